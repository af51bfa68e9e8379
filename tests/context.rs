//! Context that lasts: instructions from real folders (nested AGENTS.md, the CLAUDE.md fallback, the cap, missing and unreadable files), the environment of a real git repository, context windows asked from local servers that speak llama.cpp's, Ollama's and LM Studio's JSON, and compaction end to end against the scripted model server with a 2,000-token window.

use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::Router;
use axum::routing::{get, post};
use bumblehive::config::ProviderConfig;
use bumblehive::context::compaction::{
    self, Compacted, Compaction, CompactionError, CompactionKind, HANDOFF_SYSTEM, Policy,
    RunningChild, SUMMARY_HEADER,
};
use bumblehive::context::environment::{Environment, GitState};
use bumblehive::context::instructions::{self, INSTRUCTIONS_CAP};
use bumblehive::context::window::{self, WindowSource, estimate_tokens};
use bumblehive::context::{Prepared, prepare};
use bumblehive::invariant::check_message_order;
use bumblehive::protocol::{Message, Role, ToolCall};
use bumblehive::provider::{
    ModelProvider, ModelRequest, ModelSettings, ProviderError, ProviderEvent, ToolSpec,
};
use bumblehive::providers::provider_from_config;
use serde_json::{Value, json};

use crate::mock_llm::{MockLlm, MockResponse, RecordedRequest, openai};
use crate::providers_openai::openai_config;
use crate::support::{WAIT, assert_message_order};

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

// ---------------------------------------------------------------- instructions

#[test]
fn context_instructions_nested_agents_md_with_claude_md_fallback_and_user_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    std::fs::create_dir_all(root.join(".git")).unwrap();
    let workspace = root.join("a").join("b");
    std::fs::create_dir_all(&workspace).unwrap();
    write(&root.join("AGENTS.md"), "ROOT RULES");
    write(&root.join("CLAUDE.md"), "IGNORED: AGENTS.md is there");
    write(&root.join("a").join("CLAUDE.md"), "A RULES (claude)");
    write(&workspace.join("AGENTS.md"), "B RULES");
    // Above the repository's root: not part of this project.
    write(&dir.path().join("AGENTS.md"), "OUTSIDE");
    let user = dir.path().join("config").join("bumblehive");
    write(&user.join("AGENTS.md"), "USER RULES");

    let loaded = instructions::load(&workspace, None, Some(&user));
    let names: Vec<String> = loaded
        .files
        .iter()
        .map(|f| {
            Path::new(&f.path)
                .strip_prefix(dir.path().canonicalize().unwrap())
                .unwrap()
                .display()
                .to_string()
        })
        .collect();
    assert_eq!(
        names,
        [
            "config/bumblehive/AGENTS.md",
            "repo/AGENTS.md",
            "repo/a/CLAUDE.md",
            "repo/a/b/AGENTS.md"
        ]
    );
    let order: Vec<usize> = ["USER RULES", "ROOT RULES", "A RULES", "B RULES"]
        .iter()
        .map(|needle| loaded.text.find(needle).unwrap())
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{}", loaded.text);
    assert!(!loaded.text.contains("IGNORED"));
    assert!(!loaded.text.contains("OUTSIDE"));
    assert!(loaded.notices.is_empty(), "{:?}", loaded.notices);
    assert_eq!(loaded.files[1].bytes, 10);
    assert_eq!(loaded.files[1].tokens_estimate, 3);

    // A root named by the caller wins over the git root; the workspace alone without either.
    let hinted = instructions::load(&workspace, Some(&root.join("a")), None);
    assert_eq!(hinted.files.len(), 2);
    assert!(!hinted.text.contains("ROOT RULES"));
    let plain = tempfile::tempdir().unwrap();
    let none = instructions::load(plain.path(), None, None);
    assert!(none.files.is_empty() && none.text.is_empty() && none.notices.is_empty());
}

#[test]
fn context_instructions_cap_truncates_with_a_notice_and_leaves_the_rest_out() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join(".git")).unwrap();
    let nested = root.join("n");
    let deeper = nested.join("m");
    write(&root.join("AGENTS.md"), &"r".repeat(20 * 1024));
    // A multi-byte character straddles the cut: the text stays valid UTF-8.
    write(&nested.join("AGENTS.md"), &"é".repeat(10 * 1024));
    write(&deeper.join("AGENTS.md"), "LAST");
    let loaded = instructions::load(&deeper, None, None);
    assert!(
        loaded.text.len() <= INSTRUCTIONS_CAP + 200,
        "{}",
        loaded.text.len()
    );
    assert_eq!(loaded.files.len(), 2);
    assert!(!loaded.files[0].truncated);
    assert!(loaded.files[1].truncated);
    assert_eq!(loaded.files[1].bytes, 20 * 1024);
    assert!(loaded.files[1].tokens_estimate < 20 * 1024 / 4);
    assert!(loaded.text.contains("capped at 32 KiB"));
    assert!(!loaded.text.contains("LAST"));
    assert_eq!(loaded.notices.len(), 2, "{:?}", loaded.notices);
    assert!(
        loaded.notices[1].contains("left out"),
        "{:?}",
        loaded.notices
    );
}

#[test]
fn context_instructions_unreadable_files_are_notices_and_claude_md_stands_in() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join(".git")).unwrap();
    // An AGENTS.md that is a folder cannot be read (as root, mode 000 would not stop us).
    std::fs::create_dir_all(root.join("AGENTS.md")).unwrap();
    write(&root.join("CLAUDE.md"), "CLAUDE AT ROOT");
    let child = root.join("c");
    std::fs::create_dir_all(&child).unwrap();
    std::os::unix::fs::symlink(root.join("nowhere.md"), child.join("AGENTS.md")).unwrap();
    let user = root.join("user");
    std::fs::create_dir_all(user.join("AGENTS.md")).unwrap();

    let loaded = instructions::load(&child, None, Some(&user));
    assert_eq!(loaded.files.len(), 1, "{:?}", loaded.files);
    assert!(loaded.text.contains("CLAUDE AT ROOT"));
    assert_eq!(loaded.notices.len(), 3, "{:?}", loaded.notices);
    for notice in &loaded.notices {
        assert!(notice.starts_with("cannot read "), "{notice}");
    }
    assert!(loaded.notices.iter().any(|n| n.contains("c/AGENTS.md")));
    // A workspace that does not exist is a notice too.
    let plain = tempfile::tempdir().unwrap();
    let gone = instructions::load(&plain.path().join("missing"), None, None);
    assert!(gone.files.is_empty());
    assert!(gone.notices[0].contains("cannot resolve the workspace"));
}

// ---------------------------------------------------------------- environment

fn git(dir: &Path, args: &[&str]) {
    let status = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@t")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@t")
        .output()
        .unwrap();
    assert!(status.status.success(), "git {args:?}: {status:?}");
}

#[tokio::test]
async fn context_environment_of_a_git_repository_and_of_a_plain_folder() {
    let dir = tempfile::tempdir().unwrap();
    git(dir.path(), &["init", "-q", "-b", "feature-x"]);
    write(&dir.path().join("tracked.txt"), "1");
    git(dir.path(), &["add", "tracked.txt"]);
    git(dir.path(), &["commit", "-qm", "one"]);
    write(&dir.path().join("tracked.txt"), "2");
    for i in 0..25 {
        write(&dir.path().join(format!("new{i:02}.txt")), "x");
    }
    let started = std::time::Instant::now();
    let env = Environment::detect(dir.path()).await;
    println!(
        "Environment::detect in a git repository: {:?}",
        started.elapsed()
    );
    let GitState::Repository {
        branch,
        status,
        more,
    } = &env.git
    else {
        panic!("not seen as a repository: {env:?}")
    };
    assert_eq!(branch.as_deref(), Some("feature-x"));
    assert_eq!(status[0], " M tracked.txt");
    assert_eq!((status.len(), *more), (20, 6));
    assert_eq!(env.date.len(), 10);
    assert!(!env.os.is_empty() && !env.shell.is_empty());

    let plain = tempfile::tempdir().unwrap();
    let env = Environment::detect(plain.path()).await;
    assert_eq!(env.git, GitState::None, "{env:?}");
}

// ---------------------------------------------------------------- context window

async fn serve(app: Router) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), task)
}

fn config_for(base_url: String, model: &str) -> ProviderConfig {
    ProviderConfig {
        base_url,
        model: model.into(),
        ..ProviderConfig::default()
    }
}

#[tokio::test]
async fn context_window_from_llama_cpp_props() {
    let app = Router::new().route(
        "/props",
        get(|| async {
            Json(json!({
                "default_generation_settings": {"n_ctx": 4096, "params": {"n_predict": -1}},
                "total_slots": 1,
                "model_path": "/models/qwen.gguf",
                "build_info": "b6000"
            }))
        }),
    );
    let (url, _server) = serve(app).await;
    let window = window::resolve(&config_for(format!("{url}/v1"), "qwen")).await;
    assert_eq!((window.tokens, window.source), (4096, WindowSource::Server));
}

#[tokio::test]
async fn context_window_from_ollama_show_num_ctx_or_capped_trained_length() {
    let seen = Arc::new(Mutex::new(Vec::<Value>::new()));
    let record = seen.clone();
    let app = Router::new().route(
        "/api/show",
        post(move |Json(body): Json<Value>| {
            let record = record.clone();
            async move {
                record.lock().unwrap().push(body.clone());
                let info = json!({"general.architecture": "qwen2", "qwen2.context_length": 32768});
                if body["model"] == "tuned" {
                    Json(json!({"parameters": "stop \"<|im_end|>\"\nnum_ctx 16384", "model_info": info}))
                } else {
                    Json(json!({"parameters": "stop \"<|im_end|>\"", "model_info": info}))
                }
            }
        }),
    );
    let (url, _server) = serve(app).await;
    let tuned = window::resolve(&config_for(format!("{url}/v1"), "tuned")).await;
    assert_eq!((tuned.tokens, tuned.source), (16384, WindowSource::Server));
    let plain = window::resolve(&config_for(format!("{url}/v1"), "qwen2.5-coder")).await;
    assert_eq!(plain.tokens, window::OLLAMA_DEFAULT_NUM_CTX);
    assert_eq!(seen.lock().unwrap()[0], json!({"model": "tuned"}));
}

#[tokio::test]
async fn context_window_from_lm_studio_models() {
    let app = Router::new().route(
        "/api/v0/models",
        get(|| async {
            Json(json!({"object": "list", "data": [
                {"id": "other", "object": "model", "type": "llm", "state": "not-loaded", "max_context_length": 4096},
                {"id": "qwen2.5-coder-7b-instruct", "object": "model", "type": "llm", "publisher": "lmstudio-community",
                 "arch": "qwen2", "compatibility_type": "gguf", "quantization": "Q4_K_M", "state": "loaded",
                 "max_context_length": 32768}
            ]}))
        }),
    );
    let (url, _server) = serve(app).await;
    let found = window::resolve(&config_for(
        format!("{url}/v1"),
        "qwen2.5-coder-7b-instruct",
    ))
    .await;
    assert_eq!((found.tokens, found.source), (32768, WindowSource::Server));
    // A model the server does not list: the table does not know it either.
    let unknown = window::resolve(&config_for(format!("{url}/v1"), "missing")).await;
    assert_eq!(
        (unknown.tokens, unknown.source),
        (window::DEFAULT_WINDOW, WindowSource::Default)
    );
}

#[tokio::test]
async fn context_window_config_wins_and_silent_servers_fall_back_to_the_table() {
    // A server that answers none of the endpoints (a plain OpenAI-compatible one).
    let (url, _server) = serve(Router::new()).await;
    let table = window::resolve(&config_for(format!("{url}/v1"), "gpt-4o-mini")).await;
    assert_eq!((table.tokens, table.source), (128_000, WindowSource::Table));
    let configured = window::resolve(&ProviderConfig {
        context_window: Some(2000),
        ..config_for(format!("{url}/v1"), "gpt-4o-mini")
    })
    .await;
    assert_eq!(
        (configured.tokens, configured.source),
        (2000, WindowSource::Config)
    );
    // Nothing listens: the default, quickly.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = format!("http://{}/v1", closed.local_addr().unwrap());
    drop(closed);
    let fallback = window::resolve(&config_for(dead, "local-model")).await;
    assert_eq!(fallback.source, WindowSource::Default);
    let anthropic = window::resolve(&ProviderConfig {
        kind: "anthropic".into(),
        ..config_for(format!("{url}/v1"), "claude-sonnet-4-5")
    })
    .await;
    assert_eq!(
        (anthropic.tokens, anthropic.source),
        (200_000, WindowSource::Table)
    );
}

// ---------------------------------------------------------------- compaction

const WINDOW: usize = 2000;

fn tools() -> Vec<ToolSpec> {
    vec![ToolSpec {
        name: "read_file".into(),
        description: "Reads a file of the workspace.".into(),
        parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}).into(),
    }]
}

fn system() -> Message {
    Message::system("You are Bumblehive, a coding agent.")
}

fn is_summary_request(request: &RecordedRequest) -> bool {
    request.body["messages"][0]["content"] == HANDOFF_SYSTEM
}

/// The scripted model, for the builder's tests and the runtime's: the person's message
/// `question N` gets a `read_file` call (`big.txt` every 7th turn, `a.txt` otherwise), a
/// tool result or a report gets an answer, and summary requests get a handoff note.
/// Usage is reported as a quarter of the request's bytes, like a real server's count.
fn script(mock: &MockLlm) {
    mock.respond_with(|request| {
        let prompt = (request.raw_body.len() / 4) as u64;
        if is_summary_request(request) {
            return MockResponse::sse(openai::text_answer(
                &["## Goal\nKeep answering questions about a.txt.\n## Files touched\na.txt, big.txt"],
                (prompt, 20),
            ));
        }
        let messages = request.body["messages"].as_array().unwrap();
        let last = messages.last().unwrap();
        let text = last["content"].as_str().unwrap_or("");
        if last["role"] == "tool" || text.starts_with("[Background tool result]") {
            return MockResponse::sse(openai::text_answer(&["done with that"], (prompt, 5)));
        }
        let turn: usize = text
            .strip_prefix("question ")
            .and_then(|rest| rest.split(':').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let path = if turn % 7 == 3 { "big.txt" } else { "a.txt" };
        MockResponse::sse(openai::tool_answer(
            &[(
                &format!("call-{}-{prompt}", messages.len()),
                "read_file",
                json!({ "path": path }),
            )],
            (prompt, 10),
        ))
    });
}

/// The builder's steps without the runtime around them: the stored lines (messages and markers) and
/// the latest marker; one model call goes through [`prepare`], compacts at most once, and
/// on "context too long" compacts once more and retries once.
struct Session {
    provider: Arc<dyn ModelProvider>,
    settings: ModelSettings,
    history: Vec<Message>,
    marker: Option<Compaction>,
    /// `messages.jsonl` as the store writes it: a message per line, or `{"compaction"}`.
    lines: Vec<String>,
    policy: Policy,
    compactions: usize,
    sent: Vec<Vec<Message>>,
}

impl Session {
    fn new(mock: &MockLlm) -> Self {
        let config = openai_config(mock);
        Session {
            provider: provider_from_config(&config).unwrap(),
            settings: ModelSettings::from(&config),
            history: Vec::new(),
            marker: None,
            lines: Vec::new(),
            policy: Policy::default(),
            compactions: 0,
            sent: Vec::new(),
        }
    }

    fn append(&mut self, message: Message) {
        self.lines.push(serde_json::to_string(&message).unwrap());
        self.history.push(message);
    }

    async fn compact(&mut self, plan: compaction::Plan) -> Compacted {
        let sink = |_: ProviderEvent| {};
        let compacted = compaction::compact(
            self.provider.as_ref(),
            &self.settings,
            &self.history,
            self.marker.as_ref(),
            plan,
            &[],
            WINDOW,
            &sink,
        )
        .await;
        self.lines
            .push(serde_json::to_string(&json!({ "compaction": compacted.marker })).unwrap());
        self.marker = Some(compacted.marker.clone());
        self.compactions += 1;
        compacted
    }

    fn prepare(&self, force: bool) -> Prepared {
        prepare(
            system(),
            &self.history,
            self.marker.as_ref(),
            &tools(),
            WINDOW,
            &self.policy,
            force,
        )
    }

    /// One model call with the context builder in front; the answer is appended.
    async fn model_call(&mut self) -> Result<Message, ProviderError> {
        let mut prepared = self.prepare(false);
        if let Some(plan) = prepared.plan.take() {
            self.compact(plan).await;
            prepared = self.prepare(false);
            // One compaction brings the request under the threshold: nothing asks for another.
            assert!(
                prepared.plan.is_none(),
                "still {} tokens after a compaction",
                prepared.used
            );
        }
        let mut retried = false;
        loop {
            assert_request_shape(&prepared.messages.to_vec(), &self.history);
            self.sent.push(prepared.messages.to_vec());
            let request = ModelRequest {
                messages: prepared.messages.clone(),
                tools: tools().into(),
                settings: self.settings.clone(),
            };
            let sink = |_: ProviderEvent| {};
            match tokio::time::timeout(WAIT, self.provider.generate(request, &sink))
                .await
                .expect("model call hung")
            {
                Ok(response) => {
                    let mut message = Message::assistant(response.content, response.tool_calls);
                    message.usage = response.usage;
                    self.append(message.clone());
                    return Ok(message);
                }
                Err(ProviderError::ContextTooLong(_)) if !retried => {
                    retried = true;
                    let plan = self.prepare(true).plan.expect("a forced plan");
                    self.compact(plan).await;
                    prepared = self.prepare(false);
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// Reads `messages.jsonl` back as a reload does: messages, and the latest marker.
    fn reload(&self) -> (Vec<Message>, Option<Compaction>) {
        let mut history = Vec::new();
        let mut marker = None;
        for line in &self.lines {
            let value: Value = serde_json::from_str(line).unwrap();
            if let Some(found) = value.get("compaction") {
                marker = Some(serde_json::from_value(found.clone()).unwrap());
            } else {
                history.push(serde_json::from_value(value).unwrap());
            }
        }
        (history, marker)
    }
}

/// SPEC §2's shape in every request: one system message, the session's first user
/// message at index 1, batches whole, and the newest history verbatim at the end.
fn assert_request_shape(messages: &[Message], history: &[Message]) {
    assert_eq!(messages[0].role, Role::System);
    assert_eq!(
        messages.iter().filter(|m| m.role == Role::System).count(),
        1
    );
    if let Some(first) = history.iter().find(|m| m.role == Role::User) {
        assert_eq!(
            &messages[1], first,
            "the first user message is not at index 1"
        );
    }
    assert_eq!(check_message_order(&messages[1..]), Ok(()));
    if let Some(last) = history.last() {
        let sent = messages.last().unwrap();
        assert_eq!(sent.role, last.role);
        assert_eq!(sent.tool_call_id, last.tool_call_id);
    }
}

fn tool_result(call: &ToolCall, turn: usize) -> Message {
    // Every 7th result is oversized (about half the window); the rest are small.
    let size = if turn % 7 == 3 { 4000 } else { 120 + turn % 50 };
    Message::tool(
        &call.id,
        format!(
            "contents of {} #{turn}: {}",
            call.arguments["path"],
            "x".repeat(size)
        ),
    )
}

async fn run_turns(session: &mut Session, from: usize, to: usize) {
    for turn in from..to {
        session.append(Message::user(
            format!("u{turn}"),
            format!("question {turn}: what is in a.txt?"),
        ));
        let answer = session.model_call().await.unwrap();
        assert_eq!(answer.tool_calls.len(), 1, "turn {turn}");
        let result = tool_result(&answer.tool_calls[0], turn);
        session.append(result);
        let answer = session.model_call().await.unwrap();
        assert_eq!(answer.text(), "done with that");
    }
}

#[tokio::test]
async fn context_a_200_turn_session_keeps_running_under_a_2000_token_window() {
    let mock = MockLlm::start().await;
    script(&mock);
    let mut session = Session::new(&mock);
    run_turns(&mut session, 0, 200).await;

    assert!(
        session.compactions >= 10,
        "{} compactions",
        session.compactions
    );
    let tools = tools();
    let mut largest = 0;
    for request in &session.sent {
        let size = estimate_tokens(request, &tools);
        largest = largest.max(size);
        assert!(size < WINDOW, "a request of {size} tokens");
    }
    let requests = mock.requests();
    let chats: Vec<&RecordedRequest> = requests.iter().filter(|r| !is_summary_request(r)).collect();
    assert_eq!(chats.len(), 400);
    // What went over the wire is what the builder made, in order, and it is small too.
    for (recorded, built) in chats.iter().zip(&session.sent) {
        let messages = recorded.body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), built.len());
        assert!(
            recorded.raw_body.len() / 4 < WINDOW,
            "{} bytes on the wire",
            recorded.raw_body.len()
        );
    }
    let summaries = requests.iter().filter(|r| is_summary_request(r)).count();
    assert!(summaries >= 1);
    for request in requests.iter().filter(|r| is_summary_request(r)) {
        assert!(
            request.raw_body.len() / 4 < WINDOW,
            "summary request of {} bytes",
            request.raw_body.len()
        );
    }
    let kinds: Vec<CompactionKind> = session.reload().1.into_iter().map(|m| m.kind).collect();
    assert!(!kinds.is_empty());
    // The stored history kept everything.
    assert_eq!(session.history.len(), 200 * 4);
    assert_eq!(session.reload().0, session.history);
    let last = session.sent.last().unwrap();
    assert!(last.iter().any(|m| m.text().starts_with(SUMMARY_HEADER)));
    println!(
        "200 turns: {} compactions, {summaries} summary calls, largest request {largest} tokens (window {WINDOW}); history {} tokens",
        session.compactions,
        estimate_tokens(&session.history, &tools)
    );
}

#[tokio::test]
async fn context_the_answers_room_stays_free_in_every_request() {
    let mock = MockLlm::start().await;
    script(&mock);
    let mut session = Session::new(&mock);
    // max_tokens 600 of a 2,000-token window: servers count the answer against the window.
    session.policy = Policy::default().with_reserve_output(Some(600));
    run_turns(&mut session, 0, 60).await;
    assert!(session.compactions > 0);
    for request in &session.sent {
        let size = estimate_tokens(request, &tools());
        assert!(
            size + 600 < WINDOW,
            "a request of {size} tokens leaves no room for 600"
        );
    }
}

#[tokio::test]
async fn context_a_reload_after_a_compaction_sends_the_same_request() {
    let mock = MockLlm::start().await;
    script(&mock);
    let mut session = Session::new(&mock);
    run_turns(&mut session, 0, 30).await;
    assert!(session.compactions > 0);
    session.append(Message::user("next", "one more question"));
    let before = session.prepare(false);
    assert!(before.plan.is_none());

    let (history, marker) = session.reload();
    assert_eq!(history, session.history);
    assert_eq!(marker, session.marker);
    let after = prepare(
        system(),
        &history,
        marker.as_ref(),
        &tools(),
        WINDOW,
        &session.policy,
        false,
    );
    assert_eq!(after.messages, before.messages);
    assert_eq!(after.used, before.used);
    // Byte for byte, as the provider would serialise it.
    assert_eq!(
        serde_json::to_string(&after.messages).unwrap(),
        serde_json::to_string(&before.messages).unwrap()
    );
}

#[tokio::test]
async fn context_too_long_from_the_server_is_recovered_with_one_compaction_and_one_retry() {
    let mock = MockLlm::start().await;
    let mut session = Session::new(&mock);
    // A history that our estimate thinks fits, but the server's tokenizer does not.
    for turn in 0..12 {
        session.append(Message::user(
            format!("u{turn}"),
            format!("question {turn}"),
        ));
        let mut answer =
            Message::assistant(Some(format!("answer {turn}: {}", "y".repeat(300))), vec![]);
        answer.usage = None;
        session.append(answer);
    }
    session.append(Message::user("last", "and now?"));
    mock.push(MockResponse::error(
        400,
        r#"{"error":{"message":"This model's maximum context length is 2000 tokens. However, your messages resulted in 2400 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
    ));
    mock.push_sse(openai::text_answer(
        &["## Goal\nanswer questions"],
        (300, 10),
    ));
    mock.push_sse(openai::text_answer(&["recovered"], (500, 3)));

    let answer = session.model_call().await.unwrap();
    assert_eq!(answer.text(), "recovered");
    assert_eq!(session.compactions, 1);
    let requests = mock.requests();
    assert_eq!(requests.len(), 3);
    assert!(is_summary_request(&requests[1]));
    assert!(requests[2].raw_body.len() < requests[0].raw_body.len() * 3 / 4);
    let count = |r: &RecordedRequest| r.body["messages"].as_array().unwrap().len();
    assert!(count(&requests[2]) < count(&requests[0]));
    assert_eq!(
        session.marker.as_ref().unwrap().kind,
        CompactionKind::Summary
    );

    // Too long again after the compaction: the call fails, it does not loop.
    let mock = MockLlm::start().await;
    let mut again = Session::new(&mock);
    again.history = session.history.clone();
    let too_long = r#"{"error":{"message":"too many tokens","code":"context_length_exceeded"}}"#;
    mock.push(MockResponse::error(400, too_long));
    mock.push_sse(openai::text_answer(&["a summary"], (300, 10)));
    mock.push(MockResponse::error(400, too_long));
    let err = again.model_call().await.unwrap_err();
    assert!(matches!(err, ProviderError::ContextTooLong(_)), "{err:?}");
    assert_eq!(again.compactions, 1);
    assert_eq!(mock.requests().len(), 3);
}

#[tokio::test]
async fn context_a_failed_summary_call_drops_the_oldest_turns_and_the_session_goes_on() {
    let mock = MockLlm::start().await;
    let mut session = Session::new(&mock);
    for turn in 0..20 {
        session.append(Message::user(
            format!("u{turn}"),
            format!("question {turn}"),
        ));
        session.append(Message::assistant(
            Some(format!("answer {turn}: {}", "z".repeat(300))),
            vec![],
        ));
    }
    session.append(Message::user("last", "and now?"));
    let untouched = session.history.clone();
    let prepared = session.prepare(false);
    let plan = prepared.plan.expect("over the threshold");
    assert!(plan.summarize);

    // The summary call itself is "prompt too long": not retried, not compacted again.
    mock.push(MockResponse::error(
        400,
        r#"{"error":{"message":"prompt is too long: 2300 tokens > 2000 maximum","type":"invalid_request_error"}}"#,
    ));
    let compacted = session.compact(plan).await;
    assert!(matches!(
        compacted.error,
        Some(CompactionError::Provider(ProviderError::ContextTooLong(_)))
    ));
    assert_eq!(mock.requests().len(), 1);
    assert_eq!(
        session.history, untouched,
        "the history is the caller's and stays whole"
    );
    let marker = compacted.marker;
    assert_eq!(marker.kind, CompactionKind::Dropped);
    assert!(marker.note.as_deref().unwrap().contains("too long"));

    mock.push_sse(openai::text_answer(&["still here"], (400, 3)));
    let answer = session.model_call().await.unwrap();
    assert_eq!(answer.text(), "still here");
    let sent = session.sent.last().unwrap();
    assert!(estimate_tokens(sent, &tools()) < WINDOW * 85 / 100);
    assert_eq!(sent[1], untouched[0]);
    assert!(
        sent.iter()
            .any(|m| m.text().contains("no summary of it could be made"))
    );
    assert_eq!(sent.last().unwrap().text(), "and now?");

    // A summary that comes back empty is a failure too.
    let mock = MockLlm::start().await;
    let mut empty = Session::new(&mock);
    empty.history = untouched.clone();
    mock.push_sse(openai::text_answer(&["  "], (10, 0)));
    let plan = empty.prepare(true).plan.unwrap();
    let compacted = empty.compact(plan).await;
    assert!(matches!(
        compacted.error,
        Some(CompactionError::EmptySummary)
    ));
}

#[tokio::test]
async fn context_a_report_that_arrives_while_the_summary_is_made_is_sent_once_after_it() {
    let mock = MockLlm::start().await;
    let (live, stream) = MockResponse::live();
    mock.push(live);
    let mut session = Session::new(&mock);
    for turn in 0..20 {
        session.append(Message::user(
            format!("u{turn}"),
            format!("question {turn}"),
        ));
        session.append(Message::assistant(
            Some(format!("answer {turn}: {}", "w".repeat(300))),
            vec![],
        ));
    }
    let plan = session.prepare(true).plan.unwrap();
    let children = vec![RunningChild {
        task_id: "task-7".into(),
        title: "Docs".into(),
        task: "write the README section".into(),
    }];
    // The summary streams while a child's report reaches the run's inbox (the run loop
    // holds reports at its safe points; compaction happens before a model call).
    let inbox: Arc<Mutex<Vec<Message>>> = Arc::default();
    let report = Message::user(
        "subagent:task-7",
        "[Background tool result]\nTask ID: task-7\n\nREADME written",
    );
    let compacting = {
        let provider = session.provider.clone();
        let settings = session.settings.clone();
        let history = session.history.clone();
        tokio::spawn(async move {
            let sink = |_: ProviderEvent| {};
            compaction::compact(
                provider.as_ref(),
                &settings,
                &history,
                None,
                plan,
                &children,
                WINDOW,
                &sink,
            )
            .await
        })
    };
    let request = mock.wait_for_requests(1).await;
    let handoff = request[0].body["messages"][1]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        handoff.contains("\"Docs\" (task id task-7): write the README section"),
        "{handoff}"
    );
    inbox.lock().unwrap().push(report.clone());
    for chunk in [
        openai::data(&openai::role()),
        openai::data(&openai::text("## Goal\nquestions; Docs child running")),
        openai::data(&openai::finish("stop")),
        "data: [DONE]\n\n".to_string(),
    ] {
        stream.send(chunk);
    }
    let compacted = tokio::time::timeout(WAIT, compacting)
        .await
        .unwrap()
        .unwrap();
    assert!(compacted.error.is_none());
    session
        .lines
        .push(serde_json::to_string(&json!({"compaction": compacted.marker})).unwrap());
    session.marker = Some(compacted.marker);
    // At the safe point after the compaction, the inbox is drained into the history.
    for message in inbox.lock().unwrap().drain(..) {
        session.append(message);
    }
    let prepared = session.prepare(false);
    let reports: Vec<usize> = prepared
        .messages
        .iter()
        .enumerate()
        .filter(|(_, m)| m.id.as_deref() == Some("subagent:task-7"))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(reports, vec![prepared.messages.len() - 1], "once, and last");
    let summary = prepared
        .messages
        .iter()
        .position(|m| m.text().starts_with(SUMMARY_HEADER))
        .unwrap();
    assert!(summary < reports[0]);
    assert_eq!(check_message_order(&prepared.messages.to_vec()), Ok(()));
    // And the same after a reload.
    let (history, marker) = session.reload();
    let reloaded = prepare(
        system(),
        &history,
        marker.as_ref(),
        &tools(),
        WINDOW,
        &session.policy,
        false,
    );
    assert_eq!(reloaded.messages, prepared.messages);
}

// ---------------------------------------------------------------- through the runtime
//
// The tests above check the builder's pieces one by one. These drive the real run loop:
// a service, its sessions and the standard tools (a real `read_file` on real files), the
// scripted model server over HTTP, and the history on disk.

mod runtime {
    use std::path::PathBuf;
    use std::time::Duration;

    use bumblehive::config::{Config, ContextConfig};
    use bumblehive::controller::{SessionController, Subscription};
    use bumblehive::protocol::{Event, Snapshot, kinds};
    use bumblehive::service::{RuntimeService, ServiceOptions};

    use super::*;
    use crate::providers_openai::{of_kind, run_events, run_events_within};

    /// The next `context.compacted` event of session `id` (within the seed's wait).
    async fn compacted(events: &mut Subscription, id: &str) -> Value {
        tokio::time::timeout(WAIT, async {
            loop {
                let event = events.next_event().await.unwrap();
                let value = serde_json::to_value(&event).unwrap();
                if value["kind"] == kinds::CONTEXT_COMPACTED && value["session_id"] == id {
                    return value;
                }
            }
        })
        .await
        .expect("compacted")
    }

    /// A whole run of 200 turns can take a while on a loaded machine.
    const TURN_WAIT: Duration = Duration::from_secs(30);

    pub struct Fx {
        pub service: RuntimeService,
        pub dir: tempfile::TempDir,
    }

    impl Fx {
        pub fn new(mock: &MockLlm, window: Option<u32>, compact_at: f64) -> Fx {
            let dir = tempfile::tempdir().unwrap();
            Fx::at(dir, mock, window, compact_at)
        }

        pub fn at(
            dir: tempfile::TempDir,
            mock: &MockLlm,
            window: Option<u32>,
            compact_at: f64,
        ) -> Fx {
            Fx::with_tools(dir, mock, window, compact_at, None)
        }

        /// With only `read_file`: the standard tools' schemas alone take about a
        /// thousand tokens, too much of a 2,000-token window to test compaction in.
        pub fn reading(mock: &MockLlm, window: u32) -> Fx {
            let mut tools = bumblehive::tools::ToolRegistry::default();
            tools.register(Arc::new(bumblehive::tools::ReadFile));
            Fx::with_tools(
                tempfile::tempdir().unwrap(),
                mock,
                Some(window),
                0.85,
                Some(tools),
            )
        }

        pub fn with_tools(
            dir: tempfile::TempDir,
            mock: &MockLlm,
            window: Option<u32>,
            compact_at: f64,
            tools: Option<bumblehive::tools::ToolRegistry>,
        ) -> Fx {
            let mut provider = openai_config(mock);
            provider.context_window = window;
            let config = Config {
                provider,
                context: ContextConfig { compact_at },
                ..Config::default()
            };
            let service = RuntimeService::new(ServiceOptions {
                data_dir: dir.path().join("data"),
                config_path: Some(dir.path().join("config").join("config.json")),
                config: Some(config),
                provider_factory: Arc::new(provider_from_config),
                tools,
            })
            .unwrap();
            std::fs::create_dir_all(dir.path().join("ws")).unwrap();
            Fx { service, dir }
        }

        pub fn workspace(&self) -> PathBuf {
            self.dir.path().join("ws")
        }

        pub fn session(&self) -> (Arc<SessionController>, Subscription) {
            let info = self
                .service
                .create_session(self.workspace().to_str().unwrap(), None)
                .unwrap();
            let controller = self.service.controller(&info.session_id).unwrap();
            let (events, _) = controller.subscribe();
            (controller, events)
        }
    }

    pub fn files(fx: &Fx) {
        let line = "the quick brown fox jumps over the lazy dog 0123456789\n";
        std::fs::write(fx.workspace().join("a.txt"), line.repeat(8)).unwrap();
        std::fs::write(fx.workspace().join("big.txt"), line.repeat(60)).unwrap();
    }

    pub async fn turn(
        controller: &SessionController,
        events: &mut Subscription,
        n: usize,
    ) -> Vec<Value> {
        controller
            .submit(format!("question {n}: what is in the file?"), None)
            .unwrap();
        let (seen, end) = run_events_within(events, controller.session_id(), TURN_WAIT).await;
        assert!(matches!(end, Event::Result { .. }), "turn {n}: {end:?}");
        seen
    }

    fn chats(mock: &MockLlm) -> Vec<RecordedRequest> {
        mock.requests()
            .into_iter()
            .filter(|r| !is_summary_request(r))
            .collect()
    }

    /// SPEC §2's shape on the wire: one system message first, the first question next,
    /// each assistant's tool calls answered right after it, in order.
    fn assert_wire_shape(messages: &[Value], first: &str) {
        assert_eq!(messages[0]["role"], "system");
        assert_eq!(messages.iter().filter(|m| m["role"] == "system").count(), 1);
        assert_eq!(messages[1]["content"], first);
        let mut i = 1;
        while i < messages.len() {
            let calls = messages[i]["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for (k, call) in calls.iter().enumerate() {
                let result = &messages[i + 1 + k];
                assert_eq!(result["role"], "tool", "a call left unanswered at {i}");
                assert_eq!(result["tool_call_id"], call["id"]);
            }
            if calls.is_empty() {
                assert_ne!(messages[i]["role"], "tool", "a stray tool result at {i}");
            }
            i += 1 + calls.len();
        }
    }

    fn snapshot(controller: &SessionController) -> Snapshot {
        controller.snapshot()
    }

    #[tokio::test]
    async fn context_runtime_200_turns_stay_under_a_2000_token_window() {
        let mock = MockLlm::start().await;
        script(&mock);
        let fx = Fx::reading(&mock, 2000);
        files(&fx);
        let (controller, mut events) = fx.session();
        let mut compacted_events = 0;
        let mut meters = 0;
        for n in 0..200 {
            let seen = turn(&controller, &mut events, n).await;
            compacted_events += of_kind(&seen, kinds::CONTEXT_COMPACTED).len();
            meters += of_kind(&seen, kinds::CONTEXT_USAGE).len();
        }
        let id = controller.session_id().to_string();
        let stored = fx.service.get_session(&id).unwrap();
        // The stored history keeps everything, in SPEC §2's shape; markers are not messages.
        assert_eq!(stored.messages.len(), 200 * 4);
        assert_message_order(&stored.messages);
        assert!(
            stored.compactions.len() >= 10,
            "{} compactions",
            stored.compactions.len()
        );
        assert_eq!(stored.compactions.len(), compacted_events);
        assert!(meters >= 200);
        let chats = chats(&mock);
        assert_eq!(chats.len(), 400);
        let mut largest = 0;
        for request in &chats {
            let messages = request.body["messages"].as_array().unwrap();
            assert_wire_shape(messages, "question 0: what is in the file?");
            let size = request.raw_body.len() / 4;
            largest = largest.max(size);
            assert!(size < 2000, "a request of {size} tokens went out");
        }
        for request in mock.requests().iter().filter(|r| is_summary_request(r)) {
            assert!(request.raw_body.len() / 4 < 2000, "summary request too big");
        }
        let last = chats.last().unwrap().body["messages"].to_string();
        assert!(last.contains(SUMMARY_HEADER));
        let meter = snapshot(&controller).context.expect("a context meter");
        assert_eq!(meter.window, 2000);
        assert!(meter.percent < 100);
        let n = stored.compactions.len();
        let before: usize = stored
            .compactions
            .iter()
            .map(|c| c.tokens_before)
            .sum::<usize>()
            / n;
        let after: usize = stored
            .compactions
            .iter()
            .map(|c| c.tokens_after)
            .sum::<usize>()
            / n;
        let kinds: Vec<CompactionKind> = stored.compactions.iter().map(|c| c.kind).collect();
        println!(
            "200 turns through the runtime: {n} compactions ({} summaries), request {before} → {after} tokens on average at a compaction, largest request sent {largest} tokens of 2000; the whole history would be {} tokens; meter {}",
            kinds
                .iter()
                .filter(|k| **k == CompactionKind::Summary)
                .count(),
            estimate_tokens(&stored.messages, &[]),
            meter.label()
        );
    }

    #[tokio::test]
    async fn context_runtime_a_restart_after_a_compaction_sends_the_same_request() {
        let mock = MockLlm::start().await;
        script(&mock);
        let fx = Fx::reading(&mock, 2000);
        files(&fx);
        let (controller, mut events) = fx.session();
        for n in 0..30 {
            turn(&controller, &mut events, n).await;
        }
        let id = controller.session_id().to_string();
        assert!(!fx.service.get_session(&id).unwrap().compactions.is_empty());
        drop(events);
        drop(controller);
        tokio::time::timeout(WAIT, fx.service.shutdown())
            .await
            .unwrap();
        let Fx { service, dir } = fx;
        drop(service);

        // The copy before: what the running service sends next, from its memory...
        let copy = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("cp")
            .arg("-a")
            .arg(dir.path().join("data"))
            .arg(copy.path())
            .status()
            .unwrap();
        assert!(status.success());
        let reading = || {
            let mut tools = bumblehive::tools::ToolRegistry::default();
            tools.register(Arc::new(bumblehive::tools::ReadFile));
            Some(tools)
        };
        let before = Fx::with_tools(dir, &mock, Some(2000), 0.85, reading());
        let controller = before.service.controller(&id).unwrap();
        let (mut events, _) = controller.subscribe();
        let count = mock.requests().len();
        // ... is one turn's first request; then the same turn from a fresh load of the copy.
        turn(&controller, &mut events, 30).await;
        let first = mock.requests()[count].body["messages"].clone();
        let after = Fx::with_tools(copy, &mock, Some(2000), 0.85, reading());
        // The copy's sessions name the original workspace: same environment, same prompt.
        let controller = after.service.controller(&id).unwrap();
        let (mut events, _) = controller.subscribe();
        let count = mock.requests().len();
        turn(&controller, &mut events, 30).await;
        let second = mock.requests()[count].body["messages"].clone();
        assert_eq!(first, second);
        // Built from the marker: fewer messages than the history holds.
        let stored = after.service.get_session(&id).unwrap().messages.len();
        assert!(first.as_array().unwrap().len() < stored, "not compacted");
    }

    /// A history of long answers made with a large window, then the window set to
    /// `window` (as when the person picks a smaller model): the next run meets it.
    async fn long_history(
        mock: &MockLlm,
        fx: &Fx,
        turns: usize,
        window: u32,
    ) -> (Arc<SessionController>, Subscription) {
        fx.service
            .update_config(&json!({"provider": {"context_window": 100_000}}))
            .unwrap();
        let (controller, mut events) = fx.session();
        for n in 0..turns {
            mock.push_sse(openai::text_answer(
                &[&format!("answer {n}: {}", "y ".repeat(300))],
                (0, 0),
            ));
            controller.submit(format!("note {n}"), None).unwrap();
            let (_, end) = run_events(&mut events, controller.session_id()).await;
            assert!(matches!(end, Event::Result { .. }), "{end:?}");
        }
        fx.service
            .update_config(&json!({"provider": {"context_window": window}}))
            .unwrap();
        (controller, events)
    }

    #[tokio::test]
    async fn context_runtime_too_long_from_the_server_compacts_once_and_retries_once() {
        let mock = MockLlm::start().await;
        let fx = Fx::reading(&mock, 4000);
        let (controller, mut events) = long_history(&mock, &fx, 8, 4000).await;
        let too_long = r#"{"error":{"message":"This model's maximum context length is 4000 tokens. However, your messages resulted in 4400 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
        mock.push(MockResponse::error(400, too_long));
        mock.push_sse(openai::text_answer(&["## Goal\nnotes"], (300, 10)));
        mock.push_sse(openai::text_answer(&["recovered"], (500, 3)));
        let count = mock.requests().len();
        controller.submit("and now?".into(), None).unwrap();
        let (seen, end) = run_events(&mut events, controller.session_id()).await;
        assert_eq!(
            end,
            Event::Result {
                session_id: controller.session_id().to_string(),
                content: "recovered".into()
            }
        );
        assert_eq!(of_kind(&seen, kinds::CONTEXT_COMPACTED).len(), 1);
        let requests = &mock.requests()[count..];
        assert_eq!(requests.len(), 3);
        assert!(is_summary_request(&requests[1]));
        assert!(requests[2].raw_body.len() < requests[0].raw_body.len());

        // Too long again right after the compaction: the run fails, it does not loop,
        // and the session takes the next message.
        mock.push(MockResponse::error(400, too_long));
        mock.push_sse(openai::text_answer(&["## Goal\nnotes, again"], (300, 10)));
        mock.push(MockResponse::error(400, too_long));
        let count = mock.requests().len();
        controller.submit("once more".into(), None).unwrap();
        let (_, end) = run_events(&mut events, controller.session_id()).await;
        let Event::Error { message, .. } = end else {
            panic!("{end:?}")
        };
        assert!(message.contains("too long"), "{message}");
        // One compaction and one retry: three requests, then the error.
        assert_eq!(mock.requests().len() - count, 3);
        mock.push_sse(openai::text_answer(&["fine again"], (100, 3)));
        controller.submit("and now?".into(), None).unwrap();
        let (_, end) = run_events(&mut events, controller.session_id()).await;
        assert!(matches!(end, Event::Result { .. }), "{end:?}");
    }

    #[tokio::test]
    async fn context_runtime_a_failed_summary_call_drops_the_oldest_turns_and_goes_on() {
        let mock = MockLlm::start().await;
        let fx = Fx::reading(&mock, 2000);
        let (controller, mut events) = long_history(&mock, &fx, 12, 2000).await;
        // The next request is over the threshold: the summary call comes first and fails.
        mock.push(MockResponse::error(
            400,
            r#"{"error":{"message":"prompt is too long: 2300 tokens > 2000 maximum","type":"invalid_request_error"}}"#,
        ));
        mock.push_sse(openai::text_answer(&["still here"], (400, 3)));
        let count = mock.requests().len();
        controller.submit("and now?".into(), None).unwrap();
        let (_, end) = run_events(&mut events, controller.session_id()).await;
        assert!(
            matches!(&end, Event::Result { content, .. } if content == "still here"),
            "{end:?}"
        );
        let requests = &mock.requests()[count..];
        assert_eq!(requests.len(), 2);
        assert!(is_summary_request(&requests[0]));
        let sent = requests[1].body["messages"].to_string();
        assert!(sent.contains("no summary of it could be made"), "{sent}");
        let stored = fx.service.get_session(controller.session_id()).unwrap();
        assert_eq!(
            stored.compactions.last().unwrap().kind,
            CompactionKind::Dropped
        );
        assert_eq!(stored.messages[0].text(), "note 0");
        assert_message_order(&stored.messages);
    }

    #[tokio::test]
    async fn context_runtime_a_report_arriving_during_the_summary_is_delivered_once_after_it() {
        let mock = MockLlm::start().await;
        let fx = Fx::new(&mock, Some(8000), 0.85);
        let (controller, mut events) = fx.session();
        let id = controller.session_id().to_string();
        // The parent delegates; the child's answer and the summary are held by the test.
        let (child_live, child_stream) = MockResponse::live();
        let (summary_live, summary_stream) = MockResponse::live();
        let held = Arc::new(Mutex::new((Some(child_live), Some(summary_live))));
        {
            let held = held.clone();
            mock.respond_with(move |request| {
                let system = request.body["messages"][0]["content"]
                    .as_str()
                    .unwrap_or("");
                if is_summary_request(request) {
                    return held.lock().unwrap().1.take().expect("one summary");
                }
                if system.starts_with("You are a Bumblehive sub-agent") {
                    return held.lock().unwrap().0.take().expect("one child request");
                }
                let messages = request.body["messages"].as_array().unwrap();
                let last = messages.last().unwrap();
                if last["role"] == "user" && last["content"] == "delegate the docs" {
                    return MockResponse::sse(openai::tool_answer(
                        &[(
                            "call-docs",
                            "sub_agent",
                            json!({"title": "Docs", "task": "write the README section"}),
                        )],
                        (100, 10),
                    ));
                }
                MockResponse::sse(openai::text_answer(&["noted"], (100, 3)))
            });
        }
        controller.submit("delegate the docs".into(), None).unwrap();
        let (_, end) = run_events(&mut events, &id).await;
        assert!(matches!(end, Event::Result { .. }), "{end:?}");
        // The child is waiting on its model; the person compacts the idle parent.
        mock.wait_for_requests(3).await;
        controller.compact().unwrap();
        let requests = mock.wait_for_requests(4).await;
        let handoff = requests
            .iter()
            .find(|r| is_summary_request(r))
            .expect("the summary request")
            .body["messages"][1]["content"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(handoff.contains("\"Docs\""), "{handoff}");
        assert!(handoff.contains("write the README section"), "{handoff}");
        // The child finishes while the summary is still being written.
        for chunk in [
            openai::data(&openai::role()),
            openai::data(&openai::text("README written")),
            openai::data(&openai::finish("stop")),
            "data: [DONE]\n\n".to_string(),
        ] {
            child_stream.send(chunk);
        }
        let report_steered = tokio::time::timeout(WAIT, async {
            loop {
                let event = events.next_event().await.unwrap();
                if let Event::MessageStatus {
                    session_id,
                    message_id,
                    status,
                } = &event
                {
                    if session_id == &id && message_id.starts_with("subagent:") {
                        return *status;
                    }
                }
            }
        })
        .await
        .expect("the report reached the parent");
        assert_eq!(report_steered, bumblehive::protocol::MessageStatus::Steered);
        for chunk in [
            openai::data(&openai::role()),
            openai::data(&openai::text("## Goal\nDocs child running")),
            openai::data(&openai::finish("stop")),
            "data: [DONE]\n\n".to_string(),
        ] {
            summary_stream.send(chunk);
        }
        let (seen, end) = run_events(&mut events, &id).await;
        assert!(
            matches!(&end, Event::Result { content, .. } if content == "noted"),
            "{end:?}"
        );
        assert_eq!(of_kind(&seen, kinds::CONTEXT_COMPACTED).len(), 1);
        let stored = fx.service.get_session(&id).unwrap();
        let reports: Vec<usize> = stored
            .messages
            .iter()
            .enumerate()
            .filter(|(_, m)| m.id.as_deref().is_some_and(|i| i.starts_with("subagent:")))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(reports.len(), 1, "the report is delivered once");
        let marker = stored.compactions.last().unwrap();
        assert!(
            reports[0] >= marker.at,
            "the report comes after the compaction"
        );
        assert_message_order(&stored.messages);
        // The request after the compaction: the summary, then the report, once, at the end.
        let last = mock.requests().last().unwrap().body["messages"].clone();
        let messages = last.as_array().unwrap();
        assert_wire_shape(messages, "delegate the docs");
        let text = |m: &Value| m["content"].as_str().unwrap_or("").to_string();
        let summary = messages
            .iter()
            .position(|m| text(m).starts_with(SUMMARY_HEADER));
        let report = messages
            .iter()
            .position(|m| text(m).starts_with("[Background tool result]"));
        assert!(summary.unwrap() < report.unwrap());
        assert_eq!(report.unwrap(), messages.len() - 1);
        assert_eq!(
            messages
                .iter()
                .filter(|m| text(m).starts_with("[Background tool result]"))
                .count(),
            1
        );
    }

    /// `get_session` by its tail (`last`) and by earlier pages (`before` + `last`), through
    /// the command table: each page is the right slice, `first_index`/`total` place it in
    /// the whole history, and a compaction's `first_kept` keeps counting from the start.
    #[tokio::test]
    async fn context_runtime_get_session_pages_keep_whole_history_indexes() {
        let mock = MockLlm::start().await;
        let fx = Fx::new(&mock, Some(8000), 0.85);
        let (controller, mut events) = long_history(&mock, &fx, 6, 8000).await;
        let id = controller.session_id().to_string();
        mock.push_sse(openai::text_answer(&["## Goal\nnotes"], (100, 10)));
        controller.compact().unwrap();
        compacted(&mut events, &id).await;
        let page = |args: Value| {
            let service = fx.service.clone();
            async move {
                bumblehive::commands::dispatch(&service, "get_session", args)
                    .await
                    .unwrap()
            }
        };
        let whole = page(json!({"session_id": id})).await;
        let all = whole["messages"].as_array().unwrap().clone();
        assert_eq!(all.len(), 12);
        assert_eq!(
            (whole["first_index"].as_u64(), whole["total"].as_u64()),
            (Some(0), Some(12))
        );
        let first_kept = whole["compactions"][0]["first_kept"].as_u64().unwrap();
        assert!(first_kept > 0 && first_kept < 12, "first_kept {first_kept}");

        let tail = page(json!({"session_id": id, "last": 5})).await;
        assert_eq!(tail["messages"].as_array().unwrap()[..], all[7..]);
        assert_eq!(
            (tail["first_index"].as_u64(), tail["total"].as_u64()),
            (Some(7), Some(12))
        );
        // The marker's index still counts from the start of the whole history.
        assert_eq!(tail["compactions"], whole["compactions"]);

        let earlier = page(json!({"session_id": id, "before": 7, "last": 5})).await;
        assert_eq!(earlier["messages"].as_array().unwrap()[..], all[2..7]);
        assert_eq!(earlier["first_index"], 2);
        let first = page(json!({"session_id": id, "before": 2, "last": 5})).await;
        assert_eq!(first["messages"].as_array().unwrap()[..], all[..2]);
        assert_eq!(first["first_index"], 0);
        // More than there is, or `before` past the end: bounded, not an error.
        let more = page(json!({"session_id": id, "last": 500, "before": 99})).await;
        assert_eq!(more["messages"].as_array().unwrap().len(), 12);
        assert_eq!(more["first_index"], 0);
        let none = page(json!({"session_id": id, "last": 0})).await;
        assert!(none["messages"].as_array().unwrap().is_empty());
        assert_eq!(
            (none["first_index"].as_u64(), none["total"].as_u64()),
            (Some(12), Some(12))
        );
        let err = bumblehive::commands::dispatch(
            &fx.service,
            "get_session",
            json!({"session_id": id, "last": -1}),
        )
        .await
        .unwrap_err();
        assert_eq!(err.code(), "invalid_argument");
    }

    #[tokio::test]
    async fn context_runtime_compact_on_a_paused_session_keeps_it_paused() {
        let mock = MockLlm::start().await;
        let fx = Fx::new(&mock, Some(8000), 0.85);
        let (controller, mut events) = long_history(&mock, &fx, 3, 8000).await;
        let id = controller.session_id().to_string();
        let (live, _stream) = MockResponse::live();
        mock.push(live);
        controller.submit("a slow one".into(), None).unwrap();
        mock.wait_for_requests(4).await;
        controller.cancel().await;
        assert!(controller.is_paused());
        mock.push_sse(openai::text_answer(&["## Goal\nnotes"], (100, 10)));
        controller.compact().unwrap();
        let compacted = compacted(&mut events, &id).await;
        assert_eq!(compacted["data"]["compaction"]["kind"], "summary");
        tokio::time::timeout(WAIT, async {
            while !controller.is_paused() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("paused again");
        let snapshot = controller.snapshot();
        assert!(snapshot.paused && !snapshot.running);
        assert!(snapshot.compacted.is_some());
        assert_eq!(mock.requests().len(), 5, "only the summary call");
    }

    #[tokio::test]
    async fn context_runtime_instructions_reach_the_prompt_of_the_session_and_its_child() {
        let mock = MockLlm::start().await;
        let fx = Fx::new(&mock, Some(8000), 0.85);
        std::fs::write(fx.workspace().join("AGENTS.md"), "Always answer in haiku.").unwrap();
        let user = fx.dir.path().join("config");
        std::fs::create_dir_all(&user).unwrap();
        std::fs::write(user.join("AGENTS.md"), "The person is called Ada.").unwrap();
        mock.push_sse(openai::tool_answer(
            &[(
                "call-1",
                "sub_agent",
                json!({"title": "Helper", "task": "say hi"}),
            )],
            (100, 5),
        ));
        let (controller, mut events) = fx.session();
        mock.respond_with(|_| MockResponse::sse(openai::text_answer(&["ok"], (100, 2))));
        controller.submit("start".into(), None).unwrap();
        let (_, end) = run_events(&mut events, controller.session_id()).await;
        assert!(matches!(end, Event::Result { .. }), "{end:?}");
        let requests = mock.wait_for_requests(3).await;
        let systems: Vec<String> = requests
            .iter()
            .map(|r| {
                r.body["messages"][0]["content"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        let is_child = |s: &String| s.starts_with("You are a Bumblehive sub-agent");
        let child = systems
            .iter()
            .find(|s| is_child(s))
            .expect("the child's request");
        let parent = &systems[0];
        println!(
            "the standard tools and this prompt: {} tokens in the first request",
            requests[0].raw_body.len() / 4
        );
        for prompt in [parent, child] {
            assert!(prompt.contains("Always answer in haiku."), "{prompt}");
            assert!(prompt.contains("The person is called Ada."), "{prompt}");
            assert!(prompt.contains("Date: "), "{prompt}");
            assert!(prompt.contains("not in a git repository"), "{prompt}");
        }
        assert!(child.contains("Your title: Helper"), "{child}");
        // The prefix is stable: the parent's two requests have the same system message.
        let parents: Vec<&String> = systems.iter().filter(|s| !is_child(s)).collect();
        assert!(parents.len() >= 2);
        assert!(parents.iter().all(|s| *s == parents[0]));
        let files = controller.snapshot().instructions;
        let names: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(files.len(), 2, "{names:?}");
        assert!(names[0].ends_with("config/AGENTS.md") && names[1].ends_with("ws/AGENTS.md"));
    }

    /// The real-model tier (scripts/real-model-tier.sh): llama-server's own window from
    /// `/props`, turns with the real model until the history passes the threshold, one
    /// compaction written by the real model, and the session answering after it.
    /// Skipped without BUMBLEHIVE_REAL_MODEL_URL.
    #[tokio::test]
    async fn real_model_context_one_compaction_through_the_runtime() {
        let Ok(url) = std::env::var("BUMBLEHIVE_REAL_MODEL_URL") else {
            println!(
                "skipped: BUMBLEHIVE_REAL_MODEL_URL is not set (scripts/real-model-tier.sh sets it)"
            );
            return;
        };
        let mut provider = ProviderConfig {
            kind: "openai".into(),
            base_url: url,
            model: std::env::var("BUMBLEHIVE_REAL_MODEL_NAME")
                .unwrap_or_else(|_| "qwen2.5-coder-0.5b-instruct".into()),
            temperature: Some(0.0),
            max_tokens: Some(64),
            ..ProviderConfig::default()
        };
        provider
            .extra
            .insert("idle_timeout_ms".into(), json!(120_000));
        provider.extra.insert("max_retries".into(), json!(2));
        let window = window::resolve(&provider).await;
        assert_eq!(window.source, WindowSource::Server, "{window:?}");
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ws")).unwrap();
        // No tools: the model only talks. Compacting at 30 % of the real window keeps the
        // tier quick on two cores; the window is the server's.
        let service = RuntimeService::new(ServiceOptions {
            data_dir: dir.path().join("data"),
            config_path: Some(dir.path().join("config").join("config.json")),
            config: Some(Config {
                provider,
                context: ContextConfig { compact_at: 0.3 },
                ..Config::default()
            }),
            provider_factory: Arc::new(provider_from_config),
            tools: Some(bumblehive::tools::ToolRegistry::default()),
        })
        .unwrap();
        let info = service
            .create_session(dir.path().join("ws").to_str().unwrap(), None)
            .unwrap();
        let controller = service.controller(&info.session_id).unwrap();
        let (mut events, _) = controller.subscribe();
        let real_wait = Duration::from_secs(240);
        let mut compactions = Vec::new();
        for n in 0..12 {
            controller
                .submit(
                    format!("Note {n}: the build of module m{n} failed at step {n} because the linker ran out of memory on the small runner; we decided to pin the toolchain of m{n} to version 1.{n}, move its build to the large runner, and retry tomorrow morning. Reply with one short sentence."),
                    None,
                )
                .unwrap();
            let (seen, end) = run_events_within(&mut events, &info.session_id, real_wait).await;
            assert!(matches!(end, Event::Result { .. }), "turn {n}: {end:?}");
            compactions.extend(
                of_kind(&seen, kinds::CONTEXT_COMPACTED)
                    .into_iter()
                    .cloned(),
            );
            if !compactions.is_empty() {
                break;
            }
        }
        assert_eq!(compactions.len(), 1, "no compaction in 12 turns");
        let marker = &compactions[0]["data"]["compaction"];
        println!("real compaction: {marker:#}");
        assert_eq!(marker["kind"], "summary", "{marker}");
        assert!(!marker["summary"].as_str().unwrap_or("").trim().is_empty());
        let stored = service.get_session(&info.session_id).unwrap();
        assert_message_order(&stored.messages);
        for message in stored.messages.iter().filter(|m| m.role == Role::Assistant) {
            let usage = message.usage.expect("llama-server reports usage");
            assert!((usage.input_tokens as u32) < window.tokens, "{usage:?}");
        }
        let meter = controller.snapshot().context.expect("a meter");
        assert_eq!(meter.window, u64::from(window.tokens));
        println!("after the compaction: {}", meter.label());
    }

    /// One turn of a new session in `ws`; the window its meter then shows.
    async fn one_turn_window(service: &RuntimeService, ws: &std::path::Path) -> u64 {
        let info = service.create_session(ws.to_str().unwrap(), None).unwrap();
        let controller = service.controller(&info.session_id).unwrap();
        let (mut events, _) = controller.subscribe();
        controller.submit("hi".into(), None).unwrap();
        let (_, end) = run_events(&mut events, &info.session_id).await;
        assert!(matches!(end, Event::Result { .. }), "{end:?}");
        controller.snapshot().context.expect("a meter").window
    }

    /// A llama-server's window, asked at the first start, is remembered in the data dir:
    /// the next start uses it at once (here with the server's `/props` gone) instead of
    /// asking before its first request.
    #[tokio::test]
    async fn context_runtime_a_servers_window_is_remembered_for_the_next_start() {
        let props_up = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let up = props_up.clone();
        let app = Router::new()
            .route(
                "/props",
                get(move || {
                    let up = up.clone();
                    async move {
                        if up.load(std::sync::atomic::Ordering::SeqCst) {
                            Ok(Json(
                                json!({"default_generation_settings": {"n_ctx": 6144}}),
                            ))
                        } else {
                            Err(axum::http::StatusCode::NOT_FOUND)
                        }
                    }
                }),
            )
            .route(
                "/v1/chat/completions",
                post(|| async {
                    (
                        [("content-type", "text/event-stream")],
                        openai::text_answer(&["ok"], (10, 1)),
                    )
                }),
            );
        let (url, server) = serve(app).await;
        let dir = tempfile::tempdir().unwrap();
        let start_with = |dir: &std::path::Path, context_window: Option<u32>| {
            let mut provider = config_for(format!("{url}/v1"), "m");
            provider.api_key_env = None;
            provider.context_window = context_window;
            RuntimeService::new(ServiceOptions {
                data_dir: dir.join("data"),
                config_path: None,
                config: Some(Config {
                    provider,
                    ..Config::default()
                }),
                provider_factory: Arc::new(provider_from_config),
                tools: Some(bumblehive::tools::ToolRegistry::default()),
            })
            .unwrap()
        };
        let start = |dir: &std::path::Path| start_with(dir, None);
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        for round in 0..2 {
            let service = start(dir.path());
            assert_eq!(one_turn_window(&service, &ws).await, 6144, "round {round}");
            service.shutdown().await;
            // The server stops saying: only the remembered figure can give 6144 now.
            props_up.store(false, std::sync::atomic::Ordering::SeqCst);
        }
        assert!(dir.path().join("data").join("windows.json").exists());
        // UX review E10: a window set in Settings wins over the remembered figure of the
        // same server and model (it was ignored while `windows.json` had one).
        let service = start_with(dir.path(), Some(5000));
        assert_eq!(
            one_turn_window(&service, &ws).await,
            5000,
            "the window set in Settings was ignored"
        );
        // Changed in Settings while the app runs: the next turn takes the new figure,
        // and once cleared, what the server said (remembered) comes back.
        service
            .update_config(&json!({"provider": {"context_window": 7000}}))
            .unwrap();
        assert_eq!(
            one_turn_window(&service, &ws).await,
            7000,
            "a changed window"
        );
        service
            .update_config(&json!({"provider": {"context_window": null}}))
            .unwrap();
        assert_eq!(
            one_turn_window(&service, &ws).await,
            6144,
            "the window cleared in Settings"
        );
        service.shutdown().await;
        server.abort();
    }
}
