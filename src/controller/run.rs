//! The run loop (SPEC §2, §4): model call → tool batch → model call … until a final answer, with the steer inbox drained only at safe points and synthetic results for calls a cancel left open.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio_util::sync::CancellationToken;

use super::{QueuedMessage, RunOutcome, SessionController};
use crate::protocol::{Message, Progress, RunConfig, ToolCall};
use crate::provider::{ModelRequest, ProviderEvent};
use crate::runtime::TurnContext;
use crate::tools::{COMMITTED, ToolContext, ToolError};

/// The result text of a call that a cancel left without one.
pub const CANCELLED_RESULT: &str = "Cancelled by user";

/// The result text given to calls a crash (or a failed run) left unanswered.
pub const INTERRUPTED_RESULT: &str = "Interrupted: Bumblehive stopped before this call finished";

/// How long a cancelled batch waits for changes the person already approved and that
/// have started: their result must say truthfully that they happened (runtime review C8).
const COMMITTED_GRACE: Duration = Duration::from_secs(30);

pub fn system_prompt(workspace: &str, is_child: bool) -> String {
    let role = if is_child {
        "You are a Bumblehive sub-agent: a parent agent delegated one task to you. Do it, then answer with a concise report; that answer is sent to the parent."
    } else {
        "You are Bumblehive, a coding agent working with a person on the files of one workspace. Use the tools to read and change files; changes need the person's approval. Delegate independent pieces of work with sub_agent; their reports arrive later as messages."
    };
    format!("{role}\nWorkspace: {workspace}\nRelative paths are resolved in the workspace.")
}

struct Run {
    ctl: Arc<SessionController>,
    history: Vec<Message>,
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
}

/// From this many identical batches in a row, the model is told it repeats itself and
/// the person is shown a notice.
const LOOP_AFTER: usize = 3;

/// Starts a run task. A panic inside it ends the run as failed (an `error` event, the
/// session paused and valid) instead of leaving it "running" forever (runtime review C17).
pub(super) fn spawn(
    ctl: Arc<SessionController>,
    first: Option<QueuedMessage>,
    token: CancellationToken,
) {
    tokio::spawn(async move {
        let guard = ctl.clone();
        let outcome = std::panic::AssertUnwindSafe(run(ctl, first, token))
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
async fn run(ctl: Arc<SessionController>, first: Option<QueuedMessage>, token: CancellationToken) {
    let requeue: Vec<QueuedMessage> = first.iter().cloned().collect();
    let history = match ctl.take_history() {
        Ok(history) => history,
        Err(err) => {
            let message = format!("cannot load the session's history: {err}");
            ctl.stop_run(None, RunOutcome::Failed(message), requeue);
            return;
        }
    };
    let config = first.as_ref().map(|m| m.config.clone()).unwrap_or_default();
    let workspace = config
        .runtime
        .workspace
        .clone()
        .unwrap_or_else(|| ctl.meta().workspace.clone());
    // Resolved once: a config change applies from the next run (SPEC §6).
    let meta = ctl.current_meta();
    let request = crate::runtime::TurnRequest {
        depth: ctl.depth(),
        workspace: std::path::Path::new(&workspace),
        agent: meta.agent.as_deref(),
        provider: meta.provider.as_deref(),
        model: meta.model.as_deref(),
    };
    // MCP servers start with the first run that can use them (nothing without any).
    let mcp_servers = ctl.shared.read_config(|c| c.mcp_servers.clone());
    let hidden = || ctl.shared.read_config(crate::mcp::provider_key_env);
    let untrusted = ctl
        .shared
        .mcp
        .prepare(&mcp_servers, request.workspace, &token, hidden)
        .await;
    if !untrusted.is_empty() {
        ctl.emit_progress(Progress::McpTrustNeeded {
            workspace: workspace.clone(),
            servers: untrusted,
        });
    }
    let turn = match ctl.shared.resolve_turn(request) {
        Ok(turn) => turn,
        Err(err) => {
            ctl.stop_run(Some(history), RunOutcome::Failed(err), requeue);
            return;
        }
    };
    let mut run = Run {
        ctl,
        history,
        token,
        workspace,
        config,
        turn,
        requeue: Vec::new(),
        last_batch: String::new(),
        repeats: 0,
    };
    let outcome = run.drive(first).await;
    let Run {
        ctl,
        history,
        requeue,
        ..
    } = run;
    // `drive` returns only for stops; a completed run was ended at its last safe point.
    if let Some(outcome) = outcome {
        // What the stopped run appended is flushed before the session is told it ended.
        sync_history(&ctl).await;
        ctl.stop_run(Some(history), outcome, requeue);
    }
}

async fn sync_history(ctl: &SessionController) {
    let store = ctl.shared.store.clone();
    let id = ctl.session_id().to_string();
    let flushed = tokio::task::spawn_blocking(move || store.sync(&id)).await;
    match flushed {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::warn!(session = %ctl.session_id(), "fsync failed: {err}"),
        Err(err) => tracing::warn!(session = %ctl.session_id(), "fsync task failed: {err}"),
    }
}

impl Run {
    /// Returns `None` when the run completed (already ended under the controller's
    /// lock), or how it stopped.
    async fn drive(&mut self, first: Option<QueuedMessage>) -> Option<RunOutcome> {
        if let Err(err) = self.append_users(first.into_iter().collect()) {
            return Some(RunOutcome::Failed(err));
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
                self.ctl.add_usage(usage);
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
                let cancelled = match self.tool_batch(calls, note).await {
                    Ok(cancelled) => cancelled,
                    Err(err) => return Some(RunOutcome::Failed(err)),
                };
                self.sync().await;
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

    fn append_users(&mut self, queued: Vec<QueuedMessage>) -> Result<(), String> {
        if queued.is_empty() {
            return Ok(());
        }
        let messages: Vec<Message> = queued
            .iter()
            .map(|m| Message::user(m.message_id.clone(), m.content.clone()))
            .collect();
        if let Err(err) = self.append(messages.clone()) {
            // Not in the history, so not consumed: they go back to pending (C7).
            self.requeue.extend(queued);
            return Err(err);
        }
        for message in &queued {
            self.ctl.remember_message_id(&message.message_id);
        }
        // A report in the history is delivered; note it in the ledger so recovery
        // need not read this history to know.
        for message in &messages {
            if let Some(task_id) = message
                .id
                .as_deref()
                .and_then(|id| id.strip_prefix("subagent:"))
            {
                if let Err(err) = self
                    .ctl
                    .shared
                    .store
                    .mark_delivered(self.ctl.session_id(), task_id)
                {
                    tracing::warn!(session = %self.ctl.session_id(), "cannot note a delivered report: {err}");
                }
            }
        }
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
        self.history.extend(messages);
        Ok(())
    }

    /// The end of a run step: flush the history to the disk (the fsync policy). On a
    /// blocking thread, since a flush can take milliseconds and must not stall other runs.
    async fn sync(&self) {
        sync_history(&self.ctl).await;
    }

    /// One model call; `Ok(Err(text streamed so far))` when cancelled.
    async fn model_call(&self) -> Result<Result<crate::provider::ModelResponse, String>, String> {
        let provider = self.turn.provider.clone();
        let mut messages = Vec::with_capacity(self.history.len() + 1);
        let mut system =
            system_prompt(&self.workspace, self.ctl.meta().parent_session_id.is_some());
        if !self.turn.instructions.is_empty() {
            system.push_str("\n\nYour instructions as this agent:\n");
            system.push_str(&self.turn.instructions);
        }
        messages.push(Message::system(system));
        messages.extend(self.history.iter().cloned());
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
        let cancelled = tokio::select! {
            biased;
            _ = self.token.cancelled() => true,
            response = provider.generate(request, &sink) => {
                return response.map(Ok).map_err(|err| err.to_string());
            }
        };
        debug_assert!(cancelled);
        let text = std::mem::take(&mut *streamed.lock().unwrap_or_else(|p| p.into_inner()));
        Ok(Err(text))
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
        let ctx = ToolContext {
            session_id: self.ctl.session_id().to_string(),
            workspace: PathBuf::from(&self.workspace),
            call_id: String::new(),
            cancel: self.token.child_token(),
            approvals: self.ctl.gate(self.turn.policy.clone()),
            delegator: self.turn.delegator.clone(),
            run_config: self.config.clone(),
            secret_env: self.turn.secret_env.clone(),
        };
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
                let result = tools.call(&ctx, &call.name, call.arguments.clone()).await;
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
        result: Result<String, ToolError>,
        note: Option<&str>,
    ) -> Message {
        let (mut text, is_error) = match result {
            Ok(text) => (text, false),
            Err(err) => (format!("Error: {err}"), true),
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
        Message::tool(&call.id, text)
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
