//! Whether a workspace changed since its last snapshot, told by inotify watches on its folders, so that a changing call can take the previous call's "after" as its own "before" instead of walking the workspace again (issue 27).
//!
//! The rule this serves: a call's "before" must be the workspace as it is when the call
//! starts, or undo would take back what someone else did meanwhile (the person in their
//! editor, another session). A snapshot walks every file (≈ 45 ms on 10,000 files); the
//! previous snapshot can stand in for a new one only if nothing at all happened in the
//! workspace since it was taken. inotify says so cheaply: events are queued by the kernel
//! when a change is made, so reading the queue (without blocking) when the next call
//! starts sees every change completed before it.
//!
//! It is only ever a shortcut: whenever it cannot be sure (a queue overflow, a folder
//! moved, too many folders, a file system where other machines write, any error), the
//! workspace counts as changed and a real snapshot is taken, as before.
//!
//! Linux only (the runtime's sandbox is too); elsewhere [`Watch::new`] gives nothing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// At most this many folders are watched in one workspace: beyond it the walk itself
/// costs what the snapshot costs, and the kernel's per-user watch budget is shared
/// with every other program (editors watch too).
pub const MAX_FOLDERS: usize = 8192;

/// The watches on one workspace's folders.
pub struct Watch {
    #[cfg(target_os = "linux")]
    fd: std::os::fd::OwnedFd,
    /// Watch descriptor → the folder it watches.
    folders: HashMap<i32, PathBuf>,
    root: PathBuf,
    /// Left out of the watch: a data dir inside the workspace (the runtime's own writes)
    /// changes nothing a snapshot records.
    skip: Option<PathBuf>,
    /// Set when the watch can no longer be trusted to be complete (an overflowed queue,
    /// a folder moved, a folder it could not watch); it is then rebuilt.
    broken: bool,
}

/// Why no watch was made.
#[derive(Debug, PartialEq, Eq)]
pub enum NoWatch {
    /// More than [`MAX_FOLDERS`] folders.
    TooBig,
    /// A file system other machines write to (NFS, SMB, FUSE, 9p): they send no events.
    Remote,
    /// inotify is missing or out of instances or watches, a folder cannot be read…
    Failed(String),
}

impl Watch {
    /// Watches every folder under `root` but `.git` folders and `skip` (no symlink is
    /// followed). Made before the snapshot it is to vouch for: a change in a folder not
    /// yet watched is then in that snapshot.
    pub fn new(root: &Path, skip: Option<&Path>) -> Result<Watch, NoWatch> {
        imp::new(root, skip)
    }

    /// Reads every event queued since the last call; true when there was none and the
    /// watch is still whole, i.e. nothing in the workspace changed since then.
    pub fn quiet(&mut self) -> bool {
        let (events, whole) = imp::drain(self);
        !events && whole && !self.broken
    }

    /// Whether the watch must be rebuilt before it can vouch for a snapshot again.
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// Folders watched.
    pub fn folders(&self) -> usize {
        self.folders.len()
    }
}

#[cfg(target_os = "linux")]
mod imp {
    use super::{MAX_FOLDERS, NoWatch, Watch};
    use std::collections::HashMap;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    /// Every change that can alter a snapshot: contents, mode, entries made, removed or
    /// renamed, and the folder itself going. Reads and opens are not asked for: the
    /// snapshot's own git reads the files.
    const MASK: u32 = libc::IN_MODIFY
        | libc::IN_ATTRIB
        | libc::IN_CLOSE_WRITE
        | libc::IN_CREATE
        | libc::IN_DELETE
        | libc::IN_MOVED_FROM
        | libc::IN_MOVED_TO
        | libc::IN_DELETE_SELF
        | libc::IN_MOVE_SELF
        | libc::IN_ONLYDIR
        | libc::IN_DONT_FOLLOW;

    /// `statfs` magic numbers of file systems whose changes may come from elsewhere.
    const REMOTE: [i64; 7] = [
        0x6969,                 // NFS
        0x517b,                 // SMB
        0xff53_4d42_u32 as i64, // CIFS
        0xfe53_4d42_u32 as i64, // SMB2
        0x6573_5546,            // FUSE (sshfs, virtiofs, rclone…)
        0x0102_1997,            // 9p
        0x7375_7245,            // Coda
    ];

    pub fn new(root: &Path, skip: Option<&Path>) -> Result<Watch, NoWatch> {
        if remote(root) {
            return Err(NoWatch::Remote);
        }
        // SAFETY: inotify_init1 takes flags only; a negative result is an error.
        let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if raw < 0 {
            return Err(NoWatch::Failed(format!(
                "inotify: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: `raw` is a descriptor just opened and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut watch = Watch {
            fd,
            folders: HashMap::new(),
            root: root.to_path_buf(),
            skip: skip.map(Path::to_path_buf),
            broken: false,
        };
        add_tree(&mut watch, root)?;
        Ok(watch)
    }

    fn remote(path: &Path) -> bool {
        let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
            return true;
        };
        // SAFETY: a zeroed statfs is a valid out-parameter; `c` is a NUL-terminated path.
        let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statfs(c.as_ptr(), &mut stat) } != 0 {
            return true;
        }
        #[allow(clippy::unnecessary_cast)]
        REMOTE.contains(&(stat.f_type as i64))
    }

    /// Watches `dir` and every folder below it.
    fn add_tree(watch: &mut Watch, dir: &Path) -> Result<(), NoWatch> {
        let mut stack = vec![dir.to_path_buf()];
        while let Some(folder) = stack.pop() {
            if watch.skip.as_deref() == Some(folder.as_path()) {
                continue;
            }
            if watch.folders.len() >= MAX_FOLDERS {
                return Err(NoWatch::TooBig);
            }
            // A folder made and removed again before its watch (a build's temporary
            // folder): its making already counted as a change, its removal leaves
            // nothing to watch.
            let is_root = folder == watch.root;
            let vanished =
                |err: &std::io::Error| !is_root && err.kind() == std::io::ErrorKind::NotFound;
            match add_one(watch, &folder) {
                Err(Some(err)) if vanished(&err) => continue,
                Err(Some(err)) => {
                    return Err(match err.raw_os_error() {
                        // The kernel's watch budget (fs.inotify.max_user_watches).
                        Some(libc::ENOSPC) => NoWatch::TooBig,
                        _ => NoWatch::Failed(format!("{}: {err}", folder.display())),
                    });
                }
                Err(None) => {
                    return Err(NoWatch::Failed(format!(
                        "{}: a NUL in the path",
                        folder.display()
                    )));
                }
                Ok(()) => {}
            }
            let entries = match std::fs::read_dir(&folder) {
                Ok(entries) => entries,
                Err(err) if vanished(&err) => continue,
                Err(err) => return Err(NoWatch::Failed(format!("{}: {err}", folder.display()))),
            };
            for entry in entries {
                let entry =
                    entry.map_err(|err| NoWatch::Failed(format!("{}: {err}", folder.display())))?;
                // `file_type` does not follow a symlink: a link to a folder is a link.
                let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
                if is_dir && entry.file_name() != ".git" {
                    stack.push(entry.path());
                }
            }
        }
        Ok(())
    }

    /// Adds one folder's watch; the error is the OS's (`None`: a path inotify cannot take).
    fn add_one(watch: &mut Watch, folder: &Path) -> Result<(), Option<std::io::Error>> {
        let c = std::ffi::CString::new(folder.as_os_str().as_encoded_bytes()).map_err(|_| None)?;
        // SAFETY: the descriptor is ours and open; `c` is a NUL-terminated path.
        let wd = unsafe { libc::inotify_add_watch(watch.fd.as_raw_fd(), c.as_ptr(), MASK) };
        if wd < 0 {
            return Err(Some(std::io::Error::last_os_error()));
        }
        watch.folders.insert(wd, folder.to_path_buf());
        Ok(())
    }

    /// Reads the queue empty. Returns whether any event came, and whether the watch is
    /// still whole (new folders get their watches here; a folder moved or an overflow
    /// breaks it).
    pub fn drain(watch: &mut Watch) -> (bool, bool) {
        // Room for many events per read; each is 16 bytes plus its name.
        let mut buffer = vec![0u8; 64 * 1024];
        let mut any = false;
        loop {
            // SAFETY: the buffer is valid for its length; the descriptor is ours.
            let read = unsafe {
                libc::read(
                    watch.fd.as_raw_fd(),
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                )
            };
            if read < 0 {
                let err = std::io::Error::last_os_error();
                match err.kind() {
                    std::io::ErrorKind::WouldBlock => break,
                    std::io::ErrorKind::Interrupted => continue,
                    _ => {
                        watch.broken = true;
                        return (true, false);
                    }
                }
            }
            if read == 0 {
                break;
            }
            any = true;
            let mut offset = 0;
            let end = read as usize;
            let header = std::mem::size_of::<libc::inotify_event>();
            while offset + header <= end {
                // SAFETY: the kernel wrote whole events; the header may be unaligned in
                // the byte buffer, so it is read unaligned.
                let event: libc::inotify_event =
                    unsafe { std::ptr::read_unaligned(buffer[offset..].as_ptr().cast()) };
                let name_end = (offset + header + event.len as usize).min(end);
                let name = &buffer[offset + header..name_end];
                let name = &name[..name.iter().position(|b| *b == 0).unwrap_or(name.len())];
                on_event(watch, event.wd, event.mask, name);
                offset = name_end;
            }
        }
        (any, !watch.broken)
    }

    fn on_event(watch: &mut Watch, wd: i32, mask: u32, name: &[u8]) {
        if mask & libc::IN_Q_OVERFLOW != 0 {
            // Events were lost, folders made meanwhile among them.
            watch.broken = true;
            return;
        }
        if mask & libc::IN_IGNORED != 0 {
            // The folder went (or was unmounted); the kernel dropped its watch.
            let gone = watch.folders.remove(&wd);
            if gone.as_deref() == Some(watch.root.as_path()) {
                watch.broken = true;
            }
            return;
        }
        if mask & libc::IN_MOVE_SELF != 0 {
            // Every path recorded below it is stale now.
            watch.broken = true;
            return;
        }
        if mask & libc::IN_ISDIR == 0 {
            return;
        }
        if mask & libc::IN_MOVED_FROM != 0 {
            watch.broken = true;
            return;
        }
        if mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0 {
            let Some(parent) = watch.folders.get(&wd) else {
                return;
            };
            if name == b".git" {
                return;
            }
            let folder = parent.join(std::ffi::OsStr::from_bytes(name));
            if add_tree(watch, &folder).is_err() {
                watch.broken = true;
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use super::{NoWatch, Watch};
    use std::path::Path;

    pub fn new(_root: &Path, _skip: Option<&Path>) -> Result<Watch, NoWatch> {
        Err(NoWatch::Failed("no inotify on this system".into()))
    }

    pub fn drain(_watch: &mut Watch) -> (bool, bool) {
        (true, false)
    }
}
