//! The `run_command` tool: a shell command in the workspace, in the OS sandbox (see `crate::sandbox`) unless the policy says `off`, in its own process group, with a timeout and an output cap; on timeout, cancel or drop everything it started is killed.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::paths::{recheck, resolve};
use super::{Access, ApprovalAsk, Tool, ToolContext, ToolError, parse_args};
use crate::sandbox::{CommandPolicy, CommandSettings, Grant};

const DEFAULT_TIMEOUT_SECS: u64 = 120;
const MAX_TIMEOUT_SECS: u64 = 1800;
/// Output kept from the start and from the end; what lies between is counted, not kept.
const HEAD: usize = 16 * 1024;
const TAIL: usize = 16 * 1024;
/// How long output still in the pipes is read after the command ended. A process that
/// left the group (setsid) can keep the pipes open forever; it is not waited for.
const DRAIN: Duration = Duration::from_millis(500);

/// The standard `run_command`: uses the settings set with `crate::sandbox::configure`.
pub struct RunCommand;

impl RunCommand {
    /// A `run_command` with its own settings instead of the configured ones.
    pub fn configured(settings: CommandSettings) -> std::sync::Arc<dyn Tool> {
        std::sync::Arc::new(Configured(settings))
    }
}

struct Configured(CommandSettings);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandArgs {
    command: String,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    timeout_secs: Option<u64>,
    #[serde(default)]
    network: bool,
    #[serde(default)]
    write_paths: Vec<String>,
}

const DESCRIPTION: &str = "Run a shell command (sh -c) in the workspace, or in `cwd` relative to it. \
It runs in a sandbox where the workspace is writable, the rest of the system read-only, the home \
folder and /tmp private, and there is no network unless you set network: true (which may ask the \
person); without it a Unix socket cannot be made either (socketpair works), so a program that \
listens on one (Python's multiprocessing, a test server on a socket) needs network: true. Depending on the settings the person is asked first. stdin is empty; stdout and stderr \
are returned together with the exit code, cut in the middle when longer than 32 KB. The command \
and everything it started are killed after timeout_secs (default 120) or when the run is stopped; \
background processes do not outlive it. Only a short list of environment variables (PATH, HOME, \
LANG, TERM, ...) is passed. To write outside the workspace, name the folders in write_paths \
(the person is asked).";

fn parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The shell command line"},
            "cwd": {"type": "string", "description": "Folder to run in, relative to the workspace; default \".\""},
            "timeout_secs": {"type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT_SECS, "description": "Seconds before the command is killed; default 120"},
            "network": {"type": "boolean", "description": "The command needs the network (downloads, package installs); default false"},
            "write_paths": {"type": "array", "items": {"type": "string"}, "description": "Existing folders outside the workspace the command must write to; the person is asked"}
        },
        "required": ["command"],
        "additionalProperties": false
    })
}

#[async_trait]
impl Tool for Configured {
    fn name(&self) -> &'static str {
        "run_command"
    }

    fn changes_workspace(&self) -> bool {
        true
    }

    fn description(&self) -> &'static str {
        DESCRIPTION
    }

    fn parameters(&self) -> Value {
        parameters()
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<String, ToolError> {
        call(&self.0, ctx, arguments).await
    }
}

#[async_trait]
impl Tool for RunCommand {
    fn name(&self) -> &'static str {
        "run_command"
    }

    fn changes_workspace(&self) -> bool {
        true
    }

    fn description(&self) -> &'static str {
        DESCRIPTION
    }

    fn parameters(&self) -> Value {
        parameters()
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<String, ToolError> {
        call(&crate::sandbox::settings(), ctx, arguments).await
    }
}

/// Characters that make a command read differently from what runs: control characters
/// (but line breaks and tabs) and text-direction overrides.
fn deceptive(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(
            c,
            '\u{200B}'..='\u{200F}' | '\u{061C}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{FEFF}'
        )
}

async fn call(
    settings: &CommandSettings,
    ctx: &ToolContext,
    arguments: Value,
) -> Result<String, ToolError> {
    call_into(settings, ctx, arguments, Default::default()).await
}

/// The standard `run_command` (the configured settings) with its output kept in `output`
/// while the command runs: an ACP agent's terminal reads it before the command ends
/// (`crate::acp` terminal/output).
pub(crate) async fn run_command_into(
    ctx: &ToolContext,
    arguments: Value,
    output: Arc<Mutex<Output>>,
) -> Result<String, ToolError> {
    call_into(&crate::sandbox::settings(), ctx, arguments, output).await
}

async fn call_into(
    settings: &CommandSettings,
    ctx: &ToolContext,
    arguments: Value,
    output: Arc<Mutex<Output>>,
) -> Result<String, ToolError> {
    let args: CommandArgs = parse_args(arguments.clone())?;
    if args.command.trim().is_empty() {
        return Err(ToolError::InvalidArguments("the command is empty".into()));
    }
    if args.command.contains('\0') {
        return Err(ToolError::InvalidArguments(
            "the command contains a NUL byte".into(),
        ));
    }
    if let Some(c) = args.command.chars().find(|c| deceptive(*c)) {
        return Err(ToolError::InvalidArguments(format!(
            "the command contains the invisible or control character U+{:04X}, which would make it read differently from what runs; write it without",
            u32::from(c)
        )));
    }
    let timeout = args.timeout_secs.unwrap_or(DEFAULT_TIMEOUT_SECS);
    if !(1..=MAX_TIMEOUT_SECS).contains(&timeout) {
        return Err(ToolError::InvalidArguments(format!(
            "timeout_secs must be between 1 and {MAX_TIMEOUT_SECS}"
        )));
    }
    let raw_cwd = args.cwd.as_deref().unwrap_or(".");
    let cwd = resolve(&ctx.workspace, raw_cwd)?;
    match std::fs::metadata(&cwd.real) {
        Ok(meta) if meta.is_dir() => {}
        _ => {
            return Err(ToolError::Failed(format!(
                "cwd {} is not an existing directory",
                cwd.display
            )));
        }
    }
    let status = crate::sandbox::status_for(settings);
    let sandboxed = settings.policy != CommandPolicy::Off && status.available;
    let mut grant = Grant {
        network: args.network && (settings.network || !sandboxed),
        writable: Vec::new(),
    };
    // What the person is told besides the command itself.
    let mut notes = Vec::new();
    let mut must_ask = settings.policy != CommandPolicy::Sandbox || !sandboxed;
    if let Some(note) = cwd.outside_note() {
        notes.push(format!("cwd {note}"));
        if sandboxed {
            notes.push(format!(
                "{} will be writable in the sandbox",
                cwd.real.display()
            ));
            grant.writable.push(cwd.real.clone());
        }
    }
    let mut outside = !cwd.inside;
    for raw in &args.write_paths {
        let place = resolve(&ctx.workspace, raw)?;
        if !std::fs::metadata(&place.real).is_ok_and(|m| m.is_dir()) {
            return Err(ToolError::InvalidArguments(format!(
                "write_paths: {} is not an existing folder",
                place.display
            )));
        }
        if place.inside {
            continue;
        }
        outside = true;
        notes.push(format!(
            "writes outside the workspace: {}",
            place.real.display()
        ));
        if sandboxed && !grant.writable.contains(&place.real) {
            grant.writable.push(place.real.clone());
        }
    }
    if sandboxed {
        if args.network && !settings.network {
            notes.push("asks for network access".into());
            grant.network = true;
            must_ask = true;
        } else {
            notes.push(format!(
                "runs in the sandbox (workspace writable, {})",
                if grant.network {
                    "network on"
                } else {
                    "no network"
                }
            ));
        }
    } else if settings.policy == CommandPolicy::Off {
        notes.push("NOT sandboxed (tools.run_command.sandbox is off)".into());
    } else {
        notes.push(format!(
            "NOT sandboxed: {}",
            status.reason.as_deref().unwrap_or("no sandbox")
        ));
    }
    let access = match (!outside, must_ask) {
        (false, _) => Access::Outside,
        (true, true) => Access::Change,
        (true, false) => Access::Read,
    };
    ctx.ask(ApprovalAsk {
        tool: "run_command".to_string(),
        arguments,
        diff: Some(notes.join("\n")),
        access,
    })
    .await?;
    recheck(&ctx.workspace, raw_cwd, &cwd)?;
    let root = cwd.root.clone();
    // What the sandbox cannot keep read-only of `.git` (a new one, a new `commondir`) is
    // compared after the command and reported in its result.
    let watch = crate::sandbox::GitWatch::new(&root);
    let shell = crate::sandbox::start_shell(
        settings,
        &root,
        &cwd.real,
        &args.command,
        sandboxed,
        &grant,
        &ctx.secret_env,
    )
    .map_err(|err| ToolError::Failed(format!("cannot start the command: {err}")))?;
    let result = run(ctx, shell, Duration::from_secs(timeout), output).await;
    match (watch.report(), result) {
        (Some(notice), Ok(text)) => Ok(format!("{text}\n{notice}")),
        (Some(notice), Err(ToolError::Failed(text))) => {
            Err(ToolError::Failed(format!("{text}\n{notice}")))
        }
        (_, result) => result,
    }
}

/// Waits until the process `pid` (our child) has exited, without reaping it, so its
/// process group id stays reserved until the group is killed.
fn wait_exited_unreaped(pid: libc::pid_t) {
    loop {
        // SAFETY: waitid writes only into `info`; WNOWAIT leaves the child to be reaped
        // by tokio.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let done = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if done == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

/// The first [`HEAD`] and last [`TAIL`] bytes of the output, and how many there were.
#[derive(Default)]
pub(crate) struct Output {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: usize,
}

impl Output {
    fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len();
        let room = HEAD - self.head.len();
        if room > 0 {
            let take = room.min(bytes.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
        }
        self.tail.extend(bytes);
        let excess = self.tail.len().saturating_sub(TAIL);
        self.tail.drain(..excess);
    }

    /// The output so far, as [`Self::text`] cuts it, empty while there is none.
    pub(crate) fn so_far(&self) -> String {
        if self.total == 0 {
            String::new()
        } else {
            self.text()
        }
    }

    fn text(&self) -> String {
        let mut text = String::from_utf8_lossy(&self.head).into_owned();
        let omitted = self.total - self.head.len() - self.tail.len();
        if omitted > 0 {
            text.push_str(&format!(
                "\n[truncated: {omitted} bytes of output omitted here]\n"
            ));
        }
        let (a, b) = self.tail.as_slices();
        text.push_str(&String::from_utf8_lossy(&[a, b].concat()));
        if text.is_empty() {
            text.push_str("(no output)");
        }
        text
    }
}

async fn pump(mut from: impl AsyncRead + Unpin, into: Arc<Mutex<Output>>) {
    let mut chunk = vec![0u8; 8192];
    loop {
        match from.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => into
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(&chunk[..n]),
        }
    }
}

enum End {
    Exited(std::io::Result<std::process::ExitStatus>),
    TimedOut,
    Cancelled,
}

/// Runs a started shell to its end, its timeout or the run's cancel, and says how it
/// ended with its output. Whatever way out (a drop included: the run loop drops the calls
/// a cancel left open), everything the command started is killed with its group.
async fn run(
    ctx: &ToolContext,
    mut shell: crate::sandbox::Shell,
    timeout: Duration,
    output: Arc<Mutex<Output>>,
) -> Result<String, ToolError> {
    let Some(pid) = shell.pid() else {
        return Err(ToolError::Failed("the command exited at once".into()));
    };
    let exited = tokio::task::spawn_blocking(move || wait_exited_unreaped(pid));
    let (stdout, stderr) = shell.take_pipes();
    let stdout = stdout.and_then(|p| tokio::process::ChildStdout::from_std(p).ok());
    let stderr = stderr.and_then(|p| tokio::process::ChildStderr::from_std(p).ok());
    let pumps = {
        let output = output.clone();
        async move {
            let out = async {
                if let Some(stdout) = stdout {
                    pump(stdout, output.clone()).await;
                }
            };
            let err = async {
                if let Some(stderr) = stderr {
                    pump(stderr, output.clone()).await;
                }
            };
            tokio::join!(out, err);
        }
    };
    let work = async {
        tokio::pin!(pumps);
        tokio::pin!(exited);
        let mut drained = false;
        loop {
            tokio::select! {
                _ = &mut exited => break,
                _ = &mut pumps, if !drained => drained = true,
            }
        }
        // The command is done (not yet reaped): what it left running in its group goes
        // too, which also closes the pipes.
        shell.kill_group();
        if !drained {
            let _ = tokio::time::timeout(DRAIN, &mut pumps).await;
        }
    };
    let end = tokio::select! {
        () = work => None,
        _ = tokio::time::sleep(timeout) => Some(End::TimedOut),
        _ = ctx.cancel.cancelled() => Some(End::Cancelled),
    };
    shell.kill_group();
    // Reap the shell at once (it is dead or dying from SIGKILL) so no zombie is left; a
    // wait that takes too long goes on in its thread.
    let reap = shell
        .into_child()
        .map(|mut child| tokio::task::spawn_blocking(move || child.wait()));
    let status = match reap {
        Some(reap) => tokio::time::timeout(Duration::from_secs(5), reap)
            .await
            .map(|joined| joined.unwrap_or_else(|err| Err(std::io::Error::other(err)))),
        None => Ok(Err(std::io::Error::other("no process"))),
    };
    let end = end.unwrap_or(match status {
        Ok(status) => End::Exited(status),
        Err(_) => End::Exited(Err(std::io::Error::other("the command did not exit"))),
    });
    let text = output.lock().unwrap_or_else(|p| p.into_inner()).text();
    match end {
        End::Exited(Ok(status)) => {
            let head = match (status.code(), exit_signal(&status)) {
                (Some(code), _) => format!("exit code: {code}"),
                (None, Some(signal)) => format!("killed by signal {signal}"),
                (None, None) => "exited".to_string(),
            };
            Ok(format!("{head}\n{text}"))
        }
        End::Exited(Err(err)) => Err(ToolError::Failed(format!(
            "lost track of the command: {err}\n{text}"
        ))),
        End::TimedOut => Err(ToolError::Failed(format!(
            "the command timed out after {} s and was killed with everything it started. Output so far:\n{text}",
            timeout.as_secs()
        ))),
        End::Cancelled => Err(ToolError::Failed(format!(
            "the command was cancelled and killed. Output so far:\n{text}"
        ))),
    }
}

fn exit_signal(status: &std::process::ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_keeps_head_and_tail_and_counts_the_middle() {
        let mut output = Output::default();
        output.push(&vec![b'a'; HEAD]);
        output.push(&vec![b'b'; 1000]);
        output.push(&vec![b'c'; TAIL]);
        let text = output.text();
        assert!(text.starts_with(&"a".repeat(HEAD)));
        assert!(text.contains("[truncated: 1000 bytes of output omitted here]"));
        assert!(text.ends_with(&"c".repeat(TAIL)));
        assert_eq!(Output::default().text(), "(no output)");
    }
}
