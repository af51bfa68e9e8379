#!/usr/bin/env bash
# Desktop figures for BENCHMARKS.md: time from process start to the window's map and to the
# first paint of the chat under Xvfb, and the RSS of all the app's processes (the shell and
# WebKit's helpers) when idle with a workspace and one session open.
# Usage: scripts/bench-desktop.sh [path/to/bumblehive-desktop] [runs]
# (build first: cargo build -p bumblehive-desktop --release --features custom-protocol)
set -euo pipefail
cd "$(dirname "$0")/.."
app=${1:-target/release/bumblehive-desktop}
runs=${2:-5}
[ -x "$app" ] || { echo "no app at $app: build it first" >&2; exit 2; }
convert=/usr/bin/convert   # /usr/local/bin/convert may be a stand-in on these machines

display=""
for n in $(seq 90 120); do
  [ -e "/tmp/.X11-unix/X$n" ] || [ -e "/tmp/.X$n-lock" ] || { display=":$n"; break; }
done
Xvfb "$display" -screen 0 1280x800x24 -nolisten tcp >/dev/null 2>&1 &
xvfb=$!
tmp=$(mktemp -d)
app_pid=""
cleanup() {
  [ -n "$app_pid" ] && kill "$app_pid" 2>/dev/null || true
  kill "$xvfb" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
export DISPLAY=$display
for _ in $(seq 100); do xdpyinfo >/dev/null 2>&1 && break; sleep 0.05; done

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# The RSS (KiB) of a process and all its descendants.
tree_rss() {
  local pid=$1 total=0 child rss
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
  total=$((total + ${rss:-0}))
  for child in $(pgrep -P "$pid" || true); do
    total=$((total + $(tree_rss "$child")))
  done
  echo "$total"
}

# The PSS (KiB): shared pages split among the processes that map them, so libraries the
# shell and WebKit's helpers share are not counted three times as in RSS.
tree_pss() {
  local pid=$1 total=0 child pss
  pss=$(awk '/^Pss:/ {print $2}' "/proc/$pid/smaps_rollup" 2>/dev/null || echo 0)
  total=$((total + ${pss:-0}))
  for child in $(pgrep -P "$pid" || true); do
    total=$((total + $(tree_pss "$child")))
  done
  echo "$total"
}

for run in $(seq "$runs"); do
  mkdir -p "$tmp/$run/ws" "$tmp/$run/data/sessions/0190a0a0-0000-7000-8000-000000000001"
  echo "hello" > "$tmp/$run/ws/readme.txt"
  # One stored session in this workspace, so the sidebar has something to show.
  session="$tmp/$run/data/sessions/0190a0a0-0000-7000-8000-000000000001"
  printf '{"session_id":"0190a0a0-0000-7000-8000-000000000001","workspace":"%s","title":"Bench","parent_session_id":null,"created_at":"2026-01-01T00:00:00.000Z","updated_at":"2026-01-01T00:00:00.000Z","state":"idle"}' "$tmp/$run/ws" > "$session/meta.json"
  printf '{"role":"user","content":"hi","id":"m1"}\n{"role":"assistant","content":"Hello! How can I help?"}\n' > "$session/messages.jsonl"
  start=$(now_ms)
  "$app" --workspace "$tmp/$run/ws" --data-dir "$tmp/$run/data" --config "$tmp/$run/config.json" >/dev/null 2>&1 &
  app_pid=$!
  wid=$(xdotool search --sync --onlyvisible --name Bumblehive | head -1)
  mapped=$(now_ms)
  # First paint: the window shows the chat (many colours), not a blank page.
  painted=""
  for _ in $(seq 400); do
    colours=$(import -window "$wid" png:- 2>/dev/null | "$convert" png:- -format %k info: 2>/dev/null || echo 0)
    if [ "${colours:-0}" -gt 20 ]; then painted=$(now_ms); break; fi
  done
  [ -n "$painted" ] || { echo "run $run: never painted" >&2; exit 1; }
  # Idle: let start-up work settle, then sum the shell's and WebKit's processes.
  sleep 3
  rss=$(tree_rss "$app_pid")
  pss=$(tree_pss "$app_pid")
  echo "run $run: window mapped $((mapped - start)) ms, first paint $((painted - start)) ms, idle RSS $((rss / 1024)) MiB, PSS $((pss / 1024)) MiB (all processes)"
  [ "$run" -eq 1 ] && import -window root "$tmp/../bench-desktop.png" 2>/dev/null || true
  kill "$app_pid"; wait "$app_pid" 2>/dev/null || true; app_pid=""
done
