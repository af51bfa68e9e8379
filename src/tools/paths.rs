//! Path policy: every path a tool names is resolved to its real location (symlinks followed, `..` applied) before deciding whether it is inside the workspace.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use super::ToolError;

/// Longest path a tool may name, in bytes (Linux's PATH_MAX).
const MAX_PATH: usize = 4096;
/// Longest single name, in bytes (Linux's NAME_MAX).
const MAX_NAME: usize = 255;
/// Symlinks followed before a path is called a loop (as the kernel's ELOOP).
const MAX_LINKS: usize = 40;

/// A path resolved to where it really is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub real: PathBuf,
    pub inside: bool,
    /// The path relative to the workspace when inside, for messages and diffs.
    pub display: String,
    /// The workspace's own real location.
    pub root: PathBuf,
    /// How many names the file has when it is a regular file with more than one (a hard
    /// link): the other names may be outside the workspace, so such a file counts as
    /// outside. 0 otherwise.
    pub hard_links: u64,
}

impl Resolved {
    /// What the approval dialog says about a place it must not present as inside: the
    /// real path, never the name the model gave. `None` inside the workspace.
    pub fn outside_note(&self) -> Option<String> {
        if self.inside {
            return None;
        }
        Some(if self.hard_links > 1 {
            format!(
                "outside the workspace: {} is a hard link ({} names for one file; the others may be anywhere)",
                self.real.display(),
                self.hard_links
            )
        } else {
            format!("outside the workspace: {}", self.real.display())
        })
    }
}

/// Characters that are legal in file names but let a path look like another one in the
/// approval dialog or the transcript (line breaks, escapes, bidirectional overrides).
fn deceptive(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{200E}' | '\u{200F}' | '\u{061C}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
        )
}

/// Resolves `raw` (relative to the workspace, or absolute) to its real location.
pub fn resolve(workspace: &Path, raw: &str) -> Result<Resolved, ToolError> {
    if raw.is_empty() {
        return Err(ToolError::InvalidArguments("the path is empty".into()));
    }
    if raw.contains('\0') {
        return Err(ToolError::InvalidArguments(
            "the path contains a NUL byte".into(),
        ));
    }
    if let Some(c) = raw.chars().find(|c| deceptive(*c)) {
        return Err(ToolError::InvalidArguments(format!(
            "the path contains the control character U+{:04X}; name files without control or text-direction characters",
            u32::from(c)
        )));
    }
    if raw.len() > MAX_PATH {
        return Err(ToolError::InvalidArguments(format!(
            "the path is {} bytes long; at most {MAX_PATH} are allowed",
            raw.len()
        )));
    }
    if let Some(name) = Path::new(raw)
        .components()
        .find(|c| c.as_os_str().len() > MAX_NAME)
    {
        return Err(ToolError::InvalidArguments(format!(
            "a name in the path is {} bytes long; at most {MAX_NAME} are allowed",
            name.as_os_str().len()
        )));
    }
    let root = real_path(workspace).map_err(|err| {
        ToolError::Failed(format!(
            "the workspace {} cannot be resolved: {err}",
            workspace.display()
        ))
    })?;
    let candidate = if Path::new(raw).is_absolute() {
        PathBuf::from(raw)
    } else {
        root.join(raw)
    };
    let real = real_path(&candidate).map_err(ToolError::Failed)?;
    // A regular file with several names is the same file as its other names, which may
    // be outside: writing or reading it counts as outside (it is asked, with a note).
    let hard_links = match std::fs::symlink_metadata(&real) {
        Ok(meta) if meta.is_file() && nlink(&meta) > 1 => nlink(&meta),
        _ => 0,
    };
    // Component-wise: `/ws-other` is not inside `/ws`.
    let inside = real.starts_with(&root) && hard_links == 0;
    let display = if inside {
        let rel = real.strip_prefix(&root).unwrap_or(&real);
        if rel.as_os_str().is_empty() {
            ".".to_string()
        } else {
            rel.display().to_string()
        }
    } else {
        real.display().to_string()
    };
    Ok(Resolved {
        real,
        inside,
        display,
        root,
        hard_links,
    })
}

fn nlink(meta: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    meta.nlink()
}

/// Resolves `raw` again after the person's decision and refuses to go on when it now
/// leads elsewhere: a folder on the way may have been swapped for a symlink meanwhile.
pub fn recheck(workspace: &Path, raw: &str, decided: &Resolved) -> Result<(), ToolError> {
    let now = resolve(workspace, raw)?;
    if now.real == decided.real && (now.inside || !decided.inside) {
        return Ok(());
    }
    Err(ToolError::Failed(format!(
        "{} changed while it waited for approval (it now leads to {}); not touching it",
        decided.display,
        now.real.display()
    )))
}

/// Checks that a file opened for `resolved` is the one that was decided on: a folder on
/// the way could have been swapped for a symlink between resolving and opening. Where
/// the system cannot say where an open file is, an inside place is refused rather than
/// trusted (finding 1: the check must never pass silently); an outside one was approved
/// by its real path already.
pub fn verify_opened(file: &std::fs::File, resolved: &Resolved) -> Result<(), ToolError> {
    let Some(actual) = crate::sandbox::opened_path(file) else {
        if !resolved.inside {
            return Ok(());
        }
        return Err(ToolError::Failed(format!(
            "cannot check where {} really is on this system; not touching it",
            resolved.display
        )));
    };
    if actual == resolved.real || (resolved.inside && actual.starts_with(&resolved.root)) {
        return Ok(());
    }
    Err(ToolError::Failed(format!(
        "{} changed while it was being opened (it now leads to {}); not touching it",
        resolved.display,
        actual.display()
    )))
}

/// Opens an existing regular file for reading, refusing folders, pipes and devices (a FIFO
/// would block forever), and refusing to follow a symlink swapped in anywhere on the way
/// since the path was resolved.
pub fn open_regular(resolved: &Resolved) -> Result<(std::fs::File, u64), ToolError> {
    let file = open_exact(&resolved.real, libc::O_RDONLY | libc::O_NONBLOCK, 0).map_err(|err| {
        ToolError::Failed(format!(
            "cannot open {}: {}",
            resolved.display,
            changed_text(&err)
        ))
    })?;
    let meta = file
        .metadata()
        .map_err(|err| ToolError::Failed(format!("cannot read {}: {err}", resolved.display)))?;
    if meta.is_dir() {
        return Err(ToolError::Failed(format!(
            "{} is a directory; use list_dir to see what it holds",
            resolved.display
        )));
    }
    if !meta.is_file() {
        return Err(ToolError::Failed(format!(
            "{} is not a regular file (a pipe, socket or device); refusing to read it",
            resolved.display
        )));
    }
    // A walk decides "inside" for a whole folder: a hard-linked file in it may be an
    // outside file under an inside name, so it is not read without its own approval.
    if resolved.inside && nlink(&meta) > 1 {
        return Err(ToolError::Failed(format!(
            "{} is a hard link ({} names for one file, possibly outside the workspace); read it by its own path to be asked",
            resolved.display,
            nlink(&meta)
        )));
    }
    verify_opened(&file, resolved)?;
    Ok((file, meta.len()))
}

/// Writes `content` to the resolved place: missing folders are created, anything that is
/// not a regular file is refused, and the new text goes to a temp file in the same folder
/// that is flushed and renamed over the target (keeping its mode). So a full disk or a
/// crash leaves the original whole, and a hard link is replaced, not written through.
///
/// Every change is made relative to the opened folder, never through its path again: a
/// folder on the way swapped for a symlink after the checks (by a command running at the
/// same time, say) cannot send the file or a new folder elsewhere. The folder was opened
/// without following any symlink, so it is the one that was decided on.
pub fn write_regular(resolved: &Resolved, content: &[u8]) -> Result<(), ToolError> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let failed = |what: &str, err: &std::io::Error| {
        ToolError::Failed(format!(
            "cannot {what} {}: {}",
            resolved.display,
            changed_text(err)
        ))
    };
    let (Some(parent), Some(name)) = (resolved.real.parent(), resolved.real.file_name()) else {
        return Err(ToolError::Failed(format!(
            "{} has no parent folder",
            resolved.display
        )));
    };
    let dir = open_folder(parent, true).map_err(|err| failed("create the folder for", &err))?;
    race_point();
    check_unmoved(&dir, parent, resolved)?;
    let existing = match stat_at(&dir, name) {
        Ok(Some(meta)) if meta.st_mode & libc::S_IFMT == libc::S_IFREG => Some(meta),
        Ok(Some(meta)) if meta.st_mode & libc::S_IFMT == libc::S_IFLNK => {
            return Err(ToolError::Failed(format!(
                "{} became a symbolic link after it was checked; not touching it",
                resolved.display
            )));
        }
        Ok(Some(_)) => {
            return Err(ToolError::Failed(format!(
                "{} is not a regular file; refusing to write it",
                resolved.display
            )));
        }
        Ok(None) => None,
        Err(err) => return Err(failed("write", &err)),
    };
    let temp = std::ffi::OsString::from(format!(
        ".{}.bh-{}.tmp",
        name.to_string_lossy().chars().take(100).collect::<String>(),
        uuid::Uuid::new_v4().simple()
    ));
    // Removes the temp file on every way out but the rename.
    struct Temp<'a>(&'a std::fs::File, &'a std::ffi::OsStr, bool);
    impl Drop for Temp<'_> {
        fn drop(&mut self) {
            if !self.2 {
                let _ = unlink_at(self.0, self.1);
            }
        }
    }
    let mode = existing
        .as_ref()
        .map(|meta| meta.st_mode & 0o7777)
        .unwrap_or(0o666);
    let mut file = open_at(
        &dir,
        &temp,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        mode,
    )
    .map_err(|err| failed("write", &err))?;
    let mut guard = Temp(&dir, &temp, false);
    if let Some(meta) = &existing {
        // The umask applied at creation; the original's mode (and owner, where allowed) stay.
        let _ = file.set_permissions(std::fs::Permissions::from_mode(libc::c_uint::from(mode)));
        let _ = std::os::unix::fs::fchown(&file, Some(meta.st_uid), Some(meta.st_gid));
    }
    let unchanged = if existing.is_some() {
        "; the original is unchanged"
    } else {
        ""
    };
    file.write_all(content)
        .and_then(|()| file.flush())
        .and_then(|()| file.sync_all())
        .map_err(|err| {
            ToolError::Failed(format!(
                "cannot write {}: {}{unchanged}",
                resolved.display,
                io_text(&err)
            ))
        })?;
    drop(file);
    check_unmoved(&dir, parent, resolved)?;
    rename_at(&dir, &temp, name).map_err(|err| {
        ToolError::Failed(format!(
            "cannot write {}: {}{unchanged}",
            resolved.display,
            io_text(&err)
        ))
    })?;
    guard.2 = true;
    // The rename itself is durable only once the folder is flushed.
    let _ = dir.sync_all();
    Ok(())
}

/// Opens the file at `path` (absolute, every symlink already resolved) with `flags`,
/// following no symlink anywhere on the way: the kernel's one-call lookup where there is
/// one, otherwise a walk from `/` opening each folder with `O_NOFOLLOW`.
fn open_exact(
    path: &Path,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> std::io::Result<std::fs::File> {
    let flags = flags | libc::O_NOFOLLOW;
    if let Some(result) = one_call(path, flags, mode) {
        return result;
    }
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return open_at_root(flags);
    };
    open_at(&open_folder(parent, false)?, name, flags, mode)
}

/// The kernel's one-call lookup, unless a test asks for the walk (as on systems without).
fn one_call(
    path: &Path,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> Option<std::io::Result<std::fs::File>> {
    #[cfg(test)]
    if WALK_ONLY.get() {
        return None;
    }
    crate::sandbox::open_no_symlinks(path, flags, mode)
}

fn open_at_root(flags: libc::c_int) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags | libc::O_CLOEXEC)
        .open("/")
}

/// Opens the folder at `path` (absolute, every symlink already resolved) without following
/// any symlink on the way; with `create`, the missing folders at its end are made, each
/// inside the one opened before it (so none can be made through a swapped-in symlink).
pub(crate) fn open_folder(path: &Path, create: bool) -> std::io::Result<std::fs::File> {
    let folder = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    match one_call(path, folder, 0) {
        Some(Err(err)) if create && err.kind() == std::io::ErrorKind::NotFound => {}
        Some(result) => return result,
        None => {}
    }
    let mut dir = open_at_root(folder)?;
    for component in path.components() {
        let name = match component {
            Component::RootDir => continue,
            Component::Normal(name) => name,
            // A resolved path has neither; refuse rather than guess.
            _ => return Err(std::io::ErrorKind::InvalidInput.into()),
        };
        dir = match open_at(&dir, name, folder, 0) {
            Err(err) if create && err.kind() == std::io::ErrorKind::NotFound => {
                race_point();
                match mkdir_at(&dir, name) {
                    Ok(()) => {}
                    Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(err) => return Err(err),
                }
                open_at(&dir, name, folder, 0)?
            }
            other => other?,
        };
    }
    Ok(dir)
}

pub(crate) fn c_name(name: &std::ffi::OsStr) -> std::io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(name.as_bytes()).map_err(|_| std::io::ErrorKind::InvalidInput.into())
}

pub(crate) fn check(result: libc::c_int) -> std::io::Result<libc::c_int> {
    if result < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

/// `openat(dir, name)`, never following a symlink at `name`.
pub(crate) fn open_at(
    dir: &std::fs::File,
    name: &std::ffi::OsStr,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> std::io::Result<std::fs::File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let name = c_name(name)?;
    // SAFETY: `name` is NUL-terminated and `dir` an open descriptor for the call's length.
    let fd = check(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            libc::c_uint::from(mode),
        )
    })?;
    // SAFETY: the kernel just returned this descriptor, and nothing else owns it.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

pub(crate) fn mkdir_at(dir: &std::fs::File, name: &std::ffi::OsStr) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let name = c_name(name)?;
    // SAFETY: as in `open_at`.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o777) }).map(drop)
}

pub(crate) fn rename_at(
    dir: &std::fs::File,
    from: &std::ffi::OsStr,
    to: &std::ffi::OsStr,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let (from, to) = (c_name(from)?, c_name(to)?);
    // SAFETY: as in `open_at`.
    check(unsafe { libc::renameat(dir.as_raw_fd(), from.as_ptr(), dir.as_raw_fd(), to.as_ptr()) })
        .map(drop)
}

pub(crate) fn unlink_at(dir: &std::fs::File, name: &std::ffi::OsStr) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let name = c_name(name)?;
    // SAFETY: as in `open_at`.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) }).map(drop)
}

/// `fstatat(dir, name)` without following a symlink; `None` when nothing is there.
pub(crate) fn stat_at(
    dir: &std::fs::File,
    name: &std::ffi::OsStr,
) -> std::io::Result<Option<libc::stat>> {
    use std::os::fd::AsRawFd;
    let name = c_name(name)?;
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: as in `open_at`; the kernel fills `stat` when it answers 0.
    match check(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            stat.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    }) {
        // SAFETY: filled by the successful call.
        Ok(_) => Ok(Some(unsafe { stat.assume_init() })),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    }
}

/// Opens `path` to read it only if the file it really leads to lies inside `root`
/// (canonical), told by the kernel from the open descriptor, so a link swapped meanwhile
/// changes nothing: project files (`AGENTS.md`, profiles) that are symlinks to `~/.ssh`
/// or `~/.aws` are refused with where they lead (security review 2, finding 9). Opened
/// non-blocking, so a FIFO there does not hang the caller.
pub fn open_inside(path: &Path, root: &Path) -> Result<std::fs::File, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|err| err.to_string())?;
    let real = crate::sandbox::opened_path(&file)
        .or_else(|| path.canonicalize().ok())
        .ok_or_else(|| "cannot tell where it leads".to_string())?;
    if !real.starts_with(root) {
        return Err(format!(
            "it leads outside the project, to {}, and was not read",
            real.display()
        ));
    }
    Ok(file)
}

/// An open error in words: a symlink met on the way means the path changed after it was
/// resolved (it had none then).
fn changed_text(err: &std::io::Error) -> String {
    match err.raw_os_error() {
        Some(libc::ELOOP) | Some(libc::ENOTDIR) => {
            "it changed after it was checked (a name on the way is now a symbolic link); not touching it".into()
        }
        _ => io_text(err),
    }
}

// A test swaps folders at this point, between the checks and the changes, to show that a
// swap there cannot lead a write outside: the window a concurrent command could hit.
#[cfg(test)]
thread_local! {
    static RACE: std::cell::RefCell<Option<Box<dyn FnMut()>>> = const { std::cell::RefCell::new(None) };
    static WALK_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn race_point() {
    #[cfg(test)]
    RACE.with(|hook| {
        if let Some(hook) = hook.borrow_mut().as_mut() {
            hook();
        }
    });
}

/// Refuses to go on when the opened `folder` has left where it was decided to be: moved
/// (an outside target approved by its real path must be exactly there) or, for an inside
/// target, out of the workspace. The kernel says where the opened folder is now.
fn check_unmoved(dir: &std::fs::File, folder: &Path, resolved: &Resolved) -> Result<(), ToolError> {
    let Some(now) = crate::sandbox::opened_path(dir) else {
        // It was opened without following a symlink, so it was the decided folder then.
        return Ok(());
    };
    if now == folder || (resolved.inside && now.starts_with(&resolved.root)) {
        return Ok(());
    }
    Err(ToolError::Failed(format!(
        "the folder of {} changed after it was checked (it now is {}); not touching it",
        resolved.display,
        now.display()
    )))
}

/// An I/O error in words a model can act on.
pub fn io_text(err: &std::io::Error) -> String {
    match err.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ if err.raw_os_error() == Some(libc::ELOOP) => "it is a symbolic link".into(),
        _ => err.to_string(),
    }
}

/// `realpath` that also resolves paths whose tail does not exist yet (a file about to
/// be written), and dangling symlinks (whose target a write would create).
pub fn real_path(path: &Path) -> Result<PathBuf, String> {
    // A test asks for the walk alone, as on systems where the kernel cannot say.
    #[cfg(test)]
    if WALK_ONLY.get() {
        return walk_real_path(path);
    }
    match existing_real_path(path) {
        Some(real) => Ok(real),
        None => walk_real_path(path),
    }
}

/// The real path of a path that exists and has no symlink on the way, from one lookup
/// of the kernel's that refuses to follow any (`openat2` with `RESOLVE_NO_SYMLINKS`, an
/// `O_PATH` open: nothing is read, so a FIFO or a device is not touched). With no symlink
/// on the way, where the path is is the path itself with its `.` and `..` applied by
/// name. The walk below does one `lstat` per name, each from `/`, so a path `d` names
/// deep costs `d²` name lookups there and `d` here; resolving paths was 6 % of a
/// fan-out's CPU (BENCHMARKS, issue 31). A symlink, a missing name, a file where a folder
/// should be, or a system without the call: `None`, and the walk decides, with its words
/// for what went wrong. This only says where a path is, for the inside-or-outside
/// decision: every change still opens a name at a time without following symlinks
/// (`open_no_symlinks`), so a swap after this lookup is caught there as before.
fn existing_real_path(path: &Path) -> Option<PathBuf> {
    let absolute;
    let path = if path.is_absolute() {
        path
    } else {
        absolute = std::env::current_dir().ok()?.join(path);
        &absolute
    };
    // The path as given, `..` and all: a `..` after a symlink must meet the symlink.
    crate::sandbox::open_no_symlinks(path, libc::O_PATH, 0)?.ok()?;
    let mut real = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::Normal(name) => real.push(name),
            Component::ParentDir => {
                real.pop();
            }
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    Some(real)
}

/// [`real_path`] a name at a time: the tail may be missing, and a dangling symlink leads
/// to where its target would be made.
fn walk_real_path(path: &Path) -> Result<PathBuf, String> {
    let mut pending: VecDeque<OsString> = VecDeque::new();
    let start = if path.is_absolute() {
        PathBuf::from("/")
    } else {
        std::env::current_dir().map_err(|err| err.to_string())?
    };
    push_components(&mut pending, path);
    let mut out = start;
    let mut links = 0usize;
    let mut missing = false;
    while let Some(name) = pending.pop_front() {
        if name == ".." {
            out.pop();
            // Back in a folder that may exist: the next name must be looked at again, or
            // `missing/../link` would pass a symlink as a plain name (finding 1).
            missing = false;
            continue;
        }
        let next = out.join(&name);
        if missing {
            out = next;
            continue;
        }
        match std::fs::symlink_metadata(&next) {
            Ok(meta) if meta.file_type().is_symlink() => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(format!(
                        "too many levels of symbolic links at {}",
                        next.display()
                    ));
                }
                let target = std::fs::read_link(&next).map_err(|err| err.to_string())?;
                if target.is_absolute() {
                    out = PathBuf::from("/");
                }
                let mut spliced = VecDeque::new();
                push_components(&mut spliced, &target);
                spliced.extend(pending);
                pending = spliced;
            }
            Ok(_) => out = next,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                missing = true;
                out = next;
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotADirectory => {
                return Err(format!("{} is not a directory", out.display()));
            }
            Err(err) => return Err(format!("{}: {err}", next.display())),
        }
    }
    Ok(out)
}

fn push_components(into: &mut VecDeque<OsString>, path: &Path) {
    for component in path.components() {
        match component {
            Component::Normal(name) => into.push_back(name.to_os_string()),
            Component::ParentDir => into.push_back(OsString::from("..")),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_dotdot_and_symlinks_resolve_to_real_places() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::os::unix::fs::symlink(dir.path(), ws.join("out")).unwrap();
        std::os::unix::fs::symlink(ws.join("loop"), ws.join("loop")).unwrap();
        std::os::unix::fs::symlink("/nonexistent/target", ws.join("dangling")).unwrap();
        assert!(resolve(&ws, "sub/../a.txt").unwrap().inside);
        assert!(resolve(&ws, "new/dir/file").unwrap().inside);
        assert!(!resolve(&ws, "../x").unwrap().inside);
        assert!(!resolve(&ws, "new/../../x").unwrap().inside);
        assert!(!resolve(&ws, "out/x").unwrap().inside);
        assert!(!resolve(&ws, "dangling").unwrap().inside);
        assert!(!resolve(&ws, "/etc/passwd").unwrap().inside);
        assert!(resolve(&ws, "loop").is_err());
        assert!(resolve(&ws, "a\0b").is_err());
        assert!(resolve(&ws, &"a".repeat(300)).is_err());
        assert_eq!(resolve(&ws, "sub/./f").unwrap().display, "sub/f");
    }

    /// A folder on the way swapped for a symlink to the outside after the checks, in the
    /// window before the write creates anything: nothing may be created outside (neither the
    /// missing folders nor the file), and the write either lands where it was decided or
    /// fails.
    #[test]
    fn a_folder_swapped_for_a_symlink_during_a_write_leads_nothing_outside() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        // With the kernel's one-call lookup, and with the walk used where there is none.
        for (walk, raw) in [false, true]
            .into_iter()
            .flat_map(|walk| ["sub/new/deeper/file.txt", "sub/file.txt"].map(|raw| (walk, raw)))
        {
            WALK_ONLY.set(walk);
            let target = resolve(&ws, raw).unwrap();
            assert!(target.inside);
            let (sub, moved, out) = (ws.join("sub"), ws.join("sub-moved"), outside.clone());
            RACE.with(|hook| {
                *hook.borrow_mut() = Some(Box::new(move || {
                    if sub.is_symlink() {
                        return;
                    }
                    std::fs::rename(&sub, &moved).unwrap();
                    std::os::unix::fs::symlink(&out, &sub).unwrap();
                }))
            });
            let result = write_regular(&target, b"hello");
            RACE.with(|hook| hook.borrow_mut().take());
            let leaked: Vec<_> = std::fs::read_dir(&outside)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            assert!(
                leaked.is_empty(),
                "{raw} (walk {walk}): created outside: {leaked:?} ({result:?})"
            );
            // It lands in the folder that was decided on, wherever that is now.
            result.unwrap();
            let landed = ws.join("sub-moved").join(raw.trim_start_matches("sub/"));
            assert_eq!(std::fs::read(&landed).unwrap(), b"hello", "{raw}");
            // Back as it was, for the next case.
            std::fs::remove_file(ws.join("sub")).unwrap();
            std::fs::remove_dir_all(ws.join("sub-moved")).unwrap();
            std::fs::create_dir_all(ws.join("sub")).unwrap();
        }
    }

    /// The kernel's one lookup answers only for paths with no symlink on the way, and
    /// there agrees with the walk, `..` included; with relative and absolute symlinks,
    /// chains, `..` after a symlink (the real parent, not the name's), a symlinked
    /// workspace, missing and dangling names the walk answers, so `real_path` says the
    /// same with the lookup and without. A FIFO is not opened for reading (no hang).
    #[cfg(target_os = "linux")]
    #[test]
    fn the_kernels_lookup_and_the_walk_agree_on_existing_paths() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        std::fs::create_dir_all(base.join("ws/a/b/c")).unwrap();
        std::fs::create_dir_all(base.join("other/x")).unwrap();
        std::fs::write(base.join("ws/a/b/c/file.txt"), "x").unwrap();
        std::fs::write(base.join("other/x/secret"), "s").unwrap();
        symlink("b/c", base.join("ws/a/rel")).unwrap();
        symlink(base.join("other/x"), base.join("ws/a/abs")).unwrap();
        symlink("rel", base.join("ws/a/chain")).unwrap();
        symlink("../other", base.join("ws/up")).unwrap();
        symlink(base.join("ws"), base.join("ws-link")).unwrap();
        symlink("/nonexistent/target", base.join("ws/dangling")).unwrap();
        let fifo = base.join("ws/fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo reads the NUL-terminated path only.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // No symlink on the way: the kernel's one lookup answers.
        let plain = [
            "ws",
            "ws/a/b/c/file.txt",
            "ws/a/b/../b/./c/file.txt",
            "ws/fifo",
        ];
        for raw in plain {
            let path = base.join(raw);
            let fast = existing_real_path(&path);
            assert!(fast.is_some(), "{raw}: the kernel's lookup was not taken");
            assert_eq!(fast.unwrap(), walk_real_path(&path).unwrap(), "{raw}");
        }
        // A symlink on the way (even one a `..` steps back out of), or a missing name: the
        // walk answers.
        let linked = [
            "ws-link",
            "ws/a/rel/file.txt",
            "ws/a/chain/file.txt",
            "ws/a/abs/secret",
            "ws/a/abs/../x/secret",
            "ws/a/rel/../../b",
            "ws/up/x",
            "ws-link/a/chain/./file.txt",
        ];
        // A file stepped through by `..` the kernel refuses (not a folder); the walk goes
        // by name there, as before.
        let missing = [
            "ws/dangling",
            "ws/a/missing/../b",
            "ws/new/file",
            "ws/a/b/c/file.txt/../../c",
        ];
        for raw in linked.iter().chain(&missing) {
            assert_eq!(existing_real_path(&base.join(raw)), None, "{raw}");
        }
        // Through `real_path`, with the kernel's lookup and without, the same answers.
        for raw in plain.iter().chain(&linked).chain(&missing) {
            let path = base.join(raw);
            let fast = real_path(&path);
            WALK_ONLY.set(true);
            let walked = real_path(&path);
            WALK_ONLY.set(false);
            assert_eq!(fast, walked, "{raw}");
        }
        // `..` after a symlink is its target's parent, not the name's.
        assert_eq!(
            real_path(&base.join("ws/a/abs/../x/secret")).unwrap(),
            base.join("other/x/secret").canonicalize().unwrap()
        );
        assert!(real_path(&base.join("ws/a/b/c/file.txt/x")).is_err());
    }

    /// A read whose folder was swapped for a symlink after the path was resolved opens
    /// nothing: the lookup follows no symlink, so the outside file is never opened.
    #[test]
    fn a_read_through_a_folder_swapped_for_a_symlink_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::write(ws.join("sub/f"), "inside").unwrap();
        std::fs::create_dir_all(dir.path().join("outside")).unwrap();
        std::fs::write(dir.path().join("outside/f"), "secret").unwrap();
        let target = resolve(&ws, "sub/f").unwrap();
        std::fs::rename(ws.join("sub"), ws.join("old")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("outside"), ws.join("sub")).unwrap();
        for walk in [false, true] {
            WALK_ONLY.set(walk);
            let err = open_regular(&target).unwrap_err().to_string();
            assert!(err.contains("symbolic link"), "walk {walk}: {err}");
        }
        WALK_ONLY.set(false);
    }
}
