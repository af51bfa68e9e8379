//! The `openai` kind: Chat Completions with SSE streaming, as OpenAI, Ollama, LM Studio, llama.cpp's llama-server, vLLM and OpenRouter serve it; request building and the assembly of streamed text, tool calls, finish reason and usage.

use async_trait::async_trait;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use serde_json::{Map, Value, json};

use super::{
    HttpOptions, KeySource, StreamDecoder, base_url, classify, parse_arguments, shorten,
    stream_once, with_retries,
};
use crate::config::ProviderConfig;
use crate::protocol::{Message, Role, ToolCall, Usage};
use crate::provider::{
    ModelProvider, ModelRequest, ModelResponse, ProviderError, ProviderEvent, ProviderSink,
};

/// Any OpenAI-compatible Chat Completions server.
pub struct OpenAiProvider {
    client: reqwest::Client,
    url: String,
    options: HttpOptions,
    keys: KeySource,
    /// `max_tokens`, or `max_completion_tokens` for OpenAI's reasoning models, which
    /// refuse the older name (`provider.max_tokens_param`).
    max_tokens_param: String,
}

impl OpenAiProvider {
    pub fn new(
        config: &ProviderConfig,
        options: HttpOptions,
        keys: KeySource,
        client: reqwest::Client,
    ) -> Result<Self, ProviderError> {
        let max_tokens_param = super::text_knob(
            config,
            "max_tokens_param",
            "max_tokens",
            &["max_tokens", "max_completion_tokens"],
        )?;
        Ok(OpenAiProvider {
            client,
            url: format!("{}/chat/completions", base_url(config)?),
            options,
            keys,
            max_tokens_param,
        })
    }
}

#[async_trait]
impl ModelProvider for OpenAiProvider {
    async fn generate(
        &self,
        request: ModelRequest,
        sink: ProviderSink<'_>,
    ) -> Result<ModelResponse, ProviderError> {
        let key = self.keys.resolve().await?;
        let body = serde_json::to_vec(&request_body(&request, &self.max_tokens_param))
            .map_err(|err| ProviderError::Other(format!("cannot encode the request: {err}")))?;
        tracing::debug!(
            url = %self.url,
            model = %request.settings.model,
            messages = request.messages.len(),
            tools = request.tools.len(),
            "chat completions request"
        );
        with_retries(&self.options, sink, || {
            let mut builder = self
                .client
                .post(&self.url)
                .header(CONTENT_TYPE, "application/json")
                .header(ACCEPT, "text/event-stream")
                .body(body.clone());
            if let Some(key) = &key {
                builder = builder.bearer_auth(key.expose());
            }
            stream_once(builder, &self.options, Decoder::default(), sink)
        })
        .await
    }
}

/// The request body: the history in OpenAI's shape (our messages already are, minus the
/// runtime's own `id` and `usage`), the tools, and streaming with a usage chunk.
pub(crate) fn request_body(request: &ModelRequest, max_tokens_param: &str) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(request.settings.model));
    body.insert(
        "messages".into(),
        request
            .messages
            .iter()
            .map(|m| wire_message(m, request.settings.no_images))
            .collect(),
    );
    body.insert("stream".into(), json!(true));
    body.insert("stream_options".into(), json!({"include_usage": true}));
    if !request.tools.is_empty() {
        // An empty `tools` array is refused by some servers: leave it out instead.
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|tool| {
                json!({
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.parameters,
                    }
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(temperature) = request.settings.temperature {
        body.insert("temperature".into(), decimal(temperature));
    }
    if let Some(max_tokens) = request.settings.max_tokens {
        body.insert(max_tokens_param.into(), json!(max_tokens));
    }
    Value::Object(body)
}

/// An f32 as the decimal the person wrote (0.2, not 0.20000000298023224).
pub(crate) fn decimal(value: f32) -> Value {
    value
        .to_string()
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(Value::Null, Value::Number)
}

fn wire_message(message: &Message, no_images: bool) -> Value {
    match message.role {
        Role::System => json!({"role": "system", "content": message.text()}),
        Role::User if message.images.is_empty() => {
            json!({"role": "user", "content": message.text()})
        }
        Role::User if no_images => json!({
            "role": "user",
            "content": crate::provider::without_images_text(message),
        }),
        // Chat Completions' content parts: the text, then each image as a data URL.
        Role::User => {
            let mut parts = Vec::with_capacity(message.images.len() + 1);
            if !message.text().is_empty() {
                parts.push(json!({"type": "text", "text": message.text()}));
            }
            parts.extend(message.images.iter().map(|image| {
                json!({
                    "type": "image_url",
                    "image_url": {"url": format!("data:{};base64,{}", image.media_type, image.data)},
                })
            }));
            json!({"role": "user", "content": parts})
        }
        // Chat Completions' tool results are text only: the model is told of the images.
        Role::Tool if !message.images.is_empty() => json!({
            "role": "tool",
            "tool_call_id": message.tool_call_id.as_deref().unwrap_or_default(),
            "content": format!(
                "{}\n[{} image(s) in this result not shown: this API takes text only in tool results]",
                message.text(),
                message.images.len()
            ),
        }),
        Role::Tool => json!({
            "role": "tool",
            "tool_call_id": message.tool_call_id.as_deref().unwrap_or_default(),
            "content": message.text(),
        }),
        Role::Assistant if message.tool_calls.is_empty() => {
            json!({"role": "assistant", "content": message.text()})
        }
        Role::Assistant => {
            let calls: Vec<Value> = message
                .tool_calls
                .iter()
                .map(|call| {
                    json!({
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": arguments_text(&call.arguments)},
                    })
                })
                .collect();
            json!({"role": "assistant", "content": message.content, "tool_calls": calls})
        }
    }
}

/// The wire carries arguments as JSON text; text the model sent that was not JSON goes
/// back exactly as it came.
fn arguments_text(arguments: &Value) -> String {
    match arguments {
        Value::String(raw) => raw.clone(),
        other => other.to_string(),
    }
}

/// A tool call while its fragments arrive.
#[derive(Debug, Default)]
struct PartialCall {
    index: u64,
    id: String,
    name: String,
    arguments: String,
}

/// Assembles one streamed chat completion (choice 0).
#[derive(Debug, Default)]
struct Decoder {
    content: String,
    calls: Vec<PartialCall>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    streamed: bool,
}

impl Decoder {
    fn tool_call_delta(&mut self, delta: &Value) {
        let index = delta.get("index").and_then(Value::as_u64);
        let id = delta
            .get("id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty());
        let next_index = self.calls.iter().map(|c| c.index + 1).max().unwrap_or(0);
        let position = match (index, id) {
            // A known index with a different id is a new call from a server that
            // numbers every call 0 (seen with some local servers).
            (Some(index), id) => self.calls.iter().position(|c| {
                c.index == index && (id.is_none() || c.id.is_empty() || Some(c.id.as_str()) == id)
            }),
            // Servers that send no index: a new id starts a call, fragments extend the last.
            (None, Some(id)) => self.calls.iter().position(|c| c.id == id),
            (None, None) => self.calls.len().checked_sub(1),
        };
        let position = position.unwrap_or_else(|| {
            let index = match index {
                Some(index) if self.calls.iter().all(|c| c.index != index) => index,
                _ => next_index,
            };
            self.calls.push(PartialCall {
                index,
                ..PartialCall::default()
            });
            self.calls.len() - 1
        });
        let call = &mut self.calls[position];
        if let Some(id) = id {
            if call.id.is_empty() {
                call.id = id.to_string();
            }
        }
        let function = delta.get("function").unwrap_or(&Value::Null);
        if let Some(name) = function.get("name").and_then(Value::as_str) {
            // The name comes whole in the first fragment; servers that repeat it on later
            // fragments must not double it.
            if call.name.is_empty() {
                call.name = name.to_string();
            }
        }
        match function.get("arguments") {
            Some(Value::String(fragment)) => call.arguments.push_str(fragment),
            // A few servers send the arguments as an object in one piece.
            Some(object @ Value::Object(_)) => call.arguments = object.to_string(),
            _ => {}
        }
    }

    fn choice(&mut self, choice: &Value, sink: ProviderSink<'_>) {
        let delta = choice.get("delta").unwrap_or(&Value::Null);
        for key in ["content", "refusal"] {
            if let Some(text) = delta.get(key).and_then(Value::as_str) {
                if !text.is_empty() {
                    self.content.push_str(text);
                    self.streamed = true;
                    sink(ProviderEvent::ContentDelta(text.to_string()));
                }
            }
        }
        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
            for call in calls {
                self.tool_call_delta(call);
            }
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(reason.to_string());
        }
    }
}

fn usage_of(value: &Value) -> Usage {
    let count = |keys: &[&str]| {
        keys.iter()
            .find_map(|key| value.get(*key).and_then(Value::as_u64))
            .unwrap_or(0)
    };
    Usage {
        input_tokens: count(&["prompt_tokens", "input_tokens"]),
        output_tokens: count(&["completion_tokens", "output_tokens"]),
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
        if data == "[DONE]" {
            return Ok(true);
        }
        let chunk: Value = serde_json::from_str(data).map_err(|err| {
            ProviderError::Malformed(format!(
                "a stream chunk is not JSON ({err}): {}",
                shorten(data)
            ))
        })?;
        // OpenRouter and vLLM report failures inside a 200 stream.
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| error.to_string());
            let status = error
                .get("code")
                .and_then(Value::as_u64)
                .and_then(|c| u16::try_from(c).ok())
                .filter(|c| (400..600).contains(c));
            let kind = error
                .get("code")
                .or_else(|| error.get("type"))
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                .unwrap_or_default();
            return Err(classify(status, &kind, message));
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(usage_of(usage));
        }
        if let Some(choices) = chunk.get("choices").and_then(Value::as_array) {
            // Only choice 0 is asked for (no `n`); others would be a server's quirk.
            for choice in choices
                .iter()
                .filter(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
            {
                self.choice(choice, sink);
            }
        }
        Ok(false)
    }

    fn end_of_stream(&mut self) -> Result<(), ProviderError> {
        if self.finish_reason.is_some() {
            tracing::debug!("the stream ended without [DONE] after its finish_reason");
            return Ok(());
        }
        Err(ProviderError::Network(
            "the response stream ended before the model finished (no finish_reason, no [DONE])"
                .into(),
        ))
    }

    fn streamed(&self) -> bool {
        self.streamed
    }

    fn finish(self) -> ModelResponse {
        let mut calls = self.calls;
        calls.sort_by_key(|c| c.index);
        let tool_calls = calls
            .into_iter()
            .map(|call| ToolCall {
                // A few local servers send no id; the history needs one to pair results.
                id: if call.id.is_empty() {
                    format!("call_{}", uuid::Uuid::new_v4().simple())
                } else {
                    call.id
                },
                name: call.name,
                arguments: parse_arguments(&call.arguments),
            })
            .collect();
        ModelResponse {
            content: (!self.content.is_empty()).then_some(self.content),
            tool_calls,
            finish_reason: self.finish_reason,
            usage: self.usage,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(decoder: &mut Decoder, data: &str) -> Result<bool, ProviderError> {
        let event = eventsource_stream::Event {
            event: "message".into(),
            data: data.into(),
            ..Default::default()
        };
        decoder.feed(&event, &|_| {})
    }

    #[test]
    fn calls_numbered_zero_with_distinct_ids_stay_apart() {
        let mut decoder = Decoder::default();
        for data in [
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"read_file","arguments":"{\"path\":\"x\"}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"b","function":{"name":"read_file","arguments":"{\"path\":\"y\"}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
        ] {
            assert!(!feed(&mut decoder, data).unwrap());
        }
        let response = decoder.finish();
        let ids: Vec<&str> = response.tool_calls.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(response.tool_calls[1].arguments, json!({"path": "y"}));
    }

    #[test]
    fn calls_without_index_or_id_get_an_id() {
        let mut decoder = Decoder::default();
        feed(
            &mut decoder,
            r#"{"choices":[{"delta":{"tool_calls":[{"function":{"name":"read_file","arguments":"{\"pa"}}]}}]}"#,
        )
        .unwrap();
        feed(
            &mut decoder,
            r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"th\":\"x\"}"}}]},"finish_reason":"tool_calls"}]}"#,
        )
        .unwrap();
        let response = decoder.finish();
        assert_eq!(response.tool_calls.len(), 1);
        assert!(response.tool_calls[0].id.starts_with("call_"));
        assert_eq!(response.tool_calls[0].arguments, json!({"path": "x"}));
    }

    #[test]
    fn temperature_keeps_its_decimal() {
        assert_eq!(decimal(0.2), json!(0.2));
    }
}
