"""A small MCP server on the Python `mcp` SDK (PyPI), for what server-everything lacks:
a tool list that changes at run time (`notifications/tools/list_changed`) and a wait that
records in MARK_DIR whether the client cancelled it (`notifications/cancelled`)."""

import asyncio
import os
import pathlib

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("bumblehive-test")
marks = pathlib.Path(os.environ.get("MARK_DIR", "."))


@server.tool()
async def add_tool(name: str, ctx: Context) -> str:
    """Adds a tool called `name` and tells the client that the tool list changed."""

    def added() -> str:
        return f"{name} answers"

    server.add_tool(added, name=name, description=f"A tool added at run time: {name}")
    # The notification itself (`notify_tools_changed` only reaches `subscriptions/listen`).
    await ctx.session.send_tool_list_changed()
    return f"added {name}"


@server.tool()
async def wait(seconds: float) -> str:
    """Waits `seconds`; writes MARK_DIR/cancelled if the client cancels the call."""
    (marks / "started").write_text("started")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        (marks / "cancelled").write_text("cancelled")
        raise
    return "waited"


if __name__ == "__main__":
    server.run()
