"""Durable flow primitives: time, signals, cancellation,
run handles and the worker's entry point.

A wait is a journaled step. The core decides it from the journal and the
store's timers/signals/cancel-request tables: ready, block in place (the
default), or park (the run settles `paused` with a `timer`/`signal`
interrupt, for `wait=False` and the worker). This module calls the core and
converts values.
"""

from __future__ import annotations

import sys
import time
import warnings
from concurrent.futures import Future
from contextvars import copy_context
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from . import _codec, _core, _engine, _threads
from ._engine import FRAME, Frame
from ._lifecycle import (
    _FLOWS,
    OWNERS,
    NotDue,
    RunHandle,
    _check_name,
    acancel,
    asignal,
    cancel,
    continue_due,
    get_run,
    signal,
)
from ._retry import RetryPolicy
from ._values import TaskFailed
from ._waits import _adecide, _decide, _in_flow, _mode, _run_of, _settled
from .errors import ConfigError, SerializationError
from .flow import Flow, Task

if TYPE_CHECKING:
    from .runs import Run

R = TypeVar("R")

__all__ = [
    "RetryPolicy",
    "RunHandle",
    "StepHandle",
    "TaskFailed",
    "acancel",
    "areceive",
    "asignal",
    "asleep",
    "await_until",
    "cancel",
    "gather",
    "get_run",
    "receive",
    "receive_all",
    "signal",
    "sleep",
    "start",
    "wake_due",
]


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise TypeError(
        f"{what} must be a timedelta or a number of seconds, got {type(value).__name__}"
    )


def sleep(duration: timedelta | float) -> None:
    """A durable timer inside a flow (journaled `sleep#<n>` = wake
    time); outside a flow, `time.sleep`."""
    seconds = _seconds(duration, "sleep() duration")
    frame = _in_flow()
    if frame is None:
        time.sleep(max(0.0, seconds))
        return
    _engine.check_sync_facade()
    wait = _core.begin_sleep(_run_of(frame).attempt, frame.scope, seconds, frame.fence)
    _decide(frame, wait)


async def asleep(duration: timedelta | float) -> None:
    """Async twin of `sleep` (same keys)."""
    seconds = _seconds(duration, "asleep() duration")
    frame = _in_flow()
    if frame is None:
        import asyncio

        await asyncio.sleep(max(0.0, seconds))
        return
    wait = _core.begin_sleep(_run_of(frame).attempt, frame.scope, seconds, frame.fence)
    await _adecide(frame, wait)


def _begin_receive(frame: Frame, name: str, timeout: Any, default: Any, what: str):
    _check_name(name, what)
    seconds = None if timeout is None else _seconds(timeout, f"{what} timeout")
    try:
        default_json = _codec.dumps(default)
    except SerializationError as exc:
        raise SerializationError(f"{what} default: {exc}") from None
    return _core.begin_receive(
        _run_of(frame).attempt, frame.scope, name, seconds, default_json, frame.fence
    )


def receive(name: str, *, timeout: timedelta | float | None = None, default: Any = None) -> Any:
    """The next signal of `name` sent to this run (in send order,
    journaled as `receive:<name>#<n>`); waits for it. After `timeout`
    without one, `default`."""
    frame = _in_flow()
    if frame is None:
        raise ConfigError("receive() must be called inside a flow")
    _engine.check_sync_facade()
    return _decide(frame, _begin_receive(frame, name, timeout, default, "receive()"))


async def areceive(
    name: str, *, timeout: timedelta | float | None = None, default: Any = None
) -> Any:
    """Async twin of `receive` (same keys)."""
    frame = _in_flow()
    if frame is None:
        raise ConfigError("areceive() must be called inside a flow")
    return await _adecide(frame, _begin_receive(frame, name, timeout, default, "areceive()"))


def receive_all(name: str) -> list:
    """Every delivered, unconsumed signal of `name`, without waiting;
    consumed and journaled."""
    frame = _in_flow()
    if frame is None:
        raise ConfigError("receive_all() must be called inside a flow")
    _check_name(name, "receive_all()")
    return _codec.loads(_core.receive_all(_run_of(frame).attempt, frame.scope, name, frame.fence))


def await_until(predicate: Any, *, timeout: timedelta | float | None = None) -> bool:
    """Returns `True` once `predicate()` holds, evaluating it now and
    again after every signal delivered to the run; `False` after `timeout`.
    The predicate may read only journal-safe values (results of `receive`,
    `receive_all` and steps). Journaled as `await_until#<n>`, with the
    number of evaluations, so a replay evaluates it as often again."""
    frame = _in_flow()
    if frame is None:
        raise ConfigError("await_until() must be called inside a flow")
    if not callable(predicate):
        raise TypeError(f"await_until() takes a callable, got {type(predicate).__name__}")
    _engine.check_sync_facade()
    seconds = None if timeout is None else _seconds(timeout, "await_until() timeout")
    attempt = _run_of(frame).attempt
    wait = _core.begin_await(attempt, frame.scope, seconds, frame.fence)
    if wait.journaled:
        journaled = wait.resolve("park")[1]
        # A ready await always carries its value: here the journaled record.
        assert journaled is not None
        record = _codec.loads(journaled)
        for _ in range(record["evals"]):
            predicate()
        _settled(frame, wait, ("ready", None, None, None))
        return record["result"]
    mode = _mode(frame, False)
    started = time.time()
    evals = 0
    while True:
        evals += 1
        watermark = wait.watermark(evals)
        if predicate():
            result = True
            break
        outcome = wait.resolve(mode, watermark)
        if outcome[0] == "park":
            _settled(frame, wait, outcome)
        # Not parked: ready, with why it woke ("signal" or "timeout").
        woke = outcome[1]
        assert woke is not None
        if _codec.loads(woke) == "timeout":
            result = False
            break
    record = _codec.dumps({"result": result, "evals": evals})
    attempt.commit(wait.key, record, None, frame.fence)
    _settled(frame, wait, ("ready", None, started, None))
    return result


# ---------------------------------------------------------------------------
# Signals and cancellation


# ---------------------------------------------------------------------------
# The worker's pass


def _flow_for(name: str):
    return _FLOWS.get(name)


_warned_missing: set[str] = set()


def missing_flow_message(run_id: str, name: str, module: str | None) -> str:
    where = f"import module {module!r}" if module else "import the module that defines it"
    return (
        f"run {run_id}: flow {name!r} is not registered in this process -- {where} "
        "(compose worker --import MODULE); the run is skipped"
    )


def _agent_for(name: str):
    # No `@agent` exists until that module is loaded; looked up without
    # importing it.
    runs = sys.modules.get("composeai._agent_runs")
    return None if runs is None else runs._AGENTS.get(name)


# The kinds of due runs a worker continues: flows, and standalone agents and
# graphs made due by an answer journaled from outside (`compose answer`).
CONTINUED_KINDS = ("flow", "agent", "graph")


def missing_owner_message(run_id: str, kind: str, name: str, module: str | None) -> str | None:
    """The warning for a due run whose flow, agent or graph is not
    registered in this process (it is skipped, never failed), else
    `None`."""
    if kind == "graph":
        graphs = OWNERS.get("graph")
        if graphs is not None and graphs.compiled(name):
            return None
        return (
            f"run {run_id}: graph {name!r} is not compiled in this process -- import the "
            "module that compiles it (compose worker --import MODULE); the run is skipped"
        )
    if kind == "agent":
        if _agent_for(name) is not None:
            return None
        where = f"import module {module!r}" if module else "import the module that defines it"
        return (
            f"run {run_id}: agent {name!r} is not registered in this process -- {where} "
            "(compose worker --import MODULE); the run is skipped"
        )
    return None if _flow_for(name) is not None else missing_flow_message(run_id, name, module)


def continue_run(run_id: str) -> Run:
    """Continues one due run through the ordinary resume path, parking on
    its next wait; `NotDue` when another process settled it first."""
    return continue_due(run_id)


def wake_due(now: datetime | None = None) -> list[Run]:
    """Continues in this process every registered run that is due at
    `now` (default: the engine clock): parked runs whose timer passed or
    whose awaited signal arrived, and `running` runs whose lease holder is
    dead. A run whose body raises is failed (as `resume` does), warned
    about, and the others still continue."""
    at = None if now is None else _timestamp(now)
    done: list[Run] = []
    for run_id, kind, name, reason, module in _core.due_runs(_engine.get_store(), at):
        if not _continued(kind, reason):
            continue
        missing = missing_owner_message(run_id, kind, name, module)
        if missing is not None:
            if run_id not in _warned_missing:
                _warned_missing.add(run_id)
                warnings.warn(missing, RuntimeWarning, 2)
            continue
        try:
            done.append(continue_run(run_id))
        except NotDue:
            continue
        except Exception as exc:  # noqa: BLE001 -- the run is failed; carry on with the rest
            warnings.warn(
                f"run {run_id} ({name}) failed: {type(exc).__name__}: {exc}", RuntimeWarning, 2
            )
    return done


def _continued(kind: str, reason: str) -> bool:
    """Whether a due run is continued here: flows for any reason; an agent
    only when its wait came due, not for crash recovery, which stays with
    an explicit `resume()`."""
    return kind == "flow" or (kind in CONTINUED_KINDS and reason != "recovered")


def _timestamp(value: datetime) -> float:
    if not isinstance(value, datetime):
        raise TypeError(f"now must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None:
        raise ConfigError("now must be an aware datetime (e.g. datetime.now(timezone.utc))")
    return value.timestamp()


# ---------------------------------------------------------------------------
# Fan-out handles (EXT-6)


class StepHandle(Generic[R]):
    """A step started with `start()`: its journal key, and its result once
    it settles."""

    def __init__(self, key: str, future: Future) -> None:
        self.key = key
        self._future = future
        self._observed = False

    def __repr__(self) -> str:
        state = "done" if self._future.done() else "running"
        return f"<StepHandle {self.key} {state}>"

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> R:
        """Waits for the step; returns its value or raises its error."""
        self._observed = True
        return self._future.result()

    async def aresult(self) -> R:
        import asyncio

        self._observed = True
        return await asyncio.wrap_future(self._future)


def _agent_step(agent: Any, frame: Frame):
    """How a direct call of `agent` in a flow executes its step (agentfn's
    `_flow_step`), for `start()`."""
    from . import agentfn

    opts = agentfn._overrides(None, None, None, None, None, None)

    def execute(inner: Frame, a: tuple, k: dict) -> Any:
        call = agentfn._Call(agent, opts, inner, frame.scope)
        call.snapshot_scope = inner.scope
        token = agentfn._push_budget(agent._step_budget(frame, inner.scope, opts))
        try:
            return agentfn._agent_loop_sync(call, a, k)
        finally:
            agentfn._pop_budget(token)

    return "agent", agent.name, execute


def _stage_of(stage: Any, frame: Frame):
    import sys

    agentfn = sys.modules.get("composeai.agentfn")
    if agentfn is not None and isinstance(stage, agentfn.AgentFunction):
        return _agent_step(stage, frame)
    if isinstance(stage, Task):
        return "task", stage.name, stage._execute
    if isinstance(stage, Flow):
        return (
            "flow",
            stage.name,
            lambda _inner, a, k: _engine.call_body(stage.fn, stage._is_async, a, k),
        )
    raise TypeError(f"start() takes a @task, an @agent or a @flow, got {type(stage).__name__}")


def start(stage: Any, *args: Any, **kwargs: Any) -> StepHandle:
    """Reserves the key a direct call of `stage` would take, runs the
    step concurrently and returns its `StepHandle`. A journaled step's handle
    is resolved at once (replay)."""
    frame = _in_flow()
    if frame is None:
        raise ConfigError("start() must be called inside a flow")
    kind, name, execute = _stage_of(stage, frame)
    step = _engine.begin_step(frame, kind, name, digest=_engine.step_digest(args, kwargs))
    future: Future = Future()
    handle: StepHandle[Any] = StepHandle(step.key, future)
    run = _run_of(frame)
    started: list[StepHandle[Any]] | None = run.started
    if started is None:
        started = []
        run.started = started
    started.append(handle)
    if step.inner is None:
        try:
            future.set_result(_engine.replayed_value(frame, step))
        except TaskFailed as exc:
            future.set_exception(exc)
        return handle
    span = step.span
    assert span is not None  # a miss's: only a hit has none
    if _engine._capture():
        span.input = {"args": list(args), "kwargs": kwargs}
    inner = Frame(
        step.inner.run,
        step.inner.scope,
        step.inner.span,
        _engine.child_fence(step.inner),
        step.inner.trace,
    )
    context = copy_context()

    def target() -> None:
        FRAME.set(inner)
        try:
            value = execute(inner, args, kwargs)
            future.set_result(_engine.finish_step(step, value))
        except BaseException as exc:  # noqa: BLE001 -- handed to the handle
            _engine.fail_span(run, span, exc)
            if run.journal_failures and isinstance(exc, Exception):
                try:
                    _engine.raise_journaled_failure(step, exc)
                except BaseException as failure:  # noqa: BLE001 -- TaskFailed or a revoke
                    exc = failure
            future.set_exception(exc)

    _threads.spawn(lambda: context.run(target), f"composeai-start-{name}")
    return handle


def gather(*handles: StepHandle, return_exceptions: bool = False) -> list:
    """The results of `handles`, in order; with `return_exceptions`,
    a failed step's exception takes its place."""
    out = []
    for handle in handles:
        if not isinstance(handle, StepHandle):
            raise TypeError(f"gather() takes StepHandles, got {type(handle).__name__}")
        try:
            out.append(handle.result())
        except Exception as exc:
            if not return_exceptions:
                raise
            out.append(exc)
    return out
