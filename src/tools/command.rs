//! The `run_command` tool: a shell command in the workspace, in its own process group, with a timeout and an output cap; on timeout, cancel or drop the whole group is killed.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::paths::resolve;
use super::{Access, ApprovalAsk, Tool, ToolContext, ToolError, parse_args};

const DEFAULT_TIMEOUT_SECS: u64 = 120;
const MAX_TIMEOUT_SECS: u64 = 1800;
/// Output kept from the start and from the end; what lies between is counted, not kept.
const HEAD: usize = 16 * 1024;
const TAIL: usize = 16 * 1024;
/// How long output still in the pipes is read after the command ended. A process that
/// left the group (setsid) can keep the pipes open forever; it is not waited for.
const DRAIN: Duration = Duration::from_millis(500);

pub struct RunCommand;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandArgs {
    command: String,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    timeout_secs: Option<u64>,
}

#[async_trait]
impl Tool for RunCommand {
    fn name(&self) -> &'static str {
        "run_command"
    }

    fn description(&self) -> &'static str {
        "Run a shell command (sh -c) in the workspace, or in `cwd` relative to it, after the person \
approves it. stdin is empty; stdout and stderr are returned together with the exit code, cut in \
the middle when longer than 32 KB. The command and everything it started are killed after \
timeout_secs (default 120) or when the run is stopped; background processes do not outlive it. \
The model provider's API key variable is not passed to commands."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The shell command line"},
                "cwd": {"type": "string", "description": "Folder to run in, relative to the workspace; default \".\""},
                "timeout_secs": {"type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT_SECS, "description": "Seconds before the command is killed; default 120"}
            },
            "required": ["command"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<String, ToolError> {
        let args: CommandArgs = parse_args(arguments.clone())?;
        if args.command.trim().is_empty() {
            return Err(ToolError::InvalidArguments("the command is empty".into()));
        }
        if args.command.contains('\0') {
            return Err(ToolError::InvalidArguments(
                "the command contains a NUL byte".into(),
            ));
        }
        let timeout = args.timeout_secs.unwrap_or(DEFAULT_TIMEOUT_SECS);
        if !(1..=MAX_TIMEOUT_SECS).contains(&timeout) {
            return Err(ToolError::InvalidArguments(format!(
                "timeout_secs must be between 1 and {MAX_TIMEOUT_SECS}"
            )));
        }
        let cwd = resolve(&ctx.workspace, args.cwd.as_deref().unwrap_or("."))?;
        match std::fs::metadata(&cwd.real) {
            Ok(meta) if meta.is_dir() => {}
            _ => {
                return Err(ToolError::Failed(format!(
                    "cwd {} is not an existing directory",
                    cwd.display
                )));
            }
        }
        ctx.ask(ApprovalAsk {
            tool: self.name().to_string(),
            arguments,
            diff: None,
            access: Access::of(&cwd, true),
        })
        .await?;
        run(ctx, &args.command, &cwd.real, Duration::from_secs(timeout)).await
    }
}

/// Kills a process group when dropped: the run loop drops the calls a cancel left open,
/// and nothing the command started may outlive its call.
struct GroupKill(libc::pid_t);

impl GroupKill {
    fn kill(&self) {
        // SAFETY: killpg only sends a signal; a group that is already gone gives ESRCH.
        unsafe {
            libc::killpg(self.0, libc::SIGKILL);
        }
    }
}

impl Drop for GroupKill {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The first [`HEAD`] and last [`TAIL`] bytes of the output, and how many there were.
#[derive(Default)]
struct Output {
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

async fn run(
    ctx: &ToolContext,
    command: &str,
    cwd: &std::path::Path,
    timeout: Duration,
) -> Result<String, ToolError> {
    let mut command_line = tokio::process::Command::new("/bin/sh");
    for name in &ctx.secret_env {
        command_line.env_remove(name);
    }
    let mut child = command_line
        .arg("-c")
        .arg(command)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Nothing may wait for a person at a terminal that is not there.
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("PAGER", "cat")
        .env("GIT_PAGER", "cat")
        // Its own group, so the command and everything it starts can be killed together.
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|err| ToolError::Failed(format!("cannot start the command: {err}")))?;
    let Some(pid) = child.id() else {
        return Err(ToolError::Failed("the command exited at once".into()));
    };
    let group = GroupKill(pid as libc::pid_t);
    let output = Arc::new(Mutex::new(Output::default()));
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
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
        let mut drained = false;
        let status = loop {
            tokio::select! {
                status = child.wait() => break status,
                _ = &mut pumps, if !drained => drained = true,
            }
        };
        // The command is done: what it left running in its group goes too, which also
        // closes the pipes.
        group.kill();
        if !drained {
            let _ = tokio::time::timeout(DRAIN, &mut pumps).await;
        }
        status
    };
    let end = tokio::select! {
        status = work => End::Exited(status),
        _ = tokio::time::sleep(timeout) => End::TimedOut,
        _ = ctx.cancel.cancelled() => End::Cancelled,
    };
    group.kill();
    // Reap the shell at once (it is dead or dying from SIGKILL) so no zombie is left.
    let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
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
