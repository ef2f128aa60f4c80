"""MCP tools against real MCP servers started here (mcp.md MCP-1 … MCP-9): a low-level SDK
server over stdio (tests/_mcp_stdio_server.py) and a FastMCP server over streamable HTTP on
loopback (tests/_mcp_http_server.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from _proc import TIMEOUT, Sandbox

pytest.importorskip("mcp")

import composeai as compose
from composeai import mcp as mcpmod
from composeai.agentfn import agent
from composeai.errors import ConfigError, MCPToolError
from composeai.mcp import close_all, mcp_tools
from composeai.messages import ToolResultPart
from composeai.testing import FakeModel, reset_registries

HERE = Path(__file__).parent
STDIO_SERVER = str(HERE / "_mcp_stdio_server.py")
HTTP_SERVER = str(HERE / "_mcp_http_server.py")
# The servers use the 1.x server API; pointing this at another interpreter lets the client
# side run under a different SDK line against the same servers.
SERVER_PYTHON = os.environ.get("COMPOSEAI_TEST_MCP_SERVER_PYTHON") or sys.executable
STDIO_LABEL = f"{SERVER_PYTHON} {STDIO_SERVER}"
ALL_STDIO = ["add", "mixed", "only_image", "structured", "broken", "slow", "env_var", "die"]
ALL_HTTP = ["echo", "delete_file", "header", "nap"]


@pytest.fixture(autouse=True)
def clean_agent_registry():
    reset_registries()
    yield
    reset_registries()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_http_server(log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [SERVER_PYTHON, HTTP_SERVER, str(port), str(log)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None, "the MCP HTTP server exited"
            assert time.monotonic() < deadline, "the MCP HTTP server never listened"
            time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}/mcp"


@pytest.fixture(scope="module")
def http_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("mcp-http") / "deleted.log"
    proc, url = start_http_server(log)
    yield url, log
    close_all()  # before the server goes away, so no session outlives it
    proc.terminate()
    proc.wait(TIMEOUT)


@pytest.fixture(scope="module")
def stdio_tools():
    tools = mcp_tools(
        command=SERVER_PYTHON, args=[STDIO_SERVER], env={"MCP_TEST_VAR": "from the client"}
    )
    return {t.name: t for t in tools}


def calls(*specs: tuple) -> dict:
    return {"tool_calls": [{"name": n, "arguments": a, "id": i} for n, a, i in specs]}


# --------------------------------------------------------------------------- MCP-1


def test_mcp1_sdk_is_not_imported_by_composeai():
    code = "import sys, composeai, composeai.mcp; composeai.mcp_tools; print('mcp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_mcp1_missing_sdk_is_a_config_error_after_argument_validation(monkeypatch):
    monkeypatch.setitem(sys.modules, "mcp", None)  # makes `import mcp` raise ImportError
    with pytest.raises(ConfigError) as info:
        mcp_tools(command="anything")
    assert str(info.value) == "Install the MCP SDK: pip install 'composeai[mcp]'"
    with pytest.raises(ConfigError, match="requires exactly one of"):
        mcp_tools()


# --------------------------------------------------------------------------- MCP-2


def test_mcp2_transport_validation():
    with pytest.raises(ConfigError) as info:
        mcp_tools()
    assert str(info.value) == (
        "mcp_tools() requires exactly one of command= (stdio) or url= (streamable HTTP)"
    )
    with pytest.raises(ConfigError, match="requires exactly one of"):
        mcp_tools(command="x", url="http://127.0.0.1:1/mcp")
    with pytest.raises(ConfigError) as info:
        mcp_tools(command="x", headers={"a": "b"})
    assert str(info.value) == (
        "mcp_tools(headers=...) is only valid with url= (streamable HTTP), not command= (stdio)"
    )
    expected = (
        "mcp_tools(env=..., args=...) are only valid with command= (stdio), not url= "
        "(streamable HTTP)"
    )
    for bad in ({"env": {}}, {"args": ["x"]}):
        with pytest.raises(ConfigError) as info:
            mcp_tools(url="http://127.0.0.1:1/mcp", **bad)
        assert str(info.value) == expected


# --------------------------------------------------------------------------- MCP-3


def test_mcp3_stdio_lists_every_page_in_server_order(stdio_tools):
    assert list(stdio_tools) == ALL_STDIO  # the server pages two tools at a time


def test_mcp3_stdio_env_reaches_the_server(stdio_tools):
    assert stdio_tools["env_var"].execute({}) == "from the client"


def test_mcp3_http_with_static_headers(http_server):
    url, _ = http_server
    tools = {t.name: t for t in mcp_tools(url=url, headers={"X-Probe": "abc"})}
    assert list(tools) == ALL_HTTP
    assert tools["header"].execute({"name": "x-probe"}) == "abc"
    assert tools["echo"].execute({"text": "hi"}) == "echo: hi"


def test_mcp3_connect_failure_names_the_server():
    with pytest.raises(ConfigError) as info:
        mcp_tools(command="/nonexistent/mcp-server", args=["--flag"])
    message = str(info.value)
    assert message.startswith(
        "Failed to connect to MCP server '/nonexistent/mcp-server --flag': "
    ), message
    with pytest.raises(ConfigError, match="Failed to connect to MCP server 'http://127.0.0.1:"):
        mcp_tools(url=f"http://127.0.0.1:{free_port()}/mcp", connect_timeout=10)


def test_mcp3_connect_timeout():
    # A process that reads stdin and never answers `initialize`.
    args = ["-c", "import sys; sys.stdin.read()"]
    with pytest.raises(ConfigError) as info:
        mcp_tools(command=sys.executable, args=args, connect_timeout=0.5)
    label = " ".join([sys.executable, *args])
    assert str(info.value) == (
        f"MCP server '{label}' did not become ready within connect_timeout=0.5s"
    )


def test_mcp3_listing_failure_and_timeout():
    with pytest.raises(MCPToolError) as info:
        mcp_tools(command=SERVER_PYTHON, args=[STDIO_SERVER, "--fail-list"])
    assert str(info.value).startswith(
        f"Listing tools on MCP server '{STDIO_LABEL} --fail-list' failed: "
    )
    assert "listing is broken" in str(info.value)
    with pytest.raises(MCPToolError) as info:
        mcp_tools(command=SERVER_PYTHON, args=[STDIO_SERVER, "--slow-list"], connect_timeout=3)
    assert str(info.value) == (
        f"Listing tools on MCP server '{STDIO_LABEL} --slow-list' exceeded timeout=3s"
    )


# --------------------------------------------------------------------------- MCP-4


def test_mcp4_duplicate_names():
    with pytest.raises(ConfigError) as info:
        mcp_tools(command=SERVER_PYTHON, args=[STDIO_SERVER, "--dup"])
    assert str(info.value) == (
        f"MCP server '{STDIO_LABEL} --dup' returned duplicate tool name(s): ['add']"
    )


def test_mcp4_unknown_names_in_each_option(http_server):
    url, _ = http_server
    actual = sorted(ALL_HTTP)
    for option in ("include", "exclude", "requires_approval"):
        with pytest.raises(ConfigError) as info:
            mcp_tools(url=url, **{option: ["zeta", "echo", "alpha"]})
        assert str(info.value) == (
            f"mcp_tools({option}=...) name(s) not found on server '{url}': ['alpha', 'zeta'] "
            f"(actual tool names: {actual})"
        )


def test_mcp4_include_exclude_filter_original_names_before_prefix(http_server):
    url, _ = http_server
    tools = mcp_tools(url=url, include=["nap", "echo", "header"], exclude=["header"], prefix="web")
    assert [t.name for t in tools] == ["web_echo", "web_nap"]  # server order
    assert tools[0].execute({"text": "x"}) == "echo: x"  # called by its original name


# --------------------------------------------------------------------------- MCP-5


def test_mcp5_tool_shape(stdio_tools):
    add = stdio_tools["add"]
    assert add.spec.name == "add" and add.spec.description == "Add two integers."
    assert add.spec.input_schema == {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    }  # unmodified: not sealed
    assert add.spec.strict is False and add.spec.requires_approval is False
    assert add.is_async is False and add.fn is None
    assert add.input_type is Any and add.output_type is str
    assert stdio_tools["env_var"].spec.description == (
        "(no description provided by the MCP server)"
    )
    with pytest.raises(ConfigError, match="is not a local function"):
        add(a=1, b=2)


def test_mcp5_requires_approval_all_or_listed(http_server):
    url, _ = http_server
    assert all(t.spec.requires_approval for t in mcp_tools(url=url, requires_approval=True))
    listed = mcp_tools(url=url, requires_approval=["delete_file"], prefix="fs")
    assert {t.name: t.spec.requires_approval for t in listed} == {
        "fs_echo": False,
        "fs_delete_file": True,
        "fs_header": False,
        "fs_nap": False,
    }


# --------------------------------------------------------------------------- MCP-6


def test_mcp6_result_rendering(stdio_tools):
    assert stdio_tools["add"].execute({"a": 2, "b": 3}) == "5"
    assert stdio_tools["mixed"].execute({}) == (
        "before\n[unsupported MCP content block: image]\nafter"
    )
    assert stdio_tools["only_image"].execute({}) == "[unsupported MCP content block: image]"
    assert stdio_tools["structured"].execute({}) == json.dumps({"x": 1, "y": [2]})
    with pytest.raises(MCPToolError) as info:
        stdio_tools["broken"].execute({})
    assert str(info.value) == "it broke\n[unsupported MCP content block: image]"


# --------------------------------------------------------------------------- MCP-7


def test_mcp7_call_timeout(http_server):
    url, _ = http_server
    (nap,) = mcp_tools(url=url, include=["nap"], timeout=0.3)
    with pytest.raises(MCPToolError) as info:
        nap.execute({"seconds": 30})
    assert str(info.value) == f"MCP tool 'nap' on server '{url}' exceeded timeout=0.3s"
    assert nap.execute({"seconds": 0}) == "rested"  # the connection is still usable


def test_mcp7_other_failures():
    (die,) = mcp_tools(command=SERVER_PYTHON, args=[STDIO_SERVER], include=["die"], timeout=20)
    with pytest.raises(MCPToolError) as info:
        die.execute({})
    assert str(info.value) == "MCP tool 'die' failed: Connection closed"


def test_mcp7_errors_inside_an_agent_are_tool_results(stdio_tools):
    model = FakeModel([calls(("broken", {}, "c1"), ("add", {"a": 1, "b": 1}, "c2")), "done"])

    @agent(model=model, tools=[stdio_tools["broken"], stdio_tools["add"]])
    def worker(x: str) -> str:
        return x

    run = worker.run("go")
    assert run.status == "completed"
    results = [p for p in model.requests[1].messages[-1].parts if isinstance(p, ToolResultPart)]
    assert results[0].is_error and results[0].content == (
        "MCPToolError: it broke\n[unsupported MCP content block: image]"
    )
    assert not results[1].is_error and results[1].content == "2"


# --------------------------------------------------------------------------- MCP-8

MCP_FLOW_MODULE = """
import os
from composeai import agent, flow, mcp_tools
from composeai.testing import FakeModel

TOOLS = mcp_tools(url=os.environ["MCP_URL"], requires_approval=["delete_file"], prefix="fs")

def reply(request):
    # Decided by the conversation, so a resumed process answers like the first one.
    if request.messages[-1].role == "user" and request.messages[-1].text == "tidy up":
        return {"tool_calls": [{"name": "fs_delete_file", "arguments": {"path": "a.txt"},
                                "id": "c1"}]}
    return "all done"

@agent(model=FakeModel([reply] * 4), tools=TOOLS)
def janitor(task: str) -> str:
    return task

@flow
def cleanup(task: str) -> str:
    return janitor(task)
"""


def test_mcp8_gated_mcp_tool_pauses_in_one_process_and_resumes_in_another(tmp_path, http_server):
    url, log = http_server
    box = Sandbox(tmp_path)
    box.write_module("mcpflow", MCP_FLOW_MODULE)
    before = log.read_text().count("deleted a.txt") if log.exists() else 0
    paused = box.run(
        """
        import mcpflow
        run = mcpflow.cleanup.run("tidy up")
        emit(status=run.status, run_id=run.id, pending=run.pending.id)
        """,
        MCP_URL=url,
    ).ok()
    assert paused["status"] == "paused"
    assert paused["pending"] == "tool:fs_delete_file:c1"
    after_pause = log.read_text().count("deleted a.txt") if log.exists() else 0
    assert after_pause == before
    resumed = box.run(
        f"""
        import mcpflow
        from composeai import resume
        run = resume({paused["run_id"]!r}, {{"fs_delete_file": True}})
        emit(status=run.status, output=run.output)
        """,
        MCP_URL=url,
    ).ok()
    assert resumed == {"status": "completed", "output": "all done"}
    assert log.read_text().count("deleted a.txt") == before + 1


# --------------------------------------------------------------------------- MCP-9


def test_mcp9_close_all_closes_every_connection_idempotently(monkeypatch, http_server):
    url, _ = http_server
    monkeypatch.setattr(mcpmod, "_live", [])  # leave the module's shared connections open
    first = mcp_tools(url=url, include=["echo"])
    second = mcp_tools(url=url, include=["nap"])
    threads = [t for t in threading.enumerate() if t.name == "composeai-mcp"]
    assert len(threads) >= 2
    assert first[0].execute({"text": "x"}) == "echo: x"
    close_all()
    close_all()  # idempotent
    for tool, args in ((first[0], {"text": "x"}), (second[0], {"seconds": 0})):
        with pytest.raises(MCPToolError) as info:
            tool.execute(args)
        assert str(info.value) == (
            f"MCP server '{url}' is closed (close_all() or interpreter shutdown already ran); "
            "rebuild tools with mcp_tools()"
        )
    assert mcpmod._live == []


def test_mcp9_atexit_closes_connections_at_interpreter_exit(tmp_path, http_server):
    url, _ = http_server
    box = Sandbox(tmp_path)
    result = box.run(
        """
        import atexit, os
        from composeai import mcp as m
        tools = m.mcp_tools(url=os.environ["MCP_URL"], include=["echo"])
        assert m._atexit_registered
        emit(echo=tools[0].execute({"text": "bye"}))
        """,
        MCP_URL=url,
    )
    assert result.ok() == {"echo": "echo: bye"}
    assert result.returncode == 0


def test_mcp_exports():
    assert compose.mcp_tools is mcp_tools
    assert os.path.basename(mcpmod.__file__) == "mcp.py"


def test_mcp9_close_all_ends_a_call_in_flight_with_the_closed_error(monkeypatch, http_server):
    url, _ = http_server
    monkeypatch.setattr(mcpmod, "_live", [])
    (nap,) = mcp_tools(url=url, include=["nap"], timeout=60)
    outcome: dict = {}

    def call() -> None:
        try:
            nap.execute({"seconds": 60})
        except MCPToolError as exc:
            outcome["error"] = str(exc)

    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + TIMEOUT
    conn = mcpmod._live[0]
    while not conn._inflight and time.monotonic() < deadline:
        time.sleep(0.01)
    close_all()
    caller.join(TIMEOUT)
    assert not caller.is_alive()
    assert outcome["error"].startswith(f"MCP server '{url}' is closed")
