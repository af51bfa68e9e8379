#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine for Bumblehive's tests and runs every test:
# Rust checks and tests, the web UI's tests, a benchmark smoke run, the real-model tier,
# the Linux packages (built, installed, started, removed), and the end-to-end tests in
# headless Chromium and in the real desktop window.
# Each step installs only what is missing, so a second run is fast.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's time is printed at the end (and on failure), for the CI time budget.
times=()
current=""; started=$SECONDS
finish_step() {
  [ -n "$current" ] && times+=("$(printf '%5ss  %s' $((SECONDS - started)) "$current")")
  current=""
}
report_times() {
  finish_step
  printf '\n==> Step times\n'
  printf '%s\n' "${times[@]}"
}
trap report_times EXIT
step() {
  finish_step
  current=$*; started=$SECONDS
  printf '\n==> %s\n' "$*"
}

step "System packages (only those missing)"
./scripts/setup-system.sh
export PATH="$HOME/.cargo/bin:$PATH"

# The real model's server (llama.cpp, about 10 min of C++ on 2 cores when not cached) and
# its model are prepared in the background at the lowest priority, so that they take the
# CPU the steps below leave idle (downloads, test runs waiting on servers and windows, the
# install check) instead of a step of their own; the real-model tier runs last.
mkdir -p target
llm_log=target/real-model-prepare.log
# Its own process group (setsid), so that a failing step can stop the whole build.
setsid nice -n 19 ./scripts/local-llm/server.sh prepare >"$llm_log" 2>&1 &
llm_prepare=$!
trap 'kill -- -"$llm_prepare" 2>/dev/null || true; report_times' EXIT

step "Rust checks: format, lints"
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings

step "MCP test servers: server-everything (npm ci) and the Python mcp SDK (pinned, in a venv)"
./scripts/mcp-test-servers.sh

step "ACP test clients and agents: the official SDKs (npm @agentclientprotocol/sdk, PyPI agent-client-protocol) and the real claude-agent-acp and codex-acp (npm); all pinned"
./scripts/acp-test-clients.sh

step "Runtime tests (no GUI dependency): unit, seed scenarios, providers, tools, server, crash harness"
cargo test

step "Web UI: install, type-check, component tests, build (the desktop shell embeds ui/dist)"
(cd ui && npm ci --no-audit --no-fund && npm run typecheck && npm test && npm run build)

step "Benchmarks build and run once at a tiny size (figures: BENCHMARKS.md)"
cargo bench --profile dev --bench runtime -- --quick

step "OS keyring tier: a real Secret Service (gnome-keyring) in a private D-Bus session"
./scripts/keyring-tier.sh

step "Desktop shell lints (needs WebKitGTK, installed by the e2e step's setup)"
./scripts/setup-system.sh desktop
cargo clippy -p bumblehive-desktop -- -D warnings

step "Packages: the .deb and the AppImage from one release build (target/packages/; the CLI in the release profile, see scripts/package.sh)"
PKG_CLI_PROFILE=release ./scripts/package.sh

step "Install check: the .deb installed into a clean Debian root (debootstrap), its menu entry opens the window, removed again"
INSTALL_CHECK_CHROOT=1 ./scripts/install-check.sh

step "End-to-end: web UI in headless Chromium, desktop window on Xvfb (the release build above)"
E2E_DESKTOP_APP=target/release/bumblehive-desktop ./scripts/e2e.sh

step "UI streaming bench, smoke only (a short run per engine at small sizes; figures: BENCHMARKS.md, scripts/bench-ui.sh)"
node ui/e2e/bench-stream.mjs --smoke --app target/release/bumblehive-desktop

step "Real-model tier: a small real model on 127.0.0.1 (its server prepared in the background since the start; cached in ~/.cache/bumblehive-llm)"
if ! wait "$llm_prepare"; then
  echo "preparing the real model's server failed:" >&2
  tail -40 "$llm_log" >&2
  exit 1
fi
./scripts/real-model-tier.sh
