//! MCP servers (issue #15): the manager owned by the runtime's `Shared`. Servers start lazily when the first run that can use them resolves its turn, each under a supervisor (initialise with a timeout, list tools and follow `tools/list_changed`, restart after a crash with backoff, stop on shutdown); workspace `.mcp.json` servers wait for the person's trust first.

pub mod client;
pub mod config;
mod tool;
pub mod trust;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    state: watch::Sender<Status>,
    stop: CancellationToken,
    /// Wakes a supervisor that waits to retry (a turn wants it, or the person restarts it).
    kick: Notify,
    /// Asks a running server to restart (the Settings button); separate from `kick` so a
    /// stale retry wake-up never restarts a healthy server.
    restart: Notify,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Our environment variables a stdio server does not inherit (the providers' keys).
    hidden_env: Arc<Mutex<Vec<String>>>,
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
}

/// Every MCP server of the runtime.
pub struct McpManager {
    data_dir: PathBuf,
    servers: Mutex<BTreeMap<Key, Arc<Server>>>,
    root: CancellationToken,
    /// See [`Server::hidden_env`]; refreshed by every `prepare` that has servers.
    hidden_env: Arc<Mutex<Vec<String>>>,
}

impl McpManager {
    pub fn new(data_dir: PathBuf, root: CancellationToken) -> Self {
        McpManager {
            data_dir,
            servers: Mutex::new(BTreeMap::new()),
            root,
            hidden_env: Arc::default(),
        }
    }

    fn servers(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, Arc<Server>>> {
        self.servers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The servers a workspace's sessions use, with the config each runs with: the
    /// config's, then the workspace's `.mcp.json` (a config entry wins over a workspace
    /// one of the same name). `None` for the workspace file's servers means "not trusted".
    fn wanted(
        &self,
        configured: &BTreeMap<String, McpServerConfig>,
        workspace: &Path,
    ) -> Vec<(Key, Option<McpServerConfig>)> {
        let mut wanted: Vec<(Key, Option<McpServerConfig>)> = configured
            .iter()
            .filter(|(_, c)| c.enabled())
            .map(|(name, c)| {
                (
                    Key {
                        workspace: None,
                        name: name.clone(),
                    },
                    Some(c.clone()),
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
                        let key = Key {
                            workspace: Some(workspace.to_path_buf()),
                            name: name.clone(),
                        };
                        wanted.push((key, trusted.then(|| server.clone())));
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
        hidden_env: impl FnOnce() -> Vec<String>,
    ) -> Vec<String> {
        if configured.is_empty() && !workspace.join(".mcp.json").exists() {
            return Vec::new();
        }
        *self.hidden_env.lock().unwrap_or_else(|p| p.into_inner()) = hidden_env();
        let wanted = self.wanted(configured, workspace);
        let untrusted: Vec<String> = wanted
            .iter()
            .filter(|(key, config)| key.workspace.is_some() && config.is_none())
            .map(|(key, _)| key.name.clone())
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
                if !wanted.iter().any(|(k, _)| *k == key) {
                    if let Some(old) = servers.remove(&key) {
                        old.stop.cancel();
                    }
                }
            }
            for (key, config) in wanted {
                let existing = servers.get(&key).cloned();
                let server = match (existing, config) {
                    (Some(server), None) if server.task_is_none() => server,
                    (Some(server), Some(config)) if server.config == config => server,
                    (old, config) => {
                        if let Some(old) = old {
                            old.stop.cancel();
                        }
                        let server = self.spawn(key.clone(), config);
                        servers.insert(key, server.clone());
                        server
                    }
                };
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
    fn spawn(&self, key: Key, config: Option<McpServerConfig>) -> Arc<Server> {
        let waiting = config.is_none();
        let server = Arc::new(Server {
            key,
            config: config.unwrap_or_default(),
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
            hidden_env: self.hidden_env.clone(),
        });
        if !waiting {
            let handle = tokio::spawn(supervise(server.clone()));
            *server.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
        }
        server
    }

    /// The tools of the ready servers a run in `workspace` uses.
    pub fn tools(&self, workspace: &Path) -> Vec<Arc<dyn Tool>> {
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
            for info in listed {
                let name = tool_name(&server.key.name, &info.name);
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
        let servers = self.servers();
        let mut out = Vec::new();
        let describe = |key: Key, config: &McpServerConfig, enabled: bool| {
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
                match file.servers {
                    Ok(listed) => {
                        for (name, config) in listed {
                            if configured.contains_key(&name) {
                                continue;
                            }
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
        trust::record(&self.data_dir, workspace, &file.sha256, allow)?;
        // Entries waiting for trust are rebuilt by the next prepare.
        self.servers()
            .retain(|key, _| key.workspace.as_deref() != Some(workspace));
        Ok(())
    }

    /// Stops every server (and what each started) and waits for their supervisors.
    pub async fn shutdown(&self) {
        let servers: Vec<Arc<Server>> =
            std::mem::take(&mut *self.servers()).into_values().collect();
        for server in &servers {
            server.stop.cancel();
        }
        for server in servers {
            let handle = server.task.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(handle) = handle {
                let _ = handle.await;
            }
        }
    }
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

/// The variables that hold the configured providers' keys (and the usual ones): stdio
/// servers do not inherit them.
pub fn provider_key_env(config: &crate::config::Config) -> Vec<String> {
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

/// Fills in `${VAR}` and `keyring:` references of a server's env and headers.
async fn endpoint(server: &Server) -> Result<Endpoint, String> {
    let base = server
        .key
        .workspace
        .clone()
        .unwrap_or_else(|| std::env::current_dir().unwrap_or_default());
    let resolve = |values: BTreeMap<String, String>| async move {
        let mut out = Vec::new();
        for (name, value) in values {
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
        Ok::<_, String>(out)
    };
    Ok(match server.config.transport(&base)? {
        config::Transport::Stdio {
            command,
            args,
            env,
            cwd,
        } => Endpoint::Stdio {
            command,
            args,
            env: resolve(env).await?,
            cwd,
            // An entry's own `env` may still pass one on by name (`${OPENAI_API_KEY}`).
            remove_env: server
                .hidden_env
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        },
        config::Transport::Http { url, headers } => Endpoint::Http {
            url,
            headers: resolve(headers).await?,
        },
    })
}

/// Runs one server for as long as it is wanted: start, serve, restart after a crash.
async fn supervise(server: Arc<Server>) {
    let name = server.key.name.clone();
    let mut failures: u32 = 0;
    loop {
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
                let listed =
                    tokio::time::timeout(server.config.startup_timeout(), peer.list_tools()).await;
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
                        let mut restarted = false;
                        loop {
                            tokio::select! {
                                _ = server.stop.cancelled() => {
                                    connection.close().await;
                                    server.set(Phase::Stopped, false);
                                    return;
                                }
                                _ = connection.closed() => break,
                                _ = server.restart.notified() => {
                                    tracing::info!(server = %name, "MCP server restarting (asked)");
                                    restarted = true;
                                    break;
                                }
                                Some(()) = changed.recv() => {
                                    match peer.list_tools().await {
                                        Ok(tools) => {
                                            tracing::info!(server = %name, tools = tools.len(), "MCP tools changed");
                                            server.set(Phase::Ready { peer: peer.clone(), tools, server_info: server_info.clone() }, false);
                                        }
                                        Err(err) => tracing::warn!(server = %name, "listing changed tools failed: {err}"),
                                    }
                                }
                            }
                        }
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
