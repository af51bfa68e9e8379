#!/usr/bin/env bash
# End-to-end tests: the web UI in headless Chromium against `bumblehive serve`, and the real
# desktop window (Tauri, on Xvfb) through tauri-driver + WebKitWebDriver, both against a
# scripted OpenAI-compatible model server (ui/e2e/mock-model.mjs).
# Installs what is missing, builds, runs both, stops everything it started; exit 0 = green.
# Screenshots and logs: test-output/e2e-browser/ and test-output/e2e-desktop/.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    # Each test runs in its own process group (setsid): stop the group, then make sure.
    kill -TERM -- "-$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step "System packages (only those missing)"
./scripts/setup-system.sh desktop e2e

export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v tauri-driver >/dev/null 2>&1; then
  step "tauri-driver"
  cargo install tauri-driver --locked
fi

step "MCP test servers (the MCP step runs the Python SDK's small server)"
./scripts/mcp-test-servers.sh

step "UI dependencies and build"
# npm ci only when node_modules does not match the lock file.
if [ ! -f ui/node_modules/.package-lock.json ] || [ ui/package-lock.json -nt ui/node_modules/.package-lock.json ]; then
  (cd ui && npm ci --no-audit --no-fund)
fi
# The desktop app embeds ui/dist when it is compiled: build the UI first.
(cd ui && npm run build)

step "Rust builds: the bumblehive binary and the desktop app"
cargo build --bin bumblehive
# E2E_DESKTOP_APP names a desktop binary already built (test-all.sh passes the release
# build that scripts/package.sh made): no second build of the desktop crate.
if [ -n "${E2E_DESKTOP_APP:-}" ]; then
  E2E_DESKTOP_APP=$(realpath "$E2E_DESKTOP_APP")
  [ -x "$E2E_DESKTOP_APP" ] || { echo "E2E_DESKTOP_APP=$E2E_DESKTOP_APP is not an executable" >&2; exit 1; }
  export E2E_DESKTOP_APP
else
  cargo build -p bumblehive-desktop
fi

export E2E_NO_BUILD=1
status=0
run_test() {
  local name=$1 script=$2 pid rc
  step "$name"
  setsid node "$script" &
  pid=$!
  pids+=("$pid")
  rc=0
  wait "$pid" || rc=$?
  [ "$rc" -eq 0 ] || { echo "$name: FAILED ($rc)"; status=1; }
}
run_test "Browser e2e (headless Chromium + bumblehive serve)" ui/e2e/browser.mjs
run_test "Desktop e2e (Tauri window on Xvfb, tauri-driver)" ui/e2e/desktop.mjs

if [ "$status" -eq 0 ]; then
  echo; echo "e2e: all green (screenshots in test-output/)"
else
  echo; echo "e2e: FAILED (screenshots and logs in test-output/)"
fi
exit "$status"
