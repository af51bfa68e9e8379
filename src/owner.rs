//! One process owns a data folder (SPEC §12.7): an exclusive lock taken at start, so recovery only ever touches sessions no live process runs.
//!
//! Why a lock and not per-session care: recovery treats every session found "running" as
//! cut off by a crash. A second process on the same folder (a second window, `bumblehive
//! run` beside the desktop) would "recover" the first one's live runs: answer a call that
//! is still waiting for an approval with "Interrupted", pause the session, and leave two
//! results for one call (runtime review R7).
//!
//! The lock is a POSIX record lock (`fcntl(F_SETLK)`), not `flock`: it belongs to the
//! process, so no child (a command forked but not yet exec'd when the app is killed) ever
//! holds it, and the kernel drops it the moment the process dies. Such a lock does not
//! exclude the process itself, so owners within this process are kept in a set as well.

use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The data folders this process owns (a record lock does not exclude its own process).
static OWNED: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

/// The lock file's name inside the data folder; it holds the owner's pid.
pub const LOCK_FILE: &str = "owner.lock";

/// Why the data folder could not be owned.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    #[error(
        "the data folder {folder} is in use by another Bumblehive process (pid {pid}); close that one first, or start this one with another --data-dir"
    )]
    InUse { folder: String, pid: String },
    #[error("cannot lock the data folder {folder}: {source}")]
    Io {
        folder: String,
        #[source]
        source: std::io::Error,
    },
}

/// The held lock; dropping it lets the folder go.
#[derive(Debug)]
pub struct DataLock {
    _file: File,
    path: PathBuf,
    /// The folder as `OWNED` names it.
    key: PathBuf,
}

fn owned() -> std::sync::MutexGuard<'static, Option<HashSet<PathBuf>>> {
    OWNED.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for DataLock {
    fn drop(&mut self) {
        if let Some(set) = owned().as_mut() {
            set.remove(&self.key);
        }
    }
}

impl DataLock {
    /// Makes the folder (private) if it is missing, then takes it.
    pub fn take(data_dir: &Path) -> Result<DataLock, crate::error::RuntimeError> {
        crate::fsutil::private_dir(data_dir)
            .map_err(|err| crate::error::StoreError::io(data_dir, err))?;
        Ok(DataLock::acquire(data_dir)?)
    }

    /// Takes the folder, or says who has it. Never waits.
    pub fn acquire(data_dir: &Path) -> Result<DataLock, OwnerError> {
        let folder = data_dir.display().to_string();
        let io = |source| OwnerError::Io {
            folder: folder.clone(),
            source,
        };
        let key = std::fs::canonicalize(data_dir).map_err(io)?;
        let mut set = owned();
        if set.as_ref().is_some_and(|set| set.contains(&key)) {
            return Err(OwnerError::InUse {
                folder,
                pid: std::process::id().to_string(),
            });
        }
        let path = data_dir.join(LOCK_FILE);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        if !try_lock(&file).map_err(io)? {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            let pid = pid.trim();
            return Err(OwnerError::InUse {
                folder,
                pid: if pid.is_empty() {
                    "unknown".into()
                } else {
                    pid.to_string()
                },
            });
        }
        // The owner's pid, for the next process's words (the lock itself is what counts).
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        file.write_all(format!("{}\n", std::process::id()).as_bytes())
            .map_err(io)?;
        set.get_or_insert_with(HashSet::new).insert(key.clone());
        Ok(DataLock {
            _file: file,
            path,
            key,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(unix)]
fn try_lock(file: &File) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed `flock` is a valid value of this plain C struct; the fields set
    // below describe a write lock over the whole file.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as _;
    lock.l_whence = libc::SEEK_SET as _;
    lock.l_start = 0;
    lock.l_len = 0;
    // SAFETY: fcntl on a descriptor we own, with a pointer to a live `flock`.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &lock) };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    if matches!(err.raw_os_error(), Some(libc::EACCES | libc::EAGAIN)) {
        Ok(false)
    } else {
        Err(err)
    }
}

#[cfg(not(unix))]
fn try_lock(_file: &File) -> std::io::Result<bool> {
    // No advisory lock here yet: every start owns the folder (as before this lock).
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_names_the_owner_and_a_dropped_one_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataLock::acquire(dir.path()).unwrap();
        let second = DataLock::acquire(dir.path());
        let err = second.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains(&std::process::id().to_string()), "{err}");
        drop(first);
        assert!(DataLock::acquire(dir.path()).is_ok());
    }
}
