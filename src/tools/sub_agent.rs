//! The `sub_agent` tool (SPEC §3): starts a background child session and returns at once with a pending marker.

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Access, ApprovalAsk, Tool, ToolContext, ToolError, parse_args};

pub struct SubAgent;

#[derive(Deserialize)]
struct SubAgentArgs {
    title: String,
    task: String,
    /// A profile name (SPEC §11); the runtime lists them in the description it sends.
    #[serde(default)]
    agent: Option<String>,
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
                "agent": {"type": "string", "description": "The profile the sub-agent runs with (see the list in this tool's description); general when omitted"}
            },
            "required": ["title", "task"]
        })
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<String, ToolError> {
        let args: SubAgentArgs = parse_args(arguments.clone())?;
        if args.task.trim().is_empty() {
            return Err(ToolError::InvalidArguments("task must not be empty".into()));
        }
        // Free by default; through the gate so that a configured `ask` policy applies.
        ctx.ask(ApprovalAsk {
            tool: self.name().to_string(),
            arguments,
            diff: None,
            access: Access::Read,
        })
        .await?;
        let Some(delegator) = &ctx.delegator else {
            return Err(ToolError::Failed(
                "this session cannot delegate further (subagents.max_depth)".into(),
            ));
        };
        let task_id = delegator
            .delegate(
                ctx,
                crate::tools::Delegation {
                    title: args.title,
                    task: args.task,
                    agent: args.agent.filter(|a| !a.trim().is_empty()),
                },
            )
            .await
            .map_err(ToolError::Failed)?;
        // Exactly these two keys: the parent learns the id its report will carry.
        Ok(json!({"status": "pending", "task_id": task_id}).to_string())
    }
}
