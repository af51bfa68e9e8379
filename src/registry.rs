//! The live session controllers: one per session, loaded on first use and held only weakly, so memory and event buffers are bounded by what is live (a run, a subscriber, a live child), not by what was ever touched.
//!
//! Everything a controller holds between runs is also on disk (meta, pending queue,
//! history), so dropping an idle one loses nothing; the next use loads it again.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};

use crate::controller::SessionController;
use crate::error::RuntimeError;
use crate::protocol::{SessionId, SessionState};
use crate::runtime::Shared;

pub struct Registry {
    pub(crate) shared: Arc<Shared>,
    live: Mutex<Live>,
}

struct Live {
    controllers: HashMap<SessionId, Weak<SessionController>>,
    /// Dead entries are swept when the map reaches this size (amortised O(1)).
    sweep_at: usize,
}

impl Registry {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Registry {
            shared,
            live: Mutex::new(Live {
                controllers: HashMap::new(),
                sweep_at: 64,
            }),
        }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The controller if it is loaded now.
    pub(crate) fn get(&self, session_id: &str) -> Option<Arc<SessionController>> {
        self.live()
            .controllers
            .get(session_id)
            .and_then(Weak::upgrade)
    }

    /// The controller of a session, loaded on first use (its ancestors too: a child's
    /// events reach them).
    pub(crate) fn controller(
        &self,
        session_id: &str,
    ) -> Result<Arc<SessionController>, RuntimeError> {
        if let Some(controller) = self.get(session_id) {
            return Ok(controller);
        }
        let store = &self.shared.store;
        let loaded = store.load(session_id)?;
        let parent = match &loaded.meta.parent_session_id {
            Some(parent) => Some(self.controller(parent)?),
            None => None,
        };
        let pending = store.read_pending(session_id).unwrap_or_else(|err| {
            tracing::warn!(session = %session_id, "pending queue unreadable, starting empty: {err}");
            Vec::new()
        });
        // Children whose reports are recorded keep their task ids taken.
        let task_ids: HashSet<String> = if store.has_ledger(session_id) {
            store
                .ledger(session_id)
                .map(|ledger| ledger.records.into_iter().map(|r| r.task_id).collect())
                .unwrap_or_default()
        } else {
            HashSet::new()
        };
        let controller =
            SessionController::new(loaded, pending, task_ids, self.shared.clone(), parent);
        Ok(self.keep_first(session_id, controller))
    }

    /// The controller of a session [`crate::store::SessionStore::create`] has just made,
    /// from its meta, without reading back what was just written: a new session has no
    /// history, no pending queue and no ledger. A sub-agent's child is made this way, one
    /// load per child fewer in a fan-out (issue 31).
    pub(crate) fn made(
        &self,
        meta: crate::store::SessionMeta,
    ) -> Result<Arc<SessionController>, RuntimeError> {
        if let Some(controller) = self.get(&meta.session_id) {
            return Ok(controller);
        }
        let parent = match &meta.parent_session_id {
            Some(parent) => Some(self.controller(parent)?),
            None => None,
        };
        let session_id = meta.session_id.clone();
        let loaded = crate::store::LoadedSession {
            meta,
            messages: Vec::new(),
            compactions: Vec::new(),
            notice: None,
            damaged: false,
        };
        let controller = SessionController::new(
            loaded,
            Vec::new(),
            HashSet::new(),
            self.shared.clone(),
            parent,
        );
        Ok(self.keep_first(&session_id, controller))
    }

    /// Registers a controller just built, unless another caller registered one for the
    /// session meanwhile: then that one is the session's, and this one is dropped.
    fn keep_first(
        &self,
        session_id: &str,
        controller: Arc<SessionController>,
    ) -> Arc<SessionController> {
        let mut live = self.live();
        // Another caller may have loaded it meanwhile: keep the first.
        if let Some(existing) = live.controllers.get(session_id).and_then(Weak::upgrade) {
            return existing;
        }
        live.controllers
            .insert(session_id.to_string(), Arc::downgrade(&controller));
        if live.controllers.len() >= live.sweep_at {
            live.controllers.retain(|_, weak| weak.strong_count() > 0);
            live.sweep_at = (live.controllers.len() * 2).max(64);
        }
        controller
    }

    pub(crate) fn remove(&self, session_id: &str) {
        self.live().controllers.remove(session_id);
    }

    /// The live state of a loaded session; `None` when it is not loaded (then the stored
    /// state is the truth: nothing runs).
    pub(crate) fn live_state(&self, session_id: &str) -> Option<SessionState> {
        self.get(session_id).map(|c| c.state())
    }

    /// Every loaded controller.
    pub(crate) fn all_live(&self) -> Vec<Arc<SessionController>> {
        self.live()
            .controllers
            .values()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// How many controllers are loaded now.
    pub(crate) fn live_count(&self) -> usize {
        self.live()
            .controllers
            .values()
            .filter(|weak| weak.strong_count() > 0)
            .count()
    }
}
