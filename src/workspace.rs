//! Which folders may be a workspace: an existing absolute folder, never `/`, the home folder itself or a system folder (everything under a workspace is free to read and, once remembered, to change).

use std::path::{Path, PathBuf};

use crate::error::RuntimeError;

/// System folders that are never a workspace, nor is anything under them.
const SYSTEM_TREES: &[&str] = &[
    "/proc",
    "/sys",
    "/dev",
    "/run",
    "/boot",
    "/etc",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/usr",
    "/var",
    "/System",
    "/Library",
    "/private/etc",
    "/private/var",
];

/// Folders that are refused themselves (too wide), though a folder below them is fine.
const WIDE: &[&str] = &[
    "/", "/home", "/Users", "/root", "/tmp", "/opt", "/mnt", "/media", "/srv",
];

/// Checks a workspace a person or a `submit` override names and returns its real location.
/// Refuses relative and missing paths, `/`, the home folder itself, folders that hold
/// home folders, and system folders (`/etc`, `/proc`, `/usr`, …).
pub fn check_workspace(path: &Path) -> Result<PathBuf, RuntimeError> {
    let shown = path.display();
    if !path.is_absolute() {
        return Err(RuntimeError::InvalidArgument(format!(
            "workspace must be an absolute path, got {shown:?}"
        )));
    }
    let real = path.canonicalize().map_err(|err| {
        RuntimeError::InvalidArgument(format!("workspace {shown} cannot be opened: {err}"))
    })?;
    if !real.is_dir() {
        return Err(RuntimeError::InvalidArgument(format!(
            "workspace {shown} is not a folder"
        )));
    }
    let refuse = |why: &str| {
        Err(RuntimeError::InvalidArgument(format!(
            "workspace {shown} ({}) is {why}; choose a project folder inside it",
            real.display()
        )))
    };
    if WIDE.iter().any(|wide| real == Path::new(wide)) {
        return refuse("a folder that holds other people's or the whole system's files");
    }
    let home = dirs::home_dir().and_then(|home| home.canonicalize().ok());
    if let Some(home) = &home {
        if real == *home {
            return refuse("your home folder itself (keys, mail, browser profiles)");
        }
        if home.starts_with(&real) {
            return refuse("a folder that contains your home folder");
        }
    }
    // A home folder under a system tree (root's /root is in WIDE; some set HOME=/var/lib/x)
    // stays allowed below it.
    let under_home = home.as_ref().is_some_and(|home| real.starts_with(home));
    if !under_home && SYSTEM_TREES.iter().any(|tree| real.starts_with(tree)) {
        return refuse("a system folder");
    }
    Ok(real)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_home_and_system_folders_are_refused_a_project_is_not() {
        for bad in [
            "/",
            "/etc",
            "/proc",
            "/usr/lib",
            "/tmp",
            "relative/dir",
            "/nonexistent-xyz",
        ] {
            assert!(check_workspace(Path::new(bad)).is_err(), "{bad} accepted");
        }
        if let Some(home) = dirs::home_dir() {
            assert!(check_workspace(&home).is_err());
        }
        let dir = tempfile::tempdir().unwrap();
        let real = check_workspace(dir.path()).unwrap();
        assert_eq!(real, dir.path().canonicalize().unwrap());
    }
}
