//! Wire types shared by the core, the HTTP server, the desktop shell and the UI: messages, events, snapshots and command arguments. No I/O lives here.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use ts_rs::TS;

/// Sessions are addressed by string ids; children are ordinary sessions with a parent.
pub type SessionId = String;

/// The role of a message in the OpenAI chat shape (SPEC §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, TS)]
#[ts(export)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// One tool call of an assistant message. `arguments` is the parsed JSON object; a model
/// that sent text which is not JSON keeps that text as a JSON string, so the history stays
/// faithful and the tool can tell the model what was wrong.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub arguments: Value,
}

/// Token counts of one model call, or sums of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct Usage {
    // JSON numbers: token counts stay far below 2^53.
    #[ts(type = "number")]
    pub input_tokens: u64,
    #[ts(type = "number")]
    pub output_tokens: u64,
}

impl Usage {
    pub fn add(&mut self, other: Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
    }

    pub fn total(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }
}

/// A message in the OpenAI chat shape, plus two optional fields the runtime needs:
/// `id` (reports are `subagent:<task_id>`) and `usage` for assistant messages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct Message {
    pub role: Role,
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// An answer cut short by Stop: what had streamed is kept (and sent to the model
    /// next time), marked so the UI can say so. Never sent to providers as a field.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[ts(optional = nullable)]
    pub stopped: bool,
    /// `usage` is the runtime's estimate, not the provider's count: a stopped answer's
    /// provider reports usage only at the end of the stream (issue 28, E23).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[ts(optional = nullable)]
    pub usage_estimated: bool,
    /// Images of the message: pasted or dropped by the person (user messages), or returned
    /// by a tool (an MCP server's screenshot, on tool messages).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[ts(as = "Option<Vec<ImagePart>>", optional)]
    pub images: Vec<ImagePart>,
}

/// An image in a person's message: sent to providers as an image part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct ImagePart {
    /// `image/png`, `image/jpeg`, `image/gif` or `image/webp`.
    pub media_type: String,
    /// The image's bytes in standard base64 (no `data:` prefix).
    pub data: String,
}

impl ImagePart {
    /// The types every provider that takes images accepts.
    pub const MEDIA_TYPES: [&'static str; 4] =
        ["image/png", "image/jpeg", "image/gif", "image/webp"];
    /// The largest image accepted (Anthropic's limit per image).
    pub const MAX_BYTES: usize = 5 * 1024 * 1024;
    /// The most images one message carries.
    pub const MAX_PER_MESSAGE: usize = 8;

    /// The image's size in bytes, from its base64 length.
    pub fn decoded_len(&self) -> usize {
        let padding = self.data.bytes().rev().take_while(|b| *b == b'=').count();
        (self.data.len() / 4) * 3 - padding.min(2)
    }

    /// Checks the images of a message: known types, valid base64, size caps.
    pub fn check_all(images: &[ImagePart]) -> Result<(), String> {
        if images.len() > Self::MAX_PER_MESSAGE {
            return Err(format!(
                "{} images in one message; at most {} are taken",
                images.len(),
                Self::MAX_PER_MESSAGE
            ));
        }
        for (n, image) in images.iter().enumerate() {
            let n = n + 1;
            if !Self::MEDIA_TYPES.contains(&image.media_type.as_str()) {
                return Err(format!(
                    "image {n} is {:?}; the types taken are {}",
                    image.media_type,
                    Self::MEDIA_TYPES.join(", ")
                ));
            }
            let valid = !image.data.is_empty()
                && image.data.len() % 4 == 0
                && image
                    .data
                    .trim_end_matches('=')
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/');
            if !valid {
                return Err(format!("image {n} is not valid base64"));
            }
            if image.decoded_len() > Self::MAX_BYTES {
                return Err(format!(
                    "image {n} is {} KiB; at most {} MiB is taken",
                    image.decoded_len() / 1024,
                    Self::MAX_BYTES / (1024 * 1024)
                ));
            }
        }
        Ok(())
    }
}

impl Message {
    fn new(role: Role, content: Option<String>) -> Self {
        Message {
            role,
            content,
            tool_calls: Vec::new(),
            tool_call_id: None,
            id: None,
            usage: None,
            stopped: false,
            usage_estimated: false,
            images: Vec::new(),
        }
    }

    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, Some(content.into()))
    }

    pub fn user(id: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            id: Some(id.into()),
            ..Self::new(Role::User, Some(content.into()))
        }
    }

    pub fn assistant(content: Option<String>, tool_calls: Vec<ToolCall>) -> Self {
        Message {
            tool_calls,
            ..Self::new(Role::Assistant, content)
        }
    }

    pub fn tool(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            tool_call_id: Some(call_id.into()),
            ..Self::new(Role::Tool, Some(content.into()))
        }
    }

    pub fn text(&self) -> &str {
        self.content.as_deref().unwrap_or("")
    }

    /// A note the app added to the conversation (an undo, a rewind: [`NOTE_ID_PREFIX`]).
    pub fn is_note(&self) -> bool {
        self.role == Role::User
            && self
                .id
                .as_deref()
                .is_some_and(|id| id.starts_with(NOTE_ID_PREFIX))
    }

    /// A message the person wrote: a `user` message that is neither a sub-agent's report
    /// nor a note of the app. Each one begins a turn (the Changes view, undo, compaction).
    pub fn is_from_person(&self) -> bool {
        self.role == Role::User
            && !self.is_note()
            && !self
                .id
                .as_deref()
                .is_some_and(|id| id.starts_with("subagent:"))
    }
}

/// The id prefix of a note the app adds to a conversation for something the person did
/// outside it (UX review E7: "the person undid turn 3: hello.t deleted"). A note is a
/// `user` message, so the model reads it at its next turn, but it is no turn of the
/// person's, and the chat shows it as a note, not as their message.
pub const NOTE_ID_PREFIX: &str = "note:";

/// The note in a sub-agent's history when its changes were undone with its parent's turn.
pub const CHILD_UNDO_NOTE: &str = "Note: the person undid every file change of this conversation, together with the turn of the conversation that started it. The files are as they were before; the conversation above is unchanged.";

/// What undoing or rewinding did to the files, as the note says it: the turns (numbered
/// from 1, the person's messages), and each file by what happened to it.
pub fn undo_note_text(
    rewind: bool,
    first_turn: usize,
    last_turn: usize,
    with_children: bool,
    files: &[commands::FileChange],
) -> String {
    let mut turns = turns_text(first_turn, last_turn);
    if with_children {
        turns.push_str(" and of the sub-agents started there");
    }
    let what = undone_files_text(files);
    if rewind {
        format!(
            "Note: the person rewound to before turn {first_turn} and went on in a fork of this conversation. The file changes of {turns} were undone ({what}); the files no longer match what this conversation says about them."
        )
    } else {
        format!(
            "Note: the person undid the file changes of {turns}: {what}. The files are as they were before {}; the conversation above is unchanged.",
            if last_turn > first_turn {
                "those turns"
            } else {
                "that turn"
            }
        )
    }
}

/// The note in a sub-agent's parent when the person undid that sub-agent's own turns
/// from its tab (E7): the parent holds the sub-agent's report of those changes, and its
/// next turn must not take them for still there.
pub fn child_undone_note_text(
    child_title: &str,
    first_turn: usize,
    last_turn: usize,
    files: &[commands::FileChange],
) -> String {
    let turns = turns_text(first_turn, last_turn);
    format!(
        "Note: the person undid the file changes of sub-agent \"{child_title}\" (its {turns}): {}. Its report above may name changes that are no longer in the files.",
        undone_files_text(files)
    )
}

/// "turn 3" or "turns 3 to 5".
fn turns_text(first_turn: usize, last_turn: usize) -> String {
    if last_turn > first_turn {
        format!("turns {first_turn} to {last_turn}")
    } else {
        format!("turn {first_turn}")
    }
}

/// Each file by what undoing does to it: an added file is deleted again, the rest get
/// their earlier content back ("hello.t deleted; a.txt restored").
fn undone_files_text(files: &[commands::FileChange]) -> String {
    let mut deleted = Vec::new();
    let mut restored = Vec::new();
    for file in files {
        if file.status == "deleted" {
            deleted.push(file.path.as_str());
        } else {
            restored.push(file.path.as_str());
        }
    }
    let named = |paths: &[&str]| {
        const SHOWN: usize = 10;
        let mut text = paths
            .iter()
            .take(SHOWN)
            .copied()
            .collect::<Vec<_>>()
            .join(", ");
        if paths.len() > SHOWN {
            text.push_str(&format!(" and {} more", paths.len() - SHOWN));
        }
        text
    };
    let mut what = Vec::new();
    if !deleted.is_empty() {
        what.push(format!("{} deleted", named(&deleted)));
    }
    if !restored.is_empty() {
        what.push(format!("{} restored", named(&restored)));
    }
    what.join("; ")
}

/// What happened to a message handed to a session (SPEC §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[ts(export)]
#[serde(rename_all = "snake_case")]
pub enum MessageStatus {
    Queued,
    Steered,
    Started,
}

/// The life state of a session as a list or a badge shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, TS)]
#[ts(export)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    #[default]
    Idle,
    Running,
    Paused,
}

/// The state of a background sub-agent task, as its tab shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[ts(export)]
#[serde(rename_all = "snake_case")]
pub enum SubagentState {
    WaitingForSlot,
    Running,
    Done,
    Failed,
    Cancelled,
}

/// Per-run settings carried by a message (SPEC §4: a pending message keeps the
/// config of the run it belonged to). Unknown keys are kept so nothing is lost.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct RunConfig {
    #[serde(default)]
    pub runtime: RuntimeSettings,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct RuntimeSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// A model for this run only, on the session's provider (a custom command's `model`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub model: Option<String>,
    /// Only these tools for this run (a custom command's `allowed-tools`): what is offered
    /// is narrowed, never widened, and approvals still ask as the person's policy says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub tools: Option<Vec<String>>,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

/// The session list's feed (the desktop's `subscribe_sessions`, the server's
/// `GET /api/sessions/events`): the whole list first, and again after the subscriber
/// fell behind, then each session whose list entry changed (created, renamed, started,
/// stopped, used tokens, archived) or that was deleted. The UI keeps its list from this
/// instead of asking for it again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[ts(export)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SessionListEvent {
    Listed { sessions: Vec<SessionInfo> },
    Changed { session: Box<SessionInfo> },
    Removed { session_id: SessionId },
}

/// Session metadata as lists and the command table return it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct SessionInfo {
    pub session_id: SessionId,
    pub workspace: String,
    pub title: String,
    pub parent_session_id: Option<SessionId>,
    /// The `sub_agent` call that created this session, for children.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    pub state: SessionState,
    #[serde(default)]
    pub usage: Usage,
    /// A child whose work was cut off by a crash: resume it (`resume_subagent`) or cancel it.
    #[serde(default)]
    pub interrupted: bool,
    /// Paused because its last run failed (not stopped by the person): said after a
    /// restart too, and a parent's follow-up runs it again.
    #[serde(default)]
    pub failed: bool,
    /// Hidden from the usual list (`archive_session`); nothing else changes.
    #[serde(default)]
    pub archived: bool,
    /// A child's profile (`explore`, `review`, a file's name …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub agent: Option<String>,
    /// The provider and model chosen for this session (`set_model`); unset: the defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub model: Option<String>,
    /// Tokens by the provider and model that spent them, in the order first used (the
    /// last is the model the session ran on last).
    #[serde(default)]
    pub models: Vec<ModelUsage>,
    /// The session this one was forked from (`fork_session`), listed under it, and the
    /// index of the message the fork starts before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub forked_from: Option<SessionId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub forked_at: Option<usize>,
    /// A child that works in its own git worktree (`isolation: "worktree"`): its tab
    /// offers Apply to workspace and Discard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub worktree: Option<WorktreeInfo>,
}

/// Where an isolated child works: a git worktree of the parent's repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct WorktreeInfo {
    /// The top folder of the parent's repository, where Apply writes.
    pub origin: String,
    /// The worktree, under `<data>/worktrees/<child id>`.
    pub path: String,
    /// `bumblehive/<child id>`.
    pub branch: String,
    /// The commit the worktree started from.
    pub base: String,
    /// The changes were applied to the workspace.
    #[serde(default)]
    pub applied: bool,
}

/// The tokens one model spent in a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct ModelUsage {
    /// The provider's name in the config (`default` for a lone `provider` block).
    pub provider: String,
    pub model: String,
    pub usage: Usage,
}

/// Adds `usage` to the entry of `provider`/`model`, appending one when it is new.
pub fn add_model_usage(models: &mut Vec<ModelUsage>, provider: &str, model: &str, usage: Usage) {
    match models
        .iter_mut()
        .find(|m| m.provider == provider && m.model == model)
    {
        Some(entry) => entry.usage.add(usage),
        None => models.push(ModelUsage {
            provider: provider.to_string(),
            model: model.to_string(),
            usage,
        }),
    }
}

/// A message waiting in a session's pending queue (SPEC §4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct PendingMessage {
    pub message_id: String,
    pub content: String,
    pub status: MessageStatus,
    #[serde(default)]
    pub config: RunConfig,
    /// The images of a person's message (see [`Message::images`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[ts(as = "Option<Vec<ImagePart>>", optional)]
    pub images: Vec<ImagePart>,
}

/// An approval that waits for the person's decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct ApprovalInfo {
    pub approval_id: String,
    /// The session whose tool asks (a child's id when a sub-agent asks).
    pub session_id: SessionId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session_id: Option<SessionId>,
    /// The asking sub-agent's title, so the dialog can name it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    pub tool: String,
    pub arguments: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
    /// Whether "always allow for this session" may be offered (never for outside paths).
    #[serde(default)]
    pub rememberable: bool,
    /// What "always allow" would cover, for its button ("always allow `cargo test` in
    /// this session"): one exact command or an argv prefix, never any command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub remember_label: Option<String>,
    /// The MCP server of an `mcp__<server>__<tool>` call, so the card can name it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub mcp_server: Option<String>,
    /// The branch of the asking sub-agent's own worktree, when it is isolated: its writes
    /// and commands act there, not in the workspace, until the person applies them (UX
    /// review E20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub worktree: Option<String>,
    /// Where the asking sub-agent runs: its server's name and its model, as its run
    /// resolved them (UX review E3). A child may run on another server than its parent
    /// (its profile's), so the person sees where the call's content goes before deciding.
    /// Unset for a top-level session (it runs where the person picked) and for an ACP
    /// agent's child (the agent chooses its own model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub model: Option<String>,
}

/// A background sub-agent as its parent's snapshot lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct SubagentInfo {
    pub task_id: String,
    pub session_id: SessionId,
    pub parent_session_id: SessionId,
    pub title: String,
    pub state: SubagentState,
    /// The model server the child runs on (its slots are what it waits for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub server: Option<String>,
}

/// The authoritative state of a session for a late joiner (SPEC §5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct Snapshot {
    pub session_id: SessionId,
    pub running: bool,
    pub paused: bool,
    pub pending: Vec<PendingMessage>,
    /// Open approvals of this session and of its descendants.
    pub approvals: Vec<ApprovalInfo>,
    pub subagents: Vec<SubagentInfo>,
    /// Tokens of this session and of the whole tree below it.
    pub usage: Usage,
    pub tree_usage: Usage,
    /// How full the model's window is, as of the last model call (`None` before one).
    #[serde(default)]
    pub context: Option<ContextMeter>,
    /// The instruction files (AGENTS.md, CLAUDE.md, the user's) the last run loaded.
    #[serde(default)]
    pub instructions: Vec<InstructionFile>,
    /// The id of the latest compaction, when the history has been compacted.
    #[serde(default)]
    pub compacted: Option<String>,
}

/// One event out of the core (SPEC §5). Every event names the session it is about;
/// events of a child reach the parent's subscribers with the child's id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[ts(export)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    SessionCreated {
        session_id: SessionId,
        parent_session_id: Option<SessionId>,
        task_id: Option<String>,
        title: String,
    },
    MessageStatus {
        session_id: SessionId,
        message_id: String,
        status: MessageStatus,
    },
    ApprovalRequest(ApprovalInfo),
    ApprovalResolved {
        session_id: SessionId,
        approval_id: String,
        approved: bool,
    },
    /// Progress of a run: `kind` is e.g. `tool.call.started`, `content.delta`.
    Event {
        session_id: SessionId,
        kind: String,
        #[serde(default)]
        data: Value,
    },
    Result {
        session_id: SessionId,
        content: String,
    },
    Error {
        session_id: SessionId,
        message: String,
    },
    /// First event of an SSE stream, and the answer to a lagging subscriber.
    Snapshot(Snapshot),
}

impl Event {
    pub fn session_id(&self) -> &str {
        match self {
            Event::SessionCreated { session_id, .. }
            | Event::MessageStatus { session_id, .. }
            | Event::ApprovalResolved { session_id, .. }
            | Event::Event { session_id, .. }
            | Event::Result { session_id, .. }
            | Event::Error { session_id, .. } => session_id,
            Event::ApprovalRequest(info) => &info.session_id,
            Event::Snapshot(snapshot) => &snapshot.session_id,
        }
    }
}

/// What each kind of `Event::Event` carries, typed: the runtime builds its progress
/// events from this, and the UI reads `data` by `kind` through the generated type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[ts(export)]
#[serde(tag = "kind", content = "data")]
pub enum Progress {
    #[serde(rename = "content.delta")]
    ContentDelta { text: String },
    #[serde(rename = "tool.call.started")]
    ToolCallStarted {
        call_id: String,
        name: String,
        arguments: Value,
    },
    #[serde(rename = "tool.call.finished")]
    ToolCallFinished {
        call_id: String,
        name: String,
        result: String,
        is_error: bool,
    },
    #[serde(rename = "message.appended")]
    MessageAppended { message: Message },
    #[serde(rename = "run.cancelled")]
    RunCancelled {},
    /// The run was cut off, not by the person (an ACP child's agent process died): the
    /// sub-agent is interrupted and can be resumed or cancelled.
    #[serde(rename = "run.interrupted")]
    RunInterrupted { message: String },
    #[serde(rename = "message.discarded")]
    MessageDiscarded { message_id: String },
    #[serde(rename = "subagent.state")]
    SubagentState {
        task_id: String,
        state: SubagentState,
    },
    /// The model made the same calls several batches in a row (the loop guard).
    #[serde(rename = "loop.warning")]
    LoopWarning { name: String, repeats: u32 },
    /// The history was compacted before a model call (the UI draws its divider).
    #[serde(rename = "context.compacted")]
    Compacted { compaction: Compaction },
    /// The context meter changed.
    #[serde(rename = "context.usage")]
    Context { meter: ContextMeter },
    /// The workspace's `.mcp.json` has servers waiting for the person's trust: the turn
    /// runs without them (Settings asks; `trust_mcp_workspace` answers).
    #[serde(rename = "mcp.trust_needed")]
    McpTrustNeeded {
        workspace: String,
        servers: Vec<String>,
    },
    /// The next model call waits for a request slot of its server (a server that takes
    /// a few requests at once): `ahead` calls are before it.
    #[serde(rename = "slot.waiting")]
    WaitingForSlot { server: String, ahead: u32 },
    #[serde(rename = "provider.retry")]
    ProviderRetry {
        attempt: u32,
        // JSON numbers: a delay in milliseconds stays far below 2^53.
        #[ts(type = "number")]
        delay_ms: u64,
        reason: String,
    },
}

impl Progress {
    /// The `kind` and `data` of the wire's `event` object.
    pub fn into_parts(self) -> (String, Value) {
        match serde_json::to_value(self) {
            Ok(Value::Object(mut object)) => {
                let kind = object
                    .remove("kind")
                    .and_then(|k| k.as_str().map(str::to_string))
                    .unwrap_or_default();
                (kind, object.remove("data").unwrap_or(Value::Null))
            }
            _ => (String::new(), Value::Null),
        }
    }
}

/// Event kinds of `Event::Event`, named once so the UI and tests agree.
pub mod kinds {
    pub const CONTENT_DELTA: &str = "content.delta";
    pub const TOOL_CALL_STARTED: &str = "tool.call.started";
    pub const TOOL_CALL_FINISHED: &str = "tool.call.finished";
    pub const MESSAGE_APPENDED: &str = "message.appended";
    pub const RUN_CANCELLED: &str = "run.cancelled";
    pub const MESSAGE_DISCARDED: &str = "message.discarded";
    pub const SUBAGENT_STATE: &str = "subagent.state";
    pub const PROVIDER_RETRY: &str = "provider.retry";
    pub const SLOT_WAITING: &str = "slot.waiting";
    pub const CONTEXT_COMPACTED: &str = "context.compacted";
    pub const CONTEXT_USAGE: &str = "context.usage";
}

/// The arguments of the command table (SPEC §9).
pub mod commands {
    use super::*;

    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct CreateSession {
        pub workspace: String,
        #[serde(default)]
        #[ts(optional = nullable)]
        pub title: Option<String>,
    }

    #[derive(Debug, Clone, Default, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct ListSessions {
        #[serde(default)]
        #[ts(optional = nullable)]
        pub workspace: Option<String>,
    }

    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct SessionRef {
        pub session_id: SessionId,
    }

    /// `get_session`'s arguments: the whole history, or one page of it. A long session is
    /// opened by its tail (`last`) and earlier pages are asked for as the person scrolls up
    /// (`before` the first index already shown, with `last`).
    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct GetSession {
        pub session_id: SessionId,
        /// Only the last N messages (of those before `before`, when set).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[ts(optional)]
        pub last: Option<u32>,
        /// Only messages whose history index is below this one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[ts(optional)]
        pub before: Option<u32>,
    }

    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct Submit {
        pub session_id: SessionId,
        pub content: String,
        #[serde(default)]
        #[ts(optional = nullable)]
        pub config: Option<RunConfig>,
        /// Pasted or dropped images (at most 8, each at most 5 MiB).
        #[serde(default)]
        #[ts(optional)]
        pub images: Option<Vec<ImagePart>>,
    }

    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct MessageRef {
        pub session_id: SessionId,
        pub message_id: String,
    }

    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct DecideApproval {
        pub session_id: SessionId,
        pub approval_id: String,
        pub approved: bool,
        #[serde(default)]
        #[ts(optional = nullable)]
        pub remember: bool,
        /// Why the person denied, passed back to the model.
        #[serde(default)]
        #[ts(optional = nullable)]
        pub reason: Option<String>,
    }

    /// The key goes to the OS keyring, never to the config.
    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct SetApiKey {
        pub key: String,
        /// The keyring entry; defaults to the provider kind.
        #[serde(default)]
        #[ts(optional = nullable)]
        pub entry: Option<String>,
        /// The provider (a name of the config's `providers`) whose block names the entry;
        /// `None`: the lone `provider` block.
        #[serde(default)]
        #[ts(optional = nullable)]
        pub provider: Option<String>,
    }

    /// One tiny real request through a configured provider (Settings → Model servers → Test).
    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct TestProvider {
        /// A provider name of the config (`default` for the lone `provider` block).
        pub name: String,
    }

    /// What a provider test found: whether the server answered, and if not why, in words.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct ProviderTest {
        pub ok: bool,
        /// The model the request named.
        pub model: String,
        /// From sending the request to the end of the answer (or the failure).
        #[ts(type = "number")]
        pub latency_ms: u64,
        /// Empty when `ok`; otherwise what went wrong (authentication, unreachable, model
        /// not found, no answer in time …).
        pub message: String,
        /// The models the server lists (`GET {base_url}/models`, asked of OpenAI-compatible
        /// servers), so Settings offers them in the model field (E19); empty when it lists
        /// none or does not answer.
        pub models: Vec<String>,
    }

    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct UpdateConfig {
        pub patch: Value,
    }

    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct SessionWithMessages {
        pub info: SessionInfo,
        /// The messages asked for: the whole history, or the page `last`/`before` named.
        pub messages: Vec<Message>,
        /// The history index of `messages[0]` (0 for the whole history). Every index the
        /// other commands take (`undo_turn`, `fork_session`) and `first_kept` count from the
        /// start of the whole history, never from the page.
        #[serde(default)]
        pub first_index: u32,
        /// How many messages the whole history holds.
        #[serde(default)]
        pub total: u32,
        /// The history's compactions, oldest first: each is drawn as a divider before
        /// message `first_kept` ("Earlier conversation summarised", with its summary).
        #[serde(default)]
        pub compactions: Vec<Compaction>,
        /// Set when the stored history was damaged and had to be repaired on load.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub notice: Option<String>,
        /// Reports the person discarded from the pending queue, each with where the chat
        /// shows its mark.
        #[serde(default)]
        pub discarded: Vec<DiscardMark>,
    }

    /// A discarded report's mark: the report's message id and the history length when it
    /// was discarded (a whole-history index, like `first_index`).
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct DiscardMark {
        pub message_id: String,
        pub at: u32,
    }

    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct Submitted {
        pub message_id: String,
        pub status: MessageStatus,
    }

    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct Steered {
        pub status: MessageStatus,
    }

    /// No arguments, or no result: `{}`.
    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct Empty {}

    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct RenameSession {
        pub session_id: SessionId,
        pub title: String,
    }

    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct ArchiveSession {
        pub session_id: SessionId,
        pub archived: bool,
    }

    /// Sessions whose title or messages contain `query` (case-insensitive).
    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct SearchSessions {
        pub query: String,
        #[serde(default)]
        #[ts(optional = nullable)]
        pub workspace: Option<String>,
    }

    /// Workspace files for an @-mention: `.gitignore` honoured, best matches first.
    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct ListFiles {
        pub workspace: String,
        #[serde(default)]
        #[ts(optional = nullable)]
        pub query: Option<String>,
        #[serde(default)]
        #[ts(optional = nullable)]
        pub limit: Option<usize>,
    }

    /// The provider and model a session's next turns use (the composer's model picker);
    /// `null` clears the choice.
    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct SetModel {
        pub session_id: SessionId,
        #[serde(default)]
        #[ts(optional = nullable)]
        pub provider: Option<String>,
        #[serde(default)]
        #[ts(optional = nullable)]
        pub model: Option<String>,
    }

    /// The profile a top-level session runs as (`/agent NAME`); `None`: none.
    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct SetAgent {
        pub session_id: SessionId,
        #[serde(default)]
        #[ts(optional = nullable)]
        pub agent: Option<String>,
    }

    /// The profiles a workspace's sessions can delegate to.
    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct ListAgents {
        pub workspace: String,
    }

    /// The MCP servers of the config and, when given, of a workspace's `.mcp.json`.
    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct ListMcpServers {
        #[serde(default)]
        #[ts(optional = nullable)]
        pub workspace: Option<String>,
    }

    /// Turns a configured MCP server on or off (writes `mcp_servers.<name>.enabled`).
    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct SetMcpServerEnabled {
        pub name: String,
        pub enabled: bool,
    }

    /// Restarts an MCP server now; `workspace` for one of a workspace's `.mcp.json`.
    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct RestartMcpServer {
        pub name: String,
        #[serde(default)]
        #[ts(optional = nullable)]
        pub workspace: Option<String>,
    }

    /// The person's answer about a workspace's `.mcp.json` as it is now.
    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct TrustMcpWorkspace {
        pub workspace: String,
        pub allow: bool,
        /// With `allow`: start the workspace's servers now and answer once they are ready
        /// (or failed, or past their start-up timeout), instead of at the next turn.
        #[serde(default)]
        #[ts(optional = nullable)]
        pub start: Option<bool>,
        /// The `trust_sha256` the listing showed: refused if the file or a program it
        /// runs changed since (security review 6).
        #[serde(default)]
        #[ts(optional = nullable)]
        pub sha256: Option<String>,
    }

    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct FileList {
        /// Paths relative to the workspace, with `/` separators.
        pub files: Vec<String>,
    }

    /// A workspace that has stored sessions (`list_workspaces`), so any browser or window
    /// lists the server's workspaces, not only the ones it remembers itself.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct WorkspaceInfo {
        pub path: String,
        /// Its top-level sessions (a sub-agent's session counts with its parent).
        pub sessions: u32,
        /// The newest `updated_at` of its sessions (RFC 3339).
        pub last_activity: String,
    }

    /// `check_workspace`: whether a typed or picked folder may be opened as a workspace,
    /// before anything is opened or remembered (`~` is the home folder).
    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct CheckWorkspace {
        pub path: String,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct CheckedWorkspace {
        /// Its real location (symlinks resolved), the path to open.
        pub path: String,
    }

    /// `list_folders`: a folder's sub-folders, for the web UI's folder dialog. `None`:
    /// the home folder.
    #[derive(Debug, Clone, Default, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct ListFolders {
        #[serde(default)]
        #[ts(optional = nullable)]
        pub path: Option<String>,
        /// Show folders whose name starts with a dot (after the others); default: hidden.
        #[serde(default)]
        #[ts(optional = nullable)]
        pub hidden: bool,
        /// At most this many names (default 500, at most 2000).
        #[serde(default)]
        #[ts(optional = nullable)]
        pub limit: Option<usize>,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct FolderList {
        /// The folder listed, absolute and without `..` (symlinks are kept as named).
        pub path: String,
        /// Its parent; `None` at `/`.
        pub parent: Option<String>,
        /// The home folder, for the dialog's Home button.
        pub home: Option<String>,
        /// Sub-folders' names, sorted; names with a leading dot last (when asked for).
        pub folders: Vec<String>,
        /// More sub-folders exist than `folders` holds.
        pub truncated: bool,
    }

    /// `undo_turn`: restore the files the session's calls changed from the turn of the
    /// person's message at `message_index` on (see `checkpoints`).
    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct UndoTurn {
        pub session_id: SessionId,
        pub message_index: usize,
        /// Overwrite files the person changed since the agent wrote them.
        #[serde(default)]
        #[ts(optional = nullable)]
        pub force: bool,
        /// Only say what would change back (with diffs and conflicts); change nothing.
        #[serde(default)]
        #[ts(optional = nullable)]
        pub preview: bool,
        /// Also undo everything the sub-agents started from that turn on changed (not
        /// the isolated ones), in the same undo.
        #[serde(default)]
        #[ts(optional = nullable)]
        pub include_children: bool,
    }

    /// `fork_session`: a new session whose history is the original's before
    /// `message_index` (a message of the person); with `rewind` the files go back too.
    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct ForkSession {
        pub session_id: SessionId,
        pub message_index: usize,
        #[serde(default)]
        #[ts(optional = nullable)]
        pub rewind: bool,
        /// With `rewind`: overwrite files the person changed since the agent wrote them.
        #[serde(default)]
        #[ts(optional = nullable)]
        pub force: bool,
        /// With `rewind`: the sub-agents' changes of those turns go back too.
        #[serde(default)]
        #[ts(optional = nullable)]
        pub include_children: bool,
    }

    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct Forked {
        pub session: SessionInfo,
        /// The person's message the fork starts from, for the composer to offer again.
        pub draft: String,
        /// That message's images, back in the composer with its text.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        #[ts(as = "Option<Vec<ImagePart>>", optional)]
        pub draft_images: Vec<ImagePart>,
        /// With `rewind`: what the undo restored.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[ts(optional = nullable)]
        pub undo: Option<UndoResult>,
    }

    /// `apply_worktree`: what was applied to the workspace.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct Applied {
        /// `git diff --stat` of the applied changes (empty: there were none).
        pub stat: String,
    }

    /// One file a turn (or an undo) changes, with its unified diff.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct FileChange {
        pub path: String,
        /// `added`, `modified`, `deleted` or `type changed`.
        pub status: String,
        pub diff: String,
    }

    /// The files the agent changed in one turn (the person's message at `message_index`
    /// and everything after it until their next).
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct TurnChange {
        pub message_index: usize,
        pub files: Vec<FileChange>,
        /// What was not recorded, with why (ignored by `.gitignore`, over the size cap,
        /// a nested git repository): undo cannot bring those back.
        pub skipped: Vec<String>,
        /// The turn's changes were undone.
        pub undone: bool,
        /// Its undo history was cleared to keep the checkpoint store within its bound:
        /// it can no longer be shown or undone.
        #[serde(default)]
        pub pruned: bool,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct TurnChanges {
        /// False when checkpoints are off (git missing); `notice` says why.
        pub available: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[ts(optional = nullable)]
        pub notice: Option<String>,
        pub turns: Vec<TurnChange>,
        /// What the sub-agents this session started changed, per sub-agent (isolated
        /// ones are left out: their changes are in their worktree, applied or discarded).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        #[ts(optional = nullable)]
        pub children: Vec<ChildChanges>,
    }

    /// One sub-agent's changes, in its parent's Changes view (UX review E6).
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct ChildChanges {
        pub session_id: SessionId,
        pub title: String,
        /// The parent's turn that started it (its top-level ancestor's, for a sub-agent's
        /// own sub-agents): undoing that turn may include these changes.
        pub message_index: usize,
        pub turns: Vec<TurnChange>,
    }

    /// `undo_history` / `clear_undo_history` / `warm_workspace`: a workspace.
    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct WorkspaceRef {
        pub workspace: String,
    }

    /// How much undo history a workspace keeps (its shadow store under the data dir),
    /// and the bound past which the oldest turns lose theirs.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct UndoHistory {
        pub workspace: String,
        #[ts(type = "number")]
        pub bytes: u64,
        /// `checkpoints.max_store_mb` in bytes.
        #[ts(type = "number")]
        pub max_bytes: u64,
        /// `checkpoints.max_age_days`.
        #[ts(type = "number")]
        pub max_age_days: u64,
        /// Why there is no undo history (git missing), when there is none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[ts(optional = nullable)]
        pub off: Option<String>,
    }

    /// What an undo restored (or, as a preview, would restore).
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct UndoResult {
        /// False for a preview.
        pub applied: bool,
        /// Each file as it changes back: the diff from now to the restored content.
        pub files: Vec<FileChange>,
        /// Files changed since the agent wrote them (overwritten only with `force`).
        pub conflicts: Vec<String>,
        /// What the checkpoints left out, which the undo cannot restore.
        pub skipped: Vec<String>,
    }

    /// The one command table (SPEC §9), typed once: each command's name, its arguments
    /// and its result. It generates [`Command`] (what transports decode), [`CommandArgs`]
    /// and [`CommandResults`] (what the UI's adapter is typed with, through ts-rs: a
    /// renamed field fails to compile on both sides), and [`CommandOutput`].
    macro_rules! command_table {
        ($($name:ident => $variant:ident($args:ty) -> $result:ty;)*) => {
            /// A command with its arguments, as `{"name": ..., "args": {...}}`.
            #[derive(Debug, Clone, Serialize, Deserialize)]
            #[serde(tag = "name", content = "args", rename_all = "snake_case")]
            pub enum Command {
                $($variant($args),)*
            }

            impl Command {
                pub fn name(&self) -> &'static str {
                    match self {
                        $(Command::$variant(_) => stringify!($name),)*
                    }
                }
            }

            /// Every command's name, for transports that list or route them.
            pub const COMMAND_NAMES: &[&str] = &[$(stringify!($name),)*];

            /// Each command's arguments, by name (TypeScript: `CommandArgs["submit"]`).
            #[derive(TS)]
            #[ts(export)]
            #[allow(dead_code)]
            pub struct CommandArgs {
                $(pub $name: $args,)*
            }

            /// Each command's result, by name (TypeScript: `CommandResults["submit"]`).
            #[derive(TS)]
            #[ts(export)]
            #[allow(dead_code)]
            pub struct CommandResults {
                $(pub $name: $result,)*
            }

            /// A command's result, of the type its row names.
            #[derive(Debug, Clone, Serialize)]
            #[serde(untagged)]
            pub enum CommandOutput {
                $($variant($result),)*
            }
        };
    }

    command_table! {
        create_session => CreateSession(CreateSession) -> SessionInfo;
        list_sessions => ListSessions(ListSessions) -> Vec<SessionInfo>;
        get_session => GetSession(GetSession) -> SessionWithMessages;
        delete_session => DeleteSession(SessionRef) -> Empty;
        submit => Submit(Submit) -> Submitted;
        cancel => Cancel(SessionRef) -> Empty;
        resume_subagent => ResumeSubagent(SessionRef) -> Empty;
        steer => Steer(MessageRef) -> Steered;
        discard => Discard(MessageRef) -> Empty;
        decide_approval => DecideApproval(DecideApproval) -> Empty;
        snapshot => Snapshot(SessionRef) -> Snapshot;
        get_config => GetConfig(Empty) -> Value;
        update_config => UpdateConfig(UpdateConfig) -> Value;
        probe_providers => ProbeProviders(Empty) -> Vec<FoundServer>;
        app_info => AppInfo(Empty) -> AppInfo;
        set_api_key => SetApiKey(SetApiKey) -> Value;
        rename_session => RenameSession(RenameSession) -> SessionInfo;
        archive_session => ArchiveSession(ArchiveSession) -> SessionInfo;
        search_sessions => SearchSessions(SearchSessions) -> Vec<SessionInfo>;
        list_files => ListFiles(ListFiles) -> FileList;
        list_workspaces => ListWorkspaces(Empty) -> Vec<WorkspaceInfo>;
        list_folders => ListFolders(ListFolders) -> FolderList;
        check_workspace => CheckWorkspace(CheckWorkspace) -> CheckedWorkspace;
        set_model => SetModel(SetModel) -> SessionInfo;
        list_agents => ListAgents(ListAgents) -> Profiles;
        compact => Compact(SessionRef) -> Empty;
        set_agent => SetAgent(SetAgent) -> SessionInfo;
        test_provider => TestProvider(TestProvider) -> ProviderTest;
        turn_changes => TurnChanges(SessionRef) -> TurnChanges;
        undo_turn => UndoTurn(UndoTurn) -> UndoResult;
        fork_session => ForkSession(ForkSession) -> Forked;
        apply_worktree => ApplyWorktree(SessionRef) -> Applied;
        discard_worktree => DiscardWorktree(SessionRef) -> Empty;
        undo_history => UndoHistory(WorkspaceRef) -> UndoHistory;
        clear_undo_history => ClearUndoHistory(WorkspaceRef) -> UndoHistory;
        list_mcp_servers => ListMcpServers(ListMcpServers) -> Vec<McpServerInfo>;
        set_mcp_server_enabled => SetMcpServerEnabled(SetMcpServerEnabled) -> Vec<McpServerInfo>;
        restart_mcp_server => RestartMcpServer(RestartMcpServer) -> Empty;
        trust_mcp_workspace => TrustMcpWorkspace(TrustMcpWorkspace) -> Vec<McpServerInfo>;
        warm_workspace => WarmWorkspace(WorkspaceRef) -> Vec<McpServerInfo>;
        list_skills => ListSkills(ListSkills) -> SkillCatalog;
        expand_command => ExpandCommand(ExpandCommand) -> ExpandedCommand;
    }
}

/// The desktop shell's own commands: what drives the window and its feeds, so not in
/// the HTTP server's table. Typed here once like the rest (`DesktopCommandArgs` and
/// `DesktopCommandResults` in TypeScript); the shell's handlers take these structs as
/// their one `args` parameter, and the UI calls `invoke(name, {args})`.
pub mod desktop {
    use super::*;

    macro_rules! desktop_table {
        ($($name:ident($args:ty) -> $result:ty;)*) => {
            /// Every desktop command's name.
            pub const DESKTOP_COMMAND_NAMES: &[&str] = &[$(stringify!($name),)*];

            /// Each desktop command's arguments, by name.
            #[derive(TS)]
            #[ts(export)]
            #[allow(dead_code)]
            pub struct DesktopCommandArgs {
                $(pub $name: $args,)*
            }

            /// Each desktop command's result, by name.
            #[derive(TS)]
            #[ts(export)]
            #[allow(dead_code)]
            pub struct DesktopCommandResults {
                $(pub $name: $result,)*
            }
        };
    }

    desktop_table! {
        subscribe(Subscribe) -> String;
        subscribe_sessions(SubscribeSessions) -> String;
        unsubscribe(Unsubscribe) -> ();
        app_info(commands::Empty) -> HostInfo;
        initial_workspace(commands::Empty) -> Option<String>;
        open_url(OpenUrl) -> ();
        notify(Notify) -> ();
        set_title(SetTitle) -> ();
        set_close_guard(SetCloseGuard) -> ();
        quit(commands::Empty) -> ();
        load_ui_state(commands::Empty) -> Value;
        save_ui_state(SaveUiState) -> ();
        check_folder(CheckFolder) -> String;
        clipboard_image(commands::Empty) -> Option<ImagePart>;
        recycle_web_process(commands::Empty) -> bool;
    }

    /// Starts a session's feed (snapshot first, then its events, one frame a message).
    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct Subscribe {
        pub session_id: SessionId,
        /// The UI's own id for the feed, so it can match events that arrive before the
        /// call returns; made up by the shell when absent.
        #[serde(default)]
        #[ts(optional = nullable)]
        pub subscription: Option<String>,
    }

    /// Starts the session list's feed of a workspace (or of every workspace).
    #[derive(Debug, Clone, Default, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct SubscribeSessions {
        #[serde(default)]
        #[ts(optional = nullable)]
        pub workspace: Option<String>,
        #[serde(default)]
        #[ts(optional = nullable)]
        pub subscription: Option<String>,
    }

    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct Unsubscribe {
        pub subscription: String,
    }

    /// Facts of the host the shell knows and the runtime does not.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct HostInfo {
        /// The workspace given with `--workspace`, if any.
        pub initial_workspace: Option<String>,
        pub log_dir: String,
        pub data_dir: String,
        pub config_path: String,
        pub home_dir: Option<String>,
        /// Whether the config file names a provider.
        pub provider_configured: bool,
        /// How long the person must be away from the window before the page asks for its
        /// web process to be recycled (`recycle_web_process`); 0: never.
        #[serde(default)]
        #[ts(type = "number")]
        pub recycle_after_ms: u64,
    }

    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct OpenUrl {
        pub url: String,
    }

    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct Notify {
        pub title: String,
        pub body: String,
        /// Set when the UI wants to hear of a click on it: the shell then emits
        /// `bumblehive://notification-clicked` with this id (E21).
        #[serde(default)]
        #[ts(optional = nullable)]
        pub id: Option<i32>,
    }

    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct SetTitle {
        pub title: String,
    }

    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct SetCloseGuard {
        pub active: bool,
    }

    /// The UI's remembered choices: a JSON object.
    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct SaveUiState {
        pub value: Value,
    }

    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct CheckFolder {
        pub path: String,
    }

    /// What the shell sends the UI when a later start handed over a workspace to open
    /// (`bumblehive://open`).
    #[derive(Debug, Clone, Serialize, Deserialize, TS)]
    #[ts(export)]
    pub struct OpenRequested {
        pub workspace: String,
    }
}

/// One profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct Profile {
    pub name: String,
    pub description: String,
    /// A provider name from the config (`providers`); `None`: the parent's.
    pub provider: Option<String>,
    /// A model for that provider; `None`: the provider's own.
    pub model: Option<String>,
    /// Only these tools, when set.
    pub tools: Option<Vec<String>>,
    pub disallowed_tools: Vec<String>,
    /// How many model calls one run may make.
    pub max_turns: Option<usize>,
    /// `worktree`: its sub-agents always work in a git worktree of their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub isolation: Option<String>,
    /// The skills its agents get, by name (only these); `None`: every skill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub skills: Option<Vec<String>>,
    /// The profile's instructions (the file's body).
    pub instructions: String,
    /// `kind: "acp"`: an external ACP agent runs the profile's children instead of a model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub acp: Option<AcpAgent>,
    /// Where it was read from (`built-in` for the built-in ones).
    pub source: String,
    /// Fields that were ignored or mapped, to show the person.
    pub notices: Vec<String>,
}

impl Profile {
    /// A profile with only a name and where it comes from; the rest is filled in.
    pub fn named(name: &str, source: &str) -> Profile {
        Profile {
            name: name.to_string(),
            description: String::new(),
            provider: None,
            model: None,
            tools: None,
            disallowed_tools: Vec::new(),
            max_turns: None,
            isolation: None,
            skills: None,
            instructions: String::new(),
            acp: None,
            source: source.to_string(),
            notices: Vec::new(),
        }
    }

    /// Whether the profile lets its agent use `tool`.
    pub fn allows(&self, tool: &str) -> bool {
        // A profile that names skills gives its agents the tool that loads them.
        if tool == "skill" && self.skills.as_ref().is_some_and(|s| !s.is_empty()) {
            return true;
        }
        // An MCP server's name (`mcp__<server>`) stands for all of its tools.
        self.tools
            .as_ref()
            .is_none_or(|allowed| listed(allowed, tool))
            && !listed(&self.disallowed_tools, tool)
    }
}

/// Whether a profile's tool list names this tool, or (for an MCP tool) its whole server.
pub fn listed(list: &[String], tool: &str) -> bool {
    list.iter().any(|t| t == tool)
        || server_of_tool(tool)
            .is_some_and(|server| list.iter().any(|t| *t == format!("mcp__{server}")))
}

/// The server part of an MCP tool's name (`mcp__<server>__…`), for policy and the UI.
pub fn server_of_tool(tool: &str) -> Option<&str> {
    let rest = tool.strip_prefix("mcp__")?;
    Some(rest.split_once("__").map_or(rest, |(server, _)| server))
}

/// Every profile one workspace sees, and what could not be read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct Profiles {
    pub profiles: Vec<Profile>,
    /// `path:line: message` for each file that could not be read.
    pub errors: Vec<String>,
}

impl Profiles {
    pub fn get(&self, name: &str) -> Option<&Profile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    pub fn names(&self) -> Vec<&str> {
        self.profiles.iter().map(|p| p.name.as_str()).collect()
    }
}

/// The command of an external ACP agent (a profile with `kind: "acp"`), run as a child
/// process that speaks ACP on its stdin and stdout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct AcpAgent {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
}

/// What an MCP server is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
#[ts(export)]
pub enum McpServerState {
    /// Configured, not started yet: servers start with the first turn that can use them.
    NotStarted,
    Starting,
    Ready,
    Failed,
    /// A workspace's `.mcp.json` server, waiting for the person to trust that file.
    WaitingForTrust,
    Disabled,
}

/// One tool of an MCP server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct McpToolInfo {
    /// The server's own name for it.
    pub name: String,
    /// The name the model calls it by: `mcp__<server>__<tool>`.
    pub full_name: String,
    pub description: String,
    pub read_only_hint: bool,
}

/// An MCP server as Settings lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct McpServerInfo {
    pub name: String,
    /// Set for a server of a workspace's `.mcp.json`.
    #[ts(optional = nullable)]
    pub workspace: Option<String>,
    /// `stdio` or `http`.
    pub transport: String,
    pub enabled: bool,
    pub state: McpServerState,
    /// Why it failed, when it did.
    #[ts(optional = nullable)]
    pub error: Option<String>,
    pub tools: Vec<McpToolInfo>,
    /// The name and version the server gave.
    #[ts(optional = nullable)]
    pub server_info: Option<String>,
    /// What it runs or reaches (the trust question shows it; security review 6).
    #[ts(optional = nullable)]
    pub launch: Option<McpLaunch>,
    /// A workspace server's trust digest (the `.mcp.json` and the program files it runs):
    /// `trust_mcp_workspace` takes it back, so the answer is for exactly what was shown.
    #[ts(optional = nullable)]
    pub trust_sha256: Option<String>,
}

/// How an MCP server is started or reached, for the person to judge. Secrets never
/// appear: a literal `env` or header value is named only, a reference (`${VAR}`,
/// `keyring:ENTRY`) is shown as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct McpLaunch {
    /// The command and its arguments (stdio); empty for HTTP.
    pub command: Vec<String>,
    #[ts(optional = nullable)]
    pub cwd: Option<String>,
    #[ts(optional = nullable)]
    pub url: Option<String>,
    /// `NAME` (a literal value) or `NAME=${VAR}` / `NAME=keyring:ENTRY`.
    pub env: Vec<String>,
    /// As `env`, for HTTP headers.
    pub headers: Vec<String>,
    /// Files inside the workspace it runs, which a command could change.
    pub program_files: Vec<McpProgramFile>,
    /// What the runtime ignores or refuses in this entry, in words.
    pub notes: Vec<String>,
}

/// A workspace file an MCP server runs, with its SHA-256.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct McpProgramFile {
    pub path: String,
    pub sha256: String,
}

/// A local model server that answered a probe, with the models it lists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct FoundServer {
    pub name: String,
    /// The provider kind to configure for it (both speak the OpenAI API).
    #[ts(type = "\"openai\" | \"anthropic\"")]
    pub kind: String,
    pub base_url: String,
    /// Always true here: servers that did not answer are left out.
    pub ok: bool,
    pub models: Vec<String>,
}

/// Where things are and what this build is, for the settings page and About box.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct AppInfo {
    pub version: String,
    /// The git commit the binary was built from ("unknown" outside a checkout).
    pub commit: String,
    pub data_dir: String,
    pub log_dir: String,
    pub config_path: Option<String>,
    /// Counts of what runs now in the whole app (every session and sub-agent).
    pub active_runs: usize,
    pub subagent_tasks: usize,
    /// Whether shell commands run in the OS sandbox, and if not, why (the UI says so once).
    pub sandbox: SandboxStatus,
    /// Whether the config names a model server; when not, the first run offers set-up.
    pub provider_configured: bool,
    /// Sub-agent worktrees under the data dir whose session is gone (found at start).
    #[serde(default)]
    #[ts(optional = nullable)]
    pub leftover_worktrees: Vec<String>,
    /// Why checkpoints and undo are off (git missing), when they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub checkpoints_off: Option<String>,
}

/// The error object of the command table: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct ErrorEnvelope {
    pub error: ErrorBody,
}

/// What a later start of the app asks the data folder's owner (`owner::hand_off`): bring
/// its window forward and, if the start named one, open that workspace there (one app
/// per data folder, SPEC §12.7; ux review 2, E1). One JSON line each way on the owner's
/// socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerRequest {
    /// The workspace the later start was asked to open (already made absolute), if any.
    #[serde(default)]
    pub workspace: Option<String>,
    /// The later process, for the owner's log.
    pub pid: u32,
    /// `bumblehive run` beside a running owner: the owner runs this prompt in its own
    /// service (its window lists the session at once) and streams the run back on the
    /// same connection as [`OwnerRunLine`]s (ux review 2, E22).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<OwnerRun>,
}

/// A prompt `bumblehive run` hands to the data folder's owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerRun {
    /// Absolute; the owner checks it as any workspace.
    pub workspace: String,
    pub prompt: String,
    pub title: String,
}

/// What the owner sends on a handed-over run's connection, one JSON line each: the
/// session made, every event of it and its sub-agents (what `--json` prints), and how it
/// ended. The later process sends [`commands::DecideApproval`] lines the other way; it
/// closing the connection stops the run (the person pressed Ctrl+C).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "line", rename_all = "snake_case")]
pub enum OwnerRunLine {
    Started {
        session_id: String,
    },
    Event {
        event: Box<Event>,
    },
    /// Nothing runs in the session or below it any more; `failed`: it ended with an
    /// error, stopped or paused.
    End {
        failed: bool,
    },
    /// Not started (the workspace refused, say): the words to print.
    Refused {
        message: String,
    },
}

/// The owner's answer to an `OwnerRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerReply {
    /// Whether the owner did what was asked (a headless owner has no window to show).
    pub ok: bool,
    /// What happened, in words the later start prints.
    pub message: String,
}

/// The exact text of a sub-agent's report (SPEC §3), built in one place.
pub fn report_text(task_id: &str, outcome: &Result<String, String>) -> String {
    match outcome {
        Ok(answer) => format!("[Background tool result]\nTask ID: {task_id}\n\n{answer}"),
        Err(error) => format!("[Background tool result]\nTask ID: {task_id}\n\nError:\n{error}"),
    }
}

/// The message id of a report, unique within its parent's history.
pub fn report_message_id(task_id: &str) -> String {
    format!("subagent:{task_id}")
}

/// The message id of a child's `n`th report (SPEC §11): the first is
/// `subagent:<task_id>`, each follow-up's `subagent:<task_id>:<n>`, n = 2, 3 …
pub fn nth_report_message_id(task_id: &str, n: u32) -> String {
    if n <= 1 {
        report_message_id(task_id)
    } else {
        format!("subagent:{task_id}:{n}")
    }
}

/// Whether `message_id` is a report of `task_id`: its first (`subagent:<task_id>`) or a
/// follow-up's (`subagent:<task_id>:<n>`, n ≥ 2). Matched against the known task id, never
/// cut at the first `:`: task ids may hold `:` themselves (call ids such as
/// `functions.sub_agent:0`; runtime review R15).
pub fn is_report_of(message_id: &str, task_id: &str) -> bool {
    let Some(rest) = message_id
        .strip_prefix("subagent:")
        .and_then(|rest| rest.strip_prefix(task_id))
    else {
        return false;
    };
    rest.is_empty()
        || rest
            .strip_prefix(':')
            .is_some_and(|n| n.parse::<u32>().is_ok_and(|n| n >= 2))
}

/// How `run_command` runs commands (`tools.run_command.sandbox` in the config, SPEC §11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum CommandPolicy {
    /// Sandboxed, and run without asking; a command that wants the network (when not
    /// allowed) or runs outside the workspace asks first and says which. Where no sandbox
    /// works, every command asks.
    #[default]
    Sandbox,
    /// Sandboxed, and asks every time.
    Ask,
    /// Not sandboxed, and asks every time.
    Off,
}

/// Whether the sandbox works here, as `app_info` and the Settings page show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct SandboxStatus {
    pub available: bool,
    /// Why not, in words for the person (missing binary, user namespaces blocked, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub policy: CommandPolicy,
    /// `bubblewrap`, or `none`.
    pub kind: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_tagged_by_type_with_session_id() {
        let event = Event::Event {
            session_id: "s".into(),
            kind: kinds::CONTENT_DELTA.into(),
            data: serde_json::json!({"text": "hi"}),
        };
        let value = serde_json::to_value(&event).unwrap_or_default();
        assert_eq!(value["type"], "event");
        assert_eq!(value["session_id"], "s");
        assert_eq!(value["kind"], "content.delta");
        let created = Event::SessionCreated {
            session_id: "c".into(),
            parent_session_id: Some("p".into()),
            task_id: Some("t".into()),
            title: "T".into(),
        };
        let value = serde_json::to_value(&created).unwrap_or_default();
        assert_eq!(value["type"], "session_created");
        assert!(value.get("background").is_none());
    }

    #[test]
    fn progress_kinds_are_the_named_kinds_and_round_trip() {
        let cases = [
            (
                Progress::ContentDelta { text: "t".into() },
                kinds::CONTENT_DELTA,
            ),
            (Progress::RunCancelled {}, kinds::RUN_CANCELLED),
            (
                Progress::MessageDiscarded {
                    message_id: "m".into(),
                },
                kinds::MESSAGE_DISCARDED,
            ),
            (
                Progress::SubagentState {
                    task_id: "t".into(),
                    state: SubagentState::Running,
                },
                kinds::SUBAGENT_STATE,
            ),
        ];
        for (progress, kind) in cases {
            let (got, data) = progress.clone().into_parts();
            assert_eq!(got, kind);
            let back: Progress =
                serde_json::from_value(serde_json::json!({"kind": got, "data": data}))
                    .unwrap_or(Progress::RunCancelled {});
            assert_eq!(back, progress);
        }
    }

    #[test]
    fn message_round_trips_in_openai_shape() {
        let message = Message::assistant(
            None,
            vec![ToolCall {
                id: "a".into(),
                name: "read_file".into(),
                arguments: serde_json::json!({"path": "x"}),
            }],
        );
        let text = serde_json::to_string(&message).unwrap_or_default();
        assert!(text.contains(r#""role":"assistant""#));
        let back: Message = serde_json::from_str(&text).unwrap_or_else(|_| Message::system(""));
        assert_eq!(back, message);
    }
}

// ---- Context: compaction markers, the context meter, loaded instruction files ----

/// How a compaction dealt with the earlier conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[ts(export)]
#[serde(rename_all = "snake_case")]
pub enum CompactionKind {
    /// Old turns were replaced by a summary the model wrote.
    Summary,
    /// Only oversized old tool results were replaced by stubs; nothing was summarised.
    Elided,
    /// The summary could not be made (the call failed or did not fit): the oldest turns
    /// were dropped, the person's messages and any earlier summary kept.
    Dropped,
}

/// The marker of one compaction, stored as its own line kind in `messages.jsonl`
/// (`{"compaction": {...}}`). The latest marker decides the request; indices are into
/// the stored history, which is append-only, so they stay valid after a reload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct Compaction {
    pub id: String,
    pub kind: CompactionKind,
    /// The history's length when the marker was made: usage that assistant messages before
    /// it report was counted for a request that no longer exists.
    #[ts(type = "number")]
    pub at: usize,
    /// The first message sent verbatim after the summary; everything before it is
    /// represented by `kept_user` and `summary`.
    #[ts(type = "number")]
    pub first_kept: usize,
    /// Messages of the person before `first_kept` that are sent verbatim (the session's
    /// first user message always among them, first).
    #[serde(default)]
    #[ts(type = "Array<number>")]
    pub kept_user: Vec<usize>,
    /// Tool results at or after `first_kept` that are sent as a stub.
    #[serde(default)]
    #[ts(type = "Array<number>")]
    pub elided: Vec<usize>,
    /// The summary of everything before `first_kept` (earlier summaries included).
    #[serde(default)]
    pub summary: Option<String>,
    /// Estimated tokens of the request before and after, for the divider and the meter.
    #[serde(default)]
    #[ts(type = "number")]
    pub tokens_before: usize,
    #[serde(default)]
    #[ts(type = "number")]
    pub tokens_after: usize,
    /// Why no summary was made, for [`CompactionKind::Dropped`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The context meter of a session: the status line and each child tab show its label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct ContextMeter {
    #[ts(type = "number")]
    pub used: u64,
    #[ts(type = "number")]
    pub window: u64,
    /// `used` of `window`, rounded down, at most 100 (shown as full when over).
    pub percent: u8,
}

impl ContextMeter {
    pub fn new(used: usize, window: u32) -> Self {
        let used = u64::try_from(used).unwrap_or(u64::MAX);
        let window = u64::from(window.max(1));
        let percent = (used.saturating_mul(100) / window).min(100);
        ContextMeter {
            used,
            window,
            percent: u8::try_from(percent).unwrap_or(100),
        }
    }

    /// "41 % of 32k".
    pub fn label(&self) -> String {
        // Windows are powers of two (32768) or round thousands (128000): both read as "32k".
        let window = if self.window >= 1024 && self.window % 1024 == 0 {
            format!("{}k", self.window / 1024)
        } else if self.window >= 1000 {
            format!("{}k", (self.window + 500) / 1000)
        } else {
            self.window.to_string()
        };
        format!("{} % of {window}", self.percent)
    }
}

/// One file that was loaded, as the UI lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct InstructionFile {
    pub path: String,
    /// The file's size on disk.
    #[ts(type = "number")]
    pub bytes: u64,
    /// Tokens of what the prompt carries of it (a quarter of its bytes).
    #[ts(type = "number")]
    pub tokens_estimate: u64,
    /// Whether the cap cut it short.
    pub truncated: bool,
}

/// A skill (a folder with a `SKILL.md`) as `list_skills` and Settings show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct SkillInfo {
    pub name: String,
    pub description: String,
    /// Its `SKILL.md`.
    pub path: String,
    /// `workspace` (a folder from the workspace up to the repository root) or `user`.
    pub scope: String,
    /// The folder it was found in (`.claude/skills` …), for "where it came from".
    pub source: String,
    /// The tools its `allowed-tools` names, as ours: shown, never granted.
    pub allowed_tools: Vec<String>,
    /// Other `SKILL.md` files of the same name, which this one hides.
    pub shadowed: Vec<String>,
}

/// A custom command (a Markdown file in a `commands/` folder) as `list_skills` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct CustomCommandInfo {
    pub name: String,
    pub description: String,
    /// What its argument is (`argument-hint`), for the completion list.
    #[ts(optional = nullable)]
    pub argument_hint: Option<String>,
    /// The model its turn asks for (`model`).
    #[ts(optional = nullable)]
    pub model: Option<String>,
    /// The only tools its turn is offered (`allowed-tools`, as ours); `None`: all.
    #[ts(optional = nullable)]
    pub allowed_tools: Option<Vec<String>>,
    pub path: String,
    pub scope: String,
    pub source: String,
    pub shadowed: Vec<String>,
}

/// Every skill and custom command one workspace sees, and what could not be read
/// (`path:line: message`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct SkillCatalog {
    pub skills: Vec<SkillInfo>,
    pub commands: Vec<CustomCommandInfo>,
    pub notices: Vec<String>,
}

/// What the person's `/name args` (or `$name` of a skill) became: the message to send,
/// and the per-turn choices a command file asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct ExpandedCommand {
    /// The message to submit.
    pub content: String,
    /// `command` or `skill`.
    pub kind: String,
    pub name: String,
    #[ts(optional = nullable)]
    pub model: Option<String>,
    #[ts(optional = nullable)]
    pub allowed_tools: Option<Vec<String>>,
    /// What was ignored, to show the person (a model alias for another kind of server …).
    pub notices: Vec<String>,
}

/// `list_skills`: the skills and custom commands of a workspace.
#[derive(Debug, Clone, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct ListSkills {
    pub workspace: String,
}

/// `expand_command`: the person's line (`/name args`, or text naming `$skill`s).
#[derive(Debug, Clone, Serialize, Deserialize, TS)]
#[ts(export)]
pub struct ExpandCommand {
    pub workspace: String,
    pub text: String,
}
