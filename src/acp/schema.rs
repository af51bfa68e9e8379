//! The part of the ACP schema (protocol version 1, and the Subagent Sessions RFD's `subagent_update` / `session_message`) that `bumblehive acp` reads and writes: the client's params as serde types, our updates as JSON built in one place. No I/O.

use serde::Deserialize;
use serde_json::{Value, json};

pub const PROTOCOL_VERSION: u64 = 1;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeParams {
    #[serde(default)]
    pub protocol_version: u64,
    #[serde(default)]
    pub client_capabilities: ClientCapabilities,
    #[serde(default)]
    pub client_info: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientCapabilities {
    /// `{}` when the client understands child sessions (the RFD); absent or `null`: not.
    #[serde(default)]
    pub subagents: Option<Value>,
}

impl ClientCapabilities {
    pub fn subagents(&self) -> bool {
        self.subagents.as_ref().is_some_and(|v| !v.is_null())
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSessionParams {
    pub cwd: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionParams {
    pub session_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PromptParams {
    pub session_id: String,
    pub prompt: Vec<Value>,
}

/// The text of a prompt: text blocks, embedded text resources, and links to files as
/// `@path` (a workspace file's mention, expanded by the runtime) or their URI.
pub fn prompt_text(blocks: &[Value]) -> String {
    let mut parts = Vec::new();
    for block in blocks {
        let field = |key: &str| block.get(key).and_then(Value::as_str);
        match field("type") {
            Some("text") => parts.push(field("text").unwrap_or_default().to_string()),
            Some("resource_link") => {
                let uri = field("uri").unwrap_or_default();
                parts.push(
                    uri.strip_prefix("file://")
                        .map(|path| format!("@{path}"))
                        .unwrap_or_else(|| uri.to_string()),
                );
            }
            Some("resource") => {
                let resource = &block["resource"];
                if let (Some(uri), Some(text)) =
                    (resource["uri"].as_str(), resource["text"].as_str())
                {
                    parts.push(format!("{uri}:\n{text}"));
                }
            }
            _ => {}
        }
    }
    parts.join("\n")
}

/// The answer to `initialize`.
pub fn initialize_result(version: &str) -> Value {
    json!({
        "protocolVersion": PROTOCOL_VERSION,
        "agentCapabilities": {
            "loadSession": true,
            "promptCapabilities": {"image": false, "audio": false, "embeddedContext": true},
            "mcpCapabilities": {"http": false, "sse": false}
        },
        "authMethods": [],
        "agentInfo": {"name": "bumblehive", "title": "Bumblehive", "version": version}
    })
}

/// A `session/update` notification's params.
pub fn notification(session_id: &str, update: Value) -> Value {
    json!({"sessionId": session_id, "update": update})
}

pub fn agent_text(text: &str) -> Value {
    json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}})
}

/// `plan`: the model's plan (our `update_plan` call's steps), whole each time, as the
/// protocol's agent plan (entries of content, priority, status).
pub fn plan(arguments: &Value) -> Value {
    let entries: Vec<Value> = arguments["plan"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|step| {
            json!({
                "content": step["step"].as_str().unwrap_or_default(),
                // Our plan has no priorities: every step is as important as its place.
                "priority": "medium",
                "status": match step["status"].as_str() {
                    Some("in_progress") => "in_progress",
                    Some("completed") => "completed",
                    _ => "pending",
                },
            })
        })
        .collect();
    json!({"sessionUpdate": "plan", "entries": entries})
}

pub fn user_text(text: &str) -> Value {
    json!({"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": text}})
}

/// `tool_call`: the call as it starts.
pub fn tool_call(
    call_id: &str,
    title: &str,
    kind: &str,
    status: &str,
    raw_input: &Value,
    content: Vec<Value>,
    path: Option<&str>,
) -> Value {
    let mut update = json!({
        "sessionUpdate": "tool_call",
        "toolCallId": call_id,
        "title": title,
        "kind": kind,
        "status": status,
        "rawInput": raw_input,
    });
    if !content.is_empty() {
        update["content"] = Value::Array(content);
    }
    if let Some(path) = path {
        update["locations"] = json!([{"path": path}]);
    }
    update
}

/// `tool_call_update`: a call's end, its result as text.
pub fn tool_call_done(call_id: &str, failed: bool, shown: &str, raw_output: &str) -> Value {
    json!({
        "sessionUpdate": "tool_call_update",
        "toolCallId": call_id,
        "status": if failed { "failed" } else { "completed" },
        "content": [text_content(shown)],
        "rawOutput": raw_output,
    })
}

/// A tool call's text content item.
pub fn text_content(text: &str) -> Value {
    json!({"type": "content", "content": {"type": "text", "text": text}})
}

/// A tool call's diff content item (`oldText` absent: a new file or an unread one).
pub fn diff_content(path: &str, old_text: Option<&str>, new_text: &str) -> Value {
    let mut diff = json!({"type": "diff", "path": path, "newText": new_text});
    if let Some(old) = old_text {
        diff["oldText"] = Value::String(old.to_string());
    }
    diff
}

/// `session/request_permission` params.
pub fn permission_request(session_id: &str, tool_call: Value, options: Vec<Value>) -> Value {
    json!({"sessionId": session_id, "toolCall": tool_call, "options": options})
}

pub fn permission_option(id: &str, name: &str, kind: &str) -> Value {
    json!({"optionId": id, "name": name, "kind": kind})
}

/// The option a `session/request_permission` answer selected; `None` for a cancelled
/// outcome or anything unreadable.
pub fn selected_option(result: &Value) -> Option<&str> {
    let outcome = result.get("outcome")?;
    (outcome.get("outcome")?.as_str()? == "selected")
        .then(|| outcome.get("optionId")?.as_str())
        .flatten()
}

/// A child's state for `subagent_update` (the RFD's whole-object snapshot): `running`, or
/// `idle` with a stop reason.
pub fn running_state() -> Value {
    json!({"state": "running"})
}

pub fn idle_state(stop_reason: &str) -> Value {
    json!({"state": "idle", "stopReason": stop_reason})
}

/// The first `subagent_update` of a child: it announces the child on its parent, with
/// Stop offered (`session/cancel` on the child's id).
pub fn subagent_announced(child: &str, title: &str, description: Option<&str>) -> Value {
    let mut update = json!({
        "sessionUpdate": "subagent_update",
        "sessionId": child,
        "title": title,
        "state": running_state(),
        "capabilities": {"cancel": {}},
    });
    if let Some(description) = description {
        update["description"] = Value::String(description.to_string());
    }
    update
}

pub fn subagent_state(child: &str, state: Value) -> Value {
    json!({"sessionUpdate": "subagent_update", "sessionId": child, "state": state})
}

/// A message between sessions as the recipient's transcript shows it (a report).
pub fn session_message(
    message_id: &str,
    sender: Option<&str>,
    recipient: &str,
    text: &str,
) -> Value {
    let mut update = json!({
        "sessionUpdate": "session_message",
        "messageId": message_id,
        "recipientSessionId": recipient,
        "content": [{"type": "text", "text": text}],
    });
    if let Some(sender) = sender {
        update["senderSessionId"] = Value::String(sender.to_string());
    }
    update
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_blocks_become_one_message() {
        let blocks = vec![
            json!({"type": "text", "text": "look at"}),
            json!({"type": "resource_link", "name": "a", "uri": "file:///w/a.rs"}),
            json!({"type": "resource", "resource": {"uri": "file:///w/b.rs", "text": "fn b() {}"}}),
            json!({"type": "image", "data": "", "mimeType": "image/png"}),
        ];
        assert_eq!(
            prompt_text(&blocks),
            "look at\n@/w/a.rs\nfile:///w/b.rs:\nfn b() {}"
        );
    }

    #[test]
    fn only_a_selected_option_is_an_answer() {
        let selected = json!({"outcome": {"outcome": "selected", "optionId": "allow_once"}});
        assert_eq!(selected_option(&selected), Some("allow_once"));
        assert_eq!(
            selected_option(&json!({"outcome": {"outcome": "cancelled"}})),
            None
        );
        assert_eq!(selected_option(&json!({})), None);
    }

    #[test]
    fn subagents_is_advertised_by_an_object_only() {
        let caps = |v: Value| -> ClientCapabilities { serde_json::from_value(v).unwrap() };
        assert!(caps(json!({"subagents": {}})).subagents());
        assert!(!caps(json!({"subagents": null})).subagents());
        assert!(!caps(json!({})).subagents());
    }
}
