//! The headless server end to end: the real `bumblehive` binary on port 0 with a temp data dir, a scripted OpenAI-compatible model server, driven over HTTP and SSE.

use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use bumblehive::protocol::Message;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use crate::mock_llm::{LiveStream, MockLlm, MockResponse, RecordedRequest, openai};
use crate::support::{WAIT, assert_message_order, is_event, is_report};

/// The seed's scripted model, over HTTP: parents delegate per plan, children wait on a
/// gate, read `data.txt`, and report. A closed gate holds the answer as a live stream.
#[derive(Default)]
struct Script {
    plans: HashMap<String, (usize, bool)>,
    open: HashSet<String>,
    waiting: HashMap<String, Vec<(LiveStream, String)>>,
    approval_path: String,
    parent_error: bool,
    /// Pieces of the answer to `ROOT:flood`.
    flood: usize,
}

#[derive(Clone, Default)]
pub struct Model(Arc<Mutex<Script>>);

impl Model {
    pub fn plan(&self, root: &str, count: usize, approval: bool) {
        self.0
            .lock()
            .unwrap()
            .plans
            .insert(root.into(), (count, approval));
    }

    /// Opens a gate: held answers are sent now, later ones at once.
    pub fn open(&self, gate: &str) {
        let held = {
            let mut script = self.0.lock().unwrap();
            script.open.insert(gate.into());
            script.waiting.remove(gate).unwrap_or_default()
        };
        for (stream, body) in held {
            stream.send(body);
            stream.finish();
        }
    }

    fn answer(&self, gate: &str, body: String) -> MockResponse {
        let mut script = self.0.lock().unwrap();
        if script.open.contains(gate) {
            return MockResponse::sse(body);
        }
        let (response, stream) = MockResponse::live();
        script
            .waiting
            .entry(gate.into())
            .or_default()
            .push((stream, body));
        response
    }

    fn respond(&self, request: &RecordedRequest) -> MockResponse {
        let messages = request.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let text = |m: &Value| m["content"].as_str().unwrap_or("").to_string();
        let users: Vec<String> = messages
            .iter()
            .filter(|m| m["role"] == "user")
            .map(text)
            .collect();
        let first = users.first().cloned().unwrap_or_default();
        let last = messages.last().cloned().unwrap_or(Value::Null);
        if first.contains("\nTask:\nCHILD:") {
            let name = first
                .rsplit_once("CHILD:")
                .unwrap()
                .1
                .lines()
                .next()
                .unwrap_or("")
                .to_string();
            if name.starts_with("flood") {
                let flood = self.0.lock().unwrap().flood;
                // Wide deltas, so the children together outgrow every buffer on the way.
                let pieces: Vec<String> = (0..flood)
                    .map(|i| format!("w{i} {} ", "x".repeat(500)))
                    .collect();
                let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
                return self.answer(&name, openai::text_answer(&pieces, (5, flood as u64)));
            }
            if last["role"] == "tool" {
                return MockResponse::sse(openai::text_answer(
                    &[&format!("REPORT:{name}: {}", text(&last))],
                    (10, 5),
                ));
            }
            let body = openai::tool_answer(
                &[("read-child", "read_file", json!({"path": "data.txt"}))],
                (10, 5),
            );
            return self.answer(&name, body);
        }
        let root = first
            .strip_prefix("ROOT:")
            .unwrap_or(&first)
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        let systems = messages.iter().filter(|m| m["role"] == "system").count();
        if messages.len() == systems + 1 {
            let (count, approval, path) = {
                let script = self.0.lock().unwrap();
                let (count, approval) = script.plans.get(&root).copied().unwrap_or((0, false));
                (count, approval, script.approval_path.clone())
            };
            let mut calls: Vec<(String, String, Value)> = (0..count)
                .map(|i| {
                    (
                        format!("delegate-{i}"),
                        "sub_agent".to_string(),
                        json!({"title": format!("Review {root}-{i}"), "task": format!("CHILD:{root}-{i}")}),
                    )
                })
                .collect();
            if approval {
                calls.push((
                    "write-parent".into(),
                    "write_file".into(),
                    json!({"path": path, "content": "approved"}),
                ));
            }
            let calls: Vec<(&str, &str, Value)> = calls
                .iter()
                .map(|(id, name, args)| (id.as_str(), name.as_str(), args.clone()))
                .collect();
            return MockResponse::sse(openai::tool_answer(&calls, (20, 10)));
        }
        if self.0.lock().unwrap().parent_error {
            return MockResponse::error(
                400,
                r#"{"error":{"message":"parent execution failed","type":"invalid_request_error"}}"#,
            );
        }
        let reports: Vec<&String> = users
            .iter()
            .filter(|u| u.starts_with("[Background tool result]"))
            .collect();
        let body = if reports.is_empty() {
            "initial answer".to_string()
        } else {
            reports
                .iter()
                .map(|r| r.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        };
        self.answer(
            &format!("parent:{root}"),
            openai::text_answer(&[&format!("PARENT:{root}:"), &body], (30, 10)),
        )
    }
}

/// The real binary, serving on a free port.
pub struct Server {
    pub child: tokio::process::Child,
    pub url: String,
    pub token: String,
    pub http: reqwest::Client,
    pub dir: tempfile::TempDir,
    pub model: Model,
    pub mock: MockLlm,
}

impl Server {
    pub async fn start() -> Server {
        let mock = MockLlm::start().await;
        let model = Model::default();
        let handler = model.clone();
        mock.respond_with(move |request| handler.respond(request));
        let dir = tempfile::tempdir().unwrap();
        model.0.lock().unwrap().approval_path =
            dir.path().join("approval.txt").display().to_string();
        let config = json!({
            "provider": {"kind": "openai", "base_url": format!("{}/v1", mock.url()), "model": "scripted",
                          "max_retries": 0}
        });
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        Self::spawn(dir, model, mock).await
    }

    /// Starts the binary on `dir` (config and data inside it).
    pub async fn spawn(dir: tempfile::TempDir, model: Model, mock: MockLlm) -> Server {
        Self::spawn_with_env(dir, model, mock, &[]).await
    }

    /// [`Self::spawn`] with variables set for the server process.
    pub async fn spawn_with_env(
        dir: tempfile::TempDir,
        model: Model,
        mock: MockLlm,
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Server {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_bumblehive"))
            .envs(env.iter().copied())
            .arg("--config")
            .arg(dir.path().join("config.json"))
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["serve", "--port", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("the server printed nothing")
            .unwrap()
            .expect("the server closed stdout");
        let hello: Value = serde_json::from_str(&first).unwrap();
        Server {
            child,
            url: hello["url"].as_str().unwrap().to_string(),
            token: hello["token"].as_str().unwrap().to_string(),
            http: reqwest::Client::new(),
            dir,
            model,
            mock,
        }
    }

    /// Kills the process at once (SIGKILL): no shutdown, no flush.
    pub async fn kill(&mut self) {
        self.child.start_kill().unwrap();
        self.child.wait().await.unwrap();
    }

    /// A new process on the same data dir and model, as after a crash. The old one is
    /// killed and gone first: one process owns a data folder at a time.
    pub async fn restart(mut self) -> Server {
        if self.child.id().is_some() {
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        }
        let Server {
            dir, model, mock, ..
        } = self;
        Self::spawn(dir, model, mock).await
    }

    pub async fn post(&self, command: &str, body: Value) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}/api/{command}", self.url))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    pub async fn ok(&self, command: &str, body: Value) -> Value {
        let (status, value) = self.post(command, body).await;
        assert_eq!(status, 200, "{command}: {value}");
        value
    }

    pub async fn events(&self, session_id: &str) -> Sse {
        Sse::connect(
            &self.http,
            &format!("{}/api/sessions/{session_id}/events", self.url),
            &self.token,
        )
        .await
    }

    /// A session in `<tmp>/<root>` with `data.txt`, its events, the prompt submitted,
    /// and its `count` children created.
    pub async fn begin(
        &self,
        root: &str,
        count: usize,
        approval: bool,
    ) -> (String, Sse, Vec<Value>) {
        let workspace = self.dir.path().join(root);
        std::fs::create_dir_all(&workspace).unwrap();
        std::fs::write(workspace.join("data.txt"), format!("DATA:{root}")).unwrap();
        self.model.plan(root, count, approval);
        let info = self
            .ok(
                "create_session",
                json!({"workspace": workspace.display().to_string()}),
            )
            .await;
        let id = info["session_id"].as_str().unwrap().to_string();
        let mut events = self.events(&id).await;
        let snapshot = events.next().await;
        assert_eq!(snapshot["type"], "snapshot");
        let submitted = self
            .ok(
                "submit",
                json!({"session_id": id, "content": format!("ROOT:{root}")}),
            )
            .await;
        assert_eq!(submitted["status"], "started");
        let mut children = Vec::new();
        for _ in 0..count {
            children.push(events.wait("session_created", None, None).await);
        }
        (id, events, children)
    }

    pub async fn history(&self, session_id: &str) -> Vec<Message> {
        let session = self
            .ok("get_session", json!({"session_id": session_id}))
            .await;
        serde_json::from_value(session["messages"].clone()).unwrap()
    }

    pub async fn snapshot(&self, session_id: &str) -> Value {
        self.ok("snapshot", json!({"session_id": session_id})).await
    }

    /// Waits until the server says nothing runs in this session's tree; returns the
    /// events read meanwhile.
    async fn wait_tree_idle(&self, events: &mut Sse, session_id: &str) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            let snapshot = self.snapshot(session_id).await;
            if snapshot["running"] == false && snapshot["subagents"].as_array().unwrap().is_empty()
            {
                return seen;
            }
            // Something is still working: wait for its next event instead of polling.
            seen.push(events.next().await);
        }
    }
}

/// A Server-Sent Events client: events arrive on a channel, parsed as JSON.
pub struct Sse {
    rx: mpsc::UnboundedReceiver<Value>,
    task: tokio::task::JoinHandle<()>,
}

impl Sse {
    async fn connect(http: &reqwest::Client, url: &str, token: &str) -> Sse {
        let response = http.get(url).bearer_auth(token).send().await.unwrap();
        assert_eq!(response.status(), 200);
        Self::from_response(response)
    }

    fn from_response(response: reqwest::Response) -> Sse {
        use eventsource_stream::Eventsource;
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut stream = response.bytes_stream().eventsource();
            while let Some(Ok(event)) = stream.next().await {
                if let Ok(value) = serde_json::from_str::<Value>(&event.data) {
                    if tx.send(value).is_err() {
                        break;
                    }
                }
            }
        });
        Sse { rx, task }
    }

    pub async fn next(&mut self) -> Value {
        tokio::time::timeout(WAIT, self.rx.recv())
            .await
            .expect("timed out waiting for an SSE event")
            .expect("the event stream ended")
    }

    pub async fn wait(
        &mut self,
        kind: &str,
        session_id: Option<&str>,
        status: Option<&str>,
    ) -> Value {
        self.wait_within(WAIT, kind, session_id, status).await
    }

    /// [`Self::wait`] with a longer limit, for work that takes seconds (big workspaces).
    pub async fn wait_within(
        &mut self,
        limit: std::time::Duration,
        kind: &str,
        session_id: Option<&str>,
        status: Option<&str>,
    ) -> Value {
        let wanted = async {
            loop {
                let value = self.rx.recv().await.expect("the event stream ended");
                if is_event(&value, kind, session_id, status) {
                    return value;
                }
            }
        };
        tokio::time::timeout(limit, wanted)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {kind} {session_id:?} {status:?}"))
    }
}

impl Drop for Sse {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    /// The session list's feed, of one workspace.
    async fn list_events(&self, workspace: &std::path::Path) -> Sse {
        let url = reqwest::Url::parse_with_params(
            &format!("{}/api/sessions/events", self.url),
            [("workspace", workspace.display().to_string())],
        )
        .unwrap();
        Sse::connect(&self.http, url.as_str(), &self.token).await
    }
}

/// The next list event about `id` (others skipped), within the usual wait.
async fn list_event_about(feed: &mut Sse, id: &str, wanted: impl Fn(&Value) -> bool) -> Value {
    loop {
        let event = feed.next().await;
        let about = event["session"]["session_id"]
            .as_str()
            .or(event["session_id"].as_str());
        if about == Some(id) && wanted(&event) {
            return event;
        }
    }
}

fn reports(history: &[Message]) -> Vec<&Message> {
    history.iter().filter(|m| is_report(m)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_idle_wake_up_with_three_children() {
    let server = Server::start().await;
    server.model.open("parent:idle");
    let (parent, mut events, children) = server.begin("idle", 3, false).await;
    events.wait("result", Some(&parent), None).await;
    assert_eq!(
        server.snapshot(&parent).await["subagents"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    let busy = server
        .post(
            "update_config",
            json!({"patch": {"provider": {"model": "x"}}}),
        )
        .await;
    assert_eq!(busy.0, 409);
    assert_eq!(busy.1["error"]["code"], "busy");
    for i in 0..3 {
        server.model.open(&format!("idle-{i}"));
    }
    let mut unfinished: HashSet<String> = children
        .iter()
        .map(|c| c["session_id"].as_str().unwrap().to_string())
        .collect();
    while !unfinished.is_empty() {
        let ended = events.wait("result", None, None).await;
        unfinished.remove(ended["session_id"].as_str().unwrap());
    }
    server.wait_tree_idle(&mut events, &parent).await;
    let history = server.history(&parent).await;
    assert_eq!(reports(&history).len(), 3);
    assert!(
        reports(&history)
            .iter()
            .all(|m| m.text().contains("REPORT:idle-"))
    );
    assert_message_order(&history);
    for child in &children {
        assert_message_order(&server.history(child["session_id"].as_str().unwrap()).await);
    }
    let snapshot = server.snapshot(&parent).await;
    assert!(
        snapshot["tree_usage"]["input_tokens"].as_u64().unwrap()
            > snapshot["usage"]["input_tokens"].as_u64().unwrap()
    );
    server.mock.assert_valid();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_stop_during_approval_then_pending_then_steer() {
    let server = Server::start().await;
    server.model.open("parent:stop");
    let (parent, mut events, _) = server.begin("stop", 1, true).await;
    let approval = events.wait("approval_request", Some(&parent), None).await;
    assert_eq!(approval["tool"], "write_file");
    assert!(approval["diff"].as_str().unwrap().contains("+approved"));
    server.model.open("stop-0");
    events
        .wait("message_status", Some(&parent), Some("steered"))
        .await;
    server.ok("cancel", json!({"session_id": parent})).await;
    let snapshot = server.snapshot(&parent).await;
    assert_eq!(snapshot["running"], false);
    assert_eq!(snapshot["paused"], true);
    assert_eq!(snapshot["pending"][0]["message_id"], "subagent:delegate-0");
    assert!(snapshot["approvals"].as_array().unwrap().is_empty());
    assert!(!server.dir.path().join("approval.txt").exists());
    let steered = server
        .ok(
            "steer",
            json!({"session_id": parent, "message_id": "subagent:delegate-0"}),
        )
        .await;
    assert_eq!(steered["status"], "started");
    events.wait("result", Some(&parent), None).await;
    let history = server.history(&parent).await;
    assert_eq!(reports(&history).len(), 1);
    assert_message_order(&history);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_late_report_after_stop_stays_queued() {
    let server = Server::start().await;
    let (parent, mut events, _) = server.begin("late", 1, false).await;
    loop {
        let event = events.wait("event", Some(&parent), None).await;
        if event["kind"] == "tool.call.finished" {
            break;
        }
    }
    server.ok("cancel", json!({"session_id": parent})).await;
    server.model.open("late-0");
    events
        .wait("message_status", Some(&parent), Some("queued"))
        .await;
    let snapshot = server.snapshot(&parent).await;
    assert_eq!(snapshot["running"], false);
    assert_eq!(snapshot["pending"].as_array().unwrap().len(), 1);
    assert!(
        snapshot["pending"][0]["config"]["runtime"]["workspace"].is_null()
            || snapshot["pending"][0]["config"]["runtime"]["workspace"]
                .as_str()
                .unwrap()
                .ends_with("late")
    );
    server.model.open("parent:late");
    server
        .ok(
            "steer",
            json!({"session_id": parent, "message_id": "subagent:delegate-0"}),
        )
        .await;
    events.wait("result", Some(&parent), None).await;
    assert!(format!("{:?}", server.history(&parent).await).contains("REPORT:late-0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_disconnect_and_reconnect_snapshot_is_authoritative() {
    let server = Server::start().await;
    server.model.open("parent:again");
    let (parent, mut events, children) = server.begin("again", 1, false).await;
    events.wait("result", Some(&parent), None).await;
    drop(events);
    let mut again = server.events(&parent).await;
    let snapshot = again.next().await;
    assert_eq!(snapshot["type"], "snapshot");
    assert_eq!(snapshot["running"], false);
    assert_eq!(
        snapshot["subagents"][0]["session_id"],
        children[0]["session_id"]
    );
    drop(again);
    // No subscriber at all while the child finishes and wakes the parent.
    server.model.open("again-0");
    let mut watcher = server.events(&parent).await;
    watcher.next().await;
    server.wait_tree_idle(&mut watcher, &parent).await;
    let mut last = server.events(&parent).await;
    let snapshot = last.next().await;
    assert_eq!(snapshot["running"], false);
    assert!(snapshot["subagents"].as_array().unwrap().is_empty());
    assert!(format!("{:?}", server.history(&parent).await).contains("REPORT:again-0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_deleting_a_child_cancels_it_without_waking_the_parent() {
    let server = Server::start().await;
    server.model.open("parent:del");
    let (parent, mut events, children) = server.begin("del", 1, false).await;
    events.wait("result", Some(&parent), None).await;
    let child = children[0]["session_id"].as_str().unwrap();
    server
        .ok("delete_session", json!({"session_id": child}))
        .await;
    let snapshot = server.snapshot(&parent).await;
    assert_eq!(snapshot["running"], false);
    assert!(snapshot["pending"].as_array().unwrap().is_empty());
    assert!(snapshot["subagents"].as_array().unwrap().is_empty());
    // Opening the gate now reaches no one: the child is gone.
    server.model.open("del-0");
    let (status, body) = server
        .post("get_session", json!({"session_id": child}))
        .await;
    assert_eq!(status, 404, "{body}");
    assert!(reports(&server.history(&parent).await).is_empty());
    let listed = server.ok("list_sessions", json!({})).await;
    assert_eq!(listed.as_array().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_enforces_auth_and_answers_bad_input_clearly() {
    let server = Server::start().await;
    let url = format!("{}/api/list_sessions", server.url);
    let none = server
        .http
        .post(&url)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(none.status(), 401);
    let wrong = server
        .http
        .post(&url)
        .bearer_auth("nope")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let sse = server
        .http
        .get(format!("{}/api/sessions/x/events", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), 401);
    let (status, body) = server.post("no_such_command", json!({})).await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "unknown_command");
    let bad = server
        .http
        .post(format!("{}/api/create_session", server.url))
        .bearer_auth(&server.token)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let body: Value = bad.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not valid JSON"),
        "{body}"
    );
    let (status, body) = server
        .post("get_session", json!({"session_id": "0190-missing"}))
        .await;
    assert_eq!(status, 404, "{body}");
    let (status, _) = server
        .post("create_session", json!({"workspace": "relative/path"}))
        .await;
    assert_eq!(status, 400);
    let (status, _) = server.post("create_session", json!({})).await;
    assert_eq!(status, 400);
    let missing = server
        .http
        .get(format!(
            "{}/api/sessions/0190-missing/events?token={}",
            server.url, server.token
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let config = server.ok("get_config", json!({})).await;
    assert_eq!(config["provider"]["kind"], "openai");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_two_clients_see_the_same_events_and_a_stalled_one_slows_no_one() {
    two_clients_and_a_stalled_one(false).await;
}

/// The stalled client, read at last, is sent a fresh snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_a_stalled_client_is_resynced_when_it_reads_again() {
    two_clients_and_a_stalled_one(true).await;
}

async fn two_clients_and_a_stalled_one(check_resync: bool) {
    let server = Server::start().await;
    // Each child streams fewer events than a subscriber's buffer (4096) holds, one child
    // at a time, so readers that keep up see every one; all of them together are more
    // than a client that never reads can hold, in its socket and its buffer (8 × 3000
    // events of ~510 bytes: more than a 4 MiB autotuned send buffer, the server's write
    // buffer and a 4096-event subscriber buffer together; with 4 it depended on the host).
    let children = 8;
    server
        .ok(
            "update_config",
            json!({"patch": {"subagents": {"max_concurrent": children}}}),
        )
        .await;
    server.model.0.lock().unwrap().flood = 3000;
    server.model.open("parent:flood");
    let workspace = server.dir.path().join("flood");
    std::fs::create_dir_all(&workspace).unwrap();
    server.model.plan("flood", children, false);
    let info = server
        .ok(
            "create_session",
            json!({"workspace": workspace.display().to_string()}),
        )
        .await;
    let id = info["session_id"].as_str().unwrap().to_string();
    let mut a = server.events(&id).await;
    let mut b = server.events(&id).await;
    // A client with a tiny receive window that never reads a byte. Its segment size is
    // small too: with loopback's 64 KiB MSS, a receive buffer smaller than one segment
    // makes the kernel's silly-window avoidance advertise a zero window even after the
    // client reads, so the stream resumed only at the sender's next zero-window probe
    // (backing off up to 120 s) and sometimes not within the test at all. A slow client
    // on a real link has segments smaller than its buffer; so has this one now.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(2048).unwrap();
    {
        use std::os::fd::AsRawFd;
        let mss: libc::c_int = 536;
        // SAFETY: a valid socket fd and a c_int option of the right size.
        let set = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_MAXSEG,
                (&mss as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(set, 0, "TCP_MAXSEG: {}", std::io::Error::last_os_error());
    }
    let addr: std::net::SocketAddr = server.url.trim_start_matches("http://").parse().unwrap();
    let mut stalled = socket.connect(addr).await.unwrap();
    stalled
        .write_all(
            format!(
                "GET /api/sessions/{id}/events HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\r\n",
                server.token
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    // Wait until the server has subscribed it (its first snapshot arrives): a client
    // subscribed only after the flood would have nothing to fall behind on.
    let needle = br#"{"type":"snapshot""#;
    let first_snapshot = async {
        let mut seen: Vec<u8> = Vec::new();
        let mut buffer = [0u8; 512];
        while !seen.windows(needle.len()).any(|w| w == needle) {
            let n = stalled.read(&mut buffer).await.unwrap();
            assert!(n > 0, "the stalled client's stream ended at once");
            seen.extend_from_slice(&buffer[..n]);
        }
    };
    tokio::time::timeout(WAIT, first_snapshot)
        .await
        .expect("the stalled client was never subscribed");
    server
        .ok("submit", json!({"session_id": id, "content": "ROOT:flood"}))
        .await;
    let until_result = async |sse: &mut Sse, session: &str| {
        let mut seen = Vec::new();
        loop {
            let event = sse.next().await;
            assert_ne!(event["type"], "error", "{event}");
            let done = event["type"] == "result" && event["session_id"] == session;
            seen.push(event);
            if done {
                return seen;
            }
        }
    };
    let seen_a = until_result(&mut a, &id).await;
    let seen_b = until_result(&mut b, &id).await;
    assert_eq!(seen_a, seen_b);
    let child_ids: Vec<String> = seen_a
        .iter()
        .filter(|e| e["type"] == "session_created")
        .map(|e| e["session_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(child_ids.len(), children);
    // Hold the parent's wake-up: only the children's streams matter here.
    server.model.0.lock().unwrap().open.remove("parent:flood");
    for (i, child) in child_ids.iter().enumerate() {
        server.model.open(&format!("flood-{i}"));
        let seen_a = until_result(&mut a, child).await;
        let seen_b = until_result(&mut b, child).await;
        assert_eq!(seen_a, seen_b, "child {i}");
        assert!(
            seen_a.iter().all(|e| e["type"] != "snapshot"),
            "child {i}: a fast reader lagged"
        );
        let deltas = seen_a
            .iter()
            .filter(|e| e["kind"] == "content.delta" && e["session_id"] == child.as_str())
            .count();
        assert_eq!(deltas, 3000, "child {i}");
    }
    // The stalled client, read at last, was told to resync with a fresh snapshot.
    let resynced = async {
        let mut tail: Vec<u8> = Vec::new();
        let mut snapshots = 0;
        let mut buffer = vec![0u8; 65536];
        loop {
            let n = stalled.read(&mut buffer).await.unwrap();
            assert!(n > 0, "the stream ended before a resync snapshot");
            // Scan only what is new (plus a needle's length of overlap).
            tail.extend_from_slice(&buffer[..n]);
            snapshots += tail.windows(needle.len()).filter(|w| w == needle).count();
            // The first snapshot was read above: one more is the resync.
            if snapshots >= 1 {
                return;
            }
            let keep = tail.len().saturating_sub(needle.len() - 1);
            tail.drain(..keep);
        }
    };
    if !check_resync {
        return;
    }
    // The stalled socket is read only now. Its window has been shut for the whole flood;
    // the client's window updates reopen it as it reads (its small segments let it
    // advertise what it frees). The bound stays past TCP's zero-window probe backoff
    // (up to TCP_RTO_MAX, 120 s) in case an update is lost.
    tokio::time::timeout(std::time::Duration::from_secs(150), resynced)
        .await
        .expect("the stalled client never got a fresh snapshot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_stops_cleanly_on_sigterm_leaving_valid_histories() {
    let mut server = Server::start().await;
    server.model.open("parent:term");
    let (parent, mut events, children) = server.begin("term", 2, false).await;
    events.wait("result", Some(&parent), None).await;
    // Children are mid-run (waiting on the model) when the signal comes.
    let pid = server.child.id().unwrap() as i32;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(WAIT, server.child.wait())
        .await
        .expect("the server did not stop")
        .unwrap();
    assert!(status.success(), "{status:?}");
    let store = bumblehive::store::SessionStore::new(&server.dir.path().join("data")).unwrap();
    for id in std::iter::once(parent.as_str())
        .chain(children.iter().map(|c| c["session_id"].as_str().unwrap()))
    {
        let loaded = store.load(id).unwrap();
        assert!(loaded.notice.is_none());
        assert_message_order(&loaded.messages);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_command_prints_events_and_exits_when_the_tree_is_idle() {
    let mock = MockLlm::start().await;
    let model = Model::default();
    let handler = model.clone();
    mock.respond_with(move |request| handler.respond(request));
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("once");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("data.txt"), "DATA:once").unwrap();
    model.0.lock().unwrap().approval_path = workspace.join("out.txt").display().to_string();
    model.plan("once", 2, true);
    for gate in ["parent:once", "once-0", "once-1"] {
        model.open(gate);
    }
    let config = json!({"provider": {"kind": "openai", "base_url": format!("{}/v1", mock.url()), "model": "scripted"}});
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let output = tokio::time::timeout(
        WAIT,
        tokio::process::Command::new(env!("CARGO_BIN_EXE_bumblehive"))
            .arg("run")
            .arg("--json")
            .arg("--workspace")
            .arg(&workspace)
            .arg("--yes")
            .arg("--config")
            .arg(dir.path().join("config.json"))
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("ROOT:once")
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
    let events: Vec<Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(
        events
            .iter()
            .filter(|e| e["type"] == "session_created")
            .count(),
        2
    );
    assert!(events.iter().any(|e| e["type"] == "approval_request"));
    // The last result is the parent's, after both reports woke it.
    let last = events.iter().rev().find(|e| e["type"] == "result").unwrap();
    assert!(
        last["content"].as_str().unwrap().contains("REPORT:once-0"),
        "{last}"
    );
    assert!(
        last["content"].as_str().unwrap().contains("REPORT:once-1"),
        "{last}"
    );
    assert_eq!(
        std::fs::read_to_string(workspace.join("out.txt")).unwrap(),
        "approved"
    );
}

/// The real `bumblehive run` with `dir`'s config and data folder, in `cwd`, stdin empty.
async fn run_binary(
    dir: &std::path::Path,
    cwd: &std::path::Path,
    args: &[&str],
) -> std::process::Output {
    tokio::time::timeout(
        WAIT * 4,
        tokio::process::Command::new(env!("CARGO_BIN_EXE_bumblehive"))
            .arg("--config")
            .arg(dir.join("config.json"))
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("run")
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("run did not exit")
    .unwrap()
}

/// UX review E3 in the CLI: a sub-agent's approval on the terminal names the model and
/// server it runs on (here a profile's model on a named server, not the one `run` was
/// started with), as the window's approval does, so the person sees where the call's
/// content goes before answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_names_where_an_asking_sub_agent_runs() {
    let mock = MockLlm::start().await;
    mock.respond_with(move |request| {
        let messages = request.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let results = messages.iter().filter(|m| m["role"] == "tool").count();
        let child = request.body["model"] == "tiny";
        let body = match (child, results) {
            (true, 0) => openai::tool_answer(
                &[(
                    "w1",
                    "write_file",
                    json!({"path": "child.txt", "content": "from the child"}),
                )],
                (5, 5),
            ),
            (false, 0) => openai::tool_answer(
                &[(
                    "s1",
                    "sub_agent",
                    json!({"title": "helper", "task": "write", "agent": "scout"}),
                )],
                (5, 5),
            ),
            _ => openai::text_answer(&["done"], (5, 5)),
        };
        MockResponse::sse(body)
    });
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap().join("project");
    let agents = ws.join(".bumblehive/agents");
    std::fs::create_dir_all(&agents).unwrap();
    std::fs::write(
        agents.join("scout.md"),
        "---\nname: scout\ndescription: Writes\nprovider: local\nmodel: tiny\n---\nScout.\n",
    )
    .unwrap();
    let url = format!("{}/v1", mock.url());
    let config = json!({
        "providers": {
            "remote": {"kind": "openai", "base_url": url, "model": "big", "max_retries": 0},
            "local": {"kind": "openai", "base_url": url, "model": "small", "max_retries": 0}
        },
        "default_provider": "remote",
        "tools": {"command": {"policy": "off"}}
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let output = run_with_input(dir.path(), &ws, "delegate the write", "y\n").await;
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stderr
            .contains("sub-agent \"helper\" (tiny on local) wants to run write_file on child.txt"),
        "the approval does not say where the sub-agent runs:\n{stderr}"
    );
    assert!(stderr.contains("Approve? [y/N]"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(ws.join("child.txt")).unwrap(),
        "from the child",
        "the approval answered on the terminal"
    );
}

/// `bumblehive run <args>` started in `cwd` on `dir`'s config and data folder, its output
/// piped, for a test that acts while it runs (a signal, an owner's answer).
fn spawn_run(dir: &std::path::Path, cwd: &std::path::Path, args: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_bumblehive"))
        .arg("--config")
        .arg(dir.join("config.json"))
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("run")
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// UX review E22: `bumblehive run` for people. In the current folder (no --workspace),
/// the answer as text on stdout, a line per tool call and per sub-agent start and report
/// on stderr, an approval refused with a line saying why when there is no terminal, the
/// session titled from the prompt, exit code 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_prints_text_for_people_in_the_current_folder() {
    let mock = MockLlm::start().await;
    // The parent's text answers, in order: whether the report arrives before its answer
    // to the tool results is a race, so the stdout expected is what was sent.
    let answers: Arc<Mutex<Vec<&'static str>>> = Default::default();
    let sent = answers.clone();
    mock.respond_with(move |request| {
        let messages = request.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let first_user = messages
            .iter()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_string();
        let results = messages.iter().filter(|m| m["role"] == "tool").count();
        let reports = messages
            .iter()
            .filter(|m| {
                m["role"] == "user"
                    && m["content"]
                        .as_str()
                        .is_some_and(|c| c.starts_with("[Background tool result]"))
            })
            .count();
        let body = if first_user.contains("You are the sub-agent") {
            openai::text_answer(&["child ", "says hi"], (5, 5))
        } else if results == 0 {
            openai::tool_answer(
                &[
                    (
                        "w1",
                        "write_file",
                        json!({"path": "out.txt", "content": "x"}),
                    ),
                    (
                        "s1",
                        "sub_agent",
                        json!({"title": "helper", "task": "say hi"}),
                    ),
                ],
                (5, 5),
            )
        } else if reports == 0 {
            sent.lock().unwrap().push("All done.");
            openai::text_answer(&["All ", "done."], (5, 5))
        } else {
            sent.lock().unwrap().push("Report read.");
            openai::text_answer(&["Report ", "read."], (5, 5))
        };
        MockResponse::sse(body)
    });
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap().join("project");
    std::fs::create_dir_all(&ws).unwrap();
    let config = json!({"provider": {"kind": "openai", "base_url": format!("{}/v1", mock.url()), "model": "scripted", "max_retries": 0}});
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let output = run_binary(dir.path(), &ws, &["Write out.txt please\nand delegate"]).await;
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    // The answers, as text (no JSON line).
    let answers = answers.lock().unwrap().clone();
    assert_eq!(
        answers.last(),
        Some(&"Report read."),
        "the report woke the parent"
    );
    assert_eq!(
        stdout,
        format!("{}\n", answers.join("\n")),
        "the answers, as text"
    );
    for line in [
        "· write_file out.txt",
        "· sub_agent helper",
        "▸ sub-agent \"helper\" started",
        "◂ sub-agent \"helper\" reported",
        "Refused: the agent wants to run write_file on out.txt. There is no terminal to ask you on",
    ] {
        assert!(stderr.contains(line), "no {line:?} in:\n{stderr}");
    }
    assert!(!ws.join("out.txt").exists(), "the refused write happened");
    // The model was told why.
    let told = mock
        .bodies()
        .iter()
        .any(|b| b.to_string().contains("nobody could be asked"));
    assert!(told, "the denial's reason did not reach the model");
    // The session is in the current folder, titled from the prompt's first line.
    let store = bumblehive::store::SessionStore::new(&dir.path().join("data")).unwrap();
    let top: Vec<_> = store
        .list(None)
        .unwrap()
        .into_iter()
        .filter(|m| m.parent_session_id.is_none())
        .collect();
    assert_eq!(top.len(), 1);
    assert_eq!(top[0].title, "Write out.txt please");
    assert_eq!(top[0].workspace, ws.display().to_string());
}

/// E22: the exit codes `bumblehive run --help` documents: 1 when the run fails (the
/// model server's error, said on stderr), 3 when it cannot start (a refused workspace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_exit_codes_say_failed_and_not_started() {
    let mock = MockLlm::start().await;
    mock.respond_with(|_| MockResponse::error(400, r#"{"error": {"message": "no such model"}}"#));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap().join("project");
    std::fs::create_dir_all(&ws).unwrap();
    let config = json!({"provider": {"kind": "openai", "base_url": format!("{}/v1", mock.url()), "model": "scripted", "max_retries": 0}});
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let failed = run_binary(dir.path(), &ws, &["hello"]).await;
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert_eq!(failed.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("error: ") && stderr.contains("no such model"),
        "{stderr}"
    );
    let refused = run_binary(dir.path(), &ws, &["--workspace", "/", "hello"]).await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(3), "{stderr}");
    assert!(stderr.starts_with("bumblehive: "), "{stderr}");
    let help = run_binary(dir.path(), &ws, &["--help"]).await;
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(
        text.contains("Exit codes:")
            && text.contains("3  the run could not start")
            && text.contains("--json"),
        "{text}"
    );
}

/// E22's documented exit codes 2 and 130: wrong arguments, and Ctrl+C (SIGINT) while the
/// model is still answering; the stopped session's history stays valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_exit_codes_say_wrong_arguments_and_interrupted() {
    let mock = MockLlm::start().await;
    let (held, stream) = MockResponse::live();
    mock.push(held);
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap().join("project");
    std::fs::create_dir_all(&ws).unwrap();
    let config = json!({"provider": {"kind": "openai", "base_url": format!("{}/v1", mock.url()), "model": "scripted", "max_retries": 0}});
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let wrong = run_binary(dir.path(), &ws, &["--no-such-flag", "hello"]).await;
    assert_eq!(
        wrong.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&wrong.stderr)
    );
    let child = spawn_run(dir.path(), &ws, &["hello"]);
    // The model has the request and has begun to answer: the run is under way.
    tokio::time::timeout(WAIT, mock.wait_for_requests(1))
        .await
        .expect("the run's request");
    stream.send(openai::data(&openai::role()));
    let pid = child.id().unwrap() as i32;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let out = tokio::time::timeout(WAIT, child.wait_with_output())
        .await
        .expect("run did not exit on Ctrl+C")
        .unwrap();
    // 130 as a shell reports it: the process ends by SIGINT (128 + 2), or exits with 130.
    use std::os::unix::process::ExitStatusExt;
    assert!(
        out.status.code() == Some(130) || out.status.signal() == Some(libc::SIGINT),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let store = bumblehive::store::SessionStore::new(&dir.path().join("data")).unwrap();
    let sessions = store.list(None).unwrap();
    assert_eq!(sessions.len(), 1);
    let history = store.load(&sessions[0].session_id).unwrap();
    assert!(
        history
            .messages
            .iter()
            .any(|m| m.role == bumblehive::protocol::Role::User),
        "the prompt is kept"
    );
}

/// Issue 12's fallback, for real: a server whose PATH has no bubblewrap says in
/// `app_info` that commands cannot be sandboxed and why (the UI's banner shows that
/// reason, `firstrun.test.tsx`), and its policy then asks for every command
/// (`security::security_without_bubblewrap_every_command_asks`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_without_bubblewrap_on_path_says_so_in_app_info() {
    let mock = MockLlm::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = json!({"provider": {"kind": "openai", "base_url": format!("{}/v1", mock.url()), "model": "scripted"}});
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let empty = dir.path().join("no-tools");
    std::fs::create_dir_all(&empty).unwrap();
    let server =
        Server::spawn_with_env(dir, Model::default(), mock, &[("PATH", empty.as_os_str())]).await;
    let info = server.ok("app_info", json!({})).await;
    assert_eq!(info["sandbox"]["available"], false, "{info}");
    let reason = info["sandbox"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("bubblewrap (bwrap) is not installed or not on PATH"),
        "{info}"
    );
    // The normal server, with bwrap on PATH, has it.
    let normal = Server::start().await;
    assert_eq!(
        normal.ok("app_info", json!({})).await["sandbox"]["available"],
        true
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_app_info_and_api_keys_never_land_in_the_config() {
    let server = Server::start().await;
    let info = server.ok("app_info", json!({})).await;
    let data = server.dir.path().join("data");
    assert_eq!(info["log_dir"], data.join("logs").display().to_string());
    // The server writes its log there.
    assert!(data.join("logs").read_dir().unwrap().next().is_some());
    let (status, body) = server
        .post("set_api_key", json!({"key": "sk-test-not-a-key"}))
        .await;
    let config = server.ok("get_config", json!({})).await;
    let file = std::fs::read_to_string(server.dir.path().join("config.json")).unwrap();
    match status {
        // A machine with a Secret Service: the provider now names the keyring entry.
        200 => assert_eq!(config["provider"]["api_key_keyring"], "openai"),
        // Without one (CI, headless): a clear error, and nothing changed.
        503 => {
            assert_eq!(body["error"]["code"], "unavailable");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("keyring"),
                "{body}"
            );
            assert!(config["provider"].get("api_key_keyring").is_none());
        }
        other => panic!("set_api_key answered {other}: {body}"),
    }
    assert!(!file.contains("sk-test-not-a-key"));
    assert!(!config.to_string().contains("sk-test-not-a-key"));
    let (status, _) = server.post("set_api_key", json!({"key": "  "})).await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn server_the_session_list_feed_sends_the_list_then_each_change_of_its_workspace() {
    let server = Server::start().await;
    let workspace = server.dir.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let other = server.dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let before = server
        .ok(
            "create_session",
            json!({"workspace": workspace.display().to_string()}),
        )
        .await;
    let mut feed = server.list_events(&workspace).await;
    let listed = feed.next().await;
    assert_eq!(listed["type"], "listed", "{listed}");
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 1);
    assert_eq!(listed["sessions"][0]["session_id"], before["session_id"]);

    // A session of another workspace is not sent; a new one of this workspace is.
    let elsewhere = server
        .ok(
            "create_session",
            json!({"workspace": other.display().to_string()}),
        )
        .await;
    let created = server
        .ok(
            "create_session",
            json!({"workspace": workspace.display().to_string()}),
        )
        .await;
    let id = created["session_id"].as_str().unwrap().to_string();
    let event = feed.next().await;
    assert_eq!(event["type"], "changed", "{event}");
    assert_eq!(
        event["session"]["session_id"],
        id.as_str(),
        "{event} (not {elsewhere})"
    );

    server
        .ok(
            "rename_session",
            json!({"session_id": id, "title": "Renamed"}),
        )
        .await;
    list_event_about(&mut feed, &id, |e| e["session"]["title"] == "Renamed").await;

    // A run: the list hears it start and end, without asking.
    let (run, _events, _) = server.begin("ws", 0, false).await;
    list_event_about(&mut feed, &run, |e| e["session"]["state"] == "running").await;
    list_event_about(&mut feed, &run, |e| e["session"]["state"] == "idle").await;

    server.ok("delete_session", json!({"session_id": id})).await;
    let removed = list_event_about(&mut feed, &id, |e| e["type"] == "removed").await;
    assert_eq!(removed["session_id"], id.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_lists_the_workspaces_of_its_sessions_newest_first_and_only_existing_ones() {
    let server = Server::start().await;
    let folder = |name: &str| {
        let path = server.dir.path().join(name);
        std::fs::create_dir_all(&path).unwrap();
        path.display().to_string()
    };
    let (a, b, gone) = (folder("ws-a"), folder("ws-b"), folder("ws-gone"));
    for workspace in [&a, &gone, &b] {
        server
            .ok("create_session", json!({"workspace": workspace}))
            .await;
    }
    // A run with a sub-agent in ws-a: the newest activity; the child is not a session of
    // its own in the count.
    server.model.open("parent:ws-a");
    server.model.open("ws-a-0");
    let (parent, mut events, children) = server.begin("ws-a", 1, false).await;
    assert_eq!(children.len(), 1);
    server.wait_tree_idle(&mut events, &parent).await;
    std::fs::remove_dir_all(server.dir.path().join("ws-gone")).unwrap();

    let listed = server.ok("list_workspaces", json!({})).await;
    let listed = listed.as_array().unwrap();
    let paths: Vec<&str> = listed.iter().map(|w| w["path"].as_str().unwrap()).collect();
    assert_eq!(paths, [a.as_str(), b.as_str()], "{listed:?}");
    assert_eq!(listed[0]["sessions"], 2, "{listed:?}");
    assert_eq!(listed[1]["sessions"], 1, "{listed:?}");
    let times: Vec<&str> = listed
        .iter()
        .map(|w| w["last_activity"].as_str().unwrap())
        .collect();
    assert!(times[0] > times[1], "{times:?}");

    // The same after a restart, from the stored index.
    let server = server.restart().await;
    let again = server.ok("list_workspaces", json!({})).await;
    assert_eq!(again.as_array().unwrap(), listed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_lists_folders_for_the_folder_dialog_with_clear_errors() {
    let server = Server::start().await;
    let root = server.dir.path().join("browse");
    for name in ["src", ".hidden", "Docs"] {
        std::fs::create_dir_all(root.join(name)).unwrap();
    }
    std::fs::write(root.join("notes.txt"), "x").unwrap();
    let path = root.display().to_string();
    let list = server.ok("list_folders", json!({"path": path})).await;
    assert_eq!(list["path"], path.as_str());
    assert_eq!(list["parent"], server.dir.path().display().to_string());
    assert_eq!(list["folders"], json!(["Docs", "src"]));
    assert_eq!(list["truncated"], false);
    let all = server
        .ok(
            "list_folders",
            json!({"path": path, "hidden": true, "limit": 2}),
        )
        .await;
    assert_eq!(all["folders"], json!(["Docs", "src"]));
    assert_eq!(all["truncated"], true);
    let (status, body) = server
        .post("list_folders", json!({"path": root.join("missing")}))
        .await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not exist"),
        "{body}"
    );
    let (status, body) = server
        .post("list_folders", json!({"path": root.join("notes.txt")}))
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = server.post("list_folders", json!({"path": "rel"})).await;
    assert_eq!(status, 400);

    // The chosen folder is checked as create_session would check it (D8), before use.
    let checked = server
        .ok("check_workspace", json!({"path": root.join("src")}))
        .await;
    assert_eq!(
        checked["path"],
        root.join("src")
            .canonicalize()
            .unwrap()
            .display()
            .to_string()
    );
    for (bad, says) in [
        (root.join("missing").display().to_string(), "does not exist"),
        (root.join("notes.txt").display().to_string(), "is a file"),
        ("/".to_string(), "choose a project folder inside it"),
        ("/etc".to_string(), "a system folder"),
    ] {
        let (status, body) = server.post("check_workspace", json!({"path": bad})).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(says),
            "{bad}: {body}"
        );
    }
}

/// R7 across processes, and E22: `bumblehive run` beside a running `serve` on the same
/// data folder does not open the folder itself (nothing repaired, no second owner): it
/// hands its prompt to `serve`, which runs it as one of its sessions and says so naming
/// its pid; `serve` goes on answering, the earlier session untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_a_second_process_on_its_data_folder_hands_its_run_to_the_owner() {
    let server = Server::start().await;
    let info = server
        .ok(
            "create_session",
            json!({"workspace": server.dir.path().display().to_string()}),
        )
        .await;
    let owner = server.child.id().unwrap();
    let output = tokio::time::timeout(
        WAIT,
        tokio::process::Command::new(env!("CARGO_BIN_EXE_bumblehive"))
            .arg("--config")
            .arg(server.dir.path().join("config.json"))
            .arg("--data-dir")
            .arg(server.dir.path().join("data"))
            .arg("run")
            .arg("--workspace")
            .arg(server.dir.path())
            .arg("hello")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("run did not exit")
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("run by the Bumblehive process that owns the data folder")
            && stderr.contains(&format!("pid {owner}")),
        "{stderr}"
    );
    let listed = server.ok("list_sessions", json!({})).await;
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed.iter().any(|s| s["session_id"] == info["session_id"]));
    assert!(listed.iter().any(|s| s["title"] == "hello"), "{listed:?}");
}

/// An owner of the data folder (a service in this process).
struct Owner {
    service: bumblehive::service::RuntimeService,
    stop: tokio_util::sync::CancellationToken,
}

impl Owner {
    /// The service on `<dir>/data` with `<dir>/config.json`, taking later runs when `runs`.
    fn start(dir: &std::path::Path, runs: bool) -> Owner {
        let config = bumblehive::config::Config::load(&dir.join("config.json")).unwrap();
        let service =
            bumblehive::service::RuntimeService::new(bumblehive::service::ServiceOptions {
                data_dir: dir.join("data"),
                config_path: None,
                config: Some(config),
                provider_factory: Arc::new(bumblehive::providers::provider_from_config),
                tools: None,
            })
            .unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        if runs {
            let open: bumblehive::owner::HandoffHandler =
                Arc::new(|_| bumblehive::protocol::OwnerReply {
                    ok: false,
                    message: "no window".into(),
                });
            bumblehive::owner::listen_with_runs(
                &dir.join("data"),
                open,
                Some(bumblehive::owner_run::handler(service.clone())),
                stop.clone(),
            )
            .unwrap();
        }
        Owner { service, stop }
    }

    async fn shutdown(self) {
        self.stop.cancel();
        self.service.shutdown().await;
    }
}

/// The real `bumblehive run` on `dir` in `ws` with `stdin` written to it (the answers to
/// its approvals), beside an app owning the folder or alone.
async fn run_with_input(
    dir: &std::path::Path,
    ws: &std::path::Path,
    prompt: &str,
    stdin: &str,
) -> std::process::Output {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_bumblehive"))
        .arg("--config")
        .arg(dir.join("config.json"))
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("run")
        .arg(prompt)
        .current_dir(ws)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    tokio::time::timeout(WAIT * 4, child.wait_with_output())
        .await
        .expect("run did not exit")
        .unwrap()
}

/// A config on the scripted model, in `<dir>/config.json`; the workspace `<dir>/project`.
fn run_dir(mock: &MockLlm) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap().join("project");
    std::fs::create_dir_all(&ws).unwrap();
    let config = json!({"provider": {"kind": "openai", "base_url": format!("{}/v1", mock.url()), "model": "scripted", "max_retries": 0},
                        "tools": {"command": {"policy": "off"}}});
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    (dir, ws)
}

/// UX review E22, the window half: `bumblehive run` while the app owns the data folder is
/// run by the app (its session list gets the session at once, titled from the prompt),
/// printed here as a local run is (the answer on stdout, a line per tool call and
/// sub-agent), its approval asked here and answered over the owner's socket (the write
/// happens), exit code 0 once the sub-agent's report was taken in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_beside_the_app_is_run_by_the_app_and_listed_there_at_once() {
    let mock = MockLlm::start().await;
    mock.respond_with(move |request| {
        let messages = request.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let first_user = messages
            .iter()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_string();
        let results = messages.iter().filter(|m| m["role"] == "tool").count();
        let reported = messages.iter().any(|m| {
            m["role"] == "user"
                && m["content"]
                    .as_str()
                    .is_some_and(|c| c.starts_with("[Background tool result]"))
        });
        let body = if first_user.contains("You are the sub-agent") {
            openai::text_answer(&["child says hi"], (5, 5))
        } else if results == 0 {
            openai::tool_answer(
                &[
                    (
                        "w1",
                        "write_file",
                        json!({"path": "out.txt", "content": "approved"}),
                    ),
                    (
                        "s1",
                        "sub_agent",
                        json!({"title": "helper", "task": "say hi"}),
                    ),
                ],
                (5, 5),
            )
        } else if reported {
            openai::text_answer(&["Report ", "read."], (5, 5))
        } else {
            openai::text_answer(&["All ", "done."], (5, 5))
        };
        MockResponse::sse(body)
    });
    let (dir, ws) = run_dir(&mock);
    let owner = Owner::start(dir.path(), true);
    let stop_feed = tokio_util::sync::CancellationToken::new();
    let mut feed = Box::pin(owner.service.session_list_feed(None, stop_feed.clone()));
    let listed = tokio::time::timeout(WAIT, feed.next())
        .await
        .unwrap()
        .unwrap();
    assert!(
        !format!("{listed:?}").contains("Write out.txt"),
        "{listed:?}"
    );
    let output = run_with_input(dir.path(), &ws, "Write out.txt\nand delegate", "y\n").await;
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.ends_with("Report read.\n"), "{stdout}");
    let pid = format!("pid {}", std::process::id());
    for line in [
        pid.as_str(),
        "· write_file out.txt",
        "▸ sub-agent \"helper\" started",
        "◂ sub-agent \"helper\" reported",
        "Approve? [y/N]",
    ] {
        assert!(stderr.contains(line), "no {line:?} in:\n{stderr}");
    }
    assert_eq!(
        std::fs::read_to_string(ws.join("out.txt")).unwrap(),
        "approved",
        "the approval answered over the socket"
    );
    // The owner's list feed announced the session while it ran.
    let seen = tokio::time::timeout(WAIT, async {
        while let Some(event) = feed.next().await {
            if format!("{event:?}").contains("Write out.txt") {
                return;
            }
        }
    })
    .await;
    assert!(
        seen.is_ok(),
        "the owner's session list never showed the run"
    );
    let top: Vec<_> = owner
        .service
        .list_sessions(None)
        .unwrap()
        .into_iter()
        .filter(|s| s.parent_session_id.is_none())
        .collect();
    assert_eq!(top.len(), 1);
    assert_eq!(top[0].title, "Write out.txt");
    assert_eq!(top[0].workspace, ws.display().to_string());
    stop_feed.cancel();
    owner.shutdown().await;
}

/// E22: the later `bumblehive run` killed (Ctrl+C, a closed terminal) while the owner runs
/// its prompt stops that run in the owner, which goes on working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_beside_the_app_stops_its_run_there_when_it_is_killed() {
    let mock = MockLlm::start().await;
    let (response, live) = MockResponse::live();
    mock.push(response);
    let (dir, ws) = run_dir(&mock);
    let owner = Owner::start(dir.path(), true);
    let mut child = spawn_run(dir.path(), &ws, &["--yes", "a long answer"]);
    mock.wait_for_requests(1).await;
    live.send(openai::data(&openai::role()));
    live.send(openai::data(&openai::text("par")));
    let session = owner.service.list_sessions(None).unwrap()[0]
        .session_id
        .clone();
    let controller = owner.service.controller(&session).unwrap();
    assert!(
        owner.service.session_info(&session).unwrap().state
            == bumblehive::protocol::SessionState::Running
    );
    let (mut events, _) = controller.subscribe();
    child.kill().await.unwrap();
    let stopped = tokio::time::timeout(WAIT, async {
        loop {
            if owner.service.session_info(&session).unwrap().state
                != bumblehive::protocol::SessionState::Running
            {
                return;
            }
            events.next_event().await;
        }
    })
    .await;
    assert!(
        stopped.is_ok(),
        "the owner's run went on after its `run` was killed"
    );
    drop(live);
    owner.shutdown().await;
}

/// E22: beside an owner that takes no runs (another `bumblehive run`), `run` is refused in
/// words naming the owner's pid, exit code 3, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_beside_an_owner_taking_no_runs_is_refused_naming_it() {
    let mock = MockLlm::start().await;
    let (dir, ws) = run_dir(&mock);
    let owner = Owner::start(dir.path(), false);
    let output = run_with_input(dir.path(), &ws, "hello", "").await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("in use by another Bumblehive process")
            && stderr.contains(&format!("pid {}", std::process::id())),
        "{stderr}"
    );
    assert!(mock.requests().is_empty());
    owner.shutdown().await;
}
