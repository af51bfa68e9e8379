#!/usr/bin/env bash
# Desktop figures for BENCHMARKS.md: time from process start to the window's map and to the
# first paint of the chat under Xvfb, and the RSS and PSS of each of the app's processes (the
# shell and WebKit's helpers) when idle with a workspace and one session open: a session of
# 2 messages, then one of 300.
# Usage: scripts/bench-desktop.sh [path/to/bumblehive-desktop] [runs]
# (build first: cargo build -p bumblehive-desktop --release --features custom-protocol)
#
#        scripts/bench-desktop.sh --floor [runs]
# Against the floor (issue #31): builds (when needed, in one cargo invocation, so Tauri and
# WebKit's bindings compile once) and starts benches/floor-app, an empty Tauri 2 window built
# and started the way ours is, and ours with 2 and with 300 messages, interleaved (each round
# in a rotated order, so drift in the machine's load falls on all three alike); then the
# medians of each and the ratios ours/floor. Uses $CARGO_TARGET_DIR like cargo.
# BENCH_NO_BUILD=1 takes the binaries as they are; BENCH_APP=path/to/a/copy measures
# that build of ours (so the next one can be built meanwhile). BENCH_BEFORE="NAME=PATH ..."
# adds older builds of ours, each with 2 and 300 messages (kinds NAME-2, NAME-300; a bare
# PATH is named "before"), to every round, so a change is measured against its
# predecessors under the same load. BENCH_IDLE_S=N reads memory and CPU N s after the paint
# (default 3). BENCH_QUIET_S=M then waits M s more and gives the CPU each process used in
# those M s, per second ("quiet ms/s": what an idle window costs, e.g. a blinking caret).
set -euo pipefail
cd "$(dirname "$0")/.."
floor_mode=""
if [ "${1:-}" = --floor ]; then
  floor_mode=1
  target=${CARGO_TARGET_DIR:-target}
  app=${BENCH_APP:-$target/release/bumblehive-desktop}
  floor_app=$target/release/bumblehive-floor
  runs=${2:-5}
  if [ -z "${BENCH_NO_BUILD:-}" ]; then
    # The desktop embeds ui/dist: build it when missing or older than the UI's sources.
    if [ ! -f ui/dist/index.html ] || [ -n "$(find ui/src ui/index.html -newer ui/dist/index.html | head -1)" ]; then
      (cd ui && npm run build >/dev/null)
    fi
    cargo build --release -p bumblehive-desktop -p bumblehive-floor \
      --features bumblehive-desktop/custom-protocol,bumblehive-floor/custom-protocol
  fi
  [ -x "$floor_app" ] || { echo "no floor app at $floor_app" >&2; exit 2; }
else
  app=${1:-target/release/bumblehive-desktop}
  runs=${2:-5}
fi
[ -x "$app" ] || { echo "no app at $app: build it first" >&2; exit 2; }
convert=/usr/bin/convert   # /usr/local/bin/convert may be a stand-in on these machines
declare -A before=()
for entry in ${BENCH_BEFORE:-}; do
  case $entry in *=*) before[${entry%%=*}]=${entry#*=} ;; *) before[before]=$entry ;; esac
done
for name in "${!before[@]}"; do
  [ -x "${before[$name]}" ] || { echo "no build at BENCH_BEFORE $name=${before[$name]}" >&2; exit 2; }
done

# BENCH_DISPLAY=:N uses a display that is already running (e.g. when other jobs on a shared
# machine stop X servers they did not start); otherwise a fresh Xvfb on a free number.
# shellcheck source=scripts/desktop-fixture.sh
. scripts/desktop-fixture.sh
display=${BENCH_DISPLAY:-}
xvfb=""
[ -n "$display" ] || start_xvfb
tmp=$(mktemp -d)
app_pid=""
# The window's map and first paint as the X server reports them (scripts/paint-wait.c,
# known to a few ms); without a C compiler or the X headers, the former xdotool search
# (it looks every 0.5 s) and loop of `import` (one look every ≈ 0.3 s on a loaded machine).
paint_wait=""
if cc -O2 -o "$tmp/paint-wait" scripts/paint-wait.c -lX11 -lXdamage 2>/dev/null; then
  paint_wait=$tmp/paint-wait
fi
cleanup() {
  [ -n "$app_pid" ] && kill "$app_pid" 2>/dev/null || true
  [ -n "$xvfb" ] && kill "$xvfb" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
wait_for_display

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
  done | tee -a "$record_mem" | awk '{r[$1]+=$2; p[$1]+=$3; a[$1]+=$4; R+=$2; P+=$3; A+=$4} END {
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

# One start of a program (the rest of the arguments) whose window is titled NAME: the
# time to its window's map and first paint, and then, idle, the CPU each process used and
# the memory of each. Prints one line starting with LABEL; the raw figures go to $records
# (one line: label mapped painted, then "kind cpu_ms" and "kind rss pss alone" per process).
measure() {
  local label=$1 name=$2 start wid mapped painted colours cpu others paint_pid=""
  shift 2
  record_mem=$(mktemp -p "$tmp")
  start=$(now_ms)
  "$@" >/dev/null 2>&1 &
  app_pid=$!
  mapped="" painted="" settled=""
  # First paint: the window shows the chat (many colours), not a blank page. The floor's
  # one line of anti-aliased text passes the same test (its glyph edges alone are > 20
  # colours), so both apps are timed by one rule.
  if [ -n "$paint_wait" ]; then
    # Its lines: the window mapped, its first paint (each the moment it saw, so how soon
    # this loop looks does not matter), and, while the idle wait below runs, when the
    # window last changed before a quiet second (the chat shown).
    : > "$tmp/paint"
    "$paint_wait" "$app_pid" 120000 10000 > "$tmp/paint" &
    paint_pid=$!
    while kill -0 "$paint_pid" 2>/dev/null && [ "$(wc -l < "$tmp/paint")" -lt 2 ]; do sleep 0.02; done
    mapped=$(sed -n 1p "$tmp/paint")
    painted=$(sed -n 2p "$tmp/paint")
    [ -n "$mapped" ] || { echo "$label: no window" >&2; exit 1; }
  else
    # xdotool now and then cannot connect to a busy Xvfb ("Can't open display"): try
    # again (the "mapped" figure of such a run is late by the retry).
    wid=""
    for _ in 1 2 3 4 5; do
      wid=$(xdotool search --sync --onlyvisible --pid "$app_pid" --name "$name" 2>/dev/null | head -1) || true
      [ -n "$wid" ] && break
      sleep 0.1
    done
    [ -n "$wid" ] || { echo "$label: no window" >&2; exit 1; }
    mapped=$(now_ms)
    for _ in $(seq 400); do
      colours=$(import -window "$wid" png:- 2>/dev/null | "$convert" png:- -format %k info: 2>/dev/null || echo 0)
      if [ "${colours:-0}" -gt 20 ]; then painted=$(now_ms); break; fi
    done
  fi
  [ -n "$painted" ] || { echo "$label: never painted" >&2; exit 1; }
  # Idle: let start-up work settle, then read the shell's and WebKit's processes (3 s after
  # the first paint, or once the window is quiet if that is later). BENCH_IDLE_S=20 reads
  # later, once JavaScriptCore has collected the start-up's garbage by itself (5-15 s).
  sleep "${BENCH_IDLE_S:-3}"
  if [ -n "$paint_pid" ]; then
    wait "$paint_pid" 2>/dev/null || true
    settled=$(sed -n 3p "$tmp/paint")
  fi
  settled=${settled:-$painted}
  cpu=$(cpu_ms "$app_pid")
  others=$(( $(pgrep -c -f WebKitWebProcess || true) - $(tree_pids "$app_pid" | xargs -r ps -o args= -p | grep -c WebKitWebProcess || true) ))
  echo "$label: window mapped $((mapped - start)) ms, first paint $((painted - start)) ms, quiet after $((settled - start)) ms, CPU ms ${cpu% }, idle $(per_process "$app_pid")$([ "$others" -gt 0 ] && echo " ($others other WebKit web processes on the machine: PSS below its alone value)")"
  local quiet=""
  if [ -n "${BENCH_QUIET_S:-}" ]; then
    # The CPU of the quiet span, per process and second (ticks are 10 ms: 20 s or more).
    local before_quiet
    before_quiet=$(cpu_ms "$app_pid")
    sleep "$BENCH_QUIET_S"
    quiet=$(paste -d' ' <(echo "$before_quiet" | tr ' ' '\n' | sed '/^$/d' | paste - -) \
      <(cpu_ms "$app_pid" | tr ' ' '\n' | sed '/^$/d' | paste - -) |
      awk -v s="$BENCH_QUIET_S" '{printf "%s %.1f ", $1, ($4 - $2) / s}')
    echo "$label: quiet for ${BENCH_QUIET_S} s after that: ms/s ${quiet% }"
    quiet="quiet ${quiet% }"
  fi
  echo "$label $((mapped - start)) $((painted - start)) $((settled - start)) cpu ${cpu% } mem $(tr '\n' ' ' < "$record_mem") $quiet" >> "$records"
  kill "$app_pid"; wait "$app_pid" 2>/dev/null || true; app_pid=""
}

# Starts ours (or the build BIN) with a stored session of CASE messages open, in fresh
# folders for run RUN.
measure_ours() {
  local case=$1 run=$2 label=$3 bin=${4:-$app} ws data
  ws="$tmp/$case-$run/ws" data="$tmp/$case-$run/data"
  mkdir -p "$ws" "$data"
  ws=$(cd "$ws" && pwd -P)
  echo "hello" > "$ws/readme.txt"
  make_session "$data" "$ws" 0190a0a0-0000-7000-8000-000000000001 "$case"
  measure "$label" Bumblehive "$bin" --workspace "$ws" --data-dir "$data" --config "$tmp/$case-$run/config.json"
}

records="$tmp/records"
: > "$records"

if [ -z "$floor_mode" ]; then
  # Two cases: a session of 2 messages open, and one of 300 messages (issue #19's targets).
  for case in 2 300; do
    for run in $(seq "$runs"); do
      measure_ours "$case" "$run" "$case messages, run $run"
      [ "$run" -eq 1 ] && import -window root "$tmp/../bench-desktop-$case.png" 2>/dev/null || true
    done
  done
  exit 0
fi

echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
[ -n "$paint_wait" ] && echo "first paint: X damage events (scripts/paint-wait.c)" || echo "first paint: polling with import (no C compiler or X headers)"
kinds=(floor ours-2 ours-300)
for name in ${BENCH_BEFORE:-}; do
  case $name in *=*) name=${name%%=*} ;; *) name=before ;; esac
  kinds+=("$name-2" "$name-300")
done
for run in $(seq "$runs"); do
  for i in "${!kinds[@]}"; do
    kind=${kinds[$(( (i + run - 1) % ${#kinds[@]} ))]}
    case $kind in
      floor) measure "floor run $run" "Floor app" "$floor_app" ;;
      ours-2) measure_ours 2 "$run" "ours-2 run $run" ;;
      ours-300) measure_ours 300 "$run" "ours-300 run $run" ;;
      *-2) measure_ours 2 "$kind-$run" "$kind run $run" "${before[${kind%-2}]}" ;;
      *-300) measure_ours 300 "$kind-$run" "$kind run $run" "${before[${kind%-300}]}" ;;
    esac
  done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$records" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    kind = f[0]
    cpu_at, mem_at = f.index("cpu"), f.index("mem")
    # Labels are "<kind> run <n>"; the figures follow.
    mapped, painted, settled = int(f[3]), int(f[4]), int(f[5])
    r = {"mapped ms": mapped, "first paint ms": painted, "quiet after ms": settled}
    cpu = f[cpu_at + 1:mem_at]
    total = 0
    for name, ms in zip(cpu[::2], cpu[1::2]):
        r[f"CPU ms {name}"] = r.get(f"CPU ms {name}", 0) + int(ms)
        total += int(ms)
    r["CPU ms all"] = total
    quiet_at = f.index("quiet") if "quiet" in f else len(f)
    mem = f[mem_at + 1:quiet_at]
    quiet = f[quiet_at + 1:]
    for name, rate in zip(quiet[::2], quiet[1::2]):
        r[f"quiet ms/s {name}"] = float(rate)
    for k in ("RSS", "PSS", "PSS-alone"):
        r[f"{k} MiB all"] = 0
    for i in range(0, len(mem), 4):
        comm, rss, pss, alone = mem[i], int(mem[i + 1]), int(mem[i + 2]), int(mem[i + 3])
        short = {"WebKitWebProcess": "web", "WebKitNetworkProcess": "network"}.get(comm, comm)
        for k, v in (("RSS", rss), ("PSS", pss), ("PSS-alone", alone)):
            r[f"{k} MiB all"] += v / 1024
            r[f"{k} MiB {short}"] = r.get(f"{k} MiB {short}", 0) + v / 1024
    rows.setdefault(kind, []).append(r)
keys = list(dict.fromkeys(k for rs in rows.values() for r in rs for k in r))
med = {kind: {k: statistics.median([r[k] for r in rs if k in r]) for k in keys if any(k in r for r in rs)} for kind, rs in rows.items()}
n = {kind: len(rs) for kind, rs in rows.items()}
print(f"\nmedians ({', '.join(f'{k} n={v}' for k, v in n.items())}) and ratios of the medians to the floor's")
kinds = sorted(med, key=lambda k: (k != "floor", k.split("-")[0] != "ours", k.endswith("-300"), k))
print(f"{'figure':24s} " + " ".join(f"{k:>10s}" for k in kinds) + " " + " ".join(f"{k + '/fl':>12s}" for k in kinds[1:]))
for k in keys:
    fl = med.get("floor", {}).get(k)
    vals = [med.get(kind, {}).get(k) for kind in kinds]
    cells = [(f"{v:10.1f}" if k.startswith("quiet") else f"{v:10.0f}") if v is not None else f"{'-':>10s}" for v in vals]
    ratios = [f"{v / fl:11.2f}x" if v is not None and fl else f"{'-':>12s}" for v in vals[1:]]
    print(f"{k:24s} " + " ".join(cells) + " " + " ".join(ratios))
print("targets (issue #31): ours-2 <= 1.15x the floor on first paint and PSS; ours-300 <= 1.3x on PSS")
PY
