//! Bumblehive's desktop shell: hosts the runtime service in a Tauri window and exposes the one command table and the session event feeds; it decides nothing.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use bumblehive::commands::dispatch;
use bumblehive::config::{Config, default_config_path, default_data_dir};
use bumblehive::protocol::commands::Empty;
use bumblehive::protocol::desktop;
use bumblehive::protocol::{OwnerReply, OwnerRequest};
use bumblehive::providers::provider_from_config;
use bumblehive::service::{RuntimeService, ServiceOptions};
use futures::StreamExt;
use serde_json::{Value, json};
use tauri::{Emitter, Manager, State};
use tauri_plugin_notification::NotificationExt;
use tauri_plugin_opener::OpenerExt;
use tokio_util::sync::CancellationToken;

mod clipboard;
mod memory;
mod web_process;
mod window_state;

/// The one event name the UI listens to; the payload says which subscription it is for.
const EVENT: &str = "bumblehive://event";
/// The session list's feed (`subscribe_sessions`).
const SESSIONS_EVENT: &str = "bumblehive://sessions";
/// Sent to the UI when the person closes the window while the UI said work is running.
const CLOSE_EVENT: &str = "bumblehive://close-requested";
/// Sent to the UI when a later start handed over a workspace to open (`OpenRequested`).
const OPEN_EVENT: &str = "bumblehive://open";
/// Sent to the UI when the person clicks a notification it asked for with an id (E21):
/// the payload is that id, and the UI opens what the notification announced.
const NOTIFICATION_CLICKED_EVENT: &str = "bumblehive://notification-clicked";
/// The UI's remembered choices (last workspace and session, recents), in the data dir so
/// that a start with no arguments (from the menu) reopens where the person was.
const UI_STATE_FILE: &str = "ui-state.json";
/// The UI state is a few paths; anything bigger is a mistake, not something to store.
const UI_STATE_MAX_BYTES: usize = 64 * 1024;
/// Log lines waiting for the log file's writer thread (see `main`).
const LOG_QUEUE_LINES: usize = 4096;

struct Desktop {
    service: RuntimeService,
    feeds: Mutex<HashMap<String, CancellationToken>>,
    next_feed: AtomicU64,
    info: desktop::HostInfo,
    data_dir: PathBuf,
    /// Set by the UI while anything runs: closing the window then asks the person first.
    close_guard: AtomicBool,
    /// The web process's memory once its page settled (`recycle_web_process`).
    web_baseline: web_process::Baseline,
    recycle: Recycle,
}

/// When the web process is recycled: the person away this long (the page's side), the
/// process grown this much, its memory taken this long after each page load. Set by
/// `--web-recycle <away s>,<growth MiB>,<settle s>` (tests; away 0 turns it off).
#[derive(Clone, Copy)]
struct Recycle {
    away: std::time::Duration,
    growth_kib: u64,
    settle: std::time::Duration,
}

impl Recycle {
    fn parse(value: Option<&str>) -> Self {
        let default = Recycle {
            away: std::time::Duration::from_secs(300),
            growth_kib: web_process::RECYCLE_GROWTH_KIB,
            settle: web_process::SETTLE,
        };
        let Some(value) = value else {
            return default;
        };
        let parts: Vec<u64> = value
            .split(',')
            .filter_map(|p| p.trim().parse().ok())
            .collect();
        match parts[..] {
            [away, growth_mib, settle] => Recycle {
                away: std::time::Duration::from_secs(away),
                growth_kib: growth_mib * 1024,
                settle: std::time::Duration::from_secs(settle),
            },
            _ => {
                tracing::warn!("--web-recycle {value} is not <away s>,<growth MiB>,<settle s>");
                default
            }
        }
    }
}

impl Desktop {
    /// A feed's id (the UI's, or a new `<prefix>-<n>`) and the token `unsubscribe` cancels.
    fn register_feed(
        &self,
        subscription: Option<String>,
        prefix: &str,
    ) -> (String, CancellationToken) {
        let id = subscription.unwrap_or_else(|| {
            format!(
                "{prefix}-{}",
                self.next_feed.fetch_add(1, Ordering::Relaxed)
            )
        });
        let stop = CancellationToken::new();
        self.feeds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone(), stop.clone());
        (id, stop)
    }
}

/// A command-table style error (`{code, message}`), so the UI's one error path reads it.
fn error(code: &str, message: impl std::fmt::Display) -> Value {
    json!({"code": code, "message": message.to_string()})
}

/// Runs any command of the table: `{name, args}` in, its JSON result or `{error}` out.
#[tauri::command]
async fn command(
    state: State<'_, Arc<Desktop>>,
    name: String,
    args: Value,
) -> Result<Value, Value> {
    dispatch(&state.service, &name, args)
        .await
        .map_err(|err| err.to_json())
}

/// Starts forwarding a session's feed (snapshot first, then events) as `bumblehive://event`,
/// `{subscription, events: [...]}` with the events of one frame in order.
/// The UI may name the subscription (so it can match events that arrive before this
/// call returns); otherwise one is made up.
#[tauri::command]
async fn subscribe(
    app: tauri::AppHandle,
    state: State<'_, Arc<Desktop>>,
    args: desktop::Subscribe,
) -> Result<String, Value> {
    let controller = state
        .service
        .controller(&args.session_id)
        .map_err(|err| bumblehive::commands::CommandError::from(err).to_json())?;
    let (id, stop) = state.register_feed(args.subscription, "feed");
    // One IPC message per frame, not per event: several runs streaming deltas at once
    // would otherwise flood the window's main thread (#19). A lone event still goes at once.
    let mut batches = Box::pin(bumblehive::frames::frames(
        Box::pin(controller.feed(stop)),
        bumblehive::frames::FRAME,
    ));
    let feed_id = id.clone();
    tauri::async_runtime::spawn(async move {
        while let Some(events) = batches.next().await {
            if let Err(err) = app.emit(EVENT, json!({"subscription": feed_id, "events": events})) {
                tracing::warn!("cannot forward events to the window: {err}");
            }
        }
    });
    Ok(id)
}

/// The workspace given with `--workspace`, if any: opened without the folder dialog.
#[tauri::command]
async fn initial_workspace(
    state: State<'_, Arc<Desktop>>,
    args: Empty,
) -> Result<Option<String>, Value> {
    let Empty {} = args;
    Ok(state.info.initial_workspace.clone())
}

/// Starts forwarding the session list's feed (`SessionListEvent`: the list, then each
/// change) as `bumblehive://sessions`, so the sidebar follows without asking again.
#[tauri::command]
async fn subscribe_sessions(
    app: tauri::AppHandle,
    state: State<'_, Arc<Desktop>>,
    args: desktop::SubscribeSessions,
) -> Result<String, Value> {
    let (id, stop) = state.register_feed(args.subscription, "list");
    let mut feed = Box::pin(state.service.session_list_feed(args.workspace, stop));
    let feed_id = id.clone();
    tauri::async_runtime::spawn(async move {
        while let Some(event) = feed.next().await {
            if let Err(err) = app.emit(
                SESSIONS_EVENT,
                json!({"subscription": feed_id, "event": event}),
            ) {
                tracing::warn!("cannot forward a list event to the window: {err}");
            }
        }
    });
    Ok(id)
}

/// Stops one feed. Runs, children and wake-ups go on (SPEC §5).
#[tauri::command]
async fn unsubscribe(
    state: State<'_, Arc<Desktop>>,
    args: desktop::Unsubscribe,
) -> Result<(), Value> {
    if let Some(stop) = state
        .feeds
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&args.subscription)
    {
        stop.cancel();
    }
    Ok(())
}

/// Where things are: the workspace given on the command line, the log file, the data dir.
#[tauri::command]
async fn app_info(state: State<'_, Arc<Desktop>>, args: Empty) -> Result<desktop::HostInfo, Value> {
    let Empty {} = args;
    Ok(state.info.clone())
}

/// Opens a web or mail link in the system's handler (never in the app window).
#[tauri::command]
async fn open_url(app: tauri::AppHandle, args: desktop::OpenUrl) -> Result<(), Value> {
    let url = args.url;
    if !is_external_link(&url) {
        return Err(error(
            "invalid_argument",
            format!("only http, https and mailto links open outside the app, not {url:?}"),
        ));
    }
    app.opener()
        .open_url(url.as_str(), None::<&str>)
        .map_err(|err| error("unavailable", format!("cannot open {url}: {err}")))
}

/// Links the app hands to the system: the same rule as the UI's sanitiser.
fn is_external_link(url: &str) -> bool {
    let lower = url.trim_start().to_ascii_lowercase();
    ["http://", "https://", "mailto:"]
        .iter()
        .any(|scheme| lower.starts_with(scheme))
        && !url.chars().any(char::is_control)
}

/// An OS notification (the UI asks only while the window is not focused).
#[tauri::command]
async fn notify(app: tauri::AppHandle, args: desktop::Notify) -> Result<(), Value> {
    let desktop::Notify { title, body, id } = args;
    // Logged too: a desktop without a notification daemon shows nothing, and the log is
    // then the only trace that the person was asked.
    tracing::info!(%title, %body, "notification requested");
    // The taskbar entry asks for attention too (an urgency hint): a notification daemon
    // may be missing, and a notification is gone once dismissed.
    if let Some(window) = app
        .get_webview_window("main")
        .filter(|w| !w.is_focused().unwrap_or(false))
    {
        let _ = window.request_user_attention(Some(tauri::UserAttentionType::Informational));
    }
    let mut builder = app.notification().builder().title(title).body(body);
    if let Some(id) = id {
        builder = builder.id(id);
    }
    builder
        .show()
        .map_err(|err| error("unavailable", format!("cannot show a notification: {err}")))
}

/// The window title ("Bumblehive — 2 need you").
#[tauri::command]
async fn set_title(window: tauri::WebviewWindow, args: desktop::SetTitle) -> Result<(), Value> {
    window
        .set_title(&args.title)
        .map_err(|err| error("unavailable", err))
}

/// The UI says whether anything runs; closing the window then asks it first.
#[tauri::command]
async fn set_close_guard(
    state: State<'_, Arc<Desktop>>,
    args: desktop::SetCloseGuard,
) -> Result<(), Value> {
    state.close_guard.store(args.active, Ordering::SeqCst);
    Ok(())
}

/// The person confirmed quitting: every run stops (on `RunEvent::Exit`) and the app ends.
#[tauri::command]
async fn quit(app: tauri::AppHandle, args: Empty) -> Result<(), Value> {
    let Empty {} = args;
    app.exit(0);
    Ok(())
}

/// The UI's remembered choices, `{}` when none were saved (or the file is unreadable: a
/// damaged file only loses "where was I", so it is reported in the log and ignored).
#[tauri::command]
async fn load_ui_state(state: State<'_, Arc<Desktop>>, args: Empty) -> Result<Value, Value> {
    let Empty {} = args;
    Ok(read_ui_state(&state.data_dir))
}

/// The page's ask, once the person has been away from the window a while with nothing of
/// theirs only in the page: a new web process for it if the old one grew
/// (`web_process::recycle_if_grown`). Never while a run goes (its events would fall in the
/// gap) or once the window has the focus again.
#[tauri::command]
async fn recycle_web_process(
    window: tauri::WebviewWindow,
    state: State<'_, Arc<Desktop>>,
    args: Empty,
) -> Result<bool, Value> {
    let Empty {} = args;
    let busy = state.service.is_busy();
    let focused = window.is_focused().unwrap_or(true);
    if state.recycle.away.is_zero() || busy || focused {
        tracing::info!(
            busy,
            focused,
            "the page asked for a new web process: not now"
        );
        return Ok(false);
    }
    Ok(web_process::recycle_if_grown(
        &window,
        &state.web_baseline,
        state.recycle.growth_kib,
    ))
}

#[tauri::command]
async fn save_ui_state(
    state: State<'_, Arc<Desktop>>,
    args: desktop::SaveUiState,
) -> Result<(), Value> {
    write_ui_state(&state.data_dir, &args.value).map_err(|err| error("invalid_argument", err))
}

fn read_ui_state(data_dir: &std::path::Path) -> Value {
    let path = data_dir.join(UI_STATE_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => match serde_json::from_slice::<Value>(&bytes) {
            Ok(value) if value.is_object() => value,
            Ok(_) | Err(_) => {
                tracing::warn!("{} is not a JSON object; starting fresh", path.display());
                json!({})
            }
        },
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => json!({}),
        Err(err) => {
            tracing::warn!("cannot read {}: {err}", path.display());
            json!({})
        }
    }
}

/// Replaces the file atomically (temp file + rename), so a crash leaves the old or the new.
fn write_ui_state(data_dir: &std::path::Path, value: &Value) -> anyhow::Result<()> {
    anyhow::ensure!(value.is_object(), "the UI state must be a JSON object");
    let bytes = serde_json::to_vec_pretty(value)?;
    anyhow::ensure!(
        bytes.len() <= UI_STATE_MAX_BYTES,
        "the UI state is {} bytes, more than {UI_STATE_MAX_BYTES}",
        bytes.len()
    );
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;
    let path = data_dir.join(UI_STATE_FILE);
    let temp = data_dir.join(format!("{UI_STATE_FILE}.tmp"));
    std::fs::write(&temp, bytes).with_context(|| format!("cannot write {}", temp.display()))?;
    std::fs::rename(&temp, &path).with_context(|| format!("cannot replace {}", path.display()))?;
    Ok(())
}

/// The clipboard's image, `null` when it holds none: the composer asks when a paste
/// brought neither an image nor text, as WebKitGTK's paste event carries no image (E14).
#[tauri::command]
async fn clipboard_image(
    app: tauri::AppHandle,
    args: Empty,
) -> Result<Option<bumblehive::protocol::ImagePart>, Value> {
    let Empty {} = args;
    clipboard::read(&app)
        .await
        .map_err(|message| error("unavailable", message))
}

/// Checks a picked or typed folder before the UI uses it: `~` is the home folder, the
/// answer is the real (canonical) path, and a missing folder or a file is a clear error.
#[tauri::command]
async fn check_folder(args: desktop::CheckFolder) -> Result<String, Value> {
    checked_folder(&args.path, std::env::var_os("HOME").map(PathBuf::from))
        .map(|p| p.display().to_string())
        .map_err(|message| error("invalid_argument", message))
}

fn checked_folder(path: &str, home: Option<PathBuf>) -> Result<PathBuf, String> {
    let trimmed = path.trim();
    if trimmed.is_empty() {
        return Err("no folder given".into());
    }
    let expanded = match (trimmed.strip_prefix('~'), home) {
        (Some(rest), Some(home)) if rest.is_empty() || rest.starts_with('/') => {
            home.join(rest.trim_start_matches('/'))
        }
        _ => PathBuf::from(trimmed),
    };
    if !expanded.is_absolute() {
        return Err(format!(
            "{trimmed} is not an absolute path (start it with / or ~)"
        ));
    }
    match expanded.canonicalize() {
        Ok(real) if real.is_dir() => Ok(real),
        Ok(real) => Err(format!("{} is a file, not a folder", real.display())),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            Err(format!("{} does not exist", expanded.display()))
        }
        Err(err) => Err(format!("cannot open {}: {err}", expanded.display())),
    }
}

/// Whether the config file names a provider. Without one the runtime uses a default
/// (Ollama's address), which the first screen must not present as the person's choice.
fn provider_configured(config: &std::path::Path) -> bool {
    bumblehive::config::provider_configured(config)
}

/// What a later start's request does here: the window comes forward and, when the start
/// named a workspace, the UI opens it (`OPEN_EVENT`).
fn later_start_handler(app: tauri::AppHandle) -> bumblehive::owner::HandoffHandler {
    Arc::new(move |request: OwnerRequest| {
        let Some(window) = app.get_webview_window("main") else {
            return OwnerReply {
                ok: false,
                message: "the running app has no window".into(),
            };
        };
        // A window manager may refuse to move focus to another app's request: the urgency
        // hint still makes the taskbar ask for attention.
        let _ = window.unminimize();
        let _ = window.show();
        let _ = window.set_focus();
        let _ = window.request_user_attention(Some(tauri::UserAttentionType::Informational));
        let message = match request.workspace {
            Some(workspace) => {
                let open = desktop::OpenRequested {
                    workspace: workspace.clone(),
                };
                if let Err(err) = window.emit(OPEN_EVENT, open) {
                    return OwnerReply {
                        ok: false,
                        message: format!("the running window cannot open {workspace}: {err}"),
                    };
                }
                format!("its window opens {workspace}")
            }
            None => "its window was brought forward".into(),
        };
        OwnerReply { ok: true, message }
    })
}

/// The data folder belongs to a running app: hand it this start's workspace, say so, and
/// end. When it cannot take requests (`bumblehive serve` or `run` owns the folder, or an
/// older build), the refusal names the owner as before.
fn hand_over(args: &Args, in_use: bumblehive::owner::OwnerError) -> anyhow::Result<()> {
    let request = OwnerRequest {
        workspace: args.workspace.as_ref().map(|w| w.display().to_string()),
        pid: std::process::id(),
        run: None,
    };
    match bumblehive::owner::hand_off(&args.data_dir, &request) {
        Ok(reply) if reply.ok => {
            tracing::info!(message = %reply.message, "handed over to the running app");
            println!("Bumblehive is already running: {}.", reply.message);
            Ok(())
        }
        Ok(reply) => anyhow::bail!("{in_use}; it answered: {}", reply.message),
        Err(err) => anyhow::bail!("{in_use} ({err})"),
    }
}

struct Args {
    workspace: Option<PathBuf>,
    config: PathBuf,
    data_dir: PathBuf,
    /// `--web-recycle` (`Recycle`).
    web_recycle: Option<String>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut workspace = None;
    let mut config = None;
    let mut data_dir = None;
    let mut web_recycle = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--workspace" => workspace = Some(PathBuf::from(value("--workspace")?)),
            "--config" => config = Some(PathBuf::from(value("--config")?)),
            "--data-dir" => data_dir = Some(PathBuf::from(value("--data-dir")?)),
            "--web-recycle" => web_recycle = Some(value("--web-recycle")?),
            other => anyhow::bail!(
                "unknown argument {other:?}; usage: bumblehive-desktop [--workspace DIR] [--config FILE] [--data-dir DIR]"
            ),
        }
    }
    let workspace = match workspace {
        Some(dir) => Some(
            dir.canonicalize()
                .with_context(|| format!("--workspace {}", dir.display()))?,
        ),
        None => None,
    };
    Ok(Args {
        workspace,
        config: config.unwrap_or_else(default_config_path),
        data_dir: data_dir.unwrap_or_else(default_data_dir),
        web_recycle,
    })
}

/// The shell's async runtime: two workers are plenty for forwarding IPC and events (the
/// runs' own work is mostly waiting on the network), and each idle worker costs a stack and
/// a share of the allocator. Replaces Tauri's default of one worker per core.
fn shell_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().min(2));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("bumblehive-shell")
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Puts the window where it was last time, on a screen that is still there (E23).
fn restore_geometry(window: &tauri::WebviewWindow, saved: window_state::Geometry) {
    let screens: Vec<window_state::Screen> = window
        .available_monitors()
        .unwrap_or_default()
        .iter()
        .map(|m| {
            let area = m.work_area();
            window_state::Screen {
                x: area.position.x,
                y: area.position.y,
                width: area.size.width,
                height: area.size.height,
            }
        })
        .collect();
    let g = window_state::place(saved, &screens);
    let placed = window
        .set_size(tauri::PhysicalSize::new(g.width, g.height))
        .and_then(|()| window.set_position(tauri::PhysicalPosition::new(g.x, g.y)))
        .and_then(|()| {
            if g.maximized {
                window.maximize()
            } else {
                Ok(())
            }
        });
    if let Err(err) = placed {
        tracing::warn!("cannot put the window where it was: {err}");
    }
}

fn main() -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    memory::limit_malloc_arenas();
    // Commands the agent runs must not read this process's memory or environment.
    bumblehive::sandbox::harden_process();
    memory::prefer_low_memory_rendering();
    let args = parse_args()?;
    let logs = args.data_dir.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    // Daily files, a week of them kept: logs must not grow without bound.
    let appender = tracing_appender::rolling::RollingFileAppender::builder()
        .rotation(tracing_appender::rolling::Rotation::DAILY)
        .filename_prefix("bumblehive")
        .filename_suffix("log")
        .max_log_files(7)
        .build(&logs)
        .with_context(|| format!("cannot open the log in {}", logs.display()))?;
    // A queue of 4,096 lines for the writer thread, not the default 128,000: that queue's
    // slots are all written when it is made, 4 MiB of the shell's memory for good, and at
    // the shell's log level (info) a burst of 4,096 lines before the writer catches up does
    // not happen (BENCHMARKS.md, issue #31).
    let (writer, _guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .buffered_lines_limit(LOG_QUEUE_LINES)
        .finish(appender);
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,bumblehive=info")),
        )
        .with_ansi(false)
        .with_writer(writer)
        .init();
    let runtime = shell_runtime()?;
    tauri::async_runtime::set(runtime.handle().clone());
    let config = Config::load(&args.config)?;
    // The data dir and config stay out of sandboxed commands' reach wherever they are
    // (security review 2, finding 10).
    bumblehive::sandbox::hide(&[args.data_dir.clone(), args.config.clone()]);
    let service = match RuntimeService::new(ServiceOptions {
        data_dir: args.data_dir.clone(),
        config_path: Some(args.config.clone()),
        config: Some(config),
        provider_factory: Arc::new(provider_from_config),
        tools: None,
    }) {
        Ok(service) => service,
        // One app per data folder: a second start (the menu entry again, a file manager's
        // "open with") hands its workspace to the running window and ends (E1).
        Err(bumblehive::error::RuntimeError::InUse(in_use)) => {
            return hand_over(&args, in_use);
        }
        Err(err) => return Err(err.into()),
    };
    let workspace = args.workspace.as_ref().map(|w| w.display().to_string());
    let recycle = Recycle::parse(args.web_recycle.as_deref());
    let desktop = Arc::new(Desktop {
        service: service.clone(),
        feeds: Mutex::new(HashMap::new()),
        next_feed: AtomicU64::new(1),
        info: desktop::HostInfo {
            initial_workspace: workspace,
            log_dir: logs.display().to_string(),
            data_dir: args.data_dir.display().to_string(),
            config_path: args.config.display().to_string(),
            home_dir: std::env::var_os("HOME").map(|h| PathBuf::from(h).display().to_string()),
            provider_configured: provider_configured(&args.config),
            recycle_after_ms: recycle.away.as_millis() as u64,
        },
        data_dir: args.data_dir.clone(),
        close_guard: AtomicBool::new(false),
        web_baseline: web_process::Baseline::default(),
        recycle,
    });
    tracing::info!(
        ms = started.elapsed().as_millis(),
        "start-up: service ready"
    );
    memory::limit_network_process();
    let handoffs = CancellationToken::new();
    let listening = handoffs.clone();
    let data_dir = args.data_dir.clone();
    let runtime_handle = runtime.handle().clone();
    // A later `bumblehive run` on this folder runs here, its session listed at once.
    let runs = bumblehive::owner_run::handler(service.clone());
    // Where the window was last time (E23), put back before it is first painted.
    let saved_geometry = window_state::load(&args.data_dir);
    let geometry = Arc::new(window_state::Keeper::new(&args.data_dir, saved_geometry));
    let settled = geometry.clone();
    let app = tauri::Builder::default()
        .plugin(tauri_plugin_dialog::init())
        .plugin(tauri_plugin_opener::init())
        .plugin(tauri_plugin_notification::init())
        .manage(desktop)
        .manage(geometry)
        .setup(move |app| {
            if let Some(window) = app.get_webview_window("main") {
                memory::slim_webview(&window);
                web_process::reload_when_it_ends(&window);
                if let Some(saved) = saved_geometry {
                    restore_geometry(&window, saved);
                }
            }
            tauri::async_runtime::spawn(settled.clone().write_when_settled());
            // A click on a notification brings the window forward and tells the UI which
            // one it was (the notification server reports it as the `default` action; the
            // plugin offers that action only while a handler is registered, so before this
            // a click did nothing).
            let clicked = app.handle().clone();
            app.notification().on_action(move |performed| {
                if performed.action_id() != "tap" {
                    return;
                }
                let Some(id) = performed.notification().map(|n| n.id()) else {
                    return;
                };
                tracing::info!(id, "notification clicked");
                if let Some(window) = clicked.get_webview_window("main") {
                    let _ = window.unminimize();
                    let _ = window.show();
                    let _ = window.set_focus();
                    if let Err(err) = window.emit(NOTIFICATION_CLICKED_EVENT, id) {
                        tracing::warn!("cannot tell the window of a notification click: {err}");
                    }
                }
            })?;
            // Later starts hand their request over to this window from now on.
            let _entered = runtime_handle.enter();
            if let Err(err) = bumblehive::owner::listen_with_runs(
                &data_dir,
                later_start_handler(app.handle().clone()),
                Some(runs.clone()),
                listening.clone(),
            ) {
                tracing::warn!("a later start cannot hand over to this window: {err}");
            }
            tracing::info!(
                ms = started.elapsed().as_millis(),
                "start-up: window created"
            );
            Ok(())
        })
        // A reload (or a crash of the web process) starts a new page that knows none of
        // the old page's feeds: stop them, or each reload would leak one per session.
        .on_page_load(move |webview, payload| {
            if payload.event() == tauri::webview::PageLoadEvent::Finished {
                tracing::info!(ms = started.elapsed().as_millis(), "start-up: page loaded");
                // Once the page is up, not before: making them would compete with the
                // start for the two cores a small machine has.
                let desktop = webview.state::<Arc<Desktop>>().inner().clone();
                desktop.service.keep_spare_sessions();
                // What the new page's process holds once it settled: the growth a recycle
                // is measured from.
                tauri::async_runtime::spawn(async move {
                    tokio::time::sleep(desktop.recycle.settle).await;
                    desktop.web_baseline.take();
                });
            }
            if payload.event() == tauri::webview::PageLoadEvent::Started {
                let feeds: Vec<CancellationToken> = webview
                    .state::<Arc<Desktop>>()
                    .feeds
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .drain()
                    .map(|(_, stop)| stop)
                    .collect();
                for stop in feeds {
                    stop.cancel();
                }
            }
        })
        .on_window_event(|window, event| {
            if let tauri::WindowEvent::Moved(_) | tauri::WindowEvent::Resized(_) = event
                && let (Ok(at), Ok(size)) = (window.outer_position(), window.inner_size())
            {
                let maximized = window.is_maximized().unwrap_or(false);
                window.state::<Arc<window_state::Keeper>>().seen(
                    at.x,
                    at.y,
                    size.width,
                    size.height,
                    maximized,
                );
            }
            if let tauri::WindowEvent::CloseRequested { api, .. } = event {
                // While work runs, the UI asks the person (it knows what runs); it calls
                // `quit` when they confirm. A UI that never set the guard cannot block closing.
                let guarded = window
                    .state::<Arc<Desktop>>()
                    .close_guard
                    .load(Ordering::SeqCst);
                if guarded {
                    api.prevent_close();
                    if let Err(err) = window.emit(CLOSE_EVENT, json!({})) {
                        tracing::warn!("cannot ask the window about closing: {err}");
                    }
                }
            }
        })
        .invoke_handler(tauri::generate_handler![
            command,
            subscribe,
            subscribe_sessions,
            unsubscribe,
            app_info,
            initial_workspace,
            open_url,
            notify,
            set_title,
            set_close_guard,
            quit,
            load_ui_state,
            save_ui_state,
            check_folder,
            clipboard_image,
            recycle_web_process
        ])
        .build(tauri::generate_context!("../tauri.conf.json"))
        .context("cannot start the window")?;
    tracing::info!(
        ms = started.elapsed().as_millis(),
        "start-up: event loop ready"
    );
    app.run(move |handle, event| {
        if let tauri::RunEvent::Exit = event {
            handoffs.cancel();
            handle.state::<Arc<window_state::Keeper>>().flush();
            // Stop every run and task before the process goes, so histories end valid.
            let service = handle.state::<Arc<Desktop>>().service.clone();
            // Bounded (review R6): a run or server that does not stop must not keep the
            // app from quitting; what is left dies with the process.
            tauri::async_runtime::block_on(async {
                // The same 5 s as `serve` and `run` (issue 27).
                let stop = std::time::Duration::from_secs(5);
                if tokio::time::timeout(stop, service.shutdown())
                    .await
                    .is_err()
                {
                    tracing::warn!("runs did not stop within 5 s; quitting anyway");
                }
            });
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_web_and_mail_links_go_to_the_system() {
        assert!(is_external_link("https://example.com/a?b"));
        assert!(is_external_link("HTTP://example.com"));
        assert!(is_external_link("mailto:a@example.com"));
        assert!(!is_external_link("file:///etc/passwd"));
        assert!(!is_external_link("javascript:alert(1)"));
        assert!(!is_external_link("https://example.com/\nx"));
        assert!(!is_external_link("https://example.com/\u{7}"));
    }

    #[test]
    fn folders_are_checked_before_use() {
        let dir = tempfile::tempdir().unwrap();
        let home = Some(dir.path().to_path_buf());
        let real = dir.path().canonicalize().unwrap();
        assert_eq!(checked_folder("~", home.clone()).unwrap(), real);
        std::fs::create_dir(dir.path().join("ws")).unwrap();
        assert_eq!(
            checked_folder(" ~/ws ", home.clone()).unwrap(),
            real.join("ws")
        );
        let missing =
            checked_folder(&format!("{}/wss1", real.display()), home.clone()).unwrap_err();
        assert!(missing.contains("does not exist"), "{missing}");
        std::fs::write(dir.path().join("f.txt"), "x").unwrap();
        let file = checked_folder(&format!("{}/f.txt", real.display()), home.clone()).unwrap_err();
        assert!(file.contains("is a file"), "{file}");
        assert!(
            checked_folder("relative/dir", home.clone())
                .unwrap_err()
                .contains("absolute")
        );
        assert!(
            checked_folder("  ", home)
                .unwrap_err()
                .contains("no folder")
        );
    }

    #[test]
    fn a_provider_counts_as_configured_only_when_the_file_names_one() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.json");
        assert!(!provider_configured(&config));
        std::fs::write(&config, r#"{"subagents": {}}"#).unwrap();
        assert!(!provider_configured(&config));
        std::fs::write(&config, r#"{"provider": {"kind": "openai", "base_url": "http://127.0.0.1:1250/v1", "model": "m"}}"#).unwrap();
        assert!(provider_configured(&config));
    }

    #[test]
    fn ui_state_round_trips_and_bad_input_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_ui_state(dir.path()), json!({}));
        let state = json!({"lastWorkspace": "/w", "lastSessions": {"/w": "s1"}});
        write_ui_state(dir.path(), &state).unwrap();
        assert_eq!(read_ui_state(dir.path()), state);
        // Not an object, or far too big: refused, and the saved state stays.
        assert!(write_ui_state(dir.path(), &json!([1])).is_err());
        let big = json!({"x": "y".repeat(UI_STATE_MAX_BYTES)});
        assert!(write_ui_state(dir.path(), &big).is_err());
        assert_eq!(read_ui_state(dir.path()), state);
        // A damaged file reads as empty instead of failing the start.
        std::fs::write(dir.path().join(UI_STATE_FILE), b"{not json").unwrap();
        assert_eq!(read_ui_state(dir.path()), json!({}));
    }
}
