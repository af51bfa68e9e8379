//! The run loop (SPEC §2, §4): model call → tool batch → model call … until a final answer, with the steer inbox drained only at safe points and synthetic results for calls a cancel left open.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio_util::sync::CancellationToken;

use super::{QueuedMessage, RunOutcome, SessionController, report_task_id};
use crate::context::turn::{RunContext, Turn};
use crate::protocol::{ContextMeter, Message, Progress, RunConfig, ToolCall};
use crate::provider::{ModelRequest, ProviderError, ProviderEvent, RequestMessages};
use crate::runtime::TurnContext;
use crate::tools::{COMMITTED, ToolContext, ToolError};

/// The result text of a call that a cancel left without one.
pub const CANCELLED_RESULT: &str = "Cancelled by user";

/// The prompt of an ACP child resumed after its agent's process died mid-turn.
const ACP_GO_ON: &str = "(Your previous turn was cut off before it finished: your process ended. Go on with the task where you left off.)";

/// The result text given to calls a crash (or a failed run) left unanswered.
pub const INTERRUPTED_RESULT: &str = "Interrupted: Bumblehive stopped before this call finished";

/// How long a cancelled batch waits for changes the person already approved and that
/// have started: their result must say truthfully that they happened (runtime review C8).
const COMMITTED_GRACE: Duration = Duration::from_secs(30);

/// What a run is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A message (or a resume) to work on.
    Normal,
    /// The `compact` command on a session that was not running: compact, then end; what
    /// was steered in meanwhile goes on in a run of its own (`end_run_locked`).
    Compact { paused: bool },
}

struct Run {
    ctl: Arc<SessionController>,
    /// Shared with the request of the model call in flight ([`RequestMessages`]), never
    /// while it is appended to: a request is dropped before its answer is appended, so
    /// `Arc::make_mut` copies nothing.
    history: Arc<Vec<Message>>,
    token: CancellationToken,
    workspace: String,
    config: RunConfig,
    turn: TurnContext,
    /// Steered messages taken at a safe point whose append failed: back to pending.
    requeue: Vec<QueuedMessage>,
    /// The last batch's calls (names and arguments) and how many batches in a row made
    /// exactly those calls: the loop guard.
    last_batch: String,
    repeats: usize,
    context: RunContext,
    mode: Mode,
    /// The flush asked for at the end of the last step, still in flight while the next
    /// model call starts (see `Run::flush_later`).
    flushing: Option<crate::flush::FlushTicket>,
    /// Reports appended to the history whose "delivered" ledger note waits for the
    /// history's next awaited flush: a note on disk before its history line could, after
    /// a power cut, hide a report that never reached the disk (runtime review R10).
    unnoted: Vec<String>,
    /// The request slot kept across a batch that only delegates (`sub_agent`,
    /// `message_subagent` answer at once): the next call follows within milliseconds, so
    /// on a one-request server the parent's turn goes on before its children's first
    /// requests, instead of waiting behind one of them.
    held_slot: Option<crate::slots::Permit>,
    /// The estimated tokens of the last model request: a stopped answer's input count
    /// when the provider reported none before the stop (E23).
    request_tokens: usize,
}

/// From this many identical batches in a row, the model is told it repeats itself and
/// the person is shown a notice.
const LOOP_AFTER: usize = 3;

/// Starts a run task. A panic inside it ends the run as failed (an `error` event, the
/// session paused and valid) instead of leaving it "running" forever (runtime review C17).
pub(super) fn spawn(
    ctl: Arc<SessionController>,
    first: Vec<QueuedMessage>,
    token: CancellationToken,
    mode: Mode,
) {
    tokio::spawn(async move {
        let guard = ctl.clone();
        let outcome = std::panic::AssertUnwindSafe(run(ctl, first, token, mode))
            .catch_unwind()
            .await;
        if let Err(panic) = outcome {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            tracing::error!(session = %guard.session_id(), "a run panicked: {what}");
            // The history in memory went with the task: the session is reloaded from disk
            // and any call the panic left open is answered, so it stays valid (SPEC §2).
            if let Err(err) = guard.repair_stored_history() {
                tracing::error!(session = %guard.session_id(), "cannot repair the history after a panic: {err}");
            }
            guard.stop_run(
                None,
                RunOutcome::Failed(format!(
                    "internal error: the run stopped unexpectedly ({what})"
                )),
                Vec::new(),
            );
        }
    });
}

/// Runs one activity of a session until it ends; the controller learns the outcome.
async fn run(
    ctl: Arc<SessionController>,
    first: Vec<QueuedMessage>,
    token: CancellationToken,
    mode: Mode,
) {
    // The first messages are in the history already: nothing of them goes back to pending.
    let requeue: Vec<QueuedMessage> = Vec::new();
    // A report the run starts with is in the history but not flushed: its "delivered"
    // note waits for the run's first awaited flush (R10), or for the flush below when the
    // run cannot start.
    let first_reports: Vec<String> = first
        .iter()
        .filter_map(|m| report_task_id(&m.message_id).map(str::to_string))
        .collect();
    let (history, marker) = match ctl.take_history() {
        Ok(taken) => taken,
        Err(err) => {
            let message = format!("cannot load the session's history: {err}");
            if sync_history(&ctl).await {
                note_delivered(&ctl, first_reports);
            }
            ctl.stop_run(None, RunOutcome::Failed(message), requeue);
            return;
        }
    };
    let config = first.first().map(|m| m.config.clone()).unwrap_or_default();
    // Resolved once: a config change applies from the next run (SPEC §6).
    let resolved = crate::context::turn::resolve(&ctl, &config, &token, marker).await;
    let Turn {
        workspace,
        turn,
        context,
    } = match resolved {
        Ok(resolved) => resolved,
        Err(err) => {
            if sync_history(&ctl).await {
                note_delivered(&ctl, first_reports);
            }
            ctl.stop_run(Some(history), RunOutcome::Failed(err), requeue);
            return;
        }
    };
    let mut run = Run {
        ctl,
        history: Arc::new(history),
        token,
        workspace,
        config,
        turn,
        requeue: Vec::new(),
        last_batch: String::new(),
        repeats: 0,
        context,
        mode,
        flushing: None,
        unnoted: first_reports,
        held_slot: None,
        request_tokens: 0,
    };
    let outcome = run.drive().await;
    let Run {
        ctl,
        history,
        requeue,
        unnoted,
        ..
    } = run;
    // `drive` returns only for stops; a completed run was ended at its last safe point.
    if let Some(outcome) = outcome {
        // What the stopped run appended is flushed before the session is told it ended.
        if sync_history(&ctl).await {
            note_delivered(&ctl, unnoted);
        }
        ctl.stop_run(Some(Arc::unwrap_or_clone(history)), outcome, requeue);
    }
}

/// Flushes the session's history and waits: through the store's group commit, so runs
/// that end a step together share the disk's flushes. Returns whether it succeeded:
/// only then may ledger notes about those lines follow.
async fn sync_history(ctl: &SessionController) -> bool {
    let flushed = match ctl.shared.store.flush(ctl.session_id()) {
        Ok(ticket) => ticket.wait().await,
        Err(err) => {
            tracing::warn!(session = %ctl.session_id(), "fsync failed: {err}");
            return false;
        }
    };
    if let Err(err) = flushed {
        tracing::warn!(session = %ctl.session_id(), "fsync failed: {err}");
        return false;
    }
    true
}

/// Notes reports as delivered in the ledger, so recovery need not read this history to
/// know. Called only once the history lines of these reports are durable; a note lost
/// (a crash before it, a failed flush) costs recovery one read of the history, never a
/// report.
fn note_delivered(ctl: &SessionController, task_ids: Vec<String>) {
    for task_id in task_ids {
        if let Err(err) = ctl.shared.store.mark_delivered(ctl.session_id(), &task_id) {
            tracing::warn!(session = %ctl.session_id(), "cannot note a delivered report: {err}");
        }
    }
}

impl Run {
    /// Returns `None` when the run completed (already ended under the controller's
    /// lock), or how it stopped.
    /// The messages the run begins with are in its history already (the controller wrote
    /// them when it started the run; a child's run begins with everything that waited for
    /// its slot).
    async fn drive(&mut self) -> Option<RunOutcome> {
        if let Mode::Compact { paused } = self.mode {
            let plan = self.prepare(true).plan;
            if let Some(plan) = plan {
                match self.compact(plan).await {
                    Ok(true) => {}
                    Ok(false) => return Some(RunOutcome::Cancelled),
                    Err(err) => return Some(RunOutcome::Failed(err)),
                }
            }
            let used = self.prepare(false).used;
            self.ctl
                .set_context(ContextMeter::new(used, self.context.window as u32));
            // The run ends here; what was steered in meanwhile is decided when it ends,
            // under the controller's lock in one step with the end (runtime review R3, R4).
            return Some(RunOutcome::Compacted { paused });
        }
        if let Some(agent) = self.turn.acp.clone() {
            return self.drive_acp(agent).await;
        }
        let mut steps = 0;
        loop {
            if self.token.is_cancelled() {
                return Some(RunOutcome::Cancelled);
            }
            steps += 1;
            if steps > self.turn.limits.max_steps {
                return Some(RunOutcome::Failed(format!(
                    "the run stopped after {} model calls (the step limit)",
                    self.turn.limits.max_steps
                )));
            }
            let response = match self.model_call().await {
                Ok(Ok(response)) => response,
                Ok(Err(partial)) => {
                    // Stop keeps what had streamed, as the assistant's stopped answer; calls
                    // whose arguments were still streaming are dropped (SPEC §2 holds).
                    if !partial.trim().is_empty() {
                        let mut stopped = Message::assistant(Some(partial), Vec::new());
                        stopped.stopped = true;
                        // Providers report usage at the end of a stream, which a stop cuts
                        // off: the answer keeps the runtime's estimate, marked as one, so
                        // the session's and the tree's counts do not say 0 (E23).
                        let usage = crate::protocol::Usage {
                            input_tokens: self.request_tokens as u64,
                            output_tokens: crate::context::window::estimate_tokens(
                                std::slice::from_ref(&stopped),
                                &[],
                            ) as u64,
                        };
                        stopped.usage = Some(usage);
                        stopped.usage_estimated = true;
                        self.ctl.add_usage(
                            usage,
                            &self.turn.provider_name,
                            &self.turn.settings.model,
                        );
                        if let Err(err) = self.append(vec![stopped]) {
                            return Some(RunOutcome::Failed(err));
                        }
                    }
                    return Some(RunOutcome::Cancelled);
                }
                Err(err) => return Some(RunOutcome::Failed(err)),
            };
            let calls = response.tool_calls.clone();
            let mut assistant = Message::assistant(response.content.clone(), response.tool_calls);
            assistant.usage = response.usage;
            if let Some(usage) = response.usage {
                self.ctl
                    .add_usage(usage, &self.turn.provider_name, &self.turn.settings.model);
            }
            if let Err(err) = self.append(vec![assistant]) {
                return Some(RunOutcome::Failed(err));
            }
            if calls.is_empty() {
                // Safe point 2: steered messages follow the final answer and the run goes on.
                let answer = response.content.unwrap_or_default();
                self.sync().await;
                match self.ctl.finish_or_take_inbox(&answer, &mut self.history) {
                    None => return None,
                    Some(steered) => {
                        if let Err(err) = self.append_users(steered) {
                            return Some(RunOutcome::Failed(err));
                        }
                    }
                }
            } else {
                let note = self.loop_guard(&calls);
                if self.acts_outside_the_history(&calls) {
                    // A change to the workspace or a sub-agent started must never be on
                    // disk while the history that asked for it is not: this call and
                    // everything before it are flushed first.
                    self.sync().await;
                }
                let cancelled = match self.tool_batch(calls, note).await {
                    Ok(cancelled) => cancelled,
                    Err(err) => return Some(RunOutcome::Failed(err)),
                };
                self.flush_later();
                if cancelled {
                    return Some(RunOutcome::Cancelled);
                }
                // Safe point 1: the batch is complete; steered messages go before the next call.
                let steered = self.ctl.take_inbox();
                if let Err(err) = self.append_users(steered) {
                    return Some(RunOutcome::Failed(err));
                }
            }
        }
    }

    fn tool_context(&self) -> ToolContext {
        ToolContext {
            session_id: self.ctl.session_id().to_string(),
            workspace: PathBuf::from(&self.workspace),
            call_id: String::new(),
            cancel: self.token.child_token(),
            approvals: self.ctl.gate(
                self.turn.policy.clone(),
                // An ACP agent picks its own model: the config's would be a wrong name.
                self.turn.acp.is_none().then(|| {
                    (
                        self.turn.provider_name.clone(),
                        self.turn.settings.model.clone(),
                    )
                }),
            ),
            delegator: self.turn.delegator.clone(),
            run_config: self.config.clone(),
            secret_env: self.turn.secret_env.clone(),
            checkpoints: crate::checkpoints::CallHook::for_run(
                &self.ctl.shared.checkpoints,
                self.ctl.session_id(),
                &self.history,
            ),
        }
    }

    /// The run of a child whose profile is an external ACP agent (`acp::client`): each
    /// of the agent's turns replaces the model loop; its text and tool calls become the
    /// child's history (valid by SPEC §2), and its end of turn ends the run like a final
    /// answer, so the report goes the way of every child's.
    async fn drive_acp(&mut self, agent: crate::protocol::AcpAgent) -> Option<RunOutcome> {
        use crate::acp::client::{TurnEnd, Update};
        loop {
            if self.token.is_cancelled() {
                return Some(RunOutcome::Cancelled);
            }
            // What the person (or the parent) said since the agent's last answer.
            let since = self
                .history
                .iter()
                .rposition(|m| m.role == crate::protocol::Role::Assistant)
                .map_or(0, |i| i + 1);
            let users = |messages: &[Message]| {
                messages
                    .iter()
                    .filter(|m| m.role == crate::protocol::Role::User)
                    .map(|m| m.text())
                    .collect::<Vec<&str>>()
                    .join("\n\n")
            };
            let mut prompt = users(&self.history[since..]);
            // Nothing new since its last answer: a child resumed after its agent's process
            // died (that answer was cut off), so the agent is asked to go on.
            if prompt.trim().is_empty() {
                prompt = ACP_GO_ON.to_string();
            }
            let earlier = users(&self.history[..since]);
            let ctx = self.tool_context();
            let session_id = self.ctl.session_id().to_string();
            let mut text = String::new();
            let mut open: Vec<(ToolCall, Option<(String, bool)>)> = Vec::new();
            // Terminal output by call, for a call whose result has no content of its own.
            let mut terminal: std::collections::HashMap<String, String> = Default::default();
            let mut failed: Option<String> = None;
            let mut acp_session = self.ctl.current_meta().acp_session;
            let end = {
                let mut on_update = |update: Update| match update {
                    Update::Text(chunk) => {
                        self.ctl.emit_progress(Progress::ContentDelta {
                            text: chunk.clone(),
                        });
                        text.push_str(&chunk);
                    }
                    Update::ToolStarted {
                        id,
                        title,
                        kind,
                        input,
                    } => {
                        let call = ToolCall {
                            id,
                            name: kind,
                            arguments: serde_json::json!({"title": title, "input": input}),
                        };
                        self.ctl.emit_progress(Progress::ToolCallStarted {
                            call_id: call.id.clone(),
                            name: call.name.clone(),
                            arguments: call.arguments.clone(),
                        });
                        open.push((call, None));
                    }
                    Update::ToolUpdated { id, title, input } => {
                        if let Some((call, _)) = open.iter_mut().find(|(c, _)| c.id == id) {
                            if let Some(title) = title {
                                call.arguments["title"] = serde_json::Value::String(title);
                            }
                            if let Some(input) = input {
                                call.arguments["input"] = input;
                            }
                        }
                    }
                    Update::ToolOutput { id, text } => {
                        terminal.entry(id).or_default().push_str(&text);
                    }
                    Update::ToolFinished {
                        id,
                        output,
                        raw_output,
                        failed,
                    } => {
                        // Its content, else what its terminal showed, else its raw output.
                        let output = match (output.is_empty(), terminal.remove(&id)) {
                            (false, _) => output,
                            (true, Some(shown)) if !shown.is_empty() => shown,
                            _ => raw_output,
                        };
                        if let Some(entry) = open.iter_mut().find(|(c, _)| c.id == id) {
                            entry.1 = Some((output, failed));
                        }
                    }
                };
                crate::acp::client::turn(
                    &self.ctl.shared.acp_agents,
                    &session_id,
                    &agent,
                    &ctx,
                    prompt,
                    &earlier,
                    &mut acp_session,
                    &mut on_update,
                )
                .await
            };
            if let Some(id) = &acp_session {
                self.ctl.remember_acp_session(id);
            }
            // The agent's tool calls, each with its result (a call it never finished gets
            // the cancelled or interrupted text), then its answer.
            let mut messages = Vec::new();
            if !open.is_empty() {
                let calls: Vec<ToolCall> = open.iter().map(|(c, _)| c.clone()).collect();
                messages.push(Message::assistant(None, calls));
                for (call, result) in &open {
                    let (output, is_error) = match result {
                        Some((output, failed)) => (output.clone(), *failed),
                        None if end == TurnEnd::Cancelled => (CANCELLED_RESULT.to_string(), true),
                        None => (INTERRUPTED_RESULT.to_string(), true),
                    };
                    self.ctl.emit_progress(Progress::ToolCallFinished {
                        call_id: call.id.clone(),
                        name: call.name.clone(),
                        result: output.clone(),
                        is_error,
                    });
                    messages.push(Message::tool(&call.id, &output));
                }
            }
            let note = match &end {
                // A turn the agent ended otherwise than by finishing says so in its answer
                // (and so in the report): it was not the person's Stop.
                TurnEnd::Done(reason) if reason != "end_turn" => Some(format!(
                    "(the agent ended its turn (stop reason: {reason}))"
                )),
                // Said in the answer cut off, so the transcript shows where it stopped.
                TurnEnd::Lost(reason) => Some(format!(
                    "({reason}: interrupted; resume the sub-agent to go on)"
                )),
                _ => None,
            };
            if let Some(note) = note {
                let note = if text.trim().is_empty() {
                    note
                } else {
                    format!("\n\n{note}")
                };
                self.ctl
                    .emit_progress(Progress::ContentDelta { text: note.clone() });
                text.push_str(&note);
            }
            match &end {
                TurnEnd::Done(_) => {
                    messages.push(Message::assistant(Some(text.clone()), Vec::new()))
                }
                _ if !text.trim().is_empty() => {
                    let mut stopped = Message::assistant(Some(text.clone()), Vec::new());
                    stopped.stopped = true;
                    messages.push(stopped);
                }
                _ => {}
            }
            if let Err(err) = self.append(messages) {
                failed = Some(err);
            }
            if let Some(err) = failed {
                return Some(RunOutcome::Failed(err));
            }
            match end {
                TurnEnd::Cancelled => return Some(RunOutcome::Cancelled),
                TurnEnd::Failed(message) => return Some(RunOutcome::Failed(message)),
                TurnEnd::Lost(message) => return Some(RunOutcome::Interrupted(message)),
                TurnEnd::Done(_) => {
                    self.sync().await;
                    match self.ctl.finish_or_take_inbox(&text, &mut self.history) {
                        None => return None,
                        Some(steered) => {
                            if let Err(err) = self.append_users(steered) {
                                return Some(RunOutcome::Failed(err));
                            }
                        }
                    }
                }
            }
        }
    }

    fn append_users(&mut self, queued: Vec<QueuedMessage>) -> Result<(), String> {
        if queued.is_empty() {
            return Ok(());
        }
        let messages: Vec<Message> = queued.iter().map(QueuedMessage::to_user).collect();
        if let Err(err) = self.append(messages.clone()) {
            // Not in the history, so not consumed: they go back to pending (C7).
            self.requeue.extend(queued);
            return Err(err);
        }
        for message in &queued {
            self.ctl.remember_message_id(&message.message_id);
        }
        // The stored queue stops naming what the history has now.
        self.ctl.inbox_consumed();
        // A report in the history is delivered; its ledger note follows the history's
        // next awaited flush (`sync`).
        self.unnoted.extend(messages.iter().filter_map(|message| {
            message
                .id
                .as_deref()
                .and_then(|id| id.strip_prefix("subagent:"))
                .map(str::to_string)
        }));
        Ok(())
    }

    /// Persists, then shows: a message is on disk before any subscriber hears of it.
    fn append(&mut self, messages: Vec<Message>) -> Result<(), String> {
        let id = self.ctl.session_id().to_string();
        self.ctl
            .shared
            .store
            .append(&id, &messages)
            .map_err(|err| format!("cannot save the session: {err}"))?;
        for message in &messages {
            self.ctl.emit_progress(Progress::MessageAppended {
                message: message.clone(),
            });
        }
        Arc::make_mut(&mut self.history).extend(messages);
        Ok(())
    }

    /// Flushes the history and waits: before the run ends or stops (what it did is on
    /// disk before the session says so and before a sub-agent's report goes out) and
    /// before tools that act outside the history.
    async fn sync(&mut self) {
        self.flushing = None;
        if sync_history(&self.ctl).await {
            note_delivered(&self.ctl, std::mem::take(&mut self.unnoted));
        }
    }

    /// The end of a step whose tools only read: the flush is asked for and the next model
    /// call starts while it runs, so the disk's latency is not added to every turn. The
    /// ticket is dropped unanswered only when a later flush (which covers it) is awaited.
    fn flush_later(&mut self) {
        match self.ctl.shared.store.flush(self.ctl.session_id()) {
            Ok(ticket) => self.flushing = Some(ticket),
            Err(err) => tracing::warn!(session = %self.ctl.session_id(), "fsync failed: {err}"),
        }
    }

    /// Whether a batch has a call whose effect lives outside the history: a tool that may
    /// change the workspace, or one that starts or messages a sub-agent.
    fn acts_outside_the_history(&self, calls: &[ToolCall]) -> bool {
        calls.iter().any(|call| {
            self.turn
                .tools
                .get(&call.name)
                .is_some_and(|tool| tool.acts_outside_the_history())
        })
    }

    /// One model call; `Ok(Err(text streamed so far))` when cancelled.
    ///
    /// The context builder goes first: the request is built from the history and the
    /// latest compaction marker, and compacted when it nears the window (or when the
    /// `compact` command asked). A provider's "context too long" compacts once and
    /// retries once. At most one compaction per model call, so it can never loop.
    async fn model_call(
        &mut self,
    ) -> Result<Result<crate::provider::ModelResponse, String>, String> {
        let force = self.ctl.take_compact_request();
        let mut prepared = self.prepare(force);
        let mut compacted = false;
        if let Some(plan) = prepared.plan.take() {
            if !self.compact(plan).await? {
                return Ok(Err(String::new()));
            }
            compacted = true;
            prepared = self.prepare(false);
        }
        self.ctl
            .set_context(ContextMeter::new(prepared.used, self.context.window as u32));
        self.request_tokens = prepared.used;
        loop {
            match self.generate(prepared.messages).await {
                Err(ProviderError::ContextTooLong(message)) if !compacted => {
                    tracing::info!(session = %self.ctl.session_id(), "the provider says the context is too long ({message}): compacting once and retrying");
                    compacted = true;
                    match self.prepare(true).plan {
                        Some(plan) => {
                            if !self.compact(plan).await? {
                                return Ok(Err(String::new()));
                            }
                        }
                        None => return Err(ProviderError::ContextTooLong(message).to_string()),
                    }
                    prepared = self.prepare(false);
                    self.request_tokens = prepared.used;
                }
                Err(err) => return Err(err.to_string()),
                Ok(Ok(response)) => {
                    if let Some(usage) = response.usage.filter(|u| u.input_tokens > 0) {
                        let used = usage.input_tokens + usage.output_tokens;
                        self.ctl.set_context(ContextMeter::new(
                            usize::try_from(used).unwrap_or(usize::MAX),
                            self.context.window as u32,
                        ));
                    }
                    return Ok(Ok(response));
                }
                Ok(Err(partial)) => return Ok(Err(partial)),
            }
        }
    }

    /// The request for the next call and whether to compact first.
    fn prepare(&mut self, force: bool) -> crate::context::Prepared {
        crate::context::prepare_sized(
            self.context.system.clone(),
            &self.history,
            self.context.marker.as_ref(),
            &mut self.context.size,
            self.context.window,
            &self.turn.compaction,
            force,
        )
    }

    /// Compacts the history by `plan`: a summary call (no tools, nothing streamed to the
    /// person), then the marker is stored as its own line and used from now on. A failed
    /// summary call falls back to dropping the oldest turns, so the session goes on.
    /// Returns false when the run was cancelled meanwhile (nothing stored).
    async fn compact(&mut self, plan: crate::context::compaction::Plan) -> Result<bool, String> {
        let children = crate::context::compaction::running_children(&self.history);
        let ctl = self.ctl.clone();
        let sink = move |event: ProviderEvent| {
            if let ProviderEvent::Retry {
                attempt,
                delay_ms,
                reason,
            } = event
            {
                ctl.emit_progress(Progress::ProviderRetry {
                    attempt,
                    delay_ms,
                    reason,
                });
            }
        };
        let Some(_slot) = self.request_slot().await else {
            return Ok(false);
        };
        let compacted = tokio::select! {
            biased;
            _ = self.token.cancelled() => return Ok(false),
            compacted = crate::context::compaction::compact(
                self.turn.provider.as_ref(),
                &self.turn.settings,
                &self.history,
                self.context.marker.as_ref(),
                plan,
                &children,
                self.context.window,
                &sink,
            ) => compacted,
        };
        let marker = compacted.marker;
        self.ctl
            .shared
            .store
            .append_compaction(self.ctl.session_id(), &marker)
            .map_err(|err| format!("cannot save the session: {err}"))?;
        tracing::info!(
            session = %self.ctl.session_id(),
            kind = ?marker.kind,
            before = marker.tokens_before,
            after = marker.tokens_after,
            "compacted the history"
        );
        self.context.marker = Some(marker.clone());
        self.ctl.set_compaction(marker);
        Ok(true)
    }

    /// Sends one request; `Ok(Err(text streamed so far))` when cancelled.
    async fn generate(
        &mut self,
        messages: RequestMessages,
    ) -> Result<Result<crate::provider::ModelResponse, String>, ProviderError> {
        let provider = self.turn.provider.clone();
        let request = ModelRequest {
            messages,
            tools: self.turn.specs.clone(),
            settings: self.turn.settings.clone(),
        };
        let ctl = self.ctl.clone();
        let streamed = Arc::new(std::sync::Mutex::new(String::new()));
        let partial = streamed.clone();
        let sink = move |event: ProviderEvent| match event {
            ProviderEvent::ContentDelta(text) => {
                partial
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push_str(&text);
                ctl.emit_progress(Progress::ContentDelta { text })
            }
            ProviderEvent::Retry {
                attempt,
                delay_ms,
                reason,
            } => ctl.emit_progress(Progress::ProviderRetry {
                attempt,
                delay_ms,
                reason,
            }),
        };
        let Some(slot) = self.request_slot().await else {
            return Ok(Err(String::new()));
        };
        let cancelled = tokio::select! {
            biased;
            _ = self.token.cancelled() => true,
            response = provider.generate(request, &sink) => {
                if let Ok(answer) = &response {
                    let delegates_only = !answer.tool_calls.is_empty()
                        && answer
                            .tool_calls
                            .iter()
                            .all(|c| matches!(c.name.as_str(), "sub_agent" | "message_subagent"));
                    if delegates_only {
                        self.held_slot = slot;
                    }
                }
                return response.map(Ok);
            }
        };
        debug_assert!(cancelled);
        let text = std::mem::take(&mut *streamed.lock().unwrap_or_else(|p| p.into_inner()));
        Ok(Err(text))
    }

    /// A request slot of the run's server for one model call (`crate::slots`): at once
    /// when the server has no known limit. `None` when the run was stopped meanwhile.
    async fn request_slot(&mut self) -> Option<Option<crate::slots::Permit>> {
        if let Some(held) = self.held_slot.take() {
            return Some(Some(held));
        }
        let name = &self.turn.provider_name;
        let Some(slots) = self.ctl.shared.request_slots(name).await else {
            return Some(None);
        };
        let top = self.ctl.depth() == 0;
        let ctl = self.ctl.clone();
        let server = name.clone();
        let waiting = move |ahead: usize| {
            ctl.emit_progress(Progress::WaitingForSlot {
                server,
                ahead: u32::try_from(ahead).unwrap_or(u32::MAX),
            });
        };
        tokio::select! {
            biased;
            _ = self.token.cancelled() => None,
            permit = slots.acquire(top, waiting) => Some(Some(permit)),
        }
    }

    /// Runs a batch concurrently and appends its results in call order as soon as each
    /// prefix is complete. On cancel, calls still open get a synthetic result, so the
    /// history never holds an assistant message with a call left unanswered (SPEC §2).
    /// Returns whether the batch was cancelled.
    async fn tool_batch(
        &mut self,
        calls: Vec<ToolCall>,
        note: Option<String>,
    ) -> Result<bool, String> {
        let ctx = self.tool_context();
        let mut running = FuturesUnordered::new();
        // Set by a tool once an approved change has started (see `tools::COMMITTED`).
        let committed: Vec<Arc<AtomicBool>> = calls
            .iter()
            .map(|_| Arc::new(AtomicBool::new(false)))
            .collect();
        for (index, call) in calls.iter().enumerate() {
            let ctx = ToolContext {
                call_id: call.id.clone(),
                ..ctx.clone()
            };
            let tools = self.turn.tools.clone();
            let ctl = self.ctl.clone();
            let call = call.clone();
            let flag = committed[index].clone();
            running.push(COMMITTED.scope(flag, async move {
                ctl.emit_progress(Progress::ToolCallStarted {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                });
                let result = tools
                    .call_output(&ctx, &call.name, call.arguments.clone())
                    .await;
                (index, result)
            }));
        }
        let mut results: Vec<Option<Message>> = vec![None; calls.len()];
        let mut written = 0;
        let mut cancelled = false;
        loop {
            let next = tokio::select! {
                biased;
                _ = self.token.cancelled() => { cancelled = true; None }
                next = running.next() => next,
            };
            let Some((index, result)) = next else { break };
            results[index] = Some(self.finished(&calls[index], result, note.as_deref()));
            written = self.write_prefix(&mut results, written)?;
        }
        if cancelled {
            // Keep whatever already finished (or finishes now that it sees the cancel).
            while let Some(Some((index, result))) = running.next().now_or_never() {
                results[index] = Some(self.finished(&calls[index], result, note.as_deref()));
            }
            // An approved change that has started is waited for: "Cancelled by user" must
            // not be recorded for a file that is changed anyway.
            let open_commit = |results: &[Option<Message>]| {
                (written..calls.len())
                    .any(|i| results[i].is_none() && committed[i].load(Ordering::Acquire))
            };
            while open_commit(&results) {
                match tokio::time::timeout(COMMITTED_GRACE, running.next()).await {
                    Ok(Some((index, result))) => {
                        results[index] =
                            Some(self.finished(&calls[index], result, note.as_deref()));
                    }
                    Ok(None) | Err(_) => break,
                }
            }
            drop(running);
            // Slots before `written` are empty because their results are already in the
            // history (and were reported finished): only the calls after them are open.
            for (index, slot) in results.iter_mut().enumerate().skip(written) {
                if slot.is_none() {
                    let call = &calls[index];
                    self.ctl.emit_progress(Progress::ToolCallFinished {
                        call_id: call.id.clone(),
                        name: call.name.clone(),
                        result: CANCELLED_RESULT.into(),
                        is_error: true,
                    });
                    *slot = Some(Message::tool(&call.id, CANCELLED_RESULT));
                }
            }
            self.write_prefix(&mut results, written)?;
        }
        Ok(cancelled)
    }

    /// Counts identical batches in a row; from [`LOOP_AFTER`] on returns the note each
    /// result carries, and tells the person once per streak.
    fn loop_guard(&mut self, calls: &[ToolCall]) -> Option<String> {
        let key = calls
            .iter()
            .map(|c| format!("{}\u{0}{}", c.name, c.arguments))
            .collect::<Vec<_>>()
            .join("\u{1}");
        if key == self.last_batch {
            self.repeats += 1;
        } else {
            self.last_batch = key;
            self.repeats = 1;
        }
        if self.repeats < LOOP_AFTER {
            return None;
        }
        if self.repeats == LOOP_AFTER {
            self.ctl.emit_progress(Progress::LoopWarning {
                repeats: self.repeats as u32,
                name: calls.first().map(|c| c.name.clone()).unwrap_or_default(),
            });
        }
        Some(format!(
            "\n\n[Bumblehive: this is the same call with the same arguments {} times in a row, and its result will not change. Do something different, or answer with what you have.]",
            self.repeats
        ))
    }

    fn finished(
        &self,
        call: &ToolCall,
        result: Result<crate::tools::ToolOutput, ToolError>,
        note: Option<&str>,
    ) -> Message {
        let (mut text, is_error, images) = match result {
            Ok(output) => (output.text, false, output.images),
            Err(err) => (format!("Error: {err}"), true, Vec::new()),
        };
        if let Some(note) = note {
            text.push_str(note);
        }
        self.ctl.emit_progress(Progress::ToolCallFinished {
            call_id: call.id.clone(),
            name: call.name.clone(),
            result: text.clone(),
            is_error,
        });
        let mut message = Message::tool(&call.id, text);
        message.images = images;
        message
    }

    fn write_prefix(
        &mut self,
        results: &mut [Option<Message>],
        mut written: usize,
    ) -> Result<usize, String> {
        let mut ready = Vec::new();
        while written < results.len() {
            match results[written].take() {
                Some(message) => ready.push(message),
                None => break,
            }
            written += 1;
        }
        if !ready.is_empty() {
            self.append(ready)?;
        }
        Ok(written)
    }
}
