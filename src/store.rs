//! The on-disk session store: one folder per session with `meta.json` (rewritten in place), `messages.jsonl` (append-only, one message per line, plus `{"compaction": …}` marker lines), and `pending.json` only while the queue holds something.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::flush::{FlushStats, FlushTicket, Flusher};
use crate::protocol::{
    Compaction, Message, ModelUsage, SessionId, SessionInfo, SessionState, Usage,
};
use crate::session_index::SessionIndex;
use crate::spares::Spares;

const META: &str = "meta.json";
const MESSAGES: &str = "messages.jsonl";
/// The pending queue of SPEC §4 (rewritten in place on every change; none while empty).
const PENDING: &str = "pending.json";
/// Longest session id taken from a caller (ours are 36-character UUIDs).
const MAX_ID: usize = 128;
/// The report ledger: each finished child's report, recorded before delivery.
const REPORTS: &str = "reports.jsonl";

/// What `meta.json` holds. Live state (running) is the controller's; the stored
/// `state` only says whether the session was left paused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionMeta {
    pub session_id: SessionId,
    pub workspace: String,
    pub title: String,
    #[serde(default)]
    pub parent_session_id: Option<SessionId>,
    #[serde(default)]
    pub task_id: Option<String>,
    pub created_at: String,
    #[serde(default)]
    pub updated_at: String,
    #[serde(default)]
    pub state: SessionState,
    #[serde(default)]
    pub usage: Usage,
    /// A child whose work was cut off by a crash; the person resumes or cancels it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
    /// Paused because its last run failed, not because the person stopped it: a parent's
    /// follow-up (`message_subagent`) may start it again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub failed: bool,
    /// A child's first message, kept so an interrupted child can start again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_content: Option<String>,
    /// A child whose report is in its parent's ledger: nothing left to recover. A
    /// follow-up run clears it again until its own report is recorded.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reported: bool,
    /// How many reports the child has sent (its next one is number `reports + 1`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reports: u32,
    /// The message that begins the run a child owes a report for (none for a resume):
    /// recovery counts a final answer as that run's only if the history has this message,
    /// so a crash before the run began never re-sends an older answer (review R1b).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_message: Option<String>,
    /// Hidden from the usual list by the person.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub archived: bool,
    /// The profile a child runs with (SPEC §11).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The provider and model the person chose for this session's next turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Tokens per provider and model (see [`SessionInfo::models`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<ModelUsage>,
    /// A fork's original session and the message index it was cut before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<SessionId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_at: Option<usize>,
    /// An isolated child's git worktree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<crate::protocol::WorktreeInfo>,
    /// A `kind: acp` child's session id in its external agent: a new process of the
    /// agent continues it with `session/load` where the agent offers that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acp_session: Option<String>,
}

/// One line of a parent's report ledger: a recorded report, or the note that it reached
/// the history (the history line itself is the proof; the note saves reading it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LedgerLine {
    Record(ReportRecord),
    Delivered {
        delivered: String,
    },
    /// The person discarded the report from the pending queue: it is never requeued.
    Discarded {
        discarded: String,
        /// How long the history was when the person discarded it: where the chat shows
        /// the mark. None for reports dropped with their deleted child (no mark).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at: Option<u32>,
    },
}

/// A parent's ledger: the reports recorded, and the task ids noted as delivered or
/// discarded (either way settled).
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    pub records: Vec<ReportRecord>,
    pub delivered: std::collections::HashSet<String>,
    pub discarded: std::collections::HashSet<String>,
    /// The person's discards, in order: (the report's key, the history length then).
    pub discards: Vec<(String, u32)>,
}

impl Ledger {
    /// Reports recorded but neither in the history nor discarded.
    pub fn undelivered(&self) -> impl Iterator<Item = &ReportRecord> {
        self.records.iter().filter(|r| {
            let key = r.key();
            !self.delivered.contains(key) && !self.discarded.contains(key)
        })
    }
}

impl ReportRecord {
    /// What the ledger's delivered and discarded notes name: the message id without its
    /// `subagent:` prefix (the task id for a first report, `<task>:<n>` for a follow-up).
    pub fn key(&self) -> &str {
        self.message_id
            .strip_prefix("subagent:")
            .unwrap_or(&self.task_id)
    }
}

/// One recorded report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReportRecord {
    pub task_id: String,
    pub child_session_id: SessionId,
    pub message_id: String,
    pub content: String,
    #[serde(default)]
    pub config: crate::protocol::RunConfig,
}

impl SessionMeta {
    pub fn info(&self, state: SessionState) -> SessionInfo {
        SessionInfo {
            session_id: self.session_id.clone(),
            workspace: self.workspace.clone(),
            title: self.title.clone(),
            parent_session_id: self.parent_session_id.clone(),
            task_id: self.task_id.clone(),
            created_at: self.created_at.clone(),
            updated_at: self.updated_at.clone(),
            state,
            usage: self.usage,
            interrupted: self.interrupted,
            failed: self.failed && state == SessionState::Paused,
            archived: self.archived,
            agent: self.agent.clone(),
            provider: self.provider.clone(),
            model: self.model.clone(),
            models: self.models.clone(),
            forked_from: self.forked_from.clone(),
            forked_at: self.forked_at,
            worktree: self.worktree.clone(),
        }
    }
}

/// A session read from disk. `notice` says what was repaired or skipped.
#[derive(Debug, Clone)]
pub struct LoadedSession {
    pub meta: SessionMeta,
    pub messages: Vec<Message>,
    /// The compaction markers among the lines, oldest first; the last one decides what the
    /// next request sends (`context::compaction::build_messages`).
    pub compactions: Vec<Compaction>,
    pub notice: Option<String>,
    /// Lines other than a torn last one were unreadable: the session must not be written.
    pub damaged: bool,
}

/// What a new session starts with.
#[derive(Debug, Clone, Default)]
pub struct NewSession {
    pub workspace: String,
    pub title: Option<String>,
    pub parent_session_id: Option<SessionId>,
    pub task_id: Option<String>,
    pub task_content: Option<String>,
    pub state: SessionState,
    pub agent: Option<String>,
    /// The provider and model it runs on (a child: its parent's, unless its profile
    /// names its own); unset: the defaults.
    pub provider: Option<String>,
    pub model: Option<String>,
}

/// How many history files stay open at once. A run's file stays open while it runs
/// (an append costs one write) and is closed when it ends; past this many running
/// sessions the least recently opened is closed and reopened on its next append.
const MAX_OPEN_WRITERS: usize = 256;

/// Sessions on disk. Appenders stay open per running session so an append costs one write.
pub struct SessionStore {
    root: PathBuf,
    /// Where a deleted session's folder goes before it is removed (`delete`).
    trash: PathBuf,
    writers: Mutex<Writers>,
    /// Group commit of every flush (`flush`).
    flusher: Flusher,
    /// The list's index (`list`).
    index: SessionIndex,
    /// Ids of sessions whose list entry changed (`changes`).
    changed: tokio::sync::broadcast::Sender<SessionId>,
    /// Writers of one session's small files (meta, pending) one at a time: an in-place
    /// write pads to the length it read first (`write_in_place`). Striped by session id.
    small_writes: [Mutex<()>; 16],
    /// For tests: a simulated kill between two writes (`WriteGate`); every write of the
    /// data folder asks it first, the session index's too.
    gate: Arc<WriteGate>,
    /// Folders made ahead for new sessions (`create`), once a long-lived process asks.
    spares: Spares,
}

/// The open history files, with the order they were opened in (for the cap).
#[derive(Default)]
struct Writers {
    open: HashMap<SessionId, (u64, Arc<Mutex<File>>)>,
    next: u64,
}

pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

// In the leaf `fsutil` (config, the session index and MCP trust use them without
// depending on the store); named here as before.
use crate::fsutil::{WriteGate, private_file};
pub use crate::fsutil::{private_dir, write_atomic, write_in_place};

impl SessionStore {
    pub fn new(data_dir: &Path) -> Result<Self, StoreError> {
        let root = data_dir.join("sessions");
        private_dir(data_dir).map_err(|err| StoreError::io(data_dir, err))?;
        private_dir(&root).map_err(|err| StoreError::io(&root, err))?;
        let trash = data_dir.join(TRASH);
        private_dir(&trash).map_err(|err| StoreError::io(&trash, err))?;
        empty_trash(&trash);
        let gate = Arc::new(WriteGate::default());
        Ok(SessionStore {
            trash,
            flusher: Flusher::new(&root),
            index: SessionIndex::new(data_dir, &root, gate.clone()),
            spares: Spares::new(data_dir, gate.clone()),
            gate,
            // Small: only list feeds read it, and one that falls behind lists again.
            changed: tokio::sync::broadcast::channel(128).0,
            small_writes: Default::default(),
            root,
            writers: Mutex::new(Writers::default()),
        })
    }

    fn dir(&self, id: &str) -> Result<PathBuf, StoreError> {
        // Ids come from callers (HTTP); refuse anything that could walk out of the store,
        // and names no file system takes (a 5,000-character id is "not found", not a 500).
        if id.is_empty()
            || id.len() > MAX_ID
            || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return Err(StoreError::NotFound(id.to_string()));
        }
        Ok(self.root.join(id))
    }

    /// Makes a new session's folder with its meta and an empty history: from a spare
    /// folder when one is ready (`spares`), else file by file.
    pub fn create(&self, new: NewSession) -> Result<SessionMeta, StoreError> {
        let session_id = uuid::Uuid::now_v7().to_string();
        let dir = self.dir(&session_id)?;
        let created_at = now();
        let title = new.title.unwrap_or_else(|| "New session".to_string());
        let meta = SessionMeta {
            session_id,
            workspace: new.workspace,
            title,
            parent_session_id: new.parent_session_id,
            task_id: new.task_id,
            updated_at: created_at.clone(),
            created_at,
            state: new.state,
            usage: Usage::default(),
            interrupted: false,
            failed: false,
            task_content: new.task_content,
            reported: false,
            reports: 0,
            run_message: None,
            archived: false,
            agent: new.agent,
            provider: new.provider,
            model: new.model,
            models: Vec::new(),
            forked_from: None,
            forked_at: None,
            worktree: None,
            acp_session: None,
        };
        if let Some(spare) = self.spares.take() {
            match self.claim(&spare, &meta, &dir) {
                Ok(()) => return Ok(meta),
                // Left in `spare/`: the next process's maker looks at it again.
                Err(err) => tracing::debug!("spare {} not taken: {err}", spare.display()),
            }
        }
        self.gate
            .pass()
            .and_then(|()| private_dir(&dir))
            .map_err(|err| StoreError::io(&dir, err))?;
        let messages = dir.join(MESSAGES);
        self.gate
            .pass()
            .and_then(|()| private_file(&messages))
            .map_err(|err| StoreError::io(&messages, err))?;
        self.write_meta(&meta)?;
        Ok(meta)
    }

    /// A new session from a spare folder: its meta written into the spare's in place,
    /// then the folder renamed to `dir`, so the session appears with its meta whole. On
    /// an error nothing of the session is left, and `create` goes the slow way.
    fn claim(&self, spare: &Path, meta: &SessionMeta, dir: &Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(meta).map_err(std::io::Error::other)?;
        // The index first, as in `write_meta`: a kill before the rename leaves it ahead of
        // the folders, which its next load notices.
        self.index.record(meta);
        let claimed = self
            .gate
            .pass()
            .and_then(|()| crate::fsutil::rewrite_if_present(&spare.join(META), &bytes))
            .and_then(|present| {
                if present {
                    Ok(())
                } else {
                    Err(std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "the spare has no meta",
                    ))
                }
            })
            .and_then(|()| self.gate.pass())
            .and_then(|()| fs::rename(spare, dir));
        match claimed {
            Ok(()) => {
                self.touch(&meta.session_id);
                Ok(())
            }
            Err(err) => {
                self.index.remove(&meta.session_id);
                Err(err)
            }
        }
    }

    /// Keeps `count` spare session folders ready from now on (`spares`): for processes
    /// that live long enough to make sessions after their start.
    pub fn keep_spares(&self, count: usize) {
        self.spares.keep(count);
    }

    /// For benches and tests: waits until the spares asked for are ready.
    #[doc(hidden)]
    pub fn wait_spares(&self, timeout: std::time::Duration) -> bool {
        self.spares.wait_ready(timeout)
    }

    fn small_write_lock(&self, id: &str) -> std::sync::MutexGuard<'_, ()> {
        let stripe = id
            .bytes()
            .fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize));
        self.small_writes[stripe % self.small_writes.len()]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub fn exists(&self, id: &str) -> bool {
        self.dir(id)
            .map(|dir| dir.join(META).exists())
            .unwrap_or(false)
    }

    pub fn write_meta(&self, meta: &SessionMeta) -> Result<(), StoreError> {
        let path = self.dir(&meta.session_id)?.join(META);
        let bytes = serde_json::to_vec_pretty(meta).map_err(|err| StoreError::BadMeta {
            path: path.display().to_string(),
            message: err.to_string(),
        })?;
        // The index first: a crash between the two leaves the index ahead of the meta,
        // which its next load notices (`session_index`).
        self.index.record(meta);
        // Not flushed: everything in meta is either derivable (usage, timestamps) or
        // repaired by recovery (a session found "running" after a crash). In place: no
        // new inode per change (issue 31).
        let written = {
            let _one = self.small_write_lock(&meta.session_id);
            self.gate
                .pass()
                .and_then(|()| write_in_place(&path, &bytes))
        };
        if let Err(err) = written {
            // The index must never claim a meta the folder does not hold (review R5): a
            // session deleted meanwhile is removed from it again.
            if !path.parent().is_some_and(Path::exists) {
                self.index.remove(&meta.session_id);
            }
            return Err(StoreError::io(&path, err));
        }
        self.touch(&meta.session_id);
        Ok(())
    }

    /// After a refused [`write_meta`](Self::write_meta): the index says `meta` (what the
    /// session keeps) again, since it took the refused change's line first. A session
    /// whose folder is gone stays out of it.
    pub fn take_back_meta(&self, meta: &SessionMeta) {
        if self.dir(&meta.session_id).is_ok_and(|dir| dir.exists()) {
            self.index.record(meta);
        }
    }

    pub fn meta(&self, id: &str) -> Result<SessionMeta, StoreError> {
        let dir = self.dir(id)?;
        // Not while this process writes it in place (a read racing a write may see half).
        let _one = self.small_write_lock(id);
        read_meta(&dir.join(META), id)
    }

    /// Appends messages as lines: one write, never a rewrite of the history.
    pub fn append(&self, id: &str, messages: &[Message]) -> Result<(), StoreError> {
        let mut bytes = Vec::with_capacity(256 * messages.len());
        for message in messages {
            // Serialising our own types cannot fail; keep the error path typed anyway.
            serde_json::to_writer(&mut bytes, message).map_err(|err| StoreError::Io {
                path: id.to_string(),
                source: std::io::Error::other(err),
            })?;
            bytes.push(b'\n');
        }
        self.append_bytes(id, &bytes)
    }

    /// One write of whole lines to a session's history.
    fn append_bytes(&self, id: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let writer = self.writer(id)?;
        let mut file = writer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Err(err) = self.gate.pass().and_then(|()| file.write_all(bytes)) {
            // A failed write may leave a torn line: close the file so the next append
            // reopens it and cuts the tail off first (runtime review C7).
            drop(file);
            self.release(id);
            return Err(StoreError::io(&self.root.join(id).join(MESSAGES), err));
        }
        Ok(())
    }

    /// Appends a compaction marker as its own line: the messages before it stay as they
    /// are, so the history keeps everything and a reload rebuilds the same request.
    pub fn append_compaction(&self, id: &str, marker: &Compaction) -> Result<(), StoreError> {
        let mut bytes = serde_json::to_vec(&MarkerLine {
            compaction: marker.clone(),
        })
        .map_err(|err| StoreError::Io {
            path: id.to_string(),
            source: std::io::Error::other(err),
        })?;
        bytes.push(b'\n');
        self.append_bytes(id, &bytes)
    }

    /// Closes a session's history file (its run ended); the next append reopens it.
    pub fn release(&self, id: &str) {
        self.writers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .open
            .remove(id);
    }

    /// Flushes every open history file (shutdown): one round of the flusher.
    pub fn sync_open(&self) -> Result<(), StoreError> {
        let open: Vec<(SessionId, Arc<Mutex<File>>)> = self
            .writers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .open
            .iter()
            .map(|(id, (_, file))| (id.clone(), file.clone()))
            .collect();
        let files = open
            .into_iter()
            .map(|(id, file)| (self.root.join(&id).join(MESSAGES), file))
            .collect();
        self.flusher
            .flush_all_blocking(files)
            .map_err(|(path, err)| StoreError::io(&path, err))
    }

    /// How many history files are open now.
    pub fn open_writers(&self) -> usize {
        self.writers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .open
            .len()
    }

    /// Flushes a session's history to stable storage, blocking this thread (recovery,
    /// tests); runs ask with [`SessionStore::flush`] and await.
    pub fn sync(&self, id: &str) -> Result<(), StoreError> {
        let writer = self.writer(id)?;
        let path = self.root.join(id).join(MESSAGES);
        self.flusher
            .flush_blocking(&path, writer)
            .map_err(|err| StoreError::io(&path, err))
    }

    /// Asks for a session's history to be flushed with everything else waiting now
    /// (group commit); the ticket is answered once what was appended before this call is
    /// on stable storage.
    pub fn flush(&self, id: &str) -> Result<FlushTicket, StoreError> {
        let writer = self.writer(id)?;
        Ok(self
            .flusher
            .request(&self.root.join(id).join(MESSAGES), writer))
    }

    /// What the flusher has done so far.
    pub fn flush_stats(&self) -> FlushStats {
        self.flusher.stats()
    }

    /// For tests: the simulated kill between two writes of this store (`WriteGate`).
    #[doc(hidden)]
    pub fn write_gate(&self) -> Arc<WriteGate> {
        self.gate.clone()
    }

    /// For tests: holds every flush just before its `fdatasync` (`Flusher::hold`).
    #[doc(hidden)]
    pub fn hold_flushes(&self) -> crate::flush::FlushHold {
        self.flusher.hold()
    }

    fn writer(&self, id: &str) -> Result<Arc<Mutex<File>>, StoreError> {
        let mut writers = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, writer)) = writers.open.get(id) {
            return Ok(writer.clone());
        }
        let dir = self.dir(id)?;
        if !dir.join(META).exists() {
            return Err(StoreError::NotFound(id.to_string()));
        }
        let path = dir.join(MESSAGES);
        let file = open_repaired(&path).map_err(|err| StoreError::io(&path, err))?;
        let writer = Arc::new(Mutex::new(file));
        if writers.open.len() >= MAX_OPEN_WRITERS {
            // Closing one costs a reopen later, never a lost line: appends hold their own Arc.
            let oldest = writers
                .open
                .iter()
                .min_by_key(|(_, (order, _))| *order)
                .map(|(id, _)| id.clone());
            if let Some(oldest) = oldest {
                writers.open.remove(&oldest);
            }
        }
        let order = writers.next;
        writers.next += 1;
        writers.open.insert(id.to_string(), (order, writer.clone()));
        Ok(writer)
    }

    /// Reads a session. A torn last line (a crash mid-append) is skipped with a warning;
    /// a damaged line elsewhere is skipped too and reported in `notice`.
    pub fn load(&self, id: &str) -> Result<LoadedSession, StoreError> {
        let dir = self.dir(id)?;
        let meta = {
            let _one = self.small_write_lock(id);
            read_meta(&dir.join(META), id)?
        };
        let path = dir.join(MESSAGES);
        let text = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(err) => return Err(StoreError::io(&path, err)),
        };
        let History {
            messages,
            compactions,
            notice,
            damaged,
        } = parse_history(&text);
        if let Some(notice) = &notice {
            tracing::warn!(session = id, "{notice}");
        }
        let mut meta = meta;
        if let Ok(modified) = fs::metadata(&path).and_then(|m| m.modified()) {
            let modified: chrono::DateTime<chrono::Utc> = modified.into();
            let stamp = modified.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            if stamp > meta.updated_at {
                meta.updated_at = stamp;
            }
        }
        Ok(LoadedSession {
            meta,
            messages,
            compactions,
            notice,
            damaged,
        })
    }

    /// Every session's metadata (optionally of those listed under one workspace, see
    /// [`Self::listed_under`]), oldest first. From the index (`session_index`): after its
    /// first load, only what was appended since the last call is read. A session whose
    /// meta is unreadable is logged and left out.
    pub fn list(&self, workspace: Option<&str>) -> Result<Vec<SessionMeta>, StoreError> {
        let read = read_listed;
        // Filtered before the copy: a workspace's list does not clone every session.
        Ok(self.index.list(&read, |_, top| {
            workspace.is_none_or(|w| same_workspace(w, &top.workspace))
        }))
    }

    /// The workspace a session is listed under: its top-level ancestor's. A sub-agent
    /// isolated in a worktree works there (its `workspace`), but it belongs to its
    /// parent's conversation and is listed, tabbed and applied from there (UX review E2).
    pub fn listed_under(&self, meta: &SessionMeta) -> String {
        if meta.parent_session_id.is_none() {
            return meta.workspace.clone();
        }
        self.index.top_workspace(&read_listed, meta)
    }

    /// The children of `parent`, oldest first, copied out of the index and nothing else:
    /// a follow-up's lookup and a delete's cascade do not clone every session's meta
    /// (runtime review R12).
    pub fn children(&self, parent: &str) -> Result<Vec<SessionMeta>, StoreError> {
        Ok(self.index.list(&read_listed, |meta, _| {
            meta.parent_session_id.as_deref() == Some(parent)
        }))
    }

    /// Ids of sessions whose list entry may have changed, as they change: a meta written
    /// or a session deleted here, or a run started or ended (the controller's `touch`).
    pub fn changes(&self) -> tokio::sync::broadcast::Receiver<SessionId> {
        self.changed.subscribe()
    }

    /// Tells the list's subscribers that a session's entry may have changed.
    pub fn touch(&self, id: &str) {
        // No subscriber is no error.
        let _ = self.changed.send(id.to_string());
    }

    /// Notes in the index that this store ended with every change in it (shutdown), so
    /// the next start trusts the index without reading every session.
    pub fn close(&self) {
        self.index.close();
    }

    /// Saves the pending queue (small; rewritten whole, in place).
    pub fn write_pending(
        &self,
        id: &str,
        pending: &[crate::protocol::PendingMessage],
    ) -> Result<(), StoreError> {
        let path = self.dir(id)?.join(PENDING);
        let bytes = serde_json::to_vec(pending)
            .map_err(|err| StoreError::io(&path, std::io::Error::other(err)))?;
        // Not flushed: reports, the pending messages that matter most, are recovered from
        // the flushed report ledger. In place, like the meta.
        let _one = self.small_write_lock(id);
        self.gate.pass().map_err(|err| StoreError::io(&path, err))?;
        if pending.is_empty() {
            // An empty queue needs no file (a missing one reads as empty): most sessions,
            // and every child of a fan-out, never make one (issue 31). One that exists
            // is emptied in place, not removed, so it keeps its inode for the next change.
            return crate::fsutil::rewrite_if_present(&path, &bytes)
                .map(|_| ())
                .map_err(|err| StoreError::io(&path, err));
        }
        write_in_place(&path, &bytes)
            .map(|_| ())
            .map_err(|err| StoreError::io(&path, err))
    }

    pub fn read_pending(
        &self,
        id: &str,
    ) -> Result<Vec<crate::protocol::PendingMessage>, StoreError> {
        let path = self.dir(id)?.join(PENDING);
        // Not while this process writes it in place: a torn read would be kept aside as
        // damaged.
        let _one = self.small_write_lock(id);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|err| {
                // The next change of the queue would replace it: what it held is kept
                // beside it for the person (reports come back from the ledger anyway).
                let kept =
                    path.with_file_name(format!("{PENDING}.damaged-{}", now().replace(':', "-")));
                let _ = fs::rename(&path, &kept);
                StoreError::BadMeta {
                    path: path.display().to_string(),
                    message: format!("{err}; the file was kept as {}", kept.display()),
                }
            }),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(err) => Err(StoreError::io(&path, err)),
        }
    }

    /// Records a child's report in its parent's ledger and flushes it to disk, so a
    /// crash after this point cannot lose it.
    pub fn record_report(&self, parent: &str, record: &ReportRecord) -> Result<(), StoreError> {
        self.append_ledger(parent, &LedgerLine::Record(record.clone()), true)
    }

    /// Notes that the person discarded a report (flushed: a discard must outlast a
    /// restart, or recovery would bring the report back; runtime review C1).
    pub fn mark_discarded(
        &self,
        parent: &str,
        task_id: &str,
        at: Option<u32>,
    ) -> Result<(), StoreError> {
        let line = LedgerLine::Discarded {
            discarded: task_id.to_string(),
            at,
        };
        self.append_ledger(parent, &line, true)
    }

    /// Notes that a report reached the parent's history (not flushed: the history line,
    /// flushed with its run step, is what counts).
    pub fn mark_delivered(&self, parent: &str, task_id: &str) -> Result<(), StoreError> {
        let line = LedgerLine::Delivered {
            delivered: task_id.to_string(),
        };
        self.append_ledger(parent, &line, false)
    }

    fn append_ledger(
        &self,
        parent: &str,
        line: &LedgerLine,
        durable: bool,
    ) -> Result<(), StoreError> {
        let path = self.dir(parent)?.join(REPORTS);
        let mut bytes = serde_json::to_vec(line)
            .map_err(|err| StoreError::io(&path, std::io::Error::other(err)))?;
        bytes.push(b'\n');
        // Before the open, which makes the file: `has_ledger` looks for it.
        self.gate.pass().map_err(|err| StoreError::io(&path, err))?;
        let mut file = open_repaired(&path).map_err(|err| StoreError::io(&path, err))?;
        file.write_all(&bytes)
            .map_err(|err| StoreError::io(&path, err))?;
        if durable {
            // With the flusher, 64 children finishing at once into one parent's ledger
            // share flushes instead of queueing for the same file one by one.
            self.flusher
                .flush_blocking(&path, Arc::new(Mutex::new(file)))
                .map_err(|err| StoreError::io(&path, err))?;
        }
        Ok(())
    }

    pub fn has_ledger(&self, parent: &str) -> bool {
        self.dir(parent)
            .map(|dir| dir.join(REPORTS).exists())
            .unwrap_or(false)
    }

    /// A parent's ledger (a torn last line is skipped).
    pub fn ledger(&self, parent: &str) -> Result<Ledger, StoreError> {
        let path = self.dir(parent)?.join(REPORTS);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Ledger::default()),
            Err(err) => return Err(StoreError::io(&path, err)),
        };
        let mut ledger = Ledger::default();
        for line in bytes.split(|b| *b == b'\n') {
            match serde_json::from_slice::<LedgerLine>(line) {
                Ok(LedgerLine::Record(record)) => ledger.records.push(record),
                Ok(LedgerLine::Delivered { delivered }) => {
                    ledger.delivered.insert(delivered);
                }
                Ok(LedgerLine::Discarded { discarded, at }) => {
                    if let Some(at) = at {
                        ledger.discards.push((discarded.clone(), at));
                    }
                    ledger.discarded.insert(discarded);
                }
                Err(_) => {}
            }
        }
        Ok(ledger)
    }

    pub fn delete(&self, id: &str) -> Result<(), StoreError> {
        let dir = self.dir(id)?;
        self.release(id);
        if dir.join(META).exists() {
            self.index.remove(id);
        }
        // One rename takes the folder away whole. Removing it in place, a process killed
        // half way left a folder with part of its files, which came back as the session
        // with its history gone (the SIGKILL simulation). The name is unique, so a
        // leftover of a killed delete never meets a later one.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let aside = self.trash.join(format!("{id}.{nanos:x}"));
        match self.gate.pass().and_then(|()| fs::rename(&dir, &aside)) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                return Err(StoreError::NotFound(id.to_string()));
            }
            Err(err) => return Err(StoreError::io(&dir, err)),
        }
        self.touch(id);
        // The session is gone; what is left is disk space, which the next start frees
        // if this fails or is cut short.
        if let Err(err) = fs::remove_dir_all(&aside) {
            tracing::warn!("cannot remove {}: {err}", aside.display());
        }
        Ok(())
    }
}

/// The data folder's trash, beside `sessions/` (same file system, so a delete is one
/// rename).
const TRASH: &str = "trash";

/// Removes what deletes cut short by a crash left in the trash, on a thread of its own:
/// a start does not wait for it, and a delete made meanwhile has a name not listed here.
fn empty_trash(trash: &Path) {
    let Ok(entries) = fs::read_dir(trash) else {
        return;
    };
    let left: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    if left.is_empty() {
        return;
    }
    std::thread::spawn(move || {
        for path in left {
            if let Err(err) = fs::remove_dir_all(&path) {
                if err.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!("cannot empty the trash {}: {err}", path.display());
                }
            }
        }
    });
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

pub fn same_workspace(a: &str, b: &str) -> bool {
    Path::new(a.trim_end_matches('/')) == Path::new(b.trim_end_matches('/'))
}

fn read_meta(path: &Path, id: &str) -> Result<SessionMeta, StoreError> {
    let read = || -> Result<SessionMeta, StoreError> {
        let bytes = match fs::read(path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                return Err(StoreError::NotFound(id.to_string()));
            }
            Err(err) => return Err(StoreError::io(path, err)),
        };
        serde_json::from_slice(&bytes).map_err(|err| StoreError::BadMeta {
            path: path.display().to_string(),
            message: err.to_string(),
        })
    };
    // Metas are written in place (`write_in_place`): a reader that does not hold the
    // session's write lock (the index's scan) may meet a write half done; a second read
    // sees it whole. A file damaged for good fails both.
    match read() {
        Err(StoreError::BadMeta { .. }) => read(),
        other => other,
    }
}

/// A history file read back: the messages, the compaction markers between them, and
/// what was skipped.
#[derive(Debug, Default)]
pub struct History {
    pub messages: Vec<Message>,
    pub compactions: Vec<Compaction>,
    /// What was skipped and why.
    pub notice: Option<String>,
    /// A line other than a torn last one was unreadable.
    pub damaged: bool,
}

/// A marker line: an object with the one key `compaction`, which no message has, so the
/// two kinds of line cannot be mistaken for each other.
#[derive(Serialize, Deserialize)]
struct MarkerLine {
    compaction: Compaction,
}

/// Parses JSON lines: messages, and compaction markers (kept out of the messages, so
/// every reader of the history sees SPEC §2's shape).
pub fn parse_history(bytes: &[u8]) -> History {
    let mut history = History::default();
    let mut damaged = Vec::new();
    let mut torn = false;
    let ends_clean = bytes.last().is_none_or(|b| *b == b'\n');
    let lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    let count = lines.len();
    for (index, line) in lines.into_iter().enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Message>(line) {
            Ok(message) => history.messages.push(message),
            Err(_) => match serde_json::from_slice::<MarkerLine>(line) {
                Ok(marker) => history.compactions.push(marker.compaction),
                Err(_) if index + 1 == count && !ends_clean => torn = true,
                Err(_) => damaged.push(index + 1),
            },
        }
    }
    history.notice = match (torn, damaged.is_empty()) {
        (false, true) => None,
        (true, true) => Some("the last message was cut off by a crash and was skipped".into()),
        (_, false) => Some(format!(
            "damaged history: line(s) {damaged:?} of {MESSAGES} could not be read and were skipped; the session is read-only"
        )),
    };
    history.damaged = !damaged.is_empty();
    history
}

/// Opens a history for appending; a torn tail left by a crash is cut off first so the
/// next line starts clean.
fn open_repaired(path: &Path) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).append(true).create(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(file);
    }
    file.seek(SeekFrom::Start(len - 1))?;
    let mut last = [0u8; 1];
    file.read_exact(&mut last)?;
    if last[0] == b'\n' {
        return Ok(file);
    }
    // Find the start of the torn line; keep it if it is a whole message missing only its newline.
    let mut bytes = Vec::new();
    file.seek(SeekFrom::Start(0))?;
    file.read_to_end(&mut bytes)?;
    let start = bytes
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |pos| pos + 1);
    // Any whole JSON value is a line that only lacks its newline (histories and ledgers).
    if serde_json::from_slice::<serde_json::Value>(&bytes[start..]).is_ok() {
        file.write_all(b"\n")?;
    } else {
        tracing::warn!(
            "cutting a torn last line off {} ({} bytes)",
            path.display(),
            bytes.len() - start
        );
        file.set_len(start as u64)?;
    }
    Ok(file)
}

/// A meta as the index reads it when it must: an unreadable one is logged and left out.
fn read_listed(dir: &Path, id: &str) -> Option<SessionMeta> {
    match read_meta(&dir.join(META), id) {
        Ok(meta) => Some(meta),
        Err(StoreError::NotFound(_)) => None,
        Err(err) => {
            tracing::warn!("skipping session {id}: {err}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, SessionStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path()).unwrap();
        (dir, store)
    }

    fn new(workspace: &str) -> NewSession {
        NewSession {
            workspace: workspace.into(),
            ..NewSession::default()
        }
    }

    /// The spare folders' inodes, by inode number.
    #[cfg(unix)]
    fn spare_inodes(data: &Path) -> Vec<u64> {
        use std::os::unix::fs::MetadataExt;
        spares_in(data)
            .iter()
            .map(|path| std::fs::metadata(path).unwrap().ino())
            .collect()
    }

    /// What `spare/` holds.
    #[cfg(unix)]
    fn spares_in(data: &Path) -> Vec<PathBuf> {
        std::fs::read_dir(data.join(crate::spares::SPARE_DIR))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect()
    }

    /// Issue 31: with spares kept, a new session is a spare folder renamed into
    /// `sessions/` with its meta written in place (no new inode on the call's path), and it
    /// reads, appends, lists and reopens like one made file by file; the maker replaces
    /// the spare taken.
    #[cfg(unix)]
    #[test]
    fn a_new_session_takes_a_spare_folder_made_ahead() {
        use std::os::unix::fs::MetadataExt;
        let (dir, store) = store();
        store.keep_spares(3);
        assert!(store.wait_spares(std::time::Duration::from_secs(10)));
        let spares = spare_inodes(dir.path());
        assert_eq!(spares.len(), 3);
        let meta = store
            .create(NewSession {
                title: Some("from a spare".into()),
                ..new("/w")
            })
            .unwrap();
        let folder = store.dir(&meta.session_id).unwrap();
        let ino = std::fs::metadata(&folder).unwrap().ino();
        assert!(spares.contains(&ino), "the session's folder is not a spare");
        let mut files: Vec<String> = std::fs::read_dir(&folder)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        assert_eq!(files, [MESSAGES, META]);
        assert_eq!(store.meta(&meta.session_id).unwrap(), meta);
        store
            .append(&meta.session_id, &[Message::user("m1", "hello")])
            .unwrap();
        assert_eq!(store.load(&meta.session_id).unwrap().messages.len(), 1);
        let listed = store.list(None).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].title, "from a spare");
        assert!(store.wait_spares(std::time::Duration::from_secs(10)));
        assert_eq!(
            spare_inodes(dir.path()).len(),
            3,
            "the spare taken is replaced"
        );
        drop(store);
        let again = SessionStore::new(dir.path()).unwrap();
        assert_eq!(again.list(None).unwrap(), listed);
    }

    /// A kill between a claim's meta write and its rename leaves no session (the index
    /// line written first is dropped by the next load), and the spare, meta and all, is
    /// taken up by the next process's maker and serves a session whose shorter meta reads
    /// back whole; a spare cut off while it was made is removed.
    #[cfg(unix)]
    #[test]
    fn a_claim_cut_off_by_a_kill_leaves_no_session_and_its_spare_serves_again() {
        let (dir, store) = store();
        store.keep_spares(1);
        assert!(store.wait_spares(std::time::Duration::from_secs(10)));
        store.keep_spares(0);
        let spare = spares_in(dir.path()).remove(0);
        // The index line and the meta write pass; the rename is refused.
        store.write_gate().kill_after(2, std::time::Duration::ZERO);
        let refused = store.create(NewSession {
            title: Some("a long title that the next session's is shorter than".into()),
            ..new("/w")
        });
        assert!(refused.is_err(), "the claim was killed: {refused:?}");
        assert!(
            std::fs::read(spare.join(META)).unwrap().len() > 100,
            "the kill came after the spare's meta was written"
        );
        drop(store);
        let half = dir.path().join(crate::spares::SPARE_DIR).join("half");
        std::fs::create_dir(&half).unwrap();
        std::fs::write(half.join(MESSAGES), "").unwrap();

        let next = SessionStore::new(dir.path()).unwrap();
        assert_eq!(next.list(None).unwrap(), [], "a session the kill cut off");
        next.keep_spares(1);
        assert!(next.wait_spares(std::time::Duration::from_secs(10)));
        assert_eq!(
            spares_in(dir.path()),
            std::slice::from_ref(&spare),
            "the spare kept, the half-made one removed"
        );
        let meta = next
            .create(NewSession {
                title: Some("short".into()),
                ..new("/w")
            })
            .unwrap();
        assert!(!spare.exists(), "the spare was taken");
        assert_eq!(next.meta(&meta.session_id).unwrap(), meta);
        assert_eq!(next.list(None).unwrap(), [meta]);
    }

    /// Issue 31: a meta (and the pending queue) is replaced in place, never through a new
    /// inode (each new inode cost ext4's allocator a quarter of a fan-out's CPU); a shorter
    /// meta after a longer one reads back whole (the padding is JSON whitespace), and what
    /// a concurrent writer leaves is always one writer's meta.
    #[cfg(unix)]
    #[test]
    fn a_meta_is_replaced_in_place_and_reads_back_whole() {
        use std::os::unix::fs::MetadataExt;
        let (_dir, store) = store();
        let mut meta = store.create(new("/w")).unwrap();
        let path = store.dir(&meta.session_id).unwrap().join(META);
        let inode = std::fs::metadata(&path).unwrap().ino();
        meta.title = "a long title ".repeat(40);
        store.write_meta(&meta).unwrap();
        meta.title = "short".into();
        store.write_meta(&meta).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().ino(),
            inode,
            "a new inode"
        );
        assert_eq!(store.meta(&meta.session_id).unwrap().title, "short");
        store
            .write_pending(
                &meta.session_id,
                &[crate::protocol::PendingMessage {
                    message_id: "m1".into(),
                    content: "x".repeat(300),
                    status: crate::protocol::MessageStatus::Queued,
                    config: Default::default(),
                    images: Vec::new(),
                }],
            )
            .unwrap();
        let pending = store.dir(&meta.session_id).unwrap().join(PENDING);
        let pending_inode = std::fs::metadata(&pending).unwrap().ino();
        store.write_pending(&meta.session_id, &[]).unwrap();
        assert_eq!(std::fs::metadata(&pending).unwrap().ino(), pending_inode);
        assert!(store.read_pending(&meta.session_id).unwrap().is_empty());

        // Writers of the same meta from many threads: the file is always one of theirs.
        let store = std::sync::Arc::new(store);
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let store = store.clone();
                let mut meta = meta.clone();
                std::thread::spawn(move || {
                    for n in 0..50 {
                        meta.title = format!("t{i}-{n}-").repeat(1 + (i * 7 + n) % 13);
                        store.write_meta(&meta).unwrap();
                        let read = store.meta(&meta.session_id).unwrap();
                        assert!(read.title.starts_with('t'), "{:?}", read.title);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), inode);
    }

    /// Issue 31: an empty queue makes no `pending.json` (a missing one reads as empty); one
    /// that exists is emptied in place, keeping its inode.
    #[cfg(unix)]
    #[test]
    fn an_empty_pending_queue_makes_no_file() {
        use std::os::unix::fs::MetadataExt;
        let (_dir, store) = store();
        let meta = store.create(new("/w")).unwrap();
        let path = store.dir(&meta.session_id).unwrap().join(PENDING);
        store.write_pending(&meta.session_id, &[]).unwrap();
        assert!(!path.exists());
        let one = crate::protocol::PendingMessage {
            message_id: "m1".into(),
            content: "x".into(),
            status: crate::protocol::MessageStatus::Queued,
            config: Default::default(),
            images: Vec::new(),
        };
        store.write_pending(&meta.session_id, &[one]).unwrap();
        let inode = std::fs::metadata(&path).unwrap().ino();
        store.write_pending(&meta.session_id, &[]).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), inode);
        assert!(store.read_pending(&meta.session_id).unwrap().is_empty());
    }

    /// Security review, informational: a very long id is "not found" (404), not a storage
    /// error (500).
    #[test]
    fn a_very_long_session_id_is_not_found() {
        let (_dir, store) = store();
        let id = "a".repeat(5000);
        assert!(matches!(store.load(&id), Err(StoreError::NotFound(_))));
        assert!(matches!(
            store.read_pending(&id),
            Err(StoreError::NotFound(_))
        ));
    }

    /// Security review, informational: a damaged `pending.json` is not silently replaced
    /// by the next queue change: what it held is kept beside it, and the error says where.
    #[test]
    fn a_damaged_pending_queue_is_kept_aside_not_overwritten() {
        let (_dir, store) = store();
        let meta = store.create(new("/w")).unwrap();
        let folder = store.dir(&meta.session_id).unwrap();
        std::fs::write(
            folder.join(PENDING),
            "[{\"message_id\": \"m1\", \"content\": \"keep me",
        )
        .unwrap();
        let err = store
            .read_pending(&meta.session_id)
            .unwrap_err()
            .to_string();
        assert!(err.contains("kept as"), "{err}");
        store.write_pending(&meta.session_id, &[]).unwrap();
        let kept: Vec<_> = std::fs::read_dir(&folder)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("pending.json.damaged-"))
            .collect();
        assert_eq!(kept.len(), 1, "{kept:?}");
        let text = std::fs::read_to_string(folder.join(&kept[0])).unwrap();
        assert!(text.contains("keep me"));
        assert_eq!(store.read_pending(&meta.session_id).unwrap(), Vec::new());
    }

    #[test]
    fn torn_last_line_is_skipped_and_repaired_on_next_append() {
        let (dir, store) = store();
        let meta = store.create(new("/w")).unwrap();
        store
            .append(&meta.session_id, &[Message::user("u1", "hello")])
            .unwrap();
        drop(store);
        let path = dir
            .path()
            .join("sessions")
            .join(&meta.session_id)
            .join(MESSAGES);
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(br#"{"role":"assistant","content":"half"#)
            .unwrap();
        let store = SessionStore::new(dir.path()).unwrap();
        let loaded = store.load(&meta.session_id).unwrap();
        assert_eq!(loaded.messages.len(), 1);
        assert!(loaded.notice.unwrap().contains("cut off"));
        store
            .append(&meta.session_id, &[Message::user("u2", "again")])
            .unwrap();
        let loaded = store.load(&meta.session_id).unwrap();
        assert_eq!(
            loaded
                .messages
                .iter()
                .map(|m| m.text().to_string())
                .collect::<Vec<_>>(),
            ["hello", "again"]
        );
        assert!(loaded.notice.is_none());
    }

    #[test]
    fn damaged_middle_line_is_reported_not_fatal() {
        let history = parse_history(
            b"{\"role\":\"user\",\"content\":\"a\"}\nnot json\n{\"role\":\"user\",\"content\":\"b\"}\n",
        );
        assert_eq!(history.messages.len(), 2);
        assert!(history.damaged);
        assert!(history.notice.unwrap().contains("line(s) [2]"));
    }

    #[test]
    fn compaction_markers_are_lines_of_their_own_and_not_messages() {
        let (_dir, store) = store();
        let meta = store.create(new("/w")).unwrap();
        let id = &meta.session_id;
        store.append(id, &[Message::user("u1", "first")]).unwrap();
        let marker = Compaction {
            id: "m1".into(),
            kind: crate::protocol::CompactionKind::Summary,
            at: 1,
            first_kept: 1,
            kept_user: vec![0],
            elided: Vec::new(),
            summary: Some("the gist".into()),
            tokens_before: 900,
            tokens_after: 100,
            note: None,
        };
        store.append_compaction(id, &marker).unwrap();
        store.append(id, &[Message::user("u2", "second")]).unwrap();
        let loaded = store.load(id).unwrap();
        let texts: Vec<&str> = loaded.messages.iter().map(|m| m.text()).collect();
        assert_eq!(texts, ["first", "second"]);
        assert_eq!(loaded.compactions, vec![marker]);
        assert!(!loaded.damaged && loaded.notice.is_none());
    }

    #[test]
    fn concurrent_appends_to_different_sessions_stay_whole() {
        let (_dir, store) = store();
        let store = Arc::new(store);
        let ids: Vec<String> = (0..4)
            .map(|i| store.create(new(&format!("/w{i}"))).unwrap().session_id)
            .collect();
        let threads: Vec<_> = ids
            .iter()
            .cloned()
            .map(|id| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for n in 0..200 {
                        store
                            .append(&id, &[Message::user(format!("{id}-{n}"), "x".repeat(n))])
                            .unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        for id in &ids {
            let loaded = store.load(id).unwrap();
            assert!(loaded.notice.is_none());
            let got: Vec<_> = loaded
                .messages
                .iter()
                .map(|m| m.id.clone().unwrap())
                .collect();
            let want: Vec<_> = (0..200).map(|n| format!("{id}-{n}")).collect();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn list_filters_by_workspace_and_delete_removes() {
        let (_dir, store) = store();
        let a = store.create(new("/a")).unwrap();
        let b = store.create(new("/b/")).unwrap();
        assert_eq!(store.list(None).unwrap().len(), 2);
        assert_eq!(store.list(Some("/b")).unwrap()[0].session_id, b.session_id);
        store.delete(&a.session_id).unwrap();
        assert!(matches!(
            store.load(&a.session_id),
            Err(StoreError::NotFound(_))
        ));
        assert!(matches!(store.load("../etc"), Err(StoreError::NotFound(_))));
        assert_eq!(store.list(None).unwrap().len(), 1);
    }

    #[test]
    fn children_are_the_parents_and_no_one_elses() {
        let (_dir, store) = store();
        let parent = store.create(new("/a")).unwrap();
        let other = store.create(new("/a")).unwrap();
        let child = |of: &SessionMeta| NewSession {
            parent_session_id: Some(of.session_id.clone()),
            ..new("/a")
        };
        let c1 = store.create(child(&parent)).unwrap();
        let c2 = store.create(child(&parent)).unwrap();
        store.create(child(&other)).unwrap();
        let got: Vec<_> = store
            .children(&parent.session_id)
            .unwrap()
            .into_iter()
            .map(|m| m.session_id)
            .collect();
        assert_eq!(got.len(), 2);
        assert!(got.contains(&c1.session_id) && got.contains(&c2.session_id));
        store.delete(&c1.session_id).unwrap();
        assert_eq!(store.children(&parent.session_id).unwrap().len(), 1);
    }
}
