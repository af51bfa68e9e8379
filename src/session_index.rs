//! The session list's index: every session's `meta.json` mirrored as lines of one
//! append-only file (`sessions.index.jsonl` beside the session folders), so that listing
//! 10,000 sessions reads one file once per process and then only what was appended,
//! instead of 10,000 files at every call.
//!
//! Why it can be trusted, and when it is not:
//! - A change is appended to the index *before* `meta.json` is replaced, each line
//!   tagged with its writer's token (one per store, i.e. per process). A crash between
//!   the two leaves the index ahead of the meta, never silently behind it.
//! - A store that ends cleanly appends `{"clean": token}`. On loading, a writer with
//!   lines after the last scan and no `clean` after them may have crashed (or is still
//!   running in another process): the loader then reads every `meta.json` (a scan),
//!   appends what differs and a `{"scan": …}` line that settles those writers. A missing
//!   or unreadable index is a scan too.
//! - Other processes (the desktop and `bumblehive run` on one data folder) see each
//!   other's changes: each list reads whatever was appended since the last one.
//! - Unparseable lines (a torn append) are skipped; every append starts on a new line.
//! - Even a trusted index meets the folders once per load (a directory listing, no
//!   file read): a session folder copied in or removed by hand is picked up.
//! - The file is rewritten whole (temp + rename) only at a trusted load, when it has
//!   grown past twice its live lines: then no other writer was active. One that starts
//!   during the rewrite's milliseconds may lose a line to the old file; its `meta.json`
//!   is still right, and its later lines make the next load scan.

use std::collections::{BTreeMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::store::SessionMeta;

/// The index file's name, in the data folder (beside `sessions/`, so it is never taken
/// for a session).
pub const INDEX: &str = "sessions.index.jsonl";

/// One line. Optional fields rather than an untagged enum: serde then reads a line in
/// one pass, which is what keeps a cold load of 10,000 lines fast.
#[derive(Default, Serialize, Deserialize)]
struct Line {
    /// The writer's token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    t: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    meta: Option<SessionMeta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    removed: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    clean: Option<String>,
    /// A scan read every meta: every writer before this line is settled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scan: Option<String>,
}

/// What this process knows of the file.
#[derive(Default)]
struct State {
    loaded: bool,
    metas: BTreeMap<String, SessionMeta>,
    /// Bytes of the file applied so far, and its inode (a rewrite by another process
    /// changes it: reload).
    offset: u64,
    ino: u64,
    /// Lines read in all (for the rewrite decision).
    lines: usize,
}

pub struct SessionIndex {
    path: PathBuf,
    sessions: PathBuf,
    token: String,
    state: Mutex<State>,
    /// The file kept open for appends (`append_bytes`).
    appender: Mutex<Option<Appender>>,
    /// The store's simulated kill (tests): the index is written in the same data folder.
    gate: std::sync::Arc<crate::fsutil::WriteGate>,
}

/// The index file as this process last appended to it: its inode, and its length right
/// after our last line. Kept open: a fan-out writes a few metas per child, and opening
/// the file for each line was an open, a seek, a read and a close more per meta
/// (issue 31).
struct Appender {
    file: File,
    ino: u64,
    end: u64,
}

/// Loading reads metas through the store (one reader of `meta.json`).
pub type ReadMeta<'a> = &'a dyn Fn(&Path, &str) -> Option<SessionMeta>;

impl SessionIndex {
    pub fn new(
        data_dir: &Path,
        sessions: &Path,
        gate: std::sync::Arc<crate::fsutil::WriteGate>,
    ) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        SessionIndex {
            path: data_dir.join(INDEX),
            sessions: sessions.to_path_buf(),
            token: format!("{}-{nanos:x}", std::process::id()),
            state: Mutex::new(State::default()),
            appender: Mutex::new(None),
            gate,
        }
    }

    /// Notes a session's new meta (call before replacing `meta.json`).
    pub fn record(&self, meta: &SessionMeta) {
        self.append(&[self.meta_line(meta.clone())]);
    }

    /// Notes that a session is gone.
    pub fn remove(&self, id: &str) {
        self.append(&[self.removed_line(id.to_string())]);
    }

    /// Notes that this store ends with every change in the index (shutdown).
    pub fn close(&self) {
        self.append(&[Line {
            clean: Some(self.token.clone()),
            ..Line::default()
        }]);
    }

    /// This writer's line for a session's meta.
    fn meta_line(&self, meta: SessionMeta) -> Line {
        Line {
            t: Some(self.token.clone()),
            meta: Some(meta),
            ..Line::default()
        }
    }

    /// This writer's line for a session that is gone.
    fn removed_line(&self, id: String) -> Line {
        Line {
            t: Some(self.token.clone()),
            removed: Some(id),
            ..Line::default()
        }
    }

    /// The line that settles every writer before it (a scan or a rewrite read them all).
    fn scan_line(&self) -> Line {
        Line {
            scan: Some(self.token.clone()),
            ..Line::default()
        }
    }

    /// Every session's meta, by id (creation order: ids are UUIDv7). `read` reads one
    /// `meta.json` (used by a scan).
    /// Only those `keep` accepts are copied out; it is given each session and its
    /// top-level ancestor (the session itself when it has none).
    pub fn list(
        &self,
        read: ReadMeta<'_>,
        keep: impl Fn(&SessionMeta, &SessionMeta) -> bool,
    ) -> Vec<SessionMeta> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.refresh(&mut state, read);
        state
            .metas
            .values()
            .filter(|m| keep(m, top_of(&state.metas, m)))
            .cloned()
            .collect()
    }

    /// The workspace of `meta`'s top-level ancestor (its own when it has none, or when
    /// its parent is gone).
    pub fn top_workspace(&self, read: ReadMeta<'_>, meta: &SessionMeta) -> String {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.refresh(&mut state, read);
        top_of(&state.metas, meta).workspace.clone()
    }

    /// Brings `state` up to the file: a first load, a reload after a rewrite, or the
    /// lines appended since the last call.
    fn refresh(&self, state: &mut State, read: ReadMeta<'_>) {
        let stat = fs::metadata(&self.path).ok();
        let ino = stat.as_ref().map(ino_of).unwrap_or(0);
        let len = stat.as_ref().map(|s| s.len()).unwrap_or(0);
        if state.loaded && ino == state.ino && len == state.offset {
            return;
        }
        if state.loaded && ino == state.ino && len > state.offset {
            let mut tail = Vec::new();
            let read_tail = File::open(&self.path).and_then(|mut file| {
                file.seek(SeekFrom::Start(state.offset))?;
                file.read_to_end(&mut tail)
            });
            if read_tail.is_ok() {
                // Only whole lines: a line being appended right now is read next time.
                let whole = tail.iter().rposition(|b| *b == b'\n').map_or(0, |p| p + 1);
                for line in tail[..whole].split(|b| *b == b'\n') {
                    if let Ok(line) = serde_json::from_slice::<Line>(line) {
                        apply(&mut state.metas, line);
                        state.lines += 1;
                    }
                }
                state.offset += whole as u64;
                return;
            }
        }
        self.load(state, read);
    }

    /// A whole load: the file, then a scan if it cannot be trusted.
    fn load(&self, state: &mut State, read: ReadMeta<'_>) {
        *state = State::default();
        let bytes = fs::read(&self.path).ok();
        let mut unsettled: HashSet<String> = HashSet::new();
        let mut whole = 0;
        if let Some(bytes) = &bytes {
            whole = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |p| p + 1);
            for line in bytes[..whole].split(|b| *b == b'\n') {
                let Ok(line) = serde_json::from_slice::<Line>(line) else {
                    continue;
                };
                state.lines += 1;
                if line.scan.is_some() {
                    unsettled.clear();
                } else if let Some(token) = &line.clean {
                    unsettled.remove(token);
                } else if let Some(token) = &line.t {
                    unsettled.insert(token.clone());
                }
                apply(&mut state.metas, line);
            }
        }
        state.offset = whole as u64;
        state.ino = fs::metadata(&self.path).map(|s| ino_of(&s)).unwrap_or(0);
        state.loaded = true;
        // Our own token cannot be unsettled by a crash: we are running.
        unsettled.remove(&self.token);
        if bytes.is_none() || !unsettled.is_empty() {
            if !unsettled.is_empty() {
                tracing::info!(
                    "the session index has {} writer(s) that did not end cleanly: reading every session's meta",
                    unsettled.len()
                );
            }
            self.scan(state, read, bytes.is_none());
            return;
        }
        self.reconcile_folders(state, read);
        if state.lines > 2 * state.metas.len() + 1000 {
            self.rewrite(state);
        }
    }

    /// A trusted index still meets the folders once per load (names only, no file is
    /// read): a session folder copied in by hand or restored from a backup is read and
    /// added, one removed by hand is dropped.
    fn reconcile_folders(&self, state: &mut State, read: ReadMeta<'_>) {
        let Ok(entries) = fs::read_dir(&self.sessions) else {
            return;
        };
        let mut seen = HashSet::with_capacity(state.metas.len());
        let mut lines = Vec::new();
        for entry in entries.flatten() {
            let id = entry.file_name().to_string_lossy().into_owned();
            if !state.metas.contains_key(&id) {
                if let Some(meta) = read(&entry.path(), &id) {
                    lines.push(self.meta_line(meta.clone()));
                    state.metas.insert(id.clone(), meta);
                }
            }
            seen.insert(id);
        }
        let gone: Vec<String> = state
            .metas
            .keys()
            .filter(|id| !seen.contains(*id))
            .cloned()
            .collect();
        for id in gone {
            state.metas.remove(&id);
            lines.push(self.removed_line(id));
        }
        if !lines.is_empty() {
            self.append(&lines);
        }
    }

    /// Reads every `meta.json`; what differs from the index is appended (or, with no
    /// usable index file, the file is written whole), then a scan line.
    fn scan(&self, state: &mut State, read: ReadMeta<'_>, fresh: bool) {
        let mut found = BTreeMap::new();
        if let Ok(entries) = fs::read_dir(&self.sessions) {
            for entry in entries.flatten() {
                let id = entry.file_name().to_string_lossy().into_owned();
                if let Some(meta) = read(&entry.path(), &id) {
                    found.insert(id, meta);
                }
            }
        }
        if fresh {
            state.metas = found;
            self.rewrite(state);
            return;
        }
        let mut lines = Vec::new();
        for (id, meta) in &found {
            if state.metas.get(id) != Some(meta) {
                lines.push(self.meta_line(meta.clone()));
            }
        }
        for id in state.metas.keys() {
            if !found.contains_key(id) {
                lines.push(self.removed_line(id.clone()));
            }
        }
        lines.push(self.scan_line());
        state.metas = found;
        // Appended lines are read back by the next refresh and change nothing then.
        self.append(&lines);
    }

    /// Writes the file whole from `state` (temp + rename), ending with a scan line.
    fn rewrite(&self, state: &mut State) {
        let mut bytes = Vec::with_capacity(state.metas.len() * 600);
        for meta in state.metas.values() {
            push_line(&mut bytes, &self.meta_line(meta.clone()));
        }
        push_line(&mut bytes, &self.scan_line());
        let written = self.gate.pass();
        match written.and_then(|()| crate::fsutil::write_atomic(&self.path, &bytes, false)) {
            Ok(()) => {
                state.offset = bytes.len() as u64;
                state.ino = fs::metadata(&self.path).map(|s| ino_of(&s)).unwrap_or(0);
                state.lines = state.metas.len() + 1;
            }
            Err(err) => {
                tracing::warn!(
                    "cannot write the session index {}: {err}",
                    self.path.display()
                )
            }
        }
    }

    /// Appends lines in one write.
    fn append(&self, lines: &[Line]) {
        let mut bytes = Vec::with_capacity(640 * lines.len());
        for line in lines {
            push_line(&mut bytes, line);
        }
        self.append_bytes(&bytes);
    }

    /// One write through the open file. The path is looked at first (one `stat`): a
    /// rewrite by another process (a new inode) or a removed file is followed by opening
    /// it again. A file whose last line is torn (a writer killed mid-append) gets a
    /// newline first; it is looked for only when the file is not as we left it.
    fn append_bytes(&self, bytes: &[u8]) {
        let mut appender = self.appender.lock().unwrap_or_else(|p| p.into_inner());
        let written = (|| -> std::io::Result<()> {
            self.gate.pass()?;
            let stat = match fs::metadata(&self.path) {
                Ok(stat) => Some(stat),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
                Err(err) => return Err(err),
            };
            let (current, len) = match (&mut *appender, &stat) {
                (Some(open), Some(stat)) if open.ino == ino_of(stat) => (open, stat.len()),
                _ => {
                    let mut options = OpenOptions::new();
                    options.read(true).append(true).create(true);
                    #[cfg(unix)]
                    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
                    let file = options.open(&self.path)?;
                    let stat = file.metadata()?;
                    let open = appender.insert(Appender {
                        ino: ino_of(&stat),
                        // Unknown: the torn check below reads the last byte.
                        end: u64::MAX,
                        file,
                    });
                    (open, stat.len())
                }
            };
            let torn = len > 0 && len != current.end && {
                let mut last = [0u8; 1];
                read_at(&current.file, &mut last, len - 1)?;
                last[0] != b'\n'
            };
            let result = if torn {
                let mut fixed = Vec::with_capacity(bytes.len() + 1);
                fixed.push(b'\n');
                fixed.extend_from_slice(bytes);
                current.file.write_all(&fixed).map(|()| fixed.len())
            } else {
                current.file.write_all(bytes).map(|()| bytes.len())
            };
            match result {
                // Another process may have appended in between: then the next append
                // finds the length changed and looks at the last byte.
                Ok(n) => current.end = len + n as u64,
                Err(err) => {
                    // A failed write may leave a torn line: the next append opens the
                    // file again and looks.
                    *appender = None;
                    return Err(err);
                }
            }
            // Without inodes a rewrite by another process cannot be told apart, and an
            // open handle would stand in the way of its rename: opened for each append.
            #[cfg(not(unix))]
            {
                *appender = None;
            }
            Ok(())
        })();
        if let Err(err) = written {
            // The list is then behind until the next scan; nothing else is lost, since
            // `meta.json` is what loads a session.
            tracing::warn!(
                "cannot append to the session index {}: {err}",
                self.path.display()
            );
        }
    }
}

#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(not(unix))]
fn read_at(mut file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    file.seek(SeekFrom::Start(offset))?;
    file.read_exact(buf)
}

fn push_line(bytes: &mut Vec<u8>, line: &Line) {
    // Serialising our own types cannot fail.
    if serde_json::to_writer(&mut *bytes, line).is_ok() {
        bytes.push(b'\n');
    }
}

fn apply(metas: &mut BTreeMap<String, SessionMeta>, line: Line) {
    if let Some(meta) = line.meta {
        metas.insert(meta.session_id.clone(), meta);
    } else if let Some(id) = line.removed {
        metas.remove(&id);
    }
}

/// The top-level ancestor of `meta` among `metas`: parents are followed while they are
/// known (a bounded walk, so a hand-edited cycle cannot hang the list).
fn top_of<'a>(metas: &'a BTreeMap<String, SessionMeta>, meta: &'a SessionMeta) -> &'a SessionMeta {
    let mut at = meta;
    for _ in 0..64 {
        match at.parent_session_id.as_ref().and_then(|p| metas.get(p)) {
            Some(parent) => at = parent,
            None => break,
        }
    }
    at
}

fn ino_of(meta: &fs::Metadata) -> u64 {
    #[cfg(unix)]
    {
        std::os::unix::fs::MetadataExt::ino(meta)
    }
    #[cfg(not(unix))]
    {
        // No inode: a rewrite shows as a shorter file, which also reloads.
        let _ = meta;
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{NewSession, SessionStore};

    fn new(workspace: &str, title: &str) -> NewSession {
        NewSession {
            workspace: workspace.into(),
            title: Some(title.into()),
            ..NewSession::default()
        }
    }

    fn titles(store: &SessionStore) -> Vec<String> {
        store
            .list(None)
            .unwrap()
            .into_iter()
            .map(|m| m.title)
            .collect()
    }

    fn index_lines(dir: &Path) -> usize {
        fs::read_to_string(dir.join(INDEX)).unwrap().lines().count()
    }

    #[test]
    fn index_follows_creates_renames_and_deletes_in_creation_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path()).unwrap();
        let a = store.create(new("/w", "a")).unwrap();
        let b = store.create(new("/x", "b")).unwrap();
        assert_eq!(titles(&store), ["a", "b"]);
        let mut renamed = b.clone();
        renamed.title = "b2".into();
        store.write_meta(&renamed).unwrap();
        store.create(new("/w", "c")).unwrap();
        assert_eq!(titles(&store), ["a", "b2", "c"]);
        store.delete(&a.session_id).unwrap();
        assert_eq!(titles(&store), ["b2", "c"]);
        assert_eq!(store.list(Some("/x")).unwrap()[0].title, "b2");
    }

    #[test]
    fn index_another_store_on_the_same_folder_sees_the_changes_after_its_load() {
        // Two processes (the desktop and `bumblehive run`) on one data folder.
        let dir = tempfile::tempdir().unwrap();
        let one = SessionStore::new(dir.path()).unwrap();
        let two = SessionStore::new(dir.path()).unwrap();
        one.create(new("/w", "a")).unwrap();
        assert_eq!(titles(&two), ["a"]);
        let b = one.create(new("/w", "b")).unwrap();
        one.delete(&b.session_id).unwrap();
        two.create(new("/w", "c")).unwrap();
        assert_eq!(titles(&two), ["a", "c"]);
        assert_eq!(titles(&one), ["a", "c"]);
    }

    #[test]
    fn index_a_writer_that_did_not_end_cleanly_makes_the_next_load_read_every_meta() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path()).unwrap();
        let a = store.create(new("/w", "a")).unwrap();
        // The meta replaced without its index line: what a crash between the index
        // append and the meta's rename leaves, seen from the other side.
        let path = dir
            .path()
            .join("sessions")
            .join(&a.session_id)
            .join("meta.json");
        let mut edited = a.clone();
        edited.title = "only in meta.json".into();
        fs::write(&path, serde_json::to_vec(&edited).unwrap()).unwrap();
        drop(store); // no close: a crash
        let next = SessionStore::new(dir.path()).unwrap();
        assert_eq!(titles(&next), ["only in meta.json"]);
        next.close();
        // The scan settled it: a third load trusts the index and finds the same.
        let third = SessionStore::new(dir.path()).unwrap();
        assert_eq!(titles(&third), ["only in meta.json"]);
    }

    #[test]
    fn index_after_a_clean_end_is_trusted_and_still_meets_folders_added_or_removed_by_hand() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path()).unwrap();
        let a = store.create(new("/w", "a")).unwrap();
        let b = store.create(new("/w", "b")).unwrap();
        store.close();
        let sessions = dir.path().join("sessions");
        // A trusted index is what the list shows, even where meta.json was edited by hand…
        let mut edited = a.clone();
        edited.title = "edited by hand".into();
        fs::write(
            sessions.join(&a.session_id).join("meta.json"),
            serde_json::to_vec(&edited).unwrap(),
        )
        .unwrap();
        // …but a folder restored from a backup and one removed by hand are seen.
        let copy = sessions.join("0190aaaa-0000-7000-8000-000000000001");
        fs::create_dir(&copy).unwrap();
        let mut restored = b.clone();
        restored.session_id = "0190aaaa-0000-7000-8000-000000000001".into();
        restored.title = "restored".into();
        fs::write(
            copy.join("meta.json"),
            serde_json::to_vec(&restored).unwrap(),
        )
        .unwrap();
        fs::remove_dir_all(sessions.join(&b.session_id)).unwrap();
        let next = SessionStore::new(dir.path()).unwrap();
        assert_eq!(titles(&next), ["restored", "a"]);
    }

    #[test]
    fn index_a_torn_line_or_a_missing_file_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path()).unwrap();
        store.create(new("/w", "a")).unwrap();
        store.close();
        // A torn append (a crash mid-write) and a line of garbage.
        let mut file = OpenOptions::new()
            .append(true)
            .open(dir.path().join(INDEX))
            .unwrap();
        file.write_all(br#"{"t":"9-9","meta":{"session_id":"#)
            .unwrap();
        let store = SessionStore::new(dir.path()).unwrap();
        store.create(new("/w", "b")).unwrap();
        assert_eq!(titles(&store), ["a", "b"]);
        store.close();
        assert_eq!(titles(&SessionStore::new(dir.path()).unwrap()), ["a", "b"]);
        fs::remove_file(dir.path().join(INDEX)).unwrap();
        let rebuilt = SessionStore::new(dir.path()).unwrap();
        assert_eq!(titles(&rebuilt), ["a", "b"]);
        assert!(
            dir.path().join(INDEX).exists(),
            "the index is written again"
        );
    }

    /// Issue 31: appends go through one open file. Another writer's torn line between two
    /// of ours is still followed by a newline, and a file removed or replaced meanwhile is
    /// opened again (the lines do not go to the old inode).
    #[test]
    fn index_appends_through_one_open_file_follow_other_writers() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path()).unwrap();
        store.create(new("/w", "a")).unwrap();
        let mut file = OpenOptions::new()
            .append(true)
            .open(dir.path().join(INDEX))
            .unwrap();
        file.write_all(br#"{"t":"9-9","meta":{"session_id":"#)
            .unwrap();
        store.create(new("/w", "b")).unwrap();
        let text = fs::read_to_string(dir.path().join(INDEX)).unwrap();
        assert!(
            text.lines()
                .any(|l| l.starts_with('{') && l.contains("\"title\":\"b\"")),
            "{text}"
        );
        assert_eq!(titles(&store), ["a", "b"]);
        fs::remove_file(dir.path().join(INDEX)).unwrap();
        store.create(new("/w", "c")).unwrap();
        let text = fs::read_to_string(dir.path().join(INDEX)).unwrap();
        assert!(text.contains("\"title\":\"c\""), "{text}");
        store.close();
        assert_eq!(
            titles(&SessionStore::new(dir.path()).unwrap()),
            ["a", "b", "c"]
        );
    }

    #[test]
    fn index_is_rewritten_when_it_has_grown_past_twice_its_sessions() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path()).unwrap();
        let mut meta = store.create(new("/w", "a")).unwrap();
        for n in 0..1_200 {
            meta.title = format!("a{n}");
            store.write_meta(&meta).unwrap();
        }
        store.close();
        assert!(index_lines(dir.path()) > 1_200);
        let next = SessionStore::new(dir.path()).unwrap();
        assert_eq!(titles(&next), ["a1199"]);
        // One meta line and the scan line.
        assert_eq!(index_lines(dir.path()), 2);
        next.create(new("/w", "b")).unwrap();
        assert_eq!(titles(&next), ["a1199", "b"]);
    }
}
