#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine and starts the Bumblehive desktop app.
# Arguments are passed to the app, e.g. --workspace DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup-system.sh desktop
(cd ui && npm ci --no-audit --no-fund && npm run build)
cargo build -p bumblehive-desktop --release --features custom-protocol
exec ./target/release/bumblehive-desktop "$@"
