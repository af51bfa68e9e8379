//! Worktree isolation for writing sub-agents: a child asked to run with `isolation: "worktree"` works in a new `git worktree` of the parent's repository, under `<data>/worktrees/<child id>` on branch `bumblehive/<child id>`; its changes are applied to the parent's workspace as one patch (all or nothing) or discarded with the worktree and the branch.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::protocol::WorktreeInfo;

/// Why a worktree operation failed.
#[derive(Debug, thiserror::Error)]
pub enum WorktreeError {
    /// The folder is not in a git repository (or the repository has no commit).
    #[error("{0}")]
    NotARepository(String),
    #[error("{0}")]
    Git(String),
    /// The patch does not apply to the workspace as it is now; nothing was applied.
    #[error(
        "the sub-agent's changes do not apply cleanly to the workspace, so nothing was applied: {0}"
    )]
    Conflict(String),
}

/// Runs git in `dir` with the person's own configuration (it is their repository), but
/// never their hooks and never a prompt.
fn git(dir: &Path, args: &[&str], input: Option<&[u8]>) -> Result<Vec<u8>, WorktreeError> {
    let mut cmd = Command::new("git");
    cmd.arg("-C")
        .arg(dir)
        .args(["-c", "core.hooksPath=/dev/null"])
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("LC_ALL", "C")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let mut child = cmd
        .spawn()
        .map_err(|err| WorktreeError::Git(format!("cannot run git: {err}")))?;
    let writer = match (input, child.stdin.take()) {
        (Some(input), Some(mut stdin)) => {
            let input = input.to_vec();
            Some(std::thread::spawn(move || stdin.write_all(&input)))
        }
        _ => None,
    };
    let out = child
        .wait_with_output()
        .map_err(|err| WorktreeError::Git(format!("git failed: {err}")))?;
    if let Some(writer) = writer {
        let _ = writer.join();
    }
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(WorktreeError::Git(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8_lossy(&bytes).trim().to_string()
}

/// The repository `workspace` is in: its top folder and the commit HEAD names.
pub fn repository_of(workspace: &Path) -> Result<(PathBuf, String), WorktreeError> {
    let top = git(workspace, &["rev-parse", "--show-toplevel"], None).map_err(|_| {
        WorktreeError::NotARepository(format!(
            "isolation \"worktree\" needs a git repository, and {} is not in one; delegate without isolation, or run `git init` and commit first",
            workspace.display()
        ))
    })?;
    let head = git(workspace, &["rev-parse", "--verify", "HEAD^{commit}"], None).map_err(|_| {
        WorktreeError::NotARepository(format!(
            "isolation \"worktree\" needs a commit to start from, and the repository of {} has none yet",
            workspace.display()
        ))
    })?;
    Ok((PathBuf::from(text(top)), text(head)))
}

/// Creates the worktree of child `child_id` for the parent's `workspace`; returns where
/// it is and the folder inside it that matches `workspace` (the child's workspace).
pub fn create(
    data_dir: &Path,
    workspace: &Path,
    child_id: &str,
) -> Result<(WorktreeInfo, PathBuf), WorktreeError> {
    let (top, base) = repository_of(workspace)?;
    let root = data_dir.join("worktrees");
    std::fs::create_dir_all(&root)
        .map_err(|err| WorktreeError::Git(format!("cannot create {}: {err}", root.display())))?;
    let path = root.join(child_id);
    let branch = format!("bumblehive/{child_id}");
    let path_text = path.display().to_string();
    git(
        &top,
        &[
            "worktree", "add", "--quiet", "-b", &branch, &path_text, &base,
        ],
        None,
    )?;
    let canonical_top = top.canonicalize().unwrap_or(top.clone());
    let inside = workspace
        .canonicalize()
        .ok()
        .and_then(|ws| ws.strip_prefix(&canonical_top).ok().map(Path::to_path_buf))
        .unwrap_or_default();
    let info = WorktreeInfo {
        origin: top.display().to_string(),
        path: path_text,
        branch,
        base,
        applied: false,
    };
    Ok((info, path.join(inside)))
}

/// Stages everything the child did (new files too) in its own worktree, so that a diff
/// against the base covers it.
fn stage(info: &WorktreeInfo) -> Result<(), WorktreeError> {
    git(Path::new(&info.path), &["add", "-A"], None).map(|_| ())
}

/// `git diff --stat` of the child's changes against where it started.
pub fn diff_stat(info: &WorktreeInfo) -> Result<String, WorktreeError> {
    stage(info)?;
    let stat = git(
        Path::new(&info.path),
        &["diff", "--cached", "--stat", &info.base],
        None,
    )?;
    Ok(text(stat))
}

/// Applies the child's changes to the parent's repository folder as one patch: checked
/// first, so that a patch that does not apply changes nothing. Returns the diff stat.
pub fn apply(info: &WorktreeInfo) -> Result<String, WorktreeError> {
    stage(info)?;
    let patch = git(
        Path::new(&info.path),
        &["diff", "--cached", "--binary", "--full-index", &info.base],
        None,
    )?;
    let stat = text(git(
        Path::new(&info.path),
        &["diff", "--cached", "--stat", &info.base],
        None,
    )?);
    if patch.is_empty() {
        return Ok(stat);
    }
    let origin = Path::new(&info.origin);
    if let Err(WorktreeError::Git(why)) =
        git(origin, &["apply", "--check", "--binary", "-"], Some(&patch))
    {
        return Err(WorktreeError::Conflict(why));
    }
    // `git apply` is all or nothing: it writes no file unless every hunk applies.
    git(origin, &["apply", "--binary", "-"], Some(&patch)).map_err(|err| match err {
        WorktreeError::Git(why) => WorktreeError::Conflict(why),
        other => other,
    })?;
    Ok(stat)
}

/// Removes the worktree and its branch (the child's changes are gone).
pub fn remove(info: &WorktreeInfo) -> Result<(), WorktreeError> {
    let origin = Path::new(&info.origin);
    if Path::new(&info.path).exists() {
        git(
            origin,
            &["worktree", "remove", "--force", "--force", &info.path],
            None,
        )?;
    } else {
        // Removed by hand: forget its administrative files.
        let _ = git(origin, &["worktree", "prune"], None);
    }
    match git(origin, &["branch", "-D", &info.branch], None) {
        Ok(_) => Ok(()),
        Err(WorktreeError::Git(why)) if why.contains("not found") => Ok(()),
        Err(err) => Err(err),
    }
}

/// Worktree folders under the data dir whose session is gone (a crash between the
/// delete and the clean-up, or a data dir copied around): listed at start.
pub fn leftovers(data_dir: &Path, exists: impl Fn(&str) -> bool) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(data_dir.join("worktrees")) else {
        return Vec::new();
    };
    let mut left: Vec<String> = entries
        .flatten()
        .filter(|e| !exists(&e.file_name().to_string_lossy()))
        .map(|e| e.path().display().to_string())
        .collect();
    left.sort();
    left
}
