#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine for Bumblehive's tests and runs every test:
# Rust checks and tests, the web UI's tests, a benchmark smoke run, the real-model tier,
# and the end-to-end tests in headless Chromium and in the real desktop window.
# Each step installs only what is missing, so a second run is fast.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "System packages (only those missing)"
./scripts/setup-system.sh
export PATH="$HOME/.cargo/bin:$PATH"

step "Rust checks: format, lints"
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings

step "Runtime tests (no GUI dependency): unit, seed scenarios, providers, tools, server, crash harness"
cargo test

step "Web UI: install, type-check, component tests, build (the desktop shell embeds ui/dist)"
(cd ui && npm ci --no-audit --no-fund && npm run typecheck && npm test && npm run build)

step "Benchmarks build and run once at a tiny size (figures: BENCHMARKS.md)"
cargo bench --profile dev --bench runtime -- --quick

step "Real-model tier: a small real model on 127.0.0.1 (built once, about 10 min; cached in ~/.cache/llm-test-server)"
./scripts/real-model-tier.sh

step "OS keyring tier: a real Secret Service (gnome-keyring) in a private D-Bus session"
./scripts/keyring-tier.sh

step "Desktop shell lints (needs WebKitGTK, installed by the e2e step's setup)"
./scripts/setup-system.sh desktop
cargo clippy -p bumblehive-desktop -- -D warnings

step "End-to-end: web UI in headless Chromium, desktop window on Xvfb"
./scripts/e2e.sh
