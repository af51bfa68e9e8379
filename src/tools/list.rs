//! The read-only listing tools `list_dir` and `glob`, walking with ripgrep's `ignore` crate so `.gitignore` is honoured and symlinks are never followed.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use globset::{GlobBuilder, GlobMatcher};
use serde::Deserialize;
use serde_json::{Value, json};

use super::paths::{Resolved, resolve};
use super::{Access, ApprovalAsk, Tool, ToolContext, ToolError, blocking, parse_args};

/// Most entries a listing returns; the rest are counted in a marker.
const MAX_ENTRIES: usize = 1000;
/// Deepest recursive listing.
const MAX_DEPTH: usize = 10;

/// A walker over `base` as ripgrep walks: `.gitignore` (even outside a git repository),
/// `.ignore` and git's excludes honoured unless `include_ignored`; hidden files shown,
/// `.git` itself skipped; symlinks listed but never followed, so a walk cannot leave
/// the folder it started in.
pub(super) fn walker(base: &Path, max_depth: Option<usize>, include_ignored: bool) -> ignore::Walk {
    let mut builder = ignore::WalkBuilder::new(base);
    builder
        .standard_filters(!include_ignored)
        .hidden(false)
        .require_git(false)
        .follow_links(false)
        .max_depth(max_depth)
        .filter_entry(|entry| entry.depth() == 0 || entry.file_name() != ".git")
        .sort_by_file_name(|a, b| a.cmp(b));
    builder.build()
}

/// How a walked path is shown: relative to the workspace inside it, absolute outside.
pub(super) fn label(resolved: &Resolved, path: &Path) -> String {
    match path.strip_prefix(&resolved.root) {
        Ok(rel) if resolved.inside && !rel.as_os_str().is_empty() => {
            rel.to_string_lossy().into_owned()
        }
        Ok(_) if resolved.inside => ".".into(),
        _ => path.to_string_lossy().into_owned(),
    }
}

/// Asks for a read of `resolved` (free inside the workspace) and requires a folder.
async fn authorize_dir(
    ctx: &ToolContext,
    tool: &str,
    raw: &str,
    resolved: &Resolved,
    arguments: Value,
) -> Result<(), ToolError> {
    ctx.ask(ApprovalAsk {
        tool: tool.to_string(),
        arguments,
        diff: resolved.outside_note(),
        access: Access::of(resolved, false),
    })
    .await?;
    // The walker follows a symlinked root: the folder must still be the one decided on.
    super::paths::recheck(&ctx.workspace, raw, resolved)?;
    match std::fs::metadata(&resolved.real) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(ToolError::Failed(format!(
            "{} is not a directory; use read_file to read a file",
            resolved.display
        ))),
        Err(err) => Err(ToolError::Failed(format!(
            "cannot list {}: {}",
            resolved.display,
            super::paths::io_text(&err)
        ))),
    }
}

/// The walk opens folders by their paths: one swapped for a symlink while it was walked
/// would have shown outside names, so a listing is returned only if its folder still is
/// the one decided on.
pub(super) fn unless_moved(
    ctx: &ToolContext,
    raw: &str,
    decided: &Resolved,
    listed: Result<String, ToolError>,
) -> Result<String, ToolError> {
    let listed = listed?;
    super::paths::recheck(&ctx.workspace, raw, decided).map_err(|_| {
        ToolError::Failed(format!(
            "{} changed while it was read (a folder became a symbolic link); nothing of it is shown",
            decided.display
        ))
    })?;
    Ok(listed)
}

fn stopped(stop: &AtomicBool) -> Result<(), ToolError> {
    if stop.load(Ordering::Relaxed) {
        Err(ToolError::Failed("cancelled".into()))
    } else {
        Ok(())
    }
}

pub struct ListDir;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    depth: Option<usize>,
    #[serde(default)]
    include_ignored: bool,
}

#[async_trait]
impl Tool for ListDir {
    fn name(&self) -> &'static str {
        "list_dir"
    }

    fn description(&self) -> &'static str {
        "List a folder of the workspace (default: its root). Folders end with \"/\", symlinks show \
their target, files their size. depth > 1 lists sub-folders too. Files ignored by .gitignore are \
left out unless include_ignored is true."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Folder, relative to the workspace; default \".\""},
                "depth": {"type": "integer", "minimum": 1, "maximum": MAX_DEPTH, "description": "How many levels to list; default 1"},
                "include_ignored": {"type": "boolean", "description": "Also list files ignored by .gitignore", "default": false}
            },
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<String, ToolError> {
        let args: ListArgs = parse_args(arguments.clone())?;
        let depth = args.depth.unwrap_or(1);
        if !(1..=MAX_DEPTH).contains(&depth) {
            return Err(ToolError::InvalidArguments(format!(
                "depth must be between 1 and {MAX_DEPTH}"
            )));
        }
        let raw = args.path.as_deref().unwrap_or(".");
        let resolved = resolve(&ctx.workspace, raw)?;
        authorize_dir(ctx, self.name(), raw, &resolved, arguments.clone()).await?;
        let (raw, decided) = (raw.to_string(), resolved.clone());
        let listed = blocking(ctx, move |stop| {
            let mut lines = Vec::new();
            let mut more = 0usize;
            for entry in walker(&resolved.real, Some(depth), args.include_ignored) {
                stopped(stop)?;
                let Ok(entry) = entry else { continue };
                if entry.depth() == 0 {
                    continue;
                }
                if lines.len() >= MAX_ENTRIES {
                    more += 1;
                    continue;
                }
                let name = label(&resolved, entry.path());
                let kind = entry.file_type();
                let line = if kind.is_some_and(|k| k.is_symlink()) {
                    let target = std::fs::read_link(entry.path())
                        .map(|t| t.to_string_lossy().into_owned())
                        .unwrap_or_else(|_| "?".into());
                    format!("{name} -> {target}")
                } else if kind.is_some_and(|k| k.is_dir()) {
                    format!("{name}/")
                } else {
                    let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
                    format!("{name} ({size} bytes)")
                };
                lines.push(line);
            }
            if lines.is_empty() {
                return Ok(format!("{} is empty", resolved.display));
            }
            if more > 0 {
                lines.push(format!(
                    "[truncated: {more} more entries not shown; list a sub-folder or use a smaller depth]"
                ));
            }
            Ok(lines.join("\n"))
        })
        .await;
        unless_moved(ctx, &raw, &decided, listed)
    }
}

pub struct Glob;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GlobArgs {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    include_ignored: bool,
}

/// Compiles a glob over paths relative to the searched folder; `*` stays within one
/// folder, `**` crosses folders.
pub(super) fn compile_glob(pattern: &str) -> Result<GlobMatcher, ToolError> {
    let pattern = pattern.trim_start_matches("./");
    if pattern.is_empty() {
        return Err(ToolError::InvalidArguments("the pattern is empty".into()));
    }
    if pattern.starts_with('/') || pattern.split('/').any(|part| part == "..") {
        return Err(ToolError::InvalidArguments(
            "glob patterns are matched against paths relative to `path` and cannot start with `/` or contain `..`; set `path` to search another folder".into(),
        ));
    }
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map(|glob| glob.compile_matcher())
        .map_err(|err| ToolError::InvalidArguments(format!("bad glob pattern: {err}")))
}

#[async_trait]
impl Tool for Glob {
    fn name(&self) -> &'static str {
        "glob"
    }

    fn description(&self) -> &'static str {
        "Find files by name pattern, e.g. \"**/*.rs\" or \"src/*.toml\" (relative to `path`, default \
the workspace root; `*` stays within a folder, `**` crosses folders). Files ignored by .gitignore are \
left out unless include_ignored is true. Returns matching paths, sorted, folders ending with \"/\"."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "Glob pattern, e.g. \"**/*.py\""},
                "path": {"type": "string", "description": "Folder to search, relative to the workspace; default \".\""},
                "include_ignored": {"type": "boolean", "description": "Also match files ignored by .gitignore", "default": false}
            },
            "required": ["pattern"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<String, ToolError> {
        let args: GlobArgs = parse_args(arguments.clone())?;
        let matcher = compile_glob(&args.pattern)?;
        let raw = args.path.as_deref().unwrap_or(".");
        let resolved = resolve(&ctx.workspace, raw)?;
        authorize_dir(ctx, self.name(), raw, &resolved, arguments.clone()).await?;
        let (raw, decided) = (raw.to_string(), resolved.clone());
        let listed = blocking(ctx, move |stop| {
            let mut found = Vec::new();
            let mut more = 0usize;
            for entry in walker(&resolved.real, None, args.include_ignored) {
                stopped(stop)?;
                let Ok(entry) = entry else { continue };
                if entry.depth() == 0 {
                    continue;
                }
                let Ok(rel) = entry.path().strip_prefix(&resolved.real) else {
                    continue;
                };
                if !matcher.is_match(rel) {
                    continue;
                }
                if found.len() >= MAX_ENTRIES {
                    more += 1;
                    continue;
                }
                let mut name = label(&resolved, entry.path());
                if entry.file_type().is_some_and(|k| k.is_dir()) {
                    name.push('/');
                }
                found.push(name);
            }
            if found.is_empty() {
                return Ok(format!(
                    "No files match {:?} in {}",
                    args.pattern, resolved.display
                ));
            }
            if more > 0 {
                found.push(format!(
                    "[truncated: {more} more matches not shown; use a narrower pattern or path]"
                ));
            }
            Ok(found.join("\n"))
        })
        .await;
        unless_moved(ctx, &raw, &decided, listed)
    }
}
