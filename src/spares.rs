//! Session folders made ahead of need (`spare/` in the data folder): a new session takes one instead of making a folder, a history and a meta on the path of the call that asked for it.
//!
//! Why: a session's folder, empty history and meta are three new inodes, and what ext4's
//! inode allocator costs depends on the file system's state, not on us: 40 µs to 0.7 ms
//! for each on one VM's disk within one hour, which put a parent delegating six children
//! at 2 to 11 ms from the model's answer to its turn's end (issue 31's target: 10 ms).
//! Writing into files that exist and renaming a folder cost the same everywhere.
//!
//! A spare is a folder holding an empty `meta.json` and an empty `messages.jsonl`. A new
//! session writes its meta into the spare's file in place and renames the folder into
//! `sessions/` under its id (`SessionStore::create`), so the folder appears with its meta
//! whole; a folder without its meta was visible before, between the `mkdir` and the meta.
//! `spare/` sits beside `sessions/` (one file system, so a claim is one rename); lists,
//! the index and recovery never read it.
//!
//! Only a process that asks keeps spares ([`Spares::keep`]): the desktop, `serve` and
//! `acp` live long enough to use them, while a one-shot `bumblehive run` would only pay
//! for folders it never uses. A thread of its own makes them, first adopting what an
//! earlier process left: a spare whose claim was cut off by a kill after its meta was
//! written is still a spare (the next claim's in-place write pads over the old meta),
//! and anything else in `spare/` is removed. Like every write of the data folder, making
//! a spare asks the store's [`WriteGate`] first. It makes them at idle priority and only
//! once no spare has been taken for a moment ([`QUIET`]), never during a burst.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::fsutil::{WriteGate, private_dir, private_file};

/// The folder beside `sessions/` that holds the spares.
pub const SPARE_DIR: &str = "spare";
const META: &str = "meta.json";
const MESSAGES: &str = "messages.jsonl";

/// The spares of one data folder, and the thread that makes them once asked to.
pub struct Spares {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    gate: Arc<WriteGate>,
    state: Mutex<State>,
    /// Signalled when a spare is taken or made, or the store goes: the maker and
    /// [`Spares::wait_ready`] both wait on it.
    changed: Condvar,
}

#[derive(Default)]
struct State {
    ready: Vec<PathBuf>,
    /// How many to keep ready; 0 until [`Spares::keep`].
    want: usize,
    making: bool,
    stop: bool,
    /// When a spare was last taken: the maker waits for [`QUIET`] after it.
    taken_at: Option<Instant>,
}

/// How long no spare must have been taken before the maker replaces any. During a burst
/// (a fan-out making a thousand children) a spare made is taken at once, so making it ahead
/// only adds a rename to each child's file-system work (a 1,000-child fan-out on disk read
/// 1.29–1.54× the ideal against 1.12–1.48× without spares); after the burst the maker fills
/// up for the next one.
const QUIET: Duration = Duration::from_millis(250);

impl Spares {
    pub fn new(data_dir: &Path, gate: Arc<WriteGate>) -> Self {
        Spares {
            inner: Arc::new(Inner {
                dir: data_dir.join(SPARE_DIR),
                gate,
                state: Mutex::new(State::default()),
                changed: Condvar::new(),
            }),
        }
    }

    /// Keeps `count` spares ready from now on, made by a thread of its own (the caller
    /// never waits for one). Calling it again changes the count.
    pub fn keep(&self, count: usize) {
        let mut state = self.inner.lock();
        state.want = count;
        if !state.making && !state.stop && count > 0 {
            state.making = true;
            let inner = self.inner.clone();
            let spawned = std::thread::Builder::new()
                .name("bumblehive-spares".into())
                .spawn(move || inner.make());
            if let Err(err) = spawned {
                tracing::warn!("no spare session folders: {err}");
                state.making = false;
            }
        }
        self.inner.changed.notify_all();
    }

    /// A spare folder for a new session, if one is ready; the maker is woken to replace it.
    pub fn take(&self) -> Option<PathBuf> {
        let mut state = self.inner.lock();
        let spare = state.ready.pop();
        if spare.is_some() {
            state.taken_at = Some(Instant::now());
            self.inner.changed.notify_all();
        }
        spare
    }

    /// For benches and tests: waits until as many spares are ready as were asked for;
    /// false when `timeout` passed first or the maker stopped.
    #[doc(hidden)]
    pub fn wait_ready(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        let mut state = self.inner.lock();
        loop {
            if state.want > 0 && state.ready.len() >= state.want {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || !state.making {
                return false;
            }
            state = self
                .inner
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Drop for Spares {
    fn drop(&mut self) {
        self.inner.lock().stop = true;
        self.inner.changed.notify_all();
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The maker's thread: adopts what an earlier process left, then keeps `want` ready
    /// until the store goes. A spare it cannot make (a full disk, a refused write) ends
    /// it: sessions are then made the slow way, as without spares.
    fn make(self: Arc<Self>) {
        idle_priority();
        let adopted = match private_dir(&self.dir) {
            Ok(()) => self.adopt(),
            Err(err) => {
                tracing::warn!("no spare session folders in {}: {err}", self.dir.display());
                return self.ended();
            }
        };
        {
            let mut state = self.lock();
            state.ready.extend(adopted);
            self.changed.notify_all();
        }
        loop {
            {
                let mut state = self.lock();
                loop {
                    if state.stop {
                        break;
                    }
                    if state.ready.len() >= state.want {
                        state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
                        continue;
                    }
                    let since = state.taken_at.map_or(QUIET, |at| at.elapsed());
                    if since >= QUIET {
                        break;
                    }
                    state = self
                        .changed
                        .wait_timeout(state, QUIET - since)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                if state.stop {
                    drop(state);
                    return self.ended();
                }
            }
            match self.make_one() {
                Ok(spare) => {
                    self.lock().ready.push(spare);
                    self.changed.notify_all();
                }
                Err(err) => {
                    tracing::warn!(
                        "no more spare session folders in {}: {err}",
                        self.dir.display()
                    );
                    return self.ended();
                }
            }
        }
    }

    /// The maker's end, whatever its cause: a later `keep` may start another, and
    /// `wait_ready` stops waiting.
    fn ended(&self) {
        self.lock().making = false;
        self.changed.notify_all();
    }

    /// One spare: its folder, then its two empty files, each write asking the gate.
    fn make_one(&self) -> std::io::Result<PathBuf> {
        let spare = self.dir.join(uuid::Uuid::new_v4().simple().to_string());
        self.gate.pass()?;
        private_dir(&spare)?;
        for name in [MESSAGES, META] {
            self.gate.pass()?;
            private_file(&spare.join(name))?;
        }
        Ok(spare)
    }

    /// What an earlier process left in `spare/`: a folder holding a meta and an empty
    /// history (a spare, or one whose claim a kill cut off before its rename) is kept;
    /// anything else (a spare cut off while it was made) is removed.
    fn adopt(&self) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut kept = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let whole = std::fs::metadata(path.join(MESSAGES))
                .is_ok_and(|m| m.is_file() && m.len() == 0)
                && std::fs::metadata(path.join(META)).is_ok_and(|m| m.is_file())
                && std::fs::read_dir(&path).is_ok_and(|files| files.count() == 2);
            if whole {
                kept.push(path);
                continue;
            }
            if self.gate.pass().is_err() {
                break;
            }
            let removed = if entry.file_type().is_ok_and(|t| t.is_dir()) {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            if let Err(err) = removed {
                tracing::debug!("cannot remove {}: {err}", path.display());
            }
        }
        kept
    }
}

/// The maker runs only when the cores are otherwise idle: a burst of children takes its
/// spares while the maker's replacements would compete with the burst's own work (two
/// cores on a small machine). Linux's `SCHED_IDLE`, for this thread only.
#[cfg(target_os = "linux")]
fn idle_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sets this thread's policy (pid 0 is the calling thread); no memory is shared.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        tracing::debug!(
            "spares made at normal priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn idle_priority() {}
