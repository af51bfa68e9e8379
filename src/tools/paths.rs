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
/// would block forever), without following a symlink swapped in at the last component.
pub fn open_regular(resolved: &Resolved) -> Result<(std::fs::File, u64), ToolError> {
    use std::os::unix::fs::OpenOptionsExt;
    let meta = std::fs::metadata(&resolved.real).map_err(|err| {
        ToolError::Failed(format!(
            "cannot read {}: {}",
            resolved.display,
            io_text(&err)
        ))
    })?;
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
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&resolved.real)
        .map_err(|err| {
            ToolError::Failed(format!(
                "cannot open {}: {}",
                resolved.display,
                io_text(&err)
            ))
        })?;
    let meta = file
        .metadata()
        .map_err(|err| ToolError::Failed(format!("cannot read {}: {err}", resolved.display)))?;
    if !meta.is_file() {
        return Err(ToolError::Failed(format!(
            "{} is not a regular file; refusing to read it",
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
pub fn write_regular(resolved: &Resolved, content: &[u8]) -> Result<(), ToolError> {
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    let failed = |what: &str, err: &std::io::Error| {
        ToolError::Failed(format!(
            "cannot {what} {}: {}",
            resolved.display,
            io_text(err)
        ))
    };
    let Some(parent) = resolved.real.parent() else {
        return Err(ToolError::Failed(format!(
            "{} has no parent folder",
            resolved.display
        )));
    };
    // The folder must still be where it was decided to be before anything is created in
    // it: a folder on the way swapped for a symlink after approval would lead elsewhere.
    check_unmoved(parent, resolved)?;
    std::fs::create_dir_all(parent).map_err(|err| failed("create the folder for", &err))?;
    check_unmoved(parent, resolved)?;
    let existing = match std::fs::symlink_metadata(&resolved.real) {
        Ok(meta) if meta.is_file() => Some(meta),
        Ok(meta) if meta.file_type().is_symlink() => {
            return Err(ToolError::Failed(format!(
                "{} became a symbolic link after it was checked; not touching it",
                resolved.display
            )));
        }
        Ok(_) => {
            return Err(ToolError::Failed(format!(
                "{} is not a regular file; refusing to write it",
                resolved.display
            )));
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
        Err(err) => return Err(failed("write", &err)),
    };
    let name = resolved
        .real
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = parent.join(format!(
        ".{}.bh-{}.tmp",
        name.chars().take(100).collect::<String>(),
        uuid::Uuid::new_v4().simple()
    ));
    // Removes the temp file on every way out but the rename.
    struct Temp<'a>(&'a Path, bool);
    impl Drop for Temp<'_> {
        fn drop(&mut self) {
            if !self.1 {
                let _ = std::fs::remove_file(self.0);
            }
        }
    }
    let mode = existing
        .as_ref()
        .map(|meta| meta.permissions().mode() & 0o7777)
        .unwrap_or(0o666);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&temp)
        .map_err(|err| failed("write", &err))?;
    let mut guard = Temp(&temp, false);
    let probe = Resolved {
        real: temp.clone(),
        ..resolved.clone()
    };
    verify_opened(&file, &probe)?;
    if let Some(meta) = &existing {
        // The umask applied at creation; the original's mode (and owner, where allowed) stay.
        let _ = file.set_permissions(std::fs::Permissions::from_mode(mode));
        let _ = std::os::unix::fs::fchown(&file, Some(meta.uid()), Some(meta.gid()));
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
    check_unmoved(parent, resolved)?;
    std::fs::rename(&temp, &resolved.real).map_err(|err| {
        ToolError::Failed(format!(
            "cannot write {}: {}{unchanged}",
            resolved.display,
            io_text(&err)
        ))
    })?;
    guard.1 = true;
    // The rename itself is durable only once the folder is flushed.
    if let Ok(dir) = std::fs::File::open(parent) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// Refuses to go on when `folder` no longer resolves to itself (a folder on the way was
/// swapped for a symlink), or when an inside target's folder has left the workspace. A
/// folder that does not exist yet has nothing to check. The kernel says where the opened
/// folder is (one lookup, not one per component: paths may be thousands of names deep).
fn check_unmoved(folder: &Path, resolved: &Resolved) -> Result<(), ToolError> {
    use std::os::unix::fs::OpenOptionsExt;
    let now = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(folder)
    {
        Ok(dir) => match crate::sandbox::opened_path(&dir) {
            Some(now) => Ok(now),
            None => real_path(folder),
        },
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => Err(io_text(&err)),
    };
    match now {
        Ok(now) if now == folder && (!resolved.inside || now.starts_with(&resolved.root)) => Ok(()),
        Ok(now) => Err(ToolError::Failed(format!(
            "the folder of {} changed after it was checked (it now leads to {}); not touching it",
            resolved.display,
            now.display()
        ))),
        Err(err) => Err(ToolError::Failed(format!(
            "cannot open the folder of {}: {err}",
            resolved.display
        ))),
    }
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
}
