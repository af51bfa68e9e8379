//! The `bumblehive` command: `serve` (the headless HTTP + SSE server) and `run` (one prompt, events as JSON lines).

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use bumblehive::config::{Config, default_config_path, default_data_dir};
use bumblehive::protocol::{Event, commands::DecideApproval};
use bumblehive::providers::provider_from_config;
use bumblehive::server::{ServerOptions, generate_token, router};
use bumblehive::service::{RuntimeService, ServiceOptions};
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "bumblehive",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("BUMBLEHIVE_COMMIT"), ")"),
    about = "A desktop agent runtime with background sub-agents"
)]
struct Cli {
    /// Config file (default: <config dir>/bumblehive/config.json, or BUMBLEHIVE_CONFIG).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Data folder for sessions (default: <data dir>/bumblehive, or BUMBLEHIVE_DATA_DIR).
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the command table over HTTP and session events as Server-Sent Events.
    Serve {
        /// Port to listen on; 0 picks a free one.
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Address to listen on. Anything but loopback exposes your files: be sure.
        #[arg(long, default_value = "127.0.0.1")]
        host: std::net::IpAddr,
        /// Use this token instead of a generated one.
        #[arg(long)]
        token: Option<String>,
        /// Also serve the built web UI from this folder.
        #[arg(long)]
        ui: Option<PathBuf>,
    },
    /// Run one prompt in a workspace, print events as JSON lines, exit when all work is done.
    Run {
        #[arg(long)]
        workspace: PathBuf,
        /// Approve every request without asking.
        #[arg(long)]
        yes: bool,
        prompt: String,
    },
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    let cli = Cli::parse();
    let data_dir = cli.data_dir.clone().unwrap_or_else(default_data_dir);
    // Logs go to stderr and to a daily file in the data dir (the settings page shows where).
    let log_dir = bumblehive::config::log_dir(&data_dir);
    std::fs::create_dir_all(&log_dir)
        .with_context(|| format!("cannot create {}", log_dir.display()))?;
    let (file, _flush_on_exit) = tracing_appender::non_blocking(tracing_appender::rolling::daily(
        &log_dir,
        "bumblehive.log",
    ));
    use tracing_subscriber::prelude::*;
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,bumblehive=info")),
        )
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(file),
        )
        .init();
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    // Returned, not `process::exit`: the log writer flushes when main's guard drops.
    runtime.block_on(async_main(cli))
}

fn build_service(config_path: &Path, data_dir: &Path) -> anyhow::Result<RuntimeService> {
    // Load first so a broken file stops the start with its line number, untouched.
    let config = Config::load(config_path)?;
    Ok(RuntimeService::new(ServiceOptions {
        data_dir: data_dir.to_path_buf(),
        config_path: Some(config_path.to_path_buf()),
        config: Some(config),
        provider_factory: Arc::new(provider_from_config),
        tools: None,
    })?)
}

async fn async_main(cli: Cli) -> anyhow::Result<std::process::ExitCode> {
    let config_path = cli.config.unwrap_or_else(default_config_path);
    let data_dir = cli.data_dir.unwrap_or_else(default_data_dir);
    let service = build_service(&config_path, &data_dir)?;
    match cli.command {
        Command::Serve {
            port,
            host,
            token,
            ui,
        } => {
            serve(service, &data_dir, SocketAddr::new(host, port), token, ui).await?;
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Run {
            workspace,
            yes,
            prompt,
        } => {
            let code = run_once(service, &workspace, yes, prompt).await?;
            Ok(std::process::ExitCode::from(code))
        }
    }
}

async fn serve(
    service: RuntimeService,
    data_dir: &Path,
    addr: SocketAddr,
    token: Option<String>,
    ui: Option<PathBuf>,
) -> anyhow::Result<()> {
    if let Some(ui) = &ui {
        if !ui.join("index.html").exists() {
            bail!(
                "--ui {}: no index.html there (build the UI first)",
                ui.display()
            );
        }
    }
    let token = token.unwrap_or_else(generate_token);
    write_token_file(data_dir, &token)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let bound = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    let app = router(
        service.clone(),
        ServerOptions {
            token: token.clone(),
            ui_dir: ui,
            shutdown: shutdown.clone(),
        },
    );
    // The first stdout line is for scripts: where to connect and with which token.
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "{}",
        serde_json::json!({"url": format!("http://{bound}"), "token": token})
    )?;
    stdout.flush()?;
    drop(stdout);
    tracing::info!("serving on http://{bound}");
    let signal = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        signal.cancel();
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.clone().cancelled_owned())
        .await
        .context("server failed")?;
    service.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = ctrl_c.await;
        }
    }
}

/// The token goes to a file only its user can read, for tools that start the server.
fn write_token_file(data_dir: &Path, token: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(data_dir)?;
    let path = data_dir.join("server-token");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(token.as_bytes())?;
    Ok(())
}

/// Runs one prompt; returns the exit code (0 when the top-level run ended with a result).
async fn run_once(
    service: RuntimeService,
    workspace: &Path,
    yes: bool,
    prompt: String,
) -> anyhow::Result<u8> {
    let workspace = workspace
        .canonicalize()
        .with_context(|| format!("workspace {}", workspace.display()))?;
    let info = service.create_session(&workspace.display().to_string(), None)?;
    let controller = service.controller(&info.session_id)?;
    let (mut events, _) = controller.subscribe();
    let done = CancellationToken::new();
    let printer = {
        let service = service.clone();
        let session_id = info.session_id.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let mut failed = false;
            loop {
                // Events first: after `done`, print what is buffered, then stop.
                let event = tokio::select! {
                    biased;
                    event = events.next_event() => event,
                    _ = done.cancelled() => None,
                };
                let Some(event) = event else { break };
                if let Ok(line) = serde_json::to_string(&event) {
                    println!("{line}");
                }
                match &event {
                    Event::ApprovalRequest(ask) => {
                        let approved = yes || ask_on_terminal(ask).await;
                        let decision = DecideApproval {
                            session_id: session_id.clone(),
                            approval_id: ask.approval_id.clone(),
                            approved,
                            remember: false,
                            reason: None,
                        };
                        if let Err(err) = service.decide_approval(decision) {
                            tracing::warn!("cannot decide approval: {err}");
                        }
                    }
                    Event::Error { session_id: id, .. } if *id == session_id => failed = true,
                    Event::Result { session_id: id, .. } if *id == session_id => failed = false,
                    _ => {}
                }
            }
            failed
        })
    };
    controller.submit(prompt, None)?;
    // Done when nothing runs and every sub-agent's report has been delivered.
    service.wait_idle().await;
    service.shutdown().await;
    done.cancel();
    let failed = printer.await.unwrap_or(true) || controller.is_paused();
    Ok(if failed { 1 } else { 0 })
}

async fn ask_on_terminal(ask: &bumblehive::protocol::ApprovalInfo) -> bool {
    let who = ask
        .title
        .as_ref()
        .map(|t| format!("sub-agent \"{t}\""))
        .unwrap_or_else(|| "the agent".into());
    let mut prompt = format!("\n{who} wants to run {} {}\n", ask.tool, ask.arguments);
    if let Some(diff) = &ask.diff {
        prompt.push_str(diff);
    }
    prompt.push_str("Approve? [y/N] ");
    tokio::task::spawn_blocking(move || {
        eprint!("{prompt}");
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).is_ok()
            && matches!(line.trim(), "y" | "Y" | "yes")
    })
    .await
    .unwrap_or(false)
}
