//! The `anthropic` kind: the Messages API with SSE streaming; mapping the OpenAI-shaped history to Anthropic's (system prompt apart, tool_use / tool_result blocks, consecutive turns of one role merged) and assembling the streamed events back into one assistant message.

use std::collections::BTreeMap;

use async_trait::async_trait;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use serde_json::{Map, Value, json};

use super::openai::decimal;
use super::{
    HttpOptions, KeySource, StreamDecoder, base_url, classify, parse_arguments, shorten,
    stream_once, with_retries,
};
use crate::config::ProviderConfig;
use crate::protocol::{Message, Role, ToolCall, Usage};
use crate::provider::{
    ModelProvider, ModelRequest, ModelResponse, ProviderError, ProviderEvent, ProviderSink,
};

/// The API version this mapping is written against (`provider.anthropic_version`).
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// The Messages API requires `max_tokens`; this is used when the config names none.
pub const DEFAULT_MAX_TOKENS: u32 = 8192;

pub struct AnthropicProvider {
    client: reqwest::Client,
    url: String,
    version: String,
    options: HttpOptions,
    keys: KeySource,
}

impl AnthropicProvider {
    pub fn new(
        config: &ProviderConfig,
        options: HttpOptions,
        keys: KeySource,
        client: reqwest::Client,
    ) -> Result<Self, ProviderError> {
        let version = super::text_knob(config, "anthropic_version", ANTHROPIC_VERSION, &[])?;
        Ok(AnthropicProvider {
            client,
            url: format!("{}/v1/messages", base_url(config)?),
            version,
            options,
            keys,
        })
    }
}

#[async_trait]
impl ModelProvider for AnthropicProvider {
    async fn generate(
        &self,
        request: ModelRequest,
        sink: ProviderSink<'_>,
    ) -> Result<ModelResponse, ProviderError> {
        let Some(key) = self.keys.resolve().await? else {
            return Err(ProviderError::Auth(
                "no API key configured: set provider.api_key_env (e.g. ANTHROPIC_API_KEY) or provider.api_key_keyring".into(),
            ));
        };
        let body = serde_json::to_vec(&request_body(&request))
            .map_err(|err| ProviderError::Other(format!("cannot encode the request: {err}")))?;
        tracing::debug!(
            url = %self.url,
            model = %request.settings.model,
            messages = request.messages.len(),
            tools = request.tools.len(),
            "messages request"
        );
        with_retries(&self.options, sink, || {
            let builder = self
                .client
                .post(&self.url)
                .header(CONTENT_TYPE, "application/json")
                .header(ACCEPT, "text/event-stream")
                .header("anthropic-version", &self.version)
                .header("x-api-key", sensitive(key.expose()))
                .body(body.clone());
            stream_once(builder, &self.options, Decoder::default(), sink)
        })
        .await
    }
}

/// A header value marked sensitive, so reqwest's and hyper's debug output hide it.
fn sensitive(key: &str) -> reqwest::header::HeaderValue {
    let mut value = reqwest::header::HeaderValue::from_str(key)
        .unwrap_or_else(|_| reqwest::header::HeaderValue::from_static(""));
    value.set_sensitive(true);
    value
}

/// Builds the Messages request from the OpenAI-shaped history.
pub(crate) fn request_body(request: &ModelRequest) -> Value {
    let system: Vec<&str> = request
        .messages
        .iter()
        .filter(|m| m.role == Role::System)
        .map(Message::text)
        .filter(|text| !text.is_empty())
        .collect();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in &request.messages {
        let (role, blocks) = match message.role {
            Role::System => continue,
            Role::User if message.images.is_empty() => ("user", text_block(message.text())),
            Role::User if request.settings.no_images => (
                "user",
                text_block(&crate::provider::without_images_text(message)),
            ),
            // Images first, then the text, as Anthropic's documentation recommends.
            Role::User => {
                let mut blocks: Vec<Value> = message
                    .images
                    .iter()
                    .map(|image| {
                        json!({
                            "type": "image",
                            "source": {"type": "base64", "media_type": image.media_type, "data": image.data},
                        })
                    })
                    .collect();
                blocks.extend(text_block(message.text()));
                ("user", blocks)
            }
            Role::Tool => {
                let mut result = json!({
                    "type": "tool_result",
                    "tool_use_id": message.tool_call_id.as_deref().unwrap_or_default(),
                });
                if !message.images.is_empty() && !request.settings.no_images {
                    // A tool result's content may hold image blocks beside its text.
                    let mut blocks = text_block(message.text());
                    blocks.extend(message.images.iter().map(|image| {
                        json!({
                            "type": "image",
                            "source": {"type": "base64", "media_type": image.media_type, "data": image.data},
                        })
                    }));
                    result["content"] = Value::Array(blocks);
                } else if !message.images.is_empty() {
                    result["content"] = json!(crate::provider::without_images_text(message));
                } else if !message.text().is_empty() {
                    result["content"] = json!(message.text());
                }
                ("user", vec![result])
            }
            Role::Assistant => {
                let mut blocks = text_block(message.text());
                blocks.extend(message.tool_calls.iter().map(|call| {
                    json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input_object(&call.arguments)})
                }));
                ("assistant", blocks)
            }
        };
        if blocks.is_empty() {
            // The API refuses empty turns; an empty message says nothing to the model.
            continue;
        }
        // The API wants turns to alternate: tool results and a report that follows them
        // become one user turn, with the results first as the API requires.
        match turns.last_mut() {
            Some((last, existing)) if *last == role => existing.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    let messages: Vec<Value> = turns
        .into_iter()
        .map(|(role, blocks)| match blocks.as_slice() {
            [only] if only["type"] == "text" => json!({"role": role, "content": only["text"]}),
            _ => json!({"role": role, "content": blocks}),
        })
        .collect();
    let mut body = Map::new();
    body.insert("model".into(), json!(request.settings.model));
    body.insert(
        "max_tokens".into(),
        json!(request.settings.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
    );
    if !system.is_empty() {
        body.insert("system".into(), json!(system.join("\n\n")));
    }
    body.insert("messages".into(), Value::Array(messages));
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|tool| {
                json!({"name": tool.name, "description": tool.description, "input_schema": tool.parameters})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(temperature) = request.settings.temperature {
        body.insert("temperature".into(), decimal(temperature));
    }
    body.insert("stream".into(), json!(true));
    Value::Object(body)
}

fn text_block(text: &str) -> Vec<Value> {
    // Whitespace-only text blocks are refused by the API.
    if text.trim().is_empty() {
        Vec::new()
    } else {
        vec![json!({"type": "text", "text": text})]
    }
}

/// `tool_use.input` must be an object; arguments a model garbled were kept as text, and
/// the tool result that follows already tells the model what was wrong with them.
fn input_object(arguments: &Value) -> Value {
    match arguments {
        Value::Object(_) => arguments.clone(),
        Value::String(raw) => match serde_json::from_str::<Value>(raw) {
            Ok(value @ Value::Object(_)) => value,
            _ => json!({}),
        },
        _ => json!({}),
    }
}

#[derive(Debug)]
enum Block {
    Text,
    Tool {
        id: String,
        name: String,
        json: String,
        initial: Value,
    },
    /// Thinking and server-tool blocks: not part of the message the history keeps.
    Other,
}

/// Assembles one streamed message from its events.
#[derive(Debug, Default)]
struct Decoder {
    text: String,
    blocks: BTreeMap<u64, Block>,
    stop_reason: Option<String>,
    usage: Option<Usage>,
    streamed: bool,
}

/// Anthropic counts cached prompt tokens apart; the person pays for all of them as input.
fn input_tokens(usage: &Value) -> Option<u64> {
    let fields = [
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    ];
    let counts: Vec<u64> = fields
        .iter()
        .filter_map(|f| usage.get(*f).and_then(Value::as_u64))
        .collect();
    (!counts.is_empty()).then(|| counts.iter().sum())
}

impl Decoder {
    fn text_delta(&mut self, text: &str, sink: ProviderSink<'_>) {
        if !text.is_empty() {
            self.text.push_str(text);
            self.streamed = true;
            sink(ProviderEvent::ContentDelta(text.to_string()));
        }
    }
}

impl StreamDecoder for Decoder {
    fn feed(
        &mut self,
        event: &eventsource_stream::Event,
        sink: ProviderSink<'_>,
    ) -> Result<bool, ProviderError> {
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(false);
        }
        let value: Value = serde_json::from_str(data).map_err(|err| {
            ProviderError::Malformed(format!(
                "a stream event is not JSON ({err}): {}",
                shorten(data)
            ))
        })?;
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(event.event.as_str());
        let index = value.get("index").and_then(Value::as_u64).unwrap_or(0);
        match kind {
            "message_start" => {
                let usage = value.pointer("/message/usage").unwrap_or(&Value::Null);
                self.usage = Some(Usage {
                    input_tokens: input_tokens(usage).unwrap_or(0),
                    output_tokens: usage
                        .get("output_tokens")
                        .and_then(Value::as_u64)
                        .unwrap_or(0),
                });
            }
            "content_block_start" => {
                let block = value.get("content_block").unwrap_or(&Value::Null);
                let entry = match block.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        let initial = block.get("text").and_then(Value::as_str).unwrap_or("");
                        self.text_delta(initial, sink);
                        Block::Text
                    }
                    Some("tool_use") => Block::Tool {
                        id: string(block, "id"),
                        name: string(block, "name"),
                        json: String::new(),
                        initial: block.get("input").cloned().unwrap_or_else(|| json!({})),
                    },
                    _ => Block::Other,
                };
                self.blocks.insert(index, entry);
            }
            "content_block_delta" => {
                let delta = value.get("delta").unwrap_or(&Value::Null);
                match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => {
                        let text = delta.get("text").and_then(Value::as_str).unwrap_or("");
                        self.text_delta(text, sink);
                    }
                    Some("input_json_delta") => {
                        let fragment = delta
                            .get("partial_json")
                            .and_then(Value::as_str)
                            .unwrap_or("");
                        match self.blocks.get_mut(&index) {
                            Some(Block::Tool { json, .. }) => json.push_str(fragment),
                            _ => {
                                return Err(ProviderError::Malformed(format!(
                                    "tool input for content block {index}, which is not a tool_use block"
                                )));
                            }
                        }
                    }
                    // thinking_delta, signature_delta, citations_delta: not kept.
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = value.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_string());
                }
                if let Some(usage) = value.get("usage").filter(|u| u.is_object()) {
                    // These counts are cumulative: they replace, not add.
                    let current = self.usage.get_or_insert_with(Usage::default);
                    if let Some(input) = input_tokens(usage) {
                        current.input_tokens = input;
                    }
                    if let Some(output) = usage.get("output_tokens").and_then(Value::as_u64) {
                        current.output_tokens = output;
                    }
                }
            }
            "message_stop" => return Ok(true),
            "error" => {
                let error = value.get("error").unwrap_or(&Value::Null);
                let message = error
                    .get("message")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_else(|| error.to_string());
                let kind = error.get("type").and_then(Value::as_str).unwrap_or("");
                return Err(classify(None, kind, message));
            }
            // ping, content_block_stop, and event types added later.
            _ => {}
        }
        Ok(false)
    }

    fn end_of_stream(&mut self) -> Result<(), ProviderError> {
        if self.stop_reason.is_some() {
            tracing::debug!("the stream ended without message_stop after its stop_reason");
            return Ok(());
        }
        Err(ProviderError::Network(
            "the response stream ended before the model finished (no message_stop)".into(),
        ))
    }

    fn streamed(&self) -> bool {
        self.streamed
    }

    fn finish(self) -> ModelResponse {
        let tool_calls = self
            .blocks
            .into_values()
            .filter_map(|block| match block {
                Block::Tool {
                    id,
                    name,
                    json,
                    initial,
                } => Some(ToolCall {
                    id,
                    name,
                    arguments: if json.trim().is_empty() {
                        initial
                    } else {
                        parse_arguments(&json)
                    },
                }),
                Block::Text | Block::Other => None,
            })
            .collect();
        // The run and the history speak OpenAI's finish reasons.
        let finish_reason = self.stop_reason.map(|reason| {
            match reason.as_str() {
                "end_turn" | "stop_sequence" => "stop",
                "tool_use" => "tool_calls",
                "max_tokens" => "length",
                other => other,
            }
            .to_string()
        });
        ModelResponse {
            content: (!self.text.is_empty()).then_some(self.text),
            tool_calls,
            finish_reason,
            usage: self.usage,
        }
    }
}

fn string(value: &Value, key: &str) -> String {
    value
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}
