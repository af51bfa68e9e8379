//! The `openai` provider against a scripted HTTP server: stream shapes, exact request bodies, retries, errors, cancellation, usage, the seed's delegation flow end to end, and the chunk-to-event overhead.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bumblehive::config::{Config, ProviderConfig};
use bumblehive::controller::{SessionController, Subscription};
use bumblehive::protocol::{Event, Message, Role, ToolCall, Usage};
use bumblehive::provider::{
    ModelProvider, ModelRequest, ModelResponse, ModelSettings, ProviderError, ProviderEvent,
    ToolSpec,
};
use bumblehive::providers::provider_from_config;
use bumblehive::service::{RuntimeService, ServiceOptions};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::mock_llm::{self, MockLlm, MockResponse, openai};
use crate::support::{WAIT, assert_message_order, receive};

/// The variable the tests' provider configs name; set once, before any provider reads it.
pub const TEST_KEY_ENV: &str = "BUMBLEHIVE_TEST_PROVIDER_KEY";
pub const TEST_KEY: &str = "sk-test-3f9c2a1b7e";

pub fn set_test_key() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: set once with a name nothing else reads, before the providers that read it.
    ONCE.call_once(|| unsafe { std::env::set_var(TEST_KEY_ENV, TEST_KEY) });
}

/// A provider config for the mock: tiny backoffs so retries cost milliseconds.
pub fn provider_config(kind: &str, base_url: String, model: &str) -> ProviderConfig {
    set_test_key();
    let mut config = ProviderConfig {
        kind: kind.into(),
        base_url,
        model: model.into(),
        api_key_env: Some(TEST_KEY_ENV.into()),
        ..ProviderConfig::default()
    };
    for (key, value) in [
        ("max_retries", json!(3)),
        ("retry_base_delay_ms", json!(5)),
        ("retry_max_delay_ms", json!(20)),
        ("connect_timeout_ms", json!(2000)),
        ("idle_timeout_ms", json!(5000)),
    ] {
        config.extra.insert(key.into(), value);
    }
    config
}

pub fn openai_config(mock: &MockLlm) -> ProviderConfig {
    provider_config("openai", format!("{}/v1", mock.url()), "gpt-4o-mini")
}

/// Calls the provider directly, collecting what it sent to the sink.
pub async fn generate(
    provider: &Arc<dyn ModelProvider>,
    request: ModelRequest,
) -> (Result<ModelResponse, ProviderError>, Vec<ProviderEvent>) {
    let (result, mut events) = spawn_generate(provider.clone(), request);
    let result = tokio::time::timeout(WAIT, result)
        .await
        .expect("model call hung")
        .unwrap();
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(event);
    }
    (result, seen)
}

/// Starts a model call in a task; its sink events arrive on the channel as they happen.
pub fn spawn_generate(
    provider: Arc<dyn ModelProvider>,
    request: ModelRequest,
) -> (
    tokio::task::JoinHandle<Result<ModelResponse, ProviderError>>,
    mpsc::UnboundedReceiver<ProviderEvent>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let sink = move |event: ProviderEvent| {
            let _ = tx.send(event);
        };
        provider.generate(request, &sink).await
    });
    (task, rx)
}

pub fn deltas(events: &[ProviderEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::ContentDelta(text) => Some(text.clone()),
            _ => None,
        })
        .collect()
}

pub fn retries(events: &[ProviderEvent]) -> Vec<(u32, u64)> {
    events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::Retry {
                attempt, delay_ms, ..
            } => Some((*attempt, *delay_ms)),
            _ => None,
        })
        .collect()
}

pub fn read_file_spec() -> ToolSpec {
    ToolSpec {
        name: "read_file".into(),
        description: "Read a text file.".into(),
        parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}).into(),
    }
}

/// A short conversation with one complete tool batch, for request-shape checks.
pub fn conversation(model: &str) -> ModelRequest {
    let mut assistant = Message::assistant(
        Some("Let me look.".into()),
        vec![ToolCall {
            id: "call_1".into(),
            name: "read_file".into(),
            arguments: json!({"path": "a.txt"}),
        }],
    );
    assistant.usage = Some(Usage {
        input_tokens: 5,
        output_tokens: 5,
    });
    ModelRequest {
        messages: vec![
            Message::system("You are terse."),
            Message::user("msg-1", "Read a.txt"),
            assistant,
            Message::tool("call_1", "hello from a"),
            Message::user(
                "subagent:t1",
                "[Background tool result]\nTask ID: t1\n\ndone",
            ),
        ]
        .into(),
        tools: vec![read_file_spec()].into(),
        settings: ModelSettings {
            model: model.into(),
            temperature: Some(0.2),
            max_tokens: Some(64),
            no_images: false,
        },
    }
}

fn simple_request(text: &str) -> ModelRequest {
    ModelRequest {
        messages: vec![Message::system("S"), Message::user("m", text)].into(),
        tools: Vec::new().into(),
        settings: ModelSettings {
            model: "gpt-4o-mini".into(),
            temperature: None,
            max_tokens: None,
            no_images: false,
        },
    }
}

/// A real service on a temp dir whose provider is built from the config by
/// `provider_from_config`, as the app does it.
pub struct Fixture {
    pub service: RuntimeService,
    pub dir: tempfile::TempDir,
}

impl Fixture {
    pub fn new(provider: ProviderConfig) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let service = Self::service_on(&dir, provider);
        Fixture { service, dir }
    }

    fn service_on(dir: &tempfile::TempDir, provider: ProviderConfig) -> RuntimeService {
        RuntimeService::new(ServiceOptions {
            data_dir: dir.path().join("data"),
            config_path: None,
            config: Some(Config {
                provider,
                ..Config::default()
            }),
            provider_factory: Arc::new(provider_from_config),
            tools: None,
        })
        .unwrap()
    }

    /// The app quits (a graceful shutdown) and starts again on the same data.
    pub async fn restart(self, provider: ProviderConfig) -> Self {
        tokio::time::timeout(WAIT, self.service.shutdown())
            .await
            .expect("shutdown hung");
        let service = Self::service_on(&self.dir, provider);
        Fixture {
            service,
            dir: self.dir,
        }
    }

    pub fn workspace(&self) -> PathBuf {
        let path = self.dir.path().join("ws");
        std::fs::create_dir_all(&path).unwrap();
        path
    }

    /// A session in the workspace, subscribed.
    pub fn session(&self) -> (Arc<SessionController>, Subscription) {
        let info = self
            .service
            .create_session(self.workspace().to_str().unwrap(), None)
            .unwrap();
        let controller = self.service.controller(&info.session_id).unwrap();
        let (events, _) = controller.subscribe();
        (controller, events)
    }

    pub fn history(&self, session_id: &str) -> Vec<Message> {
        self.service.store().load(session_id).unwrap().messages
    }

    pub async fn shutdown(self) {
        tokio::time::timeout(WAIT, self.service.shutdown())
            .await
            .expect("shutdown hung");
        assert_eq!(self.service.active_runs(), 0);
    }
}

/// Waits (bounded) for the `content.delta` carrying `text`.
async fn wait_for_delta(events: &mut Subscription, text: &str) {
    loop {
        let event = tokio::time::timeout(WAIT, events.next_event())
            .await
            .expect("no delta")
            .unwrap();
        if let Event::Event { kind, data, .. } = &event {
            if kind == "content.delta" && data["text"] == text {
                return;
            }
        }
    }
}

/// Events of `kind` (`Event::Event`) that arrived until the run's `result` or `error`.
pub async fn run_events(events: &mut Subscription, session_id: &str) -> (Vec<Value>, Event) {
    run_events_within(events, session_id, WAIT).await
}

/// [`run_events`], waiting up to `wait` (a real model, or a long run, takes longer than
/// the seed's 4 s).
pub async fn run_events_within(
    events: &mut Subscription,
    session_id: &str,
    wait: std::time::Duration,
) -> (Vec<Value>, Event) {
    let mut seen = Vec::new();
    let end = tokio::time::timeout(wait, async {
        loop {
            let event = events.next_event().await.expect("event stream closed");
            if event.session_id() != session_id {
                continue;
            }
            match &event {
                Event::Result { .. } | Event::Error { .. } => return event,
                Event::Event { .. } => seen.push(serde_json::to_value(&event).unwrap()),
                _ => {}
            }
        }
    })
    .await
    .expect("timed out waiting for the run to end");
    (seen, end)
}

pub fn of_kind<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["kind"] == kind).collect()
}

#[tokio::test]
async fn openai_text_only_streams_deltas_and_sends_the_exact_request() {
    let mock = MockLlm::start().await;
    // Byte for byte as the Chat Completions reference shows a streamed answer.
    mock.push_sse(concat!(
        "data: {\"id\":\"chatcmpl-123\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"system_fingerprint\":\"fp_44709d6fcb\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-123\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"system_fingerprint\":\"fp_44709d6fcb\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-123\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"system_fingerprint\":\"fp_44709d6fcb\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there!\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-123\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"system_fingerprint\":\"fp_44709d6fcb\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-123\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"system_fingerprint\":\"fp_44709d6fcb\",\"choices\":[],\"usage\":{\"prompt_tokens\":41,\"completion_tokens\":3,\"total_tokens\":44,\"prompt_tokens_details\":{\"cached_tokens\":0,\"audio_tokens\":0},\"completion_tokens_details\":{\"reasoning_tokens\":0,\"audio_tokens\":0,\"accepted_prediction_tokens\":0,\"rejected_prediction_tokens\":0}}}\n\n",
        "data: [DONE]\n\n",
    ));
    let provider = provider_from_config(&openai_config(&mock)).unwrap();
    let (result, events) = generate(&provider, conversation("gpt-4o-mini")).await;
    let response = result.unwrap();
    assert_eq!(deltas(&events), ["Hello", " there!"]);
    assert_eq!(
        response,
        ModelResponse {
            content: Some("Hello there!".into()),
            tool_calls: vec![],
            finish_reason: Some("stop".into()),
            usage: Some(Usage {
                input_tokens: 41,
                output_tokens: 3
            }),
        }
    );
    let requests = mock.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(
        request.header("authorization"),
        Some(format!("Bearer {TEST_KEY}").as_str())
    );
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert_eq!(request.header("accept"), Some("text/event-stream"));
    assert_eq!(
        request.body,
        json!({
            "model": "gpt-4o-mini",
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Read a.txt"},
                {"role": "assistant", "content": "Let me look.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a.txt\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "hello from a"},
                {"role": "user", "content": "[Background tool result]\nTask ID: t1\n\ndone"}
            ],
            "stream": true,
            "stream_options": {"include_usage": true},
            "tools": [{"type": "function", "function": {
                "name": "read_file",
                "description": "Read a text file.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
            }}],
            "temperature": 0.2,
            "max_tokens": 64
        })
    );
    // The runtime's own fields never go to the server.
    assert!(!request.raw_body.contains("usage\":{"));
    assert!(!request.raw_body.contains("msg-1"));
}

#[tokio::test]
async fn openai_tool_call_split_over_many_chunks() {
    let mock = MockLlm::start().await;
    let arguments = r#"{"path": "src/main.rs", "start_line": 10}"#;
    let mut chunks = vec![
        openai::chunk(json!({"role": "assistant", "content": null}), None),
        openai::tool_call(0, "call_DdmO9pD3xa9XTPNJ32zg2hcA", "read_file"),
    ];
    // One argument character per chunk, as models stream them.
    chunks.extend(
        arguments
            .chars()
            .map(|c| openai::tool_args(0, &c.to_string())),
    );
    chunks.push(openai::finish("tool_calls"));
    chunks.push(openai::usage(80, 21));
    let text = openai::stream(&chunks);
    // And split the bytes so that HTTP chunks end mid-line and mid-JSON.
    let bytes = text.into_bytes();
    let pieces: Vec<Vec<u8>> = bytes.chunks(37).map(<[u8]>::to_vec).collect();
    mock.push(MockResponse::sse_chunks(pieces));
    let provider = provider_from_config(&openai_config(&mock)).unwrap();
    let (result, events) = generate(&provider, simple_request("read it")).await;
    let response = result.unwrap();
    assert!(deltas(&events).is_empty());
    assert_eq!(response.content, None);
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        response.tool_calls,
        vec![ToolCall {
            id: "call_DdmO9pD3xa9XTPNJ32zg2hcA".into(),
            name: "read_file".into(),
            arguments: json!({"path": "src/main.rs", "start_line": 10}),
        }]
    );
    assert_eq!(
        response.usage,
        Some(Usage {
            input_tokens: 80,
            output_tokens: 21
        })
    );
}

#[tokio::test]
async fn openai_parallel_tool_calls_interleaved_by_index() {
    let mock = MockLlm::start().await;
    let chunks = vec![
        openai::chunk(json!({"role": "assistant", "content": null}), None),
        openai::tool_call(0, "call_a", "read_file"),
        openai::tool_args(0, "{\"path\""),
        openai::tool_call(1, "call_b", "read_file"),
        openai::tool_args(1, "{\"path\": \"b"),
        openai::tool_call(2, "call_c", "sub_agent"),
        openai::tool_args(0, ": \"a.txt\"}"),
        openai::tool_args(2, "{\"title\": \"T\", \"task\": \"do\"}"),
        openai::tool_args(1, ".txt\"}"),
        openai::finish("tool_calls"),
        openai::usage(100, 40),
    ];
    mock.push(MockResponse::sse_chunks(
        chunks
            .iter()
            .map(openai::data)
            .chain([openai::DONE.to_string()]),
    ));
    let provider = provider_from_config(&openai_config(&mock)).unwrap();
    let (result, _) = generate(&provider, simple_request("all three")).await;
    let calls = result.unwrap().tool_calls;
    assert_eq!(
        calls,
        vec![
            ToolCall {
                id: "call_a".into(),
                name: "read_file".into(),
                arguments: json!({"path": "a.txt"})
            },
            ToolCall {
                id: "call_b".into(),
                name: "read_file".into(),
                arguments: json!({"path": "b.txt"})
            },
            ToolCall {
                id: "call_c".into(),
                name: "sub_agent".into(),
                arguments: json!({"title": "T", "task": "do"})
            },
        ]
    );
}

#[tokio::test]
async fn openai_utf8_character_split_across_chunks() {
    let mock = MockLlm::start().await;
    let (response, live) = MockResponse::live();
    mock.push(response);
    let provider = provider_from_config(&openai_config(&mock)).unwrap();
    let (task, mut events) = spawn_generate(provider, simple_request("hi"));
    let second = openai::data(&openai::text("café ☕"));
    let split = second.find('é').unwrap() + 1; // inside é's two bytes
    let bytes = second.as_bytes();
    live.send(openai::data(&openai::role()) + &openai::data(&openai::text("Hello ")));
    live.send(bytes[..split].to_vec());
    // The first piece was read on its own: its delta is out before the rest is sent.
    let first = tokio::time::timeout(WAIT, events.recv()).await.unwrap();
    assert_eq!(first, Some(ProviderEvent::ContentDelta("Hello ".into())));
    live.send(bytes[split..].to_vec());
    live.send(openai::data(&openai::finish("stop")) + openai::DONE);
    let response = tokio::time::timeout(WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(response.content.as_deref(), Some("Hello café ☕"));
    assert_eq!(
        events.recv().await,
        Some(ProviderEvent::ContentDelta("café ☕".into()))
    );
}

#[tokio::test]
async fn openai_keep_alive_comments_and_done_without_eof() {
    let mock = MockLlm::start().await;
    let (response, live) = MockResponse::live();
    mock.push(response);
    let provider = provider_from_config(&openai_config(&mock)).unwrap();
    let (task, _events) = spawn_generate(provider, simple_request("hi"));
    // OpenRouter's processing comments and a plain keep-alive, between and before events.
    live.send(": OPENROUTER PROCESSING\n\n");
    live.send(": OPENROUTER PROCESSING\n\n");
    live.send(openai::data(&openai::role()));
    live.send(":\n\n");
    live.send(openai::data(&openai::text("ok")));
    live.send(": keep-alive\n\n");
    live.send(openai::data(&openai::finish("stop")));
    live.send(openai::data(&openai::usage(7, 1)));
    live.send(openai::DONE);
    // The body is never closed: `[DONE]` alone must end the call.
    let response = tokio::time::timeout(WAIT, task)
        .await
        .expect("the call waited for the end of the body instead of [DONE]")
        .unwrap()
        .unwrap();
    assert_eq!(response.content.as_deref(), Some("ok"));
    assert_eq!(
        response.usage,
        Some(Usage {
            input_tokens: 7,
            output_tokens: 1
        })
    );
}

#[tokio::test]
async fn openai_stream_closed_after_finish_reason_without_done_is_accepted() {
    let mock = MockLlm::start().await;
    let (response, live) = MockResponse::live();
    mock.push(response);
    let provider = provider_from_config(&openai_config(&mock)).unwrap();
    let (task, _events) = spawn_generate(provider, simple_request("hi"));
    live.send(openai::data(&openai::role()) + &openai::data(&openai::text("short")));
    live.send(openai::data(&openai::finish("length")));
    live.finish();
    let response = tokio::time::timeout(WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(response.content.as_deref(), Some("short"));
    assert_eq!(response.finish_reason.as_deref(), Some("length"));
    assert_eq!(response.usage, None);
}

#[tokio::test]
async fn openai_rate_limited_with_retry_after_then_success() {
    let mock = MockLlm::start().await;
    let body = r#"{"error":{"message":"Rate limit reached for gpt-4o-mini in organization org-x on requests per min (RPM): Limit 3, Used 3, Requested 1.","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
    // OpenAI sends both; the precise one wins.
    mock.push(
        MockResponse::error(429, body)
            .header("retry-after", "1")
            .header("retry-after-ms", "40"),
    );
    mock.push_sse(openai::text_answer(&["fine"], (3, 1)));
    let provider = provider_from_config(&openai_config(&mock)).unwrap();
    let started = Instant::now();
    let (result, events) = generate(&provider, simple_request("hi")).await;
    assert_eq!(result.unwrap().content.as_deref(), Some("fine"));
    assert_eq!(retries(&events), [(1, 40)]);
    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    assert!(requests[1].received_at - requests[0].received_at >= Duration::from_millis(40));
    assert!(started.elapsed() < Duration::from_millis(900));
    match &events[0] {
        ProviderEvent::Retry { reason, .. } => {
            assert!(
                reason.starts_with("rate limited: Rate limit reached"),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn openai_rate_limit_asking_too_long_a_wait_is_reported_not_retried() {
    let mock = MockLlm::start().await;
    mock.push(
        MockResponse::error(
            429,
            r#"{"error":{"message":"Rate limit reached for requests per day (RPD)","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#,
        )
        .header("retry-after", "3600"),
    );
    let provider = provider_from_config(&openai_config(&mock)).unwrap();
    let (result, events) = generate(&provider, simple_request("hi")).await;
    match result.unwrap_err() {
        ProviderError::RateLimited {
            message,
            retry_after_ms,
        } => {
            assert_eq!(
                message,
                "Rate limit reached for requests per day (RPD) (HTTP 429)"
            );
            assert_eq!(retry_after_ms, Some(3_600_000));
        }
        other => panic!("{other:?}"),
    }
    assert!(retries(&events).is_empty());
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn openai_server_error_twice_then_success_says_so_in_events() {
    let mock = MockLlm::start().await;
    let error = r#"{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}"#;
    mock.push(MockResponse::error(500, error));
    mock.push(MockResponse::error(500, error));
    mock.push_sse(openai::text_answer(&["made ", "it"], (12, 2)));
    let fx = Fixture::new(openai_config(&mock));
    let (controller, mut events) = fx.session();
    controller.submit("hello".into(), None).unwrap();
    let (seen, end) = run_events(&mut events, controller.session_id()).await;
    assert_eq!(
        end,
        Event::Result {
            session_id: controller.session_id().into(),
            content: "made it".into()
        }
    );
    let retries = of_kind(&seen, "provider.retry");
    assert_eq!(retries.len(), 2);
    assert_eq!(retries[0]["data"]["attempt"], 1);
    assert_eq!(retries[1]["data"]["attempt"], 2);
    assert!(
        retries[0]["data"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("server error 500: The server had an error")
    );
    let deltas: Vec<&str> = of_kind(&seen, "content.delta")
        .iter()
        .map(|e| e["data"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, ["made ", "it"]);
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 3);
    assert!(bodies.iter().all(|b| *b == bodies[0]));
    fx.shutdown().await;
}

#[tokio::test]
async fn openai_retries_are_bounded() {
    let mock = MockLlm::start().await;
    for _ in 0..4 {
        mock.push(MockResponse::error(503, "upstream connect error"));
    }
    let provider = provider_from_config(&openai_config(&mock)).unwrap();
    let (result, events) = generate(&provider, simple_request("hi")).await;
    let err = result.unwrap_err();
    assert_eq!(
        err.to_string(),
        "server error 503: upstream connect error (HTTP 503)"
    );
    assert_eq!(retries(&events).len(), 3);
    assert_eq!(mock.requests().len(), 4);
}

#[tokio::test]
async fn openai_truncated_stream_after_content_fails_without_retry() {
    let mock = MockLlm::start().await;
    mock.push(
        MockResponse::sse_chunks([
            openai::data(&openai::role()),
            openai::data(&openai::text("The answer is")),
        ])
        .then_abort(),
    );
    mock.push_sse(openai::text_answer(&["never sent"], (1, 1)));
    let fx = Fixture::new(openai_config(&mock));
    let (controller, mut events) = fx.session();
    controller.submit("hello".into(), None).unwrap();
    let (seen, end) = run_events(&mut events, controller.session_id()).await;
    let Event::Error { message, .. } = end else {
        panic!("{end:?}")
    };
    assert!(
        message.starts_with("network error: the response stream broke off"),
        "{message}"
    );
    assert!(of_kind(&seen, "provider.retry").is_empty());
    assert_eq!(mock.requests().len(), 1);
    assert!(controller.is_paused());
    // The history stays valid: the user's message, and no half answer.
    let history = fx.history(controller.session_id());
    assert_eq!(history.len(), 1);
    fx.shutdown().await;
}

#[tokio::test]
async fn openai_truncated_stream_before_content_is_retried() {
    let mock = MockLlm::start().await;
    // The body ends cleanly but early: no finish_reason, no [DONE].
    mock.push_sse(openai::data(&openai::role()));
    mock.push_sse(openai::text_answer(&["second try"], (1, 2)));
    let provider = provider_from_config(&openai_config(&mock)).unwrap();
    let (result, events) = generate(&provider, simple_request("hi")).await;
    assert_eq!(result.unwrap().content.as_deref(), Some("second try"));
    assert_eq!(retries(&events).len(), 1);
    match &events[0] {
        ProviderEvent::Retry { reason, .. } => {
            assert!(
                reason.contains("ended before the model finished"),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn openai_invalid_json_chunk_is_a_malformed_response() {
    let mock = MockLlm::start().await;
    mock.push_sse(
        openai::data(&openai::role())
            + "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"oops\"}\n\n"
            + openai::DONE,
    );
    let provider = provider_from_config(&openai_config(&mock)).unwrap();
    let (result, events) = generate(&provider, simple_request("hi")).await;
    let err = result.unwrap_err();
    assert!(matches!(err, ProviderError::Malformed(_)), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("malformed response: a stream chunk is not JSON"),
        "{err}"
    );
    assert!(retries(&events).is_empty());
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn openai_unauthorized_is_not_retried_and_reads_clearly() {
    let mock = MockLlm::start().await;
    mock.push(MockResponse::error(
        401,
        r#"{"error":{"message":"Incorrect API key provided: sk-test-***********2a1b. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
    ));
    let fx = Fixture::new(openai_config(&mock));
    let (controller, mut events) = fx.session();
    controller.submit("hello".into(), None).unwrap();
    let (seen, end) = run_events(&mut events, controller.session_id()).await;
    let Event::Error { message, .. } = end else {
        panic!("{end:?}")
    };
    assert!(
        message.starts_with("authentication failed: Incorrect API key provided"),
        "{message}"
    );
    assert!(message.ends_with("(HTTP 401)"), "{message}");
    assert!(of_kind(&seen, "provider.retry").is_empty());
    assert_eq!(mock.requests().len(), 1);
    fx.shutdown().await;
}

#[tokio::test]
async fn openai_context_too_long_is_not_retried() {
    let mock = MockLlm::start().await;
    mock.push(MockResponse::error(
        400,
        r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130227 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
    ));
    let provider = provider_from_config(&openai_config(&mock)).unwrap();
    let (result, events) = generate(&provider, simple_request("hi")).await;
    let err = result.unwrap_err();
    assert!(matches!(err, ProviderError::ContextTooLong(_)), "{err:?}");
    assert!(retries(&events).is_empty());
}

#[tokio::test]
async fn openai_error_inside_a_stream_is_typed() {
    let mock = MockLlm::start().await;
    // OpenRouter reports a provider failure mid-stream, inside a 200 response.
    mock.push_sse(
        openai::data(&openai::role())
            + &openai::data(&json!({"id": "gen-1", "object": "chat.completion.chunk", "created": 1, "model": "x", "error": {"code": 502, "message": "Provider disconnected"}, "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}]})),
    );
    mock.push_sse(openai::text_answer(&["recovered"], (1, 1)));
    let provider = provider_from_config(&openai_config(&mock)).unwrap();
    let (result, events) = generate(&provider, simple_request("hi")).await;
    assert_eq!(result.unwrap().content.as_deref(), Some("recovered"));
    assert_eq!(retries(&events).len(), 1);
}

#[tokio::test]
async fn openai_idle_timeout_breaks_a_silent_stream() {
    let mock = MockLlm::start().await;
    let (response, live) = MockResponse::live();
    mock.push(response);
    let mut config = openai_config(&mock);
    config.extra.insert("idle_timeout_ms".into(), json!(150));
    config.extra.insert("max_retries".into(), json!(0));
    let provider = provider_from_config(&config).unwrap();
    let (task, _events) = spawn_generate(provider, simple_request("hi"));
    live.send(openai::data(&openai::role()));
    let err = tokio::time::timeout(WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "network error: the model server sent nothing for 0.15 s (provider.idle_timeout_ms)"
    );
    // The silent request was dropped, not left open.
    live.wait_closed().await;
}

#[tokio::test]
async fn openai_keep_alive_comments_hold_off_the_idle_timeout() {
    let mock = MockLlm::start().await;
    let (response, live) = MockResponse::live();
    mock.push(response);
    let mut config = openai_config(&mock);
    config.extra.insert("idle_timeout_ms".into(), json!(500));
    config.extra.insert("max_retries".into(), json!(0));
    let provider = provider_from_config(&config).unwrap();
    let (task, _events) = spawn_generate(provider, simple_request("hi"));
    live.send(openai::data(&openai::role()));
    // A server that is still thinking: only comments, for twice the idle timeout. This
    // paces the server; nothing in the test waits on it to be in sync.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        live.send(": OPENROUTER PROCESSING\n\n");
    }
    live.send(openai::text_answer(&["awake"], (1, 1)));
    let response = tokio::time::timeout(WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(response.content.as_deref(), Some("awake"));
}

/// A local server that is not running refuses at once: that is reported at once, with a
/// way forward, not retried for seconds (issue 17, UX review D7).
#[tokio::test]
async fn openai_a_refused_local_server_is_reported_at_once_with_a_way_forward() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let mut config = provider_config("openai", format!("http://127.0.0.1:{port}/v1"), "m");
    config.extra.insert("max_retries".into(), json!(2));
    let provider = provider_from_config(&config).unwrap();
    let (result, events) = generate(&provider, simple_request("hi")).await;
    let err = result.unwrap_err();
    assert!(matches!(err, ProviderError::Unreachable(_)), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains(&format!(
            "no model server is running at http://127.0.0.1:{port}"
        )) && message.contains("Settings"),
        "{message}"
    );
    assert!(retries(&events).is_empty());
}

/// D7 for remote servers: a name that does not resolve and a TLS handshake that fails
/// are said in words first (what to check), the details after; neither is a local
/// "start your server" case.
#[tokio::test]
async fn openai_dns_and_tls_failures_say_what_happened_in_words() {
    let mut dns = provider_config("openai", "http://model-server.invalid/v1".into(), "m");
    dns.extra.insert("max_retries".into(), json!(0));
    let (result, _) = generate(&provider_from_config(&dns).unwrap(), simple_request("hi")).await;
    let message = result.unwrap_err().to_string();
    assert!(
        message.starts_with("network error: cannot find the model server model-server.invalid: the name does not resolve"),
        "{message}"
    );
    // A plain-HTTP server behind an https:// address: the handshake fails.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            use tokio::io::AsyncWriteExt;
            let _ = socket
                .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
    });
    let mut tls = provider_config("openai", format!("https://127.0.0.1:{port}/v1"), "m");
    tls.extra.insert("max_retries".into(), json!(0));
    let (result, _) = generate(&provider_from_config(&tls).unwrap(), simple_request("hi")).await;
    let message = result.unwrap_err().to_string();
    assert!(
        message.starts_with(&format!(
            "network error: the secure connection (TLS) to 127.0.0.1:{port} failed"
        )),
        "{message}"
    );
}

#[tokio::test]
async fn openai_max_tokens_param_can_be_renamed_for_reasoning_models() {
    let mock = MockLlm::start().await;
    mock.push_sse(openai::text_answer(&["ok"], (1, 1)));
    let mut config = openai_config(&mock);
    config
        .extra
        .insert("max_tokens_param".into(), json!("max_completion_tokens"));
    let provider = provider_from_config(&config).unwrap();
    let mut request = simple_request("hi");
    request.settings.max_tokens = Some(300);
    let (result, _) = generate(&provider, request).await;
    result.unwrap();
    let body = &mock.bodies()[0];
    assert_eq!(body["max_completion_tokens"], 300);
    assert!(body.get("max_tokens").is_none());
}

#[tokio::test]
async fn openai_missing_key_variable_is_a_clear_error_and_sends_nothing() {
    let mock = MockLlm::start().await;
    let mut config = openai_config(&mock);
    config.api_key_env = Some("BUMBLEHIVE_TEST_UNSET_KEY_VARIABLE".into());
    let provider = provider_from_config(&config).unwrap();
    let (result, _) = generate(&provider, simple_request("hi")).await;
    assert_eq!(
        result.unwrap_err().to_string(),
        "authentication failed: no API key: the environment variable BUMBLEHIVE_TEST_UNSET_KEY_VARIABLE (provider.api_key_env) is not set"
    );
    assert!(mock.requests().is_empty());
}

#[tokio::test]
async fn openai_keyring_without_a_keyring_is_a_clear_error() {
    let mock = MockLlm::start().await;
    let mut config = openai_config(&mock);
    config.api_key_env = None;
    config.extra.insert(
        "api_key_keyring".into(),
        json!(format!("bumblehive-test-{}", uuid::Uuid::new_v4().simple())),
    );
    let provider = provider_from_config(&config).unwrap();
    let (result, _) = generate(&provider, simple_request("hi")).await;
    // With no D-Bus session the keyring is unavailable; with one, the entry is absent.
    let message = result.unwrap_err().to_string();
    assert!(message.starts_with("authentication failed:"), "{message}");
    assert!(message.contains("keyring"), "{message}");
    assert!(mock.requests().is_empty());
}

#[tokio::test]
async fn openai_no_key_configured_sends_no_authorization() {
    let mock = MockLlm::start().await;
    mock.push_sse(openai::text_answer(&["local"], (1, 1)));
    let mut config = openai_config(&mock);
    config.api_key_env = None;
    let provider = provider_from_config(&config).unwrap();
    let (result, _) = generate(&provider, simple_request("hi")).await;
    assert_eq!(result.unwrap().content.as_deref(), Some("local"));
    assert_eq!(mock.requests()[0].header("authorization"), None);
}

#[tokio::test]
async fn openai_malformed_tool_arguments_become_tool_results_and_the_run_goes_on() {
    let mock = MockLlm::start().await;
    mock.push_sse(openai::stream(&[
        openai::chunk(json!({"role": "assistant", "content": null}), None),
        openai::tool_call(0, "call_bad_json", "read_file"),
        openai::tool_args(0, "{\"path\": \"a.txt\""),
        openai::tool_call(1, "call_bad_type", "read_file"),
        openai::tool_args(1, "{\"path\": 42}"),
        openai::tool_call(2, "call_unknown", "launch_rockets"),
        openai::tool_args(2, "{}"),
        openai::finish("tool_calls"),
        openai::usage(50, 30),
    ]));
    mock.push_sse(openai::text_answer(&["Sorry, fixed."], (90, 4)));
    let fx = Fixture::new(openai_config(&mock));
    let (controller, mut events) = fx.session();
    controller.submit("read a.txt".into(), None).unwrap();
    let (_, end) = run_events(&mut events, controller.session_id()).await;
    assert!(matches!(end, Event::Result { .. }), "{end:?}");
    let history = fx.history(controller.session_id());
    assert_message_order(&history);
    let results: Vec<(&str, &str)> = history
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| (m.tool_call_id.as_deref().unwrap(), m.text()))
        .collect();
    assert_eq!(results.len(), 3);
    assert_eq!(results[0].0, "call_bad_json");
    assert!(
        results[0]
            .1
            .starts_with("Error: invalid arguments: arguments must be a JSON object"),
        "{}",
        results[0].1
    );
    assert!(
        results[1].1.starts_with("Error: invalid arguments:"),
        "{}",
        results[1].1
    );
    assert!(results[1].1.contains("invalid type"), "{}", results[1].1);
    assert!(
        results[2]
            .1
            .starts_with("Error: invalid arguments: unknown tool \"launch_rockets\""),
        "{}",
        results[2].1
    );
    // The model saw its own text back, then what was wrong with it.
    let second = &mock.bodies()[1];
    let messages = second["messages"].as_array().unwrap();
    assert_eq!(
        messages[2]["tool_calls"][0]["function"]["arguments"],
        "{\"path\": \"a.txt\""
    );
    assert_eq!(messages[3]["role"], "tool");
    assert_eq!(messages[3]["tool_call_id"], "call_bad_json");
    fx.shutdown().await;
}

#[tokio::test]
async fn openai_usage_reaches_the_stored_message_and_the_snapshot() {
    let mock = MockLlm::start().await;
    mock.push_sse(openai::tool_answer(
        &[("call_r", "read_file", json!({"path": "notes.txt"}))],
        (120, 15),
    ));
    mock.push_sse(openai::text_answer(&["It says hi."], (160, 5)));
    let fx = Fixture::new(openai_config(&mock));
    std::fs::write(fx.workspace().join("notes.txt"), "hi").unwrap();
    let (controller, mut events) = fx.session();
    controller
        .submit("what is in notes.txt?".into(), None)
        .unwrap();
    let (seen, end) = run_events(&mut events, controller.session_id()).await;
    assert!(matches!(end, Event::Result { .. }), "{end:?}");
    let history = fx.history(controller.session_id());
    let usages: Vec<Option<Usage>> = history
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .map(|m| m.usage)
        .collect();
    assert_eq!(
        usages,
        [
            Some(Usage {
                input_tokens: 120,
                output_tokens: 15
            }),
            Some(Usage {
                input_tokens: 160,
                output_tokens: 5
            })
        ]
    );
    // Carried by the events that announce the messages …
    let appended: Vec<&Value> = of_kind(&seen, "message.appended")
        .into_iter()
        .filter(|e| e["data"]["message"]["role"] == "assistant")
        .collect();
    assert_eq!(appended[1]["data"]["message"]["usage"]["input_tokens"], 160);
    // … and summed in the snapshot and the session info.
    let total = Usage {
        input_tokens: 280,
        output_tokens: 20,
    };
    let snapshot = controller.snapshot();
    assert_eq!(snapshot.usage, total);
    assert_eq!(snapshot.tree_usage, total);
    assert_eq!(
        fx.service
            .session_info(controller.session_id())
            .unwrap()
            .usage,
        total
    );
    fx.shutdown().await;
}

#[tokio::test]
async fn openai_cancel_aborts_the_request_at_once() {
    let mock = MockLlm::start().await;
    let (response, live) = MockResponse::live();
    mock.push(response);
    let fx = Fixture::new(openai_config(&mock));
    let (controller, mut events) = fx.session();
    controller
        .submit("write a long story".into(), None)
        .unwrap();
    let requests = mock.wait_for_requests(1).await;
    assert_eq!(
        requests[0].body["messages"][1]["content"],
        "write a long story"
    );
    live.send(openai::data(&openai::role()) + &openai::data(&openai::text("Once upon")));
    let delta = loop {
        let event = receive(&mut events, "event", Some(controller.session_id()), None).await;
        if event["kind"] == "content.delta" {
            break event;
        }
    };
    assert_eq!(delta["data"]["text"], "Once upon");
    let cancelled_at = Instant::now();
    tokio::time::timeout(WAIT, controller.cancel())
        .await
        .expect("cancel hung");
    // The server sees the client go away: the HTTP request was aborted, not left running.
    live.wait_closed().await;
    assert!(cancelled_at.elapsed() < Duration::from_secs(2));
    assert!(controller.is_paused());
    assert_eq!(fx.service.active_runs(), 0);
    fx.shutdown().await;
}

#[tokio::test]
async fn openai_api_key_never_reaches_files_events_or_config() {
    let mock = MockLlm::start().await;
    mock.push_sse(openai::text_answer(&["done"], (1, 1)));
    let fx = Fixture::new(openai_config(&mock));
    let (controller, mut events) = fx.session();
    controller.submit("hello".into(), None).unwrap();
    let (seen, end) = run_events(&mut events, controller.session_id()).await;
    assert!(matches!(end, Event::Result { .. }));
    assert_eq!(
        mock.requests()[0].header("authorization"),
        Some(format!("Bearer {TEST_KEY}").as_str())
    );
    let shown = serde_json::to_string(&fx.service.config().redacted()).unwrap();
    assert!(!shown.contains(TEST_KEY));
    assert!(!serde_json::to_string(&seen).unwrap().contains(TEST_KEY));
    for entry in walk(fx.dir.path()) {
        let bytes = std::fs::read(&entry).unwrap();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(TEST_KEY),
            "the key is in {}",
            entry.display()
        );
    }
    fx.shutdown().await;
}

/// A request's OpenAI-shaped messages back as runtime messages, for the order check.
pub fn wire_history(body: &Value) -> Vec<Message> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let role: Role = serde_json::from_value(m["role"].clone()).unwrap();
            let calls = m["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| ToolCall {
                    id: c["id"].as_str().unwrap().into(),
                    name: c["function"]["name"].as_str().unwrap().into(),
                    arguments: c["function"]["arguments"].clone(),
                })
                .collect();
            Message {
                role,
                content: m["content"].as_str().map(str::to_string),
                tool_calls: calls,
                tool_call_id: m["tool_call_id"].as_str().map(str::to_string),
                id: None,
                usage: None,
                stopped: false,
                usage_estimated: false,
                images: Vec::new(),
            }
        })
        .collect()
}

fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// The seed's delegation flow (a parent delegates three children that read files; their
/// reports wake the parent) with every model call going over HTTP to the scripted server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_delegation_flow_end_to_end() {
    let mock = MockLlm::start().await;
    mock.respond_with(|request| {
        let messages = request.body["messages"].as_array().unwrap();
        let first_user = messages[1]["content"].as_str().unwrap();
        let last = messages.last().unwrap();
        if let Some((_, name)) = first_user.split_once("\nTask:\nCHILD:") {
            if last["role"] == "tool" {
                let report = format!("REPORT:{name}: {}", last["content"].as_str().unwrap());
                return MockResponse::sse(openai::text_answer(&[&report], (30, 6)));
            }
            return MockResponse::sse(openai::tool_answer(
                &[(
                    &format!("read-{name}"),
                    "read_file",
                    json!({"path": format!("data-{name}.txt")}),
                )],
                (20, 8),
            ));
        }
        if messages.len() == 2 {
            let calls: Vec<(String, Value)> = (0..3)
                .map(|i| {
                    (
                        format!("delegate-{i}"),
                        json!({"title": format!("Review {i}"), "task": format!("CHILD:{i}")}),
                    )
                })
                .collect();
            let calls: Vec<(&str, &str, Value)> = calls
                .iter()
                .map(|(id, args)| (id.as_str(), "sub_agent", args.clone()))
                .collect();
            return MockResponse::sse(openai::tool_answer(&calls, (100, 40)));
        }
        let reports = messages
            .iter()
            .filter(|m| {
                m["content"]
                    .as_str()
                    .is_some_and(|c| c.starts_with("[Background tool result]"))
            })
            .count();
        MockResponse::sse(openai::text_answer(
            &[&format!("PARENT: {reports} reports")],
            (200, 10),
        ))
    });
    let fx = Fixture::new(openai_config(&mock));
    let workspace = fx.workspace();
    for i in 0..3 {
        std::fs::write(workspace.join(format!("data-{i}.txt")), format!("DATA {i}")).unwrap();
    }
    let (controller, mut events) = fx.session();
    let parent = controller.session_id().to_string();
    controller
        .submit("Review three parts".into(), None)
        .unwrap();
    let mut children = Vec::new();
    for _ in 0..3 {
        let created = receive(&mut events, "session_created", None, None).await;
        children.push(created["session_id"].as_str().unwrap().to_string());
    }
    tokio::time::timeout(WAIT, fx.service.wait_idle())
        .await
        .expect("the runtime never went idle");
    assert!(!controller.is_running());
    let history = fx.history(&parent);
    assert_message_order(&history);
    let reports: Vec<&Message> = history
        .iter()
        .filter(|m| m.text().starts_with("[Background tool result]"))
        .collect();
    assert_eq!(reports.len(), 3);
    for i in 0..3 {
        let expected =
            format!("[Background tool result]\nTask ID: delegate-{i}\n\nREPORT:{i}: DATA {i}");
        assert!(
            reports
                .iter()
                .any(|m| m.text() == expected && m.role == Role::User),
            "missing report {i}: {reports:#?}"
        );
    }
    let last = history.last().unwrap();
    assert_eq!(last.role, Role::Assistant);
    assert!(last.text().starts_with("PARENT: "), "{last:?}");
    for child in &children {
        let child_history = fx.history(child);
        assert_message_order(&child_history);
        assert_eq!(child_history.len(), 4, "{child_history:#?}");
        assert_eq!(
            fx.service.controller(child).unwrap().snapshot().usage,
            Usage {
                input_tokens: 50,
                output_tokens: 14
            }
        );
    }
    // Every request the server got was a valid history (the mock checks tool outputs).
    let bodies = mock.bodies();
    for body in &bodies {
        assert_eq!(body["messages"][0]["role"], "system");
        assert_message_order(&wire_history(body));
    }
    let parent_calls = bodies.len() - 6;
    let snapshot = controller.snapshot();
    let own = Usage {
        input_tokens: 100 + 200 * (parent_calls as u64 - 1),
        output_tokens: 40 + 10 * (parent_calls as u64 - 1),
    };
    assert_eq!(snapshot.usage, own);
    assert_eq!(
        snapshot.tree_usage,
        Usage {
            input_tokens: own.input_tokens + 3 * 50,
            output_tokens: own.output_tokens + 3 * 14
        }
    );
    fx.shutdown().await;
}

/// Measures the time from a chunk leaving the server to its `content.delta` event at a
/// subscriber (loopback TCP, HTTP, SSE and JSON parsing, the run's sink, the event
/// broadcast), one chunk at a time. Prints the numbers; asserts only a loose bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_chunk_to_content_delta_overhead() {
    const CHUNKS: usize = 300;
    let mock = MockLlm::start().await;
    let (response, live) = MockResponse::live();
    mock.push(response);
    let fx = Fixture::new(openai_config(&mock));
    let (controller, mut events) = fx.session();
    controller.submit("stream".into(), None).unwrap();
    live.send(openai::data(&openai::role()));
    let mut samples = Vec::with_capacity(CHUNKS);
    for i in 0..CHUNKS {
        let text = format!("token{i} ");
        let chunk = openai::data(&openai::text(&text));
        let sent = Instant::now();
        live.send(chunk);
        loop {
            let event = tokio::time::timeout(WAIT, events.next_event())
                .await
                .expect("no content.delta")
                .unwrap();
            if let Event::Event { kind, data, .. } = &event {
                if kind == "content.delta" {
                    assert_eq!(data["text"], text);
                    samples.push(sent.elapsed());
                    break;
                }
            }
        }
    }
    live.send(openai::data(&openai::finish("stop")) + openai::DONE);
    let (_, end) = run_events(&mut events, controller.session_id()).await;
    assert!(matches!(end, Event::Result { .. }));
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    println!(
        "chunk -> content.delta over {CHUNKS} chunks ({} build): median {:?}, mean {:?}, p95 {:?}, p99 {:?}, max {:?}",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        at(0.5),
        mean,
        at(0.95),
        at(0.99),
        samples[samples.len() - 1]
    );
    assert!(at(0.5) < Duration::from_millis(50), "median {:?}", at(0.5));
    fx.shutdown().await;
}

/// Keeps the module's helpers honest: they are shared with the Anthropic tests.
#[test]
fn openai_mock_checks_tool_outputs_against_calls() {
    let good = json!({"messages": [
        {"role": "assistant", "content": null, "tool_calls": [{"id": "a", "type": "function", "function": {"name": "x", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "ok"}
    ]});
    assert!(mock_llm::tool_output_problems(&good).is_empty());
    let orphan = json!({"messages": [{"role": "tool", "tool_call_id": "zz", "content": "ok"}]});
    assert_eq!(mock_llm::tool_output_problems(&orphan).len(), 1);
}

/// Stop mid-stream keeps what had streamed: saved as the assistant's stopped answer
/// (marked `stopped`), valid history, and sent to the model with the next message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_mid_stream_keeps_the_partial_answer_for_the_next_request() {
    let mock = MockLlm::start().await;
    let fx = Fixture::new(openai_config(&mock));
    let (response, stream) = MockResponse::live();
    mock.push(response);
    mock.push_sse(openai::text_answer(&["carrying on"], (3, 2)));
    let (controller, mut events) = fx.session();
    let id = controller.session_id().to_string();
    controller.submit("hello".into(), None).unwrap();
    stream.send(openai::data(&openai::role()));
    stream.send(openai::data(&openai::text("Half an ")));
    stream.send(openai::data(&openai::text("answer")));
    wait_for_delta(&mut events, "answer").await;
    controller.cancel().await;
    let history = fx.history(&id);
    let last = history.last().unwrap();
    assert_eq!(last.role, Role::Assistant);
    assert_eq!(last.text(), "Half an answer");
    assert!(last.stopped);
    assert!(last.tool_calls.is_empty());
    // E23: the stream ended before the provider's usage chunk, so the stopped answer
    // keeps the runtime's estimate, marked as one (not 0 tokens).
    let usage = last.usage.expect("a stopped answer keeps its usage");
    assert!(
        usage.input_tokens > 0 && usage.output_tokens > 0,
        "{usage:?}"
    );
    assert!(last.usage_estimated);
    crate::support::assert_message_order(&history);
    controller.submit("go on".into(), None).unwrap();
    loop {
        let event = tokio::time::timeout(WAIT, events.next_event())
            .await
            .expect("no result")
            .unwrap();
        if matches!(event, Event::Result { .. }) {
            break;
        }
    }
    let second = &mock.bodies()[1];
    let messages = second["messages"].as_array().unwrap();
    let n = messages.len();
    assert_eq!(messages[n - 2]["role"], "assistant");
    assert_eq!(messages[n - 2]["content"], "Half an answer");
    assert!(messages[n - 2].get("stopped").is_none());
    assert!(messages[n - 2].get("usage_estimated").is_none());
    assert_eq!(messages[n - 1]["content"], "go on");
    drop(stream);
    fx.shutdown().await;
}

/// A child cut off by the app quitting keeps what it had streamed (D12): after the quit
/// and a restart its history ends with the stopped partial answer, and it is marked
/// interrupted, to be resumed (from that answer) or cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_cut_off_by_a_quit_keeps_its_streamed_output_across_the_restart() {
    let mock = MockLlm::start().await;
    let fx = Fixture::new(openai_config(&mock));
    let (child_answer, stream) = MockResponse::live();
    let child_answer = std::sync::Mutex::new(Some(child_answer));
    mock.respond_with(move |request| {
        let messages = request.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let is_child = messages
            .iter()
            .any(|m| m["content"].as_str().is_some_and(|c| c.contains("Task:\n")));
        if is_child {
            if let Some(live) = child_answer.lock().unwrap().take() {
                return live;
            }
        }
        if messages.iter().any(|m| m["role"] == "tool") {
            return MockResponse::sse(openai::text_answer(&["waiting for it"], (3, 2)));
        }
        MockResponse::sse(openai::tool_answer(
            &[(
                "d",
                "sub_agent",
                json!({"title": "Writer", "task": "write a poem"}),
            )],
            (3, 2),
        ))
    });
    let (controller, mut events) = fx.session();
    controller.submit("delegate".into(), None).unwrap();
    // The child's answer streams halfway.
    let child = loop {
        let event = receive(&mut events, "session_created", None, None).await;
        if event["parent_session_id"] == controller.session_id() {
            break event["session_id"].as_str().unwrap().to_string();
        }
    };
    let child_controller = fx.service.controller(&child).unwrap();
    let (mut child_events, _) = child_controller.subscribe();
    stream.send(openai::data(&openai::role()));
    stream.send(openai::data(&openai::text("Roses are ")));
    stream.send(openai::data(&openai::text("red")));
    wait_for_delta(&mut child_events, "red").await;
    // The app quits while the child streams.
    let fx = fx.restart(openai_config(&mock)).await;
    drop(stream);
    let service = &fx.service;
    let history = service.store().load(&child).unwrap().messages;
    let last = history.last().unwrap();
    assert_eq!(last.role, Role::Assistant, "{history:#?}");
    assert_eq!(last.text(), "Roses are red");
    assert!(last.stopped);
    assert_message_order(&history);
    let info = service
        .list_sessions(None)
        .unwrap()
        .into_iter()
        .find(|s| s.session_id == child)
        .unwrap();
    assert!(info.interrupted, "{info:?}");
    // Its partial answer is no report: the parent got none, and none waits for it.
    let parent = controller.session_id().to_string();
    let reports: Vec<_> = service
        .store()
        .load(&parent)
        .unwrap()
        .messages
        .into_iter()
        .filter(crate::support::is_report)
        .collect();
    assert!(reports.is_empty(), "{reports:#?}");
    assert!(service.controller(&parent).unwrap().pending().is_empty());
    fx.shutdown().await;
}
