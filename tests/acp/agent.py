"""An ACP agent written against the official Python SDK (PyPI agent-client-protocol), run by
tests/acp.rs as a Bumblehive sub-agent (a profile with kind: acp). The SDK's package ships no
runnable example agent, so this one uses its Agent API and helpers directly: the protocol on
the other side of our client is the real library's.

Session ids name the process that made them (py-<pid>-<n>); session/load takes any id back
(a new process continuing an old session) and replays a line of history, which the client
must not take as a new answer. Every prompt writes its pid to agent.pid in the session's cwd.
Prompts it understands:
  read <path>  reads the file through the client's fs/read_text_file, asks one permission
               (session/request_permission) and answers with what it read and was told;
  run <cmd>    runs `sh -c <cmd>` in a terminal of the client's (terminal/create, then
               wait_for_exit, output and release) and answers with its exit code and
               output, or with the error the client gave;
  poll <cmd>    runs `sh -c <cmd>` in a client terminal, reads terminal/output until the
               command has written something (at most 10 s), kills it, waits for its exit
               and answers with what it saw and how it ended;
  stamp        says "stamped" and writes the wall clock (ns) to end.ns in the cwd just
               before it ends its turn (benches/runtime.rs: a report's latency);
  die          says "dying" and ends its process mid-turn (ACP_TEST_NO_LOAD=1 in its
               environment makes it an agent that cannot load sessions);
  wait         says "waiting" and waits for
               session/cancel, then ends the turn as cancelled;
  anything else is echoed ("echo from <pid> <session>: <text>").
The task of a Bumblehive child's first prompt (after its "Task:" line) is what counts.
"""

import asyncio
import os
import sys
import time

import acp
from acp import (
    PROTOCOL_VERSION,
    start_read_tool_call,
    start_tool_call,
    text_block,
    tool_content,
    update_agent_message_text,
    update_tool_call,
)
from acp.schema import (
    AgentCapabilities,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PermissionOption,
    PromptResponse,
    ToolCallUpdate,
)


class Agent:
    def __init__(self):
        self.conn = None
        self.cwd = {}
        self.cancelled = {}

    def on_connect(self, conn):
        self.conn = conn

    async def initialize(self, protocol_version, client_capabilities=None, client_info=None, **kwargs):
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            # ACP_TEST_NO_LOAD=1: an agent that cannot load sessions (a new one each start).
            agent_capabilities=AgentCapabilities(load_session=os.environ.get("ACP_TEST_NO_LOAD") != "1"),
        )

    async def new_session(self, cwd, mcp_servers=None, **kwargs):
        session_id = f"py-{os.getpid()}-{len(self.cwd) + 1}"
        self.cwd[session_id] = cwd
        return NewSessionResponse(session_id=session_id)

    async def load_session(self, cwd, session_id, mcp_servers=None, **kwargs):
        self.cwd[session_id] = cwd
        await self.say(session_id, "(replayed history)")
        return LoadSessionResponse()

    async def cancel(self, session_id, **kwargs):
        event = self.cancelled.get(session_id)
        if event is not None:
            event.set()

    async def say(self, session_id, text):
        await self.conn.session_update(session_id=session_id, update=update_agent_message_text(text))

    async def prompt(self, session_id, prompt, **kwargs):
        text = " ".join(block.text for block in prompt if getattr(block, "text", None))
        # A Bumblehive child's first prompt frames the task ("You are the sub-agent …
        # Task:\n<task>"): the task is what follows.
        text = text.split("Task:\n", 1)[-1].strip()
        with open(os.path.join(self.cwd[session_id], "agent.pid"), "w") as f:
            f.write(str(os.getpid()))
        if text.startswith("read "):
            path = text[len("read "):].strip()
            await self.conn.session_update(
                session_id=session_id, update=start_read_tool_call("r1", f"Read {path}", path)
            )
            read = await self.conn.read_text_file(session_id=session_id, path=path)
            await self.conn.session_update(
                session_id=session_id,
                update=update_tool_call(
                    "r1", status="completed", content=[tool_content(text_block(read.content))]
                ),
            )
            await self.conn.session_update(
                session_id=session_id,
                update=start_tool_call("p1", "Publish the notes", kind="execute", raw_input={"what": "notes"}),
            )
            answer = await self.conn.request_permission(
                session_id=session_id,
                tool_call=ToolCallUpdate(tool_call_id="p1", title="Publish the notes"),
                options=[
                    PermissionOption(option_id="yes", name="Allow", kind="allow_once"),
                    PermissionOption(option_id="no", name="Reject", kind="reject_once"),
                ],
            )
            outcome = answer.outcome
            allowed = getattr(outcome, "option_id", None) == "yes"
            await self.conn.session_update(
                session_id=session_id,
                update=update_tool_call(
                    "p1",
                    status="completed" if allowed else "failed",
                    content=[tool_content(text_block("published" if allowed else "rejected"))],
                ),
            )
            first = read.content.splitlines()[0] if read.content else ""
            await self.say(session_id, f"read {path}: {first}; ")
            await self.say(session_id, "permission " + ("allowed" if allowed else "rejected"))
            return PromptResponse(stop_reason="end_turn")
        if text.startswith("run "):
            command = text[len("run "):].strip()
            try:
                terminal = await self.conn.create_terminal(
                    session_id=session_id, command="sh", args=["-c", command], output_byte_limit=4096
                )
                status = await self.conn.wait_for_terminal_exit(
                    session_id=session_id, terminal_id=terminal.terminal_id
                )
                output = await self.conn.terminal_output(session_id=session_id, terminal_id=terminal.terminal_id)
                await self.conn.release_terminal(session_id=session_id, terminal_id=terminal.terminal_id)
            except Exception as err:  # the client's error, told as the answer
                await self.say(session_id, f"terminal failed: {err}")
                return PromptResponse(stop_reason="end_turn")
            await self.say(session_id, f"ran {command}: exit {status.exit_code}: {output.output.strip()}")
            return PromptResponse(stop_reason="end_turn")
        if text.startswith("poll "):
            command = text[len("poll "):].strip()
            terminal = await self.conn.create_terminal(session_id=session_id, command="sh", args=["-c", command])
            tid = terminal.terminal_id
            seen = ""
            for _ in range(200):
                out = await self.conn.terminal_output(session_id=session_id, terminal_id=tid)
                if out.output.strip() or out.exit_status is not None:
                    seen = out.output.strip()
                    break
                await asyncio.sleep(0.05)
            await self.conn.kill_terminal(session_id=session_id, terminal_id=tid)
            status = await self.conn.wait_for_terminal_exit(session_id=session_id, terminal_id=tid)
            await self.conn.release_terminal(session_id=session_id, terminal_id=tid)
            await self.say(session_id, f"polled {seen or 'nothing'}; killed: exit {status.exit_code}")
            return PromptResponse(stop_reason="end_turn")
        if text.strip() == "stamp":
            await self.say(session_id, "stamped")
            with open(os.path.join(self.cwd[session_id], "end.ns"), "w") as f:
                f.write(str(time.time_ns()))
            return PromptResponse(stop_reason="end_turn")
        if text.strip() == "die":
            await self.say(session_id, "dying")
            os._exit(3)
        if text.strip() == "wait":
            event = asyncio.Event()
            self.cancelled[session_id] = event
            await self.say(session_id, "waiting")
            await event.wait()
            return PromptResponse(stop_reason="cancelled")
        await self.say(session_id, f"echo from {os.getpid()} {session_id}: {text}")
        return PromptResponse(stop_reason="end_turn")


if __name__ == "__main__":
    asyncio.run(acp.run_agent(Agent()))
