//! A sub-agent's life as the person sees it (SPEC §3, §11): a follow-up to a child, resuming an interrupted child, cancelling one (an interrupted child's cancel reports to its parent), and deleting a session with everything below it.
//!
//! [`crate::service::RuntimeService`] calls these; the policy lives here so that the
//! service stays a facade. Report delivery and task starts are [`crate::delegation`]'s.

use std::path::Path;

use crate::controller::QueuedMessage;
use crate::error::RuntimeError;
use crate::protocol::{ImagePart, MessageStatus, RunConfig};
use crate::registry::Registry;
use crate::store::SessionMeta;
use crate::subagents::Report;

/// Whether a session is a sub-agent with a task (its messages are follow-ups).
pub(crate) fn is_child(meta: &SessionMeta) -> bool {
    meta.task_id.is_some() && meta.parent_session_id.is_some()
}

/// The person's message to a child: `@path` mentions expanded, then steered into its run
/// or run as a follow-up through its task, which reports again.
pub(crate) fn follow_up(
    registry: &Registry,
    session_id: &str,
    meta: &SessionMeta,
    content: String,
    config: Option<RunConfig>,
    images: Vec<ImagePart>,
) -> Result<(String, MessageStatus), RuntimeError> {
    if content.trim().is_empty() && images.is_empty() {
        return Err(RuntimeError::InvalidArgument(
            "content must not be empty".into(),
        ));
    }
    ImagePart::check_all(&images).map_err(RuntimeError::InvalidArgument)?;
    let content = crate::mentions::expand(&content, Path::new(&meta.workspace));
    // One decision by the child's controller: steered into its run, or a run of its
    // own through its task (never a run its parent would not hear of; review R2).
    crate::delegation::follow_up(
        registry,
        session_id,
        content,
        config.unwrap_or_default(),
        images,
        true,
    )
}

/// Continues an interrupted child from its own history (with what was sent to it
/// before the crash); its report then reaches the parent as usual. Returns at once:
/// the child waits for its slot in its own task.
pub(crate) async fn resume(registry: &Registry, session_id: &str) -> Result<(), RuntimeError> {
    let child = registry.controller(session_id)?;
    let meta = child.current_meta();
    let Some(task_id) = meta.task_id.clone() else {
        return Err(RuntimeError::InvalidArgument(format!(
            "session {session_id} is not a sub-agent"
        )));
    };
    let store = registry.shared.store.clone();
    let id = session_id.to_string();
    let ran = tokio::task::spawn_blocking(move || store.load(&id).map(|l| !l.messages.is_empty()))
        .await
        .map_err(|err| RuntimeError::Unavailable(err.to_string()))??;
    // A child that never ran begins with its task.
    let first = (!ran).then(|| QueuedMessage {
        message_id: crate::controller::task_message_id(&task_id),
        content: meta.task_content.clone().unwrap_or_default(),
        config: RunConfig::default(),
        images: Vec::new(),
    });
    child.resume_child_task(first)
}

/// `cancel`: stops a session's run. An interrupted child has no run: cancelling it
/// ends its task, and the parent gets an error report instead of waiting forever.
pub(crate) async fn cancel(registry: &Registry, session_id: &str) -> Result<(), RuntimeError> {
    let controller = registry.controller(session_id)?;
    let meta = controller.current_meta();
    if let (Some(task_id), Some(parent)) = (meta.task_id, meta.parent_session_id) {
        if controller.take_interrupted() {
            crate::delegation::deliver_report(
                registry,
                Report {
                    task_id,
                    session_id: session_id.to_string(),
                    parent_session_id: parent,
                    outcome: Err(
                        "the sub-agent was interrupted and then cancelled by the user".into(),
                    ),
                    config: RunConfig::default(),
                    run: None,
                },
            )
            .await;
            return Ok(());
        }
    }
    // A child waiting for its slot is stopped like a running one: it reports that.
    controller.cancel().await;
    Ok(())
}

/// Deletes a session and everything below it. The session is marked deleted first, so
/// that nothing is delivered to it, nothing starts in it and it creates no child;
/// then its run is stopped and its children deleted, so no report is delivered and
/// no parent is woken (SPEC §3; runtime review C9).
pub(crate) async fn delete(registry: &Registry, session_id: &str) -> Result<(), RuntimeError> {
    let shared = &registry.shared;
    if !shared.store.exists(session_id) {
        return Err(RuntimeError::NotFound(format!("session {session_id}")));
    }
    let controller = registry.controller(session_id)?;
    controller.mark_deleted();
    controller.cancel().await;
    // No child can be created from here on: list them now.
    let store = shared.store.clone();
    let id = session_id.to_string();
    let children = tokio::task::spawn_blocking(move || {
        store.children(&id).map(|metas| {
            metas
                .into_iter()
                .map(|meta| meta.session_id)
                .collect::<Vec<_>>()
        })
    })
    .await
    .map_err(|err| RuntimeError::Unavailable(err.to_string()))??;
    for child in children {
        Box::pin(delete(registry, &child)).await?;
    }
    shared.subagents.cancel(session_id).await;
    // A report recorded just before the delete must not come back after a restart.
    let meta = controller.current_meta();
    if let Some(parent) = &meta.parent_session_id {
        let ledger = if shared.store.has_ledger(parent) {
            shared.store.ledger(parent).unwrap_or_default()
        } else {
            Default::default()
        };
        for record in ledger
            .undelivered()
            .filter(|r| r.child_session_id == session_id)
        {
            if let Err(err) = shared.store.mark_discarded(parent, record.key(), None) {
                tracing::warn!(session = %session_id, "cannot note a deleted child's report: {err}");
            }
        }
    }
    shared.approvals.forget_session(session_id);
    // An ACP child's agent process (its turn, if any, was cancelled above) goes too.
    shared.acp_agents.forget(session_id);
    shared.forget_tree_usage(session_id);
    if let Some(info) = &meta.worktree {
        let info = info.clone();
        let removed =
            tokio::task::spawn_blocking(move || crate::checkpoints::worktree::remove(&info)).await;
        if !matches!(removed, Ok(Ok(()))) {
            tracing::warn!(session = %session_id, "cannot remove the sub-agent's worktree: {removed:?}");
        }
    }
    let store = shared.store.clone();
    let id = session_id.to_string();
    tokio::task::spawn_blocking(move || store.delete(&id))
        .await
        .map_err(|err| RuntimeError::Unavailable(err.to_string()))??;
    shared.checkpoints.forget_session(session_id);
    registry.remove(session_id);
    Ok(())
}
