"""A real MCP server over stdio, written with the SDK's low-level server API, for
tests/test_mcp.py. `--dup` makes it list a tool name twice, `--fail-list` / `--slow-list`
make listing fail / hang; tools are listed two per page
so clients must follow pagination cursors."""

from __future__ import annotations

import os
import sys

import anyio
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

PAGE = 2
OBJECT = {"type": "object"}

TOOLS = [
    types.Tool(
        name="add",
        description="Add two integers.",
        inputSchema={
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    ),
    types.Tool(name="mixed", description="Text around an image.", inputSchema=OBJECT),
    types.Tool(name="only_image", description="Just an image.", inputSchema=OBJECT),
    types.Tool(name="structured", description="Structured content only.", inputSchema=OBJECT),
    types.Tool(name="broken", description="Always an error result.", inputSchema=OBJECT),
    types.Tool(
        name="slow",
        description="Sleeps.",
        inputSchema={"type": "object", "properties": {"seconds": {"type": "number"}}},
    ),
    types.Tool(name="env_var", inputSchema=OBJECT),
    types.Tool(name="die", description="Exits the server process.", inputSchema=OBJECT),
]

if "--dup" in sys.argv:
    TOOLS.append(types.Tool(name="add", description="Again.", inputSchema=OBJECT))

server = Server("composeai-test-stdio")
IMAGE = types.ImageContent(type="image", data="aGk=", mimeType="image/png")


@server.list_tools()
async def list_tools(request: types.ListToolsRequest) -> types.ListToolsResult:
    if "--fail-list" in sys.argv:
        raise ValueError("listing is broken")
    if "--slow-list" in sys.argv:
        await anyio.sleep(60)
    cursor = request.params.cursor if request.params is not None else None
    start = int(cursor or 0)
    end = start + PAGE
    return types.ListToolsResult(
        tools=TOOLS[start:end], nextCursor=str(end) if end < len(TOOLS) else None
    )


def text(value: str) -> types.TextContent:
    return types.TextContent(type="text", text=value)


@server.call_tool(validate_input=False)
async def call_tool(name: str, arguments: dict):
    if name == "add":
        return types.CallToolResult(content=[text(str(arguments["a"] + arguments["b"]))])
    if name == "mixed":
        return types.CallToolResult(content=[text("before"), IMAGE, text("after")])
    if name == "only_image":
        return types.CallToolResult(content=[IMAGE])
    if name == "structured":
        return types.CallToolResult(content=[], structuredContent={"x": 1, "y": [2]})
    if name == "broken":
        return types.CallToolResult(content=[text("it broke"), IMAGE], isError=True)
    if name == "slow":
        await anyio.sleep(float(arguments.get("seconds", 5)))
        return types.CallToolResult(content=[text("slept")])
    if name == "env_var":
        return types.CallToolResult(content=[text(os.environ.get("MCP_TEST_VAR", "<unset>"))])
    if name == "die":
        os._exit(3)
    raise ValueError(f"no tool {name}")


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
