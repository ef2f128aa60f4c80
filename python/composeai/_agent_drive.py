"""The drivers of the agent loop: the sync driver performs its I/O on the
calling thread, the async driver awaits it on the caller's loop (so both
surfaces run the same logic); and how a loop starts (seed, body, snapshot).
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from . import _codec, _core, _engine
from ._agent_call import _Call, _check_cancel, _current_bus, _has
from ._agent_loop import _direct_turn, _loop, _pending_calls
from ._agent_tools import _run_tool_async, _run_tool_sync, _ToolJob
from ._engine import FRAME, Frame
from .errors import (
    ComposeError,
    ConfigError,
)
from .messages import Message, StopReason
from .models.base import ModelRequest

if TYPE_CHECKING:
    # `agentfn.AgentFunction`: that module sits above this one.
    AgentFunction = Any


# ---------------------------------------------------------------------------
# Drivers


class _TokenSink:
    """Appends an agent call's text deltas to a stream of its run
    (`@agent(stream_to=...)`), in batches of up to `_SINK_DELTAS` deltas or
    `_SINK_SECONDS` of them, so a token costs no commit of its own."""

    __slots__ = ("attempt", "first", "key", "texts")

    def __init__(self, attempt: Any, key: str) -> None:
        self.attempt = attempt
        self.key = key
        self.texts: list[str] = []
        self.first = 0.0

    def add(self, text: str) -> None:
        if not self.texts:
            self.first = time.monotonic()
        self.texts.append(_codec.dumps(text))
        if len(self.texts) >= _SINK_DELTAS or time.monotonic() - self.first >= _SINK_SECONDS:
            self.flush()

    def flush(self) -> None:
        if self.texts:
            texts, self.texts = self.texts, []
            _core.attempt_append_stream(self.attempt, self.key, texts)


_SINK_DELTAS = 64
_SINK_SECONDS = 0.05


def _token_sink(call: _Call) -> _TokenSink | None:
    key = getattr(call.agent, "stream_to", None)
    run = call.frame.run
    if key is None or run is None:
        return None
    return _TokenSink(run.attempt, key)


def _invoke_model_sync(call: _Call, request: ModelRequest, span) -> Any:
    model = call.model
    sink = _token_sink(call)
    if _current_bus() is not None or sink is not None:
        if _has(model, "stream"):
            return _consume_stream(call, model.stream(request), span, sink)
        if _has(model, "astream"):
            from . import _runtime

            return _runtime.run_sync(
                lambda: _aconsume_stream(call, model.astream(request), span, sink)
            )
    if not _has(model, "complete") and _has(model, "acomplete"):
        from . import _runtime

        return _runtime.run_sync(lambda: model.acomplete(request))
    return model.complete(request)


def _emit_stream_event(call: _Call, event: Any, span) -> None:
    from .events import Event, emit

    kind = event.kind
    if kind in ("text_delta", "thinking_delta"):
        emit(
            Event(
                kind, trace_id=span.trace_id, span_id=span.span_id, name=call.label, text=event.text
            )
        )
    elif kind in ("tool_call_started", "tool_args_delta", "tool_call_finished"):
        emit(
            Event(
                kind,
                trace_id=span.trace_id,
                span_id=span.span_id,
                name=event.tool_name,
                text=event.text if kind == "tool_args_delta" else None,
                data={"id": event.tool_call_id},
            )
        )


def _stream_missing_done(call: _Call) -> ComposeError:
    return ComposeError(
        f"Model.stream() for '{call.label}' ended without yielding a response_done event -- "
        "adapters must always yield exactly one, as their final event"
    )


def _consume_stream(call: _Call, events, span, sink: _TokenSink | None = None) -> Any:
    response = None
    try:
        for event in events:
            _check_cancel()
            if event.kind == "response_done":
                response = event.response
                break
            if sink is not None and event.kind == "text_delta":
                sink.add(event.text)
            _emit_stream_event(call, event, span)
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()
        if sink is not None:
            sink.flush()
    if response is None:
        raise _stream_missing_done(call)
    return response


def _run_batch_sync(call: _Call, jobs: list[_ToolJob]) -> list[Any]:
    """Runs a tool batch concurrently, one thread per call beyond the first
    (a tool may block or call other agents, so no shared pool)."""
    if len(jobs) == 1:
        return [_run_tool_sync(call, jobs[0])]
    from contextvars import copy_context

    outcomes: list[Any] = [None] * len(jobs)
    errors: list[BaseException | None] = [None] * len(jobs)

    def work(i: int) -> None:
        try:
            outcomes[i] = _run_tool_sync(call, jobs[i])
        except BaseException as exc:  # noqa: BLE001 -- re-raised by the waiting side
            errors[i] = exc

    threads = []
    for i in range(1, len(jobs)):
        ctx = copy_context()
        t = threading.Thread(target=ctx.run, args=(work, i), name="composeai-tool", daemon=True)
        t.start()
        threads.append(t)
    work(0)
    for t in threads:
        t.join()
    for err in errors:
        if err is not None:
            raise err
    return outcomes


def _perform_sync(effect: tuple) -> Any:
    kind = effect[0]
    if kind == "model":
        _, call, request, span = effect
        return _invoke_model_sync(call, request, span)
    if kind == "tools":
        _, call, jobs = effect
        return _run_batch_sync(call, jobs)
    _, fn, args = effect
    return fn(*args)


def _drive_sync(gen: Generator) -> Any:
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = gen.send(value) if error is None else gen.throw(error)
        except StopIteration as stop:
            return stop.value
        value, error = None, None
        try:
            value = _perform_sync(effect)
        except BaseException as exc:  # noqa: BLE001 -- thrown back into the loop
            error = exc


async def _invoke_model_async(call: _Call, request: ModelRequest, span) -> Any:
    model = call.model
    sink = _token_sink(call)
    streaming = _current_bus() is not None or sink is not None
    if streaming and _has(model, "astream"):
        return await _aconsume_stream(call, model.astream(request), span, sink)
    if streaming and _has(model, "stream"):
        return await _off_loop(lambda: _consume_stream(call, model.stream(request), span, sink))
    if _has(model, "acomplete"):
        return await model.acomplete(request)
    return await _off_loop(lambda: model.complete(request))


async def _aconsume_stream(call: _Call, events, span, sink: _TokenSink | None = None) -> Any:
    """The async twin of `_consume_stream`: a cancel seen between events
    stops here, and the model's stream is closed before anything else runs."""
    response = None
    try:
        async for event in events:
            _check_cancel()
            if event.kind == "response_done":
                response = event.response
                break
            if sink is not None and event.kind == "text_delta":
                sink.add(event.text)
            _emit_stream_event(call, event, span)
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
        if sink is not None:
            sink.flush()
    if response is None:
        raise _stream_missing_done(call)
    return response


async def _off_loop(fn: Callable[[], Any]) -> Any:
    """Runs a sync call (model, callback) on a thread of its own, with a
    fence of its own so that abandoning it revokes nothing else."""
    frame = FRAME.get()
    if frame is not None:
        frame = Frame(frame.run, frame.scope, frame.span, _engine.child_fence(frame), frame.trace)
    return await _engine.run_on_thread_async(
        fn, frame, None, lambda: RuntimeError("unreachable"), "composeai-offloop"
    )


async def _perform_async(effect: tuple) -> Any:
    kind = effect[0]
    if kind == "model":
        _, call, request, span = effect
        return await _invoke_model_async(call, request, span)
    if kind == "tools":
        import asyncio

        _, call, jobs = effect
        return list(await asyncio.gather(*(_run_tool_async(call, job) for job in jobs)))
    _, fn, args = effect
    return await _off_loop(lambda: fn(*args))


async def _drive_async(gen: Generator) -> Any:
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = gen.send(value) if error is None else gen.throw(error)
        except StopIteration as stop:
            return stop.value
        value, error = None, None
        try:
            value = await _perform_async(effect)
        except BaseException as exc:  # noqa: BLE001 -- thrown back into the loop
            error = exc


# ---------------------------------------------------------------------------
# Starting the loop: seed, body, snapshot


def _seed_from_body(agent: AgentFunction, result: Any) -> list[Message]:
    if isinstance(result, str):
        return [Message.user(result)]
    if isinstance(result, list) and all(isinstance(m, Message) for m in result):
        return list(result)
    raise ConfigError(
        f"@agent function {agent.name!r} must return a str (the user prompt) or a "
        f"list[Message] (the full conversation) from its body, got {type(result)!r}"
    )


def _restore(call: _Call) -> bool:
    """Loads the call's snapshot, if any."""
    if not call.restorable or not call.durable:
        return False
    assert call.run is not None  # `durable` says so
    row = call.run.attempt.load_agent_state(call.snapshot_scope)
    if row is None:
        return False
    messages_json, partial_json, turn = row
    call.messages = list(_codec.loads(messages_json))
    call.partial = dict(_codec.loads(partial_json)) if partial_json else {}
    call.turn = turn
    return True


def _restore_or_seed(call: _Call) -> bool:
    """The conversation from a snapshot, else from a chat's seed;
    False when the body must provide it."""
    if _restore(call):
        return True
    if call.seed is not None:
        call.messages = list(call.seed)
        return True
    return False


def _agent_loop_sync(call: _Call, args: tuple, kwargs: dict) -> Any:
    driver = _engine.driven_synchronously()
    try:
        return _agent_loop_sync_body(call, args, kwargs)
    finally:
        _engine.ASYNC_DRIVER.reset(driver)


def _agent_loop_sync_body(call: _Call, args: tuple, kwargs: dict) -> Any:
    agent = call.agent
    call.resolve_model()
    if not _restore_or_seed(call):
        if agent._is_async:
            from . import _runtime

            body = _runtime.run_sync(lambda: agent.fn(*args, **kwargs))
        else:
            body = agent.fn(*args, **kwargs)
            if type(body) is not str and inspect.iscoroutine(body):
                from . import _runtime

                body = _runtime.run_sync(lambda: body)
        call.messages = [Message.user(body)] if type(body) is str else _seed_from_body(agent, body)
    # `_direct_turn` makes the first turn when nothing could make the loop
    # call the model again or act before the call.
    if (
        call.turn == 0
        and agent.retries == 0
        and agent.retry is None
        and agent.fallback is None
        and agent.timeout is None
        and (agent.max_turns is None or agent.max_turns >= 1)
        and call.context_manager is None
        and _current_bus() is None
        and agent.stream_to is None
        and _has(call.model, "complete")
        and not (call.messages and _pending_calls(call.messages[-1]))
    ):
        response = _direct_turn(call)
        if response.stop_reason == StopReason.END_TURN and agent._schema is None:
            return response.message.text
        return _drive_sync(_loop(call, response))
    return _drive_sync(_loop(call))


async def _agent_loop_async(call: _Call, args: tuple, kwargs: dict) -> Any:
    driver = _engine.driven_by_running_loop()
    try:
        return await _agent_loop_async_body(call, args, kwargs)
    finally:
        _engine.ASYNC_DRIVER.reset(driver)


async def _agent_loop_async_body(call: _Call, args: tuple, kwargs: dict) -> Any:
    call.resolve_model()
    if not _restore_or_seed(call):
        agent = call.agent
        body = agent.fn(*args, **kwargs)
        if inspect.iscoroutine(body):
            body = await body
        call.messages = _seed_from_body(agent, body)
    return await _drive_async(_loop(call))
