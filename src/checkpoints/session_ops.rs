//! What the person does with a session's checkpoints and worktree: the Changes view, undo, fork (with or without rewinding the files), and applying or discarding an isolated child's worktree.
//!
//! [`crate::service::RuntimeService`] calls these. They sit between the session's
//! controller (is it running?) and the checkpoint store and worktrees below them.

use std::sync::Arc;

use crate::controller::SessionController;
use crate::error::RuntimeError;
use crate::protocol::{SessionState, SubagentState, WorktreeInfo, commands};
use crate::registry::Registry;
use crate::store::{LoadedSession, NewSession, SessionStore};

/// Sub-agent worktrees in the data folder whose session is gone, each warned of once.
pub(crate) fn leftover_worktrees(data_dir: &std::path::Path, store: &SessionStore) -> Vec<String> {
    let leftovers = super::worktree::leftovers(data_dir, |id| store.exists(id));
    for path in &leftovers {
        tracing::warn!(
            "a sub-agent worktree whose session is gone: {path} (remove it with `git worktree remove`)"
        );
    }
    leftovers
}

/// The files the agent changed in each turn of a session, with diffs (the Changes view).
pub(crate) async fn turn_changes(
    registry: &Registry,
    session_id: &str,
) -> Result<commands::TurnChanges, RuntimeError> {
    if !registry.shared.store.exists(session_id) {
        return Err(RuntimeError::NotFound(format!("session {session_id}")));
    }
    let mut changes = registry.shared.checkpoints.turn_changes(session_id).await?;
    if !changes.available {
        return Ok(changes);
    }
    let history = registry.shared.store.load(session_id)?.messages;
    for (child, turn) in sub_agents(registry, session_id, &history)? {
        let theirs = registry
            .shared
            .checkpoints
            .turn_changes(&child.session_id)
            .await?;
        if !theirs.turns.is_empty() {
            changes.children.push(commands::ChildChanges {
                session_id: child.session_id,
                title: child.title,
                message_index: turn,
                turns: theirs.turns,
            });
        }
    }
    Ok(changes)
}

/// The sub-agents a session started, each with its turn (the person's message whose
/// turn made the `sub_agent` call), their own sub-agents with the same turn; isolated
/// ones and theirs are left out (their changes are in their worktree).
fn sub_agents(
    registry: &Registry,
    session_id: &str,
    history: &[crate::protocol::Message],
) -> Result<Vec<(crate::store::SessionMeta, usize)>, RuntimeError> {
    // A `sub_agent` call's result names its task id (SPEC §3); only those results are
    // read (other tools' outputs may be large).
    let calls: std::collections::HashSet<&str> = history
        .iter()
        .flat_map(|m| m.tool_calls.iter())
        .filter(|call| call.name == "sub_agent")
        .map(|call| call.id.as_str())
        .collect();
    let mut started: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (index, message) in history.iter().enumerate() {
        if message.role != crate::protocol::Role::Tool
            || !message
                .tool_call_id
                .as_deref()
                .is_some_and(|id| calls.contains(id))
        {
            continue;
        }
        let Ok(value) = serde_json::from_str::<serde_json::Value>(message.text()) else {
            continue;
        };
        if let (Some(task), Some(turn)) = (
            value.get("task_id").and_then(|t| t.as_str()),
            super::turn_of(&history[..index]),
        ) {
            started.entry(task.to_string()).or_insert(turn);
        }
    }
    let store = &registry.shared.store;
    let mut found = Vec::new();
    for child in store.children(session_id)? {
        let Some(turn) = child.task_id.as_ref().and_then(|t| started.get(t)).copied() else {
            continue;
        };
        let mut stack = vec![child];
        while let Some(meta) = stack.pop() {
            if meta.worktree.is_some() {
                continue;
            }
            stack.extend(store.children(&meta.session_id)?);
            found.push((meta, turn));
        }
    }
    Ok(found)
}

/// How much undo history a workspace keeps, against its bound (Settings).
pub(crate) async fn undo_history(
    shared: &crate::runtime::Shared,
    workspace: &str,
) -> Result<commands::UndoHistory, RuntimeError> {
    let checkpoints = shared.checkpoints.clone();
    let limits = checkpoints.store_limits();
    if let Some(why) = checkpoints.off() {
        return Ok(commands::UndoHistory {
            workspace: workspace.to_string(),
            bytes: 0,
            max_bytes: limits.max_bytes,
            max_age_days: limits.max_age.as_secs() / (24 * 3600),
            off: Some(why.to_string()),
        });
    }
    let path = std::path::PathBuf::from(workspace);
    // `git count-objects`: a process, so off the async workers.
    let bytes = tokio::task::spawn_blocking(move || checkpoints.store_bytes(&path))
        .await
        .map_err(|err| RuntimeError::Unavailable(format!("cannot measure: {err}")))??;
    Ok(commands::UndoHistory {
        workspace: workspace.to_string(),
        bytes,
        max_bytes: limits.max_bytes,
        max_age_days: limits.max_age.as_secs() / (24 * 3600),
        off: None,
    })
}

/// Clears a workspace's undo history (Settings' "Clear"): its turns then say their
/// history was cleared and cannot be undone. Refused (busy) while a change is being
/// recorded there.
pub(crate) async fn clear_undo_history(
    shared: &crate::runtime::Shared,
    workspace: &str,
) -> Result<commands::UndoHistory, RuntimeError> {
    let cleared = shared
        .checkpoints
        .clear(std::path::Path::new(workspace))
        .await?;
    if cleared.is_none() {
        return Err(RuntimeError::Busy(format!(
            "a change in {workspace} is being recorded now; clear its undo history once it is done"
        )));
    }
    undo_history(shared, workspace).await
}

/// Undoes the changes of a session's turns from the person's message at
/// `message_index` on (or previews that). Refused while the session runs.
pub(crate) async fn undo_turn(
    registry: &Registry,
    args: commands::UndoTurn,
) -> Result<commands::UndoResult, RuntimeError> {
    undo_and_note(registry, args, false).await
}

/// An undo (or a rewind's), and, when files changed back, its note in the conversation
/// (`SessionController::add_note`: shown in the chat, read by the model at its next turn).
async fn undo_and_note(
    registry: &Registry,
    args: commands::UndoTurn,
    rewind: bool,
) -> Result<commands::UndoResult, RuntimeError> {
    let (loaded, _) = turn_message(registry, &args.session_id, args.message_index)?;
    let controller = registry.controller(&args.session_id)?;
    if !args.preview && controller.is_running() {
        return Err(RuntimeError::Busy(format!(
            "session {} is running; stop it before undoing its changes",
            args.session_id
        )));
    }
    // The sub-agents of the undone turns, when asked: none may still be working.
    let mut children = Vec::new();
    if args.include_children {
        for (child, turn) in sub_agents(registry, &args.session_id, &loaded.messages)? {
            if turn < args.message_index {
                continue;
            }
            let working = registry
                .shared
                .subagents
                .state_of(&child.session_id)
                .is_some_and(|state| {
                    matches!(
                        state,
                        SubagentState::WaitingForSlot | SubagentState::Running
                    )
                });
            if !args.preview && working {
                return Err(RuntimeError::Busy(format!(
                    "sub-agent \"{}\" is still working; wait for its report before undoing its changes",
                    child.title
                )));
            }
            children.push((child.session_id, turn));
        }
    }
    let result = registry
        .shared
        .checkpoints
        .undo_with(
            &args.session_id,
            args.message_index,
            &children,
            args.force,
            args.preview,
        )
        .await?;
    if result.applied && !result.files.is_empty() {
        // Turns as the person counts them: their messages, from 1.
        let turn_at = |end: usize| {
            loaded.messages[..end]
                .iter()
                .filter(|m| m.is_from_person())
                .count()
        };
        let first = turn_at(args.message_index + 1);
        let last = turn_at(loaded.messages.len()).max(first);
        let text = crate::protocol::undo_note_text(
            rewind,
            first,
            last,
            !children.is_empty(),
            &result.files,
        );
        let mut notes = vec![(controller, text)];
        // Each sub-agent undone with it is told too: a follow-up must not take its files
        // for still there.
        for (child, _) in &children {
            notes.push((
                registry.controller(child)?,
                crate::protocol::CHILD_UNDO_NOTE.to_string(),
            ));
        }
        // A sub-agent's own turns undone from its tab: its parent holds the report of
        // those changes, so it is told as well (E7). A parent that is gone or read-only
        // only loses the note, as below.
        if let Some(parent) = &loaded.meta.parent_session_id {
            match registry.controller(parent) {
                Ok(parent) => notes.push((
                    parent,
                    crate::protocol::child_undone_note_text(
                        &loaded.meta.title,
                        first,
                        last,
                        &result.files,
                    ),
                )),
                Err(err) => tracing::warn!(%parent, "cannot tell the parent of the undo: {err}"),
            }
        }
        for (controller, text) in notes {
            let id = controller.session_id().to_string();
            let noted = tokio::task::spawn_blocking(move || controller.add_note(text))
                .await
                .map_err(|err| RuntimeError::Unavailable(err.to_string()))?;
            if let Err(err) = noted {
                // The files are restored either way; the conversation just does not say so.
                tracing::warn!(session = %id, "cannot add the undo's note: {err}");
            }
        }
    }
    Ok(result)
}

/// A new session whose history is the original's before the person's message at
/// `message_index`; the original stays as it is. With `rewind` the files are
/// restored first (and nothing is forked if that is refused).
pub(crate) async fn fork_session(
    registry: &Registry,
    args: commands::ForkSession,
) -> Result<commands::Forked, RuntimeError> {
    let (loaded, draft) = turn_message(registry, &args.session_id, args.message_index)?;
    let draft_images = loaded.messages[args.message_index].images.clone();
    let undo = if args.rewind {
        Some(
            undo_and_note(
                registry,
                commands::UndoTurn {
                    session_id: args.session_id.clone(),
                    message_index: args.message_index,
                    force: args.force,
                    preview: false,
                    include_children: args.include_children,
                },
                true,
            )
            .await?,
        )
    } else {
        None
    };
    let store = &registry.shared.store;
    let mut meta = store.create(NewSession {
        workspace: loaded.meta.workspace.clone(),
        title: Some(format!("{} (fork)", loaded.meta.title)),
        agent: loaded.meta.agent.clone(),
        ..NewSession::default()
    })?;
    meta.forked_from = Some(args.session_id.clone());
    meta.forked_at = Some(args.message_index);
    meta.provider = loaded.meta.provider.clone();
    meta.model = loaded.meta.model.clone();
    store.write_meta(&meta)?;
    let copied = store
        .append(&meta.session_id, &loaded.messages[..args.message_index])
        .and_then(|()| store.sync(&meta.session_id));
    store.release(&meta.session_id);
    if let Err(err) = copied {
        // A fork with half a history is worse than none.
        let _ = store.delete(&meta.session_id);
        return Err(err.into());
    }
    Ok(commands::Forked {
        session: meta.info(SessionState::Idle),
        draft,
        draft_images,
        undo,
    })
}

/// Applies an isolated child's changes to the parent's workspace, all or nothing.
pub(crate) async fn apply_worktree(
    registry: &Registry,
    session_id: &str,
) -> Result<commands::Applied, RuntimeError> {
    let (controller, info) = idle_worktree(registry, session_id)?;
    if info.applied {
        return Err(RuntimeError::InvalidArgument(format!(
            "the changes of {} were applied already; discard the worktree when done",
            info.branch
        )));
    }
    let stat = tokio::task::spawn_blocking(move || super::worktree::apply(&info))
        .await
        .map_err(|err| RuntimeError::Unavailable(err.to_string()))?
        .map_err(|err| match err {
            super::worktree::WorktreeError::Conflict(_) => RuntimeError::Conflict(err.to_string()),
            other => RuntimeError::Unavailable(other.to_string()),
        })?;
    // Applied, but unrecorded: the person must hear it, or the next apply would be offered
    // (and conflict) as if nothing had happened.
    controller
        .edit_meta(|meta| {
            if let Some(info) = &mut meta.worktree {
                info.applied = true;
            }
        })
        .map_err(|err| {
            RuntimeError::Unavailable(format!(
                "the changes were applied to the workspace, but that could not be recorded: {err}"
            ))
        })?;
    Ok(commands::Applied { stat })
}

/// Removes an isolated child's worktree and branch; the session stays, without them.
pub(crate) async fn discard_worktree(
    registry: &Registry,
    session_id: &str,
) -> Result<(), RuntimeError> {
    let (controller, info) = idle_worktree(registry, session_id)?;
    tokio::task::spawn_blocking(move || super::worktree::remove(&info))
        .await
        .map_err(|err| RuntimeError::Unavailable(err.to_string()))?
        .map_err(|err| RuntimeError::Unavailable(err.to_string()))?;
    controller
        .edit_meta(|meta| meta.worktree = None)
        .map_err(|err| {
            RuntimeError::Unavailable(format!(
                "the worktree was removed, but that could not be recorded: {err}"
            ))
        })?;
    Ok(())
}

/// A child's controller and worktree, refused while the child still works (its
/// worktree is its workspace then).
fn idle_worktree(
    registry: &Registry,
    session_id: &str,
) -> Result<(Arc<SessionController>, WorktreeInfo), RuntimeError> {
    let controller = registry.controller(session_id)?;
    let Some(info) = controller.current_meta().worktree else {
        return Err(RuntimeError::InvalidArgument(format!(
            "session {session_id} has no worktree (only sub-agents started with isolation \"worktree\" have one)"
        )));
    };
    let working = matches!(
        registry.shared.subagents.state_of(session_id),
        Some(SubagentState::WaitingForSlot | SubagentState::Running)
    );
    if controller.is_running() || working {
        return Err(RuntimeError::Busy(format!(
            "sub-agent {session_id} is still working; wait for its report"
        )));
    }
    Ok((controller, info))
}

/// A session's history, checked to hold a message of the person at `index`; returns
/// it with that message's text.
fn turn_message(
    registry: &Registry,
    session_id: &str,
    index: usize,
) -> Result<(LoadedSession, String), RuntimeError> {
    let loaded = registry.shared.store.load(session_id)?;
    let Some(message) = loaded.messages.get(index) else {
        return Err(RuntimeError::InvalidArgument(format!(
            "message_index {index} is past the end of the session's history ({} messages)",
            loaded.messages.len()
        )));
    };
    if super::turn_of(std::slice::from_ref(message)) != Some(0) {
        return Err(RuntimeError::InvalidArgument(format!(
            "message {index} is not a message of the person; turns start at the person's messages"
        )));
    }
    let text = message.text().to_string();
    Ok((loaded, text))
}
