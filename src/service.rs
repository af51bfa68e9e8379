//! The runtime service (SPEC §3, §6): the one object a process builds; creates, lists, deletes and looks up sessions, applies the busy rule to config changes, resumes and cancels children, and shuts everything down.
//!
//! What it builds on, each in its own module: the shared context ([`crate::runtime`]),
//! the live controllers ([`crate::registry`]), delegation ([`crate::delegation`]) and
//! start-up recovery ([`crate::recovery`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::controller::{QueuedMessage, SessionController};
use crate::delegation::{
    ServiceChildTasks, ServiceDelegator, lease_fn, notify_fn, runner_fn, slot_fn,
};
use crate::error::RuntimeError;
use crate::protocol::{
    AppInfo, RunConfig, SessionId, SessionInfo, SessionListEvent, SessionState, SubagentState,
    commands,
};
use crate::provider::ProviderFactory;
use crate::registry::Registry;
use crate::runtime::{Shared, SharedParts};
use crate::store::{NewSession, SessionStore};
use crate::subagents::{Report, SubagentTasks};
use crate::tools::ToolRegistry;

pub use crate::controller::INTERRUPTED_RESULT;

/// How long a provider test waits for its one-token answer (a cold local model may
/// need to load first).
const PROVIDER_TEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// A provider failure in words for the Settings page, with what to do where that is clear.
fn provider_test_message(err: &crate::provider::ProviderError) -> String {
    use crate::provider::ProviderError;
    match err {
        ProviderError::Auth(_) => {
            format!("{err}. Check the API key (its variable or the keyring entry).")
        }
        ProviderError::BadRequest(message) if message.contains("HTTP 404") => {
            format!("not found: {message}. Check the model name and the base URL.")
        }
        _ => err.to_string(),
    }
}
pub use crate::recovery::RecoveryStats;

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
        crate::store::private_dir(&options.data_dir)
            .map_err(|err| crate::error::StoreError::io(&options.data_dir, err))?;
        let owner = crate::owner::DataLock::acquire(&options.data_dir)?;
        crate::sandbox::configure(&config.tools.command);
        // Sandboxed commands never see the sessions or the config, wherever they live
        // (security review 2, finding 10), whoever embeds the runtime.
        let mut hidden = vec![options.data_dir.clone()];
        hidden.extend(options.config_path.iter().cloned());
        crate::sandbox::hide(&hidden);
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
        let store = &registry.shared.store;
        let leftover_worktrees =
            crate::checkpoints::worktree::leftovers(&options.data_dir, |id| store.exists(id));
        for path in &leftover_worktrees {
            tracing::warn!(
                "a sub-agent worktree whose session is gone: {path} (remove it with `git worktree remove`)"
            );
        }
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

    /// What the start-up recovery repaired.
    pub fn recovery(&self) -> &RecoveryStats {
        &self.recovery
    }

    /// Where things are and what runs, for the settings page and the status line.
    pub fn app_info(&self) -> AppInfo {
        let shared = self.shared();
        AppInfo {
            version: env!("CARGO_PKG_VERSION").to_string(),
            commit: crate::BUILD_COMMIT.to_string(),
            data_dir: shared.data_dir.display().to_string(),
            log_dir: crate::config::log_dir(&shared.data_dir)
                .display()
                .to_string(),
            config_path: shared.config_path.as_ref().map(|p| p.display().to_string()),
            active_runs: self.active_runs(),
            subagent_tasks: self.subagents().len(),
            sandbox: crate::sandbox::status(),
            provider_configured: shared
                .config_path
                .as_deref()
                .is_some_and(crate::config::provider_configured),
            leftover_worktrees: self.leftover_worktrees.to_vec(),
            checkpoints_off: shared.checkpoints.off().map(str::to_string),
        }
    }

    /// The person's message to a session; `@path` mentions of workspace files bring the
    /// file's content along. To a sub-agent that has finished, it is a follow-up: the
    /// child runs again and reports again (SPEC §11).
    pub async fn submit_message(
        &self,
        session_id: &str,
        content: String,
        config: Option<RunConfig>,
    ) -> Result<(String, crate::protocol::MessageStatus), RuntimeError> {
        self.submit_message_with_images(session_id, content, config, Vec::new())
            .await
    }

    /// [`Self::submit_message`] with pasted or dropped images.
    pub async fn submit_message_with_images(
        &self,
        session_id: &str,
        content: String,
        config: Option<RunConfig>,
        images: Vec<crate::protocol::ImagePart>,
    ) -> Result<(String, crate::protocol::MessageStatus), RuntimeError> {
        let controller = self.controller(session_id)?;
        let meta = controller.current_meta();
        let is_child = meta.task_id.is_some() && meta.parent_session_id.is_some();
        if !is_child {
            return self.submit_with_images(session_id, content, config, images);
        }
        if content.trim().is_empty() && images.is_empty() {
            return Err(RuntimeError::InvalidArgument(
                "content must not be empty".into(),
            ));
        }
        crate::protocol::ImagePart::check_all(&images).map_err(RuntimeError::InvalidArgument)?;
        let content = crate::mentions::expand(&content, Path::new(&meta.workspace));
        // One decision by the child's controller: steered into its run, or a run of its
        // own through its task (never a run its parent would not hear of; review R2).
        crate::delegation::follow_up(
            &self.registry,
            session_id,
            content,
            config.unwrap_or_default(),
            images,
            true,
        )
    }

    /// The person's message to a session (not a follow-up; see [`Self::submit_message`]).
    pub fn submit(
        &self,
        session_id: &str,
        content: String,
        config: Option<RunConfig>,
    ) -> Result<(String, crate::protocol::MessageStatus), RuntimeError> {
        self.submit_with_images(session_id, content, config, Vec::new())
    }

    /// [`Self::submit`] with pasted or dropped images.
    pub fn submit_with_images(
        &self,
        session_id: &str,
        content: String,
        config: Option<RunConfig>,
        images: Vec<crate::protocol::ImagePart>,
    ) -> Result<(String, crate::protocol::MessageStatus), RuntimeError> {
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
        let title = title.trim();
        if title.is_empty() {
            return Err(RuntimeError::InvalidArgument("the title is empty".into()));
        }
        let controller = self.controller(session_id)?;
        let meta = controller.edit_meta(|meta| meta.title = title.to_string());
        Ok(meta.info(controller.state()))
    }

    /// The provider and model a session's next turns use (the model picker); `None`
    /// clears either. An unknown provider is refused.
    pub fn set_model(
        &self,
        session_id: &str,
        provider: Option<String>,
        model: Option<String>,
    ) -> Result<SessionInfo, RuntimeError> {
        if let Some(name) = &provider {
            self.config().provider_named(Some(name))?;
        }
        let controller = self.controller(session_id)?;
        let model = model.filter(|m| !m.trim().is_empty());
        let meta = controller.edit_meta(|meta| {
            meta.provider = provider;
            meta.model = model;
        });
        Ok(meta.info(controller.state()))
    }

    /// Makes a top-level session run as a profile from its next turn (its instructions,
    /// tools, provider, model and turn limit), or as none. A sub-agent's profile is its
    /// parent's choice and stays.
    pub fn set_agent(
        &self,
        session_id: &str,
        agent: Option<String>,
    ) -> Result<SessionInfo, RuntimeError> {
        let controller = self.controller(session_id)?;
        let meta = controller.current_meta();
        if meta.parent_session_id.is_some() {
            return Err(RuntimeError::InvalidArgument(
                "a sub-agent keeps the profile its parent gave it".into(),
            ));
        }
        let agent = agent.filter(|a| !a.trim().is_empty());
        if let Some(name) = &agent {
            let profiles = self.shared().profiles(Path::new(&meta.workspace));
            if profiles.get(name).is_none() {
                return Err(RuntimeError::InvalidArgument(format!(
                    "no agent profile named {name:?}; available: {}",
                    profiles.names().join(", ")
                )));
            }
        }
        let meta = controller.edit_meta(|meta| meta.agent = agent);
        Ok(meta.info(controller.state()))
    }

    /// The agent profiles of a workspace (built-in, the person's, the workspace's, and
    /// Claude Code's and Codex's files), with the files that could not be read.
    pub fn list_agents(&self, workspace: &str) -> crate::protocol::Profiles {
        self.shared().profiles(Path::new(workspace))
    }

    /// The MCP servers of the config and of `workspace`'s `.mcp.json`, with their state.
    pub fn list_mcp_servers(&self, workspace: Option<&str>) -> Vec<crate::protocol::McpServerInfo> {
        let shared = self.shared();
        let configured = shared.read_config(|c| c.mcp_servers.clone());
        let workspace = workspace.map(mcp_workspace);
        shared.mcp.list(&configured, workspace.as_deref())
    }

    /// Turns a configured MCP server on or off; it stops or starts with the next turn.
    pub fn set_mcp_server_enabled(
        &self,
        name: &str,
        enabled: bool,
    ) -> Result<Vec<crate::protocol::McpServerInfo>, RuntimeError> {
        if !self
            .shared()
            .read_config(|c| c.mcp_servers.contains_key(name))
        {
            return Err(RuntimeError::NotFound(format!("MCP server {name:?}")));
        }
        // `null` removes the key: enabled is the default.
        let value = if enabled {
            serde_json::Value::Null
        } else {
            serde_json::Value::Bool(false)
        };
        self.update_config(&serde_json::json!({"mcp_servers": {name: {"enabled": value}}}))?;
        if !enabled {
            // Off now, not at the next turn: its process should not outlive the choice.
            self.shared().mcp.stop(name);
        }
        Ok(self.list_mcp_servers(None))
    }

    /// Restarts an MCP server now.
    pub fn restart_mcp_server(
        &self,
        name: &str,
        workspace: Option<&str>,
    ) -> Result<(), RuntimeError> {
        let workspace = workspace.map(mcp_workspace);
        if self.shared().mcp.restart(name, workspace.as_deref()) {
            Ok(())
        } else {
            Err(RuntimeError::NotFound(format!(
                "running MCP server {name:?} (servers start with the first turn that uses them)"
            )))
        }
    }

    /// Records whether the person trusts `workspace`'s `.mcp.json` as it is now.
    pub fn trust_mcp_workspace(
        &self,
        workspace: &str,
        allow: bool,
    ) -> Result<Vec<crate::protocol::McpServerInfo>, RuntimeError> {
        let path = mcp_workspace(workspace);
        self.shared()
            .mcp
            .trust(&path, allow)
            .map_err(RuntimeError::InvalidArgument)?;
        Ok(self.list_mcp_servers(Some(workspace)))
    }

    /// Archives a session (hidden from the usual list) or brings it back.
    pub fn archive_session(
        &self,
        session_id: &str,
        archived: bool,
    ) -> Result<SessionInfo, RuntimeError> {
        let controller = self.controller(session_id)?;
        let meta = controller.edit_meta(|meta| meta.archived = archived);
        Ok(meta.info(controller.state()))
    }

    /// Sessions whose title or any message contains `query` (case-insensitive), newest
    /// first. Reads histories, so off the async threads.
    pub async fn search_sessions(
        &self,
        query: &str,
        workspace: Option<&str>,
    ) -> Result<Vec<SessionInfo>, RuntimeError> {
        let needle = query.trim().to_lowercase();
        if needle.is_empty() {
            return Ok(Vec::new());
        }
        let store = self.shared().store.clone();
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
        Ok(self.infos(found))
    }

    /// Session infos with the live state of those loaded (the stored one is right for
    /// the others: nothing runs in them).
    fn infos(&self, metas: Vec<crate::store::SessionMeta>) -> Vec<SessionInfo> {
        metas
            .into_iter()
            .map(|meta| {
                let state = self
                    .registry
                    .live_state(&meta.session_id)
                    .unwrap_or(meta.state);
                meta.info(state)
            })
            .collect()
    }

    /// Files of a workspace for an @-mention, best matches first.
    pub async fn list_files(
        &self,
        workspace: &str,
        query: Option<&str>,
        limit: Option<usize>,
    ) -> Result<commands::FileList, RuntimeError> {
        let root = PathBuf::from(workspace);
        if !root.is_absolute() || !root.is_dir() {
            return Err(RuntimeError::InvalidArgument(format!(
                "workspace {workspace} is not a folder"
            )));
        }
        let query = query.map(str::to_string);
        let limit = limit.unwrap_or(50).min(500);
        let files = tokio::task::spawn_blocking(move || {
            crate::mentions::list_files(&root, query.as_deref(), limit)
        })
        .await
        .map_err(|err| RuntimeError::Unavailable(err.to_string()))?;
        Ok(commands::FileList { files })
    }

    /// Stores an API key in the OS keyring and points the provider at it. The key is
    /// never written to the config, a session or a log. `provider` names the block
    /// (`None`: the lone `provider` block); a named provider's entry defaults to its name,
    /// so two servers of one kind keep two keys.
    pub async fn set_api_key(
        &self,
        key: &str,
        entry: Option<String>,
        provider: Option<&str>,
    ) -> Result<Config, RuntimeError> {
        if key.trim().is_empty() {
            return Err(RuntimeError::InvalidArgument("the API key is empty".into()));
        }
        if self.is_busy() {
            return Err(RuntimeError::Busy(
                "runs are active; stop them before changing the API key".into(),
            ));
        }
        let config = self.config();
        // Checked before the keyring is touched: an unknown name stores nothing.
        let named = match provider {
            None => None,
            Some(name) => {
                let (name, _) = config.provider_named(Some(name))?;
                config
                    .providers
                    .contains_key(name)
                    .then(|| name.to_string())
            }
        };
        let entry = entry.unwrap_or_else(|| match &named {
            Some(name) => name.clone(),
            None => config.provider.kind.clone(),
        });
        crate::providers::store_key_in_keyring(&entry, &crate::providers::ApiKey::new(key.trim()))
            .await
            .map_err(|err| RuntimeError::Unavailable(err.to_string()))?;
        let patch = match named {
            Some(name) => serde_json::json!({"providers": {name: {"api_key_keyring": entry}}}),
            None => serde_json::json!({"provider": {"api_key_keyring": entry}}),
        };
        self.update_config(&patch)
    }

    /// Sends one tiny real request (one user message, at most one token, no tools)
    /// through a configured provider, built by the same factory the runs use, and says
    /// how it went. Nothing is retried: the person wants the first failure's reason now,
    /// not after the backoff. An unknown name is an `invalid_argument` error; anything
    /// the server or the network does is a result with `ok: false`.
    pub async fn test_provider(&self, name: &str) -> Result<commands::ProviderTest, RuntimeError> {
        let config = self.config();
        let (_, block) = config.provider_named(Some(name))?;
        let mut block = block.clone();
        block
            .extra
            .insert("max_retries".into(), serde_json::json!(0));
        let model = block.model.clone();
        let started = std::time::Instant::now();
        let outcome = match self.shared().build_provider(&block) {
            Err(err) => Err(err.to_string()),
            Ok(provider) => {
                let request = crate::provider::ModelRequest {
                    messages: vec![crate::protocol::Message::user("test", "Say OK.")],
                    tools: Vec::new(),
                    settings: crate::provider::ModelSettings {
                        model: model.clone(),
                        temperature: block.temperature,
                        max_tokens: Some(1),
                        no_images: false,
                    },
                };
                let call = provider.generate(request, &|_| {});
                tokio::select! {
                    answer = tokio::time::timeout(PROVIDER_TEST_TIMEOUT, call) => match answer {
                        Ok(Ok(_)) => Ok(()),
                        Ok(Err(err)) => Err(provider_test_message(&err)),
                        Err(_) => Err(format!(
                            "no answer from {} within {} s",
                            block.base_url,
                            PROVIDER_TEST_TIMEOUT.as_secs()
                        )),
                    },
                    _ = self.shared().root.cancelled() => Err("the app is shutting down".into()),
                }
            }
        };
        let latency_ms = started.elapsed().as_millis() as u64;
        Ok(match outcome {
            Ok(()) => commands::ProviderTest {
                ok: true,
                model,
                latency_ms,
                message: String::new(),
            },
            Err(message) => commands::ProviderTest {
                ok: false,
                model,
                latency_ms,
                message,
            },
        })
    }

    /// Continues an interrupted child from its own history (with what was sent to it
    /// before the crash); its report then reaches the parent as usual. Returns at once:
    /// the child waits for its slot in its own task.
    pub async fn resume_subagent(&self, session_id: &str) -> Result<(), RuntimeError> {
        let child = self.controller(session_id)?;
        let meta = child.current_meta();
        let Some(task_id) = meta.task_id.clone() else {
            return Err(RuntimeError::InvalidArgument(format!(
                "session {session_id} is not a sub-agent"
            )));
        };
        let store = self.shared().store.clone();
        let id = session_id.to_string();
        let ran =
            tokio::task::spawn_blocking(move || store.load(&id).map(|l| !l.messages.is_empty()))
                .await
                .map_err(|err| RuntimeError::Unavailable(err.to_string()))??;
        // A child that never ran begins with its task.
        let first = (!ran).then(|| QueuedMessage {
            message_id: format!("task:{task_id}"),
            content: meta.task_content.clone().unwrap_or_default(),
            config: RunConfig::default(),
            images: Vec::new(),
        });
        child.resume_child_task(first)
    }

    /// `cancel`: stops a session's run. An interrupted child has no run: cancelling it
    /// ends its task, and the parent gets an error report instead of waiting forever.
    pub async fn cancel_session(&self, session_id: &str) -> Result<(), RuntimeError> {
        let controller = self.controller(session_id)?;
        let meta = controller.current_meta();
        if let (Some(task_id), Some(parent)) = (meta.task_id, meta.parent_session_id) {
            if controller.take_interrupted() {
                crate::delegation::deliver_report(
                    &self.registry,
                    Report {
                        task_id,
                        session_id: session_id.to_string(),
                        parent_session_id: parent,
                        outcome: Err(
                            "the sub-agent was interrupted and then cancelled by the user".into(),
                        ),
                        config: RunConfig::default(),
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

    pub fn store(&self) -> &SessionStore {
        &self.shared().store
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
    /// (each `None`: no bound). The file is read once as for the whole history; what is cut
    /// is the answer (a 2,000-message session's JSON is most of the time it takes to open).
    /// Compactions are all sent, their `first_kept` an index into the whole history.
    pub fn get_session_page(
        &self,
        session_id: &str,
        last: Option<u32>,
        before: Option<u32>,
    ) -> Result<commands::SessionWithMessages, RuntimeError> {
        let loaded = self.shared().store.load(session_id)?;
        let state = self
            .registry
            .live_state(session_id)
            .unwrap_or(loaded.meta.state);
        let mut messages = loaded.messages;
        let total = messages.len();
        let end = before.map_or(total, |b| (b as usize).min(total));
        let start = last.map_or(0, |n| end.saturating_sub(n as usize));
        messages.truncate(end);
        messages.drain(..start);
        // The person's discards of reports, for the marks in the chat (UX review D22).
        let store = &self.shared().store;
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
    pub fn session_list_feed(
        &self,
        workspace: Option<String>,
        stop: CancellationToken,
    ) -> impl futures::Stream<Item = SessionListEvent> + Send + 'static {
        // Subscribed before the list is read: a change raced with it is sent after it,
        // never lost.
        let changes = self.shared().store.changes();
        let feed = ListFeed {
            service: self.clone(),
            workspace,
            changes,
            stop,
            queued: std::collections::VecDeque::new(),
            listed: false,
        };
        futures::stream::unfold(feed, |mut feed| async move {
            let event = feed.next().await?;
            Some((event, feed))
        })
    }

    /// The workspaces of the stored sessions, most recently active first (`list_workspaces`):
    /// from the session list's index, with no scan of the disk beyond checking that each
    /// folder still exists. Counts top-level sessions (archived ones too: they are still
    /// the workspace's).
    pub fn list_workspaces(&self) -> Result<Vec<commands::WorkspaceInfo>, RuntimeError> {
        let mut found: Vec<commands::WorkspaceInfo> = Vec::new();
        for meta in self.shared().store.list(None)? {
            let top = meta.parent_session_id.is_none();
            let activity = if meta.updated_at.is_empty() {
                meta.created_at
            } else {
                meta.updated_at
            };
            match found
                .iter_mut()
                .find(|w| crate::store::same_workspace(&w.path, &meta.workspace))
            {
                Some(known) => {
                    known.sessions += u32::from(top);
                    if activity > known.last_activity {
                        known.last_activity = activity;
                    }
                }
                None => found.push(commands::WorkspaceInfo {
                    path: meta.workspace,
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

    pub fn list_sessions(&self, workspace: Option<&str>) -> Result<Vec<SessionInfo>, RuntimeError> {
        let metas = self.shared().store.list(workspace)?;
        Ok(self.infos(metas))
    }

    /// Applies a merge patch to the config. Fails with `busy` while anything runs, and
    /// then changes nothing (SPEC §6).
    pub fn update_config(&self, patch: &serde_json::Value) -> Result<Config, RuntimeError> {
        let config = self.shared().update_config(
            |config| Ok(config.patched(patch)?),
            || {
                self.is_busy().then(|| {
                    format!(
                        "{} run(s) and {} sub-agent task(s) are active; stop them before changing the config",
                        self.active_runs(),
                        self.subagents().len()
                    )
                })
            },
        )?;
        crate::sandbox::configure(&config.tools.command);
        Ok(config)
    }

    /// Deletes a session and everything below it. The session is marked deleted first, so
    /// that nothing is delivered to it, nothing starts in it and it creates no child;
    /// then its run is stopped and its children deleted, so no report is delivered and
    /// no parent is woken (SPEC §3; runtime review C9).
    pub async fn delete_session(&self, session_id: &str) -> Result<(), RuntimeError> {
        let shared = self.shared();
        if !shared.store.exists(session_id) {
            return Err(RuntimeError::NotFound(format!("session {session_id}")));
        }
        let controller = self.controller(session_id)?;
        controller.mark_deleted();
        controller.cancel().await;
        // No child can be created from here on: list them now.
        let store = shared.store.clone();
        let id = session_id.to_string();
        let children = tokio::task::spawn_blocking(move || {
            store.list(None).map(|metas| {
                metas
                    .into_iter()
                    .filter(|meta| meta.parent_session_id.as_deref() == Some(id.as_str()))
                    .map(|meta| meta.session_id)
                    .collect::<Vec<_>>()
            })
        })
        .await
        .map_err(|err| RuntimeError::Unavailable(err.to_string()))??;
        for child in children {
            Box::pin(self.delete_session(&child)).await?;
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
        shared.forget_tree_usage(session_id);
        if let Some(info) = &meta.worktree {
            let info = info.clone();
            let removed =
                tokio::task::spawn_blocking(move || crate::checkpoints::worktree::remove(&info))
                    .await;
            if !matches!(removed, Ok(Ok(()))) {
                tracing::warn!(session = %session_id, "cannot remove the sub-agent's worktree: {removed:?}");
            }
        }
        shared.store.delete(session_id)?;
        shared.checkpoints.forget_session(session_id);
        self.registry.remove(session_id);
        Ok(())
    }

    /// The files the agent changed in each turn of a session, with diffs (the Changes view).
    pub async fn turn_changes(
        &self,
        session_id: &str,
    ) -> Result<commands::TurnChanges, RuntimeError> {
        if !self.shared().store.exists(session_id) {
            return Err(RuntimeError::NotFound(format!("session {session_id}")));
        }
        Ok(self.shared().checkpoints.turn_changes(session_id).await?)
    }

    /// Undoes the changes of a session's turns from the person's message at
    /// `message_index` on (or previews that). Refused while the session runs.
    pub async fn undo_turn(
        &self,
        args: commands::UndoTurn,
    ) -> Result<commands::UndoResult, RuntimeError> {
        self.turn_message(&args.session_id, args.message_index)?;
        if !args.preview && self.controller(&args.session_id)?.is_running() {
            return Err(RuntimeError::Busy(format!(
                "session {} is running; stop it before undoing its changes",
                args.session_id
            )));
        }
        Ok(self
            .shared()
            .checkpoints
            .undo(
                &args.session_id,
                args.message_index,
                args.force,
                args.preview,
            )
            .await?)
    }

    /// A new session whose history is the original's before the person's message at
    /// `message_index`; the original stays as it is. With `rewind` the files are
    /// restored first (and nothing is forked if that is refused).
    pub async fn fork_session(
        &self,
        args: commands::ForkSession,
    ) -> Result<commands::Forked, RuntimeError> {
        let (loaded, draft) = self.turn_message(&args.session_id, args.message_index)?;
        let draft_images = loaded.messages[args.message_index].images.clone();
        let undo = if args.rewind {
            Some(
                self.undo_turn(commands::UndoTurn {
                    session_id: args.session_id.clone(),
                    message_index: args.message_index,
                    force: args.force,
                    preview: false,
                })
                .await?,
            )
        } else {
            None
        };
        let store = &self.shared().store;
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
    pub async fn apply_worktree(
        &self,
        session_id: &str,
    ) -> Result<commands::Applied, RuntimeError> {
        let (controller, info) = self.idle_worktree(session_id)?;
        if info.applied {
            return Err(RuntimeError::InvalidArgument(format!(
                "the changes of {} were applied already; discard the worktree when done",
                info.branch
            )));
        }
        let stat = tokio::task::spawn_blocking(move || crate::checkpoints::worktree::apply(&info))
            .await
            .map_err(|err| RuntimeError::Unavailable(err.to_string()))?
            .map_err(|err| match err {
                crate::checkpoints::worktree::WorktreeError::Conflict(_) => {
                    RuntimeError::Conflict(err.to_string())
                }
                other => RuntimeError::Unavailable(other.to_string()),
            })?;
        controller.edit_meta(|meta| {
            if let Some(info) = &mut meta.worktree {
                info.applied = true;
            }
        });
        Ok(commands::Applied { stat })
    }

    /// Removes an isolated child's worktree and branch; the session stays, without them.
    pub async fn discard_worktree(&self, session_id: &str) -> Result<(), RuntimeError> {
        let (controller, info) = self.idle_worktree(session_id)?;
        tokio::task::spawn_blocking(move || crate::checkpoints::worktree::remove(&info))
            .await
            .map_err(|err| RuntimeError::Unavailable(err.to_string()))?
            .map_err(|err| RuntimeError::Unavailable(err.to_string()))?;
        controller.edit_meta(|meta| meta.worktree = None);
        Ok(())
    }

    fn idle_worktree(
        &self,
        session_id: &str,
    ) -> Result<(Arc<SessionController>, crate::protocol::WorktreeInfo), RuntimeError> {
        let controller = self.controller(session_id)?;
        let Some(info) = controller.current_meta().worktree else {
            return Err(RuntimeError::InvalidArgument(format!(
                "session {session_id} has no worktree (only sub-agents started with isolation \"worktree\" have one)"
            )));
        };
        let working = matches!(
            self.subagents().state_of(session_id),
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
        &self,
        session_id: &str,
        index: usize,
    ) -> Result<(crate::store::LoadedSession, String), RuntimeError> {
        let loaded = self.shared().store.load(session_id)?;
        let Some(message) = loaded.messages.get(index) else {
            return Err(RuntimeError::InvalidArgument(format!(
                "message_index {index} is past the end of the session's history ({} messages)",
                loaded.messages.len()
            )));
        };
        if crate::checkpoints::turn_of(std::slice::from_ref(message)) != Some(0) {
            return Err(RuntimeError::InvalidArgument(format!(
                "message {index} is not a message of the person; turns start at the person's messages"
            )));
        }
        let text = message.text().to_string();
        Ok((loaded, text))
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
        let mut runs = shared.watch_runs();
        let _ = runs.wait_for(|count| *count == 0).await;
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
        loop {
            let _ = runs.wait_for(|count| *count == 0).await;
            shared.subagents.wait_empty().await;
            if *runs.borrow() == 0 && shared.subagents.is_empty() {
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

/// A workspace path as runs see it (resolved), for matching its `.mcp.json` servers.
fn mcp_workspace(workspace: &str) -> std::path::PathBuf {
    let path = Path::new(workspace);
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

/// The state of one session list feed.
struct ListFeed {
    service: RuntimeService,
    workspace: Option<String>,
    changes: tokio::sync::broadcast::Receiver<SessionId>,
    stop: CancellationToken,
    queued: std::collections::VecDeque<SessionListEvent>,
    listed: bool,
}

impl ListFeed {
    fn listed(&mut self) -> SessionListEvent {
        self.listed = true;
        let sessions = self
            .service
            .list_sessions(self.workspace.as_deref())
            .unwrap_or_else(|err| {
                tracing::warn!("cannot list sessions for a feed: {err}");
                Vec::new()
            });
        SessionListEvent::Listed { sessions }
    }

    async fn next(&mut self) -> Option<SessionListEvent> {
        use tokio::sync::broadcast::error::{RecvError, TryRecvError};
        if !self.listed {
            return Some(self.listed());
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
                Err(RecvError::Lagged(_)) => return Some(self.listed()),
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
                    Err(TryRecvError::Lagged(_)) => return Some(self.listed()),
                    Err(TryRecvError::Empty | TryRecvError::Closed) => break,
                }
            }
            for id in ids {
                let store = self.service.store();
                match store.meta(&id) {
                    Ok(meta) => {
                        if self
                            .workspace
                            .as_deref()
                            .is_none_or(|w| crate::store::same_workspace(w, &meta.workspace))
                        {
                            let mut infos = self.service.infos(vec![meta]);
                            if let Some(session) = infos.pop() {
                                self.queued.push_back(SessionListEvent::Changed {
                                    session: Box::new(session),
                                });
                            }
                        }
                    }
                    Err(_) if !store.exists(&id) => self
                        .queued
                        .push_back(SessionListEvent::Removed { session_id: id }),
                    Err(err) => {
                        tracing::warn!(session = %id, "cannot read a changed session: {err}")
                    }
                }
            }
        }
    }
}
