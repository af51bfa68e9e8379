//! Linux: bubblewrap for commands, `/proc/self/fd` for where an open file is, `openat2` for opening a path without following any symlink, `prctl` for a non-dumpable runtime, rlimits and a pids cgroup for limits.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use super::{CommandSettings, Grant};

/// The bubblewrap binary to use: the configured one, or `bwrap` on PATH.
fn bwrap_binary(configured: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(path) = configured {
        if path.is_file() {
            return Ok(path.to_path_buf());
        }
        return Err(format!(
            "the configured bubblewrap binary {} does not exist",
            path.display()
        ));
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("bwrap"))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            "bubblewrap (bwrap) is not installed or not on PATH; install the `bubblewrap` package"
                .to_string()
        })
}

pub(super) fn detect(configured: Option<&Path>) -> Result<(), String> {
    let bwrap = bwrap_binary(configured)?;
    let output = std::process::Command::new(&bwrap)
        .args([
            "--unshare-user",
            "--unshare-pid",
            "--unshare-net",
            "--die-with-parent",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--",
            "/bin/true",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|err| format!("cannot start {}: {err}", bwrap.display()))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "bubblewrap cannot create its namespaces here ({}); user namespaces may be blocked (Ubuntu 24.04's AppArmor restriction, or a container)",
        String::from_utf8_lossy(&output.stderr).trim()
    ))
}

/// The whole command line of bubblewrap running `script` with `sh -c`: the program first,
/// the script last (a spare sandbox is this line with a loader in the script's place).
pub(super) fn sandbox_argv(
    settings: &CommandSettings,
    workspace: &Path,
    cwd: &Path,
    script: &std::ffi::OsStr,
    grant: &Grant,
) -> Result<Vec<std::ffi::OsString>, String> {
    let bwrap = bwrap_binary(settings.bwrap.as_deref())?;
    let mut args: Vec<std::ffi::OsString> = vec![bwrap.into_os_string()];
    let mut add = |items: &[&std::ffi::OsStr]| args.extend(items.iter().map(|s| s.to_os_string()));
    let os = |s: &'static str| std::ffi::OsStr::new(s);
    add(&[
        os("--die-with-parent"),
        os("--new-session"),
        os("--unshare-user"),
        os("--unshare-pid"),
        // SysV IPC and message queues of the session stay out of reach. (A UTS or
        // cgroup namespace would cost time per command and hide nothing secret.)
        os("--unshare-ipc"),
        os("--cap-drop"),
        os("ALL"),
    ]);
    if !grant.network {
        add(&[os("--unshare-net")]);
        // Host Unix sockets anywhere in the filesystem (security review 2, finding 5): the
        // network namespace covers abstract ones, the tmpfs on /run those there, and this
        // filter the rest (`socket_filter`); `super::spawn` hands it to bwrap at this fd.
        if socket_filter().is_some() {
            add(&[os("--seccomp"), os(FILTER_FD_ARG)]);
        }
    }
    add(&[
        os("--ro-bind"),
        os("/"),
        os("/"),
        os("--dev"),
        os("/dev"),
        os("--proc"),
        os("/proc"),
        os("--tmpfs"),
        os("/tmp"),
    ]);
    // Host Unix sockets live under /run (security review 2, finding 5): the Docker
    // socket (root on the host for the docker group), the system bus, systemd's, CUPS',
    // and in /run/user the person's session bus, keyring and agent sockets. A read-only
    // mount does not stop `connect()`, and no network namespace covers them: /run is an
    // empty tmpfs, with back only what commands read from there (see `run_keep`).
    for (flag, from, to) in run_keep(grant.network) {
        if flag == "--tmpfs" {
            add(&[os(flag), to.as_os_str()]);
        } else {
            add(&[os(flag), from.as_os_str(), to.as_os_str()]);
        }
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute() && h.is_dir() && h != Path::new("/"))
        .and_then(|h| h.canonicalize().ok());
    let ws = workspace.as_os_str();
    let hide_home = |add: &mut dyn FnMut(&[&std::ffi::OsStr]), home: &Path| {
        add(&[os("--tmpfs"), home.as_os_str()]);
        for name in &settings.home_read_only {
            let path = home.join(name);
            if path.starts_with(home) && !name.contains("..") && path.exists() {
                add(&[os("--ro-bind"), path.as_os_str(), path.as_os_str()]);
            }
        }
    };
    // The runtime's data dir and config (`super::hide`): those that hold the workspace
    // (a worktree in the data dir) are hidden before the workspace is bound, the others
    // after it (a data dir inside the workspace).
    let (holding, other): (Vec<PathBuf>, Vec<PathBuf>) = super::hidden()
        .into_iter()
        .partition(|path| workspace.starts_with(path));
    for path in &holding {
        add(&[os("--tmpfs"), path.as_os_str()]);
    }
    match &home {
        // The workspace lies in the home folder: hide the home folder, then show the workspace.
        Some(home) if workspace.starts_with(home) => {
            hide_home(&mut add, home);
            add(&[os("--bind"), ws, ws]);
        }
        Some(home) => {
            add(&[os("--bind"), ws, ws]);
            hide_home(&mut add, home);
        }
        None => add(&[os("--bind"), ws, ws]),
    }
    // Folders are hidden behind a tmpfs (made read-only below), files behind /dev/null.
    let (other_dirs, other_files): (Vec<&PathBuf>, Vec<&PathBuf>) =
        other.iter().partition(|path| path.is_dir());
    for path in &other_dirs {
        add(&[os("--tmpfs"), path.as_os_str()]);
    }
    for path in &other_files {
        add(&[os("--ro-bind"), os("/dev/null"), path.as_os_str()]);
    }
    for folder in &grant.writable {
        add(&[os("--bind"), folder.as_os_str(), folder.as_os_str()]);
    }
    // Git runs hooks and config-named programs (core.fsmonitor, core.pager, filters)
    // outside the sandbox when the person uses it later: see `git_binds`.
    for (flag, path) in git_binds(workspace) {
        add(&[os(flag), path.as_os_str(), path.as_os_str()]);
    }
    // The folders hidden behind a tmpfs are made read-only once everything under them is
    // bound (bwrap's remount does not recurse into those binds): a write there, beside a
    // workspace in the home folder, then fails with EROFS instead of landing in a tmpfs
    // that vanishes with the command (UX review E11). /tmp stays the command's scratch.
    let hiding = home.iter().chain(&holding).chain(other_dirs);
    for path in hiding {
        add(&[os("--remount-ro"), path.as_os_str()]);
    }
    add(&[
        os("--chdir"),
        cwd.as_os_str(),
        os("--"),
        os("/bin/sh"),
        os("-c"),
    ]);
    args.push(script.to_os_string());
    Ok(args)
}

/// How /run (and /var/run, where it is a folder of its own) is shown: an empty tmpfs, and
/// back from the host only plain files and links commands read there, never a socket
/// folder: with the network, the folder `/etc/resolv.conf` leads to (systemd-resolved's
/// or resolvconf's), for name resolution; always, NixOS's system links
/// (`/run/current-system` holds its PATH). `(flag, source, destination)` triples.
fn run_keep(network: bool) -> Vec<(&'static str, PathBuf, PathBuf)> {
    let mut keep = Vec::new();
    for run in ["/run", "/var/run"] {
        let path = Path::new(run);
        // /var/run is a symlink to /run on most systems: hidden with it.
        if path.is_dir() && !path.is_symlink() {
            keep.push(("--tmpfs", path.to_path_buf(), path.to_path_buf()));
        }
    }
    let mut back: Vec<PathBuf> = [
        "/run/current-system",
        "/run/booted-system",
        "/run/opengl-driver",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    if network {
        if let Some(folder) = Path::new("/etc/resolv.conf")
            .canonicalize()
            .ok()
            .and_then(|real| real.parent().map(Path::to_path_buf))
        {
            back.push(folder);
        }
    }
    for path in back {
        let under_run = path.starts_with("/run") || path.starts_with("/var/run");
        if !under_run || path == Path::new("/run") || path == Path::new("/var/run") {
            continue;
        }
        match std::fs::read_link(&path) {
            Ok(target) => keep.push(("--symlink", target, path)),
            Err(_) if path.is_dir() => keep.push(("--ro-bind", path.clone(), path)),
            Err(_) => {}
        }
    }
    keep
}

/// The descriptor a command's socket filter reaches bubblewrap at (`--seccomp`), in the
/// command line as text.
pub(super) const FILTER_FD: libc::c_int = 4;
const FILTER_FD_ARG: &str = "4";

/// The seccomp program (classic BPF, as bubblewrap's `--seccomp` reads it) that keeps a
/// command without network away from every Unix socket of the host, wherever its path is
/// (`/var/lib/…`, `/srv`, a folder beside the workspace; security review 2, finding 5).
/// A filter cannot read the address a `connect` names, so it refuses what every such
/// connection needs: a Unix socket of its own. Refused with EPERM: `socket(AF_UNIX, …)`,
/// `socketpair(AF_UNIX, SOCK_DGRAM)` (a datagram socket may be connected again, to any
/// path), and io_uring, whose requests make sockets and connect without a system call
/// the filter sees. Kept: `socketpair(AF_UNIX)` of stream and seqpacket sockets (already
/// connected to each other for good; shells, Node, Python's asyncio and cargo use them),
/// and every other family (TCP on the sandbox's own loopback works). On x86_64 the x32
/// numbers and i386's (`socketcall` included) are covered too; a process of any other
/// architecture is killed. `None` on an architecture this does not know: the command
/// then has no filter (README says so).
pub(super) fn socket_filter() -> Option<&'static [u8]> {
    static PROGRAM: std::sync::OnceLock<Option<Vec<u8>>> = std::sync::OnceLock::new();
    PROGRAM.get_or_init(build_socket_filter).as_deref()
}

/// One instruction of the program being assembled; jumps name labels, resolved after.
enum Op {
    /// Load the 32-bit word at this offset of `struct seccomp_data`.
    Load(u32),
    /// A &= k.
    And(u32),
    /// Jump to the first label if A == k, else to the second.
    JumpIf(u32, &'static str, &'static str),
    Return(u32),
    Label(&'static str),
}

fn assemble(ops: &[Op]) -> Option<Vec<u8>> {
    const LD_W_ABS: u16 = 0x20;
    const ALU_AND_K: u16 = 0x54;
    const JMP_JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    let mut labels = std::collections::HashMap::new();
    let mut at = 0usize;
    for op in ops {
        match op {
            Op::Label(name) => {
                labels.insert(*name, at);
            }
            _ => at += 1,
        }
    }
    let mut bytes = Vec::with_capacity(at * 8);
    let mut at = 0usize;
    for op in ops {
        let (code, jt, jf, k) = match op {
            Op::Label(_) => continue,
            Op::Load(offset) => (LD_W_ABS, 0, 0, *offset),
            Op::And(mask) => (ALU_AND_K, 0, 0, *mask),
            Op::Return(value) => (RET_K, 0, 0, *value),
            Op::JumpIf(value, yes, no) => {
                // Jumps are relative to the next instruction and go forward only.
                let offset = |label: &str| -> Option<u8> {
                    let to = *labels.get(label)?;
                    u8::try_from(to.checked_sub(at + 1)?).ok()
                };
                (JMP_JEQ_K, offset(yes)?, offset(no)?, *value)
            }
        };
        bytes.extend_from_slice(&code.to_ne_bytes());
        bytes.push(jt);
        bytes.push(jf);
        bytes.extend_from_slice(&k.to_ne_bytes());
        at += 1;
    }
    Some(bytes)
}

fn build_socket_filter() -> Option<Vec<u8>> {
    // `struct seccomp_data`: nr at 0, arch at 4, then six 64-bit arguments from 16; the
    // kernel reads `int` arguments from their low half, which comes first (little-endian).
    const NR: u32 = 0;
    const ARCH: u32 = 4;
    const ARG0: u32 = 16;
    const ARG1: u32 = 24;
    const ALLOW: u32 = 0x7fff_0000;
    const KILL_PROCESS: u32 = 0x8000_0000;
    const DENY: u32 = 0x0005_0000 | libc::EPERM as u32;
    const SOCK_TYPE_MASK: u32 = 0xf;
    const IO_URING: [u32; 3] = [425, 426, 427];
    let (native_arch, x32_bit): (u32, Option<u32>) = if cfg!(target_arch = "x86_64") {
        (0xC000_003E, Some(0x4000_0000))
    } else if cfg!(target_arch = "aarch64") {
        (0xC000_00B7, None)
    } else if cfg!(target_arch = "riscv64") {
        (0xC000_00F3, None)
    } else {
        return None;
    };
    if !cfg!(target_endian = "little") {
        return None;
    }
    let unix = libc::AF_UNIX as u32;
    let dgram = libc::SOCK_DGRAM as u32;
    let mut ops = vec![
        Op::Load(ARCH),
        Op::JumpIf(native_arch, "native", "foreign"),
        Op::Label("native"),
        Op::Load(NR),
    ];
    if let Some(bit) = x32_bit {
        // x32 calls are the x86_64 numbers with this bit set.
        ops.push(Op::And(!bit));
    }
    ops.extend([
        Op::JumpIf(libc::SYS_socket as u32, "socket", "native-pair"),
        Op::Label("native-pair"),
        Op::JumpIf(libc::SYS_socketpair as u32, "pair", "native-uring0"),
        Op::Label("native-uring0"),
        Op::JumpIf(IO_URING[0], "deny", "native-uring1"),
        Op::Label("native-uring1"),
        Op::JumpIf(IO_URING[1], "deny", "native-uring2"),
        Op::Label("native-uring2"),
        Op::JumpIf(IO_URING[2], "deny", "allow"),
        Op::Label("foreign"),
    ]);
    if cfg!(target_arch = "x86_64") {
        // i386 programs on x86_64: socket 359, socketpair 360, and `socketcall` (102),
        // whose arguments lie in memory the filter cannot read: its socket (1) and
        // socketpair (8) are refused whatever the family.
        ops.extend([
            Op::JumpIf(0x4000_0003, "i386", "kill"),
            Op::Label("i386"),
            Op::Load(NR),
            Op::JumpIf(359, "socket", "i386-pair"),
            Op::Label("i386-pair"),
            Op::JumpIf(360, "pair", "i386-call"),
            Op::Label("i386-call"),
            Op::JumpIf(102, "socketcall", "i386-uring0"),
            Op::Label("i386-uring0"),
            Op::JumpIf(IO_URING[0], "deny", "i386-uring1"),
            Op::Label("i386-uring1"),
            Op::JumpIf(IO_URING[1], "deny", "i386-uring2"),
            Op::Label("i386-uring2"),
            Op::JumpIf(IO_URING[2], "deny", "allow"),
            Op::Label("socketcall"),
            Op::Load(ARG0),
            Op::JumpIf(1, "deny", "socketcall-pair"),
            Op::Label("socketcall-pair"),
            Op::JumpIf(8, "deny", "allow"),
        ]);
    }
    // Shared by both architectures' numbers; after them, as jumps only go forward.
    ops.extend([
        Op::Label("socket"),
        Op::Load(ARG0),
        Op::JumpIf(unix, "deny", "allow"),
        Op::Label("pair"),
        Op::Load(ARG0),
        Op::JumpIf(unix, "pair-type", "allow"),
        Op::Label("pair-type"),
        Op::Load(ARG1),
        Op::And(SOCK_TYPE_MASK),
        Op::JumpIf(dgram, "deny", "allow"),
        Op::Label("kill"),
        Op::Return(KILL_PROCESS),
        Op::Label("allow"),
        Op::Return(ALLOW),
        Op::Label("deny"),
        Op::Return(DENY),
    ]);
    assemble(&ops)
}

/// A pipe holding the socket filter, its read end to be put at [`FILTER_FD`] for
/// bubblewrap (which reads it to the end and closes it before the command starts).
pub(super) fn socket_filter_fd() -> Result<std::os::fd::OwnedFd, String> {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    let program = socket_filter().ok_or("no socket filter for this architecture")?;
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!(
            "cannot make a pipe for the socket filter: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: both descriptors were just made by the kernel and are owned by nothing else.
    let (read, mut write) = unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    };
    // A few hundred bytes: far below a pipe's buffer, so this never blocks.
    write
        .write_all(program)
        .map_err(|err| format!("cannot write the socket filter: {err}"))?;
    Ok(read)
}

/// The most git dirs (worktrees, submodules) of one workspace protected one by one: past
/// it, the command line would grow without bound; the rest stay as they are (and the
/// runtime's git is hardened regardless, `crate::git`).
const MAX_GIT_DIRS: usize = 64;

/// What of the workspace's `.git` is bound, and how (security review 2, finding 1): a
/// `.git` folder onto itself, so that it is a mount point a command cannot rename or
/// replace; a `.git` file read-only, and the git dir it names (when inside the workspace)
/// like a `.git` folder; in each git dir the parts that decide which config and hooks git
/// uses read-only: `config`, `hooks`, `info`, `commondir`, `config.worktree`, `gitdir`, and
/// the same parts of its linked worktrees' and submodules' git dirs. Objects, refs, the
/// index and HEAD stay writable, so git itself works in the sandbox. A part that does not
/// exist yet (a `commondir`) cannot be bound; `GitWatch` reports one that appears. The
/// same for every nested repository [`super::nested_git`] finds.
pub(super) fn git_binds(workspace: &Path) -> Vec<(&'static str, PathBuf)> {
    let mut binds = Vec::new();
    let workspace = workspace
        .canonicalize()
        .unwrap_or_else(|_| workspace.to_path_buf());
    let mut count = 0;
    protect_dot_git(&workspace, &workspace.join(".git"), &mut binds, &mut count);
    // Nested repositories (`vendor/lib/.git`, a package's own repository): the person's
    // git would run their hooks and config as it would the workspace's.
    for dot_git in super::nested_git(&workspace) {
        protect_dot_git(&workspace, &dot_git, &mut binds, &mut count);
    }
    // A git dir reached twice (a submodule's checkout names one under `.git/modules`,
    // already protected) is bound once.
    let mut seen = std::collections::HashSet::new();
    binds.retain(|(_, path)| seen.insert(path.clone()));
    binds
}

/// The binds for one `.git` (the workspace's or a nested repository's): see [`git_binds`].
fn protect_dot_git(
    workspace: &Path,
    dot_git: &Path,
    binds: &mut Vec<(&'static str, PathBuf)>,
    count: &mut usize,
) {
    let Ok(meta) = std::fs::symlink_metadata(dot_git) else {
        return;
    };
    if meta.is_dir() {
        binds.push(("--bind", dot_git.to_path_buf()));
        protect_git_dir(workspace, dot_git, binds, count, 0);
    } else if meta.is_file() {
        binds.push(("--ro-bind", dot_git.to_path_buf()));
        let named = crate::git::read_git_file(dot_git).and_then(|p| p.canonicalize().ok());
        if let Some(named) = named.filter(|n| n.starts_with(workspace) && n.is_dir()) {
            if named != workspace {
                binds.push(("--bind", named.clone()));
            }
            protect_git_dir(workspace, &named, binds, count, 0);
        }
    }
}

fn protect_git_dir(
    workspace: &Path,
    git_dir: &Path,
    binds: &mut Vec<(&'static str, PathBuf)>,
    count: &mut usize,
    depth: usize,
) {
    *count += 1;
    if *count > MAX_GIT_DIRS || depth > 3 {
        return;
    }
    // A main git dir (no commondir) gets `hooks` and `info` made when missing, so that
    // they can be bound: a command could create them otherwise.
    if !git_dir.join("commondir").exists() {
        for folder in ["hooks", "info"] {
            let path = git_dir.join(folder);
            if std::fs::symlink_metadata(&path).is_err() {
                let _ = std::fs::create_dir(&path);
            }
        }
    }
    for part in [
        "config",
        "hooks",
        "info",
        "commondir",
        "config.worktree",
        "gitdir",
    ] {
        // Bound where it really is (a part may be a symlink to a file in the workspace,
        // which would stay writable); outside the workspace everything is read-only.
        let Ok(real) = git_dir.join(part).canonicalize() else {
            continue;
        };
        if real.starts_with(workspace) {
            binds.push(("--ro-bind", real));
        }
    }
    for nested in ["worktrees", "modules"] {
        let Ok(entries) = std::fs::read_dir(git_dir.join(nested)) else {
            continue;
        };
        let mut dirs: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
        dirs.sort();
        for dir in dirs {
            protect_git_dir(workspace, &dir, binds, count, depth + 1);
        }
    }
}

/// Processes running under this user now, so the process limit is "this many more".
fn user_processes() -> u64 {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .bytes()
                        .all(|b| b.is_ascii_digit())
                })
                .filter(|e| e.metadata().is_ok_and(|m| m.uid() == uid))
                .count() as u64
        })
        .unwrap_or(0)
}

/// A pids cgroup for one command, removed when dropped. Used where the process rlimit
/// does not hold (the kernel never applies RLIMIT_NPROC to root).
pub struct Cgroup(PathBuf);

impl Drop for Cgroup {
    fn drop(&mut self) {
        // The namespace's processes are killed with its init; their exit is asynchronous,
        // so the (then empty) group is removed by a short-lived thread that retries.
        let path = std::mem::take(&mut self.0);
        // Often already empty: then no thread is needed.
        if std::fs::remove_dir(&path).is_ok() {
            return;
        }
        std::thread::spawn(move || {
            for _ in 0..50 {
                if std::fs::remove_dir(&path).is_ok() || !path.exists() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            tracing::warn!("could not remove the command cgroup {}", path.display());
        });
    }
}

/// Removes the command cgroups a runtime left when it exited before their clean-up
/// threads ran (shutdown with spares alive): those of a process that is gone, and the
/// unnamed ones of older versions once a minute old (one just made by an older runtime
/// still running is spared). `rmdir` refuses a cgroup with processes in it.
fn sweep_cgroups(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("bumblehive-") else {
            continue;
        };
        let stale = match rest.split_once('-') {
            Some((pid, _)) => match pid.parse::<libc::pid_t>() {
                Ok(pid) => {
                    // SAFETY: kill with signal 0 only checks whether the process exists.
                    let alive = unsafe { libc::kill(pid, 0) } == 0;
                    !alive && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
                }
                Err(_) => false,
            },
            None => entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > std::time::Duration::from_secs(60)),
        };
        if stale {
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

fn pids_cgroup(max: u64) -> Option<Cgroup> {
    for base in [
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup",
    ] {
        let base = Path::new(base);
        if !base.join("cgroup.procs").exists() {
            continue;
        }
        sweep_cgroups(base);
        // Named with our pid, so that a later process knows when its owner is gone.
        let dir = base.join(format!(
            "bumblehive-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        if std::fs::create_dir(&dir).is_err() {
            continue;
        }
        if std::fs::write(dir.join("pids.max"), max.to_string()).is_ok() {
            return Some(Cgroup(dir));
        }
        let _ = std::fs::remove_dir(&dir);
    }
    None
}

pub(super) fn limit(cmd: &mut std::process::Command, settings: &CommandSettings) -> Option<Cgroup> {
    use std::os::unix::process::CommandExt;
    let nproc = user_processes().saturating_add(settings.max_processes) as libc::rlim_t;
    let data = settings.max_memory_mb.saturating_mul(1024 * 1024) as libc::rlim_t;
    // SAFETY: getuid has no preconditions.
    let root = unsafe { libc::getuid() } == 0;
    let cgroup = if root {
        pids_cgroup(settings.max_processes)
    } else {
        None
    };
    let procs = cgroup
        .as_ref()
        .and_then(|c| CString::new(c.0.join("cgroup.procs").as_os_str().as_encoded_bytes()).ok());
    // SAFETY: between fork and exec only async-signal-safe calls are made (setrlimit,
    // open, write, close), on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let set = |resource, value: libc::rlim_t| {
                let limit = libc::rlimit {
                    rlim_cur: value,
                    rlim_max: value,
                };
                libc::setrlimit(resource, &limit)
            };
            set(libc::RLIMIT_NPROC, nproc);
            set(libc::RLIMIT_DATA, data);
            set(libc::RLIMIT_CORE, 0);
            if let Some(procs) = &procs {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if written != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cgroup
}

/// `openat2` with `RESOLVE_NO_SYMLINKS`: the kernel opens `path` only if no name on the
/// way is a symlink, in one atomic lookup. `None` where the kernel has no `openat2`
/// (before 5.6) or a seccomp filter hides it (some container runtimes answer EPERM).
pub(super) fn open_no_symlinks(
    path: &Path,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> Option<std::io::Result<std::fs::File>> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    static MISSING: AtomicBool = AtomicBool::new(false);
    if MISSING.load(Ordering::Relaxed) {
        return None;
    }
    let Ok(name) = CString::new(path.as_os_str().as_bytes()) else {
        return Some(Err(std::io::ErrorKind::InvalidInput.into()));
    };
    // The kernel's `struct open_how` (libc's is non-exhaustive, so it cannot be built).
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        // The kernel refuses a mode without O_CREAT.
        mode: if flags & libc::O_CREAT != 0 {
            u64::from(mode)
        } else {
            0
        },
        resolve: libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: `name` is NUL-terminated and `how` lives across the call; the size given is
    // the struct's own.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            name.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::ENOSYS) => {
                MISSING.store(true, Ordering::Relaxed);
                None
            }
            Some(libc::EPERM) => None,
            _ => Some(Err(err)),
        };
    }
    // SAFETY: the kernel just returned this descriptor, and nothing else owns it.
    Some(Ok(unsafe { std::fs::File::from_raw_fd(fd as libc::c_int) }))
}

pub(super) fn opened_path(file: &std::fs::File) -> Option<PathBuf> {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
}

/// The highest descriptor number to walk when the kernel has no `close_range`.
pub(super) fn open_max() -> libc::c_int {
    // SAFETY: sysconf only returns a value.
    let max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) };
    libc::c_int::try_from(max)
        .unwrap_or(65536)
        .clamp(1024, 1 << 20)
}

/// Marks every descriptor from `first` on close-on-exec: `close_range` (Linux 5.11), else
/// one `fcntl` per number up to `max`. Async-signal-safe (used between fork and exec).
pub(super) fn cloexec_from(first: libc::c_int, max: libc::c_int) {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags on descriptors.
    let done = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if done == 0 {
        return;
    }
    for fd in first..max {
        // SAFETY: fcntl on a number that may not be open fails with EBADF, harmlessly.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

pub(super) fn harden_process() {
    // Whatever started the runtime may have left descriptors open without close-on-exec;
    // every program the runtime starts (MCP servers included) would inherit them.
    cloexec_from(3, open_max());
    // SAFETY: PR_SET_DUMPABLE takes an integer and touches no memory of ours.
    let done = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if done != 0 {
        tracing::warn!(
            "could not make the process non-dumpable: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_runtime_becomes_non_dumpable() {
        // SAFETY: PR_GET_DUMPABLE only returns a value.
        assert_eq!(unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) }, 1);
        super::harden_process();
        // SAFETY: as above.
        assert_eq!(unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) }, 0);
    }

    /// The socket filter assembles (every jump forward and in range) where it is meant
    /// to exist: a program that failed to build would leave commands without it.
    #[test]
    fn the_socket_filter_assembles() {
        if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
            let program = super::socket_filter().expect("no socket filter");
            assert_eq!(program.len() % 8, 0);
            assert!(program.len() / 8 < 64, "{} instructions", program.len() / 8);
        }
    }

    /// Runs the socket filter on one system call as the kernel would (the four opcodes it
    /// uses): its verdict.
    fn verdict(arch: u32, nr: u32, args: [u64; 2]) -> u32 {
        let program = super::socket_filter().unwrap();
        let mut data = Vec::new();
        data.extend_from_slice(&nr.to_ne_bytes());
        data.extend_from_slice(&arch.to_ne_bytes());
        data.extend_from_slice(&0u64.to_ne_bytes());
        for arg in args {
            data.extend_from_slice(&arg.to_ne_bytes());
        }
        let (mut pc, mut a) = (0usize, 0u32);
        loop {
            let ins = &program[pc * 8..pc * 8 + 8];
            let code = u16::from_ne_bytes([ins[0], ins[1]]);
            let (jt, jf) = (ins[2] as usize, ins[3] as usize);
            let k = u32::from_ne_bytes([ins[4], ins[5], ins[6], ins[7]]);
            pc += 1;
            match code {
                0x20 => {
                    let at = k as usize;
                    a = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap());
                }
                0x54 => a &= k,
                0x15 => pc += if a == k { jt } else { jf },
                0x06 => return k,
                other => panic!("opcode {other:#x}"),
            }
        }
    }

    /// What the filter refuses and lets through, call by call, on x86_64: its own
    /// numbers, the x32 ones and those of i386 programs (`socketcall` included).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_socket_filter_refuses_unix_sockets_only() {
        const X86_64: u32 = 0xC000_003E;
        const I386: u32 = 0x4000_0003;
        const ALLOW: u32 = 0x7fff_0000;
        const EPERM: u32 = 0x0005_0001;
        const KILL: u32 = 0x8000_0000;
        let unix = libc::AF_UNIX as u64;
        let inet = libc::AF_INET as u64;
        let stream = libc::SOCK_STREAM as u64;
        let dgram = (libc::SOCK_DGRAM | libc::SOCK_CLOEXEC) as u64;
        let cases = [
            ("socket(AF_UNIX)", X86_64, 41, [unix, stream], EPERM),
            // The kernel reads an int: high bits set do not make it another family.
            (
                "socket(AF_UNIX | 1<<32)",
                X86_64,
                41,
                [unix | 1 << 32, stream],
                EPERM,
            ),
            ("socket(AF_INET)", X86_64, 41, [inet, stream], ALLOW),
            (
                "x32 socket(AF_UNIX)",
                X86_64,
                41 | 0x4000_0000,
                [unix, stream],
                EPERM,
            ),
            (
                "socketpair(AF_UNIX, STREAM)",
                X86_64,
                53,
                [unix, stream],
                ALLOW,
            ),
            (
                "socketpair(AF_UNIX, DGRAM)",
                X86_64,
                53,
                [unix, dgram],
                EPERM,
            ),
            ("io_uring_setup", X86_64, 425, [0, 0], EPERM),
            ("connect", X86_64, 42, [3, 0], ALLOW),
            ("read", X86_64, 0, [0, 0], ALLOW),
            ("i386 socket(AF_UNIX)", I386, 359, [unix, stream], EPERM),
            ("i386 socket(AF_INET)", I386, 359, [inet, stream], ALLOW),
            (
                "i386 socketpair(AF_UNIX, DGRAM)",
                I386,
                360,
                [unix, dgram],
                EPERM,
            ),
            ("i386 socketcall(SOCKET)", I386, 102, [1, 0], EPERM),
            ("i386 socketcall(SOCKETPAIR)", I386, 102, [8, 0], EPERM),
            ("i386 socketcall(CONNECT)", I386, 102, [3, 0], ALLOW),
            ("i386 io_uring_enter", I386, 426, [0, 0], EPERM),
            ("i386 read", I386, 3, [0, 0], ALLOW),
            (
                "another architecture",
                0xC000_00B7,
                198,
                [unix, stream],
                KILL,
            ),
        ];
        for (what, arch, nr, args, expected) in cases {
            assert_eq!(verdict(arch, nr, args), expected, "{what}");
        }
    }
}
