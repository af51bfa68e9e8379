//! The command sandbox's cost per command: median wall time of `run_command` with `true`, sandboxed (bubblewrap) against unsandboxed, with spare sandboxes and fresh ones; the nested-repository walk and environment detection (hardened git) of the workspace. `cargo bench --bench sandbox` (add `-- --quick` for a smoke run, `-- --workspace <repository>` to measure in a copy of a repository instead of an empty folder).
// A benchmark that cannot set itself up should stop loudly, like a test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bumblehive::sandbox::{CommandPolicy, CommandSettings};
use bumblehive::tools::{
    ApprovalAsk, ApprovalGate, Decision, RunCommand, ToolContext, ToolRegistry,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

struct Approve;

#[async_trait]
impl ApprovalGate for Approve {
    async fn ask(&self, _ask: ApprovalAsk, _cancel: &CancellationToken) -> Decision {
        Decision {
            approved: true,
            reason: None,
        }
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

async fn measure(
    settings: CommandSettings,
    ctx: &ToolContext,
    runs: usize,
    pause: Duration,
    cwd: &str,
) -> Duration {
    let mut registry = ToolRegistry::default();
    registry.register(RunCommand::configured(settings));
    let args = json!({"command": "true", "cwd": cwd});
    // Warm-up: detection, page cache.
    for _ in 0..3 {
        registry
            .call(ctx, "run_command", args.clone())
            .await
            .unwrap();
    }
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        // The time between two commands, outside the measured part: a model's turn.
        tokio::time::sleep(pause).await;
        let start = Instant::now();
        let out = registry
            .call(ctx, "run_command", args.clone())
            .await
            .unwrap();
        samples.push(start.elapsed());
        assert!(out.starts_with("exit code: 0"), "{out}");
    }
    median(samples)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let runs = if quick { 5 } else { 200 };
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let source = std::env::args().skip_while(|a| a != "--workspace").nth(1);
    match &source {
        // A copy (git clone), so that nothing of the repository itself is touched.
        Some(repo) => {
            let done = std::process::Command::new("git")
                .args(["clone", "-q", repo])
                .arg(&ws)
                .status()
                .unwrap();
            assert!(done.success());
        }
        None => std::fs::create_dir_all(&ws).unwrap(),
    }
    // A sub-folder to run in: a command there gets a fresh sandbox (spares are made only
    // for commands in the workspace itself).
    std::fs::create_dir_all(ws.join("bench-sub")).unwrap();
    let ctx = ToolContext {
        session_id: "bench".into(),
        workspace: ws.clone(),
        call_id: "call".into(),
        cancel: CancellationToken::new(),
        approvals: Arc::new(Approve),
        delegator: None,
        run_config: Default::default(),
        secret_env: Vec::new(),
        checkpoints: None,
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let status = bumblehive::sandbox::status_for(&CommandSettings::default());
        assert!(status.available, "no sandbox here: {status:?}");
        let off = CommandSettings {
            policy: CommandPolicy::Off,
            ..Default::default()
        };
        // Back to back (a spare sandbox is still being set up when the next command
        // comes), and with a pause between commands as a model's turn makes (the spare is
        // ready by then).
        println!(
            "workspace: {}",
            source.as_deref().unwrap_or("an empty folder")
        );
        for (what, pause, cwd) in [
            ("back to back", Duration::ZERO, "."),
            ("50 ms apart", Duration::from_millis(50), "."),
            (
                "50 ms apart, fresh sandboxes (in a sub-folder: no spare)",
                Duration::from_millis(50),
                "bench-sub",
            ),
        ] {
            // Interleaved rounds, so a noisy neighbour hurts both sides alike.
            let mut plain = Vec::new();
            let mut boxed = Vec::new();
            let before = bumblehive::sandbox::spare_stats();
            for _ in 0..3 {
                plain.push(measure(off.clone(), &ctx, runs / 3 + 1, pause, cwd).await);
                boxed.push(
                    measure(CommandSettings::default(), &ctx, runs / 3 + 1, pause, cwd).await,
                );
            }
            let after = bumblehive::sandbox::spare_stats();
            let (plain, boxed) = (median(plain), median(boxed));
            println!(
                "run_command `true`, {what}, median of {runs} runs: unsandboxed {:.2} ms, sandboxed {:.2} ms, added {:.2} ms ({} of the sandboxed runs in a spare sandbox)",
                plain.as_secs_f64() * 1e3,
                boxed.as_secs_f64() * 1e3,
                (boxed.as_secs_f64() - plain.as_secs_f64()) * 1e3,
                after.used - before.used
            );
        }
        // What each command also pays for `.git`: the walk for nested repositories (in
        // the sandbox's command line and before and after the command).
        let mut walks = Vec::new();
        let mut found = 0;
        for _ in 0..runs {
            let start = Instant::now();
            found = bumblehive::sandbox::nested_git(&ws).len();
            walks.push(start.elapsed());
        }
        println!(
            "nested-repository walk, median of {runs}: {:.3} ms ({found} found)",
            median(walks).as_secs_f64() * 1e3
        );
        // Environment detection with the hardened git (once per new session or sub-agent).
        let mut detects = Vec::new();
        for _ in 0..(runs / 10).max(3) {
            let start = Instant::now();
            let _ = bumblehive::context::environment::Environment::detect(&ws).await;
            detects.push(start.elapsed());
        }
        println!(
            "Environment::detect (hardened git), median of {}: {:.2} ms",
            detects.len(),
            median(detects).as_secs_f64() * 1e3
        );
    });
}
