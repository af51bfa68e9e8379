//! Trust of workspace `.mcp.json` files: a workspace's servers run programs of the repository's choosing, so the person decides once per workspace and per content of that file (its SHA-256); the answers live in `<data dir>/mcp-trust.json`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct TrustFile {
    #[serde(default)]
    decisions: Vec<Entry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    workspace: PathBuf,
    sha256: String,
    allowed: bool,
}

fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("mcp-trust.json")
}

fn load(data_dir: &Path) -> TrustFile {
    let Ok(bytes) = std::fs::read(path(data_dir)) else {
        return TrustFile::default();
    };
    serde_json::from_slice(&bytes).unwrap_or_else(|err| {
        // A broken file trusts nothing: the person is asked again.
        tracing::warn!(
            "{} is not valid ({err}); asking again",
            path(data_dir).display()
        );
        TrustFile::default()
    })
}

/// The person's answer for this workspace and this content of its `.mcp.json`, if any.
pub fn decision(data_dir: &Path, workspace: &Path, sha256: &str) -> Option<bool> {
    load(data_dir)
        .decisions
        .iter()
        .find(|e| e.workspace == workspace && e.sha256 == sha256)
        .map(|e| e.allowed)
}

/// Records an answer; it replaces any earlier one for the workspace (a changed file is
/// asked about again).
pub fn record(
    data_dir: &Path,
    workspace: &Path,
    sha256: &str,
    allowed: bool,
) -> Result<(), String> {
    let mut file = load(data_dir);
    file.decisions.retain(|e| e.workspace != workspace);
    file.decisions.push(Entry {
        workspace: workspace.to_path_buf(),
        sha256: sha256.to_string(),
        allowed,
    });
    let text = serde_json::to_vec_pretty(&file).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(data_dir).map_err(|e| e.to_string())?;
    crate::fsutil::write_atomic(&path(data_dir), &text, true)
        .map_err(|err| format!("cannot save {}: {err}", path(data_dir).display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_per_workspace_and_content() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let ws = Path::new("/w");
        assert_eq!(decision(dir.path(), ws, "aa"), None);
        record(dir.path(), ws, "aa", true).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(decision(dir.path(), ws, "aa"), Some(true));
        assert_eq!(
            decision(dir.path(), ws, "bb"),
            None,
            "a changed file is asked again"
        );
        assert_eq!(decision(dir.path(), Path::new("/other"), "aa"), None);
        record(dir.path(), ws, "bb", false).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(decision(dir.path(), ws, "bb"), Some(false));
        assert_eq!(decision(dir.path(), ws, "aa"), None);
    }
}
