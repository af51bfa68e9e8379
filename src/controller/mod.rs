//! The per-session controller (SPEC §4–5): the session's state machine (one `Phase`), the delivery table and both safe points as one `match` over it, the pending queue, subscriptions and snapshots.
//!
//! Why a locked struct and not an actor (ops in, events out): every rule here is a
//! decision over a small state that must be atomic with the run's inbox (safe point 2
//! tests "inbox empty → end the run" in one step) and whose answer the caller needs at
//! once (`deliver` returns `started` / `steered` / `queued`, the seed asserts it). One
//! mutex held for microseconds, never across an await, gives that without a round trip
//! through a queue per call; the run task (`run`) is the only writer of the history.

mod run;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::{broadcast, oneshot};
use tokio_util::sync::CancellationToken;

use crate::context::environment::Environment;
use crate::error::{RuntimeError, StoreError};
use crate::protocol::{
    Compaction, ContextMeter, Event, InstructionFile, Message, MessageStatus, PendingMessage,
    Progress, Role, RunConfig, SessionId, SessionState, Snapshot, Usage,
};
use crate::runtime::Shared;
use crate::store::{LoadedSession, SessionMeta};
use crate::subagents::ChildOutcome;

pub use run::{CANCELLED_RESULT, INTERRUPTED_RESULT};

/// How many events a subscriber of a top-level session may fall behind before it is told
/// to re-read the snapshot. The buffer is allocated whole when the first subscriber comes,
/// so it stays small per slot (an `Arc`) and smaller still for children, whose events also
/// reach their parent's.
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
    /// Images of a person's message.
    pub images: Vec<crate::protocol::ImagePart>,
}

impl QueuedMessage {
    /// The `user` message it becomes in the history.
    pub(crate) fn to_user(&self) -> Message {
        let mut message = Message::user(self.message_id.clone(), self.content.clone());
        message.images = self.images.clone();
        message
    }

    fn pending(&self) -> PendingMessage {
        PendingMessage {
            message_id: self.message_id.clone(),
            content: self.content.clone(),
            status: MessageStatus::Queued,
            config: self.config.clone(),
            images: self.images.clone(),
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    Completed(String),
    Failed(String),
    Cancelled,
    /// Cut off by something other than the person (an ACP child's agent process died
    /// mid-turn): a sub-agent is then interrupted, resumable, and owes its report; a
    /// session that is no sub-agent ends as failed.
    Interrupted(String),
    /// A run started by the `compact` command compacted the history and ended with
    /// nothing else to do; `paused` when the session was paused before and stays so.
    Compacted {
        paused: bool,
    },
}

pub(crate) struct ActiveRun {
    token: CancellationToken,
    /// Messages steered into the run, consumed at the next safe point (SPEC §4).
    inbox: Vec<QueuedMessage>,
    /// Messages the run took from its inbox at a safe point and is writing to its history:
    /// the stored queue names them until the history has them (`inbox_consumed`). Before,
    /// a queue written in that moment (another message steered in) left them out, and a
    /// process killed before the history's write lost a message the person was told was
    /// taken (the simulation, seed 520018).
    taken: Vec<QueuedMessage>,
    /// Ids of inbox messages the person sent (or took out of pending): if the run ends
    /// without consuming them (a compaction), they start the session even when paused.
    by_person: HashSet<String>,
    done: CancellationToken,
    waiters: Vec<oneshot::Sender<RunOutcome>>,
    /// The `compact` command asked for a compaction before the next model call.
    compact: bool,
}

/// A child's run that its task holds but that has not begun: the task waits for its slot
/// (the children cap), and whatever is sent meanwhile joins it.
pub(crate) struct Starting {
    /// The messages the run begins with, in order; none for a resumed child, which
    /// continues its own history.
    inbox: Vec<QueuedMessage>,
    /// Fired when the person stops the child before its run began: its task reports that.
    stop: CancellationToken,
}

/// What a child's start writes to its stored meta, held back while the report of the run
/// before it is still being recorded (`start_child_locked`).
struct DeferredStart {
    /// The first message of the run that starts (`SessionMeta::run_message`).
    run_message: Option<String>,
}

/// A child's start as its stored meta says it: it works (or waits, stopped, for its
/// report of that), owes a report, and which message its run begins with.
fn owe_start(meta: &mut SessionMeta, paused: bool, start: DeferredStart) {
    meta.state = if paused {
        SessionState::Paused
    } else {
        SessionState::Running
    };
    meta.reported = false;
    meta.failed = false;
    meta.interrupted = false;
    meta.run_message = start.run_message;
}

/// The life of a session, a child's included. Every rule of SPEC §4 is a `match` over
/// this, and every change of it is made in one step under the controller's lock.
pub(crate) enum Phase {
    /// The last run ended normally (or none ran): a message starts a run.
    Idle,
    /// A child's run waits in its task for a slot (never a top-level session's).
    Starting(Starting),
    Running(ActiveRun),
    /// The last run was stopped or failed: reports wait in `pending`.
    Paused,
    /// Being deleted or deleted: nothing is delivered, nothing starts. A run still ending
    /// is kept so that `cancel` can wait for it.
    Deleted(Option<ActiveRun>),
}

impl Phase {
    fn run_mut(&mut self) -> Option<&mut ActiveRun> {
        match self {
            Phase::Running(run) | Phase::Deleted(Some(run)) => Some(run),
            _ => None,
        }
    }

    fn run(&self) -> Option<&ActiveRun> {
        match self {
            Phase::Running(run) | Phase::Deleted(Some(run)) => Some(run),
            _ => None,
        }
    }
}

/// Who hands a message to the session; only a paused session tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// The person's own message: a person who writes after pressing Stop means to go on,
    /// so it resumes a paused session (README: a documented reading of §4's table).
    Person,
    /// A report: queued while paused (SPEC §4).
    Delivery,
    /// `steer(message_id)`: the person takes a pending message out explicitly.
    Steer,
    /// A child's task (`sub_agent`) or its parent's `message_subagent`: it starts a child
    /// paused by a failure, which the person did not choose, and waits with one the
    /// person stopped.
    Parent,
}

/// What the delivery table decides for a message.
enum Route {
    Inbox,
    Start,
    /// A child's run: through its task (slot, report), never a run of its own.
    StartChild,
    Queue,
    Refuse(RuntimeError),
}

/// Registers the task of a child's run that waits in [`Phase::Starting`]. Called under the
/// child's lock, so it must not take it; it never blocks.
pub(crate) trait ChildTasks: Send + Sync {
    fn spawn(
        &self,
        child: Arc<SessionController>,
        meta: &SessionMeta,
        config: RunConfig,
        run: u64,
    ) -> Result<oneshot::Receiver<Result<(), crate::subagents::StartError>>, String>;

    /// Whether a task of this child is still registered: its run is over and its report
    /// on the way to the parent's ledger, or it is ending without one.
    fn has_task(&self, session_id: &str) -> bool;
}

/// What a child's delivery gave: the status, and for a run that was started the
/// receiver of its task's lease (a `sub_agent` call waits for it, SPEC §3).
pub(crate) type ChildDelivery = (
    MessageStatus,
    Option<oneshot::Receiver<Result<(), crate::subagents::StartError>>>,
);

pub(crate) struct State {
    phase: Phase,
    pending: Vec<QueuedMessage>,
    /// The history, owned by the controller between runs and by the run while it works.
    history: Option<Vec<Message>>,
    /// Ids of every user message the session has seen, so a report is never added twice.
    message_ids: HashSet<String>,
    /// Task ids of every child this session delegated to, so a reused call id gets a
    /// fresh task id (SPEC §11).
    task_ids: HashSet<String>,
    /// How many runs of this child `start_child_locked` began (each owes a report): a
    /// report of an earlier run, marked late, leaves a later run owing its own.
    child_runs: u64,
    /// A start of this child's next run whose stored "running, owes a report" waits for
    /// the report of the run before it to be recorded (`start_child_locked`).
    deferred_start: Option<DeferredStart>,
    usage: Usage,
    /// Tokens per provider and model, written with `usage` at the end of a run.
    models: Vec<crate::protocol::ModelUsage>,
    /// The stored meta, kept current and written through (in place).
    meta: SessionMeta,
    /// The last write of `meta` failed: the next change writes even if it changes
    /// nothing more.
    meta_unsaved: bool,
    /// Why the session must not be written (a damaged history), if so.
    read_only: Option<String>,
    /// The latest compaction marker of the history (what the next request is built from).
    compaction: Option<Compaction>,
    /// The context meter as of the last model call (or its estimate before one).
    context: Option<ContextMeter>,
    /// The instruction files the last run loaded.
    instructions: Vec<InstructionFile>,
    /// The environment the system prompt describes, looked at once per loaded session so
    /// the prompt's prefix stays the same from turn to turn (providers cache it).
    environment: Option<Arc<Environment>>,
}

/// What the subscriber receives.
#[derive(Debug, Clone, PartialEq)]
// One value per `recv`, moved once: boxing the event would add an allocation per event
// for nothing (the channel itself shares events behind an `Arc`).
#[allow(clippy::large_enum_variant)]
pub enum Received {
    Event(Event),
    /// The subscriber fell behind and missed this many events: re-read the snapshot.
    Lagged(u64),
}

/// A live event stream of one session (its descendants' events included).
/// Dropping it unsubscribes and cancels nothing. It keeps its controller alive, so the
/// stream is never orphaned by eviction.
pub struct Subscription {
    rx: broadcast::Receiver<SharedEvent>,
    _controller: Option<Arc<SessionController>>,
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
    meta: SessionMeta,
    pub(crate) shared: Arc<Shared>,
    /// Made when the first subscriber comes (`subscribe`): a session nobody watches (a
    /// child in a fan-out with no window open, a session loaded for a command) holds no
    /// ring of events and builds none (`listened`). A new subscriber sees only events sent
    /// after it subscribed either way, so an event before the channel exists is lost to
    /// no one.
    events: std::sync::OnceLock<broadcast::Sender<SharedEvent>>,
    /// The parent's controller: child events reach every ancestor's subscribers (SPEC
    /// §3), and a live child keeps its ancestors loaded.
    parent: Option<Arc<SessionController>>,
    /// The size of the ring of events (`events`) when it is made.
    capacity: usize,
    /// This session's id, then its ancestors', nearest first.
    lineage: Vec<SessionId>,
    state: Mutex<State>,
    this: Weak<SessionController>,
}

impl SessionController {
    pub(crate) fn new(
        loaded: LoadedSession,
        pending: Vec<PendingMessage>,
        task_ids: HashSet<String>,
        shared: Arc<Shared>,
        parent: Option<Arc<SessionController>>,
    ) -> Arc<Self> {
        let LoadedSession {
            meta,
            messages,
            mut compactions,
            notice,
            damaged,
        } = loaded;
        let capacity = if parent.is_some() {
            CHILD_EVENT_BUFFER
        } else {
            EVENT_BUFFER
        };
        let mut lineage = vec![meta.session_id.clone()];
        if let Some(parent) = &parent {
            lineage.extend(parent.lineage.iter().cloned());
        }
        let mut task_ids = task_ids;
        task_ids.extend(started_task_ids(&messages));
        let history_ids: HashSet<String> = messages.iter().filter_map(|m| m.id.clone()).collect();
        let state = State {
            // "running" on disk outside recovery is a fresh child about to start.
            phase: if meta.state == SessionState::Paused {
                Phase::Paused
            } else {
                Phase::Idle
            },
            usage: meta.usage,
            models: meta.models.clone(),
            meta_unsaved: false,
            message_ids: messages.iter().filter_map(|m| m.id.clone()).collect(),
            task_ids,
            child_runs: 0,
            deferred_start: None,
            history: Some(messages),
            pending: pending
                .into_iter()
                // Steered into a run that had taken it into its history when the process
                // stopped (its stored queue still names it): it is not waiting any more.
                .filter(|p| !history_ids.contains(&p.message_id))
                .map(|p| QueuedMessage {
                    message_id: p.message_id,
                    content: p.content,
                    config: p.config,
                    images: p.images,
                })
                .collect(),
            meta: meta.clone(),
            read_only: if damaged { notice } else { None },
            compaction: compactions.pop(),
            context: None,
            instructions: Vec::new(),
            environment: None,
        };
        Arc::new_cyclic(|this| SessionController {
            meta,
            shared,
            events: std::sync::OnceLock::new(),
            capacity,
            parent,
            lineage,
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

    /// How many ancestors the session has (0 for a top-level session).
    pub fn depth(&self) -> usize {
        self.lineage.len() - 1
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether anyone hears this session's events: a subscriber of it or of an ancestor.
    /// An event nobody hears is not built (`emit_progress`): a fan-out's thousand children
    /// with no window open spent 4 % of their CPU making progress events for no one.
    fn listened(&self) -> bool {
        let mut controller = Some(self);
        while let Some(c) = controller {
            if c.events.get().is_some_and(|tx| tx.receiver_count() > 0) {
                return true;
            }
            controller = c.parent.as_deref();
        }
        false
    }

    /// Sends an event to this session's subscribers and its ancestors'.
    pub(crate) fn emit(&self, event: Event) {
        if self.listened() {
            self.send(event);
        }
    }

    /// [`Self::emit`] once [`Self::listened`] said someone hears it.
    fn send(&self, event: Event) {
        let event = Arc::new(event);
        let mut ancestor = self.parent.as_deref();
        while let Some(controller) = ancestor {
            if let Some(tx) = controller.events.get() {
                let _ = tx.send(event.clone());
            }
            ancestor = controller.parent.as_deref();
        }
        if let Some(tx) = self.events.get() {
            let _ = tx.send(event);
        }
    }

    /// Sends a progress event (typed by kind; see [`Progress`]).
    pub(crate) fn emit_progress(&self, progress: Progress) {
        if !self.listened() {
            return;
        }
        let (kind, data) = progress.into_parts();
        self.send(Event::Event {
            session_id: self.meta.session_id.clone(),
            kind,
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
        let rx = self
            .events
            .get_or_init(|| broadcast::channel(self.capacity).0)
            .subscribe();
        let snapshot = self.snapshot_locked(&state);
        drop(state);
        let subscription = Subscription {
            rx,
            _controller: self.this.upgrade(),
        };
        (subscription, snapshot)
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
        if let Some(run) = state.phase.run() {
            pending.extend(run.inbox.iter().map(|m| PendingMessage {
                status: MessageStatus::Steered,
                ..m.pending()
            }));
        }
        if let Phase::Starting(starting) = &state.phase {
            pending.extend(starting.inbox.iter().map(|m| PendingMessage {
                status: MessageStatus::Steered,
                ..m.pending()
            }));
        }
        Snapshot {
            session_id: id.clone(),
            running: state.phase.run().is_some() || matches!(state.phase, Phase::Starting(_)),
            paused: matches!(state.phase, Phase::Paused),
            pending,
            approvals: self.shared.approvals.visible_to(id),
            subagents: self.shared.subagents.snapshot(id),
            usage: state.usage,
            tree_usage: self.shared.tree_usage(id, state.usage),
            context: state.context,
            instructions: state.instructions.clone(),
            compacted: state.compaction.as_ref().map(|c| c.id.clone()),
        }
    }

    /// Working: a run, or a child's run waiting for its slot.
    pub fn is_running(&self) -> bool {
        let state = self.lock();
        state.phase.run().is_some() || matches!(state.phase, Phase::Starting(_))
    }

    pub fn is_paused(&self) -> bool {
        matches!(self.lock().phase, Phase::Paused)
    }

    pub(crate) fn is_deleted(&self) -> bool {
        matches!(self.lock().phase, Phase::Deleted(_))
    }

    pub fn state(&self) -> SessionState {
        match self.lock().phase {
            Phase::Running(_) | Phase::Starting(_) | Phase::Deleted(Some(_)) => {
                SessionState::Running
            }
            Phase::Paused => SessionState::Paused,
            Phase::Idle | Phase::Deleted(None) => SessionState::Idle,
        }
    }

    pub fn pending(&self) -> Vec<PendingMessage> {
        self.lock()
            .pending
            .iter()
            .map(QueuedMessage::pending)
            .collect()
    }

    /// Whether this session is a sub-agent: its runs go through its task and report.
    fn is_child(&self) -> bool {
        self.meta.task_id.is_some() && self.meta.parent_session_id.is_some()
    }

    /// The delivery table of SPEC §4, in this one place.
    fn route(&self, state: &State, origin: Origin) -> Route {
        let writable = state.read_only.is_none();
        let open = !self.shared.root.is_cancelled();
        let start = if self.is_child() {
            Route::StartChild
        } else {
            Route::Start
        };
        match (&state.phase, origin) {
            (Phase::Deleted(_), _) => Route::Refuse(RuntimeError::NotFound(format!(
                "session {} (deleted)",
                self.meta.session_id
            ))),
            (Phase::Running(_) | Phase::Starting(_), _) => Route::Inbox,
            // Made on disk, its task (and its worktree) not begun yet: its first message is
            // its task, from its parent; the person's waits until it runs.
            (Phase::Idle, Origin::Person | Origin::Steer | Origin::Delivery)
                if self.is_child()
                    && state.meta.state == SessionState::Running
                    && state.meta.run_message.is_none()
                    && state.meta.reports == 0 =>
            {
                Route::Refuse(RuntimeError::Busy(format!(
                    "sub-agent {} is still being set up; send it the message once it runs",
                    self.meta.session_id
                )))
            }
            (Phase::Idle, _) if writable && open => start,
            (Phase::Paused, Origin::Person | Origin::Steer) if writable && open => start,
            // A parent's follow-up runs a child whose pause was a failure's; what the person
            // stopped stays stopped, and the message waits for the person.
            (Phase::Paused, Origin::Parent) if writable && open && state.meta.failed => start,
            // Paused, read-only or shutting down: a report waits for the person.
            (_, Origin::Delivery | Origin::Parent) => Route::Queue,
            (_, Origin::Person | Origin::Steer) if !writable => {
                Route::Refuse(RuntimeError::InvalidArgument(format!(
                    "session {} is read-only: {}",
                    self.meta.session_id,
                    state.read_only.as_deref().unwrap_or_default()
                )))
            }
            // Shutting down: the person's message is kept for the next start.
            (_, Origin::Person) => Route::Queue,
            (_, Origin::Steer) => Route::Refuse(RuntimeError::Unavailable(
                "the runtime is shutting down".into(),
            )),
        }
    }

    /// Applies the table's decision; emits the `message_status` event.
    fn deliver_locked(
        &self,
        state: &mut State,
        message: QueuedMessage,
        origin: Origin,
    ) -> Result<MessageStatus, RuntimeError> {
        self.deliver_child_locked(state, message, origin)
            .map(|(status, _)| status)
    }

    /// [`Self::deliver_locked`], with the lease receiver of a child run it started.
    fn deliver_child_locked(
        &self,
        state: &mut State,
        message: QueuedMessage,
        origin: Origin,
    ) -> Result<ChildDelivery, RuntimeError> {
        let id = message.message_id.clone();
        let mut lease = None;
        // A sender is told a message was taken only once the disk has it: one that could
        // not be written (a full disk) is refused and left nowhere, where logging the
        // failure answered "steered" or "queued" for a message a restart then lost. So
        // for the person's and a parent's follow-up (`message_subagent` then fails). A
        // report keeps going on such a failure (its ledger line brings it back), and so
        // does a child's task (its meta holds it; written to the queue it would make a
        // file for every child of a fan-out).
        let refuse_unsaved = match origin {
            Origin::Person | Origin::Steer => true,
            Origin::Parent => !is_task_message(&id),
            Origin::Delivery => false,
        };
        let status = match self.route(state, origin) {
            Route::Refuse(err) => return Err(err),
            Route::Inbox => {
                match &mut state.phase {
                    Phase::Running(run) | Phase::Deleted(Some(run)) => {
                        if matches!(origin, Origin::Person | Origin::Steer) {
                            run.by_person.insert(message.message_id.clone());
                        }
                        // Kept on disk until the run has it in its history: a crash before
                        // the next safe point loses nothing (reports have their ledger).
                        let durable = report_task_id(&message.message_id).is_none();
                        run.inbox.push(message);
                        if durable {
                            self.save_or_take_back(state, &id, refuse_unsaved)?;
                        }
                    }
                    Phase::Starting(starting) => {
                        starting.inbox.push(message);
                        self.save_or_take_back(state, &id, refuse_unsaved)?;
                    }
                    _ => {}
                }
                MessageStatus::Steered
            }
            Route::Queue => {
                state.pending.push(message);
                self.save_or_take_back(state, &id, refuse_unsaved)?;
                MessageStatus::Queued
            }
            Route::Start => {
                self.start_run_locked(state, vec![message], run::Mode::Normal)?;
                MessageStatus::Started
            }
            Route::StartChild => {
                if refuse_unsaved {
                    // Written first as if queued: the start below writes it again with
                    // its run, but does not answer for that write (its other writes are
                    // the meta's, which recovery repairs).
                    state.pending.push(message.clone());
                    self.save_or_take_back(state, &id, true)?;
                    state.pending.pop();
                }
                let config = message.config.clone();
                lease = Some(self.start_child_locked(state, vec![message], config)?);
                MessageStatus::Started
            }
        };
        self.emit_status(&id, status);
        Ok((status, lease))
    }

    /// Puts a child into [`Phase::Starting`] with `messages` and registers the task that
    /// will begin its run: one step under the lock, so nothing can start a run of the
    /// child beside it. The stored state says it works and owes a report from now on;
    /// the messages are in its stored queue until the run takes them, so a crash while it
    /// waits loses nothing and re-sends no old answer (runtime review R1b).
    fn start_child_locked(
        &self,
        state: &mut State,
        messages: Vec<QueuedMessage>,
        config: RunConfig,
    ) -> Result<oneshot::Receiver<Result<(), crate::subagents::StartError>>, RuntimeError> {
        let Some(this) = self.this.upgrade() else {
            return Err(RuntimeError::Unavailable("the session is closing".into()));
        };
        let Some(tasks) = self.shared.children.get().cloned() else {
            return Err(RuntimeError::Unavailable(
                "sub-agents are not available".into(),
            ));
        };
        let previous = std::mem::replace(
            &mut state.phase,
            Phase::Starting(Starting {
                inbox: messages,
                stop: CancellationToken::new(),
            }),
        );
        let run_message = match &state.phase {
            Phase::Starting(starting) => starting.inbox.first().map(|m| m.message_id.clone()),
            _ => None,
        };
        // The run before may have ended a moment ago, its report still on its way to the
        // parent's ledger (its task waits for the flush). The stored meta then still
        // says which run owes that report: recovery records it from the history if the
        // process dies before the ledger has it. Writing this start now would replace
        // that with a run that has not begun, and recovery would find nothing to report
        // and lose the answer. So the start is written when that report is marked (or
        // when this run begins, if the report never is); its messages are in the stored
        // queue meanwhile, and this run's task waits for the earlier one anyway.
        // A child whose history is empty has had no run, so no report can be in flight:
        // a fan-out's first starts skip the look through every task.
        let deferred = DeferredStart { run_message };
        if !state.meta.reported
            && !state.message_ids.is_empty()
            && tasks.has_task(&self.meta.session_id)
        {
            state.deferred_start = Some(deferred);
        } else {
            state.deferred_start = None;
            self.write_start(state, deferred);
        }
        self.save_pending(state);
        state.child_runs += 1;
        match tasks.spawn(this, &state.meta, config, state.child_runs) {
            Ok(lease) => {
                self.shared.store.touch(&self.meta.session_id);
                Ok(lease)
            }
            Err(err) => {
                // Nothing was registered: back to where it was, with the messages kept.
                let phase = std::mem::replace(&mut state.phase, previous);
                if let Phase::Starting(starting) = phase {
                    state.pending.extend(starting.inbox);
                }
                state.child_runs -= 1;
                if state.deferred_start.take().is_some() {
                    // Never written: the meta still speaks of the run before.
                    self.save_pending(state);
                    return Err(RuntimeError::Unavailable(err));
                }
                let paused = matches!(state.phase, Phase::Paused);
                self.update_meta(state, |meta| {
                    meta.state = if paused {
                        SessionState::Paused
                    } else {
                        SessionState::Idle
                    };
                    meta.reported = true;
                    meta.run_message = None;
                });
                self.save_pending(state);
                Err(RuntimeError::Unavailable(err))
            }
        }
    }

    /// Writes a child's start (`owe_start`) to its stored meta now.
    fn write_start(&self, state: &mut State, start: DeferredStart) {
        let paused = matches!(state.phase, Phase::Paused);
        self.update_meta(state, |meta| owe_start(meta, paused, start));
    }

    /// A message to a child from its parent (`sub_agent`'s task, `message_subagent`) or
    /// from the person, decided and applied in one step: a working child takes it at its
    /// next safe point (its current run's report covers it), an idle one runs again
    /// through its task (one more report), a paused one as the delivery table says.
    pub(crate) fn deliver_to_child(
        &self,
        message: QueuedMessage,
        origin: Origin,
    ) -> Result<ChildDelivery, RuntimeError> {
        let mut state = self.lock();
        if state.meta.interrupted && !matches!(state.phase, Phase::Deleted(_)) {
            return Err(RuntimeError::InvalidArgument(format!(
                "sub-agent {} was interrupted: resume or cancel it first",
                self.meta.session_id
            )));
        }
        self.deliver_child_locked(&mut state, message, origin)
    }

    /// Resumes an interrupted child through its task: the flag is taken and the start
    /// registered in one step (a second quick resume finds nothing to resume, C10). Its
    /// stored queue (what was sent to it before the crash) goes with it; `first` is the
    /// task message of a child that never ran.
    pub(crate) fn resume_child_task(
        &self,
        first: Option<QueuedMessage>,
    ) -> Result<(), RuntimeError> {
        let mut state = self.lock();
        if !state.meta.interrupted || matches!(state.phase, Phase::Deleted(_)) {
            return Err(RuntimeError::InvalidArgument(format!(
                "sub-agent {} was not interrupted",
                self.meta.session_id
            )));
        }
        if !matches!(state.phase, Phase::Idle | Phase::Paused) || self.shared.root.is_cancelled() {
            return Err(RuntimeError::Busy(format!(
                "sub-agent {} cannot start now",
                self.meta.session_id
            )));
        }
        let mut messages: Vec<QueuedMessage> = std::mem::take(&mut state.pending);
        if let Some(first) = first {
            if !messages.iter().any(|m| m.message_id == first.message_id) {
                messages.insert(0, first);
            }
        }
        let config = messages
            .first()
            .map(|m| m.config.clone())
            .unwrap_or_default();
        self.start_child_locked(&mut state, messages, config)
            .map(|_| ())
    }

    /// The token a child's task waits on while it waits for a slot: fired when the person
    /// stops it first. `None` when it does not wait in [`Phase::Starting`] any more.
    pub(crate) fn starting_stop(&self) -> Option<CancellationToken> {
        match &self.lock().phase {
            Phase::Starting(starting) => Some(starting.stop.clone()),
            _ => None,
        }
    }

    /// The task holds its slot: the child's run begins, with what waited in
    /// [`Phase::Starting`], in one step. Returns how it ends, or `None` when the person
    /// stopped it (or it was deleted) before it could begin.
    pub(crate) fn begin_child_run(
        &self,
        task: &CancellationToken,
    ) -> Option<oneshot::Receiver<RunOutcome>> {
        let mut state = self.lock();
        // A task cancelled under this lock by `cancel_if_unbegun` (its start taken back)
        // may still get here, past its lease and slot: it must not begin, or a run would
        // start that its canceller just undid, stopped at once with no report while the
        // child's history held the task. The phase stays `Starting` for the settle.
        if self.shared.root.is_cancelled() || state.read_only.is_some() || task.is_cancelled() {
            return None;
        }
        let starting = match std::mem::replace(&mut state.phase, Phase::Idle) {
            Phase::Starting(starting) => starting,
            other => {
                state.phase = other;
                return None;
            }
        };
        // The report of the run before was never marked (it could not be recorded): this
        // run's start is written now, as it begins.
        if let Some(start) = state.deferred_start.take() {
            self.write_start(&mut state, start);
        }
        let (tx, rx) = oneshot::channel();
        let first = starting.inbox.clone();
        if let Err(err) = self.start_run_locked(&mut state, starting.inbox, run::Mode::Normal) {
            // Its messages could not be written (a full disk): they wait in pending, and
            // the child is paused; its task reports that it stopped.
            tracing::warn!(session = %self.meta.session_id, "a child's run could not start: {err}");
            state.pending.extend(first);
            state.phase = Phase::Paused;
            self.update_meta(&mut state, |meta| meta.state = SessionState::Paused);
            self.save_pending(&state);
            return None;
        }
        if let Some(run) = state.phase.run_mut() {
            run.waiters.push(tx);
        }
        self.save_pending(&state);
        Some(rx)
    }

    /// The person's message.
    pub fn submit(
        &self,
        content: String,
        config: Option<RunConfig>,
    ) -> Result<(String, MessageStatus), RuntimeError> {
        self.submit_with_images(content, config, Vec::new())
    }

    /// The person's message with pasted or dropped images (checked here: types, base64,
    /// sizes), which go to the model as image parts.
    pub fn submit_with_images(
        &self,
        content: String,
        config: Option<RunConfig>,
        images: Vec<crate::protocol::ImagePart>,
    ) -> Result<(String, MessageStatus), RuntimeError> {
        if content.trim().is_empty() && images.is_empty() {
            return Err(RuntimeError::InvalidArgument(
                "content must not be empty".into(),
            ));
        }
        crate::protocol::ImagePart::check_all(&images).map_err(RuntimeError::InvalidArgument)?;
        let message = QueuedMessage {
            message_id: format!("msg-{}", uuid::Uuid::now_v7().simple()),
            content,
            config: config.unwrap_or_default(),
            images,
        };
        let id = message.message_id.clone();
        let mut state = self.lock();
        let status = self.deliver_locked(&mut state, message, Origin::Person)?;
        Ok((id, status))
    }

    /// Hands a message (a report) to the session. `None` when it was already delivered,
    /// is waiting, or is in the run's inbox (a report is never added twice), or when the
    /// session is deleted.
    pub fn deliver(&self, message: QueuedMessage) -> Option<MessageStatus> {
        let mut state = self.lock();
        let id = &message.message_id;
        let in_inbox = state
            .phase
            .run()
            .is_some_and(|run| run.inbox.iter().any(|m| &m.message_id == id));
        if state.message_ids.contains(id)
            || state.pending.iter().any(|m| &m.message_id == id)
            || in_inbox
        {
            tracing::warn!(session = %self.meta.session_id, message = %id, "dropping a duplicate delivery");
            return None;
        }
        match self.deliver_locked(&mut state, message, Origin::Delivery) {
            Ok(status) => Some(status),
            Err(err) => {
                tracing::info!(session = %self.meta.session_id, "not delivered: {err}");
                None
            }
        }
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

    /// `steer(message_id)`: a pending message goes into the running run's inbox, or starts
    /// a run (and clears paused).
    pub fn steer(&self, message_id: &str) -> Result<MessageStatus, RuntimeError> {
        let mut state = self.lock();
        let index = self.pending_index(&state, message_id)?;
        if let Route::Refuse(err) = self.route(&state, Origin::Steer) {
            return Err(err);
        }
        // The stored queue is not written without it first: until the delivery writes it
        // where it goes, the disk would hold the message nowhere, and a process killed
        // between the two writes lost it (found by the simulation's kill at a write; test
        // `durability::a_message_steered_is_on_disk_at_every_write`). Into a run's inbox
        // or a child's start, the delivery's own write of the queue takes it out of the
        // pending part; into a parent's new run, its history has it first and the queue
        // is written after (a kill between leaves it in both: the next start drops it
        // from the queue).
        let message = state.pending.remove(index);
        let kept = message.clone();
        match self.deliver_locked(&mut state, message, Origin::Steer) {
            Ok(status) => {
                if status == MessageStatus::Started && !self.is_child() {
                    self.save_pending(&state);
                }
                Ok(status)
            }
            Err(err) => {
                // Not taken: back where it was (a child's failed start put it back already).
                if !state
                    .pending
                    .iter()
                    .any(|m| m.message_id == kept.message_id)
                {
                    let index = index.min(state.pending.len());
                    state.pending.insert(index, kept);
                }
                Err(err)
            }
        }
    }

    /// Drops a pending message. A report's discard is recorded in the ledger first, so
    /// recovery never brings it back (runtime review C1).
    pub fn discard(&self, message_id: &str) -> Result<(), RuntimeError> {
        // Taken out of the queue first and marked in the ledger after, with no lock held:
        // the mark waits for a flush, and a run's safe point or a snapshot must not wait
        // out the disk (runtime review R12). Out of the queue, nothing can deliver it
        // meanwhile; a failed mark puts it back where it was.
        let (index, removed, at) = {
            let mut state = self.lock();
            let index = self.pending_index(&state, message_id)?;
            let at = state.history.as_ref().map(Vec::len);
            // Known from here on: a second delivery of it meanwhile is a duplicate.
            state.message_ids.insert(message_id.to_string());
            (index, state.pending.remove(index), at)
        };
        let marked = match report_task_id(message_id) {
            Some(task_id) => {
                // Where the chat shows the mark: the end of the history as it is now.
                let at = at.unwrap_or_else(|| {
                    self.shared
                        .store
                        .load(&self.meta.session_id)
                        .map(|loaded| loaded.messages.len())
                        .unwrap_or(0)
                });
                self.shared
                    .store
                    .mark_discarded(&self.meta.session_id, task_id, Some(at as u32))
            }
            None => Ok(()),
        };
        let mut state = self.lock();
        let saved = marked.and_then(|()| match self.try_save_pending(&state) {
            // Its mark in the ledger is what keeps a report discarded.
            Err(err) if report_task_id(message_id).is_some() => {
                tracing::warn!(session = %self.meta.session_id, "cannot save the pending queue: {err}");
                Ok(())
            }
            // A person's message still on the disk would come back at the next start.
            other => other,
        });
        if let Err(err) = saved {
            // Not discarded: back where it was.
            state.message_ids.remove(message_id);
            let index = index.min(state.pending.len());
            state.pending.insert(index, removed);
            return Err(err.into());
        }
        drop(state);
        self.emit_progress(Progress::MessageDiscarded {
            message_id: message_id.to_string(),
        });
        Ok(())
    }

    /// Stops the current run and waits until it has written its synthetic results and
    /// put unconsumed steered messages back to pending. Children are not stopped.
    pub async fn cancel(&self) {
        let done = {
            let mut state = self.lock();
            if let Phase::Starting(_) = &state.phase {
                self.stop_starting_locked(&mut state);
                return;
            }
            let Some(run) = state.phase.run() else {
                return;
            };
            run.token.cancel();
            run.done.clone()
        };
        done.cancelled().await;
    }

    /// Stop on a child whose run waits for its slot: what waited goes to pending, the
    /// child is paused, and its task reports that it was stopped (it owes a report).
    fn stop_starting_locked(&self, state: &mut State) {
        let Phase::Starting(starting) = std::mem::replace(&mut state.phase, Phase::Paused) else {
            return;
        };
        starting.stop.cancel();
        let ids: Vec<String> = starting
            .inbox
            .iter()
            .map(|m| m.message_id.clone())
            .collect();
        state.pending.extend(starting.inbox);
        self.save_pending(state);
        self.update_meta(state, |meta| {
            meta.state = SessionState::Paused;
            meta.updated_at = crate::store::now();
        });
        for id in ids {
            self.emit_status(&id, MessageStatus::Queued);
        }
        self.emit_progress(Progress::RunCancelled {});
    }

    /// Marks the session deleted: from now on nothing is delivered, nothing starts, and
    /// it cannot delegate. Its run (if any) is cancelled; await [`Self::cancel`] for it.
    pub(crate) fn mark_deleted(&self) {
        let mut state = self.lock();
        let phase = std::mem::replace(&mut state.phase, Phase::Deleted(None));
        state.phase = match phase {
            Phase::Running(run) | Phase::Deleted(Some(run)) => {
                run.token.cancel();
                Phase::Deleted(Some(run))
            }
            Phase::Starting(starting) => {
                starting.stop.cancel();
                Phase::Deleted(None)
            }
            _ => Phase::Deleted(None),
        };
        state.pending.clear();
    }

    /// The `compact` command: a running session compacts before its next model call; an
    /// idle or paused one runs a compaction on its own (a run that makes no other model
    /// call and leaves a paused session paused).
    pub fn compact(&self) -> Result<(), RuntimeError> {
        let mut state = self.lock();
        if let Some(reason) = &state.read_only {
            return Err(RuntimeError::InvalidArgument(reason.clone()));
        }
        match &mut state.phase {
            Phase::Running(run) => {
                run.compact = true;
                Ok(())
            }
            Phase::Idle | Phase::Paused if !self.shared.root.is_cancelled() => {
                let paused = matches!(state.phase, Phase::Paused);
                self.start_run_locked(&mut state, Vec::new(), run::Mode::Compact { paused })
            }
            Phase::Idle | Phase::Paused => {
                Err(RuntimeError::Unavailable("the app is shutting down".into()))
            }
            // Its run compacts when it needs to, once it begins.
            Phase::Starting(_) => Err(RuntimeError::Busy(format!(
                "sub-agent {} waits for a slot; compact it once it runs",
                self.meta.session_id
            ))),
            Phase::Deleted(_) => Err(RuntimeError::NotFound(self.meta.session_id.clone())),
        }
    }

    /// Whether `compact` asked for a compaction since the last call (and clears it).
    pub(crate) fn take_compact_request(&self) -> bool {
        self.lock()
            .phase
            .run_mut()
            .is_some_and(|run| std::mem::take(&mut run.compact))
    }

    /// Starts a run; without a first message it continues from the history (resuming an
    /// interrupted child).
    fn start_run_locked(
        &self,
        state: &mut State,
        first: Vec<QueuedMessage>,
        mode: run::Mode,
    ) -> Result<(), RuntimeError> {
        let Some(this) = self.this.upgrade() else {
            return Err(RuntimeError::Unavailable("the session is closing".into()));
        };
        // The messages the run begins with are in the history before anyone is told the
        // run started: a crash a moment later loses none of them (SPEC §12.2).
        self.append_first_locked(state, &first)?;
        let token = self.shared.root.child_token();
        // A session found "running" on disk at the next start was cut off by a crash;
        // recovery repairs it.
        self.update_meta(state, |meta| meta.state = SessionState::Running);
        let done = CancellationToken::new();
        state.phase = Phase::Running(ActiveRun {
            token: token.clone(),
            inbox: Vec::new(),
            taken: Vec::new(),
            by_person: HashSet::new(),
            done,
            waiters: Vec::new(),
            compact: false,
        });
        self.shared.run_started();
        run::spawn(this, first, token, mode);
        Ok(())
    }

    /// Appends a starting run's first messages (no run is active, so the controller may
    /// write): the history is loaded if it is not cached, calls an earlier run left open
    /// are answered first (SPEC §2), and each message is remembered as the run loop would.
    /// A write only, no flush: a killed process loses nothing the page cache holds, and
    /// the run's first flush covers a power loss. A report among them is noted delivered
    /// by the run, after that flush (runtime review R10: a note on disk before its history
    /// line could hide a report a power cut lost).
    fn append_first_locked(
        &self,
        state: &mut State,
        first: &[QueuedMessage],
    ) -> Result<(), RuntimeError> {
        if first.is_empty() {
            return Ok(());
        }
        let id = &self.meta.session_id;
        let mut history = match state.history.take() {
            Some(history) => history,
            None => {
                let mut loaded = self.shared.store.load(id)?;
                state.compaction = loaded.compactions.pop();
                loaded.messages
            }
        };
        let results = interrupted_results(&history);
        if !results.is_empty() {
            if let Err(err) = self.shared.store.append(id, &results) {
                state.history = Some(history);
                return Err(err.into());
            }
            history.extend(results);
        }
        let messages: Vec<Message> = first.iter().map(QueuedMessage::to_user).collect();
        if let Err(err) = self.shared.store.append(id, &messages) {
            state.history = Some(history);
            return Err(err.into());
        }
        history.extend(messages.iter().cloned());
        state.history = Some(history);
        for message in first {
            state.message_ids.insert(message.message_id.clone());
        }
        for message in messages {
            self.emit_progress(Progress::MessageAppended { message });
        }
        Ok(())
    }

    /// Safe point 2: a final answer ends the run only if nothing was steered in meanwhile.
    /// Returns the steered messages to append when the run must go on.
    pub(crate) fn finish_or_take_inbox(
        &self,
        answer: &str,
        history: &mut Arc<Vec<Message>>,
    ) -> Option<Vec<QueuedMessage>> {
        let mut state = self.lock();
        let inbox = match state.phase.run_mut() {
            None => return None,
            Some(run) => take_into(run),
        };
        if !inbox.is_empty() {
            return Some(inbox);
        }
        let outcome = RunOutcome::Completed(answer.to_string());
        self.end_run_locked(
            &mut state,
            Some(Arc::unwrap_or_clone(std::mem::take(history))),
            outcome,
            Vec::new(),
        );
        None
    }

    /// The run has what it took from its inbox in its history now: the stored queue stops
    /// naming those messages.
    pub(crate) fn inbox_consumed(&self) {
        let mut state = self.lock();
        let Some(run) = state.phase.run_mut() else {
            return;
        };
        let person = run
            .taken
            .drain(..)
            .any(|m| report_task_id(&m.message_id).is_none());
        if person {
            self.save_pending(&state);
        }
    }

    /// Safe point 1: messages steered in while the batch ran.
    pub(crate) fn take_inbox(&self) -> Vec<QueuedMessage> {
        let mut state = self.lock();
        state.phase.run_mut().map(take_into).unwrap_or_default()
    }

    /// For tests: what a safe point does first (the run takes its inbox), without the
    /// history's write that follows; the ids taken.
    #[doc(hidden)]
    pub fn take_inbox_now(&self) -> Vec<String> {
        self.take_inbox()
            .into_iter()
            .map(|m| m.message_id)
            .collect()
    }

    /// Ends a run that was cancelled or failed: `requeue` (steered messages the run took
    /// but could not save) and unconsumed steered messages go back to pending in order,
    /// approvals are denied, the session is paused (SPEC §4).
    pub(crate) fn stop_run(
        &self,
        history: Option<Vec<Message>>,
        outcome: RunOutcome,
        requeue: Vec<QueuedMessage>,
    ) {
        self.shared.approvals.deny_session(&self.meta.session_id);
        let mut state = self.lock();
        self.end_run_locked(&mut state, history, outcome, requeue);
    }

    fn end_run_locked(
        &self,
        state: &mut State,
        history: Option<Vec<Message>>,
        outcome: RunOutcome,
        requeue: Vec<QueuedMessage>,
    ) {
        // Only a sub-agent can wait interrupted (its task resumes or cancels it); any
        // other session's cut-off run is a failure, decided here, in the run's last step.
        let outcome = match outcome {
            RunOutcome::Interrupted(message)
                if state.meta.task_id.is_none() || state.meta.parent_session_id.is_none() =>
            {
                RunOutcome::Failed(message)
            }
            outcome => outcome,
        };
        let phase = std::mem::replace(&mut state.phase, Phase::Idle);
        let (run, deleted) = match phase {
            Phase::Running(run) => (run, false),
            Phase::Deleted(Some(run)) => (run, true),
            other => {
                state.phase = other;
                return;
            }
        };
        // A history that failed to load stays unloaded, so the next run reads it again.
        state.history = history;
        let mut returned = requeue;
        returned.extend(run.inbox.iter().cloned());
        // A compaction ends like any run, in this one step: what was steered in meanwhile
        // is never dropped (runtime review R4). It goes on in a run of its own when the
        // session was idle, or when the person sent it (their message resumes a paused
        // session, R3); a report to a paused session waits with it.
        let mut go_on = Vec::new();
        if let RunOutcome::Compacted { paused } = outcome {
            let by_person = returned
                .iter()
                .any(|m| run.by_person.contains(&m.message_id));
            if !returned.is_empty() && !deleted && (!paused || by_person) {
                go_on = std::mem::take(&mut returned);
            }
        }
        let stopped = match outcome {
            RunOutcome::Completed(_) => false,
            RunOutcome::Compacted { paused } => paused && go_on.is_empty(),
            RunOutcome::Failed(_) | RunOutcome::Cancelled | RunOutcome::Interrupted(_) => true,
        };
        if deleted {
            state.phase = Phase::Deleted(None);
        } else {
            if stopped {
                // Unconsumed steered messages go back to pending, in order (SPEC §4).
                state.pending.extend(returned.iter().cloned());
                state.phase = Phase::Paused;
                self.save_pending(state);
            }
            // The stored state is settled before anyone hears the run ended: whoever acts
            // on the event (a restart, a list) must not find the session still "running".
            let usage = state.usage;
            let models = state.models.clone();
            let paused = stopped;
            let failed = matches!(outcome, RunOutcome::Failed(_));
            let interrupted = matches!(outcome, RunOutcome::Interrupted(_));
            self.update_meta(state, |meta| {
                meta.usage = usage;
                meta.models = models;
                meta.failed = failed;
                // Set with the run's end, in this one step: the task that ran it ends
                // without a report (`child_outcome`), and from here on the child is
                // what a restart would find, resumed or cancelled the same way.
                if interrupted {
                    meta.interrupted = true;
                }
                meta.state = if paused {
                    SessionState::Paused
                } else {
                    SessionState::Idle
                };
                meta.updated_at = crate::store::now();
            });
        }
        // The history file stays closed between runs: open files are bounded by what runs.
        self.shared.store.release(&self.meta.session_id);
        // A run that goes on after a compaction (below) counts as started before this one
        // stops counting: the count never reads zero in between, so "idle" is never seen
        // while a run is due. Otherwise it stops counting before its last events.
        let going_on = !go_on.is_empty();
        if !going_on {
            self.shared.run_ended();
        }
        let id = self.meta.session_id.clone();
        match &outcome {
            RunOutcome::Completed(answer) => self.emit(Event::Result {
                session_id: id,
                content: answer.clone(),
            }),
            RunOutcome::Failed(message) => {
                for message in &returned {
                    self.emit_status(&message.message_id, MessageStatus::Queued);
                }
                self.emit(Event::Error {
                    session_id: id,
                    message: message.clone(),
                });
            }
            RunOutcome::Cancelled => {
                for message in &returned {
                    self.emit_status(&message.message_id, MessageStatus::Queued);
                }
                self.emit_progress(Progress::RunCancelled {});
            }
            RunOutcome::Interrupted(message) => {
                for message in &returned {
                    self.emit_status(&message.message_id, MessageStatus::Queued);
                }
                self.emit_progress(Progress::RunInterrupted {
                    message: message.clone(),
                });
            }
            // Its `context.compacted` event said what happened; a paused session's steered
            // reports went back to its queue.
            RunOutcome::Compacted { .. } => {
                for message in &returned {
                    self.emit_status(&message.message_id, MessageStatus::Queued);
                }
            }
        }
        for waiter in run.waiters {
            let _ = waiter.send(outcome.clone());
        }
        run.done.cancel();
        if going_on {
            self.go_on_after_compaction(state, go_on);
            self.shared.run_ended();
        }
    }

    /// What arrived during a compaction that ended: a run with it, as if it had arrived
    /// just after (a child's through its task).
    fn go_on_after_compaction(&self, state: &mut State, messages: Vec<QueuedMessage>) {
        let config = messages[0].config.clone();
        if self.is_child() {
            if let Err(err) = self.start_child_locked(state, messages, config) {
                tracing::warn!(session = %self.meta.session_id, "cannot go on after compacting: {err}");
            }
            return;
        }
        if self.shared.root.is_cancelled() || state.read_only.is_some() {
            state.pending.extend(messages);
            self.save_pending(state);
            return;
        }
        let kept = messages.clone();
        if let Err(err) = self.start_run_locked(state, messages, run::Mode::Normal) {
            tracing::warn!(session = %self.meta.session_id, "cannot go on after compacting: {err}");
            state.pending.extend(kept);
            state.phase = Phase::Paused;
            self.save_pending(state);
        }
    }

    /// Takes the history for a run (loading it from disk the first time). Calls that an
    /// earlier run left unanswered (a failed write, a panic) get a synthetic result first,
    /// so the request is valid again (SPEC §2, runtime review C7).
    pub(crate) fn take_history(&self) -> Result<(Vec<Message>, Option<Compaction>), RuntimeError> {
        let (cached, marker) = {
            let mut state = self.lock();
            (state.history.take(), state.compaction.clone())
        };
        let (mut history, marker) = match cached {
            Some(history) => (history, marker),
            None => {
                let mut loaded = self.shared.store.load(&self.meta.session_id)?;
                let marker = loaded.compactions.pop();
                self.lock().compaction = marker.clone();
                (loaded.messages, marker)
            }
        };
        let results = interrupted_results(&history);
        if !results.is_empty() {
            self.shared.store.append(&self.meta.session_id, &results)?;
            history.extend(results);
        }
        Ok((history, marker))
    }

    /// A compaction was stored: the next run (and a reload) builds its requests from it.
    pub(crate) fn set_compaction(&self, marker: Compaction) {
        self.lock().compaction = Some(marker.clone());
        self.emit_progress(Progress::Compacted { compaction: marker });
    }

    /// The context meter changed (a model call's reported usage or an estimate).
    pub(crate) fn set_context(&self, meter: ContextMeter) {
        let mut state = self.lock();
        if state.context == Some(meter) {
            return;
        }
        state.context = Some(meter);
        drop(state);
        self.emit_progress(Progress::Context { meter });
    }

    /// The instruction files a run loaded, for the UI's list.
    pub(crate) fn set_instructions(&self, files: Vec<InstructionFile>) {
        self.lock().instructions = files;
    }

    /// The environment of this session's prompt: detected once per loaded session (a
    /// child shares its workspace's recent detection, see `Shared::environment`).
    pub(crate) async fn environment(&self, workspace: &std::path::Path) -> Arc<Environment> {
        if let Some(env) = self.lock().environment.clone() {
            return env;
        }
        let env = self.shared.environment(workspace).await;
        self.lock().environment = Some(env.clone());
        env
    }

    /// Answers, on disk, the calls the stored history leaves open (after a panic lost the
    /// run's copy of it).
    pub(crate) fn repair_stored_history(&self) -> Result<(), RuntimeError> {
        let history = self.shared.store.load(&self.meta.session_id)?.messages;
        let results = interrupted_results(&history);
        if !results.is_empty() {
            self.shared.store.append(&self.meta.session_id, &results)?;
        }
        Ok(())
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

    /// The approval gate of this session's tools, with the run's policy snapshot and
    /// where the run's model is (`runs_on`: its server's name and model), which a
    /// sub-agent's requests name (E3).
    pub(crate) fn gate(
        &self,
        policy: Arc<std::collections::BTreeMap<String, crate::config::ToolPolicy>>,
        runs_on: Option<(String, String)>,
    ) -> Arc<dyn crate::tools::ApprovalGate> {
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
            // The meta as it is now: a worktree is set after the controller was made.
            worktree: self.lock().meta.worktree.as_ref().map(|w| w.branch.clone()),
            // Only a sub-agent's: a top-level session runs where the person picked.
            runs_on: runs_on.filter(|_| self.meta.parent_session_id.is_some()),
            policy: Box::new(move |tool| crate::mcp::policy_for(&policy, tool)),
            emit: Arc::new(move |event| {
                if let Some(ctl) = this.upgrade() {
                    ctl.emit(event);
                }
            }),
        })
    }

    fn remember_message_id(&self, id: &str) {
        self.lock().message_ids.insert(id.to_string());
    }

    /// The task id for a `sub_agent` call: the call's id (the seed's `delegate-0`), or a
    /// fresh one when an earlier child of this session already has that id. `None` when
    /// the session is deleted (it must not delegate).
    pub(crate) fn allocate_task_id(&self, call_id: &str) -> Option<String> {
        let mut state = self.lock();
        if matches!(state.phase, Phase::Deleted(_)) {
            return None;
        }
        let mut task_id = call_id.to_string();
        while state.task_ids.contains(&task_id) {
            task_id = format!(
                "{call_id}-{}",
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            );
        }
        state.task_ids.insert(task_id.clone());
        Some(task_id)
    }

    fn add_usage(&self, usage: Usage, provider: &str, model: &str) {
        {
            let mut state = self.lock();
            state.usage.add(usage);
            crate::protocol::add_model_usage(&mut state.models, provider, model, usage);
        }
        self.shared.add_tree_usage(&self.lineage, usage);
    }

    /// Changes the stored meta and writes it through (in place; rare: run start/end).
    fn update_meta(&self, state: &mut State, change: impl FnOnce(&mut SessionMeta)) {
        if matches!(state.phase, Phase::Deleted(_)) {
            return;
        }
        let before = state.meta.clone();
        change(&mut state.meta);
        if state.meta == before && !state.meta_unsaved {
            // The file already says this (a child's run begins "running", as its start
            // had written): no write and no index line, but the list still hears that
            // its live state may have changed (issue 31).
            self.shared.store.touch(&self.meta.session_id);
            return;
        }
        state.meta_unsaved = match self.shared.store.write_meta(&state.meta) {
            Ok(()) => false,
            Err(err) => {
                tracing::warn!(session = %self.meta.session_id, "cannot save session meta: {err}");
                true
            }
        };
    }

    /// The pending queue survives restarts (SPEC §4, durability).
    fn save_pending(&self, state: &State) {
        if let Err(err) = self.try_save_pending(state) {
            tracing::warn!(session = %self.meta.session_id, "cannot save the pending queue: {err}");
        }
    }

    /// Saves the queue after `message_id` was put in it (or in a run's inbox); when the
    /// write fails and `refuse` is set, takes the message out again and returns the error.
    fn save_or_take_back(
        &self,
        state: &mut State,
        message_id: &str,
        refuse: bool,
    ) -> Result<(), RuntimeError> {
        let Err(err) = self.try_save_pending(state) else {
            return Ok(());
        };
        if !refuse {
            tracing::warn!(session = %self.meta.session_id, "cannot save the pending queue: {err}");
            return Ok(());
        }
        state.pending.retain(|m| m.message_id != message_id);
        match &mut state.phase {
            Phase::Running(run) | Phase::Deleted(Some(run)) => {
                run.inbox.retain(|m| m.message_id != message_id);
                run.by_person.remove(message_id);
            }
            Phase::Starting(starting) => starting.inbox.retain(|m| m.message_id != message_id),
            _ => {}
        }
        Err(err.into())
    }

    /// Writes the stored queue: what is pending, and what a run or a child's start holds
    /// that its history does not have yet.
    fn try_save_pending(&self, state: &State) -> Result<(), StoreError> {
        if matches!(state.phase, Phase::Deleted(_)) {
            return Ok(());
        }
        // A child's run waiting for its slot keeps its messages here too, and so does a
        // run for what was steered into it and is not in its history yet: a crash
        // meanwhile loses none of them (the next start drops those the history has).
        // Reports are left out: their ledger brings them back. So is a child's task
        // message while it waits for its slot: the meta holds it (`task_content`), and a
        // child cut off before its run began is interrupted and resumed with it
        // (`children::resume`; with the default run config, as recovery's own reports
        // have: the child's run takes only its workspace from it, and that is its own).
        // A fan-out's children then never make a `pending.json`: one inode less per
        // child, and inodes are what a fan-out on ext4 waits for (issue 31).
        let waiting: Vec<&QueuedMessage> = match &state.phase {
            Phase::Starting(starting) => starting
                .inbox
                .iter()
                .filter(|m| !is_task_message(&m.message_id))
                .collect(),
            Phase::Running(run) => run
                .taken
                .iter()
                .chain(&run.inbox)
                .filter(|m| report_task_id(&m.message_id).is_none())
                .collect(),
            _ => Vec::new(),
        };
        let pending: Vec<PendingMessage> = state
            .pending
            .iter()
            .chain(waiting)
            .map(QueuedMessage::pending)
            .collect();
        self.shared
            .store
            .write_pending(&self.meta.session_id, &pending)
    }

    /// A child's report is in its parent's ledger.
    /// `run` is the reported run ([`crate::subagents::Report::run`]).
    pub(crate) fn mark_reported(&self, run: Option<u64>) {
        let mut state = self.lock();
        // A follow-up may have begun the child's next run while this report was being
        // recorded (its task waits for this report's task to end before it takes a slot):
        // that run owes its own report, which its start wrote down, even if the person
        // stopped it before it began (it then reports that). Only the count moves then;
        // saying "reported" would let a crash before that run's report lose it (found by
        // the simulation; tests `a_report_marked_after_…`). Runs that owe no report (a
        // compaction) are not counted. A report of no run (a cancelled interruption) or
        // of a run this controller did not begin (only one that was loaded again since,
        // with no task alive) is the last one.
        let latest = run.is_none_or(|run| run >= state.child_runs);
        // A start held back for this report (`start_child_locked`) is written with the
        // count, in one write: from here on the ledger has what the meta spoke of.
        let start = state.deferred_start.take();
        let paused = matches!(state.phase, Phase::Paused);
        self.update_meta(&mut state, |meta| {
            if let Some(start) = start {
                owe_start(meta, paused, start);
            }
            meta.reported |= latest;
            meta.reports += 1;
        });
    }

    /// The `sub_agent` call that made this child is gone before it read that the child
    /// started (its run stopped, the app quit), so the parent never hears of the child:
    /// one whose run has not begun is undone, its task cancelled by `cancel` under this
    /// lock, in one step with the look at whether the run began (a run begins under this
    /// lock too). A run that began stays: it runs on and reports like any child of a
    /// stopped parent. Before, it was undone as well: a run that had already answered had
    /// its report dropped with its task and its meta said "reported", so the answer never
    /// reached the parent (found by the simulation, seeds 87 and 300132).
    pub(crate) fn cancel_if_unbegun<T>(&self, cancel: impl FnOnce() -> T) -> Option<T> {
        let state = self.lock();
        let begun = state
            .meta
            .task_id
            .as_ref()
            .is_some_and(|task| state.message_ids.contains(&task_message_id(task)));
        (!begun).then(cancel)
    }

    /// A child's task ended before its lease (cancelled, or the lease failed): it never
    /// ran and owes no report, so recovery must not call it interrupted (runtime review
    /// C2). What waited for it goes back to pending, except its own task message (the
    /// `sub_agent` call that made it failed, and says so).
    ///
    /// Except a follow-up cut off by a quit: its start was answered when it was sent
    /// ("started", a report to come), so it stays owed, and the next start finds the
    /// child interrupted with it queued (Resume runs it, Cancel reports that), as a
    /// follow-up cut off in its slot wait is. Undone, the child was idle and reported and
    /// the parent's `message_subagent` never got the report "started" promised. A start
    /// still deferred stays too: the late mark of the report before it writes it.
    pub(crate) fn settle_unstarted(&self) {
        let mut state = self.lock();
        let answered = matches!(&state.phase, Phase::Starting(starting)
            if !starting.inbox.iter().any(|m| is_task_message(&m.message_id)));
        let keep_owed = answered && self.shared.root.is_cancelled();
        // Only a run that waits in `Starting` is undone; any other phase (deleted, or a run
        // that ended meanwhile) stays as it is.
        if matches!(state.phase, Phase::Starting(_)) {
            if let Phase::Starting(starting) = std::mem::replace(&mut state.phase, Phase::Idle) {
                state.pending.extend(
                    starting
                        .inbox
                        .into_iter()
                        .filter(|m| !is_task_message(&m.message_id)),
                );
                self.save_pending(&state);
            }
        }
        if keep_owed {
            return;
        }
        // Its start was never written: the meta still speaks of the run before, whose
        // report is still on its way. Undone, this start no longer counts, so that
        // report, marked late, is the child's last and says "reported" (else the child
        // would owe a report nothing runs for, and recovery would send the answer again).
        if state.deferred_start.take().is_some() {
            state.child_runs = state.child_runs.saturating_sub(1);
            return;
        }
        let paused = matches!(state.phase, Phase::Paused);
        self.update_meta(&mut state, |meta| {
            meta.state = if paused {
                SessionState::Paused
            } else {
                SessionState::Idle
            };
            meta.reported = true;
            meta.interrupted = false;
            meta.run_message = None;
        });
    }

    /// A new child's worktree is made: it works there from its first run on. Refused once
    /// the child is deleted (its folder is gone) or has begun.
    pub(crate) fn set_worktree(
        &self,
        workspace: String,
        info: crate::protocol::WorktreeInfo,
    ) -> Result<(), String> {
        let mut state = self.lock();
        if !matches!(state.phase, Phase::Idle) {
            return Err(format!(
                "sub-agent {} is no longer new",
                self.meta.session_id
            ));
        }
        state.meta.workspace = workspace;
        state.meta.worktree = Some(info);
        let written = self.shared.store.write_meta(&state.meta);
        // Unwritten, the next `update_meta` must write even if it changes nothing more.
        state.meta_unsaved = written.is_err();
        written.map_err(|err| err.to_string())
    }

    /// Changes what the person may change of the meta (title, model, archived…), answered
    /// only once the disk has it: a write that fails (a full disk) leaves the session as it
    /// was and refuses the call, as a message is (SPEC §4). Before, the failure was logged
    /// and the call answered with a change a restart would lose.
    pub(crate) fn edit_meta(
        &self,
        change: impl FnOnce(&mut SessionMeta),
    ) -> Result<SessionMeta, RuntimeError> {
        let mut state = self.lock();
        if matches!(state.phase, Phase::Deleted(_)) {
            return Err(RuntimeError::Store(StoreError::NotFound(
                self.meta.session_id.clone(),
            )));
        }
        let before = state.meta.clone();
        change(&mut state.meta);
        state.meta.updated_at = crate::store::now();
        if let Err(err) = self.shared.store.write_meta(&state.meta) {
            // What a run changed and could not write before (`meta_unsaved`) stays owed.
            state.meta = before;
            self.shared.store.take_back_meta(&state.meta);
            return Err(err.into());
        }
        state.meta_unsaved = false;
        Ok(state.meta.clone())
    }

    /// Adds a note of something the person did outside the conversation (an undo, a
    /// rewind) to its history, so the chat shows it and the model reads it at its next
    /// turn (UX review E7). The note is a `user` message (id `note:…`), put only where
    /// SPEC §2 allows one:
    /// - with no run (the usual case: undo is refused while the session runs), at the end
    ///   of the history, under this lock so no run starts meanwhile; calls an earlier run
    ///   left open are answered first, as a run's start would;
    /// - into a run that began since (or a child's run waiting for its slot), through its
    ///   inbox, which the run takes at its next safe point, as it takes a steered message.
    ///
    /// Not folded into the person's next message: the note must show at once and survive a
    /// restart, the next message may be a report, and the person's own bubble (Edit, Fork)
    /// must stay theirs. Blocking (a write and a flush): call it off the async threads.
    pub(crate) fn add_note(&self, text: String) -> Result<(), RuntimeError> {
        let note = QueuedMessage {
            message_id: format!(
                "{}{}",
                crate::protocol::NOTE_ID_PREFIX,
                uuid::Uuid::new_v4().simple()
            ),
            content: text,
            config: RunConfig::default(),
            images: Vec::new(),
        };
        let id = self.meta.session_id.clone();
        let mut state = self.lock();
        if let Some(why) = &state.read_only {
            return Err(RuntimeError::Unavailable(why.clone()));
        }
        match &mut state.phase {
            Phase::Running(run) => {
                run.inbox.push(note);
                self.save_pending(&state);
                return Ok(());
            }
            Phase::Starting(starting) => {
                starting.inbox.push(note);
                self.save_pending(&state);
                return Ok(());
            }
            Phase::Deleted(_) => return Ok(()),
            Phase::Idle | Phase::Paused => {}
        }
        let open = match &state.history {
            Some(history) => interrupted_results(history),
            None => interrupted_results(&self.shared.store.load(&id)?.messages),
        };
        let mut added = open;
        added.push(note.to_user());
        let stored = self
            .shared
            .store
            .append(&id, &added)
            .and_then(|()| self.shared.store.sync(&id));
        // No run holds the file: it is closed again (a run reopens it).
        self.shared.store.release(&id);
        stored?;
        state.message_ids.insert(note.message_id.clone());
        if let Some(history) = &mut state.history {
            history.extend(added.iter().cloned());
        }
        drop(state);
        for message in added {
            self.emit_progress(Progress::MessageAppended { message });
        }
        Ok(())
    }

    /// Keeps the ACP session id of a `kind: acp` child's agent (for `session/load`).
    pub(crate) fn remember_acp_session(&self, id: &str) {
        let mut state = self.lock();
        if state.meta.acp_session.as_deref() != Some(id) {
            self.update_meta(&mut state, |meta| meta.acp_session = Some(id.to_string()));
        }
    }

    /// The stored meta as it is now (interrupted, reported, state …).
    pub fn current_meta(&self) -> SessionMeta {
        self.lock().meta.clone()
    }

    /// Clears `interrupted` and says whether it was set: a compare-and-set under the
    /// lock, so two quick resumes or cancels cannot both act (runtime review C10).
    pub(crate) fn take_interrupted(&self) -> bool {
        let mut state = self.lock();
        if !state.meta.interrupted || matches!(state.phase, Phase::Deleted(_)) {
            return false;
        }
        self.update_meta(&mut state, |meta| meta.interrupted = false);
        true
    }

    /// Waits for a child's run and maps it to the task registry's outcome; a cancelled
    /// task stops the child's run.
    pub(crate) async fn child_outcome(
        &self,
        outcome: oneshot::Receiver<RunOutcome>,
        token: CancellationToken,
    ) -> ChildOutcome {
        tokio::select! {
            outcome = outcome => match outcome {
                Ok(RunOutcome::Completed(answer)) => ChildOutcome::Completed(answer),
                Ok(RunOutcome::Failed(message)) => ChildOutcome::Failed(message),
                Ok(RunOutcome::Interrupted(_)) => ChildOutcome::Interrupted,
                Ok(RunOutcome::Cancelled | RunOutcome::Compacted { .. }) | Err(_) => {
                    ChildOutcome::Stopped
                }
            },
            _ = token.cancelled() => {
                self.cancel().await;
                ChildOutcome::Stopped
            }
        }
    }
}

/// A child's task message (`task:<task_id>`), which its meta keeps (`task_content`).
fn is_task_message(message_id: &str) -> bool {
    message_id.starts_with("task:")
}

/// The message id of the task `task_id` gives its child (its first run's first message).
pub(crate) fn task_message_id(task_id: &str) -> String {
    format!("task:{task_id}")
}

/// The task id of a report's message id (`subagent:<task_id>`).
pub(super) fn report_task_id(message_id: &str) -> Option<&str> {
    message_id.strip_prefix("subagent:")
}

/// Task ids this history's `sub_agent` calls were given (their pending results).
fn started_task_ids(messages: &[Message]) -> impl Iterator<Item = String> + '_ {
    messages
        .iter()
        .filter(|m| m.role == Role::Tool && m.text().starts_with("{\"status\":\"pending\""))
        .filter_map(|m| {
            serde_json::from_str::<serde_json::Value>(m.text())
                .ok()?
                .get("task_id")?
                .as_str()
                .map(str::to_string)
        })
}

/// A synthetic result for each call of the last assistant message that has none, so the
/// history is valid to send again (SPEC §2): what a run start, a panic and recovery add.
pub(crate) fn interrupted_results(messages: &[Message]) -> Vec<Message> {
    unanswered_calls(messages)
        .iter()
        .map(|id| Message::tool(id, INTERRUPTED_RESULT))
        .collect()
}

/// Ids of the calls of the last assistant message that have no result yet.
fn unanswered_calls(messages: &[Message]) -> Vec<String> {
    let Some(index) = messages.iter().rposition(|m| m.role == Role::Assistant) else {
        return Vec::new();
    };
    let answered: HashSet<&str> = messages[index + 1..]
        .iter()
        .filter(|m| m.role == Role::Tool)
        .filter_map(|m| m.tool_call_id.as_deref())
        .collect();
    messages[index]
        .tool_calls
        .iter()
        .filter(|c| !answered.contains(c.id.as_str()))
        .map(|c| c.id.clone())
        .collect()
}

/// A safe point's take: the run's inbox, kept as taken until the history has it
/// (`ActiveRun::taken`).
fn take_into(run: &mut ActiveRun) -> Vec<QueuedMessage> {
    let inbox = std::mem::take(&mut run.inbox);
    run.taken.extend(inbox.iter().cloned());
    inbox
}
