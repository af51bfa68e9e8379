//! MCP servers end to end (issue #15), against servers others wrote: the reference `@modelcontextprotocol/server-everything` from npm (stdio and streamable HTTP) and a small server on the Python `mcp` SDK from PyPI (`tests/mcp-servers/bumblehive_test_server.py`), driven through real sessions on the scripted model server. `scripts/mcp-test-servers.sh` installs them; without them the tests say so loudly and skip, except under `CI`, where they fail.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bumblehive::commands::dispatch;
use bumblehive::controller::Subscription;
use bumblehive::protocol::{Event, Role};
use bumblehive::service::{RuntimeService, ServiceOptions};
use serde_json::{Value, json};

use crate::mock_llm::{MockLlm, MockResponse, RecordedRequest, anthropic, openai};
use crate::providers_openai::{TEST_KEY_ENV, set_test_key};

/// Starting node or Python takes a while on a loaded 2-core machine.
const WAIT: Duration = Duration::from_secs(30);

fn missing(what: &str) -> Option<PathBuf> {
    let message = format!(
        "{what} is not installed: run ./scripts/mcp-test-servers.sh (the MCP tests need it)"
    );
    if std::env::var_os("CI").is_some() {
        panic!("{message}");
    }
    eprintln!("\n!!!!!!!!!! SKIPPED: {message} !!!!!!!!!!\n");
    None
}

/// server-everything's entry point (`node <it> stdio|streamableHttp`).
fn everything() -> Option<PathBuf> {
    let path = std::env::var_os("BUMBLEHIVE_MCP_EVERYTHING")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join(
                "tests/mcp-servers/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
            )
        });
    if path.exists() {
        Some(path)
    } else {
        missing("@modelcontextprotocol/server-everything (npm)")
    }
}

/// The venv's Python with the `mcp` SDK.
fn python() -> Option<PathBuf> {
    let venv = std::env::var_os("BUMBLEHIVE_MCP_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            dirs::home_dir()
                .unwrap_or_default()
                .join(".cache/bumblehive-mcp/venv")
        });
    let python = venv.join("bin/python");
    if python.exists() {
        Some(python)
    } else {
        missing("the Python mcp SDK venv (PyPI)")
    }
}

fn python_server() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp-servers/bumblehive_test_server.py")
}

fn everything_stdio(entry: &Path) -> Value {
    json!({"command": "node", "args": [entry, "stdio"]})
}

/// What the scripted model does: given a request, its answer.
type Script = Arc<dyn Fn(&RecordedRequest) -> MockResponse + Send + Sync>;

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    ws: PathBuf,
    mock: MockLlm,
    service: RuntimeService,
}

impl Fixture {
    /// A service whose config has `extra` merged in (e.g. `mcp_servers`, `tools`).
    async fn new(extra: Value, script: Script) -> Fixture {
        set_test_key();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let ws = root.join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        let mock = MockLlm::start().await;
        mock.respond_with(move |request| script(request));
        let mut config = json!({
            "provider": {"kind": "openai", "base_url": format!("{}/v1", mock.url()), "model": "m",
                         "api_key_env": TEST_KEY_ENV, "max_retries": 0, "context_window": 100000},
        });
        bumblehive::config::merge_patch(&mut config, &extra);
        let config_path = root.join("config.json");
        std::fs::write(&config_path, config.to_string()).unwrap();
        let service = RuntimeService::new(ServiceOptions {
            data_dir: root.join("data"),
            config_path: Some(config_path),
            config: None,
            provider_factory: Arc::new(bumblehive::providers::provider_from_config),
            tools: None,
        })
        .unwrap();
        Fixture {
            _dir: dir,
            root,
            ws,
            mock,
            service,
        }
    }

    fn session(&self) -> (String, Subscription) {
        let info = self
            .service
            .create_session(self.ws.to_str().unwrap(), None)
            .unwrap();
        let controller = self.service.controller(&info.session_id).unwrap();
        let (events, _) = controller.subscribe();
        (info.session_id, events)
    }

    async fn submit(&self, session_id: &str, text: &str) {
        self.service
            .submit_message(session_id, text.into(), None)
            .await
            .unwrap();
    }

    async fn command(&self, name: &str, args: Value) -> Value {
        dispatch(&self.service, name, args)
            .await
            .unwrap_or_else(|err| panic!("{name}: {err}"))
    }

    /// The chat requests whose last message answers a tool call.
    fn tool_results(&self) -> Vec<Value> {
        self.mock
            .bodies()
            .into_iter()
            .filter_map(|body| {
                let last = body["messages"].as_array()?.last()?.clone();
                (last["role"] == "tool").then_some(last)
            })
            .collect()
    }

    async fn shutdown(self) {
        self.service.shutdown().await;
    }
}

fn last_message(request: &RecordedRequest) -> Value {
    request.body["messages"]
        .as_array()
        .and_then(|m| m.last().cloned())
        .unwrap_or(Value::Null)
}

fn tool_names(request: &RecordedRequest) -> Vec<String> {
    request.body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["function"]["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn first_user(request: &RecordedRequest) -> String {
    request.body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
        .to_string()
}

fn last_user(request: &RecordedRequest) -> String {
    request.body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str())
        .next_back()
        .unwrap_or("")
        .to_string()
}

fn call(id: &str, name: &str, args: Value) -> MockResponse {
    MockResponse::sse(openai::tool_answer(&[(id, name, args)], (1, 1)))
}

fn text(answer: &str) -> MockResponse {
    MockResponse::sse(openai::text_answer(&[answer], (1, 1)))
}

/// Calls `name` with `args` when the newest user message contains `trigger`, then answers
/// with the tool's result as text.
fn call_then_echo(trigger: &'static str, name: &'static str, args: Value) -> Script {
    Arc::new(move |request| {
        let last = last_message(request);
        if last["role"] == "tool" {
            return text(&format!("saw: {}", last["content"].as_str().unwrap_or("")));
        }
        if last_user(request).contains(trigger) {
            return call(&format!("call-{}", uuid()), name, args.clone());
        }
        text("nothing to do")
    })
}

fn uuid() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed).to_string()
}

async fn next_where(events: &mut Subscription, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    tokio::time::timeout(WAIT, async {
        loop {
            let event: Event = events.next_event().await.expect("event stream closed");
            let value = serde_json::to_value(&event).unwrap();
            if pred(&value) {
                return value;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

async fn result_of(events: &mut Subscription, session_id: &str) -> String {
    let result = next_where(events, "result", |v| {
        v["type"] == "result" && v["session_id"] == session_id
    })
    .await;
    result["content"].as_str().unwrap_or("").to_string()
}

fn is_progress(value: &Value, kind: &str) -> bool {
    value["type"] == "event" && value["kind"] == kind
}

/// Waits (bounded) until `check` holds for the server list.
async fn wait_servers(
    fx: &Fixture,
    workspace: Option<&Path>,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let args = json!({"workspace": workspace});
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let list = fx.command("list_mcp_servers", args.clone()).await;
        if check(&list) {
            return list;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "server list never matched: {list}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_everything_stdio_tool_call_goes_through_the_gate_and_back_to_the_model() {
    let Some(entry) = everything() else { return };
    let fx = Fixture::new(
        json!({"mcp_servers": {"everything": everything_stdio(&entry)}}),
        call_then_echo(
            "echo",
            "mcp__everything__echo",
            json!({"message": "hello mcp"}),
        ),
    )
    .await;
    // Nothing starts before a turn needs it.
    let before = fx.command("list_mcp_servers", json!({})).await;
    assert_eq!(before[0]["state"], "not_started", "{before}");
    let (id, mut events) = fx.session();
    fx.submit(&id, "please echo").await;
    let request = next_where(&mut events, "approval_request", |v| {
        v["type"] == "approval_request"
    })
    .await;
    assert_eq!(request["tool"], "mcp__everything__echo");
    assert_eq!(request["mcp_server"], "everything");
    assert_eq!(request["arguments"]["message"], "hello mcp");
    // The first request already offered the server's tools, with its description and schema.
    let first = &fx.mock.requests()[0];
    let tools = first.body["tools"].as_array().unwrap();
    let echo = tools
        .iter()
        .find(|t| t["function"]["name"] == "mcp__everything__echo")
        .unwrap_or_else(|| panic!("no echo tool in {:?}", tool_names(first)));
    assert!(
        echo["function"]["description"]
            .as_str()
            .unwrap()
            .contains("Echoes back the input"),
        "{echo}"
    );
    assert_eq!(
        echo["function"]["parameters"]["properties"]["message"]["type"],
        "string"
    );
    fx.service
        .decide_approval(bumblehive::protocol::commands::DecideApproval {
            session_id: id.clone(),
            approval_id: request["approval_id"].as_str().unwrap().into(),
            approved: true,
            remember: false,
            reason: None,
        })
        .unwrap();
    let answer = result_of(&mut events, &id).await;
    assert_eq!(answer, "saw: Echo: hello mcp");
    let results = fx.tool_results();
    assert_eq!(results[0]["content"], "Echo: hello mcp");
    // Settings' list: ready, with its tools.
    let list = fx.command("list_mcp_servers", json!({})).await;
    assert_eq!(list[0]["state"], "ready", "{list}");
    assert_eq!(list[0]["transport"], "stdio");
    let listed: Vec<&str> = list[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["full_name"].as_str().unwrap())
        .collect();
    assert!(listed.contains(&"mcp__everything__echo"), "{listed:?}");
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_policy_allows_a_server_and_denies_one_tool_and_env_secrets_stay_out_of_get_config() {
    let Some(entry) = everything() else { return };
    // SAFETY: a name only this test reads, set before the server starts.
    unsafe { std::env::set_var("BUMBLEHIVE_TEST_MCP_SECRET", "s3cret-from-env") };
    let mut server = everything_stdio(&entry);
    server["env"] =
        json!({"FROM_REF": "${BUMBLEHIVE_TEST_MCP_SECRET}", "LITERAL": "literal-s3cret"});
    let fx = Fixture::new(
        json!({"mcp_servers": {"everything": server},
               "tools": {"policy": {"mcp__everything": "allow", "mcp__everything__get-sum": "deny"}}}),
        call_then_echo("env", "mcp__everything__get-env", json!({})),
    )
    .await;
    let (id, mut events) = fx.session();
    fx.submit(&id, "show env").await;
    let answer = result_of(&mut events, &id).await;
    // Allowed by the server's policy: no approval was asked; the reference reached the server.
    assert!(answer.contains("s3cret-from-env"), "{answer}");
    assert!(answer.contains("literal-s3cret"), "{answer}");
    // The provider's key variable is not inherited by the server.
    assert!(
        !answer.contains(crate::providers_openai::TEST_KEY),
        "{answer}"
    );
    assert!(!answer.contains(TEST_KEY_ENV), "{answer}");
    let first = &fx.mock.requests()[0];
    let names = tool_names(first);
    assert!(names.contains(&"mcp__everything__get-env".to_string()));
    assert!(
        !names.contains(&"mcp__everything__get-sum".to_string()),
        "a denied tool is not offered: {names:?}"
    );
    let config = fx.command("get_config", json!({})).await.to_string();
    assert!(!config.contains("literal-s3cret"), "{config}");
    assert!(config.contains("${BUMBLEHIVE_TEST_MCP_SECRET}"), "{config}");
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_stop_cancels_a_long_running_everything_call_and_the_server_stays_usable() {
    let Some(entry) = everything() else { return };
    let script: Script = Arc::new(|request| {
        let last = last_message(request);
        if last["role"] == "tool" {
            return text(&format!("saw: {}", last["content"].as_str().unwrap_or("")));
        }
        if last_user(request).contains("long") {
            return call(
                "long-1",
                "mcp__everything__trigger-long-running-operation",
                json!({"duration": 60, "steps": 60}),
            );
        }
        call(
            "echo-2",
            "mcp__everything__echo",
            json!({"message": "after stop"}),
        )
    });
    let fx = Fixture::new(
        json!({"mcp_servers": {"everything": everything_stdio(&entry)},
               "tools": {"policy": {"mcp__everything": "allow"}}}),
        script,
    )
    .await;
    let (id, mut events) = fx.session();
    fx.submit(&id, "long please").await;
    next_where(&mut events, "the long call started", |v| {
        is_progress(v, "tool.call.started")
            && v["data"]["name"] == "mcp__everything__trigger-long-running-operation"
    })
    .await;
    fx.service.cancel_session(&id).await.unwrap();
    // The run ends at once, not after the operation's 60 s.
    let finished = next_where(&mut events, "the cancelled call", |v| {
        is_progress(v, "tool.call.finished")
    })
    .await;
    assert_eq!(finished["data"]["is_error"], true, "{finished}");
    next_where(&mut events, "run.cancelled", |v| {
        is_progress(v, "run.cancelled")
    })
    .await;
    // The same server answers the next turn.
    fx.submit(&id, "echo now").await;
    let answer = result_of(&mut events, &id).await;
    assert_eq!(answer, "saw: Echo: after stop");
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_stop_sends_notifications_cancelled_to_the_python_server() {
    let Some(python) = python() else { return };
    let marks = tempfile::tempdir().unwrap();
    let fx = Fixture::new(
        json!({"mcp_servers": {"py": {"command": python, "args": [python_server()],
                                      "env": {"MARK_DIR": marks.path()}}},
               "tools": {"policy": {"mcp__py__wait": "allow"}}}),
        call_then_echo("wait", "mcp__py__wait", json!({"seconds": 60})),
    )
    .await;
    let (id, mut events) = fx.session();
    fx.submit(&id, "wait please").await;
    next_where(&mut events, "the wait started", |v| {
        is_progress(v, "tool.call.started")
    })
    .await;
    // The call reached the server's handler before Stop.
    wait_file(&marks.path().join("started")).await;
    fx.service.cancel_session(&id).await.unwrap();
    next_where(&mut events, "run.cancelled", |v| {
        is_progress(v, "run.cancelled")
    })
    .await;
    // The server's handler was cancelled: the client sent notifications/cancelled.
    wait_file(&marks.path().join("cancelled")).await;
    fx.shutdown().await;
}

/// Waits (bounded) for a file another process writes.
async fn wait_file(path: &Path) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !path.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_server_exiting_mid_call_is_a_clear_tool_error_and_restarts_for_the_next_turn() {
    let Some(entry) = everything() else { return };
    let pid_dir = tempfile::tempdir().unwrap();
    let pid_file = pid_dir.path().join("pid");
    // The real server-everything; the shell only notes its pid before becoming it.
    let server = json!({"command": "sh", "args": ["-c", "echo $$ > \"$0\"; exec node \"$1\" stdio",
                                                  pid_file, entry]});
    let script: Script = Arc::new(|request| {
        let last = last_message(request);
        if last["role"] == "tool" {
            return text(&format!("saw: {}", last["content"].as_str().unwrap_or("")));
        }
        if last_user(request).contains("long") {
            return call(
                "long-1",
                "mcp__everything__trigger-long-running-operation",
                json!({"duration": 60, "steps": 60}),
            );
        }
        call(
            "echo-2",
            "mcp__everything__echo",
            json!({"message": "restarted"}),
        )
    });
    let fx = Fixture::new(
        json!({"mcp_servers": {"everything": server},
               "tools": {"policy": {"mcp__everything": "allow"}}}),
        script,
    )
    .await;
    let (id, mut events) = fx.session();
    fx.submit(&id, "long please").await;
    next_where(&mut events, "the long call started", |v| {
        is_progress(v, "tool.call.started")
    })
    .await;
    let first_pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: kill only signals the server this test started.
    unsafe { libc::kill(first_pid, libc::SIGKILL) };
    let answer = result_of(&mut events, &id).await;
    assert!(
        answer.contains("exited during the call") && answer.contains("everything"),
        "{answer}"
    );
    // The next turn finds it restarted (a new process) and its tools work.
    fx.submit(&id, "echo now").await;
    let answer = result_of(&mut events, &id).await;
    assert_eq!(answer, "saw: Echo: restarted");
    let second_pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_ne!(first_pid, second_pid);
    fx.shutdown().await;
}

/// server-everything in its streamable HTTP mode on a free port, until dropped.
struct HttpEverything {
    child: tokio::process::Child,
    url: String,
}

impl HttpEverything {
    async fn start(entry: &Path) -> HttpEverything {
        use tokio::io::AsyncBufReadExt;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = tokio::process::Command::new("node")
            .arg(entry)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        tokio::time::timeout(WAIT, async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if line.contains("listening on port") {
                    return;
                }
            }
            panic!("server-everything (HTTP) exited before listening");
        })
        .await
        .expect("server-everything (HTTP) never listened");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        HttpEverything {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_everything_over_streamable_http_calls_a_tool_and_stop_cancels_a_long_one() {
    let Some(entry) = everything() else { return };
    let mut http = HttpEverything::start(&entry).await;
    let script: Script = Arc::new(|request| {
        let last = last_message(request);
        if last["role"] == "tool" {
            return text(&format!("saw: {}", last["content"].as_str().unwrap_or("")));
        }
        if last_user(request).contains("long") {
            return call(
                &format!("long-{}", uuid()),
                "mcp__remote__trigger-long-running-operation",
                json!({"duration": 60, "steps": 60}),
            );
        }
        call(
            &format!("sum-{}", uuid()),
            "mcp__remote__get-sum",
            json!({"a": 2, "b": 40}),
        )
    });
    let fx = Fixture::new(
        json!({"mcp_servers": {"remote": {"type": "http", "url": http.url,
                                          "headers": {"X-Test": "literal-header-s3cret"}}},
               "tools": {"policy": {"mcp__remote": "allow"}}}),
        script,
    )
    .await;
    let (id, mut events) = fx.session();
    fx.submit(&id, "sum please").await;
    let answer = result_of(&mut events, &id).await;
    assert!(answer.contains("42"), "{answer}");
    let list = fx.command("list_mcp_servers", json!({})).await;
    assert_eq!(list[0]["transport"], "http");
    assert_eq!(list[0]["state"], "ready");
    let config = fx.command("get_config", json!({})).await.to_string();
    assert!(!config.contains("literal-header-s3cret"), "{config}");
    // Stop during a long call over HTTP ends the run now; the session goes on.
    fx.submit(&id, "long please").await;
    next_where(&mut events, "the long call started", |v| {
        is_progress(v, "tool.call.started")
            && v["data"]["name"] == "mcp__remote__trigger-long-running-operation"
    })
    .await;
    fx.service.cancel_session(&id).await.unwrap();
    next_where(&mut events, "run.cancelled", |v| {
        is_progress(v, "run.cancelled")
    })
    .await;
    fx.submit(&id, "sum again").await;
    let answer = result_of(&mut events, &id).await;
    assert!(answer.contains("42"), "{answer}");
    fx.shutdown().await;
    let _ = http.child.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_an_image_result_reaches_anthropic_as_an_image_and_chat_completions_as_a_note() {
    let Some(entry) = everything() else { return };
    // Chat Completions: tool results are text only, so the model is told of the image.
    let fx = Fixture::new(
        json!({"mcp_servers": {"everything": everything_stdio(&entry)},
               "tools": {"policy": {"mcp__everything": "allow"}}}),
        call_then_echo("image", "mcp__everything__get-tiny-image", json!({})),
    )
    .await;
    let (id, mut events) = fx.session();
    fx.submit(&id, "image please").await;
    let answer = result_of(&mut events, &id).await;
    assert!(answer.contains("(image/png)]"), "{answer}");
    assert!(
        answer.contains("not shown: this API takes text only"),
        "{answer}"
    );
    // The image's base64 never reaches this model, but the history keeps it.
    let result = fx.tool_results()[0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(result.len() < 2_000, "{result}");
    let stored = fx.service.get_session(&id).unwrap().messages;
    let tool = stored.iter().find(|m| m.role == Role::Tool).unwrap();
    assert_eq!(tool.images.len(), 1);
    assert_eq!(tool.images[0].media_type, "image/png");
    let data = tool.images[0].data.clone();
    fx.shutdown().await;

    // Anthropic: the tool result's content carries the image block.
    let fx = Fixture::new(
        json!({"mcp_servers": {"everything": everything_stdio(&entry)},
               "tools": {"policy": {"mcp__everything": "allow"}}}),
        Arc::new(|request: &RecordedRequest| {
            let messages = request.body["messages"].as_array().unwrap();
            let last = messages.last().unwrap();
            let has_result = last["content"]
                .as_array()
                .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"));
            if has_result {
                MockResponse::sse(anthropic::text_answer(&["a tiny image"], 1, 1))
            } else {
                MockResponse::sse(anthropic::tool_answer(
                    &[("toolu_1", "mcp__everything__get-tiny-image", json!({}))],
                    1,
                    1,
                ))
            }
        }),
    )
    .await;
    fx.service
        .update_config(&json!({"provider": {"kind": "anthropic", "base_url": fx.mock.url()}}))
        .unwrap();
    let (id, mut events) = fx.session();
    fx.submit(&id, "image please").await;
    assert_eq!(result_of(&mut events, &id).await, "a tiny image");
    let bodies = fx.mock.bodies();
    let last = bodies.last().unwrap()["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    let result = last["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_result")
        .unwrap()
        .clone();
    let image = result["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "image")
        .expect("an image block in the tool result")
        .clone();
    assert_eq!(image["source"]["media_type"], "image/png");
    assert_eq!(image["source"]["data"], data.as_str());
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_tools_list_changed_is_followed_by_the_next_turn() {
    let Some(python) = python() else { return };
    let fx = Fixture::new(
        json!({"mcp_servers": {"py": {"command": python, "args": [python_server()]}},
               "tools": {"policy": {"mcp__py": "allow"}}}),
        call_then_echo("add", "mcp__py__add_tool", json!({"name": "fresh"})),
    )
    .await;
    let (id, mut events) = fx.session();
    fx.submit(&id, "add a tool").await;
    assert_eq!(result_of(&mut events, &id).await, "saw: added fresh");
    assert!(!tool_names(&fx.mock.requests()[0]).contains(&"mcp__py__fresh".to_string()));
    wait_servers(&fx, None, |list| {
        list[0]["tools"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["name"] == "fresh"))
    })
    .await;
    fx.submit(&id, "anything new?").await;
    result_of(&mut events, &id).await;
    let last = fx.mock.requests().pop().unwrap();
    assert!(
        tool_names(&last).contains(&"mcp__py__fresh".to_string()),
        "{:?}",
        tool_names(&last)
    );
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_a_childs_mcp_approval_reaches_the_parents_window_naming_the_child() {
    let Some(entry) = everything() else { return };
    let script: Script = Arc::new(|request| {
        let last = last_message(request);
        let child = first_user(request).contains("USE-MCP");
        if child {
            if last["role"] == "tool" {
                return text(&format!(
                    "child saw: {}",
                    last["content"].as_str().unwrap_or("")
                ));
            }
            return call(
                "c-echo",
                "mcp__everything__echo",
                json!({"message": "from child"}),
            );
        }
        if last["role"] == "tool" || last_user(request).contains("[Background") {
            return text("parent done");
        }
        call(
            "delegate-1",
            "sub_agent",
            json!({"title": "Helper", "task": "USE-MCP"}),
        )
    });
    let fx = Fixture::new(
        json!({"mcp_servers": {"everything": everything_stdio(&entry)}}),
        script,
    )
    .await;
    let (parent, mut events) = fx.session();
    fx.submit(&parent, "delegate it").await;
    let request = next_where(&mut events, "the child's approval", |v| {
        v["type"] == "approval_request"
    })
    .await;
    assert_ne!(request["session_id"], parent.as_str());
    assert_eq!(request["parent_session_id"], parent.as_str());
    assert_eq!(request["title"], "Helper");
    assert_eq!(request["tool"], "mcp__everything__echo");
    assert_eq!(request["mcp_server"], "everything");
    let child = request["session_id"].as_str().unwrap().to_string();
    fx.service
        .decide_approval(bumblehive::protocol::commands::DecideApproval {
            session_id: parent.clone(),
            approval_id: request["approval_id"].as_str().unwrap().into(),
            approved: true,
            remember: false,
            reason: None,
        })
        .unwrap();
    assert_eq!(
        result_of(&mut events, &child).await,
        "child saw: Echo: from child"
    );
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_workspace_file_servers_wait_for_trust_once_per_content() {
    let Some(python) = python() else { return };
    let fx = Fixture::new(json!({}), Arc::new(|_| text("ok"))).await;
    workspace_python_server(&fx, &python);
    let (id, mut events) = fx.session();
    fx.submit(&id, "first").await;
    // The session is told (the window asks the person), and the turn goes on without them.
    let asked = next_where(&mut events, "mcp.trust_needed", |v| {
        is_progress(v, "mcp.trust_needed")
    })
    .await;
    assert_eq!(asked["data"]["servers"], json!(["wsserver"]));
    assert_eq!(asked["data"]["workspace"], fx.ws.to_str().unwrap());
    result_of(&mut events, &id).await;
    // Not trusted yet: nothing started, nothing offered, the list says why.
    assert!(
        !tool_names(&fx.mock.requests()[0])
            .iter()
            .any(|n| n.starts_with("mcp__"))
    );
    let list = fx
        .command("list_mcp_servers", json!({"workspace": fx.ws}))
        .await;
    assert_eq!(list[0]["name"], "wsserver");
    assert_eq!(list[0]["state"], "waiting_for_trust", "{list}");
    // Trusted: the next turn starts it and offers its tools.
    fx.command(
        "trust_mcp_workspace",
        json!({"workspace": fx.ws, "allow": true}),
    )
    .await;
    fx.submit(&id, "second").await;
    result_of(&mut events, &id).await;
    let names = tool_names(&fx.mock.requests().pop().unwrap());
    assert!(
        names.contains(&"mcp__wsserver__wait".to_string()),
        "{names:?}"
    );
    // The trust is stored with the file's content: a change asks again.
    assert!(fx.root.join("data/mcp-trust.json").exists());
    let changed = json!({"mcpServers": {"wsserver": {"command": python, "args": [python_server(), "--changed"]}}});
    std::fs::write(fx.ws.join(".mcp.json"), changed.to_string()).unwrap();
    fx.submit(&id, "third").await;
    result_of(&mut events, &id).await;
    let names = tool_names(&fx.mock.requests().pop().unwrap());
    assert!(!names.iter().any(|n| n.starts_with("mcp__")), "{names:?}");
    let list = fx
        .command("list_mcp_servers", json!({"workspace": fx.ws}))
        .await;
    assert_eq!(list[0]["state"], "waiting_for_trust", "{list}");
    // Refused: not started and not asked again for this content.
    fx.command(
        "trust_mcp_workspace",
        json!({"workspace": fx.ws, "allow": false}),
    )
    .await;
    fx.submit(&id, "fourth").await;
    let seen = events_until_result(&mut events, &id).await;
    assert!(
        !seen.iter().any(|v| is_progress(v, "mcp.trust_needed")),
        "{seen:?}"
    );
    let list = fx
        .command("list_mcp_servers", json!({"workspace": fx.ws}))
        .await;
    assert_eq!(list[0]["state"], "disabled", "{list}");
    fx.shutdown().await;
}

/// A workspace `.mcp.json` naming the Python SDK's small server as `wsserver`.
fn workspace_python_server(fx: &Fixture, python: &Path) {
    let file = json!({"mcpServers": {"wsserver": {"command": python, "args": [python_server()]}}});
    std::fs::write(fx.ws.join(".mcp.json"), file.to_string()).unwrap();
}

/// `wsserver` in a server listing is ready, with its tools.
fn assert_ready_with_its_tools(list: &Value) {
    let server = server_named(list, "wsserver");
    assert_eq!(server["state"], "ready", "{list}");
    assert!(
        server["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["full_name"] == "mcp__wsserver__wait"),
        "{list}"
    );
}

/// E13: "Trust and start" starts the workspace's servers now, without a turn, and its
/// answer lists them ready with their tools (not "starts with the first turn").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_trust_and_start_starts_the_workspace_servers_and_answers_when_ready() {
    let Some(python) = python() else { return };
    let fx = Fixture::new(json!({}), Arc::new(|_| text("ok"))).await;
    workspace_python_server(&fx, &python);
    let list = fx
        .command("list_mcp_servers", json!({"workspace": fx.ws}))
        .await;
    assert_eq!(
        server_named(&list, "wsserver")["state"],
        "waiting_for_trust"
    );
    let sha = server_named(&list, "wsserver")["trust_sha256"].clone();
    let started = fx
        .command(
            "trust_mcp_workspace",
            json!({"workspace": fx.ws, "allow": true, "start": true, "sha256": sha}),
        )
        .await;
    assert_ready_with_its_tools(&started);
    // No model request was made: it started from the answer, not from a turn.
    assert!(fx.mock.requests().is_empty());
    fx.shutdown().await;
}

/// E13: opening a workspace starts its trusted servers (`warm_workspace`), so the first
/// turn after a start does not wait for them; an untrusted `.mcp.json` starts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_opening_a_workspace_starts_its_trusted_servers_before_any_turn() {
    let Some(python) = python() else { return };
    let fx = Fixture::new(json!({}), Arc::new(|_| text("ok"))).await;
    workspace_python_server(&fx, &python);
    let untrusted = fx
        .command("warm_workspace", json!({"workspace": fx.ws}))
        .await;
    assert_eq!(
        server_named(&untrusted, "wsserver")["state"],
        "waiting_for_trust",
        "{untrusted}"
    );
    let list = fx
        .command("list_mcp_servers", json!({"workspace": fx.ws}))
        .await;
    let sha = server_named(&list, "wsserver")["trust_sha256"].clone();
    // Trusted without "start": before, it then waited for the first turn.
    let trusted = fx
        .command(
            "trust_mcp_workspace",
            json!({"workspace": fx.ws, "allow": true, "sha256": sha}),
        )
        .await;
    assert_ne!(server_named(&trusted, "wsserver")["state"], "ready");
    let warmed = fx
        .command("warm_workspace", json!({"workspace": fx.ws}))
        .await;
    assert_ready_with_its_tools(&warmed);
    assert!(fx.mock.requests().is_empty(), "no turn ran");
    fx.shutdown().await;
}

/// Every event up to the session's next result.
async fn events_until_result(events: &mut Subscription, session_id: &str) -> Vec<Value> {
    let mut seen = Vec::new();
    tokio::time::timeout(WAIT, async {
        loop {
            let event: Event = events.next_event().await.expect("event stream closed");
            let value = serde_json::to_value(&event).unwrap();
            let done = value["type"] == "result" && value["session_id"] == session_id;
            seen.push(value);
            if done {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for a result"));
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_a_server_that_fails_to_start_is_shown_with_its_error_and_the_session_works() {
    let fx = Fixture::new(
        json!({"mcp_servers": {"broken": {"command": "/nonexistent/mcp-server"}}}),
        Arc::new(|_| text("fine without it")),
    )
    .await;
    let (id, mut events) = fx.session();
    fx.submit(&id, "hello").await;
    assert_eq!(result_of(&mut events, &id).await, "fine without it");
    let list = fx.command("list_mcp_servers", json!({})).await;
    assert_eq!(list[0]["state"], "failed", "{list}");
    let error = list[0]["error"].as_str().unwrap();
    assert!(error.contains("/nonexistent/mcp-server"), "{error}");
    // Disabling it writes the config; the list says so.
    let list = fx
        .command(
            "set_mcp_server_enabled",
            json!({"name": "broken", "enabled": false}),
        )
        .await;
    assert_eq!(list[0]["state"], "disabled");
    let saved = std::fs::read_to_string(fx.root.join("config.json")).unwrap();
    assert!(
        saved.contains("\"enabled\": false") || saved.contains("\"enabled\":false"),
        "{saved}"
    );
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_shutdown_stops_the_server_and_what_it_started() {
    let Some(entry) = everything() else { return };
    let pid_dir = tempfile::tempdir().unwrap();
    let pid_file = pid_dir.path().join("pid");
    // Before becoming server-everything, the shell starts a helper that reads no stdin
    // (as servers started through npx leave processes behind): it must stop too.
    let server = json!({"command": "sh", "args": ["-c", "sleep 300 & echo $! > \"$0\"; exec node \"$1\" stdio",
                                                  pid_file, entry]});
    let fx = Fixture::new(
        json!({"mcp_servers": {"everything": server}}),
        Arc::new(|_| text("ok")),
    )
    .await;
    let (id, mut events) = fx.session();
    fx.submit(&id, "start it").await;
    result_of(&mut events, &id).await;
    let list = fx.command("list_mcp_servers", json!({})).await;
    assert_eq!(list[0]["state"], "ready", "{list}");
    let helper: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!is_zombie(helper), "the helper runs while the server does");
    fx.shutdown().await;
    let deadline = tokio::time::Instant::now() + WAIT;
    // SAFETY: signal 0 only asks whether the process exists.
    while unsafe { libc::kill(helper, 0) } == 0 && !is_zombie(helper) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server's child {helper} still runs"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.split_whitespace().nth(2) == Some("Z"))
        .unwrap_or(true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_a_call_past_tool_timeout_sec_is_an_error_and_cancelled_on_the_server() {
    let Some(python) = python() else { return };
    let marks = tempfile::tempdir().unwrap();
    let fx = Fixture::new(
        json!({"mcp_servers": {"py": {"command": python, "args": [python_server()],
                                      "env": {"MARK_DIR": marks.path()}, "tool_timeout_sec": 1}},
               "tools": {"policy": {"mcp__py": "allow"}}}),
        call_then_echo("wait", "mcp__py__wait", json!({"seconds": 60})),
    )
    .await;
    let (id, mut events) = fx.session();
    fx.submit(&id, "wait please").await;
    let answer = result_of(&mut events, &id).await;
    assert!(answer.contains("did not answer within 1 s"), "{answer}");
    wait_file(&marks.path().join("cancelled")).await;
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_bumblehive_run_uses_the_configured_servers() {
    let Some(entry) = everything() else { return };
    set_test_key();
    let mock = MockLlm::start().await;
    let script = call_then_echo(
        "ROOT",
        "mcp__everything__echo",
        json!({"message": "from run"}),
    );
    mock.respond_with(move |request| script(request));
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let config = json!({
        "provider": {"kind": "openai", "base_url": format!("{}/v1", mock.url()), "model": "m",
                     "api_key_env": TEST_KEY_ENV, "max_retries": 0, "context_window": 100000},
        "mcp_servers": {"everything": everything_stdio(&entry)},
        "tools": {"policy": {"mcp__everything__echo": "allow"}},
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let output = tokio::time::timeout(
        WAIT,
        tokio::process::Command::new(env!("CARGO_BIN_EXE_bumblehive"))
            .arg("run")
            .arg("--json")
            .arg("--workspace")
            .arg(&workspace)
            .arg("--config")
            .arg(dir.path().join("config.json"))
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("ROOT")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("run did not exit")
    .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let last = stdout
        .lines()
        .rev()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|e| e["type"] == "result")
        .unwrap_or_else(|| panic!("no result in {stdout}"));
    assert_eq!(last["content"], "saw: Echo: from run");
}

#[test]
fn mcp_the_readme_example_config_is_valid() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let section = &readme[readme.find("## MCP servers").unwrap()..];
    let start = section.find("```json\n").unwrap() + "```json\n".len();
    let end = start + section[start..].find("```").unwrap();
    let config: bumblehive::config::Config = serde_json::from_str(&section[start..end])
        .unwrap_or_else(|err| panic!("the README's MCP config: {err}"));
    config.validate().unwrap();
    assert_eq!(config.mcp_servers.len(), 3);
    assert!(!config.mcp_servers["old"].enabled());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_restart_starts_a_running_server_anew() {
    let Some(entry) = everything() else { return };
    let pid_dir = tempfile::tempdir().unwrap();
    let pid_file = pid_dir.path().join("pid");
    let server = json!({"command": "sh", "args": ["-c", "echo $$ > \"$0\"; exec node \"$1\" stdio",
                                                  pid_file, entry]});
    let fx = Fixture::new(
        json!({"mcp_servers": {"everything": server}}),
        Arc::new(|_| text("ok")),
    )
    .await;
    let (id, mut events) = fx.session();
    fx.submit(&id, "start it").await;
    result_of(&mut events, &id).await;
    let first = std::fs::read_to_string(&pid_file).unwrap();
    fx.command("restart_mcp_server", json!({"name": "everything"}))
        .await;
    wait_servers(&fx, None, |list| {
        list[0]["state"] == "ready"
            && std::fs::read_to_string(&pid_file).is_ok_and(|pid| pid != first)
    })
    .await;
    // The old process is gone.
    let old: i32 = first.trim().parse().unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    // SAFETY: signal 0 only asks whether the process exists.
    while unsafe { libc::kill(old, 0) } == 0 && !is_zombie(old) {
        assert!(tokio::time::Instant::now() < deadline, "{old} still runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let err = dispatch(&fx.service, "restart_mcp_server", json!({"name": "nope"}))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "not_found");
    fx.shutdown().await;
}

/// Run by scripts/keyring-tier.sh (a real Secret Service in a private D-Bus session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyring_an_mcp_env_value_named_keyring_reaches_the_server_and_no_file() {
    if std::env::var_os("BUMBLEHIVE_KEYRING_TEST").is_none() {
        eprintln!("skipped: run scripts/keyring-tier.sh for a real Secret Service");
        return;
    }
    let Some(entry) = everything() else { return };
    let secret = format!("mcp-secret-{}", uuid());
    let name = format!("mcp-test-{}", std::process::id());
    bumblehive::providers::store_key_in_keyring(
        &name,
        &bumblehive::providers::ApiKey::new(secret.clone()),
    )
    .await
    .unwrap();
    let mut server = everything_stdio(&entry);
    server["env"] = json!({"FROM_KEYRING": format!("keyring:{name}")});
    let fx = Fixture::new(
        json!({"mcp_servers": {"everything": server},
               "tools": {"policy": {"mcp__everything": "allow"}}}),
        call_then_echo("env", "mcp__everything__get-env", json!({})),
    )
    .await;
    let (id, mut events) = fx.session();
    fx.submit(&id, "show env").await;
    let answer = result_of(&mut events, &id).await;
    assert!(answer.contains(&secret), "{answer}");
    let config = fx.command("get_config", json!({})).await.to_string();
    assert!(!config.contains(&secret) && config.contains(&format!("keyring:{name}")));
    // The config file names the entry, never the secret.
    let config_file = std::fs::read_to_string(fx.root.join("config.json")).unwrap();
    assert!(!config_file.contains(&secret));
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_disabling_a_running_server_stops_it_now_and_its_tools_go() {
    let Some(entry) = everything() else { return };
    let pid_dir = tempfile::tempdir().unwrap();
    let pid_file = pid_dir.path().join("pid");
    let server = json!({"command": "sh", "args": ["-c", "echo $$ > \"$0\"; exec node \"$1\" stdio",
                                                  pid_file, entry]});
    let fx = Fixture::new(
        json!({"mcp_servers": {"everything": server}}),
        Arc::new(|_| text("ok")),
    )
    .await;
    let (id, mut events) = fx.session();
    fx.submit(&id, "start it").await;
    result_of(&mut events, &id).await;
    assert!(tool_names(&fx.mock.requests()[0]).contains(&"mcp__everything__echo".to_string()));
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    fx.command(
        "set_mcp_server_enabled",
        json!({"name": "everything", "enabled": false}),
    )
    .await;
    let deadline = tokio::time::Instant::now() + WAIT;
    // SAFETY: signal 0 only asks whether the process exists.
    while unsafe { libc::kill(pid, 0) } == 0 && !is_zombie(pid) {
        assert!(tokio::time::Instant::now() < deadline, "{pid} still runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fx.submit(&id, "again").await;
    result_of(&mut events, &id).await;
    let names = tool_names(&fx.mock.requests().pop().unwrap());
    assert!(!names.iter().any(|n| n.starts_with("mcp__")), "{names:?}");
    // Enabled again: the next turn starts it.
    fx.command(
        "set_mcp_server_enabled",
        json!({"name": "everything", "enabled": true}),
    )
    .await;
    fx.submit(&id, "third").await;
    result_of(&mut events, &id).await;
    let names = tool_names(&fx.mock.requests().pop().unwrap());
    assert!(
        names.contains(&"mcp__everything__echo".to_string()),
        "{names:?}"
    );
    fx.shutdown().await;
}

/// tests/mcp-servers/raw_server.py (Python's standard library only) in `mode`, writing
/// its marks (pid per start, `stalled`) into `marks`.
fn raw_server(marks: &Path, mode: &str) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp-servers/raw_server.py");
    json!({"command": "python3", "args": [script],
           "env": {"MARK_DIR": marks, "MODE": mode}})
}

/// The pids the raw server wrote, one per start.
fn raw_pids(marks: &Path) -> Vec<i32> {
    std::fs::read_to_string(marks.join("pid"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect()
}

/// Waits (bounded) until the process is gone (or a zombie).
async fn wait_gone(pid: i32) {
    let deadline = tokio::time::Instant::now() + WAIT;
    // SAFETY: signal 0 only asks whether the process exists.
    while unsafe { libc::kill(pid, 0) } == 0 && !is_zombie(pid) {
        assert!(tokio::time::Instant::now() < deadline, "{pid} still runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Review R6: a server that sends `tools/list_changed` and then never answers the
/// `tools/list` that follows must not wedge its supervisor: Restart still starts it anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_restart_works_while_a_server_stalls_after_tools_list_changed() {
    let marks = tempfile::tempdir().unwrap();
    let fx = Fixture::new(
        json!({"mcp_servers": {"stall": raw_server(marks.path(), "stall_after_changed")}}),
        Arc::new(|_| text("ok")),
    )
    .await;
    let (id, mut events) = fx.session();
    fx.submit(&id, "start it").await;
    result_of(&mut events, &id).await;
    // The refresh after list_changed has reached the server, which does not answer it.
    wait_file(&marks.path().join("stalled")).await;
    let first = raw_pids(marks.path());
    assert_eq!(first.len(), 1, "{first:?}");
    std::fs::remove_file(marks.path().join("stalled")).unwrap();
    fx.command("restart_mcp_server", json!({"name": "stall"}))
        .await;
    let list = wait_servers(&fx, None, |list| {
        list[0]["state"] == "ready" && raw_pids(marks.path()).len() == 2
    })
    .await;
    assert_eq!(list[0]["tools"][0]["name"], "peek", "{list}");
    wait_gone(first[0]).await;
    // The new process stalls the same way; the manager still stops it.
    wait_file(&marks.path().join("stalled")).await;
    tokio::time::timeout(WAIT, fx.shutdown())
        .await
        .expect("shutdown did not return");
    for pid in raw_pids(marks.path()) {
        wait_gone(pid).await;
    }
}

/// Review R6: shutdown returns (and stops the process) while a supervisor waits for a
/// `tools/list` answer that never comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_shutdown_returns_while_a_server_stalls_after_tools_list_changed() {
    let marks = tempfile::tempdir().unwrap();
    let fx = Fixture::new(
        json!({"mcp_servers": {"stall": raw_server(marks.path(), "stall_after_changed")}}),
        Arc::new(|_| text("ok")),
    )
    .await;
    let (id, mut events) = fx.session();
    fx.submit(&id, "start it").await;
    result_of(&mut events, &id).await;
    wait_file(&marks.path().join("stalled")).await;
    // Well under WAIT: the bound is the manager's, not this test's.
    tokio::time::timeout(Duration::from_secs(10), fx.shutdown())
        .await
        .expect("shutdown did not return within 10 s");
    for pid in raw_pids(marks.path()) {
        wait_gone(pid).await;
    }
}

/// Writes `<workspace>/.mcp.json` with one raw server called `name`, trusts it, and runs
/// one turn of a new session there; returns the session and its events.
async fn turn_in_workspace(
    fx: &Fixture,
    workspace: &Path,
    name: &str,
    marks: &Path,
) -> (String, Subscription) {
    std::fs::create_dir_all(workspace).unwrap();
    let file = json!({"mcpServers": {name: raw_server(marks, "plain")}});
    std::fs::write(workspace.join(".mcp.json"), file.to_string()).unwrap();
    fx.command(
        "trust_mcp_workspace",
        json!({"workspace": workspace, "allow": true}),
    )
    .await;
    let info = fx
        .service
        .create_session(workspace.to_str().unwrap(), None)
        .unwrap();
    let controller = fx.service.controller(&info.session_id).unwrap();
    let (mut events, _) = controller.subscribe();
    fx.submit(&info.session_id, "use it").await;
    result_of(&mut events, &info.session_id).await;
    (info.session_id, events)
}

/// Review R9: the servers of workspaces no turn uses any more stop after
/// `mcp.workspace_idle_stop_sec`, and start again with the next turn there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_workspace_servers_stop_when_idle_and_start_again_with_the_next_turn() {
    let fx = Fixture::new(
        json!({"mcp": {"workspace_idle_stop_sec": 1}}),
        Arc::new(|_| text("ok")),
    )
    .await;
    let mut marks = Vec::new();
    let mut sessions = Vec::new();
    for n in 0..3 {
        let mark = tempfile::tempdir().unwrap();
        let ws = fx.root.join(format!("project-{n}"));
        sessions.push(turn_in_workspace(&fx, &ws, "notes", mark.path()).await);
        let tools = tool_names(&fx.mock.requests().pop().unwrap());
        assert!(tools.contains(&"mcp__notes__peek".to_string()), "{tools:?}");
        marks.push((mark, ws));
    }
    // Nobody uses them now: every process goes, none is left per visited workspace.
    for (mark, _) in &marks {
        let pids = raw_pids(mark.path());
        assert_eq!(pids.len(), 1, "{pids:?}");
        wait_gone(pids[0]).await;
    }
    // The next turn in the first workspace starts its server again, and offers its tools.
    let (id, events) = &mut sessions[0];
    fx.submit(id, "again").await;
    result_of(events, id).await;
    let tools = tool_names(&fx.mock.requests().pop().unwrap());
    assert!(tools.contains(&"mcp__notes__peek".to_string()), "{tools:?}");
    assert_eq!(raw_pids(marks[0].0.path()).len(), 2);
    for (mark, _) in &marks[1..] {
        assert_eq!(
            raw_pids(mark.path()).len(),
            1,
            "only the used one restarted"
        );
    }
    tokio::time::timeout(WAIT, fx.shutdown()).await.unwrap();
}

/// Review R9: a trust answer stops the workspace's running servers it replaces (they
/// used to leave the list and keep their process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_refusing_a_trusted_workspace_stops_its_running_server() {
    let fx = Fixture::new(json!({}), Arc::new(|_| text("ok"))).await;
    let mark = tempfile::tempdir().unwrap();
    let ws = fx.ws.clone();
    turn_in_workspace(&fx, &ws, "notes", mark.path()).await;
    let pids = raw_pids(mark.path());
    assert_eq!(pids.len(), 1, "{pids:?}");
    fx.command(
        "trust_mcp_workspace",
        json!({"workspace": ws, "allow": false}),
    )
    .await;
    wait_gone(pids[0]).await;
    tokio::time::timeout(WAIT, fx.shutdown()).await.unwrap();
}

/// Lists the workspace's servers (as the trust question does) and trusts what was listed.
async fn list_and_trust(fx: &Fixture, workspace: &Path) -> Value {
    let list = fx
        .command("list_mcp_servers", json!({"workspace": workspace}))
        .await;
    fx.command(
        "trust_mcp_workspace",
        json!({"workspace": workspace, "allow": true}),
    )
    .await;
    list
}

/// Approves the next approval request of the session's window.
async fn approve_next(fx: &Fixture, events: &mut Subscription, session_id: &str) {
    let request = next_where(events, "approval_request", |v| {
        v["type"] == "approval_request"
    })
    .await;
    fx.service
        .decide_approval(bumblehive::protocol::commands::DecideApproval {
            session_id: session_id.into(),
            approval_id: request["approval_id"].as_str().unwrap().into(),
            approved: true,
            remember: false,
            reason: None,
        })
        .unwrap();
}

fn server_named<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no server {name} in {list}"))
}

/// Security review 6: the listing shows what a workspace server runs (command line, env
/// names), and a trust answer is for exactly that: a file swapped after the listing, with
/// the same server name, is refused with the listing's digest and asked about again
/// without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_trust_is_for_the_listed_command_line_and_a_swapped_file_is_asked_again() {
    let fx = Fixture::new(json!({}), Arc::new(|_| text("ok"))).await;
    let shown_marks = tempfile::tempdir().unwrap();
    let swapped_marks = tempfile::tempdir().unwrap();
    let file = json!({"mcpServers": {"docs": raw_server(shown_marks.path(), "plain")}});
    std::fs::write(fx.ws.join(".mcp.json"), file.to_string()).unwrap();
    let list = fx
        .command("list_mcp_servers", json!({"workspace": fx.ws}))
        .await;
    let docs = server_named(&list, "docs");
    let launch = &docs["launch"];
    assert_eq!(launch["command"][0], "python3", "{docs}");
    assert!(
        launch["command"][1]
            .as_str()
            .is_some_and(|a| a.ends_with("raw_server.py")),
        "{docs}"
    );
    // Literal values are named, never shown.
    assert_eq!(launch["env"], json!(["MARK_DIR", "MODE"]), "{docs}");
    let digest = docs["trust_sha256"]
        .as_str()
        .expect("a trust digest")
        .to_string();
    // The agent rewrites the file after the listing, keeping the server's name.
    let swapped = json!({"mcpServers": {"docs": raw_server(swapped_marks.path(), "plain")}});
    std::fs::write(fx.ws.join(".mcp.json"), swapped.to_string()).unwrap();
    let err = dispatch(
        &fx.service,
        "trust_mcp_workspace",
        json!({"workspace": fx.ws, "allow": true, "sha256": digest}),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("changed since"), "{err}");
    // Without the digest, the answer is for what was listed, not for the new file.
    fx.command(
        "trust_mcp_workspace",
        json!({"workspace": fx.ws, "allow": true}),
    )
    .await;
    let (id, mut events) = fx.session();
    fx.submit(&id, "hello").await;
    next_where(&mut events, "mcp.trust_needed", |v| {
        is_progress(v, "mcp.trust_needed")
    })
    .await;
    result_of(&mut events, &id).await;
    let names = tool_names(&fx.mock.requests().pop().unwrap());
    assert!(!names.iter().any(|n| n.starts_with("mcp__")), "{names:?}");
    assert!(
        raw_pids(swapped_marks.path()).is_empty(),
        "the swapped server ran"
    );
    fx.shutdown().await;
}

/// Security review 7: a command edits the script of a trusted, running workspace server;
/// a restart (or crash, or the next app start) must not run the new code unasked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_a_trusted_servers_script_edited_by_a_command_waits_for_trust_again() {
    let fx = Fixture::new(json!({}), Arc::new(|_| text("ok"))).await;
    let marks = tempfile::tempdir().unwrap();
    let script = fx.ws.join("srv.py");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp-servers/raw_server.py"),
        &script,
    )
    .unwrap();
    let file = json!({"mcpServers": {"tools": {"command": "python3", "args": ["srv.py"], "cwd": ".",
                                               "env": {"MARK_DIR": marks.path(), "MODE": "plain"}}}});
    std::fs::write(fx.ws.join(".mcp.json"), file.to_string()).unwrap();
    let list = list_and_trust(&fx, &fx.ws).await;
    let files = &server_named(&list, "tools")["launch"]["program_files"];
    assert!(
        files[0]["path"]
            .as_str()
            .is_some_and(|p| p.ends_with("srv.py")),
        "the listing names the script it runs: {list}"
    );
    let (id, mut events) = fx.session();
    fx.submit(&id, "start it").await;
    result_of(&mut events, &id).await;
    assert!(tool_names(&fx.mock.requests().pop().unwrap()).contains(&"mcp__tools__peek".into()));
    assert_eq!(raw_pids(marks.path()).len(), 1);
    // What a sandboxed command may do without asking: edit a workspace file.
    let pwned = marks.path().join("pwned");
    let original = std::fs::read_to_string(&script).unwrap();
    std::fs::write(
        &script,
        format!(
            "import pathlib; pathlib.Path({:?}).write_text('x')\n{original}",
            pwned.display().to_string()
        ),
    )
    .unwrap();
    fx.command(
        "restart_mcp_server",
        json!({"name": "tools", "workspace": fx.ws}),
    )
    .await;
    wait_servers(&fx, Some(&fx.ws), |list| {
        server_named(list, "tools")["state"] == "waiting_for_trust"
    })
    .await;
    assert!(!pwned.exists(), "the edited script ran");
    // Nor does the next turn start it.
    fx.submit(&id, "again").await;
    result_of(&mut events, &id).await;
    let names = tool_names(&fx.mock.requests().pop().unwrap());
    assert!(!names.iter().any(|n| n.starts_with("mcp__")), "{names:?}");
    assert!(!pwned.exists(), "the edited script ran");
    assert_eq!(raw_pids(marks.path()).len(), 1);
    fx.shutdown().await;
}

/// Security review 8: a workspace `.mcp.json` gets no provider key, no keyring entry and
/// no variable the person did not list in `mcp.workspace_env`; nor does its server
/// inherit the app's other variables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_a_workspace_file_gets_no_provider_key_no_keyring_and_only_listed_variables() {
    // SAFETY: names only this test reads, set before any server starts.
    unsafe {
        std::env::set_var("BUMBLEHIVE_TEST_WS_ALLOWED", "allowed-value");
        std::env::set_var("BUMBLEHIVE_TEST_WS_SECRET", "secret-value");
    }
    let marks = tempfile::tempdir().unwrap();
    let with_env = |env: Value| {
        let mut server = raw_server(marks.path(), "plain");
        server["env"]
            .as_object_mut()
            .unwrap()
            .extend(env.as_object().unwrap().clone());
        server
    };
    let names = json!(["B", "BUMBLEHIVE_TEST_WS_SECRET", TEST_KEY_ENV]);
    let fx = Fixture::new(
        json!({"mcp": {"workspace_env": ["BUMBLEHIVE_TEST_WS_ALLOWED"]}}),
        call_then_echo("peek", "mcp__ok__peek", json!({"names": names})),
    )
    .await;
    let file = json!({"mcpServers": {
        "key": with_env(json!({"A": format!("${{{TEST_KEY_ENV}}}")})),
        "ring": with_env(json!({"R": "keyring:anything"})),
        "other": with_env(json!({"S": "${BUMBLEHIVE_TEST_WS_SECRET}"})),
        "ok": with_env(json!({"B": "${BUMBLEHIVE_TEST_WS_ALLOWED}"})),
    }});
    std::fs::write(fx.ws.join(".mcp.json"), file.to_string()).unwrap();
    list_and_trust(&fx, &fx.ws).await;
    let (id, mut events) = fx.session();
    fx.submit(&id, "peek").await;
    approve_next(&fx, &mut events, &id).await;
    let answer = result_of(&mut events, &id).await;
    assert!(answer.contains("B=allowed-value"), "{answer}");
    assert!(
        answer.contains("BUMBLEHIVE_TEST_WS_SECRET=<unset>"),
        "{answer}"
    );
    assert!(
        answer.contains(&format!("{TEST_KEY_ENV}=<unset>")),
        "{answer}"
    );
    let list = fx
        .command("list_mcp_servers", json!({"workspace": fx.ws}))
        .await;
    for (name, says) in [
        ("key", "a provider's key"),
        ("ring", "keyring: is not allowed"),
        ("other", "mcp.workspace_env"),
    ] {
        let server = server_named(&list, name);
        assert_eq!(server["state"], "failed", "{server}");
        assert!(
            server["error"].as_str().is_some_and(|e| e.contains(says)),
            "{server}"
        );
    }
    assert_eq!(server_named(&list, "ok")["state"], "ready");
    fx.shutdown().await;
}

/// Security review 11: `allow_read_only` in a workspace `.mcp.json` does not let its own
/// server's read-only tools run unasked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_a_workspace_file_cannot_exempt_its_server_from_asking() {
    let marks = tempfile::tempdir().unwrap();
    let fx = Fixture::new(
        json!({}),
        call_then_echo("peek", "mcp__notes__peek", json!({"names": ["HOME"]})),
    )
    .await;
    let mut server = raw_server(marks.path(), "plain");
    server["allow_read_only"] = json!(true);
    let file = json!({"mcpServers": {"notes": server}});
    std::fs::write(fx.ws.join(".mcp.json"), file.to_string()).unwrap();
    list_and_trust(&fx, &fx.ws).await;
    let (id, mut events) = fx.session();
    fx.submit(&id, "peek").await;
    let first = next_where(&mut events, "an approval request or the result", |v| {
        v["type"] == "approval_request" || v["type"] == "result"
    })
    .await;
    assert_eq!(first["type"], "approval_request", "{first}");
    assert_eq!(first["tool"], "mcp__notes__peek");
    fx.shutdown().await;
}

/// Security review 12: a workspace server never takes the tool names of a config server
/// (`docs.` and `docs` both sanitise to `mcp__docs__*`) or names the person's
/// `tools.policy` decides for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_workspace_server_names_never_take_the_persons_policy_or_config_names() {
    let marks = tempfile::tempdir().unwrap();
    let fx = Fixture::new(
        json!({"mcp_servers": {"docs": {"command": "/nonexistent/docs-server"}},
               "tools": {"policy": {"mcp__docs": "allow", "mcp__notes__peek": "allow"}}}),
        Arc::new(|_| text("ok")),
    )
    .await;
    let file = json!({"mcpServers": {
        "docs.": raw_server(marks.path(), "plain"),
        "notes": raw_server(marks.path(), "plain"),
        "other": raw_server(marks.path(), "plain"),
    }});
    std::fs::write(fx.ws.join(".mcp.json"), file.to_string()).unwrap();
    let (id, mut events) = fx.session();
    // A first turn reads the config's policy; then the person trusts the file.
    fx.submit(&id, "hello").await;
    result_of(&mut events, &id).await;
    list_and_trust(&fx, &fx.ws).await;
    fx.submit(&id, "again").await;
    result_of(&mut events, &id).await;
    let names = tool_names(&fx.mock.requests().pop().unwrap());
    assert!(names.contains(&"mcp__other__peek".to_string()), "{names:?}");
    assert!(!names.contains(&"mcp__docs__peek".to_string()), "{names:?}");
    assert!(
        !names.contains(&"mcp__notes__peek".to_string()),
        "{names:?}"
    );
    let list = fx
        .command("list_mcp_servers", json!({"workspace": fx.ws}))
        .await;
    for name in ["docs.", "notes"] {
        let server = server_named(&list, name);
        assert_eq!(server["state"], "failed", "{server}");
        assert!(
            server["error"]
                .as_str()
                .is_some_and(|e| e.contains("rename")),
            "{server}"
        );
    }
    fx.shutdown().await;
}
