#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine for Bumblehive's tests and runs every test.
# Each step installs only what is missing, so a second run is fast.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "Rust checks: format, lints"
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings

step "Runtime tests (no GUI dependency)"
cargo test
