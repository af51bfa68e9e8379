//! Systems without a sandbox yet (macOS will use Seatbelt, Windows its own): commands run unsandboxed and every one asks; the opened-file check reports "unknown" (macOS: `F_GETPATH`) so inside paths are never trusted blindly.

use std::path::{Path, PathBuf};

use super::{CommandSettings, Grant};

pub(super) fn detect(_configured: Option<&Path>) -> Result<(), String> {
    Err("no command sandbox on this system yet; every command asks for approval".into())
}

pub(super) fn sandbox_argv(
    _settings: &CommandSettings,
    _workspace: &Path,
    _cwd: &Path,
    _script: &std::ffi::OsStr,
    _grant: &Grant,
) -> Result<Vec<std::ffi::OsString>, String> {
    Err("no command sandbox on this system".into())
}

pub struct Cgroup;

pub(super) fn limit(
    _cmd: &mut std::process::Command,
    _settings: &CommandSettings,
) -> Option<Cgroup> {
    None
}

#[cfg(target_os = "macos")]
pub(super) fn opened_path(file: &std::fs::File) -> Option<PathBuf> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: F_GETPATH writes at most PATH_MAX bytes into the buffer given.
    let done = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETPATH, buf.as_mut_ptr()) };
    if done == -1 {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0)?;
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(&buf[..end])))
}

#[cfg(not(target_os = "macos"))]
pub(super) fn opened_path(_file: &std::fs::File) -> Option<PathBuf> {
    None
}

/// No one-call lookup here: the caller walks the path a name at a time (`O_NOFOLLOW`).
pub(super) fn open_no_symlinks(
    _path: &Path,
    _flags: libc::c_int,
    _mode: libc::mode_t,
) -> Option<std::io::Result<std::fs::File>> {
    None
}

pub(super) fn open_max() -> libc::c_int {
    // SAFETY: sysconf only returns a value.
    let max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) };
    libc::c_int::try_from(max)
        .unwrap_or(65536)
        .clamp(1024, 1 << 20)
}

/// Marks every descriptor from `first` to `max` close-on-exec, one `fcntl` each.
pub(super) fn cloexec_from(first: libc::c_int, max: libc::c_int) {
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
    cloexec_from(3, open_max());
}

/// No socket filter here: no sandbox line names one.
pub(super) const FILTER_FD: libc::c_int = 4;

pub(super) fn socket_filter_fd() -> Result<std::os::fd::OwnedFd, String> {
    Err("no socket filter on this system".into())
}
