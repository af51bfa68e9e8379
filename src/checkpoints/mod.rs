//! Checkpoints and undo: before a tool that changes the workspace runs, the workspace is recorded in a shadow git store in the data dir (git and non-git folders alike, shell commands included); each session's records say which files each call changed, so a turn's changes can be shown, and undone.
//!
//! Design (the README's "Undo" section says it for the person):
//! - One shadow repository per workspace, `<data>/checkpoints/<hash of the path>/`, driven
//!   with the git CLI (`GIT_DIR` there, `GIT_WORK_TREE` the workspace). A snapshot is a
//!   tree (`update-index` of what `ls-files` says changed, then `write-tree`): only changed
//!   files are hashed, and only new contents take space. The person's `.git` is never
//!   touched; their `.gitignore` files are honoured; files over [`git::MAX_FILE_BYTES`]
//!   and nested git repositories are left out, and the preview says so.
//! - Per call: a snapshot before and after it, under a per-workspace lock (the "before"
//!   is the previous call's "after" when [`watch`] vouches that nothing changed since);
//!   the record
//!   (session, turn = index of the person's message, call, both trees, changed paths) is
//!   appended to `<data>/checkpoints/sessions/<session>.jsonl`.
//! - Undo from a turn: every file the session's calls changed from that turn on goes back
//!   to its content before the first of those calls touched it; a file whose content is
//!   not what the agent left (the person changed it since) is refused unless forced.
//!   Each file is replaced atomically (temp file + rename), so a crash mid-undo leaves
//!   each file old or new. Empty folders are not recorded; folders a restore empties are
//!   removed. Symlinks are restored as links, the executable bit is kept.
//! - Without git, checkpoints are off and every command says so.

pub mod git;
pub(crate) mod session_ops;
pub mod watch;
pub mod worktree;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::protocol::Message;
use crate::protocol::commands::{FileChange, TurnChange, TurnChanges, UndoResult};
use git::{Entry, Shadow};

/// Why a checkpoint operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoints are off: {0}")]
    Off(String),
    #[error("{0}")]
    Git(String),
    #[error("cannot restore: {0}")]
    Restore(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Files the person changed after the agent wrote them; nothing was restored.
    #[error(
        "these files were changed after the agent wrote them, so undo would lose those changes: {}; nothing was restored (undo again with force to overwrite them)",
        .0.join(", ")
    )]
    Conflict(Vec<String>),
}

impl CheckpointError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        CheckpointError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// One changing call, as recorded.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CallRecord {
    /// The history index of the person's message whose turn made the call.
    turn: usize,
    call_id: String,
    tool: String,
    workspace: String,
    before: String,
    after: String,
    /// When the call started and finished (a clock made monotonic across records).
    started: u64,
    finished: u64,
    changed: Vec<String>,
    #[serde(default)]
    skipped: Vec<String>,
    /// Its trees were dropped to keep the store bounded (a `Pruned` line says so).
    #[serde(skip)]
    pruned: bool,
}

/// A line of a session's record file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum Line {
    Call(CallRecord),
    /// Every call of a turn `>= undo_from` finished before `at` was undone.
    Undo {
        undo_from: usize,
        at: u64,
    },
    /// The trees of every call in `pruned_workspace` that finished at or before
    /// `pruned_until` are gone (the store passed its bound or they passed their age).
    Pruned {
        pruned_workspace: String,
        pruned_until: u64,
    },
}

/// The checkpoint store of one data dir.
pub struct Checkpoints {
    root: PathBuf,
    /// Why checkpoints are off (git missing), if they are: found at first use, not at
    /// start, since `git --version` would cost every `bumblehive run` a process.
    off: std::sync::OnceLock<Option<String>>,
    /// One lock per workspace: snapshots share the shadow index.
    locks: Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
    clock: AtomicU64,
    /// See [`StoreLimits`].
    limits: Mutex<StoreLimits>,
    /// Per shadow: held by every call between its two snapshots, whose before tree no
    /// ref holds yet; the store is not pruned meanwhile.
    pins: Mutex<HashMap<PathBuf, Arc<()>>>,
    /// Shadows whose maintenance runs now (one at a time each), and whether another
    /// record asked for it meanwhile (then it runs once more).
    maintaining: Mutex<BTreeMap<PathBuf, bool>>,
    /// Per shadow: the watch on its workspace and the last snapshot, which stands in for
    /// the next call's "before" while the watch saw nothing (see [`watch`]).
    tracked: Arc<Mutex<HashMap<PathBuf, Tracked>>>,
    /// Snapshots actually taken (workspace walks), for the benches and tests.
    walks: Arc<AtomicU64>,
}

/// Workspaces whose watches are kept at once: each is an inotify instance (the kernel
/// allows 128 a user by default, shared with editors), and a workspace left for a while
/// costs one snapshot to pick up again.
const TRACKED: usize = 8;

/// A workspace's watch, the snapshot it vouches for, and when it was last used.
struct Tracked {
    watch: Option<watch::Watch>,
    /// Why there is no watch; [`watch::NoWatch::TooBig`] and `Remote` are not retried.
    no_watch: Option<watch::NoWatch>,
    last: Option<git::Snapshot>,
    used: u64,
    /// Rebuilds after a break; a workspace whose folders keep moving stops being watched.
    rebuilds: u32,
}

/// Rebuilds of a broken watch before a workspace stops being watched: each costs a walk
/// of its folders on top of the snapshot.
const MAX_REBUILDS: u32 = 16;

/// How large one workspace's shadow store may grow and how old its records may get
/// (review R8); past either, the oldest records' trees go (and the records say so).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoreLimits {
    pub max_bytes: u64,
    pub max_age: std::time::Duration,
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits {
            max_bytes: 1024 * 1024 * 1024,
            max_age: std::time::Duration::from_secs(30 * 24 * 3600),
        }
    }
}

impl Checkpoints {
    /// The store under `<data_dir>/checkpoints`; off (and logged once) when git is missing.
    pub fn new(data_dir: &Path) -> Arc<Self> {
        Arc::new(Checkpoints {
            // Canonical, so that a data dir inside a workspace is recognised (and left out).
            root: data_dir
                .canonicalize()
                .unwrap_or_else(|_| data_dir.to_path_buf())
                .join("checkpoints"),
            off: std::sync::OnceLock::new(),
            locks: Mutex::new(HashMap::new()),
            clock: AtomicU64::new(0),
            limits: Mutex::new(StoreLimits::default()),
            pins: Mutex::new(HashMap::new()),
            maintaining: Mutex::new(BTreeMap::new()),
            tracked: Arc::new(Mutex::new(HashMap::new())),
            walks: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Why checkpoints are off, if they are.
    pub fn off(&self) -> Option<&str> {
        self.off
            .get_or_init(|| {
                let off = git::available().err();
                if let Some(why) = &off {
                    tracing::warn!("checkpoints and undo are off: {why}");
                }
                off
            })
            .as_deref()
    }

    fn check_on(&self) -> Result<(), CheckpointError> {
        match self.off() {
            Some(why) => Err(CheckpointError::Off(why.to_string())),
            None => Ok(()),
        }
    }

    /// A wall-clock stamp in nanoseconds, strictly greater than every earlier one.
    fn tick(&self) -> u64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let previous = self.clock.fetch_max(now, Ordering::SeqCst);
        if previous >= now {
            self.clock.fetch_add(1, Ordering::SeqCst) + 1
        } else {
            now
        }
    }

    /// The shadow repository of a workspace.
    pub fn shadow(&self, workspace: &Path) -> Shadow {
        let canonical = workspace
            .canonicalize()
            .unwrap_or_else(|_| workspace.to_path_buf());
        Shadow {
            git_dir: self.root.join(format!(
                "{:016x}",
                fnv1a(canonical.to_string_lossy().as_bytes())
            )),
            workspace: canonical,
        }
    }

    fn lock(&self, shadow: &Shadow) -> Arc<tokio::sync::Mutex<()>> {
        self.locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(shadow.git_dir.clone())
            .or_default()
            .clone()
    }

    fn records_path(&self, session_id: &str) -> PathBuf {
        self.root
            .join("sessions")
            .join(format!("{session_id}.jsonl"))
    }

    fn append(&self, session_id: &str, line: &Line) -> Result<(), CheckpointError> {
        let path = self.records_path(session_id);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|err| CheckpointError::io(dir, err))?;
        }
        let mut text = serde_json::to_string(line)
            .map_err(|err| CheckpointError::Git(format!("cannot encode a record: {err}")))?;
        text.push('\n');
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|err| CheckpointError::io(&path, err))?;
        // One write per line: lines of concurrent calls do not interleave.
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_data())
            .map_err(|err| CheckpointError::io(&path, err))
    }

    /// A session's call records, each with whether it was undone. A torn last line (a
    /// crash mid-append) is skipped.
    fn records(&self, session_id: &str) -> Result<Vec<(CallRecord, bool)>, CheckpointError> {
        let path = self.records_path(session_id);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(err) => return Err(CheckpointError::io(&path, err)),
        };
        let mut calls: Vec<(CallRecord, bool)> = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            match serde_json::from_str::<Line>(line) {
                Ok(Line::Call(call)) => calls.push((call, false)),
                Ok(Line::Undo { undo_from, at }) => {
                    for (call, undone) in &mut calls {
                        if call.turn >= undo_from && call.finished < at {
                            *undone = true;
                        }
                    }
                }
                Ok(Line::Pruned {
                    pruned_workspace,
                    pruned_until,
                }) => {
                    for (call, _) in &mut calls {
                        if call.workspace == pruned_workspace && call.finished <= pruned_until {
                            call.pruned = true;
                        }
                    }
                }
                Err(err) => {
                    tracing::warn!(session = session_id, "skipping a checkpoint record: {err}")
                }
            }
        }
        Ok(calls)
    }

    /// Forgets a deleted session's records (the shadow store stays: other sessions of
    /// the workspace share it).
    pub fn forget_session(&self, session_id: &str) {
        self.drop_session_refs(session_id);
        let path = self.records_path(session_id);
        if let Err(err) = std::fs::remove_file(&path) {
            if err.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(
                    session = session_id,
                    "cannot remove checkpoint records: {err}"
                );
            }
        }
    }

    /// Takes a snapshot of `workspace` now (the benchmark and the hook use it).
    pub async fn snapshot(&self, workspace: &Path) -> Result<git::Snapshot, CheckpointError> {
        Ok(self.stamped_snapshot(workspace, false).await?.0)
    }

    /// The workspace as it is before a changing call: the last snapshot when its watch
    /// saw nothing change since, else a new one. Returns whether it was the last one.
    pub async fn snapshot_before_call(
        &self,
        workspace: &Path,
    ) -> Result<(git::Snapshot, bool), CheckpointError> {
        let walks = self.walks();
        let (snapshot, _) = self.stamped_snapshot(workspace, true).await?;
        Ok((snapshot, self.walks() == walks))
    }

    /// How many snapshots walked the workspace so far (the others were vouched for).
    pub fn walks(&self) -> u64 {
        self.walks.load(Ordering::SeqCst)
    }

    /// A snapshot and its stamp, taken under the workspace's lock: stamps order the
    /// snapshots of concurrent calls as they were really taken. With `reuse`, the last
    /// snapshot serves if nothing changed since.
    async fn stamped_snapshot(
        &self,
        workspace: &Path,
        reuse: bool,
    ) -> Result<(git::Snapshot, u64), CheckpointError> {
        self.check_on()?;
        let shadow = self.shadow(workspace);
        let guard = self.lock(&shadow).lock_owned().await;
        let stamp = self.tick();
        let tracked = self.tracked.clone();
        let walks = self.walks.clone();
        let used = stamp;
        // The lock goes with the work: if this future is dropped (a Stop), git still
        // runs to the end, and no other snapshot may use the index meanwhile.
        let snapshot = tokio::task::spawn_blocking(move || {
            let _guard = guard;
            tracked_snapshot(&tracked, &walks, &shadow, reuse, used)
        })
        .await
        .map_err(|err| CheckpointError::Git(format!("the snapshot failed: {err}")))??;
        Ok((snapshot, stamp))
    }

    /// Forgets the snapshot a shadow's watch vouches for (its store was pruned: the tree
    /// may be gone). Called under the shadow's lock.
    fn forget_last(&self, shadow: &Shadow) {
        if let Some(entry) = self
            .tracked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&shadow.git_dir)
        {
            entry.last = None;
        }
    }

    /// The changes of each turn of a session, with their diffs; `history` names turns.
    pub async fn turn_changes(
        self: &Arc<Self>,
        session_id: &str,
    ) -> Result<TurnChanges, CheckpointError> {
        if let Some(why) = self.off() {
            return Ok(TurnChanges {
                available: false,
                notice: Some(format!("Checkpoints and undo are off: {why}")),
                turns: Vec::new(),
                children: Vec::new(),
            });
        }
        let this = self.clone();
        let id = session_id.to_string();
        tokio::task::spawn_blocking(move || this.turn_changes_blocking(&id))
            .await
            .map_err(|err| CheckpointError::Git(format!("reading changes failed: {err}")))?
    }

    fn turn_changes_blocking(&self, session_id: &str) -> Result<TurnChanges, CheckpointError> {
        // Maintenance may prune while this reads without its lock; it marks the records
        // pruned before any tree goes, so a tree found missing means the records say so
        // now: read them once more.
        match self.turn_changes_once(session_id) {
            Err(CheckpointError::Git(_)) => self.turn_changes_once(session_id),
            other => other,
        }
    }

    fn turn_changes_once(&self, session_id: &str) -> Result<TurnChanges, CheckpointError> {
        let records = self.records(session_id)?;
        let mut by_turn: BTreeMap<usize, Vec<&(CallRecord, bool)>> = BTreeMap::new();
        for record in &records {
            by_turn.entry(record.0.turn).or_default().push(record);
        }
        let mut turns = Vec::new();
        for (turn, calls) in by_turn {
            let undone = calls.iter().all(|(_, undone)| *undone);
            if calls.iter().any(|(call, _)| call.pruned) {
                turns.push(TurnChange {
                    message_index: turn,
                    files: Vec::new(),
                    skipped: Vec::new(),
                    undone,
                    pruned: true,
                });
                continue;
            }
            let mut files = Vec::new();
            let mut skipped = BTreeSet::new();
            let plan = plan_files(calls.iter().map(|(c, _)| c));
            // Shown as of the turn's last snapshot: a later call's snapshot has what an
            // earlier one caught half-way (a temporary file) settled again.
            let last_after: BTreeMap<&str, &str> = calls
                .iter()
                .map(|(c, _)| c)
                .fold(BTreeMap::<&str, (u64, &str)>::new(), |mut last, c| {
                    let entry = last.entry(c.workspace.as_str()).or_insert((0, ""));
                    if c.finished >= entry.0 {
                        *entry = (c.finished, c.after.as_str());
                    }
                    last
                })
                .into_iter()
                .map(|(ws, (_, tree))| (ws, tree))
                .collect();
            for ((workspace, path), (before, after)) in plan {
                let after = last_after
                    .get(workspace.as_str())
                    .map(|t| t.to_string())
                    .unwrap_or(after);
                let shadow = self.shadow(Path::new(&workspace));
                let entries =
                    shadow.diff_trees(&before, &after, Some(std::slice::from_ref(&path)))?;
                let Some(entry) = entries.first() else {
                    continue; // changed and changed back within the turn
                };
                files.push(FileChange {
                    path: path.clone(),
                    status: status_name(entry.status).into(),
                    diff: shadow.patch(&before, &after, &path)?,
                });
            }
            for (call, _) in &calls {
                skipped.extend(call.skipped.iter().cloned());
            }
            turns.push(TurnChange {
                message_index: turn,
                files,
                skipped: skipped.into_iter().collect(),
                undone,
                pruned: false,
            });
        }
        Ok(TurnChanges {
            available: true,
            notice: None,
            turns,
            children: Vec::new(),
        })
    }

    /// Restores every file the session's calls changed from the turn of `from` on to
    /// its content before that. `preview` only says what would change back. Refuses
    /// files the person changed since the agent wrote them, unless `force`.
    pub async fn undo(
        self: &Arc<Self>,
        session_id: &str,
        from: usize,
        force: bool,
        preview: bool,
    ) -> Result<UndoResult, CheckpointError> {
        self.undo_with(session_id, from, &[], force, preview).await
    }

    /// [`Self::undo`] of a session's turns together with every change of `children`
    /// (sub-agents, each with the turn of `session_id` that started it), as one undo:
    /// one plan, so a file both changed goes back to before the first of them, and
    /// nothing is restored if anything conflicts (UX review E6).
    pub async fn undo_with(
        self: &Arc<Self>,
        session_id: &str,
        from: usize,
        children: &[(String, usize)],
        force: bool,
        preview: bool,
    ) -> Result<UndoResult, CheckpointError> {
        self.check_on()?;
        let records = self.records(session_id)?;
        let mut active: Vec<CallRecord> = records
            .into_iter()
            .filter(|(call, undone)| !undone && call.turn >= from)
            .map(|(call, _)| call)
            .collect();
        for (child, turn) in children {
            // A child's calls count as the parent's turn that started it: turns are
            // history indexes of one session, and the plan groups calls by turn.
            active.extend(
                self.records(child)?
                    .into_iter()
                    .filter(|(_, undone)| !undone)
                    .map(|(mut call, _)| {
                        call.turn = *turn;
                        call
                    }),
            );
        }
        if let Some(pruned) = active.iter().find(|call| call.pruned) {
            return Err(CheckpointError::Restore(format!(
                "the undo history of turn {} and earlier was cleared to keep the checkpoint store within its bound (checkpoints.max_store_mb, checkpoints.max_age_days); later turns can still be undone",
                pruned.turn
            )));
        }
        let plan = plan_files(active.iter());
        let mut workspaces: BTreeMap<String, Vec<(String, String, String)>> = BTreeMap::new();
        for ((workspace, path), (before, after)) in plan {
            workspaces
                .entry(workspace)
                .or_default()
                .push((path, before, after));
        }
        let mut result = UndoResult {
            applied: false,
            files: Vec::new(),
            conflicts: Vec::new(),
            skipped: active
                .iter()
                .flat_map(|c| c.skipped.iter().cloned())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
        };
        // All workspaces are checked before any is changed: nothing applies half-way
        // because of a conflict.
        let mut planned = Vec::new();
        for (workspace, files) in workspaces {
            let shadow = self.shadow(Path::new(&workspace));
            let guard = self.lock(&shadow).lock_owned().await;
            let check = shadow.clone();
            let (entries, conflicts, changes) =
                tokio::task::spawn_blocking(move || plan_restore(&check, &files))
                    .await
                    .map_err(|err| CheckpointError::Git(format!("the undo failed: {err}")))??;
            result.conflicts.extend(conflicts);
            result.files.extend(changes);
            planned.push((shadow, guard, entries));
        }
        if preview {
            return Ok(result);
        }
        if !result.conflicts.is_empty() && !force {
            return Err(CheckpointError::Conflict(result.conflicts));
        }
        for (shadow, _guard, entries) in planned {
            tokio::task::spawn_blocking(move || apply(&shadow, &entries))
                .await
                .map_err(|err| CheckpointError::Git(format!("the undo failed: {err}")))??;
        }
        let at = self.tick();
        for (child, _) in children {
            self.append(child, &Line::Undo { undo_from: 0, at })?;
        }
        self.append(
            session_id,
            &Line::Undo {
                undo_from: from,
                at,
            },
        )?;
        result.applied = true;
        Ok(result)
    }
}

/// For each (workspace, path) the calls changed: the tree it goes back to and the tree
/// that holds what the agent left in it.
///
/// It goes back to the first snapshot of the first turn that changed it: within a turn
/// that snapshot comes before every change (a later call's snapshot may have caught a
/// concurrent call half-way, e.g. its temporary file), and between turns the person's
/// own edits are kept. What the agent left is in the last snapshot after a call that
/// changed it.
fn plan_files<'a>(
    calls: impl Iterator<Item = &'a CallRecord>,
) -> BTreeMap<(String, String), (String, String)> {
    let calls: Vec<&CallRecord> = calls.collect();
    // The first snapshot of each (workspace, turn).
    let mut first_of_turn: BTreeMap<(&str, usize), (u64, &str)> = BTreeMap::new();
    for call in &calls {
        let first = first_of_turn
            .entry((call.workspace.as_str(), call.turn))
            .or_insert((u64::MAX, ""));
        if call.started < first.0 {
            *first = (call.started, call.before.as_str());
        }
    }
    let mut first_turn: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut last: BTreeMap<(String, String), (u64, String)> = BTreeMap::new();
    for call in &calls {
        for path in &call.changed {
            let key = (call.workspace.clone(), path.clone());
            let turn = first_turn.entry(key.clone()).or_insert(call.turn);
            *turn = (*turn).min(call.turn);
            let latest = last.entry(key).or_insert((0, String::new()));
            if call.finished >= latest.0 {
                *latest = (call.finished, call.after.clone());
            }
        }
    }
    first_turn
        .into_iter()
        .filter_map(|(key, turn)| {
            let before = first_of_turn.get(&(key.0.as_str(), turn))?.1.to_string();
            let after = last.get(&key)?.1.clone();
            Some((key, (before, after)))
        })
        .collect()
}

/// What restoring `files` (path, tree before, tree after) would do in the workspace as it
/// is now: the entries to apply, the paths changed since the agent wrote them, and the
/// changes for the preview.
#[allow(clippy::type_complexity)]
fn plan_restore(
    shadow: &Shadow,
    files: &[(String, String, String)],
) -> Result<(Vec<(Entry, Option<Vec<u8>>)>, Vec<String>, Vec<FileChange>), CheckpointError> {
    let now = shadow.snapshot()?;
    let mut conflicts = Vec::new();
    let mut by_after: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut by_before: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (path, before, after) in files {
        by_after.entry(after).or_default().push(path.clone());
        by_before.entry(before).or_default().push(path.clone());
    }
    let mut changed_since = BTreeSet::new();
    for (after, paths) in &by_after {
        for entry in shadow.diff_trees(after, &now.tree, Some(paths))? {
            changed_since.insert(entry.path);
        }
    }
    let mut entries = Vec::new();
    let mut changes = Vec::new();
    for (before, paths) in &by_before {
        for entry in shadow.diff_trees(&now.tree, before, Some(paths))? {
            // Only a file the undo would write can lose the person's edits; one that is
            // already as it was (e.g. a temporary file another call's snapshot caught)
            // is no conflict.
            if changed_since.contains(&entry.path) {
                conflicts.push(entry.path.clone());
            }
            let content = match &entry.to {
                Some((_, oid)) => Some(shadow.blob(oid)?),
                None => None,
            };
            changes.push(FileChange {
                path: entry.path.clone(),
                status: status_name(entry.status).into(),
                diff: shadow.patch(&now.tree, before, &entry.path)?,
            });
            entries.push((entry, content));
        }
    }
    conflicts.sort();
    changes.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((entries, conflicts, changes))
}

fn apply(shadow: &Shadow, entries: &[(Entry, Option<Vec<u8>>)]) -> Result<(), CheckpointError> {
    // Every path first: one whose folder a command turned into a symlink (to the home
    // folder, say) refuses the whole undo before any file changes (security review 2,
    // finding 4). Each write below goes through folder descriptors as well.
    let mut blocked = Vec::new();
    for (entry, _) in entries {
        match git::check_restorable(shadow, &entry.path) {
            Ok(()) => {}
            Err(CheckpointError::Restore(why)) => blocked.push(why),
            Err(err) => blocked.push(err.to_string()),
        }
    }
    if !blocked.is_empty() {
        return Err(CheckpointError::Restore(format!(
            "nothing was restored: {}",
            blocked.join("; ")
        )));
    }
    // An undo killed half-way left its temporary files where it was writing: the same
    // folders this one writes in. They are ours, so they go.
    let mut seen = BTreeSet::new();
    for (entry, _) in entries {
        let folder = Path::new(&entry.path).parent().map(Path::to_path_buf);
        if seen.insert(folder) {
            git::remove_stale_temps(shadow, &entry.path);
        }
    }
    for (entry, content) in entries {
        let mut contents = BTreeMap::new();
        if let (Some((_, oid)), Some(bytes)) = (&entry.to, content) {
            contents.insert(oid.clone(), bytes.clone());
        }
        git::restore_entry(shadow, entry, &contents)?;
    }
    Ok(())
}

fn status_name(status: char) -> &'static str {
    match status {
        'A' => "added",
        'D' => "deleted",
        'T' => "type changed",
        _ => "modified",
    }
}

/// 64-bit FNV-1a: a stable name for a workspace's shadow (std's hasher may change).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf29ce484222325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x100000001b3);
    }
    hash
}

/// What a run gives each of its tool calls: the session and turn to record changes under.
#[derive(Clone)]
pub struct CallHook {
    checkpoints: Arc<Checkpoints>,
    session_id: String,
    turn: usize,
}

/// The state before one call, to compare with after it.
pub struct Before {
    snapshot: git::Snapshot,
    started: u64,
    /// Keeps the store from being pruned until the call's record holds its trees.
    _pin: Arc<()>,
}

impl CallHook {
    /// The hook for a run of `session_id` whose history is `history`: its calls belong to
    /// the turn of the person's last message (reports from sub-agents start no turn).
    pub fn for_run(
        checkpoints: &Arc<Checkpoints>,
        session_id: &str,
        history: &[Message],
    ) -> Option<CallHook> {
        // Known to be off (a changing call found git missing): no hook. Not asked here,
        // since most batches change nothing and a `git --version` would cost each run.
        if checkpoints.off.get().is_some_and(Option::is_some) {
            return None;
        }
        let turn = turn_of(history)?;
        Some(CallHook {
            checkpoints: checkpoints.clone(),
            session_id: session_id.to_string(),
            turn,
        })
    }

    /// Snapshots the workspace before a changing call; `None` (logged) if that failed:
    /// the call still runs, it just cannot be undone.
    pub async fn before(&self, workspace: &Path) -> Option<Before> {
        match self.checkpoints.stamped_snapshot(workspace, true).await {
            Ok((snapshot, started)) => Some(Before {
                snapshot,
                started,
                _pin: self.checkpoints.pin(&self.checkpoints.shadow(workspace)),
            }),
            Err(err) => {
                tracing::warn!(session = %self.session_id, "no checkpoint before a call: {err}");
                None
            }
        }
    }

    /// Snapshots again after the call and records what it changed.
    pub async fn after(
        &self,
        workspace: &Path,
        before: Before,
        tool: &str,
        call_id: &str,
        arguments: &Value,
    ) {
        let recorded = self
            .record(workspace, before, tool, call_id, arguments)
            .await;
        if let Err(err) = recorded {
            tracing::warn!(session = %self.session_id, call = call_id, "cannot record a call's changes: {err}");
        }
    }

    async fn record(
        &self,
        workspace: &Path,
        before: Before,
        tool: &str,
        call_id: &str,
        arguments: &Value,
    ) -> Result<(), CheckpointError> {
        let checkpoints = &self.checkpoints;
        let shadow = checkpoints.shadow(workspace);
        let named = arguments
            .get("path")
            .and_then(Value::as_str)
            .map(str::to_string);
        let guard = checkpoints.lock(&shadow).lock_owned().await;
        let finished = checkpoints.tick();
        let work = shadow.clone();
        let before_tree = before.snapshot.tree.clone();
        let before_skipped = before.snapshot.skipped.clone();
        let keep = ref_names(&self.session_id, finished);
        let tracked = checkpoints.tracked.clone();
        let walks = checkpoints.walks.clone();
        let (after, changed, ignored) = tokio::task::spawn_blocking(move || {
            let _guard = guard;
            let after = tracked_snapshot(&tracked, &walks, &work, false, finished)?;
            let changed: Vec<String> = work
                .diff_trees(&before_tree, &after.tree, None)?
                .into_iter()
                .map(|e| e.path)
                .collect();
            // A file tool on an ignored path changes what no snapshot holds: say so.
            let ignored = named
                .filter(|p| !changed.iter().any(|c| c == p))
                .filter(|p| work.ignored(p));
            let recorded = !changed.is_empty()
                || ignored.is_some()
                || after.skipped.iter().any(|s| !before_skipped.contains(s));
            if recorded {
                // Under the lock, before the record: no prune can drop its trees first.
                let (before_ref, after_ref) = keep;
                work.keep(&[(before_ref, before_tree), (after_ref, after.tree.clone())])?;
            }
            Ok::<_, CheckpointError>((after, changed, ignored))
        })
        .await
        .map_err(|err| CheckpointError::Git(format!("the snapshot failed: {err}")))??;
        let mut skipped: BTreeSet<String> = after
            .skipped
            .iter()
            .filter(|s| !before.snapshot.skipped.contains(s))
            .cloned()
            .collect();
        if let Some(path) = ignored {
            skipped.insert(format!("{path} (ignored by .gitignore)"));
        }
        if changed.is_empty() && skipped.is_empty() {
            return Ok(());
        }
        let record = CallRecord {
            turn: self.turn,
            call_id: call_id.to_string(),
            tool: tool.to_string(),
            workspace: shadow.workspace.display().to_string(),
            before: before.snapshot.tree,
            after: after.tree,
            started: before.started,
            finished,
            changed,
            skipped: skipped.into_iter().collect(),
            pruned: false,
        };
        let pin = before._pin;
        checkpoints.append(&self.session_id, &Line::Call(record))?;
        // The record's refs hold its trees now: the store may be pruned again.
        drop(pin);
        checkpoints.maintain_later(shadow);
        Ok(())
    }
}

/// A ref-safe form of a session id (ids are UUIDs; anything else is replaced).
fn ref_part(session_id: &str) -> String {
    session_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The refs holding a record's before and after trees: `refs/bh/<session>/<stamp>-b|-a`.
fn ref_names(session_id: &str, finished: u64) -> (String, String) {
    let base = format!("refs/bh/{}/{finished:020}", ref_part(session_id));
    (format!("{base}-b"), format!("{base}-a"))
}

/// The session and stamp a record ref names.
fn parse_ref(name: &str) -> Option<(String, u64)> {
    let rest = name.strip_prefix("refs/bh/")?;
    let (session, leaf) = rest.split_once('/')?;
    let stamp = leaf.get(..20)?.parse().ok()?;
    Some((session.to_string(), stamp))
}

/// Bounding the shadow stores (review R8).
impl Checkpoints {
    /// The bound of each workspace's store (`checkpoints.max_store_mb`,
    /// `checkpoints.max_age_days` in the config).
    pub fn set_limits(&self, limits: StoreLimits) {
        *self.limits.lock().unwrap_or_else(|p| p.into_inner()) = limits;
    }

    fn limits(&self) -> StoreLimits {
        *self.limits.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn pin(&self, shadow: &Shadow) -> Arc<()> {
        self.pins
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(shadow.git_dir.clone())
            .or_default()
            .clone()
    }

    fn pinned(&self, shadow: &Shadow) -> bool {
        self.pins
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&shadow.git_dir)
            .is_some_and(|pin| Arc::strong_count(pin) > 1)
    }

    /// Bytes `workspace`'s shadow store takes.
    pub fn store_bytes(&self, workspace: &Path) -> Result<u64, CheckpointError> {
        self.shadow(workspace).store_bytes()
    }

    /// Deletes the refs of a session's records in every store its records name, so that
    /// the next prune can drop what only it held.
    fn drop_session_refs(&self, session_id: &str) {
        let workspaces: BTreeSet<String> = match self.records(session_id) {
            Ok(records) => records.into_iter().map(|(c, _)| c.workspace).collect(),
            Err(_) => return,
        };
        let prefix = format!("refs/bh/{}/", ref_part(session_id));
        for workspace in workspaces {
            let shadow = self.shadow(Path::new(&workspace));
            let dropped = shadow
                .refs(&prefix)
                .and_then(|refs| shadow.drop_refs(&refs));
            if let Err(err) = dropped {
                tracing::warn!(session = session_id, "cannot drop checkpoint refs: {err}");
            }
        }
    }

    /// Runs [`Checkpoints::maintain`] in the background (the call that triggered it does
    /// not wait), unless it runs for that store already.
    fn maintain_later(self: &Arc<Self>, shadow: Shadow) {
        {
            let mut running = self.maintaining.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(again) = running.get_mut(&shadow.git_dir) {
                *again = true;
                return;
            }
            running.insert(shadow.git_dir.clone(), false);
        }
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                if let Err(err) = this.maintain(&shadow.workspace).await {
                    tracing::warn!("checkpoint store maintenance failed: {err}");
                }
                let mut running = this.maintaining.lock().unwrap_or_else(|p| p.into_inner());
                match running.get_mut(&shadow.git_dir) {
                    Some(again) if *again => *again = false,
                    _ => {
                        running.remove(&shadow.git_dir);
                        return;
                    }
                }
            }
        });
    }

    /// Keeps `workspace`'s store within [`StoreLimits`]: records older than the age
    /// bound lose their trees, then the oldest half, and again, while the store is over
    /// its size bound; each affected session's records say so. Returns how many
    /// records lost their trees. Skipped while a call is between its snapshots.
    pub async fn maintain(self: &Arc<Self>, workspace: &Path) -> Result<usize, CheckpointError> {
        self.check_on()?;
        let shadow = self.shadow(workspace);
        let guard = self.lock(&shadow).lock_owned().await;
        if self.pinned(&shadow) {
            return Ok(0);
        }
        let this = self.clone();
        let now = self.tick();
        tokio::task::spawn_blocking(move || {
            let _guard = guard;
            this.maintain_blocking(&shadow, now)
        })
        .await
        .map_err(|err| CheckpointError::Git(format!("maintenance failed: {err}")))?
    }

    fn maintain_blocking(&self, shadow: &Shadow, now: u64) -> Result<usize, CheckpointError> {
        let limits = self.limits();
        let oldest_kept = now.saturating_sub(limits.max_age.as_nanos() as u64);
        let mut refs: Vec<(u64, String, String)> = shadow
            .refs("refs/bh/")?
            .into_iter()
            .filter_map(|name| parse_ref(&name).map(|(session, stamp)| (stamp, session, name)))
            .collect();
        refs.sort();
        let expired = refs.partition_point(|(stamp, _, _)| *stamp < oldest_kept);
        if expired == 0 && shadow.store_bytes()? <= limits.max_bytes {
            return Ok(0);
        }
        // Records written before refs existed hold their trees from nothing: they get
        // refs now, or the first prune would drop every one of them.
        self.adopt(shadow, &mut refs)?;
        let expired = refs.partition_point(|(stamp, _, _)| *stamp < oldest_kept);
        let mut dropped: Vec<(u64, String, String)> =
            refs.drain(..expired.min(refs.len())).collect();
        // The records say so before the trees go: the Changes view, reading them meanwhile
        // without this lock, must never ask git for a tree already pruned.
        self.note_pruned(shadow, &dropped)?;
        shadow.drop_refs(&dropped.iter().map(|r| r.2.clone()).collect::<Vec<_>>())?;
        self.forget_last(shadow);
        shadow.prune()?;
        // Halving, not one by one: each round is a full gc. The newest record is kept
        // whatever it costs: what the workspace holds now (the index) is never pruned,
        // so a workspace bigger than the bound would otherwise lose all its history.
        while shadow.store_bytes()? > limits.max_bytes && refs.len() > 2 {
            let half = (refs.len() / 2).max(1);
            // Both refs of a record go together (they share the stamp).
            let cut = refs[half - 1].0;
            let end = refs.partition_point(|(stamp, _, _)| *stamp <= cut);
            let round: Vec<(u64, String, String)> = refs.drain(..end).collect();
            self.note_pruned(shadow, &round)?;
            shadow.drop_refs(&round.iter().map(|r| r.2.clone()).collect::<Vec<_>>())?;
            shadow.prune()?;
            dropped.extend(round);
        }
        tracing::info!(
            workspace = %shadow.workspace.display(),
            records = dropped.len() / 2,
            "checkpoint store pruned to its bound"
        );
        Ok(dropped.len() / 2)
    }

    /// Each session whose records lost their trees says so in its records, up to the
    /// newest one dropped (its turns then show as cleared and cannot be undone).
    fn note_pruned(
        &self,
        shadow: &Shadow,
        dropped: &[(u64, String, String)],
    ) -> Result<(), CheckpointError> {
        let mut until: BTreeMap<String, u64> = BTreeMap::new();
        for (stamp, session, _) in dropped {
            let entry = until.entry(session.clone()).or_insert(0);
            *entry = (*entry).max(*stamp);
        }
        let workspace = shadow.workspace.display().to_string();
        for (session, pruned_until) in until {
            self.append(
                &session,
                &Line::Pruned {
                    pruned_workspace: workspace.clone(),
                    pruned_until,
                },
            )?;
        }
        Ok(())
    }

    /// Clears `workspace`'s undo history (Settings' "Clear"): every record's trees go and
    /// each session's records say so; what the workspace holds now stays the base of the
    /// next snapshot. `None` while a call is between its snapshots (its record would
    /// lose its "before"): the person tries again a moment later. Returns how many
    /// records lost their trees.
    pub async fn clear(
        self: &Arc<Self>,
        workspace: &Path,
    ) -> Result<Option<usize>, CheckpointError> {
        self.check_on()?;
        let shadow = self.shadow(workspace);
        let guard = self.lock(&shadow).lock_owned().await;
        if self.pinned(&shadow) {
            return Ok(None);
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let _guard = guard;
            let mut refs: Vec<(u64, String, String)> = shadow
                .refs("refs/bh/")?
                .into_iter()
                .filter_map(|name| {
                    parse_ref(&name).map(|(session, stamp)| (stamp, session, name))
                })
                .collect();
            this.adopt(&shadow, &mut refs)?;
            // Said first, as in `maintain_blocking`.
            this.note_pruned(&shadow, &refs)?;
            shadow.drop_refs(&refs.iter().map(|r| r.2.clone()).collect::<Vec<_>>())?;
            if shadow.git_dir.join("HEAD").exists() {
                this.forget_last(&shadow);
                shadow.prune()?;
            }
            tracing::info!(workspace = %shadow.workspace.display(), records = refs.len() / 2, "undo history cleared");
            Ok(Some(refs.len() / 2))
        })
        .await
        .map_err(|err| CheckpointError::Git(format!("clearing failed: {err}")))?
    }

    /// The store's bound, as the config sets it (Settings shows it beside the size).
    pub fn store_limits(&self) -> StoreLimits {
        self.limits()
    }

    /// Gives refs to this store's records that have none (see `maintain_blocking`);
    /// `refs` gains them, in order.
    fn adopt(
        &self,
        shadow: &Shadow,
        refs: &mut Vec<(u64, String, String)>,
    ) -> Result<(), CheckpointError> {
        let known: BTreeSet<String> = refs.iter().map(|r| r.2.clone()).collect();
        let workspace = shadow.workspace.display().to_string();
        let Ok(dir) = std::fs::read_dir(self.root.join("sessions")) else {
            return Ok(());
        };
        let mut wanted: Vec<(u64, String, String, String)> = Vec::new();
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let Some(session) = name.strip_suffix(".jsonl") else {
                continue;
            };
            for (call, _) in self.records(session)? {
                if call.workspace != workspace || call.pruned {
                    continue;
                }
                let (before, after) = ref_names(session, call.finished);
                if known.contains(&before) {
                    continue;
                }
                let part = ref_part(session);
                wanted.push((call.finished, part.clone(), before, call.before.clone()));
                wanted.push((call.finished, part, after, call.after.clone()));
            }
        }
        let present = shadow.present(&wanted.iter().map(|w| w.3.clone()).collect::<Vec<_>>())?;
        // A tree already gone cannot be kept (nothing was pruned before refs existed,
        // but a store copied from elsewhere may lack some).
        let wanted: Vec<(u64, String, String, String)> = wanted
            .into_iter()
            .filter(|w| present.get(&w.3).copied().unwrap_or(false))
            .collect();
        if !wanted.is_empty() {
            let keep: Vec<(String, String)> =
                wanted.iter().map(|w| (w.2.clone(), w.3.clone())).collect();
            shadow.keep(&keep)?;
        }
        refs.extend(
            wanted
                .into_iter()
                .map(|(stamp, session, name, _)| (stamp, session, name)),
        );
        refs.sort();
        Ok(())
    }
}

/// A snapshot of `shadow`'s workspace under its lock (the caller holds it): the last one
/// if `reuse` and its watch saw nothing since, else a walk. Either way the watch's queue
/// is read empty first, so that what it sees next happened after this snapshot.
fn tracked_snapshot(
    tracked: &Mutex<HashMap<PathBuf, Tracked>>,
    walks: &AtomicU64,
    shadow: &Shadow,
    reuse: bool,
    used: u64,
) -> Result<git::Snapshot, CheckpointError> {
    // Taken out while git runs, so the map's lock is never held across a walk (other
    // workspaces' snapshots go on); this shadow's own lock keeps it to one user.
    let mut entry = tracked
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&shadow.git_dir)
        .unwrap_or(Tracked {
            watch: None,
            no_watch: None,
            last: None,
            used,
            rebuilds: 0,
        });
    entry.used = used;
    let quiet = entry.watch.as_mut().is_some_and(watch::Watch::quiet);
    let result = match &entry.last {
        Some(last) if reuse && quiet => Ok(last.clone()),
        _ => {
            if entry.watch.as_ref().is_some_and(watch::Watch::broken) {
                entry.watch = None;
                entry.rebuilds += 1;
                if entry.rebuilds > MAX_REBUILDS {
                    entry.no_watch = Some(watch::NoWatch::TooBig);
                }
            }
            let retry = matches!(entry.no_watch, None | Some(watch::NoWatch::Failed(_)));
            if entry.watch.is_none() && retry {
                // Before the walk: a change in a folder not watched yet is in it.
                let data_dir = shadow.git_dir.parent().and_then(Path::parent);
                match watch::Watch::new(&shadow.workspace, data_dir) {
                    Ok(watch) => {
                        entry.watch = Some(watch);
                        entry.no_watch = None;
                    }
                    Err(why) => {
                        tracing::debug!(workspace = %shadow.workspace.display(), "no watch on the workspace: {why:?}");
                        entry.no_watch = Some(why);
                    }
                }
            }
            walks.fetch_add(1, Ordering::SeqCst);
            let taken = shadow.snapshot();
            entry.last = taken
                .as_ref()
                .ok()
                .filter(|_| entry.watch.is_some())
                .cloned();
            taken
        }
    };
    let mut map = tracked.lock().unwrap_or_else(|p| p.into_inner());
    map.insert(shadow.git_dir.clone(), entry);
    if map.len() > TRACKED {
        if let Some(oldest) = map
            .iter()
            .min_by_key(|(_, t)| t.used)
            .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
    }
    result
}

/// The index of the person's last message: reports and notes are not turns.
pub fn turn_of(history: &[Message]) -> Option<usize> {
    history.iter().rposition(Message::is_from_person)
}

impl From<CheckpointError> for crate::error::RuntimeError {
    fn from(err: CheckpointError) -> Self {
        match err {
            CheckpointError::Conflict(_) => crate::error::RuntimeError::Conflict(err.to_string()),
            other => crate::error::RuntimeError::Unavailable(other.to_string()),
        }
    }
}
