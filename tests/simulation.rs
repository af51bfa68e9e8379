//! The randomized interleaving test (SPEC §12, issue 25): a seeded generator drives the real service through random sequences of the person's and the model's actions, restarts and crashes, and checks the invariants after every step; a seed reproduces its sequence, and a failure prints the seed and the sequence.
//!
//! The way FoundationDB and TigerBeetle test theirs, scaled to one test binary: the
//! service runs on a runtime of its own with two worker threads, so the background work
//! (runs, children, reports, flushes) really interleaves with the steps; the steps
//! themselves come from the seed alone. A crash stops that runtime at once
//! (`shutdown_timeout`): every task is dropped at its next await point, as a killed process
//! stops, and a new service on the same data folder recovers. The model is scripted by the
//! text it is given (`PLAN:` for a parent, `Task:` for a child), so every run ends.
//!
//! A second mode kills a real process: the same steps run in a child process (this test
//! binary again, `simulation_child_process`), which the test kills with SIGKILL at seeded
//! step boundaries while its background work goes on, then starts again on the same data
//! folder, as the crash harness does; what the person did survives in a state file, so the
//! invariants are checked across every kill.
//!
//! Invariants are written down in `tests/SIMULATION.md`, next to SPEC §12.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bumblehive::config::Config;
use bumblehive::fsutil::WriteGate;
use bumblehive::invariant::{OrderError, check_message_order};
use bumblehive::protocol::{Message, Role, SessionState, ToolCall};
use bumblehive::provider::{
    ModelProvider, ModelRequest, ModelResponse, ProviderError, ProviderSink, fixed_provider,
};
use bumblehive::service::{RuntimeService, ServiceOptions};
use bumblehive::tools::ToolRegistry;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::lifecycle::GateTool;

/// The seeds CI runs (each a different mix; see `scripts/simulate.sh` for longer runs).
const CI_SEEDS: &[u64] = &[1, 2, 3, 5, 8, 13, 21, 34, 55, 89];
const CI_STEPS: usize = 70;
/// How many simulated kills at a write this process recovered from (for the summary).
static KILLS_AT_WRITES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Process mode: the seeds CI kills for real, how many steps each, how many kills.
const KILL_SEEDS: &[u64] = &[1, 2, 3, 4, 5, 6, 7, 12];
const KILL_STEPS: usize = 60;
const KILLS: usize = 3;
/// Process mode: the person's ledger, the config and the steps so far, kept across kills.
const STATE_FILE: &str = "sim-state.json";
/// Process mode: what the child prints after each step (the test kills it at one).
const STEP_LINE: &str = "SIMSTEP ";

/// The scripted model: a parent follows the plan in its first message (`PLAN:d2,w,g1,m,t`)
/// one step per model call, a child the plan after `Task:`; past its plan, or on any
/// later run, it answers in text. Summary calls (no tools) get a summary. Every request
/// is checked against SPEC §2 as it arrives.
struct Model {
    violations: Mutex<Vec<String>>,
    /// The service's simulated kill between two writes: once it has happened, the
    /// runtime goes on in memory with a disk that no longer follows (every write fails)
    /// until the step ends and the simulation recovers a new service; what it asks the
    /// model meanwhile is what no killed process would ask, so it is not checked.
    gate: Mutex<Option<Arc<WriteGate>>>,
    /// Numbers the answers: each answer's text is unique in this process (with the
    /// process id, across kills), so a report can be told from another (`check_quiet`).
    answers: std::sync::atomic::AtomicU64,
}

fn plan_of(request: &ModelRequest) -> (bool, Vec<String>) {
    let first = request
        .messages
        .iter()
        .find(|m| m.role == Role::User)
        .map(Message::text)
        .unwrap_or("");
    let (child, plan) = match first.split_once("\nTask:\n") {
        Some((_, task)) => (true, task),
        None => (false, first),
    };
    let steps = plan
        .split_once("PLAN:")
        .map(|(_, p)| p.split_whitespace().next().unwrap_or(""))
        .unwrap_or("")
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    (child, steps)
}

fn call(id: String, name: &str, arguments: Value) -> ToolCall {
    ToolCall {
        id,
        name: name.into(),
        arguments,
    }
}

#[async_trait]
impl ModelProvider for Model {
    async fn generate(
        &self,
        request: ModelRequest,
        _sink: ProviderSink<'_>,
    ) -> Result<ModelResponse, ProviderError> {
        let killed = (self.gate.lock().unwrap().as_ref()).is_some_and(|g| g.killed());
        if let Err(err) = check_message_order(&request.messages.to_vec())
            && !killed
        {
            self.violations
                .lock()
                .unwrap()
                .push(format!("a request broke SPEC §2: {err}"));
        }
        if request.tools.is_empty() {
            return Ok(ModelResponse::text("SUMMARY of the conversation so far"));
        }
        let (child, steps) = plan_of(&request);
        let step = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        // Ids unique per session and step: the same call id is never reused by accident.
        let tag = request.messages.len();
        let Some(action) = steps.get(step) else {
            let n = self
                .answers
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Ok(ModelResponse::text(format!(
                "{} done after {step} steps (answer {}:{n})",
                if child { "child" } else { "parent" },
                std::process::id()
            )));
        };
        let tools: BTreeSet<&str> = request.tools.iter().map(|t| t.name.as_str()).collect();
        let response = match action.chars().next().unwrap_or('t') {
            'd' if tools.contains("sub_agent") => {
                let n: usize = action[1..].parse().unwrap_or(1);
                let worktree = action.ends_with('x');
                ModelResponse::tool_calls(
                    (0..n.max(1))
                        .map(|i| {
                            let mut args = json!({
                                "title": format!("c{step}-{i}"),
                                "task": format!("PLAN:{}", ["g1,t", "w,t", "t", "g2,w,t"][(step + i) % 4]),
                            });
                            if worktree {
                                args["isolation"] = json!("worktree");
                            }
                            call(format!("d{tag}-{i}"), "sub_agent", args)
                        })
                        .collect(),
                )
            }
            'm' if tools.contains("message_subagent") => {
                // The first child this session delegated, from its pending result.
                let task = request.messages.iter().find_map(|m| {
                    let v: Value = serde_json::from_str(m.text()).ok()?;
                    (v["status"] == "pending").then(|| v["task_id"].as_str().map(str::to_string))?
                });
                match task {
                    Some(task) => ModelResponse::tool_calls(vec![call(
                        format!("m{tag}"),
                        "message_subagent",
                        json!({"task_id": task, "message": "one more thing"}),
                    )]),
                    None => ModelResponse::text("nothing to follow up"),
                }
            }
            'w' => ModelResponse::tool_calls(vec![call(
                format!("w{tag}"),
                "write_file",
                json!({"path": format!("out-{tag}.txt"), "content": "x"}),
            )]),
            'g' => ModelResponse::tool_calls(vec![call(
                format!("g{tag}"),
                "wait_gate",
                json!({"gate": format!("g{}", &action[1..])}),
            )]),
            'r' => ModelResponse::tool_calls(vec![call(
                format!("r{tag}"),
                "read_file",
                json!({"path": "data.txt"}),
            )]),
            _ => ModelResponse::text(format!("answer at step {step}")),
        };
        Ok(response)
    }
}

/// What the person did that the invariants need: every message they sent (and where),
/// what they discarded, what they deleted. In process mode it is kept in the state file
/// across kills.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Ledger {
    sent: BTreeMap<String, String>,
    discarded: BTreeSet<String>,
    deleted: BTreeSet<String>,
    /// The person's messages that began a child's next run (status `started`).
    started: BTreeSet<String>,
    /// Messages the person steered out of a pending queue (into a run, maybe mid-run).
    steered: BTreeSet<String>,
    /// Per renamed session, the titles its meta may hold: the one the last answered
    /// rename gave, and one whose call a kill may have cut short.
    #[serde(default)]
    titles: BTreeMap<String, BTreeSet<String>>,
}

struct Sim {
    seed: u64,
    rng: StdRng,
    dir: PathBuf,
    /// The folder, removed with the simulation (none in process mode: the test owns it).
    _temp: Option<tempfile::TempDir>,
    model: Arc<Model>,
    gates: Arc<GateTool>,
    rt: Option<Arc<tokio::runtime::Runtime>>,
    service: Option<RuntimeService>,
    log: Vec<String>,
    book: Ledger,
    config: Value,
    /// A restart (false) or crash (true) the step asked for, done once its context is left.
    restart_next: Option<bool>,
    /// Process mode: the process may be killed at any time, so the ledger is kept on disk.
    killable: bool,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().to_path_buf();
        Sim::first(seed, dir, Some(temp))
    }

    /// A new simulation in `dir`: a workspace (a repository) and a config from the seed.
    fn first(seed: u64, dir: PathBuf, temp: Option<tempfile::TempDir>) -> Sim {
        let mut rng = StdRng::seed_from_u64(seed);
        let workspace = dir.join("ws");
        std::fs::create_dir_all(&workspace).unwrap();
        std::fs::write(workspace.join("data.txt"), "DATA").unwrap();
        // A repository, so children may be isolated in worktrees.
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .args(args)
                .current_dir(&workspace)
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false)
        };
        let repo = git(&["init", "-q"])
            && git(&["-c", "user.email=s@s", "-c", "user.name=s", "add", "."])
            && git(&[
                "-c",
                "user.email=s@s",
                "-c",
                "user.name=s",
                "commit",
                "-qm",
                "init",
            ]);
        assert!(repo, "git is needed for the simulation's worktrees");
        let slots = [json!(1), json!(2), Value::Null][rng.random_range(0..3)].clone();
        let config = json!({
            "provider": {"max_concurrent": slots},
            "subagents": {"max_concurrent": rng.random_range(1..=4)},
        });
        let mut sim = Sim {
            seed,
            rng,
            dir,
            _temp: temp,
            model: Arc::new(Model {
                violations: Mutex::new(Vec::new()),
                gate: Mutex::new(None),
                answers: Default::default(),
            }),
            gates: GateTool::new(),
            rt: None,
            service: None,
            log: vec![format!("config {config}")],
            book: Ledger::default(),
            config,
            restart_next: None,
            killable: false,
        };
        sim.open();
        sim
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn workspace(&self) -> String {
        self.dir.join("ws").display().to_string()
    }

    fn open(&mut self) {
        let rt = runtime();
        let mut tools = ToolRegistry::standard();
        tools.register(self.gates.clone());
        let config = Config::default().patched(&self.config).unwrap();
        let options = ServiceOptions {
            data_dir: self.data(),
            config_path: None,
            config: Some(config),
            provider_factory: fixed_provider(self.model.clone()),
            tools: Some(tools),
        };
        let service = rt.block_on(async { RuntimeService::new(options) });
        match service {
            Ok(service) => {
                // Every other seed makes its sessions from spare folders (as the desktop,
                // `serve` and `acp` do), with the maker's writes and the claims among the
                // kill points; the others file by file (as `run` does).
                if self.seed % 2 == 0 {
                    service.keep_spare_sessions();
                }
                *self.model.gate.lock().unwrap() = Some(service.store().write_gate());
                self.service = Some(service);
                self.rt = Some(Arc::new(rt));
            }
            Err(err) => self.fail(&format!("the service did not start: {err}")),
        }
    }

    fn service(&self) -> &RuntimeService {
        self.service.as_ref().unwrap()
    }

    fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.rt.as_ref().unwrap().block_on(future)
    }

    fn fail(&self, what: &str) -> ! {
        panic!(
            "simulation seed {} failed: {what}\nsteps:\n  {}",
            self.seed,
            self.log.join("\n  ")
        );
    }

    fn sessions(&self) -> Vec<bumblehive::protocol::SessionInfo> {
        self.service().list_sessions(None).unwrap_or_default()
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> Option<T> {
        (!items.is_empty()).then(|| items[self.rng.random_range(0..items.len())].clone())
    }

    fn random_plan(&mut self) -> String {
        let steps = ["d1", "d2", "d3", "w", "g1", "g2", "m", "r", "d1x", "t"];
        let n = self.rng.random_range(1..=4);
        let plan: Vec<&str> = (0..n)
            .map(|_| steps[self.rng.random_range(0..steps.len())])
            .collect();
        format!("PLAN:{}", plan.join(","))
    }

    /// One random step; returns what it did, for the log.
    fn step(&mut self) -> String {
        self.recover_if_killed("between the steps");
        // The service's sync calls may start tasks: they run in its runtime's context.
        let did = {
            let rt = self.rt.clone().unwrap();
            let _context = rt.enter();
            self.step_in_context()
        };
        if self.recover_if_killed("during the step") {
            self.restart_next = None;
        }
        if let Some(crash) = self.restart_next.take() {
            self.restart(crash);
        }
        did
    }

    /// Whether the simulated kill between two writes has happened. The runtime's code
    /// goes on in memory after it, its writes refused: a person's message it answers for
    /// then must be on the disk already (the service refuses one it could not write), so
    /// such an answer is booked like any other; a refused discard may have taken effect.
    fn killed(&self) -> bool {
        self.service().store().write_gate().killed()
    }

    /// The simulated kill between two writes, if it has happened: the runtime is stopped
    /// as a crash stops it and a new service recovers from what the writes before the
    /// kill left. Returns whether it had happened.
    fn recover_if_killed(&mut self, when: &str) -> bool {
        if !self.killed() {
            return false;
        }
        self.log
            .push(format!("     (the kill at a write happened {when})"));
        KILLS_AT_WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.restart(true);
        true
    }

    /// Before a quiet point or a clean restart: an armed kill that has not happened is
    /// taken back, one that has is recovered from.
    fn settle_kill(&mut self) {
        if !self.service().store().write_gate().disarm() {
            self.recover_if_killed("before a quiet point");
        }
    }

    fn step_in_context(&mut self) -> String {
        let sessions = self.sessions();
        let ids: Vec<String> = sessions.iter().map(|s| s.session_id.clone()).collect();
        let children: Vec<String> = sessions
            .iter()
            .filter(|s| s.parent_session_id.is_some())
            .map(|s| s.session_id.clone())
            .collect();
        let roll = self.rng.random_range(0..100);
        match roll {
            0..=11 => {
                let plan = self.random_plan();
                let workspace = self.workspace();
                let info = match self.service().create_session(&workspace, None) {
                    Ok(info) => info,
                    Err(err) => return format!("create refused: {err}"),
                };
                let sent = self.block_on(self.service().submit_message(
                    &info.session_id,
                    plan.clone(),
                    None,
                ));
                match sent {
                    Ok((id, status)) => {
                        self.book.sent.insert(id.clone(), info.session_id.clone());
                        format!("new parent {} {plan}: {id} {status:?}", info.session_id)
                    }
                    Err(err) => format!("new parent refused: {err}"),
                }
            }
            12..=21 => {
                let Some(target) = self.pick(&ids) else {
                    return "no session to write to".into();
                };
                let text = if self.rng.random_bool(0.5) {
                    "Try the task again."
                } else {
                    "a note from the person"
                };
                let sent = self.block_on(self.service().submit_message(&target, text.into(), None));
                match sent {
                    Ok((id, status)) => {
                        self.book.sent.insert(id.clone(), target.clone());
                        if status == bumblehive::protocol::MessageStatus::Started
                            && children.contains(&target)
                        {
                            self.book.started.insert(id.clone());
                        }
                        format!("person writes to {target}: {id} {status:?}")
                    }
                    Err(err) => format!("person's message to {target} refused: {err}"),
                }
            }
            22..=29 => {
                let Some(target) = self.pick(&ids) else {
                    return "nothing to steer".into();
                };
                let Ok(ctl) = self.service().controller(&target) else {
                    return format!("steer: {target} gone");
                };
                let pending = ctl.pending();
                let Some(message) = self.pick(&pending) else {
                    return format!("nothing pending in {target}");
                };
                if self.rng.random_bool(0.25) {
                    // Marked before the call: a process killed right after the discard
                    // must not count the message as lost.
                    self.book.discarded.insert(message.message_id.clone());
                    self.persist_if_killable();
                    match ctl.discard(&message.message_id) {
                        Ok(()) => format!("discard {} in {target}", message.message_id),
                        // Cut short by the kill: it may have taken effect, as when a
                        // real process is killed in the call.
                        Err(err) if self.killed() => {
                            format!("discard cut short by the kill: {err}")
                        }
                        Err(err) => {
                            self.book.discarded.remove(&message.message_id);
                            format!("discard refused: {err}")
                        }
                    }
                } else {
                    self.book.steered.insert(message.message_id.clone());
                    format!(
                        "steer {} in {target}: {:?}",
                        message.message_id,
                        ctl.steer(&message.message_id)
                    )
                }
            }
            30..=37 => {
                let Some(target) = self.pick(&ids) else {
                    return "nothing to stop".into();
                };
                let stopped = self.block_on(async {
                    tokio::time::timeout(
                        Duration::from_secs(20),
                        self.service().cancel_session(&target),
                    )
                    .await
                });
                match stopped {
                    Err(_) => self.fail(&format!("Stop on {target} hung")),
                    Ok(result) => format!("stop {target}: {result:?}"),
                }
            }
            38..=41 => {
                let interrupted: Vec<String> = sessions
                    .iter()
                    .filter(|s| s.interrupted)
                    .map(|s| s.session_id.clone())
                    .collect();
                let Some(target) = self.pick(&interrupted) else {
                    return "nothing interrupted".into();
                };
                if self.rng.random_bool(0.7) {
                    let resumed = self.block_on(self.service().resume_subagent(&target));
                    format!("resume {target}: {resumed:?}")
                } else {
                    let cancelled = self.block_on(self.service().cancel_session(&target));
                    format!("cancel interrupted {target}: {cancelled:?}")
                }
            }
            42..=55 => self.decide_one(),
            56..=65 => {
                let gate = format!("g{}", self.rng.random_range(1..=2));
                self.gates.gate(&gate).set();
                format!("open gate {gate}")
            }
            66..=70 => {
                let Some(target) = self.pick(&ids) else {
                    return "nothing to compact".into();
                };
                match self.service().controller(&target) {
                    Ok(ctl) => format!("compact {target}: {:?}", ctl.compact()),
                    Err(err) => format!("compact {target}: {err}"),
                }
            }
            71..=75 => {
                let pool = if self.rng.random_bool(0.6) && !children.is_empty() {
                    children.clone()
                } else {
                    ids.clone()
                };
                let Some(target) = self.pick(&pool) else {
                    return "nothing to delete".into();
                };
                let deleted = self.block_on(async {
                    tokio::time::timeout(
                        Duration::from_secs(20),
                        self.service().delete_session(&target),
                    )
                    .await
                });
                match deleted {
                    Err(_) => self.fail(&format!("deleting {target} hung")),
                    Ok(Ok(())) => {
                        self.book.deleted.insert(target.clone());
                        format!("delete {target}")
                    }
                    Ok(Err(err)) => format!("delete {target}: {err}"),
                }
            }
            76..=80 => self.change_config(),
            81..=83 => {
                self.restart_next = Some(false);
                "restart".into()
            }
            84..=86 => {
                self.restart_next = Some(true);
                "crash".into()
            }
            87..=89 => {
                // A kill between two writes, anywhere: after `writes` more writes of the
                // data folder (whoever makes them), in this step or a later one.
                let gate = self.service().store().write_gate();
                if gate.armed() {
                    return "a kill at a write is armed already".into();
                }
                // One that happens from here on stays (`kill_after` keeps it), and the
                // check after this step recovers from it.
                let writes = self.rng.random_range(0..40);
                // Half of the kills come at once; the others stall the write they land
                // on, holding the window before it open while the next steps run (a
                // follow-up sent while a report's line waits to be written, say).
                let stall = if self.rng.random_bool(0.5) {
                    Duration::ZERO
                } else {
                    Duration::from_millis(self.rng.random_range(1..=25))
                };
                gate.kill_after(writes, stall);
                format!("kill after {writes} more writes, the last stalled {stall:?}")
            }
            90..=91 => {
                let Some(target) = self.pick(&ids) else {
                    return "nothing to rename".into();
                };
                let title = format!("title {}", self.log.len());
                // Booked before the call: a process killed in it may have written it, or
                // not (then the title before stays, the one it was made with the first
                // time).
                let current = sessions
                    .iter()
                    .find(|s| s.session_id == target)
                    .map(|s| s.title.clone())
                    .unwrap_or_default();
                let titles = self.book.titles.entry(target.clone()).or_default();
                if titles.is_empty() {
                    titles.insert(current);
                }
                titles.insert(title.clone());
                self.persist_if_killable();
                match self.service().rename_session(&target, &title) {
                    Ok(_) => {
                        self.book
                            .titles
                            .insert(target.clone(), [title.clone()].into());
                        format!("rename {target} to {title:?}")
                    }
                    Err(err) => {
                        // Refused: the disk keeps the title before.
                        if let Some(titles) = self.book.titles.get_mut(&target) {
                            titles.remove(&title);
                        }
                        format!("rename {target} refused: {err}")
                    }
                }
            }
            _ => {
                // Let the background work go on for a moment (no step waits on it).
                let micros = self.rng.random_range(0..3000);
                self.block_on(tokio::time::sleep(Duration::from_micros(micros)));
                format!("let {micros} µs pass")
            }
        }
    }

    fn open_approvals(&self) -> Vec<(String, String)> {
        let mut open = Vec::new();
        for info in self.sessions() {
            if info.parent_session_id.is_some() {
                continue;
            }
            if let Ok(ctl) = self.service().controller(&info.session_id) {
                for approval in ctl.snapshot().approvals {
                    open.push((info.session_id.clone(), approval.approval_id));
                }
            }
        }
        open
    }

    fn decide_one(&mut self) -> String {
        let open = self.open_approvals();
        let Some((session, approval)) = self.pick(&open) else {
            return "no approval open".into();
        };
        let approved = self.rng.random_bool(0.6);
        let decided =
            self.service()
                .decide_approval(bumblehive::protocol::commands::DecideApproval {
                    session_id: session.clone(),
                    approval_id: approval.clone(),
                    approved,
                    remember: false,
                    reason: None,
                });
        format!("decide {approval} in {session}: {approved} {decided:?}")
    }

    /// SPEC §6 / §12.8: a refused change changes nothing.
    fn change_config(&mut self) -> String {
        let patch = if self.rng.random_bool(0.5) {
            json!({"subagents": {"max_concurrent": self.rng.random_range(1..=4)}})
        } else {
            let slots = [json!(1), json!(2), Value::Null][self.rng.random_range(0..3)].clone();
            json!({"provider": {"max_concurrent": slots}})
        };
        let before = serde_json::to_value(self.service().config()).unwrap();
        match self.service().update_config(&patch) {
            Ok(_) => {
                json_merge(&mut self.config, &patch);
                format!("config {patch}: applied")
            }
            Err(err) => {
                let after = serde_json::to_value(self.service().config()).unwrap();
                if before != after {
                    self.fail(&format!(
                        "a refused config change changed the config: {err}"
                    ));
                }
                format!("config {patch}: {}", err.code())
            }
        }
    }

    /// Process mode: the next epoch of a simulation whose last process was killed. What
    /// the person did and the steps so far come from the state file; the service starts on
    /// the data folder the killed process left, and nothing may be running after its
    /// recovery (§12.4, §12.7).
    fn after_kill(seed: u64, dir: PathBuf, epoch: u64) -> Sim {
        let state: Value =
            serde_json::from_slice(&std::fs::read(dir.join(STATE_FILE)).unwrap()).unwrap();
        let mut sim = Sim {
            seed,
            // Each epoch draws its own steps; the seed and the epoch fix them.
            rng: StdRng::seed_from_u64(seed ^ (epoch << 40)),
            dir,
            _temp: None,
            model: Arc::new(Model {
                violations: Mutex::new(Vec::new()),
                gate: Mutex::new(None),
                answers: Default::default(),
            }),
            gates: GateTool::new(),
            rt: None,
            service: None,
            log: serde_json::from_value(state["log"].clone()).unwrap(),
            book: serde_json::from_value(state["book"].clone()).unwrap(),
            config: state["config"].clone(),
            restart_next: None,
            killable: true,
        };
        sim.log
            .push(format!("--- killed with SIGKILL; epoch {epoch} starts"));
        sim.open();
        sim.nothing_runs_after_a_start();
        sim
    }

    /// Process mode: what the next process needs if this one is killed now. Replaced
    /// atomically, so a kill leaves the old state or the new; no fsync, since a killed
    /// process loses nothing the kernel already has.
    fn persist(&self) {
        let state = json!({"config": self.config, "book": self.book, "log": self.log});
        let temp = self.dir.join(format!("{STATE_FILE}.tmp"));
        std::fs::write(&temp, serde_json::to_vec(&state).unwrap()).unwrap();
        std::fs::rename(&temp, self.dir.join(STATE_FILE)).unwrap();
    }

    fn persist_if_killable(&self) {
        if self.killable {
            self.persist();
        }
    }

    fn nothing_runs_after_a_start(&self) {
        for info in self.sessions() {
            if info.state == SessionState::Running {
                self.fail(&format!(
                    "{} is running right after a start",
                    info.session_id
                ));
            }
        }
    }

    /// A restart (`crash: false`: shutdown, then a new service) or a crash: the runtime is
    /// stopped where it is, every task dropped at its next await, and a new service starts
    /// on what is on disk.
    fn restart(&mut self, crash: bool) {
        if !crash && !self.service().store().write_gate().disarm() {
            // The armed kill happened first: this restart is that crash.
            self.log
                .push("     (the kill at a write happened before the restart)".into());
            return self.restart(true);
        }
        let service = self.service.take().unwrap();
        let rt = Arc::try_unwrap(self.rt.take().unwrap())
            .unwrap_or_else(|_| panic!("the runtime is still in use"));
        if crash {
            drop(service);
            rt.shutdown_timeout(Duration::from_secs(10));
        } else {
            let done = rt.block_on(async {
                tokio::time::timeout(Duration::from_secs(20), service.shutdown()).await
            });
            if done.is_err() {
                self.fail("shutdown hung");
            }
            drop(service);
            rt.shutdown_timeout(Duration::from_secs(10));
        }
        self.open();
        // After a restart nothing is running that no process runs (§12.4, §12.7).
        self.nothing_runs_after_a_start();
    }

    /// Checks what must hold at every step, while work goes on.
    fn check_live(&self) {
        if let Some(violation) = self.model.violations.lock().unwrap().first() {
            self.fail(violation);
        }
        for info in self.sessions() {
            let Ok(loaded) = self.service().store().load(&info.session_id) else {
                continue;
            };
            match check_message_order(&loaded.messages) {
                Ok(()) | Err(OrderError::Unanswered { .. }) => {}
                Err(err) => self.fail(&format!(
                    "history of {} breaks SPEC §2: {err}",
                    info.session_id
                )),
            }
        }
    }

    /// Lets every run end: gates opened, approvals decided, interrupted children resumed
    /// or cancelled; then waits until the runtime is idle.
    fn quiesce(&mut self) {
        self.settle_kill();
        let rt = self.rt.clone().unwrap();
        let _context = rt.enter();
        for round in 0..200 {
            for gate in ["g1", "g2"] {
                self.gates.gate(gate).set();
            }
            for (session, approval) in self.open_approvals() {
                let _ = self.service().decide_approval(
                    bumblehive::protocol::commands::DecideApproval {
                        session_id: session,
                        approval_id: approval,
                        approved: round % 2 == 0,
                        remember: false,
                        reason: None,
                    },
                );
            }
            for info in self.sessions() {
                if info.interrupted {
                    let _ = self.block_on(self.service().cancel_session(&info.session_id));
                }
            }
            let idle = self.block_on(async {
                tokio::time::timeout(Duration::from_millis(200), self.service().wait_idle()).await
            });
            if idle.is_ok() && self.open_approvals().is_empty() {
                let interrupted = self.sessions().iter().any(|s| s.interrupted);
                if !interrupted {
                    return;
                }
            }
        }
        let service = self.service();
        let busy: Vec<String> = self
            .sessions()
            .into_iter()
            .filter_map(|info| {
                let ctl = service.controller(&info.session_id).ok()?;
                let snapshot = ctl.snapshot();
                (snapshot.running || info.state == SessionState::Running).then(|| {
                    format!(
                        "{} ({:?}, child of {:?}): running {}, approvals {}, pending {}, subagents {:?}",
                        info.session_id,
                        info.state,
                        info.parent_session_id,
                        snapshot.running,
                        snapshot.approvals.len(),
                        snapshot.pending.len(),
                        snapshot.subagents.iter().map(|s| (&s.session_id, s.state)).collect::<Vec<_>>()
                    )
                })
            })
            .collect();
        self.fail(&format!(
            "the runtime never became idle: {} runs, {} tasks; {busy:#?}",
            service.active_runs(),
            service.subagents().len()
        ));
    }

    /// Checks what must hold once nothing runs (SPEC §12).
    fn check_quiet(&self) {
        self.check_live();
        let service = self.service();
        let sessions = self.sessions();
        let by_id: HashMap<&str, &bumblehive::protocol::SessionInfo> = sessions
            .iter()
            .map(|s| (s.session_id.as_str(), s))
            .collect();
        // §12.5: the list matches the folders.
        let folders: BTreeSet<String> = std::fs::read_dir(self.data().join("sessions"))
            .map(|dir| {
                dir.flatten()
                    .filter(|e| e.path().join("meta.json").exists())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let listed: BTreeSet<String> = sessions.iter().map(|s| s.session_id.clone()).collect();
        if folders != listed {
            self.fail(&format!(
                "the list and the folders differ: listed {listed:?}, folders {folders:?}"
            ));
        }
        let mut histories: HashMap<String, Vec<Message>> = HashMap::new();
        for info in &sessions {
            // §12.4: nothing runs without a task.
            if info.state == SessionState::Running {
                let meta = service.store().meta(&info.session_id).ok();
                let parent_exists = info
                    .parent_session_id
                    .as_deref()
                    .is_none_or(|p| by_id.contains_key(p));
                let live = service
                    .controller(&info.session_id)
                    .map(|c| c.is_running())
                    .unwrap_or(false);
                self.fail(&format!(
                    "{} is running with nothing running it (parent there: {parent_exists}, controller running: {live}, meta: {meta:?})",
                    info.session_id
                ));
            }
            let loaded = service.store().load(&info.session_id).unwrap();
            // §12.3: every history is valid.
            if let Err(err) = check_message_order(&loaded.messages) {
                self.fail(&format!(
                    "history of {} breaks SPEC §2: {err}",
                    info.session_id
                ));
            }
            histories.insert(info.session_id.clone(), loaded.messages);
        }
        if !service.subagents().is_empty() || service.active_runs() != 0 {
            self.fail("idle, but tasks or runs are left");
        }
        let pending = |id: &str| -> Vec<String> {
            service
                .controller(id)
                .map(|c| c.pending().into_iter().map(|p| p.message_id).collect())
                .unwrap_or_default()
        };
        // §12.2: every message the person sent is in its session once, or pending once, or
        // was discarded by the person, or went with a deleted session.
        for (message, session) in &self.book.sent {
            if !by_id.contains_key(session.as_str()) || self.book.discarded.contains(message) {
                continue;
            }
            let in_history = histories[session]
                .iter()
                .filter(|m| m.id.as_deref() == Some(message.as_str()))
                .count();
            let queued = pending(session).iter().filter(|p| *p == message).count();
            if in_history + queued != 1 {
                self.fail(&format!(
                    "the person's message {message} to {session} is in its history {in_history} times and pending {queued} times"
                ));
            }
        }
        // A rename the person was told of is what the session and the list say (a full
        // disk or a kill refuses it, never answers it and loses it).
        for (session, titles) in &self.book.titles {
            let Some(info) = by_id.get(session.as_str()) else {
                continue;
            };
            let stored = service.store().meta(session).unwrap().title;
            if !titles.contains(&stored) || info.title != stored {
                self.fail(&format!(
                    "{session} is titled {stored:?} on disk and {:?} in the list; renamed to one of {titles:?}",
                    info.title
                ));
            }
        }
        // §12.1: every child's reports, once each, numbered 1…n, none owed.
        for child in sessions.iter().filter(|s| s.parent_session_id.is_some()) {
            let parent = child.parent_session_id.as_deref().unwrap_or_default();
            let Some(task) = child.task_id.as_deref() else {
                continue;
            };
            let meta = service.store().meta(&child.session_id).unwrap();
            if !meta.reported && meta.task_content.is_some() {
                self.fail(&format!(
                    "{} owes a report with nothing running",
                    child.session_id
                ));
            }
            if !by_id.contains_key(parent) {
                self.fail(&format!("{} outlived its parent", child.session_id));
            }
            let ledger = service.store().ledger(parent).unwrap_or_default();
            let numbers: Vec<u32> = ledger
                .records
                .iter()
                .filter(|r| r.child_session_id == child.session_id)
                .map(|r| report_number(&r.message_id, task))
                .collect();
            let expected: Vec<u32> = (1..=numbers.len() as u32).collect();
            let mut sorted = numbers.clone();
            sorted.sort();
            if sorted != expected || numbers.len() as u32 != meta.reports {
                let records: Vec<String> = ledger
                    .records
                    .iter()
                    .filter(|r| r.child_session_id == child.session_id)
                    .map(|r| {
                        format!(
                            "{} {:?}",
                            r.message_id,
                            r.content.chars().take(120).collect::<String>()
                        )
                    })
                    .collect();
                self.fail(&format!(
                    "{}: reports recorded {numbers:?}, meta says {}: {records:#?}",
                    child.session_id, meta.reports
                ));
            }
            // Each run's answer is reported: a person's message that began the child's
            // next run follows the answer that ended the run before (unless the person
            // later steered it out of a queue, maybe into a run mid-way), and that answer
            // is in one of the child's reports. Counts alone miss an answer lost to a
            // later run's report taking its number.
            let history = &histories[&child.session_id];
            // An answer that ended a run (not stopped) and is in none of the child's
            // reports.
            let unreported = |m: &Message| {
                m.role == Role::Assistant
                    && m.tool_calls.is_empty()
                    && !m.stopped
                    && !ledger.records.iter().any(|r| {
                        r.child_session_id == child.session_id && r.content.contains(m.text())
                    })
            };
            for (at, message) in history.iter().enumerate() {
                let Some(id) = message.id.as_deref() else {
                    continue;
                };
                if !self.book.started.contains(id) || self.book.steered.contains(id) {
                    continue;
                }
                let Some(before) = history[..at].iter().rev().find(|m| !m.is_note()) else {
                    continue;
                };
                if unreported(before) {
                    self.fail(&format!(
                        "{}: the answer {:?} before the person's {id} was never reported\n{}",
                        child.session_id,
                        before.text(),
                        child_story(&meta, history, &ledger, &child.session_id)
                    ));
                }
            }
            // And the answer its history ends with (unless stopped): the last run's. A
            // report lost while a follow-up waited to begin leaves no started message in
            // the history to find it by when the child is then cancelled, not resumed.
            if let Some(last) = history.iter().rev().find(|m| !m.is_note())
                && unreported(last)
            {
                self.fail(&format!(
                    "{}: its last answer {:?} was never reported\n{}",
                    child.session_id,
                    last.text(),
                    child_story(&meta, history, &ledger, &child.session_id)
                ));
            }
            let queued = pending(parent);
            for record in ledger
                .records
                .iter()
                .filter(|r| r.child_session_id == child.session_id)
            {
                if ledger.discarded.contains(record.key()) {
                    continue;
                }
                let delivered = histories[parent]
                    .iter()
                    .filter(|m| m.id.as_deref() == Some(record.message_id.as_str()))
                    .count()
                    + queued.iter().filter(|q| **q == record.message_id).count();
                if delivered != 1 {
                    self.fail(&format!(
                        "report {} of {} reached its parent {delivered} times",
                        record.message_id, child.session_id
                    ));
                }
            }
        }
    }
}

/// What a failure about a child's reports needs to be read: its meta, the end of its
/// history and its reports.
fn child_story(
    meta: &bumblehive::store::SessionMeta,
    history: &[Message],
    ledger: &bumblehive::store::Ledger,
    child: &str,
) -> String {
    let tail: Vec<String> = history
        .iter()
        .rev()
        .take(6)
        .rev()
        .map(|m| {
            format!(
                "{:?} {:?} {:?}{}{}",
                m.role,
                m.id,
                m.text().chars().take(80).collect::<String>(),
                if m.tool_calls.is_empty() {
                    ""
                } else {
                    " (tool calls)"
                },
                if m.stopped { " (stopped)" } else { "" }
            )
        })
        .collect();
    let reports: Vec<String> = ledger
        .records
        .iter()
        .filter(|r| r.child_session_id == child)
        .map(|r| {
            format!(
                "{} {:?}",
                r.message_id,
                r.content.chars().take(100).collect::<String>()
            )
        })
        .collect();
    format!(
        "meta: state {:?}, reported {}, reports {}, interrupted {}, run_message {:?}\nhistory ({} messages), last: {tail:#?}\nreports: {reports:#?}",
        meta.state,
        meta.reported,
        meta.reports,
        meta.interrupted,
        meta.run_message,
        history.len()
    )
}

/// The number of a report's message id for `task` (1 for `subagent:<task>`).
fn report_number(message_id: &str, task: &str) -> u32 {
    let rest = message_id
        .strip_prefix("subagent:")
        .and_then(|r| r.strip_prefix(task))
        .unwrap_or("");
    rest.strip_prefix(':')
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

fn json_merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(target), Value::Object(patch)) => {
            for (key, value) in patch {
                json_merge(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
        (target, patch) => *target = patch.clone(),
    }
}

/// Runs one seed for `steps` steps, checking after every step and at a quiet point every
/// so often and at the end.
pub fn run_seed(seed: u64, steps: usize) {
    let mut sim = Sim::new(seed);
    sim.run_steps(0..steps);
    sim.finish();
}

impl Sim {
    /// Steps `range`, checking after every step, and at a quiet point every 25 steps.
    /// A killable simulation keeps its ledger on disk after each step and says which step
    /// it finished (the test may kill it there, with its background work going on).
    fn run_steps(&mut self, range: std::ops::Range<usize>) {
        for index in range {
            let did = self.step();
            self.log.push(format!("{index:3}: {did}"));
            self.persist_if_killable();
            self.check_live();
            if index % 25 == 24 {
                self.quiesce();
                self.log.push(format!("{index:3}: (quiet)"));
                self.persist_if_killable();
                self.check_quiet();
            }
            if self.killable {
                use std::io::Write;
                println!("{STEP_LINE}{index}");
                let _ = std::io::stdout().flush();
            }
        }
    }

    /// The end of a simulation: quiet, checked, restarted, checked again, shut down.
    fn finish(mut self) {
        let sim = &mut self;
        let seed = sim.seed;
        sim.quiesce();
        sim.check_quiet();
        // And once more after a restart: nothing is delivered twice, nothing comes back.
        sim.restart(false);
        sim.quiesce();
        sim.check_quiet();
        if std::env::var_os("BUMBLEHIVE_SIM_LOG").is_some() {
            println!("seed {seed}:\n  {}", sim.log.join("\n  "));
        }
        let service = sim.service.take().unwrap();
        let rt = Arc::try_unwrap(sim.rt.take().unwrap())
            .unwrap_or_else(|_| panic!("the runtime is still in use"));
        rt.block_on(service.shutdown());
        drop(service);
        rt.shutdown_timeout(Duration::from_secs(10));
    }
}

fn seeds_from_env() -> Option<(Vec<u64>, usize)> {
    let seeds = std::env::var("BUMBLEHIVE_SIM_SEEDS").ok()?;
    let seeds: Vec<u64> = if let Some((from, to)) = seeds.split_once("..") {
        (from.parse().ok()?..to.parse().ok()?).collect()
    } else {
        seeds
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect()
    };
    let steps = std::env::var("BUMBLEHIVE_SIM_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(CI_STEPS);
    Some((seeds, steps))
}

/// The fixed seeds of CI (or `BUMBLEHIVE_SIM_SEEDS=1..500 BUMBLEHIVE_SIM_STEPS=200`).
#[test]
fn simulation_random_interleavings_keep_every_invariant() {
    let (seeds, steps) = seeds_from_env().unwrap_or((CI_SEEDS.to_vec(), CI_STEPS));
    let started = std::time::Instant::now();
    for seed in &seeds {
        run_seed(*seed, steps);
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "simulation: {} seeds × {steps} steps in {secs:.1} s ({:.0} sequences per minute), {} kills at a write",
        seeds.len(),
        seeds.len() as f64 * 60.0 / secs.max(0.001),
        KILLS_AT_WRITES.load(std::sync::atomic::Ordering::Relaxed)
    );
}

/// Process mode, the child's side: one epoch of a killed simulation, run when the test
/// below starts this binary again (`BUMBLEHIVE_SIM_CHILD` names the folder); a plain
/// `cargo test -- --ignored` run finds no variable and does nothing.
#[test]
#[ignore = "run by simulation_sigkill_at_random_points_keeps_every_invariant in a child process"]
fn simulation_child_process() {
    let Some(dir) = std::env::var_os("BUMBLEHIVE_SIM_CHILD").map(PathBuf::from) else {
        return;
    };
    let number = |name: &str| -> usize {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} is not set"))
    };
    let (seed, epoch) = (
        number("BUMBLEHIVE_SIM_SEED") as u64,
        number("BUMBLEHIVE_SIM_EPOCH"),
    );
    let (from, steps) = (
        number("BUMBLEHIVE_SIM_FROM"),
        number("BUMBLEHIVE_SIM_STEPS"),
    );
    let mut sim = if epoch == 0 {
        let mut sim = Sim::first(seed, dir, None);
        sim.killable = true;
        sim.persist();
        sim
    } else {
        Sim::after_kill(seed, dir, epoch as u64)
    };
    sim.run_steps(from..steps);
    sim.finish();
    println!("{STEP_LINE}done");
}

/// Process mode, the test's side: each seed's steps run in a child process that is killed
/// with SIGKILL right after seeded steps (its runs, tasks, flushes and git still going),
/// then started again on the same folders, KILLS times; the last process finishes the
/// steps and checks every invariant once more after a clean restart. A failure prints the
/// seed, every step of every epoch, and where each kill landed.
#[test]
fn simulation_sigkill_at_random_points_keeps_every_invariant() {
    use std::io::BufRead;
    let seeds: Vec<u64> = std::env::var("BUMBLEHIVE_SIM_KILL_SEEDS")
        .ok()
        .map(|s| s.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| KILL_SEEDS.to_vec());
    let exe = std::env::current_exe().unwrap();
    for seed in seeds {
        let mut temp = tempfile::tempdir().unwrap();
        let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(7919));
        let mut kills: Vec<usize> = (0..KILLS)
            .map(|_| rng.random_range(3..KILL_STEPS - 3))
            .collect();
        kills.sort_unstable();
        kills.dedup();
        let mut from = 0;
        let mut landed = Vec::new();
        for epoch in 0..=kills.len() {
            let kill_at = kills.get(epoch).copied();
            let mut child = std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "simulation::simulation_child_process",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("BUMBLEHIVE_SIM_CHILD", temp.path())
                .env("BUMBLEHIVE_SIM_SEED", seed.to_string())
                .env("BUMBLEHIVE_SIM_EPOCH", epoch.to_string())
                .env("BUMBLEHIVE_SIM_FROM", from.to_string())
                .env("BUMBLEHIVE_SIM_STEPS", KILL_STEPS.to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
            let mut output = Vec::new();
            let mut killed = false;
            let mut done = false;
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                // Anywhere in the line: libtest prints "test … ... " before the test's
                // own first line.
                if let Some((_, step)) = line.split_once(STEP_LINE) {
                    done |= step == "done";
                    if kill_at.is_some() && step.parse().ok() == kill_at {
                        // SIGKILL: no destructor, no flush, no shutdown of anything.
                        child.kill().unwrap();
                        killed = true;
                        landed.push(format!("epoch {epoch}: killed after step {step}"));
                        break;
                    }
                } else {
                    output.push(line);
                }
            }
            let status = child.wait().unwrap();
            let mut stderr = String::new();
            if let Some(mut err) = child.stderr.take() {
                use std::io::Read;
                let _ = err.read_to_string(&mut stderr);
            }
            let steps = std::fs::read(temp.path().join(STATE_FILE))
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .map(|s| s["log"].clone())
                .unwrap_or_default();
            let failed = if killed {
                false
            } else {
                !status.success() || !done
            };
            if failed && std::env::var_os("BUMBLEHIVE_SIM_KEEP").is_some() {
                // For reading a failure's data folder (messages.jsonl, meta.json, ledgers).
                let kept = std::mem::replace(&mut temp, tempfile::tempdir().unwrap()).keep();
                eprintln!(
                    "simulation seed {seed}: its folders are kept in {}",
                    kept.display()
                );
            }
            assert!(
                !failed,
                "simulation seed {seed} (killed with SIGKILL: {landed:?}) failed in epoch {epoch} ({status}):\n{}\n{stderr}\nsteps so far: {steps:#}",
                output.join("\n")
            );
            from = kill_at.map_or(KILL_STEPS, |k| k + 1);
        }
        println!("simulation seed {seed}, process mode: {landed:?}");
    }
}
