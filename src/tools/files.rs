//! The file tools of the core: `read_file` and `write_file`, confined by the path policy and asking approval for changes.

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::paths::{Resolved, resolve};
use super::{ApprovalAsk, Tool, ToolContext, ToolError, parse_args};

/// Biggest read returned whole; the rest is cut with a visible marker.
const READ_CAP: usize = 256 * 1024;

pub struct ReadFile;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    path: String,
    /// First line to return, 1-based.
    #[serde(default)]
    start_line: Option<usize>,
    /// Last line to return, inclusive.
    #[serde(default)]
    end_line: Option<usize>,
}

/// Paths outside the workspace are never read or written without the person's yes.
async fn ask_if_outside(
    ctx: &ToolContext,
    tool: &str,
    resolved: &Resolved,
    arguments: &Value,
) -> Result<(), ToolError> {
    if resolved.inside {
        return Ok(());
    }
    ctx.ask(ApprovalAsk {
        tool: tool.to_string(),
        arguments: arguments.clone(),
        diff: None,
        rememberable: false,
    })
    .await
}

#[async_trait]
impl Tool for ReadFile {
    fn name(&self) -> &'static str {
        "read_file"
    }

    fn description(&self) -> &'static str {
        "Read a text file. Paths are relative to the workspace. Optionally give start_line/end_line (1-based, inclusive)."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the workspace"},
                "start_line": {"type": "integer", "minimum": 1},
                "end_line": {"type": "integer", "minimum": 1}
            },
            "required": ["path"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<String, ToolError> {
        let args: ReadArgs = parse_args(arguments.clone())?;
        let resolved = resolve(&ctx.workspace, &args.path)?;
        ask_if_outside(ctx, self.name(), &resolved, &arguments).await?;
        let bytes = tokio::fs::read(&resolved.real)
            .await
            .map_err(|err| ToolError::Failed(format!("cannot read {}: {err}", resolved.display)))?;
        if bytes.iter().take(8192).any(|b| *b == 0) {
            return Err(ToolError::Failed(format!(
                "{} is a binary file ({} bytes); read_file only reads text",
                resolved.display,
                bytes.len()
            )));
        }
        let text = String::from_utf8_lossy(&bytes);
        let text = match (args.start_line, args.end_line) {
            (None, None) => text.into_owned(),
            (start, end) => {
                let start = start.unwrap_or(1).max(1);
                let end = end.unwrap_or(usize::MAX);
                if end < start {
                    return Err(ToolError::InvalidArguments(format!(
                        "end_line {end} is before start_line {start}"
                    )));
                }
                text.lines()
                    .skip(start - 1)
                    .take(end - start + 1)
                    .collect::<Vec<_>>()
                    .join("\n")
            }
        };
        Ok(cap(text, READ_CAP))
    }
}

/// Cuts text at a char boundary below `limit` bytes and says so.
pub fn cap(mut text: String, limit: usize) -> String {
    if text.len() <= limit {
        return text;
    }
    let total = text.len();
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(&format!(
        "\n[truncated: showing {end} of {total} bytes; read a line range to see more]"
    ));
    text
}

pub struct WriteFile;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    path: String,
    content: String,
}

/// A unified diff of a planned change, for the approval dialog.
pub fn unified_diff(path: &str, old: &str, new: &str) -> String {
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{path}"), &format!("b/{path}"))
        .to_string()
}

#[async_trait]
impl Tool for WriteFile {
    fn name(&self) -> &'static str {
        "write_file"
    }

    fn description(&self) -> &'static str {
        "Create or overwrite a file with the given content. Asks the person for approval first."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the workspace"},
                "content": {"type": "string", "description": "The whole new content of the file"}
            },
            "required": ["path", "content"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<String, ToolError> {
        let args: WriteArgs = parse_args(arguments.clone())?;
        let resolved = resolve(&ctx.workspace, &args.path)?;
        let old = tokio::fs::read_to_string(&resolved.real)
            .await
            .unwrap_or_default();
        ctx.ask(ApprovalAsk {
            tool: self.name().to_string(),
            arguments,
            diff: Some(unified_diff(&resolved.display, &old, &args.content)),
            rememberable: resolved.inside,
        })
        .await?;
        if let Some(parent) = resolved.real.parent() {
            tokio::fs::create_dir_all(parent).await.map_err(|err| {
                ToolError::Failed(format!("cannot create {}: {err}", parent.display()))
            })?;
        }
        tokio::fs::write(&resolved.real, args.content.as_bytes())
            .await
            .map_err(|err| {
                ToolError::Failed(format!("cannot write {}: {err}", resolved.display))
            })?;
        Ok(format!(
            "Wrote {} bytes to {}",
            args.content.len(),
            resolved.display
        ))
    }
}
