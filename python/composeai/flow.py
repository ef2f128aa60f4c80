"""`@task`, `@flow`, `now()`/`random()` and `resume()` (FLOW-1 … FLOW-61)."""

from __future__ import annotations

import sys

from . import _codec, _core, _engine, _source
from ._engine import FRAME, Frame
from .errors import ConfigError, ResumeMismatchError, SerializationError

__all__ = ["Flow", "Task", "anow", "arandom", "aresume", "flow", "now", "random", "resume", "task"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine
    from typing import Any, Generic, Protocol, overload

    import typing_extensions

    from ._streams import RunStream
    from .runs import Budget, Run

    # Bare `Task` / `Flow` mean `[..., Any]` (COMP-46).
    P = typing_extensions.ParamSpec("P", default=...)
    R = typing_extensions.TypeVar("R", default=Any)
else:
    from ._typing import Generic, ParamSpec, TypeVar, overload

    P = ParamSpec("P")
    R = TypeVar("R")

_TASKS: dict[str, Task] = {}
_FLOWS: dict[str, Flow] = {}


_CO_COROUTINE = 0x80  # inspect.CO_COROUTINE


# `functools.update_wrapper`'s copies, written out: `functools` (and the
# `collections` it imports) costs a fresh process milliseconds. Later
# Pythons change the list, so they use `functools` itself.
_WRAPPER_ASSIGNMENTS = ("__module__", "__name__", "__qualname__", "__doc__", "__annotations__")
if sys.version_info >= (3, 12):
    _WRAPPER_ASSIGNMENTS += ("__type_params__",)


def _update_wrapper(wrapper: Any, wrapped: Any) -> None:
    if sys.version_info >= (3, 14):
        from functools import update_wrapper

        update_wrapper(wrapper, wrapped)
        return
    for attr in _WRAPPER_ASSIGNMENTS:
        try:
            value = getattr(wrapped, attr)
        except AttributeError:
            pass
        else:
            setattr(wrapper, attr, value)
    wrapper.__dict__.update(getattr(wrapped, "__dict__", {}))
    wrapper.__wrapped__ = wrapped


def _is_coroutine_function(fn: Callable) -> bool:
    # A plain function answers from its code flags without importing
    # `inspect`; anything else (partials, methods, marked callables) asks it.
    if type(fn) is _source._FunctionType and "_is_coroutine_marker" not in fn.__dict__:
        return bool(fn.__code__.co_flags & _CO_COROUTINE)
    import inspect

    return inspect.iscoroutinefunction(fn)


def _args_payload(args: tuple, kwargs: dict) -> dict:
    return {"args": list(args), "kwargs": kwargs}


# ---------------------------------------------------------------------------
# @task


class Task(_core.TaskCall, Generic[P, R]):
    """A journaled unit of work (FLOW-1 … FLOW-7)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        retries: int,
        timeout: float | None,
        name: str,
        retry: Any = None,
    ):
        _update_wrapper(self, fn)
        self.fn = fn
        self.name = name
        self.retries = retries
        self.retry = retry
        self.timeout = timeout
        self._is_async = _is_coroutine_function(fn)
        # What the core's call reads: a lean task (no timeout, no retries)
        # runs its step in the core (src/py/step.rs).
        lean = timeout is None and not retries and retry is None
        self._step = (fn, name, lean, self._is_async)

    def __repr__(self) -> str:
        return f"<Task {self.name!r}>"

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        from functools import partial

        return partial(self, obj)

    if TYPE_CHECKING:
        # The call is the core's (`_core.TaskCall`): a replay or a plain
        # task's step runs no engine frame of Python (FLOW-16, FLOW-17).
        def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...

    def _timeout_error(self, cooperative: bool):
        assert self.timeout is not None  # made only once a timeout ran out
        return _engine.task_timeout_error("@task", self.name, self.timeout, cooperative)

    def _execute(self, inner: Frame, args: tuple, kwargs: dict) -> Any:
        fn = self.fn
        if self.timeout is None:

            def body():
                return _engine.call_body(fn, self._is_async, args, kwargs)

        elif self._is_async:

            def body():
                from . import _runtime

                return _runtime.run_here(
                    lambda: self._await_with_timeout(args, kwargs), _engine.ASYNC_DRIVER
                )

        else:

            def body():
                frame = Frame(
                    inner.run, inner.scope, inner.span, _engine.child_fence(inner), inner.trace
                )
                return _engine.run_on_thread(
                    lambda: fn(*args, **kwargs),
                    frame,
                    self.timeout,
                    lambda: self._timeout_error(False),
                    f"composeai-task-{self.name}",
                )

        return _engine.call_with_retries(body, self.retries, inner.span, self.retry)

    async def _await_with_timeout(self, args: tuple, kwargs: dict) -> Any:
        import asyncio

        try:
            return await asyncio.wait_for(self.fn(*args, **kwargs), self.timeout)
        except asyncio.TimeoutError:
            raise self._timeout_error(True) from None

    async def _aexecute(self, inner: Frame, args: tuple, kwargs: dict) -> Any:
        fn = self.fn
        attempt = 0
        while True:
            try:
                if self._is_async:
                    if self.timeout is None:
                        return await fn(*args, **kwargs)
                    return await self._await_with_timeout(args, kwargs)
                frame = Frame(
                    inner.run, inner.scope, inner.span, _engine.child_fence(inner), inner.trace
                )
                return await _engine.run_on_thread_async(
                    lambda: fn(*args, **kwargs),
                    frame,
                    self.timeout,
                    lambda: self._timeout_error(False),
                    f"composeai-task-{self.name}",
                )
            except Exception as exc:
                from .errors import TaskTimeoutError

                policy = self.retry
                if policy is not None:
                    if attempt + 1 >= policy.max_attempts or not policy.retries(exc):
                        raise
                    attempt += 1
                    delay = policy.delay(attempt + 1)
                    inner.span.attributes.setdefault("retries", []).append(
                        {"type": type(exc).__name__, "message": str(exc), "delay": delay}
                    )
                    import asyncio

                    await asyncio.sleep(delay)
                    continue
                if isinstance(exc, TaskTimeoutError):
                    raise
                if self.retries:
                    inner.span.attributes.setdefault("retries", []).append(
                        {"type": type(exc).__name__, "message": str(exc)}
                    )
                if attempt >= self.retries:
                    raise
                attempt += 1

    async def arun(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Async twin of calling the task, on the caller's loop (FLOW-7)."""
        frame = FRAME.get()
        if frame is not None and frame.run is not None:
            return await _engine.ajournaled_step(
                frame, "task", self.name, self._aexecute, args, kwargs
            )
        return await _engine.aunjournaled_call(
            frame,
            "task",
            self.name,
            lambda inner: self._aexecute(inner, args, kwargs),
            _args_payload(args, kwargs),
        )


def _register(registry: dict, obj: Any, replace: bool, message: str) -> None:
    if obj.name in registry and not replace:
        raise ConfigError(message)
    registry[obj.name] = obj


if TYPE_CHECKING:

    class _TaskDecorator(Protocol):
        """Static type of `task(...)` with options."""

        @overload
        def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> Task[P, R]: ...
        @overload
        def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    class _FlowDecorator(Protocol):
        """Static type of `flow(...)` with options."""

        @overload
        def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> Flow[P, R]: ...
        @overload
        def __call__(self, fn: Callable[P, R], /) -> Flow[P, R]: ...


@overload
def task(fn: Callable[P, Coroutine[Any, Any, R]], /) -> Task[P, R]: ...
@overload
def task(fn: Callable[P, R], /) -> Task[P, R]: ...
@overload
def task(
    *,
    retries: int = 0,
    timeout: float | None = None,
    name: str | None = None,
    replace: bool = False,
    retry: Any = None,
) -> _TaskDecorator: ...
def task(fn=None, /, *, retries=0, timeout=None, name=None, replace=False, retry=None):
    """Declares a journaled task, bare or with keyword options (FLOW-1);
    `retry=RetryPolicy(...)` instead of `retries=` (EXT-9)."""

    def decorate(f: Callable[..., Any]) -> Task:
        task_name = name or f.__name__
        policy = None
        if retry is not None:
            from ._retry import resolve

            policy = resolve(f"@task {task_name!r}", retries, retry)
        obj = Task(f, retries=retries, timeout=timeout, name=task_name, retry=policy)
        _register(
            _TASKS,
            obj,
            replace,
            f"@task name {task_name!r} is already registered -- task names must be unique per "
            "process (they key the durable journal's per-step counter); pass an explicit "
            "name=... to disambiguate",
        )
        _codec.register_annotation_types(f)
        return obj

    if fn is not None:
        return decorate(fn)
    return decorate


# ---------------------------------------------------------------------------
# @flow


def _fingerprint(fn: Callable) -> str:
    """SHA-256 of the dedented source (FLOW-9), hashed in the core."""
    import inspect
    import textwrap

    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return f"nosource:{fn.__module__}:{fn.__qualname__}"
    return _core.sha256_hex(source)


class Flow(Generic[P, R]):
    """A durable run (FLOW-8 … FLOW-12)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str,
        journal_failures: bool = False,
        retry: Any = None,
        durability: str | None = None,
    ):
        _update_wrapper(self, fn)
        self.fn = fn
        self.name = name
        self.journal_failures = journal_failures
        # None: `COMPOSE_DURABILITY`, read at each run.
        self.durability = durability
        # EXT-8: None (= RetryPolicy.NONE) or a policy with several attempts.
        self.retry = retry if retry is not None and retry.max_attempts > 1 else None
        # FLOW-9: from a snapshot of the source taken now, hashed when first needed.
        self._source = _source.snapshot(fn)
        self._fingerprint = None if self._source is not None else _fingerprint(fn)
        self._is_async = _is_coroutine_function(fn)

    def __repr__(self) -> str:
        return f"<Flow {self.name!r}>"

    @property
    def fingerprint(self) -> str:
        fp = self._fingerprint
        if fp is None:
            assert self._source is not None
            fp = self._fingerprint = self._source.fingerprint()
        return fp

    def _has_fingerprint(self, fingerprint: str) -> bool:
        """Whether the flow's source has this (stored) fingerprint; mostly
        answered without tokenizing the source."""
        source = self._source
        if self._fingerprint is None and source is not None and source.matches(fingerprint):
            self._fingerprint = fingerprint
            return True
        return self.fingerprint == fingerprint

    # Direct calls are checked against the body's parameters; `budget=` is accepted on top.
    @overload
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...
    @overload
    def __call__(self, *args: Any, budget: Budget | None, **kwargs: Any) -> R: ...
    def __call__(self, *args: Any, budget: Any = None, **kwargs: Any) -> R:
        _engine.check_sync_facade()
        frame = FRAME.get()
        if frame is not None and frame.run is not None:
            if budget is not None:
                raise ConfigError(self._nested_budget_message())
            return _engine.journaled_step(
                frame,
                "flow",
                self.name,
                lambda _inner, a, k: _engine.call_body(self.fn, self._is_async, a, k),
                args,
                kwargs,
            )
        return self.run(*args, budget=budget, **kwargs).output

    def _nested_budget_message(self) -> str:
        return (
            f"@flow {self.name!r}: budget= is not supported on a nested flow call (the enclosing "
            "run's budget governs); set it on the outer run"
        )

    def _start(self, args: tuple, kwargs: dict, budget: Any, wait: bool = True):
        args_json = _codec.dumps(_args_payload(args, kwargs))
        budget_json = _engine.budget_json(budget)
        attempt = _engine.get_store().start_run(
            "flow", self.name, self.fingerprint, args_json, budget_json
        )
        run = _engine.RunState(attempt, self.name, not wait)
        return run, _engine.budget_meter(budget, "flow", self.name)

    async def _astart(self, args: tuple, kwargs: dict, budget: Any, wait: bool = True):
        args_json = _codec.dumps(_args_payload(args, kwargs))
        budget_json = _engine.budget_json(budget)
        attempt = await _engine.astart_run(
            "flow", self.name, self.fingerprint, args_json, budget_json
        )
        run = _engine.RunState(attempt, self.name, not wait)
        return run, _engine.budget_meter(budget, "flow", self.name)

    def _root(self, run, args: tuple, kwargs: dict):
        root = _engine.open_span(None, run.trace, "flow", self.name)
        if _engine._capture():
            root.input = _args_payload(args, kwargs)
        return root

    def _drive(self, run, args: tuple, kwargs: dict, meter=None):
        _core.set_module(run.attempt, self.fn.__module__)
        run.journal_failures = self.journal_failures
        _engine.apply_durability(run, self.durability)
        root = self._root(run, args, kwargs)
        token = _engine.BUDGETS.set((meter,)) if meter is not None else None
        try:
            return self._drive_body(run, root, args, kwargs)
        finally:
            if token is not None:
                _engine.BUDGETS.reset(token)

    def _drive_body(self, run, root, args: tuple, kwargs: dict):
        call = lambda: self.fn(*args, **kwargs)
        if self.retry is not None:
            from .durable import aretrying_body, retrying_body

            policy, plain = self.retry, call
            if self._is_async:
                call = lambda: aretrying_body(policy, plain)
            else:
                call = lambda: retrying_body(policy, plain)
        if self._is_async:
            from . import _runtime

            outcome = _runtime.run_sync(lambda: _engine.drive_async(run, call, root))
        else:
            outcome = _engine.drive_sync(run, call, root)
        return self._after(run, _engine.make_run_result(run, outcome))

    def _after(self, run, result):
        """A blocking driver carries on after a retry backoff (EXT-8)."""
        if self.retry is not None and not run.park:
            from .durable import is_retry_park

            if is_retry_park(result):
                return resume(result.id)
        return result

    async def _adrive(self, run, args: tuple, kwargs: dict, meter=None):
        _core.set_module(run.attempt, self.fn.__module__)
        run.journal_failures = self.journal_failures
        _engine.apply_durability(run, self.durability)
        root = self._root(run, args, kwargs)
        token = _engine.BUDGETS.set((meter,)) if meter is not None else None
        try:
            return await self._adrive_body(run, root, args, kwargs)
        finally:
            if token is not None:
                _engine.BUDGETS.reset(token)

    async def _adrive_body(self, run, root, args: tuple, kwargs: dict):
        if self._is_async:
            body = lambda: self.fn(*args, **kwargs)
        else:

            def body():
                frame = FRAME.get()
                thread_frame = Frame(
                    frame.run, frame.scope, frame.span, _engine.child_fence(frame), frame.trace
                )
                return _engine.run_on_thread_async(
                    lambda: self.fn(*args, **kwargs),
                    thread_frame,
                    None,
                    lambda: RuntimeError("unreachable"),
                    f"composeai-flow-{self.name}",
                )

        if self.retry is not None:
            from .durable import aretrying_body, is_retry_park

            policy, plain = self.retry, body
            body = lambda: aretrying_body(policy, plain)
        outcome = await _engine.drive_async(run, body, root)
        result = _engine.make_run_result(run, outcome)
        if self.retry is not None and not run.park and is_retry_park(result):
            return await aresume(result.id)
        return result

    def run(self, *args: Any, budget: Any = None, wait: bool = True, **kwargs: Any) -> Run[R]:
        """Starts a new top-level durable run, even inside another flow.
        `wait=False`: durable waits park the run instead of blocking (EXT-1)."""
        _engine.check_sync_facade()
        run, meter = self._start(args, kwargs, budget, wait)
        return self._drive(run, args, kwargs, meter)

    def start(
        self,
        *args: Any,
        budget: Any = None,
        wait: bool = True,
        queue: Any = None,
        priority: int = 0,
        dedup_id: str | None = None,
        **kwargs: Any,
    ):
        """EXT-11: creates the run durably, executes it on a background thread
        of this process and returns its `RunHandle` at once. With `queue`
        (STORE-20) the run is created `queued` and a worker executes it."""
        _engine.check_sync_facade()
        if queue is not None:
            from .queues import start_queued

            return start_queued(self, args, kwargs, budget, queue, priority, dedup_id)
        if priority != 0 or dedup_id is not None:
            raise ConfigError(
                f"priority and dedup_id apply to queued runs -- pass queue= to {self.name}.start()"
            )
        from .durable import start_in_background

        return start_in_background(self, args, kwargs, budget, wait)

    def stream(self, *args: Any, budget: Any = None, **kwargs: Any) -> RunStream[R]:
        """Runs `.run()` on a background thread with a fresh event bus (FLOW-10)."""
        from ._streams import RunStream

        return RunStream.start(lambda: self.run(*args, budget=budget, **kwargs), cancellable=True)

    async def arun(
        self, *args: Any, budget: Any = None, wait: bool = True, **kwargs: Any
    ) -> Run[R]:
        """Async twin of `run`; nested (one step) when a flow is active (FLOW-50)."""
        frame = FRAME.get()
        if frame is not None and frame.run is not None:
            if budget is not None:
                raise ConfigError(self._nested_budget_message())
            return await self._anested(frame, args, kwargs)
        run, meter = await self._astart(args, kwargs, budget, wait)
        return await self._adrive(run, args, kwargs, meter)

    async def _anested(self, frame: Frame, args: tuple, kwargs: dict):
        from . import _core
        from .runs import Run

        spans: list = []

        async def execute(inner: Frame, args: tuple, kwargs: dict):
            spans.append(inner.span)
            if self._is_async:
                return await self.fn(*args, **kwargs)
            thread_frame = Frame(
                inner.run, inner.scope, inner.span, _engine.child_fence(inner), inner.trace
            )
            return await _engine.run_on_thread_async(
                lambda: self.fn(*args, **kwargs),
                thread_frame,
                None,
                lambda: RuntimeError("unreachable"),
                f"composeai-flow-{self.name}",
            )

        output = await _engine.ajournaled_step(frame, "flow", self.name, execute, args, kwargs)
        usage = None
        if spans:
            usage = _engine.subtree_usage(frame.trace, spans[0])
        return Run(
            id=_core.ulid(),
            status="completed",
            output=output,
            usage=usage,
            trace=frame.trace,
            messages=[],
        )


@overload
def flow(fn: Callable[P, Coroutine[Any, Any, R]], /) -> Flow[P, R]: ...
@overload
def flow(fn: Callable[P, R], /) -> Flow[P, R]: ...
@overload
def flow(
    *,
    name: str | None = None,
    replace: bool = False,
    journal_failures: bool = False,
    retry: Any = None,
    durability: str | None = None,
) -> _FlowDecorator: ...
def flow(
    fn=None, /, *, name=None, replace=False, journal_failures=False, retry=None, durability=None
):
    """Declares a durable flow, bare or with keyword options (FLOW-8).
    `journal_failures=True`: failed steps raise a journaled `TaskFailed`
    (EXT-7); `retry=RetryPolicy(...)`: the engine re-attempts a failed run
    after a durable backoff (EXT-8); `durability="batch"`: steps are
    group-committed in the background (default `"step"`, or
    `COMPOSE_DURABILITY`)."""
    if durability is not None:
        _engine.check_durability(durability, "@flow(durability=...)")

    def decorate(f: Callable[..., Any]) -> Flow:
        flow_name = name or f.__name__
        policy = None
        if retry is not None:
            from ._retry import resolve

            policy = resolve(f"@flow {flow_name!r}", 0, retry)
        obj = Flow(
            f,
            name=flow_name,
            journal_failures=bool(journal_failures),
            retry=policy,
            durability=durability,
        )
        _register(
            _FLOWS,
            obj,
            replace,
            f"@flow name {flow_name!r} is already registered -- flow names must be unique per "
            "process; pass an explicit name=... to disambiguate",
        )
        _codec.register_annotation_types(f)
        return obj

    if fn is not None:
        return decorate(fn)
    return decorate


def reset_registries() -> None:
    """Forgets every registered task, flow, graph and queue name (TEST-50)."""
    _TASKS.clear()
    _FLOWS.clear()
    graph = sys.modules.get("composeai.graph")
    if graph is not None:
        graph.reset_registry()
    queues = sys.modules.get("composeai.queues")
    if queues is not None:
        queues._QUEUES.clear()


# ---------------------------------------------------------------------------
# now() / random()


def _utc_now():
    from datetime import datetime, timezone

    if _core.clock_is_fake():
        return datetime.fromtimestamp(_core.clock_now(), timezone.utc)
    return datetime.now(timezone.utc)


def _draw() -> float:
    import random as _random

    return _random.random()


def now():
    """The current UTC time, journaled once per call inside a flow (FLOW-22)."""
    _engine.check_sync_facade()
    return _engine.journaled_value("now", _utc_now)


def random() -> float:
    """A float in [0, 1), journaled once per call inside a flow (FLOW-23)."""
    _engine.check_sync_facade()
    return _engine.journaled_value("random", _draw)


async def anow():
    """Async twin of `now()`, sharing its keys (FLOW-24)."""
    return _engine.journaled_value("now", _utc_now)


async def arandom() -> float:
    """Async twin of `random()`, sharing its keys (FLOW-24)."""
    return _engine.journaled_value("random", _draw)


# ---------------------------------------------------------------------------
# resume()

_CALLBACKS_ON_FLOW = (
    "approver=, context_manager= and tool_interceptor= apply only to standalone agent runs, "
    "not @flow runs"
)


def _resolve_answers(answers: dict[str, Any], pending_ids: list[str]) -> list[tuple[str, str]]:
    """Maps answer keys to interrupt ids and encodes the answers (FLOW-43)."""
    pending = set(pending_ids)
    resolved: list[tuple[str, str]] = []
    for key, value in answers.items():
        if key in pending:
            full = key
        else:
            matches = sorted(p for p in pending_ids if p.startswith(f"tool:{key}:"))
            if len(matches) == 1:
                full = matches[0]
            elif len(matches) > 1:
                raise ConfigError(
                    f"answer key {key!r} is ambiguous -- it matches multiple pending interrupts "
                    f"{matches!r}; use the full interrupt id to disambiguate"
                )
            elif pending_ids and all(p.startswith("tool:") for p in pending_ids):
                raise ConfigError(
                    f"answer key {key!r} does not match any pending interrupt -- currently "
                    f"pending: {sorted(pending_ids)!r} (a tool-call answer can't be supplied ahead "
                    "of the tool actually being called, unlike a bare approve()/ask_human() id)"
                )
            else:
                full = key
        try:
            encoded = _codec.dumps(value)
        except SerializationError as exc:
            raise SerializationError(f"answer {key!r}: {exc}") from None
        resolved.append((full, encoded))
    return resolved


def _prepare_resume(
    store: Any,
    run_id: str,
    answers: dict[str, Any] | None,
    allow_code_change: bool,
    callbacks: tuple,
):
    """Plan (`_engine.plan_io`): FLOW-41's checks, in order, before anything
    is written. Returns the flow to run and the resolved answers, or a
    finished `Run`, or the row of an agent or graph run."""
    remote = store.kind != "sqlite"
    row = yield _engine.plan_io(remote, store.get_run, store.aget_run, run_id)
    graph = sys.modules.get("composeai.graph")
    if row is None and graph is not None:
        found = yield from graph.find_run(run_id)
        row = found[1] if found is not None else None
    if row is None:
        raise ConfigError(f"no run found with run_id {run_id!r}")
    if row["kind"] in ("agent", "graph"):
        return None, None, row
    if any(c is not None for c in callbacks):
        raise ConfigError(_CALLBACKS_ON_FLOW)
    if row["status"] == "cancelled" and row["kind"] == "flow":
        raise ConfigError(f"run '{run_id}' was cancelled")
    flow_obj = _FLOWS.get(row["name"])
    if flow_obj is None or row["kind"] != "flow":
        raise ConfigError(
            f"flow {row['name']!r} is not registered in this process -- import the module that "
            "defines it (so its @flow decoration runs) before calling resume()"
        )
    if row["status"] == "completed":
        from .runs import Run
        from .tracing import Trace

        output_json = row["output_json"]
        return (
            None,
            None,
            Run(
                id=run_id,
                status="completed",
                output=_codec.loads(output_json) if output_json is not None else None,
                usage=None,
                trace=Trace(trace_id=row["trace_id"] or ""),
                messages=[],
                pending=None,
            ),
        )
    if not allow_code_change and not flow_obj._has_fingerprint(row["fingerprint"]):
        raise ResumeMismatchError(
            f"@flow {flow_obj.name!r}'s source changed since run {run_id!r} was created "
            "(fingerprint mismatch) -- pass allow_code_change=True to resume anyway (the journal "
            "may no longer match the new code's call sequence)"
        )
    resolved = yield from _pending_answers(store, run_id, answers)
    return flow_obj, resolved, None


def _pending_answers(store: Any, run_id: str, answers: dict[str, Any] | None):
    """Plan: FLOW-43 against the run's pending interrupts; nothing is written."""
    if not answers:
        return []
    remote = store.kind != "sqlite"
    pending = yield _engine.plan_io(remote, store.pending, store.apending, run_id)
    return _resolve_answers(answers, [p[0] for p in pending])


def resolve_pending_answers(run_id: str, answers: dict[str, Any] | None) -> list:
    """FLOW-43 against the run's pending interrupts; nothing is written."""
    return _engine.run_plan(_pending_answers(_engine.get_store(), run_id, answers))


async def aresolve_pending_answers(run_id: str, answers: dict[str, Any] | None) -> list:
    """`resolve_pending_answers`, the interrupts read off the loop on a server."""
    store = await _engine.aget_store()
    return await _engine.arun_plan(_pending_answers(store, run_id, answers))


def begin_resume(
    run_id: str, resolved: list, budget: Any, span_kind: str, name: str, recover: bool = False
):
    """Takes the lease, applies the budget override and the answers, decodes
    the stored arguments, and builds the budget meter seeded with earlier
    attempts' spend (FLOW-42, BUDGET-7/8). Returns `(run, payload, meter)`.
    `recover`: a worker continuing a due run (STORE-12's limit applies)."""
    # The answers are journaled with the claim (one commit on SQLite).
    attempt = _engine.get_store().resume(run_id, recover, resolved)
    try:
        if budget is not None:
            attempt.set_budget(_engine.budget_json(budget))
        payload = _codec.loads(attempt.args_json) if attempt.args_json else {}
        effective = budget
        if effective is None and attempt.budget_json:
            effective = _engine.budget_from_json(attempt.budget_json)
        meter = None
        if effective is not None:
            meter = _engine.budget_meter(effective, span_kind, name, attempt.prior_llm_usage())
    except BaseException as exc:
        attempt.settle("failed", None, _engine.error_json(exc))
        raise
    return _engine.RunState(attempt, name), payload, meter


async def abegin_resume(run_id: str, resolved: list, budget: Any, span_kind: str, name: str):
    """`begin_resume` for an async driver: the lease claim, the answers and
    a failure's settlement are awaited off the loop on a server-backed store."""
    attempt = await _engine.aresume_attempt(run_id)
    remote = attempt.remote
    try:
        if budget is not None:
            budget_json = _engine.budget_json(budget)
            if remote:
                await _engine.off_loop(attempt.aset_budget, budget_json)
            else:
                attempt.set_budget(budget_json)
        if resolved:
            if remote:
                await _engine.off_loop(attempt.arecord_answers, resolved)
            else:
                attempt.record_answers(resolved)
        payload = _codec.loads(attempt.args_json) if attempt.args_json else {}
        effective = budget
        if effective is None and attempt.budget_json:
            effective = _engine.budget_from_json(attempt.budget_json)
        meter = None
        if effective is not None:
            if remote:
                prior = await _engine.off_loop(attempt.aprior_llm_usage)
            else:
                prior = attempt.prior_llm_usage()
            meter = _engine.budget_meter(effective, span_kind, name, prior)
    except BaseException as exc:
        await _engine.asettle(attempt, "failed", None, _engine.error_json(exc))
        raise
    return _engine.RunState(attempt, name), payload, meter


def _begin_resume(
    flow_obj: Flow, run_id: str, resolved, budget, wait: bool = True, recover: bool = False
):
    run, payload, meter = begin_resume(run_id, resolved, budget, "flow", flow_obj.name, recover)
    run.park = not wait
    return run, tuple(payload.get("args", ())), dict(payload.get("kwargs", {})), meter


class NotDue(Exception):
    """The run settled in another process after it was listed as due."""


# Statuses a due run can be continued from: parked, or running with a dead holder.
_CONTINUABLE = ("paused", "running")


def continue_due(run_id: str) -> Run[Any]:
    """Continues a run the worker found due, parking on its next wait.

    Unlike ``resume()``, a run that another process settled in the meantime
    (completed, failed or cancelled) is left exactly as it is: the status is
    checked again under the lease, so two workers never both continue it.
    """
    store = _engine.get_store()
    row = store.get_run(run_id)
    if row is None or row["kind"] != "flow" or row["status"] not in _CONTINUABLE:
        raise NotDue(run_id)
    flow_obj, resolved, done = _engine.run_plan(
        _prepare_resume(store, run_id, None, False, (None, None, None))
    )
    if done is not None:
        raise NotDue(run_id)
    run, args, kwargs, meter = _begin_resume(
        flow_obj, run_id, resolved, None, wait=False, recover=True
    )
    attempt = run.attempt
    if attempt.status not in _CONTINUABLE:
        # Settled between the check above and the lease: give the lease back
        # with the row as it is.
        settled = store.get_run(run_id)
        attempt.settle(settled["status"], settled["output_json"], settled["error_json"])
        raise NotDue(run_id)
    return flow_obj._drive(run, args, kwargs, meter)


def resume(
    run_id: str,
    answers: dict[str, Any] | None = None,
    *,
    budget: Any = None,
    allow_code_change: bool = False,
    approver: Any = None,
    tool_interceptor: Any = None,
    context_manager: Any = None,
    wait: bool = True,
) -> Run[Any]:
    """Continues a durable run in this or any process (FLOW-40 … FLOW-43)."""
    _engine.check_sync_facade()
    flow_obj, resolved, done = _engine.run_plan(
        _prepare_resume(
            _engine.get_store(),
            run_id,
            answers,
            allow_code_change,
            (approver, tool_interceptor, context_manager),
        )
    )
    if isinstance(done, dict) and done["kind"] == "graph":
        from .graph import resume_graph_run

        return resume_graph_run(done, answers, budget)
    if isinstance(done, dict):
        from .agentfn import resume_standalone

        return resume_standalone(
            done, answers, budget, approver, tool_interceptor, context_manager, False
        )
    if done is not None:
        return done
    run, args, kwargs, meter = _begin_resume(flow_obj, run_id, resolved, budget, wait)
    return flow_obj._drive(run, args, kwargs, meter)


async def aresume(
    run_id: str,
    answers: dict[str, Any] | None = None,
    *,
    budget: Any = None,
    allow_code_change: bool = False,
    approver: Any = None,
    tool_interceptor: Any = None,
    context_manager: Any = None,
    wait: bool = True,
) -> Run[Any]:
    """Async twin of `resume`, on the caller's loop: every read and write of a
    server-backed store, and its first open, are awaited off the loop."""
    flow_obj, resolved, done = await _engine.arun_plan(
        _prepare_resume(
            await _engine.aget_store(),
            run_id,
            answers,
            allow_code_change,
            (approver, tool_interceptor, context_manager),
        )
    )
    if isinstance(done, dict) and done["kind"] == "graph":
        from .graph import aresume_graph_run

        return await aresume_graph_run(done, answers, budget)
    if isinstance(done, dict):
        from .agentfn import resume_standalone

        return await resume_standalone(
            done, answers, budget, approver, tool_interceptor, context_manager, True
        )
    if done is not None:
        return done
    run, payload, meter = await abegin_resume(run_id, resolved, budget, "flow", flow_obj.name)
    run.park = not wait
    args, kwargs = tuple(payload.get("args", ())), dict(payload.get("kwargs", {}))
    return await flow_obj._adrive(run, args, kwargs, meter)
