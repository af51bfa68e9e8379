#!/usr/bin/env bash
# Desktop figures for BENCHMARKS.md: time from process start to the window's map and to the
# first paint of the chat under Xvfb, and the RSS and PSS of each of the app's processes (the
# shell and WebKit's helpers) when idle with a workspace and one session open: a session of
# 2 messages, then one of 300.
# Usage: scripts/bench-desktop.sh [path/to/bumblehive-desktop] [runs]
# (build first: cargo build -p bumblehive-desktop --release --features custom-protocol)
set -euo pipefail
cd "$(dirname "$0")/.."
app=${1:-target/release/bumblehive-desktop}
runs=${2:-5}
[ -x "$app" ] || { echo "no app at $app: build it first" >&2; exit 2; }
convert=/usr/bin/convert   # /usr/local/bin/convert may be a stand-in on these machines

# BENCH_DISPLAY=:N uses a display that is already running (e.g. when other jobs on a shared
# machine stop X servers they did not start); otherwise a fresh Xvfb on a free number.
display=${BENCH_DISPLAY:-}
xvfb=""
if [ -z "$display" ]; then
  for n in $(seq 90 120); do
    [ -e "/tmp/.X11-unix/X$n" ] || [ -e "/tmp/.X$n-lock" ] || { display=":$n"; break; }
  done
  Xvfb "$display" -screen 0 1280x800x24 -nolisten tcp >/dev/null 2>&1 &
  xvfb=$!
fi
tmp=$(mktemp -d)
app_pid=""
cleanup() {
  [ -n "$app_pid" ] && kill "$app_pid" 2>/dev/null || true
  [ -n "$xvfb" ] && kill "$xvfb" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
export DISPLAY=$display
for _ in $(seq 100); do xdpyinfo >/dev/null 2>&1 && break; sleep 0.05; done

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# The app's processes: the shell and its descendants (WebKit's web and network processes).
tree_pids() {
  local pid=$1 child
  echo "$pid"
  for child in $(pgrep -P "$pid" || true); do tree_pids "$child"; done
}

# "name rss pss alone" (KiB) per process kind: the shell, WebKitWebProcess,
# WebKitNetworkProcess (others, e.g. a sandbox helper, under their own name). PSS splits
# shared pages among the processes that map them, so libraries the shell and WebKit's
# helpers share are not counted three times as in RSS. But the kernel's PSS splits them
# with every process on the machine (another WebKitGTK app, someone's e2e run lowers it),
# so "alone" (scripts/pss-alone.py, root only) splits them among the app's own processes:
# the figure the app has on a machine where nothing else maps those libraries.
per_process() {
  local pid comm rss pss pids
  pids=$(tree_pids "$1")
  declare -A alone=()
  if [ "$(id -u)" = 0 ]; then
    while read -r p _ a _; do alone[$p]=$a; done < <(python3 scripts/pss-alone.py $pids 2>/dev/null || true)
  fi
  for pid in $pids; do
    # The program's name from its command line (/proc/PID/comm cuts names at 15 bytes).
    comm=$(tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null | head -1) || continue
    comm=${comm##*/}
    [ "$pid" = "$1" ] && comm=shell
    rss=$(awk '/^Rss:/ {print $2}' "/proc/$pid/smaps_rollup" 2>/dev/null || echo 0)
    pss=$(awk '/^Pss:/ {print $2}' "/proc/$pid/smaps_rollup" 2>/dev/null || echo 0)
    echo "$comm ${rss:-0} ${pss:-0} ${alone[$pid]:-0}"
  done | awk '{r[$1]+=$2; p[$1]+=$3; a[$1]+=$4; R+=$2; P+=$3; A+=$4} END {
    out = sprintf("all %d/%d/%d", R/1024, P/1024, A/1024)
    n = split("shell WebKitWebProcess WebKitNetworkProcess", order, " ")
    for (i = 1; i <= n; i++) if (order[i] in r) { k = order[i]; out = out sprintf(", %s %d/%d/%d", k, r[k]/1024, p[k]/1024, a[k]/1024); delete r[k] }
    for (k in r) out = out sprintf(", %s %d/%d/%d", k, r[k]/1024, p[k]/1024, a[k]/1024)
    print out " MiB RSS/PSS/PSS-alone"
  }'
}

# CPU time (ms, user + system) each process used since it started: unlike the wall-clock
# figures it hardly moves with the machine's other load. "shell 300 web 450 network 75".
cpu_ms() {
  local pid comm tck
  tck=$(getconf CLK_TCK)
  for pid in $(tree_pids "$1"); do
    comm=$(tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null | head -1) || continue
    comm=${comm##*/}
    [ "$pid" = "$1" ] && comm=shell
    comm=${comm#WebKit}; comm=${comm%Process}
    awk -v n="$comm" -v t="$tck" '{printf "%s %d ", tolower(n), ($14 + $15) * 1000 / t}' "/proc/$pid/stat" 2>/dev/null
  done
}

# A stored session of N messages (user and assistant in turn, the assistant's in markdown
# with a list and a code block, as agent answers are), in workspace WS, opened at start
# (the shell's ui-state.json names it as the workspace's last session).
make_session() {
  local data=$1 ws=$2 id=$3 n=$4 dir i
  dir="$data/sessions/$id"
  mkdir -p "$dir"
  printf '{"session_id":"%s","workspace":"%s","title":"Bench","parent_session_id":null,"created_at":"2026-01-01T00:00:00.000Z","updated_at":"2026-01-01T00:00:00.000Z","state":"idle"}' "$id" "$ws" > "$dir/meta.json"
  : > "$dir/messages.jsonl"
  for i in $(seq 1 2 "$n"); do
    if [ "$n" -le 2 ]; then
      printf '{"role":"user","content":"hi","id":"m%d"}\n{"role":"assistant","content":"Hello! How can I help?"}\n' "$i"
    else
      printf '{"role":"user","content":"Question %d: what does src/lib.rs do, and where is the config read?","id":"m%d"}\n' "$i" "$i"
      printf '{"role":"assistant","content":"Answer %d. The **library** owns the runtime:\\n\\n- `config.rs` reads the file\\n- `store.rs` keeps sessions\\n- `service.rs` runs them\\n\\n```rust\\nfn main() {\\n    let config = Config::load(path)?;\\n    println!(\\"{}\\", config.model);\\n}\\n```\\n\\nSee [the docs](https://example.com/docs) for more."}\n' "$i"
    fi
  done >> "$dir/messages.jsonl"
  printf '{"lastWorkspace":"%s","recents":["%s"],"lastSessions":{"%s":"%s"}}' "$ws" "$ws" "$ws" "$id" > "$data/ui-state.json"
}

# Two cases: a session of 2 messages open, and one of 300 messages (issue #19's targets).
for case in 2 300; do
  for run in $(seq "$runs"); do
    ws="$tmp/$case-$run/ws" data="$tmp/$case-$run/data"
    mkdir -p "$ws" "$data"
    ws=$(cd "$ws" && pwd -P)
    echo "hello" > "$ws/readme.txt"
    make_session "$data" "$ws" 0190a0a0-0000-7000-8000-000000000001 "$case"
    start=$(now_ms)
    "$app" --workspace "$ws" --data-dir "$data" --config "$tmp/$case-$run/config.json" >/dev/null 2>&1 &
    app_pid=$!
    # xdotool now and then cannot connect to a busy Xvfb ("Can't open display"): try again
    # (the "mapped" figure of such a run is late by the retry).
    wid=""
    for _ in 1 2 3 4 5; do
      wid=$(xdotool search --sync --onlyvisible --name Bumblehive 2>/dev/null | head -1) || true
      [ -n "$wid" ] && break
      sleep 0.1
    done
    [ -n "$wid" ] || { echo "case $case run $run: no window" >&2; exit 1; }
    mapped=$(now_ms)
    # First paint: the window shows the chat (many colours), not a blank page.
    painted=""
    for _ in $(seq 400); do
      colours=$(import -window "$wid" png:- 2>/dev/null | "$convert" png:- -format %k info: 2>/dev/null || echo 0)
      if [ "${colours:-0}" -gt 20 ]; then painted=$(now_ms); break; fi
    done
    [ -n "$painted" ] || { echo "case $case run $run: never painted" >&2; exit 1; }
    # Idle: let start-up work settle, then read the shell's and WebKit's processes.
    sleep 3
    cpu=$(cpu_ms "$app_pid")
    others=$(( $(pgrep -c -f WebKitWebProcess || true) - $(tree_pids "$app_pid" | xargs -r ps -o args= -p | grep -c WebKitWebProcess || true) ))
    echo "$case messages, run $run: window mapped $((mapped - start)) ms, first paint $((painted - start)) ms, CPU ms ${cpu% }, idle $(per_process "$app_pid")$([ "$others" -gt 0 ] && echo " ($others other WebKit web processes on the machine: PSS below its alone value)")"
    [ "$run" -eq 1 ] && import -window root "$tmp/../bench-desktop-$case.png" 2>/dev/null || true
    kill "$app_pid"; wait "$app_pid" 2>/dev/null || true; app_pid=""
  done
done
