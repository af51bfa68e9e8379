//! Agent profiles and several model servers: profiles from our folder, Claude Code's and Codex's files and the person's own, a child on its profile's server with its tools, and slots per server.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bumblehive::commands::dispatch;
use bumblehive::config::ProviderConfig;
use bumblehive::protocol::{Role, ToolCall, Usage};
use bumblehive::provider::{
    ModelProvider, ModelRequest, ModelResponse, ProviderError, ProviderFactory, ProviderSink,
};
use bumblehive::service::{RuntimeService, ServiceOptions};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::support::{WAIT, assert_message_order, is_report};

/// A model server: answers by a function of the request, records every request, and
/// counts how many requests it holds at once (with a small latency, like a real one).
struct Server {
    respond: Box<dyn Fn(&ModelRequest) -> ModelResponse + Send + Sync>,
    requests: watch::Sender<Vec<ModelRequest>>,
    in_flight: AtomicUsize,
    most: AtomicUsize,
    latency: Duration,
    /// While false, the children's requests are held (counted in flight) until it turns true.
    open: watch::Sender<bool>,
}

impl Server {
    fn new(
        latency: Duration,
        respond: impl Fn(&ModelRequest) -> ModelResponse + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Server {
            respond: Box::new(respond),
            requests: watch::channel(Vec::new()).0,
            in_flight: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
            latency,
            open: watch::channel(true).0,
        })
    }

    fn requests(&self) -> Vec<ModelRequest> {
        self.requests.borrow().clone()
    }
}

#[async_trait]
impl ModelProvider for Server {
    async fn generate(
        &self,
        request: ModelRequest,
        _sink: ProviderSink<'_>,
    ) -> Result<ModelResponse, ProviderError> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        if first_user(&request).contains("Task:\n") {
            let _ = self.open.subscribe().wait_for(|open| *open).await;
        }
        if !self.latency.is_zero() {
            // The model's own time to answer (what makes requests overlap), not a wait
            // for anything.
            tokio::time::sleep(self.latency).await;
        }
        let response = (self.respond)(&request);
        self.requests.send_modify(|r| r.push(request));
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        Ok(response)
    }
}

/// Routes each provider block to the server its `base_url` names.
fn two_servers(local: Arc<Server>, remote: Arc<Server>) -> ProviderFactory {
    Arc::new(move |block: &ProviderConfig| {
        let server: Arc<dyn ModelProvider> = if block.base_url.contains("local") {
            local.clone()
        } else {
            remote.clone()
        };
        Ok(server)
    })
}

fn first_user(request: &ModelRequest) -> &str {
    request
        .messages
        .iter()
        .find(|m| m.role == Role::User)
        .map(|m| m.text())
        .unwrap_or("")
}

fn tool_names(request: &ModelRequest) -> Vec<String> {
    request.tools.iter().map(|t| t.name.clone()).collect()
}

fn write(path: &std::path::Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profiles_load_from_every_folder_and_report_broken_files() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    write(
        &ws.join(".bumblehive/agents/fast.md"),
        "---\nname: fast\ndescription: Quick answers\nprovider: local\nmodel: tiny\ntools: [read_file]\nmax_turns: 3\n---\nBe quick.\n",
    );
    write(
        &ws.join(".claude/agents/reviewer.md"),
        "---\nname: code-reviewer\ndescription: Reviews diffs\ntools: Read, Grep, WebFetch\nmodel: sonnet\ncolor: blue\n---\nReview carefully.\n",
    );
    write(
        &ws.join(".codex/agents/planner.toml"),
        "name = \"planner\"\ndescription = \"Plans work\"\ndeveloper_instructions = \"Plan first.\"\nmodel = \"gpt-5\"\nsandbox_mode = \"read-only\"\n",
    );
    write(
        &ws.join(".bumblehive/agents/broken.md"),
        "---\nname: broken\nthis line is wrong\n---\n",
    );
    write(&ws.join(".codex/agents/bad.toml"), "name = \n");
    write(
        &ws.join(".bumblehive/agents/codex.md"),
        "---\nname: codex\nkind: acp\ncommand: codex-acp-not-here\n---\n",
    );
    write(
        &ws.join(".bumblehive/agents/py.md"),
        "---\nname: py-agent\nkind: acp\ncommand: python3\nargs: [agent.py]\n---\n",
    );
    // The person's own profiles live beside the config file.
    write(
        &dir.path().join("agents/mine.md"),
        "---\ndescription: Mine\n---\nMy way.\n",
    );
    let service = RuntimeService::new(ServiceOptions {
        data_dir: dir.path().join("data"),
        config_path: Some(dir.path().join("config.json")),
        config: None,
        provider_factory: two_servers(
            Server::new(Duration::ZERO, |_| ModelResponse::text("x")),
            Server::new(Duration::ZERO, |_| ModelResponse::text("x")),
        ),
        tools: None,
    })
    .unwrap();
    let listed = dispatch(
        &service,
        "list_agents",
        json!({"workspace": ws.display().to_string()}),
    )
    .await
    .unwrap();
    let by_name = |name: &str| -> Value {
        listed["profiles"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no profile {name}: {listed}"))
    };
    let fast = by_name("fast");
    assert_eq!(fast["provider"], "local");
    assert_eq!(fast["model"], "tiny");
    assert_eq!(fast["tools"], json!(["read_file"]));
    assert_eq!(fast["max_turns"], 3);
    assert_eq!(fast["instructions"], "Be quick.");
    let reviewer = by_name("code-reviewer");
    assert_eq!(reviewer["tools"], json!(["read_file", "grep"]));
    assert_eq!(reviewer["model"], "claude-sonnet-4-5");
    let notices = reviewer["notices"].to_string();
    assert!(
        notices.contains("WebFetch") && notices.contains("color"),
        "{notices}"
    );
    let planner = by_name("planner");
    assert_eq!(planner["instructions"], "Plan first.");
    assert!(planner["notices"].to_string().contains("sandbox_mode"));
    assert_eq!(by_name("mine")["instructions"], "My way.");
    for built_in in ["general", "explore", "review"] {
        assert_eq!(by_name(built_in)["source"], "built-in");
    }
    // ACP agents are listed with the others; one whose command is not installed says
    // what to install, one that is (python3, as the test agent runs) says nothing.
    let codex = by_name("codex");
    assert_eq!(codex["acp"]["command"], "codex-acp-not-here");
    let notices = codex["notices"].to_string();
    assert!(
        notices.contains("`codex-acp-not-here` is not installed or not on PATH"),
        "{notices}"
    );
    let python = by_name("py-agent");
    assert_eq!(python["notices"], json!([]), "{python}");
    let errors = listed["errors"].to_string();
    assert!(errors.contains("broken.md:3:"), "{errors}");
    assert!(errors.contains("bad.toml:1:"), "{errors}");
    service.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_runs_on_its_profiles_server_with_its_tools() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    write(
        &ws.join(".bumblehive/agents/scout.md"),
        "---\nname: scout\ndescription: Finds things\nprovider: local\ntools: [read_file, grep]\n---\nScout the code.\n",
    );
    let used = |response: ModelResponse, input_tokens| ModelResponse {
        usage: Some(Usage {
            input_tokens,
            output_tokens: 1,
        }),
        ..response
    };
    let local = Server::new(Duration::ZERO, move |_| {
        used(ModelResponse::text("found it"), 7)
    });
    let remote = Server::new(Duration::ZERO, move |request| {
        let last = request.messages.last().unwrap();
        used(remote_answer(last), 100)
    });
    fn remote_answer(last: &bumblehive::protocol::Message) -> ModelResponse {
        match (last.role, is_report(last)) {
            (Role::User, false) if last.text() == "find" => {
                ModelResponse::tool_calls(vec![ToolCall {
                    id: "d1".into(),
                    name: "sub_agent".into(),
                    arguments: json!({"title": "Scout", "task": "find x", "agent": "scout"}),
                }])
            }
            (Role::User, false) => ModelResponse::tool_calls(vec![ToolCall {
                id: "d2".into(),
                name: "sub_agent".into(),
                arguments: json!({"title": "Nobody", "task": "t", "agent": "nobody"}),
            }]),
            _ => ModelResponse::text("parent done"),
        }
    }
    let config = json!({
        "providers": {
            "local": {"kind": "openai", "base_url": "http://local/v1", "model": "small"},
            "remote": {"kind": "anthropic", "base_url": "http://remote", "model": "big"}
        },
        "default_provider": "remote"
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let service = RuntimeService::new(ServiceOptions {
        data_dir: dir.path().join("data"),
        config_path: Some(dir.path().join("config.json")),
        config: None,
        provider_factory: two_servers(local.clone(), remote.clone()),
        tools: None,
    })
    .unwrap();
    let info = service.create_session(ws.to_str().unwrap(), None).unwrap();
    let ctl = service.controller(&info.session_id).unwrap();
    ctl.submit("find".into(), None).unwrap();
    tokio::time::timeout(WAIT, service.wait_idle())
        .await
        .unwrap();
    // The parent ran on the remote server and was told about the profiles.
    let parent_requests = remote.requests();
    assert!(!parent_requests.is_empty());
    assert!(parent_requests.iter().all(|r| r.settings.model == "big"));
    let delegate = parent_requests[0]
        .tools
        .iter()
        .find(|t| t.name == "sub_agent")
        .unwrap();
    assert!(delegate.description.contains("scout: Finds things"));
    assert!(delegate.description.contains("explore:"));
    // The child ran on the local server, with the profile's tools and instructions.
    let child_requests = local.requests();
    assert_eq!(child_requests.len(), 1);
    let child = &child_requests[0];
    assert_eq!(child.settings.model, "small");
    assert_eq!(tool_names(child), ["read_file", "grep"]);
    assert!(child.messages[0].text().contains("Scout the code."));
    let history = service.store().load(&info.session_id).unwrap().messages;
    assert_message_order(&history);
    assert!(
        history
            .iter()
            .any(|m| is_report(m) && m.text().ends_with("found it"))
    );
    let children = service.list_sessions(None).unwrap();
    let scout = children.iter().find(|s| s.title == "Scout").unwrap();
    assert_eq!(scout.agent.as_deref(), Some("scout"));
    // Usage per child and per model: the child's tokens went to the local model, the
    // parent's to the remote one.
    let model_usage = |info: &bumblehive::protocol::SessionInfo| {
        info.models
            .iter()
            .map(|m| (m.provider.clone(), m.model.clone(), m.usage.input_tokens))
            .collect::<Vec<_>>()
    };
    assert_eq!(model_usage(scout), [("local".into(), "small".into(), 7)]);
    let parent = children
        .iter()
        .find(|s| s.session_id == info.session_id)
        .unwrap();
    let calls = parent_requests.len() as u64;
    assert_eq!(
        model_usage(parent),
        [("remote".into(), "big".into(), 100 * calls)]
    );
    // An unknown profile is one clear tool error naming the valid ones.
    ctl.submit("again".into(), None).unwrap();
    tokio::time::timeout(WAIT, service.wait_idle())
        .await
        .unwrap();
    let history = service.store().load(&info.session_id).unwrap().messages;
    let refused = history
        .iter()
        .find(|m| m.tool_call_id.as_deref() == Some("d2"))
        .unwrap();
    assert!(
        refused.text().contains("no agent profile named \"nobody\"")
            && refused.text().contains("scout"),
        "{}",
        refused.text()
    );
    service.shutdown().await;
}

/// The slot tests' model: a parent that delegates `children` sub-agents at once (each
/// answers at once), then finishes; `latency` is the model's own time per request.
fn delegating_server(latency: Duration, children: usize) -> Arc<Server> {
    Server::new(latency, move |request| {
        if first_user(request).contains("Task:\n") {
            return ModelResponse::text("child done");
        }
        let last = request.messages.last().unwrap();
        match (last.role, is_report(last)) {
            (Role::User, false) => ModelResponse::tool_calls(
                (0..children)
                    .map(|i| ToolCall {
                        id: format!("d{i}"),
                        name: "sub_agent".into(),
                        arguments: json!({"title": format!("C{i}"), "task": format!("t{i}")}),
                    })
                    .collect(),
            ),
            _ => ModelResponse::text("parent done"),
        }
    })
}

/// A service whose one provider `local` is `block`, every request answered by `server`,
/// with room for 8 children at once (so only the server's own slots bound them).
fn slots_service(dir: &std::path::Path, block: Value, server: &Arc<Server>) -> RuntimeService {
    let config = json!({
        "providers": {"local": block},
        "default_provider": "local",
        "subagents": {"max_concurrent": 8}
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    RuntimeService::new(ServiceOptions {
        data_dir: dir.join("data"),
        config_path: Some(dir.join("config.json")),
        config: None,
        provider_factory: two_servers(server.clone(), server.clone()),
        tools: None,
    })
    .unwrap()
}

/// An HTTP server on 127.0.0.1 answering `app`: its OpenAI base URL and its task.
async fn serve(app: axum::Router) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_two_slots_never_holds_more_than_two_requests() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let local = delegating_server(Duration::from_millis(5), 6);
    let service = slots_service(
        dir.path(),
        json!({"kind": "openai", "base_url": "http://local/v1", "model": "m", "max_concurrent": 2}),
        &local,
    );
    let info = service.create_session(ws.to_str().unwrap(), None).unwrap();
    let parent = service.controller(&info.session_id).unwrap();
    let (mut events, _) = parent.subscribe();
    parent.submit("go".into(), None).unwrap();
    // While children wait, the snapshot says which server's slot they wait for.
    let server = tokio::time::timeout(WAIT, async {
        loop {
            let event = events.next_event().await.unwrap();
            let value = serde_json::to_value(&event).unwrap();
            if value["kind"] == "subagent.state" && value["data"]["state"] == "waiting_for_slot" {
                let snapshot = parent.snapshot();
                if let Some(child) = snapshot.subagents.first() {
                    return child.server.clone();
                }
            }
        }
    })
    .await
    .expect("a child waiting for a slot");
    assert_eq!(server.as_deref(), Some("local"));
    tokio::time::timeout(Duration::from_secs(20), service.wait_idle())
        .await
        .unwrap();
    assert!(
        local.most.load(Ordering::SeqCst) <= 2,
        "{} requests at once on a 2-slot server",
        local.most.load(Ordering::SeqCst)
    );
    let history = service.store().load(&info.session_id).unwrap().messages;
    let reports: Vec<_> = history.iter().filter(|m| is_report(m)).collect();
    assert_eq!(reports.len(), 6);
    let mut ids: Vec<_> = reports.iter().map(|m| m.id.clone()).collect();
    ids.dedup();
    assert_eq!(ids.len(), 6);
    assert_message_order(&history);
    service.shutdown().await;
}

/// D15 (UX review 2): while runs are active, the named model servers may change (a
/// server added, one edited) and nothing else may (`busy`, nothing changed). A server
/// whose slot count changes mid-run never holds more requests than the larger of its
/// two counts: the new count takes over once its old slots are all back. Before, every
/// change was refused while anything ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d15_named_servers_change_while_runs_are_active_and_nothing_else_does() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let local = delegating_server(Duration::from_millis(5), 6);
    let service = slots_service(
        dir.path(),
        json!({"kind": "openai", "base_url": "http://local/v1", "model": "m", "max_concurrent": 1}),
        &local,
    );
    // The children's requests are held: the run is surely active while the config changes
    // below are tried, and one child's request holds the server's one slot.
    local.open.send_replace(false);
    let info = service.create_session(ws.to_str().unwrap(), None).unwrap();
    let parent = service.controller(&info.session_id).unwrap();
    let (mut events, _) = parent.subscribe();
    parent.submit("go".into(), None).unwrap();
    tokio::time::timeout(WAIT, async {
        loop {
            let value = serde_json::to_value(events.next_event().await.unwrap()).unwrap();
            if value["kind"] == "subagent.state" && value["data"]["state"] == "waiting_for_slot" {
                return;
            }
        }
    })
    .await
    .expect("a child waiting for the one slot");

    let added = service.update_config(&json!({"providers": {"other": {
        "kind": "openai", "base_url": "http://other/v1", "model": "o"}}}));
    assert!(
        added.is_ok(),
        "adding a server while runs are active: {added:?}"
    );
    let edited = service.update_config(&json!({"providers": {"local": {"max_concurrent": 2}}}));
    assert!(
        edited.is_ok(),
        "editing a named server while runs are active: {edited:?}"
    );
    let before = serde_json::to_value(service.config()).unwrap();
    for patch in [
        json!({"subagents": {"max_concurrent": 2}}),
        json!({"default_provider": "other"}),
        json!({"tools": {"policy": {"write_file": "allow"}}}),
        json!({"providers": {"other": {"model": "p"}}, "subagents": {"max_depth": 3}}),
    ] {
        let refused = service.update_config(&patch).unwrap_err();
        assert_eq!(refused.code(), "busy", "{patch}");
    }
    assert_eq!(serde_json::to_value(service.config()).unwrap(), before);
    let saved: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(saved["providers"]["local"]["max_concurrent"], 2);
    assert_eq!(saved["providers"]["other"]["model"], "o");
    local.open.send_replace(true);

    tokio::time::timeout(Duration::from_secs(20), service.wait_idle())
        .await
        .unwrap();
    assert!(
        local.most.load(Ordering::SeqCst) <= 2,
        "{} requests at once on a server of 1, then 2 slots",
        local.most.load(Ordering::SeqCst)
    );
    let history = service.store().load(&info.session_id).unwrap().messages;
    assert_eq!(history.iter().filter(|m| is_report(m)).count(), 6);
    assert_message_order(&history);
    // Idle now: the rest may change.
    service
        .update_config(&json!({"subagents": {"max_concurrent": 2}}))
        .unwrap();
    service.shutdown().await;
}

/// A parent turn in a new session of `dir` that delegates `children` sub-agents at once
/// on the server at `url` (a block without `max_concurrent`, so the server's own slots
/// bound it): the parent's history, and the most requests the model server held at once.
async fn delegate_at_once(
    dir: &std::path::Path,
    url: &str,
    children: usize,
) -> (Vec<bumblehive::protocol::Message>, usize) {
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let local = delegating_server(Duration::from_millis(20), children);
    let service = slots_service(
        dir,
        json!({"kind": "openai", "base_url": url, "model": "m"}),
        &local,
    );
    let info = service.create_session(ws.to_str().unwrap(), None).unwrap();
    service
        .controller(&info.session_id)
        .unwrap()
        .submit("go".into(), None)
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), service.wait_idle())
        .await
        .unwrap();
    let history = service.store().load(&info.session_id).unwrap().messages;
    service.shutdown().await;
    (history, local.most.load(Ordering::SeqCst))
}

/// llama-server says how many requests it serves at once (`GET /props` → `total_slots`,
/// its `-np`); with no `max_concurrent` in the config, that bounds its children to two,
/// one slot kept for the parent. Before the server was asked, all six ran at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_llama_cpp_server_that_says_three_slots_gets_two_children_at_once() {
    let props = axum::Router::new().route(
        "/props",
        axum::routing::get(|| async {
            axum::Json(json!({"total_slots": 3, "default_generation_settings": {"n_ctx": 8192}}))
        }),
    );
    let (url, props_server) = serve(props).await;
    let dir = tempfile::tempdir().unwrap();
    let (history, most) = delegate_at_once(dir.path(), &url, 6).await;
    // Two children and the parent's own turn at most: the server's three slots.
    assert!(most <= 3, "{most} requests at once on a 3-slot server");
    assert_eq!(history.iter().filter(|m| is_report(m)).count(), 6);
    assert_message_order(&history);
    props_server.abort();
}

/// The slot count a server said is remembered in the data dir (`slots.json`), like its
/// window: the next start uses it at once instead of probing the server before its
/// first request (#31: three probes, about a third of `bumblehive run`'s start). Here
/// the second start finds `/props` gone and still keeps to the three slots; unasked
/// and unremembered, all six children would run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_slot_count_is_remembered_for_the_next_start() {
    let props_up = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let up = props_up.clone();
    let props = axum::Router::new().route(
        "/props",
        axum::routing::get(move || {
            let up = up.clone();
            async move {
                if up.load(Ordering::SeqCst) {
                    Ok(axum::Json(json!({"total_slots": 3})))
                } else {
                    Err(axum::http::StatusCode::NOT_FOUND)
                }
            }
        }),
    );
    let (url, props_server) = serve(props).await;
    let dir = tempfile::tempdir().unwrap();
    for round in 0..2 {
        let (_, most) = delegate_at_once(dir.path(), &url, 6).await;
        assert!(
            most <= 3,
            "round {round}: {most} requests at once on a 3-slot server"
        );
        // The server stops saying: only the remembered count can bound the next start.
        props_up.store(false, Ordering::SeqCst);
    }
    assert!(dir.path().join("data").join("slots.json").exists());
    props_server.abort();
}

/// Ollama does not say how many requests it serves at once: with no `max_concurrent`,
/// one child at a time on it (the parent's own turn beside it), the safe guess for a
/// local model. Before, all four ran at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ollama_server_without_max_concurrent_gets_one_child_at_a_time() {
    let ollama = axum::Router::new().route(
        "/api/version",
        axum::routing::get(|| async { axum::Json(json!({"version": "0.5.7"})) }),
    );
    let (url, version_server) = serve(ollama).await;
    let dir = tempfile::tempdir().unwrap();
    let (history, most) = delegate_at_once(dir.path(), &url, 4).await;
    assert!(most <= 2, "{most} requests at once on an Ollama server");
    assert_eq!(history.iter().filter(|m| is_report(m)).count(), 4);
    version_server.abort();
}

/// The parent's model for the follow-up tests: delegates once, then after the first
/// report sends that child a follow-up with `message_subagent`, then finishes.
fn follow_up_parent(request: &ModelRequest) -> ModelResponse {
    if first_user(request).contains("Task:\n") {
        let asked = request
            .messages
            .iter()
            .filter(|m| m.role == Role::User)
            .count();
        let last = request.messages.last().unwrap().text().to_string();
        return ModelResponse::text(format!("answer {asked}: {last}"));
    }
    let reports = request.messages.iter().filter(|m| is_report(m)).count();
    let last = request.messages.last().unwrap();
    match (last.role, reports) {
        (Role::User, 0) => ModelResponse::tool_calls(vec![ToolCall {
            id: "d1".into(),
            name: "sub_agent".into(),
            arguments: json!({"title": "Helper", "task": "first job"}),
        }]),
        (Role::User, 1) if is_report(last) => ModelResponse::tool_calls(vec![ToolCall {
            id: "m1".into(),
            name: "message_subagent".into(),
            arguments: json!({"task_id": "d1", "message": "second job"}),
        }]),
        _ => ModelResponse::text(format!("parent saw {reports}")),
    }
}

fn follow_up_service(dir: &std::path::Path, server: Arc<Server>) -> RuntimeService {
    RuntimeService::new(ServiceOptions {
        data_dir: dir.join("data"),
        config_path: Some(dir.join("config.json")),
        config: None,
        provider_factory: two_servers(server.clone(), server),
        tools: None,
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_ups_to_a_finished_child_each_end_in_one_more_report() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let server = Server::new(Duration::ZERO, follow_up_parent);
    let service = follow_up_service(dir.path(), server.clone());
    let info = service.create_session(ws.to_str().unwrap(), None).unwrap();
    service
        .controller(&info.session_id)
        .unwrap()
        .submit("go".into(), None)
        .unwrap();
    tokio::time::timeout(WAIT, service.wait_idle())
        .await
        .unwrap();
    // The parent's follow-up (message_subagent) started the finished child again.
    let history = service.store().load(&info.session_id).unwrap().messages;
    let sent = history
        .iter()
        .find(|m| m.tool_call_id.as_deref() == Some("m1"))
        .unwrap();
    assert!(
        sent.text().contains("\"status\":\"started\""),
        "{}",
        sent.text()
    );
    let ids: Vec<_> = history
        .iter()
        .filter(|m| is_report(m))
        .map(|m| m.id.clone().unwrap())
        .collect();
    assert_eq!(ids, ["subagent:d1", "subagent:d1:2"]);
    assert!(
        history
            .iter()
            .any(|m| m.text().ends_with("answer 2: second job"))
    );
    // The person types into the child's tab: one more run, one more report, after a
    // restart too (the count is stored).
    let child = service
        .list_sessions(None)
        .unwrap()
        .into_iter()
        .find(|s| s.title == "Helper")
        .unwrap();
    service.shutdown().await;
    let service = follow_up_service(dir.path(), server.clone());
    let submitted = dispatch(
        &service,
        "submit",
        json!({"session_id": child.session_id, "content": "third job"}),
    )
    .await
    .unwrap();
    assert_eq!(submitted["status"], "started");
    tokio::time::timeout(WAIT, service.wait_idle())
        .await
        .unwrap();
    let history = service.store().load(&info.session_id).unwrap().messages;
    let ids: Vec<_> = history
        .iter()
        .filter(|m| is_report(m))
        .map(|m| m.id.clone().unwrap())
        .collect();
    assert_eq!(ids, ["subagent:d1", "subagent:d1:2", "subagent:d1:3"]);
    assert_message_order(&history);
    service.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_to_a_working_child_is_steered_into_its_run() {
    let fx = crate::support::Delegation::new();
    let mut begun = fx.begin("steer", 1, false, None).await;
    let child = begun.children[0]["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    // Once its run has begun (its task message is in its history).
    loop {
        let event = crate::support::receive(&mut begun.events, "event", Some(&child), None).await;
        if event["kind"] == "message.appended" {
            break;
        }
    }
    let (_, status) = fx
        .service
        .submit_message(&child, "also look at README".into(), None)
        .await
        .unwrap();
    assert_eq!(status, bumblehive::protocol::MessageStatus::Steered);
    fx.provider.gate("steer-0").set();
    fx.wait_idle().await;
    let child_history = fx.history(&child);
    assert!(
        child_history
            .iter()
            .any(|m| m.role == Role::User && m.text() == "also look at README")
    );
    let reports: Vec<_> = fx
        .history(&begun.session_id)
        .into_iter()
        .filter(is_report)
        .collect();
    assert_eq!(reports.len(), 1);
    drop(begun);
    fx.shutdown().await;
}

/// `/agent NAME`: a top-level session runs as a profile from its next turn (its tools and
/// instructions), as none again when cleared; an unknown name and a sub-agent are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_agent_makes_a_top_level_session_run_as_a_profile() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let server = Server::new(Duration::ZERO, |_| ModelResponse::text("ok"));
    let config = json!({"providers": {"local": {"kind": "openai", "base_url": "http://local/v1", "model": "m"}}, "default_provider": "local"});
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let service = RuntimeService::new(ServiceOptions {
        data_dir: dir.path().join("data"),
        config_path: Some(dir.path().join("config.json")),
        config: None,
        provider_factory: two_servers(server.clone(), server.clone()),
        tools: None,
    })
    .unwrap();
    let info = service.create_session(ws.to_str().unwrap(), None).unwrap();
    let id = info.session_id.clone();
    let turn = |n: usize| {
        let service = service.clone();
        let id = id.clone();
        let server = server.clone();
        async move {
            service
                .controller(&id)
                .unwrap()
                .submit("look around".into(), None)
                .unwrap();
            tokio::time::timeout(WAIT, service.wait_idle())
                .await
                .unwrap();
            server.requests()[n].clone()
        }
    };
    let plain = turn(0).await;
    assert!(tool_names(&plain).contains(&"write_file".to_string()));

    let set = dispatch(
        &service,
        "set_agent",
        json!({"session_id": id, "agent": "explore"}),
    )
    .await
    .unwrap();
    assert_eq!(set["agent"], "explore");
    let explore = turn(1).await;
    let tools = tool_names(&explore);
    assert!(tools.contains(&"read_file".to_string()), "{tools:?}");
    assert!(!tools.contains(&"write_file".to_string()), "{tools:?}");
    assert!(!tools.contains(&"run_command".to_string()), "{tools:?}");
    assert!(
        explore.messages[0]
            .text()
            .contains("# Your instructions as this agent")
    );

    dispatch(
        &service,
        "set_agent",
        json!({"session_id": id, "agent": null}),
    )
    .await
    .unwrap();
    assert!(tool_names(&turn(2).await).contains(&"write_file".to_string()));

    let err = dispatch(
        &service,
        "set_agent",
        json!({"session_id": id, "agent": "nobody"}),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "invalid_argument");
    assert!(err.to_string().contains("explore"), "{err}");
    service.shutdown().await;
}

/// E3: a child with no profile of its own runs on its parent's current server and model
/// (the session's model picker), never on the default server. Two real scripted
/// OpenAI-compatible servers: the default one must see no request at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e3_a_child_runs_on_the_server_and_model_picked_for_its_parent() {
    use crate::mock_llm::{MockLlm, MockResponse, openai};
    let default = MockLlm::start().await;
    let picked = MockLlm::start().await;
    default.respond_with(|_| MockResponse::sse(openai::text_answer(&["wrong server"], (5, 2))));
    picked.respond_with(|request| {
        let messages = request.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let child = messages.iter().any(|m| {
            m["content"]
                .as_str()
                .is_some_and(|c| c.contains("You are the sub-agent"))
        });
        let answered = messages.iter().any(|m| m["role"] == "tool");
        let answer = if child {
            openai::text_answer(&["child done"], (5, 2))
        } else if answered {
            openai::text_answer(&["parent done"], (5, 2))
        } else {
            openai::tool_answer(
                &[(
                    "call_1",
                    "sub_agent",
                    json!({"title": "T", "task": "do it"}),
                )],
                (5, 2),
            )
        };
        MockResponse::sse(answer)
    });
    let block = |mock: &MockLlm, model: &str| {
        json!({"kind": "openai", "base_url": format!("{}/v1", mock.url()), "model": model,
               "max_retries": 0})
    };
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let config = bumblehive::config::Config::default()
        .patched(&json!({
            "providers": {"remote": block(&default, "big"), "scripted": block(&picked, "other")},
            "default_provider": "remote",
        }))
        .unwrap();
    let service = RuntimeService::new(ServiceOptions {
        data_dir: dir.path().join("data"),
        config_path: None,
        config: Some(config),
        provider_factory: Arc::new(bumblehive::providers::provider_from_config),
        tools: None,
    })
    .unwrap();
    let info = service.create_session(ws.to_str().unwrap(), None).unwrap();
    service
        .set_model(
            &info.session_id,
            Some("scripted".into()),
            Some("scripted-1".into()),
        )
        .unwrap();
    let parent = service.controller(&info.session_id).unwrap();
    parent.submit("delegate".into(), None).unwrap();
    tokio::time::timeout(WAIT, service.wait_idle())
        .await
        .expect("the runs never settled");
    let history = service.store().load(&info.session_id).unwrap().messages;
    assert_eq!(history.iter().filter(|m| is_report(m)).count(), 1);
    assert!(
        default.requests().is_empty(),
        "the default server was asked: {:?}",
        default.bodies()
    );
    let bodies = picked.bodies();
    assert!(bodies.len() >= 3, "{bodies:#?}");
    assert!(
        bodies.iter().all(|b| b["model"] == "scripted-1"),
        "{bodies:#?}"
    );
    // The child's snapshot names where it runs.
    let child = service
        .store()
        .list(None)
        .unwrap()
        .into_iter()
        .find(|s| s.parent_session_id.as_deref() == Some(info.session_id.as_str()))
        .expect("the child");
    assert_eq!(child.provider.as_deref(), Some("scripted"));
    assert_eq!(child.model.as_deref(), Some("scripted-1"));
    service.shutdown().await;
}

/// Scripted for the E3 approval tests: the parent delegates `children` at once, each child
/// asks to write `<its title>.txt` (an approval), then everyone answers in text.
fn delegating(children: Value) -> impl Fn(&ModelRequest) -> ModelResponse + Send + Sync {
    move |request| {
        let first = first_user(request);
        let answered = request.messages.iter().any(|m| m.role == Role::Tool);
        match first
            .split_once("You are the sub-agent \"")
            .map(|(_, rest)| rest)
        {
            Some(rest) if !answered => {
                let title = rest.split('"').next().unwrap_or_default();
                ModelResponse::tool_calls(vec![ToolCall {
                    id: format!("w-{title}"),
                    name: "write_file".into(),
                    arguments: json!({"path": format!("{title}.txt"), "content": "x\n"}),
                }])
            }
            Some(_) => ModelResponse::text("child done"),
            None if !answered => ModelResponse::tool_calls(
                children
                    .as_array()
                    .unwrap()
                    .iter()
                    .enumerate()
                    .map(|(i, args)| ToolCall {
                        id: format!("d{i}"),
                        name: "sub_agent".into(),
                        arguments: args.clone(),
                    })
                    .collect(),
            ),
            None => ModelResponse::text("parent done"),
        }
    }
}

/// Submits `prompt` to `session`, approves each approval request its tree makes until
/// `count` were made, waits for the tree to be idle and returns the requests as sent.
async fn approve_all(service: &RuntimeService, session: &str, count: usize) -> Vec<Value> {
    let parent = service.controller(session).unwrap();
    let (mut events, _) = parent.subscribe();
    parent.submit("delegate".into(), None).unwrap();
    let mut asked = Vec::new();
    tokio::time::timeout(WAIT, async {
        while asked.len() < count {
            let event = serde_json::to_value(events.next_event().await.unwrap()).unwrap();
            if event["type"] == "approval_request" {
                service
                    .decide_approval(bumblehive::protocol::commands::DecideApproval {
                        session_id: event["session_id"].as_str().unwrap().into(),
                        approval_id: event["approval_id"].as_str().unwrap().into(),
                        approved: true,
                        remember: false,
                        reason: None,
                    })
                    .unwrap();
                asked.push(event);
            }
        }
    })
    .await
    .expect("fewer approval requests than expected");
    tokio::time::timeout(WAIT, service.wait_idle())
        .await
        .expect("the runs never settled");
    asked
}

/// E3: a sub-agent's approval names the server and model it runs on, as its run resolved
/// them: a profile's server and model, or (no profile) the parent's, here the default
/// server's name and model though the parent's meta names none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e3_a_childs_approval_names_the_server_and_model_it_runs_on() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    write(
        &ws.join(".bumblehive/agents/scout.md"),
        "---\nname: scout\ndescription: Finds things\nprovider: local\nmodel: tiny\n---\nScout.\n",
    );
    let respond = || {
        delegating(json!([
            {"title": "Scout", "task": "write", "agent": "scout"},
            {"title": "Plain", "task": "write"},
        ]))
    };
    let local = Server::new(Duration::ZERO, respond());
    let remote = Server::new(Duration::ZERO, respond());
    let config = json!({
        "providers": {
            "local": {"kind": "openai", "base_url": "http://local/v1", "model": "small"},
            "remote": {"kind": "openai", "base_url": "http://remote/v1", "model": "big"}
        },
        "default_provider": "remote"
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let service = RuntimeService::new(ServiceOptions {
        data_dir: dir.path().join("data"),
        config_path: Some(dir.path().join("config.json")),
        config: None,
        provider_factory: two_servers(local.clone(), remote.clone()),
        tools: None,
    })
    .unwrap();
    let info = service.create_session(ws.to_str().unwrap(), None).unwrap();
    let asked = approve_all(&service, &info.session_id, 2).await;
    let of = |title: &str| {
        asked
            .iter()
            .find(|a| a["title"] == title)
            .unwrap_or_else(|| panic!("no approval of {title}: {asked:#?}"))
    };
    assert_eq!(of("Scout")["provider"], "local");
    assert_eq!(of("Scout")["model"], "tiny");
    assert_eq!(of("Plain")["provider"], "remote");
    assert_eq!(of("Plain")["model"], "big");
    assert!(ws.join("Scout.txt").exists() && ws.join("Plain.txt").exists());
    service.shutdown().await;
}

/// E3, `delegation::child_model`'s `(None, Some(_))`: a profile that names only a model
/// runs that model on the parent's server (the session's pick), not on the default one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e3_a_profile_naming_only_a_model_runs_it_on_the_parents_server() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    write(
        &ws.join(".bumblehive/agents/fast.md"),
        "---\nname: fast\ndescription: Quick\nmodel: tiny\n---\nBe quick.\n",
    );
    let respond = || delegating(json!([{"title": "Fast", "task": "write", "agent": "fast"}]));
    let local = Server::new(Duration::ZERO, respond());
    let remote = Server::new(Duration::ZERO, respond());
    let config = json!({
        "providers": {
            "local": {"kind": "openai", "base_url": "http://local/v1", "model": "small"},
            "remote": {"kind": "openai", "base_url": "http://remote/v1", "model": "big"}
        },
        "default_provider": "remote"
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let service = RuntimeService::new(ServiceOptions {
        data_dir: dir.path().join("data"),
        config_path: Some(dir.path().join("config.json")),
        config: None,
        provider_factory: two_servers(local.clone(), remote.clone()),
        tools: None,
    })
    .unwrap();
    let info = service.create_session(ws.to_str().unwrap(), None).unwrap();
    // The person picked the local server (and a model of it) for this session.
    service
        .set_model(
            &info.session_id,
            Some("local".into()),
            Some("picked".into()),
        )
        .unwrap();
    let asked = approve_all(&service, &info.session_id, 1).await;
    assert!(
        remote.requests().is_empty(),
        "the default server was asked: {:#?}",
        remote.requests()
    );
    let models: Vec<(bool, String)> = local
        .requests()
        .iter()
        .map(|r| {
            let child = first_user(r).contains("You are the sub-agent");
            (child, r.settings.model.clone())
        })
        .collect();
    assert!(models.contains(&(true, "tiny".into())), "{models:?}");
    assert!(
        models
            .iter()
            .all(|(child, model)| model == if *child { "tiny" } else { "picked" }),
        "{models:?}"
    );
    assert_eq!(asked[0]["title"], "Fast");
    assert_eq!(asked[0]["provider"], "local");
    assert_eq!(asked[0]["model"], "tiny");
    service.shutdown().await;
}
