#!/usr/bin/env bash
# Runs the randomized interleaving test (tests/SIMULATION.md) over many seeds:
#   ./scripts/simulate.sh [SEEDS] [STEPS]      e.g. ./scripts/simulate.sh 1..500 200
# SEEDS is a range (FROM..TO, TO excluded) or a comma list; a failure prints its seed
# and every step, and stops the run.
#   KILL_SEEDS=1,2,3,4,5 ./scripts/simulate.sh     also kills a real process with SIGKILL
#                                                   (process mode) for those seeds
set -euo pipefail
cd "$(dirname "$0")/.."
export BUMBLEHIVE_SIM_SEEDS="${1:-1..200}"
export BUMBLEHIVE_SIM_STEPS="${2:-150}"
[ -n "${KILL_SEEDS:-}" ] && export BUMBLEHIVE_SIM_KILL_SEEDS="$KILL_SEEDS"
exec cargo test --release --test tests simulation:: -- --nocapture
