//! The context a model call is built from: project instructions, the environment, the system prompt, the model's context window and automatic compaction of a long history.
//!
//! These are building blocks for the run loop's context builder; each is I/O-light and
//! tested on its own:
//! - [`instructions`]: `AGENTS.md` / `CLAUDE.md` from the workspace root down to the
//!   workspace, and the user-level file, under one size cap.
//! - [`environment`]: date, OS, shell, workspace, git branch and a short status (once per run).
//! - [`prompt`]: the one system message, byte-identical for the same inputs.
//! - [`window`]: the context window of a model (config, server, table, default), token
//!   estimates and the context meter.
//! - [`compaction`]: when to compact, what is kept, the handoff summary, the stored
//!   marker and the rebuilt request.
//! - `turn`: the turn context a run resolves once (provider, settings, tools with MCP's,
//!   system prompt, window, compaction marker), from the pieces above and
//!   `Shared::resolve_turn`.

pub mod compaction;
pub mod environment;
pub mod instructions;
pub mod prompt;
pub(crate) mod turn;
pub mod window;

use std::sync::Arc;

use crate::protocol::Message;
use crate::provider::{RequestMessages, ToolSpec};

/// What the context builder knows before a model call: the request's messages, its size
/// (reported or estimated) and whether to compact first.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub messages: RequestMessages,
    /// Tokens the request uses ([`window::used_tokens`]); the context meter shows it.
    pub used: usize,
    /// `Some` when the history should be compacted before this call.
    pub plan: Option<compaction::Plan>,
}

/// The context builder's step before every model call: the request from the history and
/// the latest marker, its size, and the compaction plan if one is due (`force` for the
/// `compact` command and after a provider's "context too long").
pub fn prepare(
    system: Message,
    history: &[Message],
    marker: Option<&compaction::Compaction>,
    tools: &[ToolSpec],
    window: usize,
    policy: &compaction::Policy,
    force: bool,
) -> Prepared {
    let mut size = window::RequestSize::new(window::tools_json(tools));
    let history = Arc::new(history.to_vec());
    prepare_sized(system, &history, marker, &mut size, window, policy, force)
}

/// [`prepare`] for a run: the tools' JSON size counted once for all its calls and the
/// history's messages once each ([`window::RequestSize`], kept by the run from call to
/// call), and the history shared, not copied, by the request ([`RequestMessages`]).
pub fn prepare_sized(
    system: Message,
    history: &Arc<Vec<Message>>,
    marker: Option<&compaction::Compaction>,
    size: &mut window::RequestSize,
    window: usize,
    policy: &compaction::Policy,
    force: bool,
) -> Prepared {
    let messages = compaction::build_messages(system, history, marker);
    let estimate = size.estimate(&messages, marker.map(|m| m.id.as_str()));
    let used = window::used_tokens(history, marker.map(|m| m.at), estimate);
    let plan = compaction::plan(history, marker, window, used, policy, force);
    Prepared {
        messages,
        used,
        plan,
    }
}
