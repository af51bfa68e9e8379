//! The MCP client connection: the only file that names `rmcp` (pinned exactly in Cargo.toml), so a new major version of it changes this file alone. Starts a stdio server (in its own process group, stderr to the log) or reaches a streamable HTTP one through our own reqwest client, initialises, lists and calls tools.

use std::borrow::Cow;
use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use rmcp::model::{CallToolRequestParams, ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::service::{NotificationContext, RoleClient, RunningService};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse,
};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, ServiceExt};
use serde_json::Value;
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;

/// What went wrong talking to a server, in words for the person and the model.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    #[error("cannot start: {0}")]
    Start(String),
    #[error("initialisation failed: {0}")]
    Initialize(String),
    #[error("initialisation did not finish within {0:?}")]
    InitTimeout(Duration),
    #[error("the server connection closed")]
    Closed,
    #[error("{0}")]
    Call(String),
}

/// A resolved transport: secrets filled in (never logged).
pub enum Endpoint {
    Stdio {
        command: String,
        args: Vec<String>,
        env: Vec<(String, String)>,
        cwd: Option<std::path::PathBuf>,
        /// Variables of ours the server does not inherit.
        remove_env: Vec<String>,
        /// Inherit nothing: `env` is the whole environment (a workspace's server).
        clear_env: bool,
    },
    Http {
        url: String,
        headers: Vec<(String, String)>,
    },
}

/// A tool as the server lists it, in plain JSON terms.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolInfo {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    pub read_only_hint: bool,
}

/// One block of a tool's result.
#[derive(Debug, Clone, PartialEq)]
pub enum Block {
    Text(String),
    /// `data` is the image's base64, as the server sent it.
    Image {
        mime_type: String,
        data: String,
    },
    Other(String),
}

/// A tool call's result.
#[derive(Debug, Clone, PartialEq)]
pub struct CallResult {
    pub blocks: Vec<Block>,
    pub structured: Option<Value>,
    pub is_error: bool,
}

/// Receives server notifications; `tools/list_changed` is passed to the supervisor.
struct Handler {
    tools_changed: mpsc::UnboundedSender<()>,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.tools_changed.send(());
    }

    fn get_info(&self) -> rmcp::model::ClientConfig {
        let mut info = rmcp::model::ClientConfig::default();
        info.client_info.name = "bumblehive".into();
        info.client_info.version = env!("CARGO_PKG_VERSION").into();
        info
    }
}

/// A live connection. Calls go through [`Peer`] clones; the connection itself is owned by
/// the server's supervisor, which closes it.
pub struct Connection {
    peer: rmcp::Peer<RoleClient>,
    /// Ends the service loop (which closes the transport).
    cancel: Option<rmcp::service::RunningServiceCancellationToken>,
    /// Becomes true when the service loop has ended, for whatever reason.
    done: tokio::sync::watch::Receiver<bool>,
    /// The stdio server's process group, killed whole on close (its children too).
    process_group: Option<i32>,
}

impl Connection {
    fn new(service: RunningService<RoleClient, Handler>, process_group: Option<i32>) -> Self {
        let peer = service.peer().clone();
        let cancel = Some(service.cancellation_token());
        let (tx, done) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let reason = service.waiting().await;
            tracing::debug!("MCP service loop ended: {reason:?}");
            let _ = tx.send(true);
        });
        Connection {
            peer,
            cancel,
            done,
            process_group,
        }
    }
}

/// A cheap handle for calls while the connection lives.
#[derive(Clone)]
pub struct Peer(rmcp::Peer<RoleClient>);

/// Starts the server and initialises the session within `timeout`. `server` names it in
/// the log lines of its stderr; `tools_changed` hears `notifications/tools/list_changed`.
pub async fn connect(
    server: &str,
    endpoint: Endpoint,
    timeout: Duration,
    tools_changed: mpsc::UnboundedSender<()>,
) -> Result<Connection, ClientError> {
    let handler = Handler { tools_changed };
    match endpoint {
        Endpoint::Stdio {
            command,
            args,
            env,
            cwd,
            remove_env,
            clear_env,
        } => {
            let mut cmd = tokio::process::Command::new(&command);
            if clear_env {
                cmd.env_clear();
            }
            for name in remove_env {
                cmd.env_remove(name);
            }
            cmd.args(&args).envs(env).kill_on_drop(true);
            if let Some(cwd) = cwd {
                cmd.current_dir(cwd);
            }
            // Its own process group, so that stopping it stops what it started (npx → node).
            #[cfg(unix)]
            cmd.process_group(0);
            let (transport, stderr) = TokioChildProcess::builder(cmd)
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|err| ClientError::Start(format!("{command}: {err}")))?;
            let process_group = transport.id().map(|pid| pid as i32);
            if let Some(stderr) = stderr {
                let server = server.to_string();
                tokio::spawn(async move {
                    let mut lines = tokio::io::BufReader::new(stderr).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        tracing::info!(target: "bumblehive::mcp::stderr", server = %server, "{line}");
                    }
                });
            }
            let started = tokio::time::timeout(timeout, handler.serve(transport)).await;
            let service = match started {
                Ok(Ok(service)) => service,
                Ok(Err(err)) => {
                    kill_group(process_group);
                    return Err(ClientError::Initialize(err.to_string()));
                }
                Err(_) => {
                    kill_group(process_group);
                    return Err(ClientError::InitTimeout(timeout));
                }
            };
            Ok(Connection::new(service, process_group))
        }
        Endpoint::Http { url, headers } => {
            let mut custom = HashMap::new();
            for (name, value) in headers {
                let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|err| ClientError::Start(format!("header {name:?}: {err}")))?;
                let mut value = reqwest::header::HeaderValue::from_str(&value).map_err(|_| {
                    ClientError::Start(format!("header {name}: the value is not a valid header"))
                })?;
                value.set_sensitive(true);
                custom.insert(name, value);
            }
            let client = reqwest::Client::builder()
                .connect_timeout(timeout)
                .build()
                .map_err(|err| ClientError::Start(err.to_string()))?;
            let mut config = StreamableHttpClientTransportConfig::with_uri(url);
            config.custom_headers = custom;
            let transport = StreamableHttpClientTransport::with_client(HttpClient(client), config);
            let service = match tokio::time::timeout(timeout, handler.serve(transport)).await {
                Ok(Ok(service)) => service,
                Ok(Err(err)) => return Err(ClientError::Initialize(err.to_string())),
                Err(_) => return Err(ClientError::InitTimeout(timeout)),
            };
            Ok(Connection::new(service, None))
        }
    }
}

fn kill_group(group: Option<i32>) {
    #[cfg(unix)]
    if let Some(group) = group.filter(|g| *g > 0) {
        // SAFETY: killpg only sends a signal; a group that is gone gives ESRCH.
        unsafe {
            libc::killpg(group, libc::SIGKILL);
        }
    }
    #[cfg(not(unix))]
    let _ = group;
}

impl Connection {
    pub fn peer(&self) -> Peer {
        Peer(self.peer.clone())
    }

    /// The server's name and version as it gave them in `initialize`.
    pub fn server_info(&self) -> Option<String> {
        let info = self.peer.peer_info()?;
        let value = serde_json::to_value(&*info).ok()?;
        let name = value.pointer("/serverInfo/name")?.as_str()?.to_string();
        let version = value
            .pointer("/serverInfo/version")
            .and_then(Value::as_str)
            .unwrap_or("");
        Some(format!("{name} {version}").trim().to_string())
    }

    /// Resolves when the connection ends by itself (the server exited or hung up).
    pub async fn closed(&self) {
        let mut done = self.done.clone();
        let _ = done.wait_for(|done| *done).await;
    }

    /// Closes the session and stops the server with everything it started.
    pub async fn close(mut self) {
        if let Some(cancel) = self.cancel.take() {
            cancel.cancel();
        }
        let mut done = self.done.clone();
        let _ = tokio::time::timeout(Duration::from_secs(2), done.wait_for(|done| *done)).await;
        kill_group(self.process_group.take());
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // A connection dropped without `close` (a panic, a cancelled supervisor) must
        // not leave the server's children behind.
        if let Some(cancel) = self.cancel.take() {
            cancel.cancel();
        }
        kill_group(self.process_group.take());
    }
}

impl Peer {
    /// Every tool, all pages.
    pub async fn list_tools(&self) -> Result<Vec<ToolInfo>, ClientError> {
        let tools = self.0.list_all_tools().await.map_err(call_error)?;
        Ok(tools
            .into_iter()
            .filter_map(|tool| {
                let value = serde_json::to_value(&tool).ok()?;
                Some(ToolInfo {
                    name: tool.name.to_string(),
                    description: tool
                        .description
                        .as_deref()
                        .or(tool.title.as_deref())
                        .unwrap_or_default()
                        .to_string(),
                    input_schema: value
                        .get("inputSchema")
                        .cloned()
                        .unwrap_or_else(|| serde_json::json!({"type": "object"})),
                    read_only_hint: value
                        .pointer("/annotations/readOnlyHint")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                })
            })
            .collect())
    }

    /// Calls a tool. Dropping the future before the answer sends
    /// `notifications/cancelled` for the request (rmcp's cancel-on-drop).
    pub async fn call(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, Value>,
    ) -> Result<CallResult, ClientError> {
        let mut params = CallToolRequestParams::new(Cow::Owned(tool.to_string()));
        params.arguments = Some(arguments);
        let result = self.0.call_tool(params).await.map_err(call_error)?;
        let value = serde_json::to_value(&result).map_err(|e| ClientError::Call(e.to_string()))?;
        let blocks = value
            .get("content")
            .and_then(Value::as_array)
            .map(|blocks| blocks.iter().map(block).collect())
            .unwrap_or_default();
        Ok(CallResult {
            blocks,
            structured: value.get("structuredContent").cloned(),
            is_error: value.get("isError").and_then(Value::as_bool) == Some(true),
        })
    }
}

/// A content block from its wire form (text, image, audio, resource, resource link).
fn block(value: &Value) -> Block {
    let text = |key: &str| value.get(key).and_then(Value::as_str).unwrap_or_default();
    match text("type") {
        "text" => Block::Text(text("text").to_string()),
        "image" => Block::Image {
            mime_type: text("mimeType").to_string(),
            data: text("data").to_string(),
        },
        "resource" => match value.pointer("/resource/text").and_then(Value::as_str) {
            Some(inner) => Block::Text(inner.to_string()),
            None => Block::Other(format!(
                "[embedded resource {}]",
                value
                    .pointer("/resource/uri")
                    .and_then(Value::as_str)
                    .unwrap_or("")
            )),
        },
        "resource_link" => Block::Other(format!("[resource link {}]", text("uri"))),
        other => Block::Other(format!("[{other} content]")),
    }
}

fn call_error(err: rmcp::ServiceError) -> ClientError {
    match err {
        rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_) => {
            ClientError::Closed
        }
        rmcp::ServiceError::McpError(data) => ClientError::Call(data.message.to_string()),
        other => ClientError::Call(other.to_string()),
    }
}

/// rmcp's streamable HTTP transport over the reqwest client the rest of the app uses
/// (rmcp's own reqwest feature would bring a second reqwest and TLS stack).
#[derive(Clone)]
struct HttpClient(reqwest::Client);

const SESSION_HEADER: &str = "Mcp-Session-Id";
const EVENT_STREAM: &str = "text/event-stream";
const JSON: &str = "application/json";

type HttpError = StreamableHttpError<reqwest::Error>;

fn with_headers(
    mut request: reqwest::RequestBuilder,
    auth: Option<String>,
    custom: HashMap<reqwest::header::HeaderName, reqwest::header::HeaderValue>,
) -> reqwest::RequestBuilder {
    if let Some(auth) = auth {
        request = request.bearer_auth(auth);
    }
    for (name, value) in custom {
        request = request.header(name, value);
    }
    request
}

fn content_type(response: &reqwest::Response) -> Option<String> {
    response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.to_ascii_lowercase())
}

async fn status_error(response: reqwest::Response) -> HttpError {
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    let body: String = body.chars().take(300).collect();
    StreamableHttpError::UnexpectedServerResponse(Cow::Owned(format!("HTTP {status}: {body}")))
}

fn sse(
    response: reqwest::Response,
) -> futures::stream::BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>> {
    sse_stream::SseStream::from_bytes_stream(response.bytes_stream()).boxed()
}

impl StreamableHttpClient for HttpClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<reqwest::header::HeaderName, reqwest::header::HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let mut request = with_headers(self.0.post(uri.as_ref()), auth_header, custom_headers)
            .header(reqwest::header::ACCEPT, format!("{EVENT_STREAM}, {JSON}"));
        let had_session = session_id.is_some();
        if let Some(id) = session_id {
            request = request.header(SESSION_HEADER, id.as_ref());
        }
        let response = request
            .json(&message)
            .send()
            .await
            .map_err(StreamableHttpError::Client)?;
        let status = response.status();
        if matches!(
            status,
            reqwest::StatusCode::ACCEPTED | reqwest::StatusCode::NO_CONTENT
        ) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if status == reqwest::StatusCode::NOT_FOUND && had_session {
            return Err(StreamableHttpError::SessionExpired);
        }
        let kind = content_type(&response);
        let session = response
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let is_json = kind.as_deref().is_some_and(|k| k.starts_with(JSON));
        if !status.is_success() && !is_json {
            return Err(status_error(response).await);
        }
        if kind.as_deref().is_some_and(|k| k.starts_with(EVENT_STREAM)) {
            return Ok(StreamableHttpPostResponse::Sse(sse(response), session));
        }
        if is_json {
            let bytes = response
                .bytes()
                .await
                .map_err(StreamableHttpError::Client)?;
            if bytes.is_empty() && status.is_success() {
                return Ok(StreamableHttpPostResponse::Accepted);
            }
            let message: ServerJsonRpcMessage = serde_json::from_slice(&bytes)?;
            return Ok(StreamableHttpPostResponse::Json(message, session));
        }
        if status.is_success() && response.content_length() == Some(0) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        Err(StreamableHttpError::UnexpectedContentType(kind))
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<reqwest::header::HeaderName, reqwest::header::HeaderValue>,
    ) -> Result<(), HttpError> {
        let response = with_headers(self.0.delete(uri.as_ref()), auth_header, custom_headers)
            .header(SESSION_HEADER, session_id.as_ref())
            .send()
            .await
            .map_err(StreamableHttpError::Client)?;
        if response.status() == reqwest::StatusCode::METHOD_NOT_ALLOWED
            || response.status().is_success()
        {
            return Ok(());
        }
        Err(status_error(response).await)
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<reqwest::header::HeaderName, reqwest::header::HeaderValue>,
    ) -> Result<
        futures::stream::BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>,
        HttpError,
    > {
        let mut request = with_headers(self.0.get(uri.as_ref()), auth_header, custom_headers)
            .header(reqwest::header::ACCEPT, format!("{EVENT_STREAM}, {JSON}"));
        if let Some(id) = session_id {
            request = request.header(SESSION_HEADER, id.as_ref());
        }
        if let Some(last) = last_event_id {
            request = request.header("Last-Event-Id", last);
        }
        let response = request.send().await.map_err(StreamableHttpError::Client)?;
        if response.status() == reqwest::StatusCode::METHOD_NOT_ALLOWED {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        if !response.status().is_success() {
            return Err(status_error(response).await);
        }
        match content_type(&response) {
            Some(kind) if kind.starts_with(EVENT_STREAM) => Ok(sse(response)),
            other => Err(StreamableHttpError::UnexpectedContentType(other)),
        }
    }
}
