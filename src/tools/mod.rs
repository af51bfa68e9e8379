//! The tool trait, the context a tool runs in, and the registry that offers tools to the model.

mod files;
pub mod paths;
mod sub_agent;

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::protocol::SessionId;
use crate::provider::ToolSpec;

pub use files::{ReadFile, WriteFile};
pub use sub_agent::SubAgent;

/// A failure the model is told about as the tool's result; the run goes on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    #[error("denied by user{}", .0.as_ref().map(|r| format!(": {r}")).unwrap_or_default())]
    Denied(Option<String>),
    #[error("{0}")]
    Failed(String),
}

/// What the person decided about an approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub approved: bool,
    pub reason: Option<String>,
}

/// An approval a tool asks for.
#[derive(Debug, Clone)]
pub struct ApprovalAsk {
    pub tool: String,
    pub arguments: Value,
    pub diff: Option<String>,
    /// False for paths outside the workspace: "always allow" never covers those.
    pub rememberable: bool,
}

/// Where approvals go: the session controller, which shows them to the person.
#[async_trait]
pub trait ApprovalGate: Send + Sync {
    /// Waits for the person's decision; a cancelled run resolves it as denied.
    async fn ask(&self, ask: ApprovalAsk, cancel: &CancellationToken) -> Decision;
}

/// Starts a background sub-agent for a `sub_agent` call (the service implements it).
#[async_trait]
pub trait Delegator: Send + Sync {
    async fn delegate(&self, ctx: &ToolContext, title: String, task: String) -> Result<(), String>;
}

/// Everything a tool call may use. Cheap to clone.
#[derive(Clone)]
pub struct ToolContext {
    pub session_id: SessionId,
    pub workspace: PathBuf,
    pub call_id: String,
    pub cancel: CancellationToken,
    pub approvals: Arc<dyn ApprovalGate>,
    pub delegator: Option<Arc<dyn Delegator>>,
    /// The run config of the message that started this run, passed on to children.
    pub run_config: crate::protocol::RunConfig,
}

impl ToolContext {
    pub async fn ask(&self, ask: ApprovalAsk) -> Result<(), ToolError> {
        let decision = self.approvals.ask(ask, &self.cancel).await;
        if decision.approved {
            Ok(())
        } else {
            Err(ToolError::Denied(decision.reason))
        }
    }
}

/// A tool. Add one by implementing this and registering it in [`ToolRegistry`].
#[async_trait]
pub trait Tool: Send + Sync {
    fn name(&self) -> &'static str;
    fn description(&self) -> &'static str;
    /// JSON schema of the arguments object.
    fn parameters(&self) -> Value;
    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<String, ToolError>;
}

/// The tools a session may use, in the order the model sees them.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: Vec<Arc<dyn Tool>>,
}

impl ToolRegistry {
    /// The standard tool set.
    pub fn standard() -> Self {
        let mut registry = ToolRegistry::default();
        registry.register(Arc::new(ReadFile));
        registry.register(Arc::new(WriteFile));
        registry.register(Arc::new(SubAgent));
        registry
    }

    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        self.tools.retain(|t| t.name() != tool.name());
        self.tools.push(tool);
    }

    /// A copy keeping only the tools `keep` accepts (e.g. read-only children).
    pub fn filtered(&self, keep: impl Fn(&str) -> bool) -> Self {
        ToolRegistry {
            tools: self
                .tools
                .iter()
                .filter(|t| keep(t.name()))
                .cloned()
                .collect(),
        }
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.iter().find(|t| t.name() == name)
    }

    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools
            .iter()
            .map(|t| ToolSpec {
                name: t.name().to_string(),
                description: t.description().to_string(),
                parameters: t.parameters(),
            })
            .collect()
    }

    /// Runs one call; unknown tools and bad arguments become errors for the model.
    pub async fn call(
        &self,
        ctx: &ToolContext,
        name: &str,
        arguments: Value,
    ) -> Result<String, ToolError> {
        let Some(tool) = self.get(name) else {
            let known: Vec<_> = self.tools.iter().map(|t| t.name()).collect();
            return Err(ToolError::InvalidArguments(format!(
                "unknown tool {name:?}; available tools: {}",
                known.join(", ")
            )));
        };
        let arguments = match arguments {
            Value::Object(_) => arguments,
            Value::Null => Value::Object(Default::default()),
            Value::String(text) => serde_json::from_str::<Value>(&text)
                .ok()
                .filter(Value::is_object)
                .ok_or_else(|| {
                    ToolError::InvalidArguments(format!(
                        "arguments must be a JSON object, got text that is not one: {text:?}"
                    ))
                })?,
            other => {
                return Err(ToolError::InvalidArguments(format!(
                    "arguments must be a JSON object, got {other}"
                )));
            }
        };
        tool.call(ctx, arguments).await
    }
}

/// Decodes typed arguments, with a message the model can act on.
pub fn parse_args<T: serde::de::DeserializeOwned>(arguments: Value) -> Result<T, ToolError> {
    serde_json::from_value(arguments).map_err(|err| ToolError::InvalidArguments(err.to_string()))
}
