//! The session list as the UI reads it: infos with the live state, search, the workspaces, a page of one session's history, and the list feed (`SessionListEvent`: the list, then each change once).
//!
//! It reads the session list's index ([`crate::session_index`], through the store) and
//! the live controllers ([`crate::registry`]). [`crate::service::RuntimeService`] calls it.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::error::RuntimeError;
use crate::protocol::{SessionId, SessionInfo, SessionListEvent, commands};
use crate::registry::Registry;
use crate::store::SessionMeta;

/// Session infos with the live state of those loaded (the stored one is right for
/// the others: nothing runs in them).
pub(crate) fn infos(registry: &Registry, metas: Vec<SessionMeta>) -> Vec<SessionInfo> {
    metas
        .into_iter()
        .map(|meta| {
            let state = registry.live_state(&meta.session_id).unwrap_or(meta.state);
            meta.info(state)
        })
        .collect()
}

/// The sessions of a workspace (or all), with their live state.
pub(crate) fn list(
    registry: &Registry,
    workspace: Option<&str>,
) -> Result<Vec<SessionInfo>, RuntimeError> {
    let metas = registry.shared.store.list(workspace)?;
    Ok(infos(registry, metas))
}

/// Sessions whose title or any message contains `query` (case-insensitive), newest
/// first. Reads histories, so off the async threads.
pub(crate) async fn search(
    registry: &Registry,
    query: &str,
    workspace: Option<&str>,
) -> Result<Vec<SessionInfo>, RuntimeError> {
    let needle = query.trim().to_lowercase();
    if needle.is_empty() {
        return Ok(Vec::new());
    }
    let store = registry.shared.store.clone();
    let workspace = workspace.map(str::to_string);
    let found = tokio::task::spawn_blocking(move || -> Result<_, RuntimeError> {
        let mut found = Vec::new();
        for meta in store.list(workspace.as_deref())?.into_iter().rev() {
            let hit = meta.title.to_lowercase().contains(&needle)
                || store.load(&meta.session_id).is_ok_and(|loaded| {
                    loaded
                        .messages
                        .iter()
                        .any(|m| m.text().to_lowercase().contains(&needle))
                });
            if hit {
                found.push(meta);
            }
        }
        Ok(found)
    })
    .await
    .map_err(|err| RuntimeError::Unavailable(err.to_string()))??;
    Ok(infos(registry, found))
}

/// The workspaces of the stored sessions, most recently active first (`list_workspaces`):
/// from the session list's index, with no scan of the disk beyond checking that each
/// folder still exists. Counts top-level sessions (archived ones too: they are still
/// the workspace's).
pub(crate) fn workspaces(
    registry: &Registry,
) -> Result<Vec<commands::WorkspaceInfo>, RuntimeError> {
    let mut found: Vec<commands::WorkspaceInfo> = Vec::new();
    // Each session's listed workspace (its top-level ancestor's): a worktree child's
    // activity is its parent's workspace's, and its worktree is no workspace of its own.
    // Parents come before their children (ids are in creation order).
    let mut listed: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for meta in registry.shared.store.list(None)? {
        let top = meta.parent_session_id.is_none();
        let workspace = meta
            .parent_session_id
            .as_ref()
            .and_then(|parent| listed.get(parent))
            .cloned()
            .unwrap_or_else(|| meta.workspace.clone());
        listed.insert(meta.session_id.clone(), workspace.clone());
        let activity = if meta.updated_at.is_empty() {
            meta.created_at
        } else {
            meta.updated_at
        };
        match found
            .iter_mut()
            .find(|w| crate::store::same_workspace(&w.path, &workspace))
        {
            Some(known) => {
                known.sessions += u32::from(top);
                if activity > known.last_activity {
                    known.last_activity = activity;
                }
            }
            None => found.push(commands::WorkspaceInfo {
                path: workspace,
                sessions: u32::from(top),
                last_activity: activity,
            }),
        }
    }
    found.retain(|w| Path::new(&w.path).is_dir());
    // RFC 3339 times in UTC compare as strings.
    found.sort_by(|a, b| b.last_activity.cmp(&a.last_activity));
    Ok(found)
}

/// One page of a session's history: the last `last` messages of those before `before`
/// (each `None`: no bound). The file is read once as for the whole history; what is cut
/// is the answer (a 2,000-message session's JSON is most of the time it takes to open).
/// Compactions are all sent, their `first_kept` an index into the whole history.
pub(crate) fn page(
    registry: &Registry,
    session_id: &str,
    last: Option<u32>,
    before: Option<u32>,
) -> Result<commands::SessionWithMessages, RuntimeError> {
    let store = &registry.shared.store;
    let loaded = store.load(session_id)?;
    let state = registry.live_state(session_id).unwrap_or(loaded.meta.state);
    let mut messages = loaded.messages;
    let total = messages.len();
    let end = before.map_or(total, |b| (b as usize).min(total));
    let start = last.map_or(0, |n| end.saturating_sub(n as usize));
    messages.truncate(end);
    messages.drain(..start);
    // The person's discards of reports, for the marks in the chat (UX review D22).
    let discarded = if store.has_ledger(session_id) {
        store
            .ledger(session_id)
            .map(|ledger| {
                ledger
                    .discards
                    .into_iter()
                    .map(|(key, at)| commands::DiscardMark {
                        message_id: format!("subagent:{key}"),
                        at,
                    })
                    .collect()
            })
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    Ok(commands::SessionWithMessages {
        info: loaded.meta.info(state),
        messages,
        first_index: start as u32,
        total: total as u32,
        compactions: loaded.compactions,
        notice: loaded.notice,
        discarded,
    })
}

/// The session list as a feed (`SessionListEvent`): the list first, then each change
/// as it happens. Changes that arrive together are sent once per session. Ends when
/// `stop` is cancelled.
pub(crate) fn feed(
    registry: Arc<Registry>,
    workspace: Option<String>,
    stop: CancellationToken,
) -> impl futures::Stream<Item = SessionListEvent> + Send + 'static {
    // Subscribed before the list is read: a change raced with it is sent after it,
    // never lost.
    let changes = registry.shared.store.changes();
    let feed = ListFeed {
        registry,
        workspace,
        changes,
        stop,
        queued: VecDeque::new(),
        listed: false,
    };
    futures::stream::unfold(feed, |mut feed| async move {
        let event = feed.next().await?;
        Some((event, feed))
    })
}

/// The state of one session list feed.
struct ListFeed {
    registry: Arc<Registry>,
    workspace: Option<String>,
    changes: tokio::sync::broadcast::Receiver<SessionId>,
    stop: CancellationToken,
    queued: VecDeque<SessionListEvent>,
    listed: bool,
}

impl ListFeed {
    /// The whole list. Reads the index (every meta, when it cannot be trusted): off the
    /// async threads (runtime review R12).
    async fn listed(&mut self) -> SessionListEvent {
        self.listed = true;
        let registry = self.registry.clone();
        let workspace = self.workspace.clone();
        let sessions = tokio::task::spawn_blocking(move || list(&registry, workspace.as_deref()))
            .await
            .map_err(|err| RuntimeError::Unavailable(err.to_string()))
            .and_then(|listed| listed)
            .unwrap_or_else(|err| {
                tracing::warn!("cannot list sessions for a feed: {err}");
                Vec::new()
            });
        SessionListEvent::Listed { sessions }
    }

    /// What became of sessions that changed: each one's meta read again (off the async
    /// threads, as the whole list is).
    async fn changed(&self, ids: Vec<SessionId>) -> Vec<SessionListEvent> {
        let registry = self.registry.clone();
        let workspace = self.workspace.clone();
        let read = tokio::task::spawn_blocking(move || {
            let store = &registry.shared.store;
            let mut events = Vec::new();
            for id in ids {
                match store.meta(&id) {
                    Ok(meta) => {
                        if workspace.as_deref().is_none_or(|w| {
                            crate::store::same_workspace(w, &store.listed_under(&meta))
                        }) {
                            if let Some(session) = infos(&registry, vec![meta]).pop() {
                                events.push(SessionListEvent::Changed {
                                    session: Box::new(session),
                                });
                            }
                        }
                    }
                    Err(_) if !store.exists(&id) => {
                        events.push(SessionListEvent::Removed { session_id: id })
                    }
                    Err(err) => {
                        tracing::warn!(session = %id, "cannot read a changed session: {err}")
                    }
                }
            }
            events
        });
        read.await.unwrap_or_else(|err| {
            tracing::warn!("cannot read changed sessions: {err}");
            Vec::new()
        })
    }

    async fn next(&mut self) -> Option<SessionListEvent> {
        use tokio::sync::broadcast::error::{RecvError, TryRecvError};
        if !self.listed {
            return Some(self.listed().await);
        }
        loop {
            if let Some(event) = self.queued.pop_front() {
                return Some(event);
            }
            let first = tokio::select! {
                _ = self.stop.cancelled() => return None,
                received = self.changes.recv() => received,
            };
            let mut ids = match first {
                Ok(id) => vec![id],
                Err(RecvError::Lagged(_)) => return Some(self.listed().await),
                Err(RecvError::Closed) => return None,
            };
            // Whatever else is waiting now: a session that changed five times is sent once.
            loop {
                match self.changes.try_recv() {
                    Ok(id) => {
                        if !ids.contains(&id) {
                            ids.push(id);
                        }
                    }
                    Err(TryRecvError::Lagged(_)) => return Some(self.listed().await),
                    Err(TryRecvError::Empty | TryRecvError::Closed) => break,
                }
            }
            let events = self.changed(ids).await;
            self.queued.extend(events);
        }
    }
}
