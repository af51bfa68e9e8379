//! Embeds tauri.conf.json and the page next to this crate (no capabilities: the page calls nothing).
fn main() {
    tauri_build::try_build(tauri_build::Attributes::new())
        .unwrap_or_else(|err| panic!("tauri build failed: {err:#}"));
}
