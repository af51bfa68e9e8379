//! The shadow repository of one workspace: the git CLI driven with `GIT_DIR` in the data dir and `GIT_WORK_TREE` on the workspace, so snapshots are git trees and the person's own `.git` is never read or written.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::CheckpointError;

/// Files bigger than this are not recorded (and the undo preview says so).
pub const MAX_FILE_BYTES: u64 = 10 * 1024 * 1024;

/// A shadow repository: the git dir, and the workspace it snapshots.
#[derive(Debug, Clone)]
pub struct Shadow {
    pub git_dir: PathBuf,
    pub workspace: PathBuf,
}

/// One state of the workspace: a tree in the shadow store, and what it left out.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub tree: String,
    /// Paths not recorded, with why (`over the size cap`, `a nested git repository`).
    pub skipped: Vec<String>,
}

/// How a path differs between two trees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: String,
    /// `A`, `M`, `D` or `T` (type change) as `git diff-tree` says it.
    pub status: char,
    /// The mode and blob on the `to` side (`None` when the path is deleted there).
    pub to: Option<(String, String)>,
}

/// Whether git can be run at all; the message says why not.
pub fn available() -> Result<(), String> {
    let mut git = crate::git::Git::new(Path::new("/"));
    git.args(["--version"]);
    match git.output(None) {
        Ok(_) => Ok(()),
        Err(crate::git::GitError::Spawn(err)) => Err(format!("git was not found ({err})")),
        Err(err) => Err(err.to_string()),
    }
}

impl Shadow {
    /// Git on the shadow store: hardened like all of the runtime's git (`crate::git`),
    /// with `GIT_DIR` in the data dir and the workspace as the work tree. The shadow's
    /// config is the runtime's own, so nothing of it needs listing; the workspace's
    /// `.gitattributes` may name filters, but no driver is configured here.
    fn git(&self) -> crate::git::Git {
        let mut git = crate::git::Git::new(&self.workspace);
        git.env("GIT_DIR", &self.git_dir)
            .env("GIT_WORK_TREE", &self.workspace)
            // The shadow's index is the runtime's: its untracked cache is safe, and
            // saves each snapshot a walk of unchanged folders.
            .config("core.untrackedCache=true");
        git
    }

    /// Runs git with `args` (and `input` on stdin); its stdout, or an error with stderr.
    fn run(&self, args: &[&str], input: Option<&[u8]>) -> Result<Vec<u8>, CheckpointError> {
        let mut git = self.git();
        git.args(args);
        git.output(input)
            .map_err(|err| CheckpointError::Git(err.to_string()))
    }

    /// Creates the shadow repository if it does not exist yet.
    pub fn ensure(&self) -> Result<(), CheckpointError> {
        if self.git_dir.join("HEAD").exists() {
            return Ok(());
        }
        std::fs::create_dir_all(&self.git_dir)
            .map_err(|err| CheckpointError::io(&self.git_dir, err))?;
        self.run(&["init", "--quiet"], None)?;
        for (key, value) in [
            // Trees are only ever referenced from our records: git must never prune them.
            ("gc.auto", "0"),
            ("gc.pruneExpire", "never"),
            ("core.autocrlf", "false"),
            ("core.symlinks", "true"),
            ("core.quotePath", "false"),
            ("core.untrackedCache", "true"),
            ("core.fsmonitor", "false"),
            ("core.hooksPath", "/dev/null"),
        ] {
            self.run(&["config", key, value], None)?;
        }
        // Never recorded: the temporary files of the file tools (`tools::paths`) and of an
        // undo (killed half-way, they stay), which a snapshot taken meanwhile would catch,
        // and a data dir inside the workspace (tests, portable set-ups), whose shadow
        // would try to snapshot its own objects.
        let mut exclude = String::from(".*.bh-*.tmp\n.*.bumblehive-undo\n");
        if let Some(data) = self.git_dir.parent().and_then(Path::parent) {
            if let Ok(rel) = data.strip_prefix(&self.workspace) {
                if !rel.as_os_str().is_empty() {
                    exclude.push_str(&format!("/{}/\n", rel.display()));
                }
            }
        }
        let info = self.git_dir.join("info");
        std::fs::create_dir_all(&info).map_err(|err| CheckpointError::io(&info, err))?;
        std::fs::write(info.join("exclude"), exclude)
            .map_err(|err| CheckpointError::io(&info, err))?;
        std::fs::write(
            self.git_dir.join("bumblehive-workspace"),
            self.workspace.display().to_string(),
        )
        .map_err(|err| CheckpointError::io(&self.git_dir, err))?;
        Ok(())
    }

    /// Records the workspace as it is now. Only what changed since the last snapshot is
    /// hashed (git's index keeps the stat data); ignored files and files over the cap
    /// are left out.
    pub fn snapshot(&self) -> Result<Snapshot, CheckpointError> {
        self.ensure()?;
        let listed = self.run(
            &[
                "ls-files",
                "-z",
                "--others",
                "--modified",
                "--deleted",
                "--exclude-standard",
            ],
            None,
        )?;
        let mut update = Vec::new();
        let mut drop_big = Vec::new();
        let mut gone = Vec::new();
        let mut skipped = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut links = BTreeMap::new();
        for raw in listed.split(|b| *b == 0).filter(|p| !p.is_empty()) {
            if !seen.insert(raw) {
                continue;
            }
            let path = String::from_utf8_lossy(raw).into_owned();
            if path.ends_with('/') {
                // `ls-files --others` names a folder with its own `.git` as a whole.
                skipped.push(format!("{path} (a nested git repository)"));
                continue;
            }
            // A recorded file whose folder is a symlink now (security review 2, finding
            // 13): `update-index --remove` refuses a path "beyond a symbolic link", which
            // failed every later snapshot. It is gone from the workspace as recorded; the
            // link itself is recorded as a link.
            if let Some(link) = beyond_link(&self.workspace, &path, &mut links) {
                gone.extend_from_slice(raw);
                gone.push(0);
                let note = format!("{link}/ (a symlink now: nothing behind it is recorded)");
                if !skipped.contains(&note) {
                    skipped.push(note);
                }
                continue;
            }
            match std::fs::symlink_metadata(self.workspace.join(&path)) {
                Ok(meta) if meta.is_file() && meta.len() > MAX_FILE_BYTES => {
                    skipped.push(format!(
                        "{path} (over the {} MB cap)",
                        MAX_FILE_BYTES / 1024 / 1024
                    ));
                    drop_big.extend_from_slice(raw);
                    drop_big.push(0);
                }
                _ => {
                    update.extend_from_slice(raw);
                    update.push(0);
                }
            }
        }
        // Removed first, so that the link can take the folder's name in the index.
        if !gone.is_empty() {
            self.run(
                &["update-index", "-z", "--force-remove", "--stdin"],
                Some(&gone),
            )?;
        }
        if !update.is_empty() {
            self.run(
                &[
                    "update-index",
                    "-z",
                    "--add",
                    "--remove",
                    "--replace",
                    "--stdin",
                ],
                Some(&update),
            )?;
        }
        if !drop_big.is_empty() {
            self.run(
                &["update-index", "-z", "--force-remove", "--stdin"],
                Some(&drop_big),
            )?;
        }
        let tree = self.run(&["write-tree"], None)?;
        Ok(Snapshot {
            tree: String::from_utf8_lossy(&tree).trim().to_string(),
            skipped,
        })
    }
}

/// The first folder of `path` (relative to the workspace) that is a symlink or not a
/// folder now, if any; `known` remembers each folder's answer for the other paths.
fn beyond_link(workspace: &Path, path: &str, known: &mut BTreeMap<String, bool>) -> Option<String> {
    let mut prefix = String::new();
    let mut parts = path.split('/').peekable();
    while let Some(part) = parts.next() {
        if parts.peek().is_none() {
            break;
        }
        if !prefix.is_empty() {
            prefix.push('/');
        }
        prefix.push_str(part);
        let plain = *known.entry(prefix.clone()).or_insert_with(|| {
            std::fs::symlink_metadata(workspace.join(&prefix))
                .map(|meta| meta.is_dir())
                .unwrap_or(true)
        });
        if !plain {
            return Some(prefix);
        }
    }
    None
}

impl Shadow {
    /// How `to` differs from `from`, limited to `paths` when given.
    pub fn diff_trees(
        &self,
        from: &str,
        to: &str,
        paths: Option<&[String]>,
    ) -> Result<Vec<Entry>, CheckpointError> {
        if from == to {
            return Ok(Vec::new());
        }
        let mut args = vec!["diff-tree", "-r", "-z", "--no-renames", from, to];
        let literal: Vec<String>;
        if let Some(paths) = paths {
            if paths.is_empty() {
                return Ok(Vec::new());
            }
            args.push("--");
            literal = paths.iter().map(|p| format!(":(literal){p}")).collect();
            args.extend(literal.iter().map(String::as_str));
        }
        let out = self.run(&args, None)?;
        parse_diff_tree(&out)
    }

    /// A unified diff of `paths` between two trees, for the person to read.
    pub fn patch(&self, from: &str, to: &str, path: &str) -> Result<String, CheckpointError> {
        let literal = format!(":(literal){path}");
        let out = self.run(
            &[
                "diff",
                "--no-color",
                "--no-ext-diff",
                "--no-renames",
                from,
                to,
                "--",
                &literal,
            ],
            None,
        )?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// The content of a blob.
    pub fn blob(&self, oid: &str) -> Result<Vec<u8>, CheckpointError> {
        self.run(&["cat-file", "blob", oid], None)
    }

    /// Whether `path` is ignored by the workspace's `.gitignore` files.
    pub fn ignored(&self, path: &str) -> bool {
        self.run(&["check-ignore", "-q", "--no-index", "--", path], None)
            .is_ok()
    }
}

/// `:<old mode> <new mode> <old oid> <new oid> <status>\0<path>\0`, repeated.
fn parse_diff_tree(out: &[u8]) -> Result<Vec<Entry>, CheckpointError> {
    let mut fields = out.split(|b| *b == 0);
    let mut entries = Vec::new();
    while let Some(head) = fields.next() {
        if head.is_empty() {
            continue;
        }
        let head = String::from_utf8_lossy(head);
        let parts: Vec<&str> = head.trim_start_matches(':').split(' ').collect();
        let path = fields
            .next()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .ok_or_else(|| CheckpointError::Git(format!("diff-tree: no path after {head}")))?;
        let [_, new_mode, _, new_oid, status] = parts[..] else {
            return Err(CheckpointError::Git(format!(
                "diff-tree: cannot read {head}"
            )));
        };
        let status = status.chars().next().unwrap_or('M');
        entries.push(Entry {
            path,
            status,
            to: (status != 'D').then(|| (new_mode.to_string(), new_oid.to_string())),
        });
    }
    Ok(entries)
}

/// A workspace path's folders, opened one name at a time from the workspace, each with
/// `O_NOFOLLOW` (security review 2, finding 4): a recorded folder that a command turned
/// into a symlink is never written, removed or listed through.
struct Walked {
    /// The workspace's descriptor, then one per folder of the path.
    chain: Vec<std::fs::File>,
    /// The folders' names (one fewer than `chain`), and the last name.
    folders: Vec<std::ffi::OsString>,
    name: std::ffi::OsString,
}

/// Opens the folders of `rel` (relative to the workspace); with `create`, missing ones
/// are made, each inside the one opened before it. `None` when one is missing (and not
/// made); an error naming the folder when one is a symlink or a file now.
fn walk(workspace: &Path, rel: &str, create: bool) -> Result<Option<Walked>, CheckpointError> {
    use crate::tools::paths;
    use std::path::Component;
    let mut names = Vec::new();
    for component in Path::new(rel).components() {
        match component {
            Component::Normal(name) => names.push(name.to_os_string()),
            // A recorded path is plain and relative; anything else is refused.
            _ => {
                return Err(CheckpointError::Restore(format!(
                    "{rel} is not a plain path inside the workspace"
                )));
            }
        }
    }
    let name = names
        .pop()
        .ok_or_else(|| CheckpointError::Restore(format!("{rel} names no file")))?;
    // The workspace itself is where it really is (its parents are outside the
    // workspace, so no command of the sandbox changes them).
    let root = workspace
        .canonicalize()
        .map_err(|err| CheckpointError::io(workspace, err))?;
    let mut chain =
        vec![paths::open_folder(&root, false).map_err(|err| CheckpointError::io(&root, err))?];
    let folder = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    for (i, part) in names.iter().enumerate() {
        let Some(dir) = chain.last() else { break };
        let opened = match paths::open_at(dir, part, folder, 0) {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound && create => {
                match paths::mkdir_at(dir, part) {
                    Err(err) if err.kind() != std::io::ErrorKind::AlreadyExists => Err(err),
                    _ => paths::open_at(dir, part, folder, 0),
                }
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            other => other,
        };
        match opened {
            Ok(file) => chain.push(file),
            Err(_) => {
                let shown: Vec<String> = names[..=i]
                    .iter()
                    .map(|n| n.to_string_lossy().into_owned())
                    .collect();
                return Err(CheckpointError::Restore(format!(
                    "{rel}: {} is a symlink or a file now, not the folder that was recorded; nothing is written through it",
                    shown.join("/")
                )));
            }
        }
    }
    Ok(Some(Walked {
        chain,
        folders: names,
        name,
    }))
}

/// Whether `rel` can be restored without going through a symlink: the check an undo
/// makes for every path before it changes any.
pub fn check_restorable(shadow: &Shadow, rel: &str) -> Result<(), CheckpointError> {
    walk(&shadow.workspace, rel, false).map(drop)
}

/// Puts `path` (relative to the workspace) in the state `entry` describes, one file at a
/// time and atomically: a new content is written beside it and renamed over it, so a
/// process killed meanwhile leaves the old file or the new one, never a mix. Every step
/// is relative to a folder descriptor opened without following symlinks ([`walk`]).
pub fn restore_entry(
    shadow: &Shadow,
    entry: &Entry,
    contents: &BTreeMap<String, Vec<u8>>,
) -> Result<(), CheckpointError> {
    use crate::tools::paths;
    let target = shadow.workspace.join(&entry.path);
    let is_dir = |stat: &libc::stat| stat.st_mode & libc::S_IFMT == libc::S_IFDIR;
    match &entry.to {
        None => {
            let Some(walked) = walk(&shadow.workspace, &entry.path, false)? else {
                return Ok(());
            };
            let Some(dir) = walked.chain.last() else {
                return Ok(());
            };
            match paths::stat_at(dir, &walked.name)
                .map_err(|err| CheckpointError::io(&target, err))?
            {
                Some(stat) if is_dir(&stat) => {
                    return Err(CheckpointError::Restore(format!(
                        "{} is a folder now; it was not removed",
                        entry.path
                    )));
                }
                Some(_) => paths::unlink_at(dir, &walked.name)
                    .map_err(|err| CheckpointError::io(&target, err))?,
                None => {}
            }
            remove_empty_parents(&walked);
            Ok(())
        }
        Some((mode, oid)) => {
            let bytes = contents.get(oid).ok_or_else(|| {
                CheckpointError::Restore(format!("no content for {}", entry.path))
            })?;
            let walked = walk(&shadow.workspace, &entry.path, true)?
                .ok_or_else(|| CheckpointError::Restore(format!("{} has no folder", entry.path)))?;
            let Some(dir) = walked.chain.last() else {
                return Err(CheckpointError::Restore(format!(
                    "{} has no folder",
                    entry.path
                )));
            };
            let now = paths::stat_at(dir, &walked.name)
                .map_err(|err| CheckpointError::io(&target, err))?;
            if now.as_ref().is_some_and(is_dir) {
                return Err(CheckpointError::Restore(format!(
                    "{} is a folder now; the file was not put back",
                    entry.path
                )));
            }
            let tmp = std::ffi::OsString::from(format!(
                ".{}.{}{TEMP_SUFFIX}",
                walked.name.to_string_lossy(),
                uuid::Uuid::new_v4().simple()
            ));
            let written = write_temp(dir, &tmp, mode, bytes)
                .and_then(|()| paths::rename_at(dir, &tmp, &walked.name));
            if let Err(err) = written {
                let _ = paths::unlink_at(dir, &tmp);
                return Err(CheckpointError::io(&target, err));
            }
            Ok(())
        }
    }
}

/// The suffix of an undo's temporary files (`.<name>.<uuid><suffix>`).
const TEMP_SUFFIX: &str = ".bumblehive-undo";

/// Removes the temporary files an earlier, killed undo left in the folder of `rel` (a
/// workspace path), found without following symlinks.
pub fn remove_stale_temps(shadow: &Shadow, rel: &str) {
    use std::os::fd::AsRawFd;
    let Ok(Some(walked)) = walk(&shadow.workspace, rel, false) else {
        return;
    };
    let Some(dir) = walked.chain.last() else {
        return;
    };
    // The folder's entries through its descriptor, never through its name.
    let Ok(entries) = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let text = name.to_string_lossy();
        if text.starts_with('.') && text.ends_with(TEMP_SUFFIX) {
            let _ = crate::tools::paths::unlink_at(dir, &name);
        }
    }
}

/// Writes `bytes` as the new file `tmp` in `dir` (a symlink for mode 120000).
fn write_temp(
    dir: &std::fs::File,
    tmp: &std::ffi::OsStr,
    mode: &str,
    bytes: &[u8],
) -> std::io::Result<()> {
    use crate::tools::paths;
    use std::os::fd::AsRawFd;
    if mode == "120000" {
        let link = std::ffi::CString::new(bytes.to_vec())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidData))?;
        let name = paths::c_name(tmp)?;
        // SAFETY: both strings are NUL-terminated and `dir` is open for the call.
        return paths::check(unsafe {
            libc::symlinkat(link.as_ptr(), dir.as_raw_fd(), name.as_ptr())
        })
        .map(drop);
    }
    let mut file = paths::open_at(
        dir,
        tmp,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        0o600,
    )?;
    file.write_all(bytes)?;
    // Flushed before the rename: after a power loss the file is old or new, not empty.
    file.sync_all()?;
    use std::os::unix::fs::PermissionsExt;
    let bits = if mode == "100755" { 0o755 } else { 0o644 };
    file.set_permissions(std::fs::Permissions::from_mode(bits))?;
    Ok(())
}

/// Removes folders that a deletion left empty, up to (not including) the workspace, each
/// by its name in the folder opened before it.
fn remove_empty_parents(walked: &Walked) {
    use std::os::fd::AsRawFd;
    for i in (0..walked.folders.len()).rev() {
        let Ok(name) = crate::tools::paths::c_name(&walked.folders[i]) else {
            break;
        };
        // SAFETY: `name` is NUL-terminated and the parent descriptor is open. `rmdir`
        // refuses a folder that is not empty: nothing else is touched.
        let removed = unsafe {
            libc::unlinkat(
                walked.chain[i].as_raw_fd(),
                name.as_ptr(),
                libc::AT_REMOVEDIR,
            )
        };
        if removed != 0 {
            break;
        }
    }
}

/// Keeping the store bounded (review R8): each record's trees are held by refs, so that
/// `gc` keeps exactly what some record can still undo to, and drops the rest.
impl Shadow {
    /// Points each ref (`refs/bh/…`) at its tree, in one git process.
    pub fn keep(&self, refs: &[(String, String)]) -> Result<(), CheckpointError> {
        let input: String = refs
            .iter()
            .map(|(name, oid)| format!("update {name} {oid}\n"))
            .collect();
        self.run(&["update-ref", "--stdin"], Some(input.as_bytes()))
            .map(|_| ())
    }

    /// Deletes refs, in one git process.
    pub fn drop_refs(&self, names: &[String]) -> Result<(), CheckpointError> {
        if names.is_empty() {
            return Ok(());
        }
        let input: String = names
            .iter()
            .map(|name| format!("delete {name}\n"))
            .collect();
        self.run(&["update-ref", "--stdin"], Some(input.as_bytes()))
            .map(|_| ())
    }

    /// The refs under `prefix` (e.g. `refs/bh/<session>/`).
    pub fn refs(&self, prefix: &str) -> Result<Vec<String>, CheckpointError> {
        if !self.git_dir.join("HEAD").exists() {
            return Ok(Vec::new());
        }
        let out = self.run(&["for-each-ref", "--format=%(refname)", prefix], None)?;
        Ok(String::from_utf8_lossy(&out)
            .lines()
            .map(str::to_string)
            .collect())
    }

    /// Bytes the store's objects take (loose and packed), as `git count-objects` says.
    pub fn store_bytes(&self) -> Result<u64, CheckpointError> {
        if !self.git_dir.join("HEAD").exists() {
            return Ok(0);
        }
        let out = self.run(&["count-objects", "-v"], None)?;
        let text = String::from_utf8_lossy(&out);
        let kib: u64 = text
            .lines()
            .filter_map(|line| {
                let (key, value) = line.split_once(": ")?;
                matches!(key, "size" | "size-pack" | "size-garbage")
                    .then(|| value.trim().parse::<u64>().ok())
                    .flatten()
            })
            .sum();
        Ok(kib * 1024)
    }

    /// Drops every object no ref and no index entry reaches, now (the store's own config
    /// says never, so that nothing goes behind a record's back).
    pub fn prune(&self) -> Result<(), CheckpointError> {
        self.run(
            &[
                "-c",
                "gc.pruneExpire=now",
                "-c",
                "gc.reflogExpire=now",
                "-c",
                "gc.reflogExpireUnreachable=now",
                "gc",
                "--prune=now",
                "--quiet",
            ],
            None,
        )
        .map(|_| ())
    }

    /// Whether the store still has this object.
    pub fn has(&self, oid: &str) -> bool {
        self.run(&["cat-file", "-e", oid], None).is_ok()
    }
}

impl Shadow {
    /// Which of these objects the store has, in one git process.
    pub fn present(&self, oids: &[String]) -> Result<BTreeMap<String, bool>, CheckpointError> {
        if oids.is_empty() {
            return Ok(BTreeMap::new());
        }
        let input: String = oids.iter().map(|oid| format!("{oid}\n")).collect();
        let out = self.run(&["cat-file", "--batch-check"], Some(input.as_bytes()))?;
        Ok(oids
            .iter()
            .zip(String::from_utf8_lossy(&out).lines())
            .map(|(oid, line)| (oid.clone(), !line.ends_with(" missing")))
            .collect())
    }
}
