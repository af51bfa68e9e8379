//! MCP servers (issue #15): the manager owned by the runtime's `Shared`. Servers start lazily when the first run that can use them resolves its turn, each under a supervisor (initialise with a timeout, list tools and follow `tools/list_changed`, restart after a crash with backoff, stop on shutdown); workspace `.mcp.json` servers wait for the person's trust first.

pub mod client;
pub mod config;
mod tool;
pub mod trust;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::config::ToolPolicy;
pub use crate::protocol::listed;
use crate::protocol::{McpServerInfo, McpServerState, McpToolInfo};
use crate::tools::Tool;
use client::{Endpoint, Peer, ToolInfo};
pub use config::{McpServerConfig, server_of_tool, tool_name};

/// Consecutive failed starts after which a server is left failed until restarted.
const MAX_START_FAILURES: u32 = 5;

/// Where a server is defined: the config, or a workspace's `.mcp.json`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Key {
    workspace: Option<PathBuf>,
    name: String,
}

/// What a server is doing now.
#[derive(Clone)]
enum Phase {
    Starting,
    Ready {
        peer: Peer,
        tools: Vec<ToolInfo>,
        server_info: Option<String>,
    },
    Failed {
        message: String,
        /// It was ready and then went away: the next turn restarts it at once.
        crashed: bool,
    },
    WaitingForTrust,
    Stopped,
}

#[derive(Clone)]
struct Status {
    /// Counts starts, so a waiter can tell a fresh outcome from the old one.
    generation: u64,
    phase: Phase,
}

struct Server {
    key: Key,
    config: McpServerConfig,
    /// The trust digest a workspace server was trusted with: checked again before each
    /// start, so a program a command edited never runs unasked (security review 7).
    trusted: Option<String>,
    state: watch::Sender<Status>,
    stop: CancellationToken,
    /// Wakes a supervisor that waits to retry (a turn wants it, or the person restarts it).
    kick: Notify,
    /// Asks a running server to restart (the Settings button); separate from `kick` so a
    /// stale retry wake-up never restarts a healthy server.
    restart: Notify,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The manager's [`McpSettings`], as the last `prepare` read them.
    settings: Arc<Mutex<McpSettings>>,
    /// When a turn or a call last used it: a workspace server idle for longer than
    /// `mcp.workspace_idle_stop_sec` is stopped (review R9).
    last_used: Mutex<Instant>,
    /// Calls in flight: a server is never idle during one, however long it takes.
    calls: AtomicUsize,
}

impl Server {
    fn status(&self) -> Status {
        self.state.borrow().clone()
    }

    fn set(&self, phase: Phase, new_start: bool) {
        self.state.send_modify(|status| {
            if new_start {
                status.generation += 1;
            }
            status.phase = phase;
        });
    }

    /// The live connection's peer, or why there is none (without copying the tool list:
    /// this is on every call's path).
    fn peer(&self) -> Result<Peer, Option<String>> {
        match &self.state.borrow().phase {
            Phase::Ready { peer, .. } => Ok(peer.clone()),
            Phase::Failed { message, .. } => Err(Some(message.clone())),
            _ => Err(None),
        }
    }

    fn tool_timeout(&self) -> Duration {
        self.config.tool_timeout()
    }

    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// Marks a call in flight until the guard is dropped.
    fn in_call(self: &Arc<Self>) -> CallGuard {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.touch();
        CallGuard(self.clone())
    }

    /// A workspace server whose supervisor runs and that nothing used for `idle`.
    fn idle_for(&self, idle: Duration) -> bool {
        self.key.workspace.is_some()
            && !self.task_is_none()
            // A slow start is not idleness: the turn that wants it waits for it.
            && !matches!(self.state.borrow().phase, Phase::Starting)
            && self.calls.load(Ordering::SeqCst) == 0
            && self
                .last_used
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .elapsed()
                >= idle
    }
}

/// See [`Server::in_call`].
struct CallGuard(Arc<Server>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.calls.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What `prepare` reads from the config (only when there are servers at all).
#[derive(Debug, Clone, Default)]
pub struct McpSettings {
    /// Our environment variables a stdio server does not inherit (the providers' keys).
    pub hidden_env: Vec<String>,
    /// `tools.policy`: no workspace server may take a tool name one of its entries covers.
    pub policy: BTreeMap<String, ToolPolicy>,
    /// `mcp.workspace_env`: the variables a workspace `.mcp.json` may read.
    pub workspace_env: Vec<String>,
    /// `mcp.workspace_idle_stop_sec`.
    pub idle_stop: Duration,
}

type Servers = Arc<Mutex<BTreeMap<Key, Arc<Server>>>>;

fn lock_servers(servers: &Servers) -> std::sync::MutexGuard<'_, BTreeMap<Key, Arc<Server>>> {
    servers.lock().unwrap_or_else(|p| p.into_inner())
}

/// Stops the workspace servers nothing used for `idle`; the next turn in their
/// workspace starts them again (its `prepare` finds no entry and makes one).
fn reap_idle(servers: &Servers, idle: Duration) {
    let mut servers = lock_servers(servers);
    let idle_keys: Vec<Key> = servers
        .iter()
        .filter(|(_, server)| server.idle_for(idle))
        .map(|(key, _)| key.clone())
        .collect();
    for key in idle_keys {
        if let Some(server) = servers.remove(&key) {
            tracing::info!(server = %key.name, workspace = ?key.workspace, "MCP server idle; stopping it");
            server.stop.cancel();
        }
    }
}

/// Every MCP server of the runtime.
pub struct McpManager {
    data_dir: PathBuf,
    servers: Servers,
    root: CancellationToken,
    /// Refreshed by every `prepare` that has servers.
    settings: Arc<Mutex<McpSettings>>,
    /// Stops idle workspace servers; started with the first workspace server.
    reaper: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Per workspace, the trust digest the last listing showed: a trust answer is for
    /// that content, even if the file was swapped between the listing and the click.
    shown: Mutex<BTreeMap<PathBuf, String>>,
}

impl McpManager {
    pub fn new(data_dir: PathBuf, root: CancellationToken) -> Self {
        McpManager {
            data_dir,
            servers: Arc::default(),
            root,
            settings: Arc::default(),
            reaper: Mutex::new(None),
            shown: Mutex::new(BTreeMap::new()),
        }
    }

    fn servers(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, Arc<Server>>> {
        lock_servers(&self.servers)
    }

    /// Starts the reaper of idle workspace servers unless it runs already.
    fn ensure_reaper(&self) {
        let mut reaper = self.reaper.lock().unwrap_or_else(|p| p.into_inner());
        if reaper.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        let servers = self.servers.clone();
        let settings = self.settings.clone();
        let root = self.root.clone();
        *reaper = Some(tokio::spawn(async move {
            loop {
                let idle = settings.lock().unwrap_or_else(|p| p.into_inner()).idle_stop;
                // Stops within a quarter of the idle time of its end; never a busy loop.
                let tick = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(30));
                tokio::select! {
                    _ = tokio::time::sleep(tick) => {}
                    _ = root.cancelled() => return,
                }
                reap_idle(&servers, idle);
            }
        }));
    }

    /// The servers a workspace's sessions use, with the config each runs with: the
    /// config's, then the workspace's `.mcp.json` (a config entry wins over a workspace
    /// one of the same name). `None` for the workspace file's servers means "not trusted".
    fn wanted(
        &self,
        configured: &BTreeMap<String, McpServerConfig>,
        workspace: &Path,
    ) -> Vec<(Key, Option<McpServerConfig>, Option<String>)> {
        let policy = self.policy();
        let mut wanted: Vec<(Key, Option<McpServerConfig>, Option<String>)> = configured
            .iter()
            .filter(|(_, c)| c.enabled())
            .map(|(name, c)| {
                (
                    Key {
                        workspace: None,
                        name: name.clone(),
                    },
                    Some(c.clone()),
                    None,
                )
            })
            .collect();
        if let Some(file) = config::workspace_file(workspace) {
            match &file.servers {
                Ok(servers) => {
                    let decision = trust::decision(&self.data_dir, workspace, &file.sha256);
                    let trusted = decision == Some(true);
                    for (name, server) in servers {
                        // Refused once: not asked again until the file changes.
                        if configured.contains_key(name)
                            || !server.enabled()
                            || decision == Some(false)
                        {
                            continue;
                        }
                        if let Some(reason) = name_refused(name, configured, &policy) {
                            tracing::warn!("{}: {reason}", file.path.display());
                            continue;
                        }
                        let key = Key {
                            workspace: Some(workspace.to_path_buf()),
                            name: name.clone(),
                        };
                        wanted.push((
                            key,
                            trusted.then(|| server.clone()),
                            trusted.then(|| file.sha256.clone()),
                        ));
                    }
                }
                Err(err) => tracing::warn!("{err}"),
            }
        }
        wanted
    }

    /// Starts what a run in `workspace` may use and waits (up to each server's start-up
    /// timeout, or until `cancel`) for those still starting, so a first turn sees their
    /// tools. With no server configured and no `.mcp.json` it returns at once. Returns the
    /// workspace servers that wait for the person's trust.
    /// `hidden_env` names the variables stdio servers must not inherit (asked only when
    /// there are servers).
    pub async fn prepare(
        &self,
        configured: &BTreeMap<String, McpServerConfig>,
        workspace: &Path,
        cancel: &CancellationToken,
        settings: impl FnOnce() -> McpSettings,
    ) -> Vec<String> {
        if configured.is_empty() && !workspace.join(".mcp.json").exists() {
            return Vec::new();
        }
        *self.settings.lock().unwrap_or_else(|p| p.into_inner()) = settings();
        let wanted = self.wanted(configured, workspace);
        let untrusted: Vec<String> = wanted
            .iter()
            .filter(|(key, config, _)| key.workspace.is_some() && config.is_none())
            .map(|(key, _, _)| key.name.clone())
            .collect();
        let mut waits = Vec::new();
        {
            let mut servers = self.servers();
            // Servers of this scope that are no longer wanted (removed, disabled) stop.
            let scope_keys: Vec<Key> = servers
                .keys()
                .filter(|k| k.workspace.is_none() || k.workspace.as_deref() == Some(workspace))
                .cloned()
                .collect();
            for key in scope_keys {
                if !wanted.iter().any(|(k, _, _)| *k == key) {
                    if let Some(old) = servers.remove(&key) {
                        old.stop.cancel();
                    }
                }
            }
            for (key, config, trusted) in wanted {
                let existing = servers.get(&key).cloned();
                let server = match (existing, config) {
                    (Some(server), None) if server.task_is_none() => server,
                    (Some(server), Some(config))
                        if server.config == config && server.trusted == trusted =>
                    {
                        server
                    }
                    (old, config) => {
                        if let Some(old) = old {
                            old.stop.cancel();
                        }
                        let server = self.spawn(key.clone(), config, trusted);
                        servers.insert(key, server.clone());
                        server
                    }
                };
                // This turn uses it: the idle clock starts again.
                server.touch();
                if key_is_workspace(&server.key) {
                    self.ensure_reaper();
                }
                let status = server.status();
                match status.phase {
                    Phase::Failed { crashed: true, .. } => {
                        server.kick.notify_one();
                        waits.push((server.clone(), status.generation, true));
                    }
                    Phase::Starting => waits.push((server.clone(), status.generation, false)),
                    _ => {}
                }
            }
        }
        let waiting = waits
            .into_iter()
            .map(|(server, generation, kicked)| async move {
                let mut state = server.state.subscribe();
                let timeout = server.config.startup_timeout() + Duration::from_millis(500);
                let settled = state.wait_for(|status| {
                    let fresh = !kicked || status.generation > generation;
                    fresh && !matches!(status.phase, Phase::Starting)
                });
                let _ = tokio::time::timeout(timeout, settled).await;
            });
        tokio::select! {
            _ = futures::future::join_all(waiting) => {}
            _ = cancel.cancelled() => {}
        }
        untrusted
    }

    /// A server entry and its supervisor (`None` config: waiting for trust, no process).
    fn spawn(
        &self,
        key: Key,
        config: Option<McpServerConfig>,
        trusted: Option<String>,
    ) -> Arc<Server> {
        let waiting = config.is_none();
        let server = Arc::new(Server {
            key,
            config: config.unwrap_or_default(),
            trusted,
            state: watch::channel(Status {
                generation: 0,
                phase: if waiting {
                    Phase::WaitingForTrust
                } else {
                    Phase::Starting
                },
            })
            .0,
            stop: self.root.child_token(),
            kick: Notify::new(),
            restart: Notify::new(),
            task: Mutex::new(None),
            settings: self.settings.clone(),
            last_used: Mutex::new(Instant::now()),
            calls: AtomicUsize::new(0),
        });
        if !waiting {
            let handle = tokio::spawn(supervise(server.clone()));
            *server.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
        }
        server
    }

    /// The tools of the ready servers a run in `workspace` uses.
    pub fn tools(&self, workspace: &Path) -> Vec<Arc<dyn Tool>> {
        let policy = self.policy();
        let servers = self.servers();
        let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
        let mut names = std::collections::HashSet::new();
        for server in servers.values() {
            if server
                .key
                .workspace
                .as_deref()
                .is_some_and(|w| w != workspace)
            {
                continue;
            }
            let Phase::Ready { tools: listed, .. } = server.status().phase else {
                continue;
            };
            server.touch();
            for info in listed {
                let name = tool_name(&server.key.name, &info.name);
                // Config servers come first (their keys sort first), so a workspace
                // server never takes a config server's tool name; nor one the person's
                // policy names (security review 12).
                if server.key.workspace.is_some() && policy_for(&policy, &name).is_some() {
                    tracing::warn!(server = %server.key.name, "the workspace tool {name} is left out: tools.policy names it");
                    continue;
                }
                if !names.insert(name.clone()) {
                    tracing::warn!(server = %server.key.name, tool = %info.name, "two MCP tools share the name {name}; the second is left out");
                    continue;
                }
                tools.push(Arc::new(tool::McpTool::new(name, server.clone(), info)));
            }
        }
        tools
    }

    /// Every known server of the config and of `workspace`, with its state.
    pub fn list(
        &self,
        configured: &BTreeMap<String, McpServerConfig>,
        workspace: Option<&Path>,
    ) -> Vec<McpServerInfo> {
        let policy = self.policy();
        let settings = self
            .settings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let servers = self.servers();
        let mut out = Vec::new();
        let describe = |key: Key, config: &McpServerConfig, enabled: bool| {
            let key_workspace = key.workspace.clone();
            let status = servers.get(&key).map(|s| s.status());
            let (state, error, tools, server_info) = match status.map(|s| s.phase) {
                _ if !enabled => (McpServerState::Disabled, None, Vec::new(), None),
                None => (McpServerState::NotStarted, None, Vec::new(), None),
                Some(Phase::Starting) => (McpServerState::Starting, None, Vec::new(), None),
                Some(Phase::Ready {
                    tools, server_info, ..
                }) => (McpServerState::Ready, None, tools, server_info),
                Some(Phase::Failed { message, .. }) => {
                    (McpServerState::Failed, Some(message), Vec::new(), None)
                }
                Some(Phase::WaitingForTrust) => {
                    (McpServerState::WaitingForTrust, None, Vec::new(), None)
                }
                Some(Phase::Stopped) => (McpServerState::NotStarted, None, Vec::new(), None),
            };
            McpServerInfo {
                tools: tools
                    .iter()
                    .map(|t| McpToolInfo {
                        name: t.name.clone(),
                        full_name: tool_name(&key.name, &t.name),
                        description: t.description.clone(),
                        read_only_hint: t.read_only_hint,
                    })
                    .collect(),
                name: key.name,
                workspace: key.workspace.map(|w| w.display().to_string()),
                transport: if config.url.is_some() || config.kind.as_deref() == Some("http") {
                    "http".into()
                } else {
                    "stdio".into()
                },
                enabled,
                state,
                error,
                server_info,
                launch: Some(launch_of(config, key_workspace.as_deref(), &settings)),
                trust_sha256: None,
            }
        };
        for (name, config) in configured {
            let key = Key {
                workspace: None,
                name: name.clone(),
            };
            out.push(describe(key, config, config.enabled()));
        }
        if let Some(workspace) = workspace {
            if let Some(file) = config::workspace_file(workspace) {
                let trusted = trust::decision(&self.data_dir, workspace, &file.sha256);
                self.shown
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(workspace.to_path_buf(), file.sha256.clone());
                match file.servers {
                    Ok(listed) => {
                        for (name, config) in listed {
                            if configured.contains_key(&name) {
                                continue;
                            }
                            let refused = name_refused(&name, configured, &policy);
                            let files = file.programs.get(&name).cloned().unwrap_or_default();
                            let key = Key {
                                workspace: Some(workspace.to_path_buf()),
                                name,
                            };
                            let enabled = config.enabled() && trusted != Some(false);
                            let known = servers.contains_key(&key);
                            let mut info = describe(key, &config, enabled);
                            if !known && trusted.is_none() && enabled {
                                info.state = McpServerState::WaitingForTrust;
                            }
                            if let Some(reason) = refused {
                                info.state = McpServerState::Failed;
                                info.error = Some(reason);
                            }
                            if let Some(launch) = info.launch.as_mut() {
                                launch.program_files = files
                                    .into_iter()
                                    .map(|f| crate::protocol::McpProgramFile {
                                        path: f.path.display().to_string(),
                                        sha256: f.sha256,
                                    })
                                    .collect();
                            }
                            info.trust_sha256 = Some(file.sha256.clone());
                            out.push(info);
                        }
                    }
                    Err(message) => out.push(McpServerInfo {
                        name: ".mcp.json".into(),
                        workspace: Some(workspace.display().to_string()),
                        transport: String::new(),
                        enabled: false,
                        state: McpServerState::Failed,
                        error: Some(message),
                        tools: Vec::new(),
                        server_info: None,
                        launch: None,
                        trust_sha256: Some(file.sha256.clone()),
                    }),
                }
            }
        }
        out
    }

    /// Restarts a server now (the Settings button): it starts over, failures forgotten.
    pub fn restart(&self, name: &str, workspace: Option<&Path>) -> bool {
        let servers = self.servers();
        let key = Key {
            workspace: workspace.map(Path::to_path_buf),
            name: name.to_string(),
        };
        let Some(server) = servers.get(&key) else {
            return false;
        };
        match server.status().phase {
            Phase::Ready { .. } => server.restart.notify_one(),
            Phase::Failed { .. } => server.kick.notify_one(),
            // Starting already, or waiting for trust (nothing to restart).
            _ => {}
        }
        true
    }

    /// Stops a config server now (it was disabled); a later turn starts it if enabled again.
    pub fn stop(&self, name: &str) {
        let key = Key {
            workspace: None,
            name: name.to_string(),
        };
        if let Some(server) = self.servers().remove(&key) {
            server.stop.cancel();
        }
    }

    /// Records the person's answer about a workspace's `.mcp.json` (as it is now); its
    /// servers start at the next turn when allowed.
    pub fn trust(&self, workspace: &Path, allow: bool) -> Result<(), String> {
        let file = config::workspace_file(workspace)
            .ok_or_else(|| format!("{} has no .mcp.json", workspace.display()))?;
        // What the person was shown, not what the file holds now: a file swapped after
        // the listing does not match the answer, so it is asked about again.
        let shown = self
            .shown
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(workspace)
            .cloned()
            .unwrap_or(file.sha256);
        trust::record(&self.data_dir, workspace, &shown, allow)?;
        // Every entry of the workspace is rebuilt by the next prepare, from the answer;
        // the running ones stop now (review R9: a removed entry that kept its process
        // was listed, restarted and shut down by nobody).
        let mut servers = self.servers();
        let keys: Vec<Key> = servers
            .keys()
            .filter(|key| key.workspace.as_deref() == Some(workspace))
            .cloned()
            .collect();
        for key in keys {
            if let Some(server) = servers.remove(&key) {
                server.stop.cancel();
            }
        }
        Ok(())
    }

    /// Stops every server (and what each started) and waits for their supervisors.
    pub async fn shutdown(&self) {
        let servers: Vec<Arc<Server>> =
            std::mem::take(&mut *self.servers()).into_values().collect();
        for server in &servers {
            server.stop.cancel();
        }
        let handles: Vec<_> = servers
            .iter()
            .filter_map(|server| server.task.lock().unwrap_or_else(|p| p.into_inner()).take())
            .collect();
        stop_all(handles).await;
    }
}

/// How long a stopping supervisor may take (closing its connection waits up to 2 s for
/// the server to go) before it is aborted, which kills its process group all the same.
/// Under the 5 s in which the app, `run` and `serve` exit after a stop request.
const SUPERVISOR_STOP: Duration = Duration::from_secs(3);

/// Waits for supervisors that were told to stop, together, up to [`SUPERVISOR_STOP`];
/// the ones still running then are aborted (a stop must never wait on a server).
async fn stop_all(mut handles: Vec<tokio::task::JoinHandle<()>>) {
    let all = futures::future::join_all(handles.iter_mut());
    if tokio::time::timeout(SUPERVISOR_STOP, all).await.is_err() {
        for handle in &handles {
            if !handle.is_finished() {
                tracing::warn!("an MCP supervisor did not stop in time; aborting it");
                handle.abort();
            }
        }
        // Aborted tasks end at their next poll; their connections' Drop kills the servers.
        let _ = futures::future::join_all(handles).await;
    }
}

impl McpManager {
    fn policy(&self) -> BTreeMap<String, ToolPolicy> {
        self.settings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .policy
            .clone()
    }
}

/// Why a workspace server may not run under this name, if it may not (security review
/// 12): its tools would be named like a config server's (`docs.` and `docs` are both
/// `mcp__docs__*`), or like tools the person's `tools.policy` decides for.
fn name_refused(
    name: &str,
    configured: &BTreeMap<String, McpServerConfig>,
    policy: &BTreeMap<String, ToolPolicy>,
) -> Option<String> {
    let sanitised = config::sanitise(name);
    if let Some(other) = configured
        .keys()
        .find(|other| config::sanitise(other) == sanitised)
    {
        return Some(format!(
            "the workspace server {name:?} is not started: its tools would be named like those of your config's server {other:?} (mcp__{sanitised}); rename it in .mcp.json"
        ));
    }
    if let Some(entry) = policy
        .keys()
        .find(|entry| server_of_tool(entry) == Some(sanitised.as_str()))
    {
        return Some(format!(
            "the workspace server {name:?} is not started: your tools.policy entry {entry:?} is for tools of that name; rename it in .mcp.json, or move it to your config's mcp_servers"
        ));
    }
    None
}

/// How an entry starts, for the person (see [`crate::protocol::McpLaunch`]).
fn launch_of(
    server: &McpServerConfig,
    workspace: Option<&Path>,
    settings: &McpSettings,
) -> crate::protocol::McpLaunch {
    let show = |values: &BTreeMap<String, String>| -> Vec<String> {
        values
            .iter()
            .map(|(name, value)| {
                if config::literal(value) {
                    name.clone()
                } else {
                    format!("{name}={value}")
                }
            })
            .collect()
    };
    let mut notes = Vec::new();
    if let Some(workspace) = workspace {
        if server.allow_read_only.is_some() {
            notes.push(
                "allow_read_only is ignored in a workspace .mcp.json: every call asks".into(),
            );
        }
        for (name, value) in server.env.iter().chain(&server.headers) {
            if let Some(reason) = config::workspace_value_refused(
                name,
                value,
                &settings.workspace_env,
                &settings.hidden_env,
            ) {
                notes.push(format!("it will not start: {reason}"));
            }
        }
        if server.url.is_none() {
            notes.push(format!(
                "it runs outside the sandbox in {}, with files a command there can change",
                server
                    .cwd
                    .as_ref()
                    .map_or(workspace.to_path_buf(), |cwd| workspace.join(cwd))
                    .display()
            ));
        }
    }
    crate::protocol::McpLaunch {
        command: server.command.iter().chain(&server.args).cloned().collect(),
        cwd: server.cwd.clone(),
        url: server.url.clone(),
        env: show(&server.env),
        headers: show(&server.headers),
        program_files: Vec::new(),
        notes,
    }
}

/// Whether `workspace`'s `.mcp.json` (with its program files) still has this trust
/// digest; the error says that it changed.
pub fn check_trust_digest(workspace: &str, sha256: &str) -> Result<(), String> {
    let path = Path::new(workspace);
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let now = config::workspace_file(&path).map(|file| file.sha256);
    if now.as_deref() == Some(sha256) {
        Ok(())
    } else {
        Err(format!(
            "{}'s .mcp.json or a program it runs changed since it was shown; look at it again",
            path.display()
        ))
    }
}

fn key_is_workspace(key: &Key) -> bool {
    key.workspace.is_some()
}

impl Server {
    fn task_is_none(&self) -> bool {
        self.task
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }
}

/// The policy of an MCP tool: its own `tools.policy` entry, else its server's
/// (`mcp__<server>`). Any other tool: its own entry.
pub fn policy_for(policy: &BTreeMap<String, ToolPolicy>, tool: &str) -> Option<ToolPolicy> {
    policy.get(tool).copied().or_else(|| {
        server_of_tool(tool).and_then(|server| policy.get(&format!("mcp__{server}")).copied())
    })
}

/// What `prepare` needs from the config (see [`McpSettings`]).
pub fn settings(config: &crate::config::Config) -> McpSettings {
    McpSettings {
        hidden_env: provider_keys(config),
        policy: config.tools.policy.clone(),
        workspace_env: config.mcp.workspace_env.clone(),
        idle_stop: config.mcp.workspace_idle_stop(),
    }
}

/// The variables that hold the configured providers' keys (and the usual ones): stdio
/// servers do not inherit them.
fn provider_keys(config: &crate::config::Config) -> Vec<String> {
    let mut names = crate::tools::secret_env(&config.provider);
    for block in config.providers.values() {
        for name in crate::tools::secret_env(block) {
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names
}

/// Fills in `${VAR}` and `keyring:` references of a server's env and headers. A
/// workspace server (the repository's entry, security review 8) gets no keyring entry,
/// only the variables `mcp.workspace_env` lists (never a provider's key), and inherits
/// only the basic environment commands get, not every secret the app was started with.
async fn endpoint(server: &Server) -> Result<Endpoint, String> {
    let workspace = server.key.workspace.clone();
    let base = workspace
        .clone()
        .unwrap_or_else(|| std::env::current_dir().unwrap_or_default());
    let settings = server
        .settings
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let rules = workspace.is_some().then_some(&settings);
    Ok(match server.config.transport(&base)? {
        config::Transport::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            let own = resolve(env, rules).await?;
            let (env, clear_env) = match rules {
                None => (own, false),
                Some(rules) => {
                    let mut inherited: Vec<(String, String)> = std::env::vars()
                        .filter(|(name, _)| {
                            (crate::sandbox::BASE_ENV.contains(&name.as_str())
                                || name.starts_with("LC_")
                                || rules.workspace_env.contains(name))
                                && !rules.hidden_env.contains(name)
                        })
                        .collect();
                    inherited.extend(own);
                    (inherited, true)
                }
            };
            Endpoint::Stdio {
                command,
                args,
                env,
                // A workspace's server runs in the workspace (as other clients run
                // project servers), so its relative paths are the ones trusted.
                cwd: cwd.or(workspace),
                // A config entry's own `env` may still pass one on by name
                // (`${OPENAI_API_KEY}`).
                remove_env: settings.hidden_env.clone(),
                clear_env,
            }
        }
        config::Transport::Http { url, headers } => Endpoint::Http {
            url,
            headers: resolve(headers, rules).await?,
        },
    })
}

/// `values` with their references filled in; `rules` for a workspace server's entry.
async fn resolve(
    values: BTreeMap<String, String>,
    rules: Option<&McpSettings>,
) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (name, value) in values {
        if let Some(rules) = rules {
            if let Some(reason) = config::workspace_value_refused(
                &name,
                &value,
                &rules.workspace_env,
                &rules.hidden_env,
            ) {
                return Err(reason);
            }
        }
        let filled = match config::secret_ref(&value) {
            config::SecretRef::Keyring(entry) => crate::providers::read_secret(entry)
                .await
                .map_err(|err| format!("{name}: {err}"))?,
            config::SecretRef::Text(text) => {
                config::expand_env(text, |var| std::env::var(var).ok())
                    .map_err(|err| format!("{name}: {err}"))?
            }
        };
        out.push((name, filled));
    }
    Ok(out)
}

/// A tool-list refresh after `tools/list_changed`, bounded by the start-up timeout.
type Refresh = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = Result<
                    Result<Vec<ToolInfo>, client::ClientError>,
                    tokio::time::error::Elapsed,
                >,
            > + Send,
    >,
>;

/// Serves a ready server until it stops (`None`), exits (`Some(false)`) or is asked to
/// restart (`Some(true)`). A `tools/list_changed` refresh runs beside the other events,
/// never inside one of them (review R6): a server that announces a change and then does
/// not answer `tools/list` must not keep stop, restart or its own exit from being seen.
async fn serve_ready(
    server: &Server,
    connection: &client::Connection,
    peer: &Peer,
    server_info: &Option<String>,
    changed: &mut mpsc::UnboundedReceiver<()>,
) -> Option<bool> {
    let name = &server.key.name;
    let mut refresh: Option<Refresh> = None;
    // A change announced while a refresh is in flight: that answer may predate it, so
    // one more refresh follows.
    let mut again = false;
    let start_refresh = || -> Refresh {
        let peer = peer.clone();
        let limit = server.config.startup_timeout();
        Box::pin(async move { tokio::time::timeout(limit, peer.list_tools()).await })
    };
    loop {
        tokio::select! {
            _ = server.stop.cancelled() => return None,
            _ = connection.closed() => return Some(false),
            _ = server.restart.notified() => {
                tracing::info!(server = %name, "MCP server restarting (asked)");
                return Some(true);
            }
            Some(()) = changed.recv() => {
                if refresh.is_some() {
                    again = true;
                } else {
                    refresh = Some(start_refresh());
                }
            }
            listed = async {
                match refresh.as_mut() {
                    Some(pending) => pending.await,
                    None => std::future::pending().await,
                }
            } => {
                refresh = again.then(start_refresh);
                again = false;
                match listed {
                    Ok(Ok(tools)) => {
                        tracing::info!(server = %name, tools = tools.len(), "MCP tools changed");
                        server.set(
                            Phase::Ready {
                                peer: peer.clone(),
                                tools,
                                server_info: server_info.clone(),
                            },
                            false,
                        );
                    }
                    // The old list stays: calls may still work, and a crash is still seen.
                    Ok(Err(err)) => {
                        tracing::warn!(server = %name, "listing changed tools failed: {err}")
                    }
                    Err(_) => tracing::warn!(
                        server = %name,
                        "listing changed tools timed out; keeping the old list"
                    ),
                }
            }
        }
    }
}

/// A workspace server's `.mcp.json` and program files are as they were trusted (checked
/// before every start: a crash, a restart, a command that edited its script).
fn still_trusted(server: &Server) -> bool {
    match (&server.key.workspace, &server.trusted) {
        (Some(workspace), Some(trusted)) => {
            config::workspace_file(workspace).is_some_and(|file| file.sha256 == *trusted)
        }
        _ => true,
    }
}

/// Runs one server for as long as it is wanted: start, serve, restart after a crash.
async fn supervise(server: Arc<Server>) {
    let name = server.key.name.clone();
    let mut failures: u32 = 0;
    loop {
        if !still_trusted(&server) {
            tracing::warn!(server = %name, "the .mcp.json or a program it runs changed since it was trusted; asking again");
            server.set(Phase::WaitingForTrust, true);
            return;
        }
        server.set(Phase::Starting, true);
        let (changed_tx, mut changed) = mpsc::unbounded_channel();
        let started = async {
            let endpoint = endpoint(&server).await?;
            client::connect(&name, endpoint, server.config.startup_timeout(), changed_tx)
                .await
                .map_err(|e| e.to_string())
        };
        let connection = tokio::select! {
            c = started => c,
            _ = server.stop.cancelled() => {
                server.set(Phase::Stopped, false);
                return;
            }
        };
        let crashed = match connection {
            Err(message) => {
                failures += 1;
                tracing::warn!(server = %name, "MCP server failed to start: {message}");
                server.set(
                    Phase::Failed {
                        message,
                        crashed: false,
                    },
                    false,
                );
                false
            }
            Ok(connection) => {
                let peer = connection.peer();
                let server_info = connection.server_info();
                // Bounded, and cancellable by stop: a server that never answers its first
                // `tools/list` must not hold up a shutdown for the start-up timeout.
                let listed = tokio::select! {
                    listed = tokio::time::timeout(server.config.startup_timeout(), peer.list_tools()) => listed,
                    _ = server.stop.cancelled() => {
                        connection.close().await;
                        server.set(Phase::Stopped, false);
                        return;
                    }
                };
                match listed {
                    Ok(Ok(tools)) => {
                        failures = 0;
                        tracing::info!(server = %name, tools = tools.len(), "MCP server ready");
                        server.set(
                            Phase::Ready {
                                peer: peer.clone(),
                                tools,
                                server_info: server_info.clone(),
                            },
                            false,
                        );
                        let restarted =
                            serve_ready(&server, &connection, &peer, &server_info, &mut changed)
                                .await;
                        let Some(restarted) = restarted else {
                            connection.close().await;
                            server.set(Phase::Stopped, false);
                            return;
                        };
                        if restarted {
                            connection.close().await;
                            // Straight back to the top: a fresh start, no backoff.
                            continue;
                        }
                        drop(connection);
                        tracing::warn!(server = %name, "MCP server exited; it restarts");
                        server.set(
                            Phase::Failed {
                                message: "the server exited; restarting".into(),
                                crashed: true,
                            },
                            false,
                        );
                        true
                    }
                    Ok(Err(err)) => {
                        failures += 1;
                        connection.close().await;
                        server.set(
                            Phase::Failed {
                                message: format!("listing tools failed: {err}"),
                                crashed: false,
                            },
                            false,
                        );
                        false
                    }
                    Err(_) => {
                        failures += 1;
                        connection.close().await;
                        server.set(
                            Phase::Failed {
                                message: "listing tools timed out".into(),
                                crashed: false,
                            },
                            false,
                        );
                        false
                    }
                }
            }
        };
        // Backoff: at once after a crash of a server that was working, then 0.5 s, 1 s,
        // 2 s, … for repeated failed starts; after MAX_START_FAILURES only a kick (a
        // restart) tries again.
        let delay = if crashed {
            Duration::from_millis(200)
        } else {
            Duration::from_millis(500 * 2u64.pow(failures.saturating_sub(1).min(6)))
        };
        if failures >= MAX_START_FAILURES {
            if let Phase::Failed { message, .. } = server.status().phase {
                server.set(
                    Phase::Failed {
                        message: format!(
                            "{message} (gave up after {failures} tries; restart it to try again)"
                        ),
                        crashed: false,
                    },
                    false,
                );
            }
            tokio::select! {
                _ = server.kick.notified() => failures = 0,
                _ = server.stop.cancelled() => { server.set(Phase::Stopped, false); return; }
            }
        } else {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = server.kick.notified() => {}
                _ = server.stop.cancelled() => { server.set(Phase::Stopped, false); return; }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tools_own_policy_wins_over_its_servers() {
        let policy: BTreeMap<String, ToolPolicy> = [
            ("mcp__srv".to_string(), ToolPolicy::Allow),
            ("mcp__srv__drop".to_string(), ToolPolicy::Deny),
            ("read_file".to_string(), ToolPolicy::Ask),
        ]
        .into();
        assert_eq!(
            policy_for(&policy, "mcp__srv__echo"),
            Some(ToolPolicy::Allow)
        );
        assert_eq!(
            policy_for(&policy, "mcp__srv__drop"),
            Some(ToolPolicy::Deny)
        );
        assert_eq!(policy_for(&policy, "mcp__other__echo"), None);
        assert_eq!(policy_for(&policy, "read_file"), Some(ToolPolicy::Ask));
        // `mcp__srv` never covers a built-in tool or another server with that prefix.
        assert_eq!(policy_for(&policy, "mcp__srvx__echo"), None);
    }

    #[test]
    fn profiles_name_a_whole_server_or_one_tool() {
        let list = vec![
            "read_file".to_string(),
            "mcp__docs".to_string(),
            "mcp__git__log".to_string(),
        ];
        assert!(listed(&list, "mcp__docs__search"));
        assert!(listed(&list, "mcp__git__log"));
        assert!(!listed(&list, "mcp__git__push"));
        assert!(listed(&list, "read_file"));
        assert!(!listed(&list, "write_file"));
    }
}
