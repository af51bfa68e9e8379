//! The command sandbox's cost per command: median wall time of `run_command` with `true`, sandboxed (bubblewrap) against unsandboxed. `cargo bench --bench sandbox` (add `-- --quick` for a smoke run).
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
) -> Duration {
    let mut registry = ToolRegistry::default();
    registry.register(RunCommand::configured(settings));
    // Warm-up: detection, page cache.
    for _ in 0..3 {
        registry
            .call(ctx, "run_command", json!({"command": "true"}))
            .await
            .unwrap();
    }
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        // The time between two commands, outside the measured part: a model's turn.
        tokio::time::sleep(pause).await;
        let start = Instant::now();
        let out = registry
            .call(ctx, "run_command", json!({"command": "true"}))
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
    std::fs::create_dir_all(&ws).unwrap();
    let ctx = ToolContext {
        session_id: "bench".into(),
        workspace: ws,
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
        for (what, pause) in [
            ("back to back", Duration::ZERO),
            ("50 ms apart", Duration::from_millis(50)),
        ] {
            // Interleaved rounds, so a noisy neighbour hurts both sides alike.
            let mut plain = Vec::new();
            let mut boxed = Vec::new();
            let before = bumblehive::sandbox::spare_stats();
            for _ in 0..3 {
                plain.push(measure(off.clone(), &ctx, runs / 3 + 1, pause).await);
                boxed.push(measure(CommandSettings::default(), &ctx, runs / 3 + 1, pause).await);
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
    });
}
