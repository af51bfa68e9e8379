//! The turn context, resolved in one place when a run starts (SPEC §6: a config change applies from the next run): the workspace, provider and model settings, tools (built-in, MCP, the profile's), policy and limits, the system prompt, the context window and the compaction marker.
//!
//! The run loop (`controller/run.rs`) calls [`resolve`] once per run. It starts the MCP
//! servers the run may use (their tools are part of the answer), asks
//! [`crate::runtime::Shared::resolve_turn`] for the config's half ([`TurnContext`]), and
//! builds the prompt's half ([`RunContext`]) here.

use std::path::Path;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::prompt::{ChildRole, PromptParts, system_prompt};
use crate::controller::SessionController;
use crate::protocol::{Compaction, Message, Progress, RunConfig};
use crate::runtime::{TurnContext, TurnRequest};
use crate::workspace::Place;

/// Everything a run works with, resolved once when it starts.
pub(crate) struct Turn {
    /// The folder the run works in.
    pub(crate) workspace: String,
    /// Provider, model settings, tools, policy, delegation, limits, the profile.
    pub(crate) turn: TurnContext,
    /// The system prompt, the context window and the compaction marker.
    pub(crate) context: RunContext,
}

/// What a run knows about the model's context, resolved when it starts.
pub(crate) struct RunContext {
    /// The system message, the same for every call of the run (providers cache it).
    pub(crate) system: Message,
    pub(crate) window: usize,
    /// The latest compaction marker.
    pub(crate) marker: Option<Compaction>,
    /// The size of the run's requests: the tools' JSON counted once per run (the specs do
    /// not change within a run; counting them per call was 3 % of a fan-out's CPU, issue
    /// 31), the history's messages once each.
    pub(crate) size: crate::context::window::RequestSize,
}

/// The turn of a run started by a message with `config`, over a history whose latest
/// compaction is `marker`. An error (an unknown provider or profile) fails the run.
pub(crate) async fn resolve(
    ctl: &Arc<SessionController>,
    config: &RunConfig,
    token: &CancellationToken,
    marker: Option<Compaction>,
) -> Result<Turn, String> {
    let meta = ctl.current_meta();
    // A sub-agent works in its own workspace (its worktree when isolated), whatever the
    // config of the message that started the run (its parent's, which its report keeps).
    let workspace = match (&meta.task_id, &config.runtime.workspace) {
        (None, Some(workspace)) => workspace.clone(),
        _ => meta.workspace.clone(),
    };
    // Found once for the run (or shared with runs started just before in the same
    // folder): the profiles, the skills and the instruction files all read from the
    // folder it names and its project root.
    let place = ctl.shared.place(Path::new(&workspace));
    let request = TurnRequest {
        depth: ctl.depth(),
        workspace: Path::new(&workspace),
        place: &place,
        agent: meta.agent.as_deref(),
        provider: meta.provider.as_deref(),
        model: meta.model.as_deref(),
        choice: &config.runtime,
    };
    // MCP servers start with the first run that can use them (nothing without any),
    // before the tools are resolved: their tools are among them.
    let mcp_servers = ctl.shared.read_config(|c| c.mcp_servers.clone());
    let hidden = || ctl.shared.read_config(crate::mcp::settings);
    let untrusted = ctl
        .shared
        .mcp
        .prepare(&mcp_servers, request.workspace, token, hidden)
        .await;
    if !untrusted.is_empty() {
        ctl.emit_progress(Progress::McpTrustNeeded {
            workspace: workspace.clone(),
            servers: untrusted,
        });
    }
    let turn = ctl.shared.resolve_turn(request)?;
    let context = run_context(ctl, &turn, Path::new(&workspace), place, marker).await;
    Ok(Turn {
        workspace,
        turn,
        context,
    })
}

/// The system prompt and the window, once per run. The environment, the window and the
/// instruction files are looked up at once, since each may wait on a process, a server
/// or the disk.
async fn run_context(
    ctl: &Arc<SessionController>,
    turn: &TurnContext,
    workspace: &Path,
    place: Arc<Place>,
    marker: Option<Compaction>,
) -> RunContext {
    let (environment, window, instructions) = tokio::join!(
        ctl.environment(workspace),
        ctl.shared.context_window(&turn.provider_name, &turn.block),
        ctl.shared.instructions(place),
    );
    for notice in &instructions.notices {
        tracing::warn!(session = %ctl.session_id(), "instructions: {notice}");
    }
    ctl.set_instructions(instructions.files.clone());
    let meta = ctl.meta();
    let settings = crate::sandbox::settings();
    let sandbox = crate::sandbox::prompt_note(&settings);
    let mut system = system_prompt(&PromptParts {
        child: meta
            .parent_session_id
            .as_ref()
            .map(|_| ChildRole { title: &meta.title }),
        environment: &environment,
        instructions: &instructions,
        sandbox: sandbox.as_deref(),
        can_delegate: turn.specs.iter().any(|spec| spec.name == "sub_agent"),
        approvals: true,
        tools_note: None,
    });
    if !turn.instructions.is_empty() {
        system.push_str("\n\n# Your instructions as this agent\n");
        system.push_str(&turn.instructions);
    }
    RunContext {
        system: Message::system(system),
        window: window.tokens as usize,
        marker,
        size: crate::context::window::RequestSize::new(crate::context::window::tools_json(
            &turn.specs,
        )),
    }
}
