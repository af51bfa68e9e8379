//! Group commit: one flusher thread makes the store's files durable for every writer
//! waiting at that moment, so 64 sessions ending a step together cost one round of
//! `fdatasync`s instead of 64 threads each waiting its turn for the journal.
//!
//! Why a thread of its own and not `spawn_blocking` per flush: a flush blocks for the
//! disk's latency (0.15–3.5 ms here), and while one round runs, new requests queue up
//! and are all answered by the next round. The requests of one round are grouped by
//! file (a session that asked twice is flushed once) and flushed in arrival order.
//! On ext4 (data=ordered), the first `fdatasync` of a round commits the journal
//! transaction that holds every other appended file's size too, so the rest of the
//! round is cheap; this is what makes it a group commit without `syncfs`, which would
//! also write back whatever else is dirty on the filesystem (a build in the workspace).
//!
//! A store on tmpfs or ramfs has nothing to make durable: requests are answered at
//! once, without the thread hop.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

/// A file to flush and whom to tell.
struct Request {
    path: PathBuf,
    file: Arc<Mutex<File>>,
    reply: Reply,
}

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

/// How many requests and rounds the flusher has served (for tests and benchmarks).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FlushStats {
    pub requests: u64,
    pub rounds: u64,
    pub syncs: u64,
}

/// The store's flusher. Its thread starts at the first request that needs it and ends
/// when the flusher is dropped (the channel closes).
pub struct Flusher {
    /// Whether flushing does anything on this filesystem.
    needed: bool,
    tx: Mutex<Option<mpsc::Sender<Request>>>,
    stats: Arc<Mutex<FlushStats>>,
}

impl Flusher {
    /// A flusher for files under `root` (its filesystem decides whether one is needed).
    pub fn new(root: &Path) -> Self {
        Flusher {
            needed: !on_memory_fs(root),
            tx: Mutex::new(None),
            stats: Arc::default(),
        }
    }

    pub fn stats(&self) -> FlushStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks for `file` (at `path`, which also identifies it within a round) to be made
    /// durable; the ticket is answered after a flush that started after this call.
    pub fn request(&self, path: &Path, file: Arc<Mutex<File>>) -> FlushTicket {
        if !self.needed {
            return FlushTicket::Done;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(path, file, Reply::Async(tx));
        FlushTicket::Pending(rx)
    }

    /// The same, blocking this thread until it is done (any thread, async or not: it
    /// waits on a std channel, never on the runtime).
    pub fn flush_blocking(&self, path: &Path, file: Arc<Mutex<File>>) -> io::Result<()> {
        if !self.needed {
            return Ok(());
        }
        let (tx, rx) = mpsc::channel();
        self.send(path, file, Reply::Blocking(tx));
        rx.recv().unwrap_or_else(|_| Err(gone()))
    }

    /// Several files at once, blocking until all are done: they share the flusher's
    /// rounds. The first error, with its file, if any.
    pub fn flush_all_blocking(
        &self,
        files: Vec<(PathBuf, Arc<Mutex<File>>)>,
    ) -> Result<(), (PathBuf, io::Error)> {
        if !self.needed {
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
        let request = Request {
            path: path.to_path_buf(),
            file,
            reply,
        };
        let mut tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let request = match tx.as_ref() {
            Some(sender) => match sender.send(request) {
                Ok(()) => return,
                Err(mpsc::SendError(request)) => request,
            },
            None => request,
        };
        // No thread yet (or it died): start one. If the OS refuses a thread, flush here.
        let (new_tx, rx) = mpsc::channel();
        let stats = self.stats.clone();
        match std::thread::Builder::new()
            .name("bumblehive-flush".into())
            .spawn(move || flusher(rx, stats))
        {
            Ok(_) => {
                let _ = new_tx.send(request);
                *tx = Some(new_tx);
            }
            Err(err) => {
                tracing::warn!("cannot start the flusher thread ({err}); flushing inline");
                let result = request
                    .file
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .sync_data();
                request.reply.send(result);
            }
        }
    }
}

/// The flusher's loop: take every request waiting now, flush each file once, answer all.
fn flusher(rx: mpsc::Receiver<Request>, stats: Arc<Mutex<FlushStats>>) {
    while let Ok(first) = rx.recv() {
        let mut round = vec![first];
        round.extend(rx.try_iter());
        // Files in arrival order, each once; every request waits for its file's result.
        let mut order: Vec<(PathBuf, Arc<Mutex<File>>)> = Vec::new();
        let mut waiting: HashMap<PathBuf, Vec<Reply>> = HashMap::new();
        let requests = round.len() as u64;
        for request in round {
            let replies = waiting.entry(request.path.clone()).or_default();
            if replies.is_empty() {
                order.push((request.path, request.file));
            }
            replies.push(request.reply);
        }
        let syncs = order.len() as u64;
        let results = sync_parallel(order);
        // Counted before anyone is answered, so a waiter that looks sees its round.
        {
            let mut stats = stats.lock().unwrap_or_else(|p| p.into_inner());
            stats.requests += requests;
            stats.rounds += 1;
            stats.syncs += syncs;
        }
        for (path, result) in results {
            if let Err(err) = &result {
                tracing::warn!("cannot flush {}: {err}", path.display());
            }
            for reply in waiting.remove(&path).unwrap_or_default() {
                reply.send(match &result {
                    Ok(()) => Ok(()),
                    // io::Error is not Clone: each waiter gets the same kind and text.
                    Err(err) => Err(io::Error::new(err.kind(), err.to_string())),
                });
            }
        }
    }
}

/// At most this many `fdatasync`s of one round run at once.
const PARALLEL: usize = 16;

/// Flushes a round's files on up to [`PARALLEL`] threads at once: concurrent flushes on
/// one filesystem share the journal's commit and the device's cache flush, where one
/// after the other each pays for its own.
fn sync_parallel(order: Vec<(PathBuf, Arc<Mutex<File>>)>) -> Vec<(PathBuf, io::Result<()>)> {
    let sync = |(path, file): (PathBuf, Arc<Mutex<File>>)| {
        let result = file.lock().unwrap_or_else(|p| p.into_inner()).sync_data();
        (path, result)
    };
    if order.len() <= 1 {
        return order.into_iter().map(sync).collect();
    }
    let lanes = order.len().min(PARALLEL);
    let mut chunks: Vec<Vec<(PathBuf, Arc<Mutex<File>>)>> =
        (0..lanes).map(|_| Vec::new()).collect();
    for (index, item) in order.into_iter().enumerate() {
        chunks[index % lanes].push(item);
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| scope.spawn(move || chunk.into_iter().map(sync).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|handle| handle.join().unwrap_or_default())
            .collect()
    })
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
    fn waiting_requests_share_a_round_and_one_file_is_flushed_once_per_round() {
        let dir = scratch();
        if on_memory_fs(dir.path()) {
            return;
        }
        let flusher = Flusher::new(dir.path());
        let (a, file_a) = file_in(dir.path(), "a");
        let (b, file_b) = file_in(dir.path(), "b");
        // Hold a's lock so the first round blocks on it while the others queue up.
        let guard = file_a.lock().unwrap();
        let first = flusher.request(&a, file_a.clone());
        let mut later = Vec::new();
        for _ in 0..10 {
            later.push(flusher.request(&a, file_a.clone()));
            later.push(flusher.request(&b, file_b.clone()));
        }
        drop(guard);
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
        // The first round cannot end before the lock is released, by when every later
        // request waits: they are in it or make the second round. Each round flushes
        // each of its files once: 21 requests, at most 2 rounds and 2 + 2 syncs.
        assert!(stats.rounds <= 2, "{stats:?}");
        assert!(stats.syncs <= 4, "{stats:?}");
    }

    #[tokio::test]
    async fn an_async_ticket_is_answered_after_the_flush() {
        let dir = scratch();
        let flusher = Flusher::new(dir.path());
        let (path, file) = file_in(dir.path(), "a");
        flusher.request(&path, file).wait().await.expect("flush");
        if flusher.needed {
            assert_eq!(flusher.stats().rounds, 1);
        }
    }
}
