//! The shared runtime context every session controller works in: store, config snapshot, provider cache, approvals, sub-agent tasks, slots, run counting and the turn-context resolver.
//!
//! It knows nothing of controllers: the controller depends on it, the registry and the
//! service build on both, so the module graph has no cycle.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use crate::approvals::ApprovalBook;
use crate::config::{Config, ProviderConfig, ToolPolicy};
use crate::context::environment::Environment;
use crate::context::instructions::Instructions;
use crate::context::window::ContextWindow;
use crate::protocol::{Profiles, SessionId, Usage};
use crate::provider::{ModelProvider, ModelSettings, ProviderError, ProviderFactory, ToolSpec};
use crate::store::SessionStore;
use crate::subagents::SubagentTasks;
use crate::tools::{Delegator, ToolRegistry};

/// What a turn runs with from the config, resolved once when the run starts and fixed
/// for that run (a config change applies from the next run). Profiles and MCP tools plug
/// in here; `crate::context::turn::resolve` adds the prompt's half and is the one
/// place a run resolves its turn.
#[derive(Clone)]
pub struct TurnContext {
    pub provider: Arc<dyn ModelProvider>,
    pub settings: ModelSettings,
    /// The tools the run may call (already narrowed for children and by depth).
    pub tools: ToolRegistry,
    /// What the model is offered: `tools` minus those switched off by policy (shared
    /// with every request of the run).
    pub specs: Arc<[ToolSpec]>,
    /// `tools.policy` as it was when the run started.
    pub policy: Arc<std::collections::BTreeMap<String, ToolPolicy>>,
    pub delegator: Option<Arc<dyn Delegator>>,
    /// Variables that hold secrets; commands do not get them.
    pub secret_env: Vec<String>,
    pub limits: Limits,
    /// The profile's instructions (a child's agent), added to the system prompt.
    pub instructions: String,
    /// The profile's external ACP agent: its turns replace the model loop (`acp::client`).
    pub acp: Option<crate::protocol::AcpAgent>,
    /// The provider's name and the model, for the UI and usage.
    pub provider_name: String,
    /// The provider block the run uses (its model included): the context window is
    /// resolved from it.
    pub block: ProviderConfig,
    /// When and how the history is compacted (`context.compact_at`, the answer's room).
    pub compaction: crate::context::compaction::Policy,
}

/// What a run asks for when it resolves its turn context.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TurnRequest<'a> {
    /// 0 for a top-level session.
    pub depth: usize,
    /// The folder as the session names it (the MCP servers are keyed by it).
    pub workspace: &'a Path,
    /// The same folder found once for the run: its real location and project root.
    pub place: &'a crate::workspace::Place,
    /// The child's profile.
    pub agent: Option<&'a str>,
    /// The session's chosen provider and model (the model picker).
    pub provider: Option<&'a str>,
    pub model: Option<&'a str>,
    /// The run's own choices (a custom command's `model` and `allowed-tools`).
    pub choice: &'a crate::protocol::RuntimeSettings,
}

/// Bounds of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How many model calls a run may make before it stops with an error.
    pub max_steps: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_steps: crate::config::LimitsConfig::DEFAULT_MAX_STEPS,
        }
    }
}

/// What the controllers share: store, config, provider, approvals, tasks, run count.
pub struct Shared {
    pub(crate) store: Arc<SessionStore>,
    /// The external ACP agents of `kind: acp` children (`acp::client`).
    pub(crate) acp_agents: crate::acp::client::Agents,
    pub(crate) data_dir: PathBuf,
    config: RwLock<Config>,
    pub(crate) config_path: Option<PathBuf>,
    provider_factory: ProviderFactory,
    /// The provider built for a provider block, rebuilt when the block changes. Looked up
    /// with a copy of the block, never while the config lock is held (runtime review C3).
    providers: BlockCache<Arc<dyn ModelProvider>>,
    /// Request slots of each model server with a known number of parallel requests
    /// (`max_concurrent`, or what the server says): a lease per model call.
    provider_slots: Mutex<HashMap<String, Arc<crate::slots::RequestSlots>>>,
    pub(crate) approvals: Arc<ApprovalBook>,
    pub(crate) subagents: SubagentTasks,
    pub(crate) root: CancellationToken,
    active_runs: watch::Sender<usize>,
    /// Child run slots (`subagents.max_concurrent`), one pool per delegation depth: a
    /// child holds a slot of its own depth only, so grandchildren never wait on it
    /// (runtime review C6). Waited for inside the child's task, never by its parent.
    slots: Mutex<Vec<Arc<Semaphore>>>,
    /// Starting a run takes this for reading and a config change for writing, so a run
    /// never starts between the busy check and the change (SPEC §6, runtime review C3).
    run_gate: RwLock<()>,
    /// Serialises config changes (the file is saved outside `config`'s lock).
    update_lock: Mutex<()>,
    /// Tokens of each session's whole tree, kept as usage is added.
    tree_usage: Mutex<HashMap<SessionId, Usage>>,
    /// The tools of top-level sessions.
    pub(crate) tools: ToolRegistry,
    /// The `sub_agent` tool's back end; set once the registry exists.
    pub(crate) delegator: OnceLock<Arc<dyn Delegator>>,
    /// Registers the task of each child run (the controller's `Starting` phase).
    pub(crate) children: OnceLock<Arc<dyn crate::controller::ChildTasks>>,
    /// Children being made and started by a `sub_agent` call's task (a worktree may take
    /// a while): work that `wait_idle` waits for, though no run or task counts it yet.
    pub(crate) making: watch::Sender<usize>,
    /// Context windows found per provider, with the block they were found for: asking a
    /// server once per provider is enough (a changed block asks again).
    windows: BlockCache<ContextWindow>,
    /// The latest environment detection per workspace: sessions opened within
    /// [`ENVIRONMENT_FRESH`] of it (a fan-out's children) share it instead of each
    /// starting `git status`.
    environments: Recent<Environment>,
    /// Where each workspace was found (its real folder and project root), shared the
    /// same way: a fan-out's thousand children would otherwise each resolve the folder
    /// and walk up from it for `.git` (3.6 % of its CPU, issue 31).
    places: Recent<crate::workspace::Place>,
    /// Request slots model servers reported (llama.cpp `total_slots`), per provider and
    /// block; `None` when the server does not say.
    server_slots: BlockCache<Option<usize>>,
    /// The checkpoint store that changing tool calls record into (undo).
    pub(crate) checkpoints: Arc<crate::checkpoints::Checkpoints>,
    /// MCP servers: started by the first run that can use them.
    pub(crate) mcp: crate::mcp::McpManager,
}

/// What was built or found for a provider, per provider name, with the block it was for.
type BlockCache<T> = Mutex<HashMap<String, (ProviderConfig, T)>>;

/// The value kept for `name`, if it was made for this very block (a changed block makes
/// it again). No lock is held after it returns.
fn cached_for<T: Clone>(cache: &BlockCache<T>, name: &str, block: &ProviderConfig) -> Option<T> {
    let cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    cache
        .get(name)
        .filter(|(seen, _)| seen == block)
        .map(|(_, value)| value.clone())
}

fn remember<T>(cache: &BlockCache<T>, name: &str, block: &ProviderConfig, value: T) {
    cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(name.to_string(), (block.clone(), value));
}

/// Context windows model servers reported, by server and model (`windows.json` in the
/// data dir), so a start need not ask again before its first request.
const WINDOWS_FILE: &str = "windows.json";

/// How many requests model servers said they serve at once, by server (`slots.json` in
/// the data dir): asking costs a start three probes (llama.cpp, Ollama, LM Studio)
/// before its first request, about a third of a one-shot `bumblehive run`'s start
/// (issue #31).
const SLOTS_FILE: &str = "slots.json";

fn window_key(block: &ProviderConfig) -> String {
    format!("{} {} {}", block.kind, block.base_url, block.model)
}

fn server_key(block: &ProviderConfig) -> String {
    format!("{} {}", block.kind, block.base_url)
}

/// How long a remembered server fact is used before it is asked again (in the
/// background: the start never waits for it).
const WINDOW_FRESH: Duration = Duration::from_secs(600);

/// What a server said and when (seconds since the epoch).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Seen<T> {
    /// `window` in the `windows.json` of builds that kept nothing else.
    #[serde(alias = "window")]
    value: T,
    at: u64,
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn read_seen<T: serde::de::DeserializeOwned>(
    path: &Path,
) -> std::collections::BTreeMap<String, Seen<T>> {
    std::fs::read(path)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// Records what asking a server found, also "nothing" (a server that does not say, or a
/// hosted API: the table's or the default figure, no slot limit), so that is not asked
/// each start either. A lost race between two starts loses only a cache entry.
fn save_seen<T: serde::Serialize + serde::de::DeserializeOwned>(path: &Path, key: &str, value: T) {
    let mut seen = read_seen::<T>(path);
    seen.insert(
        key.to_string(),
        Seen {
            value,
            at: now_secs(),
        },
    );
    let bytes = serde_json::to_vec_pretty(&seen).unwrap_or_default();
    if let Err(err) = crate::fsutil::write_atomic(path, &bytes, false) {
        tracing::debug!("cannot save {}: {err}", path.display());
    }
}

/// What a server said at an earlier start (`path`, under `key`) is used at once, and
/// asked again in the background for the next start once older than [`WINDOW_FRESH`]
/// (quick repeated starts ask nothing at all); with nothing remembered it is asked now
/// and kept. A stale figure costs little: a too-large window is caught by "context too
/// long" and one compaction, a wrong slot count by the server's own queue until the
/// next start.
async fn ask_once<T, F, Fut>(path: PathBuf, key: String, ask: F) -> T
where
    T: serde::Serialize + serde::de::DeserializeOwned + Clone + Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    match read_seen::<T>(&path).remove(&key) {
        Some(seen) => {
            if now_secs().saturating_sub(seen.at) > WINDOW_FRESH.as_secs() {
                tokio::spawn(async move {
                    let fresh = ask().await;
                    save_seen(&path, &key, fresh);
                });
            }
            seen.value
        }
        None => {
            let value = ask().await;
            save_seen(&path, &key, value.clone());
            value
        }
    }
}

/// How long one workspace's environment detection, and where it was found, are reused
/// by other sessions.
const ENVIRONMENT_FRESH: Duration = Duration::from_secs(10);

/// What was last found per workspace, reused for [`ENVIRONMENT_FRESH`].
struct Recent<T>(Mutex<HashMap<PathBuf, (Instant, Arc<T>)>>);

impl<T> Default for Recent<T> {
    fn default() -> Self {
        Recent(Mutex::new(HashMap::new()))
    }
}

impl<T> Recent<T> {
    fn get(&self, workspace: &Path) -> Option<Arc<T>> {
        let cache = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (when, value) = cache.get(workspace)?;
        (when.elapsed() < ENVIRONMENT_FRESH).then(|| value.clone())
    }

    fn put(&self, workspace: &Path, value: T) -> Arc<T> {
        let value = Arc::new(value);
        let mut cache = self.0.lock().unwrap_or_else(|p| p.into_inner());
        cache.retain(|_, (when, _)| when.elapsed() < ENVIRONMENT_FRESH);
        cache.insert(workspace.to_path_buf(), (Instant::now(), value.clone()));
        value
    }
}

/// What a [`Shared`] is built from.
pub(crate) struct SharedParts {
    pub store: Arc<SessionStore>,
    pub data_dir: PathBuf,
    pub config: Config,
    pub config_path: Option<PathBuf>,
    pub provider_factory: ProviderFactory,
    pub subagents: SubagentTasks,
    pub root: CancellationToken,
    pub tools: ToolRegistry,
}

impl Shared {
    pub(crate) fn new(parts: SharedParts) -> Self {
        let SharedParts {
            store,
            data_dir,
            config,
            config_path,
            provider_factory,
            subagents,
            root,
            tools,
        } = parts;
        let (data_dir_for_mcp, root_for_mcp) = (data_dir.clone(), root.clone());
        Shared {
            acp_agents: Default::default(),
            checkpoints: {
                let checkpoints = crate::checkpoints::Checkpoints::new(&data_dir);
                checkpoints.set_limits(config.checkpoints.limits());
                checkpoints
            },
            store,
            data_dir,
            config: RwLock::new(config),
            config_path,
            provider_factory,
            providers: Mutex::new(HashMap::new()),
            provider_slots: Mutex::new(HashMap::new()),
            approvals: Arc::new(ApprovalBook::default()),
            subagents,
            root,
            active_runs: watch::channel(0).0,
            slots: Mutex::new(Vec::new()),
            run_gate: RwLock::new(()),
            update_lock: Mutex::new(()),
            tree_usage: Mutex::new(HashMap::new()),
            tools,
            delegator: OnceLock::new(),
            children: OnceLock::new(),
            making: watch::channel(0).0,
            windows: Mutex::new(HashMap::new()),
            environments: Recent::default(),
            places: Recent::default(),
            server_slots: Mutex::new(HashMap::new()),
            mcp: crate::mcp::McpManager::new(data_dir_for_mcp, root_for_mcp),
        }
    }

    /// The model's context window for a run's provider block (config, server, table or
    /// default), found once per provider and block.
    pub(crate) async fn context_window(&self, name: &str, block: &ProviderConfig) -> ContextWindow {
        // A window the person set wins over anything a server said, remembered or not
        // (UX review E10: `windows.json` is keyed by server and model, not by the block).
        if block.context_window.is_some_and(|t| t > 0) {
            return crate::context::window::resolve(block).await;
        }
        if let Some(window) = cached_for(&self.windows, name, block) {
            return window;
        }
        let asked = block.clone();
        let window = ask_once(
            self.data_dir.join(WINDOWS_FILE),
            window_key(block),
            move || async move { crate::context::window::resolve(&asked).await },
        )
        .await;
        remember(&self.windows, name, block, window);
        window
    }

    /// The environment of a workspace for a session's system prompt.
    pub(crate) async fn environment(&self, workspace: &Path) -> Arc<Environment> {
        if let Some(env) = self.environments.get(workspace) {
            return env;
        }
        self.environments
            .put(workspace, Environment::detect(workspace).await)
    }

    /// Where a workspace is for a run: its real folder and project root (the folders
    /// its instruction files, skills and profiles are read from; their contents are read
    /// at every run).
    pub(crate) fn place(&self, workspace: &Path) -> Arc<crate::workspace::Place> {
        if let Some(place) = self.places.get(workspace) {
            return place;
        }
        self.places
            .put(workspace, crate::workspace::Place::find(workspace))
    }

    /// The project instructions of a workspace (AGENTS.md / CLAUDE.md and the user's file
    /// beside the config), read on a blocking thread.
    pub(crate) async fn instructions(&self, place: Arc<crate::workspace::Place>) -> Instructions {
        let user_dir = self.user_dir();
        tokio::task::spawn_blocking(move || {
            crate::context::instructions::load_at(&place, user_dir.as_deref())
        })
        .await
        .unwrap_or_else(|err| Instructions {
            notices: vec![format!("cannot read the instruction files: {err}")],
            ..Instructions::default()
        })
    }

    pub fn config(&self) -> Config {
        self.read_config(Config::clone)
    }

    /// Reads part of the config without copying all of it.
    pub(crate) fn read_config<T>(&self, read: impl FnOnce(&Config) -> T) -> T {
        read(&self.config.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// The provider for a provider block, built once per block. The block is a copy, so
    /// no config lock is held here.
    pub(crate) fn provider_for(
        &self,
        name: &str,
        block: &ProviderConfig,
    ) -> Result<Arc<dyn ModelProvider>, ProviderError> {
        if let Some(provider) = cached_for(&self.providers, name, block) {
            return Ok(provider);
        }
        // Built outside the lock: building may read a keyring or the environment.
        let provider = (self.provider_factory)(block)?;
        remember(&self.providers, name, block, provider.clone());
        Ok(provider)
    }

    /// A provider for a block, built by the runs' factory but not cached (a provider
    /// test's block differs from the run's: it does not retry).
    pub(crate) fn build_provider(
        &self,
        block: &ProviderConfig,
    ) -> Result<Arc<dyn ModelProvider>, ProviderError> {
        (self.provider_factory)(block)
    }

    /// Where the person's own agent profiles live: `agents/` beside the config file.
    pub(crate) fn user_dir(&self) -> Option<PathBuf> {
        match &self.config_path {
            Some(path) => path.parent().map(Path::to_path_buf),
            None => dirs::config_dir().map(|d| d.join("bumblehive")),
        }
    }

    /// The agent profiles a workspace's sessions can use (read each time: a few small
    /// folders; edits apply from the next run).
    pub(crate) fn profiles(&self, workspace: &Path) -> Profiles {
        self.profiles_at(&self.place(workspace))
    }

    /// [`Self::profiles`] of a workspace already found (a run's turn).
    pub(crate) fn profiles_at(&self, place: &crate::workspace::Place) -> Profiles {
        crate::profiles::load_at(place, self.user_dir().as_deref())
    }

    /// The provider a child with `agent` runs on (for its slots): the one its meta names
    /// (`chosen`, its parent's), else its profile's, as [`Self::resolve_turn`] picks.
    pub(crate) fn provider_of(
        &self,
        workspace: &Path,
        agent: Option<&str>,
        chosen: Option<&str>,
    ) -> String {
        let profile_provider = chosen.map(str::to_string).or_else(|| {
            agent.and_then(|name| {
                self.profiles(workspace)
                    .get(name)
                    .and_then(|p| p.provider.clone())
            })
        });
        let config = self.config();
        config
            .provider_named(profile_provider.as_deref())
            .map(|(name, _)| name.to_string())
            .unwrap_or_else(|_| crate::config::DEFAULT_PROVIDER.to_string())
    }

    /// Resolves what a run works with, from one copy of the config.
    pub(crate) fn resolve_turn(&self, request: TurnRequest<'_>) -> Result<TurnContext, String> {
        let config = self.config();
        let profiles = self.profiles_at(request.place);
        let profile = match request.agent {
            None => None,
            Some(name) => Some(profiles.get(name).cloned().ok_or_else(|| {
                format!(
                    "no agent profile named {name:?}; available: {}",
                    profiles.names().join(", ")
                )
            })?),
        };
        let wanted = request
            .provider
            .or(profile.as_ref().and_then(|p| p.provider.as_deref()));
        let (provider_name, block) = config
            .provider_named(wanted)
            .map_err(|err| err.to_string())?;
        let mut block = block.clone();
        // A custom command's choices are the person's for their own turn: a child does not
        // inherit them with the run config.
        let choice = Some(request.choice).filter(|_| request.depth == 0);
        if let Some(model) = choice
            .and_then(|c| c.model.as_deref())
            .or(request.model)
            .or(profile.as_ref().and_then(|p| p.model.as_deref()))
        {
            block.model = model.to_string();
        }
        let provider = self
            .provider_for(provider_name, &block)
            .map_err(|err| err.to_string())?;
        let depth = request.depth;
        let mut tools = self.tools.clone();
        // The ready MCP servers' tools, narrowed below like the built-in ones.
        for tool in self.mcp.tools(request.workspace) {
            tools.register(tool);
        }
        crate::skills::offer(
            &mut tools,
            request.place,
            self.user_dir().as_deref(),
            profile.as_ref(),
        );
        if depth > 0 {
            if let Some(allowed) = &config.subagents.tools {
                tools = tools.filtered(|name| crate::mcp::listed(allowed, name));
            }
        }
        // A session at the depth limit is not offered the tool at all.
        let delegator = if depth < config.subagents.max_depth {
            self.delegator.get().cloned()
        } else {
            None
        };
        if delegator.is_none() {
            tools = tools.filtered(|name| name != "sub_agent" && name != "message_subagent");
        }
        if let Some(profile) = &profile {
            tools = tools.filtered(|name| profile.allows(name));
        }
        // Narrowed, never widened: approvals and `tools.policy` still apply to what is left.
        if let Some(only) = choice.and_then(|c| c.tools.as_ref()) {
            tools = tools.filtered(|name| crate::mcp::listed(only, name));
        }
        let policy = config.tools.policy.clone();
        // Tools switched off by policy are not offered; a call to one is refused anyway.
        let specs = tools
            .specs()
            .iter()
            .filter(|spec| crate::mcp::policy_for(&policy, &spec.name) != Some(ToolPolicy::Deny))
            .cloned()
            .map(|mut spec| {
                if spec.name == "sub_agent" {
                    spec.description.push_str(&agents_note(&profiles));
                }
                spec
            })
            .collect();
        let mut limits = Limits {
            max_steps: config.limits.max_steps,
        };
        if let Some(turns) = profile.as_ref().and_then(|p| p.max_turns) {
            limits.max_steps = turns;
        }
        Ok(TurnContext {
            provider,
            settings: ModelSettings::from(&block),
            tools,
            specs,
            policy: Arc::new(policy),
            delegator,
            secret_env: crate::tools::secret_env(&block),
            limits,
            acp: profile.as_ref().and_then(|p| p.acp.clone()),
            instructions: profile.map(|p| p.instructions).unwrap_or_default(),
            provider_name: provider_name.to_string(),
            compaction: crate::context::compaction::Policy::from_config(&config.context)
                .with_reserve_output(block.max_tokens),
            block,
        })
    }

    /// Applies a change to the config unless anything runs, checked and applied in one
    /// step: `change` runs only after the busy check, under the run gate, so whatever
    /// it does besides (the keyring of `set_api_key`) is skipped by a `busy` refusal
    /// (SPEC §6). The file is written before the change is visible, outside the config
    /// lock, and no run can start meanwhile.
    pub(crate) fn update_config(
        &self,
        change: impl FnOnce(
            &Config,
            &dyn Fn(&Config) -> Result<(), crate::error::RuntimeError>,
        ) -> Result<Config, crate::error::RuntimeError>,
        busy: impl Fn(&Config, &Config) -> Option<String>,
    ) -> Result<Config, crate::error::RuntimeError> {
        let _update = self.update_lock.lock().unwrap_or_else(|p| p.into_inner());
        let _no_new_runs = self.run_gate.write().unwrap_or_else(|p| p.into_inner());
        let current = self.config();
        // The busy rule looks at what changes (a named server may change while runs are
        // active), so it is asked about the next config: by `change` itself before any
        // side effect of its own (the keyring), and here once more before anything is saved.
        let check = |next: &Config| match busy(&current, next) {
            Some(why) => Err(crate::error::RuntimeError::Busy(why)),
            None => Ok(()),
        };
        let next = change(&current, &check)?;
        check(&next)?;
        if let Some(path) = &self.config_path {
            next.save(path)?;
        }
        let slots_changed =
            next.subagents.max_concurrent != self.read_config(|c| c.subagents.max_concurrent);
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = next.clone();
        self.checkpoints.set_limits(next.checkpoints.limits());
        // Still under the gate: the next run sees the new config and its sandbox together.
        crate::sandbox::configure(&next.tools.command);
        if slots_changed {
            // No child runs (the busy check), so the old pools hold no permit.
            self.slots.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
        Ok(next)
    }

    /// Counts a run as started; waits while a config change is being applied.
    pub(crate) fn run_started(&self) {
        let _gate = self.run_gate.read().unwrap_or_else(|p| p.into_inner());
        self.active_runs.send_modify(|count| *count += 1);
    }

    pub(crate) fn run_ended(&self) {
        self.active_runs
            .send_modify(|count| *count = count.saturating_sub(1));
    }

    pub(crate) fn active_runs(&self) -> usize {
        *self.active_runs.borrow()
    }

    pub(crate) fn watch_runs(&self) -> watch::Receiver<usize> {
        self.active_runs.subscribe()
    }

    /// The slot pool of children at `depth` (1 for a top-level session's children).
    pub(crate) fn slots(&self, depth: usize) -> Arc<Semaphore> {
        let mut pools = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let max = self.read_config(|c| c.subagents.max_concurrent);
        while pools.len() < depth.max(1) {
            pools.push(Arc::new(Semaphore::new(max)));
        }
        pools[depth.max(1) - 1].clone()
    }

    /// The request slots of a model server that takes a known number of requests at once
    /// (`max_concurrent` in its block, else what the server says: llama.cpp's
    /// `total_slots`). `None`: no limit of the server's own.
    pub(crate) async fn request_slots(
        &self,
        name: &str,
    ) -> Option<Arc<crate::slots::RequestSlots>> {
        let block = self.read_config(|config| {
            config
                .provider_named(Some(name))
                .ok()
                .map(|(_, block)| block.clone())
        })?;
        let max = match block.max_concurrent {
            Some(max) => max,
            None => self.discovered_slots(name, &block).await?,
        };
        let mut pools = self
            .provider_slots
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let entry = pools
            .entry(name.to_string())
            .or_insert_with(|| crate::slots::RequestSlots::new(max));
        if entry.total() != max.max(1) && entry.idle() {
            // A server's block may change while runs are active (the busy rule lets named
            // servers change): the new count takes over once no request holds or waits
            // for a slot of the old one, so the server never gets more than either count.
            *entry = crate::slots::RequestSlots::new(max);
        }
        Some(entry.clone())
    }

    /// The slot count a provider's server reported, asked once per provider and block.
    async fn discovered_slots(&self, name: &str, block: &ProviderConfig) -> Option<usize> {
        if let Some(slots) = cached_for(&self.server_slots, name, block) {
            return slots;
        }
        let asked = block.clone();
        let slots = ask_once(
            self.data_dir.join(SLOTS_FILE),
            server_key(block),
            move || async move { crate::context::window::server_slots(&asked).await },
        )
        .await
        .map(|n| n as usize);
        if let Some(slots) = slots {
            tracing::info!(
                provider = name,
                slots,
                "the model server serves {slots} requests at once"
            );
        }
        remember(&self.server_slots, name, block, slots);
        slots
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

    pub(crate) fn forget_tree_usage(&self, session_id: &str) {
        self.tree_usage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(session_id);
    }

    /// Tokens of every stored tree, summed once at start; runs add to it as they go.
    pub(crate) fn sum_tree_usage(&self, metas: &[crate::store::SessionMeta]) {
        let parents: HashMap<&str, Option<&str>> = metas
            .iter()
            .map(|m| (m.session_id.as_str(), m.parent_session_id.as_deref()))
            .collect();
        let mut tree = self.tree_usage.lock().unwrap_or_else(|p| p.into_inner());
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

/// What the `sub_agent` tool's description adds: the profiles and what each is for.
fn agents_note(profiles: &Profiles) -> String {
    let mut note = String::from("\nProfiles for `agent`:");
    for profile in &profiles.profiles {
        note.push_str(&format!("\n- {}: {}", profile.name, profile.description));
    }
    note
}

/// Raises the soft limit of open files to the hard limit, once per process: a desktop
/// session with many sub-agents must not die with EMFILE at the usual 1,024.
pub fn raise_open_file_limit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(unix)]
        // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
        unsafe {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0
                && limit.rlim_cur < limit.rlim_max
            {
                let wanted = libc::rlimit {
                    rlim_cur: limit.rlim_max.min(1 << 20),
                    rlim_max: limit.rlim_max,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) != 0 {
                    tracing::debug!("cannot raise the open-file limit");
                }
            }
        }
    });
}
