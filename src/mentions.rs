//! @-mentions of workspace files: the file list the composer offers (`.gitignore` honoured, fuzzy-ranked), and the expansion of `@path` in the person's message into the file's content.
//!
//! The person names the file, so its content goes into the message without an approval;
//! only regular files whose real location is inside the workspace are read, and only up
//! to a cap.

use std::path::{Path, PathBuf};

/// How many files a listing walks at most (a huge tree must not stall the composer).
const MAX_WALK: usize = 20_000;
/// The largest file a mention copies into a message.
pub const MAX_MENTION_BYTES: u64 = 64 * 1024;

/// Workspace files, best matches for `query` first (all files, by path, without one).
pub fn list_files(workspace: &Path, query: Option<&str>, limit: usize) -> Vec<String> {
    let mut files = Vec::new();
    let walker = ignore::WalkBuilder::new(workspace)
        .hidden(true)
        .follow_links(false)
        .build();
    for entry in walker.flatten().take(MAX_WALK) {
        if !entry.file_type().is_some_and(|t| t.is_file()) {
            continue;
        }
        if let Ok(relative) = entry.path().strip_prefix(workspace) {
            files.push(relative.to_string_lossy().replace('\\', "/"));
        }
    }
    let query = query.map(str::trim).filter(|q| !q.is_empty());
    match query {
        None => {
            files.sort();
            files.truncate(limit);
            files
        }
        Some(query) => {
            let mut scored: Vec<(i64, String)> = files
                .into_iter()
                .filter_map(|path| fuzzy_score(&path, query).map(|score| (score, path)))
                .collect();
            scored.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
            scored.into_iter().take(limit).map(|(_, p)| p).collect()
        }
    }
}

/// A subsequence match of `query` in `path` (case-insensitive), scored: consecutive
/// characters, matches at the start of a name and in the file name count more; shorter
/// paths win ties. `None` when `query` is not a subsequence.
pub fn fuzzy_score(path: &str, query: &str) -> Option<i64> {
    let path_lower: Vec<char> = path.to_lowercase().chars().collect();
    let query: Vec<char> = query.to_lowercase().chars().collect();
    let name_start = path_lower
        .iter()
        .rposition(|c| *c == '/')
        .map_or(0, |i| i + 1);
    let mut score: i64 = 0;
    let mut at = 0;
    let mut previous: Option<usize> = None;
    for q in query {
        let found = (at..path_lower.len()).find(|&i| path_lower[i] == q)?;
        score += 1;
        if previous == Some(found.wrapping_sub(1)) {
            score += 5;
        }
        if found == 0 || matches!(path_lower[found - 1], '/' | '_' | '-' | '.') {
            score += 3;
        }
        if found >= name_start {
            score += 2;
        }
        previous = Some(found);
        at = found + 1;
    }
    Some(score * 100 - path_lower.len() as i64)
}

/// Appends the content of each `@path` the message mentions (a word starting with `@`
/// naming a file inside the workspace) as a fenced block after the message. Mentions
/// that name nothing readable are left as they are.
pub fn expand(content: &str, workspace: &Path) -> String {
    let Ok(root) = workspace.canonicalize() else {
        return content.to_string();
    };
    let mut blocks = Vec::new();
    let mut seen: Vec<PathBuf> = Vec::new();
    for word in content.split_whitespace() {
        let Some(mention) = word.strip_prefix('@') else {
            continue;
        };
        let mention = mention.trim_end_matches([',', '.', ';', ':', ')', '!', '?']);
        if mention.is_empty() {
            continue;
        }
        let Ok(real) = root.join(mention).canonicalize() else {
            continue;
        };
        if !real.starts_with(&root) || seen.contains(&real) {
            continue;
        }
        let Ok(meta) = std::fs::metadata(&real) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        let text = if meta.len() > MAX_MENTION_BYTES {
            format!(
                "(not included: {} bytes, more than the {} KiB a mention takes)",
                meta.len(),
                MAX_MENTION_BYTES / 1024
            )
        } else {
            match std::fs::read(&real).map(String::from_utf8) {
                Ok(Ok(text)) => text,
                Ok(Err(_)) => "(not included: not a text file)".to_string(),
                Err(err) => format!("(not included: {err})"),
            }
        };
        seen.push(real);
        blocks.push(format!("<file path=\"{mention}\">\n{text}\n</file>"));
    }
    if blocks.is_empty() {
        content.to_string()
    } else {
        format!("{content}\n\n{}", blocks.join("\n\n"))
    }
}

/// [`list_files`] off the async threads, for the `list_files` command: the workspace
/// must be an absolute folder; at most 500 files (50 unless `limit` says).
pub(crate) async fn file_list(
    workspace: &str,
    query: Option<&str>,
    limit: Option<usize>,
) -> Result<crate::protocol::commands::FileList, crate::error::RuntimeError> {
    use crate::error::RuntimeError;
    let root = PathBuf::from(workspace);
    if !root.is_absolute() || !root.is_dir() {
        return Err(RuntimeError::InvalidArgument(format!(
            "workspace {workspace} is not a folder"
        )));
    }
    let query = query.map(str::to_string);
    let limit = limit.unwrap_or(50).min(500);
    let files = tokio::task::spawn_blocking(move || list_files(&root, query.as_deref(), limit))
        .await
        .map_err(|err| RuntimeError::Unavailable(err.to_string()))?;
    Ok(crate::protocol::commands::FileList { files })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuzzy_prefers_names_and_runs() {
        let a = fuzzy_score("src/controller/run.rs", "run").unwrap();
        let b = fuzzy_score("src/router/unused.rs", "run").unwrap();
        assert!(a > b);
        assert!(fuzzy_score("README.md", "xyz").is_none());
    }

    #[test]
    fn mentions_expand_inside_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        std::fs::write(ws.join("a.txt"), "alpha").unwrap();
        std::fs::write(dir.path().join("secret.txt"), "secret").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret.txt"), ws.join("link")).unwrap();
        let out = expand("see @a.txt, @../secret.txt and @link", &ws);
        assert!(out.contains("<file path=\"a.txt\">\nalpha\n</file>"));
        assert!(!out.contains("secret\n"));
        assert!(out.starts_with("see @a.txt, @../secret.txt and @link"));
    }
}
