"""The Python driver of the core's engine protocol.

The Rust core decides (keys, replay, first-write-wins, leases, fencing); this
module executes: it calls user functions, converts values, and keeps the
ambient frame (run, journal scope, current span, fence) in a context variable
so that nested calls, threads and tasks see it.
"""

from __future__ import annotations

import atexit
import os
import sys
import time

# `_thread` and `_contextvars` rather than `threading` and `contextvars`:
# the modules those import cost a fresh process milliseconds.
from _contextvars import ContextVar, copy_context
from _thread import allocate_lock

from . import _codec, _core
from . import events as _events
from . import tracing as _tracing
from ._cancel import CANCEL_TOKEN as _CANCEL_TOKEN
from ._values import Budget, TaskFailed
from .errors import ConfigError, SerializationError, TaskTimeoutError
from .tracing import ErrorInfo, Span, Trace, _capture_content, replayed_span

# `events.current_bus`, called without a Python frame of its own.
_current_bus = _events._BUS.get

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from .events import EventKind


class _Pause(BaseException):
    """Internal signal: an interrupt has no answer yet."""

    def __init__(self, interrupt_id: str, kind: str, question: str | None, payload: Any):
        super().__init__(interrupt_id)
        self.interrupt_id = interrupt_id
        self.kind = kind
        self.question = question
        self.payload = payload
        # Further pauses of the same tool batch and the agent snapshot, all
        # persisted with the run's pause (AGENT-40).
        self.others: list[_Pause] = []
        self.snapshots: list[tuple] = []

    def attach(self, others: list[_Pause], snapshot: tuple, run: Any) -> None:
        self.others.extend(others)
        self.snapshots.append(snapshot)

    def interrupt(self):
        from ._interrupt import Interrupt

        return Interrupt(
            id=self.interrupt_id, kind=self.kind, question=self.question, payload=self.payload
        )


class _Cancelled(BaseException):
    """Internal signal: the run's stream was cancelled."""


class _Revoked(BaseException):
    """Internal signal: this thread's journal access was revoked.
    It unwinds an abandoned thread silently."""


class _RunCancelled(BaseException):
    """Internal signal: a cancel request for the run reached this attempt. Code may clean up in `finally` but must not swallow it."""


_core.register_errors(ConfigError, SerializationError, _Revoked, _RunCancelled)
_core.register_decoder(_codec.loads)

# ---------------------------------------------------------------------------
# The store


_store: Any = None
_store_lock = allocate_lock()


def state_dir() -> str:
    return os.environ.get("COMPOSE_DIR") or "./.compose"


_configured_store: str | None = None


def configure(*, store: str | None = None, otel: bool | None = None) -> None:
    """Configures the process: which store, and whether spans go to OpenTelemetry.

    Args:
        store: the store's URL, as for `COMPOSE_STORE`: `sqlite:///abs/path.db`
            or `postgresql://user:pass@host:5432/db?...`. Call it before the
            first run; naming another store after one was opened is a
            `ConfigError`.
        otel: `True` emits every span through the global OpenTelemetry
            `TracerProvider` as it ends, `False` stops it (overrides
            `COMPOSE_OTEL`).
    """
    global _configured_store
    if otel is not None:
        from . import _otel

        _otel.configure(otel)
    if store is None:
        return
    _core.store_target(store, "")
    with _store_lock:
        current = _configured_store
        if _store is not None:
            current = current if current is not None else store_spec()
        if current is not None and current != store:
            shown = _core.store_target(current, _default_sqlite())[1]
            raise ConfigError(
                f"composeai.configure(store=...): the store is already {shown!r} -- "
                "configure the store once, before the first run"
            )
        _configured_store = store


def store_spec() -> str:
    """The store in use: `configure(store=...)`, else `COMPOSE_STORE` (read
    lazily), else '' (SQLite in COMPOSE_DIR)."""
    if _configured_store is not None:
        return _configured_store
    return os.environ.get("COMPOSE_STORE", "")


def _default_sqlite() -> str:
    return os.path.join(state_dir(), "runs.db")


def get_store():
    """The process's store, opened on first use."""
    store = _store
    if store is not None:
        return store
    return _open_store()


def _open_store():
    global _store
    with _store_lock:
        if _store is None:
            spec = store_spec()
            kind, target = _core.store_target(spec, _default_sqlite())
            if kind == "sqlite":
                if not spec:
                    os.makedirs(state_dir(), mode=0o700, exist_ok=True)
                _store = _core.Store(target)
            else:
                _store = _core.Store(spec)
            _close_at_exit_once()
            _otel_from_env()
        return _store


async def aget_store():
    """`get_store()` for an async caller: a server's first open (connection and
    schema check) is awaited off the loop; a SQLite file opens in place."""
    global _store
    store = _store
    if store is not None:
        return store
    spec = store_spec()
    if _core.store_target(spec, _default_sqlite())[0] == "sqlite":
        return _open_store()
    opened = await off_loop(_core.Store.aopen, spec)
    with _store_lock:
        if _store is None:
            _store = opened
            _close_at_exit_once()
            _otel_from_env()
        return _store


def _otel_from_env() -> None:
    """`COMPOSE_OTEL`, read as the store opens (before any span reaches it).
    Unset, and with the export never started, nothing more is imported."""
    if "composeai._otel" not in sys.modules and not os.environ.get("COMPOSE_OTEL"):
        return
    from . import _otel

    _otel.from_env()


_CLOSE_AT_EXIT = False


def _close_at_exit_once() -> None:
    global _CLOSE_AT_EXIT
    if not _CLOSE_AT_EXIT:
        _CLOSE_AT_EXIT = True
        atexit.register(_close_at_exit)


def _close_at_exit() -> None:
    """As the process exits: writes what is still queued (batch-durability
    steps, spans) and lets go of the store. On SQLite, the last process to
    close it leaves no WAL for the next one to read back."""
    store = _store
    if store is not None:
        try:
            store.close()
        except Exception:  # noqa: BLE001, S110 -- nothing left to report to at exit
            pass


def reset_store() -> None:
    global _store
    with _store_lock:
        if _store is not None:
            _store.flush()
        _store = None


_warned_span_write = False


def _check_span_writes() -> None:
    """Span persistence failures warn once per process, then stay silent."""
    global _warned_span_write
    message = _core.take_span_write_error()
    if message is not None and not _warned_span_write:
        _warned_span_write = True
        import warnings

        warnings.warn(f"composeai could not persist trace spans: {message}", RuntimeWarning, 3)


# ---------------------------------------------------------------------------
# Durability modes

DURABILITY_MODES = ("step", "batch")


def check_durability(value: Any, where: str) -> str:
    if value not in DURABILITY_MODES:
        raise ConfigError(
            f"{where} must be 'step' or 'batch', got {value!r} -- 'step' (the default) commits "
            "each step before handing back its value; 'batch' group-commits steps in the "
            "background within 10 ms"
        )
    return value


def durability_from_env() -> str:
    value = os.environ.get("COMPOSE_DURABILITY")
    if not value:
        return "step"
    return check_durability(value, "COMPOSE_DURABILITY")


def apply_durability(run: Any, durability: str | None) -> None:
    """Sets up a flow attempt before its body runs: its durability mode
    (`durability`, else `COMPOSE_DURABILITY`) and where its step spans are
    kept. A refused mode fails the attempt (nothing else ran) and raises."""
    try:
        if (durability or durability_from_env()) == "batch":
            # Batched steps still queued at exit are committed by `_close_at_exit`.
            run.attempt.set_batch()
        keep_step_spans_in_store(run)
    except BaseException as exc:
        run.attempt.settle("failed", None, error_json(exc))
        raise


# ---------------------------------------------------------------------------
# The ambient frame


class RunState:
    """One attempt of a durable run as the Python side sees it."""

    __slots__ = (
        "attempt",
        "journal_failures",
        "kind",
        "name",
        "park",
        "remote",
        "run_id",
        "span_mark",
        "started",
        "trace",
        "trace_id",
    )

    def __init__(self, attempt, name: str, park: bool = False):
        self.attempt = attempt
        # `@flow(journal_failures=True)`: a failed step is journaled and
        # raised as `TaskFailed` (EXT-7).
        self.journal_failures = False
        # `StepHandle`s of `start()`ed steps; the run settles only after
        # every one of them has (EXT-6).
        self.started: list[Any] | None = None
        # Durable waits park the run (settle it paused) instead of blocking
        # this process (`wait=False`, the worker).
        self.park = park
        # Commits wait on a server: async steps await them off the loop.
        self.remote = attempt.remote
        self.kind = attempt.kind
        self.run_id = attempt.run_id
        self.trace_id = attempt.trace_id
        self.trace = Trace(self.trace_id)
        self.name = name
        # Set (see `keep_step_spans_in_store`): the spans of plain task
        # steps are not kept in `trace` while the run executes; the finished
        # run's trace reads them from the store, written after this mark.
        self.span_mark = None


def keep_step_spans_in_store(run: RunState) -> None:
    """A flow run holds no per-step span objects (memory stays flat in run
    length) when the store can read them back."""
    run.span_mark = run.attempt.span_mark()


def _step_span(trace_id: str, row: tuple) -> Span:
    span_id, parent, name, started, ended, replayed, key, attrs, inp, out = row
    attributes = {} if attrs is None else _stored_payload(attrs)
    if key is not None:
        attributes = {"step_key": key, **attributes}
    return Span(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent,
        kind="task",
        name=name,
        started_at=started,
        ended_at=ended,
        status="ok",
        input=None if inp is None else _stored_payload(inp),
        output=None if out is None else _stored_payload(out),
        attributes=attributes,
        replayed=replayed,
    )


def _stored_payload(text: str) -> Any:
    """A span payload as stored (leniently encoded): decoded like a journal
    value, or as plain JSON when it names a type this process lacks."""
    try:
        return _codec.loads(text)
    except Exception:  # noqa: BLE001 -- payloads are observability, never fatal
        import json

        return json.loads(text)


def attach_step_spans(run: RunState) -> None:
    """Makes the finished run's trace read its task-step spans from the
    store on first access, merged in start (span id) order with the spans
    kept in memory."""
    mark = run.span_mark
    if mark is None:
        return
    run_id, trace_id = run.run_id, run.trace_id

    def load(kept: list[Span]) -> list[Span]:
        # Read through the process's store at the time, never a store
        # object kept alive by the trace.
        rows = get_store().step_spans(run_id, mark)
        ids = {s.span_id for s in kept}
        stored = [_step_span(trace_id, row) for row in rows if row[0] not in ids]
        merged = kept + stored
        merged.sort(key=_span_order)
        return merged

    run.trace._load = load


def _span_order(span: Span) -> str:
    return span.span_id


class Frame:
    """What a call sees of its surroundings. Immutable: nesting makes a new one."""

    # `__weakref__`: the core's task call remembers the last frame weakly.
    __slots__ = ("__weakref__", "defer", "fence", "run", "scope", "span", "trace")

    def __init__(self, run: RunState | None, scope: str, span: Span, fence, trace, defer=False):
        self.run = run
        self.scope = scope
        self.span = span
        self.fence = fence
        self.trace = trace
        # A step made directly in this frame hands its value to a collector
        # (a `map`) that syncs before the flow body sees it, so its commit
        # may complete in the background.
        self.defer = defer


FRAME: ContextVar[Frame | None] = ContextVar("composeai.frame", default=None)

# Every budget active here, innermost last; each is charged after every model
# call below its root (BUDGET-3, BUDGET-4).
BUDGETS: ContextVar[tuple] = ContextVar("composeai.budgets", default=())


def store_searched() -> str:
    """Which store a lookup searched, and how it was chosen, for a message."""
    spec = store_spec()
    kind, target = _core.store_target(spec, _default_sqlite())
    if kind != "sqlite":
        return f"searched the {kind} store '{target}' (COMPOSE_STORE or configure(store=...))"
    path = os.path.abspath(target)
    if spec:
        how = "COMPOSE_STORE or configure(store=...)"
    elif os.environ.get("COMPOSE_DIR"):
        how = f"COMPOSE_DIR={os.environ['COMPOSE_DIR']}"
    else:
        how = f"COMPOSE_DIR is unset: ./.compose under {os.getcwd()}"
    return f"searched the SQLite store '{path}' ({how})"


def run_not_found(run_id: str, quote: str = "run_id") -> str:
    """The message for a run id no row matches, naming the store searched."""
    return (
        f"no run found with {quote} '{run_id}' -- {store_searched()}; run from the directory "
        "the run was started in, or set COMPOSE_DIR / COMPOSE_STORE to its store"
    )


def missing_store() -> bool:
    """Whether the SQLite store file a lookup of an existing run would open
    does not exist (so the lookup reports it instead of creating it empty)."""
    if _store is not None:
        return False
    kind, target = _core.store_target(store_spec(), _default_sqlite())
    return kind == "sqlite" and not os.path.exists(target)


def importable_module(fn: Any) -> str | None:
    """The module another process imports to register `fn`; None for a
    script's `__main__` (no other process imports it by that name)."""
    module = getattr(fn, "__module__", None)
    return None if module in (None, "__main__") else module


def not_registered(kind: str, name: str, module: str | None, before: str) -> ConfigError:
    """The error for a run whose `kind` ('flow', 'agent') is not registered
    here, naming the module recorded with the run when there is one; its
    `not_registered` attribute tells it from other configuration errors."""
    text = (
        f"{kind} '{name}' is not registered in this process -- import the module that "
        f"defines it (so its @{kind} decoration runs) before {before}"
    )
    if module:
        text += f": `import {module}` (compose commands: --import {module})"
    else:
        text += " (compose commands: --import <module>)"
    error = ConfigError(text)
    error.not_registered = True  # type: ignore[attr-defined]
    return error


def budget_json(budget: Any) -> str | None:
    if budget is None:
        return None
    return _codec.dumps({"usd": budget.usd, "tokens": budget.tokens})


def budget_from_json(text: str) -> Any:
    data = _codec.loads(text)
    return Budget(usd=data.get("usd"), tokens=data.get("tokens"))


def budget_meter(budget: Any, span_kind: str, span_name: str, baseline=(0, 0.0)):
    """The core meter of a budget attached to a `span_kind` span (None for no budget)."""
    if budget is None:
        return None
    return _core.BudgetMeter(
        None if budget.usd is None else float(budget.usd),
        budget.tokens,
        str(budget.usd),
        str(budget.tokens),
        span_kind,
        span_name,
        baseline[0],
        baseline[1],
    )


def _emit(kind: EventKind, span: Span, data: dict) -> None:
    if _current_bus() is not None:
        _events.emit(
            _events.Event(
                kind, trace_id=span.trace_id, span_id=span.span_id, name=span.name, data=data
            )
        )


def emit_run_finished(root: Span, status: str, exc: BaseException | None = None) -> None:
    """Once per trace, for the root span."""
    if _current_bus() is None:
        return
    data: dict[str, Any] = {"status": status}
    if exc is not None:
        data["error"] = type(exc).__name__
    _events.emit(
        _events.Event("run_finished", trace_id=root.trace_id, span_id=root.span_id, data=data)
    )


# ---------------------------------------------------------------------------
# Spans


_capture = _capture_content


def open_span(parent: Span | None, trace: Trace, kind: str, name: str) -> Span:
    """Opens a span under `parent` in `trace` (the trace keeps start order)."""
    span = Span(
        trace_id=trace.trace_id,
        span_id=_core.ulid(),
        parent_span_id=parent.span_id if parent is not None else None,
        kind=kind,
        name=name,
        started_at=time.time(),
    )
    trace.add(span)
    if _current_bus() is not None:
        _emit("span_started", span, {"kind": kind})
    return span


def open_child(frame: Frame | None, kind: str, name: str) -> tuple[Span, Trace]:
    """A span under the frame's current span, or the root of a new trace."""
    if frame is not None and frame.span is not None:
        return open_span(frame.span, frame.trace, kind, name), frame.trace
    trace = Trace(_core.ulid())
    return open_span(None, trace, kind, name), trace


def error_info(exc: BaseException) -> ErrorInfo:
    import traceback

    return ErrorInfo(
        type=type(exc).__name__,
        message=str(exc),
        stacktrace="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    )


def mark_failed(span: Span, exc: BaseException) -> None:
    """Records how `exc` ended the span: paused, revoked or an error."""
    span.ended_at = time.time()
    if isinstance(exc, _Pause):
        span.status = "paused"
    elif (
        isinstance(exc, (_Revoked, _Cancelled, _RunCancelled))
        or type(exc).__name__ == "CancelledError"
    ):
        span.status = "cancelled"
    else:
        span.status = "error"
        span.error = error_info(exc)


def span_row(span: Span, output_json: str | None = None, input_json: str | None = None) -> tuple:
    """The 14-field record the core persists (see src/py/spans.rs)."""
    attributes = span.attributes
    step_key = attributes.get("step_key")
    if not attributes or (step_key is not None and len(attributes) == 1):
        attributes_json = None
    else:
        attributes_json = _codec.dumps_lenient(
            {k: v for k, v in attributes.items() if k != "step_key"}
        )
    error = span.error
    error_json = (
        None
        if error is None
        else _codec.dumps_lenient(
            {"type": error.type, "message": error.message, "stacktrace": error.stacktrace}
        )
    )
    usage = span.usage
    usage_t = (
        None
        if usage is None
        else (
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens,
            usage.cache_creation_tokens,
            usage.reasoning_tokens,
            usage.cost_usd,
            usage.cost_complete,
        )
    )
    if input_json is None and span.input is not None:
        input_json = _plain_args_json(span.input) or _codec.dumps_lenient(span.input)
    if output_json is None and span.output is not None:
        output_json = _codec.dumps_lenient(span.output)
    return (
        span.span_id,
        span.parent_span_id,
        span.kind,
        span.name,
        span.started_at,
        span.ended_at,
        span.status,
        span.replayed,
        step_key,
        attributes_json,
        usage_t,
        error_json,
        input_json,
        output_json,
    )


_encode_ascii_str = _codec._encode_str


def _plain_args_json(value: Any) -> str | None:
    """The text `dumps_lenient` writes for a step's input `{"args": [...],
    "kwargs": {}}` whose arguments are ints, bools, None or ASCII strings
    (the common case, written without the general encoder); None for any
    other input."""
    if type(value) is not dict or len(value) != 2:
        return None
    args = value.get("args")
    kwargs = value.get("kwargs")
    if type(args) is not list or type(kwargs) is not dict:
        return None
    return _args_text(args, kwargs)


def _args_text(args: Any, kwargs: dict) -> str | None:
    """`_plain_args_json` of `{"args": list(args), "kwargs": kwargs}`."""
    if kwargs:
        return None
    parts = []
    for a in args:
        t = type(a)
        if t is int:
            if not -_BIG_INT < a < _BIG_INT:
                return None
            parts.append(int.__repr__(a))
        elif t is str and a.isascii():
            parts.append(_encode_ascii_str(a))
        elif a is None:
            parts.append("null")
        elif t is bool:
            parts.append("true" if a else "false")
        else:
            return None
    return '{"args":[' + ",".join(parts) + '],"kwargs":{}}'


# Ints beyond this go through the general encoder (which knows the digit limit).
_BIG_INT = 10**18


def persist_span(run: RunState | None, span: Span, output_json: str | None = None) -> None:
    """Hands a finished span to the core: batched with the run's next commit,
    or, outside any run, written when its root finishes."""
    if not _capture():
        output_json = None
    if _current_bus() is not None:
        _emit("span_finished", span, {"kind": span.kind, "status": span.status})
    row = span_row(span, output_json)
    if run is not None:
        run.attempt.span(row)
        return
    store = get_store()
    store.queue_span(span.trace_id, row)
    if span.parent_span_id is None:
        try:
            store.flush()
        except Exception:  # noqa: BLE001, S110 -- warned once below (OBS-5)
            pass
        _check_span_writes()


def close_span(run: RunState | None, span: Span, output: Any = None) -> None:
    span.ended_at = time.time()
    span.status = "ok"
    if output is not None and _capture():
        span.output = output
    persist_span(run, span)


def fail_span(run: RunState | None, span: Span, exc: BaseException) -> None:
    mark_failed(span, exc)
    persist_span(run, span)


# ---------------------------------------------------------------------------
# Executing bodies


def _timeout_text(seconds: float) -> str:
    return str(seconds)


def task_timeout_error(kind: str, name: str, seconds: float, cooperative: bool) -> TaskTimeoutError:
    if cooperative:
        tail = " (cancelled cooperatively)"
    else:
        tail = (
            " -- the abandoned thread keeps running in the background as a daemon; its eventual "
            "result is discarded, and it loses journal write access immediately (its pure side "
            "effects, if any, still run to completion -- there is no safe way to stop that)"
        )
    return TaskTimeoutError(f"{kind} {name!r} exceeded timeout={_timeout_text(seconds)}s{tail}")


def run_on_thread(
    fn: Callable[[], Any],
    frame: Frame,
    timeout: float | None,
    on_timeout: Callable[[], BaseException],
    thread_name: str,
) -> Any:
    """Runs `fn` on a dedicated daemon thread under `frame` (whose fence the
    caller derived for it). On timeout the fence is revoked and the thread
    abandoned."""
    outcome: list[Any] = []
    from threading import Event

    from . import _threads

    finished = Event()
    ctx = copy_context()

    def target() -> None:
        FRAME.set(frame)
        try:
            outcome.append((True, fn()))
        except _Revoked:
            outcome.append((False, None))
        except BaseException as exc:  # noqa: BLE001 -- handed to the waiting side
            outcome.append((False, exc))
        finally:
            finished.set()

    _threads.spawn(lambda: ctx.run(target), thread_name)
    try:
        if not finished.wait(timeout):
            if frame.fence is not None:
                frame.fence.revoke()
            raise on_timeout()
    except KeyboardInterrupt:
        if frame.fence is not None:
            frame.fence.revoke()
        raise
    ok, value = outcome[0]
    if ok:
        return value
    if value is None:
        raise _Revoked("stage abandoned")
    raise value


def child_fence(frame: Frame):
    if frame.run is None:
        return None
    parent = frame.fence if frame.fence is not None else frame.run.attempt.root_fence()
    return parent.child()


def call_body(fn: Callable, is_async: bool, args: tuple, kwargs: dict) -> Any:
    """Calls a body from sync code: directly, or for an `async def` body on
    the calling thread's own event loop."""
    if is_async:
        from . import _runtime

        return _runtime.run_here(lambda: fn(*args, **kwargs), ASYNC_DRIVER)
    return fn(*args, **kwargs)


def call_with_retries(body: Callable[[], Any], retries: int, span: Span, policy=None) -> Any:
    """Re-runs the body on an `Exception`, recording each failure;
    with a `RetryPolicy`, as it says, after its delays."""
    if policy is not None:
        return call_with_policy(body, policy, span)
    attempt = 0
    while True:
        try:
            return body()
        except TaskTimeoutError:
            raise
        except Exception as exc:
            if retries:
                span.attributes.setdefault("retries", []).append(
                    {"type": type(exc).__name__, "message": str(exc)}
                )
            if attempt >= retries:
                raise
            attempt += 1


def call_with_policy(body: Callable[[], Any], policy, span: Span) -> Any:
    attempt = 1
    while True:
        try:
            return body()
        except Exception as exc:
            if attempt >= policy.max_attempts or not policy.retries(exc):
                raise
            attempt += 1
            delay = policy.delay(attempt)
            span.attributes.setdefault("retries", []).append(
                {"type": type(exc).__name__, "message": str(exc), "delay": delay}
            )
            time.sleep(delay)


def encode_step(key: str, value: Any) -> str:
    try:
        return _codec.dumps(value)
    except SerializationError as exc:
        raise SerializationError(f"step '{key}': {exc}") from None


# ---------------------------------------------------------------------------
# Journaled steps


# The event loop awaiting the current engine work, while it is async-driven
# (an `arun`, an async body); `None` under a sync driver.
ASYNC_DRIVER: ContextVar[Any] = ContextVar("composeai.async_driver", default=None)


def check_sync_facade() -> None:
    """A sync facade call made on the thread of the loop that drives
    the engine would block or deadlock that loop; it raises instead. A sync
    call from a plain coroutine (a notebook cell) is fine."""
    runtime = sys.modules.get("composeai._runtime")
    if runtime is not None and runtime.on_loop_thread():
        raise RuntimeError(runtime.REENTRY)
    driver = ASYNC_DRIVER.get()
    if driver is not None:
        asyncio = sys.modules.get("asyncio")
        if asyncio is not None and asyncio._get_running_loop() is driver:
            from ._runtime import REENTRY

            raise RuntimeError(REENTRY)


def driven_by_running_loop():
    """Marks the current context as async-driven by the running loop;
    returns the token to reset."""
    import asyncio

    return ASYNC_DRIVER.set(asyncio.get_running_loop())


def driven_synchronously():
    return ASYNC_DRIVER.set(None)


_MODULES = sys.modules
_STREAMS = "composeai._streams"


def _streams_loaded() -> bool:
    # A run can only be cancelled through a stream; until one was created
    # there is no token to look at.
    return "composeai._streams" in sys.modules


def _check_cancel() -> None:
    token = _CANCEL_TOKEN.get()
    if token is not None and token.cancelled:
        raise _Cancelled()


class StepStart:
    """A reserved step: either a journal hit (`hit` holds the decoded stored
    value; no `span`) or a miss to execute under `inner`, the step's own frame."""

    __slots__ = ("frame", "hit", "inner", "key", "span")

    def __init__(self, frame: Frame, key: str, span: Span | None, hit: Any, inner: Frame | None):
        self.frame = frame
        self.key = key
        self.span = span
        self.hit = hit
        self.inner = inner


def begin_step(
    frame: Frame,
    kind: str,
    name: str,
    span_input: Any = None,
    keep: bool = True,
    digest: int | None = None,
) -> StepStart:
    """Reserves the step's key. A hit is replayed here: the span is recorded
    as replayed and nothing else runs. Without `keep`, the span
    is persisted but not added to the in-memory trace (see
    `keep_step_spans_in_store`). `digest`: the hash of the call's arguments
    its identity keeps (`step_digest`)."""
    assert frame.run is not None  # journaled steps run inside a durable run
    if _streams_loaded():
        _check_cancel()
    hit = frame.run.attempt.replay(
        frame.scope, name, kind, frame.span.span_id, _capture(), frame.fence, digest
    )
    if type(hit) is tuple:
        return StepStart(frame, hit[6], None, replayed_hit(frame, hit, keep), None)
    return started_step(frame, kind, name, hit, span_input, keep)


def replayed_hit(frame: Frame, hit: tuple, keep: bool = True) -> Any:
    """Records the span of a replayed step (the core already queued its
    row) and returns the step's value. Without `keep` the record is not
    held in memory (the store has the row)."""
    trace = frame.trace
    if keep:
        trace._add_replayed(hit)
        if _current_bus() is not None:
            _emit_replayed(trace.spans[-1])
    elif _current_bus() is not None:
        _emit_replayed(replayed_span(trace.trace_id, hit))
    return hit[0]


def _emit_replayed(span: Span) -> None:
    _emit("span_started", span, {"kind": span.kind})
    _emit("span_finished", span, {"kind": span.kind, "status": "ok"})


def started_step(
    frame: Frame, kind: str, name: str, key: str, span_input: Any, keep: bool = True
) -> StepStart:
    """A journal miss: the step's span and frame, to execute the body under."""
    parent = frame.span
    span = Span(
        trace_id=parent.trace_id,
        span_id=_core.ulid(),
        parent_span_id=parent.span_id,
        kind=kind,
        name=name,
        started_at=time.time(),
        attributes={"step_key": key},
    )
    if keep:
        frame.trace.add(span)
    if _current_bus() is not None:
        _emit("span_started", span, {"kind": kind})
    if span_input is not None and _capture():
        span.input = span_input
    inner = Frame(frame.run, key, span, frame.fence, frame.trace)
    return StepStart(frame, key, span, None, inner)


def _step_record(step: StepStart, value: Any) -> tuple[str, Any, bool]:
    """`(value_json, span row, capture)` of a finished step, its span closed."""
    span = step.span
    assert span is not None  # a miss's: only a hit has none
    try:
        value_json = encode_step(step.key, value)
    except SerializationError as exc:
        fail_span(step.frame.run, span, exc)
        raise
    span.ended_at = time.time()
    span.status = "ok"
    capture = _capture()
    return value_json, span_row(span, value_json if capture else None), capture


def finish_step(step: StepStart, value: Any) -> Any:
    """Journals the step's value and span in one durable commit and returns
    the value decoded from what was stored."""
    run = step.frame.run
    assert run is not None and step.span is not None  # a miss inside a durable run
    value_json, row, capture = _step_record(step, value)
    if step.frame.defer:
        stored = run.attempt.commit_deferred(step.key, value_json, row, step.frame.fence)
    else:
        stored = run.attempt.commit(step.key, value_json, row, step.frame.fence)
    result = _codec.loads(stored)
    if capture:
        step.span.output = result
    return result


async def afinish_step(step: StepStart, value: Any) -> Any:
    """`finish_step` on a server-backed store: the loop keeps running while
    the commit travels (the core resolves the future)."""
    import asyncio

    assert step.frame.run is not None and step.span is not None  # a miss inside a durable run
    value_json, row, capture = _step_record(step, value)
    future = asyncio.get_running_loop().create_future()
    step.frame.run.attempt.acommit(step.key, value_json, row, step.frame.fence, future)
    result = _codec.loads(await future)
    if capture:
        step.span.output = result
    return result


def resolve_future(future: Any, ok: bool, value: Any) -> None:
    """Called on the loop by the core once an `acommit` finished."""
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


FAILED = "$failed"


def replayed_value(frame: Frame, step: StepStart) -> Any:
    """A journal hit: its value, or the journaled failure raised again."""
    assert frame.run is not None  # journaled steps run inside a durable run
    hit = step.hit
    if frame.run.journal_failures and isinstance(hit, dict) and list(hit) == [FAILED]:
        failure = hit[FAILED]
        raise TaskFailed(step.key, failure.get("type", ""), failure.get("message", ""))
    return hit


def raise_journaled_failure(step: StepStart, exc: Exception) -> None:
    """Journals a step's failure under its key and raises `TaskFailed`
    (original as `__cause__`)."""
    assert step.frame.run is not None  # journaled steps run inside a durable run
    record = {FAILED: {"type": type(exc).__name__, "message": str(exc)}}
    step.frame.run.attempt.commit(step.key, _codec.dumps(record), None, step.frame.fence)
    raise TaskFailed(step.key, type(exc).__name__, str(exc)) from exc


def journaled_step(
    frame: Frame, kind: str, name: str, execute: Callable[..., Any], args: tuple, kwargs: dict
) -> Any:
    """One journaled step on the sync path: replay, or run
    `execute(inner_frame, args, kwargs)` then commit."""
    if _STREAMS in _MODULES:
        _check_cancel()
    run = frame.run
    assert run is not None  # journaled steps run inside a durable run
    keep = kind != "task" or run.span_mark is None
    hit = run.attempt.replay(
        frame.scope,
        name,
        kind,
        span_id_of(frame),
        _capture(),
        frame.fence,
        step_digest(args, kwargs),
    )
    if type(hit) is tuple:
        return _replayed(frame, run, hit, keep)
    return _executed_step(frame, kind, name, hit, execute, args, kwargs, keep)


def _replayed(frame: Frame, run: RunState, hit: tuple, keep: bool) -> Any:
    """The whole of a replayed step: the core queued its span row; the
    record is kept unbuilt in the trace (with `keep`)."""
    if keep:
        trace = frame.trace
        if trace._unbuilt < 0:
            trace._unbuilt = len(trace._spans)
        trace._spans.append(hit)
        if _current_bus() is not None:
            _emit_replayed(trace.spans[-1])
    elif _current_bus() is not None:
        _emit_replayed(replayed_span(frame.trace.trace_id, hit))
    if run.journal_failures:
        return replayed_value(frame, StepStart(frame, hit[6], None, hit[0], None))
    return hit[0]


def _executed_step(
    frame: Frame,
    kind: str,
    name: str,
    key: str,
    execute: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    keep: bool,
) -> Any:
    """A journal miss on the sync path: `execute` under the step's span, then commit."""
    step = started_step(frame, kind, name, key, None, keep)
    assert frame.run is not None and step.span is not None  # a miss inside a durable run
    if _capture():
        step.span.input = {"args": list(args), "kwargs": kwargs}
    token = FRAME.set(step.inner)
    try:
        value = execute(step.inner, args, kwargs)
    except BaseException as exc:
        fail_span(frame.run, step.span, exc)
        if not keep:
            # Only `ok` step spans are read back from the store.
            frame.trace.add(step.span)
        if frame.run.journal_failures and isinstance(exc, Exception):
            raise_journaled_failure(step, exc)
        raise
    finally:
        FRAME.reset(token)
    return finish_step(step, value)


# ---------------------------------------------------------------------------
# The `@task` call (its hot paths are in the core: src/py/step.rs)


def span_id_of(frame: Frame) -> str:
    """The id of the frame's current span, without building a lean step's span."""
    if type(frame) is _core.StepFrame:
        return frame.span_id
    return frame.span.span_id


def task_step(frame: Frame, run: RunState, task: Any, args: tuple, kwargs: dict) -> Any:
    """A `@task` call inside a run that the core hands back whole."""
    return journaled_step(frame, "task", task.name, task._execute, args, kwargs)


def task_outside(task: Any, frame: Frame | None, args: tuple, kwargs: dict) -> Any:
    """A `@task` call outside any durable run."""
    return unjournaled_call(
        frame,
        "task",
        task.name,
        lambda inner: task._execute(inner, args, kwargs),
        _args_input(args, kwargs),
    )


def build_span(inner: Any) -> Span:
    """The `Span` of a lean step, as `started_step` makes it."""
    span = Span(
        trace_id=inner.trace.trace_id,
        span_id=inner.span_id,
        parent_span_id=inner.parent_span_id,
        kind="task",
        name=inner.name,
        started_at=inner.started_at,
        attributes={"step_key": inner.scope},
    )
    if inner.capture:
        span.input = _args_input(inner.args, inner.kwargs)
    return span


def lean_failed(frame: Frame, inner: Any, exc: BaseException) -> None:
    """A lean step's body raised: its span ends failed and is kept in the
    trace (only `ok` step spans are read back from the store)."""
    span = inner.span
    fail_span(inner.run, span, exc)
    frame.trace.add(span)


def lean_finish(frame: Frame, inner: Any, value: Any) -> Any:
    """A lean step whose body read its span: committed from the span."""
    return finish_step(StepStart(frame, inner.scope, inner.span, None, inner), value)


def lean_unencodable(inner: Any, exc: BaseException) -> None:
    """A lean step's value failed to encode: raises what `finish_step` would."""
    if not isinstance(exc, SerializationError):
        raise exc
    error = SerializationError(f"step '{inner.scope}': {exc}")
    fail_span(inner.run, inner.span, error)
    raise error from None


def args_json(args: tuple, kwargs: dict) -> str:
    """A step's input text, as `span_row` writes it."""
    return _args_text(args, kwargs) or _codec.dumps_lenient(_args_input(args, kwargs))


def _args_input(args: tuple, kwargs: dict) -> dict:
    return {"args": list(args), "kwargs": kwargs}


def step_digest(args: tuple, kwargs: dict) -> int | None:
    """The hash a step's identity keeps of its arguments: of their encoded
    text with every dict's keys (keyword arguments included) in sorted order,
    so that arguments equal by `==` hash alike whatever order a dict was built
    in; None when they cannot be encoded (the call is then compared by kind,
    name and position only)."""
    text = _args_text(args, kwargs)
    if text is None:
        try:
            text = _codec.canonical_dumps({"args": list(args), "kwargs": kwargs})
        except Exception:  # noqa: BLE001 -- any unencodable argument
            return None
    return _core.step_digest(text)


async def ajournaled_step(
    frame: Frame, kind: str, name: str, execute: Callable[..., Any], args: tuple, kwargs: dict
) -> Any:
    """The async twin of `journaled_step`: `execute` returns an awaitable."""
    assert frame.run is not None  # journaled steps run inside a durable run
    keep = kind != "task" or frame.run.span_mark is None
    step = begin_step(frame, kind, name, None, keep, step_digest(args, kwargs))
    if step.inner is None:
        return replayed_value(frame, step)
    assert step.span is not None  # a miss's: only a hit has none
    if _capture():
        step.span.input = {"args": list(args), "kwargs": kwargs}
    token = FRAME.set(step.inner)
    try:
        value = await execute(step.inner, args, kwargs)
    except BaseException as exc:
        fail_span(frame.run, step.span, exc)
        if not keep:
            frame.trace.add(step.span)
        if frame.run.journal_failures and isinstance(exc, Exception):
            raise_journaled_failure(step, exc)
        raise
    finally:
        FRAME.reset(token)
    if frame.run.remote:
        return await afinish_step(step, value)
    return finish_step(step, value)


def _unjournaled_frame(frame: Frame | None, kind: str, name: str, span_input: Any) -> Frame:
    run = frame.run if frame is not None else None
    span, trace = open_child(frame, kind, name)
    if span_input is not None and _capture():
        span.input = span_input
    return Frame(
        run,
        frame.scope if frame is not None else "",
        span,
        frame.fence if frame is not None else None,
        trace,
    )


def unjournaled_call(
    frame: Frame | None, kind: str, name: str, execute: Callable[[Frame], Any], span_input: Any
) -> Any:
    """A step outside any durable run: a plain span, nothing journaled."""
    inner = _unjournaled_frame(frame, kind, name, span_input)
    token = FRAME.set(inner)
    try:
        value = execute(inner)
    except BaseException as exc:
        fail_span(inner.run, inner.span, exc)
        raise
    finally:
        FRAME.reset(token)
    close_span(inner.run, inner.span, value)
    return value


async def aunjournaled_call(
    frame: Frame | None, kind: str, name: str, execute: Callable[[Frame], Any], span_input: Any
) -> Any:
    inner = _unjournaled_frame(frame, kind, name, span_input)
    token = FRAME.set(inner)
    try:
        value = await execute(inner)
    except BaseException as exc:
        fail_span(inner.run, inner.span, exc)
        raise
    finally:
        FRAME.reset(token)
    close_span(inner.run, inner.span, value)
    return value


# ---------------------------------------------------------------------------
# Deterministic values: now() / random()


def journaled_value(name: str, draw: Callable[[], Any]) -> Any:
    frame = FRAME.get()
    if frame is None or frame.run is None:
        return draw()
    attempt = frame.run.attempt
    key, hit = attempt.reserve(frame.scope, name, frame.fence, name)
    if hit is not None:
        return _codec.loads(hit)
    value = draw()
    return _codec.loads(attempt.commit(key, _codec.dumps(value), None, frame.fence))


# ---------------------------------------------------------------------------
# Interrupts

NO_RUN_FOR_INTERRUPT = (
    "approve()/ask_human() (and approval-gated @tool calls) only work inside an active @flow "
    "body or a durable @agent run -- none is active here"
)


def interrupt(interrupt_id: str, kind: str, question: str | None, payload: Any) -> Any:
    """Looks the answer up in the run's journal; without one, pauses."""
    frame = FRAME.get()
    if frame is None or frame.run is None:
        raise ConfigError(NO_RUN_FOR_INTERRUPT)
    hit = frame.run.attempt.lookup("__interrupt__:" + interrupt_id, frame.fence)
    if hit is not None:
        return _codec.loads(hit)
    span = open_span(frame.span, frame.trace, "pause", interrupt_id)
    span.ended_at = span.started_at
    span.status = "paused"
    if payload is not None and _capture():
        span.input = payload
    persist_span(frame.run, span)
    raise _Pause(interrupt_id, kind, question, payload)


# ---------------------------------------------------------------------------
# A run's error record; core calls and sync bodies awaited off the loop
# (driving and settling a run: `_drive`)


def error_json(exc: BaseException) -> str:
    message = str(exc)
    if type(exc).__name__ == "CancelledError" and not message:
        message = "cancelled"
    return _codec.dumps({"type": type(exc).__name__, "message": message})


async def off_loop(method: Callable[..., None], *args: Any) -> Any:
    """Awaits a core call that resolves an asyncio future of this loop once
    the server answered (`Store.astart_run`, `Attempt.asettle`, ...)."""
    import asyncio

    future = asyncio.get_running_loop().create_future()
    method(future, *args)
    return await future


async def run_on_thread_async(
    fn: Callable[[], Any],
    frame: Frame | None,
    timeout: float | None,
    on_timeout: Callable[[], BaseException],
    thread_name: str,
) -> Any:
    """Awaits a sync body run on a dedicated daemon thread (never a shared,
    bounded pool). Timeout or cancellation revokes its fence."""
    import asyncio

    from . import _threads

    loop = asyncio.get_running_loop()
    future = loop.create_future()
    ctx = copy_context()

    def deliver(outcome: tuple) -> None:
        if not future.done():
            future.set_result(outcome)

    def target() -> None:
        FRAME.set(frame)
        try:
            outcome = (True, fn())
        except _Revoked:
            outcome = (False, None)
        except BaseException as exc:  # noqa: BLE001 -- handed to the awaiting side
            outcome = (False, exc)
        try:
            loop.call_soon_threadsafe(deliver, outcome)
        except RuntimeError:
            pass  # the loop is gone; nobody is waiting

    _threads.spawn(lambda: ctx.run(target), thread_name)
    try:
        if timeout is None:
            ok, value = await future
        else:
            ok, value = await asyncio.wait_for(future, timeout)
    except asyncio.TimeoutError:
        if frame is not None and frame.fence is not None:
            frame.fence.revoke()
        raise on_timeout() from None
    except BaseException:
        if frame is not None and frame.fence is not None:
            frame.fence.revoke()
        raise
    if ok:
        return value
    if value is None:
        raise _Revoked("stage abandoned")
    raise value


_core.register_task_path(
    {
        "frame": FRAME,
        "driver": ASYNC_DRIVER,
        "bus": _events._BUS,
        "modules": sys.modules,
        "facade": check_sync_facade,
        "cancel": _check_cancel,
        "capture": _capture,
        "environ": _tracing._ENV_DATA,
        "content_key": getattr(_tracing, "_CONTENT_KEY", None),
        "dumps": _codec.dumps,
        "general": task_step,
        "outside": task_outside,
        "failed": lean_failed,
        "finish": lean_finish,
        "unencodable": lean_unencodable,
        "args_json": args_json,
        "call_body": call_body,
        "build_span": build_span,
        "digest": step_digest,
    }
)
