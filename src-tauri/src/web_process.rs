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
//!
//! The same way out recycles a web process that a day of use has grown
//! ([`recycle_if_grown`]): WebKit's allocators keep what streaming churned through, about
//! 200 MiB after a scripted day, and neither a memory-pressure limit nor loading the page
//! again in the same process gives it back; a new process showing the same data is within
//! a few MiB of a fresh start (BENCHMARKS.md, issue 31). The page asks for it only when the
//! person has been away from the window for a while and nothing of theirs lives only in
//! the page (`ui/src/recycle.ts`); the shell does it only when no run is going and the
//! process has grown by [`RECYCLE_GROWTH_KIB`] since its page settled.

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

/// How much a web process's own memory (private dirty pages: WebKit's heaps) must have
/// grown since its page settled before a recycle is worth a new page: a 300-message
/// session holds about 40 MiB of it, a day's leftovers 150 to 200.
pub const RECYCLE_GROWTH_KIB: u64 = 96 * 1024;

/// How long after a page finished loading its process's memory is taken as the page's own
/// (the first render done, JavaScriptCore's first collections run).
pub const SETTLE: std::time::Duration = std::time::Duration::from_secs(20);

/// The web process's memory when its page settled, to measure growth from.
#[derive(Default)]
pub struct Baseline(std::sync::Mutex<Option<u64>>);

impl Baseline {
    /// Takes the web process's memory now as its page's own (called [`SETTLE`] after each
    /// page load).
    pub fn take(&self) {
        let now = web_process_private_kib();
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = now;
        tracing::info!(kib = now, "web process memory once its page settled");
    }
}

/// Ends the window's web process when it grew by at least `growth_kib` since its page
/// settled; the reload handler then loads the page in a new one. True when it did.
pub fn recycle_if_grown(
    window: &tauri::WebviewWindow,
    baseline: &Baseline,
    growth_kib: u64,
) -> bool {
    let Some(now) = web_process_private_kib() else {
        return false;
    };
    let Some(then) = *baseline.0.lock().unwrap_or_else(|p| p.into_inner()) else {
        return false;
    };
    if now.saturating_sub(then) < growth_kib {
        tracing::info!(
            then_kib = then,
            now_kib = now,
            "the page asked for a new web process: not grown enough"
        );
        return false;
    }
    tracing::info!(
        then_kib = then,
        now_kib = now,
        "the web process grew while the person was away: a new one loads the page"
    );
    #[cfg(target_os = "linux")]
    {
        let ended = window.with_webview(|webview| {
            use webkit2gtk::WebViewExt;
            webview.inner().terminate_web_process();
        });
        if let Err(err) = ended {
            tracing::warn!("cannot end the web process: {err}");
            return false;
        }
        true
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = window;
        false
    }
}

/// The private dirty memory (KiB) of this process's WebKit web process, from
/// `/proc/<pid>/smaps_rollup`; None where there is none or no `/proc`.
fn web_process_private_kib() -> Option<u64> {
    let me = std::process::id();
    let entries = std::fs::read_dir("/proc").ok()?;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid …": the name may hold spaces, so read after its ')'.
        let Some((name, rest)) = stat.split_once(" (").and_then(|(_, r)| r.rsplit_once(") "))
        else {
            continue;
        };
        let ppid = rest
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(me) || !name.starts_with("WebKitWebProces") {
            continue;
        }
        let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
        return rollup.lines().find_map(|line| {
            line.strip_prefix("Private_Dirty:")
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        });
    }
    None
}
