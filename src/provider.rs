//! The model-provider trait: one model call from messages and tool definitions to an assistant message, streaming deltas to a sink.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::ProviderConfig;
use crate::protocol::{Message, ToolCall, Usage};

/// A tool as the model sees it: name, description and a JSON schema of its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// Shared, not copied, by every registry that offers the tool (`tools::ToolRegistry`).
    pub parameters: std::sync::Arc<Value>,
}

/// Settings of one call, taken from the provider config.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelSettings {
    pub model: String,
    pub temperature: Option<f32>,
    pub max_tokens: Option<u32>,
    /// The model takes no images (`provider.images: false`): they are left out of the
    /// request with a note.
    #[serde(default)]
    pub no_images: bool,
}

impl From<&ProviderConfig> for ModelSettings {
    fn from(config: &ProviderConfig) -> Self {
        ModelSettings {
            model: config.model.clone(),
            temperature: config.temperature,
            max_tokens: config.max_tokens,
            no_images: config.images == Some(false),
        }
    }
}

/// The text of a user message whose images are not sent (a model that takes none): the
/// model is told they were there.
pub fn without_images_text(message: &Message) -> String {
    let n = message.images.len();
    let note = format!(
        "[{n} image{} attached here left out: this model takes no images (provider.images is false)]",
        if n == 1 { "" } else { "s" }
    );
    if message.text().is_empty() {
        note
    } else {
        format!("{}\n\n{note}", message.text())
    }
}

/// Everything one model call needs. `messages` starts with the system message.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    pub messages: Vec<Message>,
    /// Shared with the run that offers them: the same specs go with every call of a run,
    /// and copying their schemas per call was a few % of a fan-out's CPU (issue 31).
    pub tools: std::sync::Arc<[ToolSpec]>,
    pub settings: ModelSettings,
}

/// The answer of one model call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelResponse {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
}

impl ModelResponse {
    pub fn text(content: impl Into<String>) -> Self {
        ModelResponse {
            content: Some(content.into()),
            finish_reason: Some("stop".into()),
            ..Default::default()
        }
    }

    pub fn tool_calls(calls: Vec<ToolCall>) -> Self {
        ModelResponse {
            tool_calls: calls,
            finish_reason: Some("tool_calls".into()),
            ..Default::default()
        }
    }
}

/// What a provider tells the run while it works.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderEvent {
    ContentDelta(String),
    /// A failed attempt will be retried after `delay_ms`.
    Retry {
        attempt: u32,
        delay_ms: u64,
        reason: String,
    },
}

pub type ProviderSink<'a> = &'a (dyn Fn(ProviderEvent) + Send + Sync);

/// Typed provider failures; the message is what the person (and a parent's report) sees.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProviderError {
    #[error("authentication failed: {0}")]
    Auth(String),
    #[error("rate limited: {message}")]
    RateLimited {
        message: String,
        retry_after_ms: Option<u64>,
    },
    #[error("the conversation is too long for the model's context: {0}")]
    ContextTooLong(String),
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("server error {status}: {message}")]
    Server { status: u16, message: String },
    #[error("network error: {0}")]
    Network(String),
    /// Nothing listens at a server on this machine: retrying will not start it.
    #[error("{0}")]
    Unreachable(String),
    #[error("malformed response: {0}")]
    Malformed(String),
    #[error("the account's quota is used up: {0}")]
    QuotaExceeded(String),
    #[error("provider configuration: {0}")]
    Config(String),
    #[error("{0}")]
    Other(String),
}

impl ProviderError {
    /// Whether trying the same request again may help: rate limits, server trouble and
    /// broken connections pass; a bad key or a bad request fails the same way every time.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ProviderError::RateLimited { .. }
                | ProviderError::Server { .. }
                | ProviderError::Network(_)
        )
    }

    /// The wait the server asked for, if it named one.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            ProviderError::RateLimited { retry_after_ms, .. } => *retry_after_ms,
            _ => None,
        }
    }
}

/// A model. Implementations stream deltas to `sink` and return the whole message.
/// Cancellation is by dropping the future: implementations must not hold work
/// that outlives it (an HTTP request is aborted when its future is dropped).
#[async_trait]
pub trait ModelProvider: Send + Sync {
    async fn generate(
        &self,
        request: ModelRequest,
        sink: ProviderSink<'_>,
    ) -> Result<ModelResponse, ProviderError>;
}

/// Builds the provider for a config; the service calls it when the config changes.
pub type ProviderFactory =
    Arc<dyn Fn(&ProviderConfig) -> Result<Arc<dyn ModelProvider>, ProviderError> + Send + Sync>;

/// A factory that always hands out the same provider (tests, embedders).
pub fn fixed_provider(provider: Arc<dyn ModelProvider>) -> ProviderFactory {
    Arc::new(move |_| Ok(provider.clone()))
}
