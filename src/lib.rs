//! Bumblehive's runtime: sessions, the agent loop, background sub-agents, providers and tools, with no GUI dependency.
//!
//! Where each rule of SPEC.md lives:
//! - §1 nouns, §5 event shapes, §9 command arguments: [`protocol`] (no I/O).
//! - §2 the message-order invariant: kept by [`run`]; checked by [`invariant`].
//! - §3 delegation: the `sub_agent` tool in [`tools`], the task registry in [`subagents`],
//!   child creation and report delivery in [`service`].
//! - §4 the delivery table, pending queue, safe points' inbox: [`controller`] (safe points
//!   themselves are in [`run`]).
//! - §5 subscriptions and snapshots: [`controller`].
//! - §6 busy config, shutdown, isolation: [`service`].
//! - §7 approvals: [`approvals`].
//! - §9 the command table: [`commands`].
//! - §10 configuration: [`config`]; sessions on disk: [`store`]; model providers over
//!   HTTP and API keys: [`providers`].

pub mod approvals;
pub mod commands;
pub mod config;
pub mod controller;
pub mod error;
pub mod invariant;
pub mod probe;
pub mod protocol;
pub mod provider;
pub mod providers;
mod run;
pub mod sandbox;
pub mod server;
pub mod service;
pub mod store;
pub mod subagents;
pub mod tools;
pub mod workspace;

pub use run::{CANCELLED_RESULT, system_prompt};
