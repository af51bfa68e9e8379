//! `bumblehive acp`: the runtime as an Agent Client Protocol agent over stdio; docs/ACP.md is the mapping (our events and commands ↔ ACP methods and updates).
//!
//! One [`RuntimeService`] behind it, as behind `serve` and the desktop app. Each session
//! the client opens (`session/new`, `session/load`) gets one forwarder task: it subscribes
//! to the session's controller (its descendants' events included, SPEC §5) and turns each
//! event into `session/update` notifications, `session/request_permission` requests, and
//! the answer of the open `session/prompt`. Updates are sent whether or not a prompt is
//! open, so a wake-up by a report after the prompt ended (SPEC §4) still reaches the client.

pub mod client;
mod rpc;
pub mod schema;
mod terminal;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncWrite};

use crate::controller::Received;
use crate::error::RuntimeError;
use crate::protocol::{
    ApprovalInfo, Event, Message, MessageStatus, Progress, Role, SubagentState, commands,
};
use crate::service::RuntimeService;
use rpc::{Connection, Incoming, RpcError};

/// The most text one tool result puts into a `tool_call_update` (the model and the stored
/// history keep all of it; an editor's card needs no megabytes).
const RESULT_TEXT_MAX: usize = 16 * 1024;

/// Serves ACP on stdin/stdout until the client closes stdin.
pub async fn serve_stdio(service: RuntimeService) {
    serve(
        service,
        tokio::io::BufReader::new(tokio::io::stdin()),
        tokio::io::stdout(),
    )
    .await;
}

/// Serves ACP over `input` and `output` until `input` ends. The forwarders stop then;
/// runs and children go on until the caller shuts the service down.
pub async fn serve<R, W>(service: RuntimeService, input: R, output: W)
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (connection, mut reader) = rpc::connect(input, output);
    let acp = Arc::new(Acp {
        service,
        connection,
        subagents: OnceLock::new(),
        sessions: Mutex::new(HashMap::new()),
    });
    while let Some(incoming) = reader.next().await {
        match incoming {
            Incoming::Request { id, method, params } => acp.request(id, &method, params),
            Incoming::Notification { method, params } => acp.notification(&method, params),
        }
    }
    for (_, attached) in acp
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain()
    {
        attached.forwarder.abort();
    }
}

struct Acp {
    service: RuntimeService,
    connection: Arc<Connection>,
    /// Whether the client advertised `subagents` (the Subagent Sessions RFD) at `initialize`.
    subagents: OnceLock<bool>,
    /// The sessions the client opened, by id.
    sessions: Mutex<HashMap<String, Arc<Attached>>>,
}

/// A session the client opened, and its forwarder.
struct Attached {
    /// The open `session/prompt`, answered when its turn ends.
    prompt: Arc<Mutex<Option<OpenPrompt>>>,
    forwarder: tokio::task::JoinHandle<()>,
}

struct OpenPrompt {
    /// The JSON-RPC id of the `session/prompt` request.
    request: Value,
    /// The prompt's message: the turn it belongs to is the run that started with it or
    /// took it in at a safe point (its `message_status` arms the answer).
    message_id: String,
    armed: bool,
}

fn params<T: serde::de::DeserializeOwned>(params: Value) -> Result<T, RpcError> {
    serde_json::from_value(params).map_err(|err| RpcError::invalid_params(err.to_string()))
}

fn runtime_error(err: RuntimeError) -> RpcError {
    let code = match err {
        RuntimeError::NotFound(_) => rpc::NOT_FOUND,
        RuntimeError::InvalidArgument(_) => rpc::INVALID_PARAMS,
        _ => rpc::INTERNAL_ERROR,
    };
    RpcError::new(code, err.to_string())
}

impl Acp {
    fn subagents(&self) -> bool {
        self.subagents.get().copied().unwrap_or(false)
    }

    /// Answers a request: at once, except `session/prompt`, whose answer is its turn's end.
    fn request(self: &Arc<Self>, id: Value, method: &str, raw: Value) {
        let answer = match method {
            "initialize" => params(raw).map(|p| self.initialize(&p)),
            "session/new" => params(raw).and_then(|p| self.new_session(&p)),
            "session/load" => params(raw).and_then(|p| self.load_session(&p)),
            "session/prompt" => match params(raw) {
                Ok(p) => return self.prompt(id, p),
                Err(err) => Err(err),
            },
            other => Err(RpcError::new(
                rpc::METHOD_NOT_FOUND,
                format!("method not found: {other}"),
            )),
        };
        match answer {
            Ok(result) => self.connection.respond(id, result),
            Err(err) => self.connection.respond_error(id, &err),
        }
    }

    fn notification(self: &Arc<Self>, method: &str, raw: Value) {
        if method != "session/cancel" {
            return;
        }
        let Ok(cancel) = params::<schema::SessionParams>(raw) else {
            return;
        };
        // Stop (SPEC §4); for a child's session, Stop of that child only.
        let service = self.service.clone();
        tokio::spawn(async move {
            if let Err(err) = service.cancel_session(&cancel.session_id).await {
                tracing::warn!(session = %cancel.session_id, "session/cancel: {err}");
            }
        });
    }

    fn initialize(&self, request: &schema::InitializeParams) -> Value {
        let _ = self.subagents.set(request.client_capabilities.subagents());
        tracing::info!(
            client = ?request.client_info,
            version = request.protocol_version,
            subagents = self.subagents(),
            "ACP client connected"
        );
        schema::initialize_result(env!("CARGO_PKG_VERSION"))
    }

    fn new_session(
        self: &Arc<Self>,
        request: &schema::NewSessionParams,
    ) -> Result<Value, RpcError> {
        let cwd = Path::new(&request.cwd);
        if !cwd.is_absolute() {
            return Err(RpcError::invalid_params(format!(
                "cwd must be an absolute path, not {}",
                request.cwd
            )));
        }
        let cwd = cwd
            .canonicalize()
            .map_err(|err| RpcError::invalid_params(format!("cwd {}: {err}", request.cwd)))?;
        // The workspace rules (`/`, the home folder itself, system folders refused) are
        // `create_session`'s, as for every front door.
        let info = self
            .service
            .create_session(&cwd.display().to_string(), None)
            .map_err(|err| {
                RpcError::invalid_params(format!("cannot work in {}: {err}", cwd.display()))
            })?;
        self.attach(&info.session_id)?;
        Ok(json!({"sessionId": info.session_id}))
    }

    fn load_session(self: &Arc<Self>, request: &schema::SessionParams) -> Result<Value, RpcError> {
        let id = &request.session_id;
        let stored = self.service.get_session(id).map_err(runtime_error)?;
        let workspace = PathBuf::from(&stored.info.workspace);
        // The history first, then live updates: the forwarder starts after the replay.
        for update in replay(&stored.messages, &workspace) {
            self.connection
                .notify("session/update", schema::notification(id, update));
        }
        self.attach(id)?;
        Ok(json!({}))
    }

    /// Starts the session's forwarder (once per session per connection).
    fn attach(self: &Arc<Self>, session_id: &str) -> Result<(), RpcError> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if sessions.contains_key(session_id) {
            return Ok(());
        }
        let controller = self.service.controller(session_id).map_err(runtime_error)?;
        let workspace = PathBuf::from(&controller.current_meta().workspace);
        // Subscribed here, before `session/new` is answered: no event of a prompt sent
        // right after can come before the subscription.
        let (events, _) = controller.subscribe();
        let prompt = Arc::new(Mutex::new(None));
        let forwarder = Forwarder {
            acp: self.clone(),
            top: session_id.to_string(),
            workspace,
            prompt: prompt.clone(),
            subagents: self.subagents(),
            children: HashMap::new(),
            calls: HashMap::new(),
            asked: HashSet::new(),
        };
        let task = tokio::spawn(forwarder.run(events, controller));
        sessions.insert(
            session_id.to_string(),
            Arc::new(Attached {
                prompt,
                forwarder: task,
            }),
        );
        Ok(())
    }

    fn prompt(&self, request_id: Value, request: schema::PromptParams) {
        let id = request.session_id;
        let refuse = |err: RpcError| self.connection.respond_error(request_id.clone(), &err);
        let Some(attached) = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
        else {
            return refuse(RpcError::invalid_params(format!(
                "session {id} is not open on this connection (session/new or session/load first)"
            )));
        };
        let text = schema::prompt_text(&request.prompt);
        if text.trim().is_empty() {
            return refuse(RpcError::invalid_params("the prompt has no text"));
        }
        // Held across the submit: the forwarder reads the message's status only once the
        // prompt is recorded, so the status cannot pass unseen.
        let mut open = attached.prompt.lock().unwrap_or_else(|p| p.into_inner());
        if open.is_some() {
            return refuse(RpcError::invalid_params(
                "a prompt is already running in this session",
            ));
        }
        match self.service.submit(&id, text, None) {
            Ok((message_id, MessageStatus::Queued)) => {
                // Held for a run that is not starting: the turn is over for the client;
                // the message waits in the session's queue.
                tracing::info!(session = %id, message = %message_id, "prompt queued");
                self.connection
                    .respond(request_id, json!({"stopReason": "end_turn"}));
            }
            Ok((message_id, _)) => {
                *open = Some(OpenPrompt {
                    request: request_id,
                    message_id,
                    armed: false,
                });
                drop(open);
                self.send_queued(&id);
            }
            Err(err) => refuse(runtime_error(err)),
        }
    }
}

impl Acp {
    /// What waited in a stopped session's queue (reports that arrived while it was
    /// stopped, messages a Stop returned) joins the turn the person's prompt started: an
    /// ACP client has no queue to show or send from, so left there it would never be sent.
    fn send_queued(&self, session_id: &str) {
        let Ok(controller) = self.service.controller(session_id) else {
            return;
        };
        let queued = controller.snapshot().pending.into_iter();
        for pending in queued.filter(|p| p.status == MessageStatus::Queued) {
            if let Err(err) = controller.steer(&pending.message_id) {
                tracing::warn!(session = %session_id, message = %pending.message_id, "cannot send a queued message: {err}");
            }
        }
    }
}

/// A child session seen by the forwarder.
struct Child {
    title: String,
    /// Its `sub_agent` call's id (a report names it).
    task_id: Option<String>,
    /// The session it was announced on.
    parent: String,
}

/// Turns one session's events (its descendants' included) into ACP messages.
struct Forwarder {
    acp: Arc<Acp>,
    /// The session the client opened.
    top: String,
    workspace: PathBuf,
    prompt: Arc<Mutex<Option<OpenPrompt>>>,
    subagents: bool,
    /// Descendants announced so far (`session_created` seen).
    children: HashMap<String, Child>,
    /// Tool calls started and not finished, by (session, call id): an approval names the
    /// call it is about.
    calls: HashMap<(String, String), (String, Value)>,
    /// Approvals already sent to the client (a lag's snapshot may list them again).
    asked: HashSet<String>,
}

impl Forwarder {
    async fn run(
        mut self,
        mut events: crate::controller::Subscription,
        controller: Arc<crate::controller::SessionController>,
    ) {
        while let Some(received) = events.recv().await {
            match received {
                Received::Event(event) => self.event(event),
                Received::Lagged(missed) => {
                    // Missed events may have held approval requests or the turn's end:
                    // the snapshot has every open approval and whether a run goes on.
                    tracing::warn!(session = %self.top, missed, "the ACP client fell behind");
                    let snapshot = controller.snapshot();
                    for ask in snapshot.approvals {
                        self.approval(ask);
                    }
                    if !snapshot.running {
                        self.end_prompt(Ok("end_turn"));
                    }
                }
            }
        }
    }

    fn send(&self, session_id: &str, update: Value) {
        self.acp
            .connection
            .notify("session/update", schema::notification(session_id, update));
    }

    /// Whether a session's updates go under its own id: the opened session's, and a
    /// child's for a client that knows child sessions (else they are summarised).
    fn own_stream(&self, session_id: &str) -> bool {
        session_id == self.top || (self.subagents && self.children.contains_key(session_id))
    }

    fn summary(&self, line: String) {
        self.send(&self.top, schema::agent_text(&format!("\n{line}\n")));
    }

    fn child_title(&self, session_id: &str) -> String {
        self.children
            .get(session_id)
            .map(|c| c.title.clone())
            .unwrap_or_else(|| session_id.to_string())
    }

    fn event(&mut self, event: Event) {
        match event {
            Event::SessionCreated {
                session_id,
                parent_session_id: Some(parent),
                task_id,
                title,
            } => self.child_created(session_id, parent, task_id, title),
            Event::MessageStatus {
                session_id,
                message_id,
                status,
            } => {
                let mut open = self.prompt.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(prompt) = open.as_mut() {
                    if prompt.message_id == message_id && status != MessageStatus::Queued {
                        prompt.armed = true;
                    }
                }
                drop(open);
                if status == MessageStatus::Queued && session_id == self.top {
                    self.report_waits(&message_id);
                }
            }
            Event::ApprovalRequest(ask) => self.approval(ask),
            Event::Event {
                session_id,
                kind,
                data,
            } => self.progress(session_id, kind, data),
            Event::Result { session_id, .. } if session_id == self.top => {
                self.end_prompt(Ok("end_turn"));
            }
            Event::Error {
                session_id,
                message,
            } => {
                if session_id == self.top {
                    self.end_prompt(Err(message));
                } else if !self.subagents {
                    let title = self.child_title(&session_id);
                    self.summary(format!(
                        "[sub-agent \u{201c}{title}\u{201d} failed: {message}]"
                    ));
                }
            }
            _ => {}
        }
    }

    /// A report queued in the stopped session: said in its stream, since an ACP client
    /// shows no queue (it goes with the next prompt, `Acp::send_queued`).
    fn report_waits(&self, message_id: &str) {
        let Some(task) = message_id.strip_prefix("subagent:") else {
            return;
        };
        let task = task.split(':').next().unwrap_or_default();
        let title = self
            .children
            .values()
            .find(|child| child.task_id.as_deref() == Some(task))
            .map(|child| child.title.clone())
            .unwrap_or_else(|| task.to_string());
        self.summary(format!(
            "[the report of sub-agent \u{201c}{title}\u{201d} waits: the session was stopped; it goes with your next prompt]"
        ));
    }

    fn child_created(
        &mut self,
        session_id: String,
        parent: String,
        task_id: Option<String>,
        title: String,
    ) {
        self.children.insert(
            session_id.clone(),
            Child {
                title: title.clone(),
                task_id: task_id.clone(),
                parent: parent.clone(),
            },
        );
        if !self.subagents {
            self.summary(format!("[sub-agent \u{201c}{title}\u{201d} started]"));
            return;
        }
        // The RFD: announced on its immediate parent before any of its own traffic.
        let description = task_id.map(|task| format!("background task {task}"));
        self.send(
            &parent,
            schema::subagent_announced(&session_id, &title, description.as_deref()),
        );
    }

    fn progress(&mut self, session_id: String, kind: String, data: Value) {
        // The common case first, without typing the event: a streamed piece of answer.
        if kind == "content.delta" {
            if let Some(text) = data.get("text").and_then(Value::as_str) {
                if self.own_stream(&session_id) {
                    self.send(&session_id, schema::agent_text(text));
                }
            }
            return;
        }
        let Ok(progress) = serde_json::from_value::<Progress>(json!({"kind": kind, "data": data}))
        else {
            return;
        };
        let own = self.own_stream(&session_id);
        match progress {
            Progress::ToolCallStarted {
                call_id,
                name,
                arguments,
            } => {
                if own && name == crate::tools::UpdatePlan::NAME {
                    // Sent as the plan when it is taken (below), not as a tool call.
                } else if own {
                    self.send(
                        &session_id,
                        tool_call(&call_id, &name, &arguments, &self.workspace, "in_progress"),
                    );
                } else {
                    let title = self.child_title(&session_id);
                    let what = tool_title(&name, &arguments);
                    self.summary(format!("[sub-agent \u{201c}{title}\u{201d}: {what}]"));
                }
                self.calls.insert((session_id, call_id), (name, arguments));
            }
            Progress::ToolCallFinished {
                call_id,
                result,
                is_error,
                ..
            } => {
                let call = self.calls.remove(&(session_id.clone(), call_id.clone()));
                let plan = call.filter(|(name, _)| name == crate::tools::UpdatePlan::NAME);
                if let Some((_, arguments)) = plan {
                    // A plan the tool refused (two steps in progress) was never the plan.
                    if own && !is_error {
                        self.send(&session_id, schema::plan(&arguments));
                    }
                } else if own {
                    let shown = cut(&result, RESULT_TEXT_MAX);
                    self.send(
                        &session_id,
                        schema::tool_call_done(&call_id, is_error, &shown, &result),
                    );
                }
            }
            Progress::RunCancelled {} if session_id == self.top => {
                self.end_prompt(Ok("cancelled"));
            }
            Progress::SubagentState { state, .. } if self.subagents => {
                // A child's own event; its state goes to the session it was announced on.
                if let Some(child) = self.children.get(&session_id) {
                    let update = schema::subagent_state(&session_id, subagent_state(state));
                    self.send(&child.parent, update);
                }
            }
            Progress::MessageAppended { message } => self.appended(&session_id, &message),
            _ => {}
        }
    }

    /// A report reaching a session's history: the RFD's `session_message` from the child,
    /// or a line in the summary.
    fn appended(&mut self, session_id: &str, message: &Message) {
        let Some(message_id) = message.id.as_deref() else {
            return;
        };
        if message.role != Role::User || !message_id.starts_with("subagent:") {
            return;
        }
        // `subagent:<task id>`, or `subagent:<task id>:<n>` for a follow-up's report.
        let task_id = message_id
            .trim_start_matches("subagent:")
            .split(':')
            .next()
            .unwrap_or_default();
        let text = message.content.clone().unwrap_or_default();
        let child = self
            .acp
            .service
            .store()
            .children(session_id)
            .ok()
            .and_then(|children| {
                children
                    .into_iter()
                    .find(|meta| meta.task_id.as_deref() == Some(task_id))
            })
            .map(|meta| meta.session_id);
        if self.subagents {
            if self.own_stream(session_id) {
                let update =
                    schema::session_message(message_id, child.as_deref(), session_id, &text);
                self.send(session_id, update);
            }
            return;
        }
        let title = child
            .map(|id| self.child_title(&id))
            .unwrap_or_else(|| task_id.to_string());
        // The report's body, without its `[Background tool result]` / task id head.
        let body = text
            .split_once("\n\n")
            .map(|(_, body)| body)
            .unwrap_or(&text);
        self.summary(format!(
            "[sub-agent \u{201c}{title}\u{201d} reported: {}]",
            cut(body, 2000)
        ));
    }

    /// Asks the client, then decides the approval with its answer. A reject, a cancelled
    /// outcome or a failed request is a denial.
    fn approval(&mut self, ask: ApprovalInfo) {
        if !self.asked.insert(ask.approval_id.clone()) {
            return;
        }
        let on = if self.own_stream(&ask.session_id) {
            ask.session_id.clone()
        } else {
            self.top.clone()
        };
        // The call it is about, so the client's card is the call's own.
        let call_id = self
            .calls
            .iter()
            .find(|((session, _), (name, arguments))| {
                *session == ask.session_id && *name == ask.tool && *arguments == ask.arguments
            })
            .map(|((_, call_id), _)| call_id.clone())
            .unwrap_or_else(|| ask.approval_id.clone());
        let mut call = tool_call(
            &call_id,
            &ask.tool,
            &ask.arguments,
            &self.workspace,
            "pending",
        );
        if let Some(update) = call.as_object_mut() {
            update.remove("sessionUpdate");
        }
        if ask.session_id != self.top && !self.subagents {
            let title = format!(
                "sub-agent \u{201c}{}\u{201d}: {}",
                self.child_title(&ask.session_id),
                tool_title(&ask.tool, &ask.arguments)
            );
            call["title"] = Value::String(title);
        }
        let mut options = vec![schema::permission_option(
            "allow_once",
            "Allow",
            "allow_once",
        )];
        if ask.rememberable {
            let label = ask
                .remember_label
                .as_ref()
                // Already the whole sentence ("always allow … in this session"), as the
                // desktop's button says it: only its first letter is raised.
                .map(|l| {
                    let mut chars = l.chars();
                    chars.next().map_or_else(String::new, |first| {
                        first.to_uppercase().chain(chars).collect::<String>()
                    })
                })
                .unwrap_or_else(|| "Always allow in this session".into());
            options.push(schema::permission_option(
                "allow_always",
                &label,
                "allow_always",
            ));
        }
        options.push(schema::permission_option(
            "reject_once",
            "Reject",
            "reject_once",
        ));
        let request = schema::permission_request(&on, call, options);
        let connection = self.acp.connection.clone();
        let service = self.acp.service.clone();
        let top = self.top.clone();
        tokio::spawn(async move {
            let answer = connection
                .request("session/request_permission", request)
                .await;
            let (approved, remember) = match &answer {
                Ok(result) => match schema::selected_option(result) {
                    Some("allow_once") => (true, false),
                    Some("allow_always") => (true, true),
                    _ => (false, false),
                },
                Err(err) => {
                    tracing::warn!("session/request_permission failed: {err}; denied");
                    (false, false)
                }
            };
            let decision = commands::DecideApproval {
                session_id: top,
                approval_id: ask.approval_id.clone(),
                approved,
                remember,
                reason: None,
            };
            // Already settled (a Stop denied it meanwhile) is worth a note, no more.
            if let Err(err) = service.decide_approval(decision) {
                tracing::debug!(approval = %ask.approval_id, "approval not decided: {err}");
            }
        });
    }

    /// Answers the open prompt if its turn has begun (its message started or was steered
    /// in); a run that ends before that was another turn (a wake-up by a report).
    fn end_prompt(&self, outcome: Result<&str, String>) {
        let mut open = self.prompt.lock().unwrap_or_else(|p| p.into_inner());
        if !open.as_ref().is_some_and(|prompt| prompt.armed) {
            return;
        }
        let Some(prompt) = open.take() else {
            return;
        };
        let connection = &self.acp.connection;
        match outcome {
            Ok(reason) => connection.respond(prompt.request, json!({"stopReason": reason})),
            Err(message) => connection
                .respond_error(prompt.request, &RpcError::new(rpc::INTERNAL_ERROR, message)),
        }
    }
}

/// The first `max` bytes of `text` (at a character boundary), marked when cut.
fn cut(text: &str, max: usize) -> String {
    let head = crate::text::head(text, max);
    if head.len() == text.len() {
        return text.to_string();
    }
    format!("{head}\n… ({} more bytes)", text.len() - head.len())
}

fn subagent_state(state: SubagentState) -> Value {
    match state {
        SubagentState::WaitingForSlot | SubagentState::Running => schema::running_state(),
        SubagentState::Done => schema::idle_state("end_turn"),
        SubagentState::Cancelled => schema::idle_state("cancelled"),
        SubagentState::Failed => schema::idle_state("error"),
    }
}

fn str_arg<'a>(arguments: &'a Value, key: &str) -> Option<&'a str> {
    arguments.get(key).and_then(Value::as_str)
}

/// ACP's tool kind of one of our tools.
fn tool_kind(name: &str) -> &'static str {
    match name {
        "read_file" | "list_dir" => "read",
        "glob" | "grep" => "search",
        "write_file" | "edit_file" => "edit",
        "run_command" => "execute",
        _ => "other",
    }
}

/// A call's one-line title, as an editor's card shows it.
fn tool_title(name: &str, arguments: &Value) -> String {
    let path = str_arg(arguments, "path").unwrap_or(".");
    match name {
        "read_file" => format!("Read {path}"),
        "write_file" => format!("Write {path}"),
        "edit_file" => format!("Edit {path}"),
        "list_dir" => format!("List {path}"),
        "glob" => format!("Find {}", str_arg(arguments, "pattern").unwrap_or("")),
        "grep" => format!("Search for {}", str_arg(arguments, "pattern").unwrap_or("")),
        "run_command" => format!("Run {}", str_arg(arguments, "command").unwrap_or("")),
        "sub_agent" => format!(
            "Sub-agent \u{201c}{}\u{201d}",
            str_arg(arguments, "title").unwrap_or("")
        ),
        "message_subagent" => "Message a sub-agent".into(),
        other => other.to_string(),
    }
}

/// A workspace-relative path made absolute (as ACP wants), lexically: nothing is read.
fn absolute(workspace: &Path, path: &str) -> String {
    let path = Path::new(path);
    if path.is_absolute() {
        path.display().to_string()
    } else {
        workspace.join(path).display().to_string()
    }
}

/// What a call's card shows: an edit's diff (the replaced text and its replacement; a
/// whole file written as new text), a shell call's command line. Built from the
/// arguments alone: this layer reads no file, the tools' path policy stays the only
/// reader.
fn tool_content(name: &str, arguments: &Value, workspace: &Path) -> Vec<Value> {
    let path = str_arg(arguments, "path").map(|p| absolute(workspace, p));
    match (name, path) {
        ("write_file", Some(path)) => str_arg(arguments, "content")
            .map(|content| vec![schema::diff_content(&path, None, content)])
            .unwrap_or_default(),
        ("edit_file", Some(path)) => match (
            str_arg(arguments, "old_string"),
            str_arg(arguments, "new_string"),
        ) {
            (Some(old), Some(new)) => vec![schema::diff_content(&path, Some(old), new)],
            _ => Vec::new(),
        },
        ("run_command", _) => str_arg(arguments, "command")
            .map(|command| vec![schema::text_content(&format!("$ {command}"))])
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

fn tool_call(
    call_id: &str,
    name: &str,
    arguments: &Value,
    workspace: &Path,
    status: &str,
) -> Value {
    let path = str_arg(arguments, "path").map(|p| absolute(workspace, p));
    schema::tool_call(
        call_id,
        &tool_title(name, arguments),
        tool_kind(name),
        status,
        arguments,
        tool_content(name, arguments, workspace),
        path.as_deref(),
    )
}

/// A stored history as the updates that replay it (`session/load`).
fn replay(messages: &[Message], workspace: &Path) -> Vec<Value> {
    let mut updates = Vec::new();
    // `update_plan` calls by id: replayed as the plan once their result says it was taken.
    let mut plans: HashMap<&str, &Value> = HashMap::new();
    for message in messages {
        let text = message.content.clone().unwrap_or_default();
        match message.role {
            Role::User if !text.is_empty() => updates.push(schema::user_text(&text)),
            Role::Assistant => {
                if !text.is_empty() {
                    updates.push(schema::agent_text(&text));
                }
                for call in &message.tool_calls {
                    if call.name == crate::tools::UpdatePlan::NAME {
                        plans.insert(&call.id, &call.arguments);
                        continue;
                    }
                    updates.push(tool_call(
                        &call.id,
                        &call.name,
                        &call.arguments,
                        workspace,
                        "pending",
                    ));
                }
            }
            Role::Tool => {
                if let Some(arguments) = message
                    .tool_call_id
                    .as_deref()
                    .and_then(|id| plans.remove(id))
                {
                    if text.starts_with(crate::tools::UpdatePlan::TAKEN) {
                        updates.push(schema::plan(arguments));
                    }
                } else if let Some(call_id) = &message.tool_call_id {
                    let shown = cut(&text, RESULT_TEXT_MAX);
                    updates.push(schema::tool_call_done(call_id, false, &shown, &text));
                }
            }
            _ => {}
        }
    }
    updates
}
