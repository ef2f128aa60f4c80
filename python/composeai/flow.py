"""`@task`, `@flow`, `now()`/`random()` and `resume()`."""

from __future__ import annotations

import sys

from . import _codec, _core, _drive, _engine, _source
from ._engine import FRAME, Frame

# `NotDue`, `continue_due` and the `*resume*` helpers stay importable from
# here, where they were before `_lifecycle`.
from ._lifecycle import (  # noqa: F401
    _FLOWS,
    REGISTRIES,
    NotDue,
    abegin_resume,
    aexisting_run,
    aresolve_pending_answers,
    aresume,
    begin_resume,
    check_run_id,
    continue_due,
    existing_run,
    resolve_pending_answers,
    resume,
    start_in_background,
    start_queued,
)
from ._values import Run
from .errors import ConfigError

__all__ = ["Flow", "Task", "anow", "arandom", "aresume", "flow", "now", "random", "resume", "task"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine
    from datetime import timedelta
    from typing import Any, Generic, Protocol, overload

    import typing_extensions

    from ._streams import RunStream
    from .runs import Budget

    # Bare `Task` / `Flow` mean `[..., Any]` (COMP-46).
    P = typing_extensions.ParamSpec("P", default=...)
    R = typing_extensions.TypeVar("R", default=Any)
else:
    from ._typing import Generic, ParamSpec, TypeVar, overload

    P = ParamSpec("P")
    R = TypeVar("R")

_TASKS: dict[str, Task] = {}


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
    """A task made by `@task`: call it like the function it wraps.

    Inside a flow a call is a journaled step; `await task.arun(...)` is the
    async form. `name` is the journal name.
    """

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
        """Async twin of calling the task, on the caller's loop."""
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
    """Declares a task: a step whose value a flow journals.

    Usable bare (`@task`) or with keyword options. Inside a flow each call is
    journaled under `<name>#<n>` and replayed from the journal on resume;
    outside any flow a call simply runs (traced, not journaled).

    Args:
        retries: attempts again at once after an exception, this many times.
        timeout: seconds per attempt; a sync body is raced on a thread, an
            async one cancelled; raises `TaskTimeoutError`.
        name: the journal name (default: the function's name); unique per
            process.
        replace: rebind a name that is already registered.
        retry: a `RetryPolicy` (backoff, jitter, which exceptions), instead
            of `retries=`.
    """

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
    """SHA-256 of the dedented source, hashed in the core."""
    import inspect
    import textwrap

    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return f"nosource:{fn.__module__}:{fn.__qualname__}"
    return _core.sha256_hex(source)


class Flow(Generic[P, R]):
    """A durable flow made by `@flow`.

    `flow_fn(...)` runs it and returns its output; `run()` returns the `Run`
    (`completed`, `paused` or `cancelled`; a failure raises); `start()`
    executes it in the background and returns a `RunHandle`; `stream()`
    yields its events; `arun()` is the async form. `name` and `fingerprint`
    (a hash of the source, checked on resume) identify its code.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str,
        journal_failures: bool = False,
        retry: Any = None,
        durability: str | None = None,
        on_divergence: str = "raise",
        timeout: float | None = None,
    ):
        _update_wrapper(self, fn)
        self.fn = fn
        self.name = name
        # OPS-12: seconds from a run's creation to its deadline.
        self.timeout = timeout
        self.journal_failures = journal_failures
        # Issue 27: how a resumed body that diverges from its journal is met.
        self.on_divergence = on_divergence
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
            return _engine.journaled_step(frame, "flow", self.name, self._nested, args, kwargs)
        return self.run(*args, budget=budget, **kwargs).output

    def _nested(self, inner: Frame, args: tuple, kwargs: dict) -> Any:
        """The body of a nested call, under its own deadline when it has a
        timeout (the tighter of it and the enclosing one's)."""
        if self.timeout is None:
            return _engine.call_body(self.fn, self._is_async, args, kwargs)
        token = FRAME.set(self._deadline_frame(inner))
        try:
            return _engine.call_body(self.fn, self._is_async, args, kwargs)
        finally:
            FRAME.reset(token)

    def _deadline_frame(self, inner: Frame) -> Frame:
        """`inner` with the fence carrying this nested flow's journaled deadline."""
        assert inner.run is not None  # a nested call runs inside a durable run
        fence = inner.run.attempt.nested_deadline(inner.scope, self.name, self.timeout, inner.fence)
        return Frame(inner.run, inner.scope, inner.span, fence, inner.trace)

    def _nested_budget_message(self) -> str:
        return (
            f"@flow {self.name!r}: budget= is not supported on a nested flow call (the enclosing "
            "run's budget governs); set it on the outer run"
        )

    @property
    def _module(self) -> str | None:
        """The importable module defining the flow, recorded with each run so an
        error in another process can name the import (None for a script's
        `__main__`, which no other process can import by that name)."""
        return _engine.importable_module(self.fn)

    def _start(self, args: tuple, kwargs: dict, budget: Any, wait: bool = True):
        args_json = _codec.dumps(_args_payload(args, kwargs))
        budget_json = _engine.budget_json(budget)
        attempt = _engine.get_store().start_run(
            "flow",
            self.name,
            self.fingerprint,
            args_json,
            budget_json,
            module=self._module,
            timeout=self.timeout,
        )
        run = _engine.RunState(attempt, self.name, not wait)
        return run, _engine.budget_meter(budget, "flow", self.name)

    def _start_keyed(self, args: tuple, kwargs: dict, budget: Any, wait: bool, run_id: Any):
        """`_start` under the caller's `run_id`: `(run, meter, None)`
        when the run was created here, else `(None, None, (row, live))` for
        the run of the same flow and arguments that holds the id."""
        args_json = _codec.dumps(_args_payload(args, kwargs))
        budget_json = _engine.budget_json(budget)
        attempt, row, live = _engine.get_store().start_keyed(
            "flow",
            self.name,
            self.fingerprint,
            args_json,
            budget_json,
            check_run_id(run_id),
            self.timeout,
            self._module,
        )
        if attempt is None:
            return None, None, (row, live)
        run = _engine.RunState(attempt, self.name, not wait)
        return run, _engine.budget_meter(budget, "flow", self.name), None

    async def _astart_keyed(self, args: tuple, kwargs: dict, budget: Any, wait: bool, run_id: Any):
        """`_start_keyed` for an async driver."""
        args_json = _codec.dumps(_args_payload(args, kwargs))
        budget_json = _engine.budget_json(budget)
        attempt, row, live = await _drive.astart_keyed(
            "flow",
            self.name,
            self.fingerprint,
            args_json,
            budget_json,
            check_run_id(run_id),
            self.timeout,
            self._module,
        )
        if attempt is None:
            return None, None, (row, live)
        run = _engine.RunState(attempt, self.name, not wait)
        return run, _engine.budget_meter(budget, "flow", self.name), None

    async def _astart(self, args: tuple, kwargs: dict, budget: Any, wait: bool = True):
        args_json = _codec.dumps(_args_payload(args, kwargs))
        budget_json = _engine.budget_json(budget)
        attempt = await _drive.astart_run(
            "flow",
            self.name,
            self.fingerprint,
            args_json,
            budget_json,
            module=self._module,
            timeout=self.timeout,
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
        if self.on_divergence != "raise":
            run.attempt.set_divergence(self.on_divergence)
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
            from ._waits import aretrying_body, retrying_body

            policy, plain = self.retry, call
            if self._is_async:
                call = lambda: aretrying_body(policy, plain)
            else:
                call = lambda: retrying_body(policy, plain)
        if self._is_async:
            from . import _runtime

            outcome = _runtime.run_sync(lambda: _drive.drive_async(run, call, root))
        else:
            outcome = _drive.drive_sync(run, call, root)
        return self._after(run, _drive.make_run_result(run, outcome))

    def _after(self, run, result):
        """A blocking driver carries on after a retry backoff."""
        if self.retry is not None and not run.park:
            from ._waits import is_retry_park

            if is_retry_park(result):
                return resume(result.id)
        return result

    async def _adrive(self, run, args: tuple, kwargs: dict, meter=None):
        _core.set_module(run.attempt, self.fn.__module__)
        if self.on_divergence != "raise":
            run.attempt.set_divergence(self.on_divergence)
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
            from ._waits import aretrying_body, is_retry_park

            policy, plain = self.retry, body
            body = lambda: aretrying_body(policy, plain)
        outcome = await _drive.drive_async(run, body, root)
        result = _drive.make_run_result(run, outcome)
        if self.retry is not None and not run.park and is_retry_park(result):
            return await aresume(result.id)
        return result

    def run(
        self,
        *args: Any,
        budget: Any = None,
        wait: bool = True,
        run_id: str | None = None,
        **kwargs: Any,
    ) -> Run[R]:
        """Starts a new top-level durable run, even inside another flow.
        `wait=False`: durable waits park the run instead of blocking.
        `run_id`: the run's id; when a run of this flow with these arguments
        already has it, that run is returned (or waited for, or continued)
        instead of starting another."""
        _engine.check_sync_facade()
        if run_id is None:
            run, meter = self._start(args, kwargs, budget, wait)
            return self._drive(run, args, kwargs, meter)
        run, meter, existing = self._start_keyed(args, kwargs, budget, wait, run_id)
        if run is None:
            return existing_run(existing[0], existing[1], wait)
        return self._drive(run, args, kwargs, meter)

    def start(
        self,
        *args: Any,
        budget: Any = None,
        wait: bool = True,
        queue: Any = None,
        priority: int = 0,
        dedup_id: str | None = None,
        run_id: str | None = None,
        **kwargs: Any,
    ):
        """Creates the run durably, executes it on a background thread
        of this process and returns its `RunHandle` at once. With `queue`
        the run is created `queued` and a worker executes it.
        `run_id`: as for `run`; the handle of the run that already has it."""
        _engine.check_sync_facade()
        if queue is not None:
            return start_queued(self, args, kwargs, budget, queue, priority, dedup_id, run_id)
        if priority != 0 or dedup_id is not None:
            raise ConfigError(
                f"priority and dedup_id apply to queued runs -- pass queue= to {self.name}.start()"
            )
        return start_in_background(self, args, kwargs, budget, wait, run_id)

    def stream(
        self, *args: Any, budget: Any = None, run_id: str | None = None, **kwargs: Any
    ) -> RunStream[R]:
        """Runs `.run()` on a background thread with a fresh event bus."""
        from ._streams import RunStream

        if run_id is not None:
            check_run_id(run_id)
        return RunStream.start(
            lambda: self.run(*args, budget=budget, run_id=run_id, **kwargs), cancellable=True
        )

    async def arun(
        self,
        *args: Any,
        budget: Any = None,
        wait: bool = True,
        run_id: str | None = None,
        **kwargs: Any,
    ) -> Run[R]:
        """Async twin of `run`; nested (one step) when a flow is active."""
        frame = FRAME.get()
        if frame is not None and frame.run is not None:
            if budget is not None:
                raise ConfigError(self._nested_budget_message())
            if run_id is not None:
                raise ConfigError(
                    f"@flow {self.name!r}: run_id= is not supported on a nested flow call (it "
                    f"is a step of the enclosing run); call {self.name}.run(run_id=...) to "
                    "start a run of its own"
                )
            return await self._anested(frame, args, kwargs)
        if run_id is None:
            run, meter = await self._astart(args, kwargs, budget, wait)
            return await self._adrive(run, args, kwargs, meter)
        run, meter, existing = await self._astart_keyed(args, kwargs, budget, wait, run_id)
        if run is None:
            return await aexisting_run(existing[0], existing[1], wait)
        return await self._adrive(run, args, kwargs, meter)

    async def _anested(self, frame: Frame, args: tuple, kwargs: dict):
        spans: list = []

        async def execute(inner: Frame, args: tuple, kwargs: dict):
            spans.append(inner.span)
            if self.timeout is not None:
                inner = self._deadline_frame(inner)
                token = FRAME.set(inner)
                try:
                    return await run_body(inner, args, kwargs)
                finally:
                    FRAME.reset(token)
            return await run_body(inner, args, kwargs)

        async def run_body(inner: Frame, args: tuple, kwargs: dict):
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
            usage = _drive.subtree_usage(frame.trace, spans[0])
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
    on_divergence: str = "raise",
    timeout: float | timedelta | None = None,
) -> _FlowDecorator: ...
def flow(
    fn=None,
    /,
    *,
    name=None,
    replace=False,
    journal_failures=False,
    retry=None,
    durability=None,
    on_divergence="raise",
    timeout=None,
):
    """Declares a durable flow: a function whose steps are journaled.

    Usable bare (`@flow`) or with keyword options (`@flow(name=...)`). Calling
    the flow runs it and returns its output; `.run()` returns the `Run`.
    Inside another flow, a call is one nested, journaled step.

    Args:
        name: the registered name (default: the function's name); unique per
            process, as `resume()` finds a run's code by it.
        replace: rebind a name that is already registered.
        journal_failures: a step that fails after its retries raises a
            journaled `TaskFailed` inside the body (replayed as the same
            failure) instead of failing the run.
        retry: a `RetryPolicy`: the engine re-attempts a failed run after a
            durable backoff.
        durability: `"step"` (each step's record is committed before its
            value is handed back) or `"batch"` (records are group-committed
            in the background); default: `COMPOSE_DURABILITY`, else `"step"`.
        on_divergence: `"raise"` (a resumed body whose calls no longer match
            its journal raises `NondeterminismError`) or `"warn"` (it warns
            with `NondeterminismWarning` and carries on).
        timeout: seconds or a `timedelta`: each run's deadline is its
            creation time plus this, past which it fails with
            `FlowTimeoutError`; a nested call runs under the tighter of its
            own deadline and the enclosing run's.
    """
    seconds = _timeout_seconds(timeout)
    if durability is not None:
        _engine.check_durability(durability, "@flow(durability=...)")
    if on_divergence not in ("raise", "warn"):
        raise ConfigError(
            f'@flow(on_divergence=...) must be "raise" or "warn", got {on_divergence!r}'
        )

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
            on_divergence=on_divergence,
            timeout=seconds,
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


def _timeout_seconds(timeout: Any) -> float | None:
    """`@flow(timeout=...)` in seconds: a positive, finite number or timedelta."""
    if timeout is None:
        return None
    seconds = None
    if hasattr(timeout, "total_seconds") and callable(timeout.total_seconds):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    if seconds is None or not 0 < seconds < float("inf"):
        raise ConfigError(
            "@flow(timeout=...) must be a positive number of seconds or a timedelta, got "
            f"{timeout!r}"
        )
    return seconds


def reset_registries() -> None:
    """Forgets every registered task, flow, graph and queue name."""
    _TASKS.clear()
    _FLOWS.clear()
    for registry in REGISTRIES:
        registry.clear()


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
    """The current UTC time, journaled once per call inside a flow."""
    _engine.check_sync_facade()
    return _engine.journaled_value("now", _utc_now)


def random() -> float:
    """A float in [0, 1), journaled once per call inside a flow."""
    _engine.check_sync_facade()
    return _engine.journaled_value("random", _draw)


async def anow():
    """Async twin of `now()`, sharing its keys."""
    return _engine.journaled_value("now", _utc_now)


async def arandom() -> float:
    """Async twin of `random()`, sharing its keys."""
    return _engine.journaled_value("random", _draw)
