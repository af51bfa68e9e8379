//! The OS sandbox for `run_command` and every other platform-only check (where an open file really is, opening a path without following symlinks, a non-dumpable process): Linux uses bubblewrap, `/proc` and `openat2`; other systems get a portable fallback that asks for everything.
//!
//! What a sandboxed command sees (Linux, bubblewrap):
//! - the system read-only, `/dev` and a fresh `/proc` of its own pid namespace (so the
//!   runtime's `/proc/<pid>/environ` and memory are not there), a private `/tmp`;
//! - the home folder hidden (an empty tmpfs) except the workspace, which is writable, and
//!   the read-only toolchain folders of [`CommandSettings::home_read_only`];
//! - `.git/config` and `.git/hooks` read-only: git itself works (objects, index, refs,
//!   commits), but a command cannot plant a hook or a `core.fsmonitor`/`core.pager` line
//!   that git would later run *outside* the sandbox when the person uses it;
//! - no network unless allowed; a new pid namespace, so nothing outlives the command
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

/// How `run_command` runs commands (`tools.run_command.sandbox` in the config, SPEC §11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "snake_case")]
pub enum CommandPolicy {
    /// Sandboxed, and run without asking; a command that wants the network (when not
    /// allowed) or runs outside the workspace asks first and says which. Where no sandbox
    /// works, every command asks.
    #[default]
    Sandbox,
    /// Sandboxed, and asks every time.
    Ask,
    /// Not sandboxed, and asks every time.
    Off,
}

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

/// Whether the sandbox works here, as `app_info` and the Settings page show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
pub struct SandboxStatus {
    pub available: bool,
    /// Why not, in words for the person (missing binary, user namespaces blocked, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub policy: CommandPolicy,
    /// `bubblewrap`, or `none`.
    pub kind: String,
}

static SETTINGS: RwLock<Option<CommandSettings>> = RwLock::new(None);

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
        "there is no network unless the person allows it for a command"
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

/// Builds the process for `sh -c command`: inside the sandbox when `sandboxed` (which the
/// caller decided from [`status_for`]), otherwise plain; either way with the allow-listed
/// environment only, and the process and memory limits applied before it starts.
pub fn shell_command(
    settings: &CommandSettings,
    workspace: &Path,
    cwd: &Path,
    command: &str,
    sandboxed: bool,
    grant: &Grant,
) -> Result<(tokio::process::Command, CommandGuard), String> {
    let mut cmd = if sandboxed {
        platform::sandboxed(settings, workspace, cwd, command, grant)?
    } else {
        let mut cmd = tokio::process::Command::new("/bin/sh");
        cmd.arg("-c").arg(command).current_dir(cwd);
        cmd
    };
    cmd.env_clear();
    cmd.envs(command_env(settings));
    // Nothing may wait for a person at a terminal that is not there.
    cmd.env("GIT_TERMINAL_PROMPT", "0")
        .env("PAGER", "cat")
        .env("GIT_PAGER", "cat");
    let mut guard = CommandGuard(None);
    if sandboxed {
        // The private /tmp, not the runtime's TMPDIR (which the sandbox does not show).
        cmd.env("TMPDIR", "/tmp");
        guard.0 = platform::limit(&mut cmd, settings);
    }
    Ok((cmd, guard))
}

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
