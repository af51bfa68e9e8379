//! One process owns a data folder (SPEC §12.7): an exclusive lock taken at start, so recovery only ever touches sessions no live process runs.
//!
//! Why a lock and not per-session care: recovery treats every session found "running" as
//! cut off by a crash. A second process on the same folder (a second window, `bumblehive
//! run` beside the desktop) would "recover" the first one's live runs: answer a call that
//! is still waiting for an approval with "Interrupted", pause the session, and leave two
//! results for one call (runtime review R7).
//!
//! The lock is a POSIX record lock (`fcntl(F_SETLK)`), not `flock`: it belongs to the
//! process, so no child (a command forked but not yet exec'd when the app is killed) ever
//! holds it, and the kernel drops it the moment the process dies. Such a lock does not
//! exclude the process itself, so owners within this process are kept in a set as well.
//!
//! A later start need not stop at the refusal: the owner listens on a socket in the data
//! folder (`listen`), and a later desktop start hands its request over (`hand_off`): the
//! running window comes forward and opens what the later start was asked to open, as
//! Claude Desktop, Codex and Zed do. A socket in the folder rather than a session-bus name
//! (tauri-plugin-single-instance): it needs no D-Bus (absent under plain Xvfb, in CI, over
//! ssh), and it is keyed by the data folder, so two folders still run side by side.

use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::protocol::{OwnerReply, OwnerRequest, OwnerRun};

/// The data folders this process owns (a record lock does not exclude its own process).
static OWNED: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

/// The lock file's name inside the data folder; it holds the owner's pid.
pub const LOCK_FILE: &str = "owner.lock";

/// The owner's socket inside the data folder (private, like the folder itself).
pub const SOCKET_FILE: &str = "owner.sock";

/// How long either side waits for the other's line: a handler only shows a window.
const HANDOFF_TIMEOUT: Duration = Duration::from_secs(5);
/// A request is a path and a pid; anything longer is not one of ours.
const MAX_REQUEST: u64 = 64 * 1024;

/// What the owner does with a later start's request (the desktop: show its window, open
/// the workspace). Called on an async worker; it must not block.
pub type HandoffHandler = Arc<dyn Fn(OwnerRequest) -> OwnerReply + Send + Sync>;

/// A handed-over `bumblehive run`'s connection, past its request line.
#[cfg(unix)]
pub struct RunConnection {
    pub reader: tokio::io::BufReader<tokio::net::unix::OwnedReadHalf>,
    pub writer: tokio::net::unix::OwnedWriteHalf,
}

/// What the owner does with a handed-over `bumblehive run` ([`crate::owner_run::handler`]):
/// serves the run on its connection until it ends.
#[cfg(unix)]
pub type RunHandler =
    Arc<dyn Fn(OwnerRun, RunConnection) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// Why a request could not be handed to the owner.
#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    #[error("the owner of {folder} does not take requests ({source})")]
    Unreachable {
        folder: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the owner of {folder} did not answer: {reason}")]
    NoAnswer { folder: String, reason: String },
}

/// Why the data folder could not be owned.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    #[error(
        "the data folder {folder} is in use by another Bumblehive process (pid {pid}); close that one first, or start this one with another --data-dir"
    )]
    InUse { folder: String, pid: String },
    #[error("cannot lock the data folder {folder}: {source}")]
    Io {
        folder: String,
        #[source]
        source: std::io::Error,
    },
}

/// The held lock; dropping it lets the folder go.
#[derive(Debug)]
pub struct DataLock {
    _file: File,
    path: PathBuf,
    /// The folder as `OWNED` names it.
    key: PathBuf,
}

fn owned() -> std::sync::MutexGuard<'static, Option<HashSet<PathBuf>>> {
    OWNED.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for DataLock {
    fn drop(&mut self) {
        if let Some(set) = owned().as_mut() {
            set.remove(&self.key);
        }
    }
}

impl DataLock {
    /// Makes the folder (private) if it is missing, then takes it.
    pub fn take(data_dir: &Path) -> Result<DataLock, crate::error::RuntimeError> {
        crate::fsutil::private_dir(data_dir)
            .map_err(|err| crate::error::StoreError::io(data_dir, err))?;
        Ok(DataLock::acquire(data_dir)?)
    }

    /// Takes the folder, or says who has it. Never waits.
    pub fn acquire(data_dir: &Path) -> Result<DataLock, OwnerError> {
        let folder = data_dir.display().to_string();
        let io = |source| OwnerError::Io {
            folder: folder.clone(),
            source,
        };
        let key = std::fs::canonicalize(data_dir).map_err(io)?;
        let mut set = owned();
        if set.as_ref().is_some_and(|set| set.contains(&key)) {
            return Err(OwnerError::InUse {
                folder,
                pid: std::process::id().to_string(),
            });
        }
        let path = data_dir.join(LOCK_FILE);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        if !try_lock(&file).map_err(io)? {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            let pid = pid.trim();
            return Err(OwnerError::InUse {
                folder,
                pid: if pid.is_empty() {
                    "unknown".into()
                } else {
                    pid.to_string()
                },
            });
        }
        // The owner's pid, for the next process's words (the lock itself is what counts).
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        file.write_all(format!("{}\n", std::process::id()).as_bytes())
            .map_err(io)?;
        set.get_or_insert_with(HashSet::new).insert(key.clone());
        Ok(DataLock {
            _file: file,
            path,
            key,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Takes later starts' requests on the data folder's socket until `stop`. Only the
/// folder's owner calls this (the process whose service holds the lock), so a socket file
/// found there was left by an owner that died and is replaced.
#[cfg(unix)]
pub fn listen(
    data_dir: &Path,
    handler: HandoffHandler,
    stop: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    listen_with_runs(data_dir, handler, None, stop)
}

/// [`listen`], and later `bumblehive run`s are run here when `runs` is given.
#[cfg(unix)]
pub fn listen_with_runs(
    data_dir: &Path,
    handler: HandoffHandler,
    runs: Option<RunHandler>,
    stop: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use std::os::unix::fs::PermissionsExt;
    let path = data_dir.join(SOCKET_FILE);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(err),
    }
    let listener = tokio::net::UnixListener::bind(&path)?;
    // The folder is private already; the socket is too, whatever the umask says.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                _ = stop.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(err) => {
                        tracing::warn!("the owner's socket stopped taking requests: {err}");
                        break;
                    }
                },
            };
            let handler = handler.clone();
            let runs = runs.clone();
            tokio::spawn(async move {
                if let Err(err) = serve_one(stream, handler, runs).await {
                    tracing::warn!("a later start's request failed: {err}");
                }
            });
        }
        // A socket nobody answers would make the next start wait for its timeout.
        let _ = std::fs::remove_file(&path);
    }))
}

/// One request line in, one reply line out, each within the timeout; a run's request
/// goes to `runs` with its connection.
#[cfg(unix)]
async fn serve_one(
    stream: tokio::net::UnixStream,
    handler: HandoffHandler,
    runs: Option<RunHandler>,
) -> std::io::Result<()> {
    use tokio::io::AsyncReadExt;
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = tokio::io::BufReader::new(read);
    tokio::time::timeout(
        HANDOFF_TIMEOUT,
        (&mut reader).take(MAX_REQUEST).read_line(&mut line),
    )
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no request"))??;
    let reply = match serde_json::from_str::<OwnerRequest>(&line) {
        Ok(OwnerRequest {
            run: Some(run),
            pid,
            ..
        }) => {
            tracing::info!(pid, workspace = %run.workspace, "a later `bumblehive run` handed over its prompt");
            let Some(runs) = runs else {
                let refused = crate::protocol::OwnerRunLine::Refused {
                    message: "the process that owns the data folder does not take runs".into(),
                };
                let mut bytes = serde_json::to_vec(&refused).map_err(std::io::Error::other)?;
                bytes.push(b'\n');
                return write.write_all(&bytes).await;
            };
            runs(
                run,
                RunConnection {
                    reader,
                    writer: write,
                },
            )
            .await;
            return Ok(());
        }
        Ok(request) => {
            tracing::info!(pid = request.pid, workspace = ?request.workspace, "a later start handed over its request");
            handler(request)
        }
        Err(err) => OwnerReply {
            ok: false,
            message: format!("not a request: {err}"),
        },
    };
    let mut bytes = serde_json::to_vec(&reply).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    tokio::time::timeout(HANDOFF_TIMEOUT, write.write_all(&bytes))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "reply not taken"))?
}

/// Hands a request to the data folder's owner and waits for its answer (a later start,
/// before it has any runtime of its own: plain blocking I/O with timeouts).
#[cfg(unix)]
pub fn hand_off(data_dir: &Path, request: &OwnerRequest) -> Result<OwnerReply, HandoffError> {
    use std::io::BufRead;
    use std::os::unix::net::UnixStream;
    let folder = data_dir.display().to_string();
    let unreachable = |source| HandoffError::Unreachable {
        folder: folder.clone(),
        source,
    };
    let stream = UnixStream::connect(data_dir.join(SOCKET_FILE)).map_err(unreachable)?;
    let no_answer = |reason: String| HandoffError::NoAnswer {
        folder: folder.clone(),
        reason,
    };
    stream
        .set_read_timeout(Some(HANDOFF_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(HANDOFF_TIMEOUT)))
        .map_err(|err| no_answer(err.to_string()))?;
    let mut line = serde_json::to_vec(request).map_err(|err| no_answer(err.to_string()))?;
    line.push(b'\n');
    (&stream)
        .write_all(&line)
        .map_err(|err| no_answer(err.to_string()))?;
    let mut answer = String::new();
    std::io::BufReader::new((&stream).take(MAX_REQUEST))
        .read_line(&mut answer)
        .map_err(|err| no_answer(err.to_string()))?;
    serde_json::from_str(&answer).map_err(|err| no_answer(format!("{err}: {answer:?}")))
}

#[cfg(not(unix))]
pub fn listen(
    _data_dir: &Path,
    _handler: HandoffHandler,
    _stop: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    Err(std::io::Error::other("no owner socket on this platform"))
}

#[cfg(not(unix))]
pub fn hand_off(data_dir: &Path, _request: &OwnerRequest) -> Result<OwnerReply, HandoffError> {
    Err(HandoffError::Unreachable {
        folder: data_dir.display().to_string(),
        source: std::io::Error::other("no owner socket on this platform"),
    })
}

#[cfg(unix)]
fn try_lock(file: &File) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed `flock` is a valid value of this plain C struct; the fields set
    // below describe a write lock over the whole file.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as _;
    lock.l_whence = libc::SEEK_SET as _;
    lock.l_start = 0;
    lock.l_len = 0;
    // SAFETY: fcntl on a descriptor we own, with a pointer to a live `flock`.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &lock) };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    if matches!(err.raw_os_error(), Some(libc::EACCES | libc::EAGAIN)) {
        Ok(false)
    } else {
        Err(err)
    }
}

#[cfg(not(unix))]
fn try_lock(_file: &File) -> std::io::Result<bool> {
    // No advisory lock here yet: every start owns the folder (as before this lock).
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_names_the_owner_and_a_dropped_one_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataLock::acquire(dir.path()).unwrap();
        let second = DataLock::acquire(dir.path());
        let err = second.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains(&std::process::id().to_string()), "{err}");
        drop(first);
        assert!(DataLock::acquire(dir.path()).is_ok());
    }

    fn request(workspace: Option<&str>) -> OwnerRequest {
        OwnerRequest {
            workspace: workspace.map(str::to_string),
            pid: 4242,
            run: None,
        }
    }

    /// A later start's request reaches the owner's handler and its answer comes back;
    /// after the owner stops listening, a later start is told the owner is unreachable
    /// (and so falls back to the refusal) instead of waiting.
    #[tokio::test]
    async fn a_later_start_hands_its_request_to_the_owner() {
        let dir = tempfile::tempdir().unwrap();
        let _lock = DataLock::acquire(dir.path()).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handler: HandoffHandler = {
            let seen = seen.clone();
            Arc::new(move |request: OwnerRequest| {
                seen.lock().unwrap().push(request.clone());
                OwnerReply {
                    ok: true,
                    message: format!("opened {:?}", request.workspace),
                }
            })
        };
        let stop = CancellationToken::new();
        // A socket left by an owner that died is replaced, not an error.
        std::fs::write(dir.path().join(SOCKET_FILE), b"stale").unwrap();
        let listening = listen(dir.path(), handler, stop.clone()).unwrap();
        let folder = dir.path().to_path_buf();
        let reply = tokio::task::spawn_blocking(move || hand_off(&folder, &request(Some("/w"))))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            reply,
            OwnerReply {
                ok: true,
                message: "opened Some(\"/w\")".into()
            }
        );
        assert_eq!(*seen.lock().unwrap(), vec![request(Some("/w"))]);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(SOCKET_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);

        stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), listening)
            .await
            .expect("the listener did not stop")
            .unwrap();
        assert!(
            !dir.path().join(SOCKET_FILE).exists(),
            "the socket outlived its listener"
        );
        let folder = dir.path().to_path_buf();
        let err = tokio::task::spawn_blocking(move || hand_off(&folder, &request(None)))
            .await
            .unwrap()
            .unwrap_err();
        assert!(matches!(err, HandoffError::Unreachable { .. }), "{err}");
    }

    /// Garbage on the socket gets an answer saying so, and the owner goes on taking
    /// requests.
    #[tokio::test]
    async fn garbage_on_the_owners_socket_is_answered_and_harmless() {
        let dir = tempfile::tempdir().unwrap();
        let stop = CancellationToken::new();
        let handler: HandoffHandler = Arc::new(|_| OwnerReply {
            ok: true,
            message: "shown".into(),
        });
        listen(dir.path(), handler, stop.clone()).unwrap();
        let socket = dir.path().join(SOCKET_FILE);
        let answer = tokio::task::spawn_blocking(move || {
            use std::io::BufRead;
            let mut stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
            stream.write_all(b"{not json\n").unwrap();
            let mut line = String::new();
            std::io::BufReader::new(&stream)
                .read_line(&mut line)
                .unwrap();
            line
        })
        .await
        .unwrap();
        let reply: OwnerReply = serde_json::from_str(&answer).unwrap();
        assert!(
            !reply.ok && reply.message.starts_with("not a request"),
            "{answer}"
        );
        let folder = dir.path().to_path_buf();
        let reply = tokio::task::spawn_blocking(move || hand_off(&folder, &request(None)))
            .await
            .unwrap()
            .unwrap();
        assert!(reply.ok);
        stop.cancel();
    }
}
