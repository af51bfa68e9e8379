//! `bumblehive acp` driven by the official ACP client SDKs (issue #29): the Python SDK from PyPI (`tests/acp/client.py`) and the TypeScript SDK from npm (`tests/acp/client.ts`, advertising sub-agents), each spawning the real binary against the scripted model server. `scripts/acp-test-clients.sh` installs them; without them these tests fail and say so.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::mock_llm::{LiveStream, MockLlm, MockResponse, RecordedRequest, openai};

/// The longest a whole client script may take.
const SCRIPT_WAIT: Duration = Duration::from_secs(90);

fn missing(what: &str) -> ! {
    panic!("{what} is not installed: run ./scripts/acp-test-clients.sh (the ACP tests need it)")
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The venv's Python with the ACP SDK.
fn python() -> PathBuf {
    let venv = std::env::var_os("BUMBLEHIVE_ACP_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/bumblehive-acp/venv")
        });
    let python = venv.join("bin/python");
    if !python.exists() {
        missing("the Python ACP SDK venv (PyPI agent-client-protocol)");
    }
    python
}

/// The compiled TypeScript client.
fn node_client() -> PathBuf {
    let script = repo().join("tests/acp/dist/client.js");
    if !script.exists()
        || !repo()
            .join("tests/acp/node_modules/@agentclientprotocol/sdk")
            .exists()
    {
        missing("the TypeScript ACP SDK client (npm @agentclientprotocol/sdk)");
    }
    script
}

/// The scripted model: it answers by what the request holds (sessions run side by side,
/// so no queue order). Sub-agents' first answers are held until `release`.
#[derive(Clone, Default)]
struct Model(Arc<Mutex<ModelState>>);

#[derive(Default)]
struct ModelState {
    released: bool,
    held: Vec<(LiveStream, String)>,
    /// Children held until a moment of their scenario (`open`): delta (queued after
    /// Stop) until its parent is stopped, epsilon (steering) until its parent waits
    /// for a permission.
    gates: std::collections::HashMap<&'static str, Gate>,
    /// The cancelled turn's stream, kept open until the test ends.
    hanging: Vec<LiveStream>,
}

/// An answer held until its gate opens; once open, answered at once.
#[derive(Default)]
struct Gate {
    open: bool,
    held: Vec<(LiveStream, String)>,
}

fn text_of(message: &Value) -> String {
    message["content"].as_str().unwrap_or_default().to_string()
}

impl Model {
    fn respond(&self, request: &RecordedRequest) -> MockResponse {
        let messages = request.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let users: Vec<&Value> = messages.iter().filter(|m| m["role"] == "user").collect();
        let first = users.first().map(|m| text_of(m)).unwrap_or_default();
        let last = messages.last().cloned().unwrap_or(Value::Null);
        if first.contains("Task:\nALPHA") {
            if last["role"] == "tool" {
                return MockResponse::sse(openai::text_answer(&["ALPHA_DONE"], (10, 2)));
            }
            return self.held(openai::tool_answer(
                &[("alpha-read", "read_file", json!({"path": "hello.txt"}))],
                (10, 2),
            ));
        }
        if first.contains("Task:\nDELTA") {
            return self.gated("delta", openai::text_answer(&["DELTA_DONE"], (10, 2)));
        }
        if first.contains("Task:\nEPSILON") {
            return self.gated("epsilon", openai::text_answer(&["EPSILON_DONE"], (10, 2)));
        }
        if first.contains("Task:\nGAMMA") {
            // Works until the client stops it.
            let (response, live) = MockResponse::live();
            live.send(openai::data(&openai::role()));
            live.send(openai::data(&openai::text("working")));
            self.0.lock().unwrap().hanging.push(live);
            return response;
        }
        if first.contains("Task:\nBETA") {
            return self.held(openai::text_answer(&["BETA_DONE"], (10, 2)));
        }
        // The person's last own message says which turn this is.
        let asked = users
            .iter()
            .rev()
            .map(|m| text_of(m))
            .find(|t| !t.starts_with("[Background tool result]"))
            .unwrap_or_default();
        if asked == "delegate delta" && text_of(&last) != "delegate delta" {
            // After delegating: streams until the client stops the session (whatever
            // report came in meanwhile).
            let (response, live) = MockResponse::live();
            live.send(openai::data(&openai::role()));
            live.send(openai::data(&openai::text("thinking")));
            self.0.lock().unwrap().hanging.push(live);
            return response;
        }
        if asked == "steer" {
            // Steering at a safe point (the seed's report during an approval): the
            // delegation, then a write that asks; epsilon ends while the permission is
            // open, so its report must come right after the write's result, in this turn.
            return MockResponse::sse(
                match (last["role"].as_str(), last["tool_call_id"].as_str()) {
                    (Some("user"), _) if text_of(&last) == "steer" => openai::tool_answer(
                        &[(
                            "call-epsilon",
                            "sub_agent",
                            json!({"title": "epsilon", "task": "EPSILON"}),
                        )],
                        (20, 3),
                    ),
                    (Some("tool"), Some("call-epsilon")) => openai::tool_answer(
                        &[(
                            "call-write-e",
                            "write_file",
                            json!({"path": "e.txt", "content": "epsilon\n"}),
                        )],
                        (20, 3),
                    ),
                    (Some("user"), _) if text_of(&last).contains("EPSILON_DONE") => {
                        openai::text_answer(&["STEERED epsilon_done_seen"], (20, 3))
                    }
                    _ => openai::text_answer(&["STEER-WITHOUT-REPORT"], (20, 3)),
                },
            );
        }
        if last["role"] == "tool" {
            let answer = match asked.as_str() {
                "read hello" => "READ-DONE",
                "write a" => "WRITE-1-DONE",
                "write b" => "WRITE-2-DONE",
                "plan" => "PLANNED",
                "delegate" | "delegate gamma" => "DELEGATED",
                _ => "UNEXPECTED",
            };
            return MockResponse::sse(openai::text_answer(&[answer], (20, 3)));
        }
        let text = text_of(&last);
        if text.starts_with("[Background tool result]") || text == "resume" {
            // A wake-up: answer what the trailing reports said.
            let mut seen = Vec::new();
            for message in messages.iter().rev() {
                if message["role"] != "user" {
                    break;
                }
                let report = text_of(message);
                for token in ["ALPHA_DONE", "BETA_DONE", "DELTA_DONE"] {
                    if report.contains(token) {
                        seen.push(format!("{}_seen", token.to_lowercase()));
                    }
                }
            }
            let answer = format!("WOKE {}", seen.join(" "));
            return MockResponse::sse(openai::text_answer(&[&answer], (20, 3)));
        }
        match text.as_str() {
            "read hello" => MockResponse::sse(openai::tool_answer(
                &[("call-read", "read_file", json!({"path": "hello.txt"}))],
                (20, 3),
            )),
            "write a" => MockResponse::sse(openai::tool_answer(
                &[(
                    "call-write-a",
                    "write_file",
                    json!({"path": "a.txt", "content": "alpha\n"}),
                )],
                (20, 3),
            )),
            "write b" => MockResponse::sse(openai::tool_answer(
                &[(
                    "call-write-b",
                    "write_file",
                    json!({"path": "b.txt", "content": "beta\n"}),
                )],
                (20, 3),
            )),
            "plan" => MockResponse::sse(openai::tool_answer(
                &[(
                    "call-plan",
                    "update_plan",
                    json!({"plan": [
                        {"step": "Read the code", "status": "completed"},
                        {"step": "Fix the bug", "status": "in_progress"},
                        {"step": "Run the tests", "status": "pending"}
                    ]}),
                )],
                (20, 3),
            )),
            "fail" => MockResponse::error(
                500,
                r#"{"error":{"message":"the scripted model failed","type":"server_error"}}"#,
            ),
            "hang" => {
                let (response, live) = MockResponse::live();
                live.send(openai::data(&openai::role()));
                live.send(openai::data(&openai::text("partial")));
                self.0.lock().unwrap().hanging.push(live);
                response
            }
            "delegate" => MockResponse::sse(openai::tool_answer(
                &[
                    (
                        "call-alpha",
                        "sub_agent",
                        json!({"title": "alpha", "task": "ALPHA"}),
                    ),
                    (
                        "call-beta",
                        "sub_agent",
                        json!({"title": "beta", "task": "BETA"}),
                    ),
                ],
                (20, 3),
            )),
            "delegate delta" => MockResponse::sse(openai::tool_answer(
                &[(
                    "call-delta",
                    "sub_agent",
                    json!({"title": "delta", "task": "DELTA"}),
                )],
                (20, 3),
            )),
            "delegate gamma" => MockResponse::sse(openai::tool_answer(
                &[(
                    "call-gamma",
                    "sub_agent",
                    json!({"title": "gamma", "task": "GAMMA"}),
                )],
                (20, 3),
            )),
            _ => MockResponse::sse(openai::text_answer(&["UNEXPECTED"], (20, 3))),
        }
    }

    /// An answer sent at once after `release`, held until then.
    fn held(&self, body: String) -> MockResponse {
        let mut state = self.0.lock().unwrap();
        if state.released {
            return MockResponse::sse(body);
        }
        let (response, live) = MockResponse::live();
        state.held.push((live, body));
        response
    }

    /// An answer held until `open(gate)`.
    fn gated(&self, gate: &'static str, body: String) -> MockResponse {
        let mut state = self.0.lock().unwrap();
        let gate = state.gates.entry(gate).or_default();
        if gate.open {
            return MockResponse::sse(body);
        }
        let (response, live) = MockResponse::live();
        gate.held.push((live, body));
        response
    }

    fn open(&self, gate: &'static str) {
        let mut state = self.0.lock().unwrap();
        let gate = state.gates.entry(gate).or_default();
        gate.open = true;
        for (live, body) in gate.held.drain(..) {
            live.send(body);
            live.finish();
        }
    }

    fn release(&self) {
        let mut state = self.0.lock().unwrap();
        state.released = true;
        for (live, body) in state.held.drain(..) {
            live.send(body);
            live.finish();
        }
    }
}

struct Setup {
    dir: tempfile::TempDir,
    workspace: PathBuf,
    model: Model,
    mock: MockLlm,
}

async fn setup() -> Setup {
    let mock = MockLlm::start().await;
    let model = Model::default();
    let handler = model.clone();
    mock.respond_with(move |request| handler.respond(request));
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("hello.txt"), "hello from the workspace\n").unwrap();
    let config = json!({
        "provider": {"kind": "openai", "base_url": format!("{}/v1", mock.url()), "model": "scripted",
                      "max_retries": 0}
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    Setup {
        workspace: workspace.canonicalize().unwrap(),
        dir,
        model,
        mock,
    }
}

/// Runs a client script to its end; releases the sub-agents when it says the delegating
/// prompt ended. Returns its `facts` line.
async fn run_client(program: &Path, script: &Path, setup: &Setup) -> Value {
    let mut child = tokio::process::Command::new(program)
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_bumblehive"))
        .arg(setup.dir.path().join("config.json"))
        .arg(setup.dir.path().join("data"))
        .arg(&setup.workspace)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut facts = None;
    let read = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let Ok(value) = serde_json::from_str::<Value>(&line) else {
                panic!("the client printed a line that is not JSON: {line}");
            };
            if value["ev"] == "prompt_ended" && value["name"] == "delegate" {
                setup.model.release();
            }
            if value["ev"] == "prompt_ended" && value["name"] == "queue_stop" {
                setup.model.open("delta");
            }
            if value["ev"] == "permission_asked" && value["path"] == "e.txt" {
                setup.model.open("epsilon");
            }
            if value["ev"] == "facts" {
                facts = Some(value);
            }
        }
    };
    tokio::time::timeout(SCRIPT_WAIT, read)
        .await
        .expect("the ACP client script did not finish");
    let status = child.wait().await.unwrap();
    assert!(status.success(), "the ACP client script failed: {status}");
    facts.expect("the client printed no facts")
}

fn updates<'a>(facts: &'a Value, phase: &str) -> Vec<&'a Value> {
    facts["updates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["phase"] == phase)
        .collect()
}

fn kinds(list: &[&Value]) -> Vec<String> {
    list.iter()
        .map(|u| u["update"]["sessionUpdate"].as_str().unwrap().to_string())
        .collect()
}

fn text(list: &[&Value], session: &str) -> String {
    list.iter()
        .filter(|u| {
            u["session"] == session && u["update"]["sessionUpdate"] == "agent_message_chunk"
        })
        .map(|u| u["update"]["content"]["text"].as_str().unwrap_or_default())
        .collect()
}

/// What both clients see the same way: initialize, the refused workspace, a tool call, a
/// permission answered both ways (the denial reaching the model), a cancel, and the
/// wake-up's turn after the delegating prompt ended.
fn check_common(facts: &Value, setup: &Setup) {
    let init = &facts["initialize"];
    assert_eq!(init["protocolVersion"], 1, "{init}");
    assert_eq!(init["agentCapabilities"]["loadSession"], true, "{init}");
    assert_eq!(init["authMethods"], json!([]), "{init}");
    let refused = facts["refused"].as_str().expect("cwd / was accepted");
    assert!(refused.contains("cannot work in /"), "{refused}");
    let sid = facts["session"].as_str().unwrap();
    let stops = &facts["stops"];
    for turn in ["read", "write_allow", "write_reject", "plan", "delegate"] {
        assert_eq!(stops[turn], "end_turn", "{turn}: {stops}");
    }
    assert_eq!(stops["cancel"], "cancelled", "{stops}");

    // The model's plan (its update_plan call): a `plan` update with every step, parsed
    // by the SDK's own types, and no tool call for it.
    let plan = updates(facts, "plan");
    let plans: Vec<&&Value> = plan
        .iter()
        .filter(|u| u["update"]["sessionUpdate"] == "plan")
        .collect();
    assert_eq!(plans.len(), 1, "{plan:?}");
    let entries: Vec<(String, String)> = plans[0]["update"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["content"].as_str().unwrap().to_string(),
                e["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        entries,
        [
            ("Read the code", "completed"),
            ("Fix the bug", "in_progress"),
            ("Run the tests", "pending")
        ]
        .map(|(c, s)| (c.to_string(), s.to_string()))
    );
    assert!(
        !plan
            .iter()
            .any(|u| u["update"]["sessionUpdate"] == "tool_call"),
        "{plan:?}"
    );
    assert!(text(&plan, sid).contains("PLANNED"));

    // A tool call: announced with its kind, title and input, then completed with the file.
    let read = updates(facts, "read");
    let call = read
        .iter()
        .find(|u| u["update"]["sessionUpdate"] == "tool_call")
        .expect("no tool_call");
    assert_eq!(call["update"]["toolCallId"], "call-read");
    assert_eq!(call["update"]["kind"], "read");
    assert_eq!(call["update"]["title"], "Read hello.txt");
    assert_eq!(call["update"]["rawInput"], json!({"path": "hello.txt"}));
    let done = read
        .iter()
        .find(|u| u["update"]["sessionUpdate"] == "tool_call_update")
        .expect("no tool_call_update");
    assert_eq!(done["update"]["status"], "completed");
    assert!(
        done["update"]
            .to_string()
            .contains("hello from the workspace"),
        "{done}"
    );
    assert!(text(&read, sid).contains("READ-DONE"));

    // The permissions: a.txt allowed once, b.txt rejected; each carries the call's diff.
    let permissions: Vec<&Value> = facts["permissions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["phase"] == "write_allow" || p["phase"] == "write_reject")
        .collect();
    assert_eq!(permissions.len(), 2, "{permissions:?}");
    for (permission, path, answer) in [
        (&permissions[0], "a.txt", "allow_once"),
        (&permissions[1], "b.txt", "reject_once"),
    ] {
        assert_eq!(permission["session"], sid);
        assert_eq!(permission["answer"], answer);
        let call = &permission["toolCall"];
        assert_eq!(call["kind"], "edit", "{call}");
        let diff = &call["content"][0];
        assert_eq!(diff["type"], "diff", "{call}");
        assert_eq!(
            diff["path"],
            setup.workspace.join(path).display().to_string(),
            "{call}"
        );
        // The "always" option says what it covers, once (it read "Always allow always
        // allow write_file … in this session in this session").
        let always = permission["options"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["optionId"] == "allow_always")
            .expect("no allow_always option");
        assert_eq!(
            always["name"],
            "Always allow write_file inside the workspace in this session"
        );
        let ids: Vec<&str> = permission["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["optionId"].as_str().unwrap())
            .collect();
        assert!(
            ids.contains(&"allow_once") && ids.contains(&"reject_once"),
            "{ids:?}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(setup.workspace.join("a.txt")).unwrap(),
        "alpha\n"
    );
    assert!(
        !setup.workspace.join("b.txt").exists(),
        "the rejected write happened"
    );
    // The denial reached the model: the request after it carries it as the tool's result.
    let denial = setup
        .mock
        .bodies()
        .into_iter()
        .find_map(|body| {
            body["messages"].as_array().unwrap().iter().find_map(|m| {
                (m["role"] == "tool" && m["tool_call_id"] == "call-write-b").then(|| text_of(m))
            })
        })
        .expect("the model never saw the rejected call's result");
    assert!(denial.contains("denied by user"), "{denial}");
    let rejected = updates(facts, "write_reject");
    assert!(
        rejected
            .iter()
            .any(|u| u["update"]["sessionUpdate"] == "tool_call_update"
                && u["update"]["status"] == "failed"),
        "{:?}",
        kinds(&rejected)
    );

    // The cancel: what streamed stays, the turn answers cancelled.
    assert!(text(&updates(facts, "cancel"), sid).contains("partial"));

    // After the delegating prompt ended, the reports woke the session: its new turn came
    // as updates on the same session.
    let after = updates(facts, "after");
    let woke = text(&after, sid);
    assert!(
        woke.contains("alpha_done_seen") && woke.contains("beta_done_seen"),
        "{woke}"
    );
}

/// The stored session: the person's prompts, the sub-agents as its children, both reports
/// delivered exactly once.
fn check_store(facts: &Value, setup: &Setup) {
    let sid = facts["session"].as_str().unwrap();
    let sessions = setup.dir.path().join("data/sessions");
    let history = std::fs::read_to_string(sessions.join(sid).join("messages.jsonl")).unwrap();
    let messages: Vec<Value> = history
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for prompt in ["read hello", "write a", "write b", "hang", "delegate"] {
        assert_eq!(
            messages
                .iter()
                .filter(|m| m["role"] == "user" && m["content"] == prompt)
                .count(),
            1,
            "{prompt}"
        );
    }
    for task in ["call-alpha", "call-beta"] {
        let id = format!("subagent:{task}");
        assert_eq!(
            messages.iter().filter(|m| m["id"] == id).count(),
            1,
            "report {id} not delivered exactly once"
        );
    }
    assert!(
        messages
            .iter()
            .any(|m| m["role"] == "assistant" && m["stopped"] == true),
        "the cancelled answer is not kept as stopped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_python_sdk_client_runs_a_session_with_summarised_subagents() {
    let python = python();
    let setup = setup().await;
    let facts = run_client(&python, &repo().join("tests/acp/client.py"), &setup).await;
    check_common(&facts, &setup);
    check_store(&facts, &setup);
    let sid = facts["session"].as_str().unwrap();
    // No `subagents` advertised: the children are lines in the session's own stream, and
    // no update names another session.
    let all: Vec<&Value> = facts["updates"].as_array().unwrap().iter().collect();
    assert!(all.iter().all(|u| u["session"] == sid));
    assert!(!kinds(&all).contains(&"subagent_update".to_string()));
    let summary = text(&all, sid);
    for line in [
        "[sub-agent \u{201c}alpha\u{201d} started]",
        "[sub-agent \u{201c}beta\u{201d} started]",
        "[sub-agent \u{201c}alpha\u{201d}: Read hello.txt]",
        "[sub-agent \u{201c}alpha\u{201d} reported: ALPHA_DONE]",
        "[sub-agent \u{201c}beta\u{201d} reported: BETA_DONE]",
    ] {
        assert!(summary.contains(line), "{line} missing from {summary}");
    }
    // A failed run answered the prompt with a JSON-RPC error carrying its message.
    let failed = &facts["failed"];
    assert_eq!(failed["code"], -32603, "{failed}");
    assert!(
        failed.to_string().contains("the scripted model failed"),
        "{failed}"
    );
    // session/load in a second process replays the stored history, the plan as a plan.
    let loaded: Vec<&Value> = facts["loaded"].as_array().unwrap().iter().collect();
    let replayed_plan = loaded
        .iter()
        .find(|u| u["update"]["sessionUpdate"] == "plan")
        .expect("no plan replayed");
    assert_eq!(
        replayed_plan["update"]["entries"][1]["content"],
        "Fix the bug"
    );
    assert!(
        !loaded
            .iter()
            .any(|u| u["update"]["toolCallId"] == "call-plan"),
        "the plan was replayed as a tool call too"
    );
    let replayed_users: Vec<&str> = loaded
        .iter()
        .filter(|u| u["update"]["sessionUpdate"] == "user_message_chunk")
        .map(|u| u["update"]["content"]["text"].as_str().unwrap())
        .collect();
    assert!(replayed_users.starts_with(&[
        "read hello",
        "write a",
        "write b",
        "plan",
        "fail",
        "hang",
        "delegate"
    ]));
    assert!(text(&loaded, sid).contains("READ-DONE"));
    assert!(
        loaded
            .iter()
            .any(|u| u["update"]["sessionUpdate"] == "tool_call"
                && u["update"]["toolCallId"] == "call-write-a")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_typescript_sdk_client_gets_subagents_as_child_sessions() {
    let script = node_client();
    let setup = setup().await;
    let facts = run_client(Path::new("node"), &script, &setup).await;
    check_common(&facts, &setup);
    check_store(&facts, &setup);
    let sid = facts["session"].as_str().unwrap();
    let all: Vec<&Value> = facts["updates"].as_array().unwrap().iter().collect();
    // Each child announced on the parent before any update under its own id.
    let mut children = Vec::new();
    for (index, update) in all.iter().enumerate() {
        let session = update["session"].as_str().unwrap();
        if session == sid {
            if update["update"]["sessionUpdate"] == "subagent_update"
                && update["update"]["title"].is_string()
            {
                children.push((
                    update["update"]["sessionId"].as_str().unwrap().to_string(),
                    update["update"]["title"].as_str().unwrap().to_string(),
                    index,
                ));
                assert_eq!(update["update"]["state"]["state"], "running", "{update}");
                assert!(
                    update["update"]["capabilities"]["cancel"].is_object(),
                    "{update}"
                );
            }
            continue;
        }
        let announced = children.iter().find(|(id, _, _)| id == session);
        assert!(
            announced.is_some_and(|(_, _, at)| *at < index),
            "an update of {session} came before its subagent_update"
        );
    }
    let titles: Vec<&str> = children.iter().map(|(_, t, _)| t.as_str()).collect();
    assert_eq!(titles, ["alpha", "beta", "gamma", "delta", "epsilon"]);
    let child_id = |title: &str| {
        children
            .iter()
            .find(|(_, t, _)| t == title)
            .map(|(id, _, _)| id.clone())
            .unwrap()
    };
    let (alpha, beta) = (child_id("alpha"), child_id("beta"));
    // The children's work under their own ids: alpha's tool call, both answers.
    let alpha_call = all
        .iter()
        .find(|u| u["session"] == alpha.as_str() && u["update"]["sessionUpdate"] == "tool_call")
        .expect("alpha's tool call not under its session");
    assert_eq!(alpha_call["update"]["toolCallId"], "alpha-read");
    assert!(text(&all, &alpha).contains("ALPHA_DONE"));
    assert!(text(&all, &beta).contains("BETA_DONE"));
    // Each child went idle with end_turn, and its report came as a session_message from it.
    for child in [&alpha, &beta] {
        assert!(
            all.iter().any(|u| u["session"] == sid
                && u["update"]["sessionUpdate"] == "subagent_update"
                && u["update"]["sessionId"] == child.as_str()
                && u["update"]["state"]["state"] == "idle"
                && u["update"]["state"]["stopReason"] == "end_turn"),
            "{child} never reported idle"
        );
        assert!(
            all.iter().any(|u| u["session"] == sid
                && u["update"]["sessionUpdate"] == "session_message"
                && u["update"]["senderSessionId"] == child.as_str()
                && u["update"]["recipientSessionId"] == sid),
            "{child}'s report is no session_message"
        );
    }
    // Stop of one child, by session/cancel on its id: it went idle `cancelled`, keeping
    // what it had streamed as its stopped answer; the parent's prompt had ended normally.
    assert_eq!(facts["stops"]["delegate_gamma"], "end_turn");
    let gamma = facts["gamma"].as_str().expect("gamma announced");
    assert!(all.iter().any(|u| u["session"] == sid
        && u["update"]["sessionId"] == gamma
        && u["update"]["state"]["stopReason"] == "cancelled"));
    let history = std::fs::read_to_string(
        setup
            .dir
            .path()
            .join("data/sessions")
            .join(gamma)
            .join("messages.jsonl"),
    )
    .unwrap();
    assert!(
        history.lines().any(|l| {
            let m: Value = serde_json::from_str(l).unwrap();
            m["role"] == "assistant" && m["content"] == "working" && m["stopped"] == true
        }),
        "{history}"
    );
    // Queued after Stop: the session was stopped while delta worked; delta's report
    // waited (no model request saw it before the next prompt) and came with "resume".
    assert_eq!(facts["stops"]["queue_stop"], "cancelled");
    assert_eq!(facts["stops"]["resume"], "end_turn");
    let bodies = setup.mock.bodies();
    let with_report: Vec<&Value> = bodies
        .iter()
        .filter(|body| {
            body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["role"] == "user" && text_of(m).contains("Task ID: call-delta"))
        })
        .collect();
    assert!(
        !with_report.is_empty(),
        "delta's report never reached the model"
    );
    assert!(
        text(&all, sid).contains(
            "[the report of sub-agent \u{201c}delta\u{201d} waits: the session was stopped; it goes with your next prompt]"
        ),
        "the queued report was not shown"
    );
    for body in with_report {
        assert!(
            body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["role"] == "user" && m["content"] == "resume"),
            "the stopped session woke on a report: {body}"
        );
    }
    // No summary lines for a client that sees the child sessions.
    assert!(!text(&all, sid).contains("[sub-agent"));

    // Steering at a safe point (the seed's report during an approval, through ACP):
    // epsilon ended while the prompt's write waited for its permission; its report went
    // into that same prompt right after the write's result (not into a later wake-up),
    // and the prompt ended normally with the model's answer to it.
    assert_eq!(facts["stops"]["steer"], "end_turn");
    let steer = updates(&facts, "steer");
    let answered = text(&steer, sid);
    assert!(answered.contains("STEERED epsilon_done_seen"), "{answered}");
    assert!(!answered.contains("STEER-WITHOUT-REPORT"), "{answered}");
    assert_eq!(
        std::fs::read_to_string(setup.workspace.join("e.txt")).unwrap(),
        "epsilon\n"
    );
    let epsilon_report =
        |m: &Value| m["role"] == "user" && text_of(m).contains("Task ID: call-epsilon");
    let steered: Vec<Vec<Value>> = bodies
        .iter()
        .map(|body| body["messages"].as_array().unwrap().clone())
        .filter(|messages| messages.iter().any(epsilon_report))
        .collect();
    assert!(
        !steered.is_empty(),
        "epsilon's report never reached the model"
    );
    for messages in &steered {
        let at = messages.iter().position(epsilon_report).unwrap();
        assert_eq!(
            messages[at - 1]["tool_call_id"],
            "call-write-e",
            "the report was not steered in right after the write's result: {messages:#?}"
        );
        assert_eq!(messages.iter().filter(|m| epsilon_report(m)).count(), 1);
    }
    let history = std::fs::read_to_string(
        setup
            .dir
            .path()
            .join("data/sessions")
            .join(sid)
            .join("messages.jsonl"),
    )
    .unwrap();
    assert_eq!(
        history
            .lines()
            .filter(|l| serde_json::from_str::<Value>(l).unwrap()["id"] == "subagent:call-epsilon")
            .count(),
        1,
        "epsilon's report not recorded exactly once"
    );
}
