//! Model providers over HTTP (SPEC §10): choosing one by `provider.kind`, the knobs they share (timeouts, retries), API-key resolution, the retry loop and the SSE reading that both wire dialects use.

mod anthropic;
mod keys;
mod openai;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use eventsource_stream::{EventStreamError, Eventsource};
use futures::StreamExt;
use rand::Rng;
use reqwest::header::HeaderMap;
use serde_json::Value;

use crate::config::ProviderConfig;
use crate::provider::{ModelProvider, ModelResponse, ProviderError, ProviderEvent, ProviderSink};

pub use anthropic::AnthropicProvider;
pub(crate) use keys::read_secret;
pub(crate) use keys::store_key_blocking;
pub use keys::{ApiKey, KEYRING_SERVICE, KeySource, store_key_in_keyring};
pub use openai::OpenAiProvider;

/// Builds the provider a config names; usable as the service's `ProviderFactory`
/// (`Arc::new(provider_from_config)`). Nothing is sent and no key is read here: a
/// missing key is reported by the first model call, where the person sees it.
pub fn provider_from_config(
    config: &ProviderConfig,
) -> Result<Arc<dyn ModelProvider>, ProviderError> {
    let options = HttpOptions::from_config(config)?;
    let keys = KeySource::from_config(config)?;
    let client = options.client()?;
    match config.kind.as_str() {
        "openai" => Ok(Arc::new(OpenAiProvider::new(
            config, options, keys, client,
        )?)),
        "anthropic" => Ok(Arc::new(AnthropicProvider::new(
            config, options, keys, client,
        )?)),
        other => Err(ProviderError::Config(format!(
            "provider.kind must be \"openai\" or \"anthropic\", not {other:?}"
        ))),
    }
}

/// The service factory that builds real HTTP providers.
pub fn factory() -> crate::provider::ProviderFactory {
    Arc::new(provider_from_config)
}

/// Transport knobs read from the provider block's extra keys, with defaults that suit
/// both a hosted API and a slow local model on a laptop CPU.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpOptions {
    /// `connect_timeout_ms`: how long to wait for the TCP/TLS connection.
    pub connect_timeout: Duration,
    /// `idle_timeout_ms`: the longest silence allowed while waiting for the response
    /// headers or between two stream chunks (keep-alive comments count as data).
    pub idle_timeout: Duration,
    /// `max_retries`: how many times a failed attempt is tried again.
    pub max_retries: u32,
    /// `retry_base_delay_ms`: the first backoff; each retry doubles it, with jitter.
    pub retry_base_delay: Duration,
    /// `retry_max_delay_ms`: the cap of the exponential backoff.
    pub retry_max_delay: Duration,
    /// `max_retry_after_ms`: a server asking to wait longer than this is not retried.
    pub max_retry_after: Duration,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            max_retries: 4,
            retry_base_delay: Duration::from_millis(500),
            retry_max_delay: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(120),
        }
    }
}

/// A text knob of the provider block: absent gives `default`; when `allowed` is not empty
/// the value must be one of it.
pub(crate) fn text_knob(
    config: &ProviderConfig,
    key: &str,
    default: &str,
    allowed: &[&str],
) -> Result<String, ProviderError> {
    match config.extra.get(key) {
        None | Some(Value::Null) => Ok(default.to_string()),
        Some(Value::String(text)) if allowed.is_empty() || allowed.contains(&text.as_str()) => {
            Ok(text.clone())
        }
        Some(other) if allowed.is_empty() => Err(ProviderError::Config(format!(
            "provider.{key} must be text, got {other}"
        ))),
        Some(other) => Err(ProviderError::Config(format!(
            "provider.{key} must be one of {allowed:?}, got {other}"
        ))),
    }
}

impl HttpOptions {
    pub fn from_config(config: &ProviderConfig) -> Result<Self, ProviderError> {
        let defaults = HttpOptions::default();
        let ms = |key: &str, default: Duration| -> Result<Duration, ProviderError> {
            match config.extra.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(value) => value.as_u64().map(Duration::from_millis).ok_or_else(|| {
                    ProviderError::Config(format!(
                        "provider.{key} must be a whole number of milliseconds, got {value}"
                    ))
                }),
            }
        };
        let max_retries = match config.extra.get("max_retries") {
            None | Some(Value::Null) => defaults.max_retries,
            Some(value) => value
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    ProviderError::Config(format!(
                        "provider.max_retries must be a small whole number, got {value}"
                    ))
                })?,
        };
        Ok(HttpOptions {
            connect_timeout: ms("connect_timeout_ms", defaults.connect_timeout)?,
            idle_timeout: ms("idle_timeout_ms", defaults.idle_timeout)?,
            max_retries,
            retry_base_delay: ms("retry_base_delay_ms", defaults.retry_base_delay)?,
            retry_max_delay: ms("retry_max_delay_ms", defaults.retry_max_delay)?,
            max_retry_after: ms("max_retry_after_ms", defaults.max_retry_after)?,
        })
    }

    fn client(&self) -> Result<reqwest::Client, ProviderError> {
        reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            .redirect(same_origin_redirects())
            .user_agent(concat!("bumblehive/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|err| ProviderError::Config(format!("cannot set up HTTP: {err}")))
    }

    /// How long to wait before retry number `retry` (1-based), or `None` to give up.
    /// A server's own wait wins over the backoff, as long as it is not absurdly long.
    fn delay(&self, retry: u32, server_asked: Option<Duration>) -> Option<Duration> {
        if let Some(asked) = server_asked {
            return (asked <= self.max_retry_after).then_some(asked);
        }
        let doubled = self
            .retry_base_delay
            .saturating_mul(2u32.saturating_pow(retry.saturating_sub(1)))
            .min(self.retry_max_delay);
        // Jitter in [half, full] spreads out clients that failed together.
        let millis = u64::try_from(doubled.as_millis()).unwrap_or(u64::MAX);
        let low = millis / 2;
        Some(Duration::from_millis(if millis > low {
            rand::rng().random_range(low..=millis)
        } else {
            millis
        }))
    }
}

/// One failed attempt: the error, whether any text already reached the person (then it
/// is never retried: the run would show the same words twice), and the server's wait.
#[derive(Debug)]
pub(crate) struct Failure {
    pub error: ProviderError,
    pub streamed: bool,
    pub retry_after: Option<Duration>,
}

impl From<ProviderError> for Failure {
    fn from(error: ProviderError) -> Self {
        Failure {
            error,
            streamed: false,
            retry_after: None,
        }
    }
}

/// Runs `attempt` until it succeeds, fails for good, or the retries are spent; every
/// retry is announced on the sink first so the person knows why nothing is happening.
pub(crate) async fn with_retries<F, Fut>(
    options: &HttpOptions,
    sink: ProviderSink<'_>,
    mut attempt: F,
) -> Result<ModelResponse, ProviderError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<ModelResponse, Failure>>,
{
    let mut retry = 0;
    loop {
        let failure = match attempt().await {
            Ok(response) => {
                tracing::debug!(
                    finish_reason = ?response.finish_reason,
                    usage = ?response.usage,
                    tool_calls = response.tool_calls.len(),
                    retries = retry,
                    "model call done"
                );
                return Ok(response);
            }
            Err(failure) => failure,
        };
        if failure.streamed || !failure.error.is_retryable() || retry >= options.max_retries {
            return Err(failure.error);
        }
        retry += 1;
        let asked = failure
            .retry_after
            .or_else(|| failure.error.retry_after_ms().map(Duration::from_millis));
        let Some(delay) = options.delay(retry, asked) else {
            return Err(failure.error);
        };
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        tracing::warn!(
            retry,
            delay_ms,
            "model call failed, retrying: {}",
            failure.error
        );
        sink(ProviderEvent::Retry {
            attempt: retry,
            delay_ms,
            reason: failure.error.to_string(),
        });
        tokio::time::sleep(delay).await;
    }
}

/// What a wire dialect does with the events of one streamed response.
pub(crate) trait StreamDecoder {
    /// Takes one SSE event; `Ok(true)` once the response is complete.
    fn feed(
        &mut self,
        event: &eventsource_stream::Event,
        sink: ProviderSink<'_>,
    ) -> Result<bool, ProviderError>;
    /// The stream ended without its final marker: the answer, if it is whole anyway.
    fn end_of_stream(&mut self) -> Result<(), ProviderError>;
    /// Whether any text went to the sink (then the attempt must not be retried).
    fn streamed(&self) -> bool;
    fn finish(self) -> ModelResponse;
}

/// Sends one request and decodes its SSE stream; the idle timeout covers the wait for
/// headers and every gap between chunks. Dropping the future aborts the request.
pub(crate) async fn stream_once<D: StreamDecoder>(
    request: reqwest::RequestBuilder,
    options: &HttpOptions,
    mut decoder: D,
    sink: ProviderSink<'_>,
) -> Result<ModelResponse, Failure> {
    let idle = options.idle_timeout;
    let response = match tokio::time::timeout(idle, request.send()).await {
        Err(_) => return Err(silence(idle).into()),
        Ok(Err(err)) => return Err(network_error(&err).into()),
        Ok(Ok(response)) => response,
    };
    let status = response.status();
    if !status.is_success() {
        let headers = response.headers().clone();
        let body = match tokio::time::timeout(idle, response.text()).await {
            Ok(Ok(body)) => body,
            Ok(Err(err)) => format!("(the error body could not be read: {err})"),
            Err(_) => "(the error body did not arrive)".to_string(),
        };
        let wait = retry_after(&headers);
        let mut error = error_from_status(status.as_u16(), &body);
        if let ProviderError::RateLimited { retry_after_ms, .. } = &mut error {
            *retry_after_ms = wait.map(|w| u64::try_from(w.as_millis()).unwrap_or(u64::MAX));
        }
        return Err(Failure {
            error,
            streamed: false,
            retry_after: wait,
        });
    }
    // The idle clock runs on the bytes, not on the events: keep-alive comments (which
    // the SSE parser swallows) must count as signs of life.
    let bytes = Box::pin(response.bytes_stream());
    let bytes = futures::stream::unfold(bytes, move |mut bytes| async move {
        match tokio::time::timeout(idle, bytes.next()).await {
            Ok(Some(Ok(piece))) => Some((Ok(piece), bytes)),
            Ok(Some(Err(err))) => Some((Err(ReadError::Http(err)), bytes)),
            Ok(None) => None,
            Err(_) => Some((Err(ReadError::Silent(idle)), bytes)),
        }
    });
    let mut events = std::pin::pin!(bytes.eventsource());
    let fail = |error: ProviderError, decoder: &D| Failure {
        error,
        streamed: decoder.streamed(),
        retry_after: None,
    };
    loop {
        let event = match events.next().await {
            None => match decoder.end_of_stream() {
                Ok(()) => return Ok(decoder.finish()),
                Err(error) => return Err(fail(error, &decoder)),
            },
            Some(Err(err)) => return Err(fail(sse_error(err), &decoder)),
            Some(Ok(event)) => event,
        };
        match decoder.feed(&event, sink) {
            Ok(false) => {}
            Ok(true) => return Ok(decoder.finish()),
            Err(error) => return Err(fail(error, &decoder)),
        }
        // A burst of buffered events would otherwise be decoded and broadcast without a
        // pause, faster than subscribers' tasks can forward them, and they would lag.
        tokio::task::yield_now().await;
    }
}

fn silence(idle: Duration) -> ProviderError {
    ProviderError::Network(format!(
        "the model server sent nothing for {} s (provider.idle_timeout_ms)",
        idle.as_secs_f32()
    ))
}

/// reqwest's own message is terse ("error sending request"); the causes say what happened.
fn network_error(err: &reqwest::Error) -> ProviderError {
    let mut message = if err.is_connect() {
        "cannot connect to the model server".to_string()
    } else if err.is_timeout() {
        "the model server did not answer in time".to_string()
    } else {
        "the request to the model server failed".to_string()
    };
    let mut refused = false;
    let mut source: Option<&dyn std::error::Error> = Some(err);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        refused |= cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused);
        source = cause.source();
    }
    // A local server that is not running refuses at once, every time: say so and how to
    // go on, instead of retrying for seconds (UX review D7).
    let local = err
        .url()
        .and_then(|url| url.host_str().map(str::to_string))
        .is_some_and(|host| {
            host == "localhost"
                || host
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        });
    if refused && local {
        let at = err
            .url()
            .map(|u| u.origin().ascii_serialization())
            .unwrap_or_default();
        return ProviderError::Unreachable(format!(
            "no model server is running at {at} (connection refused). Start it (Ollama: `ollama serve`; llama.cpp: `llama-server`), or choose another provider in Settings."
        ));
    }
    // A remote server's usual failures in words first, what to check, then the detail
    // (UX review D7: the raw chain alone says little to a person).
    let mut chain = Vec::new();
    let mut source: Option<&dyn std::error::Error> = Some(err);
    while let Some(cause) = source {
        chain.push(cause);
        source = cause.source();
    }
    let detail = chain.last().map(|c| c.to_string()).unwrap_or_default();
    let host = err
        .url()
        .and_then(|u| u.host_str())
        .unwrap_or("?")
        .to_string();
    let at = err
        .url()
        .map(|u| format!("{host}:{}", u.port_or_known_default().unwrap_or(0)))
        .unwrap_or_default();
    if err.is_connect() && chain.iter().any(|c| c.to_string().starts_with("dns error")) {
        return ProviderError::Network(format!(
            "cannot find the model server {host}: the name does not resolve; check the provider's base_url and this machine's network ({detail})"
        ));
    }
    // The TCP connection's own failures carry an I/O error of their kind (refused, reset,
    // unreachable, timed out); a failed handshake over https carries none of those.
    let io_kind = chain
        .iter()
        .find_map(|c| c.downcast_ref::<std::io::Error>().map(std::io::Error::kind));
    let tls = err.is_connect()
        && !err.is_timeout()
        && err.url().is_some_and(|u| u.scheme() == "https")
        && matches!(
            io_kind,
            None | Some(std::io::ErrorKind::InvalidData | std::io::ErrorKind::Other)
        );
    if tls {
        return ProviderError::Network(format!(
            "the secure connection (TLS) to {at} failed: {detail}; check that the server speaks https on that port and that its certificate is trusted"
        ));
    }
    ProviderError::Network(message)
}

/// Why reading the body stopped short.
#[derive(Debug)]
enum ReadError {
    Http(reqwest::Error),
    Silent(Duration),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Http(err) => write!(f, "{err}"),
            ReadError::Silent(idle) => write!(f, "{}", silence(*idle)),
        }
    }
}

fn sse_error(err: EventStreamError<ReadError>) -> ProviderError {
    match err {
        EventStreamError::Transport(ReadError::Silent(idle)) => silence(idle),
        EventStreamError::Transport(ReadError::Http(err)) => {
            let (ProviderError::Network(message) | ProviderError::Unreachable(message)) =
                network_error(&err)
            else {
                return ProviderError::Network(err.to_string());
            };
            ProviderError::Network(format!("the response stream broke off ({message})"))
        }
        EventStreamError::Utf8(err) => {
            ProviderError::Malformed(format!("the stream is not valid UTF-8: {err}"))
        }
        EventStreamError::Parser(err) => {
            ProviderError::Malformed(format!("the stream is not valid SSE: {err}"))
        }
    }
}

/// `retry-after-ms` (OpenAI's precise form) wins over `retry-after`, which is either
/// seconds or an HTTP date.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = text("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            return Some(Duration::from_secs_f64(ms / 1000.0));
        }
    }
    let value = text("retry-after")?;
    if let Ok(seconds) = value.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds));
    }
    let when = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let wait = when.with_timezone(&chrono::Utc) - chrono::Utc::now();
    Some(wait.to_std().unwrap_or(Duration::ZERO))
}

/// The person-facing text of an error body in any of the shapes servers use:
/// `{"error": {"message", "type", "code"}}` (OpenAI, Anthropic, vLLM, LM Studio),
/// `{"error": "text"}` (Ollama), `{"message": ...}`, or plain text.
pub(crate) fn error_text(body: &str) -> (String, String) {
    let trimmed = body.trim();
    let Ok(value) = serde_json::from_str::<Value>(trimmed) else {
        return (shorten(trimmed), String::new());
    };
    let error = value.get("error").unwrap_or(&value);
    let message = match error {
        Value::String(text) => text.clone(),
        _ => error
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| shorten(trimmed)),
    };
    // The machine-readable kind: OpenAI's `code`/`type`, Anthropic's `type`.
    let kind = ["code", "type"]
        .iter()
        .filter_map(|key| error.get(*key))
        .filter_map(|v| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join(" ");
    (message, kind)
}

fn shorten(text: &str) -> String {
    const MAX: usize = 500;
    let head = crate::text::head(text, MAX);
    if head.len() == text.len() {
        return text.to_string();
    }
    format!("{head}…")
}

/// Maps an HTTP failure to the typed error the run and the person see.
pub(crate) fn error_from_status(status: u16, body: &str) -> ProviderError {
    let (message, kind) = error_text(body);
    let message = if message.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("{message} (HTTP {status})")
    };
    classify(Some(status), &kind, message)
}

/// The same mapping for an error that arrives inside a stream, named by its kind only.
pub(crate) fn classify(status: Option<u16>, kind: &str, message: String) -> ProviderError {
    let kind = kind.to_ascii_lowercase();
    let lower = message.to_ascii_lowercase();
    if kind.contains("insufficient_quota") {
        return ProviderError::QuotaExceeded(message);
    }
    if is_context_overflow(&kind, &lower) {
        return ProviderError::ContextTooLong(message);
    }
    match status {
        Some(401 | 403) => ProviderError::Auth(message),
        Some(429) => ProviderError::RateLimited {
            message,
            retry_after_ms: None,
        },
        Some(408) => ProviderError::Server {
            status: 408,
            message,
        },
        Some(status @ 500..=599) => ProviderError::Server { status, message },
        Some(_) => ProviderError::BadRequest(message),
        None => match kind.as_str() {
            k if k.contains("authentication") || k.contains("permission") => {
                ProviderError::Auth(message)
            }
            k if k.contains("rate_limit") || k == "429" => ProviderError::RateLimited {
                message,
                retry_after_ms: None,
            },
            k if k.contains("overloaded") || k.contains("api_error") || k.starts_with('5') => {
                ProviderError::Server {
                    status: if k.contains("overloaded") { 529 } else { 500 },
                    message,
                }
            }
            k if k.contains("invalid_request") || k.starts_with('4') => {
                ProviderError::BadRequest(message)
            }
            _ => ProviderError::Other(message),
        },
    }
}

/// Servers word this differently: OpenAI `context_length_exceeded`, Anthropic "prompt is
/// too long", llama.cpp `exceed_context_size_error`, vLLM "maximum context length".
fn is_context_overflow(kind: &str, message: &str) -> bool {
    kind.contains("context_length_exceeded")
        || kind.contains("exceed_context_size")
        || [
            "context length",
            "context window",
            "maximum context",
            "context size",
            "prompt is too long",
            "too many tokens",
        ]
        .iter()
        .any(|needle| message.contains(needle))
}

/// Parses a model's tool-call arguments. Text that is not a JSON object is kept as a JSON
/// string, so the history stays faithful and the tool registry tells the model what was
/// wrong (`ToolCall::arguments`).
pub(crate) fn parse_arguments(raw: &str) -> Value {
    if raw.trim().is_empty() {
        return Value::Object(serde_json::Map::new());
    }
    match serde_json::from_str::<Value>(raw) {
        Ok(value @ Value::Object(_)) => value,
        _ => Value::String(raw.to_string()),
    }
}

/// `base_url` without a trailing slash, so joining paths never doubles one.
pub(crate) fn base_url(config: &ProviderConfig) -> Result<String, ProviderError> {
    let base = config.base_url.trim().trim_end_matches('/').to_string();
    match reqwest::Url::parse(&base) {
        Ok(url) if matches!(url.scheme(), "http" | "https") => Ok(base),
        _ => Err(ProviderError::Config(format!(
            "provider.base_url must be an http(s) URL, got {:?}",
            config.base_url
        ))),
    }
}

/// Redirects of model calls stay on the origin the person configured: reqwest strips
/// `Authorization` on a cross-host hop but not `x-api-key` (Anthropic's), and a changed
/// port or scheme (https -> http) would send the key elsewhere or in clear (finding 9).
pub fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let same = attempt.previous().first().is_some_and(|first| {
            let next = attempt.url();
            first.scheme() == next.scheme()
                && first.host_str() == next.host_str()
                && first.port_or_known_default() == next.port_or_known_default()
        });
        if !same {
            let to = attempt.url().to_string();
            attempt.error(format!(
                "the model server redirected to another origin ({to}); not following it with the API key"
            ))
        } else if attempt.previous().len() > 5 {
            attempt.error("too many redirects")
        } else {
            attempt.follow()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_classified_by_status_and_kind() {
        let auth = error_from_status(
            401,
            r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#,
        );
        assert!(matches!(auth, ProviderError::Auth(_)), "{auth:?}");
        assert!(auth.to_string().contains("Incorrect API key provided"));
        let long = error_from_status(
            400,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
        );
        assert!(matches!(long, ProviderError::ContextTooLong(_)), "{long:?}");
        let ollama = error_from_status(
            404,
            r#"{"error":"model \"nope\" not found, try pulling it first"}"#,
        );
        assert_eq!(
            ollama.to_string(),
            "bad request: model \"nope\" not found, try pulling it first (HTTP 404)"
        );
        let quota = error_from_status(
            429,
            r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#,
        );
        assert!(!quota.is_retryable());
        assert!(error_from_status(529, "overloaded").is_retryable());
        assert!(error_from_status(503, "<html>bad gateway</html>").is_retryable());
    }

    #[test]
    fn retry_after_reads_ms_seconds_and_dates() {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", "2".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert("retry-after-ms", "150".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(150)));
        let mut dated = HeaderMap::new();
        dated.insert(
            "retry-after",
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&dated), Some(Duration::ZERO));
    }

    #[test]
    fn backoff_doubles_with_jitter_and_honours_the_server() {
        let options = HttpOptions {
            retry_base_delay: Duration::from_millis(100),
            retry_max_delay: Duration::from_millis(300),
            max_retry_after: Duration::from_secs(5),
            ..HttpOptions::default()
        };
        for _ in 0..50 {
            let first = options.delay(1, None).unwrap();
            assert!((50..=100).contains(&first.as_millis()), "{first:?}");
            let third = options.delay(3, None).unwrap();
            assert!((150..=300).contains(&third.as_millis()), "{third:?}");
        }
        assert_eq!(
            options.delay(1, Some(Duration::from_secs(2))),
            Some(Duration::from_secs(2))
        );
        assert_eq!(options.delay(1, Some(Duration::from_secs(60))), None);
    }

    #[test]
    fn arguments_that_are_not_an_object_stay_text() {
        assert_eq!(parse_arguments(""), serde_json::json!({}));
        assert_eq!(parse_arguments(r#"{"a":1}"#), serde_json::json!({"a": 1}));
        assert_eq!(
            parse_arguments(r#"{"a":"#),
            Value::String(r#"{"a":"#.into())
        );
        assert_eq!(parse_arguments("[1]"), Value::String("[1]".into()));
    }
}
