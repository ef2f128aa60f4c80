"""A loopback server speaking the Anthropic Messages API wire format, for adapter tests and
the W7 benchmark.

`WireServer` answers `POST /v1/messages` from a queue of scripted replies, one per request,
and records every request it received (path, headers, JSON body). Replies:

- `JsonReply(message)` — a complete JSON message (or any status and body, for errors);
- `SseReply(events)` — a server-sent event stream, chunked; `cut_after=n` sends `n` events
  and then drops the connection in the middle of a chunk (a transport failure), while
  `end_after=n` ends the body cleanly after `n` events (a stream that stops early);
- `SlowReply(seconds, reply)` — waits before answering (for client timeouts);
- `HangingSse(events, trickle=event)` — sends `events`, then keeps the stream open (sending
  `trickle` every 20 ms, if given) until the client goes away, and records the disconnect in
  `WireServer.disconnected` (for cancellation).

`message(...)` builds a wire message and `stream_events(message)` the event sequence the API
would stream for it, so one scripted reply serves both `complete()` and `stream()`.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

API_PATH = "/v1/messages"


# ---------------------------------------------------------------------------
# Wire values


def usage(
    input_tokens: int = 10,
    output_tokens: int = 5,
    *,
    cache_read: int | None = None,
    cache_creation: int | None = None,
    ttl: tuple[int, int] | None = None,
    thinking: int | None = None,
) -> dict[str, Any]:
    u: dict[str, Any] = {"input_tokens": input_tokens, "output_tokens": output_tokens}
    if cache_read is not None:
        u["cache_read_input_tokens"] = cache_read
    if cache_creation is not None:
        u["cache_creation_input_tokens"] = cache_creation
    if ttl is not None:
        u["cache_creation"] = {
            "ephemeral_5m_input_tokens": ttl[0],
            "ephemeral_1h_input_tokens": ttl[1],
        }
    if thinking is not None:
        u["output_tokens_details"] = {"thinking_tokens": thinking}
    return u


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def tool_use(id: str, name: str, input: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": id, "name": name, "input": input}


def thinking(t: str, signature: str = "sig-1") -> dict[str, Any]:
    return {"type": "thinking", "thinking": t, "signature": signature}


def message(
    *content: dict[str, Any],
    stop_reason: str = "end_turn",
    model: str = "claude-sonnet-5",
    usage_: dict[str, Any] | None = None,
    id: str = "msg_01",
) -> dict[str, Any]:
    return {
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": list(content),
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage_ if usage_ is not None else usage(),
    }


def _chunks(s: str, size: int) -> list[str]:
    return [s[i : i + size] for i in range(0, len(s), size)] or [""]


def stream_events(msg: dict[str, Any], *, chunk: int = 4) -> list[dict[str, Any]]:
    """The event sequence the Messages API streams for `msg`: usage split the way the API
    splits it (input side in `message_start`, output side in `message_delta`)."""
    full = msg["usage"]
    start_usage = {
        k: v for k, v in full.items() if k not in ("output_tokens", "output_tokens_details")
    }
    start_usage["output_tokens"] = 1
    delta_usage = {"output_tokens": full["output_tokens"]}
    if "output_tokens_details" in full:
        delta_usage["output_tokens_details"] = full["output_tokens_details"]
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {**msg, "content": [], "stop_reason": None, "usage": start_usage},
        },
        {"type": "ping"},
    ]
    for index, block in enumerate(msg["content"]):
        kind = block["type"]
        if kind == "text":
            events.append(
                {"type": "content_block_start", "index": index, "content_block": text("")}
            )
            for piece in _chunks(block["text"], chunk):
                delta = {"type": "text_delta", "text": piece}
                events.append({"type": "content_block_delta", "index": index, "delta": delta})
        elif kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            events.append({"type": "content_block_start", "index": index, "content_block": start})
            for piece in _chunks(block["thinking"], chunk):
                delta = {"type": "thinking_delta", "thinking": piece}
                events.append({"type": "content_block_delta", "index": index, "delta": delta})
            delta = {"type": "signature_delta", "signature": block["signature"]}
            events.append({"type": "content_block_delta", "index": index, "delta": delta})
        elif kind == "tool_use":
            start = {**block, "input": {}}
            events.append({"type": "content_block_start", "index": index, "content_block": start})
            raw = block.get("raw_json", json.dumps(block["input"]))
            for piece in _chunks(raw, chunk * 2):
                delta = {"type": "input_json_delta", "partial_json": piece}
                events.append({"type": "content_block_delta", "index": index, "delta": delta})
        else:
            events.append({"type": "content_block_start", "index": index, "content_block": block})
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": None},
            "usage": delta_usage,
        }
    )
    events.append({"type": "message_stop"})
    return events


def sse_bytes(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


# ---------------------------------------------------------------------------
# Replies


@dataclass
class JsonReply:
    body: Any
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class SseReply:
    events: list[dict[str, Any]]
    cut_after: int | None = None
    end_after: int | None = None


@dataclass
class SlowReply:
    seconds: float
    reply: Any


@dataclass
class HangingSse:
    events: list[dict[str, Any]]
    trickle: dict[str, Any] | None = None
    limit: float = 30.0


def error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def reply_for(msg: dict[str, Any]):
    """A reply that answers `msg` as JSON or as a stream, whichever the request asks for."""

    def choose(body: dict[str, Any]):
        return SseReply(stream_events(msg)) if body.get("stream") else JsonReply(msg)

    return choose


# ---------------------------------------------------------------------------
# The server


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # A handler still sleeping or hanging must not hold up the fixture's teardown.
    block_on_close = False


class WireServer:
    """A threaded loopback HTTP server; `url` is its base URL (for `base_url=`)."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self._replies: list[Any] = []
        self._lock = threading.Lock()
        self.disconnected = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # Headers and body go out in separate writes: without this, Nagle's algorithm
                # and delayed ACKs stall every keep-alive exchange by tens of milliseconds.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                body = json.loads(raw) if raw else {}
                with server._lock:
                    server.requests.append(
                        Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                    )
                    reply = server._replies.pop(0) if server._replies else None
                if reply is None:
                    reply = JsonReply(error_body("api_error", "no scripted reply left"), 500)
                if callable(reply):
                    reply = reply(body)
                try:
                    server._answer(self, reply)
                except OSError:  # the client went away (timeouts, cancellation)
                    self.close_connection = True

        self._http = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> WireServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def push(self, *replies: Any) -> None:
        with self._lock:
            self._replies.extend(replies)

    def bodies(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r.body for r in self.requests]

    # -- answering -----------------------------------------------------------

    def _answer(self, h: BaseHTTPRequestHandler, reply: Any) -> None:
        if isinstance(reply, SlowReply):
            time.sleep(reply.seconds)
            self._answer(h, reply.reply)
            return
        if isinstance(reply, JsonReply):
            data = json.dumps(reply.body).encode()
            h.send_response(reply.status)
            h.send_header("content-type", "application/json")
            h.send_header("content-length", str(len(data)))
            h.send_header("request-id", "req_loopback")
            for k, v in reply.headers.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data)
            h.wfile.flush()
            return
        if isinstance(reply, SseReply):
            self._sse(h, reply)
            return
        if isinstance(reply, HangingSse):
            self._hang(h, reply)
            return
        raise TypeError(f"unknown scripted reply {reply!r}")

    def _sse_head(self, h: BaseHTTPRequestHandler, *, chunked: bool) -> None:
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("cache-control", "no-cache")
        if chunked:
            h.send_header("transfer-encoding", "chunked")
        else:
            h.send_header("connection", "close")
            h.close_connection = True
        h.end_headers()

    def _sse(self, h: BaseHTTPRequestHandler, reply: SseReply) -> None:
        if reply.end_after is not None:
            self._sse_head(h, chunked=False)
            for event in reply.events[: reply.end_after]:
                h.wfile.write(sse_bytes(event))
            h.wfile.flush()
            return
        self._sse_head(h, chunked=True)
        for i, event in enumerate(reply.events):
            data = sse_bytes(event)
            if reply.cut_after is not None and i == reply.cut_after:
                # Announce a chunk, send half of it, drop the connection.
                h.wfile.write(f"{len(data):x}\r\n".encode() + data[: len(data) // 2])
                h.wfile.flush()
                h.close_connection = True
                h.connection.shutdown(socket.SHUT_RDWR)
                return
            h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()

    def _hang(self, h: BaseHTTPRequestHandler, reply: HangingSse) -> None:
        self._sse_head(h, chunked=True)
        for event in reply.events:
            data = sse_bytes(event)
            h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        h.wfile.flush()
        h.close_connection = True
        deadline = time.monotonic() + reply.limit
        sock = h.connection
        while time.monotonic() < deadline:
            readable, _, _ = select.select([sock], [], [], 0.02)
            try:
                if readable and sock.recv(1, socket.MSG_PEEK) == b"":
                    break
                if reply.trickle is not None:
                    data = sse_bytes(reply.trickle)
                    h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    h.wfile.flush()
            except OSError:
                break
        else:
            return
        self.disconnected.set()
