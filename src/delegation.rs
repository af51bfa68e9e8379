//! Delegation as the runtime wires it (SPEC §3): the `sub_agent` tool's back end (child sessions, task ids), the task registry's lease, runner and report hand-over, and the observer that shows each child's state to its parent's subscribers.

use std::sync::{Arc, Weak};

use async_trait::async_trait;
use futures::FutureExt;

use crate::controller::{QueuedMessage, SessionController};
use crate::error::RuntimeError;
use crate::protocol::{
    Event, MessageStatus, Progress, RunConfig, SessionState, SubagentState, nth_report_message_id,
    report_text,
};
use crate::registry::Registry;
use crate::store::{NewSession, ReportRecord};
use crate::subagents::{
    ChildOutcome, ChildStart, LeaseFn, LeaseGuard, NotifyFn, Report, RunnerFn, SubagentObserver,
};
use crate::tools::{Delegation, Delegator, ToolContext};

/// A slot of the child's depth (one pool per depth: a child waiting for its own child
/// never holds the slot that child needs; runtime review C6).
/// Then, when the child's model server says how many requests it takes, a slot of that
/// server too: children wait for their own server, not behind another's.
pub(crate) fn lease_fn(registry: Weak<Registry>) -> LeaseFn {
    Arc::new(move |start: &ChildStart| {
        let registry = registry.clone();
        let depth = start.depth;
        let session_id = start.session_id.clone();
        let workspace = start.workspace.clone();
        let server = start.server.clone();
        async move {
            let unavailable = || "runtime unavailable".to_string();
            let registry = registry.upgrade().ok_or_else(unavailable)?;
            let shared = &registry.shared;
            let depth_slot = shared
                .slots(depth)
                .acquire_owned()
                .await
                .map_err(|_| unavailable())?;
            // Found once when the child was started; a start without it (a test's) asks now.
            let provider = match server {
                Some(server) => server,
                None => {
                    let agent = shared.store.meta(&session_id).ok().and_then(|m| m.agent);
                    shared.provider_of(std::path::Path::new(&workspace), agent.as_deref())
                }
            };
            let server_slot = match shared.provider_slots(&provider).await {
                Some(pool) => Some(pool.acquire_owned().await.map_err(|_| unavailable())?),
                None => None,
            };
            Ok(Box::new((depth_slot, server_slot)) as LeaseGuard)
        }
        .boxed()
    })
}

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
            if start.resume {
                return child.resume_child(token).await;
            }
            let mut config = start.config.clone();
            config.runtime.workspace = Some(start.workspace.clone());
            let message = QueuedMessage {
                message_id: start
                    .message_id
                    .clone()
                    .unwrap_or_else(|| format!("task:{}", start.task_id)),
                content: start.content,
                config,
                images: Vec::new(),
            };
            child.run_child(message, start.starts_paused, token).await
        }
        .boxed()
    })
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
    // The child's first report, or a follow-up's (`subagent:<task>:<n>`).
    let number = registry
        .shared
        .store
        .meta(&report.session_id)
        .map_or(1, |meta| meta.reports + 1);
    let mut content = report_text(&report.task_id, &report.outcome);
    // An isolated child's report ends with what it changed in its worktree.
    let worktree = registry
        .shared
        .store
        .meta(&report.session_id)
        .ok()
        .and_then(|meta| meta.worktree);
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
        images: Vec::new(),
    });
}

/// A follow-up to a child (the person typing in its tab, or its parent's
/// `message_subagent`): a working child gets it at its next safe point (its current run's
/// report covers it); a finished one runs again as a task of its own, ending in one more
/// report (`subagent:<task_id>:<n>`), durable like the first.
pub(crate) async fn follow_up(
    registry: &Registry,
    child_id: &str,
    content: String,
    config: RunConfig,
    by_person: bool,
) -> Result<(String, MessageStatus), RuntimeError> {
    let child = registry.controller(child_id)?;
    let meta = child.current_meta();
    let (Some(task_id), Some(parent)) = (meta.task_id.clone(), meta.parent_session_id.clone())
    else {
        return Err(RuntimeError::InvalidArgument(format!(
            "session {child_id} is not a sub-agent"
        )));
    };
    if child.is_running() {
        return child.submit(content, Some(config));
    }
    if meta.interrupted {
        return Err(RuntimeError::InvalidArgument(format!(
            "sub-agent {child_id} was interrupted: resume or cancel it first"
        )));
    }
    if registry.shared.subagents.state_of(child_id).is_some() {
        return Err(RuntimeError::Busy(format!(
            "sub-agent {child_id} is waiting for a slot; send it the message once it runs"
        )));
    }
    // Whether this follow-up may start a paused child: the person's own message may; a
    // parent's may only when the pause was a failure's, which the person did not choose.
    // Where the person's Stop holds the child, the parent's message waits with it, for
    // the person, and nothing runs.
    let starts_paused = by_person || meta.failed;
    if !starts_paused && child.is_paused() {
        let message_id = format!("msg-{}", uuid::Uuid::now_v7().simple());
        let status = child
            .deliver(QueuedMessage {
                message_id: message_id.clone(),
                content,
                config,
                images: Vec::new(),
            })
            .unwrap_or(MessageStatus::Queued);
        return Ok((message_id, status));
    }
    child.owe_report();
    let message_id = format!("msg-{}", uuid::Uuid::now_v7().simple());
    let start = ChildStart {
        task_id: task_id.clone(),
        session_id: child_id.to_string(),
        parent_session_id: parent,
        title: meta.title.clone(),
        workspace: meta.workspace.clone(),
        content,
        config,
        resume: false,
        depth: child.depth(),
        message_id: Some(message_id.clone()),
        starts_paused,
        server: Some(
            registry
                .shared
                .provider_of(std::path::Path::new(&meta.workspace), meta.agent.as_deref()),
        ),
    };
    let observer = Arc::new(EventObserver {
        child: child.clone(),
        task_id,
    });
    match registry.shared.subagents.start(start, observer).await {
        Ok(()) => Ok((message_id, MessageStatus::Started)),
        Err(err) => {
            // It did not run: nothing is owed.
            child.mark_settled();
            Err(RuntimeError::InvalidArgument(err.to_string()))
        }
    }
}

/// Tells the parent's subscribers how each child is doing. It holds the child's
/// controller for as long as the task lives, so the last state (done, failed) still
/// reaches the parent after the child's run has let go of it.
pub(crate) struct EventObserver {
    pub(crate) child: Arc<SessionController>,
    pub(crate) task_id: String,
}

impl SubagentObserver for EventObserver {
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
    mut meta: crate::store::SessionMeta,
    workspace: &std::path::Path,
) -> Result<String, String> {
    let store = registry.shared.store.clone();
    let data_dir = registry.shared.data_dir.clone();
    let workspace = workspace.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let made = crate::checkpoints::worktree::create(&data_dir, &workspace, &meta.session_id)
            .map_err(|err| format!("cannot create the sub-agent's worktree: {err}"));
        let written = made.and_then(|(info, inside)| {
            meta.workspace = inside.display().to_string();
            meta.worktree = Some(info);
            store.write_meta(&meta).map_err(|err| err.to_string())?;
            Ok(meta.workspace.clone())
        });
        if written.is_err() {
            if let Some(info) = &meta.worktree {
                let _ = crate::checkpoints::worktree::remove(info);
            }
            let _ = store.delete(&meta.session_id);
        }
        written
    })
    .await
    .map_err(|err| err.to_string())?
}

/// The runtime side of the `sub_agent` tool.
pub(crate) struct ServiceDelegator {
    pub(crate) registry: Weak<Registry>,
}

#[async_trait]
impl Delegator for ServiceDelegator {
    async fn delegate(&self, ctx: &ToolContext, request: Delegation) -> Result<String, String> {
        let registry = self
            .registry
            .upgrade()
            .ok_or_else(|| "runtime unavailable".to_string())?;
        let mut request = request;
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
            // Before anything is created: a folder that is not a repository is the model's
            // mistake to hear about, with nothing to clean up.
            let ws = ctx.workspace.clone();
            tokio::task::spawn_blocking(move || crate::checkpoints::worktree::repository_of(&ws))
                .await
                .map_err(|err| err.to_string())?
                .map_err(|err| err.to_string())?;
        }
        let Delegation { title, task, .. } = request.clone();
        let parent = registry
            .controller(&ctx.session_id)
            .map_err(|err| err.to_string())?;
        let task_id = parent
            .allocate_task_id(&ctx.call_id)
            .ok_or_else(|| "the session is being deleted".to_string())?;
        let workspace = ctx.workspace.display().to_string();
        let content = format!("You are the sub-agent \"{title}\".\nTask:\n{task}");
        let meta = registry
            .shared
            .store
            .create(NewSession {
                workspace: workspace.clone(),
                title: Some(title.clone()),
                parent_session_id: Some(parent.session_id().to_string()),
                task_id: Some(task_id.clone()),
                task_content: Some(content.clone()),
                // "running" until its run ends: a crash before then leaves it interrupted.
                state: SessionState::Running,
                agent: request.agent.clone(),
            })
            .map_err(|err| err.to_string())?;
        let workspace = if request.worktree {
            isolate(&registry, meta.clone(), &ctx.workspace).await?
        } else {
            workspace
        };
        let child = registry
            .controller(&meta.session_id)
            .map_err(|err| err.to_string())?;
        child.emit(Event::SessionCreated {
            session_id: meta.session_id.clone(),
            parent_session_id: Some(parent.session_id().to_string()),
            task_id: Some(task_id.clone()),
            title: title.clone(),
        });
        let server = registry
            .shared
            .provider_of(std::path::Path::new(&workspace), meta.agent.as_deref());
        let start = ChildStart {
            task_id: task_id.clone(),
            session_id: meta.session_id.clone(),
            parent_session_id: parent.session_id().to_string(),
            title: title.clone(),
            workspace,
            content,
            config: ctx.run_config.clone(),
            resume: false,
            depth: child.depth(),
            message_id: None,
            server: Some(server),
            starts_paused: false,
        };
        let observer = Arc::new(EventObserver {
            child: child.clone(),
            task_id: task_id.clone(),
        });
        let subagents = registry.shared.subagents.clone();
        let started = tokio::select! {
            biased;
            started = subagents.start(start, observer) => started.map_err(|err| err.to_string()),
            _ = ctx.cancel.cancelled() => {
                subagents.cancel(&meta.session_id).await;
                Err("the parent's run was stopped before the sub-agent started".into())
            }
        };
        match started {
            Ok(()) => Ok(task_id),
            Err(err) => {
                // It never ran and owes no report (runtime review C2).
                child.settle_unstarted();
                Err(err)
            }
        }
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
            store.list(None).ok().and_then(|metas| {
                metas.into_iter().find(|m| {
                    m.parent_session_id.as_deref() == Some(parent.as_str())
                        && m.task_id.as_deref() == Some(wanted.as_str())
                })
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
            false,
        )
        .await
        .map(|(_, status)| status)
        .map_err(|err| err.to_string())
    }
}
