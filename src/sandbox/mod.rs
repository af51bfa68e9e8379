//! The OS sandbox for `run_command` and every other platform-only check (where an open file really is, opening a path without following symlinks, a non-dumpable process): Linux uses bubblewrap, `/proc` and `openat2`; other systems get a portable fallback that asks for everything.
//!
//! What a sandboxed command sees (Linux, bubblewrap):
//! - the system read-only, `/dev` and a fresh `/proc` of its own pid namespace (so the
//!   runtime's `/proc/<pid>/environ` and memory are not there), a private `/tmp`;
//! - the home folder hidden (an empty tmpfs) except the workspace, which is writable, and
//!   the read-only toolchain folders of [`CommandSettings::home_read_only`];
//! - `.git` bound onto itself (it cannot be renamed or replaced) with `config`, `hooks`,
//!   `info`, `commondir`, `config.worktree` and `gitdir` read-only, also for a `.git` file
//!   and the git dir it names: git itself works (objects, index, refs, commits), but a
//!   command cannot plant a hook or a `core.fsmonitor`/`core.pager` line that git would
//!   later run *outside* the sandbox; the same for nested repositories ([`nested_git`]);
//!   what cannot be bound (a new `.git`, a new nested repository, a new `commondir`) is
//!   reported after the command ([`GitWatch`]);
//! - `/run` and `/var/run` an empty tmpfs (no host Unix sockets), the runtime's data dir
//!   and config hidden wherever they are ([`hide`]), no inherited descriptor;
//! - no network unless allowed, and then no Unix socket either (a seccomp filter,
//!   `linux::socket_filter`: host sockets anywhere in the filesystem stay out of reach;
//!   socketpairs still work); a new pid namespace, so nothing outlives the command
//!   (a `setsid` child included); process and memory limits;
//! - an environment built from an allow-list ([`BASE_ENV`] plus the names the person
//!   adds), never the runtime's own.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, RwLock};

use serde::{Deserialize, Serialize};

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
use linux as platform;
#[cfg(not(target_os = "linux"))]
mod other;
#[cfg(not(target_os = "linux"))]
use other as platform;
mod spare;

// Wire types, defined in `crate::protocol` (the config and `app_info` carry them).
pub use crate::protocol::{CommandPolicy, SandboxStatus};

/// The `tools.run_command` block of the config (`tools.command` before).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CommandSettings {
    /// `sandbox` in the config (SPEC §11); `policy` is still read.
    #[serde(rename = "sandbox", alias = "policy")]
    pub policy: CommandPolicy,
    /// Sandboxed commands may use the network without asking.
    pub network: bool,
    /// Names of environment variables passed to commands on top of [`BASE_ENV`].
    pub env: Vec<String>,
    /// Folders under the home folder that sandboxed commands may read (toolchains).
    pub home_read_only: Vec<String>,
    /// Most processes a sandboxed command may run at once.
    pub max_processes: u64,
    /// Most memory (data segment) per process of a sandboxed command, in MiB.
    pub max_memory_mb: u64,
    /// The bubblewrap binary; default `bwrap` on PATH.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bwrap: Option<PathBuf>,
}

impl Default for CommandSettings {
    fn default() -> Self {
        CommandSettings {
            policy: CommandPolicy::Sandbox,
            network: false,
            env: Vec::new(),
            home_read_only: [".cargo/bin", ".cargo/registry", ".rustup", ".local/bin"]
                .map(String::from)
                .to_vec(),
            max_processes: 512,
            max_memory_mb: 8192,
            bwrap: None,
        }
    }
}

/// Variables every command gets (when set); everything else is dropped. Secrets
/// (`*_KEY`, `*_TOKEN`, `DBUS_SESSION_BUS_ADDRESS`, …) are never inherited by accident.
pub const BASE_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "TERM",
    "TZ",
    "COLORTERM",
    "NO_COLOR",
    "CARGO_HOME",
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
    "GOPATH",
    "JAVA_HOME",
    "VIRTUAL_ENV",
    "PYTHONPATH",
    "NODE_PATH",
];

static SETTINGS: RwLock<Option<CommandSettings>> = RwLock::new(None);

/// The runtime's own files, hidden from every sandboxed command ([`hide`]).
static HIDDEN: RwLock<Vec<PathBuf>> = RwLock::new(Vec::new());

/// Hides `paths` (the data dir with the server token and every session's history, the
/// config file with any literal secrets) from every sandboxed command of this process,
/// wherever they are: the home folder is hidden anyway, but a data dir or config outside
/// it was readable (security review 2, finding 10). A folder becomes an empty tmpfs, a
/// file reads as empty; a workspace inside a hidden folder (a worktree in the data dir)
/// is still shown. Adds to what earlier calls hid (several services in one process);
/// paths that no longer exist are skipped when a sandbox is built.
pub fn hide(paths: &[PathBuf]) {
    let mut hidden = HIDDEN.write().unwrap_or_else(|p| p.into_inner());
    for path in paths {
        if path.is_absolute() && path != Path::new("/") && !hidden.contains(path) {
            hidden.push(path.clone());
        }
    }
}

/// [`hide`] for a runtime's data folder and its config file.
pub fn hide_data(data_dir: &Path, config: Option<&Path>) {
    let mut paths = vec![data_dir.to_path_buf()];
    paths.extend(config.map(Path::to_path_buf));
    hide(&paths);
}

/// What [`hide`] hid that exists now, where it really is.
fn hidden() -> Vec<PathBuf> {
    let hidden = HIDDEN.read().unwrap_or_else(|p| p.into_inner());
    let mut real: Vec<PathBuf> = hidden
        .iter()
        .filter_map(|path| path.canonicalize().ok())
        .filter(|path| path != Path::new("/"))
        .collect();
    real.sort();
    real.dedup();
    real
}

/// Sets the command settings the standard `run_command` uses (at start and on every
/// config change). Until called, the defaults apply.
pub fn configure(settings: &CommandSettings) {
    *SETTINGS.write().unwrap_or_else(|p| p.into_inner()) = Some(settings.clone());
    // Not detected here: the probe starts bwrap (milliseconds), which `bumblehive run`
    // would pay on every start. It runs at the first command or `app_info` (the desktop
    // asks at start, so its notice still shows at once).
}

/// The command settings in force.
pub fn settings() -> CommandSettings {
    SETTINGS
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .unwrap_or_default()
}

/// The sandbox's state with the settings in force.
pub fn status() -> SandboxStatus {
    status_for(&settings())
}

/// The sandbox's state for given settings.
pub fn status_for(settings: &CommandSettings) -> SandboxStatus {
    let detection = detect(settings.bwrap.as_deref());
    SandboxStatus {
        available: detection.is_ok(),
        reason: detection.err(),
        policy: settings.policy,
        kind: if cfg!(target_os = "linux") {
            "bubblewrap".into()
        } else {
            "none".into()
        },
    }
}

/// How commands are confined, in a sentence for the system prompt; `None` when they run
/// unconfined. Says what the policy promises without starting the probe (which would
/// cost `bumblehive run` milliseconds at every start): where no sandbox works, the
/// policy already makes every command ask, which the sentence says.
pub fn prompt_note(settings: &CommandSettings) -> Option<String> {
    if settings.policy == CommandPolicy::Off || !cfg!(target_os = "linux") {
        return None;
    }
    let network = if settings.network {
        "the network is allowed"
    } else {
        "there is no network (nor Unix sockets) unless the person allows it for a command"
    };
    Some(format!(
        "bubblewrap, with the system read-only, the workspace writable, a private /tmp, the home folder hidden and {network}; where the sandbox cannot start, each command asks first"
    ))
}

/// Whether the sandbox works, found once per binary: the first failure is logged once.
fn detect(bwrap: Option<&Path>) -> Result<(), String> {
    type Seen = Vec<(Option<PathBuf>, Result<(), String>)>;
    static SEEN: OnceLock<Mutex<Seen>> = OnceLock::new();
    let seen = SEEN.get_or_init(Default::default);
    let key = bwrap.map(Path::to_path_buf);
    if let Some((_, result)) = seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|(k, _)| *k == key)
    {
        return result.clone();
    }
    let result = platform::detect(bwrap);
    match &result {
        Ok(()) => tracing::info!("commands run in the bubblewrap sandbox"),
        Err(reason) => {
            tracing::warn!("no sandbox for commands: {reason}; every command will ask for approval")
        }
    }
    seen.lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((key, result.clone()));
    result
}

/// What one command may do beyond the defaults.
#[derive(Debug, Clone, Default)]
pub struct Grant {
    /// The network was asked for and approved (or allowed by the settings).
    pub network: bool,
    /// Folders outside the workspace the person approved writing to (an outside cwd).
    pub writable: Vec<PathBuf>,
}

/// The environment a command gets: only the allow-listed names that are set.
pub fn command_env(settings: &CommandSettings) -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(name, _)| {
            BASE_ENV.contains(&name.as_str())
                || name.starts_with("LC_")
                || settings.env.iter().any(|extra| extra == name)
        })
        .collect()
}

/// Frees what the limits of one command set up (a pids cgroup), when dropped after the
/// command ended.
pub struct CommandGuard(#[allow(dead_code)] Option<platform::Cgroup>);

/// A started shell command: its process, in a process group of its own, with stdout and
/// stderr piped, and what its limits hold until it ended. The process is a std child,
/// tied to no tokio runtime, because a spare sandbox is started by one call and used by
/// another. Dropped before it was reaped, it kills its group and is reaped on a thread.
pub struct Shell {
    child: Option<std::process::Child>,
    _guard: CommandGuard,
}

impl Shell {
    /// The process id, which is also its group's id.
    pub fn pid(&self) -> Option<libc::pid_t> {
        self.child.as_ref().map(|c| c.id() as libc::pid_t)
    }

    /// Takes the output pipes (once).
    pub fn take_pipes(
        &mut self,
    ) -> (
        Option<std::process::ChildStdout>,
        Option<std::process::ChildStderr>,
    ) {
        match self.child.as_mut() {
            Some(child) => (child.stdout.take(), child.stderr.take()),
            None => (None, None),
        }
    }

    /// Kills the whole group. Never after the leader was reaped: its pid could then
    /// belong to another process (runtime-review C18); the child is here until then.
    pub fn kill_group(&self) {
        if let Some(pid) = self.pid() {
            // SAFETY: killpg only sends a signal; the leader is not reaped yet (we hold
            // it), so the id is still this group's.
            unsafe {
                libc::killpg(pid, libc::SIGKILL);
            }
        }
    }

    /// Hands the leader over to be reaped; nothing kills by its id afterwards.
    pub fn into_child(mut self) -> Option<std::process::Child> {
        self.child.take()
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        self.kill_group();
        if let Some(mut child) = self.child.take() {
            // Killed just now: the wait is short, but it is a wait, so not here.
            std::thread::spawn(move || {
                let _ = child.wait();
            });
        }
    }
}

/// The environment of a command: the allow-list, the settings nothing may prompt for,
/// the private /tmp when sandboxed; never a name of `dropped` (the provider's key names,
/// in case the person listed one).
fn shell_env(
    settings: &CommandSettings,
    sandboxed: bool,
    dropped: &[String],
) -> Vec<(String, String)> {
    let mut env = command_env(settings);
    // Nothing may wait for a person at a terminal that is not there.
    env.extend(
        [
            ("GIT_TERMINAL_PROMPT", "0"),
            ("PAGER", "cat"),
            ("GIT_PAGER", "cat"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    if sandboxed {
        // The private /tmp, not the runtime's TMPDIR (which the sandbox does not show).
        env.push(("TMPDIR".into(), "/tmp".into()));
    }
    env.retain(|(name, _)| !dropped.contains(name));
    env
}

/// Spawns `argv` with `env` only, stdin empty, stdout and stderr piped, in its own
/// process group (so the command and everything it starts are killed together); with the
/// limits when sandboxed; with `script` as its fd 3 for a spare.
fn spawn(
    argv: &[std::ffi::OsString],
    env: &[(String, String)],
    cwd: Option<&Path>,
    limits: Option<&CommandSettings>,
    script: Option<std::os::fd::OwnedFd>,
) -> Result<Shell, String> {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0);
    if let Some(cwd) = cwd {
        cmd.current_dir(cwd);
    }
    let guard = CommandGuard(limits.and_then(|settings| platform::limit(&mut cmd, settings)));
    // No descriptor of the runtime reaches a command: one it inherited from whatever
    // started it, or one a library opened without close-on-exec, could be a socket or a
    // file the command must not have. Marked close-on-exec in the child, from 3 on (a
    // spare's script is put at 3 after this, without the flag).
    let open_max = platform::open_max();
    // SAFETY: only async-signal-safe calls (close_range or fcntl) on descriptors.
    unsafe {
        cmd.pre_exec(move || {
            platform::cloexec_from(3, open_max);
            Ok(())
        });
    }
    // Descriptors handed on at fixed numbers: a spare's script at 3, the socket filter
    // bubblewrap reads at `FILTER_FD` when the line names one (`linux::socket_filter`).
    let mut passed: Vec<(std::os::fd::OwnedFd, libc::c_int)> = Vec::new();
    if let Some(script) = script {
        passed.push((script, 3));
    }
    if argv.iter().any(|arg| arg == "--seccomp") {
        passed.push((platform::socket_filter_fd()?, platform::FILTER_FD));
    }
    if !passed.is_empty() {
        use std::os::fd::AsRawFd;
        let pairs: Vec<(libc::c_int, libc::c_int)> = passed
            .iter()
            .map(|(fd, to)| (fd.as_raw_fd(), *to))
            .collect();
        // SAFETY: fcntl, dup2 and close are async-signal-safe and touch only descriptors;
        // `pairs` was allocated before the fork.
        unsafe {
            cmd.pre_exec(move || {
                // First out of the way of every target (a source may sit on another's
                // number), then each onto its number, which dup2 leaves without
                // close-on-exec.
                let mut moved = [-1 as libc::c_int; 2];
                for (slot, (fd, _)) in moved.iter_mut().zip(&pairs) {
                    *slot = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 16);
                    if *slot < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                for (from, (_, to)) in moved.iter().zip(&pairs) {
                    if libc::dup2(*from, *to) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    libc::close(*from);
                }
                Ok(())
            });
        }
    }
    let child = cmd.spawn().map_err(|err| err.to_string())?;
    Ok(Shell {
        child: Some(child),
        _guard: guard,
    })
}

/// Starts `sh -c command` in `cwd`: inside the sandbox when `sandboxed` (which the caller
/// decided from [`status_for`]), otherwise plain; either way with the allow-listed
/// environment only (less `dropped`), and, sandboxed, the process and memory limits
/// applied before it starts. A sandboxed command with no grant, run in the workspace
/// itself, takes a spare sandbox if one was made for exactly the sandbox it needs, and
/// leaves one for the next command.
pub fn start_shell(
    settings: &CommandSettings,
    workspace: &Path,
    cwd: &Path,
    command: &str,
    sandboxed: bool,
    grant: &Grant,
    dropped: &[String],
) -> Result<Shell, String> {
    let env = shell_env(settings, sandboxed, dropped);
    if !sandboxed {
        let argv = ["/bin/sh", "-c", command].map(std::ffi::OsString::from);
        return spawn(&argv, &env, Some(cwd), None, None);
    }
    let argv = platform::sandbox_argv(settings, workspace, cwd, command.as_ref(), grant)?;
    let plain = !grant.network && grant.writable.is_empty() && cwd == workspace;
    if plain {
        let key = spare::Key::new(workspace, settings, &argv, env);
        if let Some(shell) = spare::take(&key, command) {
            spare::refill(key, settings);
            return Ok(shell);
        }
        let shell = spawn(&argv, &key.env, None, Some(settings), None)?;
        spare::refill(key, settings);
        return Ok(shell);
    }
    spawn(&argv, &env, None, Some(settings), None)
}

/// How many spare sandboxes were made, used and thrown away, for tests and benchmarks.
pub use spare::{SpareStats, spare_stats, wait_for_spare};

/// Where an open file really is, from the kernel; `None` where the system cannot say.
pub fn opened_path(file: &std::fs::File) -> Option<PathBuf> {
    platform::opened_path(file)
}

/// Opens `path` (absolute, every symlink already resolved) only if no name on the way is
/// a symlink now, in one lookup of the kernel's; `None` where the system has no such call
/// (the caller then walks the path a name at a time, each opened with `O_NOFOLLOW`).
pub fn open_no_symlinks(
    path: &Path,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> Option<std::io::Result<std::fs::File>> {
    platform::open_no_symlinks(path, flags, mode)
}

/// Makes this process non-dumpable, so the commands it starts (same user) cannot read its
/// memory or `/proc/<pid>/environ`. Call it first thing in `main` (the `bumblehive`
/// binary and the desktop shell both).
pub fn harden_process() {
    platform::harden_process();
}

/// How deep below the workspace, and through how many folders, [`nested_git`] looks.
const NESTED_DEPTH: usize = 4;
const NESTED_FOLDERS: usize = 256;
/// Folders [`nested_git`] does not enter: build output and installed packages, large
/// and never a repository of the person's (package managers drop `.git`).
const NESTED_SKIP: &[&str] = &[
    ".git",
    "node_modules",
    "target",
    ".venv",
    "venv",
    "__pycache__",
    ".tox",
    ".mypy_cache",
    ".gradle",
];

/// The `.git` (folder or file) of each repository nested in `workspace` (`vendor/lib`,
/// a package with a repository of its own), not the workspace's own: found by a walk
/// breadth first, at most [`NESTED_DEPTH`] folders down and through [`NESTED_FOLDERS`]
/// folders, never following a symlink, so that its cost per command stays small (about a
/// millisecond at the limit; BENCHMARKS.md). A repository deeper, or past the limit, is
/// not found: README says so.
pub fn nested_git(workspace: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut queue = std::collections::VecDeque::from([(workspace.to_path_buf(), 0usize)]);
    let mut read = 0;
    while let Some((dir, depth)) = queue.pop_front() {
        if read == NESTED_FOLDERS {
            break;
        }
        read += 1;
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            // The type from the folder listing: no stat, and a symlink is never a folder.
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if name == ".git" {
                if depth > 0 && (kind.is_dir() || kind.is_file()) {
                    found.push(entry.path());
                }
                continue;
            }
            if kind.is_dir()
                && depth + 1 < NESTED_DEPTH
                && !NESTED_SKIP.iter().any(|skip| name == *skip)
            {
                queue.push_back((entry.path(), depth + 1));
            }
        }
    }
    found.sort();
    found
}

/// What a command changed of the workspace's `.git` that the sandbox could not keep
/// read-only (security review 2, finding 1): a `.git` that appeared (`git init`), was
/// replaced or removed, and a `commondir`, `config.worktree`, `config`, hooks or the
/// `.git` file's target that are new or differ. Taken before a command and compared
/// after it, when nothing of the command runs any more (its pid namespace is gone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitWatch {
    root: PathBuf,
    marks: GitMarks,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct GitMarks {
    /// `.git`: missing, a folder (device, inode), a file (its text), a symlink (its target).
    dot_git: DotGit,
    /// The parts of the git dir it leads to that decide config and hooks: contents
    /// (small files) or names (the hooks folder).
    parts: Vec<(String, Option<Vec<u8>>)>,
    /// Nested repositories' `.git` ([`nested_git`]) with their device and inode: one
    /// that appears during a command (also under the name of one moved away) was not
    /// protected while it ran, so its config and hooks are the command's.
    nested: Vec<(PathBuf, Option<(u64, u64)>)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum DotGit {
    Missing,
    Folder(u64, u64),
    File(Vec<u8>),
    Link(PathBuf),
    Other,
}

/// The parts compared; each read up to this many bytes.
const WATCHED_PARTS: &[&str] = &["commondir", "config.worktree", "config", "gitdir"];
const WATCH_BYTES: u64 = 256 * 1024;

impl GitWatch {
    /// The state of `<workspace>/.git` now.
    pub fn new(workspace: &Path) -> GitWatch {
        GitWatch {
            root: workspace.to_path_buf(),
            marks: GitMarks::of(workspace),
        }
    }

    /// A notice for the tool result when `.git` changed in a way the sandbox cannot
    /// prevent, in words for the model and the person; `None` when nothing did.
    pub fn report(&self) -> Option<String> {
        let now = GitMarks::of(&self.root);
        if now == self.marks {
            return None;
        }
        let mut what = Vec::new();
        match (&self.marks.dot_git, &now.dot_git) {
            (DotGit::Missing, DotGit::Missing) => {}
            (DotGit::Missing, _) => what.push("a new .git appeared in the workspace".to_string()),
            (_, DotGit::Missing) => what.push(".git was removed".to_string()),
            (before, after) if before != after => {
                what.push(".git was replaced or now points elsewhere".to_string())
            }
            _ => {}
        }
        if what.is_empty() {
            for ((name, before), (_, after)) in self.marks.parts.iter().zip(&now.parts) {
                match (before, after) {
                    (None, Some(_)) => what.push(format!(".git/{name} was created")),
                    (Some(_), None) => what.push(format!(".git/{name} was removed")),
                    (Some(a), Some(b)) if a != b => what.push(format!(".git/{name} was changed")),
                    _ => {}
                }
            }
        }
        let mut check = vec![self.root.join(".git")];
        let known = |id: &Option<(u64, u64)>| {
            id.is_some() && self.marks.nested.iter().any(|(_, before)| before == id)
        };
        for (path, _) in now.nested.iter().filter(|(_, id)| !known(id)) {
            what.push(format!(
                "a new repository appeared at {} (its config and hooks are the command's)",
                path.display()
            ));
            check.push(path.clone());
        }
        if what.is_empty() {
            return None;
        }
        let check: Vec<String> = check.iter().map(|p| p.display().to_string()).collect();
        Some(format!(
            "[notice: this command changed the workspace's git setup: {}. Git config and hooks can name programs: the runtime's own git runs none of them, but check {} before running git there yourself.]",
            what.join("; "),
            check.join(" and ")
        ))
    }
}

impl GitMarks {
    fn of(workspace: &Path) -> GitMarks {
        use std::os::unix::fs::MetadataExt;
        let dot = workspace.join(".git");
        let (dot_git, git_dir) = match std::fs::symlink_metadata(&dot) {
            Err(_) => (DotGit::Missing, None),
            Ok(meta) if meta.is_dir() => (DotGit::Folder(meta.dev(), meta.ino()), Some(dot)),
            Ok(meta) if meta.is_file() => (
                DotGit::File(read_small(&dot).unwrap_or_default()),
                crate::git::read_git_file(&dot),
            ),
            Ok(meta) if meta.file_type().is_symlink() => (
                DotGit::Link(std::fs::read_link(&dot).unwrap_or_default()),
                None,
            ),
            Ok(_) => (DotGit::Other, None),
        };
        let mut parts: Vec<(String, Option<Vec<u8>>)> = WATCHED_PARTS
            .iter()
            .map(|name| {
                let bytes = git_dir.as_ref().and_then(|dir| read_small(&dir.join(name)));
                (name.to_string(), bytes)
            })
            .collect();
        let hooks = git_dir.as_ref().and_then(|dir| {
            let mut names: Vec<String> = std::fs::read_dir(dir.join("hooks"))
                .ok()?
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            Some(names.join("\n").into_bytes())
        });
        parts.push(("hooks".to_string(), hooks));
        GitMarks {
            dot_git,
            parts,
            nested: nested_git(workspace)
                .into_iter()
                .map(|path| {
                    let id = std::fs::symlink_metadata(&path)
                        .ok()
                        .map(|meta| (meta.dev(), meta.ino()));
                    (path, id)
                })
                .collect(),
        }
    }
}

/// A small file's bytes (a symlink's target instead of following it); `None` when missing.
fn read_small(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    if let Ok(target) = std::fs::read_link(path) {
        // A symlink in a part's place is a change of its own (git follows it).
        let mut bytes = b"symlink to ".to_vec();
        bytes.extend_from_slice(target.as_os_str().as_encoded_bytes());
        return Some(bytes);
    }
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let mut bytes = Vec::new();
    file.take(WATCH_BYTES).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}
