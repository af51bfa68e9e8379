//! Project instructions: `AGENTS.md` (else `CLAUDE.md`) from the workspace's root down to the workspace, and the user-level `<config dir>/bumblehive/AGENTS.md`, under one size cap; a file that is missing or unreadable is a notice, never an error.

use std::path::{Path, PathBuf};

use serde::Serialize;
use ts_rs::TS;

use crate::workspace::Place;

/// The most instruction text a prompt carries; the rest is cut with a notice, so a huge
/// file cannot crowd the conversation out of the window.
pub const INSTRUCTIONS_CAP: usize = 32 * 1024;

/// The file read in each folder, and the one read where a folder has none.
pub const PRIMARY: &str = "AGENTS.md";
pub const FALLBACK: &str = "CLAUDE.md";

pub use crate::protocol::InstructionFile;

/// The instructions of a session: the files loaded, their text as the prompt carries it,
/// and notices about files that could not be read or were cut.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, TS)]
#[ts(export)]
pub struct Instructions {
    pub files: Vec<InstructionFile>,
    pub text: String,
    pub notices: Vec<String>,
}

impl Instructions {
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }
}

/// `<config dir>/bumblehive`, the folder of the user-level `AGENTS.md` (next to the default
/// config file). Callers with another config file may pass its folder instead.
pub fn default_user_dir() -> Option<PathBuf> {
    dirs::config_dir().map(|dir| dir.join("bumblehive"))
}

/// Loads the instructions for `workspace`, with `root_hint` as its project root when the
/// workspace is inside it ([`Place::find_within`]); [`load_at`] does the reading.
pub fn load(workspace: &Path, root_hint: Option<&Path>, user_dir: Option<&Path>) -> Instructions {
    load_at(&Place::find_within(workspace, root_hint), user_dir)
}

/// Loads the instructions of a workspace found at `place`. Order, general to specific
/// (later text wins where they disagree): the user-level file, then one file per folder
/// from the project root down to the workspace, `AGENTS.md` where there is one, else
/// `CLAUDE.md`. The total is capped at [`INSTRUCTIONS_CAP`]: the file that crosses it is
/// cut with a notice in the text and the ones after it are left out (each with a notice).
pub fn load_at(place: &Place, user_dir: Option<&Path>) -> Instructions {
    let mut notices: Vec<String> = place.unresolved.iter().cloned().collect();
    let root = &place.root;
    let folders = place.folders();

    // Each candidate with the folder it must stay in: the project's files may not lead
    // out of the project through a symlink (the outside file would go to the provider
    // unasked); the user's own file is the person's, wherever it leads.
    let mut candidates: Vec<(PathBuf, Option<&Path>)> = Vec::new();
    if let Some(user_dir) = user_dir {
        // The user file has no fallback: CLAUDE.md in a config folder is another tool's.
        let path = user_dir.join(PRIMARY);
        if let Some(found) = present(&path, &mut notices) {
            candidates.push((found, None));
        }
    }
    for folder in &folders {
        let primary = folder.join(PRIMARY);
        match present(&primary, &mut notices) {
            Some(found) if readable(&found, root, &mut notices) => {
                candidates.push((found, Some(root)))
            }
            _ => {
                let fallback = folder.join(FALLBACK);
                if let Some(found) = present(&fallback, &mut notices) {
                    candidates.push((found, Some(root)));
                }
            }
        }
    }

    // A user folder inside the project would otherwise be read twice.
    let mut seen = std::collections::HashSet::new();
    candidates.retain(|(path, _)| {
        seen.insert(std::fs::canonicalize(path).unwrap_or_else(|_| path.clone()))
    });

    let mut instructions = Instructions {
        notices,
        ..Instructions::default()
    };
    let mut room = INSTRUCTIONS_CAP;
    for (path, inside) in candidates {
        let read = match inside {
            Some(root) => crate::tools::paths::open_inside(&path, root).and_then(|mut file| {
                use std::io::Read;
                let mut bytes = Vec::new();
                file.read_to_end(&mut bytes)
                    .map(|_| bytes)
                    .map_err(|err| err.to_string())
            }),
            None => std::fs::read(&path).map_err(|err| err.to_string()),
        };
        let bytes = match read {
            Ok(bytes) => bytes,
            Err(err) => {
                instructions
                    .notices
                    .push(format!("cannot read {}: {err}", path.display()));
                continue;
            }
        };
        let size = bytes.len() as u64;
        let text = String::from_utf8_lossy(&bytes);
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        if room == 0 {
            instructions.notices.push(format!(
                "{} was left out: the instructions are capped at {} KiB",
                path.display(),
                INSTRUCTIONS_CAP / 1024
            ));
            continue;
        }
        let header = format!("Instructions from {}:\n", path.display());
        let budget = room.saturating_sub(header.len());
        let (body, truncated) = if text.len() > budget {
            let mut end = budget;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            (&text[..end], true)
        } else {
            (text, false)
        };
        if !instructions.text.is_empty() {
            instructions.text.push_str("\n\n");
        }
        instructions.text.push_str(&header);
        instructions.text.push_str(body);
        if truncated {
            let notice = format!(
                "{} was cut at {} bytes: the instructions are capped at {} KiB",
                path.display(),
                body.len(),
                INSTRUCTIONS_CAP / 1024
            );
            instructions.text.push_str(&format!("\n[… {notice}]"));
            instructions.notices.push(notice);
        }
        room = room.saturating_sub(header.len() + body.len());
        if truncated {
            room = 0;
        }
        instructions.files.push(InstructionFile {
            path: path.display().to_string(),
            bytes: size,
            tokens_estimate: (body.len() as u64).div_ceil(4),
            truncated,
        });
    }
    instructions
}

/// The path when something is there (a file, a directory, a link even if broken); a
/// missing file is the common case and says nothing.
fn present(path: &Path, notices: &mut Vec<String>) -> Option<PathBuf> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => Some(path.to_path_buf()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
        Err(err) => {
            notices.push(format!("cannot read {}: {err}", path.display()));
            None
        }
    }
}

/// Whether a present file can be read as a file inside `root`; says why not (a
/// directory, a broken link, no permission, a link out of the project), so the folder's
/// `CLAUDE.md` is read instead.
fn readable(path: &Path, root: &Path, notices: &mut Vec<String>) -> bool {
    let problem = match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => match crate::tools::paths::open_inside(path, root) {
            Ok(_) => return true,
            Err(err) => err,
        },
        Ok(_) => "not a file".to_string(),
        Err(err) => err.to_string(),
    };
    notices.push(format!("cannot read {}: {problem}", path.display()));
    false
}
