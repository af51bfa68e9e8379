#!/usr/bin/env bash
# Writes src-tauri/startup-order.txt: the functions of the desktop binary that run while it
# starts and paints a session, for the linker to place together (issue #31).
#
# Why: the kernel maps a program's code 64 KiB around each page it faults in ("fault-around"),
# so the ≈ 2,500 functions run at start, spread over 22 MB of text, kept 15 MiB of the
# binary resident in the shell. Placed side by side (lld's --symbol-ordering-file, passed by
# src-tauri/build.rs to release builds) they keep 6-8 (BENCHMARKS.md, "The shell's code
# placed by use").
#
# How: the release build is dropped from the page cache, its disk's read-ahead set to 0 for
# the moment, and it is started under Xvfb with a 2-message session open, as
# scripts/bench-desktop.sh does. After 6 s the file's pages in the page cache are exactly the
# pages it read (mincore); the functions on the text pages among them are the candidates.
# Rounds of relinking and starting again narrow them down to the functions that ran (below).
#
# Usage (root: the read-ahead setting; Xvfb): scripts/startup-order.sh
# It builds and relinks ${CARGO_TARGET_DIR:-target}/release/bumblehive-desktop (about a minute
# per link; seven links) and leaves it built with the new list. The list goes stale slowly as
# the code changes (names it holds that are gone are skipped, new functions go where the
# linker puts them anyway); run it again after large changes.
set -euo pipefail
cd "$(dirname "$0")/.."
out=src-tauri/startup-order.txt
# The build the packages ship (scripts/package.sh): the desktop and the CLI in one
# invocation. Its features, and with them the hashes in many generic functions' names,
# differ from the desktop built alone, and a function the list misses costs 64 KiB.
build() {
  cargo build --release -p bumblehive-desktop -p bumblehive --features bumblehive-desktop/custom-protocol \
    --bin bumblehive-desktop --bin bumblehive
}
[ -d ui/dist ] || (cd ui && npm run build >/dev/null)
build
bin=$(realpath "${CARGO_TARGET_DIR:-target}/release/bumblehive-desktop")
[ "$(id -u)" = 0 ] || { echo "run as root: the disk's read-ahead is set to 0 while the binary starts" >&2; exit 2; }
command -v Xvfb >/dev/null || { echo "Xvfb is needed (scripts/setup-system.sh e2e)" >&2; exit 2; }

# The block device's read-ahead knob (a partition's is its disk's).
dev=$(stat -c '%d' "$bin")
sys=/sys/dev/block/$((dev >> 8)):$((dev & 255))
knob=$sys/bdi/read_ahead_kb
[ -e "$knob" ] || knob=$sys/../bdi/read_ahead_kb
[ -w "$knob" ] || { echo "cannot set the read-ahead of the disk holding $bin ($knob)" >&2; exit 2; }
old=$(cat "$knob")

tmp=$(mktemp -d)
xvfb="" app=""
cleanup() {
  echo "$old" > "$knob"
  [ -n "$app" ] && kill "$app" 2>/dev/null || true
  [ -n "$xvfb" ] && kill "$xvfb" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
# shellcheck source=scripts/desktop-fixture.sh
. scripts/desktop-fixture.sh
start_xvfb
wait_for_display

# A workspace with a 2-message session open at start, as the bench has.
ws=$tmp/ws data=$tmp/data
mkdir -p "$ws"
make_session "$data" "$ws" 0190a0a0-0000-7000-8000-000000000001 2

helper=scripts/startup-order.py
# One cold start of the build at $bin: its pages read in its first 6 s.
cold_start() {
  python3 "$helper" evict "$bin"
  echo 0 > "$knob"
  "$bin" --workspace "$ws" --data-dir "$data" --config "$tmp/config.json" >/dev/null 2>&1 &
  app=$!
  sleep 6
  kill -0 "$app" 2>/dev/null || { echo "the app ended before it was read" >&2; exit 1; }
  python3 "$helper" touched "$bin" "$@"
  kill "$app"; wait "$app" 2>/dev/null || true; app=""
  echo "$old" > "$knob"
}
relink() {
  build 2>&1 | tail -1
}

# A page holds a dozen functions, of which one in seven or so runs at start: the functions
# on the pages read (round 0) are four times what runs. So each later round links the
# candidates in groups of G, each group between blocks of 4 KiB of functions that are not
# candidates, starts cold again, and keeps the candidates whose group's pages were read.
cold_start "$tmp/list0"
prev=$tmp/list0
round=0
for group in 5 2 1; do
  round=$((round + 1))
  python3 "$helper" interleave "$bin" "$prev" "$group" "$out"
  relink
  cold_start "$tmp/list$round" "$prev"
  prev=$tmp/list$round
done
# A function that ran in the first start but not in a later one (timing) was dropped by
# then, and one left out costs 64 KiB of fault-around wherever it lies: two starts of the
# build with the list add what ran outside it.
cp "$prev" "$out"
for extra in 1 2; do
  relink
  cold_start "$tmp/seen$extra"
  python3 "$helper" union "$out" "$tmp/seen$extra" "$out"
done
relink
echo "$out written; the release build at $bin places these functions together"
