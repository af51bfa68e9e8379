//! The `bumblehive` command: `serve` (the headless HTTP + SSE server), `run` (one prompt, for people or as JSON lines: `run_cli.rs`) and `acp` (an Agent Client Protocol agent on stdio).

mod run_cli;

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use bumblehive::config::{Config, default_config_path, default_data_dir};
use bumblehive::providers::provider_from_config;
use bumblehive::server::{ServerOptions, allowed_hosts, check_token, generate_token, router};
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
        /// Use this token instead of the kept or a generated one.
        #[arg(long)]
        token: Option<String>,
        /// Make a fresh token instead of reusing the one in `<data dir>/server-token`
        /// (open tabs then need the new address).
        #[arg(long, conflicts_with = "token")]
        new_token: bool,
        /// Also serve the built web UI from this folder.
        #[arg(long)]
        ui: Option<PathBuf>,
    },
    /// Run one prompt in a workspace and exit when all work is done (its sub-agents'
    /// too): the answer streams to stdout, a line per tool call and sub-agent to stderr.
    #[command(after_help = run_cli::EXIT_HELP)]
    Run {
        /// The workspace folder (default: the current folder).
        #[arg(long)]
        workspace: Option<PathBuf>,
        /// Approve every request without asking.
        #[arg(long)]
        yes: bool,
        /// Print every event as one JSON line on stdout instead of text.
        #[arg(long)]
        json: bool,
        prompt: String,
    },
    /// Speak the Agent Client Protocol on stdin/stdout (for Zed, JetBrains and other ACP
    /// editors); logs go to stderr and the log file, never stdout.
    Acp,
}

/// Daily log files kept; older ones are deleted.
const LOG_FILES_KEPT: usize = 7;

fn main() -> std::process::ExitCode {
    match start() {
        Ok(code) => code,
        Err(err) => {
            // Whatever kept the command from starting or serving (the config, the
            // workspace, the data folder in use): one line, and its own exit code.
            eprintln!("bumblehive: {err:#}");
            std::process::ExitCode::from(run_cli::EXIT_NOT_STARTED)
        }
    }
}

fn start() -> anyhow::Result<std::process::ExitCode> {
    // Before anything else: commands this process starts cannot read its memory or
    // /proc/<pid>/environ (finding 2).
    bumblehive::sandbox::harden_process();
    raise_file_limit();
    let cli = Cli::parse();
    let data_dir = cli.data_dir.clone().unwrap_or_else(default_data_dir);
    // Logs go to stderr and to a daily file in the data dir (the settings page shows
    // where), in a folder only this user can open (they hold paths and errors).
    let log_dir = bumblehive::config::log_dir(&data_dir);
    private_dir(&log_dir)?;
    let appender = tracing_appender::rolling::RollingFileAppender::builder()
        .rotation(tracing_appender::rolling::Rotation::DAILY)
        .filename_prefix("bumblehive")
        .filename_suffix("log")
        .max_log_files(LOG_FILES_KEPT)
        .build(&log_dir)
        .with_context(|| format!("cannot write logs in {}", log_dir.display()))?;
    // A queue of 4,096 lines for the writer thread, not the default 128,000: that queue's
    // slots are all written when it is made (4 MiB resident for good and ~1,000 page
    // faults before a one-shot `run` sends its first request), and at the info level a
    // burst of 4,096 lines before the writer catches up does not happen (issue #31).
    let (file, _flush_on_exit) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .buffered_lines_limit(4096)
        .finish(appender);
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

/// Creates a folder (and its parents) that only this user can open.
fn private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot make {} private", dir.display()))?;
    Ok(())
}

/// Many event streams and a burst of local connections need more than the usual 1024
/// descriptors: the soft limit goes up to the hard one.
fn raise_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max.min(65536);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

fn build_service(config_path: &Path, data_dir: &Path) -> anyhow::Result<RuntimeService> {
    // Load first so a broken file stops the start with its line number, untouched.
    let config = Config::load(config_path)?;
    bumblehive::sandbox::configure(&config.tools.command);
    // The token, the histories and the config's secrets stay out of commands' reach
    // wherever they are (security review 2, finding 10).
    bumblehive::sandbox::hide(&[data_dir.to_path_buf(), config_path.to_path_buf()]);
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
    let service = match build_service(&config_path, &data_dir) {
        Ok(service) => service,
        Err(err) => {
            // `run` beside the app (or `serve`, `acp`): the owner of the folder runs it.
            if let (
                Command::Run {
                    workspace,
                    yes,
                    json,
                    prompt,
                },
                Some(bumblehive::error::RuntimeError::InUse(
                    bumblehive::owner::OwnerError::InUse { pid, .. },
                )),
            ) = (&cli.command, err.downcast_ref())
            {
                let workspace = match workspace {
                    Some(workspace) => workspace.clone(),
                    None => std::env::current_dir().context("the current folder")?,
                };
                let output = if *json {
                    run_cli::Output::Json
                } else {
                    run_cli::Output::Text
                };
                let handed =
                    run_cli::run_at_owner(&data_dir, pid, &workspace, *yes, output, prompt.clone())
                        .await?;
                if let Some(code) = handed {
                    return Ok(std::process::ExitCode::from(code));
                }
            }
            return Err(err);
        }
    };
    match cli.command {
        Command::Serve {
            port,
            host,
            token,
            new_token,
            ui,
        } => {
            // The kept token unless one is given or a fresh one asked for: a restarted
            // server keeps its open tabs signed in (D27).
            let token = token.or_else(|| (!new_token).then(|| kept_token(&data_dir)).flatten());
            service.keep_spare_sessions();
            serve(service, &data_dir, SocketAddr::new(host, port), token, ui).await?;
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Run {
            workspace,
            yes,
            json,
            prompt,
        } => {
            let workspace = match workspace {
                Some(workspace) => workspace,
                None => std::env::current_dir().context("the current folder")?,
            };
            let output = if json {
                run_cli::Output::Json
            } else {
                run_cli::Output::Text
            };
            let code = run_cli::run_once(service, &workspace, yes, output, prompt).await?;
            Ok(std::process::ExitCode::from(code))
        }
        Command::Acp => {
            let stop = CancellationToken::new();
            take_runs(&service, &data_dir, "bumblehive acp", stop.clone());
            service.keep_spare_sessions();
            bumblehive::acp::serve_stdio(service.clone()).await;
            stop.cancel();
            // The client went away (stdin closed): runs stop, as after SIGTERM for `serve`.
            stop_within_deadline(&service).await;
            Ok(std::process::ExitCode::SUCCESS)
        }
    }
}

/// A later `bumblehive run` on this data folder is run here (`owner_run`); a desktop start
/// is told there is no window to bring forward.
fn take_runs(
    service: &RuntimeService,
    data_dir: &Path,
    who: &'static str,
    stop: CancellationToken,
) {
    let open: bumblehive::owner::HandoffHandler =
        Arc::new(move |_| bumblehive::protocol::OwnerReply {
            ok: false,
            message: format!("it is `{who}`, which has no window"),
        });
    let runs = bumblehive::owner_run::handler(service.clone());
    if let Err(err) = bumblehive::owner::listen_with_runs(data_dir, open, Some(runs), stop) {
        tracing::warn!("a later `bumblehive run` cannot hand its prompt to this process: {err}");
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
    if let Some(token) = &token {
        check_token(token).map_err(|err| anyhow::anyhow!("--token: {err}"))?;
    }
    let token = token.unwrap_or_else(generate_token);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let bound = listener.local_addr()?;
    // Only once listening: a start that fails must not replace a running server's token.
    write_token_file(data_dir, &token)?;
    let shutdown = CancellationToken::new();
    take_runs(&service, data_dir, "bumblehive serve", shutdown.clone());
    let app = router(
        service.clone(),
        ServerOptions {
            token: token.clone(),
            ui_dir: ui,
            shutdown: shutdown.clone(),
            allowed_hosts: if addr.ip().is_unspecified() {
                Vec::new()
            } else {
                allowed_hosts(bound)
            },
        },
    );
    // Signal handlers are in place before anyone is told where to connect: a SIGTERM
    // right after the first line still shuts down cleanly.
    let signals = Signals::new()?;
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
        signals.wait().await;
        signal.cancel();
    });
    // On the signal, runs are stopped at once, alongside the (bounded) drain of open
    // connections: a half-sent request or a blocked command never delays the exit (C14).
    let stopping = async {
        shutdown.cancelled().await;
        stop_within_deadline(&service).await;
    };
    let (served, ()) = tokio::join!(
        bumblehive::server::serve(listener, app, shutdown.clone()),
        stopping
    );
    served.context("server failed")?;
    tracing::info!("stopped");
    Ok(())
}

/// Longest wait for the runs to stop after SIGINT/SIGTERM, or at the end of `run`: a
/// stop request ends the process within 5 s whatever an MCP server, a model server or a
/// command does (MCP supervisors get 3 s of it, then are aborted; issue 27).
const SERVICE_STOP: std::time::Duration = std::time::Duration::from_secs(5);

/// Stops every run and task, waiting at most [`SERVICE_STOP`]: a server or task that
/// does not stop must not keep the command from exiting (review R6); what is left dies
/// with the process.
async fn stop_within_deadline(service: &RuntimeService) {
    if tokio::time::timeout(SERVICE_STOP, service.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "runs did not stop within {} s; exiting anyway",
            SERVICE_STOP.as_secs()
        );
    }
}

/// SIGINT and SIGTERM, registered when made.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
            terminate: signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
        })
    }

    async fn wait(mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

/// The token goes to a file only its user can read, for tools that start the server: a
/// fresh file (O_EXCL|O_NOFOLLOW, mode 0600 whatever the umask) renamed over the old
/// name, so neither a symlink planted there nor an old file's mode is ever used.
fn write_token_file(data_dir: &Path, token: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::create_dir_all(data_dir)?;
    let path = data_dir.join("server-token");
    let temp = data_dir.join(format!(
        ".server-token.{}.tmp",
        uuid::Uuid::new_v4().simple()
    ));
    let written = (|| -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temp)?;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.write_all(token.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&temp, &path)
    })();
    if let Err(err) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(err).with_context(|| format!("cannot write {}", path.display()));
    }
    Ok(())
}

/// The token a previous `serve` wrote to `<data dir>/server-token`, when it can be
/// trusted: a regular file (opened with O_NOFOLLOW, so never through a symlink) owned by
/// this user, mode 0600 (nobody else could have read or planted it), holding a token that
/// `check_token` accepts. Anything else is ignored and a fresh token is made (finding 10).
fn kept_token(data_dir: &Path) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let path = data_dir.join("server-token");
    // O_NONBLOCK: a FIFO planted at the name cannot hang the start.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path);
    let file = match file {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return None,
        Err(err) => {
            // ELOOP: a symlink at the name; never followed.
            tracing::warn!("not reusing {}: {err}; making a new token", path.display());
            return None;
        }
    };
    // Checked on the open file, so what was checked is what is read.
    let meta = file.metadata().ok()?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let trusted = meta.file_type().is_file()
        && meta.uid() == me
        && meta.mode() & 0o777 == 0o600
        && meta.len() <= 4096;
    if !trusted {
        tracing::warn!(
            "not reusing {}: not a private regular file of this user; making a new token",
            path.display()
        );
        return None;
    }
    let mut token = String::new();
    file.take(4096).read_to_string(&mut token).ok()?;
    match check_token(&token) {
        Ok(()) => Some(token),
        Err(err) => {
            tracing::warn!("not reusing {}: {err}; making a new token", path.display());
            None
        }
    }
}
