//! MCP server configuration: the `mcp_servers` config key and `<workspace>/.mcp.json` (the `mcpServers` shape people already have), secret references in `env` and `headers`, redaction, and tool naming.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

// Defined in `crate::config` (the config names it; the MCP manager reads it).
pub use crate::config::McpServerConfig;

/// The config's `mcp` block: rules for servers of workspace `.mcp.json` files, which the
/// repository (not the person) wrote.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpSettingsConfig {
    /// Seconds a workspace's servers keep running after the last turn or call that used
    /// them (default 600); they start again with the next turn there. Each visited
    /// workspace would otherwise keep a process per server until the app quits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workspace_idle_stop_sec: Option<f64>,
    /// The only environment variables a workspace `.mcp.json` may read with `${VAR}`
    /// (never a provider's key, even when listed). A repository's file must not be able
    /// to hand the person's secrets to a program or URL it chose.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub workspace_env: Vec<String>,
}

impl McpSettingsConfig {
    pub fn is_default(&self) -> bool {
        *self == McpSettingsConfig::default()
    }

    pub fn workspace_idle_stop(&self) -> Duration {
        seconds(self.workspace_idle_stop_sec, 600.0)
    }
}

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

/// The variable names a value reads with `${VAR}`.
pub fn env_refs(value: &str) -> Vec<&str> {
    let mut names = Vec::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            break;
        };
        names.push(&after[..end]);
        rest = &after[end + 1..];
    }
    names
}

/// Why a workspace `.mcp.json` value may not be used, if it may not (security review 8):
/// the repository wrote it, so it gets no keyring entry, no provider key, and only the
/// variables the person listed in `mcp.workspace_env`.
pub fn workspace_value_refused(
    name: &str,
    value: &str,
    allowed: &[String],
    hidden: &[String],
) -> Option<String> {
    if let SecretRef::Keyring(_) = secret_ref(value) {
        return Some(format!(
            "{name}: keyring: is not allowed in a workspace .mcp.json (only in your config's mcp_servers)"
        ));
    }
    env_refs(value).into_iter().find_map(|var| {
        if hidden.iter().any(|h| h == var) {
            Some(format!(
                "{name}: a workspace .mcp.json may not read ${{{var}}} (a provider's key)"
            ))
        } else if !allowed.iter().any(|a| a == var) {
            Some(format!(
                "{name}: a workspace .mcp.json may read ${{{var}}} only if your config lists it in mcp.workspace_env"
            ))
        } else {
            None
        }
    })
}

/// Whether a value holds a literal (not a reference): those are hidden in `get_config`.
pub fn literal(value: &str) -> bool {
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

/// The `.mcp.json` of a workspace: its servers, and what the person's trust covers.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkspaceFile {
    pub path: PathBuf,
    /// The trust digest (security review 6, 7): the file's bytes and, per server, the
    /// digest of every program file inside the workspace it runs ([`program_files`]).
    /// A command may edit a trusted server's script; that changes this digest, so the
    /// person is asked again before the new code runs.
    pub sha256: String,
    pub servers: Result<BTreeMap<String, McpServerConfig>, String>,
    /// Per server: the workspace files it runs, with their digests.
    pub programs: BTreeMap<String, Vec<ProgramFile>>,
}

/// A file inside the workspace that a stdio server runs (its command, or an argument
/// that names a file: `python3 srv.py`).
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramFile {
    pub path: PathBuf,
    pub sha256: String,
}

fn hex_sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The files inside `workspace` a workspace server runs: its command and the arguments
/// that are files there, resolved from its working folder (the workspace unless `cwd`
/// says otherwise). Links are followed, and only targets inside the workspace count:
/// what lies outside is not the repository's to change.
pub fn program_files(workspace: &Path, server: &McpServerConfig) -> Vec<ProgramFile> {
    let Ok(Transport::Stdio {
        command, args, cwd, ..
    }) = server.transport(workspace)
    else {
        return Vec::new();
    };
    let Ok(root) = workspace.canonicalize() else {
        return Vec::new();
    };
    let base = cwd.unwrap_or_else(|| workspace.to_path_buf());
    let mut files: Vec<ProgramFile> = Vec::new();
    for part in std::iter::once(&command).chain(&args) {
        // `--flag=x` and bare words like `stdio` are not files; `node` is on PATH.
        if part.starts_with('-') || part.is_empty() {
            continue;
        }
        let Ok(path) = base.join(part).canonicalize() else {
            continue;
        };
        if !path.starts_with(&root) || !path.is_file() || files.iter().any(|f| f.path == path) {
            continue;
        }
        // An unreadable file is recorded as such: becoming readable changes the digest.
        let sha256 = std::fs::read(&path)
            .map(|bytes| hex_sha256(&bytes))
            .unwrap_or_else(|_| "unreadable".into());
        files.push(ProgramFile { path, sha256 });
    }
    files
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
    let servers = serde_json::from_slice::<McpJson>(&bytes)
        .map_err(|err| format!("{} does not parse: {err}", path.display()))
        .and_then(|file| {
            validate(&file.mcp_servers).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(file.mcp_servers)
        });
    let programs: BTreeMap<String, Vec<ProgramFile>> = match &servers {
        Ok(servers) => servers
            .iter()
            .map(|(name, server)| (name.clone(), program_files(workspace, server)))
            .collect(),
        Err(_) => BTreeMap::new(),
    };
    let mut covered = bytes.clone();
    for (name, files) in &programs {
        for file in files {
            covered.extend_from_slice(
                format!("\0{name}\0{}\0{}", file.path.display(), file.sha256).as_bytes(),
            );
        }
    }
    Some(WorkspaceFile {
        path,
        sha256: hex_sha256(&covered),
        servers,
        programs,
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
