//! Open approvals of all sessions (SPEC §7): asking, deciding, "always allow for this session" (per tool for files, per exact command or plain argv prefix for `run_command`), and denial on cancel.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::config::ToolPolicy;
use crate::protocol::{ApprovalInfo, Event, SessionId};
use crate::tools::{Access, ApprovalAsk, ApprovalGate, Decision};

type Emit = Arc<dyn Fn(Event) + Send + Sync>;
/// The configured policy of a tool, if any.
pub type PolicyFn = Box<dyn Fn(&str) -> Option<ToolPolicy> + Send + Sync>;

struct Open {
    info: ApprovalInfo,
    /// Emits on the asking session's stream (which reaches its ancestors).
    emit: Emit,
    /// The asking session and its ancestors: any of them may see and decide it.
    lineage: Vec<SessionId>,
    reply: oneshot::Sender<Decision>,
}

/// Every open approval of the runtime, in the order they were asked.
#[derive(Default)]
pub struct ApprovalBook {
    open: Mutex<Vec<Open>>,
    /// (session, tool, scope): the scope is `None` for file tools (the whole workspace)
    /// and the remembered command for `run_command` (see [`remember_scope`]).
    remembered: Mutex<HashSet<(SessionId, String, Option<String>)>>,
}

/// Characters that give a shell command line more than one plain argv: with any of them
/// a remembered command covers only itself, never a longer one.
const SHELL_META: &[char] = &[
    ';', '&', '|', '<', '>', '(', ')', '$', '`', '\\', '"', '\'', '*', '?', '[', ']', '{', '}',
    '~', '#', '!', '=', '\n', '\r', '%', '^',
];

/// What "always allow" remembers for a call: `None` for file tools (the tool, inside the
/// workspace), and for `run_command` the command itself, its words joined by one space.
pub fn remember_scope(tool: &str, arguments: &serde_json::Value) -> Option<String> {
    if tool != "run_command" {
        return None;
    }
    let command = arguments
        .get("command")
        .and_then(|c| c.as_str())
        .unwrap_or("");
    let network = arguments
        .get("network")
        .and_then(|n| n.as_bool())
        .unwrap_or(false);
    let words = command.split_whitespace().collect::<Vec<_>>().join(" ");
    // A command allowed without the network does not cover the same one with it.
    Some(if network {
        format!("{words} [network]")
    } else {
        words
    })
}

/// The words of the "always allow" button, naming exactly what it covers.
pub fn remember_label(tool: &str, arguments: &serde_json::Value) -> String {
    match remember_scope(tool, arguments) {
        Some(scope) if scope.contains(SHELL_META) => {
            format!("always allow exactly `{scope}` in this session")
        }
        Some(scope) => {
            format!("always allow `{scope}` (with any further plain arguments) in this session")
        }
        // An MCP tool acts wherever its server does, not only inside the workspace.
        None if crate::mcp::server_of_tool(tool).is_some() => {
            format!("always allow {tool} in this session")
        }
        None => format!("always allow {tool} inside the workspace in this session"),
    }
}

/// Whether a remembered scope covers a new call's scope: the same command, or (when both
/// are plain words without shell metacharacters) the remembered words followed by more.
pub fn scope_covers(remembered: &Option<String>, asked: &Option<String>) -> bool {
    match (remembered, asked) {
        (None, None) => true,
        (Some(old), Some(new)) if old == new => true,
        (Some(old), Some(new)) => {
            let plain = |s: &str| !s.contains(SHELL_META) && !s.ends_with("[network]");
            plain(old)
                && plain(new)
                && new.starts_with(old.as_str())
                && new[old.len()..].starts_with(' ')
        }
        _ => false,
    }
}

impl ApprovalBook {
    fn open(&self) -> std::sync::MutexGuard<'_, Vec<Open>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Approvals asked by `session_id` or by any of its descendants.
    pub fn visible_to(&self, session_id: &str) -> Vec<ApprovalInfo> {
        self.open()
            .iter()
            .filter(|open| open.lineage.iter().any(|id| id == session_id))
            .map(|open| open.info.clone())
            .collect()
    }

    /// Decides an approval that `session_id` (the asker or an ancestor) can see.
    ///
    /// Approving with `remember` covers the asking session's later calls of that tool
    /// inside the workspace, and settles its other open asks of that tool inside the
    /// workspace too (a batch may hold several). It never covers an outside path.
    pub fn decide(
        &self,
        session_id: &str,
        approval_id: &str,
        approved: bool,
        remember: bool,
        reason: Option<String>,
    ) -> bool {
        let (decided, covered) = {
            let mut open = self.open();
            let Some(index) = open.iter().position(|o| {
                o.info.approval_id == approval_id && o.lineage.iter().any(|id| id == session_id)
            }) else {
                return false;
            };
            let decided = open.remove(index);
            let mut covered = Vec::new();
            if approved && remember && decided.info.rememberable {
                let scope = remember_scope(&decided.info.tool, &decided.info.arguments);
                self.remembered
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert((
                        decided.info.session_id.clone(),
                        decided.info.tool.clone(),
                        scope.clone(),
                    ));
                let (same, rest): (Vec<Open>, Vec<Open>) =
                    std::mem::take(&mut *open).into_iter().partition(|o| {
                        o.info.rememberable
                            && o.info.session_id == decided.info.session_id
                            && o.info.tool == decided.info.tool
                            && scope_covers(
                                &scope,
                                &remember_scope(&o.info.tool, &o.info.arguments),
                            )
                    });
                *open = rest;
                covered = same;
            }
            (decided, covered)
        };
        resolve(decided, approved, reason);
        for open in covered {
            resolve(open, true, None);
        }
        true
    }

    /// Denies every open approval of one session (its run was cancelled).
    pub fn deny_session(&self, session_id: &str) {
        let denied: Vec<Open> = {
            let mut open = self.open();
            let (denied, kept) = std::mem::take(&mut *open)
                .into_iter()
                .partition(|o| o.info.session_id == session_id);
            *open = kept;
            denied
        };
        for open in denied {
            resolve(open, false, Some("the run was stopped".into()));
        }
    }

    fn remembered(&self, session_id: &str, tool: &str, arguments: &serde_json::Value) -> bool {
        let asked = remember_scope(tool, arguments);
        self.remembered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|(id, t, scope)| id == session_id && t == tool && scope_covers(scope, &asked))
    }

    pub fn forget_session(&self, session_id: &str) {
        self.remembered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(id, _, _)| id != session_id);
    }
}

/// Tells the asker's window (and its ancestors') and the waiting tool.
fn resolve(open: Open, approved: bool, reason: Option<String>) {
    (open.emit)(Event::ApprovalResolved {
        session_id: open.info.session_id.clone(),
        approval_id: open.info.approval_id.clone(),
        approved,
    });
    let _ = open.reply.send(Decision { approved, reason });
}

/// The gate a session's tools ask through. Emits `approval_request` on the session's
/// event stream (which reaches its ancestors' subscribers too).
pub struct SessionGate {
    pub book: Arc<ApprovalBook>,
    pub session_id: SessionId,
    pub parent_session_id: Option<SessionId>,
    pub title: Option<String>,
    pub lineage: Vec<SessionId>,
    /// The branch of the session's worktree, when it is an isolated sub-agent.
    pub worktree: Option<String>,
    /// A sub-agent's server and model for this run, named in its requests (E3).
    pub runs_on: Option<(String, String)>,
    pub policy: PolicyFn,
    pub emit: Emit,
}

#[async_trait]
impl ApprovalGate for SessionGate {
    fn policy(&self, tool: &str) -> Option<ToolPolicy> {
        (self.policy)(tool)
    }

    async fn ask(&self, ask: ApprovalAsk, cancel: &CancellationToken) -> Decision {
        let approve = Decision {
            approved: true,
            reason: None,
        };
        let policy = (self.policy)(&ask.tool);
        if policy == Some(ToolPolicy::Deny) {
            return Decision {
                approved: false,
                reason: Some(format!(
                    "the {} tool is disabled by configuration",
                    ask.tool
                )),
            };
        }
        match ask.access {
            Access::Read if policy != Some(ToolPolicy::Ask) => return approve,
            // "Always allow" and an `allow` policy cover only places inside the workspace.
            Access::Read | Access::Change => {
                if policy == Some(ToolPolicy::Allow)
                    || self
                        .book
                        .remembered(&self.session_id, &ask.tool, &ask.arguments)
                {
                    return approve;
                }
            }
            Access::Outside => {}
        }
        if cancel.is_cancelled() {
            return Decision {
                approved: false,
                reason: Some("the run was stopped".into()),
            };
        }
        let approval_id = format!("approval-{}", uuid::Uuid::new_v4().simple());
        let rememberable = ask.rememberable();
        let info = ApprovalInfo {
            approval_id: approval_id.clone(),
            session_id: self.session_id.clone(),
            parent_session_id: self.parent_session_id.clone(),
            title: self.title.clone(),
            remember_label: rememberable.then(|| remember_label(&ask.tool, &ask.arguments)),
            mcp_server: crate::mcp::server_of_tool(&ask.tool).map(str::to_string),
            worktree: self.worktree.clone(),
            provider: self.runs_on.as_ref().map(|(provider, _)| provider.clone()),
            model: self.runs_on.as_ref().map(|(_, model)| model.clone()),
            tool: ask.tool,
            arguments: ask.arguments,
            diff: ask.diff,
            rememberable,
        };
        let (reply, answer) = oneshot::channel();
        {
            let mut open = self.book.open();
            open.push(Open {
                info: info.clone(),
                emit: self.emit.clone(),
                lineage: self.lineage.clone(),
                reply,
            });
            // Emitted under the book's lock so a snapshot taken meanwhile is consistent.
            (self.emit)(Event::ApprovalRequest(info));
        }
        // However this wait ends (decided, cancelled, or the call dropped), the request
        // leaves the book and the windows are told, so nothing shows a request no one awaits.
        let _withdraw = Withdraw {
            gate: self,
            approval_id,
        };
        tokio::select! {
            decision = answer => decision.unwrap_or(Decision { approved: false, reason: Some("the approval was withdrawn".into()) }),
            _ = cancel.cancelled() => Decision { approved: false, reason: Some("the run was stopped".into()) },
        }
    }
}

/// Withdraws an approval request that is still open when its asker stops waiting.
struct Withdraw<'a> {
    gate: &'a SessionGate,
    approval_id: String,
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        let still_open = {
            let mut open = self.gate.book.open();
            let before = open.len();
            open.retain(|o| o.info.approval_id != self.approval_id);
            before != open.len()
        };
        if still_open {
            (self.gate.emit)(Event::ApprovalResolved {
                session_id: self.gate.session_id.clone(),
                approval_id: std::mem::take(&mut self.approval_id),
                approved: false,
            });
        }
    }
}
