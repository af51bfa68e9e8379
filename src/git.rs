//! The one way the runtime runs git (environment detection, the shadow store of checkpoints, worktrees and their apply): hardened so that git runs no program a repository names (hooks, `core.fsmonitor`, filters, pagers, external diffs, transports) and takes nothing from the runtime's environment, with the git dir and work tree given explicitly rather than found through a `.git` file.
//!
//! Why: a sandboxed command can write a repository's `.git` (security review 2,
//! findings 1-3), and a repository may arrive hostile (an archive, a copied project). Git
//! runs outside the sandbox when the runtime runs it, so everything git would execute on
//! a repository's say-so is switched off here:
//! - the fixed overrides of [`HARDENING`] (command-line config wins over the
//!   repository's own);
//! - for a repository the runtime does not own ([`Git::repository`]), its config is
//!   listed first (listing runs nothing) and every filter driver, merge driver,
//!   config-based hook and per-protocol permission it names is overridden too, since
//!   their names are the repository's choice;
//! - no system or global config, no `GIT_*` variable of the runtime's environment, no
//!   prompt, no lazy fetch.
//!
//! A config that `include.path`s a file of the work tree (which a command could rewrite
//! between the listing and the run) is refused outright. What is left: a program-running
//! key this list does not know of; the sandbox keeps `.git/config` read-only
//! (`sandbox::linux`) so a command cannot add one.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Config given on every git command line. Each names a program git would otherwise run
/// (or a cache it would write) on the repository's say-so; see the module doc.
pub const HARDENING: &[&str] = &[
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "diff.external=",
    "core.pager=cat",
    "core.sshCommand=false",
    "core.askPass=",
    "core.editor=false",
    "sequence.editor=false",
    "core.gitProxy=",
    "core.alternateRefsCommand=",
    "credential.helper=",
    "protocol.allow=never",
    "protocol.file.allow=never",
    "protocol.ext.allow=never",
    "submodule.recurse=false",
    "gc.auto=0",
    "maintenance.auto=false",
    "gpg.program=false",
    "uploadpack.packObjectsHook=",
];

/// Why a git command failed.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("cannot run git: {0}")]
    Spawn(std::io::Error),
    /// git ran and failed: its first words and stderr.
    #[error("git {command} failed: {stderr}")]
    Failed { command: String, stderr: String },
}

/// A repository as git would find it from a folder: its git dir and its work tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repository {
    pub git_dir: PathBuf,
    pub work_tree: PathBuf,
}

/// What a `.git` file names (`gitdir: <path>`, relative to the file's folder), if it is one.
pub fn read_git_file(dot_git: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(dot_git).ok()?;
    let named = text.lines().next()?.strip_prefix("gitdir:")?.trim();
    if named.is_empty() {
        return None;
    }
    let named = Path::new(named);
    Some(match dot_git.parent() {
        Some(folder) if named.is_relative() => folder.join(named),
        _ => named.to_path_buf(),
    })
}

/// The repository `start` is in, found the way git finds it (the nearest `.git` folder or
/// file upwards, whose git dir has a `HEAD`), but without running git and without
/// `GIT_DIR`/`GIT_WORK_TREE` from the environment.
pub fn discover(start: &Path) -> Option<Repository> {
    // Upwards from where the folder really is, as git does (its cwd is resolved).
    let start = start.canonicalize().unwrap_or_else(|_| start.to_path_buf());
    start.ancestors().find_map(|folder| {
        let dot_git = folder.join(".git");
        let meta = std::fs::metadata(&dot_git).ok()?;
        let git_dir = if meta.is_dir() {
            dot_git
        } else if meta.is_file() {
            read_git_file(&dot_git)?
        } else {
            return None;
        };
        git_dir.join("HEAD").is_file().then(|| Repository {
            git_dir,
            work_tree: folder.to_path_buf(),
        })
    })
}

/// A git command being built: [`HARDENING`], a clean environment, the working folder.
pub struct Git {
    command: Command,
    label: String,
}

impl Git {
    /// Git with no repository of anyone's (`--version`), or one whose git dir the caller
    /// gives and owns (the shadow store: its config is the runtime's).
    pub fn new(cwd: &Path) -> Git {
        let mut command = Command::new("git");
        // Nothing of the runtime's environment steers git: GIT_DIR, GIT_CONFIG_*, the
        // trace and exec paths, GIT_SSH, GIT_EXTERNAL_DIFF, ...
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("GIT_") {
                command.env_remove(name);
            }
        }
        command
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_ATTR_NOSYSTEM", "1")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_NO_LAZY_FETCH", "1")
            .env("GIT_PROTOCOL_FROM_USER", "0")
            .env("GIT_PAGER", "cat")
            .env("LC_ALL", "C")
            .current_dir(cwd)
            .stdin(Stdio::null());
        for setting in HARDENING {
            command.arg("-c").arg(setting);
        }
        Git {
            command,
            label: String::new(),
        }
    }

    /// Git on `repo`, a repository that is not the runtime's own (the person's, or a
    /// worktree a sub-agent worked in): the git dir and work tree given explicitly, and
    /// every program its config names overridden (see the module doc). The listing itself
    /// is one git process that runs nothing.
    pub fn repository(repo: &Repository, cwd: &Path) -> Result<Git, GitError> {
        let mut list = Git::new(cwd);
        list.locate(repo)
            .args(["config", "--list", "--includes", "-z"]);
        let listed = list.output(None)?;
        if let Some(file) = included_from(&listed, repo) {
            // A file of the work tree can be rewritten by a sandboxed command between
            // the listing above and the command below, naming programs the listing did
            // not see: such a repository is not run at all.
            return Err(GitError::Failed {
                command: "config".into(),
                stderr: format!(
                    "the repository's config includes {}, a file in the workspace that commands can change; git is not run on it",
                    file.display()
                ),
            });
        }
        let mut git = Git::new(cwd);
        for setting in overrides(&listed) {
            git.command.arg("-c").arg(setting);
        }
        git.locate(repo);
        Ok(git)
    }

    fn locate(&mut self, repo: &Repository) -> &mut Git {
        let mut dir = OsString::from("--git-dir=");
        dir.push(&repo.git_dir);
        let mut tree = OsString::from("--work-tree=");
        tree.push(&repo.work_tree);
        self.command.arg(dir).arg(tree);
        self
    }

    /// Adds arguments; the first one names the command in errors.
    pub fn args<I, S>(&mut self, args: I) -> &mut Git
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        for arg in args {
            let arg = arg.as_ref();
            if self.label.is_empty() && !arg.to_string_lossy().starts_with('-') {
                self.label = arg.to_string_lossy().into_owned();
            }
            self.command.arg(arg);
        }
        self
    }

    /// One more `-c` setting, after (so over) [`HARDENING`]: for the runtime's own store only.
    pub fn config(&mut self, setting: &str) -> &mut Git {
        self.command.arg("-c").arg(setting);
        self
    }

    /// Sets one more environment variable (the shadow store's index, say).
    pub fn env(&mut self, name: &str, value: impl AsRef<std::ffi::OsStr>) -> &mut Git {
        self.command.env(name, value);
        self
    }

    /// The command as built, for a caller that runs it itself (async, with a timeout).
    pub fn into_command(self) -> Command {
        self.command
    }

    /// Runs it with `input` on stdin: stdout on success, stderr in the error otherwise.
    pub fn output(mut self, input: Option<&[u8]>) -> Result<Vec<u8>, GitError> {
        let out = run(&mut self.command, input).map_err(GitError::Spawn)?;
        if out.status.success() {
            Ok(out.stdout)
        } else {
            Err(GitError::Failed {
                command: self.label,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            })
        }
    }
}

/// Runs `command` with stdout and stderr piped and `input` (if any) on stdin.
fn run(command: &mut Command, input: Option<&[u8]>) -> std::io::Result<Output> {
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    if input.is_some() {
        command.stdin(Stdio::piped());
    }
    let mut child = command.spawn()?;
    let writer = match (input, child.stdin.take()) {
        (Some(input), Some(mut stdin)) => {
            // From another thread: git may fill its stdout pipe before it has read all of
            // a long input, and both sides would wait forever.
            let input = input.to_vec();
            Some(std::thread::spawn(move || stdin.write_all(&input)))
        }
        _ => None,
    };
    let out = child.wait_with_output();
    if let Some(writer) = writer {
        let _ = writer.join();
    }
    out
}

/// The first file an `include.path` / `includeIf.*.path` of the listing names that lies
/// in the work tree. A relative path is taken from the git dir (where the repository's
/// config is); `~/` paths are the person's and left alone.
fn included_from(listed: &[u8], repo: &Repository) -> Option<PathBuf> {
    let tree = repo
        .work_tree
        .canonicalize()
        .unwrap_or_else(|_| repo.work_tree.clone());
    for record in listed.split(|b| *b == 0) {
        let record = String::from_utf8_lossy(record);
        let (key, value) = record.split_once('\n').unwrap_or((&record, ""));
        let include =
            key == "include.path" || (key.starts_with("includeif.") && key.ends_with(".path"));
        if !include || value.starts_with('~') {
            continue;
        }
        let path = repo.git_dir.join(value);
        let real = path.canonicalize().unwrap_or(path);
        if real.starts_with(&tree) {
            return Some(real);
        }
    }
    None
}

/// The `-c` overrides for the programs a repository's config names under names it chose:
/// from `git config --list -z` (`key\nvalue\0` records; section and key lower-case).
fn overrides(listed: &[u8]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for record in listed.split(|b| *b == 0) {
        let record = String::from_utf8_lossy(record);
        let key = record.split('\n').next().unwrap_or_default();
        let (Some((section, rest)), Some((_, name))) = (key.split_once('.'), key.rsplit_once('.'))
        else {
            continue;
        };
        let Some((sub, _)) = rest.rsplit_once('.') else {
            continue;
        };
        let set = match (section, name) {
            // An empty command is "no filter"; `required` would turn that into an error.
            ("filter", "clean" | "smudge" | "process") => {
                vec![format!("{key}="), format!("filter.{sub}.required=false")]
            }
            ("merge", "driver") => vec![format!("{key}=")],
            // Blocked by `protocol.allow=never`, unless a repository allows one by name.
            ("protocol", "allow") => vec![format!("{key}=never")],
            // Config-based hooks (newer git) are not covered by `core.hooksPath`.
            ("hook", "command") => vec![format!("{key}=true")],
            _ => Vec::new(),
        };
        for setting in set {
            if !out.contains(&setting) {
                out.push(setting);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_keys_of_any_name_are_overridden() {
        let listed =
            b"core.fsmonitor\nx\0filter.Evil.One.clean\nrm -rf\0filter.Evil.One.smudge\ny\0\
            diff.x.textconv\nz\0protocol.ext.allow\nalways\0merge.m.driver\nq\0hook.h.command\nw\0\
            user.name\nme\0";
        assert_eq!(
            overrides(listed),
            [
                "filter.Evil.One.clean=",
                "filter.Evil.One.required=false",
                "filter.Evil.One.smudge=",
                "protocol.ext.allow=never",
                "merge.m.driver=",
                "hook.h.command=true",
            ]
        );
    }

    #[test]
    fn a_git_file_is_read_relative_to_its_folder() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(".git");
        std::fs::write(&file, "gitdir: ../real/.git\n").unwrap();
        assert_eq!(read_git_file(&file), Some(dir.path().join("../real/.git")));
        std::fs::write(&file, "gitdir: /abs\n").unwrap();
        assert_eq!(read_git_file(&file), Some(PathBuf::from("/abs")));
        std::fs::write(&file, "nonsense\n").unwrap();
        assert_eq!(read_git_file(&file), None);
    }
}
