"""A raw MCP stdio server on Python's standard library alone (newline-delimited JSON-RPC),
for behaviours no SDK server shows on purpose. It writes its pid to MARK_DIR/pid (one line
per start, appended) and, per MODE:

- `stall_after_changed`: answers `initialize` and the first `tools/list`, then sends
  `notifications/tools/list_changed` and never answers another `tools/list` (it writes
  MARK_DIR/stalled when that request arrives). Review finding R6.
- `plain`: answers `initialize`, `tools/list` (one tool, `peek`, marked `readOnlyHint`)
  and `tools/call` (`peek` answers with the server's environment variables named in
  the `names` argument, as `NAME=value` lines).
"""

import json
import os
import pathlib
import sys

mode = os.environ.get("MODE", "plain")
marks = pathlib.Path(os.environ.get("MARK_DIR", "."))
with open(marks / "pid", "a") as f:
    f.write(f"{os.getpid()}\n")


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


TOOLS = [
    {
        "name": "peek",
        "description": "Shows the values of the environment variables named in `names`.",
        "inputSchema": {
            "type": "object",
            "properties": {"names": {"type": "array", "items": {"type": "string"}}},
        },
        "annotations": {"readOnlyHint": True},
    }
]

lists = 0
for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    request = json.loads(line)
    method = request.get("method")
    ident = request.get("id")
    if method == "initialize":
        send(
            {
                "jsonrpc": "2.0",
                "id": ident,
                "result": {
                    "protocolVersion": request["params"]["protocolVersion"],
                    "capabilities": {"tools": {"listChanged": True}},
                    "serverInfo": {"name": "raw-" + mode, "version": "1"},
                },
            }
        )
    elif method == "tools/list":
        lists += 1
        if mode == "stall_after_changed" and lists > 1:
            # Busy or wedged: the request is never answered.
            (marks / "stalled").write_text("stalled")
            continue
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": TOOLS}})
        if mode == "stall_after_changed":
            send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
    elif method == "tools/call":
        names = request["params"].get("arguments", {}).get("names", [])
        text = "\n".join(f"{n}={os.environ.get(n, '<unset>')}" for n in names)
        send(
            {
                "jsonrpc": "2.0",
                "id": ident,
                "result": {"content": [{"type": "text", "text": text}]},
            }
        )
    elif ident is not None:
        send(
            {
                "jsonrpc": "2.0",
                "id": ident,
                "error": {"code": -32601, "message": f"no method {method}"},
            }
        )
