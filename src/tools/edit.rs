//! The `edit_file` tool: replaces an exact string in a text file, failing clearly when it is absent or not unique, and asking approval with a diff.

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::files::{Current, current, current_if_inside, unified_diff};
use super::paths::{recheck, resolve, write_regular};
use super::{
    Access, ApprovalAsk, Tool, ToolContext, ToolError, blocking, blocking_change, parse_args,
};

/// How many occurrence lines a "not unique" error lists.
const LIST_LINES: usize = 10;

pub struct EditFile;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EditArgs {
    path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: bool,
}

#[async_trait]
impl Tool for EditFile {
    fn name(&self) -> &'static str {
        "edit_file"
    }

    fn changes_workspace(&self) -> bool {
        true
    }

    fn description(&self) -> &'static str {
        "Replace an exact piece of text in a file. old_string must match the file exactly \
(whitespace and line endings included) and occur exactly once, unless replace_all is true. \
Include enough surrounding lines to make it unique. The person is shown a diff and asked for approval."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the workspace"},
                "old_string": {"type": "string", "description": "The exact text to replace"},
                "new_string": {"type": "string", "description": "The text to put in its place"},
                "replace_all": {"type": "boolean", "description": "Replace every occurrence instead of exactly one", "default": false}
            },
            "required": ["path", "old_string", "new_string"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<String, ToolError> {
        let args: EditArgs = parse_args(arguments.clone())?;
        if args.old_string.is_empty() {
            return Err(ToolError::InvalidArguments(
                "old_string is empty; to create or overwrite a whole file use write_file".into(),
            ));
        }
        if args.old_string == args.new_string {
            return Err(ToolError::InvalidArguments(
                "old_string and new_string are the same; nothing would change".into(),
            ));
        }
        let resolved = resolve(&ctx.workspace, &args.path)?;
        let probe = resolved.clone();
        let before = match blocking(ctx, move |_| current_if_inside(&probe)).await? {
            Current::Text(text) => Some(text),
            // Outside the workspace nothing is read before approval: the person sees the
            // replacement itself, and the edit is checked once they said yes.
            Current::Unread => None,
            Current::Missing => return Err(missing(&resolved.display)),
            Current::Opaque(what) => return Err(opaque(&resolved.display, &what)),
        };
        let (diff, planned) = match &before {
            Some(text) => {
                let after = apply(&resolved.display, text, &args)?;
                (unified_diff(&resolved.display, text, &after), Some(after))
            }
            None => (
                format!(
                    "({}; it is not read before approval; the replacement)\n{}",
                    resolved.outside_note().unwrap_or_default(),
                    unified_diff(&resolved.display, &args.old_string, &args.new_string)
                ),
                None,
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
        let target = resolved.clone();
        let count = blocking_change(move || {
            let now = match current(&target)? {
                Current::Text(now) => now,
                Current::Missing => return Err(missing(&target.display)),
                Current::Opaque(what) => return Err(opaque(&target.display, &what)),
                // `current` always reads; only `current_if_inside` leaves things unread.
                Current::Unread => return Err(opaque(&target.display, "not readable")),
            };
            let after = match (&before, planned) {
                // The approval may have taken minutes; never overwrite a change made meanwhile.
                (Some(before), Some(after)) if *before == now => after,
                (Some(_), _) => {
                    return Err(ToolError::Failed(format!(
                        "{} changed while the edit waited for approval; read it again and redo the edit",
                        target.display
                    )));
                }
                (None, _) => apply(&target.display, &now, &args)?,
            };
            let count = if args.replace_all {
                now.matches(&args.old_string).count()
            } else {
                1
            };
            write_regular(&target, after.as_bytes())?;
            Ok(count)
        })
        .await?;
        Ok(format!(
            "Replaced {count} occurrence{} in {}",
            if count == 1 { "" } else { "s" },
            resolved.display
        ))
    }
}

fn missing(display: &str) -> ToolError {
    ToolError::Failed(format!(
        "{display} does not exist; use write_file to create it"
    ))
}

fn opaque(display: &str, what: &str) -> ToolError {
    ToolError::Failed(format!(
        "{display} is {what}; edit_file only edits UTF-8 text files"
    ))
}

/// The edited text, or an error that tells the model how to fix its call.
fn apply(display: &str, text: &str, args: &EditArgs) -> Result<String, ToolError> {
    let old = args.old_string.as_str();
    let starts: Vec<usize> = text.match_indices(old).map(|(at, _)| at).collect();
    match starts.len() {
        0 => Err(ToolError::Failed(format!(
            "old_string was not found in {display}{}",
            near_miss_hint(text, old)
        ))),
        1 => Ok(text.replacen(old, &args.new_string, 1)),
        _ if args.replace_all => Ok(text.replace(old, &args.new_string)),
        n => {
            let lines: Vec<String> = starts
                .iter()
                .take(LIST_LINES)
                .map(|at| (text[..*at].matches('\n').count() + 1).to_string())
                .collect();
            Err(ToolError::Failed(format!(
                "old_string occurs {n} times in {display} (at lines {}{}); include more surrounding text so it matches exactly once, or set replace_all to replace every occurrence",
                lines.join(", "),
                if n > LIST_LINES { ", …" } else { "" }
            )))
        }
    }
}

/// Why an exact match may have failed, when a looser one would have worked.
fn near_miss_hint(text: &str, old: &str) -> String {
    if text.contains("\r\n") && old.contains('\n') && !old.contains("\r\n") {
        let crlf = old.replace('\n', "\r\n");
        if text.contains(&crlf) {
            return "; the file uses CRLF (\\r\\n) line endings: use them in old_string".into();
        }
    }
    let trimmed = old.trim();
    if !trimmed.is_empty() && trimmed != old && text.contains(trimmed) {
        return "; it matches when leading/trailing whitespace is removed: copy the exact text"
            .into();
    }
    let squash = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    if squash(text).contains(&squash(old)) {
        return "; a match differs only in whitespace or indentation: copy the exact text from read_file".into();
    }
    "; read the file again and copy the exact text".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(old: &str, new: &str, all: bool) -> EditArgs {
        EditArgs {
            path: "f".into(),
            old_string: old.into(),
            new_string: new.into(),
            replace_all: all,
        }
    }

    #[test]
    fn replaces_once_or_all_and_explains_misses() {
        assert_eq!(
            apply("f", "a b a", &args("b", "c", false)).unwrap(),
            "a c a"
        );
        let err = apply("f", "a\nb\na", &args("a", "c", false)).unwrap_err();
        assert!(err.to_string().contains("occurs 2 times"), "{err}");
        assert!(err.to_string().contains("lines 1, 3"), "{err}");
        assert_eq!(apply("f", "a b a", &args("a", "c", true)).unwrap(), "c b c");
        let err = apply("f", "x\r\ny\r\n", &args("x\ny", "z", false)).unwrap_err();
        assert!(err.to_string().contains("CRLF"), "{err}");
        let err = apply("f", "    indented", &args("  indented ", "z", false)).unwrap_err();
        assert!(err.to_string().contains("whitespace"), "{err}");
    }
}
