//! The headless HTTP transport (SPEC §9): `POST /api/<command>` over the command table, session events as Server-Sent Events, bearer-token auth, and the built web UI; hardened against local processes (header and body timeouts, a connection cap, the token checked before the body is read, Host/Origin checks, security headers, no symlinks out of the UI folder, a bounded graceful shutdown).

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::commands::{CommandError, dispatch};
use crate::protocol::Event;
use crate::service::RuntimeService;

/// What the HTTP layer needs besides the service.
#[derive(Clone)]
pub struct ServerOptions {
    /// Every request must carry it, as `Authorization: Bearer …` or `?token=` (EventSource
    /// cannot set headers).
    pub token: String,
    /// The built web UI to serve at `/`, if any.
    pub ui_dir: Option<PathBuf>,
    /// Ends the event streams, so a graceful shutdown does not wait on them forever.
    pub shutdown: CancellationToken,
    /// `Host` values the API answers (`127.0.0.1:PORT`, `localhost:PORT`, …; see
    /// [`allowed_hosts`]); anything else is a DNS-rebinding page. Empty: any host.
    pub allowed_hosts: Vec<String>,
}

/// Shortest token accepted from `--token`: a short one can be guessed by any local process.
pub const MIN_TOKEN_LEN: usize = 32;
/// Longest wait for a request's headers (a half-sent request line is dropped after it).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for a command's body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest command body.
pub const MAX_BODY: usize = 2 * 1024 * 1024;
/// Connections served at once that have sent a request; more get a 503 and are closed.
pub const MAX_CONNECTIONS: usize = 256;
/// How long a graceful shutdown waits for open requests before dropping them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// Refuses tokens a local process could guess.
pub fn check_token(token: &str) -> Result<(), String> {
    if token.chars().count() < MIN_TOKEN_LEN {
        return Err(format!(
            "the token must be at least {MIN_TOKEN_LEN} characters long (leave --token out for a fresh random one)"
        ));
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("the token must not contain spaces or control characters".into());
    }
    Ok(())
}

/// The `Host` values a server bound to `addr` answers: the address itself, and for
/// loopback `localhost` and the other loopback spelling.
pub fn allowed_hosts(addr: std::net::SocketAddr) -> Vec<String> {
    let port = addr.port();
    let mut hosts = vec![addr.to_string()];
    if addr.ip().is_loopback() {
        for name in ["127.0.0.1", "localhost", "[::1]"] {
            hosts.push(format!("{name}:{port}"));
        }
    }
    hosts.sort();
    hosts.dedup();
    hosts
}

#[derive(Clone)]
struct AppState {
    service: RuntimeService,
    options: Arc<ServerOptions>,
}

/// The router: the HTTP layer only decodes, dispatches and encodes.
pub fn router(service: RuntimeService, options: ServerOptions) -> Router {
    let ui_dir = options.ui_dir.clone();
    let state = AppState {
        service,
        options: Arc::new(options),
    };
    let api = Router::new()
        .route("/api/sessions/events", get(session_list_events))
        .route("/api/sessions/{session_id}/events", get(events))
        .route("/api/{command}", post(command))
        // Host, Origin and the token before anything else is read (finding 6, 15).
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard_api,
        ))
        .with_state(state);
    let app = match ui_dir {
        Some(dir) => {
            let root = dir.canonicalize().unwrap_or(dir.clone());
            let files = tower_http::services::ServeDir::new(&dir)
                .fallback(tower_http::services::ServeFile::new(dir.join("index.html")));
            api.fallback_service(Router::new().fallback_service(files).layer(
                axum::middleware::from_fn_with_state(Arc::new(root), no_links_out),
            ))
        }
        None => api,
    };
    app.layer(axum::middleware::from_fn(security_headers))
}

/// Headers that keep the served UI out of frames and sniffing, and scripts to its own.
async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'self'; script-src 'self'; img-src 'self' data:; connect-src 'self'; \
object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// The API answers only its own Host (no DNS rebinding), no foreign Origin, and only
/// with the token, all checked before the body is read.
/// A refused request also closes its connection: a client without the token has no use
/// for keep-alive, and would otherwise hold one of [`MAX_CONNECTIONS`] until the header
/// timer of its next request (security review 2, finding 14).
async fn guard_api(state: State<AppState>, request: Request, next: Next) -> Response {
    let mut response = check_api(state, request, next).await;
    if matches!(
        response.status(),
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
    ) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

async fn check_api(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let allowed = &state.options.allowed_hosts;
    if !allowed.is_empty() {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !allowed.iter().any(|a| a.eq_ignore_ascii_case(host)) {
            return error_response(
                StatusCode::FORBIDDEN,
                "forbidden_host",
                format!("this server answers only {}", allowed.join(", ")),
            );
        }
        if let Some(origin) = request.headers().get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("");
            // Its own origin, or another loopback page (the UI's dev server proxies
            // /api from localhost:5173): a rebinding page has a foreign name here.
            let ok = allowed
                .iter()
                .any(|a| origin.eq_ignore_ascii_case(&format!("http://{a}")))
                || loopback_origin(origin);
            if !ok {
                return error_response(
                    StatusCode::FORBIDDEN,
                    "forbidden_origin",
                    format!("requests from {origin} are not accepted"),
                );
            }
        }
    }
    let query: std::collections::HashMap<String, String> = request
        .uri()
        .query()
        .and_then(query_pairs)
        .unwrap_or_default();
    if let Err(response) = authorize(&state, request.headers(), &query) {
        return *response;
    }
    next.run(request).await
}

/// `http://localhost:PORT`, `http://127.0.0.1:PORT` or `http://[::1]:PORT`.
fn loopback_origin(origin: &str) -> bool {
    let Some(rest) = origin.strip_prefix("http://") else {
        return false;
    };
    let host = match rest.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => rest,
    };
    matches!(
        host.to_ascii_lowercase().as_str(),
        "localhost" | "127.0.0.1" | "[::1]"
    )
}

/// `a=b&c=d` decoded (what axum's `Query` does), without another dependency.
fn query_pairs(query: &str) -> Option<std::collections::HashMap<String, String>> {
    axum::extract::Query::<std::collections::HashMap<String, String>>::try_from_uri(
        &format!("/?{query}").parse().ok()?,
    )
    .ok()
    .map(|q| q.0)
}

/// Refuses UI files whose real location is outside the UI folder (a symlink in it).
async fn no_links_out(
    State(root): State<Arc<std::path::PathBuf>>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    let decoded = percent_decode(path.trim_start_matches('/'));
    let candidate = root.join(decoded.trim_start_matches('/'));
    if let Ok(real) = candidate.canonicalize() {
        if !real.starts_with(root.as_path()) {
            return error_response(StatusCode::NOT_FOUND, "not_found", "no such file");
        }
    }
    next.run(request).await
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(byte) = u8::from_str_radix(&text[i + 1..i + 3], 16) {
                out.push(byte);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Connections held at once that have not yet sent the headers of their first request:
/// past it, the oldest of them is dropped for the new one (security review 2, finding 14).
pub const MAX_PENDING: usize = 64;

/// The connections that have sent no complete request yet, oldest first, each with what
/// drops it.
type Pending = std::sync::Mutex<std::collections::VecDeque<(u64, CancellationToken)>>;

fn forget_pending(pending: &Pending, id: u64) {
    pending
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|(other, _)| *other != id);
}

/// Serves `app` on `listener` until `stop` is cancelled. Every connection's headers are
/// due within [`HEADER_TIMEOUT`] of accept (HTTP/1 only, no version sniffing, which ran
/// without a timer). A connection counts against [`MAX_CONNECTIONS`] only once it has
/// sent a whole request; before that at most [`MAX_PENDING`] are held and a new one
/// drops the oldest, so silent or half-sent connections cannot keep the person's requests
/// in the listen queue. On stop, open connections get [`SHUTDOWN_GRACE`] to finish and are
/// then dropped, so nothing a client holds open (a half-sent request, an event stream)
/// keeps the process alive.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    stop: CancellationToken,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let pending: Arc<Pending> = Arc::default();
    let mut connections = tokio::task::JoinSet::new();
    let mut next_id: u64 = 0;
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!("accept failed: {err}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        let id = next_id;
        next_id += 1;
        let drop_it = CancellationToken::new();
        {
            let mut waiting = pending.lock().unwrap_or_else(|p| p.into_inner());
            while waiting.len() >= MAX_PENDING {
                match waiting.pop_front() {
                    Some((_, oldest)) => oldest.cancel(),
                    None => break,
                }
            }
            waiting.push_back((id, drop_it.clone()));
        }
        let inner = hyper_util::service::TowerToHyperService::new(app.clone());
        let stop = stop.clone();
        let pending = pending.clone();
        let permits = permits.clone();
        connections.spawn(async move {
            // Taken at the first complete request, held while the connection lives.
            let held: Arc<std::sync::Mutex<Option<tokio::sync::OwnedSemaphorePermit>>> =
                Arc::default();
            let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
            let service = {
                let (pending, held) = (pending.clone(), held.clone());
                hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let inner = inner.clone();
                    let admitted = if first.swap(false, std::sync::atomic::Ordering::SeqCst) {
                        forget_pending(&pending, id);
                        let permit = permits.clone().try_acquire_owned().ok();
                        let admitted = permit.is_some();
                        *held.lock().unwrap_or_else(|p| p.into_inner()) = permit;
                        admitted
                    } else {
                        true
                    };
                    async move {
                        if !admitted {
                            let mut busy = error_response(
                                StatusCode::SERVICE_UNAVAILABLE,
                                "busy",
                                "too many connections; try again",
                            );
                            busy.headers_mut()
                                .insert(header::CONNECTION, HeaderValue::from_static("close"));
                            return Ok::<_, Infallible>(busy);
                        }
                        hyper::service::Service::call(&inner, request).await
                    }
                })
            };
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                // Dropped for a newer connection while it had sent no whole request.
                _ = drop_it.cancelled() => {}
                _ = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            forget_pending(&pending, id);
            drop(held);
        });
        while connections.try_join_next().is_some() {}
    }
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::info!(
            "dropping {} connections still open after the shutdown grace",
            connections.len()
        );
    }
    connections.abort_all();
    Ok(())
}

/// A fresh random token (128 bits, hex).
pub fn generate_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

fn error_response(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        axum::Json(json!({"error": {"code": code, "message": message.into()}})),
    )
        .into_response()
}

fn command_error(err: CommandError) -> Response {
    let status =
        StatusCode::from_u16(err.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(err.to_json())).into_response()
}

/// Compares without an early exit, so timing does not leak how much of a token matched.
fn same_token(given: &str, expected: &str) -> bool {
    given.len() == expected.len()
        && given
            .bytes()
            .zip(expected.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

fn authorize(
    state: &AppState,
    headers: &HeaderMap,
    query: &std::collections::HashMap<String, String>,
) -> Result<(), Box<Response>> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let given = bearer.or(query.get("token").map(String::as_str));
    match given {
        Some(token) if same_token(token, &state.options.token) => Ok(()),
        Some(_) => Err(Box::new(error_response(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "wrong token",
        ))),
        None => Err(Box::new(error_response(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing token: send Authorization: Bearer <token>",
        ))),
    }
}

async fn command(State(state): State<AppState>, Path(name): Path<String>, body: Body) -> Response {
    // The token was checked by `guard_api`; only now is the body read, within a time
    // and size limit.
    let body = match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY)).await
    {
        Ok(Ok(body)) => body,
        Ok(Err(_)) => {
            return error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("the body is larger than {MAX_BODY} bytes or was cut off"),
            );
        }
        Err(_) => {
            return error_response(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!(
                    "the body did not arrive within {} s",
                    BODY_TIMEOUT.as_secs()
                ),
            );
        }
    };
    let arguments: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        match serde_json::from_slice(&body) {
            Ok(value) => value,
            Err(err) => {
                return error_response(
                    StatusCode::BAD_REQUEST,
                    "invalid_json",
                    format!("the body is not valid JSON: {err}"),
                );
            }
        }
    };
    match dispatch(&state.service, &name, arguments).await {
        Ok(value) => axum::Json(value).into_response(),
        Err(err) => command_error(err),
    }
}

async fn events(State(state): State<AppState>, Path(session_id): Path<String>) -> Response {
    let controller = match state.service.controller(&session_id) {
        Ok(controller) => controller,
        Err(err) => return command_error(CommandError::Runtime(err)),
    };
    let stream = controller
        .feed(state.options.shutdown.clone())
        .map(|event| Ok::<_, Infallible>(sse(&event)));
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// The session list's feed (`SessionListEvent`), of one workspace with `?workspace=`.
async fn session_list_events(
    State(state): State<AppState>,
    axum::extract::Query(query): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Response {
    let stream = state
        .service
        .session_list_feed(
            query.get("workspace").cloned(),
            state.options.shutdown.clone(),
        )
        .map(|event| {
            Ok::<_, Infallible>(
                SseEvent::default()
                    .data(serde_json::to_string(&event).unwrap_or_else(|_| "{}".into())),
            )
        });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

fn sse(event: &Event) -> SseEvent {
    SseEvent::default().data(serde_json::to_string(event).unwrap_or_else(|_| "{}".into()))
}
