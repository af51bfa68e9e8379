//! MCP server configuration: the `mcp_servers` config key and `<workspace>/.mcp.json` (the `mcpServers` shape people already have), secret references in `env` and `headers`, redaction, and tool naming.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

// Defined in `crate::config` (the config names it; the MCP manager reads it).
pub use crate::config::McpServerConfig;

/// How a server is reached, checked.
#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    },
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

impl McpServerConfig {
    pub fn enabled(&self) -> bool {
        self.enabled != Some(false)
    }

    pub fn startup_timeout(&self) -> Duration {
        seconds(self.startup_timeout_sec, 30.0)
    }

    pub fn tool_timeout(&self) -> Duration {
        seconds(self.tool_timeout_sec, 300.0)
    }

    /// The transport, or what is wrong with the entry. `base` resolves a relative `cwd`.
    pub fn transport(&self, base: &Path) -> Result<Transport, String> {
        let kind =
            self.kind
                .as_deref()
                .unwrap_or(if self.url.is_some() { "http" } else { "stdio" });
        match kind {
            "stdio" => {
                let command = self
                    .command
                    .clone()
                    .filter(|c| !c.trim().is_empty())
                    .ok_or("a stdio server needs a \"command\"")?;
                if self.url.is_some() {
                    return Err("a stdio server takes no \"url\" (set \"type\": \"http\")".into());
                }
                Ok(Transport::Stdio {
                    command,
                    args: self.args.clone(),
                    env: self.env.clone(),
                    cwd: self.cwd.as_ref().map(|cwd| base.join(cwd)),
                })
            }
            "http" | "streamable-http" | "streamableHttp" => {
                let url = self
                    .url
                    .clone()
                    .filter(|u| u.starts_with("http://") || u.starts_with("https://"))
                    .ok_or("an http server needs a \"url\" starting with http:// or https://")?;
                if self.command.is_some() {
                    return Err("an http server takes no \"command\"".into());
                }
                Ok(Transport::Http {
                    url,
                    headers: self.headers.clone(),
                })
            }
            "sse" => Err(
                "the old SSE transport is not supported; use streamable HTTP (\"type\": \"http\")"
                    .into(),
            ),
            other => Err(format!(
                "\"type\" must be \"stdio\" or \"http\", not {other:?}"
            )),
        }
    }
}

fn seconds(value: Option<f64>, default: f64) -> Duration {
    Duration::from_secs_f64(
        value
            .filter(|s| s.is_finite() && *s > 0.0)
            .unwrap_or(default),
    )
}

/// Checks every entry of a `mcp_servers` block (the config refuses bad entries when saved).
pub fn validate(servers: &BTreeMap<String, McpServerConfig>) -> Result<(), String> {
    for (name, server) in servers {
        if sanitise(name).is_empty() {
            return Err(format!(
                "mcp_servers: {name:?} is not a usable server name (letters, digits, - and _)"
            ));
        }
        server
            .transport(Path::new("."))
            .map_err(|err| format!("mcp_servers.{name}: {err}"))?;
    }
    Ok(())
}

/// A value that names where a secret is (`${VAR}` inside it, or `keyring:ENTRY`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretRef<'a> {
    /// The whole value is the keyring entry's secret.
    Keyring(&'a str),
    /// Plain text with `${VAR}` parts to fill in (none: the value as it is).
    Text(&'a str),
}

pub fn secret_ref(value: &str) -> SecretRef<'_> {
    match value.strip_prefix("keyring:") {
        Some(entry) => SecretRef::Keyring(entry.trim()),
        None => SecretRef::Text(value),
    }
}

/// Fills `${VAR}` parts from the environment; a missing variable is an error naming it
/// (never the value).
pub fn expand_env(value: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(format!("unclosed ${{ in {value:?}"));
        };
        let name = &after[..end];
        match lookup(name) {
            Some(found) => out.push_str(&found),
            None => return Err(format!("the environment variable {name} is not set")),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Whether a value holds a literal (not a reference): those are hidden in `get_config`.
fn literal(value: &str) -> bool {
    !value.starts_with("keyring:") && !value.contains("${")
}

/// Hides literal `env` and `headers` values of a `mcp_servers` block (as JSON): they may be
/// secrets. References (`${VAR}`, `keyring:…`) only say where a secret is, so they show.
pub fn redact(servers: &mut Value) {
    let Some(servers) = servers.as_object_mut() else {
        return;
    };
    for server in servers.values_mut() {
        for key in ["env", "headers"] {
            if let Some(map) = server.get_mut(key).and_then(Value::as_object_mut) {
                for value in map.values_mut() {
                    if value.as_str().is_some_and(literal) {
                        *value = Value::String("<redacted>".into());
                    }
                }
            }
        }
        if let Some(Value::String(url)) = server.get_mut("url") {
            if let Some((scheme, rest)) = url.split_once("://") {
                if let Some((_, host)) = rest.split_once('@') {
                    *url = format!("{scheme}://<redacted>@{host}");
                }
            }
        }
    }
}

/// The `.mcp.json` of a workspace: its servers and the file's bytes (for the trust hash).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkspaceFile {
    pub path: PathBuf,
    pub sha256: String,
    pub servers: Result<BTreeMap<String, McpServerConfig>, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct McpJson {
    #[serde(default)]
    mcp_servers: BTreeMap<String, McpServerConfig>,
}

/// Reads `<workspace>/.mcp.json`; `None` when there is none (the common case costs one stat).
pub fn workspace_file(workspace: &Path) -> Option<WorkspaceFile> {
    let path = workspace.join(".mcp.json");
    let bytes = std::fs::read(&path).ok()?;
    let sha256 = {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(&bytes);
        digest.iter().map(|b| format!("{b:02x}")).collect()
    };
    let servers = serde_json::from_slice::<McpJson>(&bytes)
        .map_err(|err| format!("{} does not parse: {err}", path.display()))
        .and_then(|file| {
            validate(&file.mcp_servers).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(file.mcp_servers)
        });
    Some(WorkspaceFile {
        path,
        sha256,
        servers,
    })
}

/// What providers accept as a tool name: letters, digits, `_` and `-`, at most this long.
pub const MAX_TOOL_NAME: usize = 64;

/// A name part made of what providers accept; runs of `_` are squeezed to one so that
/// `__` only ever separates the parts of `mcp__<server>__<tool>`.
pub fn sanitise(part: &str) -> String {
    let mut out = String::new();
    for c in part.chars() {
        let c = if c.is_ascii_alphanumeric() || c == '-' {
            c
        } else {
            '_'
        };
        if c == '_' && out.ends_with('_') {
            continue;
        }
        out.push(c);
    }
    out.trim_matches('_').to_string()
}

/// `mcp__<server>__<tool>`, sanitised, cut to [`MAX_TOOL_NAME`] with a short hash of the
/// full name so that two long names stay apart.
pub fn tool_name(server: &str, tool: &str) -> String {
    let full = format!("mcp__{}__{}", sanitise(server), sanitise(tool));
    if full.len() <= MAX_TOOL_NAME {
        return full;
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{server}\0{tool}").as_bytes());
    let hash: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("{}_{hash}", &full[..MAX_TOOL_NAME - 9])
}

// The tool-naming rule is the wire's (`crate::protocol`): profiles match on it too.
pub use crate::protocol::server_of_tool;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mcp_json_shape_parses_both_transports() {
        let text = r#"{"mcpServers": {
            "files": {"command": "npx", "args": ["-y", "x"], "env": {"TOKEN": "${MY_TOKEN}"}, "cwd": "sub"},
            "remote": {"type": "http", "url": "https://example.test/mcp", "headers": {"Authorization": "Bearer ${T}"}},
            "off": {"command": "x", "enabled": false}
        }}"#;
        let file: McpJson = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}"));
        assert!(validate(&file.mcp_servers).is_ok());
        let files = &file.mcp_servers["files"];
        assert_eq!(
            files.transport(Path::new("/w")),
            Ok(Transport::Stdio {
                command: "npx".into(),
                args: vec!["-y".into(), "x".into()],
                env: [("TOKEN".to_string(), "${MY_TOKEN}".to_string())].into(),
                cwd: Some(PathBuf::from("/w/sub")),
            })
        );
        assert!(matches!(
            file.mcp_servers["remote"].transport(Path::new("/")),
            Ok(Transport::Http { .. })
        ));
        assert!(!file.mcp_servers["off"].enabled());
    }

    #[test]
    fn bad_entries_are_refused_with_the_reason() {
        let bad: BTreeMap<String, McpServerConfig> =
            serde_json::from_str(r#"{"x": {"type": "http"}}"#).unwrap_or_else(|e| panic!("{e}"));
        let err = validate(&bad).err().unwrap_or_default();
        assert!(
            err.contains("mcp_servers.x") && err.contains("url"),
            "{err}"
        );
        let typo =
            serde_json::from_str::<BTreeMap<String, McpServerConfig>>(r#"{"x": {"comand": "y"}}"#);
        assert!(typo.is_err());
    }

    #[test]
    fn env_references_expand_and_missing_ones_are_named() {
        let lookup = |name: &str| (name == "T").then(|| "s3cret".to_string());
        assert_eq!(
            expand_env("Bearer ${T}", lookup),
            Ok("Bearer s3cret".into())
        );
        let err = expand_env("${NOPE}", lookup).err().unwrap_or_default();
        assert!(err.contains("NOPE") && !err.contains("s3cret"));
        assert_eq!(secret_ref("keyring:gh"), SecretRef::Keyring("gh"));
    }

    #[test]
    fn literal_secrets_are_redacted_references_shown() {
        let mut value = serde_json::json!({"s": {
            "env": {"A": "literal-secret", "B": "${VAR}"},
            "headers": {"Authorization": "Bearer abc", "X": "keyring:entry"},
            "url": "https://user:pw@host/mcp"
        }});
        redact(&mut value);
        let text = value.to_string();
        assert!(!text.contains("literal-secret") && !text.contains("Bearer abc"));
        assert!(!text.contains("pw@"));
        assert!(text.contains("${VAR}") && text.contains("keyring:entry"));
    }

    #[test]
    fn tool_names_are_sanitised_capped_and_parsed_back() {
        assert_eq!(tool_name("everything", "echo"), "mcp__everything__echo");
        assert_eq!(tool_name("my server", "get.sum"), "mcp__my_server__get_sum");
        assert_eq!(tool_name("a__b", "c"), "mcp__a_b__c");
        let long = tool_name("server", &"x".repeat(100));
        let other = tool_name("server", &format!("{}y", "x".repeat(100)));
        assert!(long.len() <= MAX_TOOL_NAME && long != other);
        assert_eq!(server_of_tool("mcp__everything__echo"), Some("everything"));
        assert_eq!(server_of_tool("read_file"), None);
    }
}
