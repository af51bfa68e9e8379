//! Bumblehive's runtime: sessions, the agent loop, background sub-agents, providers and tools, with no GUI dependency.
//!
//! Where each rule of SPEC.md lives:
//! - §1 nouns, §5 event shapes, §9 command arguments: [`protocol`] (no I/O).
//! - §2 the message-order invariant: kept by the run loop (`controller/run.rs`); checked
//!   by [`invariant`].
//! - §3 delegation: the `sub_agent` tool in [`tools`], the task registry in [`subagents`],
//!   child creation, task ids and report delivery in [`delegation`].
//! - §4 the session's state machine, the delivery table, the pending queue and both safe
//!   points: [`controller`] (`SessionController::route`; the run loop calls the safe points).
//! - §5 subscriptions and snapshots: [`controller`].
//! - §6 busy config: [`runtime`] (`Shared::update_config`, with the turn context each run
//!   resolves once; the commands that change it: `settings`); shutdown: [`service`];
//!   deletion and a child's follow-up, resume and cancel: `children`.
//! - Durability: [`store`] (files), [`recovery`] (start-up repair).
//! - Bounded resources: [`registry`] (live controllers only), [`store`] (open files).
//!
//! Module graph (no cycle): fsutil, protocol (no crate dependency) ← store, config ←
//! providers, tools ← runtime ← controller ← registry ← delegation, recovery ← children,
//! settings, list_feed ← service ← commands ← server; service ← acp (the ACP front door).
//! - §7 approvals: [`approvals`].
//! - §9 the command table: [`commands`].
//! - §10 configuration: [`config`]; sessions on disk: [`store`]; model providers over
//!   HTTP and API keys: [`providers`].

pub mod acp;
pub mod approvals;
pub mod checkpoints;
mod children;
pub mod commands;
pub mod config;
pub mod context;
pub mod controller;
mod delegation;
pub mod error;
pub mod flush;
pub mod frames;
pub mod fsutil;
pub mod git;
pub mod invariant;
mod list_feed;
pub mod mcp;
pub mod mentions;
pub mod owner;
pub mod owner_run;
pub mod probe;
pub mod profiles;
pub mod protocol;
pub mod provider;
pub mod providers;
mod recovery;
mod registry;
pub mod runtime;
pub mod sandbox;
pub mod server;
pub mod service;
pub mod session_index;
mod settings;
pub mod skills;
pub mod slots;
mod spares;
pub mod store;
pub mod subagents;
pub mod text;
pub mod tools;
pub mod workspace;

pub use controller::CANCELLED_RESULT;

/// The git commit this build was made from, set by the build script when it can tell.
pub const BUILD_COMMIT: &str = match option_env!("BUMBLEHIVE_COMMIT") {
    Some(commit) => commit,
    None => "unknown",
};
