//! The runtime service (SPEC §3, §6): owns the controllers, the sub-agent tasks and the config; counts active runs; delegation, reports, deletion and shutdown.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, Weak};

use async_trait::async_trait;
use futures::FutureExt;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use crate::approvals::ApprovalBook;
use crate::config::Config;
use crate::controller::{QueuedMessage, SessionController};
use crate::error::RuntimeError;
use crate::protocol::{
    RunConfig, SessionId, SessionInfo, SessionState, SubagentState, Usage, commands, kinds,
    report_message_id, report_text,
};
use crate::provider::{ModelProvider, ProviderError, ProviderFactory};
use crate::store::{NewSession, ReportRecord, SessionStore};
use crate::subagents::{
    ChildOutcome, ChildStart, LeaseGuard, Report, SubagentObserver, SubagentTasks,
};
use crate::tools::{Delegator, ToolContext, ToolRegistry};

/// What the controllers share: store, config, provider, approvals, tasks, run count.
pub struct Shared {
    pub(crate) store: Arc<SessionStore>,
    data_dir: PathBuf,
    config: RwLock<Config>,
    config_path: Option<PathBuf>,
    provider_factory: ProviderFactory,
    provider: Mutex<Option<Arc<dyn ModelProvider>>>,
    pub(crate) approvals: Arc<ApprovalBook>,
    pub(crate) subagents: SubagentTasks,
    pub(crate) root: CancellationToken,
    active_runs: watch::Sender<usize>,
    slots: RwLock<Arc<Semaphore>>,
    /// Tokens of each session's whole tree, kept as usage is added.
    tree_usage: Mutex<HashMap<SessionId, Usage>>,
}

impl Shared {
    pub fn config(&self) -> Config {
        self.read_config(Config::clone)
    }

    /// Reads part of the config without copying all of it (hot paths: every tool call).
    pub(crate) fn read_config<T>(&self, read: impl FnOnce(&Config) -> T) -> T {
        read(&self.config.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// The provider for the current config, built once per config.
    pub(crate) fn provider(&self) -> Result<Arc<dyn ModelProvider>, ProviderError> {
        let mut cached = self.provider.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(provider) = cached.as_ref() {
            return Ok(provider.clone());
        }
        let provider = (self.provider_factory)(&self.config().provider)?;
        *cached = Some(provider.clone());
        Ok(provider)
    }

    pub(crate) fn run_started(&self) {
        self.active_runs.send_modify(|count| *count += 1);
    }

    pub(crate) fn run_ended(&self) {
        self.active_runs
            .send_modify(|count| *count = count.saturating_sub(1));
    }

    pub(crate) fn tree_usage(&self, session_id: &str, own: Usage) -> Usage {
        self.tree_usage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(session_id)
            .copied()
            .unwrap_or(own)
    }

    pub(crate) fn add_tree_usage(&self, lineage: &[SessionId], usage: Usage) {
        let mut tree = self.tree_usage.lock().unwrap_or_else(|p| p.into_inner());
        for id in lineage {
            tree.entry(id.clone()).or_default().add(usage);
        }
    }
}

/// How to build a service.
pub struct ServiceOptions {
    /// Sessions live in `<data_dir>/sessions`.
    pub data_dir: PathBuf,
    /// Where the config is read from and saved to; `None` keeps it in memory only.
    pub config_path: Option<PathBuf>,
    /// Used instead of reading `config_path` (tests, embedders).
    pub config: Option<Config>,
    pub provider_factory: ProviderFactory,
    /// The tools of top-level sessions; `None` for the standard set.
    pub tools: Option<ToolRegistry>,
}

struct ServiceInner {
    shared: Arc<Shared>,
    controllers: Mutex<HashMap<SessionId, Arc<SessionController>>>,
    tools: ToolRegistry,
    this: Weak<ServiceInner>,
}

/// The runtime: one per process. Cheap to clone.
#[derive(Clone)]
pub struct RuntimeService {
    inner: Arc<ServiceInner>,
    recovery: RecoveryStats,
}

/// The result text given to calls a crash left unanswered.
pub const INTERRUPTED_RESULT: &str = "Interrupted: Bumblehive stopped before this call finished";

/// Counts of what start-up recovery repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryStats {
    pub interrupted_runs: usize,
    pub interrupted_children: usize,
    pub recorded_reports: usize,
    pub requeued_reports: usize,
}

/// Ids of the calls of the last assistant message that have no result yet.
fn unanswered_calls(messages: &[crate::protocol::Message]) -> Vec<String> {
    use crate::protocol::Role;
    let Some(index) = messages.iter().rposition(|m| m.role == Role::Assistant) else {
        return Vec::new();
    };
    let answered: std::collections::HashSet<&str> = messages[index + 1..]
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

/// The final answer, if the history ends with one.
fn final_answer(messages: &[crate::protocol::Message]) -> Option<String> {
    let last = messages.last()?;
    (last.role == crate::protocol::Role::Assistant && last.tool_calls.is_empty())
        .then(|| last.text().to_string())
}

impl RuntimeService {
    pub fn new(options: ServiceOptions) -> Result<Self, RuntimeError> {
        let config = match (options.config, &options.config_path) {
            (Some(config), _) => config,
            (None, Some(path)) => Config::load(path)?,
            (None, None) => Config::default(),
        };
        config.validate()?;
        let store = Arc::new(SessionStore::new(&options.data_dir)?);
        let root = CancellationToken::new();
        let slots = Arc::new(Semaphore::new(config.subagents.max_concurrent));
        let tools = options.tools.unwrap_or_else(ToolRegistry::standard);
        let inner = Arc::new_cyclic(|this: &Weak<ServiceInner>| {
            let subagents = SubagentTasks::with_root(
                lease_fn(this.clone()),
                runner_fn(this.clone()),
                notify_fn(this.clone()),
                root.clone(),
            );
            ServiceInner {
                shared: Arc::new(Shared {
                    store,
                    data_dir: options.data_dir.clone(),
                    config: RwLock::new(config),
                    config_path: options.config_path,
                    provider_factory: options.provider_factory,
                    provider: Mutex::new(None),
                    approvals: Arc::new(ApprovalBook::default()),
                    subagents,
                    root,
                    active_runs: watch::channel(0).0,
                    slots: RwLock::new(slots),
                    tree_usage: Mutex::new(HashMap::new()),
                }),
                controllers: Mutex::new(HashMap::new()),
                tools,
                this: this.clone(),
            }
        });
        let recovery = inner.recover()?;
        Ok(RuntimeService { inner, recovery })
    }

    /// What the start-up recovery repaired.
    pub fn recovery(&self) -> &RecoveryStats {
        &self.recovery
    }

    /// Where things are, for the settings page: data, config and logs.
    pub fn app_info(&self) -> serde_json::Value {
        let shared = &self.inner.shared;
        serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "data_dir": shared.data_dir.display().to_string(),
            "log_dir": crate::config::log_dir(&shared.data_dir).display().to_string(),
            "config_path": shared.config_path.as_ref().map(|p| p.display().to_string()),
        })
    }

    /// Stores an API key in the OS keyring and points the provider at it. The key is
    /// never written to the config, a session or a log.
    pub async fn set_api_key(
        &self,
        key: &str,
        entry: Option<String>,
    ) -> Result<Config, RuntimeError> {
        if key.trim().is_empty() {
            return Err(RuntimeError::InvalidArgument("the API key is empty".into()));
        }
        if self.is_busy() {
            return Err(RuntimeError::Busy(
                "runs are active; stop them before changing the API key".into(),
            ));
        }
        let entry = entry.unwrap_or_else(|| self.config().provider.kind.clone());
        crate::providers::store_key_in_keyring(&entry, &crate::providers::ApiKey::new(key.trim()))
            .await
            .map_err(|err| RuntimeError::Unavailable(err.to_string()))?;
        self.update_config(&serde_json::json!({"provider": {"api_key_keyring": entry}}))
    }

    /// Continues an interrupted child from its own history; its report then reaches the
    /// parent as usual. Waits until the child holds a slot.
    pub async fn resume_subagent(&self, session_id: &str) -> Result<(), RuntimeError> {
        let child = self.controller(session_id)?;
        let meta = child.current_meta();
        let (Some(task_id), Some(parent)) = (meta.task_id.clone(), meta.parent_session_id.clone())
        else {
            return Err(RuntimeError::InvalidArgument(format!(
                "session {session_id} is not a sub-agent"
            )));
        };
        if !meta.interrupted {
            return Err(RuntimeError::InvalidArgument(format!(
                "sub-agent {session_id} was not interrupted"
            )));
        }
        let resume = !self
            .inner
            .shared
            .store
            .load(session_id)?
            .messages
            .is_empty();
        child.set_interrupted(false);
        let start = ChildStart {
            task_id: task_id.clone(),
            session_id: session_id.to_string(),
            parent_session_id: parent,
            title: meta.title.clone(),
            workspace: meta.workspace.clone(),
            content: meta.task_content.clone().unwrap_or_default(),
            config: RunConfig::default(),
            resume,
        };
        let observer = Arc::new(EventObserver {
            child: Arc::downgrade(&child),
            task_id,
        });
        self.subagents()
            .start(start, observer)
            .await
            .map_err(|err| RuntimeError::InvalidArgument(err.to_string()))
    }

    /// `cancel`: stops a session's run. An interrupted child has no run: cancelling it
    /// ends its task, and the parent gets an error report instead of waiting forever.
    pub async fn cancel_session(&self, session_id: &str) -> Result<(), RuntimeError> {
        let controller = self.controller(session_id)?;
        let meta = controller.current_meta();
        if meta.interrupted {
            if let (Some(task_id), Some(parent)) = (meta.task_id, meta.parent_session_id) {
                controller.set_interrupted(false);
                self.inner
                    .deliver_report(Report {
                        task_id,
                        session_id: session_id.to_string(),
                        parent_session_id: parent,
                        outcome: Err(
                            "the sub-agent was interrupted and then cancelled by the user".into(),
                        ),
                        config: RunConfig::default(),
                    })
                    .await;
                return Ok(());
            }
        }
        // A child still waiting for a slot has no run to stop: cancelling its task makes the
        // parent's `sub_agent` call fail with "stopped before startup", which is the answer.
        if !controller.is_running()
            && self.subagents().state_of(session_id) == Some(SubagentState::WaitingForSlot)
        {
            self.subagents().cancel(session_id).await;
            return Ok(());
        }
        controller.cancel().await;
        Ok(())
    }

    pub fn store(&self) -> &SessionStore {
        &self.inner.shared.store
    }

    pub fn subagents(&self) -> &SubagentTasks {
        &self.inner.shared.subagents
    }

    pub fn config(&self) -> Config {
        self.inner.shared.config()
    }

    /// Runs that are working now, children included.
    pub fn active_runs(&self) -> usize {
        *self.inner.shared.active_runs.borrow()
    }

    /// True while any run works or any sub-agent task exists.
    pub fn is_busy(&self) -> bool {
        self.active_runs() > 0 || !self.subagents().is_empty()
    }

    pub fn create_session(
        &self,
        workspace: &str,
        title: Option<String>,
    ) -> Result<SessionInfo, RuntimeError> {
        let path = Path::new(workspace);
        if !path.is_absolute() {
            return Err(RuntimeError::InvalidArgument(format!(
                "workspace must be an absolute path, got {workspace:?}"
            )));
        }
        if !path.is_dir() {
            return Err(RuntimeError::InvalidArgument(format!(
                "workspace {workspace} is not a folder"
            )));
        }
        let meta = self.inner.shared.store.create(NewSession {
            workspace: workspace.to_string(),
            title,
            ..NewSession::default()
        })?;
        Ok(meta.info(SessionState::Idle))
    }

    /// The controller of a session, loaded on first use.
    pub fn controller(&self, session_id: &str) -> Result<Arc<SessionController>, RuntimeError> {
        self.inner.controller(session_id)
    }

    pub fn session_info(&self, session_id: &str) -> Result<SessionInfo, RuntimeError> {
        let meta = self.inner.shared.store.meta(session_id)?;
        Ok(meta.info(self.inner.live_state(session_id).unwrap_or(meta.state)))
    }

    pub fn get_session(
        &self,
        session_id: &str,
    ) -> Result<commands::SessionWithMessages, RuntimeError> {
        let loaded = self.inner.shared.store.load(session_id)?;
        let state = self
            .inner
            .live_state(session_id)
            .unwrap_or(loaded.meta.state);
        Ok(commands::SessionWithMessages {
            info: loaded.meta.info(state),
            messages: loaded.messages,
            notice: loaded.notice,
        })
    }

    pub fn list_sessions(&self, workspace: Option<&str>) -> Result<Vec<SessionInfo>, RuntimeError> {
        let metas = self.inner.shared.store.list(workspace)?;
        Ok(metas
            .into_iter()
            .map(|meta| {
                let state = self
                    .inner
                    .live_state(&meta.session_id)
                    .unwrap_or(meta.state);
                meta.info(state)
            })
            .collect())
    }

    /// Applies a merge patch to the config. Fails with `busy` while anything runs.
    pub fn update_config(&self, patch: &serde_json::Value) -> Result<Config, RuntimeError> {
        let shared = &self.inner.shared;
        let mut config = shared.config.write().unwrap_or_else(|p| p.into_inner());
        if self.is_busy() {
            return Err(RuntimeError::Busy(format!(
                "{} run(s) and {} sub-agent task(s) are active; stop them before changing the config",
                self.active_runs(),
                self.subagents().len()
            )));
        }
        let next = config.patched(patch)?;
        if let Some(path) = &shared.config_path {
            next.save(path)?;
        }
        if next.subagents.max_concurrent != config.subagents.max_concurrent {
            *shared.slots.write().unwrap_or_else(|p| p.into_inner()) =
                Arc::new(Semaphore::new(next.subagents.max_concurrent));
        }
        *config = next.clone();
        *shared.provider.lock().unwrap_or_else(|p| p.into_inner()) = None;
        Ok(next)
    }

    /// Deletes a session and everything below it: its run and its children's tasks are
    /// cancelled first, so no report is delivered and no parent is woken.
    pub async fn delete_session(&self, session_id: &str) -> Result<(), RuntimeError> {
        let shared = &self.inner.shared;
        if !shared.store.exists(session_id) {
            return Err(RuntimeError::NotFound(format!("session {session_id}")));
        }
        let children: Vec<SessionId> = shared
            .store
            .list(None)?
            .into_iter()
            .filter(|meta| meta.parent_session_id.as_deref() == Some(session_id))
            .map(|meta| meta.session_id)
            .collect();
        for child in children {
            Box::pin(self.delete_session(&child)).await?;
        }
        shared.subagents.cancel(session_id).await;
        let controller = self
            .inner
            .controllers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(session_id);
        if let Some(controller) = controller {
            controller.cancel().await;
        }
        shared.approvals.forget_session(session_id);
        shared
            .tree_usage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(session_id);
        shared.store.delete(session_id)?;
        Ok(())
    }

    /// Decides an approval that the session (or one of its descendants) asked for.
    pub fn decide_approval(&self, args: commands::DecideApproval) -> Result<(), RuntimeError> {
        let controller = self.controller(&args.session_id)?;
        controller.decide_approval_with(
            &args.approval_id,
            args.approved,
            args.remember,
            args.reason,
        )
    }

    /// Stops every run and task; returns when no run and no task is left.
    pub async fn shutdown(&self) {
        let shared = &self.inner.shared;
        shared.root.cancel();
        shared.subagents.cancel_all().await;
        let mut runs = shared.active_runs.subscribe();
        let _ = runs.wait_for(|count| *count == 0).await;
        for id in self
            .inner
            .controllers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
        {
            if let Err(err) = shared.store.sync(id) {
                tracing::warn!(session = %id, "fsync at shutdown failed: {err}");
            }
        }
    }

    /// Waits until no run and no task is left (e.g. `bumblehive run`).
    pub async fn wait_idle(&self) {
        let shared = &self.inner.shared;
        let mut runs = shared.active_runs.subscribe();
        loop {
            let _ = runs.wait_for(|count| *count == 0).await;
            shared.subagents.wait_empty().await;
            if *runs.borrow() == 0 && shared.subagents.is_empty() {
                return;
            }
        }
    }
}

impl ServiceInner {
    fn live_state(&self, session_id: &str) -> Option<SessionState> {
        self.controllers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(session_id)
            .map(|c| c.state())
    }

    fn controller(&self, session_id: &str) -> Result<Arc<SessionController>, RuntimeError> {
        if let Some(controller) = self
            .controllers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(session_id)
        {
            return Ok(controller.clone());
        }
        let loaded = self.shared.store.load(session_id)?;
        let parent = match &loaded.meta.parent_session_id {
            Some(parent) => Some(self.controller(parent)?),
            None => None,
        };
        let config = self.shared.config();
        let depth = parent.as_ref().map_or(0, |p| p.depth() + 1);
        let mut tools = self.tools.clone();
        if depth > 0 {
            if let Some(allowed) = &config.subagents.tools {
                tools = tools.filtered(|name| allowed.iter().any(|a| a == name));
            }
        }
        // A session at the depth limit is not offered the tool at all.
        let delegator: Option<Arc<dyn Delegator>> = if depth < config.subagents.max_depth {
            Some(Arc::new(ServiceDelegator {
                service: self.this.clone(),
            }))
        } else {
            tools = tools.filtered(|name| name != "sub_agent");
            None
        };
        let pending = self.shared.store.read_pending(session_id).unwrap_or_else(|err| {
            tracing::warn!(session = %session_id, "pending queue unreadable, starting empty: {err}");
            Vec::new()
        });
        let controller = SessionController::new(
            loaded,
            pending,
            self.shared.clone(),
            parent.as_deref(),
            tools,
            delegator,
        );
        let mut controllers = self.controllers.lock().unwrap_or_else(|p| p.into_inner());
        // Another caller may have loaded it meanwhile: keep the first.
        if let Some(existing) = controllers.get(session_id) {
            return Ok(existing.clone());
        }
        controllers.insert(session_id.to_string(), controller.clone());
        Ok(controller)
    }

    /// A finished child's report is recorded in its parent's ledger (flushed), then goes
    /// to the parent through the delivery table.
    async fn deliver_report(&self, report: Report) {
        let parent = match self.controller(&report.parent_session_id) {
            Ok(parent) => parent,
            Err(err) => {
                tracing::warn!(task = %report.task_id, "dropping a report: parent gone: {err}");
                return;
            }
        };
        let record = ReportRecord {
            task_id: report.task_id.clone(),
            child_session_id: report.session_id.clone(),
            message_id: report_message_id(&report.task_id),
            content: report_text(&report.task_id, &report.outcome),
            config: report.config,
        };
        // The flush takes milliseconds on a disk: off the async threads, so a burst of
        // finishing children does not stall every other run.
        let store = self.shared.store.clone();
        let parent_id = parent.session_id().to_string();
        let line = record.clone();
        let recorded =
            tokio::task::spawn_blocking(move || store.record_report(&parent_id, &line)).await;
        match recorded {
            Ok(Ok(())) => {
                if let Ok(child) = self.controller(&report.session_id) {
                    child.mark_reported();
                }
            }
            Ok(Err(err)) => {
                tracing::error!(task = %report.task_id, "cannot record a report: {err}")
            }
            Err(err) => {
                tracing::error!(task = %report.task_id, "cannot record a report: {err}")
            }
        }
        parent.deliver(QueuedMessage {
            message_id: record.message_id,
            content: record.content,
            config: record.config,
        });
    }

    /// Repairs what a crash left behind (issue: durability). Runs once, at start:
    /// - a run found "running" gets synthetic results for its unanswered calls and is paused;
    /// - a child that was working is marked interrupted (resume or cancel it);
    /// - a child that finished but whose report was never recorded gets it recorded;
    /// - recorded reports that never reached their parent's history go to its pending queue.
    fn recover(&self) -> Result<RecoveryStats, RuntimeError> {
        let store = &self.shared.store;
        let mut stats = RecoveryStats::default();
        let mut metas = store.list(None)?;
        for meta in metas
            .iter_mut()
            .filter(|m| m.state == SessionState::Running)
        {
            let loaded = store.load(&meta.session_id)?;
            let unanswered = unanswered_calls(&loaded.messages);
            if !unanswered.is_empty() && !loaded.damaged {
                let results: Vec<_> = unanswered
                    .iter()
                    .map(|id| crate::protocol::Message::tool(id, INTERRUPTED_RESULT))
                    .collect();
                store.append(&meta.session_id, &results)?;
                store.sync(&meta.session_id)?;
            }
            let finished_child = meta.task_id.is_some()
                && !meta.reported
                && final_answer(&loaded.messages).is_some()
                && unanswered.is_empty();
            if meta.task_id.is_some() && !meta.reported && !finished_child {
                meta.interrupted = true;
                stats.interrupted_children += 1;
            }
            meta.state = SessionState::Paused;
            store.write_meta(meta)?;
            stats.interrupted_runs += 1;
        }
        let mut ledgers: HashMap<SessionId, crate::store::Ledger> = HashMap::new();
        for meta in metas.iter_mut() {
            let (Some(task_id), Some(parent)) =
                (meta.task_id.clone(), meta.parent_session_id.clone())
            else {
                continue;
            };
            if meta.reported || meta.interrupted || !store.exists(&parent) {
                continue;
            }
            let ledger = match ledgers.get(&parent) {
                Some(ledger) => ledger,
                None => ledgers
                    .entry(parent.clone())
                    .or_insert(store.ledger(&parent)?),
            };
            if !ledger.records.iter().any(|r| r.task_id == task_id) {
                let history = store.load(&meta.session_id)?.messages;
                let Some(answer) = final_answer(&history) else {
                    meta.interrupted = true;
                    store.write_meta(meta)?;
                    stats.interrupted_children += 1;
                    continue;
                };
                let record = ReportRecord {
                    task_id: task_id.clone(),
                    child_session_id: meta.session_id.clone(),
                    message_id: report_message_id(&task_id),
                    content: report_text(&task_id, &Ok(answer)),
                    config: RunConfig::default(),
                };
                store.record_report(&parent, &record)?;
                ledgers
                    .entry(parent.clone())
                    .or_default()
                    .records
                    .push(record);
                stats.recorded_reports += 1;
            }
            meta.reported = true;
            store.write_meta(meta)?;
        }
        for meta in metas.iter_mut() {
            let id = meta.session_id.clone();
            let ledger = match ledgers.remove(&id) {
                Some(ledger) => ledger,
                None if store.has_ledger(&id) => store.ledger(&id)?,
                None => continue,
            };
            if ledger.undelivered().next().is_none() {
                continue;
            }
            let history_ids: std::collections::HashSet<String> = store
                .load(&id)?
                .messages
                .into_iter()
                .filter_map(|m| m.id)
                .collect();
            let mut pending = store.read_pending(&id).unwrap_or_default();
            let mut added = false;
            for record in ledger.undelivered() {
                if history_ids.contains(&record.message_id)
                    || pending.iter().any(|p| p.message_id == record.message_id)
                {
                    continue;
                }
                pending.push(crate::protocol::PendingMessage {
                    message_id: record.message_id.clone(),
                    content: record.content.clone(),
                    status: crate::protocol::MessageStatus::Queued,
                    config: record.config.clone(),
                });
                added = true;
                stats.requeued_reports += 1;
            }
            if added {
                store.write_pending(&id, &pending)?;
                // Queued reports wait for the person after a crash: nothing starts by itself.
                meta.state = SessionState::Paused;
                store.write_meta(meta)?;
            }
        }
        if stats != RecoveryStats::default() {
            tracing::warn!(?stats, "recovered from an unclean stop");
        }
        self.sum_tree_usage(&metas);
        Ok(stats)
    }

    /// Tokens of every stored tree, summed once at start; runs add to it as they go.
    fn sum_tree_usage(&self, metas: &[crate::store::SessionMeta]) {
        let parents: HashMap<&str, Option<&str>> = metas
            .iter()
            .map(|m| (m.session_id.as_str(), m.parent_session_id.as_deref()))
            .collect();
        let mut tree = self
            .shared
            .tree_usage
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for meta in metas {
            let mut id = Some(meta.session_id.as_str());
            // Bounded by the number of sessions, so a corrupt parent cycle cannot loop.
            for _ in 0..=metas.len() {
                let Some(current) = id else { break };
                tree.entry(current.to_string()).or_default().add(meta.usage);
                id = parents.get(current).copied().flatten();
            }
        }
    }
}

fn lease_fn(service: Weak<ServiceInner>) -> crate::subagents::LeaseFn {
    Arc::new(move || {
        let service = service.clone();
        async move {
            let service = service
                .upgrade()
                .ok_or_else(|| "runtime unavailable".to_string())?;
            let slots = service
                .shared
                .slots
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            let permit = slots
                .acquire_owned()
                .await
                .map_err(|_| "runtime unavailable".to_string())?;
            Ok(Box::new(permit) as LeaseGuard)
        }
        .boxed()
    })
}

fn runner_fn(service: Weak<ServiceInner>) -> crate::subagents::RunnerFn {
    Arc::new(move |start: ChildStart, token| {
        let service = service.clone();
        async move {
            let Some(service) = service.upgrade() else {
                return ChildOutcome::Failed("runtime unavailable".into());
            };
            let child = match service.controller(&start.session_id) {
                Ok(child) => child,
                Err(err) => return ChildOutcome::Failed(err.to_string()),
            };
            if start.resume {
                return child.resume_child(token).await;
            }
            let mut config = start.config.clone();
            config.runtime.workspace = Some(start.workspace.clone());
            let message = QueuedMessage {
                message_id: format!("task:{}", start.task_id),
                content: start.content,
                config,
            };
            child.run_child(message, token).await
        }
        .boxed()
    })
}

fn notify_fn(service: Weak<ServiceInner>) -> crate::subagents::NotifyFn {
    Arc::new(move |report| {
        let service = service.clone();
        async move {
            if let Some(service) = service.upgrade() {
                service.deliver_report(report).await;
            }
        }
        .boxed()
    })
}

/// Tells the parent's subscribers how each child is doing.
struct EventObserver {
    child: Weak<SessionController>,
    task_id: String,
}

impl SubagentObserver for EventObserver {
    fn state(&self, _session_id: &str, state: SubagentState) {
        if let Some(child) = self.child.upgrade() {
            child.emit_kind(
                kinds::SUBAGENT_STATE,
                serde_json::json!({"task_id": self.task_id, "state": state}),
            );
        }
    }

    fn error(&self, session_id: &str, message: &str) {
        tracing::warn!(session = %session_id, task = %self.task_id, "sub-agent failed: {message}");
    }
}

/// The service side of the `sub_agent` tool.
struct ServiceDelegator {
    service: Weak<ServiceInner>,
}

#[async_trait]
impl Delegator for ServiceDelegator {
    async fn delegate(&self, ctx: &ToolContext, title: String, task: String) -> Result<(), String> {
        let service = self
            .service
            .upgrade()
            .ok_or_else(|| "runtime unavailable".to_string())?;
        let parent = service
            .controller(&ctx.session_id)
            .map_err(|err| err.to_string())?;
        let workspace = ctx.workspace.display().to_string();
        let content = format!("You are the sub-agent \"{title}\".\nTask:\n{task}");
        let meta = service
            .shared
            .store
            .create(NewSession {
                workspace: workspace.clone(),
                title: Some(title.clone()),
                parent_session_id: Some(parent.session_id().to_string()),
                task_id: Some(ctx.call_id.clone()),
                task_content: Some(content.clone()),
                // "running" until its run ends: a crash before then leaves it interrupted.
                state: SessionState::Running,
            })
            .map_err(|err| err.to_string())?;
        let child = service
            .controller(&meta.session_id)
            .map_err(|err| err.to_string())?;
        child.emit(crate::protocol::Event::SessionCreated {
            session_id: meta.session_id.clone(),
            parent_session_id: Some(parent.session_id().to_string()),
            task_id: Some(ctx.call_id.clone()),
            title: title.clone(),
        });
        let start = ChildStart {
            task_id: ctx.call_id.clone(),
            session_id: meta.session_id.clone(),
            parent_session_id: parent.session_id().to_string(),
            title: title.clone(),
            workspace,
            content,
            config: ctx.run_config.clone(),
            resume: false,
        };
        let observer = Arc::new(EventObserver {
            child: Arc::downgrade(&child),
            task_id: ctx.call_id.clone(),
        });
        let subagents = service.shared.subagents.clone();
        tokio::select! {
            biased;
            started = subagents.start(start, observer) => started.map_err(|err| err.to_string()),
            _ = ctx.cancel.cancelled() => {
                subagents.cancel(&meta.session_id).await;
                Err("the parent's run was stopped before the sub-agent started".into())
            }
        }
    }
}
