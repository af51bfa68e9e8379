//! The context window of a model (config, then the server where it says, then a built-in table, then a safe default), token estimates of a request, and the context meter the UI shows.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use ts_rs::TS;

use crate::config::ProviderConfig;
pub use crate::protocol::ContextMeter;
use crate::protocol::{Message, Role};
use crate::provider::{RequestMessages, ToolSpec};

/// The window assumed when nothing says otherwise: small enough that compaction starts
/// before any common server (Ollama's 4k default aside, which `/api/show` reports) overflows.
pub const DEFAULT_WINDOW: u32 = 8192;

/// Ollama runs a model with `num_ctx` tokens, not the model's trained length: without a
/// `num_ctx` parameter it uses its own default and silently cuts longer prompts, so the
/// trained length is capped at this default rather than trusted.
pub const OLLAMA_DEFAULT_NUM_CTX: u32 = 4096;

/// How long a server gets to say its window: this runs before the first model call.
pub const QUERY_TIMEOUT: Duration = Duration::from_millis(1500);

/// Where a window figure came from (the settings page shows it next to the figure).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[ts(export)]
#[serde(rename_all = "snake_case")]
pub enum WindowSource {
    /// `provider.context_window` in the config.
    Config,
    /// llama.cpp `/props`, Ollama `/api/show` or LM Studio `/api/v0/models`.
    Server,
    /// The built-in table of well-known OpenAI and Anthropic models.
    Table,
    /// [`DEFAULT_WINDOW`].
    Default,
}

/// A model's context window in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct ContextWindow {
    pub tokens: u32,
    pub source: WindowSource,
}

/// The window for a provider block: `context_window` when set, else what the server says
/// (OpenAI-compatible local servers only), else the table, else [`DEFAULT_WINDOW`].
/// Never fails: a server that does not answer is simply not asked again by this call.
pub async fn resolve(config: &ProviderConfig) -> ContextWindow {
    if let Some(tokens) = config.context_window.filter(|t| *t > 0) {
        return ContextWindow {
            tokens,
            source: WindowSource::Config,
        };
    }
    if config.kind == "openai" && !is_cloud_api(&config.base_url) {
        if let Some(tokens) = ask_server(&config.base_url, &config.model).await {
            return ContextWindow {
                tokens,
                source: WindowSource::Server,
            };
        }
    }
    match builtin_window(&config.model) {
        Some(tokens) => ContextWindow {
            tokens,
            source: WindowSource::Table,
        },
        None => ContextWindow {
            tokens: DEFAULT_WINDOW,
            source: WindowSource::Default,
        },
    }
}

/// Hosted APIs that answer none of the local servers' introspection endpoints: asking
/// them would only cost a round trip (and a 404) before every run.
fn is_cloud_api(base_url: &str) -> bool {
    let host = base_url
        .split("://")
        .nth(1)
        .unwrap_or(base_url)
        .split(['/', ':'])
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    [
        "api.openai.com",
        "openrouter.ai",
        "api.anthropic.com",
        "api.groq.com",
        "api.mistral.ai",
        "api.deepseek.com",
        "api.together.xyz",
        "generativelanguage.googleapis.com",
    ]
    .iter()
    .any(|cloud| host == *cloud || host.ends_with(&format!(".{cloud}")))
}

/// The server's root from an OpenAI base URL: `http://host:port/v1` → `http://host:port`.
pub fn server_root(base_url: &str) -> String {
    let trimmed = base_url.trim_end_matches('/');
    trimmed
        .strip_suffix("/v1")
        .unwrap_or(trimmed)
        .trim_end_matches('/')
        .to_string()
}

/// Asks the server behind an OpenAI base URL for the model's window: llama.cpp, Ollama
/// and LM Studio are asked at once (each answers only its own endpoint) and the first
/// that says wins in that order.
pub async fn ask_server(base_url: &str, model: &str) -> Option<u32> {
    let client = reqwest::Client::builder()
        .timeout(QUERY_TIMEOUT)
        .connect_timeout(QUERY_TIMEOUT)
        .build()
        .ok()?;
    let root = server_root(base_url);
    let (llama, ollama, lm_studio) = futures::join!(
        llama_cpp_window(&client, &root),
        ollama_window(&client, &root, model),
        lm_studio_window(&client, &root, model),
    );
    llama.or(ollama).or(lm_studio)
}

/// How many requests the server behind an OpenAI base URL serves at once: llama.cpp says
/// (`GET /props` → `total_slots`, its `-np`); Ollama (`GET /api/version`) and LM Studio
/// (`GET /api/v0/models`) do not, so they count as one, the safe guess for a local
/// model on one machine (raise it with `max_concurrent`). Other servers (vLLM, hosted
/// APIs, anything that answers none of these) have no limit of their own here.
pub async fn server_slots(config: &ProviderConfig) -> Option<u32> {
    if config.kind != "openai" || is_cloud_api(&config.base_url) {
        return None;
    }
    let client = reqwest::Client::builder()
        .timeout(QUERY_TIMEOUT)
        .connect_timeout(QUERY_TIMEOUT)
        .build()
        .ok()?;
    let root = server_root(&config.base_url);
    let (llama, ollama, lm_studio) = futures::join!(
        get_json(client.get(format!("{root}/props"))),
        get_json(client.get(format!("{root}/api/version"))),
        get_json(client.get(format!("{root}/api/v0/models"))),
    );
    if let Some(slots) = llama.as_ref().and_then(|b| positive(b.get("total_slots"))) {
        return Some(slots);
    }
    let is_ollama = ollama.is_some_and(|b| b.get("version").is_some_and(Value::is_string));
    let is_lm_studio = lm_studio.is_some_and(|b| b.get("data").is_some_and(Value::is_array));
    (is_ollama || is_lm_studio).then_some(1)
}

async fn get_json(request: reqwest::RequestBuilder) -> Option<Value> {
    let response = match request.send().await {
        Ok(response) => response,
        Err(err) => {
            tracing::debug!("context window query failed: {err}");
            return None;
        }
    };
    if !response.status().is_success() {
        return None;
    }
    response.json::<Value>().await.ok()
}

fn positive(value: Option<&Value>) -> Option<u32> {
    value
        .and_then(Value::as_u64)
        .filter(|n| *n > 0)
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// llama.cpp's `llama-server`: `GET /props` → `default_generation_settings.n_ctx` (the
/// context of one slot, which is what one request gets).
pub async fn llama_cpp_window(client: &reqwest::Client, root: &str) -> Option<u32> {
    let body = get_json(client.get(format!("{root}/props"))).await?;
    positive(body.pointer("/default_generation_settings/n_ctx"))
        .or_else(|| positive(body.get("n_ctx")))
}

/// Ollama: `POST /api/show {"model"}` → a `num_ctx` line in `parameters` when the model
/// sets one, else `model_info.<arch>.context_length` capped at Ollama's own default.
pub async fn ollama_window(client: &reqwest::Client, root: &str, model: &str) -> Option<u32> {
    let request = client
        .post(format!("{root}/api/show"))
        .json(&serde_json::json!({ "model": model }));
    let body = get_json(request).await?;
    let num_ctx = body
        .get("parameters")
        .and_then(Value::as_str)
        .and_then(|text| {
            text.lines().find_map(|line| {
                let mut words = line.split_whitespace();
                (words.next() == Some("num_ctx"))
                    .then(|| words.next()?.parse::<u32>().ok())
                    .flatten()
            })
        })
        .filter(|n| *n > 0);
    if num_ctx.is_some() {
        return num_ctx;
    }
    let trained = body
        .get("model_info")
        .and_then(Value::as_object)?
        .iter()
        .find(|(key, _)| key.ends_with(".context_length"))
        .and_then(|(_, value)| positive(Some(value)))?;
    Some(trained.min(OLLAMA_DEFAULT_NUM_CTX))
}

/// LM Studio: `GET /api/v0/models` → the entry whose `id` is the model:
/// `loaded_context_length` when it is loaded with one, else `max_context_length`.
pub async fn lm_studio_window(client: &reqwest::Client, root: &str, model: &str) -> Option<u32> {
    let body = get_json(client.get(format!("{root}/api/v0/models"))).await?;
    let entry = body
        .get("data")
        .and_then(Value::as_array)?
        .iter()
        .find(|entry| entry.get("id").and_then(Value::as_str) == Some(model))?;
    positive(entry.get("loaded_context_length"))
        .or_else(|| positive(entry.get("max_context_length")))
}

/// Well-known hosted models, by id prefix (the longest matching prefix wins; a router's
/// `vendor/` prefix, as OpenRouter ids have, is ignored).
pub fn builtin_window(model: &str) -> Option<u32> {
    const TABLE: &[(&str, u32)] = &[
        ("gpt-5", 400_000),
        ("gpt-4.1", 1_047_576),
        ("gpt-4o", 128_000),
        ("gpt-4-turbo", 128_000),
        ("gpt-4-32k", 32_768),
        ("gpt-4", 8_192),
        ("gpt-3.5-turbo", 16_385),
        ("o1-mini", 128_000),
        ("o1", 200_000),
        ("o3", 200_000),
        ("o4-mini", 200_000),
        ("claude-", 200_000),
    ];
    let id = model
        .rsplit('/')
        .next()
        .unwrap_or(model)
        .to_ascii_lowercase();
    TABLE
        .iter()
        .filter(|(prefix, _)| id.starts_with(prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, tokens)| *tokens)
}

/// Counts bytes written through it, so a size is known without keeping the text.
struct ByteCount(usize);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub(crate) fn serialized_len<T: Serialize + ?Sized>(value: &T) -> usize {
    let mut count = ByteCount(0);
    // Serialising our own types into a counter cannot fail; a failure counts as empty.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// What one image costs a model, about: providers count images by their pixels, not by
/// their base64 (OpenAI's high detail tiles and Anthropic's width × height / 750 land
/// near this for screenshots), so a megabyte of base64 is not 250,000 tokens.
pub const IMAGE_TOKENS: usize = 1_600;

/// Tokens of one message, estimated as a quarter of its JSON size (rounded up), with
/// each image counted as [`IMAGE_TOKENS`] instead of its base64.
pub fn message_tokens(message: &Message) -> usize {
    tokens_of(message, serialized_len(message))
}

/// [`message_tokens`] of a message whose JSON is `json` bytes long.
fn tokens_of(message: &Message, json: usize) -> usize {
    if message.images.is_empty() {
        return json.div_ceil(4);
    }
    let base64: usize = message.images.iter().map(|i| i.data.len()).sum();
    (json - base64).div_ceil(4) + message.images.len() * IMAGE_TOKENS
}

/// Tokens of a request, estimated as a quarter of the JSON size of its messages and tools:
/// the figure before a provider has reported any, and the one compaction plans with.
pub fn estimate_tokens(messages: &[Message], tools: &[ToolSpec]) -> usize {
    Counted::of(messages.iter()).estimate(messages.len(), tools_json(tools))
}

/// [`estimate_tokens`] of a request built by the context builder, with its tools' JSON size
/// counted already ([`tools_json`]).
pub fn estimate_request(messages: &RequestMessages, tools_json: usize) -> usize {
    Counted::of(messages.iter()).estimate(messages.len(), tools_json)
}

/// The JSON size of the tools a request offers, as [`estimate_tokens`] counts it (none
/// offered: nothing, not the two bytes of an empty list).
pub fn tools_json(tools: &[ToolSpec]) -> usize {
    if tools.is_empty() {
        0
    } else {
        serialized_len(tools)
    }
}

/// What the estimate of a list of messages adds up, one message at a time: the estimate is
/// a quarter of the list's JSON (its items, a comma between each two, the brackets) and the
/// tools', or, when a message has images, the sum of [`message_tokens`] (an image costs
/// [`IMAGE_TOKENS`], not its base64).
#[derive(Debug, Default, Clone, Copy)]
struct Counted {
    json: usize,
    tokens: usize,
    images: bool,
}

impl Counted {
    fn of<'a>(messages: impl Iterator<Item = &'a Message>) -> Self {
        let mut counted = Counted::default();
        for message in messages {
            counted.add(message);
        }
        counted
    }

    fn add(&mut self, message: &Message) {
        let json = serialized_len(message);
        self.json += json;
        self.tokens += tokens_of(message, json);
        self.images |= !message.images.is_empty();
    }

    fn and(self, other: Counted) -> Counted {
        Counted {
            json: self.json + other.json,
            tokens: self.tokens + other.tokens,
            images: self.images || other.images,
        }
    }

    /// The estimate of a request of `len` messages counted here, with tools of `tools_json`.
    fn estimate(self, len: usize, tools_json: usize) -> usize {
        if self.images {
            return self.tokens + tools_json.div_ceil(4);
        }
        let commas = len.saturating_sub(1);
        (2 + commas + self.json + tools_json).div_ceil(4)
    }
}

/// The estimate of a run's requests ([`estimate_request`]), the shared history counted once
/// per message. Between two calls of a run its history only grows, so two requests with the
/// same compaction marker send the same messages of the history up to where the first
/// ended: the next counts only what was appended since. A parent woken forty times in a
/// fan-out serialised its whole history of 2,000 messages at each call to estimate it
/// (issue 31). The request's own messages (system, kept, summary) are counted every time.
#[derive(Debug, Default, Clone)]
pub struct RequestSize {
    /// The JSON size of the tools the requests offer ([`tools_json`]): the same for every
    /// call of a run.
    tools_json: usize,
    /// The marker's id and the first index of the shared history the counts are for.
    key: Option<(Option<String>, usize)>,
    /// How many messages of the shared history are counted, and their counts.
    counted: usize,
    shared: Counted,
}

impl RequestSize {
    /// For requests that offer tools of `tools_json` bytes of JSON ([`tools_json`]).
    pub fn new(tools_json: usize) -> Self {
        RequestSize {
            tools_json,
            ..RequestSize::default()
        }
    }

    /// [`estimate_request`] of `request`, built with the compaction marker `marker` (its
    /// id) from a history that only grew since the last request this was given.
    pub fn estimate(&mut self, request: &RequestMessages, marker: Option<&str>) -> usize {
        let from = request.shared_from();
        let head = request.head_len();
        let shared = request.len() - head;
        // Compared before anything is allocated: the key changes only with a compaction.
        let same = self
            .key
            .as_ref()
            .is_some_and(|(id, at)| id.as_deref() == marker && *at == from);
        if !same || self.counted > shared {
            *self = RequestSize {
                key: Some((marker.map(str::to_string), from)),
                ..RequestSize::new(self.tools_json)
            };
        }
        for message in request.iter().skip(head + self.counted) {
            self.shared.add(message);
        }
        self.counted = shared;
        Counted::of(request.iter().take(head))
            .and(self.shared)
            .estimate(request.len(), self.tools_json)
    }
}

/// The tokens the next request will use: the provider's count for the last answer of
/// this context (its input plus its output, which is now part of the history) plus an
/// estimate of what came after it, or the estimate of the whole request when that is
/// larger (a count can be low by the answer's own framing, and then a request would pass
/// the threshold unseen); before any answer, or when the last answer predates the latest
/// compaction (whose request was another), the estimate alone.
///
/// `compacted_at` is the history length when the latest compaction was made
/// ([`super::compaction::Compaction::at`]); `estimate` is the request's
/// ([`estimate_request`], or a run's [`RequestSize`]).
pub fn used_tokens(history: &[Message], compacted_at: Option<usize>, estimate: usize) -> usize {
    let since = compacted_at.unwrap_or(0).min(history.len());
    let reported = history[since..]
        .iter()
        .enumerate()
        .rev()
        .find_map(|(offset, m)| match (m.role, m.usage) {
            (Role::Assistant, Some(usage)) if usage.input_tokens > 0 => {
                Some((since + offset, usage))
            }
            _ => None,
        });
    match reported {
        Some((index, usage)) => {
            let after: usize = history[index + 1..].iter().map(message_tokens).sum();
            let counted = usize::try_from(usage.input_tokens + usage.output_tokens)
                .unwrap_or(usize::MAX)
                .saturating_add(after);
            counted.max(estimate)
        }
        None => estimate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::compaction::{Compaction, CompactionKind, build_messages};
    use std::sync::Arc;

    /// A run's estimate, counting each message of its history once, is the estimate of the
    /// whole request at every call: as the history grows, across a compaction (a new
    /// marker: counted again from its cut, with its stubs), with images, and when the
    /// request's own messages change.
    #[test]
    fn a_runs_estimate_counted_once_per_message_is_the_whole_requests() {
        let tools = 123;
        let mut size = RequestSize::new(tools);
        let mut history = Arc::new(Vec::new());
        let marker = |id: &str, at: usize, elided: Vec<usize>| Compaction {
            id: id.into(),
            kind: CompactionKind::Summary,
            at,
            // The history runs user, assistant, tool result: 6 is a person's message, 8,
            // 11 and 14 are tool results.
            first_kept: 6,
            kept_user: vec![0, 3],
            elided,
            summary: Some(format!("summary {id}")),
            tokens_before: 0,
            tokens_after: 0,
            note: None,
        };
        for step in 0..30 {
            let h = Arc::make_mut(&mut history);
            h.push(Message::user(format!("u{step}"), "q".repeat(step * 7)));
            let mut answer = Message::assistant(
                None,
                vec![crate::protocol::ToolCall {
                    id: format!("c{step}"),
                    name: "read_file".into(),
                    arguments: serde_json::json!({"path": format!("f{step}")}),
                }],
            );
            answer.id = Some(format!("a{step}"));
            h.push(answer);
            let mut result = Message::tool(format!("c{step}"), "r".repeat(500 + step * 31));
            if step == 17 {
                result.images.push(crate::protocol::ImagePart {
                    media_type: "image/png".into(),
                    data: "A".repeat(5_000),
                });
            }
            h.push(result);
            // No marker at first, then one, then another (a second compaction), and the
            // system message changes once (another run's, as after a resume).
            let compaction = match step {
                0..10 => None,
                10..20 => Some(marker("first", 30, vec![8, 11])),
                // The same cut, one more result elided: what was counted whole is a stub now.
                _ => Some(marker("second", 60, vec![8, 11, 14])),
            };
            let system = if step < 25 {
                "system"
            } else {
                "system, changed"
            };
            let request = build_messages(Message::system(system), &history, compaction.as_ref());
            let whole = estimate_request(&request, tools);
            // The estimate by its definition, from the list the request stands for.
            let list = request.to_vec();
            let direct = if list.iter().any(|m| !m.images.is_empty()) {
                list.iter().map(message_tokens).sum::<usize>() + tools.div_ceil(4)
            } else {
                (serde_json::to_vec(&list).unwrap().len() + tools).div_ceil(4)
            };
            assert_eq!(whole, direct, "step {step}");
            if compaction.is_some() {
                // The stubs are sent (and counted) instead of the results they stand for.
                let mut unelided = compaction.clone().unwrap();
                unelided.elided.clear();
                let full = build_messages(Message::system(system), &history, Some(&unelided));
                assert!(whole < estimate_request(&full, tools), "step {step}");
            }
            assert_eq!(
                size.estimate(&request, compaction.as_ref().map(|m| m.id.as_str())),
                whole,
                "step {step}"
            );
            // The same request again counts nothing twice.
            assert_eq!(
                size.estimate(&request, compaction.as_ref().map(|m| m.id.as_str())),
                whole
            );
        }
    }

    #[test]
    fn an_image_counts_as_a_fixed_cost_not_as_its_base64() {
        let mut message = Message::user("u", "look at this");
        let plain = message_tokens(&message);
        message.images.push(crate::protocol::ImagePart {
            media_type: "image/png".into(),
            data: "A".repeat(1_000_000),
        });
        // The image's JSON framing (type, field names) is counted, its base64 is not.
        let tokens = message_tokens(&message);
        assert!(
            (plain + IMAGE_TOKENS..plain + IMAGE_TOKENS + 20).contains(&tokens),
            "{tokens}"
        );
        let request = [Message::system("s"), message];
        let tokens = estimate_tokens(&request, &[]);
        assert!(tokens < 2 * IMAGE_TOKENS, "{tokens}");
    }

    #[test]
    fn table_matches_longest_prefix_and_ignores_router_prefix() {
        assert_eq!(builtin_window("gpt-4o-mini"), Some(128_000));
        assert_eq!(builtin_window("gpt-4"), Some(8_192));
        assert_eq!(builtin_window("gpt-4-turbo-2024-04-09"), Some(128_000));
        assert_eq!(builtin_window("openai/gpt-4.1-mini"), Some(1_047_576));
        assert_eq!(builtin_window("anthropic/claude-sonnet-4.5"), Some(200_000));
        assert_eq!(builtin_window("o1-mini"), Some(128_000));
        assert_eq!(builtin_window("qwen2.5-coder"), None);
    }

    #[test]
    fn server_root_strips_v1_and_cloud_hosts_are_known() {
        assert_eq!(
            server_root("http://127.0.0.1:8080/v1"),
            "http://127.0.0.1:8080"
        );
        assert_eq!(
            server_root("http://127.0.0.1:8080/v1/"),
            "http://127.0.0.1:8080"
        );
        assert_eq!(server_root("http://h:1/"), "http://h:1");
        assert!(is_cloud_api("https://api.openai.com/v1"));
        assert!(is_cloud_api("https://openrouter.ai/api/v1"));
        assert!(!is_cloud_api("http://127.0.0.1:11434/v1"));
    }

    #[test]
    fn estimates_are_a_quarter_of_the_json() {
        let messages = vec![Message::system("s"), Message::user("u", "hello")];
        let bytes = serde_json::to_vec(&messages).unwrap().len();
        assert_eq!(estimate_tokens(&messages, &[]), bytes.div_ceil(4));
        let tool = ToolSpec {
            name: "t".into(),
            description: "d".into(),
            parameters: std::sync::Arc::new(serde_json::json!({"type": "object"})),
        };
        let tools_bytes = serde_json::to_vec(std::slice::from_ref(&tool))
            .unwrap()
            .len();
        assert_eq!(
            estimate_tokens(&messages, &[tool]),
            (bytes + tools_bytes).div_ceil(4)
        );
    }

    #[test]
    fn used_prefers_reported_usage_unless_a_compaction_came_after() {
        let mut answer = Message::assistant(Some("a".into()), vec![]);
        answer.usage = Some(crate::protocol::Usage {
            input_tokens: 1000,
            output_tokens: 20,
        });
        let next = Message::user("2", "next question");
        let history = vec![Message::user("1", "q"), answer, next.clone()];
        let request = vec![Message::system("s")];
        assert_eq!(
            used_tokens(&history, None, estimate_tokens(&request, &[])),
            1020 + message_tokens(&next)
        );
        // A count below the request's own estimate does not hide it.
        let big = vec![Message::system("s".repeat(8000))];
        assert_eq!(
            used_tokens(&history, None, estimate_tokens(&big, &[])),
            estimate_tokens(&big, &[])
        );
        // The answer predates the compaction: its count was for another request.
        assert_eq!(
            used_tokens(&history, Some(2), estimate_tokens(&request, &[])),
            estimate_tokens(&request, &[])
        );
    }

    #[test]
    fn meter_label() {
        assert_eq!(ContextMeter::new(13_120, 32_000).label(), "41 % of 32k");
        assert_eq!(ContextMeter::new(820, 2_000).label(), "41 % of 2k");
        assert_eq!(ContextMeter::new(1, 32_768).label(), "0 % of 32k");
        assert_eq!(ContextMeter::new(99_999, 8_192).percent, 100);
        assert_eq!(ContextMeter::new(10, 500).label(), "2 % of 500");
    }
}
