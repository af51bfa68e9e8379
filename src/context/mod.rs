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

pub mod compaction;
pub mod environment;
pub mod instructions;
pub mod prompt;
pub mod window;
