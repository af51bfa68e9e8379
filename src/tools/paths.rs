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
    })
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
