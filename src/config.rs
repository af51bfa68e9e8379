//! The configuration file (SPEC §10): its shape, defaults, loading with clear errors, merge patches and atomic saving.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ConfigError;

/// One MCP server (SPEC §10, `mcp_servers`; its checks, redaction and `.mcp.json` are in
/// `crate::mcp::config`), as an entry of `.mcp.json`'s `mcpServers`: `command`/`args`/`env`/`cwd`
/// for stdio, `type: "http"` with `url`/`headers` for streamable HTTP.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpServerConfig {
    /// `stdio` (the default when `command` is set) or `http` (also `streamable-http`).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Values may be `${VAR}` (read from our environment) or `keyring:ENTRY` (the OS
    /// keyring, service `bumblehive`) instead of the secret itself.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub env: std::collections::BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Values as in `env`: `Bearer ${TOKEN}` or `keyring:ENTRY` keep the secret out.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub headers: std::collections::BTreeMap<String, String>,
    /// `false` keeps the server off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Seconds to start and initialise (default 30).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub startup_timeout_sec: Option<f64>,
    /// Seconds one tool call may take (default 300).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_timeout_sec: Option<f64>,
    /// `true`: tools the server marks `readOnlyHint` run without asking. Off by default:
    /// the server's own annotation alone never lets a call run unasked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_read_only: Option<bool>,
}

// Unknown keys are errors: a misspelt `"tool": {"policy": {"run_command": "deny"}}` must
// not be saved and silently leave the tool on "ask" (security review, informational).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The single unnamed provider (named `default`), as configs have always had it.
    pub provider: ProviderConfig,
    /// Named providers (SPEC §11): several model servers at once.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub providers: std::collections::BTreeMap<String, ProviderConfig>,
    /// The provider top-level sessions use; `default` (the `provider` block) when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_provider: Option<String>,
    pub subagents: SubagentConfig,
    pub tools: ToolsConfig,
    /// How long histories are kept within the model's window (SPEC §11 `context.compact_at`).
    pub context: ContextConfig,
    /// MCP servers (issue #15), each as an entry of `.mcp.json`'s `mcpServers`.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub mcp_servers: std::collections::BTreeMap<String, McpServerConfig>,
    /// How the runtime treats workspace `.mcp.json` servers (idle stop, the variables
    /// they may read).
    #[serde(skip_serializing_if = "crate::mcp::config::McpSettingsConfig::is_default")]
    pub mcp: crate::mcp::config::McpSettingsConfig,
    /// The bound of each workspace's undo history (review R8).
    #[serde(skip_serializing_if = "CheckpointsConfig::is_default")]
    pub checkpoints: CheckpointsConfig,
    /// Bounds of every run (a profile's `max_turns` overrides `max_steps` for its children).
    pub limits: LimitsConfig,
}

/// `checkpoints` in the config: past `max_store_mb` (a workspace's shadow store) or
/// `max_age_days` (a record's age), the oldest undo records lose their snapshots.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointsConfig {
    pub max_store_mb: u64,
    pub max_age_days: u64,
}

impl Default for CheckpointsConfig {
    fn default() -> Self {
        CheckpointsConfig {
            max_store_mb: 1024,
            max_age_days: 30,
        }
    }
}

impl CheckpointsConfig {
    pub fn is_default(&self) -> bool {
        *self == CheckpointsConfig::default()
    }

    /// What [`crate::checkpoints::Checkpoints::set_limits`] takes.
    pub fn limits(&self) -> crate::checkpoints::StoreLimits {
        crate::checkpoints::StoreLimits {
            max_bytes: self.max_store_mb.saturating_mul(1024 * 1024),
            max_age: std::time::Duration::from_secs(self.max_age_days.saturating_mul(24 * 3600)),
        }
    }
}

/// `limits` in the config: how far one run may go on its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Model calls one run may make before it stops with an error: the step budget that
    /// ends a model going round in circles when nobody watches.
    pub max_steps: usize,
}

impl LimitsConfig {
    pub const DEFAULT_MAX_STEPS: usize = 500;
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_steps: Self::DEFAULT_MAX_STEPS,
        }
    }
}

/// When a history is compacted: at `compact_at` of the model's window (a fraction, at
/// most [`ContextConfig::MAX_COMPACT_AT`] so the summary call itself still has room).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ContextConfig {
    pub compact_at: f64,
}

impl ContextConfig {
    pub const DEFAULT_COMPACT_AT: f64 = 0.85;
    pub const MAX_COMPACT_AT: f64 = 0.95;
}

impl Default for ContextConfig {
    fn default() -> Self {
        ContextConfig {
            compact_at: Self::DEFAULT_COMPACT_AT,
        }
    }
}

/// The name of the lone `provider` block.
pub const DEFAULT_PROVIDER: &str = "default";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProviderConfig {
    /// `openai` (any Chat Completions server) or `anthropic`.
    pub kind: String,
    pub base_url: String,
    pub model: String,
    /// Name of the environment variable holding the API key; the key itself is never stored here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// How many requests this server takes at once (a local server's parallel slots):
    /// children wait for a slot of their own server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<usize>,
    /// The model's context window in tokens; when unset it is asked from the server or
    /// taken from a built-in table (`context::window::resolve`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u32>,
    /// `false` for a model that takes no images: a message's images are then left out of
    /// its requests with a note in the text. Unset: images are sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub images: Option<bool>,
    /// Extra knobs for providers (timeouts, retries); kept as given.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

impl Default for ProviderConfig {
    fn default() -> Self {
        ProviderConfig {
            kind: "openai".into(),
            base_url: "http://127.0.0.1:11434/v1".into(),
            model: "qwen2.5-coder".into(),
            api_key_env: None,
            temperature: None,
            max_tokens: None,
            max_concurrent: None,
            context_window: None,
            images: None,
            extra: serde_json::Map::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubagentConfig {
    /// How many children may run at once (the lease of SPEC §3).
    pub max_concurrent: usize,
    /// How deep delegation may go: 1 means children cannot delegate further.
    pub max_depth: usize,
    /// When set, children may only use these tools (e.g. read-only children).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
}

impl Default for SubagentConfig {
    fn default() -> Self {
        SubagentConfig {
            max_concurrent: 4,
            max_depth: 1,
            tools: None,
        }
    }
}

/// Per-tool policy: `ask`, `allow` or `deny`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolPolicy {
    Ask,
    Allow,
    Deny,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolsConfig {
    pub policy: std::collections::BTreeMap<String, ToolPolicy>,
    /// How `run_command` runs: sandbox policy, network, extra environment names, limits.
    /// SPEC §11 names it `tools.run_command` (its policy `sandbox`); the names of before,
    /// `tools.command` and `policy`, are still read (`legacy_names`).
    #[serde(rename = "run_command", alias = "command")]
    pub command: crate::sandbox::CommandSettings,
}

impl Config {
    /// Loads the config file; a missing file gives the defaults, a broken one a clear
    /// error naming the file and line (and the file is left untouched).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Config::default()),
            Err(source) => {
                return Err(ConfigError::Io {
                    path: path.display().to_string(),
                    source,
                });
            }
        };
        let config: Config = serde_json::from_str(&text).map_err(|err| ConfigError::Parse {
            path: path.display().to_string(),
            line: err.line(),
            column: err.column(),
            message: err.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// The provider block a name refers to (`None`: the default provider), with its name.
    pub fn provider_named(
        &self,
        name: Option<&str>,
    ) -> Result<(&str, &ProviderConfig), ConfigError> {
        let name = name
            .or(self.default_provider.as_deref())
            .unwrap_or(DEFAULT_PROVIDER);
        if let Some((name, block)) = self.providers.get_key_value(name) {
            return Ok((name.as_str(), block));
        }
        if name == DEFAULT_PROVIDER {
            return Ok((DEFAULT_PROVIDER, &self.provider));
        }
        let mut known: Vec<&str> = self.providers.keys().map(String::as_str).collect();
        if !self.providers.contains_key(DEFAULT_PROVIDER) {
            known.insert(0, DEFAULT_PROVIDER);
        }
        Err(ConfigError::Invalid(format!(
            "no provider named {name:?}; configured: {}",
            known.join(", ")
        )))
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        crate::mcp::config::validate(&self.mcp_servers).map_err(ConfigError::Invalid)?;
        if let Some(name) = &self.default_provider {
            self.provider_named(Some(name))?;
        }
        for (name, block) in &self.providers {
            if !matches!(block.kind.as_str(), "openai" | "anthropic") {
                return Err(ConfigError::Invalid(format!(
                    "providers.{name}.kind must be \"openai\" or \"anthropic\", not {:?}",
                    block.kind
                )));
            }
            if block.max_concurrent == Some(0) {
                return Err(ConfigError::Invalid(format!(
                    "providers.{name}.max_concurrent must be at least 1"
                )));
            }
        }
        if self.subagents.max_concurrent == 0 {
            return Err(ConfigError::Invalid(
                "subagents.max_concurrent must be at least 1".into(),
            ));
        }
        if self.limits.max_steps == 0 {
            return Err(ConfigError::Invalid(
                "limits.max_steps must be at least 1 (model calls per run)".into(),
            ));
        }
        let compact_at = self.context.compact_at;
        if !(compact_at > 0.0 && compact_at <= ContextConfig::MAX_COMPACT_AT) {
            return Err(ConfigError::Invalid(format!(
                "context.compact_at must be a fraction of the window above 0 and at most {}, not {compact_at}",
                ContextConfig::MAX_COMPACT_AT
            )));
        }
        if !matches!(self.provider.kind.as_str(), "openai" | "anthropic") {
            return Err(ConfigError::Invalid(format!(
                "provider.kind must be \"openai\" or \"anthropic\", not {:?}",
                self.provider.kind
            )));
        }
        Ok(())
    }

    /// Applies a JSON merge patch (RFC 7396) and returns the new config, validated.
    pub fn patched(&self, patch: &Value) -> Result<Config, ConfigError> {
        let mut value =
            serde_json::to_value(self).map_err(|err| ConfigError::Invalid(err.to_string()))?;
        // A client that sends `get_config`'s answer back keeps the secrets it never saw.
        let mut patch = patch.clone();
        let keep_secrets = |block: &mut Value| {
            if let Some(block) = block.as_object_mut() {
                block.retain(|_, v| v.as_str() != Some("<redacted>"));
            }
        };
        if let Some(provider) = patch.get_mut("provider") {
            keep_secrets(provider);
        }
        if let Some(providers) = patch.get_mut("providers").and_then(Value::as_object_mut) {
            providers.values_mut().for_each(keep_secrets);
        }
        legacy_names(&mut patch);
        merge_patch(&mut value, &patch);
        let config: Config =
            serde_json::from_value(value).map_err(|err| ConfigError::Invalid(err.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Writes the config atomically (temp file + rename) so a crash never leaves half a file.
    pub fn save(&self, path: &Path) -> Result<(), ConfigError> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|err| ConfigError::Invalid(err.to_string()))?;
        let io = |source| ConfigError::Io {
            path: path.display().to_string(),
            source,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        // A config kept elsewhere through a symlink (dotfiles) is written where it really
        // is: replacing the link with a file would leave the dotfile stale.
        let target = match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                std::fs::canonicalize(path).or_else(|_| {
                    // Dangling: its target is about to be made.
                    std::fs::read_link(path)
                        .map(|link| path.parent().unwrap_or(Path::new("/")).join(link))
                })
            }
            _ => Ok(path.to_path_buf()),
        }
        .map_err(io)?;
        crate::fsutil::write_atomic(&target, text.as_bytes(), true).map_err(io)
    }

    /// The config as `get_config` shows it. Keys never live in the config, so there is
    /// nothing to redact but values that look like secrets in the provider's extra knobs;
    /// `api_key_env` and `api_key_keyring` only name where a key is found, so they show.
    pub fn redacted(&self) -> Value {
        let mut value = serde_json::to_value(self).unwrap_or(Value::Null);
        let redact = |block: &mut Value| {
            if let Some(block) = block.as_object_mut() {
                redact_object(block);
                // `https://user:sk-…@host` carries a credential in the address itself.
                if let Some(Value::String(url)) = block.get_mut("base_url") {
                    if let Some((scheme, rest)) = url.split_once("://") {
                        if let Some((_, host)) = rest.split_once('@') {
                            *url = format!("{scheme}://<redacted>@{host}");
                        }
                    }
                }
            }
        };
        if let Some(provider) = value.get_mut("provider") {
            redact(provider);
        }
        if let Some(providers) = value.get_mut("providers").and_then(Value::as_object_mut) {
            providers.values_mut().for_each(redact);
        }
        if let Some(servers) = value.get_mut("mcp_servers") {
            crate::mcp::config::redact(servers);
        }
        value
    }
}

/// Whether a key names a secret: one of its words is key, secret, token, password, …
/// (`max_tokens` is a count, not a token; `api_key_env`/`api_key_keyring` name places).
fn secret_name(key: &str) -> bool {
    let lower = key.to_ascii_lowercase();
    if lower == "api_key_env" || lower == "api_key_keyring" {
        return false;
    }
    lower.split(['_', '-', '.']).any(|word| {
        matches!(
            word,
            "key"
                | "apikey"
                | "secret"
                | "token"
                | "password"
                | "passwd"
                | "auth"
                | "authorization"
                | "credential"
                | "credentials"
                | "bearer"
                | "cookie"
        )
    })
}

fn redact_object(object: &mut serde_json::Map<String, Value>) {
    for (key, field) in object.iter_mut() {
        if secret_name(key) {
            *field = Value::String("<redacted>".into());
        } else if let Value::Object(inner) = field {
            // e.g. a `headers` block with an `Authorization` entry.
            redact_object(inner);
        }
    }
}

/// A patch written with the names of before (`tools.command`, its `policy`) says what a
/// patch with SPEC §11's names (`tools.run_command`, `sandbox`) says: renamed before it
/// is merged, so the merged config never holds both spellings.
fn legacy_names(patch: &mut Value) {
    let Some(tools) = patch.get_mut("tools").and_then(Value::as_object_mut) else {
        return;
    };
    if let Some(mut old) = tools.remove("command") {
        if let Some(block) = old.as_object_mut() {
            if let Some(policy) = block.remove("policy") {
                block.entry("sandbox").or_insert(policy);
            }
        }
        match tools.get_mut("run_command").and_then(Value::as_object_mut) {
            Some(new) => {
                if let Some(old) = old.as_object() {
                    for (key, value) in old {
                        new.entry(key.clone()).or_insert(value.clone());
                    }
                }
            }
            None => {
                tools.insert("run_command".into(), old);
            }
        }
    } else if let Some(block) = tools.get_mut("run_command").and_then(Value::as_object_mut) {
        if let Some(policy) = block.remove("policy") {
            block.entry("sandbox").or_insert(policy);
        }
    }
}

/// RFC 7396: objects merge recursively, `null` removes a key, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(target_map) = target {
        for (key, value) in patch_map {
            if value.is_null() {
                target_map.remove(key);
            } else {
                merge_patch(target_map.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// Whether the person configured a model server (a `provider` or `providers` block in the
/// file), as opposed to running on the built-in default: the first run offers set-up.
pub fn provider_configured(path: &Path) -> bool {
    std::fs::read(path)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
        .is_some_and(|value| {
            value.get("provider").is_some_and(Value::is_object)
                || value
                    .get("providers")
                    .and_then(Value::as_object)
                    .is_some_and(|p| !p.is_empty())
        })
}

/// `<config dir>/bumblehive/config.json`, unless `BUMBLEHIVE_CONFIG` names another file.
pub fn default_config_path() -> PathBuf {
    if let Some(path) = std::env::var_os("BUMBLEHIVE_CONFIG") {
        return PathBuf::from(path);
    }
    dirs::config_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("bumblehive")
        .join("config.json")
}

/// Where the app writes its log files: `<data dir>/logs`.
pub fn log_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("logs")
}

/// `<data dir>/bumblehive/`, unless `BUMBLEHIVE_DATA_DIR` names another folder.
pub fn default_data_dir() -> PathBuf {
    if let Some(path) = std::env::var_os("BUMBLEHIVE_DATA_DIR") {
        return PathBuf::from(path);
    }
    dirs::data_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("bumblehive")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Security review, informational: a config that is a symlink (dotfiles) stays one
    /// when saved; its target gets the new text.
    #[test]
    fn a_symlinked_config_is_written_through_its_link() {
        let dir = tempfile::tempdir().unwrap();
        let dotfiles = dir.path().join("dotfiles");
        std::fs::create_dir_all(&dotfiles).unwrap();
        std::fs::write(dotfiles.join("bumblehive.json"), "{}").unwrap();
        let path = dir.path().join("config.json");
        std::os::unix::fs::symlink(dotfiles.join("bumblehive.json"), &path).unwrap();
        let mut config = Config::default();
        config.limits.max_steps = 7;
        config.save(&path).unwrap();
        assert!(
            std::fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        let saved = std::fs::read_to_string(dotfiles.join("bumblehive.json")).unwrap();
        assert!(saved.contains("\"max_steps\": 7"), "{saved}");
        assert_eq!(Config::load(&path).unwrap().limits.max_steps, 7);
    }

    #[test]
    fn broken_file_names_file_and_line_and_is_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, "{\n  \"provider\": {\n    \"kind\": \n}").unwrap();
        let err = Config::load(&path).unwrap_err().to_string();
        assert!(err.contains("config.json"), "{err}");
        assert!(err.contains("line 4"), "{err}");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\n  \"provider\": {\n    \"kind\": \n}"
        );
    }

    #[test]
    fn missing_file_gives_defaults_and_patch_merges() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::load(&dir.path().join("none.json")).unwrap();
        assert_eq!(config, Config::default());
        let patched = config
            .patched(&json!({"provider": {"model": "other"}, "subagents": {"max_concurrent": 8}}))
            .unwrap();
        assert_eq!(patched.provider.model, "other");
        assert_eq!(patched.provider.kind, "openai");
        assert_eq!(patched.subagents.max_concurrent, 8);
        assert!(
            config
                .patched(&json!({"provider": {"kind": "nope"}}))
                .is_err()
        );
        patched.save(&dir.path().join("config.json")).unwrap();
        assert_eq!(
            Config::load(&dir.path().join("config.json")).unwrap(),
            patched
        );
    }

    #[test]
    fn context_window_and_compact_at_are_read_and_checked() {
        let config = Config::default()
            .patched(
                &json!({"provider": {"context_window": 32768}, "context": {"compact_at": 0.9}}),
            )
            .unwrap();
        assert_eq!(config.provider.context_window, Some(32768));
        assert!(config.provider.extra.get("context_window").is_none());
        assert_eq!(config.context.compact_at, 0.9);
        assert_eq!(Config::default().context.compact_at, 0.85);
        for bad in [0.0, 0.96, 1.5, -0.1] {
            let err = Config::default()
                .patched(&json!({"context": {"compact_at": bad}}))
                .unwrap_err()
                .to_string();
            assert!(err.contains("context.compact_at"), "{err}");
        }
    }

    #[test]
    fn secrets_in_extra_knobs_are_redacted() {
        let config = Config::default()
            .patched(&json!({"provider": {"api_key": "sk-123", "api_key_env": "X", "api_key_keyring": "openai"}}))
            .unwrap();
        let shown = config.redacted();
        assert_eq!(shown["provider"]["api_key"], "<redacted>");
        assert_eq!(shown["provider"]["api_key_env"], "X");
        assert_eq!(shown["provider"]["api_key_keyring"], "openai");
    }

    #[test]
    fn redaction_keeps_counts_and_hides_credentials_in_urls_and_headers() {
        let config = Config::default()
            .patched(&json!({"provider": {
                "base_url": "https://user:sk-secret@host.example/v1",
                "max_tokens": 100, "max_tokens_param": "max_completion_tokens",
                "headers": {"Authorization": "Bearer sk-x", "X-Trace": "1"},
                "access_token": "t"
            }}))
            .unwrap();
        let shown = config.redacted();
        assert_eq!(shown["provider"]["max_tokens"], 100);
        assert_eq!(
            shown["provider"]["max_tokens_param"],
            "max_completion_tokens"
        );
        assert_eq!(
            shown["provider"]["base_url"],
            "https://<redacted>@host.example/v1"
        );
        assert_eq!(shown["provider"]["headers"]["Authorization"], "<redacted>");
        assert_eq!(shown["provider"]["headers"]["X-Trace"], "1");
        assert_eq!(shown["provider"]["access_token"], "<redacted>");
        assert!(!shown.to_string().contains("sk-"));
    }

    #[test]
    fn misspelt_keys_are_refused_not_saved() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, r#"{"tool": {"policy": {"run_command": "deny"}}}"#).unwrap();
        assert!(Config::load(&path).is_err());
        assert!(
            Config::default()
                .patched(&json!({"tools": {"polcy": {"run_command": "deny"}}}))
                .is_err()
        );
        assert!(
            Config::default()
                .patched(&json!({"tools": {"command": {"policy": "ask", "network": true}}}))
                .is_ok()
        );
    }

    #[test]
    fn the_command_sandbox_is_tools_run_command_sandbox_and_the_old_names_still_work() {
        use crate::sandbox::CommandPolicy;
        // SPEC §11's names, in a patch and in what is written and answered.
        let config = Config::default()
            .patched(&json!({"tools": {"run_command": {"sandbox": "ask"}}}))
            .unwrap();
        assert_eq!(config.tools.command.policy, CommandPolicy::Ask);
        let written = serde_json::to_value(&config).unwrap();
        assert_eq!(written["tools"]["run_command"]["sandbox"], "ask");
        assert!(written["tools"].get("command").is_none(), "{written}");
        // The names of before: in a later patch (merged onto the new spelling) …
        let config = config
            .patched(&json!({"tools": {"command": {"policy": "off", "network": true}}}))
            .unwrap();
        assert_eq!(config.tools.command.policy, CommandPolicy::Off);
        assert!(config.tools.command.network);
        // … and in a config file written by an earlier version.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, r#"{"tools": {"command": {"policy": "ask"}}}"#).unwrap();
        assert_eq!(
            Config::load(&path).unwrap().tools.command.policy,
            CommandPolicy::Ask
        );
        std::fs::write(&path, r#"{"tools": {"run_command": {"sandbox": "off"}}}"#).unwrap();
        assert_eq!(
            Config::load(&path).unwrap().tools.command.policy,
            CommandPolicy::Off
        );
        // A misspelt value is still an error, under either name.
        assert!(
            Config::default()
                .patched(&json!({"tools": {"run_command": {"sandbox": "sometimes"}}}))
                .is_err()
        );
    }
}
