//! The Settings page's commands (SPEC §6, §10): config changes (a merge patch, an API key, an MCP server turned on or off or trusted), the provider test, the app's info, and a session's own settings (title, archived, model, agent profile).
//!
//! Every config change goes through [`Shared::update_config`]: refused with `busy` while a
//! run or a sub-agent task exists, and then nothing is changed; only the named model
//! servers may change meanwhile (see [`busy`]).
//! [`crate::service::RuntimeService`] calls these.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::Config;
use crate::error::RuntimeError;
use crate::protocol::{AppInfo, McpServerInfo, SessionInfo, commands};
use crate::registry::Registry;
use crate::runtime::Shared;

/// How long a provider test waits for its one-token answer (a cold local model may
/// need to load first).
const PROVIDER_TEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// Why a config change must wait, if anything runs (SPEC §6). A change confined to the
/// named model servers (the `providers` table: a server added, edited or removed) goes
/// through meanwhile (D15): each run holds the provider its turn context resolved at its
/// start, a server's request slots take a new count only once idle, and the next turn
/// resolves the new figures. Everything else (the default server, tools, sandbox, slots
/// of sub-agents, MCP) waits until nothing runs.
fn busy(shared: &Shared, current: &Config, next: &Config) -> Option<String> {
    let runs = shared.active_runs();
    let tasks = shared.subagents.len();
    if runs == 0 && tasks == 0 || only_named_servers_differ(current, next) {
        return None;
    }
    Some(format!(
        "{runs} run(s) and {tasks} sub-agent task(s) are active; stop them before changing the config (named model servers can be added or edited meanwhile)"
    ))
}

/// Whether two configs differ in nothing but their `providers` table.
fn only_named_servers_differ(current: &Config, next: &Config) -> bool {
    let without_servers = |config: &Config| {
        let mut value = serde_json::to_value(config).unwrap_or_default();
        if let Some(map) = value.as_object_mut() {
            map.remove("providers");
        }
        value
    };
    without_servers(current) == without_servers(next)
}

/// Applies a merge patch to the config. Fails with `busy` while anything runs, and
/// then changes nothing (SPEC §6).
pub(crate) fn update_config(
    shared: &Shared,
    patch: &serde_json::Value,
) -> Result<Config, RuntimeError> {
    shared.update_config(
        |config, _| Ok(config.patched(patch)?),
        |current, next| busy(shared, current, next),
    )
}

/// Stores an API key in the OS keyring and points the provider at it. The key is
/// never written to the config, a session or a log. `provider` names the block
/// (`None`: the lone `provider` block); a named provider's entry defaults to its name,
/// so two servers of one kind keep two keys.
///
/// The keyring is written inside the config change, after its busy check and under
/// its run gate: a `busy` refusal leaves the keyring as it was (SPEC §6; review R14).
/// Off the async threads: the keyring may take seconds to answer.
pub(crate) async fn set_api_key(
    registry: Arc<Registry>,
    key: &str,
    entry: Option<String>,
    provider: Option<&str>,
) -> Result<Config, RuntimeError> {
    if key.trim().is_empty() {
        return Err(RuntimeError::InvalidArgument("the API key is empty".into()));
    }
    let key = crate::providers::ApiKey::new(key.trim());
    let provider = provider.map(str::to_string);
    tokio::task::spawn_blocking(move || {
        let shared = &registry.shared;
        shared.update_config(
            |config, busy_check| {
                // Checked before the keyring is touched: an unknown name stores nothing.
                let named = match &provider {
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
                let patch = match named {
                    Some(name) => {
                        serde_json::json!({"providers": {name: {"api_key_keyring": entry}}})
                    }
                    None => serde_json::json!({"provider": {"api_key_keyring": entry}}),
                };
                let next = config.patched(&patch)?;
                busy_check(&next)?;
                crate::providers::store_key_blocking(&entry, &key)
                    .map_err(|err| RuntimeError::Unavailable(err.to_string()))?;
                Ok(next)
            },
            |current, next| busy(shared, current, next),
        )
    })
    .await
    .map_err(|err| RuntimeError::Unavailable(err.to_string()))?
}

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

/// Sends one tiny real request (one user message, at most one token, no tools)
/// through a configured provider, built by the same factory the runs use, and says
/// how it went. Nothing is retried: the person wants the first failure's reason now,
/// not after the backoff. An unknown name is an `invalid_argument` error; anything
/// the server or the network does is a result with `ok: false`.
pub(crate) async fn test_provider(
    shared: &Shared,
    name: &str,
) -> Result<commands::ProviderTest, RuntimeError> {
    let config = shared.config();
    let (_, block) = config.provider_named(Some(name))?;
    let mut block = block.clone();
    block
        .extra
        .insert("max_retries".into(), serde_json::json!(0));
    let model = block.model.clone();
    let started = std::time::Instant::now();
    let outcome = match shared.build_provider(&block) {
        Err(err) => Err(err.to_string()),
        Ok(provider) => {
            let request = crate::provider::ModelRequest {
                messages: vec![crate::protocol::Message::user("test", "Say OK.")].into(),
                tools: Vec::new().into(),
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
                _ = shared.root.cancelled() => Err("the app is shutting down".into()),
            }
        }
    };
    let latency_ms = started.elapsed().as_millis() as u64;
    // The server's own list, even when the test failed: a "model not found" is answered
    // by choosing one it has (E19). Anthropic's list needs its key headers: not asked.
    let models = if block.kind == "anthropic" {
        Vec::new()
    } else {
        crate::probe::probe(&[(name.to_string(), block.base_url.clone())])
            .await
            .into_iter()
            .flat_map(|found| found.models)
            .collect()
    };
    Ok(match outcome {
        Ok(()) => commands::ProviderTest {
            ok: true,
            model,
            latency_ms,
            message: String::new(),
            models,
        },
        Err(message) => commands::ProviderTest {
            ok: false,
            model,
            latency_ms,
            message,
            models,
        },
    })
}

/// The MCP servers of the config and of `workspace`'s `.mcp.json`, with their state.
pub(crate) fn list_mcp_servers(shared: &Shared, workspace: Option<&str>) -> Vec<McpServerInfo> {
    let configured = shared.read_config(|c| c.mcp_servers.clone());
    let workspace = workspace.map(mcp_workspace);
    shared.mcp.list(&configured, workspace.as_deref())
}

/// Turns a configured MCP server on or off; it stops or starts with the next turn.
pub(crate) fn set_mcp_server_enabled(
    shared: &Shared,
    name: &str,
    enabled: bool,
) -> Result<Vec<McpServerInfo>, RuntimeError> {
    if !shared.read_config(|c| c.mcp_servers.contains_key(name)) {
        return Err(RuntimeError::NotFound(format!("MCP server {name:?}")));
    }
    // `null` removes the key: enabled is the default.
    let value = if enabled {
        serde_json::Value::Null
    } else {
        serde_json::Value::Bool(false)
    };
    update_config(
        shared,
        &serde_json::json!({"mcp_servers": {name: {"enabled": value}}}),
    )?;
    if !enabled {
        // Off now, not at the next turn: its process should not outlive the choice.
        shared.mcp.stop(name);
    }
    Ok(list_mcp_servers(shared, None))
}

/// Restarts an MCP server now.
pub(crate) fn restart_mcp_server(
    shared: &Shared,
    name: &str,
    workspace: Option<&str>,
) -> Result<(), RuntimeError> {
    let workspace = workspace.map(mcp_workspace);
    if shared.mcp.restart(name, workspace.as_deref()) {
        Ok(())
    } else {
        Err(RuntimeError::NotFound(format!(
            "running MCP server {name:?} (servers start with the first turn that uses them)"
        )))
    }
}

/// Records whether the person trusts `workspace`'s `.mcp.json` as it is now.
pub(crate) fn trust_mcp_workspace(
    shared: &Shared,
    workspace: &str,
    allow: bool,
) -> Result<Vec<McpServerInfo>, RuntimeError> {
    let path = mcp_workspace(workspace);
    shared
        .mcp
        .trust(&path, allow)
        .map_err(RuntimeError::InvalidArgument)?;
    Ok(list_mcp_servers(shared, Some(workspace)))
}

/// Starts what a run in `workspace` would use (its trusted `.mcp.json` servers and the
/// config's) now, as the first turn would, and answers once they are ready, failed, or
/// past their start-up timeout: "Trust and start" says when a server is ready instead of
/// leaving it to the first turn (issue 28, E13).
pub(crate) async fn start_mcp_workspace(shared: &Shared, workspace: &str) -> Vec<McpServerInfo> {
    let configured = shared.read_config(|c| c.mcp_servers.clone());
    let path = mcp_workspace(workspace);
    let cancel = shared.root.child_token();
    shared
        .mcp
        .prepare(&configured, &path, &cancel, || {
            shared.read_config(crate::mcp::settings)
        })
        .await;
    list_mcp_servers(shared, Some(workspace))
}

/// A workspace path as runs see it (resolved), for matching its `.mcp.json` servers.
fn mcp_workspace(workspace: &str) -> PathBuf {
    let path = Path::new(workspace);
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

/// Where things are and what runs, for the settings page and the status line.
pub(crate) fn app_info(shared: &Shared, leftover_worktrees: &[String]) -> AppInfo {
    AppInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        commit: crate::BUILD_COMMIT.to_string(),
        data_dir: shared.data_dir.display().to_string(),
        log_dir: crate::config::log_dir(&shared.data_dir)
            .display()
            .to_string(),
        config_path: shared.config_path.as_ref().map(|p| p.display().to_string()),
        active_runs: shared.active_runs(),
        subagent_tasks: shared.subagents.len(),
        sandbox: crate::sandbox::status(),
        provider_configured: shared
            .config_path
            .as_deref()
            .is_some_and(crate::config::provider_configured),
        leftover_worktrees: leftover_worktrees.to_vec(),
        checkpoints_off: shared.checkpoints.off().map(str::to_string),
    }
}

/// The provider and model a session's next turns use (the model picker); `None`
/// clears either. An unknown provider is refused.
pub(crate) fn set_model(
    registry: &Registry,
    session_id: &str,
    provider: Option<String>,
    model: Option<String>,
) -> Result<SessionInfo, RuntimeError> {
    if let Some(name) = &provider {
        registry.shared.config().provider_named(Some(name))?;
    }
    let controller = registry.controller(session_id)?;
    let model = model.filter(|m| !m.trim().is_empty());
    let meta = controller.edit_meta(|meta| {
        meta.provider = provider;
        meta.model = model;
    })?;
    Ok(meta.info(controller.state()))
}

/// Makes a top-level session run as a profile from its next turn (its instructions,
/// tools, provider, model and turn limit), or as none. A sub-agent's profile is its
/// parent's choice and stays.
pub(crate) fn set_agent(
    registry: &Registry,
    session_id: &str,
    agent: Option<String>,
) -> Result<SessionInfo, RuntimeError> {
    let controller = registry.controller(session_id)?;
    let meta = controller.current_meta();
    if meta.parent_session_id.is_some() {
        return Err(RuntimeError::InvalidArgument(
            "a sub-agent keeps the profile its parent gave it".into(),
        ));
    }
    let agent = agent.filter(|a| !a.trim().is_empty());
    if let Some(name) = &agent {
        let profiles = registry.shared.profiles(Path::new(&meta.workspace));
        if profiles.get(name).is_none() {
            return Err(RuntimeError::InvalidArgument(format!(
                "no agent profile named {name:?}; available: {}",
                profiles.names().join(", ")
            )));
        }
    }
    let meta = controller.edit_meta(|meta| meta.agent = agent)?;
    Ok(meta.info(controller.state()))
}

/// Renames a session (its tab and list entry).
pub(crate) fn rename(
    registry: &Registry,
    session_id: &str,
    title: &str,
) -> Result<SessionInfo, RuntimeError> {
    let title = title.trim();
    if title.is_empty() {
        return Err(RuntimeError::InvalidArgument("the title is empty".into()));
    }
    let controller = registry.controller(session_id)?;
    let meta = controller.edit_meta(|meta| meta.title = title.to_string())?;
    Ok(meta.info(controller.state()))
}

/// Archives a session (hidden from the usual list) or brings it back.
pub(crate) fn archive(
    registry: &Registry,
    session_id: &str,
    archived: bool,
) -> Result<SessionInfo, RuntimeError> {
    let controller = registry.controller(session_id)?;
    let meta = controller.edit_meta(|meta| meta.archived = archived)?;
    Ok(meta.info(controller.state()))
}
