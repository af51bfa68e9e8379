//! Bumblehive's integration tests: one binary, one module per area.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// Shared helpers: the scripted delegation provider, waiting on events with a timeout,
// the message-order check on stored histories.
mod support;

// Every scenario of ../shared/seed/test_background_delegation.py, same names without `test_`.
mod seed;

// The controller's delivery table (SPEC §4), steer/discard errors, snapshots, approvals.
mod controller;

// Recovery after a crash or restart, the report ledger, interrupted children, damaged sessions.
mod durability;
