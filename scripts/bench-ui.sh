#!/usr/bin/env bash
# Streaming into the UI and opening a long session (#19), in the real desktop window (Tauri
# on Xvfb via tauri-driver) and in headless Chromium (`bumblehive serve`): builds the UI, the
# bumblehive binary and the desktop app, then runs ui/e2e/bench-stream.mjs (see its header
# for what is measured and how). Figures: BENCHMARKS.md.
#
#   scripts/bench-ui.sh [bench-stream.mjs options]    e.g. --runs 3 --engine both
#   BENCH_NO_BUILD=1 scripts/bench-ui.sh …            use what is built
#
# Needs what scripts/e2e.sh installs (Xvfb, WebKitWebDriver, tauri-driver, Chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
if [ -z "${BENCH_NO_BUILD:-}" ]; then
  if [ ! -f ui/node_modules/.package-lock.json ] || [ ui/package-lock.json -nt ui/node_modules/.package-lock.json ]; then
    (cd ui && npm ci --no-audit --no-fund)
  fi
  # The desktop app embeds ui/dist when it is compiled: the UI first.
  (cd ui && npm run build)
  cargo build --bin bumblehive
  cargo build -p bumblehive-desktop
fi
exec node ui/e2e/bench-stream.mjs "$@"
