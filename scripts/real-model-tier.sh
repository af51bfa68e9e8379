#!/usr/bin/env bash
# The real-model test tier: starts a small real model behind an OpenAI-compatible API
# (../shared/tools/local-llm/start.sh, beside this repository), runs the `real_model_`
# tests against it, and stops the server by its pid when this script exits.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
shared=${BUMBLEHIVE_SHARED_DIR:-$repo/../shared}
export LLM_DIR=${LLM_DIR:-$HOME/.cache/llm-test-server}
export LLM_PORT=${LLM_PORT:-8089}

# start.sh polls the server's health with curl; everything else it needs comes from PyPI.
command -v curl >/dev/null || { apt-get update -qq && apt-get install -y -qq curl; }

pid=""
stop_server() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
}
trap stop_server EXIT

# The pid file is stale from any earlier run until start.sh rewrites it.
rm -f "$LLM_DIR/server.pid"
bash "$shared/tools/local-llm/start.sh"
pid=$(cat "$LLM_DIR/server.pid")

export BUMBLEHIVE_REAL_MODEL_URL="http://127.0.0.1:$LLM_PORT/v1"
# One test at a time: the server runs one request slot (-np 1) on two cores.
cargo test --test tests real_model_ -- --test-threads=1 --nocapture
