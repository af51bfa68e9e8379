//! The runtime service (SPEC §3, §6): the one object a process builds, a facade over the modules that own each rule; it builds the runtime, looks up controllers, submits messages and shuts everything down.
//!
//! What it calls, each owning its policy: the shared context ([`crate::runtime`]), the
//! live controllers ([`crate::registry`]), a child's follow-up, resume, cancel and the
//! delete cascade ([`crate::children`]), the session list and its feed
//! ([`crate::list_feed`]), config changes under the busy rule ([`crate::settings`]),
//! undo, fork and worktrees ([`crate::checkpoints::session_ops`]), delegation
//! ([`crate::delegation`]) and start-up recovery ([`crate::recovery`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::checkpoints::session_ops;
use crate::config::Config;
use crate::controller::SessionController;
use crate::delegation::{
    ServiceChildTasks, ServiceDelegator, lease_fn, notify_fn, runner_fn, slot_fn,
};
use crate::error::RuntimeError;
use crate::protocol::{
    AppInfo, ImagePart, McpServerInfo, MessageStatus, RunConfig, SessionInfo, SessionListEvent,
    SessionState, commands,
};
use crate::provider::ProviderFactory;
use crate::registry::Registry;
use crate::runtime::{Shared, SharedParts};
use crate::store::{NewSession, SessionStore};
use crate::subagents::SubagentTasks;
use crate::tools::ToolRegistry;

pub use crate::controller::INTERRUPTED_RESULT;
pub use crate::recovery::RecoveryStats;

/// How to build a service.
/// How many session folders a long-lived process keeps made ahead
/// ([`RuntimeService::keep_spare_sessions`]): a parent's usual burst of children, with
/// room (each is a folder and two empty files).
pub const SPARE_SESSIONS: usize = 16;

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

/// The runtime: one per process. Cheap to clone.
#[derive(Clone)]
pub struct RuntimeService {
    registry: Arc<Registry>,
    /// The data folder's lock, let go at shutdown (a restart in the same process can then
    /// take it again) or when the last clone goes.
    owner: Arc<std::sync::Mutex<Option<crate::owner::DataLock>>>,
    recovery: RecoveryStats,
    /// Sub-agent worktrees found at start whose session is gone.
    leftover_worktrees: Arc<Vec<String>>,
}

impl RuntimeService {
    pub fn new(options: ServiceOptions) -> Result<Self, RuntimeError> {
        crate::runtime::raise_open_file_limit();
        let config = match (options.config, &options.config_path) {
            (Some(config), _) => config,
            (None, Some(path)) => Config::load(path)?,
            (None, None) => Config::default(),
        };
        config.validate()?;
        // One process owns the data folder: a second one is refused before it reads or
        // repairs anything (runtime review R7).
        let owner = crate::owner::DataLock::take(&options.data_dir)?;
        crate::sandbox::configure(&config.tools.command);
        // Sandboxed commands never see the sessions or the config, wherever they live
        // (security review 2, finding 10), whoever embeds the runtime.
        crate::sandbox::hide_data(&options.data_dir, options.config_path.as_deref());
        let store = Arc::new(SessionStore::new(&options.data_dir)?);
        let root = CancellationToken::new();
        let tools = options.tools.unwrap_or_else(ToolRegistry::standard);
        let registry = Arc::new_cyclic(|weak| {
            let subagents = SubagentTasks::with_root(
                lease_fn(weak.clone()),
                runner_fn(weak.clone()),
                notify_fn(weak.clone()),
                root.clone(),
            )
            .with_slots(slot_fn(weak.clone()));
            let shared = Shared::new(SharedParts {
                store,
                data_dir: options.data_dir.clone(),
                config,
                config_path: options.config_path,
                provider_factory: options.provider_factory,
                subagents,
                root,
                tools,
            });
            let _ = shared.delegator.set(Arc::new(ServiceDelegator {
                registry: weak.clone(),
            }));
            let _ = shared.children.set(Arc::new(ServiceChildTasks {
                registry: weak.clone(),
            }));
            Registry::new(Arc::new(shared))
        });
        let (recovery, metas) = crate::recovery::recover(&registry.shared.store)?;
        registry.shared.sum_tree_usage(&metas);
        let leftover_worktrees =
            session_ops::leftover_worktrees(&options.data_dir, &registry.shared.store);
        Ok(RuntimeService {
            registry,
            owner: Arc::new(std::sync::Mutex::new(Some(owner))),
            recovery,
            leftover_worktrees: Arc::new(leftover_worktrees),
        })
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.registry.shared
    }

    #[cfg(test)]
    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// What the start-up recovery repaired.
    pub fn recovery(&self) -> &RecoveryStats {
        &self.recovery
    }

    /// Where things are and what runs, for the settings page and the status line.
    pub fn app_info(&self) -> AppInfo {
        crate::settings::app_info(self.shared(), &self.leftover_worktrees)
    }

    /// The person's message to a session; `@path` mentions of workspace files bring the
    /// file's content along. To a sub-agent that has finished, it is a follow-up: the
    /// child runs again and reports again (SPEC §11).
    pub async fn submit_message(
        &self,
        session_id: &str,
        content: String,
        config: Option<RunConfig>,
    ) -> Result<(String, MessageStatus), RuntimeError> {
        self.submit_message_with_images(session_id, content, config, Vec::new())
            .await
    }

    /// [`Self::submit_message`] with pasted or dropped images.
    pub async fn submit_message_with_images(
        &self,
        session_id: &str,
        content: String,
        config: Option<RunConfig>,
        images: Vec<ImagePart>,
    ) -> Result<(String, MessageStatus), RuntimeError> {
        let meta = self.controller(session_id)?.current_meta();
        if !crate::children::is_child(&meta) {
            return self.submit_with_images(session_id, content, config, images);
        }
        crate::children::follow_up(&self.registry, session_id, &meta, content, config, images)
    }

    /// The person's message to a session (not a follow-up; see [`Self::submit_message`]).
    pub fn submit(
        &self,
        session_id: &str,
        content: String,
        config: Option<RunConfig>,
    ) -> Result<(String, MessageStatus), RuntimeError> {
        self.submit_with_images(session_id, content, config, Vec::new())
    }

    /// [`Self::submit`] with pasted or dropped images.
    pub fn submit_with_images(
        &self,
        session_id: &str,
        content: String,
        config: Option<RunConfig>,
        images: Vec<ImagePart>,
    ) -> Result<(String, MessageStatus), RuntimeError> {
        let controller = self.controller(session_id)?;
        let overridden = config.as_ref().and_then(|c| c.runtime.workspace.clone());
        if let Some(workspace) = &overridden {
            // The override gets the same checks as a new session's workspace.
            crate::workspace::check_workspace(Path::new(workspace))?;
        }
        let workspace = overridden.unwrap_or_else(|| controller.meta().workspace.clone());
        let content = if content.contains('@') {
            crate::mentions::expand(&content, Path::new(&workspace))
        } else {
            content
        };
        controller.submit_with_images(content, config, images)
    }

    /// Renames a session (its tab and list entry).
    pub fn rename_session(
        &self,
        session_id: &str,
        title: &str,
    ) -> Result<SessionInfo, RuntimeError> {
        crate::settings::rename(&self.registry, session_id, title)
    }

    /// The provider and model a session's next turns use (the model picker).
    pub fn set_model(
        &self,
        session_id: &str,
        provider: Option<String>,
        model: Option<String>,
    ) -> Result<SessionInfo, RuntimeError> {
        crate::settings::set_model(&self.registry, session_id, provider, model)
    }

    /// Makes a top-level session run as a profile from its next turn, or as none.
    pub fn set_agent(
        &self,
        session_id: &str,
        agent: Option<String>,
    ) -> Result<SessionInfo, RuntimeError> {
        crate::settings::set_agent(&self.registry, session_id, agent)
    }

    /// The agent profiles of a workspace (built-in, the person's, the workspace's, and
    /// Claude Code's and Codex's files), with the files that could not be read.
    pub fn list_agents(&self, workspace: &str) -> crate::protocol::Profiles {
        crate::profiles::note_missing_agents(self.shared().profiles(Path::new(workspace)))
    }

    /// The MCP servers of the config and of `workspace`'s `.mcp.json`, with their state.
    pub fn list_mcp_servers(&self, workspace: Option<&str>) -> Vec<McpServerInfo> {
        crate::settings::list_mcp_servers(self.shared(), workspace)
    }

    /// Turns a configured MCP server on or off; it stops or starts with the next turn.
    pub fn set_mcp_server_enabled(
        &self,
        name: &str,
        enabled: bool,
    ) -> Result<Vec<McpServerInfo>, RuntimeError> {
        crate::settings::set_mcp_server_enabled(self.shared(), name, enabled)
    }

    /// Restarts an MCP server now.
    pub fn restart_mcp_server(
        &self,
        name: &str,
        workspace: Option<&str>,
    ) -> Result<(), RuntimeError> {
        crate::settings::restart_mcp_server(self.shared(), name, workspace)
    }

    /// Records whether the person trusts `workspace`'s `.mcp.json` as it is now.
    pub fn trust_mcp_workspace(
        &self,
        workspace: &str,
        allow: bool,
    ) -> Result<Vec<McpServerInfo>, RuntimeError> {
        crate::settings::trust_mcp_workspace(self.shared(), workspace, allow)
    }

    /// Archives a session (hidden from the usual list) or brings it back.
    pub fn archive_session(&self, id: &str, archived: bool) -> Result<SessionInfo, RuntimeError> {
        crate::settings::archive(&self.registry, id, archived)
    }

    /// Sessions whose title or any message contains `query` (case-insensitive), newest
    /// first.
    pub async fn search_sessions(
        &self,
        query: &str,
        workspace: Option<&str>,
    ) -> Result<Vec<SessionInfo>, RuntimeError> {
        crate::list_feed::search(&self.registry, query, workspace).await
    }

    /// Files of a workspace for an @-mention, best matches first.
    pub async fn list_files(
        &self,
        workspace: &str,
        query: Option<&str>,
        limit: Option<usize>,
    ) -> Result<commands::FileList, RuntimeError> {
        crate::mentions::file_list(workspace, query, limit).await
    }

    /// Stores an API key in the OS keyring and points the provider at it (`provider`
    /// names the block; `None`: the lone `provider` block).
    pub async fn set_api_key(
        &self,
        key: &str,
        entry: Option<String>,
        provider: Option<&str>,
    ) -> Result<Config, RuntimeError> {
        crate::settings::set_api_key(self.registry.clone(), key, entry, provider).await
    }

    /// Sends one tiny real request through a configured provider and says how it went.
    pub async fn test_provider(&self, name: &str) -> Result<commands::ProviderTest, RuntimeError> {
        crate::settings::test_provider(self.shared(), name).await
    }

    /// Continues an interrupted child from its own history; returns at once.
    pub async fn resume_subagent(&self, session_id: &str) -> Result<(), RuntimeError> {
        crate::children::resume(&self.registry, session_id).await
    }

    /// `cancel`: stops a session's run; an interrupted child's cancel reports to its parent.
    pub async fn cancel_session(&self, session_id: &str) -> Result<(), RuntimeError> {
        crate::children::cancel(&self.registry, session_id).await
    }

    /// For tests: what a `sub_agent` call dropped with its child's start unread does
    /// (the call's future gone at a moment a test chooses).
    #[doc(hidden)]
    pub async fn drop_delegation_answer(&self, child_session_id: &str) {
        crate::delegation::undo_delegation(
            Arc::downgrade(&self.registry),
            child_session_id.to_string(),
        )
        .await;
    }

    /// For tests: what a `sub_agent` call does when its parent's run stops while it waits
    /// for the child's lease (at a moment a test chooses); `Ok` says the child started.
    #[doc(hidden)]
    pub async fn stop_delegation_start(&self, child_session_id: &str) -> Result<(), String> {
        let child = self
            .registry
            .controller(child_session_id)
            .map_err(|err| err.to_string())?;
        crate::delegation::stop_waiting_start(&child, &self.shared().subagents, child_session_id)
            .await
    }

    pub fn store(&self) -> &SessionStore {
        &self.shared().store
    }

    /// Keeps session folders made ahead from now on, so a new session (a delegation's
    /// children above all) costs no new inode on its call's path (`spares`). For processes
    /// that live on after their start: the desktop, `serve`, `acp`; a one-shot `run` would
    /// only pay for folders it never uses.
    pub fn keep_spare_sessions(&self) {
        self.shared().store.keep_spares(SPARE_SESSIONS);
    }

    pub fn subagents(&self) -> &SubagentTasks {
        &self.shared().subagents
    }

    pub fn config(&self) -> Config {
        self.shared().config()
    }

    /// Runs that are working now, children included.
    pub fn active_runs(&self) -> usize {
        self.shared().active_runs()
    }

    /// True while any run works or any sub-agent task exists.
    pub fn is_busy(&self) -> bool {
        self.active_runs() > 0 || !self.subagents().is_empty()
    }

    /// Controllers loaded now (each live run, subscriber or live child keeps one).
    pub fn live_controllers(&self) -> usize {
        self.registry.live_count()
    }

    pub fn create_session(
        &self,
        workspace: &str,
        title: Option<String>,
    ) -> Result<SessionInfo, RuntimeError> {
        // `/`, the home folder itself and system folders are refused (security finding 11).
        crate::workspace::check_workspace(Path::new(workspace))?;
        let meta = self.shared().store.create(NewSession {
            workspace: workspace.to_string(),
            title,
            ..NewSession::default()
        })?;
        Ok(meta.info(SessionState::Idle))
    }

    /// The controller of a session, loaded on first use.
    pub fn controller(&self, session_id: &str) -> Result<Arc<SessionController>, RuntimeError> {
        self.registry.controller(session_id)
    }

    pub fn session_info(&self, session_id: &str) -> Result<SessionInfo, RuntimeError> {
        let meta = self.shared().store.meta(session_id)?;
        Ok(meta.info(self.registry.live_state(session_id).unwrap_or(meta.state)))
    }

    pub fn get_session(
        &self,
        session_id: &str,
    ) -> Result<commands::SessionWithMessages, RuntimeError> {
        self.get_session_page(session_id, None, None)
    }

    /// One page of a session's history: the last `last` messages of those before `before`
    /// (each `None`: no bound).
    pub fn get_session_page(
        &self,
        session_id: &str,
        last: Option<u32>,
        before: Option<u32>,
    ) -> Result<commands::SessionWithMessages, RuntimeError> {
        crate::list_feed::page(&self.registry, session_id, last, before)
    }

    /// The session list as a feed: the list first, then each change as it happens. Ends
    /// when `stop` is cancelled.
    pub fn session_list_feed(
        &self,
        workspace: Option<String>,
        stop: CancellationToken,
    ) -> impl futures::Stream<Item = SessionListEvent> + Send + 'static {
        crate::list_feed::feed(self.registry.clone(), workspace, stop)
    }

    /// The workspaces of the stored sessions, most recently active first.
    pub fn list_workspaces(&self) -> Result<Vec<commands::WorkspaceInfo>, RuntimeError> {
        crate::list_feed::workspaces(&self.registry)
    }

    pub fn list_sessions(&self, workspace: Option<&str>) -> Result<Vec<SessionInfo>, RuntimeError> {
        crate::list_feed::list(&self.registry, workspace)
    }

    /// Applies a merge patch to the config. Fails with `busy` while anything runs, and
    /// then changes nothing (SPEC §6).
    pub fn update_config(&self, patch: &serde_json::Value) -> Result<Config, RuntimeError> {
        crate::settings::update_config(self.shared(), patch)
    }

    /// Deletes a session and everything below it (SPEC §3).
    pub async fn delete_session(&self, session_id: &str) -> Result<(), RuntimeError> {
        crate::children::delete(&self.registry, session_id).await
    }

    /// The files the agent changed in each turn of a session, with diffs (the Changes view).
    pub async fn turn_changes(
        &self,
        session_id: &str,
    ) -> Result<commands::TurnChanges, RuntimeError> {
        session_ops::turn_changes(&self.registry, session_id).await
    }

    /// Undoes (or previews undoing) a session's turns from a message of the person on.
    pub async fn undo_turn(
        &self,
        args: commands::UndoTurn,
    ) -> Result<commands::UndoResult, RuntimeError> {
        session_ops::undo_turn(&self.registry, args).await
    }

    /// A new session whose history is the original's before a message of the person.
    pub async fn fork_session(
        &self,
        args: commands::ForkSession,
    ) -> Result<commands::Forked, RuntimeError> {
        session_ops::fork_session(&self.registry, args).await
    }

    /// Applies an isolated child's changes to the parent's workspace, all or nothing.
    pub async fn apply_worktree(
        &self,
        session_id: &str,
    ) -> Result<commands::Applied, RuntimeError> {
        session_ops::apply_worktree(&self.registry, session_id).await
    }

    /// Removes an isolated child's worktree and branch; the session stays.
    pub async fn discard_worktree(&self, session_id: &str) -> Result<(), RuntimeError> {
        session_ops::discard_worktree(&self.registry, session_id).await
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
        let shared = self.shared();
        shared.root.cancel();
        shared.subagents.cancel_all().await;
        shared.mcp.shutdown().await;
        let _ = shared.watch_runs().wait_for(|count| *count == 0).await;
        shared.acp_agents.clear();
        let store = shared.store.clone();
        let synced = tokio::task::spawn_blocking(move || {
            let synced = store.sync_open();
            store.close();
            synced
        })
        .await;
        if let Ok(Err(err)) = synced {
            tracing::warn!("fsync at shutdown failed: {err}");
        }
        // Nothing of ours runs any more: the folder may be owned by the next process.
        self.owner.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Waits until no run and no task is left (e.g. `bumblehive run`).
    pub async fn wait_idle(&self) {
        let shared = self.shared();
        let mut runs = shared.watch_runs();
        let mut making = shared.making.subscribe();
        loop {
            let _ = making.wait_for(|count| *count == 0).await;
            let _ = runs.wait_for(|count| *count == 0).await;
            shared.subagents.wait_empty().await;
            if *runs.borrow() == 0 && shared.subagents.is_empty() && *making.borrow() == 0 {
                // A run's last events are sent under its controller's lock, just after it
                // stops counting: taking each lock once means they have all been sent.
                for controller in self.registry.all_live() {
                    let _ = controller.state();
                }
                return;
            }
        }
    }
}
