//! Which folders may be a workspace: an existing absolute folder, never `/`, the home folder itself or a system folder (everything under a workspace is free to read and, once remembered, to change); where a run finds its workspace (its real folder and project root); and the folder listing the web UI's folder dialog browses with.

use std::path::{Path, PathBuf};

use crate::error::RuntimeError;
use crate::protocol::commands::FolderList;

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

/// A workspace as a run finds it: its real folder (links resolved) and its project root
/// (the nearest folder at or above it with a `.git`, else itself). Found when a run
/// starts (runs started within seconds of each other in one folder share it:
/// `runtime::Shared::place`) and read by the instruction files, the skills and the agent
/// profiles alike, so that the three agree on the folders they read and none resolves
/// them again (each did, at every run: 3 % of a 1,000-child fan-out's CPU, issue 31).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// Where the workspace really is; the folder as named when it cannot be resolved.
    pub real: PathBuf,
    /// The project root: `real` or a folder above it.
    pub root: PathBuf,
    /// Why `real` is the folder as named: it could not be resolved (a notice for whoever
    /// reads from it).
    pub unresolved: Option<String>,
}

impl Place {
    /// The place of `workspace`, its project root found the way git finds a repository.
    pub fn find(workspace: &Path) -> Place {
        Place::find_within(workspace, None)
    }

    /// The same with `root` as the project root when the workspace is inside it (a caller
    /// that knows the project, such as a test of a nested layout).
    pub fn find_within(workspace: &Path, root: Option<&Path>) -> Place {
        let (real, unresolved) = match workspace.canonicalize() {
            Ok(real) => (real, None),
            Err(err) => (
                workspace.to_path_buf(),
                Some(format!(
                    "cannot resolve the workspace {}: {err}",
                    workspace.display()
                )),
            ),
        };
        let hinted = root
            .map(|hint| hint.canonicalize().unwrap_or_else(|_| hint.to_path_buf()))
            .filter(|hint| real.starts_with(hint));
        let root = hinted.unwrap_or_else(|| {
            real.ancestors()
                .find(|dir| dir.join(".git").exists())
                .unwrap_or(&real)
                .to_path_buf()
        });
        Place {
            real,
            root,
            unresolved,
        }
    }

    /// The folders from the project root down to the workspace, the root first.
    pub fn folders(&self) -> Vec<PathBuf> {
        let mut folders: Vec<PathBuf> = self
            .real
            .ancestors()
            .take_while(|dir| dir.starts_with(&self.root))
            .map(Path::to_path_buf)
            .collect();
        folders.reverse();
        folders
    }
}

/// A folder a person typed or picked, checked as a workspace before it is opened
/// (`check_workspace`): `~` is the home folder; a missing path, a file, a relative path
/// and the folders [`check_workspace`] refuses (the home folder itself, `/`, system
/// folders) are refused with a clear reason. Returns its real location.
pub fn check_folder(path: &str) -> Result<PathBuf, RuntimeError> {
    let trimmed = path.trim();
    if trimmed.is_empty() {
        return Err(RuntimeError::InvalidArgument("no folder given".into()));
    }
    let expanded = match (trimmed.strip_prefix('~'), dirs::home_dir()) {
        (Some(rest), Some(home)) if rest.is_empty() || rest.starts_with('/') => {
            home.join(rest.trim_start_matches('/'))
        }
        _ => PathBuf::from(trimmed),
    };
    if !expanded.is_absolute() {
        return Err(RuntimeError::InvalidArgument(format!(
            "{trimmed} is not an absolute path (start it with / or ~)"
        )));
    }
    match expanded.metadata() {
        Ok(meta) if !meta.is_dir() => {
            return Err(RuntimeError::InvalidArgument(format!(
                "{} is a file, not a folder",
                expanded.display()
            )));
        }
        Ok(_) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Err(RuntimeError::InvalidArgument(format!(
                "{} does not exist",
                expanded.display()
            )));
        }
        Err(err) => {
            return Err(RuntimeError::InvalidArgument(format!(
                "cannot open {}: {err}",
                expanded.display()
            )));
        }
    }
    check_workspace(&expanded)
}

/// The most directory entries one listing reads: a folder with more shows the first ones
/// (sorted among themselves) and says it was cut.
const MAX_ENTRIES_READ: usize = 20_000;

/// `path` without `.` and `..` (lexically: the dialog's Up button goes to the parent of
/// the folder as it was named, as a file manager does).
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// A folder's sub-folders for the folder dialog (`list_folders`): `None` or `~` is the
/// home folder; a relative, missing or unreadable path is a clear error. Names starting
/// with a dot are left out unless `hidden`, and then come after the others. At most
/// `limit` names (500 by default, 2000 at most); `truncated` says when there were more.
/// Only names are listed: nothing is opened below the folder itself.
pub fn list_folders(
    path: Option<&str>,
    hidden: bool,
    limit: Option<usize>,
) -> Result<FolderList, RuntimeError> {
    let home = dirs::home_dir();
    let named = path.map(str::trim).filter(|p| !p.is_empty()).unwrap_or("~");
    let expanded = match named.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => {
            let home = home.clone().ok_or_else(|| {
                RuntimeError::InvalidArgument("there is no home folder to start in".into())
            })?;
            home.join(rest.trim_start_matches('/'))
        }
        _ => PathBuf::from(named),
    };
    if !expanded.is_absolute() {
        return Err(RuntimeError::InvalidArgument(format!(
            "{named:?} is not an absolute path (start with / or ~)"
        )));
    }
    let folder = normalise(&expanded);
    let shown = folder.display().to_string();
    let entries = match std::fs::read_dir(&folder) {
        Ok(entries) => entries,
        Err(err) => {
            return Err(match err.kind() {
                std::io::ErrorKind::NotFound => {
                    RuntimeError::NotFound(format!("folder {shown} does not exist"))
                }
                std::io::ErrorKind::NotADirectory => {
                    RuntimeError::InvalidArgument(format!("{shown} is not a folder"))
                }
                std::io::ErrorKind::PermissionDenied => RuntimeError::InvalidArgument(format!(
                    "folder {shown} cannot be read: permission denied"
                )),
                _ => RuntimeError::InvalidArgument(format!("folder {shown} cannot be read: {err}")),
            });
        }
    };
    let limit = limit.unwrap_or(500).clamp(1, 2000);
    let mut names = Vec::new();
    let mut cut = false;
    for (read, entry) in entries.enumerate() {
        if read >= MAX_ENTRIES_READ {
            cut = true;
            break;
        }
        let Ok(entry) = entry else { continue };
        let name = entry.file_name().to_string_lossy().into_owned();
        if !hidden && name.starts_with('.') {
            continue;
        }
        // A symlink to a folder is a folder to the person (and to the workspace check).
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir())
            || entry.path().metadata().is_ok_and(|m| m.is_dir());
        if is_dir {
            names.push(name);
        }
    }
    names.sort_by(|a, b| {
        (a.starts_with('.'), a.to_lowercase(), a).cmp(&(b.starts_with('.'), b.to_lowercase(), b))
    });
    let truncated = cut || names.len() > limit;
    names.truncate(limit);
    Ok(FolderList {
        parent: folder.parent().map(|p| p.display().to_string()),
        path: shown,
        home: home.map(|h| h.display().to_string()),
        folders: names,
        truncated,
    })
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

    #[test]
    fn list_folders_lists_sub_folders_sorted_hidden_last_and_capped() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["beta", "Alpha", ".git", "gamma"] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
        }
        std::fs::write(dir.path().join("file.txt"), "x").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(dir.path().join("beta"), dir.path().join("link")).unwrap();
        let root = dir.path().to_str().unwrap();
        let list = list_folders(Some(root), false, None).unwrap();
        assert_eq!(list.path, root);
        assert_eq!(
            list.parent.as_deref(),
            dir.path().parent().and_then(|p| p.to_str())
        );
        let expected: Vec<&str> = if cfg!(unix) {
            vec!["Alpha", "beta", "gamma", "link"]
        } else {
            vec!["Alpha", "beta", "gamma"]
        };
        assert_eq!(list.folders, expected);
        assert!(!list.truncated);
        let all = list_folders(Some(root), true, None).unwrap();
        assert_eq!(all.folders.last().map(String::as_str), Some(".git"));
        let two = list_folders(Some(root), false, Some(2)).unwrap();
        assert_eq!(two.folders, ["Alpha", "beta"]);
        assert!(two.truncated);
        // `..` is resolved by name, so Up from a listed folder is its parent.
        let up = list_folders(Some(&format!("{root}/beta/..")), false, None).unwrap();
        assert_eq!(up.path, root);
    }

    #[test]
    fn list_folders_says_clearly_what_is_wrong_with_a_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("file.txt"), "x").unwrap();
        let missing = dir.path().join("nope");
        let err = list_folders(missing.to_str(), false, None).unwrap_err();
        assert_eq!(err.code(), "not_found");
        assert!(err.to_string().contains("does not exist"), "{err}");
        let file = dir.path().join("file.txt");
        let err = list_folders(file.to_str(), false, None).unwrap_err();
        assert!(err.to_string().contains("is not a folder"), "{err}");
        let err = list_folders(Some("relative/dir"), false, None).unwrap_err();
        assert!(err.to_string().contains("not an absolute path"), "{err}");
        if let Some(home) = dirs::home_dir() {
            let list = list_folders(None, false, None).unwrap();
            assert_eq!(list.path, home.display().to_string());
            assert_eq!(list.home, Some(home.display().to_string()));
        }
    }

    #[test]
    fn check_folder_says_why_a_typed_folder_cannot_be_a_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().join("proj");
        std::fs::create_dir(&project).unwrap();
        std::fs::write(dir.path().join("file.txt"), "x").unwrap();
        let real = check_folder(&format!("  {}  ", project.display())).unwrap();
        assert_eq!(real, project.canonicalize().unwrap());
        let err = |path: &str| check_folder(path).unwrap_err().to_string();
        assert!(err(&format!("{}/nope", dir.path().display())).contains("does not exist"));
        assert!(err(&format!("{}/file.txt", dir.path().display())).contains("is a file"));
        assert!(err("relative/dir").contains("not an absolute path"));
        assert!(err(" ").contains("no folder given"));
        assert!(err("/").contains("choose a project folder inside it"));
        assert!(err("/etc").contains("a system folder"));
        if dirs::home_dir().is_some_and(|h| h.is_dir()) {
            // (`/root` is refused as a wide folder, another home as the home folder itself.)
            assert!(
                err("~").contains("choose a project folder inside it"),
                "{}",
                err("~")
            );
        }
    }

    #[test]
    fn a_place_is_the_real_folder_and_the_repository_above_it() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        let repo = base.join("repo");
        let deep = repo.join("crates/core");
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::create_dir(repo.join(".git")).unwrap();
        // Named through a link: the real folder, the root found from there.
        let link = base.join("link");
        std::os::unix::fs::symlink(&deep, &link).unwrap();
        let place = Place::find(&link);
        assert_eq!(place.real, deep);
        assert_eq!(place.root, repo);
        assert_eq!(place.unresolved, None);
        assert_eq!(
            place.folders(),
            vec![repo.clone(), repo.join("crates"), deep.clone()]
        );
        // A root given by the caller counts only when the workspace is inside it.
        let hinted = Place::find_within(&deep, Some(&repo.join("crates")));
        assert_eq!(hinted.root, repo.join("crates"));
        let outside = Place::find_within(&deep, Some(&base.join("elsewhere")));
        assert_eq!(outside.root, repo);
        // No repository: the workspace is its own root.
        let plain = base.join("plain");
        std::fs::create_dir(&plain).unwrap();
        let place = Place::find(&plain);
        assert_eq!(
            (place.root.clone(), place.folders()),
            (plain.clone(), vec![plain])
        );
        // A folder that is gone: named as given, with the reason.
        let gone = Place::find(&base.join("gone"));
        assert_eq!(gone.real, base.join("gone"));
        assert!(
            gone.unresolved
                .unwrap()
                .contains("cannot resolve the workspace")
        );
    }
}
