//! The desktop's floor (issue #31): an empty Tauri 2 window whose page paints one line,
//! started the way the desktop shell starts its window, so that what bumblehive-desktop
//! costs above it is ours. `scripts/bench-desktop.sh --floor` runs the two interleaved.
//!
//! Shared with the shell, not copied: its memory module (by path), so the floor gets the
//! same environment and WebKit settings (compositing off, no Mesa in the shell process,
//! two malloc arenas, the network process's memory limit, the web view's features off).
//! Left out on purpose, being the app rather than the floor: the runtime service, logging,
//! the sandbox's process hardening, the plugins and the UI.

// The shell's own module, compiled into this binary as it is into the shell.
#[path = "../../../src-tauri/src/memory.rs"]
mod memory;

fn main() {
    memory::limit_malloc_arenas();
    memory::prefer_low_memory_rendering();
    memory::limit_network_process();
    tauri::Builder::default()
        .setup(|app| {
            use tauri::Manager;
            if let Some(window) = app.get_webview_window("main") {
                memory::slim_webview(&window);
            }
            Ok(())
        })
        .run(tauri::generate_context!())
        .unwrap_or_else(|err| panic!("cannot start the window: {err}"));
}
