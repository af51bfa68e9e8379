//! JSON-RPC 2.0 over newline-delimited stdio, as ACP carries it: one writer task for every outgoing line, our requests' answers routed back by id.
//!
//! Hand-written rather than the `agent-client-protocol` crate: that crate and its schema
//! crate turn on serde_json's `preserve_order` for the whole binary (every `Value` map
//! becomes an `IndexMap`, larger and ordered differently in every module), which a front
//! door must not do to the runtime behind it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

/// Error codes of JSON-RPC 2.0 (and ACP's resource-not-found).
pub const INVALID_PARAMS: i64 = -32602;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INTERNAL_ERROR: i64 = -32603;
pub const NOT_FOUND: i64 = -32002;

/// An error answer.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(INVALID_PARAMS, message)
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

/// One message from the peer.
pub enum Incoming {
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
}

/// The sending half of a connection. Cheap to share (`Arc`).
pub struct Connection {
    out: mpsc::UnboundedSender<String>,
    next_id: AtomicU64,
    pending: Mutex<HashMap<u64, oneshot::Sender<Result<Value, RpcError>>>>,
}

impl Connection {
    fn send(&self, message: Value) {
        // A closed writer means the peer is gone; what is left to say goes nowhere.
        let _ = self.out.send(message.to_string());
    }

    pub fn notify(&self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    pub fn respond(&self, id: Value, result: Value) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "result": result}));
    }

    pub fn respond_error(&self, id: Value, error: &RpcError) {
        self.send(json!({"jsonrpc": "2.0", "id": id,
            "error": {"code": error.code, "message": error.message}}));
    }

    /// Sends a request; the answer (or the connection's end, as an error) resolves it.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, tx);
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        rx.await
            .unwrap_or_else(|_| Err(RpcError::new(INTERNAL_ERROR, "the client went away")))
    }

    fn answered(&self, message: &Value) {
        let Some(id) = message.get("id").and_then(Value::as_u64) else {
            return;
        };
        let Some(tx) = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id)
        else {
            return;
        };
        let answer = match message.get("error") {
            Some(error) => Err(RpcError::new(
                error.get("code").and_then(Value::as_i64).unwrap_or(0),
                error
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
            )),
            None => Ok(message.get("result").cloned().unwrap_or(Value::Null)),
        };
        let _ = tx.send(answer);
    }
}

/// A connection over `input` and `output`: the writer task is spawned; `incoming` yields
/// the peer's requests and notifications until `input` ends (its answers to our requests
/// are routed inside).
pub fn connect<R, W>(input: R, output: W) -> (std::sync::Arc<Connection>, Reader<R>)
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (out, rx) = mpsc::unbounded_channel();
    tokio::spawn(write_lines(rx, output));
    let connection = std::sync::Arc::new(Connection {
        out,
        next_id: AtomicU64::new(0),
        pending: Mutex::new(HashMap::new()),
    });
    (
        connection.clone(),
        Reader {
            lines: input.lines(),
            connection,
        },
    )
}

/// Writes each message as one line; what queued up meanwhile goes out with one flush.
async fn write_lines<W: AsyncWrite + Unpin>(
    mut rx: mpsc::UnboundedReceiver<String>,
    mut output: W,
) {
    while let Some(line) = rx.recv().await {
        let mut batch = line;
        batch.push('\n');
        while let Ok(more) = rx.try_recv() {
            batch.push_str(&more);
            batch.push('\n');
        }
        if output.write_all(batch.as_bytes()).await.is_err() || output.flush().await.is_err() {
            return;
        }
    }
}

/// The reading half.
pub struct Reader<R> {
    lines: tokio::io::Lines<R>,
    connection: std::sync::Arc<Connection>,
}

impl<R: AsyncBufRead + Unpin> Reader<R> {
    /// The next request or notification; `None` when the input ended.
    pub async fn next(&mut self) -> Option<Incoming> {
        loop {
            let line = match self.lines.next_line().await {
                Ok(Some(line)) => line,
                Ok(None) => return None,
                Err(err) => {
                    tracing::warn!("cannot read from the ACP client: {err}");
                    return None;
                }
            };
            if line.trim().is_empty() {
                continue;
            }
            let message: Value = match serde_json::from_str(&line) {
                Ok(message) => message,
                Err(err) => {
                    self.connection.send(json!({"jsonrpc": "2.0", "id": null,
                        "error": {"code": -32700, "message": format!("parse error: {err}")}}));
                    continue;
                }
            };
            let method = message.get("method").and_then(Value::as_str);
            let params = message.get("params").cloned().unwrap_or(Value::Null);
            match (method, message.get("id")) {
                (Some(method), Some(id)) if !id.is_null() => {
                    return Some(Incoming::Request {
                        id: id.clone(),
                        method: method.to_string(),
                        params,
                    });
                }
                (Some(method), _) => {
                    return Some(Incoming::Notification {
                        method: method.to_string(),
                        params,
                    });
                }
                (None, _) => self.connection.answered(&message),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn requests_notifications_and_answers_are_told_apart() {
        let (client, agent) = tokio::io::duplex(4096);
        let (agent_in, agent_out) = tokio::io::split(agent);
        let (conn, mut reader) = connect(tokio::io::BufReader::new(agent_in), agent_out);
        let (client_in, mut client_out) = tokio::io::split(client);
        let mut client_lines = tokio::io::BufReader::new(client_in).lines();
        client_out
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"initialize\",\"params\":{}}\n\n{\"jsonrpc\":\"2.0\",\"method\":\"session/cancel\",\"params\":{\"sessionId\":\"s\"}}\n")
            .await
            .unwrap();
        let Some(Incoming::Request { id, method, .. }) = reader.next().await else {
            panic!("no request");
        };
        assert_eq!((id, method.as_str()), (json!(7), "initialize"));
        assert!(matches!(
            reader.next().await,
            Some(Incoming::Notification { method, .. }) if method == "session/cancel"
        ));
        // Our request's answer is routed to it, not yielded.
        let asked = tokio::spawn({
            let conn = conn.clone();
            async move { conn.request("session/request_permission", json!({})).await }
        });
        let sent: Value =
            serde_json::from_str(&client_lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(sent["method"], "session/request_permission");
        client_out
            .write_all(
                format!(
                    "{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{{\"ok\":1}}}}\n",
                    sent["id"]
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        client_out.shutdown().await.unwrap();
        assert!(reader.next().await.is_none());
        assert_eq!(asked.await.unwrap(), Ok(json!({"ok": 1})));
    }
}
