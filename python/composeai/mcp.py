"""Tools served by MCP servers.

Each `mcp_tools()` call opens one connection (stdio or streamable HTTP) and
keeps it for the life of the process on an event loop of its own, in a
thread of its own: the SDK is asyncio-based and its transports must be
entered and left by one task, while tools are called synchronously from any
thread. The `mcp` SDK is imported only when `mcp_tools()` is called.
"""

from __future__ import annotations

import atexit
import json
import threading
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, MCPToolError

if TYPE_CHECKING:
    import asyncio

    from .tools import Tool

__all__ = ["close_all", "mcp_tools"]

NO_DESCRIPTION = "(no description provided by the MCP server)"

_live: list[_Connection] = []
_live_lock = threading.Lock()
_atexit_registered = False


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside the SDK's (possibly nested) exception groups."""
    inner = getattr(exc, "exceptions", None)
    while isinstance(inner, (list, tuple)) and inner:
        exc = inner[0]
        inner = getattr(exc, "exceptions", None)
    return exc


def _describe(exc: BaseException) -> str:
    exc = _leaf(exc)
    return str(exc) or type(exc).__name__


class _Connection:
    """One live MCP session, owned by a task on a private loop thread."""

    def __init__(self, label: str, transport: Any) -> None:
        import asyncio

        self.label = label
        self._transport = transport
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="composeai-mcp", daemon=True
        )
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._main: Any = None  # the serving task, as a concurrent future
        self._finished = threading.Event()
        self._inflight: set[Any] = set()  # calls waiting for an answer
        self.closed = False

    # -- lifecycle -----------------------------------------------------------

    def open(self, connect_timeout: float) -> None:
        """Connect and `initialize()` within `connect_timeout`."""
        import asyncio
        import concurrent.futures

        self._thread.start()
        ready: concurrent.futures.Future = concurrent.futures.Future()
        self._main = asyncio.run_coroutine_threadsafe(self._serve(ready), self._loop)
        try:
            ready.result(connect_timeout)
        except concurrent.futures.TimeoutError:
            self.close()
            raise ConfigError(
                f"MCP server '{self.label}' did not become ready within "
                f"connect_timeout={connect_timeout}s"
            ) from None
        except Exception as exc:  # noqa: BLE001 -- reported with the server's label
            self.close()
            raise ConfigError(
                f"Failed to connect to MCP server '{self.label}': {_describe(exc)}"
            ) from None

    async def _serve(self, ready: Any) -> None:
        import asyncio
        from contextlib import AsyncExitStack

        from mcp import ClientSession

        self._stop = asyncio.Event()
        try:
            async with AsyncExitStack() as stack:
                streams = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
                await session.initialize()
                self._session = session
                ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:  # handed to the opener, or dropped at close
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(exc))
            if not isinstance(exc, Exception):
                raise
        finally:
            self._session = None
            self._finished.set()

    def close(self) -> None:
        """Tear the session down and stop the loop thread; never raises."""
        if self.closed:
            return
        self.closed = True
        loop = self._loop
        try:
            for call in list(self._inflight):
                call.cancel()  # its caller reports the server closed
            main = self._main
            if main is not None and not self._finished.is_set():
                if self._session is not None and self._stop is not None:
                    loop.call_soon_threadsafe(self._stop.set)  # leave the contexts in order
                else:
                    main.cancel()  # still connecting
                self._finished.wait(5.0)
            loop.call_soon_threadsafe(loop.stop)
            if self._thread.is_alive() and self._thread is not threading.current_thread():
                self._thread.join(5.0)
        except BaseException:  # noqa: BLE001, S110 -- close never raises (MCP-9)
            pass

    # -- requests ------------------------------------------------------------

    def request(self, make_coro: Any, timeout: float | None) -> Any:
        """Run `make_coro(session)` on the connection's loop; `TimeoutError`
        after `timeout` seconds (the request is cancelled)."""
        import asyncio
        import concurrent.futures

        session = self._session
        if self.closed or session is None:
            raise _ClosedError()
        future = asyncio.run_coroutine_threadsafe(make_coro(session), self._loop)
        self._inflight.add(future)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError from None
        except concurrent.futures.CancelledError:
            raise _ClosedError() from None
        finally:
            self._inflight.discard(future)


class _ClosedError(Exception):
    pass


def _closed_error(label: str) -> MCPToolError:
    return MCPToolError(
        f"MCP server '{label}' is closed (close_all() or interpreter shutdown already ran); "
        "rebuild tools with mcp_tools()"
    )


async def _list_all(session: Any) -> list[Any]:
    """Every tool the server offers, following pagination cursors."""
    tools: list[Any] = []
    cursor = None
    while True:
        result = await (session.list_tools(cursor) if cursor else session.list_tools())
        tools.extend(result.tools)
        cursor = getattr(result, "nextCursor", None)
        if not cursor:
            return tools


def render_result(result: Any) -> str:
    """The text a call result hands to the model."""
    blocks = list(result.content or ())
    structured = getattr(result, "structuredContent", None)
    has_text = any(getattr(b, "type", None) == "text" for b in blocks)
    if not has_text and structured is not None:
        text = json.dumps(structured)
    else:
        text = "\n".join(
            b.text if b.type == "text" else f"[unsupported MCP content block: {b.type}]"
            for b in blocks
        )
    if result.isError:
        raise MCPToolError(text)
    return text


def _executor(conn: _Connection, name: str, timeout: float) -> Any:
    def execute(arguments: dict[str, Any]) -> str:
        try:
            result = conn.request(lambda s: s.call_tool(name, arguments), timeout)
        except _ClosedError:
            raise _closed_error(conn.label) from None
        except TimeoutError:
            raise MCPToolError(
                f"MCP tool '{name}' on server '{conn.label}' exceeded timeout={timeout}s"
            ) from None
        except Exception as exc:  # noqa: BLE001 -- every failure is an MCPToolError (MCP-7)
            if conn.closed:
                raise _closed_error(conn.label) from None
            raise MCPToolError(f"MCP tool '{name}' failed: {_describe(exc)}") from None
        return render_result(result)

    return execute


def _check_names(label: str, option: str, wanted: Sequence[str], actual: list[str]) -> None:
    unknown = sorted(set(wanted) - set(actual))
    if unknown:
        raise ConfigError(
            f"mcp_tools({option}=...) name(s) not found on server '{label}': {unknown} "
            f"(actual tool names: {sorted(actual)})"
        )


def _select(
    label: str,
    listed: list[Any],
    include: Sequence[str] | None,
    exclude: Sequence[str],
    requires_approval: bool | Sequence[str],
) -> list[tuple[Any, bool]]:
    """The server's tools to offer, in server order, each with its
    approval flag."""
    names = [t.name for t in listed]
    dups = sorted(n for n, k in Counter(names).items() if k > 1)
    if dups:
        raise ConfigError(f"MCP server '{label}' returned duplicate tool name(s): {dups}")
    if include is not None:
        _check_names(label, "include", include, names)
    _check_names(label, "exclude", exclude, names)
    gated: set[str] | None = None
    if not isinstance(requires_approval, bool):
        _check_names(label, "requires_approval", requires_approval, names)
        gated = set(requires_approval)
    chosen = []
    for t in listed:
        if include is not None and t.name not in include:
            continue
        if t.name in exclude:
            continue
        chosen.append((t, bool(requires_approval) if gated is None else t.name in gated))
    return chosen


def _stdio_transport(command: str, args: Sequence[str], env: dict[str, str] | None) -> Any:
    from mcp import StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=command, args=list(args), env=env)
    return lambda: stdio_client(params)


def _http_transport(url: str, headers: dict[str, str] | None) -> Any:
    from contextlib import asynccontextmanager

    import httpx
    from mcp.client.streamable_http import streamable_http_client

    @asynccontextmanager
    async def transport():
        # The SDK's recommended timeouts: a server may hold a response stream
        # open for minutes.
        client = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30.0, read=300.0))
        async with client, streamable_http_client(url, http_client=client) as streams:
            yield streams

    return transport


def mcp_tools(
    *,
    command: str | None = None,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    url: str | None = None,
    headers: dict[str, str] | None = None,
    include: Sequence[str] | None = None,
    exclude: Sequence[str] = (),
    prefix: str | None = None,
    requires_approval: bool | Sequence[str] = False,
    timeout: float | None = None,
    connect_timeout: float = 30.0,
) -> list[Tool]:
    """Connect to an MCP server and return its tools as `Tool`s."""
    if (command is None) == (url is None):
        raise ConfigError(
            "mcp_tools() requires exactly one of command= (stdio) or url= (streamable HTTP)"
        )
    if command is not None and headers is not None:
        raise ConfigError(
            "mcp_tools(headers=...) is only valid with url= (streamable HTTP), not command= (stdio)"
        )
    if url is not None and (env is not None or len(args) > 0):
        raise ConfigError(
            "mcp_tools(env=..., args=...) are only valid with command= (stdio), not url= "
            "(streamable HTTP)"
        )
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise ConfigError("Install the MCP SDK: pip install 'composeai[mcp]'") from None

    if command is not None:
        label = " ".join([command, *args])
        transport = _stdio_transport(command, args, env)
    else:
        label = str(url)
        transport = _http_transport(str(url), headers)
    conn = _Connection(label, transport)
    conn.open(connect_timeout)
    try:
        try:
            listed = conn.request(_list_all, connect_timeout)
        except TimeoutError:
            raise MCPToolError(
                f"Listing tools on MCP server '{label}' exceeded timeout={connect_timeout}s"
            ) from None
        except Exception as exc:  # noqa: BLE001 -- reported as a listing failure
            raise MCPToolError(
                f"Listing tools on MCP server '{label}' failed: {_describe(exc)}"
            ) from None
        chosen = _select(label, listed, include, exclude, requires_approval)
        tools = _make_tools(conn, chosen, prefix, connect_timeout if timeout is None else timeout)
    except BaseException:
        conn.close()
        raise
    _register(conn)
    return tools


def _make_tools(
    conn: _Connection, chosen: list[tuple[Any, bool]], prefix: str | None, timeout: float
) -> list[Tool]:
    from .models.base import ToolSpec
    from .tools import Tool

    tools = []
    for t, gated in chosen:
        spec = ToolSpec(
            name=f"{prefix}_{t.name}" if prefix else t.name,
            description=t.description or NO_DESCRIPTION,
            input_schema=t.inputSchema if t.inputSchema is not None else {},
            strict=False,
            requires_approval=bool(gated),
        )
        tools.append(Tool(spec=spec, executor=_executor(conn, t.name, timeout)))
    return tools


def _register(conn: _Connection) -> None:
    global _atexit_registered
    with _live_lock:
        _live.append(conn)
        if not _atexit_registered:
            _atexit_registered = True
            atexit.register(close_all)


def close_all() -> None:
    """Close every live MCP connection (idempotent, never raises)."""
    with _live_lock:
        conns = list(_live)
        _live.clear()
    for conn in conns:
        conn.close()
