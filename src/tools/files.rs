//! The file tools `read_file` and `write_file`: confined by the path policy, reading capped text, and asking approval (with a diff) for changes.

use std::io::{BufRead, BufReader, Read};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::paths::{Resolved, open_regular, recheck, resolve, write_regular};
use super::{
    Access, ApprovalAsk, Tool, ToolContext, ToolError, blocking, blocking_change, parse_args,
};

/// Biggest read returned whole; the rest is cut with a visible marker.
pub const READ_CAP: usize = 256 * 1024;
/// Bytes sniffed for NUL to call a file binary (as git and ripgrep do).
const SNIFF: usize = 8192;
/// Biggest diff put in an approval request; a person cannot review more anyway.
const DIFF_CAP: usize = 64 * 1024;
/// Biggest current file read to build a diff.
const DIFF_SOURCE_CAP: u64 = 4 * 1024 * 1024;

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

#[async_trait]
impl Tool for ReadFile {
    fn name(&self) -> &'static str {
        "read_file"
    }

    fn description(&self) -> &'static str {
        "Read a text file. Paths are relative to the workspace. Optionally give start_line/end_line \
(1-based, inclusive) to read part of a long file. Output longer than 256 KB is cut and ends with a \
\"[truncated: ...]\" line. Binary files are refused."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the workspace"},
                "start_line": {"type": "integer", "minimum": 1, "description": "First line to read (1-based)"},
                "end_line": {"type": "integer", "minimum": 1, "description": "Last line to read (inclusive)"}
            },
            "required": ["path"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<String, ToolError> {
        let args: ReadArgs = parse_args(arguments.clone())?;
        let range = match (args.start_line, args.end_line) {
            (None, None) => None,
            (start, end) => {
                let start = start.unwrap_or(1);
                let end = end.unwrap_or(usize::MAX);
                if start == 0 || end == 0 {
                    return Err(ToolError::InvalidArguments(
                        "line numbers start at 1".into(),
                    ));
                }
                if end < start {
                    return Err(ToolError::InvalidArguments(format!(
                        "end_line {end} is before start_line {start}"
                    )));
                }
                Some((start, end))
            }
        };
        let resolved = resolve(&ctx.workspace, &args.path)?;
        ctx.ask(ApprovalAsk {
            tool: self.name().to_string(),
            arguments,
            diff: resolved.outside_note(),
            access: Access::of(&resolved, false),
        })
        .await?;
        recheck(&ctx.workspace, &args.path, &resolved)?;
        blocking(ctx, move |_| read_text(&resolved, range)).await
    }
}

/// Reads a regular text file, whole or a line range, never more than [`READ_CAP`] of it.
fn read_text(resolved: &Resolved, range: Option<(usize, usize)>) -> Result<String, ToolError> {
    let (file, len) = open_regular(resolved)?;
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    let head = reader
        .fill_buf()
        .map_err(|err| ToolError::Failed(format!("cannot read {}: {err}", resolved.display)))?;
    if head.iter().take(SNIFF).any(|b| *b == 0) {
        return Err(ToolError::Failed(format!(
            "{} looks like a binary file ({len} bytes); read_file only reads text",
            resolved.display
        )));
    }
    let failed =
        |err: std::io::Error| ToolError::Failed(format!("cannot read {}: {err}", resolved.display));
    let Some((start, end)) = range else {
        let mut bytes = Vec::new();
        reader
            .take(READ_CAP as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(failed)?;
        if bytes.is_empty() {
            return Ok("[empty file]".into());
        }
        if bytes.len() <= READ_CAP {
            return Ok(String::from_utf8_lossy(&bytes).into_owned());
        }
        // Cut at the last whole line so the model never sees half a line as if it were whole.
        bytes.truncate(READ_CAP);
        if let Some(newline) = bytes.iter().rposition(|b| *b == b'\n') {
            bytes.truncate(newline + 1);
        }
        let lines = bytes.iter().filter(|b| **b == b'\n').count();
        let shown = bytes.len();
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        text.push_str(&format!(
            "[truncated: showing lines 1-{lines} ({shown} of {len} bytes); read a line range with start_line/end_line to see more]"
        ));
        return Ok(text);
    };
    let mut out = String::new();
    let mut line = Vec::new();
    let mut number = 0usize;
    loop {
        line.clear();
        // Lines before the range are skipped without being kept, and a line in it is
        // kept only up to the cap: a multi-GB line must not fill memory (finding 8).
        let keep = if number + 1 < start { 0 } else { READ_CAP + 1 };
        let read = read_line_capped(&mut reader, &mut line, keep).map_err(failed)?;
        if read == 0 {
            break;
        }
        number += 1;
        if number < start {
            continue;
        }
        let text = String::from_utf8_lossy(&line);
        if out.is_empty() && text.len() > READ_CAP {
            // One line longer than the cap: its start, said so (never "continue at this
            // same line", which would loop).
            out.push_str(&cap(text.into_owned(), READ_CAP));
            out.push_str(&format!(
                "\n[truncated: line {number} is longer than {} KB; continue with start_line={}]",
                READ_CAP / 1024,
                number + 1
            ));
            return Ok(out);
        }
        if out.len() + text.len() > READ_CAP {
            out.push_str(&format!(
                "[truncated: showing lines {start}-{} of the range; continue with start_line={number}]",
                number - 1
            ));
            return Ok(out);
        }
        out.push_str(&text);
        if number >= end {
            break;
        }
    }
    if number < start {
        return Err(ToolError::InvalidArguments(format!(
            "start_line {start} is past the end of {}, which has {number} lines",
            resolved.display
        )));
    }
    Ok(out)
}

/// Reads one line (through its `\n`), keeping at most `keep` bytes of it in `line`.
/// Returns the bytes consumed.
fn read_line_capped(
    reader: &mut impl BufRead,
    line: &mut Vec<u8>,
    keep: usize,
) -> std::io::Result<usize> {
    let mut consumed = 0usize;
    loop {
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        };
        if buf.is_empty() {
            return Ok(consumed);
        }
        let (take, ended) = match buf.iter().position(|b| *b == b'\n') {
            Some(at) => (at + 1, true),
            None => (buf.len(), false),
        };
        let room = keep.saturating_sub(line.len());
        line.extend_from_slice(&buf[..take.min(room)]);
        reader.consume(take);
        consumed += take;
        if ended {
            return Ok(consumed);
        }
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
    text.push_str(&format!("\n[truncated: showing {end} of {total} bytes]"));
    text
}

/// The current state of a file about to be changed, for the diff.
pub(super) enum Current {
    Missing,
    Text(String),
    /// Not shown as text (binary or too big); the words say what it is.
    Opaque(String),
    /// Outside the workspace, where nothing is read before the person's yes.
    Unread,
}

/// Like [`current`], but outside the workspace only checks what kind of thing is there
/// (a stat): its content is not read before approval.
pub(super) fn current_if_inside(resolved: &Resolved) -> Result<Current, ToolError> {
    if resolved.inside {
        return current(resolved);
    }
    match std::fs::metadata(&resolved.real) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Current::Missing),
        Ok(meta) if meta.is_dir() => Err(ToolError::Failed(format!(
            "{} is a directory",
            resolved.display
        ))),
        Ok(meta) if !meta.is_file() => Err(ToolError::Failed(format!(
            "{} is not a regular file",
            resolved.display
        ))),
        _ => Ok(Current::Unread),
    }
}

/// Reads what a change would replace. Folders, pipes and devices are refused before any
/// approval is asked, so the person is never asked about a change that cannot happen.
pub(super) fn current(resolved: &Resolved) -> Result<Current, ToolError> {
    match std::fs::symlink_metadata(&resolved.real) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Current::Missing),
        _ => {}
    }
    let (file, len) = open_regular(resolved)?;
    if len > DIFF_SOURCE_CAP {
        return Ok(Current::Opaque(format!("a file of {len} bytes")));
    }
    let mut bytes = Vec::new();
    file.take(DIFF_SOURCE_CAP)
        .read_to_end(&mut bytes)
        .map_err(|err| ToolError::Failed(format!("cannot read {}: {err}", resolved.display)))?;
    if bytes.iter().take(SNIFF).any(|b| *b == 0) {
        return Ok(Current::Opaque(format!("a binary file of {len} bytes")));
    }
    match String::from_utf8(bytes) {
        Ok(text) => Ok(Current::Text(text)),
        Err(_) => Ok(Current::Opaque(format!("a non-UTF-8 file of {len} bytes"))),
    }
}

/// A unified diff of a planned change, for the approval dialog; capped.
pub fn unified_diff(path: &str, old: &str, new: &str) -> String {
    let diff = similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{path}"), &format!("b/{path}"))
        .to_string();
    cap(diff, DIFF_CAP)
}

pub struct WriteFile;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    path: String,
    content: String,
}

#[async_trait]
impl Tool for WriteFile {
    fn name(&self) -> &'static str {
        "write_file"
    }

    fn changes_workspace(&self) -> bool {
        true
    }

    fn description(&self) -> &'static str {
        "Create or overwrite a file with the given content (missing folders are created). \
The person is shown a diff and asked for approval first. To change part of a file, prefer edit_file."
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
        let probe = resolved.clone();
        let old = blocking(ctx, move |_| current_if_inside(&probe)).await?;
        let diff = match &old {
            Current::Missing => unified_diff(&resolved.display, "", &args.content),
            Current::Text(text) => unified_diff(&resolved.display, text, &args.content),
            Current::Opaque(what) => format!(
                "--- a/{0}\n+++ b/{0}\n(replaces {what} with {1} bytes of text)\n",
                resolved.display,
                args.content.len()
            ),
            Current::Unread => format!(
                "({}; its current content is not read before approval)\n{}",
                resolved.outside_note().unwrap_or_default(),
                unified_diff(&resolved.display, "", &args.content)
            ),
        };
        ctx.ask(ApprovalAsk {
            tool: self.name().to_string(),
            arguments,
            diff: Some(diff),
            access: Access::of(&resolved, true),
        })
        .await?;
        recheck(&ctx.workspace, &args.path, &resolved)?;
        let bytes = args.content.len();
        let target = resolved.clone();
        blocking_change(move || write_regular(&target, args.content.as_bytes())).await?;
        Ok(match old {
            Current::Missing => format!("Created {} ({bytes} bytes)", resolved.display),
            _ => format!("Wrote {bytes} bytes to {}", resolved.display),
        })
    }
}
