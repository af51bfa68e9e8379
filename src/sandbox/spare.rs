//! Spare sandboxes: the next command's sandbox is started while the current command runs, so a command finds its namespaces and mounts ready instead of waiting for them (the ~6 ms bubblewrap needs).
//!
//! A spare is bubblewrap with the exact command line a fresh sandbox would get, except
//! that in place of the command its shell runs a loader: it reads the script from fd 3,
//! closes it and `exec`s `sh -c script`, so the command runs as it would have in a fresh
//! sandbox (same `$0`, same shell, fd 3 closed). A spare is used only when the sandbox
//! the command needs now has the same command line, environment and limits as the one
//! the spare was made with: a folder that appeared since (a `.git` whose hooks must be
//! read-only) changes the line, a folder bound in that was made anew under the same name
//! changes its inode, and either way the spare is thrown away. Spares are made only for
//! commands with no grant that run in the workspace itself, the common case; idle ones
//! are ended after [`IDLE`], and at most [`MAX_SPARES`] exist.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::{CommandSettings, Shell};

/// How long an unused spare lives: a model's next command comes within seconds, or the
/// turn is over and the processes are better gone.
const IDLE: Duration = Duration::from_secs(120);
/// Spares alive at once (one per workspace and sandbox is enough).
const MAX_SPARES: usize = 4;
/// The spare's shell script: the command text arrives on fd 3 (the command substitution
/// waits for its end), fd 3 is closed for the command, and `sh -c` runs it.
const LOADER: &str = "exec /bin/sh -c \"$(cat <&3)\" 3<&-";

/// What a sandbox is made of; a spare serves a command only if they are equal.
#[derive(PartialEq, Eq)]
pub(super) struct Key {
    workspace: PathBuf,
    settings: CommandSettings,
    /// bubblewrap's command line up to (not including) the script.
    argv: Vec<OsString>,
    /// The device and inode of each folder or file bound into the sandbox: one deleted
    /// and made again under the same name (a workspace cloned afresh, a `.git` made
    /// anew, whose new hooks the spare would not cover) is another sandbox.
    bound: Vec<Option<(u64, u64, Option<std::time::SystemTime>)>>,
    pub(super) env: Vec<(String, String)>,
}

impl Key {
    pub(super) fn new(
        workspace: &Path,
        settings: &CommandSettings,
        argv: &[OsString],
        env: Vec<(String, String)>,
    ) -> Key {
        use std::os::unix::fs::MetadataExt;
        let argv = argv[..argv.len().saturating_sub(1)].to_vec();
        let bound = argv
            .windows(2)
            .filter(|pair| pair[0] == "--bind" || pair[0] == "--ro-bind")
            .map(|pair| {
                std::fs::metadata(&pair[1])
                    .ok()
                    // With its birth time: a freed inode number is soon given to the
                    // next new file (ext4), and the birth time tells them apart.
                    .map(|meta| (meta.dev(), meta.ino(), meta.created().ok()))
            })
            .collect();
        Key {
            workspace: workspace.to_path_buf(),
            settings: settings.clone(),
            argv,
            bound,
            env,
        }
    }
}

struct Spare {
    key: Key,
    shell: Shell,
    /// The write end of the spare's fd 3.
    script: std::fs::File,
    made: Instant,
}

static POOL: Mutex<Vec<Spare>> = Mutex::new(Vec::new());
static MADE: (Mutex<u64>, Condvar) = (Mutex::new(0), Condvar::new());
static USED: AtomicU64 = AtomicU64::new(0);
static DISCARDED: AtomicU64 = AtomicU64::new(0);

/// Counts since the process started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpareStats {
    pub made: u64,
    pub used: u64,
    /// Spares thrown away unused: their sandbox no longer matched, they died, or idled out.
    pub discarded: u64,
}

pub fn spare_stats() -> SpareStats {
    SpareStats {
        made: *MADE.0.lock().unwrap_or_else(|p| p.into_inner()),
        used: USED.load(Ordering::Relaxed),
        discarded: DISCARDED.load(Ordering::Relaxed),
    }
}

fn pool() -> std::sync::MutexGuard<'static, Vec<Spare>> {
    POOL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Drops spares that idled out or that `keep` rejects (dropping one kills it).
fn discard(pool: &mut Vec<Spare>, keep: impl Fn(&Spare) -> bool) {
    let before = pool.len();
    pool.retain(|spare| spare.made.elapsed() < IDLE && keep(spare));
    DISCARDED.fetch_add((before - pool.len()) as u64, Ordering::Relaxed);
}

/// The spare made for exactly `key`, now running `command`; `None` when there is none.
pub(super) fn take(key: &Key, command: &str) -> Option<Shell> {
    let mut spare = {
        let mut pool = pool();
        // A spare of this workspace made for another sandbox will never serve it again.
        discard(&mut pool, |spare| {
            spare.key.workspace != key.workspace || spare.key == *key
        });
        let found = pool.iter().position(|spare| spare.key == *key)?;
        pool.remove(found)
    };
    let alive = spare
        .shell
        .child
        .as_mut()
        .is_some_and(|child| matches!(child.try_wait(), Ok(None)));
    if !alive || spare.script.write_all(command.as_bytes()).is_err() {
        DISCARDED.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    // Closing the write end ends the script for the loader.
    drop(spare.script);
    USED.fetch_add(1, Ordering::Relaxed);
    Some(spare.shell)
}

/// Asks for a spare for `key` unless one exists. It is made on a thread of its own, off
/// the command's path: starting a process with limits forks this (large) process, and for
/// root it joins a cgroup, which waits for an RCU grace period (up to ~20 ms measured on
/// an idle machine). A spare that cannot be made is no error: the next command starts its
/// own sandbox.
pub(super) fn refill(key: Key, settings: &CommandSettings) {
    if pool().iter().any(|spare| spare.key == key) {
        return;
    }
    static MAKER: OnceLock<Mutex<std::sync::mpsc::Sender<(Key, CommandSettings)>>> =
        OnceLock::new();
    let maker = MAKER.get_or_init(|| {
        let (send, receive) = std::sync::mpsc::channel::<(Key, CommandSettings)>();
        let _ = std::thread::Builder::new()
            .name("spare-sandboxes".into())
            .spawn(move || {
                loop {
                    match receive.recv_timeout(IDLE / 4) {
                        Ok((key, settings)) => make(key, &settings),
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                    // Also the idle ones' end, so an app left alone holds none for long.
                    discard(&mut pool(), |_| true);
                }
            });
        Mutex::new(send)
    });
    let _ = maker
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send((key, settings.clone()));
}

fn make(key: Key, settings: &CommandSettings) {
    // Asked twice before the first was made: one is enough.
    if pool().iter().any(|spare| spare.key == key) {
        return;
    }
    let Ok((script, read)) = pipe() else {
        return;
    };
    let mut argv = key.argv.clone();
    argv.push(LOADER.into());
    let shell = match super::spawn(&argv, &key.env, None, Some(settings), Some(read)) {
        Ok(shell) => shell,
        Err(err) => {
            tracing::debug!("no spare sandbox: {err}");
            return;
        }
    };
    {
        let mut pool = pool();
        pool.push(Spare {
            key,
            shell,
            script,
            made: Instant::now(),
        });
        if pool.len() > MAX_SPARES {
            pool.remove(0);
            DISCARDED.fetch_add(1, Ordering::Relaxed);
        }
    }
    let (made, signal) = &MADE;
    *made.lock().unwrap_or_else(|p| p.into_inner()) += 1;
    signal.notify_all();
}

/// Waits until a spare for `workspace` is ready, at most `timeout`; whether one is. For
/// tests: spares are made in the background.
pub fn wait_for_spare(workspace: &Path, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let (made, signal) = &MADE;
    // The pool is looked at with `made` held, and a spare is counted (and signalled)
    // under it after it was put in the pool: no spare can slip between look and wait.
    let mut guard = made.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if pool().iter().any(|spare| spare.key.workspace == workspace) {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        guard = signal
            .wait_timeout(guard, left)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

/// A pipe, both ends close-on-exec: (write end, read end).
fn pipe() -> std::io::Result<(std::fs::File, std::os::fd::OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array given.
    #[cfg(target_os = "linux")]
    let made = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    // Elsewhere (macOS has no pipe2) the flag follows at once; spares are only made where
    // bubblewrap runs, so this only has to build.
    // SAFETY: pipe writes two descriptors into the array given; fcntl only sets flags.
    #[cfg(not(target_os = "linux"))]
    let made = unsafe {
        let made = libc::pipe(fds.as_mut_ptr());
        if made == 0 {
            libc::fcntl(fds[0], libc::F_SETFD, libc::FD_CLOEXEC);
            libc::fcntl(fds[1], libc::F_SETFD, libc::FD_CLOEXEC);
        }
        made
    };
    if made != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just made by the kernel and are owned by nothing else.
    Ok(unsafe {
        (
            std::fs::File::from_raw_fd(fds[1]),
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
        )
    })
}
