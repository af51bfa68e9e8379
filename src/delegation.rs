//! Delegation as the runtime wires it (SPEC §3): the `sub_agent` tool's back end (child sessions, task ids), the task registry's lease, runner and report hand-over, and the observer that shows each child's state to its parent's subscribers.

use std::sync::{Arc, Weak};

use async_trait::async_trait;
use futures::FutureExt;

use crate::controller::{Origin, QueuedMessage, SessionController};
use crate::error::RuntimeError;
use crate::protocol::{
    Event, MessageStatus, Progress, RunConfig, SessionState, SubagentState, nth_report_message_id,
    report_text,
};
use crate::registry::Registry;
use crate::store::{NewSession, ReportRecord};
use crate::subagents::{
    ChildOutcome, ChildStart, LeaseFn, LeaseGuard, NotifyFn, Report, RunnerFn, SlotFn,
    SubagentObserver, SubagentTasks,
};
use crate::tools::{Delegation, Delegator, ToolContext};

/// The seed's lease: the runtime's word that it can take the child (it is running and
/// the child's session is on disk). It never waits for a slot: slots are waited for
/// inside the child's task (`slot_fn`) and per model call (`Shared::request_slot`).
pub(crate) fn lease_fn(registry: Weak<Registry>) -> LeaseFn {
    Arc::new(move |start: &ChildStart| {
        let exists = registry.upgrade().is_some_and(|registry| {
            !registry.shared.root.is_cancelled() && registry.shared.store.exists(&start.session_id)
        });
        async move {
            if exists {
                Ok(Box::new(()) as LeaseGuard)
            } else {
                Err("runtime unavailable".to_string())
            }
        }
        .boxed()
    })
}

/// A run slot of the child's depth (`subagents.max_concurrent`, one pool per depth: a
/// child waiting for its own child never holds the slot that child needs; runtime review
/// C6), waited for inside the child's task. The person's Stop ends the wait.
pub(crate) fn slot_fn(registry: Weak<Registry>) -> SlotFn {
    Arc::new(move |start: &ChildStart| {
        let registry = registry.clone();
        let session_id = start.session_id.clone();
        let depth = start.depth;
        async move {
            let registry = registry.upgrade()?;
            let child = registry.controller(&session_id).ok()?;
            let stop = child.starting_stop()?;
            let pool = registry.shared.slots(depth);
            tokio::select! {
                biased;
                _ = stop.cancelled() => None,
                permit = pool.acquire_owned() => {
                    permit.ok().map(|permit| Box::new(permit) as LeaseGuard)
                }
            }
        }
        .boxed()
    })
}

/// Begins the child's run that waited in its `Starting` phase and waits for its end.
pub(crate) fn runner_fn(registry: Weak<Registry>) -> RunnerFn {
    Arc::new(move |start: ChildStart, token| {
        let registry = registry.clone();
        async move {
            let Some(registry) = registry.upgrade() else {
                return ChildOutcome::Failed("runtime unavailable".into());
            };
            let child = match registry.controller(&start.session_id) {
                Ok(child) => child,
                Err(err) => return ChildOutcome::Failed(err.to_string()),
            };
            match child.begin_child_run(&token) {
                Some(outcome) => child.child_outcome(outcome, token).await,
                // Stopped by the person (or deleted) between its slot and its start.
                None => ChildOutcome::Stopped,
            }
        }
        .boxed()
    })
}

/// Registers a child run's task for the controller (`ChildTasks`): what the task needs is
/// read from the child's meta, under the child's lock, with no lock of its own taken.
pub(crate) struct ServiceChildTasks {
    pub(crate) registry: Weak<Registry>,
}

impl crate::controller::ChildTasks for ServiceChildTasks {
    fn spawn(
        &self,
        child: Arc<SessionController>,
        meta: &crate::store::SessionMeta,
        config: RunConfig,
        run: u64,
    ) -> Result<tokio::sync::oneshot::Receiver<Result<(), crate::subagents::StartError>>, String>
    {
        let registry = self
            .registry
            .upgrade()
            .ok_or_else(|| "runtime unavailable".to_string())?;
        let (Some(task_id), Some(parent)) = (meta.task_id.clone(), meta.parent_session_id.clone())
        else {
            return Err(format!("session {} is not a sub-agent", meta.session_id));
        };
        let start = ChildStart {
            task_id: task_id.clone(),
            session_id: meta.session_id.clone(),
            parent_session_id: parent,
            title: meta.title.clone(),
            workspace: meta.workspace.clone(),
            config,
            depth: child.depth(),
            server: Some(registry.shared.provider_of(
                std::path::Path::new(&meta.workspace),
                meta.agent.as_deref(),
                meta.provider.as_deref(),
            )),
            run,
        };
        let observer = Arc::new(EventObserver { child, task_id });
        registry
            .shared
            .subagents
            .spawn(start, observer)
            .map_err(|err| err.to_string())
    }

    fn has_task(&self, session_id: &str) -> bool {
        self.registry
            .upgrade()
            .is_some_and(|registry| registry.shared.subagents.has_task(session_id))
    }
}

pub(crate) fn notify_fn(registry: Weak<Registry>) -> NotifyFn {
    Arc::new(move |report| {
        let registry = registry.clone();
        async move {
            if let Some(registry) = registry.upgrade() {
                deliver_report(&registry, report).await;
            }
        }
        .boxed()
    })
}

/// A finished child's report is recorded in its parent's ledger (flushed), then goes to
/// the parent through the delivery table. A child deleted meanwhile reports nothing.
pub(crate) async fn deliver_report(registry: &Registry, report: Report) {
    let parent = match registry.controller(&report.parent_session_id) {
        Ok(parent) => parent,
        Err(err) => {
            tracing::warn!(task = %report.task_id, "dropping a report: parent gone: {err}");
            return;
        }
    };
    // The child's meta from its controller, which owns it (live: it just reported); from
    // its file only when the controller cannot be had. Reading the file for every report
    // was 2.3 % of a 1,000-child fan-out's CPU (issue 31).
    let meta = match registry.controller(&report.session_id) {
        Ok(child) => Some(child.current_meta()),
        Err(_) => registry.shared.store.meta(&report.session_id).ok(),
    };
    // The child's first report, or a follow-up's (`subagent:<task>:<n>`).
    let number = meta.as_ref().map_or(1, |meta| meta.reports + 1);
    let mut content = report_text(&report.task_id, &report.outcome);
    // An isolated child's report ends with what it changed in its worktree.
    let worktree = meta.and_then(|meta| meta.worktree);
    if let Some(info) = worktree {
        let stat = tokio::task::spawn_blocking(move || {
            crate::checkpoints::worktree::diff_stat(&info).map(|stat| (info.branch.clone(), stat))
        })
        .await;
        content.push_str(&match stat {
            Ok(Ok((branch, stat))) if stat.is_empty() => {
                format!("\n\n[Worktree {branch}: no changes]")
            }
            Ok(Ok((branch, stat))) => format!(
                "\n\n[Worktree {branch}: changes not yet in the workspace; the person applies or discards them]\n{stat}"
            ),
            Ok(Err(err)) => format!("\n\n[Worktree: cannot read its changes: {err}]"),
            Err(err) => format!("\n\n[Worktree: cannot read its changes: {err}]"),
        });
    }
    let record = ReportRecord {
        task_id: report.task_id.clone(),
        child_session_id: report.session_id.clone(),
        message_id: nth_report_message_id(&report.task_id, number),
        content,
        config: report.config,
    };
    // The flush takes milliseconds on a disk: off the async threads, so a burst of
    // finishing children does not stall every other run.
    let store = registry.shared.store.clone();
    let parent_id = parent.session_id().to_string();
    let line = record.clone();
    let recorded =
        tokio::task::spawn_blocking(move || store.record_report(&parent_id, &line)).await;
    let child = registry.controller(&report.session_id).ok();
    // Deleting the child while its report was being recorded cancels the report
    // (SPEC §3; runtime review C9): the delete marks the child first, then waits for us.
    if child.as_ref().is_none_or(|child| child.is_deleted()) {
        tracing::info!(task = %report.task_id, "the sub-agent was deleted: its report is dropped");
        return;
    }
    match recorded {
        Ok(Ok(())) => {
            if let Some(child) = &child {
                child.mark_reported(report.run);
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
        images: Vec::new(),
    });
}

/// A follow-up to a child (the person typing in its tab, or its parent's
/// `message_subagent`), decided in one step by the child's controller: a working child
/// (or one waiting for its slot) gets it at its next safe point, and its current run's
/// report covers it; a finished one runs again through its task, ending in one more
/// report (`subagent:<task_id>:<n>`). Never waits for a slot: the answer comes at once.
pub(crate) fn follow_up(
    registry: &Registry,
    child_id: &str,
    content: String,
    config: RunConfig,
    images: Vec<crate::protocol::ImagePart>,
    by_person: bool,
) -> Result<(String, MessageStatus), RuntimeError> {
    let child = registry.controller(child_id)?;
    let meta = child.meta();
    if meta.task_id.is_none() || meta.parent_session_id.is_none() {
        return Err(RuntimeError::InvalidArgument(format!(
            "session {child_id} is not a sub-agent"
        )));
    }
    let message_id = format!("msg-{}", uuid::Uuid::now_v7().simple());
    let origin = if by_person {
        Origin::Person
    } else {
        Origin::Parent
    };
    let (status, _) = child.deliver_to_child(
        QueuedMessage {
            message_id: message_id.clone(),
            content,
            config,
            images,
        },
        origin,
    )?;
    Ok((message_id, status))
}

/// Tells the parent's subscribers how each child is doing. It holds the child's
/// controller for as long as the task lives, so the last state (done, failed) still
/// reaches the parent after the child's run has let go of it.
pub(crate) struct EventObserver {
    pub(crate) child: Arc<SessionController>,
    pub(crate) task_id: String,
}

impl SubagentObserver for EventObserver {
    fn unstarted(&self, _session_id: &str) {
        self.child.settle_unstarted();
    }

    fn state(&self, _session_id: &str, state: SubagentState) {
        self.child.emit_progress(Progress::SubagentState {
            task_id: self.task_id.clone(),
            state,
        });
    }

    fn error(&self, session_id: &str, message: &str) {
        tracing::warn!(session = %session_id, task = %self.task_id, "sub-agent failed: {message}");
    }
}

/// Gives a new child its own worktree and makes that its workspace; a child whose
/// worktree cannot be made is deleted again.
async fn isolate(
    registry: &Registry,
    meta: crate::store::SessionMeta,
    workspace: &std::path::Path,
) -> Result<String, String> {
    let store = registry.shared.store.clone();
    let data_dir = registry.shared.data_dir.clone();
    let workspace = workspace.to_path_buf();
    let id = meta.session_id.clone();
    let made = tokio::task::spawn_blocking(move || {
        crate::checkpoints::worktree::create(&data_dir, &workspace, &id)
            .map_err(|err| format!("cannot create the sub-agent's worktree: {err}"))
    })
    .await
    .map_err(|err| err.to_string())?;
    // Through the child's controller, which owns its meta: a meta written beside it would
    // be overwritten by (or overwrite) what the controller writes (review R5; the
    // simulation found a report count lost that way).
    let written = made.and_then(|(info, inside)| {
        let child = registry
            .controller(&meta.session_id)
            .map_err(|err| err.to_string())?;
        let workspace = inside.display().to_string();
        child.set_worktree(workspace.clone(), info.clone())?;
        Ok((workspace, info))
    });
    match written {
        Ok((workspace, _)) => Ok(workspace),
        Err(err) => {
            if let Ok(meta) = store.meta(&meta.session_id) {
                if let Some(info) = &meta.worktree {
                    let _ = crate::checkpoints::worktree::remove(info);
                }
            }
            let _ = store.delete(&meta.session_id);
            registry.remove(&meta.session_id);
            Err(err)
        }
    }
}

/// The `sub_agent` call's side of a delegation: dropped (its run stopped) with a started
/// child's answer still unread, the child is undone if its run has not begun, so nothing
/// runs that the parent's history does not name; one that began reports, so the parent
/// hears of it then.
struct DelegationAnswer {
    rx: Option<tokio::sync::oneshot::Receiver<Result<(String, String), String>>>,
    registry: Weak<Registry>,
}

impl Drop for DelegationAnswer {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            if let Ok(Ok((_, session_id))) = rx.try_recv() {
                tokio::spawn(undo_delegation(self.registry.clone(), session_id));
            }
        }
    }
}

/// Counts a child being made and started (`Shared::making`) for as long as it lives.
struct Making(Arc<crate::runtime::Shared>);

impl Making {
    fn new(shared: &Arc<crate::runtime::Shared>) -> Self {
        shared.making.send_modify(|n| *n += 1);
        Making(shared.clone())
    }
}

impl Drop for Making {
    fn drop(&mut self) {
        self.0.making.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Stops and settles a child whose `sub_agent` call ended without naming it, unless its
/// run has begun (`SessionController::cancel_if_unbegun`): then it runs on and reports.
pub(crate) async fn undo_delegation(registry: Weak<Registry>, session_id: String) {
    let Some(registry) = registry.upgrade() else {
        return;
    };
    let subagents = registry.shared.subagents.clone();
    let Ok(child) = registry.controller(&session_id) else {
        subagents.cancel(&session_id).await;
        return;
    };
    undo_unbegun(&child, &subagents, &session_id).await;
}

/// The parent's run stopped while its `sub_agent` call waited for the child's lease. The
/// lease was not there when the call looked, but the task may have had it and begun the
/// run since. Cancelling the task whatever its phase (as this did before) stopped such a
/// run with no report while the child's history held the task. So only an unbegun child
/// is undone; one that began runs on and reports, and the call says it started.
pub(crate) async fn stop_waiting_start(
    child: &SessionController,
    subagents: &SubagentTasks,
    session_id: &str,
) -> Result<(), String> {
    if undo_unbegun(child, subagents, session_id).await {
        Err("the parent's run was stopped before the sub-agent started".into())
    } else {
        Ok(())
    }
}

/// Undoes a child whose run has not begun: its task is cancelled under the child's lock,
/// in one step with the look at whether the run began (`cancel_if_unbegun`), waited for,
/// and the child settled as never started. Says whether it was undone; one whose run
/// began is left to run on and report. Both ways a start can be taken back use it: the
/// call's answer dropped unread (`undo_delegation`) and the parent stopped while the
/// child waited for its lease (`start_delegation`).
async fn undo_unbegun(
    child: &SessionController,
    subagents: &SubagentTasks,
    session_id: &str,
) -> bool {
    let Some(done) = child.cancel_if_unbegun(|| subagents.cancel_now(session_id)) else {
        return false;
    };
    for done in done {
        done.cancelled().await;
    }
    child.settle_unstarted();
    true
}

/// A `sub_agent` call's request, checked before anything is made: its profile exists, and
/// a worktree is asked for only in a repository (the model's mistake to hear about, with
/// nothing to clean up).
async fn check_delegation(
    registry: &Registry,
    ctx: &ToolContext,
    mut request: Delegation,
) -> Result<Delegation, String> {
    if let Some(agent) = &request.agent {
        let profiles = registry.shared.profiles(&ctx.workspace);
        let Some(profile) = profiles.get(agent) else {
            return Err(format!(
                "no agent profile named {agent:?}; available: {}",
                profiles.names().join(", ")
            ));
        };
        // A profile that asks for a worktree gets one whatever the call says.
        if profile.isolation.as_deref() == Some("worktree") {
            request.worktree = true;
        }
    }
    if request.worktree {
        let ws = ctx.workspace.clone();
        tokio::task::spawn_blocking(move || crate::checkpoints::worktree::repository_of(&ws))
            .await
            .map_err(|err| err.to_string())?
            .map_err(|err| err.to_string())?;
    }
    Ok(request)
}

/// A child made on disk (not yet started).
struct Made {
    meta: crate::store::SessionMeta,
    /// The child's controller once announced, held until its run starts: dropped in
    /// between, it would be loaded from disk again (a fan-out's children, issue 31).
    /// `None` for a child in a worktree: its controller is made once its worktree is in
    /// its meta (`start_delegation`).
    child: Option<Arc<SessionController>>,
    task_id: String,
    title: String,
    parent: crate::protocol::SessionId,
    content: String,
}

/// Makes the child on disk in one synchronous step, so a batch's children are made (and
/// announced) in call order and a Stop cannot cut the making in half.
fn make_child(
    registry: &Registry,
    ctx: &ToolContext,
    request: &Delegation,
) -> Result<Made, String> {
    let Delegation { title, task, .. } = request.clone();
    let parent = registry
        .controller(&ctx.session_id)
        .map_err(|err| err.to_string())?;
    let task_id = parent
        .allocate_task_id(&ctx.call_id)
        .ok_or_else(|| "the session is being deleted".to_string())?;
    let workspace = ctx.workspace.display().to_string();
    let content = format!("You are the sub-agent \"{title}\".\nTask:\n{task}");
    let (provider, model) = child_model(registry, ctx, &parent, request.agent.as_deref());
    let new = NewSession {
        workspace,
        title: Some(title.clone()),
        parent_session_id: Some(parent.session_id().to_string()),
        task_id: Some(task_id.clone()),
        task_content: Some(content.clone()),
        // "running" until its run ends: a crash before then leaves it interrupted.
        state: SessionState::Running,
        agent: request.agent.clone(),
        provider,
        model,
    };
    // A child in a worktree gets its controller once its worktree is in its meta; any
    // other gets it with its creation, in one step (`Registry::create_made`).
    let (meta, child) = if request.worktree {
        let meta = registry
            .shared
            .store
            .create(new)
            .map_err(|err| err.to_string())?;
        (meta, None)
    } else {
        let child = registry.create_made(new).map_err(|err| err.to_string())?;
        (child.current_meta(), Some(child))
    };
    let made = Made {
        meta,
        child,
        task_id,
        title,
        parent: parent.session_id().to_string(),
        content,
    };
    if let Some(child) = &made.child {
        announce(child, &made);
    }
    Ok(made)
}

/// Where a child runs (E3): its profile's server and model when the profile names them,
/// else its parent's current choice (the session's model picker), never silently the
/// default server. A profile naming only a model runs it on the parent's server.
fn child_model(
    registry: &Registry,
    ctx: &ToolContext,
    parent: &SessionController,
    agent: Option<&str>,
) -> (Option<String>, Option<String>) {
    let profile =
        agent.and_then(|name| registry.shared.profiles(&ctx.workspace).get(name).cloned());
    let parent = parent.current_meta();
    let (profile_provider, profile_model) =
        profile.map(|p| (p.provider, p.model)).unwrap_or_default();
    match (profile_provider, profile_model) {
        // The profile's own server: its model, or that server's.
        (Some(_), _) => (None, None),
        (None, Some(_)) => (parent.provider, None),
        (None, None) => (parent.provider, parent.model),
    }
}

/// `session_created` for the child, to its parent's subscribers (SPEC §3).
fn announce(child: &SessionController, made: &Made) {
    child.emit(Event::SessionCreated {
        session_id: made.meta.session_id.clone(),
        parent_session_id: Some(made.parent.clone()),
        task_id: Some(made.task_id.clone()),
        title: made.title.clone(),
    });
}

/// Starts a made child: its worktree first when isolated, then its first run through
/// its task. Returns its task id and session id.
async fn start_delegation(
    registry: &Weak<Registry>,
    ctx: &ToolContext,
    made: Made,
) -> Result<(String, String), String> {
    let registry = registry
        .upgrade()
        .ok_or_else(|| "runtime unavailable".to_string())?;
    let Made {
        meta,
        task_id,
        content,
        ..
    } = &made;
    let (meta, task_id, content) = (meta.clone(), task_id.clone(), content.clone());
    let child = match made.child.clone() {
        Some(child) => child,
        None => {
            // A child in a worktree: its meta now names the worktree as its workspace.
            isolate(&registry, meta.clone(), &ctx.workspace).await?;
            // Read back: its meta changed since it was made (its workspace).
            let child = registry
                .controller(&meta.session_id)
                .map_err(|err| err.to_string())?;
            announce(&child, &made);
            child
        }
    };
    if ctx.cancel.is_cancelled() {
        // The parent's run was stopped while the child was made: it never starts.
        child.settle_unstarted();
        return Err("the parent's run was stopped before the sub-agent started".into());
    }
    // The parent's run config: what its report keeps (SPEC §4); the child itself always
    // runs in its own workspace (its worktree when isolated; `controller::run`).
    let message = QueuedMessage {
        message_id: crate::controller::task_message_id(&task_id),
        content,
        config: ctx.run_config.clone(),
        images: Vec::new(),
    };
    // The child's run goes through its task like every later one; the call answers
    // once the task holds the seed's lease, never after a slot (SPEC §3).
    let delivered = child.deliver_to_child(message, Origin::Parent);
    let lease = match delivered {
        Ok((_, Some(lease))) => lease,
        Ok((status, None)) => {
            return Err(format!("the sub-agent did not start ({status:?})"));
        }
        Err(err) => {
            child.settle_unstarted();
            return Err(err.to_string());
        }
    };
    let subagents = registry.shared.subagents.clone();
    let started = tokio::select! {
        biased;
        started = lease => match started {
            Ok(started) => started.map_err(|err| err.to_string()),
            Err(_) => Err(format!("sub-agent task {task_id} was stopped before startup")),
        },
        _ = ctx.cancel.cancelled() => stop_waiting_start(&child, &subagents, &meta.session_id).await,
    };
    started.map(|()| (task_id, meta.session_id.clone()))
}

/// The runtime side of the `sub_agent` tool.
pub(crate) struct ServiceDelegator {
    pub(crate) registry: Weak<Registry>,
}

#[async_trait]
impl Delegator for ServiceDelegator {
    async fn delegate(&self, ctx: &ToolContext, request: Delegation) -> Result<String, String> {
        // The child is made and started by a task of its own, not by this call's future:
        // a Stop drops the future at any await, and what it began must still end in one
        // settled state (runtime review R1). When the call is gone before it read that the
        // child started, the parent never hears of it, so it neither runs nor reports,
        // unless its run has begun: then its report is how the parent hears of it.
        let strong = self
            .registry
            .upgrade()
            .ok_or_else(|| "runtime unavailable".to_string())?;
        let request = check_delegation(&strong, ctx, request).await?;
        let made = make_child(&strong, ctx, &request)?;
        let strong_shared = strong.shared.clone();
        drop(strong);
        let registry = self.registry.clone();
        let ctx = ctx.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let undo_registry = registry.clone();
        let making = Making::new(&strong_shared);
        tokio::spawn(async move {
            let _making = making;
            let started = start_delegation(&registry, &ctx, made).await;
            if let Err(Ok((_, session_id))) = tx.send(started) {
                undo_delegation(undo_registry, session_id).await;
            }
        });
        let mut answer = DelegationAnswer {
            rx: Some(rx),
            registry: self.registry.clone(),
        };
        let started = match answer.rx.as_mut() {
            Some(rx) => rx.await,
            None => return Err("runtime unavailable".to_string()),
        };
        answer.rx = None;
        started
            .map_err(|_| "runtime unavailable".to_string())?
            .map(|(task_id, _)| task_id)
    }

    async fn follow_up(
        &self,
        ctx: &ToolContext,
        task_id: &str,
        message: String,
    ) -> Result<MessageStatus, String> {
        let registry = self
            .registry
            .upgrade()
            .ok_or_else(|| "runtime unavailable".to_string())?;
        let store = registry.shared.store.clone();
        let parent = ctx.session_id.clone();
        let wanted = task_id.to_string();
        let child = tokio::task::spawn_blocking(move || {
            store.children(&parent).ok().and_then(|metas| {
                metas
                    .into_iter()
                    .find(|m| m.task_id.as_deref() == Some(wanted.as_str()))
            })
        })
        .await
        .map_err(|err| err.to_string())?
        .ok_or_else(|| format!("no sub-agent of this session has task id {task_id:?}"))?;
        follow_up(
            &registry,
            &child.session_id,
            message,
            ctx.run_config.clone(),
            Vec::new(),
            false,
        )
        .map(|(_, status)| status)
        .map_err(|err| err.to_string())
    }
}
