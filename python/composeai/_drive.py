"""Driving a durable run: its body on the calling thread (`drive_sync`) or
the caller's loop (`drive_async`), then its settlement (completed, paused,
cancelled or failed) in one transaction, and the `Run` it returns. Store
calls and settlements are written as plans, so the blocking and the async
drivers share every decision and differ only in how they wait.
"""

from __future__ import annotations

import time

from . import _codec
from ._engine import (
    ASYNC_DRIVER,
    FRAME,
    Frame,
    RunState,
    _Cancelled,
    _capture,
    _check_span_writes,
    _Pause,
    _RunCancelled,
    aget_store,
    attach_step_spans,
    driven_by_running_loop,
    driven_synchronously,
    emit_run_finished,
    error_json,
    fail_span,
    mark_failed,
    off_loop,
    persist_span,
)
from ._values import Run
from .errors import SerializationError
from .tracing import Span, Trace

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# A settlement is written as a plan: a generator that yields each
# `(run, settle arguments)` to commit and continues once it is durable (or
# gets the store's error thrown in), so the blocking and the async drivers
# share every decision and differ only in how they wait for the server.


def _settle_now(plan) -> Any:
    """Commits a settlement plan's writes in place."""
    try:
        run, args = next(plan)
        while True:
            try:
                run.attempt.settle(*args)
            except BaseException as exc:  # noqa: BLE001 -- handed to the plan
                run, args = plan.throw(exc)
            else:
                run, args = plan.send(None)
    except StopIteration as stop:
        return stop.value


async def _asettle_now(plan) -> Any:
    """Commits a settlement plan's writes, awaiting a server-backed store
    off the event loop."""
    try:
        run, args = next(plan)
        while True:
            try:
                await asettle(run.attempt, *args)
            except BaseException as exc:  # noqa: BLE001 -- handed to the plan
                run, args = plan.throw(exc)
            else:
                run, args = plan.send(None)
    except StopIteration as stop:
        return stop.value


# Store calls written as plans: generators that yield each call as `(call,
# acall, args)` and continue with its result (or get its error thrown in), so
# the blocking and the async drivers share every decision and differ only in
# how they wait. `acall` is the core's off-loop twin of `call` (it resolves an
# asyncio future), None where the store is local and its calls need no
# waiting for a server (ASYNC-1, STORE-2).


def plan_io(remote: bool, call: Callable[..., Any], acall: Callable[..., None], *args: Any):
    return (call, acall if remote else None, args)


def run_plan(plan) -> Any:
    """Runs a plan with each store call made in place."""
    try:
        call, _, args = next(plan)
        while True:
            try:
                value = call(*args)
            except BaseException as exc:  # noqa: BLE001 -- handed to the plan
                call, _, args = plan.throw(exc)
            else:
                call, _, args = plan.send(value)
    except StopIteration as stop:
        return stop.value


async def arun_plan(plan) -> Any:
    """Runs a plan on the running loop, awaiting each server call off it."""
    try:
        call, acall, args = next(plan)
        while True:
            try:
                if acall is None:
                    value = call(*args)
                else:
                    value = await off_loop(acall, *args)
            except BaseException as exc:  # noqa: BLE001 -- handed to the plan
                call, acall, args = plan.throw(exc)
            else:
                call, acall, args = plan.send(value)
    except StopIteration as stop:
        return stop.value


async def astart_run(*args: Any, **kwargs: Any) -> Any:
    """`get_store().start_run(*args, **kwargs)`, off the loop when the store is a server."""
    store = await aget_store()
    if store.kind == "sqlite":
        return store.start_run(*args, **kwargs)
    return await off_loop(store.astart_run, *args, **kwargs)


async def aresume_attempt(run_id: str, recover: bool = False) -> Any:
    """`get_store().resume(run_id, recover)`, off the loop when the store is a
    server."""
    store = await aget_store()
    if store.kind == "sqlite":
        return store.resume(run_id, recover)
    return await off_loop(store.aresume, run_id, recover)


async def asettle(attempt: Any, *args: Any) -> None:
    """`attempt.settle(*args)`, off the loop when the store is a server."""
    if attempt.remote:
        await off_loop(attempt.asettle, *args)
    else:
        attempt.settle(*args)


def settle_failed(run: RunState, exc: BaseException) -> None:
    return _settle_now(_settle_failed(run, exc))


def _settle_failed(run: RunState, exc: BaseException):
    if isinstance(exc, KeyboardInterrupt):
        err = _codec.dumps({"type": "CancelledError", "message": "cancelled"})
    else:
        err = error_json(exc)
    yield run, ("failed", None, err)
    _check_span_writes()


def _pending_row(pause: _Pause) -> tuple:
    payload_json = None
    if pause.payload is not None:
        try:
            payload_json = _codec.dumps(pause.payload)
        except SerializationError as exc:
            raise SerializationError(f"interrupt '{pause.interrupt_id}' payload: {exc}") from None
    return (pause.interrupt_id, pause.kind, pause.question, payload_json)


def drive_sync(run: RunState, body: Callable[[], Any], root: Span) -> Any:
    """Executes a durable run's body on the calling thread and settles the
    attempt. Returns `(status, output, pause)`; failures are re-raised
    unchanged after the row is marked failed."""
    frame = Frame(run, "", root, None, run.trace)
    token = FRAME.set(frame)
    driver = driven_synchronously()
    try:
        output = body()
        if run.started:
            join_started(run)
        run.attempt.check_complete()
    except BaseException as exc:  # noqa: BLE001 -- settled, re-raised unless a pause/cancel
        return settle_interrupted(run, root, _diverged(run, exc))
    finally:
        ASYNC_DRIVER.reset(driver)
        FRAME.reset(token)
    return settle_completed(run, root, output)


def _diverged(run: RunState, exc: BaseException) -> BaseException:
    """The run's `NondeterminismError` once its body diverged from the
    journal, whatever the body (a map item, a tool) made of it."""
    divergence = run.attempt.divergence()
    if divergence is None or divergence is exc or isinstance(exc, type(divergence)):
        return exc
    divergence.__context__ = exc
    return divergence


def join_started(run: RunState) -> None:
    """Structured concurrency: waits for every started step; the
    first failure nobody asked for fails the run."""
    assert run.started is not None  # called only when steps were started
    join_handles(run.started)


def join_handles(handles: list) -> None:
    """Waits for every `StepHandle`; raises the first failure no caller
    observed (through `result()`)."""
    first: BaseException | None = None
    for handle in handles:
        try:
            handle._future.result()
        except BaseException as exc:  # noqa: BLE001 -- only unobserved failures count
            if not handle._observed and first is None:
                first = exc
    if first is not None:
        raise first


async def ajoin_handles(handles: list) -> None:
    import asyncio

    await asyncio.gather(*(asyncio.wrap_future(h._future) for h in handles), return_exceptions=True)
    join_handles(handles)


def _settle_paused(run: RunState, root: Span, pause: _Pause):
    """Persists the pause: every pending interrupt of it, the agent
    snapshots it carries, and the row's status, in one transaction."""
    mark_failed(root, pause)
    persist_span(run, root)
    try:
        pending = [_pending_row(p) for p in (pause, *pause.others)]
    except SerializationError as exc:
        yield from _settle_failed(run, exc)
        raise
    yield run, ("paused", None, None, pending, pause.snapshots)
    _check_span_writes()
    emit_run_finished(root, "paused")
    return ("paused", None, pause)


def _settle_cancelled(
    run: RunState, root: Span, exc: _Cancelled | _RunCancelled, row_status: str = "failed"
):
    """A run whose stream was cancelled; the caller gets a cancelled Run. A
    flow's row is failed with message "cancelled" (resumable, like
    any failed flow run); agents and composites mark theirs `cancelled`."""
    fail_span(run, root, exc)
    if row_status == "failed":
        error = _codec.dumps({"type": "CancelledError", "message": "cancelled"})
        yield run, ("failed", None, error)
    else:
        yield run, (row_status, None, None)
    _check_span_writes()
    emit_run_finished(root, "cancelled")
    return ("cancelled", None, None)


def settle_error(run: RunState, root: Span, exc: BaseException) -> None:
    """A run that failed: span, row and `run_finished`."""
    return _settle_now(_settle_error(run, root, exc))


def _settle_error(run: RunState, root: Span, exc: BaseException):
    fail_span(run, root, exc)
    yield from _settle_failed(run, exc)
    emit_run_finished(root, "failed", exc)


def settle_interrupted(
    run: RunState, root: Span, exc: BaseException, cancelled_status: str = "failed"
):
    """Settles a run whose body raised: a pause or a cancellation becomes the
    outcome `(status, None, pause)`; anything else fails the run and is
    re-raised unchanged."""
    return _settle_now(_settle_interrupted(run, root, exc, cancelled_status))


async def asettle_interrupted(
    run: RunState, root: Span, exc: BaseException, cancelled_status: str = "failed"
):
    """`settle_interrupted` for an async driver."""
    return await _asettle_now(_settle_interrupted(run, root, exc, cancelled_status))


def _settle_interrupted(run: RunState, root: Span, exc: BaseException, cancelled_status: str):
    if isinstance(exc, _Pause):
        return (yield from _settle_paused(run, root, exc))
    if isinstance(exc, _Cancelled):
        return (yield from _settle_cancelled(run, root, exc, cancelled_status))
    if isinstance(exc, _RunCancelled):
        return (yield from _settle_cancelled(run, root, exc, "cancelled"))
    yield from _settle_error(run, root, exc)
    raise exc


def settle_completed(run: RunState, root: Span, output: Any, lenient: bool = False):
    """A run whose body returned. An unencodable output fails a flow; agents and composites store it as NULL instead."""
    return _settle_now(_settle_completed(run, root, output, lenient))


async def asettle_completed(run: RunState, root: Span, output: Any, lenient: bool = False):
    """`settle_completed` for an async driver."""
    return await _asettle_now(_settle_completed(run, root, output, lenient))


def _settle_completed(run: RunState, root: Span, output: Any, lenient: bool):
    try:
        output_json = _codec.dumps(output)
    except SerializationError as exc:
        if not lenient:
            yield from _settle_error(run, root, exc)
            raise
        output_json = None
    root.ended_at = time.time()
    root.status = "ok"
    persist_span(run, root, output_json)
    if _capture():
        root.output = output
    yield run, ("completed", output_json, None)
    _check_span_writes()
    emit_run_finished(root, "completed")
    return ("completed", output, None)


async def drive_async(run: RunState, body: Callable[[], Any], root: Span) -> Any:
    """The async twin of `drive_sync`: the body is awaited on the caller's loop."""
    frame = Frame(run, "", root, None, run.trace)
    token = FRAME.set(frame)
    driver = driven_by_running_loop()
    try:
        output = await body()
        if run.started:
            await ajoin_handles(run.started)
        run.attempt.check_complete()
    except BaseException as exc:  # noqa: BLE001 -- settled, re-raised unless a pause/cancel
        return await asettle_interrupted(run, root, _diverged(run, exc))
    finally:
        ASYNC_DRIVER.reset(driver)
        FRAME.reset(token)
    return await asettle_completed(run, root, output)


def make_run_result(run: RunState, outcome, usage: Any = None, messages: Any = None) -> Any:
    """The `Run` of a settled top-level run; `usage`/`messages` default to
    the attempt's llm rollup and an empty conversation."""
    status, output, pause = outcome
    attach_step_spans(run)
    if status == "cancelled":
        return Run(
            id=run.run_id, status="cancelled", output=None, usage=None, trace=run.trace, messages=[]
        )
    if status == "paused":
        return Run(
            id=run.run_id,
            status="paused",
            output=None,
            usage=None,
            trace=run.trace,
            messages=[],
            pending=pause.interrupt(),
        )
    return Run(
        id=run.run_id,
        status="completed",
        output=output,
        usage=rollup_usage(run.trace) if usage is None else usage,
        trace=run.trace,
        messages=[] if messages is None else messages,
        pending=None,
    )


def subtree_usage(trace: Trace, root: Span):
    """Usage of the `llm` spans under `root`, or `None` when there are none.
    Spans are in start order, so the subtree follows `root`: only spans
    opened since `root` are visited (no quadratic work in run length).
    `llm` spans are always kept in memory, so this never reads the store."""
    spans = trace._spans
    start = len(spans) - 1
    while start >= 0 and spans[start] is not root:
        start -= 1
    ids = {root.span_id}
    total = None
    for span in spans[start + 1 :] if start >= 0 else spans:
        # A replayed step's record (a tuple) never has children.
        if type(span) is not tuple and span.parent_span_id in ids:
            ids.add(span.span_id)
            if span.kind == "llm" and span.usage is not None:
                total = span.usage if total is None else total + span.usage
    if root.kind == "llm" and root.usage is not None:
        total = root.usage if total is None else total + root.usage
    return total


def rollup_usage(trace: Trace):
    """Usage of the attempt's `llm` spans, or `None` ("nothing yet") when it
    made no model call (from the spans in memory: `llm` spans always are).
    Replayed steps carry none, so their records are skipped unbuilt."""
    total = None
    for span in trace._spans:
        if type(span) is not tuple and span.kind == "llm" and span.usage is not None:
            total = span.usage if total is None else total + span.usage
    return total
