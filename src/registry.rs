//! The live session controllers: one per session, loaded on first use and held only weakly, so memory and event buffers are bounded by what is live (a run, a subscriber, a live child), not by what was ever touched.
//!
//! Everything a controller holds between runs is also on disk (meta, pending queue,
//! history), so dropping an idle one loses nothing; the next use loads it again.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock, Weak};

use crate::controller::SessionController;
use crate::error::RuntimeError;
use crate::protocol::{SessionId, SessionState};
use crate::runtime::Shared;

pub struct Registry {
    pub(crate) shared: Arc<Shared>,
    live: Mutex<Live>,
    /// Held shared from a new session's creation until its controller, made from the meta
    /// just written, is registered (`create_made`); taken alone by a load from disk. A
    /// session is listed from the moment its meta is written: a rename from the list in
    /// between loaded a second controller from disk, wrote its title and let it go, and
    /// the made one, registered after, later wrote its own meta over it with the title
    /// before (found by the simulation, seed 350038).
    making: RwLock<()>,
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
            making: RwLock::new(()),
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
        {
            // Once no session is between its creation and its controller, one that was
            // has its controller registered, and that one is the session's. If it is not
            // there now, none will be made from a meta written before: the load can go
            // on without the lock.
            let _alone = self.making.write().unwrap_or_else(|p| p.into_inner());
            if let Some(controller) = self.get(session_id) {
                return Ok(controller);
            }
        }
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

    /// Makes a new session ([`crate::store::SessionStore::create`]) and its controller
    /// from the meta written, without reading it back: a new session has no history, no
    /// pending queue and no ledger. A sub-agent's child is made this way, one load per
    /// child fewer in a fan-out (issue 31). Until the controller is registered no load
    /// from disk can make a second one (`making`).
    pub(crate) fn create_made(
        &self,
        new: crate::store::NewSession,
    ) -> Result<Arc<SessionController>, RuntimeError> {
        self.create_made_with(new, |_| {})
    }

    /// [`create_made`](Self::create_made), with `between` run after the session is written
    /// and before its controller is registered (tests: a rename in that moment).
    fn create_made_with(
        &self,
        new: crate::store::NewSession,
        between: impl FnOnce(&crate::store::SessionMeta),
    ) -> Result<Arc<SessionController>, RuntimeError> {
        // The parent first: loading it takes `making` alone.
        let parent = match &new.parent_session_id {
            Some(parent) => Some(self.controller(parent)?),
            None => None,
        };
        let _making = self.making.read().unwrap_or_else(|p| p.into_inner());
        let meta = self.shared.store.create(new)?;
        between(&meta);
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::Config;
    use crate::protocol::SessionState;
    use crate::service::{RuntimeService, ServiceOptions};
    use crate::store::NewSession;

    /// A child is listed from the moment its meta is written. A rename from the list
    /// before its controller was registered loaded a second controller from disk, wrote
    /// the new title and let it go; the controller made from the meta as created was
    /// registered after, and its next write put the old title back: the rename, answered,
    /// was lost (the simulation, seed 350038). Now the rename waits for that controller
    /// and goes through it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rename_while_a_child_is_made_is_not_written_over() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("w");
        std::fs::create_dir_all(&workspace).unwrap();
        let service = RuntimeService::new(ServiceOptions {
            data_dir: dir.path().join("data"),
            config_path: None,
            config: Some(Config::default()),
            provider_factory: std::sync::Arc::new(crate::providers::provider_from_config),
            tools: None,
        })
        .unwrap();
        let workspace = workspace.display().to_string();
        let parent = service.create_session(&workspace, None).unwrap();
        let registry = service.registry().clone();
        let (renamed_tx, renamed_rx) = std::sync::mpsc::channel();
        let mut renamer = None;
        let child = registry
            .create_made_with(
                NewSession {
                    workspace,
                    title: Some("as made".into()),
                    parent_session_id: Some(parent.session_id),
                    task_id: Some("t1".into()),
                    state: SessionState::Running,
                    ..NewSession::default()
                },
                |meta| {
                    let registry = registry.clone();
                    let id = meta.session_id.clone();
                    renamer = Some(std::thread::spawn(move || {
                        let answer = crate::settings::rename(&registry, &id, "renamed");
                        let _ = renamed_tx.send(());
                        answer
                    }));
                    // Before, the rename was made and answered here. Now it cannot be
                    // until the controller is registered: the wait runs out.
                    let _ = renamed_rx.recv_timeout(Duration::from_millis(500));
                },
            )
            .unwrap();
        let answer = renamer.unwrap().join().unwrap();
        assert!(answer.is_ok(), "{answer:?}");
        // The made controller writes its meta, as a run's start or end does.
        child.edit_meta(|meta| meta.archived = false).unwrap();
        let id = child.session_id().to_string();
        let stored = service.store().meta(&id).unwrap().title;
        assert_eq!(stored, "renamed", "the answered rename was written over");
        assert_eq!(child.current_meta().title, "renamed");
        service.shutdown().await;
    }
}
