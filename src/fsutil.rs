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
