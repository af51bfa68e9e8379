//! Bumblehive's desktop shell: hosts the runtime service in a Tauri window and exposes the one command table and the session event feeds; it decides nothing.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use bumblehive::commands::dispatch;
use bumblehive::config::{Config, default_config_path, default_data_dir};
use bumblehive::providers::provider_from_config;
use bumblehive::service::{RuntimeService, ServiceOptions};
use futures::StreamExt;
use serde_json::{Value, json};
use tauri::{Emitter, Manager, State};
use tokio_util::sync::CancellationToken;

/// The one event name the UI listens to; the payload says which subscription it is for.
const EVENT: &str = "bumblehive://event";

struct Desktop {
    service: RuntimeService,
    feeds: Mutex<HashMap<String, CancellationToken>>,
    next_feed: AtomicU64,
    info: Value,
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

/// Starts forwarding a session's feed (snapshot first, then events) as `bumblehive://event`.
/// The UI may name the subscription (so it can match events that arrive before this
/// call returns); otherwise one is made up.
#[tauri::command]
async fn subscribe(
    app: tauri::AppHandle,
    state: State<'_, Arc<Desktop>>,
    session_id: String,
    subscription: Option<String>,
) -> Result<String, Value> {
    let controller = state
        .service
        .controller(&session_id)
        .map_err(|err| bumblehive::commands::CommandError::from(err).to_json())?;
    let id = subscription
        .unwrap_or_else(|| format!("feed-{}", state.next_feed.fetch_add(1, Ordering::Relaxed)));
    let stop = CancellationToken::new();
    state
        .feeds
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id.clone(), stop.clone());
    let mut feed = Box::pin(controller.feed(stop));
    let feed_id = id.clone();
    tauri::async_runtime::spawn(async move {
        while let Some(event) = feed.next().await {
            if let Err(err) = app.emit(EVENT, json!({"subscription": feed_id, "event": event})) {
                tracing::warn!("cannot forward an event to the window: {err}");
            }
        }
    });
    Ok(id)
}

/// The workspace given with `--workspace`, if any: opened without the folder dialog.
#[tauri::command]
async fn initial_workspace(state: State<'_, Arc<Desktop>>) -> Result<Value, Value> {
    Ok(state.info["initial_workspace"].clone())
}

/// Stops one feed. Runs, children and wake-ups go on (SPEC §5).
#[tauri::command]
async fn unsubscribe(state: State<'_, Arc<Desktop>>, subscription: String) -> Result<(), Value> {
    if let Some(stop) = state
        .feeds
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&subscription)
    {
        stop.cancel();
    }
    Ok(())
}

/// Where things are: the workspace given on the command line, the log file, the data dir.
#[tauri::command]
async fn app_info(state: State<'_, Arc<Desktop>>) -> Result<Value, Value> {
    Ok(state.info.clone())
}

struct Args {
    workspace: Option<PathBuf>,
    config: PathBuf,
    data_dir: PathBuf,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut workspace = None;
    let mut config = None;
    let mut data_dir = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--workspace" => workspace = Some(PathBuf::from(value("--workspace")?)),
            "--config" => config = Some(PathBuf::from(value("--config")?)),
            "--data-dir" => data_dir = Some(PathBuf::from(value("--data-dir")?)),
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
    })
}

/// WebKitGTK's accelerated compositing costs about 90 MB of memory (measured: 480 → 390 MB
/// RSS for all processes, BENCHMARKS.md) and this UI draws nothing that needs it. Someone
/// who wants it back sets the variable to 0 themselves.
fn prefer_low_memory_rendering() {
    if std::env::var_os("WEBKIT_DISABLE_COMPOSITING_MODE").is_none() {
        // SAFETY: the first thing `main` does, before any other thread exists.
        unsafe { std::env::set_var("WEBKIT_DISABLE_COMPOSITING_MODE", "1") };
    }
}

fn main() -> anyhow::Result<()> {
    prefer_low_memory_rendering();
    let args = parse_args()?;
    let logs = args.data_dir.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    let (writer, _guard) =
        tracing_appender::non_blocking(tracing_appender::rolling::daily(&logs, "bumblehive.log"));
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,bumblehive=info")),
        )
        .with_ansi(false)
        .with_writer(writer)
        .init();
    let config = Config::load(&args.config)?;
    let service = RuntimeService::new(ServiceOptions {
        data_dir: args.data_dir.clone(),
        config_path: Some(args.config.clone()),
        config: Some(config),
        provider_factory: Arc::new(provider_from_config),
        tools: None,
    })?;
    let desktop = Arc::new(Desktop {
        service: service.clone(),
        feeds: Mutex::new(HashMap::new()),
        next_feed: AtomicU64::new(1),
        info: json!({
            "initial_workspace": args.workspace.map(|w| w.display().to_string()),
            "log_dir": logs.display().to_string(),
            "data_dir": args.data_dir.display().to_string(),
            "config_path": args.config.display().to_string(),
        }),
    });
    let app = tauri::Builder::default()
        .plugin(tauri_plugin_dialog::init())
        .manage(desktop)
        .invoke_handler(tauri::generate_handler![
            command,
            subscribe,
            unsubscribe,
            app_info,
            initial_workspace
        ])
        .build(tauri::generate_context!("../tauri.conf.json"))
        .context("cannot start the window")?;
    app.run(move |handle, event| {
        if let tauri::RunEvent::Exit = event {
            // Stop every run and task before the process goes, so histories end valid.
            let service = handle.state::<Arc<Desktop>>().service.clone();
            tauri::async_runtime::block_on(service.shutdown());
        }
    });
    Ok(())
}
