//! Bumblehive's integration tests: one binary, one module per area.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// Shared helpers: the scripted delegation provider, waiting on events with a timeout,
// the message-order check on stored histories.
mod support;

// Every scenario of ../shared/seed/test_background_delegation.py, same names without `test_`.
mod seed;

// A scripted model server (axum on 127.0.0.1:0): queued SSE answers, recorded requests,
// tool outputs checked against earlier calls; OpenAI chunk and Anthropic event builders.
mod mock_llm;

// The `openai` provider over real HTTP against the mock: stream shapes, request bodies,
// retries, errors, cancel, usage, the seed's delegation flow, chunk-to-event overhead.
mod providers_openai;

// The `anthropic` provider over real HTTP against the mock: event shapes, the mapping of
// the OpenAI-shaped history, retries and errors.
mod providers_anthropic;

// A real small model served by ../shared/tools/local-llm (skipped unless
// BUMBLEHIVE_REAL_MODEL_URL is set; scripts/real-model-tier.sh sets it).
mod real_model;

// Workspace tools driven directly (edits, search, commands with no process left behind),
// and approvals end to end: a child's approval in the parent's window, remember, denial reasons.
mod tools;

// The path-escape corpus: every file tool against hundreds of ways out of the workspace.
mod paths;

// Security review findings for real: the bubblewrap sandbox, environment allow-list,
// scoped "always allow", hard links, swapped links, full disk, outside paths named.
mod security;

// The controller's delivery table (SPEC §4), steer/discard errors, submit after Stop, lag,
// cancelling a child that waits for a slot.
mod controller;

// One test per runtime-review finding the session core fixes (C1–C19), and the SPEC
// assertions the review found missing (session_created fields, busy changes nothing).
mod review;

// The second runtime review's findings (R1–R15) on the child lifecycle, and delegation
// that never blocks the parent (issue 25).
mod lifecycle;

// The randomized interleaving test: seeded sequences of every action against the real
// service, restarts and crashes, SPEC §12's invariants after every step.
mod simulation;

// Recovery after a crash or restart, the report ledger, interrupted children, damaged sessions.
mod durability;

// The typed command table by name: decoding errors, rename, archive, search, workspace
// files and @-mentions.
mod commands;

// Agent profiles (ours, Claude Code's, Codex's), named providers, a child on its
// profile's server with its tools, slots per server.
mod profiles;

// The headless server: the real binary over HTTP and SSE, and `bumblehive run`.
mod server;

// SIGKILL at many points of delegated runs, restart, resume, check (names start with crash_).
mod crash;

// The OS keyring for real (inside a D-Bus session with gnome-keyring; skipped elsewhere).
mod keyring;

// Context that lasts: instructions, environment, context windows from local servers, and
// compaction against the scripted model server with a 2,000-token window.
mod context;

// Checkpoints and undo: the Changes view, undo of a turn in git and plain folders, the
// person's later edits, rewind and fork, deletion, SIGKILL during an undo (names start with undo_).
mod undo;
// MCP servers for real: server-everything from npm (stdio and streamable HTTP) and a small
// server on the Python `mcp` SDK; approval, Stop, crashes, list_changed, workspace trust.
mod mcp;

// Agent Skills and custom commands: the list in the request, the skill loaded on use, its
// script under approvals, a profile's skills, list_skills and expand_command (names start with skills_).
mod skills;

// Security review 2, findings 1-3: repositories planted with programs (hooks, fsmonitor,
// filters, commondir, `.git` files, nested and new repositories); the runtime's own git
// runs none of them.
mod security_git;

// Security review 2, findings 5 and 10: host sockets under /run and the runtime's data
// dir and config are out of a sandboxed command's reach.
mod security_hide;

// Security review 2, finding 9: instruction and profile files follow no symlink out of the
// project; a workspace profile replacing another says so.
mod security_links;

// Security review 2, finding 14: `serve` under connection floods (the real binary).
mod security_server;

// The busy rule for config changes beyond the config file (the keyring; review 2, R14).
mod settings;

// `bumblehive acp` driven by the official ACP client SDKs (Python from PyPI, TypeScript from
// npm; scripts/acp-test-clients.sh installs them): tool calls, permissions both ways,
// cancel, sub-agents as child sessions or summarised, a wake-up after the prompt ended.
mod acp;

// ACP agents as background sub-agents: the Python SDK agent (tests/acp/agent.py) as a
// `kind: acp` child that reads a file, asks one permission, reports once, and is stopped.
mod acp_child;

// The real ACP agents (npm claude-agent-acp and codex-acp, pinned in tests/acp/agents/) as
// `kind: acp` background children against the mock server's Messages and Responses
// endpoints: a file read, one permission in the parent's window, one report, no network.
mod acp_real;
