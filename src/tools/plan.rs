//! `update_plan`: the model's own short plan for a longer task, its steps and their status, kept in the conversation (each call replaces the last) and shown to the person: the chat renders it as a checklist, an ACP client gets it as a `plan` update (issue 29).
//!
//! Why a tool and not text: the plan then has a shape the UI and ACP editors can show
//! (Zed's plan panel), and the model's latest plan is the last call in its history, so
//! it survives compaction's summary and a restart like any tool call. It changes
//! nothing, so it asks nothing.

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError, parse_args};

pub struct UpdatePlan;

impl UpdatePlan {
    pub const NAME: &'static str = "update_plan";
    /// How its result starts when the plan was taken (a replay tells it from a refusal).
    pub const TAKEN: &'static str = "Plan updated";
}

/// At most this many steps: a plan is a short list, not the work itself.
const MAX_STEPS: usize = 50;
/// Each step's text at most this long (bytes).
const MAX_STEP: usize = 500;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanArgs {
    #[serde(default)]
    explanation: Option<String>,
    plan: Vec<PlanStep>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanStep {
    step: String,
    status: Status,
}

#[derive(Deserialize, PartialEq, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum Status {
    Pending,
    InProgress,
    Completed,
}

#[async_trait]
impl Tool for UpdatePlan {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn description(&self) -> &'static str {
        "Keep a short plan for a task of several steps and update it as you go: the whole list \
each time, each step with its status (pending, in_progress, completed), at most one in_progress. \
The person sees it as a checklist. Skip it for a task of one or two steps."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "explanation": {"type": "string", "description": "Why the plan changed, if it did"},
                "plan": {
                    "type": "array",
                    "description": "Every step, in order",
                    "items": {
                        "type": "object",
                        "properties": {
                            "step": {"type": "string"},
                            "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]}
                        },
                        "required": ["step", "status"],
                        "additionalProperties": false
                    }
                }
            },
            "required": ["plan"],
            "additionalProperties": false
        })
    }

    async fn call(&self, _ctx: &ToolContext, arguments: Value) -> Result<String, ToolError> {
        let args: PlanArgs = parse_args(arguments)?;
        if args.plan.is_empty() {
            return Err(ToolError::InvalidArguments(
                "the plan has no steps; give every step with its status".into(),
            ));
        }
        if args.plan.len() > MAX_STEPS {
            return Err(ToolError::InvalidArguments(format!(
                "{} steps: a plan has at most {MAX_STEPS}",
                args.plan.len()
            )));
        }
        if let Some(step) = args
            .plan
            .iter()
            .find(|s| s.step.trim().is_empty() || s.step.len() > MAX_STEP)
        {
            return Err(ToolError::InvalidArguments(format!(
                "each step needs a text of at most {MAX_STEP} bytes (got {} bytes)",
                step.step.len()
            )));
        }
        let active = args
            .plan
            .iter()
            .filter(|s| s.status == Status::InProgress)
            .count();
        if active > 1 {
            return Err(ToolError::InvalidArguments(format!(
                "{active} steps are in_progress: at most one may be"
            )));
        }
        let done = args
            .plan
            .iter()
            .filter(|s| s.status == Status::Completed)
            .count();
        let _ = args.explanation;
        Ok(format!(
            "{}: {done} of {} steps completed.",
            Self::TAKEN,
            args.plan.len()
        ))
    }
}
