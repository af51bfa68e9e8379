//! The per-session controller (SPEC §4–5): the delivery table, the pending queue and paused state, the current run's steer inbox, subscriptions and snapshots.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::{broadcast, oneshot};
use tokio_util::sync::CancellationToken;

use crate::error::RuntimeError;
use crate::protocol::{
    Event, Message, MessageStatus, PendingMessage, RunConfig, SessionId, SessionState, Snapshot,
    Usage, kinds,
};
use crate::service::Shared;
use crate::store::{LoadedSession, SessionMeta};
use crate::subagents::ChildOutcome;
use crate::tools::{Delegator, ToolRegistry};

/// How many events a subscriber of a top-level session may fall behind before it is told
/// to re-read the snapshot. The buffer is allocated up front, so it stays small per slot
/// (an `Arc`) and smaller still for children, whose events also reach their parent's.
const EVENT_BUFFER: usize = 4096;
const CHILD_EVENT_BUFFER: usize = 512;

/// Events travel shared: one allocation, whatever the number of subscribers and ancestors.
type SharedEvent = Arc<Event>;

/// A message handed to a session, waiting or in flight.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedMessage {
    pub message_id: String,
    pub content: String,
    pub config: RunConfig,
}

impl QueuedMessage {
    fn pending(&self) -> PendingMessage {
        PendingMessage {
            message_id: self.message_id.clone(),
            content: self.content.clone(),
            status: MessageStatus::Queued,
            config: self.config.clone(),
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    Completed(String),
    Failed(String),
    Cancelled,
}

pub(crate) struct ActiveRun {
    pub token: CancellationToken,
    /// Messages steered into the run, consumed at the next safe point (SPEC §4).
    pub inbox: Vec<QueuedMessage>,
    done: CancellationToken,
    waiters: Vec<oneshot::Sender<RunOutcome>>,
}

#[derive(Default)]
pub(crate) struct State {
    pub run: Option<ActiveRun>,
    pub paused: bool,
    pub pending: Vec<QueuedMessage>,
    /// The history, owned by the controller between runs and by the run while it works.
    pub history: Option<Vec<Message>>,
    /// Ids of every user message the session has seen, so a report is never added twice.
    pub message_ids: HashSet<String>,
    pub usage: Usage,
    /// The stored meta, kept current and written through (atomic replace).
    pub meta: Option<SessionMeta>,
    /// Why the session must not be written (a damaged history), if so.
    pub read_only: Option<String>,
}

/// What the subscriber receives.
#[derive(Debug, Clone, PartialEq)]
pub enum Received {
    Event(Event),
    /// The subscriber fell behind and missed this many events: re-read the snapshot.
    Lagged(u64),
}

/// A live event stream of one session (its descendants' events included).
/// Dropping it unsubscribes and cancels nothing.
pub struct Subscription {
    rx: broadcast::Receiver<SharedEvent>,
}

impl Subscription {
    /// The next event; `None` once the session is gone.
    pub async fn recv(&mut self) -> Option<Received> {
        match self.rx.recv().await {
            Ok(event) => Some(Received::Event(Arc::unwrap_or_clone(event))),
            Err(broadcast::error::RecvError::Lagged(missed)) => Some(Received::Lagged(missed)),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }

    /// The next event, skipping lag notices (tests and simple consumers).
    pub async fn next_event(&mut self) -> Option<Event> {
        loop {
            match self.recv().await? {
                Received::Event(event) => return Some(event),
                Received::Lagged(_) => continue,
            }
        }
    }
}

pub struct SessionController {
    pub(crate) meta: SessionMeta,
    pub(crate) shared: Arc<Shared>,
    pub(crate) events: broadcast::Sender<SharedEvent>,
    /// The event senders of the parent, grandparent …: child events reach them too (SPEC §3).
    pub(crate) ancestors: Vec<broadcast::Sender<SharedEvent>>,
    pub(crate) lineage: Vec<SessionId>,
    pub(crate) tools: ToolRegistry,
    pub(crate) delegator: Option<Arc<dyn Delegator>>,
    pub(crate) state: Mutex<State>,
    pub(crate) this: Weak<SessionController>,
}

impl SessionController {
    pub(crate) fn new(
        loaded: LoadedSession,
        pending: Vec<PendingMessage>,
        shared: Arc<Shared>,
        parent: Option<&SessionController>,
        tools: ToolRegistry,
        delegator: Option<Arc<dyn Delegator>>,
    ) -> Arc<Self> {
        let LoadedSession {
            meta,
            messages,
            notice,
            damaged,
        } = loaded;
        let capacity = if parent.is_some() {
            CHILD_EVENT_BUFFER
        } else {
            EVENT_BUFFER
        };
        let (events, _) = broadcast::channel(capacity);
        let (ancestors, mut lineage) = match parent {
            Some(parent) => {
                let mut ancestors = vec![parent.events.clone()];
                ancestors.extend(parent.ancestors.iter().cloned());
                (ancestors, parent.lineage.clone())
            }
            None => (Vec::new(), Vec::new()),
        };
        lineage.insert(0, meta.session_id.clone());
        let state = State {
            // "running" on disk outside recovery is a fresh child about to start.
            paused: meta.state == SessionState::Paused,
            usage: meta.usage,
            message_ids: messages.iter().filter_map(|m| m.id.clone()).collect(),
            history: Some(messages),
            pending: pending
                .into_iter()
                .map(|p| QueuedMessage {
                    message_id: p.message_id,
                    content: p.content,
                    config: p.config,
                })
                .collect(),
            meta: Some(meta.clone()),
            read_only: if damaged { notice } else { None },
            run: None,
        };
        Arc::new_cyclic(|this| SessionController {
            meta,
            shared,
            events,
            ancestors,
            lineage,
            tools,
            delegator,
            state: Mutex::new(state),
            this: this.clone(),
        })
    }

    pub fn session_id(&self) -> &str {
        &self.meta.session_id
    }

    pub fn meta(&self) -> &SessionMeta {
        &self.meta
    }

    /// The session's ancestors' ids, nearest first.
    pub fn depth(&self) -> usize {
        self.ancestors.len()
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends an event to this session's subscribers and its ancestors'.
    pub(crate) fn emit(&self, event: Event) {
        let event = Arc::new(event);
        for ancestor in &self.ancestors {
            let _ = ancestor.send(event.clone());
        }
        let _ = self.events.send(event);
    }

    pub(crate) fn emit_kind(&self, kind: &str, data: serde_json::Value) {
        self.emit(Event::Event {
            session_id: self.meta.session_id.clone(),
            kind: kind.to_string(),
            data,
        });
    }

    fn emit_status(&self, message_id: &str, status: MessageStatus) {
        self.emit(Event::MessageStatus {
            session_id: self.meta.session_id.clone(),
            message_id: message_id.to_string(),
            status,
        });
    }

    /// A live event stream and the authoritative snapshot, taken together (SPEC §5).
    pub fn subscribe(&self) -> (Subscription, Snapshot) {
        let state = self.lock();
        // Subscribe before reading: an event raced with the snapshot is seen twice, never lost.
        let rx = self.events.subscribe();
        let snapshot = self.snapshot_locked(&state);
        (Subscription { rx }, snapshot)
    }

    /// What a transport forwards: the snapshot first, then live events. A consumer that
    /// fell behind (the runtime never waits for it) gets a fresh snapshot and continues.
    /// Ends when `stop` fires; dropping it cancels nothing.
    pub fn feed(
        self: &Arc<Self>,
        stop: CancellationToken,
    ) -> impl futures::Stream<Item = Event> + Send + 'static {
        let (subscription, snapshot) = self.subscribe();
        let first = Some(Event::Snapshot(snapshot));
        futures::stream::unfold(
            (first, subscription, self.clone(), stop),
            |(first, mut subscription, controller, stop)| async move {
                if let Some(first) = first {
                    return Some((first, (None, subscription, controller, stop)));
                }
                let received = tokio::select! {
                    _ = stop.cancelled() => None,
                    received = subscription.recv() => received,
                }?;
                let event = match received {
                    Received::Event(event) => event,
                    Received::Lagged(missed) => {
                        tracing::debug!(
                            missed,
                            "a subscriber fell behind; sending a fresh snapshot"
                        );
                        Event::Snapshot(controller.snapshot())
                    }
                };
                Some((event, (None, subscription, controller, stop)))
            },
        )
    }

    /// Dropping the subscription is enough; this names the act.
    pub fn unsubscribe(&self, subscription: Subscription) {
        drop(subscription);
    }

    pub fn snapshot(&self) -> Snapshot {
        let state = self.lock();
        self.snapshot_locked(&state)
    }

    fn snapshot_locked(&self, state: &State) -> Snapshot {
        let id = &self.meta.session_id;
        let mut pending: Vec<PendingMessage> =
            state.pending.iter().map(QueuedMessage::pending).collect();
        if let Some(run) = &state.run {
            pending.extend(run.inbox.iter().map(|m| PendingMessage {
                status: MessageStatus::Steered,
                ..m.pending()
            }));
        }
        Snapshot {
            session_id: id.clone(),
            running: state.run.is_some(),
            paused: state.paused,
            pending,
            approvals: self.shared.approvals.visible_to(id),
            subagents: self.shared.subagents.snapshot(id),
            usage: state.usage,
            tree_usage: self.shared.tree_usage(id, state.usage),
        }
    }

    pub fn is_running(&self) -> bool {
        self.lock().run.is_some()
    }

    pub fn is_paused(&self) -> bool {
        self.lock().paused
    }

    pub fn state(&self) -> SessionState {
        let state = self.lock();
        if state.run.is_some() {
            SessionState::Running
        } else if state.paused {
            SessionState::Paused
        } else {
            SessionState::Idle
        }
    }

    pub fn pending(&self) -> Vec<PendingMessage> {
        self.lock()
            .pending
            .iter()
            .map(QueuedMessage::pending)
            .collect()
    }

    /// The person's message. A person who writes after pressing Stop means to go on,
    /// so a paused session is resumed by it; reports are what `deliver` queues.
    pub fn submit(
        &self,
        content: String,
        config: Option<RunConfig>,
    ) -> Result<(String, MessageStatus), RuntimeError> {
        if content.trim().is_empty() {
            return Err(RuntimeError::InvalidArgument(
                "content must not be empty".into(),
            ));
        }
        let message = QueuedMessage {
            message_id: format!("msg-{}", uuid::Uuid::now_v7().simple()),
            content,
            config: config.unwrap_or_default(),
        };
        let id = message.message_id.clone();
        let mut state = self.lock();
        self.check_writable(&state)?;
        if state.run.is_none() && state.paused {
            state.paused = false;
        }
        let status = self.deliver_locked(&mut state, message);
        Ok((id, status))
    }

    /// Hands a message to the session: the table of SPEC §4, in this one place.
    pub fn deliver(&self, message: QueuedMessage) -> Option<MessageStatus> {
        let mut state = self.lock();
        if state.message_ids.contains(&message.message_id)
            || state
                .pending
                .iter()
                .any(|m| m.message_id == message.message_id)
        {
            tracing::warn!(session = %self.meta.session_id, message = %message.message_id, "dropping a duplicate delivery");
            return None;
        }
        Some(self.deliver_locked(&mut state, message))
    }

    fn deliver_locked(&self, state: &mut State, message: QueuedMessage) -> MessageStatus {
        let id = message.message_id.clone();
        let status = if let Some(run) = state.run.as_mut() {
            run.inbox.push(message);
            MessageStatus::Steered
        } else if state.paused || state.read_only.is_some() || self.shared.root.is_cancelled() {
            state.pending.push(message);
            self.save_pending(state);
            MessageStatus::Queued
        } else {
            self.start_run_locked(state, message);
            MessageStatus::Started
        };
        self.emit_status(&id, status);
        status
    }

    fn pending_index(&self, state: &State, message_id: &str) -> Result<usize, RuntimeError> {
        state
            .pending
            .iter()
            .position(|m| m.message_id == message_id)
            .ok_or_else(|| {
                RuntimeError::NotFound(format!(
                    "pending message {message_id} in session {}",
                    self.meta.session_id
                ))
            })
    }

    /// A session whose history is damaged takes no new run (nothing is written to it).
    fn check_writable(&self, state: &State) -> Result<(), RuntimeError> {
        match &state.read_only {
            Some(why) => Err(RuntimeError::InvalidArgument(format!(
                "session {} is read-only: {why}",
                self.meta.session_id
            ))),
            None => Ok(()),
        }
    }

    /// `steer(message_id)`: a pending message goes into the running run's inbox, or starts a run.
    pub fn steer(&self, message_id: &str) -> Result<MessageStatus, RuntimeError> {
        let mut state = self.lock();
        let index = self.pending_index(&state, message_id)?;
        if state.run.is_none() {
            self.check_writable(&state)?;
        }
        let message = state.pending.remove(index);
        self.save_pending(&state);
        let status = if let Some(run) = state.run.as_mut() {
            run.inbox.push(message);
            MessageStatus::Steered
        } else {
            state.paused = false;
            self.start_run_locked(&mut state, message);
            MessageStatus::Started
        };
        self.emit_status(message_id, status);
        Ok(status)
    }

    /// Drops a pending message.
    pub fn discard(&self, message_id: &str) -> Result<(), RuntimeError> {
        let mut state = self.lock();
        let index = self.pending_index(&state, message_id)?;
        state.pending.remove(index);
        self.save_pending(&state);
        drop(state);
        self.emit_kind(
            kinds::MESSAGE_DISCARDED,
            serde_json::json!({"message_id": message_id}),
        );
        Ok(())
    }

    /// Stops the current run and waits until it has written its synthetic results and
    /// put unconsumed steered messages back to pending. Children are not stopped.
    pub async fn cancel(&self) {
        let done = {
            let state = self.lock();
            let Some(run) = &state.run else {
                return;
            };
            run.token.cancel();
            run.done.clone()
        };
        done.cancelled().await;
    }

    /// Starts a run with `message` on an idle session and returns how it ends.
    /// Used for children, whose first message starts their only run.
    pub(crate) fn start_watched(&self, message: QueuedMessage) -> oneshot::Receiver<RunOutcome> {
        let (tx, rx) = oneshot::channel();
        let mut state = self.lock();
        let id = message.message_id.clone();
        let status = self.deliver_locked(&mut state, message);
        match (status, state.run.as_mut()) {
            (MessageStatus::Started, Some(run)) => run.waiters.push(tx),
            _ => {
                tracing::warn!(session = %self.meta.session_id, message = %id, "child could not start a run");
                let _ = tx.send(RunOutcome::Cancelled);
            }
        }
        rx
    }

    fn start_run_locked(&self, state: &mut State, first: QueuedMessage) {
        self.start_run_with(state, Some(first));
    }

    /// Starts a run; without a first message it continues from the history (resuming an
    /// interrupted child).
    fn start_run_with(&self, state: &mut State, first: Option<QueuedMessage>) {
        let token = self.shared.root.child_token();
        // A session found "running" on disk at the next start was cut off by a crash;
        // recovery repairs it.
        self.update_meta(state, |meta| meta.state = SessionState::Running);
        let done = CancellationToken::new();
        state.run = Some(ActiveRun {
            token: token.clone(),
            inbox: Vec::new(),
            done: done.clone(),
            waiters: Vec::new(),
        });
        self.shared.run_started();
        let Some(this) = self.this.upgrade() else {
            return;
        };
        tokio::spawn(crate::run::run(this, first, token));
    }

    /// Safe point 2: a final answer ends the run only if nothing was steered in meanwhile.
    /// Returns the steered messages to append when the run must go on.
    pub(crate) fn finish_or_take_inbox(
        &self,
        answer: &str,
        history: &mut Vec<Message>,
    ) -> Option<Vec<QueuedMessage>> {
        let mut state = self.lock();
        let run = state.run.as_mut()?;
        if !run.inbox.is_empty() {
            return Some(std::mem::take(&mut run.inbox));
        }
        let outcome = RunOutcome::Completed(answer.to_string());
        self.end_run_locked(&mut state, Some(std::mem::take(history)), outcome);
        None
    }

    /// Safe point 1: messages steered in while the batch ran.
    pub(crate) fn take_inbox(&self) -> Vec<QueuedMessage> {
        let mut state = self.lock();
        state
            .run
            .as_mut()
            .map(|run| std::mem::take(&mut run.inbox))
            .unwrap_or_default()
    }

    /// Ends a run that was cancelled or failed: unconsumed steered messages go back to
    /// pending in order, approvals are denied, the session is paused (SPEC §4).
    pub(crate) fn stop_run(&self, history: Option<Vec<Message>>, outcome: RunOutcome) {
        self.shared.approvals.deny_session(&self.meta.session_id);
        let mut state = self.lock();
        self.end_run_locked(&mut state, history, outcome);
    }

    fn end_run_locked(
        &self,
        state: &mut State,
        history: Option<Vec<Message>>,
        outcome: RunOutcome,
    ) {
        let Some(run) = state.run.take() else {
            return;
        };
        // A history that failed to load stays unloaded, so the next run reads it again.
        state.history = history;
        let stopped = !matches!(outcome, RunOutcome::Completed(_));
        if stopped {
            // Unconsumed steered messages go back to pending, in order (SPEC §4).
            state.pending.extend(run.inbox.iter().cloned());
            state.paused = true;
            self.save_pending(state);
        }
        // The stored state is settled before anyone hears the run ended: whoever acts on
        // the event (a restart, a list) must not find the session still "running".
        let usage = state.usage;
        let paused = state.paused;
        self.update_meta(state, |meta| {
            meta.usage = usage;
            meta.state = if paused {
                SessionState::Paused
            } else {
                SessionState::Idle
            };
            meta.updated_at = crate::store::now();
        });
        self.shared.run_ended();
        let id = self.meta.session_id.clone();
        match &outcome {
            RunOutcome::Completed(answer) => self.emit(Event::Result {
                session_id: id,
                content: answer.clone(),
            }),
            RunOutcome::Failed(message) => {
                for message in run.inbox.iter() {
                    self.emit_status(&message.message_id, MessageStatus::Queued);
                }
                self.emit(Event::Error {
                    session_id: id,
                    message: message.clone(),
                });
            }
            RunOutcome::Cancelled => {
                for message in run.inbox.iter() {
                    self.emit_status(&message.message_id, MessageStatus::Queued);
                }
                self.emit_kind(kinds::RUN_CANCELLED, serde_json::Value::Null);
            }
        }
        for waiter in run.waiters {
            let _ = waiter.send(outcome.clone());
        }
        run.done.cancel();
    }

    /// Takes the history for a run (loading it from disk the first time).
    pub(crate) fn take_history(&self) -> Result<Vec<Message>, RuntimeError> {
        let cached = self.lock().history.take();
        match cached {
            Some(history) => Ok(history),
            None => Ok(self.shared.store.load(&self.meta.session_id)?.messages),
        }
    }

    /// Decides an approval asked by this session or by one of its descendants.
    pub fn decide_approval(&self, approval_id: &str, approved: bool) -> Result<(), RuntimeError> {
        self.decide_approval_with(approval_id, approved, false, None)
    }

    pub fn decide_approval_with(
        &self,
        approval_id: &str,
        approved: bool,
        remember: bool,
        reason: Option<String>,
    ) -> Result<(), RuntimeError> {
        if self.shared.approvals.decide(
            &self.meta.session_id,
            approval_id,
            approved,
            remember,
            reason,
        ) {
            Ok(())
        } else {
            Err(RuntimeError::NotFound(format!(
                "approval {approval_id} in session {}",
                self.meta.session_id
            )))
        }
    }

    /// The approval gate of this session's tools.
    pub(crate) fn gate(&self) -> Arc<dyn crate::tools::ApprovalGate> {
        let shared = self.shared.clone();
        let this = self.this.clone();
        Arc::new(crate::approvals::SessionGate {
            book: self.shared.approvals.clone(),
            session_id: self.meta.session_id.clone(),
            parent_session_id: self.meta.parent_session_id.clone(),
            title: self
                .meta
                .parent_session_id
                .as_ref()
                .map(|_| self.meta.title.clone()),
            lineage: self.lineage.clone(),
            policy: Box::new(move |tool| {
                shared.read_config(|config| config.tools.policy.get(tool).copied())
            }),
            emit: Arc::new(move |event| {
                if let Some(ctl) = this.upgrade() {
                    ctl.emit(event);
                }
            }),
        })
    }

    pub(crate) fn remember_message_id(&self, id: &str) {
        self.lock().message_ids.insert(id.to_string());
    }

    pub(crate) fn add_usage(&self, usage: Usage) {
        self.lock().usage.add(usage);
        self.shared.add_tree_usage(&self.lineage, usage);
    }

    /// Changes the stored meta and writes it through (atomic replace; rare: run start/end).
    fn update_meta(&self, state: &mut State, change: impl FnOnce(&mut SessionMeta)) {
        let Some(meta) = state.meta.as_mut() else {
            return;
        };
        change(meta);
        if let Err(err) = self.shared.store.write_meta(meta) {
            tracing::warn!(session = %self.meta.session_id, "cannot save session meta: {err}");
        }
    }

    /// The pending queue survives restarts (SPEC §4, durability).
    fn save_pending(&self, state: &State) {
        let pending: Vec<PendingMessage> =
            state.pending.iter().map(QueuedMessage::pending).collect();
        if let Err(err) = self
            .shared
            .store
            .write_pending(&self.meta.session_id, &pending)
        {
            tracing::warn!(session = %self.meta.session_id, "cannot save the pending queue: {err}");
        }
    }

    /// Resumes an interrupted child from its own history: a run with no new message.
    pub(crate) fn start_resumed(&self) -> oneshot::Receiver<RunOutcome> {
        let (tx, rx) = oneshot::channel();
        let mut state = self.lock();
        if state.run.is_some() || state.read_only.is_some() || self.shared.root.is_cancelled() {
            let _ = tx.send(RunOutcome::Cancelled);
            return rx;
        }
        state.paused = false;
        self.start_run_with(&mut state, None);
        if let Some(run) = state.run.as_mut() {
            run.waiters.push(tx);
        }
        rx
    }

    /// A child's report is in its parent's ledger.
    pub(crate) fn mark_reported(&self) {
        let mut state = self.lock();
        self.update_meta(&mut state, |meta| meta.reported = true);
    }

    /// The stored meta as it is now (interrupted, reported, state …).
    pub fn current_meta(&self) -> SessionMeta {
        self.lock()
            .meta
            .clone()
            .unwrap_or_else(|| self.meta.clone())
    }

    pub(crate) fn set_interrupted(&self, interrupted: bool) {
        let mut state = self.lock();
        self.update_meta(&mut state, |meta| meta.interrupted = interrupted);
    }

    /// Waits for a resumed child's run, like [`Self::run_child`].
    pub(crate) async fn resume_child(&self, token: CancellationToken) -> ChildOutcome {
        let outcome = self.start_resumed();
        self.child_outcome(outcome, token).await
    }

    /// Waits for a child's run and maps it to the task registry's outcome; a cancelled
    /// task stops the child's run.
    pub(crate) async fn run_child(
        &self,
        message: QueuedMessage,
        token: CancellationToken,
    ) -> ChildOutcome {
        let outcome = self.start_watched(message);
        self.child_outcome(outcome, token).await
    }

    async fn child_outcome(
        &self,
        outcome: oneshot::Receiver<RunOutcome>,
        token: CancellationToken,
    ) -> ChildOutcome {
        tokio::select! {
            outcome = outcome => match outcome {
                Ok(RunOutcome::Completed(answer)) => ChildOutcome::Completed(answer),
                Ok(RunOutcome::Failed(message)) => ChildOutcome::Failed(message),
                Ok(RunOutcome::Cancelled) | Err(_) => ChildOutcome::Stopped,
            },
            _ = token.cancelled() => {
                self.cancel().await;
                ChildOutcome::Stopped
            }
        }
    }
}
