"""Durable flow primitives (EXT-1 … EXT-12): time, signals, cancellation,
run handles and the worker's entry point.

A wait is a journaled step. The core decides it from the journal and the
store's timers/signals/cancel-request tables: ready, block in place (the
default), or park (the run settles `paused` with a `timer`/`signal`
interrupt, for `wait=False` and the worker). This module calls the core and
converts values.
"""

from __future__ import annotations

import time
import warnings
from concurrent.futures import Future
from contextvars import copy_context
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from . import _codec, _core, _engine, _threads
from ._engine import FRAME, Frame, RunState, _Pause
from ._retry import RetryPolicy
from .errors import ComposeError, ConfigError, SerializationError

if TYPE_CHECKING:
    from typing import Literal

    from .runs import Run
    from .tracing import Span

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


class TaskFailed(ComposeError):
    """EXT-7: a step of a `@flow(journal_failures=True)` failed after its
    retries; journaled, so a replay raises the same failure again."""

    def __init__(self, step_key: str, error_type: str, message: str) -> None:
        super().__init__(f"step '{step_key}' failed: {error_type}: {message}")
        self.step_key = step_key
        self.error_type = error_type
        self.message = message


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise TypeError(
        f"{what} must be a timedelta or a number of seconds, got {type(value).__name__}"
    )


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
    from ._streams import current_cancel_token

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


def sleep(duration: timedelta | float) -> None:
    """EXT-1: a durable timer inside a flow (journaled `sleep#<n>` = wake
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


def _check_name(name: Any, what: str) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{what}: the signal name must be a non-empty string, got {name!r}")


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
    """EXT-4: the next signal of `name` sent to this run (in send order,
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
    """EXT-4: every delivered, unconsumed signal of `name`, without waiting;
    consumed and journaled."""
    frame = _in_flow()
    if frame is None:
        raise ConfigError("receive_all() must be called inside a flow")
    _check_name(name, "receive_all()")
    return _codec.loads(_core.receive_all(_run_of(frame).attempt, frame.scope, name, frame.fence))


def await_until(predicate: Any, *, timeout: timedelta | float | None = None) -> bool:
    """EXT-5: returns `True` once `predicate()` holds, evaluating it now and
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


def _encode_signal(name: str, value: Any) -> str:
    _check_name(name, "signal()")
    try:
        return _codec.dumps(value)
    except SerializationError as exc:
        raise SerializationError(f"signal {name!r} value: {exc}") from None


def signal(run_id: str, name: str, value: Any = None, *, resume: bool = False) -> Run | None:
    """EXT-3: delivers `value` under `name` to a run that has not finished
    (buffered until the body asks). With `resume=True`, a run parked on
    that name is continued here and its `Run` returned."""
    value_json = _encode_signal(name, value)
    store = _engine.get_store()
    _core.send_signal(store, run_id, name, value_json)
    if resume and _parked_on(store, run_id, name):
        from .flow import resume as _resume

        return _resume(run_id, wait=False)
    return None


async def asignal(run_id: str, name: str, value: Any = None, *, resume: bool = False) -> Run | None:
    """Async twin of `signal`."""
    value_json = _encode_signal(name, value)
    store = _engine.get_store()
    _core.send_signal(store, run_id, name, value_json)
    if resume and _parked_on(store, run_id, name):
        from .flow import aresume

        return await aresume(run_id, wait=False)
    return None


def _parked_on(store: Any, run_id: str, name: str) -> bool:
    wait = _core.parked_wait(store, run_id)
    return wait is not None and wait[2] == name


def cancel(run_id: str, reason: str | None = None) -> None:
    """EXT-10: cancels a run: a parked one at once, an executing one at its
    next durable boundary (in whatever process executes it)."""
    if reason is not None and not isinstance(reason, str):
        raise ConfigError(f"cancel(): reason must be a string, got {type(reason).__name__}")
    _core.request_cancel(_engine.get_store(), run_id, reason)


async def acancel(run_id: str, reason: str | None = None) -> None:
    """Async twin of `cancel`."""
    cancel(run_id, reason)


# ---------------------------------------------------------------------------
# The worker's pass


def _flow_for(name: str):
    from .flow import _FLOWS

    return _FLOWS.get(name)


_warned_missing: set[str] = set()


def missing_flow_message(run_id: str, name: str, module: str | None) -> str:
    where = f"import module {module!r}" if module else "import the module that defines it"
    return (
        f"run {run_id}: flow {name!r} is not registered in this process -- {where} "
        "(compose worker --import MODULE); the run is skipped"
    )


def continue_run(run_id: str) -> Run:
    """Continues one due run through the ordinary resume path, parking on
    its next wait; `flow.NotDue` when another process settled it first."""
    from .flow import continue_due

    return continue_due(run_id)


def wake_due(now: datetime | None = None) -> list[Run]:
    """EXT-2: continues in this process every registered run that is due at
    `now` (default: the engine clock): parked runs whose timer passed or
    whose awaited signal arrived, and `running` runs whose lease holder is
    dead. A run whose body raises is failed (as `resume` does), warned
    about, and the others still continue."""
    from .flow import NotDue

    at = None if now is None else _timestamp(now)
    done: list[Run] = []
    for run_id, kind, name, _reason, module in _core.due_runs(_engine.get_store(), at):
        if kind != "flow":
            continue
        if _flow_for(name) is None:
            if run_id not in _warned_missing:
                _warned_missing.add(run_id)
                warnings.warn(missing_flow_message(run_id, name, module), RuntimeWarning, 2)
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


def _timestamp(value: datetime) -> float:
    if not isinstance(value, datetime):
        raise TypeError(f"now must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None:
        raise ConfigError("now must be an aware datetime (e.g. datetime.now(timezone.utc))")
    return value.timestamp()


# ---------------------------------------------------------------------------
# Run handles (EXT-11)

# How often `RunHandle.result()` reads the store while it waits on a run
# executing elsewhere.
_RESULT_POLL = 0.02


class RunHandle:
    """A durable run addressed by id, from any process."""

    def __init__(self, run_id: str) -> None:
        self.id = run_id
        # Set when this process executes the run (`Flow.start`).
        self._done: Any = None
        self._outcome: tuple | None = None

    def __repr__(self) -> str:
        return f"<RunHandle {self.id}>"

    def _row(self) -> dict:
        row = _engine.get_store().get_run(self.id)
        if row is None:
            raise ConfigError(f"no run found with run_id {self.id!r}")
        return row

    @property
    def status(self) -> str:
        """The run's status, read from the store."""
        return self._row()["status"]

    @property
    def pending(self) -> Any:
        """The run's first pending interrupt (`Interrupt`), or `None`."""
        rows = _engine.get_store().pending(self.id)
        if not rows:
            return None
        return _interrupt(rows[0])

    def signal(self, name: str, value: Any = None) -> None:
        signal(self.id, name, value)

    def cancel(self, reason: str | None = None) -> None:
        cancel(self.id, reason)

    def resume(self, answers: dict[str, Any] | None = None, **kw: Any) -> Run:
        from .flow import resume

        return resume(self.id, answers, **kw)

    def result(self, timeout: float | None = None) -> Run:
        """Waits until the run completes, fails (re-raised), is cancelled, or
        parks on a human interrupt; `TimeoutError` after `timeout` seconds."""
        end = None if timeout is None else time.monotonic() + timeout
        if self._done is not None:
            if not self._done.wait(timeout):
                raise TimeoutError(f"run {self.id} did not finish within {timeout}s")
            # Set before `_done` is.
            assert self._outcome is not None
            ok, value = self._outcome
            if not self._moved_on(ok, value):
                if not ok:
                    raise value
                if value.status != "paused" or value.pending.kind not in ("timer", "signal"):
                    return value
        while True:
            run = self._settled()
            if run is not None:
                return run
            if end is not None and time.monotonic() >= end:
                raise TimeoutError(f"run {self.id} did not finish within {timeout}s")
            time.sleep(_RESULT_POLL)

    def _moved_on(self, ok: bool, value: Any) -> bool:
        """Whether the run went on after this process's drive of it ended (a
        resume or retry here or in another process), so that the outcome kept
        here is stale and the store's latest settled state is the answer."""
        row = self._row()
        if not ok:
            return row["status"] != "failed"
        if value.status != "paused":
            return False
        if row["status"] != "paused":
            return True
        pending = [p[0] for p in _engine.get_store().pending(self.id)]
        return value.pending.id not in pending

    def _settled(self) -> Run | None:
        from .runs import Run
        from .tracing import Trace

        row = self._row()
        status = row["status"]
        trace = Trace(trace_id=row["trace_id"] or "")
        if status == "completed":
            out = row["output_json"]
            return Run(
                id=self.id,
                status="completed",
                output=_codec.loads(out) if out is not None else None,
                trace=trace,
            )
        if status == "cancelled":
            return Run(id=self.id, status="cancelled", output=None, trace=trace)
        if status == "failed":
            raise _stored_error(self.id, row["error_json"])
        if status == "paused":
            rows = _engine.get_store().pending(self.id)
            human = [p for p in rows if p[1] not in ("timer", "signal")]
            if human:
                return Run(
                    id=self.id,
                    status="paused",
                    output=None,
                    trace=trace,
                    pending=_interrupt(human[0]),
                )
        return None


def _interrupt(row: tuple) -> Any:
    from .hitl import Interrupt

    interrupt_id, kind, question, payload_json = row
    payload = _codec.loads(payload_json) if payload_json is not None else None
    if kind == "graph":
        from .graph import pending_interrupt

        return pending_interrupt(interrupt_id[len("node:") :], payload)
    return Interrupt(id=interrupt_id, kind=kind, question=question, payload=payload)


def _stored_error(run_id: str, error_json: str | None) -> BaseException:
    """The error of a run that failed in another process: the same
    composeai error class when there is one, else a `ComposeError`."""
    from . import errors

    data = _codec.loads(error_json) if error_json else {}
    name = data.get("type", "Exception")
    message = data.get("message", "")
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.ComposeError):
        return cls(message)
    return errors.ComposeError(f"run {run_id} failed: {name}: {message}")


def get_run(run_id: str) -> RunHandle:
    """EXT-11: a handle on an existing run (any process)."""
    handle = RunHandle(run_id)
    handle._row()
    return handle


def start_in_background(flow_obj: Any, args: tuple, kwargs: dict, budget: Any, wait: bool):
    """`Flow.start`: the run row is created durably here, then the run
    executes on a background thread of this process."""
    import contextvars
    import threading

    run, meter = flow_obj._start(args, kwargs, budget, wait)
    handle = RunHandle(run.run_id)
    handle._done = threading.Event()

    def target() -> None:
        try:
            handle._outcome = (True, flow_obj._drive(run, args, kwargs, meter))
        except BaseException as exc:  # noqa: BLE001 -- handed to result()
            handle._outcome = (False, exc)
        finally:
            handle._done.set()

    context = contextvars.Context()
    threading.Thread(
        target=lambda: context.run(target), name=f"composeai-run-{run.run_id}", daemon=True
    ).start()
    return handle


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

    from .flow import Flow, Task

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
    """EXT-6: reserves the key a direct call of `stage` would take, runs the
    step concurrently and returns its `StepHandle`. A journaled step's handle
    is resolved at once (replay)."""
    frame = _in_flow()
    if frame is None:
        raise ConfigError("start() must be called inside a flow")
    kind, name, execute = _stage_of(stage, frame)
    step = _engine.begin_step(frame, kind, name)
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
    """EXT-6: the results of `handles`, in order; with `return_exceptions`,
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


def join_handles(handles: list) -> None:
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
