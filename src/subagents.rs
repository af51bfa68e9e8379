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
    pub workspace: String,
    pub content: String,
    /// The config of the parent's run that delegated, kept by the report.
    pub config: RunConfig,
    /// Continue an interrupted child from its own history instead of starting it.
    pub resume: bool,
    /// How deep the child is (1 for a top-level session's child): slots are per depth.
    pub depth: usize,
    /// The id of the message that starts this run: `None` for a child's task
    /// (`task:<task_id>`), set for a follow-up.
    pub message_id: Option<String>,
    /// The provider (model server) the child runs on, found once from its profile: its
    /// slots are waited for, and the UI says "waiting for a slot on <server>".
    pub server: Option<String>,
    /// The run may start a paused child: the person asked for it (a message typed in the
    /// child's tab, Retry, Resume), as the person's own message does in any session, or
    /// the pause was a failure's, which the person did not choose. A parent's
    /// `message_subagent` to a child the person stopped does not (SPEC §4: what the
    /// person paused stays paused).
    pub starts_paused: bool,
}

/// How a child's run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildOutcome {
    Completed(String),
    Failed(String),
    /// The child's own run was stopped by the person (not by deleting the task).
    Stopped,
}

/// A finished child's report for its parent.
#[derive(Debug, Clone)]
pub struct Report {
    pub task_id: String,
    pub session_id: SessionId,
    pub parent_session_id: SessionId,
    pub outcome: Result<String, String>,
    pub config: RunConfig,
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
}

struct Entry {
    info: SubagentInfo,
    order: u64,
    token: CancellationToken,
    done: CancellationToken,
}

struct Inner {
    lease: LeaseFn,
    runner: RunnerFn,
    notify: NotifyFn,
    root: CancellationToken,
    tasks: Mutex<HashMap<SessionId, Entry>>,
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
                runner,
                notify,
                root,
                tasks: Mutex::new(HashMap::new()),
                next_order: Default::default(),
                count: watch::channel(0).0,
            }),
        }
    }

    fn tasks(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Entry>> {
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
        let token = self.inner.root.child_token();
        let done = CancellationToken::new();
        {
            let mut tasks = self.tasks();
            // One task per child: a second start (two quick resumes) must not replace the
            // first, whose report would then be lost (runtime review C10).
            if tasks.contains_key(&start.session_id) {
                return Err(StartError::AlreadyRunning(start.session_id.clone()));
            }
            let order = self
                .inner
                .next_order
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tasks.insert(
                start.session_id.clone(),
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
        }
        observer.state(&start.session_id, SubagentState::WaitingForSlot);
        let (started_tx, started_rx) = oneshot::channel();
        let registry = self.clone();
        let task_id = start.task_id.clone();
        tokio::spawn(registry.work(start, observer, token, done, started_tx));
        match started_rx.await {
            Ok(result) => result,
            Err(_) => Err(StartError::StoppedBeforeStartup(task_id)),
        }
    }

    async fn work(
        self,
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
                self.remove(&session_id);
                observer.cancelled(&session_id);
                observer.state(&session_id, SubagentState::Cancelled);
                let _ = started.send(Err(StartError::StoppedBeforeStartup(start.task_id)));
                done.cancel();
                return;
            }
            Some(Err(message)) => {
                self.remove(&session_id);
                observer.error(&session_id, &message);
                observer.state(&session_id, SubagentState::Failed);
                let _ = started.send(Err(StartError::Lease(message)));
                done.cancel();
                return;
            }
            Some(Ok(guard)) => guard,
        };
        self.set_state(&session_id, SubagentState::Running);
        observer.state(&session_id, SubagentState::Running);
        // One poll starts the child's run, so it counts as active before `start` returns
        // (the parent may finish its own run at once and must see the child working).
        // A panic in the child's task ends it as failed: its parent gets an error report
        // and `cancel_all` does not wait forever (runtime review C17).
        let mut running =
            std::panic::AssertUnwindSafe((self.inner.runner)(start.clone(), token.clone()))
                .catch_unwind();
        let first = futures::poll!(&mut running);
        let _ = started.send(Ok(()));
        let outcome = match first {
            std::task::Poll::Ready(outcome) => outcome,
            std::task::Poll::Pending => running.await,
        };
        let outcome = outcome.unwrap_or_else(|_| {
            ChildOutcome::Failed("internal error: the sub-agent stopped unexpectedly".into())
        });
        drop(guard);
        if token.is_cancelled() {
            // Deleted or shut down: no report, the parent is not woken.
            self.remove(&session_id);
            observer.cancelled(&session_id);
            observer.state(&session_id, SubagentState::Cancelled);
            done.cancel();
            return;
        }
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
        };
        self.set_state(&session_id, state);
        observer.state(&session_id, state);
        // The report is handed over before the task leaves the registry, so "no tasks
        // left" means every report has reached its parent.
        (self.inner.notify)(Report {
            task_id: start.task_id,
            session_id: session_id.clone(),
            parent_session_id: start.parent_session_id,
            outcome,
            config: start.config,
        })
        .await;
        self.remove(&session_id);
        done.cancel();
    }

    fn set_state(&self, session_id: &str, state: SubagentState) {
        if let Some(entry) = self.tasks().get_mut(session_id) {
            entry.info.state = state;
        }
    }

    fn remove(&self, session_id: &str) {
        let mut tasks = self.tasks();
        tasks.remove(session_id);
        self.inner.count.send_replace(tasks.len());
    }

    /// Cancels a task (no report will be sent) and waits until it has stopped.
    /// Returns false when no such task runs.
    pub async fn cancel(&self, session_id: &str) -> bool {
        let done = {
            let tasks = self.tasks();
            let Some(entry) = tasks.get(session_id) else {
                return false;
            };
            entry.token.cancel();
            entry.done.clone()
        };
        done.cancelled().await;
        true
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

    /// The state of a task, if it is still registered.
    pub fn state_of(&self, session_id: &str) -> Option<SubagentState> {
        self.tasks().get(session_id).map(|entry| entry.info.state)
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
        let ids: Vec<SessionId> = self.tasks().keys().cloned().collect();
        for id in ids {
            self.cancel(&id).await;
        }
        self.wait_empty().await;
    }
}
