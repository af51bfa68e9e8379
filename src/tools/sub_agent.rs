//! The delegation tools: `sub_agent` (SPEC §3) starts a background child session and returns at once with a pending marker; `message_subagent` sends one of this session's children a follow-up (SPEC §11).

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Access, ApprovalAsk, Tool, ToolContext, ToolError, parse_args};

pub struct SubAgent;

/// Both delegation tools are free by default but go through the gate, so that a
/// configured `ask` policy applies; then they need the session's delegator.
async fn delegator_after_gate<'a>(
    ctx: &'a ToolContext,
    tool: &str,
    arguments: Value,
    without: &str,
) -> Result<&'a std::sync::Arc<dyn super::Delegator>, ToolError> {
    ctx.ask(ApprovalAsk {
        tool: tool.to_string(),
        arguments,
        diff: None,
        access: Access::Read,
    })
    .await?;
    ctx.delegator
        .as_ref()
        .ok_or_else(|| ToolError::Failed(without.to_string()))
}

#[derive(Deserialize)]
struct SubAgentArgs {
    title: String,
    task: String,
    /// A profile name (SPEC §11); the runtime lists them in the description it sends.
    #[serde(default)]
    agent: Option<String>,
    /// `worktree`: the child works in a git worktree of its own (`none`: the default).
    #[serde(default)]
    isolation: Option<String>,
}

#[async_trait]
impl Tool for SubAgent {
    fn name(&self) -> &'static str {
        "sub_agent"
    }

    fn description(&self) -> &'static str {
        "Delegate a self-contained task to a sub-agent that works in the background in the same workspace. \
Returns at once with a task id; the sub-agent's report arrives later as a user message starting with \
\"[Background tool result]\". Give the task everything it needs: the sub-agent does not see this conversation."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "title": {"type": "string", "description": "A short name for the sub-agent's tab"},
                "task": {"type": "string", "description": "What the sub-agent must do, self-contained"},
                "agent": {"type": "string", "description": "The profile the sub-agent runs with (see the list in this tool's description); general when omitted"},
                "isolation": {"type": "string", "enum": ["none", "worktree"], "description": "worktree: the sub-agent works in its own git worktree and branch (git workspaces only); its changes reach the workspace only when the person applies them. none (default): it works in the workspace itself"}
            },
            "required": ["title", "task"]
        })
    }

    /// A started child, or a message to one, must find its parent's call on disk after a
    /// crash (recovery pairs them by task id).
    fn acts_outside_the_history(&self) -> bool {
        true
    }
    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<String, ToolError> {
        let args: SubAgentArgs = parse_args(arguments.clone())?;
        if args.task.trim().is_empty() {
            return Err(ToolError::InvalidArguments("task must not be empty".into()));
        }
        let worktree = match args.isolation.as_deref().map(str::trim) {
            None | Some("") | Some("none") => false,
            Some("worktree") => true,
            Some(other) => {
                return Err(ToolError::InvalidArguments(format!(
                    "isolation must be \"none\" or \"worktree\", not {other:?}"
                )));
            }
        };
        let delegator = delegator_after_gate(
            ctx,
            self.name(),
            arguments,
            "this session cannot delegate further (subagents.max_depth)",
        )
        .await?;
        let task_id = delegator
            .delegate(
                ctx,
                crate::tools::Delegation {
                    title: args.title,
                    task: args.task,
                    agent: args.agent.filter(|a| !a.trim().is_empty()),
                    worktree,
                },
            )
            .await
            .map_err(ToolError::Failed)?;
        // Exactly these two keys: the parent learns the id its report will carry.
        Ok(json!({"status": "pending", "task_id": task_id}).to_string())
    }
}

/// Sends a follow-up to one of this session's children by task id: a running child gets
/// it at its next safe point; a finished one starts a new run, whose report arrives like
/// the first (`subagent:<task_id>:<n>`).
pub struct MessageSubagent;

#[derive(Deserialize)]
struct MessageArgs {
    task_id: String,
    message: String,
}

#[async_trait]
impl Tool for MessageSubagent {
    fn name(&self) -> &'static str {
        "message_subagent"
    }

    fn description(&self) -> &'static str {
        "Send a follow-up message to one of your sub-agents, by its task id. A sub-agent that is still working reads it at its next step; one that has finished (or failed) works on it and sends a new report, which arrives later as a user message starting with \"[Background tool result]\". One the person stopped keeps the message until the person lets it go on (status \"queued\")."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "task_id": {"type": "string", "description": "The task id the sub_agent call returned"},
                "message": {"type": "string", "description": "What the sub-agent should do next, self-contained"}
            },
            "required": ["task_id", "message"]
        })
    }

    /// A started child, or a message to one, must find its parent's call on disk after a
    /// crash (recovery pairs them by task id).
    fn acts_outside_the_history(&self) -> bool {
        true
    }
    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<String, ToolError> {
        let args: MessageArgs = parse_args(arguments.clone())?;
        if args.message.trim().is_empty() {
            return Err(ToolError::InvalidArguments(
                "message must not be empty".into(),
            ));
        }
        let delegator = delegator_after_gate(
            ctx,
            self.name(),
            arguments,
            "this session has no sub-agents to message",
        )
        .await?;
        let status = delegator
            .follow_up(ctx, &args.task_id, args.message)
            .await
            .map_err(ToolError::Failed)?;
        Ok(json!({"status": status, "task_id": args.task_id}).to_string())
    }
}
