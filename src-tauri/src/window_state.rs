//! The window's size and position remembered across starts (E23): kept current as it moves and resizes, written shortly after it settles and at exit, restored onto a screen that is still there.
//!
//! Physical pixels throughout: the figures come back exactly on the same screens, and
//! a screen that went away (a laptop off its dock) is handled by [`place`], which puts
//! the window wholly on a screen that exists, never off every screen.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The file in the data folder (beside the UI's own remembered choices).
const FILE: &str = "window.json";

/// How long the window must rest before its geometry is written: a drag or a resize
/// sends dozens of events a second, and only where it ends matters.
const SETTLE: Duration = Duration::from_millis(400);

/// Where the window was and how big, in physical pixels (outer position, inner size).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Geometry {
    pub x: i32,
    pub y: i32,
    pub width: u32,
    pub height: u32,
    /// Maximized: the figures above are then the size it goes back to when restored.
    #[serde(default)]
    pub maximized: bool,
}

/// A screen's usable area (its work area: without panels and docks), in physical pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Screen {
    pub x: i32,
    pub y: i32,
    pub width: u32,
    pub height: u32,
}

impl Screen {
    /// The area the window and this screen share (0 when apart).
    fn overlap(&self, g: &Geometry) -> u64 {
        let left = self.x.max(g.x) as i64;
        let top = self.y.max(g.y) as i64;
        let right = (self.x as i64 + self.width as i64).min(g.x as i64 + g.width as i64);
        let bottom = (self.y as i64 + self.height as i64).min(g.y as i64 + g.height as i64);
        if right <= left || bottom <= top {
            0
        } else {
            ((right - left) * (bottom - top)) as u64
        }
    }
}

/// Where a saved window goes on today's screens: on the screen it shares most with (the
/// first screen, the primary, when it shares nothing with any), shrunk to fit that
/// screen and moved so that all of it is on it. With no screen known it stays as saved.
pub fn place(saved: Geometry, screens: &[Screen]) -> Geometry {
    let Some(screen) = screens
        .iter()
        .max_by_key(|s| s.overlap(&saved))
        .filter(|s| s.overlap(&saved) > 0)
        .or(screens.first())
    else {
        return saved;
    };
    let width = saved.width.clamp(1, screen.width.max(1));
    let height = saved.height.clamp(1, screen.height.max(1));
    let max_x = screen.x as i64 + screen.width as i64 - width as i64;
    let max_y = screen.y as i64 + screen.height as i64 - height as i64;
    Geometry {
        x: (saved.x as i64).clamp(screen.x as i64, max_x) as i32,
        y: (saved.y as i64).clamp(screen.y as i64, max_y) as i32,
        width,
        height,
        maximized: saved.maximized,
    }
}

/// The saved geometry, `None` when there is none or the file is damaged (a damaged file
/// only loses where the window was: logged, and the default size is used).
pub fn load(data_dir: &Path) -> Option<Geometry> {
    let path = data_dir.join(FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return None,
        Err(err) => {
            tracing::warn!("cannot read {}: {err}", path.display());
            return None;
        }
    };
    match serde_json::from_slice::<Geometry>(&bytes) {
        Ok(g) if g.width > 0 && g.height > 0 => Some(g),
        _ => {
            tracing::warn!("{} is not a window geometry; ignored", path.display());
            None
        }
    }
}

/// Written whole into a temporary file and renamed over the old one: a crash leaves
/// the old geometry or the new, never half of one.
fn save(data_dir: &Path, geometry: &Geometry) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(geometry).map_err(std::io::Error::other)?;
    let temp = data_dir.join(format!("{FILE}.tmp"));
    std::fs::write(&temp, bytes)?;
    std::fs::rename(&temp, data_dir.join(FILE))
}

/// The window's latest geometry, and the writer that saves it once the window rests.
pub struct Keeper {
    data_dir: PathBuf,
    latest: Mutex<Latest>,
    changed: tokio::sync::Notify,
}

#[derive(Default)]
struct Latest {
    /// The geometry as last seen, `None` until the window reported one.
    geometry: Option<Geometry>,
    /// What the file holds (nothing written when it already says this).
    saved: Option<Geometry>,
}

impl Keeper {
    pub fn new(data_dir: &Path, saved: Option<Geometry>) -> Self {
        Self {
            data_dir: data_dir.to_path_buf(),
            latest: Mutex::new(Latest {
                geometry: saved,
                saved,
            }),
            changed: tokio::sync::Notify::new(),
        }
    }

    /// The window moved or resized. A maximized window keeps the size it had before
    /// (what "restore" goes back to) and only the flag changes; a minimized one (0×0)
    /// is not a size to come back to.
    pub fn seen(&self, outer_x: i32, outer_y: i32, width: u32, height: u32, maximized: bool) {
        let mut latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        let next = match (maximized, latest.geometry) {
            (true, Some(before)) => Geometry {
                maximized: true,
                ..before
            },
            _ if width == 0 || height == 0 => return,
            _ => Geometry {
                x: outer_x,
                y: outer_y,
                width,
                height,
                maximized,
            },
        };
        if latest.geometry != Some(next) {
            latest.geometry = Some(next);
            drop(latest);
            self.changed.notify_one();
        }
    }

    /// Writes the latest geometry if the file does not already hold it.
    pub fn flush(&self) {
        let mut latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        let Some(geometry) = latest.geometry else {
            return;
        };
        if latest.saved == Some(geometry) {
            return;
        }
        match save(&self.data_dir, &geometry) {
            Ok(()) => latest.saved = Some(geometry),
            Err(err) => tracing::warn!("cannot remember the window's size: {err}"),
        }
    }

    /// Saves each change once the window has rested for [`SETTLE`]; runs until the app ends
    /// (the exit flushes what is left).
    pub async fn write_when_settled(self: std::sync::Arc<Self>) {
        loop {
            self.changed.notified().await;
            // Each further change within the settle time starts the wait again.
            while tokio::time::timeout(SETTLE, self.changed.notified())
                .await
                .is_ok()
            {}
            let keeper = self.clone();
            let _ = tokio::task::spawn_blocking(move || keeper.flush()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HD: Screen = Screen {
        x: 0,
        y: 0,
        width: 1920,
        height: 1050,
    };
    const RIGHT: Screen = Screen {
        x: 1920,
        y: 0,
        width: 1280,
        height: 1024,
    };

    fn g(x: i32, y: i32, width: u32, height: u32) -> Geometry {
        Geometry {
            x,
            y,
            width,
            height,
            maximized: false,
        }
    }

    #[test]
    fn a_window_on_a_screen_that_is_there_comes_back_exactly() {
        assert_eq!(
            place(g(100, 80, 1000, 700), &[HD, RIGHT]),
            g(100, 80, 1000, 700)
        );
        assert_eq!(
            place(g(2000, 10, 1200, 900), &[HD, RIGHT]),
            g(2000, 10, 1200, 900)
        );
        // No screen known (a headless start): as saved.
        assert_eq!(place(g(-50, -50, 10, 10), &[]), g(-50, -50, 10, 10));
    }

    #[test]
    fn a_window_off_every_screen_or_across_an_edge_is_put_wholly_on_one() {
        // Its screen was unplugged: onto the primary, same size.
        assert_eq!(
            place(g(3500, 200, 1000, 700), &[HD]),
            g(920, 200, 1000, 700)
        );
        // Mostly on the right-hand screen, hanging over its bottom edge: kept there.
        assert_eq!(
            place(g(2100, 900, 1000, 700), &[HD, RIGHT]),
            g(2100, 324, 1000, 700)
        );
        // Bigger than the screen it is on now: shrunk to it.
        assert_eq!(place(g(0, 0, 2560, 1440), &[HD]), g(0, 0, 1920, 1050));
        // Above and left of everything.
        assert_eq!(place(g(-900, -900, 800, 600), &[HD]), g(0, 0, 800, 600));
    }

    #[test]
    fn maximizing_keeps_the_size_to_restore_and_minimizing_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let keeper = Keeper::new(dir.path(), None);
        keeper.seen(10, 20, 1000, 700, false);
        keeper.seen(0, 0, 1920, 1050, true);
        keeper.seen(0, 0, 0, 0, false);
        keeper.flush();
        assert_eq!(
            load(dir.path()),
            Some(Geometry {
                maximized: true,
                ..g(10, 20, 1000, 700)
            })
        );
        keeper.seen(30, 40, 1100, 750, false);
        keeper.flush();
        assert_eq!(load(dir.path()), Some(g(30, 40, 1100, 750)));
    }

    #[test]
    fn a_missing_or_damaged_file_is_no_geometry() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()), None);
        std::fs::write(dir.path().join(FILE), b"{\"x\": 1").unwrap();
        assert_eq!(load(dir.path()), None);
        std::fs::write(
            dir.path().join(FILE),
            br#"{"x":1,"y":2,"width":0,"height":5}"#,
        )
        .unwrap();
        assert_eq!(load(dir.path()), None);
    }
}
