"""A real MCP server over streamable HTTP on loopback, written with the SDK's FastMCP API,
for tests/test_mcp.py. Usage: python _mcp_http_server.py <port>."""

from __future__ import annotations

import sys

import anyio
from mcp.server.fastmcp import Context, FastMCP

app = FastMCP("composeai-test-http", host="127.0.0.1", port=int(sys.argv[1]), log_level="WARNING")


@app.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return f"echo: {text}"


@app.tool()
def delete_file(path: str) -> str:
    """Delete a file (pretend)."""
    with open(sys.argv[2], "a") as log:
        log.write(f"deleted {path}\n")
    return f"deleted {path}"


@app.tool()
def header(ctx: Context, name: str) -> str:
    """The value of one HTTP request header."""
    request = ctx.request_context.request
    return request.headers.get(name, "<missing>")


@app.tool()
async def nap(seconds: float) -> str:
    """Sleeps."""
    await anyio.sleep(seconds)
    return "rested"


if __name__ == "__main__":
    app.run("streamable-http")
