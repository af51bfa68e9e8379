//! Worktree isolation for writing sub-agents: a child asked to run with `isolation: "worktree"` works in a new `git worktree` of the parent's repository, under `<data>/worktrees/<child id>` on branch `bumblehive/<child id>`; its changes are applied to the parent's workspace as one patch (all or nothing) or discarded with the worktree and the branch.

use std::path::{Path, PathBuf};

use crate::git::{Git, GitError, Repository};
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

/// Runs git on `repo`, hardened (`crate::git`): it is the person's repository or a
/// worktree a sub-agent's commands could write, so its config, hooks and `.git` file are
/// not trusted to name programs (security review 2, findings 2-3).
fn git(repo: &Repository, args: &[&str], input: Option<&[u8]>) -> Result<Vec<u8>, WorktreeError> {
    let failed = |err: GitError| match err {
        GitError::Failed { stderr, .. } => WorktreeError::Git(stderr),
        other => WorktreeError::Git(other.to_string()),
    };
    let mut cmd = Git::repository(repo, &repo.work_tree).map_err(failed)?;
    cmd.args(args);
    cmd.output(input).map_err(failed)
}

/// The repository of the parent's folder `origin`, which must be its top folder.
fn origin_repository(origin: &Path) -> Result<Repository, WorktreeError> {
    crate::git::discover(origin)
        .filter(|repo| same_path(&repo.work_tree, origin))
        .ok_or_else(|| {
            WorktreeError::Git(format!(
                "{} is no longer a git repository",
                origin.display()
            ))
        })
}

fn same_path(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// The git dir the runtime made for the child's worktree: `<common dir>/worktrees/<name>`
/// of the origin, whose `gitdir` file names the worktree back. Never taken from the
/// worktree's own `.git` file, which the child's commands can rewrite.
fn worktree_git_dir(info: &WorktreeInfo) -> Result<PathBuf, WorktreeError> {
    let origin = origin_repository(Path::new(&info.origin))?;
    let common = match std::fs::read_to_string(origin.git_dir.join("commondir")) {
        Ok(text) => origin.git_dir.join(text.trim()),
        Err(_) => origin.git_dir.clone(),
    };
    let path = Path::new(&info.path);
    let name = path
        .file_name()
        .ok_or_else(|| WorktreeError::Git(format!("{} names no worktree", info.path)))?;
    let dir = common.join("worktrees").join(name);
    let back = std::fs::read_to_string(dir.join("gitdir")).unwrap_or_default();
    let names_us = Path::new(back.trim())
        .parent()
        .is_some_and(|tree| same_path(tree, path));
    if !names_us {
        return Err(WorktreeError::Git(format!(
            "the git dir of worktree {} is not where the runtime made it",
            info.path
        )));
    }
    Ok(dir)
}

/// The child's worktree as a repository, checked: its `.git` file must still name the
/// git dir the runtime made. A child that pointed it elsewhere (a git dir of its own,
/// with config that names programs) gets nothing run there.
fn worktree_repository(info: &WorktreeInfo) -> Result<Repository, WorktreeError> {
    let git_dir = worktree_git_dir(info)?;
    let path = Path::new(&info.path);
    let named = crate::git::read_git_file(&path.join(".git"));
    if !named.is_some_and(|named| same_path(&named, &git_dir)) {
        return Err(WorktreeError::Git(format!(
            "the worktree's .git was changed (it no longer names {}); nothing was run there",
            git_dir.display()
        )));
    }
    Ok(Repository {
        git_dir,
        work_tree: path.to_path_buf(),
    })
}

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8_lossy(&bytes).trim().to_string()
}

/// The repository `workspace` is in: its top folder and the commit HEAD names.
pub fn repository_of(workspace: &Path) -> Result<(PathBuf, String), WorktreeError> {
    let repo = crate::git::discover(workspace).ok_or_else(|| {
        WorktreeError::NotARepository(format!(
            "isolation \"worktree\" needs a git repository, and {} is not in one; delegate without isolation, or run `git init` and commit first",
            workspace.display()
        ))
    })?;
    let head = git(&repo, &["rev-parse", "--verify", "HEAD^{commit}"], None).map_err(|_| {
        WorktreeError::NotARepository(format!(
            "isolation \"worktree\" needs a commit to start from, and the repository of {} has none yet",
            workspace.display()
        ))
    })?;
    Ok((repo.work_tree, text(head)))
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
    let origin = origin_repository(&top)?;
    git(
        &origin,
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
fn stage(repo: &Repository) -> Result<(), WorktreeError> {
    git(repo, &["add", "-A"], None).map(|_| ())
}

/// `git diff --stat` of the child's changes against where it started.
pub fn diff_stat(info: &WorktreeInfo) -> Result<String, WorktreeError> {
    let repo = worktree_repository(info)?;
    stage(&repo)?;
    staged_stat(&repo, &info.base)
}

/// The stat of what is staged against `base`. No external diff and no textconv (here and
/// in the patch): both are programs the repository's config names.
fn staged_stat(repo: &Repository, base: &str) -> Result<String, WorktreeError> {
    let args = [
        "diff",
        "--cached",
        "--no-ext-diff",
        "--no-textconv",
        "--stat",
        base,
    ];
    Ok(text(git(repo, &args, None)?))
}

/// Applies the child's changes to the parent's repository folder as one patch: checked
/// first, so that a patch that does not apply changes nothing. Returns the diff stat.
pub fn apply(info: &WorktreeInfo) -> Result<String, WorktreeError> {
    let repo = worktree_repository(info)?;
    stage(&repo)?;
    let patch = git(
        &repo,
        &[
            "diff",
            "--cached",
            "--no-ext-diff",
            "--no-textconv",
            "--binary",
            "--full-index",
            &info.base,
        ],
        None,
    )?;
    let stat = staged_stat(&repo, &info.base)?;
    if patch.is_empty() {
        return Ok(stat);
    }
    let origin = origin_repository(Path::new(&info.origin))?;
    if let Err(WorktreeError::Git(why)) = git(
        &origin,
        &["apply", "--check", "--binary", "-"],
        Some(&patch),
    ) {
        return Err(WorktreeError::Conflict(why));
    }
    // `git apply` is all or nothing: it writes no file unless every hunk applies.
    git(&origin, &["apply", "--binary", "-"], Some(&patch)).map_err(|err| match err {
        WorktreeError::Git(why) => WorktreeError::Conflict(why),
        other => other,
    })?;
    Ok(stat)
}

/// Removes the worktree and its branch (the child's changes are gone).
pub fn remove(info: &WorktreeInfo) -> Result<(), WorktreeError> {
    let origin = origin_repository(Path::new(&info.origin))?;
    let path = Path::new(&info.path);
    if path.exists() && worktree_repository(info).is_ok() {
        git(
            &origin,
            &["worktree", "remove", "--force", "--force", &info.path],
            None,
        )?;
    } else {
        // Removed by hand, or its `.git` changed (git would refuse to remove it then):
        // delete the folder (`remove_dir_all` follows no symlink) and let git forget its
        // administrative files.
        if path.exists() {
            std::fs::remove_dir_all(path).map_err(|err| {
                WorktreeError::Git(format!("cannot remove {}: {err}", path.display()))
            })?;
        }
        let _ = git(&origin, &["worktree", "prune"], None);
    }
    match git(&origin, &["branch", "-D", &info.branch], None) {
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
