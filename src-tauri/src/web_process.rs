//! The web process's end: when WebKit's web process ends (a crash, the kernel's out-of-memory killer, WebKit's own memory limit), the page is loaded again in a new one instead of leaving a dead window.
//!
//! Why: without this, a web process that died took the page with it and nothing started
//! another. The window stayed up, blank and deaf, until the person quit and restarted
//! the app (found by killing the web process of a running window, 2026-12-08). The runtime
//! lives in the shell, so nothing of a session is lost with the page: a new page reads
//! the workspace and session it shows back from the shell (`ui-state.json`), and every
//! run, child and approval from the runtime. What the page alone held goes: text typed and
//! not sent, which child's tab was in front.
//!
//! A page that takes its new process down again at once is not loaded forever: after
//! [`MAX_RELOADS`] ends within [`RELOAD_WINDOW`], the window is left as it is and the log
//! says why.

#[cfg(target_os = "linux")]
use std::time::{Duration, Instant};

/// How many ends in a row are answered by loading the page again...
#[cfg(target_os = "linux")]
const MAX_RELOADS: usize = 3;
/// ...within this long.
#[cfg(target_os = "linux")]
const RELOAD_WINDOW: Duration = Duration::from_secs(60);

/// Loads the page again whenever the window's web process ends.
pub fn reload_when_it_ends(window: &tauri::WebviewWindow) {
    #[cfg(target_os = "linux")]
    if let Err(err) = window.with_webview(|webview| {
        use webkit2gtk::WebViewExt;
        let view = webview.inner();
        // GTK's main thread only: the handler runs there, so a plain cell will do.
        let ends = std::cell::RefCell::new(Vec::<Instant>::new());
        view.connect_web_process_terminated(move |view, reason| {
            let mut ends = ends.borrow_mut();
            let now = Instant::now();
            ends.retain(|at| now.duration_since(*at) < RELOAD_WINDOW);
            ends.push(now);
            if ends.len() > MAX_RELOADS {
                tracing::error!(
                    ?reason,
                    "the web process ended {} times within {} s: the page is not loaded again",
                    ends.len(),
                    RELOAD_WINDOW.as_secs()
                );
                return;
            }
            tracing::warn!(?reason, "the web process ended: the page is loaded again");
            view.reload();
        });
    }) {
        tracing::warn!("a web process that ends will not be replaced: {err}");
    }
    #[cfg(not(target_os = "linux"))]
    let _ = window;
}
