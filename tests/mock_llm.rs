//! A scripted model server for tests: an axum server on 127.0.0.1:0 that answers each request with the next scripted response (byte-exact SSE, errors, live streams), records every request, and checks that every tool output in a request answers a tool call made before it. Builders for OpenAI Chat Completions chunks, OpenAI Responses events and Anthropic events.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use futures::StreamExt;
use serde_json::Value;
use tokio::sync::{mpsc, watch};

/// How long the waits of this module give a provider before failing the test.
pub const MOCK_WAIT: Duration = Duration::from_secs(10);

/// A request the server received.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    /// Header names in lower case.
    pub headers: BTreeMap<String, String>,
    /// The body as JSON (`Value::Null` when it was not JSON; see `raw_body`).
    pub body: Value,
    pub raw_body: String,
    pub received_at: Instant,
}

impl RecordedRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }
}

enum MockBody {
    /// Each piece is its own HTTP chunk; `abort` breaks the connection after the last.
    Chunks { pieces: Vec<Bytes>, abort: bool },
    /// Pieces the test sends while the client reads.
    Live {
        rx: mpsc::UnboundedReceiver<Bytes>,
        closed: watch::Sender<bool>,
    },
}

/// One scripted answer.
pub struct MockResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: MockBody,
}

impl MockResponse {
    /// A 200 `text/event-stream` response with this body, sent as one piece.
    pub fn sse(body: impl Into<String>) -> Self {
        Self::sse_chunks([body.into()])
    }

    /// A 200 `text/event-stream` response sent piece by piece (split anywhere, even
    /// inside a UTF-8 character, by passing bytes).
    pub fn sse_chunks<I, P>(pieces: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<Vec<u8>>,
    {
        MockResponse {
            status: 200,
            headers: sse_headers(),
            body: MockBody::Chunks {
                pieces: pieces.into_iter().map(|p| Bytes::from(p.into())).collect(),
                abort: false,
            },
        }
    }

    /// An error response with a JSON (or text) body.
    pub fn error(status: u16, body: impl Into<String>) -> Self {
        MockResponse {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: MockBody::Chunks {
                pieces: vec![Bytes::from(body.into())],
                abort: false,
            },
        }
    }

    /// A 200 stream whose pieces the test sends through the returned handle.
    pub fn live() -> (Self, LiveStream) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (closed, _) = watch::channel(false);
        let handle = LiveStream {
            tx,
            closed: closed.clone(),
        };
        let response = MockResponse {
            status: 200,
            headers: sse_headers(),
            body: MockBody::Live { rx, closed },
        };
        (response, handle)
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// Breaks the connection after the last piece instead of ending the body cleanly.
    pub fn then_abort(mut self) -> Self {
        if let MockBody::Chunks { abort, .. } = &mut self.body {
            *abort = true;
        }
        self
    }
}

fn sse_headers() -> Vec<(String, String)> {
    vec![
        (
            "content-type".into(),
            "text/event-stream; charset=utf-8".into(),
        ),
        ("cache-control".into(), "no-cache".into()),
    ]
}

/// The test's end of a live response.
pub struct LiveStream {
    tx: mpsc::UnboundedSender<Bytes>,
    closed: watch::Sender<bool>,
}

impl LiveStream {
    pub fn send(&self, piece: impl Into<Vec<u8>>) {
        let _ = self.tx.send(Bytes::from(piece.into()));
    }

    /// Ends the body cleanly.
    pub fn finish(self) {}

    /// Resolves once the client has gone away (the server dropped the response body).
    pub async fn wait_closed(&self) {
        let mut rx = self.closed.subscribe();
        tokio::time::timeout(MOCK_WAIT, rx.wait_for(|closed| *closed))
            .await
            .expect("the client never closed the live stream")
            .expect("live stream state dropped");
    }
}

/// Marks a live stream closed when hyper drops its body: the client is gone.
struct CloseGuard(watch::Sender<bool>);

impl Drop for CloseGuard {
    fn drop(&mut self) {
        self.0.send_replace(true);
    }
}

type Handler = Arc<dyn Fn(&RecordedRequest) -> MockResponse + Send + Sync>;

#[derive(Default)]
struct MockState {
    script: Mutex<VecDeque<MockResponse>>,
    handler: Mutex<Option<Handler>>,
    requests: watch::Sender<Vec<RecordedRequest>>,
    violations: Mutex<Vec<String>>,
}

/// The server. Dropping it stops it.
pub struct MockLlm {
    addr: SocketAddr,
    state: Arc<MockState>,
    server: tokio::task::JoinHandle<()>,
}

impl MockLlm {
    pub async fn start() -> MockLlm {
        let state = Arc::new(MockState::default());
        let app = Router::new().fallback(handle).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        MockLlm {
            addr,
            state,
            server,
        }
    }

    /// `http://127.0.0.1:<port>` (append `/v1` for an OpenAI base URL).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Queues the answer to the next request that the queue has not answered.
    pub fn push(&self, response: MockResponse) {
        self.state.script.lock().unwrap().push_back(response);
    }

    /// Queues a 200 SSE answer sent as one piece.
    pub fn push_sse(&self, body: impl Into<String>) {
        self.push(MockResponse::sse(body));
    }

    /// Answers requests the queue has no answer for (concurrent sessions, where the order
    /// of requests is not known): the handler sees each request and picks its answer.
    pub fn respond_with(
        &self,
        handler: impl Fn(&RecordedRequest) -> MockResponse + Send + Sync + 'static,
    ) {
        *self.state.handler.lock().unwrap() = Some(Arc::new(handler));
    }

    /// Every request so far, in arrival order. Fails the test if any request carried a
    /// tool output that answers no earlier tool call.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.assert_valid();
        self.state.requests.borrow().clone()
    }

    /// The JSON bodies of every request so far.
    pub fn bodies(&self) -> Vec<Value> {
        self.requests().into_iter().map(|r| r.body).collect()
    }

    /// Waits until `count` requests have arrived and returns them.
    pub async fn wait_for_requests(&self, count: usize) -> Vec<RecordedRequest> {
        let mut rx = self.state.requests.subscribe();
        tokio::time::timeout(MOCK_WAIT, rx.wait_for(|r| r.len() >= count))
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {count} model requests"))
            .expect("mock state dropped");
        self.requests()
    }

    pub fn assert_valid(&self) {
        let violations = self.state.violations.lock().unwrap();
        assert!(
            violations.is_empty(),
            "invalid model requests: {violations:#?}"
        );
    }
}

impl Drop for MockLlm {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn handle(
    State(state): State<Arc<MockState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    // Like a real OpenAI or Anthropic server, only the model endpoints answer: a client
    // that looks for llama.cpp's `/props` or Ollama's `/api/show` (the context window)
    // gets a 404 and consumes nothing of the script.
    let path = uri.path();
    if method != Method::POST
        || !(path.ends_with("/chat/completions")
            || path.ends_with("/messages")
            || path.ends_with("/responses"))
    {
        return plain(StatusCode::NOT_FOUND, format!("mock: no endpoint {path}"));
    }
    let raw_body = String::from_utf8_lossy(&body).into_owned();
    let request = RecordedRequest {
        method: method.to_string(),
        path: uri.path().to_string(),
        headers: headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_ascii_lowercase(),
                    v.to_str().unwrap_or("").to_string(),
                )
            })
            .collect(),
        body: serde_json::from_str(&raw_body).unwrap_or(Value::Null),
        raw_body,
        received_at: Instant::now(),
    };
    let problems = tool_output_problems(&request.body);
    state.requests.send_modify(|r| r.push(request.clone()));
    if !problems.is_empty() {
        state.violations.lock().unwrap().extend(problems.clone());
        return plain(
            StatusCode::BAD_REQUEST,
            format!("mock: {}", problems.join("; ")),
        );
    }
    let scripted = state.script.lock().unwrap().pop_front();
    let response = match scripted {
        Some(response) => response,
        None => match state.handler.lock().unwrap().clone() {
            Some(handler) => handler(&request),
            None => {
                return plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "mock: no scripted response left".into(),
                );
            }
        },
    };
    let mut builder = Response::builder().status(response.status);
    for (name, value) in &response.headers {
        builder = builder.header(name, value);
    }
    let body = match response.body {
        MockBody::Chunks { pieces, abort } => {
            let mut items: Vec<Result<Bytes, std::io::Error>> =
                pieces.into_iter().map(Ok).collect();
            if abort {
                items.push(Err(std::io::Error::other(
                    "mock: connection broken on purpose",
                )));
            }
            let stream = futures::stream::iter(items).then(|item| async move {
                // Give each piece its own write, so the client sees the split.
                tokio::task::yield_now().await;
                item
            });
            Body::from_stream(stream)
        }
        MockBody::Live { rx, closed } => {
            let guard = CloseGuard(closed);
            let stream = futures::stream::unfold((rx, guard), |(mut rx, guard)| async move {
                rx.recv()
                    .await
                    .map(|piece| (Ok::<Bytes, std::io::Error>(piece), (rx, guard)))
            });
            Body::from_stream(stream)
        }
    };
    builder.body(body).unwrap()
}

fn plain(status: StatusCode, text: String) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain")
        .body(Body::from(text))
        .unwrap()
}

/// Like codex-rs's harness: every tool output in a request must answer a tool call made
/// earlier in the same request. Knows OpenAI's (Chat Completions and Responses) and
/// Anthropic's shapes.
pub fn tool_output_problems(body: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(items) = body.get("input").and_then(Value::as_array) {
        // Responses: `function_call` items, then `function_call_output` items naming them.
        let mut calls: HashSet<&str> = HashSet::new();
        let mut answered: HashSet<&str> = HashSet::new();
        for (i, item) in items.iter().enumerate() {
            let id = item.get("call_id").and_then(Value::as_str).unwrap_or("");
            match item.get("type").and_then(Value::as_str) {
                Some("function_call" | "custom_tool_call") => {
                    calls.insert(id);
                }
                Some("function_call_output" | "custom_tool_call_output") => {
                    if !calls.contains(id) {
                        problems.push(format!(
                            "input item {i} is a tool output for {id:?}, which no earlier tool call made"
                        ));
                    }
                    if !answered.insert(id) {
                        problems.push(format!(
                            "input item {i} answers tool call {id:?} a second time"
                        ));
                    }
                }
                _ => {}
            }
        }
        return problems;
    }
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return problems;
    };
    let mut calls: HashSet<String> = HashSet::new();
    let mut answered: HashSet<String> = HashSet::new();
    for (i, message) in messages.iter().enumerate() {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        for call in message
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(id) = call.get("id").and_then(Value::as_str) {
                calls.insert(id.to_string());
            }
        }
        let mut outputs = Vec::new();
        if role == "tool" {
            outputs.push(
                message
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            );
        }
        for block in message
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            match block.get("type").and_then(Value::as_str) {
                Some("tool_use") => {
                    if let Some(id) = block.get("id").and_then(Value::as_str) {
                        calls.insert(id.to_string());
                    }
                }
                Some("tool_result") => outputs.push(
                    block
                        .get("tool_use_id")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                ),
                _ => {}
            }
        }
        for id in outputs {
            if !calls.contains(&id) {
                problems.push(format!(
                    "message {i} is a tool output for {id:?}, which no earlier tool call made"
                ));
            }
            if !answered.insert(id.clone()) {
                problems.push(format!(
                    "message {i} answers tool call {id:?} a second time"
                ));
            }
        }
    }
    problems
}

/// Builders for OpenAI Chat Completions stream chunks, shaped as the API reference shows
/// them (with `stream_options.include_usage`, every chunk has `"usage": null` until the
/// last one, whose `choices` is empty).
pub mod openai {
    use serde_json::{Value, json};

    pub const DONE: &str = "data: [DONE]\n\n";

    /// A `chat.completion.chunk` with one choice.
    pub fn chunk(delta: Value, finish_reason: Option<&str>) -> Value {
        json!({
            "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
            "object": "chat.completion.chunk",
            "created": 1741570283,
            "model": "gpt-4o-2024-08-06",
            "service_tier": "default",
            "system_fingerprint": "fp_eb9dce56a8",
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}],
            "usage": null
        })
    }

    pub fn role() -> Value {
        chunk(
            json!({"role": "assistant", "content": "", "refusal": null}),
            None,
        )
    }

    pub fn text(text: &str) -> Value {
        chunk(json!({"content": text}), None)
    }

    /// The first fragment of a tool call: id, name and empty arguments.
    pub fn tool_call(index: u64, id: &str, name: &str) -> Value {
        chunk(
            json!({"tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}),
            None,
        )
    }

    /// A later fragment of a tool call's arguments.
    pub fn tool_args(index: u64, fragment: &str) -> Value {
        chunk(
            json!({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}),
            None,
        )
    }

    pub fn finish(reason: &str) -> Value {
        chunk(json!({}), Some(reason))
    }

    /// The usage chunk that `include_usage` adds before `[DONE]`.
    pub fn usage(prompt: u64, completion: u64) -> Value {
        json!({
            "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
            "object": "chat.completion.chunk",
            "created": 1741570283,
            "model": "gpt-4o-2024-08-06",
            "service_tier": "default",
            "system_fingerprint": "fp_eb9dce56a8",
            "choices": [],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
            }
        })
    }

    /// One SSE event: `data: <compact JSON>\n\n`.
    pub fn data(chunk: &Value) -> String {
        format!("data: {}\n\n", serde_json::to_string(chunk).unwrap())
    }

    /// The chunks as SSE events, then `[DONE]`.
    pub fn stream(chunks: &[Value]) -> String {
        let mut out: String = chunks.iter().map(data).collect();
        out.push_str(DONE);
        out
    }

    /// A whole text answer: role, the text in pieces, stop, usage, `[DONE]`.
    pub fn text_answer(pieces: &[&str], usage_tokens: (u64, u64)) -> String {
        let mut chunks = vec![role()];
        chunks.extend(pieces.iter().map(|p| text(p)));
        chunks.push(finish("stop"));
        chunks.push(usage(usage_tokens.0, usage_tokens.1));
        stream(&chunks)
    }

    /// A whole tool-call answer: each call's id and name, its arguments in two pieces.
    pub fn tool_answer(calls: &[(&str, &str, Value)], usage_tokens: (u64, u64)) -> String {
        let mut chunks = vec![chunk(json!({"role": "assistant", "content": null}), None)];
        for (index, (id, name, arguments)) in calls.iter().enumerate() {
            let index = index as u64;
            let text = arguments.to_string();
            let (head, tail) = text.split_at(text.len() / 2);
            chunks.push(tool_call(index, id, name));
            chunks.push(tool_args(index, head));
            chunks.push(tool_args(index, tail));
        }
        chunks.push(finish("tool_calls"));
        chunks.push(usage(usage_tokens.0, usage_tokens.1));
        stream(&chunks)
    }
}

/// Builders for Anthropic Messages stream events, shaped as the API reference shows them
/// (`event: <type>` then `data: <JSON with the same type>`).
pub mod anthropic {
    use serde_json::{Value, json};

    pub fn event(name: &str, data: Value) -> String {
        format!(
            "event: {name}\ndata: {}\n\n",
            serde_json::to_string(&data).unwrap()
        )
    }

    pub fn message_start(input_tokens: u64) -> String {
        event(
            "message_start",
            json!({"type": "message_start", "message": {
                "id": "msg_014p7gG3wDgGV9EUtLvnow3U",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-5-20250929",
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": {"input_tokens": input_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 1}
            }}),
        )
    }

    pub fn ping() -> String {
        event("ping", json!({"type": "ping"}))
    }

    pub fn text_start(index: u64) -> String {
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
        )
    }

    pub fn text_delta(index: u64, text: &str) -> String {
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}),
        )
    }

    pub fn tool_start(index: u64, id: &str, name: &str) -> String {
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
        )
    }

    pub fn input_json(index: u64, partial: &str) -> String {
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": partial}}),
        )
    }

    pub fn block_stop(index: u64) -> String {
        event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        )
    }

    pub fn message_delta(stop_reason: &str, output_tokens: u64) -> String {
        event(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null}, "usage": {"output_tokens": output_tokens}}),
        )
    }

    pub fn message_stop() -> String {
        event("message_stop", json!({"type": "message_stop"}))
    }

    pub fn error(kind: &str, message: &str) -> String {
        event(
            "error",
            json!({"type": "error", "error": {"type": kind, "message": message}}),
        )
    }

    /// A whole text answer in the given pieces.
    pub fn text_answer(pieces: &[&str], input_tokens: u64, output_tokens: u64) -> String {
        let mut out = message_start(input_tokens);
        out.push_str(&text_start(0));
        out.push_str(&ping());
        for piece in pieces {
            out.push_str(&text_delta(0, piece));
        }
        out.push_str(&block_stop(0));
        out.push_str(&message_delta("end_turn", output_tokens));
        out.push_str(&message_stop());
        out
    }

    /// A whole tool-use answer: each call's input in two pieces.
    pub fn tool_answer(
        calls: &[(&str, &str, Value)],
        input_tokens: u64,
        output_tokens: u64,
    ) -> String {
        let mut out = message_start(input_tokens);
        for (index, (id, name, input)) in calls.iter().enumerate() {
            let index = index as u64;
            let text = input.to_string();
            let (head, tail) = text.split_at(text.len() / 2);
            out.push_str(&tool_start(index, id, name));
            out.push_str(&input_json(index, ""));
            out.push_str(&input_json(index, head));
            out.push_str(&input_json(index, tail));
            out.push_str(&block_stop(index));
        }
        out.push_str(&message_delta("tool_use", output_tokens));
        out.push_str(&message_stop());
        out
    }
}

/// Builders for OpenAI Responses stream events, shaped as the API reference shows them
/// (`event: <type>` then `data: <JSON with the same type and a sequence number>`): a
/// response's output items added, their deltas, each item done, then the response
/// completed with its usage.
pub mod responses {
    use serde_json::{Value, json};

    /// Numbers the events of one response.
    struct Events {
        out: String,
        next: u64,
    }

    impl Events {
        fn push(&mut self, kind: &str, mut data: Value) {
            data["type"] = json!(kind);
            data["sequence_number"] = json!(self.next);
            self.next += 1;
            self.out.push_str(&format!(
                "event: {kind}\ndata: {}\n\n",
                serde_json::to_string(&data).unwrap()
            ));
        }
    }

    fn response(id: &str, status: &str, output: Vec<Value>, usage: Option<(u64, u64)>) -> Value {
        json!({
            "id": id,
            "object": "response",
            "created_at": 1_764_000_000,
            "status": status,
            "model": "gpt-test",
            "output": output,
            "usage": usage.map(|(input, output)| json!({
                "input_tokens": input,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": output,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": input + output
            })),
        })
    }

    fn answer(items: Vec<(Value, Vec<Value>)>, usage: (u64, u64)) -> String {
        let id = "resp_68af4030592c81938ec0a5fbab4a3e9f";
        let mut events = Events {
            out: String::new(),
            next: 0,
        };
        events.push(
            "response.created",
            json!({"response": response(id, "in_progress", Vec::new(), None)}),
        );
        events.push(
            "response.in_progress",
            json!({"response": response(id, "in_progress", Vec::new(), None)}),
        );
        let mut done = Vec::new();
        for (index, (item, deltas)) in items.into_iter().enumerate() {
            let mut added = item.clone();
            added["status"] = json!("in_progress");
            if added["type"] == "message" {
                added["content"] = json!([]);
            } else {
                added["arguments"] = json!("");
            }
            events.push(
                "response.output_item.added",
                json!({"output_index": index, "item": added}),
            );
            for delta in deltas {
                let kind = if item["type"] == "message" {
                    "response.output_text.delta"
                } else {
                    "response.function_call_arguments.delta"
                };
                let mut data =
                    json!({"item_id": item["id"], "output_index": index, "delta": delta});
                if item["type"] == "message" {
                    data["content_index"] = json!(0);
                }
                events.push(kind, data);
            }
            events.push(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            );
            done.push(item);
        }
        events.push(
            "response.completed",
            json!({"response": response(id, "completed", done, Some(usage))}),
        );
        events.out
    }

    /// A whole text answer in the given pieces.
    pub fn text_answer(pieces: &[&str], usage: (u64, u64)) -> String {
        let text: String = pieces.concat();
        let item = json!({
            "id": "msg_68af4033ac9c8193a0c8b4e8ba2b1c8b",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]
        });
        answer(
            vec![(item, pieces.iter().map(|p| json!(p)).collect())],
            usage,
        )
    }

    /// A whole tool-call answer: one `function_call` item per call, its arguments in two
    /// pieces.
    pub fn tool_answer(calls: &[(&str, &str, Value)], usage: (u64, u64)) -> String {
        let items = calls
            .iter()
            .enumerate()
            .map(|(i, (call_id, name, arguments))| {
                let text = arguments.to_string();
                let (head, tail) = text.split_at(text.len() / 2);
                let item = json!({
                    "id": format!("fc_68af40{i}"),
                    "type": "function_call",
                    "status": "completed",
                    "name": name,
                    "call_id": call_id,
                    "arguments": text
                });
                (item, vec![json!(head), json!(tail)])
            })
            .collect();
        answer(items, usage)
    }
}
