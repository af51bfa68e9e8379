//! Files written safely, shared by every module that writes one (the store, the config, the session index, MCP trust): atomic replacement, and files and folders readable by their owner only.
//!
//! A leaf: it depends on nothing in the crate, so that modules low in the graph can
//! write files without depending on the store.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;

/// Writes a file so that readers see either the old or the new content, never half.
/// `durable` also flushes it to the disk first (survives power loss, costs milliseconds);
/// without it the rename alone survives a killed process.
///
/// The folder must exist: a late write for a deleted session must not bring its folder
/// back (runtime review C9). The file is created readable by its owner only.
pub fn write_atomic(path: &Path, bytes: &[u8], durable: bool) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()));
    let mut file = private_file(&tmp)?;
    let written = file
        .write_all(bytes)
        .and_then(|()| if durable { file.sync_all() } else { Ok(()) });
    if let Err(err) = written.and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(err);
    }
    Ok(())
}

/// Replaces a small JSON file's content in place, without making a new inode: one
/// positioned write of the new bytes padded with spaces to the old length (JSON readers
/// skip trailing whitespace), then a truncation when the file is much longer than the
/// content. Each replacement through a temporary file made a new inode, and ext4's inode
/// allocator was about a quarter of the CPU of a 1,000-child fan-out on disk (issue 31).
///
/// A killed process leaves the old content or the new, never a mix: a `pwrite` of a few
/// KiB to a regular file is done whole or not at all when the process dies, and a kill
/// between the write and the truncation leaves only padding. Like `write_atomic` without
/// `durable`, nothing is flushed. The caller serialises writers of the same file (the
/// padding length is read before the write). A file that does not exist yet is made with
/// `write_atomic`, so it never appears empty. Returns whether it was written in place.
pub fn write_in_place(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    match OpenOptions::new().write(true).open(path) {
        Ok(file) => overwrite(&file, bytes).map(|()| true),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            write_atomic(path, bytes, false)?;
            Ok(false)
        }
        Err(err) => Err(err),
    }
}

/// [`write_in_place`] for a file that need not exist: a missing one is left missing
/// (returns false), for content a missing file already stands for (an empty queue).
pub fn rewrite_if_present(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    match OpenOptions::new().write(true).open(path) {
        Ok(file) => overwrite(&file, bytes).map(|()| true),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(err) => Err(err),
    }
}

/// The in-place write of [`write_in_place`]: the new bytes padded to the old length.
fn overwrite(file: &File, bytes: &[u8]) -> std::io::Result<()> {
    let old = file.metadata()?.len();
    let mut padded;
    let content = if (bytes.len() as u64) < old {
        padded = Vec::with_capacity(old as usize);
        padded.extend_from_slice(bytes);
        padded.resize(old as usize, b' ');
        &padded[..]
    } else {
        bytes
    };
    write_all_at(file, content)?;
    // Shrinking frees blocks (an inode change, but no new inode); rare: only when the
    // padding would be most of the file.
    if old > 2 * bytes.len() as u64 + 4096 {
        file.set_len(bytes.len() as u64)?;
    }
    Ok(())
}

#[cfg(unix)]
fn write_all_at(file: &File, bytes: &[u8]) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, bytes, 0)
}

#[cfg(not(unix))]
fn write_all_at(mut file: &File, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom};
    file.seek(SeekFrom::Start(0))?;
    file.write_all(bytes)
}

/// Creates a new file readable and writable by its owner only (histories, metas and the
/// config hold what the person wrote).
pub(crate) fn private_file(path: &Path) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

/// Creates a folder (and its parents) readable by its owner only.
pub fn private_dir(path: &Path) -> std::io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(path)
}

/// A process killed between two writes of one data folder, for the randomized
/// interleaving test: once armed with `kill_after(n, stall)`, `n` more writes pass, the
/// next one stalls for `stall` (its thread descheduled; the others' writes go on
/// meanwhile) and is then refused with every later one, so the disk keeps exactly what a
/// process killed at the end of the stall would have left (the page cache keeps what was
/// written; nothing after it lands). The test then drops the service and recovers a new
/// one from the folder. A crash that stops the runtime at its next await can only land
/// between two awaits; this one lands between any two writes, wherever no await
/// separates them, and the stall holds a window between two writes open while the
/// person's next steps run (issue 25's simulation).
///
/// Unarmed, a write pays one atomic load.
#[derive(Debug, Default)]
pub struct WriteGate {
    /// Whether a plan is armed or has killed: the only thing an unarmed write reads.
    on: std::sync::atomic::AtomicBool,
    plan: std::sync::Mutex<Plan>,
    /// Signalled when a stall ends in the kill.
    settled: std::sync::Condvar,
}

#[derive(Debug, Default, Clone, Copy, PartialEq)]
enum Plan {
    #[default]
    Off,
    /// `writes` more writes pass; the next one stalls for `stall`, then kills.
    After {
        writes: u64,
        stall: std::time::Duration,
    },
    /// A write is stalled: the kill comes at its end; the others' writes pass until then.
    Stalling,
    Killed,
}

impl WriteGate {
    /// Asks to write: an error once the simulated kill has happened.
    pub fn pass(&self) -> std::io::Result<()> {
        if !self.on.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        let mut plan = self.plan();
        match *plan {
            Plan::Off | Plan::Stalling => Ok(()),
            Plan::Killed => Err(killed()),
            Plan::After { writes: 0, stall } => {
                if !stall.is_zero() {
                    *plan = Plan::Stalling;
                    drop(plan);
                    std::thread::sleep(stall);
                    plan = self.plan();
                }
                *plan = Plan::Killed;
                self.settled.notify_all();
                Err(killed())
            }
            Plan::After { writes, stall } => {
                *plan = Plan::After {
                    writes: writes - 1,
                    stall,
                };
                Ok(())
            }
        }
    }

    /// Lets `writes` more writes pass, stalls the next one for `stall`, then kills. A kill
    /// that has happened stays: arming again over it let the writes after it pass, and a
    /// write it had refused was never recovered from (the simulation, seed 360085: a stop
    /// whose meta write the kill refused left the session "running" on disk).
    pub fn kill_after(&self, writes: u64, stall: std::time::Duration) {
        let mut plan = self.plan();
        if *plan == Plan::Killed {
            return;
        }
        *plan = Plan::After { writes, stall };
        self.on.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Kills now: every later write fails.
    pub fn kill(&self) {
        *self.plan() = Plan::Killed;
        self.on.store(true, std::sync::atomic::Ordering::Release);
        self.settled.notify_all();
    }

    /// Takes an armed kill back; false if it has happened (it stays), after waiting for a
    /// stalled write's kill to happen.
    pub fn disarm(&self) -> bool {
        let mut plan = self.plan();
        while *plan == Plan::Stalling {
            plan = self
                .settled
                .wait(plan)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        if *plan == Plan::Killed {
            return false;
        }
        *plan = Plan::Off;
        self.on.store(false, std::sync::atomic::Ordering::Release);
        true
    }

    /// Whether the simulated kill has happened.
    pub fn killed(&self) -> bool {
        *self.plan() == Plan::Killed
    }

    /// Whether a kill is armed (or a write stalled before it) and has not happened yet.
    pub fn armed(&self) -> bool {
        matches!(*self.plan(), Plan::After { .. } | Plan::Stalling)
    }

    fn plan(&self) -> std::sync::MutexGuard<'_, Plan> {
        self.plan
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn killed() -> std::io::Error {
    std::io::Error::other("the process was killed here (a simulated kill)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_gate_lets_n_writes_pass_then_refuses_every_later_one() {
        let gate = WriteGate::default();
        assert!(gate.pass().is_ok(), "unarmed, every write passes");
        gate.kill_after(2, std::time::Duration::ZERO);
        assert!(gate.armed() && !gate.killed());
        assert!(gate.pass().is_ok());
        assert!(gate.pass().is_ok());
        assert!(gate.pass().is_err(), "the third write is the kill");
        assert!(gate.killed() && !gate.armed());
        assert!(gate.pass().is_err(), "nothing lands after the kill");
        assert!(!gate.disarm(), "a kill that happened stays");
        assert!(gate.killed());
        // Armed again (a kill the arming did not see happen): the kill stays, so the
        // writes it refused are recovered from, not followed by writes that land.
        gate.kill_after(3, std::time::Duration::ZERO);
        assert!(gate.killed(), "a kill that happened stays when armed again");
        assert!(gate.pass().is_err(), "nothing lands after the kill");

        let gate = WriteGate::default();
        gate.kill_after(5, std::time::Duration::ZERO);
        assert!(gate.pass().is_ok());
        assert!(gate.disarm(), "taken back before it happened");
        assert!(!gate.armed() && !gate.killed());
        for _ in 0..10 {
            assert!(gate.pass().is_ok());
        }
    }

    /// A stalled write holds the kill back while other writes pass; it is refused at its
    /// end, and a disarm waits for that end (the kill stays).
    #[test]
    fn a_stalled_write_is_killed_at_its_end_and_others_pass_meanwhile() {
        let gate = std::sync::Arc::new(WriteGate::default());
        gate.kill_after(1, std::time::Duration::from_millis(50));
        assert!(gate.pass().is_ok());
        let stalled = std::thread::spawn({
            let gate = gate.clone();
            move || gate.pass()
        });
        // The stalled writer holds no lock: the others' writes pass while it sleeps.
        while *gate.plan() != Plan::Stalling {
            std::thread::yield_now();
        }
        assert!(gate.pass().is_ok(), "a write during the stall lands");
        assert!(!gate.disarm(), "the stall ends in the kill");
        assert!(gate.killed());
        assert!(
            stalled.join().unwrap().is_err(),
            "the stalled write is refused"
        );
        assert!(gate.pass().is_err());
    }
}
