"""An ACP client on the official Python SDK (PyPI agent-client-protocol, pinned in
requirements.txt) driving `bumblehive acp`; tests/acp.rs runs it against a scripted model.

It runs the scenario both ACP test clients run (tests/acp.rs says what is checked) and prints what it
saw as JSON lines on stdout: {"ev": "prompt_ended", "name": ...} as each prompt ends (the
Rust side releases the sub-agents on "delegate"), then one {"ev": "facts", ...} with every
update, permission request and answer. The Rust test asserts on those and on the files.

Usage: client.py BUMBLEHIVE CONFIG DATA_DIR WORKSPACE
"""

import asyncio
import json
import sys

import acp
from acp import text_block
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    DeniedOutcome,
    Implementation,
    RequestPermissionResponse,
)

WAIT = 30.0


def emit(obj):
    print(json.dumps(obj), flush=True)


def dump(model):
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


class Recorder:
    """The client side: records every update, answers permissions by path."""

    def __init__(self):
        self.phase = "init"
        self.updates = []
        self.permissions = []
        self.changed = asyncio.Event()

    def text_since(self, start, session_id):
        return "".join(
            u["update"].get("content", {}).get("text", "")
            for u in self.updates[start:]
            if u["session"] == session_id and u["update"].get("sessionUpdate") == "agent_message_chunk"
        )

    async def request_permission(self, session_id, tool_call, options, **kwargs):
        call = dump(tool_call)
        path = (call.get("rawInput") or {}).get("path")
        # a.txt is allowed, b.txt rejected: both answers of the scenario.
        wanted = "reject_once" if path == "b.txt" else "allow_once"
        option = next((o for o in options if o.kind == wanted), None)
        self.permissions.append(
            {
                "phase": self.phase,
                "session": session_id,
                "toolCall": call,
                "options": [dump(o) for o in options],
                "answer": wanted,
            }
        )
        self.changed.set()
        if option is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=option.option_id)
        )

    async def session_update(self, session_id, update, **kwargs):
        self.updates.append({"phase": self.phase, "session": session_id, "update": dump(update)})
        self.changed.set()

    async def wait_for(self, predicate):
        async def loop():
            while not predicate():
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(loop(), WAIT)


async def prompt(conn, rec, session_id, name, text):
    rec.phase = name
    response = await asyncio.wait_for(conn.prompt(session_id=session_id, prompt=[text_block(text)]), WAIT)
    emit({"ev": "prompt_ended", "name": name, "stopReason": response.stop_reason})
    return response.stop_reason


async def main():
    binary, config, data_dir, workspace = sys.argv[1:5]
    args = ["--config", config, "--data-dir", data_dir, "acp"]
    facts = {}
    rec = Recorder()
    async with acp.spawn_agent_process(rec, binary, *args) as (conn, process):
        init = await conn.initialize(
            protocol_version=acp.PROTOCOL_VERSION,
            client_capabilities=ClientCapabilities(),
            client_info=Implementation(name="python-sdk-test", version="0.12.1"),
        )
        facts["initialize"] = dump(init)
        try:
            await conn.new_session(cwd="/", mcp_servers=[])
            facts["refused"] = None
        except acp.RequestError as err:
            facts["refused"] = str(err) + " " + json.dumps(getattr(err, "data", None))
        session = await conn.new_session(cwd=workspace, mcp_servers=[])
        sid = session.session_id
        facts["session"] = sid
        stops = {}
        for name, text in [("read", "read hello"), ("write_allow", "write a"), ("write_reject", "write b"), ("plan", "plan")]:
            stops[name] = await prompt(conn, rec, sid, name, text)

        # A run that fails answers the prompt with a JSON-RPC error.
        rec.phase = "fail"
        try:
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block("fail")]), WAIT)
            facts["failed"] = None
        except acp.RequestError as err:
            facts["failed"] = {"code": err.code, "message": str(err), "data": err.data}

        # Stop while the model streams: cancel once the first words arrived.
        start = len(rec.updates)
        hang = asyncio.create_task(prompt(conn, rec, sid, "cancel", "hang"))
        await rec.wait_for(lambda: "partial" in rec.text_since(start, sid))
        await conn.cancel(session_id=sid)
        stops["cancel"] = await hang

        # Two sub-agents; their reports arrive after the prompt ended (the Rust side
        # holds them until it reads prompt_ended) and wake the session.
        stops["delegate"] = await prompt(conn, rec, sid, "delegate", "delegate")
        rec.phase = "after"
        after = len(rec.updates)
        await rec.wait_for(
            lambda: all(t in rec.text_since(after, sid) for t in ("alpha_done_seen", "beta_done_seen"))
        )
        facts["stops"] = stops
    # A second process on the same data: session/load replays the history.
    rec2 = Recorder()
    rec2.phase = "load"
    async with acp.spawn_agent_process(rec2, binary, *args) as (conn, process):
        await conn.initialize(protocol_version=acp.PROTOCOL_VERSION, client_capabilities=ClientCapabilities())
        await conn.load_session(cwd=workspace, session_id=sid, mcp_servers=[])
    facts["updates"] = rec.updates
    facts["permissions"] = rec.permissions
    facts["loaded"] = rec2.updates
    emit({"ev": "facts", **facts})


if __name__ == "__main__":
    asyncio.run(main())
