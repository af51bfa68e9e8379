//! The real ACP agents as `kind: acp` background children (issue #29): claude-agent-acp (Claude Code through the Claude Agent SDK) against the mock server's Anthropic Messages endpoint, and codex-acp (Codex's app-server) against its OpenAI Responses endpoint, each reading a file, asking one permission answered in the parent's window, and reporting once; a local proxy that refuses everything catches any attempt to reach the network.
//!
//! The packages are pinned in `tests/acp/agents/package.json` and installed by
//! `./scripts/acp-test-clients.sh`; without them these tests fail and say so.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bumblehive::protocol::{Message, commands::DecideApproval};
use bumblehive::service::{RuntimeService, ServiceOptions};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::mock_llm::{MockLlm, MockResponse, RecordedRequest, anthropic, openai, responses};
use crate::support::{assert_message_order, is_report};

/// Each wait on an event: the agents start in about a second here; this bounds a hang
/// (an agent that waits on the network, say) without sleeping.
const WAIT: Duration = Duration::from_secs(60);

const NOTES: &str = "first line of the notes\nsecond\n";

fn agent_bin(name: &str) -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/acp/agents/node_modules/.bin")
        .join(name);
    assert!(
        bin.exists(),
        "{} is not installed: run ./scripts/acp-test-clients.sh",
        bin.display()
    );
    bin
}

/// A proxy on 127.0.0.1 that answers every request with 403 and keeps its first line:
/// the agents get it as HTTP(S)_PROXY (with 127.0.0.1 exempt), so whatever they try to
/// reach off this machine is refused at once and named by the test.
struct Tripwire {
    url: String,
    seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Tripwire {
    async fn start() -> Tripwire {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let seen = seen.clone();
            async move {
                while let Ok((mut socket, _)) = listener.accept().await {
                    let seen = seen.clone();
                    tokio::spawn(async move {
                        let mut head = vec![0u8; 1024];
                        let n = socket.read(&mut head).await.unwrap_or(0);
                        let text = String::from_utf8_lossy(&head[..n]);
                        let line = text.lines().next().unwrap_or("").to_string();
                        seen.lock().unwrap().push(line);
                        let _ = socket
                            .write_all(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")
                            .await;
                    });
                }
            }
        });
        Tripwire { url, seen, task }
    }

    /// The environment that sends an agent's outside traffic here.
    fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        for name in [
            "HTTPS_PROXY",
            "https_proxy",
            "HTTP_PROXY",
            "http_proxy",
            "ALL_PROXY",
            "all_proxy",
        ] {
            env.push((name, self.url.clone()));
        }
        env.push(("NO_PROXY", "127.0.0.1,localhost".into()));
        env.push(("no_proxy", "127.0.0.1,localhost".into()));
        env
    }

    fn assert_untouched(&self) {
        let seen = self.seen.lock().unwrap();
        assert!(
            seen.is_empty(),
            "the agent tried to reach the network: {seen:?}"
        );
    }
}

impl Drop for Tripwire {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The text of every tool result in an Anthropic request, in order, with its error flag.
fn anthropic_results(body: &Value) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    for message in body["messages"].as_array().into_iter().flatten() {
        for block in message["content"].as_array().into_iter().flatten() {
            if block["type"] == "tool_result" {
                let text = match &block["content"] {
                    Value::String(s) => s.clone(),
                    Value::Array(parts) => parts
                        .iter()
                        .filter_map(|p| p["text"].as_str())
                        .collect::<Vec<_>>()
                        .join(""),
                    _ => String::new(),
                };
                out.push((text, block["is_error"] == true));
            }
        }
    }
    out
}

/// The outputs of every function call in a Responses request, in order.
fn responses_results(body: &Value) -> Vec<String> {
    body["input"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|item| item["type"] == "function_call_output")
        .map(|item| match &item["output"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect()
}

/// What the agent's model says once it has read the file and run the publishing command.
fn summary(read: &str, published: bool) -> String {
    let line = if read.contains("first line of the notes") {
        "first line of the notes"
    } else {
        "nothing"
    };
    let outcome = if published { "done" } else { "refused" };
    format!("read notes.txt: {line}; publish: {outcome}")
}

/// The model behind all three: the parent (Chat Completions) delegates to the agent named
/// in its prompt; Claude Code (Messages) and Codex (Responses) read notes.txt, then ask to
/// run `touch published.txt`, then answer with what they saw. Requests without tools (the
/// agents' side calls, such as a title) get a plain answer.
fn model(ws: PathBuf) -> impl Fn(&RecordedRequest) -> MockResponse + Send + Sync + 'static {
    move |request: &RecordedRequest| {
        let body = &request.body;
        let no_tools = body["tools"].as_array().is_none_or(|t| t.is_empty());
        if request.path.ends_with("/chat/completions") {
            let messages = body["messages"].as_array().cloned().unwrap_or_default();
            let last = messages.last().cloned().unwrap_or(Value::Null);
            let text = last["content"].as_str().unwrap_or_default();
            if last["role"] == "user" {
                if let Some(agent) = text.strip_prefix("delegate to ") {
                    return MockResponse::sse(openai::tool_answer(
                        &[(
                            "d1",
                            "sub_agent",
                            json!({"title": "Outside", "task": "Read notes.txt and publish it.", "agent": agent}),
                        )],
                        (10, 2),
                    ));
                }
                return MockResponse::sse(openai::text_answer(&["parent saw the report"], (10, 2)));
            }
            return MockResponse::sse(openai::text_answer(&["waiting for the agent"], (10, 2)));
        }
        if request.path.ends_with("/messages") {
            if no_tools {
                return MockResponse::sse(anthropic::text_answer(&["ok"], 10, 2));
            }
            let results = anthropic_results(body);
            let notes = ws.join("notes.txt");
            return MockResponse::sse(match results.as_slice() {
                [] => anthropic::tool_answer(
                    &[("toolu_read", "Read", json!({"file_path": notes}))],
                    10,
                    5,
                ),
                [_] => anthropic::tool_answer(
                    &[(
                        "toolu_publish",
                        "Bash",
                        json!({"command": "touch published.txt", "description": "Publish the notes"}),
                    )],
                    10,
                    5,
                ),
                [(read, _), (_, refused), ..] => {
                    anthropic::text_answer(&[&summary(read, !refused)], 10, 5)
                }
            });
        }
        if request.path.ends_with("/responses") {
            if no_tools {
                return MockResponse::sse(responses::text_answer(&["ok"], (10, 2)));
            }
            let results = responses_results(body);
            return MockResponse::sse(match results.as_slice() {
                [] => responses::tool_answer(
                    &[("call_read", "exec_command", json!({"cmd": "cat notes.txt"}))],
                    (10, 5),
                ),
                [_] => responses::tool_answer(
                    &[(
                        "call_publish",
                        "exec_command",
                        json!({"cmd": "touch published.txt", "sandbox_permissions": "require_escalated", "justification": "Publish the notes"}),
                    )],
                    (10, 5),
                ),
                [read, publish, ..] => responses::text_answer(
                    &[&summary(read, publish.contains("exited with code 0"))],
                    (10, 5),
                ),
            });
        }
        MockResponse::error(404, "no such endpoint")
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    ws: PathBuf,
    data: PathBuf,
    config: PathBuf,
    llm: MockLlm,
    tripwire: Tripwire,
}

impl Fixture {
    async fn new() -> Fixture {
        // Not under /tmp: Codex will not put its sandbox helper under a temporary folder,
        // and without it every sandboxed command fails.
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let root = dir.path().canonicalize().unwrap();
        let ws = root.join("ws");
        std::fs::create_dir_all(ws.join(".bumblehive/agents")).unwrap();
        std::fs::write(ws.join("notes.txt"), NOTES).unwrap();
        let llm = MockLlm::start().await;
        llm.respond_with(model(ws.clone()));
        let config = root.join("config.json");
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
            data: root.join("data"),
            ws,
            root,
            config,
            llm,
            tripwire: Tripwire::start().await,
            _dir: dir,
        }
    }

    /// Writes the profile `name` running `command` with `env` (plus the tripwire's).
    fn profile(&self, name: &str, command: &Path, env: Vec<(&str, String)>) {
        let mut text = format!(
            "---\nname: {name}\ndescription: a real ACP agent\nkind: acp\ncommand: {}\nenv:\n",
            command.display()
        );
        for (key, value) in env.into_iter().chain(self.tripwire.env()) {
            text.push_str(&format!("  {key}: \"{value}\"\n"));
        }
        text.push_str("---\n");
        std::fs::write(self.ws.join(format!(".bumblehive/agents/{name}.md")), text).unwrap();
    }

    /// What a failing test shows: the model requests so far and what hit the tripwire.
    fn diagnose(&self) -> String {
        let requests: Vec<String> = self
            .llm
            .requests()
            .iter()
            .map(|r| {
                let tools = r.body["tools"].as_array().map_or(0, Vec::len);
                format!("{} ({tools} tools)", r.path)
            })
            .collect();
        format!(
            "model requests: {requests:?}; network attempts: {:?}",
            self.tripwire.seen.lock().unwrap()
        )
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

fn has_report(service: &RuntimeService, session_id: &str) -> bool {
    let history = service.store().load(session_id).unwrap().messages;
    history.iter().any(is_report)
}

/// Delegates to `agent`, answers its one permission request with `allow`, waits for the
/// one report, and checks what the parent, the child and the workspace show.
async fn delegate_and_answer(fx: &Fixture, agent: &str, allow: bool) -> (String, Vec<Message>) {
    let service = fx.service();
    let info = service
        .create_session(fx.ws.to_str().unwrap(), None)
        .unwrap();
    let parent = service.controller(&info.session_id).unwrap();
    let (mut events, _) = parent.subscribe();
    parent.submit(format!("delegate to {agent}"), None).unwrap();
    let ask = tokio::time::timeout(WAIT, async {
        loop {
            let event = serde_json::to_value(events.next_event().await.unwrap()).unwrap();
            if event["type"] == "approval_request" {
                return event;
            }
            // A child that fails before it asks reports at once: say what it said.
            let history = service.store().load(&info.session_id).unwrap().messages;
            if let Some(report) = history.iter().find(|m| is_report(m)) {
                panic!(
                    "{agent} reported before it asked: {}; {}",
                    report.text(),
                    fx.diagnose()
                );
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{agent} never asked a permission; {}", fx.diagnose()));
    assert_eq!(ask["parent_session_id"], info.session_id.as_str());
    assert_eq!(ask["title"], "Outside");
    assert_eq!(ask["tool"], "acp: touch published.txt");
    let child_id = ask["session_id"].as_str().unwrap().to_string();
    service
        .decide_approval(DecideApproval {
            session_id: child_id.clone(),
            approval_id: ask["approval_id"].as_str().unwrap().into(),
            approved: allow,
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
    .unwrap_or_else(|_| panic!("no report of {agent} reached the parent; {}", fx.diagnose()));
    tokio::time::timeout(WAIT, service.wait_idle())
        .await
        .unwrap();
    let report = reports(&service, &info.session_id);
    assert_eq!(report.len(), 1, "{report:#?}");
    let child = service.store().load(&child_id).unwrap().messages;
    assert_message_order(&child);
    let tab = service
        .list_sessions(None)
        .unwrap()
        .into_iter()
        .find(|s| s.session_id == child_id)
        .unwrap();
    assert_eq!(tab.agent.as_deref(), Some(agent));
    service.shutdown().await;

    // After a restart the report is still there once, and not delivered again.
    let service = fx.service();
    tokio::time::timeout(WAIT, service.wait_idle())
        .await
        .unwrap();
    assert_eq!(reports(&service, &info.session_id).len(), 1);
    service.shutdown().await;
    fx.tripwire.assert_untouched();
    fx.llm.assert_valid();
    (report[0].text().to_string(), child)
}

/// The child's two calls keep what they did: the file read and the command run (Claude
/// Code gives a call's input only after announcing it).
fn assert_read_and_command(child: &[Message]) {
    let calls: Vec<&Value> = child
        .iter()
        .flat_map(|m| m.tool_calls.iter().map(|c| &c.arguments))
        .collect();
    assert!(calls[0].to_string().contains("notes.txt"), "{calls:?}");
    assert!(
        calls[1]["input"]
            .to_string()
            .contains("touch published.txt"),
        "{calls:?}"
    );
}

/// The tool results of a child's history.
fn tool_results(child: &[Message]) -> Vec<String> {
    child
        .iter()
        .filter(|m| m.role == bumblehive::protocol::Role::Tool)
        .map(|m| m.text().to_string())
        .collect()
}

/// The `claude` profile: claude-agent-acp with the local Messages server as its API.
fn claude_profile(fx: &Fixture) {
    let home = fx.root.join("claude-home");
    // Manual mode: Claude Code asks before running a command (its default, `auto`,
    // would ask a classifier model instead).
    std::fs::create_dir_all(home.join(".claude")).unwrap();
    std::fs::write(
        home.join(".claude/settings.json"),
        r#"{"permissions": {"defaultMode": "default"}}"#,
    )
    .unwrap();
    fx.profile(
        "claude",
        &agent_bin("claude-agent-acp"),
        vec![
            ("HOME", home.display().to_string()),
            ("ANTHROPIC_BASE_URL", fx.llm.url()),
            ("ANTHROPIC_API_KEY", "test-key".into()),
            ("ANTHROPIC_MODEL", "test-model".into()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
            ("DISABLE_TELEMETRY", "1".into()),
            ("DISABLE_ERROR_REPORTING", "1".into()),
            ("DISABLE_AUTOUPDATER", "1".into()),
            // Set (as in some sandboxes) it makes the adapter, running as root, pass
            // --dangerously-skip-permissions, which Claude Code then refuses as root.
            ("IS_SANDBOX", String::new()),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_agent_acp_reads_asks_once_and_reports_once() {
    let fx = Fixture::new().await;
    claude_profile(&fx);
    let (report, child) = delegate_and_answer(&fx, "claude", true).await;
    assert!(
        report.contains("read notes.txt: first line of the notes; publish: done"),
        "{report}"
    );
    assert!(fx.ws.join("published.txt").exists());
    let calls: Vec<&str> = child
        .iter()
        .flat_map(|m| m.tool_calls.iter().map(|c| c.name.as_str()))
        .collect();
    assert_eq!(calls, ["read", "execute"], "{child:#?}");
    let results = tool_results(&child);
    assert!(
        results[0].contains("first line of the notes"),
        "{results:?}"
    );
    assert_read_and_command(&child);
}

/// The `codex` profile: codex-acp with the local Responses server as its provider.
fn codex_profile(fx: &Fixture) {
    let codex_home = fx.root.join("codex-home");
    std::fs::create_dir_all(&codex_home).unwrap();
    // The local Responses server as Codex's model provider; no analytics, and none of
    // the features that look for plugins and apps online.
    std::fs::write(
        codex_home.join("config.toml"),
        format!(
            r#"model = "test-model"
model_provider = "local"

[model_providers.local]
name = "local"
base_url = "{}/v1"
wire_api = "responses"
env_key = "LOCAL_MODEL_KEY"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[features]
plugins = false
remote_plugin = false
apps = false
"#,
            fx.llm.url()
        ),
    )
    .unwrap();
    fx.profile(
        "codex",
        &agent_bin("codex-acp"),
        vec![
            ("HOME", fx.root.join("codex-user").display().to_string()),
            ("CODEX_HOME", codex_home.display().to_string()),
            ("LOCAL_MODEL_KEY", "test-key".into()),
            // Read-only sandbox, ask the person before anything more (not an automatic
            // reviewer model).
            ("INITIAL_AGENT_MODE", "read-only".into()),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_acp_reads_asks_once_and_reports_once() {
    let fx = Fixture::new().await;
    codex_profile(&fx);
    let (report, child) = delegate_and_answer(&fx, "codex", true).await;
    assert!(
        report.contains("read notes.txt: first line of the notes; publish: done"),
        "{report}"
    );
    assert!(fx.ws.join("published.txt").exists());
    let calls: Vec<&str> = child
        .iter()
        .flat_map(|m| m.tool_calls.iter().map(|c| c.name.as_str()))
        .collect();
    assert_eq!(calls, ["read", "execute"], "{child:#?}");
    let results = tool_results(&child);
    assert!(
        results[0].contains("first line of the notes"),
        "{results:?}"
    );
    assert_read_and_command(&child);
}

/// Codex ends its turn as `cancelled` when its permission request is rejected ("No, and
/// tell Codex what to do differently"): that is the agent's end of turn, not the person's
/// Stop, so the report says how it ended and the child is not shown as stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_acp_refused_ends_its_turn_and_reports_how() {
    let fx = Fixture::new().await;
    codex_profile(&fx);
    let (report, child) = delegate_and_answer(&fx, "codex", false).await;
    assert!(!fx.ws.join("published.txt").exists());
    assert!(
        report.contains("the agent ended its turn (stop reason: cancelled)"),
        "{report}"
    );
    assert!(!report.to_lowercase().contains("stopped"), "{report}");
    let results = tool_results(&child);
    assert!(
        results[0].contains("first line of the notes"),
        "{results:?}"
    );
}

/// Rejected, Claude Code's command does not run and its model is told so (the tool result
/// an error); its turn goes on to an answer, the one report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_agent_acp_rejected_reports_the_refusal() {
    let fx = Fixture::new().await;
    claude_profile(&fx);
    let (report, child) = delegate_and_answer(&fx, "claude", false).await;
    assert!(!fx.ws.join("published.txt").exists());
    assert!(
        report.contains("read notes.txt: first line of the notes; publish: refused"),
        "{report}"
    );
    assert_read_and_command(&child);
}
