//! Bumblehive's integration tests: one binary, one module per area.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// Shared helpers: the scripted delegation provider, waiting on events with a timeout,
// the message-order check on stored histories.
mod support;

// Every scenario of ../shared/seed/test_background_delegation.py, same names without `test_`.
mod seed;

// Workspace tools driven directly (edits, search, commands with no process left behind),
// and approvals end to end: a child's approval in the parent's window, remember, denial reasons.
mod tools;

// The path-escape corpus: every file tool against hundreds of ways out of the workspace.
mod paths;

// The controller's delivery table (SPEC §4), steer/discard errors, snapshots, approvals.
mod controller;

// Recovery after a crash or restart, the report ledger, interrupted children, damaged sessions.
mod durability;
