"""Test kit: a scripted fake model, request hashes and registry reset.

Nothing here needs a provider SDK.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from composeai import _core
from composeai.errors import ComposeError, ConfigError
from composeai.messages import Message, StopReason, TextPart, ThinkingPart, ToolCallPart, Usage
from composeai.models._cache import (
    CachingModel,
    _canonical_hash,  # noqa: F401 -- importable from here as before
    compute_full_hash,
    compute_message_hash,
)
from composeai.models.base import ModelRequest, ModelResponse, RawStreamEvent, new_response

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator, Sequence

__all__ = [
    "CachingModel",
    "FakeModel",
    "RecordingModel",
    "ReplayModel",
    "ReplayReport",  # noqa: F822 -- provided lazily by the module __getattr__
    "cassette",  # noqa: F822 -- provided lazily by the module __getattr__
    "compute_full_hash",
    "compute_message_hash",
    "fake_clock",
    "record_cassette",
    "replay",  # noqa: F822 -- provided lazily by the module __getattr__
    "replay_cassette",
    "reset_registries",
]


# --------------------------------------------------------------------------- hashes (TEST-22)


# --------------------------------------------------------------------------- streaming (TEST-5)

_TOKENS = re.compile(r"\S+|\s+")


def _synthesize_events(response: ModelResponse) -> list[RawStreamEvent]:
    """The stream events equivalent to ``response``, ending with ``response_done``."""
    events: list[RawStreamEvent] = []
    for part in response.message.parts:
        if isinstance(part, TextPart):
            events.extend(RawStreamEvent("text_delta", text=t) for t in _TOKENS.findall(part.text))
        elif isinstance(part, ThinkingPart):
            events.extend(
                RawStreamEvent("thinking_delta", text=t) for t in _TOKENS.findall(part.text)
            )
        elif isinstance(part, ToolCallPart):
            events.append(
                RawStreamEvent("tool_call_started", tool_call_id=part.id, tool_name=part.name)
            )
            events.append(
                RawStreamEvent(
                    "tool_args_delta",
                    text=json.dumps(part.arguments),
                    tool_call_id=part.id,
                    tool_name=part.name,
                )
            )
            events.append(
                RawStreamEvent("tool_call_finished", tool_call_id=part.id, tool_name=part.name)
            )
    events.append(RawStreamEvent("response_done", response=response))
    return events


async def _aiter(events: list[RawStreamEvent]) -> AsyncIterator[RawStreamEvent]:
    for event in events:
        yield event


# --------------------------------------------------------------------------- FakeModel


# Usage is frozen: every reply can share one.
_DEFAULT_USAGE = Usage(input_tokens=10, output_tokens=20, cost_complete=False)


class FakeModel:
    """A scripted ``Model``: one script item is consumed per call.

    Item forms: a ``str`` (text reply), ``{"tool_calls": [...], "text": ...}``,
    ``{"json": payload}``, a ``ModelResponse`` (returned unchanged) or a callable taking the
    ``ModelRequest`` and returning one of the former. Every request is recorded in
    ``requests``. There is deliberately no ``model_id`` attribute.

    The script follows the conversation, so a run resumed in a fresh process (after an
    approval pause or a crash) continues where it is: the n-th model turn of an agent's
    conversation gets the n-th item. When a request's conversation holds assistant turns
    this FakeModel did not answer itself, and the next script items are the ones that
    produced them (same text, same tool calls; a callable item counts as the same), those
    items are skipped as already used. History written by hand that does not match the
    script skips nothing, so a script holding only the remaining replies works too.

    A dict item with a key outside ``tool_calls``/``text``/``json`` (or a tool call with
    a key outside ``name``/``arguments``/``id``) raises ``ConfigError`` here, naming it.
    """

    def __init__(self, script: list, *, usage: Usage | None = None) -> None:
        for item in script:
            _check_keys(item)
        self.script = list(script)
        self.requests: list[ModelRequest] = []
        self._usage = usage
        self._lock = threading.Lock()
        # Per conversation (keyed by its system prompt and first message): how many of
        # its assistant turns this instance accounted for.
        self._turns: dict[tuple, int] = {}

    def __repr__(self) -> str:
        return f"FakeModel(<{len(self.script)} scripted item(s) left>)"

    def _next_item(self, request: ModelRequest) -> Any:
        with self._lock:
            self.requests.append(request)
            messages = request.messages
            replies = [m for m in messages if m.role == "assistant"]
            if messages:
                first = messages[0]
                key: tuple = (request.system, first.role, len(first.parts), first.text)
                unseen = replies[self._turns.get(key, 0) :]
                # Turns answered by an earlier process: their items were used there.
                while unseen and self.script and _produced(self.script[0], unseen[0]):
                    self.script.pop(0)
                    unseen.pop(0)
                self._turns[key] = len(replies) + 1
            if not self.script:
                raise ComposeError(
                    f"FakeModel script exhausted after {len(self.requests)} request(s): "
                    "no more scripted responses left"
                )
            return self.script.pop(0)

    def _respond(self, request: ModelRequest) -> ModelResponse:
        item = self._next_item(request)
        if callable(item) and not isinstance(item, ModelResponse):
            item = item(request)
        return self._interpret(item, request)

    def _interpret(self, item: Any, request: ModelRequest) -> ModelResponse:
        if isinstance(item, ModelResponse):
            return item
        usage = self._usage if self._usage is not None else _DEFAULT_USAGE
        if isinstance(item, str):
            return new_response(
                Message.assistant(item), StopReason.END_TURN, "end_turn", usage, request.model
            )
        if isinstance(item, dict):
            _check_keys(item)
            if "tool_calls" in item:
                return self._tool_calls(item, request, usage)
            if "json" in item:
                payload = item["json"]
                return ModelResponse(
                    message=Message.assistant(json.dumps(payload)),
                    stop_reason=StopReason.END_TURN,
                    raw_stop_reason="end_turn",
                    usage=usage,
                    model_id=request.model,
                    parsed=payload,
                )
        raise _unrecognized(item)

    def _tool_calls(self, item: dict, request: ModelRequest, usage: Usage) -> ModelResponse:
        calls = item["tool_calls"]
        if not isinstance(calls, (list, tuple)):
            raise _unrecognized(item)
        parts: list[Any] = []
        text = item.get("text")
        if text:
            parts.append(TextPart(text=text))
        for call in calls:
            if not isinstance(call, dict) or "name" not in call:
                raise _unrecognized(item)
            arguments = call.get("arguments")
            parts.append(
                ToolCallPart(
                    id=call.get("id") or _core.ulid(),
                    name=call["name"],
                    arguments={} if arguments is None else arguments,
                )
            )
        return ModelResponse(
            message=Message(role="assistant", parts=parts),
            stop_reason=StopReason.TOOL_USE,
            raw_stop_reason="tool_use",
            usage=usage,
            model_id=request.model,
        )

    def complete(self, request: ModelRequest) -> ModelResponse:
        return self._respond(request)

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        return self._respond(request)

    def stream(self, request: ModelRequest) -> Iterator[RawStreamEvent]:
        # The item is consumed (and the request recorded) at call time, not lazily.
        return iter(_synthesize_events(self._respond(request)))

    def astream(self, request: ModelRequest) -> AsyncIterator[RawStreamEvent]:
        return _aiter(_synthesize_events(self._respond(request)))


def _unrecognized(item: Any) -> ComposeError:
    return ComposeError(f"FakeModel: unrecognized script item {item!r}")


_ITEM_KEYS = ("tool_calls", "text", "json")
_CALL_KEYS = ("name", "arguments", "id")


def _check_keys(item: Any) -> None:
    """Refuses a misspelt key in a dict item or one of its tool calls."""
    if type(item) is not dict:
        return
    for key in item:
        if key not in _ITEM_KEYS:
            raise ConfigError(
                f"FakeModel: unknown key {key!r} in script item {item!r}; "
                f"valid keys: {', '.join(_ITEM_KEYS)}"
            )
    calls = item.get("tool_calls")
    if isinstance(calls, (list, tuple)):
        for call in calls:
            if isinstance(call, dict):
                for key in call:
                    if key not in _CALL_KEYS:
                        raise ConfigError(
                            f"FakeModel: unknown key {key!r} in tool call {call!r}; "
                            f"valid keys: {', '.join(_CALL_KEYS)}"
                        )


def _produced(item: Any, message: Message) -> bool:
    """Whether script item ``item`` yields the assistant ``message``."""
    if callable(item) and not isinstance(item, ModelResponse):
        return True
    if isinstance(item, ModelResponse):
        return item.message == message
    if isinstance(item, str):
        return message.text == item and not any(isinstance(p, ToolCallPart) for p in message.parts)
    if isinstance(item, dict):
        if "tool_calls" in item and isinstance(item["tool_calls"], (list, tuple)):
            made = [p for p in message.parts if isinstance(p, ToolCallPart)]
            wanted = item["tool_calls"]
            if len(made) != len(wanted) or (item.get("text") or "") != message.text:
                return False
            for part, call in zip(made, wanted):
                if not isinstance(call, dict) or part.name != call.get("name"):
                    return False
                if part.arguments != (call.get("arguments") or {}):
                    return False
                if call.get("id") and part.id != call["id"]:
                    return False
            return True
        if "json" in item:
            return message.text == json.dumps(item["json"])
    return False


# --------------------------------------------------------------------------- cassettes (TEST-20 …)

CASSETTE_VERSION = 2

_NESTED_CASSETTE = (
    "record_cassette()/replay_cassette() cannot be nested -- registry.resolve() is already "
    "intercepted by another active cassette context. Nesting isn't supported: a plain "
    "save/restore of registry.resolve means whichever context exits last would clobber the "
    "other's interception. Close the outer cassette context first, or record/replay "
    "everything through one shared context instead."
)

# Whether a cassette context currently intercepts ``registry.resolve`` (TEST-25).
_cassette_lock = threading.Lock()
_cassette_active = False


def _cassette_entry(request: ModelRequest, response: ModelResponse) -> dict[str, Any]:
    """One cassette entry: both hashes, the request's conversation, the response."""
    from composeai import _codec

    return {
        "full_hash": compute_full_hash(request),
        "message_hash": compute_message_hash(request.system, request.messages),
        "request": {
            "model": request.model,
            "system": request.system,
            "messages": [m.model_dump(mode="json") for m in request.messages],
        },
        "response": _codec.encode(response),
    }


class RecordingModel:
    """Passes every call through to ``inner`` and appends one cassette entry per completed
    call to ``entries``. Stream methods exist only where ``inner`` has them; a
    stream is recorded from its ``response_done`` event."""

    def __init__(self, inner: Any, entries: list[dict[str, Any]]) -> None:
        self.inner = inner
        self.entries = entries
        model_id = getattr(inner, "model_id", None)
        if model_id:
            self.model_id = model_id
        if getattr(inner, "stream", None) is not None:
            self.stream = self._stream
        if getattr(inner, "acomplete", None) is not None:
            self.acomplete = self._acomplete
        if getattr(inner, "astream", None) is not None:
            self.astream = self._astream

    def __repr__(self) -> str:
        return f"RecordingModel({self.inner!r})"

    def complete(self, request: ModelRequest) -> ModelResponse:
        response = self.inner.complete(request)
        self.entries.append(_cassette_entry(request, response))
        return response

    async def _acomplete(self, request: ModelRequest) -> ModelResponse:
        response = await self.inner.acomplete(request)
        self.entries.append(_cassette_entry(request, response))
        return response

    def _stream(self, request: ModelRequest) -> Iterator[RawStreamEvent]:
        for event in self.inner.stream(request):
            if event.kind == "response_done" and event.response is not None:
                self.entries.append(_cassette_entry(request, event.response))
            yield event

    async def _astream(self, request: ModelRequest) -> AsyncIterator[RawStreamEvent]:
        async for event in self.inner.astream(request):
            if event.kind == "response_done" and event.response is not None:
                self.entries.append(_cassette_entry(request, event.response))
            yield event


class ReplayModel:
    """Answers requests from recorded cassette entries, each used at most once:
    the first unused entry whose ``full_hash`` matches, else the first unused whose
    ``message_hash`` matches (exported cassettes carry no full hash)."""

    def __init__(self, entries: Sequence[dict[str, Any]]) -> None:
        self.entries = list(entries)
        self._used = [False] * len(self.entries)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ReplayModel(<{self._used.count(False)} of {len(self.entries)} entries unused>)"

    def _take(self, request: ModelRequest) -> dict[str, Any]:
        full = compute_full_hash(request)
        message = compute_message_hash(request.system, request.messages)
        with self._lock:
            for field, wanted in (("full_hash", full), ("message_hash", message)):
                for i, entry in enumerate(self.entries):
                    if not self._used[i] and entry.get(field) == wanted:
                        self._used[i] = True
                        return entry
        raise ComposeError(
            f"no cassette entry matches this request (model='{request.model}', "
            f"full_hash='{full}', message_hash='{message}') -- re-record the cassette "
            "(e.g. COMPOSE_RECORD=1) if the request legitimately changed"
        )

    def complete(self, request: ModelRequest) -> ModelResponse:
        from composeai import _codec

        entry = self._take(request)
        response = _codec.decode(entry.get("response"))
        if not isinstance(response, ModelResponse):
            raise ComposeError(
                f"cassette entry for message_hash '{entry.get('message_hash')}' holds "
                f"{type(response).__name__}, not a ModelResponse -- re-record the cassette"
            )
        return response

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        return self.complete(request)

    def stream(self, request: ModelRequest) -> Iterator[RawStreamEvent]:
        return iter(_synthesize_events(self.complete(request)))

    def astream(self, request: ModelRequest) -> AsyncIterator[RawStreamEvent]:
        return _aiter(_synthesize_events(self.complete(request)))


@contextlib.contextmanager
def _intercept_resolve(make: Callable[[Any], Any]) -> Iterator[None]:
    """Swaps ``registry.resolve`` for ``make(original)`` for the block, refusing a
    second active cassette context before anything is touched."""
    global _cassette_active
    from composeai.models import registry

    with _cassette_lock:
        if _cassette_active:
            raise ConfigError(_NESTED_CASSETTE)
        _cassette_active = True
    original = registry.resolve
    try:
        registry.resolve = make(original)
        yield
    finally:
        registry.resolve = original
        with _cassette_lock:
            _cassette_active = False


@contextlib.contextmanager
def record_cassette(path: str | os.PathLike[str]) -> Iterator[list[dict[str, Any]]]:
    """Record every model call made in the block to the cassette at ``path``.

    The file is written when the block exits, also when it raised, in full regardless of
    ``COMPOSE_TRACE_CONTENT``. Yields the list of entries recorded so far.
    """
    entries: list[dict[str, Any]] = []

    def make(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def resolve(model: Any) -> Any:
            return RecordingModel(original(model), entries)

        return resolve

    with _intercept_resolve(make):
        try:
            yield entries
        finally:
            target = Path(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            text = json.dumps({"version": CASSETTE_VERSION, "entries": list(entries)}, indent=2)
            target.write_text(text, encoding="utf-8")


def _read_cassette(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read cassette {path}: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"cassette {path} is not valid JSON: {exc}") from None
    version = data.get("version") if isinstance(data, dict) else None
    if version != CASSETTE_VERSION:
        raise ConfigError(
            f"cassette {path} is version {version!r}, expected {CASSETTE_VERSION} -- re-record "
            "it (e.g. `COMPOSE_RECORD=1` against the real provider, or `compose export` again "
            "from a persisted run) to pick up the current hash format"
        )
    entries = data.get("entries")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(f"cassette {path} has no list of entries under 'entries'")
    return entries


@contextlib.contextmanager
def replay_cassette(path: str | os.PathLike[str]) -> Iterator[ReplayModel]:
    """Answer every model call in the block from the cassette at ``path``: every
    model resolves to one shared ``ReplayModel``; no adapter or SDK is constructed."""
    with _cassette_lock:
        if _cassette_active:
            raise ConfigError(_NESTED_CASSETTE)
    model = ReplayModel(_read_cassette(path))
    with _intercept_resolve(lambda _original: lambda _model: model):
        yield model


def _use_cassette(path: str | os.PathLike[str]) -> contextlib.AbstractContextManager[Any]:
    """``COMPOSE_RECORD=1`` records (overwriting); else an existing file replays;
    else the block runs live, untouched."""
    if os.environ.get("COMPOSE_RECORD") == "1":
        return record_cassette(path)
    if Path(path).exists():
        return replay_cassette(path)
    return contextlib.nullcontext()


def _make_cassette_fixture() -> Any:
    import pytest

    @pytest.fixture
    def cassette() -> Iterator[Callable[[str | os.PathLike[str]], Any]]:
        """Yields ``use(path)``: a context manager that records, replays or passes through
        model calls per ``COMPOSE_RECORD`` and whether ``path`` exists."""
        yield _use_cassette

    return cassette


def __getattr__(name: str) -> Any:
    # ``cassette`` imports pytest only when a test suite asks for it (TEST-30), so
    # ``import composeai.testing`` stays cheap in programs that never use it.
    if name == "cassette":
        import importlib.util

        fixture = _make_cassette_fixture() if importlib.util.find_spec("pytest") else None
        globals()["cassette"] = fixture
        return fixture
    if name in ("replay", "ReplayReport"):
        # The replayer (issue 27) loads the engine's flow machinery on first use.
        from composeai import _replay

        value = getattr(_replay, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------- registries (TEST-50)


def reset_registries() -> None:
    """Forget every ``@agent``, ``@flow`` and ``@task`` name."""
    # (``composeai.flow`` the attribute is the @flow decorator, so import the function.)
    from composeai.flow import reset_registries as reset_flows_and_tasks

    reset_flows_and_tasks()
    agentfn = sys.modules.get("composeai.agentfn")
    agents = getattr(agentfn, "_AGENTS", None) if agentfn is not None else None
    if agents is not None:
        agents.clear()


# --------------------------------------------------------------------------- engine clock (EXT-12)


class FakeClock:
    """The engine clock while `fake_clock` is active: every durable timer,
    deadline and `now()` of this process reads it."""

    def now(self):
        from datetime import datetime, timezone

        return datetime.fromtimestamp(_core.clock_now(), timezone.utc)

    def advance(self, delta) -> None:
        """Moves time forward (seconds or a `timedelta`); blocked runs whose
        deadline passed wake up."""
        from datetime import timedelta

        if isinstance(delta, timedelta):
            seconds = delta.total_seconds()
        elif isinstance(delta, (int, float)) and not isinstance(delta, bool):
            seconds = float(delta)
        else:
            raise TypeError(f"advance() takes seconds or a timedelta, got {type(delta).__name__}")
        if seconds < 0:
            raise ValueError(f"advance() cannot move the clock backwards ({seconds}s)")
        _core.clock_advance(seconds)


class _FakeClockContext:
    def __init__(self, start) -> None:
        from datetime import datetime

        if start is not None and (not isinstance(start, datetime) or start.tzinfo is None):
            raise ValueError("fake_clock(start=...) takes an aware datetime")
        self._start = start
        self._previous: float | None = None

    def __enter__(self) -> FakeClock:
        self._previous = _core.clock_now() if _core.clock_is_fake() else None
        start = self._start.timestamp() if self._start is not None else _core.clock_now()
        _core.clock_set_fake(start)
        return FakeClock()

    def __exit__(self, *exc: object) -> None:
        _core.clock_set_fake(self._previous)


def fake_clock(start=None) -> _FakeClockContext:
    """Replaces the engine clock process-wide for the `with` block
    (`start`: an aware datetime, default now); yields a `FakeClock`."""
    return _FakeClockContext(start)
