//! Group commit: every flush request waiting for a file when a flush of it starts is
//! answered by that one `fdatasync`, and flushes of different files run side by side on
//! a small pool of flusher threads, so 1,000 children reporting into one parent's ledger
//! cost a handful of flushes, and 64 sessions ending a step together do not queue behind
//! each other.
//!
//! Why per file and not rounds of "everything waiting now": a round ends with its slowest
//! flush, so on a disk busy with other writers (a build in the workspace) one slow file
//! held every other session back. Why not `syncfs`: it writes back everything dirty on
//! the filesystem, the build's output included. Why threads of our own and not
//! `spawn_blocking` per flush: requests for a file in flight then wait for the next flush
//! of that file instead of each taking a thread to flush it again.
//!
//! A request is answered only by a flush that started after it was made, so whatever was
//! written before the request is on stable storage when its answer comes. A store on
//! tmpfs or ramfs has nothing to make durable: requests are answered at once.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

enum Reply {
    Async(tokio::sync::oneshot::Sender<io::Result<()>>),
    Blocking(mpsc::Sender<io::Result<()>>),
}

impl Reply {
    fn send(self, result: io::Result<()>) {
        // A requester that stopped waiting (a run whose next flush covers this one)
        // is no error.
        match self {
            Reply::Async(tx) => {
                let _ = tx.send(result);
            }
            Reply::Blocking(tx) => {
                let _ = tx.send(result);
            }
        }
    }
}

/// The answer to one flush request, to await. (Blocking callers use
/// [`Flusher::flush_blocking`], which needs no ticket.)
pub enum FlushTicket {
    /// Nothing to wait for (a memory filesystem).
    Done,
    Pending(tokio::sync::oneshot::Receiver<io::Result<()>>),
}

impl FlushTicket {
    /// Waits for the flush without blocking a thread.
    pub async fn wait(self) -> io::Result<()> {
        match self {
            FlushTicket::Done => Ok(()),
            FlushTicket::Pending(rx) => rx.await.unwrap_or_else(|_| Err(gone())),
        }
    }
}

fn gone() -> io::Error {
    io::Error::other("the flusher stopped before answering")
}

/// How many requests the flushers have answered with how many `fdatasync`s (for tests
/// and benchmarks).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FlushStats {
    pub requests: u64,
    pub syncs: u64,
}

/// At most this many flushes run at once (threads are started as needed and end after
/// [`IDLE`] without work). Sessions that end a step together flush side by side, which
/// lets the filesystem's journal commit them together.
const WORKERS: usize = 32;
const IDLE: Duration = Duration::from_secs(10);

/// One file's flushes: who waits for the next one, and whether one runs now.
struct Slot {
    file: Arc<Mutex<File>>,
    waiting: Vec<Reply>,
    running: bool,
    queued: bool,
}

#[derive(Default)]
struct Queue {
    slots: HashMap<PathBuf, Slot>,
    ready: VecDeque<PathBuf>,
    workers: usize,
    idle: usize,
    stats: FlushStats,
}

/// A test's hold on the flushes: each waiting flush has a ticket; those below `passed`
/// may go on (`FlushHold::pass`), the others wait while the hold lasts.
#[derive(Default)]
struct Held {
    on: bool,
    next: u64,
    passed: u64,
    waiting: std::collections::BTreeSet<u64>,
}

impl Held {
    /// How many flushes wait at the hold and were not let through.
    fn holding(&self) -> usize {
        self.waiting.range(self.passed..).count()
    }
}

struct Inner {
    queue: Mutex<Queue>,
    work: Condvar,
    /// Flushes held just before their `fdatasync` (`Flusher::hold`).
    held: Mutex<Held>,
    released: Condvar,
}

/// The store's flushers.
pub struct Flusher {
    /// Whether flushing does anything on this filesystem.
    needed: bool,
    inner: Arc<Inner>,
}

impl Flusher {
    /// A flusher for files under `root` (its filesystem decides whether one is needed).
    pub fn new(root: &Path) -> Self {
        Flusher {
            needed: !on_memory_fs(root),
            inner: Arc::new(Inner {
                queue: Mutex::default(),
                work: Condvar::new(),
                held: Mutex::default(),
                released: Condvar::new(),
            }),
        }
    }

    /// For tests: every flush waits just before its `fdatasync` until the hold is dropped,
    /// as on a disk that takes its time; on a memory filesystem flushes then run too.
    /// This is how tests show that nothing waits for a flush that must not (R12).
    #[doc(hidden)]
    pub fn hold(&self) -> FlushHold {
        *self.inner.held.lock().unwrap_or_else(|p| p.into_inner()) = Held {
            on: true,
            ..Held::default()
        };
        FlushHold(self.inner.clone())
    }

    /// Whether requests go to the flushers (a held flusher flushes even on a memory fs).
    fn needed(&self) -> bool {
        self.needed || self.inner.held.lock().unwrap_or_else(|p| p.into_inner()).on
    }

    pub fn stats(&self) -> FlushStats {
        self.inner.lock().stats
    }

    /// Asks for `file` (at `path`, which identifies it) to be made durable; the ticket is
    /// answered by a flush of it that started after this call.
    pub fn request(&self, path: &Path, file: Arc<Mutex<File>>) -> FlushTicket {
        if !self.needed() {
            return FlushTicket::Done;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(path, file, Reply::Async(tx));
        FlushTicket::Pending(rx)
    }

    /// The same, blocking this thread until it is done (any thread, async or not: it
    /// waits on a std channel, never on the runtime).
    pub fn flush_blocking(&self, path: &Path, file: Arc<Mutex<File>>) -> io::Result<()> {
        if !self.needed() {
            return Ok(());
        }
        let (tx, rx) = mpsc::channel();
        self.send(path, file, Reply::Blocking(tx));
        rx.recv().unwrap_or_else(|_| Err(gone()))
    }

    /// Several files at once, blocking until all are done: they flush side by side.
    /// The first error, with its file, if any.
    pub fn flush_all_blocking(
        &self,
        files: Vec<(PathBuf, Arc<Mutex<File>>)>,
    ) -> Result<(), (PathBuf, io::Error)> {
        if !self.needed() {
            return Ok(());
        }
        let waiting: Vec<(PathBuf, mpsc::Receiver<io::Result<()>>)> = files
            .into_iter()
            .map(|(path, file)| {
                let (tx, rx) = mpsc::channel();
                self.send(&path, file, Reply::Blocking(tx));
                (path, rx)
            })
            .collect();
        let mut first_error = None;
        for (path, rx) in waiting {
            if let Err(err) = rx.recv().unwrap_or_else(|_| Err(gone())) {
                first_error.get_or_insert((path, err));
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn send(&self, path: &Path, file: Arc<Mutex<File>>, reply: Reply) {
        let mut queue = self.inner.lock();
        queue.stats.requests += 1;
        let slot = queue.slots.entry(path.to_path_buf()).or_insert(Slot {
            file,
            waiting: Vec::new(),
            running: false,
            queued: false,
        });
        slot.waiting.push(reply);
        // A file being flushed now gets its next flush when this one ends; one already
        // queued takes this request along.
        if slot.running || slot.queued {
            return;
        }
        slot.queued = true;
        queue.ready.push_back(path.to_path_buf());
        if queue.idle > 0 {
            self.inner.work.notify_one();
            return;
        }
        if queue.workers >= WORKERS {
            return;
        }
        let inner = self.inner.clone();
        match std::thread::Builder::new()
            .name("bumblehive-flush".into())
            .spawn(move || worker(inner))
        {
            Ok(_) => queue.workers += 1,
            Err(err) if queue.workers == 0 => {
                // No thread at all: flush here rather than never.
                tracing::warn!("cannot start a flusher thread ({err}); flushing inline");
                let path = queue.ready.pop_back().unwrap_or_default();
                if let Some(slot) = queue.slots.remove(&path) {
                    drop(queue);
                    let result = slot
                        .file
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .sync_data();
                    answer(slot.waiting, &result);
                }
            }
            Err(err) => tracing::warn!("cannot start another flusher thread: {err}"),
        }
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits while a test holds the flushes (`Flusher::hold`).
    fn wait_released(&self) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if !held.on {
            return;
        }
        let ticket = held.next;
        held.next += 1;
        held.waiting.insert(ticket);
        self.released.notify_all();
        while held.on && ticket >= held.passed {
            held = self.released.wait(held).unwrap_or_else(|p| p.into_inner());
        }
        held.waiting.remove(&ticket);
    }
}

/// Flushes held until this is dropped (`Flusher::hold`).
#[doc(hidden)]
pub struct FlushHold(Arc<Inner>);

impl FlushHold {
    /// Waits until `n` flushes wait at the hold (not counting those let through).
    pub fn wait_for(&self, n: usize) {
        let mut held = self.0.held.lock().unwrap_or_else(|p| p.into_inner());
        while held.holding() < n {
            held = self
                .0
                .released
                .wait(held)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Lets the flushes waiting now go on; those that come later wait, as before. A test
    /// steps a flow through its flushes one group at a time with this.
    pub fn pass(&self) {
        let mut held = self.0.held.lock().unwrap_or_else(|p| p.into_inner());
        held.passed = held.next;
        self.0.released.notify_all();
    }
}

impl Drop for FlushHold {
    fn drop(&mut self) {
        self.0.held.lock().unwrap_or_else(|p| p.into_inner()).on = false;
        self.0.released.notify_all();
    }
}

/// A flusher thread: takes the next file that has waiters, flushes it once for all of
/// them, and queues it again if more came meanwhile.
fn worker(inner: Arc<Inner>) {
    let mut queue = inner.lock();
    loop {
        let Some(path) = queue.ready.pop_front() else {
            queue.idle += 1;
            let (next, timeout) = inner
                .work
                .wait_timeout(queue, IDLE)
                .unwrap_or_else(|p| p.into_inner());
            queue = next;
            queue.idle -= 1;
            if timeout.timed_out() && queue.ready.is_empty() {
                queue.workers -= 1;
                return;
            }
            continue;
        };
        let Some(slot) = queue.slots.get_mut(&path) else {
            continue;
        };
        slot.queued = false;
        slot.running = true;
        let waiting = std::mem::take(&mut slot.waiting);
        let file = slot.file.clone();
        drop(queue);
        // On a handle of its own: the store's appends take the file's lock, and an append
        // must not wait out a flush that takes tens of milliseconds on a busy disk
        // (runtime review R12). A flush on any handle of the file covers what was written.
        let own = file.lock().unwrap_or_else(|p| p.into_inner()).try_clone();
        inner.wait_released();
        let result = own.and_then(|own| own.sync_data());
        if let Err(err) = &result {
            tracing::warn!("cannot flush {}: {err}", path.display());
        }
        queue = inner.lock();
        // Counted before anyone is answered, so a waiter that looks sees its flush.
        queue.stats.syncs += 1;
        let again = match queue.slots.get_mut(&path) {
            Some(slot) if !slot.waiting.is_empty() => {
                slot.running = false;
                slot.queued = true;
                true
            }
            _ => {
                // Nobody waits: let the file go (the store keeps its own handle).
                queue.slots.remove(&path);
                false
            }
        };
        if again {
            queue.ready.push_back(path);
        }
        drop(queue);
        answer(waiting, &result);
        queue = inner.lock();
    }
}

fn answer(waiting: Vec<Reply>, result: &io::Result<()>) {
    for reply in waiting {
        reply.send(match result {
            Ok(()) => Ok(()),
            // io::Error is not Clone: each waiter gets the same kind and text.
            Err(err) => Err(io::Error::new(err.kind(), err.to_string())),
        });
    }
}

/// Whether `path` is on a filesystem that lives in memory (tmpfs, ramfs), where a flush
/// does nothing a crash could tell apart.
fn on_memory_fs(path: &Path) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::ffi::OsStrExt;
        const TMPFS_MAGIC: i64 = 0x0102_1994;
        const RAMFS_MAGIC: i64 = 0x8584_58f6;
        let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
            return false;
        };
        let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: a valid NUL-terminated path and a zeroed out-parameter of the right type.
        if unsafe { libc::statfs(c_path.as_ptr(), &mut stat) } != 0 {
            return false;
        }
        let kind = stat.f_type as i64;
        kind == TMPFS_MAGIC || kind == RAMFS_MAGIC
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder on the disk the build is on (`/tmp` may be a tmpfs).
    fn scratch() -> tempfile::TempDir {
        let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
        std::fs::create_dir_all(&target).expect("target");
        tempfile::tempdir_in(target).expect("dir")
    }

    fn file_in(dir: &Path, name: &str) -> (PathBuf, Arc<Mutex<File>>) {
        let path = dir.join(name);
        let file = File::create(&path).expect("create");
        (path, Arc::new(Mutex::new(file)))
    }

    #[test]
    fn a_memory_filesystem_needs_no_flush_and_a_disk_does() {
        if Path::new("/dev/shm").is_dir() {
            assert!(on_memory_fs(Path::new("/dev/shm")));
        }
        let dir = scratch();
        // The repository is on a disk here; where it is not, there is nothing to check.
        if !on_memory_fs(dir.path()) {
            let flusher = Flusher::new(dir.path());
            let (path, file) = file_in(dir.path(), "a");
            flusher.flush_blocking(&path, file).expect("flush");
            assert_eq!(flusher.stats().syncs, 1);
        }
    }

    #[test]
    fn requests_waiting_for_a_file_share_its_next_flush() {
        let dir = scratch();
        if on_memory_fs(dir.path()) {
            return;
        }
        let flusher = Flusher::new(dir.path());
        let (a, file_a) = file_in(dir.path(), "a");
        let (b, file_b) = file_in(dir.path(), "b");
        // Hold both files' locks so their first flushes block while the others queue up.
        let guard = file_a.lock().unwrap();
        let guard_b = file_b.lock().unwrap();
        let first = flusher.request(&a, file_a.clone());
        let mut later = Vec::new();
        for _ in 0..10 {
            later.push(flusher.request(&a, file_a.clone()));
            later.push(flusher.request(&b, file_b.clone()));
        }
        drop(guard);
        drop(guard_b);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            first.wait().await.expect("first");
            for ticket in later {
                ticket.wait().await.expect("later");
            }
        });
        let stats = flusher.stats();
        assert_eq!(stats.requests, 21);
        // Each file's first flush cannot end before its lock is released, by when every
        // later request for it waits: they share one more flush. 21 requests, at most
        // 2 + 2 fdatasyncs.
        assert!(stats.syncs <= 4, "{stats:?}");
    }

    #[tokio::test]
    async fn an_async_ticket_is_answered_after_the_flush() {
        let dir = scratch();
        let flusher = Flusher::new(dir.path());
        let (path, file) = file_in(dir.path(), "a");
        flusher.request(&path, file).wait().await.expect("flush");
        if flusher.needed {
            assert_eq!(flusher.stats().syncs, 1);
        }
    }
}
