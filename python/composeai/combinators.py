"""Composition: `pipe`/`>>`, `aggregate`, `map`/`amap`.

Composites run as spans of the current run when something is active (a flow
or any span: adoption), and as independent `pipe`/`aggregate` runs otherwise.
Their stages journal as usual; the composites themselves have no journal
entry.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from contextvars import copy_context
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast, overload

from . import _codec, _core, _drive, _engine
from ._engine import FRAME, Frame
from ._stages import build_validator, stage_name, stage_types
from .errors import CompositionTypeError, ConfigError
from .flow import Task

__all__ = ["Aggregate", "MapResult", "Pipeline", "Stage", "aggregate", "amap", "map", "pipe"]

In_contra = TypeVar("In_contra", contravariant=True)
Out_co = TypeVar("Out_co", covariant=True)
if TYPE_CHECKING:
    from collections.abc import Awaitable
    from typing import Literal

    import typing_extensions

    from ._streams import AsyncRunStream, RunStream
    from .runs import Budget, Run

    # Bare `MapResult`, `Pipeline`, `Aggregate` mean `[Any]` / `[Any, Any]` (COMP-46).
    T = typing_extensions.TypeVar("T", default=Any)
    _PIn = typing_extensions.TypeVar("_PIn", default=Any)
    _POut = typing_extensions.TypeVar("_POut", default=Any)
    _AggIn = typing_extensions.TypeVar("_AggIn", default=Any)
    # Stage types of `pipe()`'s overloads, `>>` and `map()`.
    _A = TypeVar("_A")
    _B = TypeVar("_B")
    _C = TypeVar("_C")
    _D = TypeVar("_D")
    _E = TypeVar("_E")
    _F = TypeVar("_F")
    _G = TypeVar("_G")
    _H = TypeVar("_H")
    _I = TypeVar("_I")
    _J = TypeVar("_J")
    _W = TypeVar("_W")
    _Z = TypeVar("_Z")
else:
    T = TypeVar("T")
    _PIn = TypeVar("_PIn")
    _POut = TypeVar("_POut")


@dataclass
class MapResult(Generic[T]):
    """One item's outcome of `map(..., on_error="collect")`."""

    ok: bool
    value: T | None = None
    error: str | None = None
    error_type: str | None = None


_codec.register_serializable(MapResult)


def _check_map_args(fn_label: str, on_error: str, max_workers: int | None) -> None:
    if on_error not in ("raise", "collect"):
        raise ConfigError(f"{fn_label}(): on_error must be 'raise' or 'collect', got {on_error!r}")
    if max_workers is not None and max_workers < 1:
        raise ValueError("max_workers must be greater than 0")


class _Fanout:
    """Runs items on the calling thread plus workers added on demand.

    A watcher adds workers (doubling, up to `limit`) whenever items are
    waiting and none finished during a tick: items that block or wait get
    threads of their own within milliseconds, while quick items run without
    thread hand-offs. No bounded shared pool sits under the items.
    """

    # Long enough that a commit or a checkpoint does not look like a blocked
    # item, short enough that blocked items fan out within milliseconds.
    TICK = 0.005

    def __init__(self, count: int, limit: int, run_item: Callable[[int], None]):
        self.pending = deque(range(count))
        self.limit = limit
        self.run_item = run_item
        self.lock = threading.Lock()
        self.workers = 1  # the calling thread
        self.finished = 0
        self.remaining = count
        self.done = threading.Event()
        self.ctx = copy_context()

    def _take(self) -> int | None:
        with self.lock:
            return self.pending.popleft() if self.pending else None

    def _work(self) -> None:
        while (index := self._take()) is not None:
            try:
                self.run_item(index)
            finally:
                with self.lock:
                    self.finished += 1
                    self.remaining -= 1
                    if self.remaining == 0:
                        self.done.set()

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        ctx = self.ctx.copy()
        threading.Thread(target=ctx.run, args=(target,), name=name, daemon=True).start()

    def _watch(self) -> None:
        seen = -1
        while not self.done.wait(self.TICK):
            with self.lock:
                if not self.pending:
                    return
                stalled = self.finished == seen
                seen = self.finished
                grow = 0
                if stalled:
                    grow = min(self.workers, self.limit - self.workers, len(self.pending))
                    self.workers += grow
            for _ in range(grow):
                self._spawn(self._work, "composeai-map")

    def run(self) -> None:
        if self.limit > 1 and len(self.pending) > 1:
            self._spawn(self._watch, "composeai-map-watch")
        try:
            self._work()
        except BaseException:
            with self.lock:
                self.pending.clear()
            raise
        self.done.wait()


@overload
def map(
    fn: Callable[[_A], Awaitable[_B]],
    items: Sequence[_A],
    *,
    max_workers: int | None = None,
    timeout_per_item: float | None = None,
    on_error: Literal["raise"] = "raise",
) -> list[_B]: ...
@overload
def map(
    fn: Callable[[_A], Awaitable[_B]],
    items: Sequence[_A],
    *,
    max_workers: int | None = None,
    timeout_per_item: float | None = None,
    on_error: Literal["collect"],
) -> list[MapResult[_B]]: ...
@overload
def map(
    fn: Callable[[_A], _B],
    items: Sequence[_A],
    *,
    max_workers: int | None = None,
    timeout_per_item: float | None = None,
    on_error: Literal["raise"] = "raise",
) -> list[_B]: ...
@overload
def map(
    fn: Callable[[_A], _B],
    items: Sequence[_A],
    *,
    max_workers: int | None = None,
    timeout_per_item: float | None = None,
    on_error: Literal["collect"],
) -> list[MapResult[_B]]: ...
def map(
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    *,
    max_workers: int | None = None,
    timeout_per_item: float | None = None,
    on_error: str = "raise",
) -> list:
    """Applies a stage to every item concurrently; returns the results in input order.

    In a flow, the steps of item `i` of the k-th map are journaled under the
    scope `map#k[i]`, so a resumed flow runs only the items not finished.

    Args:
        fn: a `@task`, `@agent`, pipeline, aggregate or one-argument function.
        items: the inputs.
        max_workers: how many items run at once (default: all).
        timeout_per_item: seconds per item (`TaskTimeoutError`).
        on_error: `"raise"` (the first failure by index is raised) or
            `"collect"` (a `MapResult` per item instead of its value).
    """
    _check_map_args("map", on_error, max_workers)
    validator = build_validator(fn)
    _engine.check_sync_facade()
    items = list(items)
    if not items:
        return []
    frame = FRAME.get()
    run = frame.run if frame is not None else None
    name = stage_name(fn)
    scope = frame.scope if frame is not None else ""
    fence = frame.fence if frame is not None else None
    count = len(items)
    map_key = _open_map(run, scope, count, fence)
    span, trace = _engine.open_child(frame, "aggregate", f"map({name})")
    outcomes: list[Any] = [None] * count
    failures: list[BaseException | None] = [None] * count
    item_fences = []

    def run_item(index: int) -> None:
        item_scope = f"{map_key}[{index}]" if map_key is not None else scope
        # `run` is the frame's: with one there is a frame.
        item_fence = _engine.child_fence(cast("Frame", frame)) if run is not None else None
        if item_fence is not None:
            item_fences.append(item_fence)
        item_frame = Frame(run, item_scope, span, item_fence, trace)
        token = FRAME.set(item_frame)
        try:
            outcomes[index] = _run_item(
                fn, name, index, items[index], item_frame, timeout_per_item, validator
            )
        except _engine._Revoked:
            failures[index] = None
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 -- settled per item, raised in index order
            failures[index] = exc
        finally:
            FRAME.reset(token)

    limit = count if max_workers is None else min(max_workers, count)
    try:
        _Fanout(count, limit, run_item).run()
        if run is not None:
            # Item steps committed in the background are durable before any
            # of their values reaches the flow body.
            run.attempt.sync()
    except BaseException as exc:
        for item_fence in item_fences:
            item_fence.revoke()
        _engine.fail_span(run, span, exc)
        raise
    return _collect(run, span, on_error, outcomes, failures)


def _open_map(run: Any, scope: str, count: int, fence: Any) -> str | None:
    """The key of a map in a run: a call of its scope that journals no row
    of its own, checked against the journal with its number of items, so a
    body that now maps over fewer or more items stops before any runs."""
    if run is None:
        return None
    return run.attempt.open_scope(scope, "map", count, fence)  # type: ignore[no-any-return]


def _run_item(
    fn: Callable[[Any], Any],
    name: str,
    index: int,
    item: Any,
    frame: Frame,
    timeout: float | None,
    validator: Callable[[Any, str], Any] | None,
) -> Any:
    """One item: validated at its boundary, then an agent or composite in
    its own span, anything else inside a `<fn>[<i>]` task span."""
    if validator is not None:
        item = validator(item, f"map item {index}")
    label = f"{name}[{index}]"

    def timed_out(cooperative: bool) -> BaseException:
        assert timeout is not None  # called only once the timeout ran out
        return _engine.task_timeout_error("@task", label, timeout, cooperative)

    if _is_agent(fn) or isinstance(fn, _Composite):
        if timeout is None:
            return _call_stage_sync(fn, item)
        fence = _engine.child_fence(frame) or frame.fence
        return _bounded_sync(
            fn,
            item,
            Frame(frame.run, frame.scope, frame.span, fence, frame.trace),
            timeout,
            timed_out,
        )
    # A task mapped directly journals a value only the map collects.
    defer = isinstance(fn, Task)

    def execute(inner: Frame) -> Any:
        if timeout is None:
            token = FRAME.set(
                Frame(inner.run, inner.scope, inner.span, inner.fence, inner.trace, defer)
            )
            try:
                return _call_plain_sync(fn, item)
            finally:
                FRAME.reset(token)
        fence = _engine.child_fence(inner) or inner.fence
        thread_frame = Frame(inner.run, inner.scope, inner.span, fence, inner.trace, defer)
        if _runs_on_loop(fn):
            import asyncio

            from . import _runtime

            async def bounded() -> Any:
                FRAME.set(thread_frame)
                body = fn.arun(item) if isinstance(fn, Task) else fn(item)
                try:
                    return await asyncio.wait_for(body, timeout)
                except asyncio.TimeoutError:
                    raise timed_out(True) from None

            return _runtime.run_sync(bounded)
        return _engine.run_on_thread(
            lambda: _call_plain_sync(fn, item),
            thread_frame,
            timeout,
            lambda: timed_out(False),
            f"composeai-map-{label}",
        )

    return _engine.unjournaled_call(frame, "task", label, execute, item)


def _collect(run: Any, span: Any, on_error: str, outcomes: list, failures: list) -> list:
    """Settles a map: results in input order, or the first failure by index; pauses and other BaseExceptions are never collected."""
    if on_error == "collect":
        fatal = next((f for f in failures if f is not None and not isinstance(f, Exception)), None)
        if fatal is not None:
            _engine.fail_span(run, span, fatal)
            raise fatal
        results = []
        for value, failure in zip(outcomes, failures):
            if failure is None:
                results.append(MapResult(ok=True, value=value))
            else:
                results.append(
                    MapResult(ok=False, error=str(failure), error_type=type(failure).__name__)
                )
        _engine.close_span(run, span, results)
        return results
    first = next((f for f in failures if f is not None), None)
    if first is not None:
        _engine.fail_span(run, span, first)
        raise first
    _engine.close_span(run, span, outcomes)
    return outcomes


def _runs_on_loop(fn: Any) -> bool:
    """Whether items of `fn` are awaited on the loop (no thread each)."""
    if isinstance(fn, Task):
        return fn._is_async
    return _is_agent(fn) or isinstance(fn, _Composite) or _is_coroutine_function(fn)


@overload
async def amap(
    fn: Callable[[_A], Awaitable[_B]],
    items: Sequence[_A],
    *,
    max_workers: int | None = None,
    timeout_per_item: float | None = None,
    on_error: Literal["raise"] = "raise",
) -> list[_B]: ...
@overload
async def amap(
    fn: Callable[[_A], Awaitable[_B]],
    items: Sequence[_A],
    *,
    max_workers: int | None = None,
    timeout_per_item: float | None = None,
    on_error: Literal["collect"],
) -> list[MapResult[_B]]: ...
@overload
async def amap(
    fn: Callable[[_A], _B],
    items: Sequence[_A],
    *,
    max_workers: int | None = None,
    timeout_per_item: float | None = None,
    on_error: Literal["raise"] = "raise",
) -> list[_B]: ...
@overload
async def amap(
    fn: Callable[[_A], _B],
    items: Sequence[_A],
    *,
    max_workers: int | None = None,
    timeout_per_item: float | None = None,
    on_error: Literal["collect"],
) -> list[MapResult[_B]]: ...
async def amap(
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    *,
    max_workers: int | None = None,
    timeout_per_item: float | None = None,
    on_error: Literal["raise", "collect"] = "raise",
) -> list:
    """Async twin of `map`, on the caller's loop."""
    import asyncio

    _check_map_args("amap", on_error, max_workers)
    validator = build_validator(fn)
    items = list(items)
    if not items:
        return []
    if not _runs_on_loop(fn):
        # Sync bodies each need a thread anyway: run the whole fan-out as the
        # sync `map` on one thread off the loop (same keys, spans, contract).
        return await _map_off_loop(fn, items, max_workers, timeout_per_item, on_error)
    frame = FRAME.get()
    run = frame.run if frame is not None else None
    name = stage_name(fn)
    scope = frame.scope if frame is not None else ""
    fence = frame.fence if frame is not None else None
    count = len(items)
    map_key = _open_map(run, scope, count, fence)
    span, trace = _engine.open_child(frame, "aggregate", f"map({name})")
    gate = asyncio.Semaphore(count if max_workers is None else min(max_workers, count))

    async def one(index: int) -> Any:
        async with gate:
            item_scope = f"{map_key}[{index}]" if map_key is not None else scope
            # `run` is the frame's: with one there is a frame.
            item_fence = _engine.child_fence(cast("Frame", frame)) if run is not None else None
            FRAME.set(Frame(run, item_scope, span, item_fence, trace))
            return await _arun_item(fn, name, index, items[index], timeout_per_item, validator)

    results = await asyncio.gather(*(one(i) for i in range(count)), return_exceptions=True)
    if run is not None:
        run.attempt.sync()
    outcomes: list[Any] = [None] * count
    failures: list[BaseException | None] = [None] * count
    for i, result in enumerate(results):
        if isinstance(result, _engine._Revoked):
            continue
        if isinstance(result, BaseException):
            failures[i] = result
        else:
            outcomes[i] = result
    return _collect(run, span, on_error, outcomes, failures)


async def _map_off_loop(
    fn: Any,
    items: list,
    max_workers: int | None,
    timeout: float | None,
    on_error: Literal["raise", "collect"],
) -> list:
    frame = FRAME.get()
    if frame is not None:
        frame = Frame(frame.run, frame.scope, frame.span, _engine.child_fence(frame), frame.trace)
    return await _engine.run_on_thread_async(
        lambda: map(
            fn, items, max_workers=max_workers, timeout_per_item=timeout, on_error=on_error
        ),
        frame,
        None,
        lambda: RuntimeError("unreachable"),
        "composeai-amap",
    )


async def _arun_item(
    fn: Callable[[Any], Any],
    name: str,
    index: int,
    item: Any,
    timeout: float | None,
    validator: Callable[[Any, str], Any] | None,
) -> Any:
    import asyncio

    if validator is not None:
        item = validator(item, f"map item {index}")
    label = f"{name}[{index}]"

    def timed_out(cooperative: bool) -> BaseException:
        assert timeout is not None  # called only once the timeout ran out
        return _engine.task_timeout_error("@task", label, timeout, cooperative)

    if _is_agent(fn) or isinstance(fn, _Composite):
        if timeout is None:
            return await _call_stage_async(fn, item)
        try:
            return await asyncio.wait_for(_call_stage_async(fn, item), timeout)
        except asyncio.TimeoutError:
            raise timed_out(True) from None
    defer = isinstance(fn, Task)

    async def execute(inner: Frame) -> Any:
        FRAME.set(Frame(inner.run, inner.scope, inner.span, inner.fence, inner.trace, defer))
        if isinstance(fn, Task):
            body = fn.arun(item)
        elif _is_coroutine_function(fn):
            body = fn(item)
        else:
            fence = _engine.child_fence(inner) or inner.fence
            thread_frame = Frame(inner.run, inner.scope, inner.span, fence, inner.trace)
            return await _engine.run_on_thread_async(
                lambda: _call_plain_sync(fn, item),
                thread_frame,
                timeout,
                lambda: timed_out(False),
                f"composeai-map-{label}",
            )
        if timeout is None:
            return await body
        try:
            return await asyncio.wait_for(body, timeout)
        except asyncio.TimeoutError:
            raise timed_out(True) from None

    return await _engine.aunjournaled_call(FRAME.get(), "task", label, execute, item)


# ---------------------------------------------------------------------------
# Stages


class Stage(Protocol[In_contra, Out_co]):
    """Anything callable with one positional argument."""

    def __call__(self, x: In_contra, /) -> Out_co: ...


def _is_agent(stage: Any) -> bool:
    agentfn = sys.modules.get("composeai.agentfn")
    return agentfn is not None and isinstance(stage, agentfn.AgentFunction)


def _call_stage_sync(stage: Any, x: Any) -> Any:
    """An agent is called (journaled in a flow), a composite nests,
    anything else runs in a `task` span named after it."""
    if _is_agent(stage):
        return stage(x)
    if isinstance(stage, _Composite):
        return stage._nested_sync(x)
    name = stage_name(stage)
    return _engine.unjournaled_call(
        FRAME.get(), "task", name, lambda _inner: _call_plain_sync(stage, x), x
    )


def _call_plain_sync(stage: Any, x: Any) -> Any:
    if _is_coroutine_function(stage):
        from . import _runtime

        return _runtime.run_sync(lambda: stage(x))
    result = stage(x)
    if inspect_iscoroutine(result):
        from . import _runtime

        return _runtime.run_sync(lambda: result)
    return result


async def _call_stage_async(stage: Any, x: Any) -> Any:
    if _is_agent(stage):
        return (await stage.arun(x)).output
    if isinstance(stage, _Composite):
        return await stage._nested_async(x)
    if isinstance(stage, Task):
        return await _engine.aunjournaled_call(
            FRAME.get(), "task", stage_name(stage), lambda _inner: stage.arun(x), x
        )

    async def execute(inner: Frame) -> Any:
        if _is_coroutine_function(stage):
            return await stage(x)
        frame = Frame(inner.run, inner.scope, inner.span, _engine.child_fence(inner), inner.trace)
        result = await _engine.run_on_thread_async(
            lambda: stage(x), frame, None, lambda: RuntimeError("unreachable"), "composeai-stage"
        )
        if inspect_iscoroutine(result):
            return await result
        return result

    return await _engine.aunjournaled_call(FRAME.get(), "task", stage_name(stage), execute, x)


def _bounded_sync(
    stage: Any, x: Any, frame: Frame, timeout: float, error: Callable[[bool], BaseException]
) -> Any:
    """A stage under a timeout from sync code: an async body is cancelled
    cooperatively on the background loop, a sync one is abandoned on its
    thread."""
    if _runs_on_loop(stage):
        import asyncio

        from . import _runtime

        async def bounded() -> Any:
            token = FRAME.set(frame)
            try:
                return await asyncio.wait_for(_call_stage_async(stage, x), timeout)
            except asyncio.TimeoutError:
                raise error(True) from None
            finally:
                FRAME.reset(token)

        return _runtime.run_sync(bounded)
    return _engine.run_on_thread(
        lambda: _call_stage_sync(stage, x), frame, timeout, lambda: error(False), "composeai-stage"
    )


async def _bounded_async(
    stage: Any, x: Any, frame: Frame, timeout: float, error: Callable[[bool], BaseException]
) -> Any:
    """The async twin of `_bounded_sync`."""
    if _runs_on_loop(stage):
        import asyncio

        token = FRAME.set(frame)
        try:
            return await asyncio.wait_for(_call_stage_async(stage, x), timeout)
        except asyncio.TimeoutError:
            raise error(True) from None
        finally:
            FRAME.reset(token)
    return await _engine.run_on_thread_async(
        lambda: _call_stage_sync(stage, x), frame, timeout, lambda: error(False), "composeai-stage"
    )


def _is_coroutine_function(fn: Any) -> bool:
    import inspect

    if inspect.iscoroutinefunction(fn):
        return True
    # An object whose __call__ is a coroutine function.
    call = type(fn).__dict__.get("__call__")
    return call is not None and inspect.iscoroutinefunction(call)


def inspect_iscoroutine(value: Any) -> bool:
    import inspect

    return inspect.iscoroutine(value)


# ---------------------------------------------------------------------------
# Pipelines and aggregates


class _Composite:
    """What `Pipeline` and `Aggregate` share: running as a nested span or as
    an independent run, sync and async, and `>>`."""

    kind: str = ""
    name: str = ""
    input_type: Any = Any
    output_type: Any = Any

    # -- subclasses --------------------------------------------------------

    def _execute_sync(self, x: Any) -> Any:
        raise NotImplementedError

    async def _execute_async(self, x: Any) -> Any:
        raise NotImplementedError

    # -- composition -------------------------------------------------------

    def __rshift__(self, other: Any) -> Pipeline:
        return chain(self, other)

    def __rrshift__(self, other: Any) -> Pipeline:
        return chain(other, self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    # -- calling (COMP-10 … COMP-13) ------------------------------------------

    def __call__(self, x: Any) -> Any:
        _engine.check_sync_facade()
        frame = FRAME.get()
        if frame is not None and frame.span is not None:
            return self._nested_sync(x)
        return self.run(x).output

    def _nested_budget_error(self) -> ConfigError:
        return ConfigError(
            f"{self.kind} {self.name!r}: budget= is not supported on a nested arun()/astream() "
            "call (the enclosing run's budget governs); set it on the outer run"
        )

    def _open_nested(self, x: Any) -> Frame:
        frame = FRAME.get()
        assert frame is not None  # a composite nests only under a frame
        span = _engine.open_span(frame.span, frame.trace, self.kind, self.name)
        if _engine._capture():
            span.input = x
        return Frame(frame.run, frame.scope, span, frame.fence, frame.trace)

    def _nested_sync(self, x: Any) -> Any:
        inner = self._open_nested(x)
        token = FRAME.set(inner)
        try:
            output = self._execute_sync(x)
        except BaseException as exc:
            _engine.fail_span(inner.run, inner.span, exc)
            raise
        finally:
            FRAME.reset(token)
        _engine.close_span(inner.run, inner.span, output)
        return output

    async def _nested_async(self, x: Any, spans: list | None = None) -> Any:
        inner = self._open_nested(x)
        if spans is not None:
            spans.append(inner.span)
        token = FRAME.set(inner)
        try:
            output = await self._execute_async(x)
        except BaseException as exc:
            _engine.fail_span(inner.run, inner.span, exc)
            raise
        finally:
            FRAME.reset(token)
        _engine.close_span(inner.run, inner.span, output)
        return output

    def _start(self, budget: Any):
        attempt = _engine.get_store().start_run(self.kind, self.name, None, None, None)
        run = _engine.RunState(attempt, self.name)
        root = _engine.open_span(None, run.trace, self.kind, self.name)
        meter = _engine.budget_meter(budget, self.kind, self.name)
        return run, root, meter

    def _paused_error(self) -> ConfigError:
        noun = self.kind
        return ConfigError(
            f"{noun} {self.name!r} paused on an approval/ask_human interrupt, but a bare "
            f"{noun}()/aggregate() isn't resumable -- durable pauses need a @flow as the root. "
            "Wrap this call in a @flow function (so it has a name resume() can look up and a "
            "fingerprint it can check) and call that instead, e.g.:\n\n"
            "    @flow\n"
            "    def run_it(x):\n"
            f"        return {self.name}(x)\n"
        )

    def _settle(self, run, root, output: Any, exc: BaseException | None):
        if isinstance(exc, _engine._Pause):
            _engine.mark_failed(root, exc)
            run.attempt.discard()
            raise self._paused_error() from None
        if exc is not None:
            outcome = _drive.settle_interrupted(run, root, exc, cancelled_status="cancelled")
        else:
            outcome = _drive.settle_completed(run, root, output, lenient=True)
        return _drive.make_run_result(run, outcome)

    def run(self, x: Any, budget: Any = None):
        """An independent top-level run, even inside a flow."""
        _engine.check_sync_facade()
        run, root, meter = self._start(budget)
        if _engine._capture():
            root.input = x
        token = FRAME.set(Frame(run, "", root, None, run.trace))
        budget_token = _engine.BUDGETS.set((meter,)) if meter is not None else None
        try:
            output = self._execute_sync(x)
        except BaseException as exc:  # noqa: BLE001 -- settled, then re-raised
            return self._settle(run, root, None, exc)
        finally:
            if budget_token is not None:
                _engine.BUDGETS.reset(budget_token)
            FRAME.reset(token)
        return self._settle(run, root, output, None)

    async def arun(self, x: Any, budget: Any = None):
        """Async twin: adopts an active run, else an independent run."""
        from .runs import Run

        frame = FRAME.get()
        if frame is not None and frame.span is not None:
            if budget is not None:
                raise self._nested_budget_error()
            spans: list = []
            output = await self._nested_async(x, spans)
            return Run(
                id=_core.ulid(),
                status="completed",
                output=output,
                usage=_drive.subtree_usage(frame.trace, spans[0]),
                trace=frame.trace,
                messages=[],
            )
        run, root, meter = self._start(budget)
        if _engine._capture():
            root.input = x
        token = FRAME.set(Frame(run, "", root, None, run.trace))
        budget_token = _engine.BUDGETS.set((meter,)) if meter is not None else None
        try:
            output = await self._execute_async(x)
        except BaseException as exc:  # noqa: BLE001 -- settled, then re-raised
            return self._settle(run, root, None, exc)
        finally:
            if budget_token is not None:
                _engine.BUDGETS.reset(budget_token)
            FRAME.reset(token)
        return self._settle(run, root, output, None)

    def stream(self, x: Any, budget: Any = None):
        from ._streams import RunStream

        return RunStream.start(lambda: self.run(x, budget), cancellable=True)

    def astream(self, x: Any, budget: Any = None):
        frame = FRAME.get()
        if budget is not None and frame is not None and frame.span is not None:
            raise self._nested_budget_error()
        from ._streams import AsyncRunStream

        return AsyncRunStream.start(lambda: self.arun(x, budget))


class Pipeline(_Composite, Generic[_PIn, _POut]):
    """Stages run one after another."""

    kind = "pipe"

    if TYPE_CHECKING:

        def __call__(self, x: _PIn) -> _POut: ...
        def run(self, x: _PIn, budget: Budget | None = None) -> Run[_POut]: ...
        async def arun(self, x: _PIn, budget: Budget | None = None) -> Run[_POut]: ...
        def stream(self, x: _PIn, budget: Budget | None = None) -> RunStream[_POut]: ...
        def astream(self, x: _PIn, budget: Budget | None = None) -> AsyncRunStream[_POut]: ...
        def __rshift__(self, other: Stage[_POut, _Z]) -> Pipeline[_PIn, _Z]: ...
        def __rrshift__(self, other: Stage[_W, _PIn]) -> Pipeline[_W, _POut]: ...

    def __init__(self, stages: Sequence[Any]):
        self.stages = tuple(stages)
        self.name = "pipe(" + " → ".join(stage_name(s) for s in self.stages) + ")"
        self.input_type = stage_types(self.stages[0])[0]
        self.output_type = stage_types(self.stages[-1])[1]
        self._validators = [build_validator(s) for s in self.stages]

    def _boundaries(self):
        for i, (stage, validator) in enumerate(zip(self.stages, self._validators)):
            yield stage, validator, "pipeline input" if i == 0 else "stage handoff"

    def _execute_sync(self, x: Any) -> Any:
        for stage, validator, boundary in self._boundaries():
            if validator is not None:
                x = validator(x, boundary)
            x = _call_stage_sync(stage, x)
        return x

    async def _execute_async(self, x: Any) -> Any:
        for stage, validator, boundary in self._boundaries():
            if validator is not None:
                x = validator(x, boundary)
            x = await _call_stage_async(stage, x)
        return x


class Aggregate(_Composite, Generic[_PIn]):
    """Branches run concurrently on the same input."""

    kind = "aggregate"
    output_type = dict

    if TYPE_CHECKING:

        def __call__(self, x: _PIn) -> dict[str, Any]: ...
        def run(self, x: _PIn, budget: Budget | None = None) -> Run[dict[str, Any]]: ...
        async def arun(self, x: _PIn, budget: Budget | None = None) -> Run[dict[str, Any]]: ...
        def stream(self, x: _PIn, budget: Budget | None = None) -> RunStream[dict[str, Any]]: ...
        def astream(
            self, x: _PIn, budget: Budget | None = None
        ) -> AsyncRunStream[dict[str, Any]]: ...
        def __rshift__(self, other: Stage[dict[str, Any], _Z]) -> Pipeline[_PIn, _Z]: ...
        def __rrshift__(self, other: Stage[_W, _PIn]) -> Pipeline[_W, dict[str, Any]]: ...

    def __init__(self, branches: dict[str, Any], timeout_per_branch: float | None = None):
        self.branches = dict(branches)
        self.timeout_per_branch = timeout_per_branch
        self.name = "aggregate(" + ", ".join(self.branches) + ")"
        from ._stages import aggregate_input_type

        self.input_type = aggregate_input_type([stage_types(b)[0] for b in self.branches.values()])
        self._validators = {k: build_validator(b) for k, b in self.branches.items()}
        self._branches_digest = _core.step_digest("\0".join(sorted(self.branches)))

    def _branch_frames(self) -> tuple[Frame, list[str]]:
        frame = FRAME.get()
        assert frame is not None  # branches run under the aggregate's frame
        keys = list(self.branches)
        if frame.run is None:
            return frame, [frame.scope] * len(keys)
        # A call of its scope, checked with its branches' names: a body that
        # now aggregates other branches stops before any runs.
        base = frame.run.attempt.open_scope(
            frame.scope, "aggregate", self._branches_digest, frame.fence
        )
        return frame, [f"{base}/{k}" for k in keys]

    def _timeout_error(self, key: str, cooperative: bool):
        assert self.timeout_per_branch is not None  # made only once a timeout ran out
        return _engine.task_timeout_error(
            "aggregate branch", key, self.timeout_per_branch, cooperative
        )

    def _run_branch_sync(self, frame: Frame, scope: str, key: str, x: Any) -> Any:
        validator = self._validators[key]
        if validator is not None:
            x = validator(x, f"aggregate branch {key!r}")
        branch = self.branches[key]
        fence = _engine.child_fence(frame) if frame.run is not None else frame.fence
        branch_frame = Frame(frame.run, scope, frame.span, fence, frame.trace)
        if self.timeout_per_branch is None:
            token = FRAME.set(branch_frame)
            try:
                return _call_stage_sync(branch, x)
            finally:
                FRAME.reset(token)
        return _bounded_sync(
            branch,
            x,
            branch_frame,
            self.timeout_per_branch,
            lambda cooperative: self._timeout_error(key, cooperative),
        )

    def _execute_sync(self, x: Any) -> Any:
        frame, scopes = self._branch_frames()
        keys = list(self.branches)
        results: list[Any] = [None] * len(keys)
        failures: list[BaseException | None] = [None] * len(keys)

        def work(i: int) -> None:
            try:
                results[i] = self._run_branch_sync(frame, scopes[i], keys[i], x)
            except _engine._Revoked:
                pass
            except BaseException as exc:  # noqa: BLE001 -- raised in declaration order
                failures[i] = exc

        threads = []
        for i in range(1, len(keys)):
            ctx = copy_context()
            t = threading.Thread(
                target=ctx.run, args=(work, i), name="composeai-branch", daemon=True
            )
            t.start()
            threads.append(t)
        work(0)
        for t in threads:
            t.join()
        first = next((f for f in failures if f is not None), None)
        if first is not None:
            raise first
        return dict(zip(keys, results))

    async def _run_branch_async(self, frame: Frame, scope: str, key: str, x: Any) -> Any:
        validator = self._validators[key]
        if validator is not None:
            x = validator(x, f"aggregate branch {key!r}")
        branch = self.branches[key]
        fence = _engine.child_fence(frame) if frame.run is not None else frame.fence
        branch_frame = Frame(frame.run, scope, frame.span, fence, frame.trace)
        if self.timeout_per_branch is not None:
            return await _bounded_async(
                branch,
                x,
                branch_frame,
                self.timeout_per_branch,
                lambda cooperative: self._timeout_error(key, cooperative),
            )
        token = FRAME.set(branch_frame)
        try:
            return await _call_stage_async(branch, x)
        finally:
            FRAME.reset(token)

    async def _execute_async(self, x: Any) -> Any:
        import asyncio

        frame, scopes = self._branch_frames()
        keys = list(self.branches)
        outcomes = await asyncio.gather(
            *(self._run_branch_async(frame, scopes[i], k, x) for i, k in enumerate(keys)),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return dict(zip(keys, outcomes))


def _flatten(stages: Sequence[Any]) -> list[Any]:
    flat: list[Any] = []
    for stage in stages:
        if isinstance(stage, Pipeline):
            flat.extend(stage.stages)
        else:
            flat.append(stage)
    return flat


# Two through nine stages; longer chains use `>>` (COMP-42: no fallback overload).
@overload
def pipe(s1: Stage[_A, _B], s2: Stage[_B, _C], /) -> Pipeline[_A, _C]: ...
@overload
def pipe(s1: Stage[_A, _B], s2: Stage[_B, _C], s3: Stage[_C, _D], /) -> Pipeline[_A, _D]: ...
@overload
def pipe(
    s1: Stage[_A, _B],
    s2: Stage[_B, _C],
    s3: Stage[_C, _D],
    s4: Stage[_D, _E],
    /,
) -> Pipeline[_A, _E]: ...
@overload
def pipe(
    s1: Stage[_A, _B],
    s2: Stage[_B, _C],
    s3: Stage[_C, _D],
    s4: Stage[_D, _E],
    s5: Stage[_E, _F],
    /,
) -> Pipeline[_A, _F]: ...
@overload
def pipe(
    s1: Stage[_A, _B],
    s2: Stage[_B, _C],
    s3: Stage[_C, _D],
    s4: Stage[_D, _E],
    s5: Stage[_E, _F],
    s6: Stage[_F, _G],
    /,
) -> Pipeline[_A, _G]: ...
@overload
def pipe(
    s1: Stage[_A, _B],
    s2: Stage[_B, _C],
    s3: Stage[_C, _D],
    s4: Stage[_D, _E],
    s5: Stage[_E, _F],
    s6: Stage[_F, _G],
    s7: Stage[_G, _H],
    /,
) -> Pipeline[_A, _H]: ...
@overload
def pipe(
    s1: Stage[_A, _B],
    s2: Stage[_B, _C],
    s3: Stage[_C, _D],
    s4: Stage[_D, _E],
    s5: Stage[_E, _F],
    s6: Stage[_F, _G],
    s7: Stage[_G, _H],
    s8: Stage[_H, _I],
    /,
) -> Pipeline[_A, _I]: ...
@overload
def pipe(
    s1: Stage[_A, _B],
    s2: Stage[_B, _C],
    s3: Stage[_C, _D],
    s4: Stage[_D, _E],
    s5: Stage[_E, _F],
    s6: Stage[_F, _G],
    s7: Stage[_G, _H],
    s8: Stage[_H, _I],
    s9: Stage[_I, _J],
    /,
) -> Pipeline[_A, _J]: ...
def pipe(*stages: Any) -> Pipeline:
    """Chains stages, checking adjacent types before anything runs.
    A `Pipeline` stage stays one nested stage."""
    from ._stages import check_pipe

    check_pipe(stages)
    return Pipeline(stages)


def chain(left: Any, right: Any) -> Pipeline:
    """`left >> right`: `pipe(left, right)` with `Pipeline` operands
    flattened, so `a >> b >> c` is one 3-stage pipeline."""
    from ._stages import check_pipe

    flat = _flatten((left, right))
    check_pipe(flat)
    return Pipeline(flat)


def aggregate(
    *,
    timeout_per_branch: float | None = None,
    **branches: Stage[_AggIn, Any] | Callable[[Any], Any],
) -> Aggregate[_AggIn]:
    """Runs every branch on the same input concurrently; returns
    `{name: output}` in declaration order."""
    if not branches:
        raise CompositionTypeError("aggregate() requires at least 1 branch, got 0")
    if timeout_per_branch is not None and (
        isinstance(timeout_per_branch, bool) or not isinstance(timeout_per_branch, (int, float))
    ):
        raise ConfigError(
            "aggregate(): timeout_per_branch must be a number of seconds, got "
            f"{type(timeout_per_branch)!r}"
        )
    return Aggregate(branches, timeout_per_branch)
