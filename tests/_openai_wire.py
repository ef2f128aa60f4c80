"""A loopback HTTP server speaking the OpenAI wire formats, for the adapter tests and bench.

The REAL ``openai`` SDK talks to it over HTTP. Replies are scripted per test (a queue; the
last reply repeats when the queue runs dry if ``repeat`` is set) and every request is
recorded (path, headers, JSON body). Builders produce Responses API objects and stream
events, and Chat Completions objects and chunks, shaped like the SDK's types.

Streams are sent with chunked transfer encoding; ``cut=True`` drops the connection in the
middle of the body (the client sees an incomplete chunked read), ``end_early=True`` ends the
body cleanly before the terminal event.
"""

from __future__ import annotations

import json
import select
import socket
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: Any


@dataclass
class Reply:
    """One scripted reply: a JSON body, or a stream of SSE events."""

    status: int = 200
    body: Any = None
    events: list[tuple[str | None, Any]] | None = None  # (event name, data); data "[DONE]" raw
    cut_after: int | None = None  # drop the connection after this many events
    end_after: int | None = None  # end the body cleanly after this many events
    hold_after: int | None = None  # after this many events, wait for the client to go away
    delay: float = 0.0  # seconds to wait before answering (timeouts)
    headers: dict[str, str] = field(default_factory=dict)


class WireServer:
    """``ThreadingHTTPServer`` on 127.0.0.1:0 in a daemon thread."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.replies: deque[Reply] = deque()
        self.repeat: Reply | None = None
        self.client_gone = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # One segment per reply, sent at once: no Nagle / delayed-ACK stalls.
            disable_nagle_algorithm = True
            wbufsize = -1

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                server._handle(self)

            do_GET = do_POST

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def queue(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def bodies(self) -> list[Any]:
        return [r.body for r in self.requests]

    # -- serving ----------------------------------------------------------

    def _next_reply(self) -> Reply:
        with self._lock:
            if self.replies:
                return self.replies.popleft()
            if self.repeat is not None:
                return self.repeat
        return Reply(status=500, body={"error": {"message": "no reply scripted", "type": "test"}})

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        with self._lock:
            self.requests.append(
                Recorded(
                    handler.command,
                    handler.path,
                    {k.lower(): v for k, v in handler.headers.items()},
                    body,
                )
            )
        reply = self._next_reply()
        if reply.delay and self.release.wait(reply.delay):
            return
        if reply.events is None:
            data = json.dumps(reply.body).encode()
            handler.send_response(reply.status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            for k, v in reply.headers.items():
                handler.send_header(k, v)
            handler.end_headers()
            handler.wfile.write(data)
            handler.wfile.flush()
            return
        self._stream(handler, reply)

    def _stream(self, handler: BaseHTTPRequestHandler, reply: Reply) -> None:
        handler.send_response(reply.status)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        out = handler.wfile
        try:
            for i, (name, data) in enumerate(reply.events):
                if reply.cut_after is not None and i == reply.cut_after:
                    # A partial chunk, then the socket goes away mid-body.
                    out.write(b'40\r\ndata: {"trunc')
                    out.flush()
                    handler.connection.shutdown(socket.SHUT_RDWR)
                    handler.close_connection = True
                    return
                if reply.end_after is not None and i == reply.end_after:
                    break
                if reply.hold_after is not None and i == reply.hold_after:
                    self._wait_for_client_to_leave(handler)
                payload = data if isinstance(data, str) else json.dumps(data)
                text = (f"event: {name}\n" if name else "") + f"data: {payload}\n\n"
                chunk = text.encode()
                out.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                out.flush()
            out.write(b"0\r\n\r\n")
            out.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.client_gone.set()
            handler.close_connection = True

    def _wait_for_client_to_leave(self, handler: BaseHTTPRequestHandler) -> None:
        """Blocks until the client closes the connection (EOF) or the test releases us."""
        sock = handler.connection
        while not self.release.is_set():
            ready, _, _ = select.select([sock], [], [], 0.02)
            if ready:
                try:
                    data = sock.recv(1, socket.MSG_PEEK)
                except OSError:
                    data = b""
                if not data:
                    self.client_gone.set()
                    raise BrokenPipeError
        raise BrokenPipeError


# -- Responses API shapes ------------------------------------------------------


def usage(input_tokens=10, output_tokens=5, cached=0, reasoning=0) -> dict:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input_tokens + output_tokens,
    }


def message_item(text: str, item_id: str = "msg_1", refusal: str | None = None) -> dict:
    content: list[dict] = []
    if text:
        content.append({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
    if refusal is not None:
        content.append({"type": "refusal", "refusal": refusal})
    return {
        "type": "message",
        "id": item_id,
        "status": "completed",
        "role": "assistant",
        "content": content,
    }


def call_item(call_id: str, name: str, arguments: Any, item_id: str | None = None) -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "type": "function_call",
        "id": item_id or f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "arguments": args,
        "status": "completed",
    }


def reasoning_item(summary: str, item_id: str = "rs_1", encrypted: str | None = None) -> dict:
    item: dict = {
        "type": "reasoning",
        "id": item_id,
        "summary": [{"type": "summary_text", "text": summary}] if summary else [],
    }
    if encrypted is not None:
        item["encrypted_content"] = encrypted
    return item


def response(
    output: list[dict],
    *,
    status: str = "completed",
    model: str = "gpt-5.4",
    use: dict | None = None,
    incomplete: str | None = None,
    error: dict | None = None,
    response_id: str = "resp_1",
) -> dict:
    return {
        "id": response_id,
        "object": "response",
        "created_at": 1_700_000_000,
        "model": model,
        "status": status,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": error,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "usage": use if use is not None else usage(),
    }


def _pieces(text: str, n: int = 2) -> list[str]:
    if not text:
        return []
    step = max(1, -(-len(text) // n))
    return [text[i : i + step] for i in range(0, len(text), step)]


def response_events(final: dict) -> list[tuple[str, Any]]:
    """The SSE events a Responses API stream sends for ``final``, in order."""
    seq = iter(range(10_000))
    events: list[tuple[str, Any]] = []

    def add(kind: str, **data: Any) -> None:
        events.append((kind, {"type": kind, "sequence_number": next(seq), **data}))

    started = dict(final, status="in_progress", output=[], usage=None)
    add("response.created", response=started)
    for index, item in enumerate(final["output"]):
        kind = item["type"]
        if kind == "message":
            add("response.output_item.added", output_index=index, item=dict(item, content=[]))
            for ci, block in enumerate(item["content"]):
                empty = dict(block, text="") if block["type"] == "output_text" else block
                add(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=ci,
                    part=empty,
                )
                if block["type"] == "output_text":
                    for piece in _pieces(block["text"]):
                        add(
                            "response.output_text.delta",
                            item_id=item["id"],
                            output_index=index,
                            content_index=ci,
                            delta=piece,
                            logprobs=[],
                        )
                    add(
                        "response.output_text.done",
                        item_id=item["id"],
                        output_index=index,
                        content_index=ci,
                        text=block["text"],
                        logprobs=[],
                    )
                else:
                    add(
                        "response.refusal.delta",
                        item_id=item["id"],
                        output_index=index,
                        content_index=ci,
                        delta=block["refusal"],
                    )
                add(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=ci,
                    part=block,
                )
        elif kind == "function_call":
            add("response.output_item.added", output_index=index, item=dict(item, arguments=""))
            for piece in _pieces(item["arguments"]):
                add(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=piece,
                )
            add(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=item["arguments"],
            )
        elif kind == "reasoning":
            add("response.output_item.added", output_index=index, item=dict(item, summary=[]))
            for si, part in enumerate(item["summary"]):
                for piece in _pieces(part["text"]):
                    add(
                        "response.reasoning_summary_text.delta",
                        item_id=item["id"],
                        output_index=index,
                        summary_index=si,
                        delta=piece,
                    )
        add("response.output_item.done", output_index=index, item=item)
    terminal = {
        "completed": "response.completed",
        "incomplete": "response.incomplete",
        "failed": "response.failed",
    }[final["status"]]
    add(terminal, response=final)
    return events


def sse(final: dict, **kw: Any) -> Reply:
    return Reply(events=response_events(final), **kw)


# -- Chat Completions shapes ---------------------------------------------------


def chat_usage(prompt=10, completion=5, cached=0, reasoning=0, cache_write=None) -> dict:
    details: dict = {"cached_tokens": cached}
    if cache_write is not None:
        details["cache_write_tokens"] = cache_write
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": details,
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


def chat_call(call_id: str, name: str, arguments: Any) -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def completion(
    content: str | None = None,
    *,
    tool_calls: list[dict] | None = None,
    finish: str | None = "stop",
    refusal: str | None = None,
    use: dict | None = None,
    model: str = "local-model",
    no_usage: bool = False,
) -> dict:
    message: dict = {"role": "assistant", "content": content, "refusal": refusal}
    if tool_calls:
        message["tool_calls"] = tool_calls
    out = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
    }
    if not no_usage:
        out["usage"] = use if use is not None else chat_usage()
    return out


def chat_chunks(done: dict, *, with_usage: bool = True) -> list[tuple[None, Any]]:
    """The SSE ``data:`` chunks a Chat Completions stream sends for completion ``done``."""
    base = {
        "id": done["id"],
        "object": "chat.completion.chunk",
        "created": done["created"],
        "model": done["model"],
    }
    choice = done["choices"][0]
    message = choice["message"]

    def chunk(delta: dict, finish: str | None = None) -> tuple[None, dict]:
        return None, dict(
            base, choices=[{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
        )

    chunks = [chunk({"role": "assistant", "content": ""})]
    for piece in _pieces(message.get("content") or ""):
        chunks.append(chunk({"content": piece}))
    if message.get("refusal"):
        chunks.append(chunk({"refusal": message["refusal"]}))
    for index, call in enumerate(message.get("tool_calls") or []):
        head = {
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        chunks.append(chunk({"tool_calls": [head]}))
        for piece in _pieces(call["function"]["arguments"]):
            chunks.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            )
    chunks.append(chunk({}, choice["finish_reason"]))
    if with_usage and done.get("usage") is not None:
        chunks.append((None, dict(base, choices=[], usage=done["usage"])))
    chunks.append((None, "[DONE]"))
    return chunks


def chat_sse(done: dict, *, with_usage: bool = True, **kw: Any) -> Reply:
    return Reply(events=chat_chunks(done, with_usage=with_usage), **kw)


def error_reply(status: int, message: str = "boom", code: str | None = None) -> Reply:
    return Reply(
        status=status,
        body={"error": {"message": message, "type": "invalid_request_error", "code": code}},
    )
