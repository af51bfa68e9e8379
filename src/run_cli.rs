//! `bumblehive run` (part of the binary, not the library): one prompt in a workspace, printed for people (the streamed answer on stdout, one line per tool call and sub-agent on stderr) or, with `--json`, as the event stream's JSON lines; approvals asked on the terminal; the exit code.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use bumblehive::controller::Received;
use bumblehive::protocol::{
    ApprovalInfo, Event, OwnerRequest, OwnerRun, OwnerRunLine, Progress, Role,
    commands::DecideApproval,
};
use bumblehive::service::RuntimeService;
use tokio_util::sync::CancellationToken;

/// The exit codes, as `bumblehive run --help` and the README list them.
pub const EXIT_DONE: u8 = 0;
/// The run failed (the model server's error, a run stopped) or ended paused.
pub const EXIT_FAILED: u8 = 1;
/// Bumblehive could not start the run: the config, the workspace, the data folder in use.
pub const EXIT_NOT_STARTED: u8 = 3;

/// The exit codes for `--help`.
pub const EXIT_HELP: &str = "\
Exit codes:
  0  the run ended with an answer (and every sub-agent reported)
  1  the run failed or was stopped (the model server's error, for one)
  2  wrong arguments
  3  the run could not start (the config, the workspace, the data folder in use)
  130  interrupted (Ctrl+C)

Output: the answer streams to stdout; tool calls, sub-agents, approvals and errors go to
stderr, one line each. --json prints every event as one JSON line on stdout instead.
Approvals are asked on the terminal; without one (stdin is not a terminal and ends) each
is refused with a line saying so. --yes approves every request.

With the app (or `serve`, `acp`) open on the same data folder, the prompt is run there, its
window listing the conversation, and printed here the same way; Ctrl+C stops it there.";

/// How the run prints.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
}

/// A session's title from the person's prompt: its first line, at most 60 characters (as
/// the window titles a conversation from its first message).
pub fn title_from_prompt(prompt: &str) -> String {
    let first = prompt.trim().lines().next().unwrap_or("").trim();
    let title: String = first.chars().take(60).collect();
    if title.is_empty() {
        "New conversation".into()
    } else {
        title
    }
}

/// Runs one prompt; returns the exit code.
pub async fn run_once(
    service: RuntimeService,
    workspace: &Path,
    yes: bool,
    output: Output,
    prompt: String,
) -> anyhow::Result<u8> {
    let workspace = workspace
        .canonicalize()
        .with_context(|| format!("workspace {}", workspace.display()))?;
    // `/`, the home folder itself and system folders are not workspaces (finding 11).
    let workspace = bumblehive::workspace::check_workspace(&workspace)?;
    let info = service.create_session(
        &workspace.display().to_string(),
        Some(title_from_prompt(&prompt)),
    )?;
    let controller = service.controller(&info.session_id)?;
    let (mut events, _) = controller.subscribe();
    let done = CancellationToken::new();
    let asker = Asker {
        decider: Decider::Local(service.clone()),
        session_id: info.session_id.clone(),
        yes,
        stdin_ended: Arc::new(AtomicBool::new(false)),
    };
    let printer = {
        let session_id = info.session_id.clone();
        let done = done.clone();
        let controller = controller.clone();
        tokio::spawn(async move {
            let mut text = TextPrinter::new(session_id.clone());
            let mut failed = false;
            // Approvals already answered: after a lag the snapshot lists the open ones,
            // some of which may have been seen (and answered) before it.
            let mut answered = HashSet::new();
            loop {
                // Events first: after `done`, print what is buffered, then stop.
                let received = tokio::select! {
                    biased;
                    received = events.recv() => received,
                    _ = done.cancelled() => None,
                };
                let event = match received {
                    None => break,
                    Some(Received::Event(event)) => event,
                    // Fell behind: approval requests may be among the missed events, and
                    // nothing would answer them (C13). The snapshot has every open one.
                    Some(Received::Lagged(missed)) => {
                        tracing::debug!(
                            missed,
                            "the terminal fell behind; re-reading the snapshot"
                        );
                        for ask in controller.snapshot().approvals {
                            if answered.insert(ask.approval_id.clone()) {
                                let event = Event::ApprovalRequest(ask.clone());
                                match output {
                                    Output::Json => print_json(&event),
                                    Output::Text => text.event(&event),
                                }
                                asker.answer(&ask, &mut text).await;
                            }
                        }
                        continue;
                    }
                };
                match output {
                    Output::Json => print_json(&event),
                    Output::Text => text.event(&event),
                }
                match &event {
                    Event::ApprovalRequest(ask) if answered.insert(ask.approval_id.clone()) => {
                        asker.answer(ask, &mut text).await;
                    }
                    Event::Error { session_id: id, .. } if *id == session_id => failed = true,
                    Event::Result { session_id: id, .. } if *id == session_id => failed = false,
                    _ => {}
                }
            }
            text.end();
            failed
        })
    };
    controller.submit(prompt, None)?;
    // Done when nothing runs and every sub-agent's report has been delivered.
    service.wait_idle().await;
    // Bounded as in `serve`.
    super::stop_within_deadline(&service).await;
    done.cancel();
    let failed = printer.await.unwrap_or(true) || controller.is_paused();
    Ok(if failed { EXIT_FAILED } else { EXIT_DONE })
}

fn print_json(event: &Event) {
    if let Ok(line) = serde_json::to_string(event) {
        println!("{line}");
    }
}

/// `bumblehive run` while another process owns the data folder (the desktop app, `serve`
/// or `acp`): the prompt is handed to that owner, which runs it (its window lists the
/// session at once) and streams the run back here to be printed, and the approvals are
/// answered here (ux review 2, E22). `None` when the owner takes no runs (an older build,
/// another `run`): the caller says the folder is in use, as before.
pub async fn run_at_owner(
    data_dir: &Path,
    owner_pid: &str,
    workspace: &Path,
    yes: bool,
    output: Output,
    prompt: String,
) -> anyhow::Result<Option<u8>> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let workspace = workspace
        .canonicalize()
        .with_context(|| format!("workspace {}", workspace.display()))?;
    let workspace = bumblehive::workspace::check_workspace(&workspace)?;
    let Ok(stream) =
        tokio::net::UnixStream::connect(data_dir.join(bumblehive::owner::SOCKET_FILE)).await
    else {
        return Ok(None);
    };
    let (read, mut write) = stream.into_split();
    let request = OwnerRequest {
        workspace: None,
        pid: std::process::id(),
        run: Some(OwnerRun {
            workspace: workspace.display().to_string(),
            title: title_from_prompt(&prompt),
            prompt,
        }),
    };
    let mut line = serde_json::to_vec(&request)?;
    line.push(b'\n');
    if write.write_all(&line).await.is_err() {
        return Ok(None);
    }
    let mut lines = tokio::io::BufReader::new(read).lines();
    let session_id = match lines
        .next_line()
        .await
        .ok()
        .flatten()
        .map(|l| serde_json::from_str::<OwnerRunLine>(&l))
    {
        Some(Ok(OwnerRunLine::Started { session_id })) => session_id,
        Some(Ok(OwnerRunLine::Refused { message })) => {
            eprintln!("bumblehive: {}", terminal_safe(&message));
            return Ok(Some(EXIT_NOT_STARTED));
        }
        _ => return Ok(None),
    };
    eprintln!(
        "(run by the Bumblehive process that owns the data folder, pid {owner_pid}; its window shows this conversation)"
    );
    let asker = Asker {
        decider: Decider::Owner(tokio::sync::Mutex::new(write)),
        session_id: session_id.clone(),
        yes,
        stdin_ended: Arc::new(AtomicBool::new(false)),
    };
    let mut text = TextPrinter::new(session_id);
    let mut answered = HashSet::new();
    let code = loop {
        let line = match lines.next_line().await {
            Ok(Some(line)) => line,
            Ok(None) | Err(_) => {
                text.end();
                eprintln!(
                    "bumblehive: the process that owns the data folder went away before the run ended"
                );
                break EXIT_FAILED;
            }
        };
        match serde_json::from_str::<OwnerRunLine>(&line) {
            Ok(OwnerRunLine::Event { event }) => {
                match output {
                    Output::Json => print_json(&event),
                    Output::Text => text.event(&event),
                }
                if let Event::ApprovalRequest(ask) = &*event {
                    if answered.insert(ask.approval_id.clone()) {
                        asker.answer(ask, &mut text).await;
                    }
                }
            }
            Ok(OwnerRunLine::End { failed }) => {
                text.end();
                break if failed { EXIT_FAILED } else { EXIT_DONE };
            }
            Ok(other) => tracing::debug!("unexpected line from the owner: {other:?}"),
            Err(err) => tracing::warn!("the owner sent what is not a run's line: {err}"),
        }
    };
    Ok(Some(code))
}

/// Where an approval's answer goes: this process's service, or the owner's socket.
enum Decider {
    Local(RuntimeService),
    Owner(tokio::sync::Mutex<tokio::net::unix::OwnedWriteHalf>),
}

impl Decider {
    async fn decide(&self, decision: DecideApproval) {
        match self {
            Decider::Local(service) => {
                if let Err(err) = service.decide_approval(decision) {
                    tracing::warn!("cannot decide approval: {err}");
                }
            }
            Decider::Owner(writer) => {
                use tokio::io::AsyncWriteExt;
                let Ok(mut line) = serde_json::to_vec(&decision) else {
                    return;
                };
                line.push(b'\n');
                if let Err(err) = writer.lock().await.write_all(&line).await {
                    tracing::warn!("cannot send the approval to the owner: {err}");
                }
            }
        }
    }
}

/// Answers approvals: `--yes`, the terminal, or a refusal once stdin has ended.
struct Asker {
    decider: Decider,
    session_id: String,
    yes: bool,
    /// Stdin ended (not a terminal: `/dev/null`, a closed pipe): nobody can answer.
    stdin_ended: Arc<AtomicBool>,
}

impl Asker {
    async fn answer(&self, ask: &ApprovalInfo, text: &mut TextPrinter) {
        let (approved, reason) = if self.yes {
            (true, None)
        } else {
            text.break_line();
            match self.ask_on_terminal(ask).await {
                Some(approved) => (approved, None),
                None => {
                    eprintln!(
                        "Refused: {}. There is no terminal to ask you on (stdin is not a terminal and has ended); run in a terminal, or pass --yes to approve every request.",
                        terminal_safe(&describe(ask))
                    );
                    (
                        false,
                        Some(
                            "nobody could be asked: `bumblehive run` had no terminal (the person can pass --yes)"
                                .to_string(),
                        ),
                    )
                }
            }
        };
        let decision = DecideApproval {
            session_id: self.session_id.clone(),
            approval_id: ask.approval_id.clone(),
            approved,
            remember: false,
            reason,
        };
        self.decider.decide(decision).await;
    }

    /// The person's answer, or `None` when stdin has ended (no answer can come).
    async fn ask_on_terminal(&self, ask: &ApprovalInfo) -> Option<bool> {
        if self.stdin_ended.load(Ordering::Relaxed) {
            return None;
        }
        let mut prompt = format!("\n{}\n", terminal_safe(&describe(ask)));
        if let Some(worktree) = &ask.worktree {
            prompt.push_str(&format!(
                "(in its own worktree, branch {}, not in the workspace)\n",
                terminal_safe(worktree)
            ));
        }
        prompt.push_str(&format!(
            "arguments: {}\n",
            terminal_safe(&ask.arguments.to_string())
        ));
        if let Some(diff) = &ask.diff {
            prompt.push_str(&terminal_safe(diff));
            if !diff.ends_with('\n') {
                prompt.push('\n');
            }
        }
        prompt.push_str("Approve? [y/N] ");
        let ended = self.stdin_ended.clone();
        tokio::task::spawn_blocking(move || {
            eprint!("{prompt}");
            let mut line = String::new();
            match std::io::stdin().lock().read_line(&mut line) {
                Ok(0) | Err(_) => {
                    ended.store(true, Ordering::Relaxed);
                    eprintln!();
                    None
                }
                Ok(_) => Some(matches!(line.trim(), "y" | "Y" | "yes")),
            }
        })
        .await
        .unwrap_or(None)
    }
}

/// "sub-agent "x" (tiny on local) wants to run write_file on a.txt": a sub-agent named
/// with where it runs (UX review E3), since a child may run on another server than the
/// one the person started `run` with, and the call's content goes there.
fn describe(ask: &ApprovalInfo) -> String {
    let runs_on = match (&ask.model, &ask.provider) {
        (Some(model), Some(provider)) => format!(" ({model} on {provider})"),
        (Some(one), None) | (None, Some(one)) => format!(" ({one})"),
        (None, None) => String::new(),
    };
    let who = ask
        .title
        .as_ref()
        .map(|t| format!("sub-agent \"{t}\"{runs_on}"))
        .unwrap_or_else(|| "the agent".into());
    let hint = argument_hint(&ask.arguments);
    if hint.is_empty() {
        format!("{who} wants to run {}", ask.tool)
    } else {
        format!("{who} wants to run {} on {hint}", ask.tool)
    }
}

/// The argument that says what a call is about (its path, command …), cut to 80
/// characters; the window's approval and cards use the same keys.
fn argument_hint(arguments: &serde_json::Value) -> String {
    for key in [
        "title", "path", "command", "pattern", "query", "url", "file",
    ] {
        if let Some(value) = arguments.get(key).and_then(|v| v.as_str()) {
            let first = value.lines().next().unwrap_or("");
            let mut hint: String = first.chars().take(77).collect();
            if first.chars().count() > 77 || value.lines().count() > 1 {
                hint.push('…');
            }
            return hint;
        }
    }
    String::new()
}

/// The text mode: the top-level session's answer as it streams (stdout), and a line per
/// tool call, sub-agent start and report, and error (stderr).
struct TextPrinter {
    root: String,
    /// Sub-agents' titles, for their lines.
    titles: HashMap<String, String>,
    /// Stdout's last line has no newline yet (an answer streaming).
    open_line: bool,
    /// The top-level session's current answer came as deltas (else its stored message
    /// prints it).
    streamed: bool,
    /// Whether the person's terminal sees stdout and stderr together (then a line on
    /// stderr first ends the answer's open line).
    shared_terminal: bool,
}

impl TextPrinter {
    fn new(root: String) -> Self {
        TextPrinter {
            root,
            titles: HashMap::new(),
            open_line: false,
            streamed: false,
            shared_terminal: std::io::stdout().is_terminal() && std::io::stderr().is_terminal(),
        }
    }

    fn title(&self, session_id: &str) -> String {
        terminal_safe(
            self.titles
                .get(session_id)
                .map(String::as_str)
                .unwrap_or("sub-agent"),
        )
    }

    /// What a tool line starts with: nothing for the top-level session, `[title] ` for
    /// a sub-agent's.
    fn who(&self, session_id: &str) -> String {
        if session_id == self.root {
            String::new()
        } else {
            format!("[{}] ", self.title(session_id))
        }
    }

    /// `sub-agent "title"`.
    fn child(&self, session_id: &str) -> String {
        format!("sub-agent \"{}\"", self.title(session_id))
    }

    /// Ends stdout's open line before a line on a shared terminal.
    fn break_line(&mut self) {
        if self.open_line {
            if self.shared_terminal {
                println!();
                self.open_line = false;
            }
            let _ = std::io::stdout().flush();
        }
    }

    fn note(&mut self, line: String) {
        self.break_line();
        eprintln!("{line}");
    }

    fn event(&mut self, event: &Event) {
        match event {
            Event::SessionCreated {
                session_id,
                parent_session_id: Some(_),
                title,
                ..
            } => {
                self.titles.insert(session_id.clone(), title.clone());
                self.note(format!("▸ sub-agent \"{}\" started", terminal_safe(title)));
            }
            Event::Event {
                session_id,
                kind,
                data,
            } => {
                let Ok(progress) = serde_json::from_value::<Progress>(
                    serde_json::json!({"kind": kind, "data": data}),
                ) else {
                    return;
                };
                match progress {
                    Progress::ContentDelta { text } if *session_id == self.root => {
                        let text = terminal_safe(&text);
                        print!("{text}");
                        let _ = std::io::stdout().flush();
                        if !text.is_empty() {
                            self.open_line = !text.ends_with('\n');
                            self.streamed = true;
                        }
                    }
                    // The end of one of its model calls: a run may answer more than once
                    // (a report taken in before it ended), so each answer ends its line.
                    Progress::MessageAppended { message }
                        if *session_id == self.root && message.role == Role::Assistant =>
                    {
                        // A server that sent the answer whole, not streamed: printed now.
                        if !self.streamed && !message.text().is_empty() {
                            print!("{}", terminal_safe(message.text()));
                            self.open_line = !message.text().ends_with('\n');
                        }
                        self.streamed = false;
                        self.end();
                    }
                    Progress::ToolCallStarted {
                        name, arguments, ..
                    } => {
                        let hint = argument_hint(&arguments);
                        let who = self.who(session_id);
                        self.note(format!(
                            "· {who}{}{}{}",
                            terminal_safe(&name),
                            if hint.is_empty() { "" } else { " " },
                            terminal_safe(&hint)
                        ));
                    }
                    Progress::ToolCallFinished {
                        name,
                        result,
                        is_error: true,
                        ..
                    } => {
                        let first = result.lines().next().unwrap_or("").to_string();
                        let who = self.who(session_id);
                        self.note(format!(
                            "  ✗ {who}{}: {}",
                            terminal_safe(&name),
                            terminal_safe(&first)
                        ));
                    }
                    _ => {}
                }
            }
            Event::Result { session_id, .. } if *session_id != self.root => {
                let child = self.child(session_id);
                self.note(format!("◂ {child} reported"));
            }
            Event::Result { .. } => self.end(),
            Event::Error {
                session_id,
                message,
            } => {
                let message = terminal_safe(message);
                if *session_id == self.root {
                    self.note(format!("error: {message}"));
                } else {
                    let child = self.child(session_id);
                    self.note(format!("◂ {child} failed: {message}"));
                }
            }
            _ => {}
        }
    }

    fn end(&mut self) {
        if self.open_line {
            println!();
            self.open_line = false;
        }
        let _ = std::io::stdout().flush();
    }
}

/// Text for the terminal with control characters (but line breaks and tabs) shown as
/// `\u{…}`: model-chosen text must not move the cursor or rewrite the prompt (finding 13).
pub fn terminal_safe(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let bidi = matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' | '\u{061C}');
        if (c.is_control() && c != '\n' && c != '\t') || bidi {
            out.push_str(&format!("\\u{{{:04x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}
