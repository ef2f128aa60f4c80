"""Durable waits as the engine decides them.

A wait is a journaled step. The core decides it from the journal and the
store's timers/signals/cancel-request tables: ready, block in place (the
default), or park (the run settles `paused` with a `timer`/`signal`
interrupt, for `wait=False` and the worker). This module turns the core's
decision into a value, a trace span or a pause; `composeai.durable` builds
the public primitives on it, and `@flow(retry=...)` its run retries.
"""

from __future__ import annotations

import time

from . import _codec, _core, _engine
from ._cancel import current_cancel_token
from ._engine import FRAME, Frame, RunState, _Pause

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Literal

    from .tracing import Span


# ---------------------------------------------------------------------------
# Waits


def _run_of(frame: Frame) -> RunState:
    """The run of a frame inside a flow: every frame the primitives below
    are given comes from `_in_flow` or a flow body, so it has one."""
    run = frame.run
    assert run is not None
    return run


def _span_of(frame: Frame) -> Span:
    """The enclosing span of a frame inside a flow (its root span at least)."""
    span = frame.span
    assert span is not None
    return span


def _mode(frame: Frame, is_async: bool) -> Literal["block", "poll", "park"]:
    if _run_of(frame).park:
        return "park"
    return "poll" if is_async else "block"


def _settled(frame: Frame, wait: Any, outcome: tuple) -> Any:
    """Traces a decided wait and returns its value, or raises the pause."""
    kind, value_json, number, park = outcome
    run = _run_of(frame)
    now = time.time()
    if kind == "park":
        interrupt_id, interrupt_kind, payload_json = park
        payload = _codec.loads(payload_json) if payload_json is not None else None
        span = _engine.open_span(frame.span, frame.trace, "pause", wait.key)
        span.attributes["step_key"] = wait.key
        span.ended_at = span.started_at
        span.status = "paused"
        if payload is not None and _engine._capture():
            span.input = payload
        _engine.persist_span(run, span)
        raise _Pause(interrupt_id, interrupt_kind, None, payload)
    value = _codec.loads(value_json) if value_json is not None else None
    if wait.journaled and number is None:
        # Satisfied in an earlier attempt: a replayed step.
        from .tracing import Span

        parent = _span_of(frame)
        span = Span(
            trace_id=parent.trace_id,
            span_id=_core.ulid(),
            parent_span_id=parent.span_id,
            kind="pause",
            name=wait.key,
            started_at=now,
            ended_at=now,
            status="ok",
            attributes={"step_key": wait.key},
            replayed=True,
        )
        frame.trace.spans.append(span)
        run.attempt.replayed(span.span_id, parent.span_id, "pause", wait.key, now, wait.key, False)
        return value
    span = _engine.open_span(frame.span, frame.trace, "pause", wait.key)
    span.attributes["step_key"] = wait.key
    if number is not None:
        # The span covers the whole wait, also across a park.
        span.started_at = min(number, now)
    span.ended_at = now
    span.status = "ok"
    if value is not None and _engine._capture():
        span.output = value
    _engine.persist_span(run, span)
    return value


def _decide(frame: Frame, wait: Any) -> Any:
    mode = _mode(frame, False)
    token = _stream_token() if mode == "block" else None
    if token is None:
        return _settled(frame, wait, wait.resolve(mode))
    # Under a cancellable stream the wait also ends on `stream.cancel()`.
    while True:
        _engine._check_cancel()
        outcome = wait.resolve("poll")
        if outcome[0] != "block":
            return _settled(frame, wait, outcome)
        token.wait(outcome[2])


def _stream_token() -> Any:
    if not _engine._streams_loaded():
        return None
    return current_cancel_token()


async def _adecide(frame: Frame, wait: Any) -> Any:
    import asyncio

    mode = _mode(frame, True)
    while True:
        if _engine._streams_loaded():
            _engine._check_cancel()  # AsyncRunStream.cancel()
        outcome = wait.resolve(mode)
        if outcome[0] != "block":
            return _settled(frame, wait, outcome)
        await asyncio.sleep(outcome[2])


def _in_flow() -> Frame | None:
    frame = FRAME.get()
    if frame is None or frame.run is None:
        return None
    return frame


# ---------------------------------------------------------------------------
# Run retries (EXT-8)

RETRY = "__retry__"


def _retries_so_far(attempt: Any) -> tuple[int, str]:
    """How many failed attempts of the run are journaled, and the key the
    next failure is journaled under."""
    n = 0
    while True:
        key, hit = attempt.reserve("", RETRY, None)
        if hit is None:
            return n, key
        n += 1


def _schedule_retry(frame: Frame, policy: Any, n: int, key: str, exc: Exception) -> None:
    """Journals the failure and parks the run on the backoff timer; the next
    attempt (the worker, a blocking driver, or `resume`) runs the body again."""
    attempt = _run_of(frame).attempt
    record = {"type": type(exc).__name__, "message": str(exc)}
    attempt.commit(key, _codec.dumps(record), None, None)
    wait = _core.begin_sleep(attempt, key, policy.delay(n + 2), None)
    _settled(frame, wait, ("park", None, None, wait.park()))


def _retryable(policy: Any, n: int, exc: BaseException) -> bool:
    return isinstance(exc, Exception) and n + 1 < policy.max_attempts and policy.retries(exc)


def retrying_body(policy: Any, call: Any) -> Any:
    """A sync flow body under `@flow(retry=...)`: waits out a pending
    backoff, then runs; a retryable failure schedules the next attempt."""
    frame = FRAME.get()
    # A flow body runs in its run's frame.
    assert frame is not None
    attempt = _run_of(frame).attempt
    n, key = _retries_so_far(attempt)
    if n:
        _decide(frame, _core.begin_sleep(attempt, f"{RETRY}#{n}", 0.0, None))
    try:
        return call()
    except Exception as exc:
        if not _retryable(policy, n, exc):
            raise
        _schedule_retry(frame, policy, n, key, exc)


async def aretrying_body(policy: Any, call: Any) -> Any:
    """The async twin of `retrying_body`."""
    frame = FRAME.get()
    assert frame is not None
    attempt = _run_of(frame).attempt
    n, key = _retries_so_far(attempt)
    if n:
        await _adecide(frame, _core.begin_sleep(attempt, f"{RETRY}#{n}", 0.0, None))
    try:
        return await call()
    except Exception as exc:
        if not _retryable(policy, n, exc):
            raise
        _schedule_retry(frame, policy, n, key, exc)


def is_retry_park(run: Any) -> bool:
    pending = run.pending
    return (
        run.status == "paused" and pending is not None and pending.id.startswith(f"timer:{RETRY}#")
    )
