//! The client side of ACP: an external agent (a profile with `kind: "acp"`) runs as a child process in a process group of its own, one ACP session per Bumblehive child session, and each of its turns stands in for that child's model loop.
//!
//! The agent's `session/request_permission` requests go to the child's approval gate
//! (shown in the parent's window, naming the child); its `fs/read_text_file` and
//! `fs/write_text_file` requests are served under the workspace path rules
//! (`tools::paths`), writes asking like `write_file`; its `terminal/*` requests run
//! `run_command` (sandbox, approvals, limits: `super::terminal`).
//! The agent lives as long as the child session's runs need it: a follow-up prompts the
//! same ACP session; Stop sends `session/cancel` and then ends the process group.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::rpc::{self, Connection, Incoming, RpcError};
use crate::protocol::AcpAgent;
use crate::tools::{Access, ApprovalAsk, ToolContext};

/// How long a cancelled prompt may take to answer before the process group is ended.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// What the agent did during a turn, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// A piece of its answer (`agent_message_chunk`).
    Text(String),
    /// A tool call it began (`tool_call`).
    ToolStarted {
        id: String,
        title: String,
        kind: String,
        input: Value,
    },
    /// A later title or input of a tool call (`tool_call_update` carrying them: Claude
    /// Code announces a call before its input is known).
    ToolUpdated {
        id: String,
        title: Option<String>,
        input: Option<Value>,
    },
    /// Output of a command a tool call runs, shown as a terminal (`_meta.terminal_output`
    /// or `terminal_output_delta`, as codex-acp sends a command's output).
    ToolOutput { id: String, text: String },
    /// A tool call it finished (`tool_call_update` with `completed` or `failed`): its
    /// content's text, and its `rawOutput` for a call whose output came no other way.
    ToolFinished {
        id: String,
        output: String,
        raw_output: String,
        failed: bool,
    },
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnEnd {
    /// `session/prompt` answered: the agent's turn is over, with its `stopReason`
    /// (`end_turn`, `max_tokens`, `refusal`, or `cancelled` when the agent ended it so
    /// without our `session/cancel`, as Codex does when a permission is rejected).
    Done(String),
    /// Stopped by the person (the agent was told with `session/cancel`).
    Cancelled,
    /// The agent could not start, or answered the prompt with an error.
    Failed(String),
    /// The agent's process ended during the turn, not by our Stop: the turn was cut off,
    /// not finished, so the child is interrupted and resumable (a new process of the
    /// agent continues its session with `session/load` where it offers it).
    Lost(String),
}

/// One running agent process and its ACP session.
struct Agent {
    connection: Arc<Connection>,
    acp_session: String,
    incoming: tokio::sync::Mutex<mpsc::UnboundedReceiver<Incoming>>,
    /// Fired when the agent's stdout closes (its process ended).
    exited: CancellationToken,
    pgid: i32,
    /// Its `terminal/create` commands (shared with the requests that wait on them; all
    /// killed when the agent goes).
    terminals: Arc<super::terminal::Terminals>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.terminals.kill_all();
        stop_group(self.pgid);
    }
}

fn stop_group(pgid: i32) {
    if pgid > 0 {
        // SAFETY: kill(2) with a negative pid signals the group the agent leads; it was
        // started with a group of its own, so nothing of ours is in it.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
}

/// The agents of a runtime's live child sessions, by our session id (one per runtime,
/// in its shared state): dropping one ends its process group.
#[derive(Default)]
pub struct Agents(Mutex<HashMap<String, Arc<Agent>>>);

impl Agents {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Agent>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends the agent of a session (deleted, or its turn stopped): its process group goes
    /// once its running turn (if any) lets it go.
    pub fn forget(&self, session_id: &str) {
        let agent = self.map().remove(session_id);
        drop(agent);
    }

    /// Ends every agent (the runtime shuts down).
    pub fn clear(&self) {
        let all: Vec<Arc<Agent>> = self.map().drain().map(|(_, a)| a).collect();
        drop(all);
    }
}

/// What to tell the person when the command is not there.
fn missing(command: &str) -> String {
    let hint = crate::profiles::acp_install_hint(command);
    format!(
        "cannot start the ACP agent: `{command}` is not installed or not on PATH; install it{hint}, or fix the profile's `command`"
    )
}

async fn start(
    agents: &Agents,
    session_id: &str,
    spec: &AcpAgent,
    ctx: &ToolContext,
    previous: Option<&str>,
) -> Result<Arc<Agent>, String> {
    if let Some(agent) = agents
        .map()
        .get(session_id)
        .filter(|a| !a.exited.is_cancelled())
        .cloned()
    {
        return Ok(agent);
    }
    let mut command = tokio::process::Command::new(&spec.command);
    command
        .args(&spec.args)
        .current_dir(&ctx.workspace)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    // The provider's key is ours, not the agent's: it gets only what its profile names.
    for name in &ctx.secret_env {
        command.env_remove(name);
    }
    command.envs(&spec.env);
    let mut child = command.spawn().map_err(|err| match err.kind() {
        std::io::ErrorKind::NotFound => missing(&spec.command),
        _ => format!("cannot start the ACP agent `{}`: {err}", spec.command),
    })?;
    let pgid = child.id().map(|id| id as i32).unwrap_or(0);
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        stop_group(pgid);
        return Err("the ACP agent's pipes are missing".into());
    };
    let (connection, mut reader) = rpc::connect(tokio::io::BufReader::new(stdout), stdin);
    let (tx, rx) = mpsc::unbounded_channel();
    let exited = CancellationToken::new();
    tokio::spawn({
        let exited = exited.clone();
        async move {
            while let Some(message) = reader.next().await {
                if tx.send(message).is_err() {
                    break;
                }
            }
            exited.cancel();
            // Reaped here; the process group was ended (or ends) by whoever saw it go.
            let _ = child.wait().await;
        }
    });
    let talk = async {
        let init = connection
            .request(
                "initialize",
                json!({
                    "protocolVersion": 1,
                    "clientCapabilities": {
                        "fs": {"readTextFile": true, "writeTextFile": true},
                        "terminal": true
                    },
                    "clientInfo": {"name": "bumblehive", "version": env!("CARGO_PKG_VERSION")}
                }),
            )
            .await?;
        // The session of the agent's earlier process, where it can load one: its
        // conversation goes on. A load it refuses falls back to a new session.
        if let Some(previous) =
            previous.filter(|_| init["agentCapabilities"]["loadSession"].as_bool() == Some(true))
        {
            let load = connection
                .request(
                    "session/load",
                    json!({"sessionId": previous, "cwd": ctx.workspace, "mcpServers": []}),
                )
                .await;
            match load {
                Ok(_) => return Ok(json!({"sessionId": previous})),
                Err(err) => {
                    tracing::info!(
                        session = session_id,
                        "the ACP agent did not load session {previous}: {err}"
                    )
                }
            }
        }
        connection
            .request(
                "session/new",
                json!({"cwd": ctx.workspace, "mcpServers": []}),
            )
            .await
    };
    let answer = tokio::select! {
        answer = talk => answer,
        _ = exited.cancelled() => Err(RpcError::new(rpc::INTERNAL_ERROR, "the agent's process ended")),
    };
    let answer = match answer {
        Ok(answer) => answer,
        Err(err) => {
            stop_group(pgid);
            return Err(format!(
                "the ACP agent `{}` did not start a session: {err}",
                spec.command
            ));
        }
    };
    let Some(acp_session) = answer.get("sessionId").and_then(Value::as_str) else {
        stop_group(pgid);
        return Err("the ACP agent answered session/new without a sessionId".into());
    };
    // What a load replayed (the agent's account of the old conversation) is in the
    // history already: it is not this turn's. A request this early (none is expected)
    // is answered, so the agent does not wait on it.
    let mut rx = rx;
    while let Ok(message) = rx.try_recv() {
        if let Incoming::Request { id, method, .. } = message {
            connection.respond_error(
                id,
                &RpcError::new(
                    rpc::INTERNAL_ERROR,
                    format!("{method} before the session started"),
                ),
            );
        }
    }
    let agent = Arc::new(Agent {
        connection,
        acp_session: acp_session.to_string(),
        incoming: tokio::sync::Mutex::new(rx),
        exited,
        pgid,
        terminals: Default::default(),
    });
    agents.map().insert(session_id.to_string(), agent.clone());
    Ok(agent)
}

/// Runs one turn of the session's agent (started first when it is not running): sends
/// `prompt` with `session/prompt` and hands every update to `on_update` until the
/// prompt is answered, the person stops it (`ctx.cancel`) or the agent dies.
///
/// `acp_session` is the ACP session the child had (a new process of the agent loads it
/// where it can) and, once the agent runs, the one it has now. `earlier` is what the
/// child was told before this prompt (its task, follow-ups): sent ahead of the prompt
/// when the agent had to begin a new session instead of loading its own, so that the
/// new session still knows the task.
#[allow(clippy::too_many_arguments)]
pub async fn turn(
    agents: &Agents,
    session_id: &str,
    spec: &AcpAgent,
    ctx: &ToolContext,
    prompt: String,
    earlier: &str,
    acp_session: &mut Option<String>,
    on_update: &mut (dyn FnMut(Update) + Send),
) -> TurnEnd {
    let agent = tokio::select! {
        biased;
        _ = ctx.cancel.cancelled() => return TurnEnd::Cancelled,
        agent = start(agents, session_id, spec, ctx, acp_session.as_deref()) => match agent {
            Ok(agent) => agent,
            Err(message) => return TurnEnd::Failed(message),
        },
    };
    let lost_its_session = acp_session
        .as_deref()
        .is_some_and(|previous| previous != agent.acp_session);
    *acp_session = Some(agent.acp_session.clone());
    let prompt = if lost_its_session && !earlier.trim().is_empty() {
        format!(
            "(Your earlier session could not be loaded. What you were told in it:)\n\n{earlier}\n\n(Now:)\n\n{prompt}"
        )
    } else {
        prompt
    };
    let mut incoming = agent.incoming.lock().await;
    let prompting = agent.connection.request(
        "session/prompt",
        json!({"sessionId": agent.acp_session, "prompt": [{"type": "text", "text": prompt}]}),
    );
    tokio::pin!(prompting);
    let mut cancelled = false;
    let grace = tokio::time::sleep(Duration::MAX / 4);
    tokio::pin!(grace);
    loop {
        tokio::select! {
            answer = &mut prompting => {
                // Updates sent before the answer are in the channel already (the reader
                // queues them before it reads the answer's line): they belong to this turn.
                while let Ok(message) = incoming.try_recv() {
                    handle(&agent, ctx, message, on_update);
                }
                drop(incoming);
                return match answer {
                    _ if cancelled => {
                        agents.forget(session_id);
                        TurnEnd::Cancelled
                    }
                    Ok(answer) => TurnEnd::Done(
                        answer["stopReason"].as_str().unwrap_or("end_turn").to_string(),
                    ),
                    Err(err) => TurnEnd::Failed(format!("the ACP agent failed: {err}")),
                };
            }
            _ = ctx.cancel.cancelled(), if !cancelled => {
                cancelled = true;
                agent.connection.notify("session/cancel", json!({"sessionId": agent.acp_session}));
                grace.as_mut().reset(tokio::time::Instant::now() + CANCEL_GRACE);
            }
            _ = &mut grace, if cancelled => {
                drop(incoming);
                agents.forget(session_id);
                return TurnEnd::Cancelled;
            }
            _ = agent.exited.cancelled() => {
                // Whatever it sent before it died is still in the channel.
                while let Ok(message) = incoming.try_recv() {
                    handle(&agent, ctx, message, on_update);
                }
                drop(incoming);
                agents.forget(session_id);
                return if cancelled {
                    TurnEnd::Cancelled
                } else {
                    TurnEnd::Lost("the ACP agent's process ended during its turn".into())
                };
            }
            message = incoming.recv() => match message {
                Some(message) => handle(&agent, ctx, message, on_update),
                None => {
                    agent.exited.cancel();
                }
            },
        }
    }
}

/// One message from the agent: an update for the turn, or a request we serve.
fn handle(
    agent: &Arc<Agent>,
    ctx: &ToolContext,
    message: Incoming,
    on_update: &mut (dyn FnMut(Update) + Send),
) {
    match message {
        Incoming::Notification { method, params } if method == "session/update" => {
            for update in updates_of(&params["update"]) {
                on_update(update);
            }
        }
        Incoming::Notification { .. } => {}
        Incoming::Request { id, method, params } => {
            let connection = agent.connection.clone();
            let terminals = agent.terminals.clone();
            let ctx = ctx.clone();
            tokio::spawn(async move {
                let answer = if method.starts_with("terminal/") {
                    terminals.serve(&ctx, &method, &params).await
                } else {
                    serve(&ctx, &method, &params).await
                };
                match answer {
                    Ok(result) => connection.respond(id, result),
                    Err(err) => connection.respond_error(id, &err),
                }
            });
        }
    }
}

/// Maps a `session/update` to what the child's history keeps (none for the kinds it
/// does not keep: plans, usage, commands, session info).
pub fn updates_of(update: &Value) -> Vec<Update> {
    let text = |v: &Value| v.get("text").and_then(Value::as_str).map(str::to_string);
    let id = || {
        update
            .get("toolCallId")
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let mut out = Vec::new();
    match update.get("sessionUpdate").and_then(Value::as_str) {
        Some("agent_message_chunk") => out.extend(text(&update["content"]).map(Update::Text)),
        Some("tool_call") => out.extend(id().map(|id| Update::ToolStarted {
            id,
            title: update["title"].as_str().unwrap_or_default().to_string(),
            kind: update["kind"].as_str().unwrap_or("other").to_string(),
            input: update.get("rawInput").cloned().unwrap_or(Value::Null),
        })),
        Some("tool_call_update") => {
            let Some(id) = id() else { return out };
            let title = update["title"].as_str().map(str::to_string);
            // An empty input says nothing new (Claude Code's first announcement has one).
            let input = update
                .get("rawInput")
                .filter(|v| !v.is_null() && v.as_object().is_none_or(|o| !o.is_empty()))
                .cloned();
            if title.is_some() || input.is_some() {
                out.push(Update::ToolUpdated {
                    id: id.clone(),
                    title,
                    input,
                });
            }
            let meta = &update["_meta"];
            for key in ["terminal_output", "terminal_output_delta"] {
                if let Some(data) = meta[key]["data"].as_str() {
                    out.push(Update::ToolOutput {
                        id: id.clone(),
                        text: data.to_string(),
                    });
                }
            }
            let status = update["status"].as_str().unwrap_or_default();
            if status == "completed" || status == "failed" {
                let output: Vec<String> = update["content"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| text(&c["content"]))
                    .collect();
                let raw_output = match update.get("rawOutput") {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(raw)) => raw.clone(),
                    Some(raw) => raw.to_string(),
                };
                out.push(Update::ToolFinished {
                    id,
                    output: output.join("\n"),
                    raw_output,
                    failed: status == "failed",
                });
            }
        }
        _ => {}
    }
    out
}

/// Serves one request of the agent with our own confined tools and approvals.
async fn serve(ctx: &ToolContext, method: &str, params: &Value) -> Result<Value, RpcError> {
    let path = || {
        params["path"]
            .as_str()
            .ok_or_else(|| RpcError::invalid_params("path is missing"))
    };
    match method {
        "session/request_permission" => Ok(permission(ctx, params).await),
        "fs/read_text_file" => {
            let raw = path()?;
            let resolved = crate::tools::paths::resolve(&ctx.workspace, raw)
                .map_err(|err| RpcError::invalid_params(err.to_string()))?;
            let access = if resolved.inside && resolved.hard_links == 0 {
                Access::Read
            } else {
                Access::Outside
            };
            ask(ctx, "read_file", json!({"path": raw}), None, access).await?;
            let (mut file, _) = crate::tools::paths::open_regular(&resolved)
                .map_err(|err| RpcError::new(rpc::NOT_FOUND, err.to_string()))?;
            let mut content = String::new();
            std::io::Read::read_to_string(&mut file, &mut content)
                .map_err(|err| RpcError::new(rpc::INTERNAL_ERROR, err.to_string()))?;
            // `line` is 1-based; `limit` counts lines from there.
            if params.get("line").is_some() || params.get("limit").is_some() {
                let skip = params["line"].as_u64().unwrap_or(1).max(1) as usize - 1;
                let take = params["limit"].as_u64().map_or(usize::MAX, |l| l as usize);
                content = content
                    .split_inclusive('\n')
                    .skip(skip)
                    .take(take)
                    .collect();
            }
            Ok(json!({"content": content}))
        }
        "fs/write_text_file" => {
            let raw = path()?;
            let content = params["content"]
                .as_str()
                .ok_or_else(|| RpcError::invalid_params("content is missing"))?;
            let resolved = crate::tools::paths::resolve(&ctx.workspace, raw)
                .map_err(|err| RpcError::invalid_params(err.to_string()))?;
            let access = if resolved.inside && resolved.hard_links == 0 {
                Access::Change
            } else {
                Access::Outside
            };
            ask(
                ctx,
                "write_file",
                json!({"path": raw, "content": content}),
                None,
                access,
            )
            .await?;
            crate::tools::paths::recheck(&ctx.workspace, raw, &resolved)
                .map_err(|err| RpcError::invalid_params(err.to_string()))?;
            crate::tools::paths::write_regular(&resolved, content.as_bytes())
                .map_err(|err| RpcError::new(rpc::INTERNAL_ERROR, err.to_string()))?;
            Ok(Value::Null)
        }
        other => Err(RpcError::new(
            rpc::METHOD_NOT_FOUND,
            format!("{other} is not offered by this client"),
        )),
    }
}

async fn ask(
    ctx: &ToolContext,
    tool: &str,
    arguments: Value,
    diff: Option<String>,
    access: Access,
) -> Result<(), RpcError> {
    ctx.ask(ApprovalAsk {
        tool: tool.to_string(),
        arguments,
        diff,
        access,
    })
    .await
    .map_err(|err| RpcError::new(rpc::INTERNAL_ERROR, err.to_string()))
}

/// A `session/request_permission` as an approval of the child: allowed picks the
/// agent's `allow_once` option, denied its `reject_once`; a stop answers `cancelled`.
async fn permission(ctx: &ToolContext, params: &Value) -> Value {
    let call = &params["toolCall"];
    let title = call["title"].as_str().unwrap_or("a tool call");
    let decision = ctx
        .approvals
        .ask(
            ApprovalAsk {
                tool: format!("acp: {title}"),
                arguments: call.get("rawInput").cloned().unwrap_or(json!({})),
                diff: None,
                access: Access::Change,
            },
            &ctx.cancel,
        )
        .await;
    if ctx.cancel.is_cancelled() {
        return json!({"outcome": {"outcome": "cancelled"}});
    }
    let options = params["options"].as_array().cloned().unwrap_or_default();
    let wanted: &[&str] = if decision.approved {
        &["allow_once", "allow_always"]
    } else {
        &["reject_once", "reject_always"]
    };
    let chosen = wanted.iter().find_map(|kind| {
        options
            .iter()
            .find(|o| o["kind"].as_str() == Some(kind))
            .and_then(|o| o["optionId"].as_str())
    });
    match chosen {
        Some(option) => json!({"outcome": {"outcome": "selected", "optionId": option}}),
        None => json!({"outcome": {"outcome": "cancelled"}}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_map_to_text_and_tool_calls() {
        assert_eq!(
            updates_of(&json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "hi"}})),
            [Update::Text("hi".into())]
        );
        assert_eq!(
            updates_of(
                &json!({"sessionUpdate": "tool_call_update", "toolCallId": "t",
                "status": "completed", "rawOutput": "1\tok",
                "content": [{"type": "content", "content": {"type": "text", "text": "ok"}}]})
            ),
            [Update::ToolFinished {
                id: "t".into(),
                output: "ok".into(),
                raw_output: "1\tok".into(),
                failed: false
            }]
        );
        assert_eq!(
            updates_of(
                &json!({"sessionUpdate": "tool_call_update", "toolCallId": "t",
                "status": "in_progress"})
            ),
            []
        );
    }

    /// Claude Code names a call's input after announcing it; codex-acp sends a
    /// command's output as terminal output in `_meta`.
    #[test]
    fn later_inputs_and_terminal_output_are_kept() {
        assert_eq!(
            updates_of(
                &json!({"sessionUpdate": "tool_call_update", "toolCallId": "t",
                "rawInput": {"file_path": "/w/notes.txt"}, "title": "Read notes.txt"})
            ),
            [Update::ToolUpdated {
                id: "t".into(),
                title: Some("Read notes.txt".into()),
                input: Some(json!({"file_path": "/w/notes.txt"}))
            }]
        );
        assert_eq!(
            updates_of(
                &json!({"sessionUpdate": "tool_call_update", "toolCallId": "t",
                "rawInput": {}})
            ),
            []
        );
        assert_eq!(
            updates_of(
                &json!({"sessionUpdate": "tool_call_update", "toolCallId": "c",
                "status": "completed", "rawOutput": {"exit_code": 0},
                "_meta": {"terminal_output_delta": {"data": "line\n", "terminal_id": "c"}}})
            ),
            [
                Update::ToolOutput {
                    id: "c".into(),
                    text: "line\n".into()
                },
                Update::ToolFinished {
                    id: "c".into(),
                    output: String::new(),
                    raw_output: "{\"exit_code\":0}".into(),
                    failed: false
                }
            ]
        );
    }
}
