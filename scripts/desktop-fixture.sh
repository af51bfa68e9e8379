# Sourced by scripts/bench-desktop.sh and scripts/startup-order.sh: the display the app is
# started on and the stored session it opens, so that both start it the same way.

# A fresh Xvfb on a free display number: sets $display and $xvfb (its pid).
start_xvfb() {
  local n
  display=""
  for n in $(seq 90 120); do
    [ -e "/tmp/.X11-unix/X$n" ] || [ -e "/tmp/.X$n-lock" ] || { display=":$n"; break; }
  done
  [ -n "$display" ] || { echo "no free X display number in :90-:120" >&2; return 1; }
  Xvfb "$display" -screen 0 1280x800x24 -nolisten tcp >/dev/null 2>&1 &
  xvfb=$!
}

# Exports DISPLAY=$display and waits (up to 5 s) for the X server to answer.
wait_for_display() {
  export DISPLAY=$display
  for _ in $(seq 100); do xdpyinfo >/dev/null 2>&1 && break; sleep 0.05; done
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

