//! The read-only `grep` tool: a regex search over the workspace with ripgrep's crates (`ignore` walk honouring `.gitignore`, `grep-searcher`, `grep-regex`), binary files skipped.

use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use globset::{GlobBuilder, GlobMatcher};
use grep_regex::RegexMatcherBuilder;
use grep_searcher::sinks::Lossy;
use grep_searcher::{BinaryDetection, SearcherBuilder};
use serde::Deserialize;
use serde_json::{Value, json};

use super::list::{label, unless_moved, walker};
use super::paths::{Resolved, open_regular, recheck, resolve};
use super::{Access, ApprovalAsk, Tool, ToolContext, ToolError, blocking, parse_args};

/// Matches returned by default, and at most.
const DEFAULT_MATCHES: usize = 200;
const MAX_MATCHES: usize = 2000;
/// A matching line longer than this is cut (minified files would flood the model).
const LINE_CAP: usize = 400;

pub struct Grep;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrepArgs {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    glob: Option<String>,
    #[serde(default)]
    case_insensitive: bool,
    #[serde(default)]
    fixed_strings: bool,
    #[serde(default)]
    max_results: Option<usize>,
}

#[async_trait]
impl Tool for Grep {
    fn name(&self) -> &'static str {
        "grep"
    }

    fn description(&self) -> &'static str {
        "Search file contents with a regular expression (Rust regex syntax), like ripgrep. Searches \
`path` (a folder or one file; default the workspace root), skipping files ignored by .gitignore and \
binary files. `glob` limits the files searched (e.g. \"*.rs\", or \"src/**/*.ts\"). Returns \
\"path:line:text\" lines."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "Regular expression (or plain text with fixed_strings)"},
                "path": {"type": "string", "description": "Folder or file to search, relative to the workspace; default \".\""},
                "glob": {"type": "string", "description": "Only search files matching this glob; without \"/\" it matches file names"},
                "case_insensitive": {"type": "boolean", "default": false},
                "fixed_strings": {"type": "boolean", "description": "Treat the pattern as plain text", "default": false},
                "max_results": {"type": "integer", "minimum": 1, "maximum": MAX_MATCHES, "description": "Most matching lines to return; default 200"}
            },
            "required": ["pattern"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<String, ToolError> {
        let args: GrepArgs = parse_args(arguments.clone())?;
        if args.pattern.is_empty() {
            return Err(ToolError::InvalidArguments("the pattern is empty".into()));
        }
        let limit = args.max_results.unwrap_or(DEFAULT_MATCHES);
        if !(1..=MAX_MATCHES).contains(&limit) {
            return Err(ToolError::InvalidArguments(format!(
                "max_results must be between 1 and {MAX_MATCHES}"
            )));
        }
        let matcher = RegexMatcherBuilder::new()
            .case_insensitive(args.case_insensitive)
            .fixed_strings(args.fixed_strings)
            // Matches never span lines, as in ripgrep without --multiline.
            .line_terminator(Some(b'\n'))
            .build(&args.pattern)
            .map_err(|err| ToolError::InvalidArguments(format!("bad regular expression: {err}")))?;
        let filter = args.glob.as_deref().map(FileFilter::new).transpose()?;
        let raw = args.path.as_deref().unwrap_or(".");
        let resolved = resolve(&ctx.workspace, raw)?;
        ctx.ask(ApprovalAsk {
            tool: self.name().to_string(),
            arguments,
            diff: resolved.outside_note(),
            access: Access::of(&resolved, false),
        })
        .await?;
        recheck(&ctx.workspace, raw, &resolved)?;
        let pattern = args.pattern.clone();
        let (raw, decided) = (raw.to_string(), resolved.clone());
        let found = blocking(ctx, move |stop| {
            search(&resolved, &matcher, filter.as_ref(), limit, stop, &pattern)
        })
        .await;
        unless_moved(ctx, &raw, &decided, found)
    }
}

/// The `glob` argument: a file-name pattern, or a path pattern when it has a `/`.
struct FileFilter {
    matcher: GlobMatcher,
    by_name: bool,
}

impl FileFilter {
    fn new(pattern: &str) -> Result<Self, ToolError> {
        let pattern = pattern.trim_start_matches("./");
        let matcher = GlobBuilder::new(pattern)
            .literal_separator(true)
            .build()
            .map_err(|err| ToolError::InvalidArguments(format!("bad glob: {err}")))?
            .compile_matcher();
        Ok(FileFilter {
            matcher,
            by_name: !pattern.contains('/'),
        })
    }

    fn accepts(&self, rel: &std::path::Path) -> bool {
        if self.by_name {
            rel.file_name()
                .is_some_and(|name| self.matcher.is_match(name))
        } else {
            self.matcher.is_match(rel)
        }
    }
}

/// Most memory the searcher may use for one line (and its buffer).
const HEAP_LIMIT: usize = 8 * 1024 * 1024;

fn search(
    base: &Resolved,
    matcher: &grep_regex::RegexMatcher,
    filter: Option<&FileFilter>,
    limit: usize,
    stop: &AtomicBool,
    pattern: &str,
) -> Result<String, ToolError> {
    let mut searcher = SearcherBuilder::new()
        .binary_detection(BinaryDetection::quit(0))
        .line_number(true)
        // A multi-GB file of one line must not be held whole in memory (finding 8).
        .heap_limit(Some(HEAP_LIMIT))
        .build();
    let mut found: Vec<String> = Vec::new();
    let mut truncated = false;
    let mut unreadable = 0usize;
    let single_file = std::fs::metadata(&base.real)
        .map(|m| !m.is_dir())
        .unwrap_or(false);
    let files: Box<dyn Iterator<Item = std::path::PathBuf>> = if single_file {
        Box::new(std::iter::once(base.real.clone()))
    } else {
        Box::new(
            walker(&base.real, None, false)
                .filter_map(Result::ok)
                // Symlinks are not followed: their entries are not files, so a link to
                // something outside the workspace is never searched.
                .filter(|entry| entry.file_type().is_some_and(|k| k.is_file()))
                .map(ignore::DirEntry::into_path),
        )
    };
    for path in files {
        if stop.load(Ordering::Relaxed) {
            return Err(ToolError::Failed("cancelled".into()));
        }
        if let Some(filter) = filter {
            let rel = path.strip_prefix(&base.real).unwrap_or(&path);
            let rel = if rel.as_os_str().is_empty() {
                path.file_name().map(std::path::Path::new).unwrap_or(rel)
            } else {
                rel
            };
            if !filter.accepts(rel) {
                continue;
            }
        }
        let shown = label(base, &path);
        let file = Resolved {
            real: path.clone(),
            inside: base.inside,
            display: shown.clone(),
            root: base.root.clone(),
            hard_links: 0,
        };
        let Ok((handle, _)) = open_regular(&file) else {
            unreadable += 1;
            continue;
        };
        let result = searcher.search_file(
            matcher,
            &handle,
            Lossy(|number, line| {
                if found.len() >= limit {
                    truncated = true;
                    return Ok(false);
                }
                let mut line = line.trim_end_matches(['\n', '\r']).to_string();
                if line.len() > LINE_CAP {
                    let mut end = LINE_CAP;
                    while !line.is_char_boundary(end) {
                        end -= 1;
                    }
                    line.truncate(end);
                    line.push_str(" […]");
                }
                found.push(format!("{shown}:{number}:{line}"));
                Ok(!stop.load(Ordering::Relaxed))
            }),
        );
        if result.is_err() {
            unreadable += 1;
        }
        if truncated {
            break;
        }
    }
    if found.is_empty() {
        let mut text = format!("No matches for {pattern:?} in {}", base.display);
        if unreadable > 0 {
            text.push_str(&format!(" ({unreadable} files could not be read)"));
        }
        return Ok(text);
    }
    if truncated {
        found.push(format!(
            "[truncated: stopped after {limit} matches; narrow the pattern, path or glob]"
        ));
    }
    if unreadable > 0 {
        found.push(format!("({unreadable} files could not be read)"));
    }
    Ok(found.join("\n"))
}
