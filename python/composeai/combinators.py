"""`map()` and `MapResult` (COMP-22 … COMP-27)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from contextvars import copy_context
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from . import _codec, _engine
from ._engine import FRAME, Frame
from .errors import ConfigError
from .flow import Task

__all__ = ["MapResult", "map"]

T = TypeVar("T")


@dataclass
class MapResult(Generic[T]):
    """One item's outcome of `map(..., on_error="collect")` (COMP-26)."""

    ok: bool
    value: T | None = None
    error: str | None = None
    error_type: str | None = None


_codec.register_serializable(MapResult)


def stage_name(stage: Any) -> str:
    """COMP-2: a stage's display name."""
    name = getattr(stage, "name", None)
    if isinstance(name, str) and name:
        return name
    dunder = getattr(stage, "__name__", None)
    if isinstance(dunder, str):
        return dunder
    return repr(stage)


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
    thread hand-offs. No bounded shared pool sits under the items (ASYNC-7).
    """

    TICK = 0.001

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


def map(
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    *,
    max_workers: int | None = None,
    timeout_per_item: float | None = None,
    on_error: str = "raise",
) -> list:
    """Applies `fn` to every item concurrently; results in input order. In a
    flow, item `i` of the k-th map journals under scope `map#k[i]`."""
    _check_map_args("map", on_error, max_workers)
    items = list(items)
    if not items:
        return []
    frame = FRAME.get()
    run = frame.run if frame is not None else None
    name = stage_name(fn)
    span, trace = _engine.open_child(frame, "aggregate", f"map({name})")
    scope = frame.scope if frame is not None else ""
    fence = frame.fence if frame is not None else None
    map_key = run.attempt.next_key(scope, "map", fence) if run is not None else None
    count = len(items)
    outcomes: list[Any] = [None] * count
    failures: list[BaseException | None] = [None] * count
    item_fences = []

    def run_item(index: int) -> None:
        item_scope = f"{map_key}[{index}]" if map_key is not None else scope
        item_fence = _engine.child_fence(frame) if run is not None else None
        if item_fence is not None:
            item_fences.append(item_fence)
        item_frame = Frame(run, item_scope, span, item_fence, trace)
        token = FRAME.set(item_frame)
        try:
            outcomes[index] = _run_item(fn, name, index, items[index], item_frame, timeout_per_item)
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
    first = next((f for f in failures if f is not None), None)
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
    if first is not None:
        _engine.fail_span(run, span, first)
        raise first
    _engine.close_span(run, span, outcomes)
    return outcomes


def _run_item(
    fn: Callable[[Any], Any],
    name: str,
    index: int,
    item: Any,
    frame: Frame,
    timeout: float | None,
) -> Any:
    """One item inside its `<fn>[<i>]` task span (COMP-24)."""
    label = f"{name}[{index}]"
    # A task mapped directly journals a value only the map collects.
    defer = isinstance(fn, Task)

    def execute(inner: Frame) -> Any:
        if timeout is None:
            if not defer:
                return fn(item)
            token = FRAME.set(
                Frame(inner.run, inner.scope, inner.span, inner.fence, inner.trace, True)
            )
            try:
                return fn(item)
            finally:
                FRAME.reset(token)
        fence = _engine.child_fence(inner) or inner.fence
        thread_frame = Frame(inner.run, inner.scope, inner.span, fence, inner.trace, defer)
        return _engine.run_on_thread(
            lambda: fn(item),
            thread_frame,
            timeout,
            lambda: _engine.task_timeout_error("@task", label, timeout, False),
            f"composeai-map-{label}",
        )

    return _engine.unjournaled_call(frame, "task", label, execute, item)
