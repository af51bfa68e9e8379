//! ACP agents as background sub-agents (issue #29, SPEC §11): a profile with `kind: acp` runs a real agent written against the official Python SDK (`tests/acp/agent.py`, PyPI agent-client-protocol) as a child of a parent scripted on the mock model server; its fs/read_text_file is served by our confined tools, its permission request is the parent's approval naming the child, its end of turn the one report, Stop cancels it and ends its process.

use std::path::PathBuf;
use std::time::Duration;

use bumblehive::protocol::{Message, commands::DecideApproval};
use bumblehive::service::{RuntimeService, ServiceOptions};
use serde_json::{Value, json};

use crate::mock_llm::{MockLlm, MockResponse, RecordedRequest, openai};
use crate::support::{assert_message_order, is_report};

const WAIT: Duration = Duration::from_secs(30);

fn python() -> PathBuf {
    let venv = std::env::var_os("BUMBLEHIVE_ACP_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/bumblehive-acp/venv")
        });
    let python = venv.join("bin/python");
    assert!(
        python.exists(),
        "the Python ACP SDK venv is not installed: run ./scripts/acp-test-clients.sh"
    );
    python
}

/// The parent: `delegate <task>` delegates `<task>` to the `py` profile; a report (or
/// the pending answer) gets a plain answer.
fn parent(request: &RecordedRequest) -> MockResponse {
    let messages = request.body["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let last = messages.last().cloned().unwrap_or(Value::Null);
    let text = last["content"].as_str().unwrap_or_default();
    if last["role"] == "user" {
        if let Some(task) = text.strip_prefix("delegate ") {
            return MockResponse::sse(openai::tool_answer(
                &[(
                    "d1",
                    "sub_agent",
                    json!({"title": "Py", "task": task, "agent": "py"}),
                )],
                (10, 2),
            ));
        }
        return MockResponse::sse(openai::text_answer(&["parent saw the report"], (10, 2)));
    }
    MockResponse::sse(openai::text_answer(&["waiting for Py"], (10, 2)))
}

struct Fixture {
    _dir: tempfile::TempDir,
    ws: PathBuf,
    data: PathBuf,
    config: PathBuf,
    _llm: MockLlm,
}

impl Fixture {
    async fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join(".bumblehive/agents")).unwrap();
        let agent = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/acp/agent.py");
        std::fs::write(
            ws.join(".bumblehive/agents/py.md"),
            format!(
                "---\nname: py\ndescription: The Python SDK agent\nkind: acp\ncommand: {}\nargs: [{}]\nenv:\n  PYTHONUNBUFFERED: \"1\"\n---\n",
                python().display(),
                agent.display()
            ),
        )
        .unwrap();
        std::fs::write(ws.join("notes.txt"), "first line of the notes\nsecond\n").unwrap();
        let llm = MockLlm::start().await;
        llm.respond_with(parent);
        let config = dir.path().join("config.json");
        std::fs::write(
            &config,
            json!({
                "providers": {"mock": {"kind": "openai", "base_url": format!("{}/v1", llm.url()), "model": "m"}},
                "default_provider": "mock"
            })
            .to_string(),
        )
        .unwrap();
        Fixture {
            data: dir.path().join("data"),
            ws,
            config,
            _dir: dir,
            _llm: llm,
        }
    }

    fn service(&self) -> RuntimeService {
        RuntimeService::new(ServiceOptions {
            data_dir: self.data.clone(),
            config_path: Some(self.config.clone()),
            config: None,
            provider_factory: std::sync::Arc::new(bumblehive::providers::provider_from_config),
            tools: None,
        })
        .unwrap()
    }
}

fn reports(service: &RuntimeService, session_id: &str) -> Vec<Message> {
    let history = service.store().load(session_id).unwrap().messages;
    assert_message_order(&history);
    history.into_iter().filter(is_report).collect()
}

/// Whether a report is in the history (read while the parent may be mid-batch, so its
/// order is checked only once it is idle, by `reports`).
fn has_report(service: &RuntimeService, session_id: &str) -> bool {
    let history = service.store().load(session_id).unwrap().messages;
    history.iter().any(is_report)
}

fn alive(pid: i32) -> bool {
    // A zombie is gone for our purpose: its group was killed, only the reaping is left.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat.contains(") Z "))
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acp_agent_reads_a_file_asks_once_reports_once_and_takes_a_follow_up() {
    let fx = Fixture::new().await;
    let service = fx.service();
    let info = service
        .create_session(fx.ws.to_str().unwrap(), None)
        .unwrap();
    let parent = service.controller(&info.session_id).unwrap();
    let (mut events, _) = parent.subscribe();
    parent
        .submit("delegate read notes.txt".into(), None)
        .unwrap();
    // The agent's permission request is an approval in the parent's window naming the child.
    // (The Python agent's start-up can take longer than `support::receive`'s wait.)
    let ask = tokio::time::timeout(WAIT, async {
        loop {
            let event = serde_json::to_value(events.next_event().await.unwrap()).unwrap();
            if event["type"] == "approval_request" {
                return event;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(ask["parent_session_id"], info.session_id.as_str());
    assert_eq!(ask["title"], "Py");
    assert_eq!(ask["tool"], "acp: Publish the notes");
    let child_id = ask["session_id"].as_str().unwrap().to_string();
    service
        .decide_approval(DecideApproval {
            session_id: child_id.clone(),
            approval_id: ask["approval_id"].as_str().unwrap().into(),
            approved: true,
            remember: false,
            reason: None,
        })
        .unwrap();
    tokio::time::timeout(WAIT, async {
        while !has_report(&service, &info.session_id) || parent.snapshot().running {
            let _ = events.next_event().await;
        }
    })
    .await
    .expect("no report reached the parent");
    let report = reports(&service, &info.session_id);
    assert_eq!(report.len(), 1);
    let text = report[0].text();
    assert!(
        text.contains("read notes.txt: first line of the notes; permission allowed"),
        "{text}"
    );
    // The child's history: the task, the agent's two tool calls with their results (the
    // file read through fs/read_text_file), and its answer.
    let child = service.store().load(&child_id).unwrap().messages;
    assert_message_order(&child);
    let calls: Vec<&str> = child
        .iter()
        .flat_map(|m| m.tool_calls.iter().map(|c| c.name.as_str()))
        .collect();
    assert_eq!(calls, ["read", "execute"]);
    assert!(
        child
            .iter()
            .any(|m| m.text() == "first line of the notes\nsecond\n")
    );
    assert!(child.iter().any(|m| m.text() == "published"));
    let children = service.list_sessions(None).unwrap();
    let tab = children.iter().find(|s| s.session_id == child_id).unwrap();
    assert_eq!(tab.agent.as_deref(), Some("py"));
    // A follow-up in the child's tab goes to the same agent process and ACP session.
    let pid = || -> i32 {
        std::fs::read_to_string(fx.ws.join("agent.pid"))
            .unwrap()
            .parse()
            .unwrap()
    };
    let first_pid = pid();
    let child_ctl = service.controller(&child_id).unwrap();
    child_ctl.submit("hello".into(), None).unwrap();
    let echoed = |service: &RuntimeService| {
        service
            .store()
            .load(&child_id)
            .unwrap()
            .messages
            .into_iter()
            .find(|m| m.text().starts_with("echo from"))
    };
    tokio::time::timeout(WAIT, async {
        while echoed(&service).is_none() {
            let _ = events.next_event().await;
        }
    })
    .await
    .expect("the follow-up was not answered");
    assert_eq!(
        echoed(&service).unwrap().text(),
        format!("echo from {first_pid} py-{first_pid}-1: hello")
    );
    // Deleting the child ends its agent's process.
    tokio::time::timeout(WAIT, service.wait_idle())
        .await
        .unwrap();
    let delivered = reports(&service, &info.session_id).len();
    service.delete_session(&child_id).await.unwrap();
    tokio::time::timeout(WAIT, async {
        while alive(first_pid) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the agent's process outlived the delete");
    service.shutdown().await;

    // After a restart each report (the task's and the follow-up's) is there once, and
    // none is delivered again.
    let service = fx.service();
    tokio::time::timeout(WAIT, service.wait_idle())
        .await
        .unwrap();
    assert_eq!(reports(&service, &info.session_id).len(), delivered);
    service.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_an_acp_child_cancels_its_turn_and_ends_its_process() {
    let fx = Fixture::new().await;
    let service = fx.service();
    let info = service
        .create_session(fx.ws.to_str().unwrap(), None)
        .unwrap();
    let parent = service.controller(&info.session_id).unwrap();
    let (mut events, _) = parent.subscribe();
    parent.submit("delegate wait".into(), None).unwrap();
    // "waiting" streams from the child once the agent wrote its pid and waits.
    let waiting = tokio::time::timeout(WAIT, async {
        loop {
            let event = serde_json::to_value(events.next_event().await.unwrap()).unwrap();
            if event["kind"] == "content.delta" && event["data"]["text"] == "waiting" {
                return event;
            }
        }
    })
    .await
    .expect("the agent never said it waits");
    let child_id = waiting["session_id"].as_str().unwrap().to_string();
    assert_ne!(child_id, info.session_id);
    let pid: i32 = std::fs::read_to_string(fx.ws.join("agent.pid"))
        .unwrap()
        .parse()
        .unwrap();
    assert!(alive(pid));
    service.cancel_session(&child_id).await.unwrap();
    tokio::time::timeout(WAIT, async {
        while !has_report(&service, &info.session_id) || parent.snapshot().running {
            let _ = events.next_event().await;
        }
    })
    .await
    .expect("no report after Stop");
    let report = reports(&service, &info.session_id);
    assert_eq!(report.len(), 1);
    assert!(
        report[0].text().to_lowercase().contains("stop"),
        "{}",
        report[0].text()
    );
    // Its process group is gone (waited for with a deadline: the kill is asynchronous).
    tokio::time::timeout(WAIT, async {
        while alive(pid) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the agent's process outlived Stop");
    let child = service.store().load(&child_id).unwrap().messages;
    assert_message_order(&child);
    service.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_agent_command_fails_the_child_saying_what_to_install() {
    let fx = Fixture::new().await;
    std::fs::write(
        fx.ws.join(".bumblehive/agents/py.md"),
        "---\nname: py\nkind: acp\ncommand: claude-agent-acp-not-here\n---\n",
    )
    .unwrap();
    let service = fx.service();
    let info = service
        .create_session(fx.ws.to_str().unwrap(), None)
        .unwrap();
    let parent = service.controller(&info.session_id).unwrap();
    let (mut events, _) = parent.subscribe();
    parent.submit("delegate anything".into(), None).unwrap();
    tokio::time::timeout(WAIT, async {
        while !has_report(&service, &info.session_id) || parent.snapshot().running {
            let _ = events.next_event().await;
        }
    })
    .await
    .expect("no report of the failed child");
    let report = reports(&service, &info.session_id);
    assert_eq!(report.len(), 1);
    assert!(
        report[0]
            .text()
            .contains("`claude-agent-acp-not-here` is not installed or not on PATH; install it"),
        "{}",
        report[0].text()
    );
    service.shutdown().await;
}

/// Delegates `task` to the Python agent, approves whatever it asks (each ask naming the
/// child), and returns the one report's text with the approvals' tools.
async fn report_of(fx: &Fixture, task: &str) -> (String, Vec<String>) {
    let service = fx.service();
    let info = service
        .create_session(fx.ws.to_str().unwrap(), None)
        .unwrap();
    let parent = service.controller(&info.session_id).unwrap();
    let (mut events, _) = parent.subscribe();
    parent.submit(format!("delegate {task}"), None).unwrap();
    let mut asked = Vec::new();
    tokio::time::timeout(WAIT, async {
        while !has_report(&service, &info.session_id) || parent.snapshot().running {
            let event = serde_json::to_value(events.next_event().await.unwrap()).unwrap();
            if event["type"] == "approval_request" {
                assert_eq!(event["parent_session_id"], info.session_id.as_str());
                asked.push(event["tool"].as_str().unwrap().to_string());
                service
                    .decide_approval(DecideApproval {
                        session_id: event["session_id"].as_str().unwrap().into(),
                        approval_id: event["approval_id"].as_str().unwrap().into(),
                        approved: true,
                        remember: false,
                        reason: None,
                    })
                    .unwrap();
            }
        }
    })
    .await
    .expect("no report reached the parent");
    let report = reports(&service, &info.session_id);
    assert_eq!(report.len(), 1);
    service.shutdown().await;
    (report[0].text().to_string(), asked)
}

/// The agent's `terminal/create` runs our `run_command` (its sandbox and approvals) in
/// the workspace; wait_for_exit, output and release answer from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acp_agents_terminal_runs_our_run_command() {
    let fx = Fixture::new().await;
    let (report, asked) = report_of(&fx, "run echo made-here > made.txt && cat made.txt").await;
    assert!(
        report.contains("ran echo made-here > made.txt && cat made.txt: exit 0: made-here"),
        "{report}"
    );
    assert_eq!(
        std::fs::read_to_string(fx.ws.join("made.txt")).unwrap(),
        "made-here\n"
    );
    // Asked or not as run_command would be (that depends on the sandbox here), and never
    // as anything else.
    assert!(asked.iter().all(|tool| tool == "run_command"), "{asked:?}");
}

/// `tools.policy` applies to the agent's terminal as to our own calls: run_command
/// switched off, the command does not run and the agent is told why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acp_agents_terminal_obeys_the_run_command_policy() {
    let fx = Fixture::new().await;
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(&fx.config).unwrap()).unwrap();
    config["tools"] = json!({"policy": {"run_command": "deny"}});
    std::fs::write(&fx.config, config.to_string()).unwrap();
    let (report, asked) = report_of(&fx, "run touch made.txt").await;
    assert!(asked.is_empty(), "{asked:?}");
    assert!(!fx.ws.join("made.txt").exists());
    assert!(
        report.contains("ran touch made.txt: exit None: denied")
            && report.contains("disabled by configuration"),
        "{report}"
    );
}

/// An agent whose process died mid-turn leaves its child interrupted, as a crash of ours
/// would (SPEC §3): no report yet and the parent not woken; a follow-up is refused until
/// the child is resumed or cancelled; a restart finds it interrupted still. Resumed, a
/// new process continues the same ACP session with `session/load` (the agent offers it),
/// asked to go on, its replayed history not taken as an answer; then the one report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_agents_child_is_interrupted_and_resumes_its_acp_session_with_session_load() {
    let fx = Fixture::new().await;
    let (first_pid, child_id, parent_id) = interrupted_by_a_dead_agent(&fx).await;
    // A restart keeps it interrupted and resumable.
    let service = fx.service();
    assert!(service.session_info(&child_id).unwrap().interrupted);
    let text = resumed_answer(&service, &child_id, &parent_id).await;
    let second_pid: i32 = std::fs::read_to_string(fx.ws.join("agent.pid"))
        .unwrap()
        .parse()
        .unwrap();
    assert_ne!(second_pid, first_pid);
    assert!(
        text.starts_with(&format!(
            "echo from {second_pid} py-{first_pid}-1: (Your previous turn was cut off"
        )),
        "{text}"
    );
    let child = service.store().load(&child_id).unwrap().messages;
    assert!(
        !child
            .iter()
            .any(|m| m.text().contains("(replayed history)")),
        "{child:#?}"
    );
    service.shutdown().await;
}

/// The same death with an agent that cannot load sessions: the new session it begins is
/// told what the child was told before (its task) ahead of the request to go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_agent_without_session_load_is_told_its_task_again() {
    let fx = Fixture::new().await;
    let profile = fx.ws.join(".bumblehive/agents/py.md");
    let text = std::fs::read_to_string(&profile).unwrap();
    std::fs::write(
        &profile,
        text.replace("env:\n", "env:\n  ACP_TEST_NO_LOAD: \"1\"\n"),
    )
    .unwrap();
    let (first_pid, child_id, parent_id) = interrupted_by_a_dead_agent(&fx).await;
    let service = fx.service();
    let text = resumed_answer(&service, &child_id, &parent_id).await;
    let second_pid: i32 = std::fs::read_to_string(fx.ws.join("agent.pid"))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        text.starts_with(&format!(
            "echo from {second_pid} py-{second_pid}-1: die\n\n(Now:)"
        )),
        "{text}"
    );
    assert!(text.contains("(Your previous turn was cut off"), "{text}");
    assert_ne!(second_pid, first_pid);
    service.shutdown().await;
}

/// Delegates `die` to the Python agent and waits until its child is interrupted and
/// everything is idle; checks nothing was reported and a follow-up is refused; shuts the
/// service down. Returns the dead agent's pid, the child's and the parent's ids.
async fn interrupted_by_a_dead_agent(fx: &Fixture) -> (i32, String, String) {
    let service = fx.service();
    let info = service
        .create_session(fx.ws.to_str().unwrap(), None)
        .unwrap();
    let parent = service.controller(&info.session_id).unwrap();
    parent.submit("delegate die".into(), None).unwrap();
    let child_of = |service: &RuntimeService| {
        service
            .list_sessions(None)
            .unwrap()
            .into_iter()
            .find(|s| s.parent_session_id.as_deref() == Some(info.session_id.as_str()))
    };
    tokio::time::timeout(WAIT, async {
        loop {
            service.wait_idle().await;
            if child_of(&service).is_some_and(|c| c.interrupted) {
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the child of the dead agent was not interrupted");
    let child = child_of(&service).unwrap();
    assert!(!child.failed, "{child:?}");
    assert!(reports(&service, &info.session_id).is_empty());
    let history = service.store().load(&child.session_id).unwrap().messages;
    let cut = history.last().unwrap();
    assert!(cut.stopped, "{history:#?}");
    assert!(
        cut.text().starts_with("dying")
            && cut
                .text()
                .contains("the ACP agent's process ended during its turn: interrupted"),
        "{}",
        cut.text()
    );
    let refused = service
        .submit_message(&child.session_id, "hello".into(), None)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("interrupted"), "{refused}");
    let pid: i32 = std::fs::read_to_string(fx.ws.join("agent.pid"))
        .unwrap()
        .parse()
        .unwrap();
    service.shutdown().await;
    (pid, child.session_id, info.session_id)
}

/// Resumes the interrupted child and waits for its one report in the parent; returns
/// the child's answer.
async fn resumed_answer(service: &RuntimeService, child_id: &str, parent_id: &str) -> String {
    let parent = service.controller(parent_id).unwrap();
    let (mut events, _) = parent.subscribe();
    service.resume_subagent(child_id).await.unwrap();
    tokio::time::timeout(WAIT, async {
        while !has_report(service, parent_id) || parent.snapshot().running {
            let _ = events.next_event().await;
        }
    })
    .await
    .expect("no report after the resume");
    tokio::time::timeout(WAIT, service.wait_idle())
        .await
        .unwrap();
    let report = reports(service, parent_id);
    assert_eq!(report.len(), 1, "{report:#?}");
    let answer = service
        .store()
        .load(child_id)
        .unwrap()
        .messages
        .into_iter()
        .rev()
        .find(|m| m.text().starts_with("echo from"))
        .expect("no answer after the resume")
        .text()
        .to_string();
    assert!(report[0].text().contains(&answer), "{}", report[0].text());
    answer
}

/// terminal/output shows what the command wrote while it still runs, and terminal/kill
/// ends it (the command would sleep 30 s, longer than the test waits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acp_agents_terminal_streams_output_and_is_killed() {
    let fx = Fixture::new().await;
    let (report, _) = report_of(&fx, "poll echo started; sleep 30").await;
    assert!(
        report.contains("polled started; killed: exit None"),
        "{report}"
    );
}
