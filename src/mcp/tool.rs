//! An MCP server's tool as one of ours: `mcp__<server>__<tool>`, asked through the approval gate like any change, called with a timeout and cancellation, its result turned into text (truncated with a note).

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use super::Server;
use super::client::{Block, ClientError, ToolInfo};
use crate::tools::{Access, ApprovalAsk, Tool, ToolContext, ToolError};

/// Past this a result is cut, with a note saying how much was left out.
pub const RESULT_CAP: usize = 100_000;

pub struct McpTool {
    name: String,
    description: String,
    server: Arc<Server>,
    info: ToolInfo,
}

impl McpTool {
    pub(super) fn new(name: String, server: Arc<Server>, info: ToolInfo) -> Self {
        let description = format!(
            "{} (tool {:?} of the MCP server {:?})",
            info.description.trim(),
            info.name,
            server.key.name
        );
        McpTool {
            name,
            description,
            server,
            info,
        }
    }
}

#[async_trait]
impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Value {
        let mut schema = self.info.input_schema.clone();
        if schema.get("type").is_none() {
            if let Some(object) = schema.as_object_mut() {
                object.insert("type".into(), Value::String("object".into()));
            }
        }
        schema
    }

    /// A server's tool may write the workspace (a filesystem server, a code generator):
    /// undo records it like a command, unless the server marks it read-only (a claim
    /// that only saves the snapshot; it never lets the call run unasked by itself).
    fn changes_workspace(&self) -> bool {
        !self.info.read_only_hint
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<String, ToolError> {
        self.call_output(ctx, arguments)
            .await
            .map(|output| output.text)
    }

    async fn call_output(
        &self,
        ctx: &ToolContext,
        arguments: Value,
    ) -> Result<crate::tools::ToolOutput, ToolError> {
        // The server's readOnlyHint is its own claim: it lets a call run unasked only when
        // the person said so for this server (`allow_read_only` in their config; a
        // workspace `.mcp.json` cannot exempt its own server, security review 11).
        let access = if self.info.read_only_hint
            && self.server.config.allow_read_only == Some(true)
            && self.server.key.workspace.is_none()
        {
            Access::Read
        } else {
            Access::Change
        };
        ctx.ask(ApprovalAsk {
            tool: self.name.clone(),
            arguments: arguments.clone(),
            diff: None,
            access,
        })
        .await?;
        let server = &self.server.key.name;
        let peer = match self.server.peer() {
            Ok(peer) => peer,
            Err(Some(message)) => {
                return Err(ToolError::Failed(format!(
                    "the MCP server {server:?} is not running: {message}"
                )));
            }
            Err(None) => {
                return Err(ToolError::Failed(format!(
                    "the MCP server {server:?} is not running"
                )));
            }
        };
        let Value::Object(arguments) = arguments else {
            return Err(ToolError::InvalidArguments(
                "arguments must be an object".into(),
            ));
        };
        // In flight: the idle reaper leaves the server alone until the call ends.
        let _in_call = self.server.in_call();
        let timeout = self.server.tool_timeout();
        // Dropping the call (Stop, timeout) sends `notifications/cancelled` to the server.
        let result = tokio::select! {
            result = tokio::time::timeout(timeout, peer.call(&self.info.name, arguments)) => result,
            _ = ctx.cancel.cancelled() => return Err(ToolError::Failed("cancelled".into())),
        };
        let result = match result {
            Err(_) => {
                return Err(ToolError::Failed(format!(
                    "the MCP server {server:?} did not answer within {} s (the call was cancelled)",
                    timeout.as_secs_f64()
                )));
            }
            Ok(Err(ClientError::Closed)) => {
                return Err(ToolError::Failed(format!(
                    "the MCP server {server:?} exited during the call; it is restarted for the next turn"
                )));
            }
            Ok(Err(err)) => {
                return Err(ToolError::Failed(format!(
                    "the MCP server {server:?} failed the call: {err}"
                )));
            }
            Ok(Ok(result)) => result,
        };
        let mut text = String::new();
        let mut images = Vec::new();
        for block in &result.blocks {
            if !text.is_empty() {
                text.push('\n');
            }
            match block {
                Block::Text(t) => text.push_str(t),
                // Images that providers take travel beside the text (a provider whose tool
                // results are text only says so); others are named, not sent.
                Block::Image { mime_type, data } => {
                    let image = crate::protocol::ImagePart {
                        media_type: mime_type.clone(),
                        data: data.clone(),
                    };
                    let kept = images.len() < crate::protocol::ImagePart::MAX_PER_MESSAGE
                        && crate::protocol::ImagePart::check_all(std::slice::from_ref(&image))
                            .is_ok();
                    if kept {
                        text.push_str(&format!("[image {} ({mime_type})]", images.len() + 1));
                        images.push(image);
                    } else {
                        text.push_str(&format!(
                            "[image ({mime_type}, about {} bytes) not shown: not a PNG, JPEG, GIF or WebP of at most 5 MiB]",
                            data.len() / 4 * 3
                        ));
                    }
                }
                Block::Other(note) => text.push_str(note),
            }
        }
        if result.blocks.is_empty() {
            if let Some(structured) = &result.structured {
                text = structured.to_string();
            }
        }
        let text = truncate(text);
        if result.is_error {
            Err(ToolError::Failed(text))
        } else {
            Ok(crate::tools::ToolOutput { text, images })
        }
    }
}

fn truncate(mut text: String) -> String {
    if text.len() <= RESULT_CAP {
        return text;
    }
    let mut cut = RESULT_CAP;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let omitted = text.len() - cut;
    text.truncate(cut);
    text.push_str(&format!(
        "\n[truncated: {omitted} more bytes of the MCP result omitted]"
    ));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_results_are_cut_with_a_note() {
        let text = truncate("é".repeat(RESULT_CAP));
        assert!(text.len() < RESULT_CAP + 100);
        assert!(text.ends_with("bytes of the MCP result omitted]"));
        assert_eq!(truncate("short".into()), "short");
    }
}
