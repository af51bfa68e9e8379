//! The tool trait, the context a tool runs in, and the registry that offers tools to the model.

pub(crate) mod command;
mod edit;
mod files;
mod list;
pub mod paths;
mod plan;
mod search;
mod sub_agent;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::config::ToolPolicy;
use crate::protocol::SessionId;
use crate::provider::ToolSpec;

pub use command::RunCommand;
pub use edit::EditFile;
pub use files::{ReadFile, WriteFile};
pub use list::{Glob, ListDir};
pub use plan::UpdatePlan;
pub use search::Grep;
pub use sub_agent::{MessageSubagent, SubAgent};

/// A failure the model is told about as the tool's result; the run goes on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    #[error("denied by user{}", .0.as_ref().map(|r| format!(": {r}")).unwrap_or_default())]
    Denied(Option<String>),
    /// The tool is switched off by `tools.policy` in the config.
    #[error("the {0} tool is disabled by configuration (tools.policy)")]
    Disabled(String),
    #[error("{0}")]
    Failed(String),
}

/// What the person decided about an approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub approved: bool,
    pub reason: Option<String>,
}

/// What a call does and where, which decides whether the person is asked (SPEC §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reading inside the workspace, or anything else that needs no approval by default
    /// (delegating): free unless the tool's policy says `ask`.
    Read,
    /// Changing things inside the workspace (writes, edits, commands): asks unless the
    /// tool is allowed by policy or remembered for the session.
    Change,
    /// Reading or changing outside the workspace (or through a symlink that leaves it):
    /// always asks; neither "always allow" nor an `allow` policy covers it.
    Outside,
}

impl Access {
    /// The access of a call on a resolved path.
    pub fn of(resolved: &paths::Resolved, change: bool) -> Access {
        match (resolved.inside, change) {
            (false, _) => Access::Outside,
            (true, false) => Access::Read,
            (true, true) => Access::Change,
        }
    }
}

/// What a tool is about to do, for the gate to allow, ask about or refuse.
#[derive(Debug, Clone)]
pub struct ApprovalAsk {
    pub tool: String,
    pub arguments: Value,
    /// A unified diff of the change, for writes and edits.
    pub diff: Option<String>,
    pub access: Access,
}

impl ApprovalAsk {
    /// False for places outside the workspace: "always allow" never covers those.
    pub fn rememberable(&self) -> bool {
        self.access != Access::Outside
    }
}

/// Where approvals go: the session controller, which shows them to the person.
#[async_trait]
pub trait ApprovalGate: Send + Sync {
    /// Decides a call: at once when policy, remembered choices or a free read settle it,
    /// otherwise by waiting for the person; a cancelled run resolves it as denied.
    async fn ask(&self, ask: ApprovalAsk, cancel: &CancellationToken) -> Decision;

    /// The configured policy of a tool, if any (`deny` refuses the tool outright).
    fn policy(&self, _tool: &str) -> Option<ToolPolicy> {
        None
    }
}

/// Starts a background sub-agent for a `sub_agent` call (the service implements it).
#[async_trait]
pub trait Delegator: Send + Sync {
    /// Starts the child and returns its task id: the call's id, or a fresh one when the
    /// model reused a call id of an earlier child (SPEC §11).
    async fn delegate(&self, ctx: &ToolContext, request: Delegation) -> Result<String, String>;

    /// Sends a follow-up to the child with `task_id`; returns how it was delivered
    /// (`steered` into its run, or `started` a new one).
    async fn follow_up(
        &self,
        ctx: &ToolContext,
        task_id: &str,
        message: String,
    ) -> Result<crate::protocol::MessageStatus, String>;
}

/// What a `sub_agent` call asks for.
#[derive(Debug, Clone)]
pub struct Delegation {
    pub title: String,
    pub task: String,
    /// A profile name; `None` for `general`.
    pub agent: Option<String>,
    /// Work in a git worktree of its own (`isolation: "worktree"`).
    pub worktree: bool,
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
    /// Environment variables that hold secrets (the provider's API key): commands do not
    /// get them, so an approved `env` cannot write a key into the session's history.
    pub secret_env: Vec<String>,
    /// Where changing calls record their checkpoints (`None`: not recorded, e.g. git
    /// is missing or the call runs outside a session).
    pub checkpoints: Option<crate::checkpoints::CallHook>,
}

/// The variables [`ToolContext::secret_env`] holds for a provider config: the configured
/// key variable and the usual ones.
pub fn secret_env(provider: &crate::config::ProviderConfig) -> Vec<String> {
    let mut names: Vec<String> = provider.api_key_env.iter().cloned().collect();
    for usual in ["OPENAI_API_KEY", "ANTHROPIC_API_KEY"] {
        if !names.iter().any(|n| n == usual) {
            names.push(usual.to_string());
        }
    }
    names
}

impl ToolContext {
    /// Every access a tool makes goes through here, free reads included, so that the
    /// per-tool policy applies to all of them.
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
    /// Owned by the tool: names of tools that exist only at run time (MCP) are not static.
    fn name(&self) -> &str;
    fn description(&self) -> &str;
    /// JSON schema of the arguments object.
    fn parameters(&self) -> Value;
    /// Whether a call may change the workspace: the runtime then records a checkpoint
    /// before it and what it changed after it (`checkpoints`). MCP tools that may write
    /// say true too.
    fn changes_workspace(&self) -> bool {
        false
    }
    /// Whether a call has an effect that must not outlive a crash while the history that
    /// asked for it does not: the run flushes its history before such a call (a read-only
    /// tool's step is flushed while the next model call runs). Sub-agent tools say true.
    fn acts_outside_the_history(&self) -> bool {
        self.changes_workspace()
    }
    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<String, ToolError>;

    /// The result with the images it carries (an MCP server's screenshot): the run sends
    /// them to providers whose tool results take images. Text-only tools keep the default.
    async fn call_output(
        &self,
        ctx: &ToolContext,
        arguments: Value,
    ) -> Result<ToolOutput, ToolError> {
        self.call(ctx, arguments).await.map(ToolOutput::text)
    }
}

/// A tool's result: its text and any images.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolOutput {
    pub text: String,
    pub images: Vec<crate::protocol::ImagePart>,
}

impl ToolOutput {
    pub fn text(text: String) -> Self {
        ToolOutput {
            text,
            images: Vec::new(),
        }
    }
}

/// The tools a session may use, in the order the model sees them.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: Vec<Entry>,
    /// Built once: the model is sent them on every call.
    specs: Arc<std::sync::OnceLock<Vec<ToolSpec>>>,
}

/// A tool and its JSON schema, built at most once and shared by every registry cloned or
/// narrowed from this one: each turn narrows the registry (a child has no `sub_agent`, a
/// profile its own list), and a schema rebuilt per turn cost every running child its own
/// copy of every schema (the child-memory bench: 222 → 106 KiB per running child).
#[derive(Clone)]
struct Entry {
    tool: Arc<dyn Tool>,
    schema: Arc<std::sync::OnceLock<Arc<Value>>>,
}

impl ToolRegistry {
    /// The standard tool set: read-only tools first, then the ones that change things.
    pub fn standard() -> Self {
        Self::standard_with(Arc::new(RunCommand))
    }

    /// The standard tools with this `run_command` (e.g. one with its own sandbox settings).
    pub fn standard_with(run_command: Arc<dyn Tool>) -> Self {
        let mut registry = ToolRegistry::default();
        registry.register(Arc::new(ReadFile));
        registry.register(Arc::new(ListDir));
        registry.register(Arc::new(Glob));
        registry.register(Arc::new(Grep));
        registry.register(Arc::new(WriteFile));
        registry.register(Arc::new(EditFile));
        registry.register(run_command);
        registry.register(Arc::new(SubAgent));
        registry.register(Arc::new(MessageSubagent));
        registry.register(Arc::new(UpdatePlan));
        registry
    }

    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        self.tools.retain(|e| e.tool.name() != tool.name());
        self.tools.push(Entry {
            tool,
            schema: Default::default(),
        });
        self.specs = Default::default();
    }

    /// A copy keeping only the tools `keep` accepts (e.g. read-only children).
    pub fn filtered(&self, keep: impl Fn(&str) -> bool) -> Self {
        ToolRegistry {
            tools: self
                .tools
                .iter()
                .filter(|e| keep(e.tool.name()))
                .cloned()
                .collect(),
            specs: Default::default(),
        }
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools
            .iter()
            .find(|e| e.tool.name() == name)
            .map(|e| &e.tool)
    }

    pub fn specs(&self) -> &[ToolSpec] {
        self.specs.get_or_init(|| {
            self.tools
                .iter()
                .map(|e| ToolSpec {
                    name: e.tool.name().to_string(),
                    description: e.tool.description().to_string(),
                    parameters: e
                        .schema
                        .get_or_init(|| Arc::new(e.tool.parameters()))
                        .clone(),
                })
                .collect()
        })
    }

    /// Runs one call; unknown tools and bad arguments become errors for the model.
    pub async fn call(
        &self,
        ctx: &ToolContext,
        name: &str,
        arguments: Value,
    ) -> Result<String, ToolError> {
        self.call_output(ctx, name, arguments)
            .await
            .map(|output| output.text)
    }

    /// [`Self::call`] with the images a result carries (the run loop's entry point).
    pub async fn call_output(
        &self,
        ctx: &ToolContext,
        name: &str,
        arguments: Value,
    ) -> Result<ToolOutput, ToolError> {
        let Some(tool) = self.get(name) else {
            let known: Vec<_> = self.tools.iter().map(|e| e.tool.name()).collect();
            return Err(ToolError::InvalidArguments(format!(
                "unknown tool {name:?}; available tools: {}",
                known.join(", ")
            )));
        };
        if ctx.approvals.policy(name) == Some(ToolPolicy::Deny) {
            return Err(ToolError::Disabled(name.to_string()));
        }
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
        let hook = ctx
            .checkpoints
            .as_ref()
            .filter(|_| tool.changes_workspace());
        let Some(hook) = hook else {
            return tool.call_output(ctx, arguments).await;
        };
        let before = hook.before(&ctx.workspace).await;
        let result = tool.call_output(ctx, arguments.clone()).await;
        // Refused before it did anything: nothing to record, and the result must not wait
        // for a snapshot (a Stop collects the calls that are done at once, and a denial by
        // the stop is one of them).
        let untouched = matches!(
            result,
            Err(ToolError::Denied(_) | ToolError::InvalidArguments(_) | ToolError::Disabled(_))
        );
        if let (Some(before), false) = (before, untouched) {
            hook.after(&ctx.workspace, before, name, &ctx.call_id, &arguments)
                .await;
        }
        result
    }
}

/// Runs blocking file-system work (walks, searches, reads) off the async threads. When the
/// run is cancelled, or the call's future is dropped, the tool returns at once and `stop`
/// tells the work to give up at its next check.
pub(crate) async fn blocking<T, F>(ctx: &ToolContext, work: F) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce(&AtomicBool) -> Result<T, ToolError> + Send + 'static,
{
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
    let flag = stop.0.clone();
    let handle = tokio::task::spawn_blocking(move || work(&flag));
    tokio::select! {
        joined = handle => joined.map_err(|err| ToolError::Failed(format!("the tool failed: {err}")))?,
        _ = ctx.cancel.cancelled() => Err(ToolError::Failed("cancelled".into())),
    }
}

tokio::task_local! {
    /// Set by [`blocking_change`] when an approved change starts, so that a run cancelled
    /// meanwhile waits for its result instead of recording "Cancelled by user".
    pub(crate) static COMMITTED: Arc<AtomicBool>;
}

/// Runs a blocking change to completion even if the run is cancelled meanwhile: once the
/// person approved it, the result must say truthfully whether it happened.
pub(crate) async fn blocking_change<T, F>(work: F) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ToolError> + Send + 'static,
{
    let _ = COMMITTED.try_with(|committed| committed.store(true, Ordering::Release));
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| ToolError::Failed(format!("the tool failed: {err}")))?
}

/// Decodes typed arguments, with a message the model can act on.
pub fn parse_args<T: serde::de::DeserializeOwned>(arguments: Value) -> Result<T, ToolError> {
    serde_json::from_value(arguments).map_err(|err| ToolError::InvalidArguments(err.to_string()))
}
