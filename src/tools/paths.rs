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
    // Component-wise: `/ws-other` is not inside `/ws`.
    let inside = real.starts_with(&root);
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
    })
}

/// Where an open file really is, from the kernel (Linux's `/proc/self/fd`); `None` where
/// that is not available.
fn opened_location(file: &std::fs::File) -> Option<PathBuf> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = file;
        None
    }
}

/// Checks that a file opened for `resolved` is the one that was decided on: a folder on
/// the way could have been swapped for a symlink between resolving and opening.
pub fn verify_opened(file: &std::fs::File, resolved: &Resolved) -> Result<(), ToolError> {
    let Some(actual) = opened_location(file) else {
        return Ok(());
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
    verify_opened(&file, resolved)?;
    Ok((file, meta.len()))
}

/// Writes `content` to the resolved place, creating missing folders, refusing anything
/// that is not a regular file, and checking the opened file is the one approved.
pub fn write_regular(resolved: &Resolved, content: &[u8]) -> Result<(), ToolError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(parent) = resolved.real.parent() {
        std::fs::create_dir_all(parent).map_err(|err| {
            ToolError::Failed(format!(
                "cannot create the folder for {}: {err}",
                resolved.display
            ))
        })?;
    }
    let existed = std::fs::symlink_metadata(&resolved.real).is_ok();
    // No O_TRUNC: nothing is cut before the opened file is known to be the right one.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&resolved.real)
        .map_err(|err| {
            ToolError::Failed(format!(
                "cannot write {}: {}",
                resolved.display,
                io_text(&err)
            ))
        })?;
    let checked = file
        .metadata()
        .map_err(|err| ToolError::Failed(format!("cannot write {}: {err}", resolved.display)))
        .and_then(|meta| {
            if meta.is_file() {
                Ok(())
            } else {
                Err(ToolError::Failed(format!(
                    "{} is not a regular file; refusing to write it",
                    resolved.display
                )))
            }
        })
        .and_then(|()| verify_opened(&file, resolved));
    if let Err(err) = checked {
        if !existed {
            let _ = std::fs::remove_file(&resolved.real);
        }
        return Err(err);
    }
    file.set_len(0)
        .and_then(|()| file.write_all(content))
        .and_then(|()| file.flush())
        .map_err(|err| ToolError::Failed(format!("cannot write {}: {err}", resolved.display)))
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
