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
