//! The background sub-agent task registry (SPEC §3): lease, start-up, cancellation, per-parent snapshot, and exactly one report per finished task.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::protocol::{RunConfig, SessionId, SubagentInfo, SubagentState};

/// What holds a runtime slot while a child runs; dropping it frees the slot.
pub type LeaseGuard = Box<dyn Send + Sync>;
/// Acquires a slot for a child; may wait (all slots busy) or fail (runtime unavailable).
pub type LeaseFn =
    Arc<dyn Fn(&ChildStart) -> BoxFuture<'static, Result<LeaseGuard, String>> + Send + Sync>;
/// Waits for a run slot of the child (the children cap), inside the child's own task so
/// that no caller ever waits for it. `None`: the person stopped the child meanwhile (its
/// report says so). The registry drops the wait when the task is cancelled.
pub type SlotFn = Arc<dyn Fn(&ChildStart) -> BoxFuture<'static, Option<LeaseGuard>> + Send + Sync>;
/// Runs a child to its end. Its first poll must start the child's run (so the child
/// counts as active at once), and it must stop the child when the token fires.
pub type RunnerFn =
    Arc<dyn Fn(ChildStart, CancellationToken) -> BoxFuture<'static, ChildOutcome> + Send + Sync>;
/// Hands a finished child's report to its parent.
pub type NotifyFn = Arc<dyn Fn(Report) -> BoxFuture<'static, ()> + Send + Sync>;

/// Everything needed to start a child.
#[derive(Debug, Clone)]
pub struct ChildStart {
    pub task_id: String,
    pub session_id: SessionId,
    pub parent_session_id: SessionId,
    pub title: String,
    /// Where the child works (its worktree when isolated).
    pub workspace: String,
    /// The config of the parent's run that delegated, kept by the report.
    pub config: RunConfig,
    /// How deep the child is (1 for a top-level session's child): slots are per depth.
    pub depth: usize,
    /// The provider (model server) the child runs on, found once from its profile: its
    /// slots are waited for, and the UI says "waiting for a slot on <server>".
    pub server: Option<String>,
    /// Which of the child's runs this task carries (its controller counts the runs it
    /// begins), so that the report tells whether a later run began since.
    pub run: u64,
}

/// How a child's run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildOutcome {
    Completed(String),
    Failed(String),
    /// The child's own run was stopped by the person (not by deleting the task).
    Stopped,
    /// The child's run was cut off (its ACP agent's process died) and the child marked
    /// interrupted in the same step: no report now; resuming it starts a new task that
    /// reports, cancelling it reports the cancel (as after a restart).
    Interrupted,
}

/// A finished child's report for its parent.
#[derive(Debug, Clone)]
pub struct Report {
    pub task_id: String,
    pub session_id: SessionId,
    pub parent_session_id: SessionId,
    pub outcome: Result<String, String>,
    pub config: RunConfig,
    /// The run it reports ([`ChildStart::run`]); none for a report no run made (an
    /// interrupted child cancelled).
    pub run: Option<u64>,
}

/// Why a child did not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    #[error("sub-agent task {0} was stopped before startup")]
    StoppedBeforeStartup(String),
    #[error("{0}")]
    Lease(String),
    #[error("sub-agent {0} is already running")]
    AlreadyRunning(String),
}

/// Told about each task's life, e.g. to show child states in the UI.
pub trait SubagentObserver: Send + Sync {
    fn state(&self, _session_id: &str, _state: SubagentState) {}
    fn cancelled(&self, _session_id: &str) {}
    fn error(&self, _session_id: &str, _message: &str) {}
    /// The task ended before its lease (cancelled, or the lease failed): the child never
    /// ran and owes no report.
    fn unstarted(&self, _session_id: &str) {}
}

struct Entry {
    info: SubagentInfo,
    order: u64,
    token: CancellationToken,
    done: CancellationToken,
}

struct Inner {
    lease: LeaseFn,
    slot: Option<SlotFn>,
    runner: RunnerFn,
    notify: NotifyFn,
    root: CancellationToken,
    /// Keyed by start order: a child may have a finished task still handing over its
    /// report while its next run's task waits (a follow-up sent as it finished).
    tasks: Mutex<HashMap<u64, Entry>>,
    next_order: std::sync::atomic::AtomicU64,
    count: watch::Sender<usize>,
}

/// The registry. Cheap to clone; clones share the tasks.
#[derive(Clone)]
pub struct SubagentTasks {
    inner: Arc<Inner>,
}

impl SubagentTasks {
    pub fn new(lease: LeaseFn, runner: RunnerFn, notify: NotifyFn) -> Self {
        Self::with_root(lease, runner, notify, CancellationToken::new())
    }

    /// `root` cancels every task at once (service shutdown).
    pub fn with_root(
        lease: LeaseFn,
        runner: RunnerFn,
        notify: NotifyFn,
        root: CancellationToken,
    ) -> Self {
        SubagentTasks {
            inner: Arc::new(Inner {
                lease,
                slot: None,
                runner,
                notify,
                root,
                tasks: Mutex::new(HashMap::new()),
                next_order: Default::default(),
                count: watch::channel(0).0,
            }),
        }
    }

    /// Waits for `slot` inside each task before its run (the runtime's children cap).
    pub fn with_slots(mut self, slot: SlotFn) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.slot = Some(slot);
        }
        self
    }

    fn tasks(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        self.inner
            .tasks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers the task and waits until it holds its lease (or cannot get one).
    /// The child then runs in the background; its report goes through `notify`.
    pub async fn start(
        &self,
        start: ChildStart,
        observer: Arc<dyn SubagentObserver>,
    ) -> Result<(), StartError> {
        let task_id = start.task_id.clone();
        let started = self.spawn(start, observer)?;
        match started.await {
            Ok(result) => result,
            Err(_) => Err(StartError::StoppedBeforeStartup(task_id)),
        }
    }

    /// Registers the task and starts it without waiting: never blocks, so a child's
    /// controller may call it under its own lock. The receiver answers once the task
    /// holds its lease (or cannot get one).
    pub fn spawn(
        &self,
        start: ChildStart,
        observer: Arc<dyn SubagentObserver>,
    ) -> Result<oneshot::Receiver<Result<(), StartError>>, StartError> {
        let token = self.inner.root.child_token();
        let done = CancellationToken::new();
        let order = {
            let mut tasks = self.tasks();
            // A child may have a task still ending (its run over, its report on the way)
            // when its next run's task is registered: the controller's phase lets only one
            // run be started at a time, and the new task waits for the earlier one
            // (`wait_for_earlier`), so report n is recorded before run n + 1 begins.
            let order = self
                .inner
                .next_order
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tasks.insert(
                order,
                Entry {
                    info: SubagentInfo {
                        task_id: start.task_id.clone(),
                        session_id: start.session_id.clone(),
                        parent_session_id: start.parent_session_id.clone(),
                        title: start.title.clone(),
                        state: SubagentState::WaitingForSlot,
                        server: start.server.clone(),
                    },
                    order,
                    token: token.clone(),
                    done: done.clone(),
                },
            );
            self.inner.count.send_replace(tasks.len());
            order
        };
        observer.state(&start.session_id, SubagentState::WaitingForSlot);
        let (started_tx, started_rx) = oneshot::channel();
        let registry = self.clone();
        tokio::spawn(registry.work(order, start, observer, token, done, started_tx));
        Ok(started_rx)
    }

    /// Waits until no earlier task of the same child is left: a child's runs and their
    /// reports follow each other, so report `n` is recorded before run `n + 1` begins
    /// and numbers never race (runtime review R13).
    async fn wait_for_earlier(&self, order: u64, session_id: &str) {
        let mut count = self.inner.count.subscribe();
        loop {
            let earlier = self
                .tasks()
                .values()
                .any(|entry| entry.order < order && entry.info.session_id == session_id);
            if !earlier {
                return;
            }
            if count.changed().await.is_err() {
                return;
            }
        }
    }

    async fn work(
        self,
        order: u64,
        start: ChildStart,
        observer: Arc<dyn SubagentObserver>,
        token: CancellationToken,
        done: CancellationToken,
        started: oneshot::Sender<Result<(), StartError>>,
    ) {
        let session_id = start.session_id.clone();
        let lease = tokio::select! {
            biased;
            _ = token.cancelled() => None,
            lease = (self.inner.lease)(&start) => Some(lease),
        };
        let guard = match lease {
            None => {
                self.remove(order);
                observer.unstarted(&session_id);
                observer.cancelled(&session_id);
                observer.state(&session_id, SubagentState::Cancelled);
                let _ = started.send(Err(StartError::StoppedBeforeStartup(start.task_id)));
                done.cancel();
                return;
            }
            Some(Err(message)) => {
                self.remove(order);
                observer.unstarted(&session_id);
                observer.error(&session_id, &message);
                observer.state(&session_id, SubagentState::Failed);
                let _ = started.send(Err(StartError::Lease(message)));
                done.cancel();
                return;
            }
            Some(Ok(guard)) => guard,
        };
        // With a children cap, the caller has its answer now and the child waits for its
        // slot in here ("waiting for a slot"), never in the caller (SPEC §3).
        let mut started = Some(started);
        let slot = match self.inner.slot.clone() {
            None => None,
            Some(slot) => {
                if let Some(started) = started.take() {
                    let _ = started.send(Ok(()));
                }
                let waited = tokio::select! {
                    biased;
                    _ = token.cancelled() => None,
                    got = async {
                        self.wait_for_earlier(order, &session_id).await;
                        slot(&start).await
                    } => Some(got),
                };
                match waited {
                    // Deleted or shut down while waiting: no report.
                    None => {
                        self.remove(order);
                        observer.cancelled(&session_id);
                        observer.state(&session_id, SubagentState::Cancelled);
                        done.cancel();
                        return;
                    }
                    // The person stopped it before it ran: it reports that, once.
                    Some(None) => {
                        self.report(order, start, &observer, ChildOutcome::Stopped)
                            .await;
                        done.cancel();
                        return;
                    }
                    Some(Some(slot)) => Some(slot),
                }
            }
        };
        self.set_state(order, SubagentState::Running);
        observer.state(&session_id, SubagentState::Running);
        // One poll starts the child's run, so it counts as active before `start` returns
        // (the parent may finish its own run at once and must see the child working).
        // A panic in the child's task ends it as failed: its parent gets an error report
        // and `cancel_all` does not wait forever (runtime review C17).
        let mut running =
            std::panic::AssertUnwindSafe((self.inner.runner)(start.clone(), token.clone()))
                .catch_unwind();
        let first = futures::poll!(&mut running);
        if let Some(started) = started.take() {
            let _ = started.send(Ok(()));
        }
        let outcome = match first {
            std::task::Poll::Ready(outcome) => outcome,
            std::task::Poll::Pending => running.await,
        };
        let outcome = outcome.unwrap_or_else(|_| {
            ChildOutcome::Failed("internal error: the sub-agent stopped unexpectedly".into())
        });
        drop(slot);
        drop(guard);
        if token.is_cancelled() || outcome == ChildOutcome::Interrupted {
            // Deleted or shut down: no report, the parent is not woken. Interrupted: its
            // report is owed by the resume or the cancel that ends the interruption.
            self.remove(order);
            observer.cancelled(&session_id);
            observer.state(&session_id, SubagentState::Cancelled);
            done.cancel();
            return;
        }
        self.report(order, start, &observer, outcome).await;
        done.cancel();
    }

    /// Hands the one report of a task's run to its parent, then lets the task go.
    async fn report(
        &self,
        order: u64,
        start: ChildStart,
        observer: &Arc<dyn SubagentObserver>,
        outcome: ChildOutcome,
    ) {
        let session_id = start.session_id.clone();
        let (state, outcome) = match outcome {
            ChildOutcome::Completed(answer) => (SubagentState::Done, Ok(answer)),
            ChildOutcome::Failed(message) => {
                observer.error(&session_id, &message);
                (SubagentState::Failed, Err(message))
            }
            ChildOutcome::Stopped => (
                SubagentState::Cancelled,
                Err("the sub-agent was stopped by the user".to_string()),
            ),
            // `work` ends an interrupted child's task without a report; were one asked
            // for, it would say what happened rather than claim an answer.
            ChildOutcome::Interrupted => (
                SubagentState::Cancelled,
                Err("the sub-agent was interrupted".to_string()),
            ),
        };
        self.set_state(order, state);
        observer.state(&session_id, state);
        // The report is handed over before the task leaves the registry, so "no tasks
        // left" means every report has reached its parent.
        (self.inner.notify)(Report {
            task_id: start.task_id,
            session_id: session_id.clone(),
            parent_session_id: start.parent_session_id,
            outcome,
            config: start.config,
            run: Some(start.run),
        })
        .await;
        self.remove(order);
    }

    fn set_state(&self, order: u64, state: SubagentState) {
        if let Some(entry) = self.tasks().get_mut(&order) {
            entry.info.state = state;
        }
    }

    fn remove(&self, order: u64) {
        let mut tasks = self.tasks();
        tasks.remove(&order);
        self.inner.count.send_replace(tasks.len());
    }

    /// Cancels a child's tasks (no report will be sent) and waits until they have stopped.
    /// Returns false when no such task runs.
    pub async fn cancel(&self, session_id: &str) -> bool {
        let done = self.cancel_now(session_id);
        if done.is_empty() {
            return false;
        }
        for done in done {
            done.cancelled().await;
        }
        true
    }

    /// Cancels a child's tasks now, without waiting: what to wait on for each to stop
    /// (for a caller that must cancel under a lock of its own).
    pub fn cancel_now(&self, session_id: &str) -> Vec<CancellationToken> {
        let tasks = self.tasks();
        tasks
            .values()
            .filter(|entry| entry.info.session_id == session_id)
            .map(|entry| {
                entry.token.cancel();
                entry.done.clone()
            })
            .collect()
    }

    /// The children of one parent that are still working, in start order.
    pub fn snapshot(&self, parent_session_id: &str) -> Vec<SubagentInfo> {
        let tasks = self.tasks();
        let mut children: Vec<_> = tasks
            .values()
            .filter(|entry| entry.info.parent_session_id == parent_session_id)
            .map(|entry| (entry.order, entry.info.clone()))
            .collect();
        children.sort_by_key(|(order, _)| *order);
        children.into_iter().map(|(_, info)| info).collect()
    }

    /// The state of a child's newest task, if one is still registered.
    pub fn state_of(&self, session_id: &str) -> Option<SubagentState> {
        self.tasks()
            .values()
            .filter(|entry| entry.info.session_id == session_id)
            .max_by_key(|entry| entry.order)
            .map(|entry| entry.info.state)
    }

    /// Whether a task of this child is registered (waiting, running, or handing over its
    /// report).
    pub fn has_task(&self, session_id: &str) -> bool {
        self.tasks()
            .values()
            .any(|entry| entry.info.session_id == session_id)
    }

    pub fn len(&self) -> usize {
        self.tasks().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The number of tasks, as a watch (wait for a count without polling).
    pub fn watch_len(&self) -> watch::Receiver<usize> {
        self.inner.count.subscribe()
    }

    /// Waits until no task is left.
    pub async fn wait_empty(&self) {
        let mut count = self.inner.count.subscribe();
        let _ = count.wait_for(|count| *count == 0).await;
    }

    /// Cancels every task and waits for all of them.
    pub async fn cancel_all(&self) {
        let ids: Vec<SessionId> = self
            .tasks()
            .values()
            .map(|entry| entry.info.session_id.clone())
            .collect();
        for id in ids {
            self.cancel(&id).await;
        }
        self.wait_empty().await;
    }
}
