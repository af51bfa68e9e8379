//! The headless HTTP transport (SPEC §9): `POST /api/<command>` over the command table, session events as Server-Sent Events, bearer-token auth, and the built web UI.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
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
        .route("/api/sessions/{session_id}/events", get(events))
        .route("/api/{command}", post(command))
        .with_state(state);
    match ui_dir {
        Some(dir) => api.fallback_service(
            tower_http::services::ServeDir::new(&dir)
                .fallback(tower_http::services::ServeFile::new(dir.join("index.html"))),
        ),
        None => api,
    }
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

async fn command(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(response) = authorize(&state, &headers, &query) {
        return *response;
    }
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

async fn events(
    State(state): State<AppState>,
    Path(session_id): Path<String>,
    Query(query): Query<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if let Err(response) = authorize(&state, &headers, &query) {
        return *response;
    }
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

fn sse(event: &Event) -> SseEvent {
    SseEvent::default().data(serde_json::to_string(event).unwrap_or_else(|_| "{}".into()))
}
