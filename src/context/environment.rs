//! The environment a run works in, for the system prompt: the date, OS, shell, workspace, and whether it is a git repository (branch and a short status), found once per run with bounded, hardened `git` calls (`crate::git`: the repository's config runs nothing).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde::Serialize;
use ts_rs::TS;

/// The most `git status` lines the prompt carries; the rest is counted.
pub const STATUS_LINES: usize = 20;

/// How long `git status` may take (a huge repository, a slow disk): past it the prompt
/// says the status is unknown rather than holding up the run.
pub const GIT_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, TS)]
#[ts(export)]
pub struct Environment {
    /// The local date, `YYYY-MM-DD` (a date, not a time, so the prompt stays the same all day).
    pub date: String,
    pub os: String,
    pub shell: String,
    pub workspace: String,
    pub git: GitState,
}

/// What git says about the workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, TS)]
#[ts(export)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum GitState {
    /// Not inside a git repository.
    None,
    Repository {
        /// `None` on a detached HEAD.
        branch: Option<String>,
        /// `git status --short` lines, at most [`STATUS_LINES`].
        status: Vec<String>,
        /// Lines left out.
        #[ts(type = "number")]
        more: usize,
    },
    /// git is missing, failed or took too long: the reason.
    Unknown { reason: String },
}

impl Environment {
    /// Looks at the machine and the workspace: one `git status` (no optional locks, so a
    /// concurrent git command of the person is never blocked), bounded by [`GIT_TIMEOUT`].
    pub async fn detect(workspace: &Path) -> Environment {
        Environment {
            date: chrono::Local::now().format("%Y-%m-%d").to_string(),
            os: os_name(),
            shell: shell_name(),
            workspace: workspace.display().to_string(),
            git: git_state(workspace).await,
        }
    }
}

fn os_name() -> String {
    let family = std::env::consts::OS;
    let arch = std::env::consts::ARCH;
    // On Linux the distribution says more than "linux"; reading one small file is cheap.
    let pretty = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string())
        })
        .filter(|_| family == "linux");
    match pretty {
        Some(name) => format!("{name} ({family}, {arch})"),
        None => format!("{family} ({arch})"),
    }
}

fn shell_name() -> String {
    let var = if cfg!(windows) { "COMSPEC" } else { "SHELL" };
    std::env::var(var)
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| if cfg!(windows) { "cmd.exe" } else { "/bin/sh" }.to_string())
}

async fn git_state(workspace: &Path) -> GitState {
    // No `.git` (folder or file) in the workspace or above it: not a repository, known
    // without starting git (a few milliseconds per run otherwise). `GIT_DIR` of the
    // runtime's environment is not looked at: the runtime's git takes no `GIT_*` (see
    // `crate::git`).
    let Some(repo) = crate::git::discover(workspace) else {
        return GitState::None;
    };
    // Hardened (security review 2, findings 1-2): the repository's config may have been
    // planted by a command or come with the folder, and this runs outside the sandbox.
    // Submodules are not looked into: their config is not listed, and git would start a
    // `git status` of its own in each one.
    let cwd = workspace.to_path_buf();
    let prepared = tokio::task::spawn_blocking(move || {
        let mut git = crate::git::Git::repository(&repo, &cwd)?;
        git.args([
            "--no-optional-locks",
            "status",
            "--porcelain=v1",
            "--branch",
            "--ignore-submodules=all",
        ]);
        Ok::<_, crate::git::GitError>(git.into_command())
    });
    let mut command = match tokio::time::timeout(GIT_TIMEOUT, prepared).await {
        Ok(Ok(Ok(command))) => tokio::process::Command::from(command),
        Ok(Ok(Err(crate::git::GitError::Spawn(err))))
            if err.kind() == std::io::ErrorKind::NotFound =>
        {
            return GitState::Unknown {
                reason: "git is not installed".into(),
            };
        }
        Ok(Ok(Err(err))) => {
            return GitState::Unknown {
                reason: err.to_string(),
            };
        }
        Ok(Err(err)) => {
            return GitState::Unknown {
                reason: format!("cannot run git: {err}"),
            };
        }
        Err(_) => {
            return GitState::Unknown {
                reason: format!("git config took longer than {} s", GIT_TIMEOUT.as_secs()),
            };
        }
    };
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = match tokio::time::timeout(GIT_TIMEOUT, command.output()).await {
        Err(_) => {
            return GitState::Unknown {
                reason: format!("git status took longer than {} s", GIT_TIMEOUT.as_secs()),
            };
        }
        Ok(Err(err)) if err.kind() == std::io::ErrorKind::NotFound => {
            return GitState::Unknown {
                reason: "git is not installed".into(),
            };
        }
        Ok(Err(err)) => {
            return GitState::Unknown {
                reason: format!("cannot run git: {err}"),
            };
        }
        Ok(Ok(output)) => output,
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        if stderr.contains("not a git repository") {
            return GitState::None;
        }
        return GitState::Unknown {
            reason: stderr
                .lines()
                .next()
                .unwrap_or("git status failed")
                .to_string(),
        };
    }
    parse_status(&String::from_utf8_lossy(&output.stdout))
}

/// Reads `git status --porcelain=v1 --branch`: a `## ` branch line, then one line per path.
pub fn parse_status(text: &str) -> GitState {
    let mut branch = None;
    let mut lines = Vec::new();
    for line in text.lines() {
        if let Some(head) = line.strip_prefix("## ") {
            let head = head
                .strip_prefix("No commits yet on ")
                .or_else(|| head.strip_prefix("Initial commit on "))
                .unwrap_or(head);
            let name = head.split("...").next().unwrap_or(head);
            let name = name.split(' ').next().unwrap_or(name);
            if !name.is_empty() && !head.starts_with("HEAD (no branch)") {
                branch = Some(name.to_string());
            }
        } else if !line.is_empty() {
            lines.push(line.to_string());
        }
    }
    let more = lines.len().saturating_sub(STATUS_LINES);
    lines.truncate(STATUS_LINES);
    GitState::Repository {
        branch,
        status: lines,
        more,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_and_branch_are_read() {
        let text = "## main...origin/main [ahead 1]\n M src/lib.rs\n?? new.txt\n";
        assert_eq!(
            parse_status(text),
            GitState::Repository {
                branch: Some("main".into()),
                status: vec![" M src/lib.rs".into(), "?? new.txt".into()],
                more: 0
            }
        );
        assert!(matches!(
            parse_status("## No commits yet on trunk\n"),
            GitState::Repository { branch: Some(b), .. } if b == "trunk"
        ));
        assert!(matches!(
            parse_status("## HEAD (no branch)\n"),
            GitState::Repository { branch: None, .. }
        ));
        let many: String = std::iter::once("## dev\n".to_string())
            .chain((0..25).map(|i| format!("?? f{i}\n")))
            .collect();
        let GitState::Repository { status, more, .. } = parse_status(&many) else {
            panic!("not a repository")
        };
        assert_eq!((status.len(), more), (STATUS_LINES, 5));
    }
}
