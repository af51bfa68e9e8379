//! The weeks-of-use soak (issue #27): one service, 50 workspaces each with a stdio MCP server, thousands of turns that call it, write files and run commands, day after simulated day; prints the data folder's size, open fds, live processes, RSS, live controllers and undo history at checkpoints. `cargo bench --bench weeks` (`-- --turns N`, default 20,000; `-- --quick` for 300).
// A benchmark that cannot set itself up should stop loudly, like a test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bumblehive::config::{Config, ToolPolicy};
use bumblehive::protocol::{Event, Role, ToolCall};
use bumblehive::provider::{
    ModelProvider, ModelRequest, ModelResponse, ProviderError, ProviderSink, fixed_provider,
};
use bumblehive::service::{RuntimeService, ServiceOptions};
use serde_json::json;

const WORKSPACES: usize = 50;
/// Workspaces in use on one simulated day; the day moves on to the next ones, so every
/// workspace is visited and then left (its MCP server must stop, review R9).
const PER_DAY: usize = 5;
const DAY_TURNS: usize = 200;
/// The undo history's bound per workspace, small enough for the soak to reach it.
const STORE_MB: u64 = 2;

/// Each turn: the workspace's MCP tool, a file written (a checkpoint), a command (the
/// sandbox), then an answer.
struct Scripted;

#[async_trait]
impl ModelProvider for Scripted {
    async fn generate(
        &self,
        request: ModelRequest,
        _sink: ProviderSink<'_>,
    ) -> Result<ModelResponse, ProviderError> {
        let messages = &request.messages;
        let start = messages
            .iter()
            .rposition(|m| m.role == Role::User)
            .unwrap_or(0);
        let turn = messages[start].text().to_string();
        let step = messages
            .iter()
            .skip(start)
            .filter(|m| m.role == Role::Assistant)
            .count();
        let call = |name: &str, arguments| {
            Ok(ModelResponse::tool_calls(vec![ToolCall {
                id: format!("{name}-{step}"),
                name: name.into(),
                arguments,
            }]))
        };
        match step {
            0 => call("mcp__notes__peek", json!({"names": ["HOME"]})),
            // New content every turn (about 16 KB), so the undo history grows until
            // its bound prunes it.
            1 => call(
                "write_file",
                json!({"path": format!("notes/{}.txt", turn.len() % 40),
                       "content": format!("{turn}\n").repeat(16_000 / (turn.len() + 1))}),
            ),
            2 => call("run_command", json!({"command": "echo ran >> log.txt"})),
            _ => Ok(ModelResponse::text("done")),
        }
    }
}

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Processes below this one (MCP servers, commands, git), read from /proc.
fn descendants() -> usize {
    let me = std::process::id();
    let mut parents: Vec<(u32, u32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // The command name is in parentheses and may hold spaces: read after the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
            parents.push((pid, ppid));
        }
    }
    let mut below = vec![me];
    let mut count = 0;
    while let Some(parent) = below.pop() {
        for (pid, _) in parents.iter().filter(|(_, ppid)| *ppid == parent) {
            count += 1;
            below.push(*pid);
            if std::env::var_os("SOAK_DEBUG").is_some() {
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                println!(
                    "  child {pid}: {}",
                    String::from_utf8_lossy(&cmd).replace('\0', " ")
                );
            }
        }
    }
    count
}

fn du(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    std::fs::read_dir(path)
        .map(|d| d.flatten().map(|e| du(&e.path())).sum())
        .unwrap_or(0)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let turns = if args.iter().any(|a| a == "--quick") {
        300
    } else {
        args.iter()
            .position(|a| a == "--turns")
            .and_then(|i| args.get(i + 1))
            .and_then(|n| n.parse().ok())
            .unwrap_or(20_000)
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(soak(turns));
}

async fn soak(turns: usize) {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let server = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp-servers/raw_server.py");
    let marks = root.path().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let mut workspaces: Vec<PathBuf> = Vec::new();
    for n in 0..WORKSPACES {
        let ws = root.path().join(format!("project-{n:02}"));
        std::fs::create_dir_all(ws.join("notes")).unwrap();
        std::fs::write(ws.join("README.md"), format!("project {n}\n")).unwrap();
        let entry = json!({"command": "python3", "args": [server.display().to_string()],
                           "env": {"MODE": "plain", "MARK_DIR": marks.display().to_string()}});
        std::fs::write(
            ws.join(".mcp.json"),
            json!({"mcpServers": {"notes": entry}}).to_string(),
        )
        .unwrap();
        workspaces.push(ws);
    }
    let mut config = Config::default();
    // Not the MCP tool: a workspace server may not take a policy entry of the person's
    // (security review 2, finding 12); `peek` is read-only and asks nothing.
    for tool in ["write_file", "run_command"] {
        config.tools.policy.insert(tool.into(), ToolPolicy::Allow);
    }
    config.checkpoints.max_store_mb = STORE_MB;
    // A left workspace's server stops after this long unused (the default is 10 min).
    config.mcp.workspace_idle_stop_sec = Some(2.0);
    config.provider.context_window = Some(100_000_000);
    // A config file, as the app has: MCP trust is kept beside it.
    let config_path = root.path().join("config.json");
    std::fs::write(&config_path, serde_json::to_vec(&config).unwrap()).unwrap();
    let service = RuntimeService::new(ServiceOptions {
        data_dir: data.clone(),
        config_path: Some(config_path),
        config: None,
        provider_factory: fixed_provider(Arc::new(Scripted)),
        tools: None,
    })
    .expect("service");
    for ws in &workspaces {
        let listed = service
            .trust_mcp_workspace(ws.to_str().unwrap(), true)
            .expect("trust");
        if std::env::var_os("SOAK_DEBUG").is_some() {
            println!("{listed:?}");
        }
    }
    println!(
        "soak: {WORKSPACES} workspaces ({PER_DAY} a day, {DAY_TURNS} turns a day), {turns} turns; undo bound {STORE_MB} MB per workspace"
    );
    println!(
        "{:>7} {:>8} {:>9} {:>9} {:>5} {:>6} {:>8} {:>11} {:>12}",
        "turns",
        "secs",
        "data_MiB",
        "undo_MiB",
        "fds",
        "procs",
        "rss_MiB",
        "controllers",
        "max_store_MiB"
    );
    let report_at: Vec<usize> = [1, 10, 100, 1_000, 5_000, 10_000, 15_000, 20_000, turns]
        .into_iter()
        .filter(|n| *n <= turns)
        .collect();
    let started = Instant::now();
    let mut sessions: Vec<(usize, String)> = Vec::new();
    let mut day = usize::MAX;
    let mut approvals = 0;
    for turn in 0..turns {
        if turn / DAY_TURNS != day {
            day = turn / DAY_TURNS;
            // A new day: new sessions in the day's workspaces; yesterday's are left.
            sessions = (0..PER_DAY)
                .map(|k| {
                    let w = (day * PER_DAY + k) % WORKSPACES;
                    let info = service
                        .create_session(workspaces[w].to_str().unwrap(), None)
                        .expect("session");
                    (w, info.session_id)
                })
                .collect();
        }
        let (_, id) = &sessions[turn % PER_DAY];
        let ctl = service.controller(id).expect("controller");
        let (mut events, _) = ctl.subscribe();
        ctl.submit(format!("turn {turn} of day {day}"), None)
            .expect("submit");
        loop {
            match events.next_event().await.expect("events") {
                Event::Result { session_id, .. } if &session_id == id => break,
                // The workspace server's tool asks once; remembered after that.
                Event::ApprovalRequest(info) => {
                    approvals += 1;
                    service
                        .decide_approval(bumblehive::protocol::commands::DecideApproval {
                            session_id: info.session_id,
                            approval_id: info.approval_id,
                            approved: true,
                            remember: true,
                            reason: None,
                        })
                        .expect("approve");
                }
                Event::Error {
                    session_id,
                    message,
                } if &session_id == id => {
                    panic!("turn {turn} failed: {message}")
                }
                _ => {}
            }
        }
        drop(events);
        drop(ctl);
        if turn == 0 && std::env::var_os("SOAK_DEBUG").is_some() {
            println!(
                "after: {:?}",
                service.list_mcp_servers(Some(workspaces[0].to_str().unwrap()))
            );
            let history = service.store().load(id).unwrap().messages;
            for m in &history {
                println!(
                    "{:?}: {}",
                    m.role,
                    m.text().chars().take(200).collect::<String>()
                );
            }
        }
        let done = turn + 1;
        if report_at.contains(&done) {
            // Each workspace's shadow store is a folder under `<data>/checkpoints`; the
            // sessions' call records are its `sessions/` (they go with their session).
            let mut undo = 0;
            let mut max_undo = 0;
            for entry in std::fs::read_dir(data.join("checkpoints"))
                .into_iter()
                .flatten()
                .flatten()
            {
                let bytes = du(&entry.path());
                undo += bytes;
                if entry.file_name() != "sessions" {
                    max_undo = max_undo.max(bytes);
                }
            }
            println!(
                "{:>7} {:>8.1} {:>9.1} {:>9.1} {:>5} {:>6} {:>8.1} {:>11} {:>12.2}",
                done,
                started.elapsed().as_secs_f64(),
                mib(du(&data)),
                mib(undo),
                open_fds(),
                descendants(),
                status_kib("VmRSS:") as f64 / 1024.0,
                service.live_controllers(),
                mib(max_undo),
            );
        }
    }
    let starts = std::fs::read_to_string(marks.join("pid"))
        .map(|s| s.lines().count())
        .unwrap_or(0);
    println!(
        "MCP server starts: {starts} over {} simulated days; approvals asked: {approvals}",
        turns.div_ceil(DAY_TURNS)
    );
    let stop = Instant::now();
    service.shutdown().await;
    println!(
        "shutdown: {:.0} ms; processes left: {}",
        stop.elapsed().as_secs_f64() * 1000.0,
        descendants()
    );
}
