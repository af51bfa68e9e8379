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
    pub messages: RequestMessages,
    /// Shared with the run that offers them: the same specs go with every call of a run,
    /// and copying their schemas per call was a few % of a fan-out's CPU (issue 31).
    pub tools: std::sync::Arc<[ToolSpec]>,
    pub settings: ModelSettings,
}

/// A request's messages: a few of its own (the system message, and after a compaction the
/// person's kept messages and the summary), then the run's history from some index on,
/// shared with the run instead of copied, with some of its messages sent in another form
/// (compaction's elided tool results). Copying the history into every request and dropping
/// it after was a tenth of a fan-out's CPU (issue 31): a parent woken by a thousand reports
/// sends a history of two thousand messages forty times. Read it as a sequence: `iter`,
/// `len`, `get`, `last`, indexing.
#[derive(Debug, Clone, Default)]
pub struct RequestMessages {
    head: Vec<Message>,
    shared: Arc<Vec<Message>>,
    /// The first index of `shared` sent.
    from: usize,
    /// Messages of `shared[from..]` sent in another form: (index into `shared`, message),
    /// ascending by index.
    replaced: Vec<(usize, Message)>,
}

impl RequestMessages {
    /// `head`, then `shared[from..]` with the messages at the indices of `replaced`
    /// (ascending, each at or after `from`) sent as given there.
    pub fn new(
        head: Vec<Message>,
        shared: Arc<Vec<Message>>,
        from: usize,
        replaced: Vec<(usize, Message)>,
    ) -> Self {
        let from = from.min(shared.len());
        debug_assert!(replaced.windows(2).all(|w| w[0].0 < w[1].0));
        debug_assert!(
            replaced
                .iter()
                .all(|(i, _)| (from..shared.len()).contains(i))
        );
        RequestMessages {
            head,
            shared,
            from,
            replaced,
        }
    }

    pub fn len(&self) -> usize {
        self.head.len() + self.shared.len() - self.from
    }

    /// How many of the messages are the request's own, before the shared history.
    pub fn head_len(&self) -> usize {
        self.head.len()
    }

    /// The first index of the shared history the request sends.
    pub fn shared_from(&self) -> usize {
        self.from
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, index: usize) -> Option<&Message> {
        match index.checked_sub(self.head.len()) {
            None => self.head.get(index),
            Some(offset) => {
                let index = self.from.checked_add(offset)?;
                self.shared.get(index).map(|m| self.sent_as(index, m))
            }
        }
    }

    pub fn first(&self) -> Option<&Message> {
        self.get(0)
    }

    pub fn last(&self) -> Option<&Message> {
        self.len().checked_sub(1).and_then(|i| self.get(i))
    }

    pub fn iter(&self) -> RequestIter<'_> {
        RequestIter {
            messages: self,
            front: 0,
            back: self.len(),
        }
    }

    pub fn to_vec(&self) -> Vec<Message> {
        self.iter().cloned().collect()
    }

    fn sent_as<'a>(&'a self, index: usize, message: &'a Message) -> &'a Message {
        if self.replaced.is_empty() {
            return message;
        }
        match self.replaced.binary_search_by_key(&index, |(i, _)| *i) {
            Ok(found) => &self.replaced[found].1,
            Err(_) => message,
        }
    }
}

impl From<Vec<Message>> for RequestMessages {
    fn from(messages: Vec<Message>) -> Self {
        RequestMessages {
            head: messages,
            ..Default::default()
        }
    }
}

impl std::ops::Index<usize> for RequestMessages {
    type Output = Message;

    fn index(&self, index: usize) -> &Message {
        let len = self.len();
        self.get(index)
            .unwrap_or_else(|| panic!("message {index} of a request of {len}"))
    }
}

impl<'a> IntoIterator for &'a RequestMessages {
    type Item = &'a Message;
    type IntoIter = RequestIter<'a>;

    fn into_iter(self) -> RequestIter<'a> {
        self.iter()
    }
}

/// The messages of a [`RequestMessages`] in order.
#[derive(Debug, Clone)]
pub struct RequestIter<'a> {
    messages: &'a RequestMessages,
    front: usize,
    back: usize,
}

impl<'a> Iterator for RequestIter<'a> {
    type Item = &'a Message;

    fn next(&mut self) -> Option<&'a Message> {
        if self.front == self.back {
            return None;
        }
        self.front += 1;
        self.messages.get(self.front - 1)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.back - self.front;
        (n, Some(n))
    }
}

impl DoubleEndedIterator for RequestIter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.front == self.back {
            return None;
        }
        self.back -= 1;
        self.messages.get(self.back)
    }
}

impl ExactSizeIterator for RequestIter<'_> {}

impl PartialEq for RequestMessages {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

/// Serialized as the sequence it reads as.
impl Serialize for RequestMessages {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A request over a shared history reads the same whichever way it is read, and the
    /// same as the list it stands for: in order, backwards, by index, as JSON.
    #[test]
    fn a_shared_request_reads_as_the_list_it_stands_for() {
        let history: Vec<Message> = (0..6)
            .map(|i| Message::user(format!("h{i}"), format!("history {i}")))
            .collect();
        let stub = Message::user("h4", "sent instead of history 4");
        let request = RequestMessages::new(
            vec![Message::system("s"), Message::user("k", "kept")],
            Arc::new(history.clone()),
            2,
            vec![(4, stub.clone())],
        );
        let mut expected = vec![Message::system("s"), Message::user("k", "kept")];
        expected.extend(history[2..].iter().cloned());
        expected[4] = stub;

        assert_eq!(request.len(), expected.len());
        assert_eq!(request.to_vec(), expected);
        assert_eq!(request.iter().len(), expected.len());
        let backwards: Vec<&Message> = request.iter().rev().collect();
        assert_eq!(backwards, expected.iter().rev().collect::<Vec<_>>());
        for (i, message) in expected.iter().enumerate() {
            assert_eq!(&request[i], message);
            assert_eq!(request.get(i), Some(message));
        }
        assert_eq!(request.get(expected.len()), None);
        assert_eq!(request.first(), expected.first());
        assert_eq!(request.last(), expected.last());
        assert_eq!(request, RequestMessages::from(expected.clone()));
        assert_eq!(
            serde_json::to_string(&request).unwrap(),
            serde_json::to_string(&expected).unwrap()
        );
        // Iterating from both ends meets in the middle without repeating a message.
        let mut both = request.iter();
        let mut met = Vec::new();
        while let (Some(front), back) = (both.next(), both.next_back()) {
            met.push(front);
            met.extend(back);
        }
        assert_eq!(met.len(), expected.len());

        let empty = RequestMessages::default();
        assert!(empty.is_empty());
        assert_eq!(empty.last(), None);
        assert_eq!(serde_json::to_string(&empty).unwrap(), "[]");
    }

    /// The history is shared, not copied: the request holds the run's own allocation.
    #[test]
    fn a_request_shares_the_history_it_is_built_from() {
        let history = Arc::new(vec![Message::user("a", "a"), Message::user("b", "b")]);
        let request = RequestMessages::new(vec![Message::system("s")], history.clone(), 0, vec![]);
        assert_eq!(Arc::strong_count(&history), 2);
        assert!(std::ptr::eq(request.get(1).unwrap(), &history[0]));
        drop(request);
        // Dropped with the call: appending to the history copies nothing.
        let mut history = history;
        let before = history.as_ptr();
        Arc::make_mut(&mut history);
        assert_eq!(history.as_ptr(), before);
    }
}
