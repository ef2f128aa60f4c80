"""Streaming events and the event bus.

The engine reports progress (spans, text deltas, tool calls, run outcome) as
`Event`s on the *ambient* `EventBus`, if any. `emit()` is on the engine's hot
path: with no bus installed it costs one ContextVar lookup.

A bus fans every event out to all its subscriptions, in one total order (the
order in which `emit` calls took the bus lock). Subscriptions have unbounded
queues, so `emit` never blocks on a slow consumer. The producer ends the stream
with `EventBus.close()`: each subscription then yields what it already holds and
stops; later emits are dropped and later subscriptions end at once.

This module imports only cheap stdlib modules; asyncio is imported lazily by
`EventBus.asubscribe()`.
"""

from __future__ import annotations

import reprlib
import time

# Not `threading`, `collections`, `contextvars`: their imports cost a fresh
# process milliseconds; a subscription imports what it needs.
from _contextvars import ContextVar
from _thread import allocate_lock

from . import _dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio
    from types import TracebackType
    from typing import Any, Literal

    from typing_extensions import Self

__all__ = [
    "AsyncSubscription",
    "Event",
    "EventBus",
    "EventKind",
    "Subscription",
    "current_bus",
    "emit",
    "use_bus",
]

_EVENT_KINDS = (
    "span_started",
    "text_delta",
    "thinking_delta",
    "tool_call_started",
    "tool_args_delta",
    "tool_call_finished",
    "span_finished",
    "paused",
    "run_finished",
)

if TYPE_CHECKING:
    EventKind = Literal[
        "span_started",
        "text_delta",
        "thinking_delta",
        "tool_call_started",
        "tool_args_delta",
        "tool_call_finished",
        "span_finished",
        "paused",
        "run_finished",
    ]
    """The kinds of `Event` a run emits, as a `Literal` of their names."""


def __getattr__(name: str) -> Any:
    # `EventKind` is built on first access: `typing` is not loaded at import.
    if name == "EventKind":
        from typing import Literal

        value = Literal[_EVENT_KINDS]  # type: ignore[valid-type]
        globals()[name] = value
        return value
    raise AttributeError(f"module 'composeai.events' has no attribute {name!r}")


_EVENT_FIELDS = ("kind", "ts", "trace_id", "span_id", "name", "text", "data")
_EVENT_PARAMS = {"frozen": True, "slots": True}
_EVENT_DEFAULTS = {"trace_id": None, "span_id": None, "name": None, "text": None, "data": None}
_EVENT_FACTORIES = {"ts": time.time}


class Event:
    """One thing that happened during a run."""

    # `@dataclass(frozen=True, slots=True)`, written out; see `_dataclass`.
    __slots__ = _EVENT_FIELDS
    kind: EventKind
    ts: float
    trace_id: str | None
    span_id: str | None
    name: str | None
    text: str | None
    data: dict[str, Any] | None

    __dataclass_fields__ = _dataclass.metadata(_EVENT_PARAMS, _EVENT_DEFAULTS, _EVENT_FACTORIES)
    __dataclass_params__ = _dataclass.metadata(_EVENT_PARAMS, _EVENT_DEFAULTS, _EVENT_FACTORIES)
    __match_args__ = ("kind", "ts", "trace_id", "span_id", "name", "text", "data")
    _lazy_annotation_names = ("EventKind",)

    def __init__(
        self,
        kind: EventKind,
        ts: float = _dataclass.FACTORY,
        trace_id: str | None = None,
        span_id: str | None = None,
        name: str | None = None,
        text: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        setter = object.__setattr__
        setter(self, "kind", kind)
        setter(self, "ts", time.time() if ts is _dataclass.FACTORY else ts)
        setter(self, "trace_id", trace_id)
        setter(self, "span_id", span_id)
        setter(self, "name", name)
        setter(self, "text", text)
        setter(self, "data", data)

    def _values(self) -> tuple:
        return (self.kind, self.ts, self.trace_id, self.span_id, self.name, self.text, self.data)

    @reprlib.recursive_repr()
    def __repr__(self) -> str:
        return (
            f"{self.__class__.__qualname__}(kind={self.kind!r}, ts={self.ts!r}, "
            f"trace_id={self.trace_id!r}, span_id={self.span_id!r}, name={self.name!r}, "
            f"text={self.text!r}, data={self.data!r})"
        )

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self._values() == other._values()  # type: ignore[attr-defined]
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._values())

    def __setattr__(self, name: str, value: Any) -> None:
        if type(self) is Event or name in _EVENT_FIELDS:
            raise _dataclass.frozen_error("assign to", name)
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if type(self) is Event or name in _EVENT_FIELDS:
            raise _dataclass.frozen_error("delete", name)
        super().__delattr__(name)

    def __getstate__(self) -> list:
        return list(self._values())

    def __setstate__(self, state: list) -> None:
        for name, value in zip(_EVENT_FIELDS, state):
            object.__setattr__(self, name, value)


class EventBus:
    """Thread-safe fan-out of `Event`s to any number of subscriptions."""

    __slots__ = ("__weakref__", "_closed", "_lock", "_subs")

    def __init__(self) -> None:
        # One lock guards the bus and every subscription's queue: emits are
        # totally ordered and a subscription's waiters wait on this lock.
        self._lock = allocate_lock()
        # Copy-on-write, so `emit` can skip the lock when nobody listens.
        self._subs: tuple[Subscription | AsyncSubscription, ...] = ()
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once `close()` has been called."""
        return self._closed

    def subscribe(self) -> Subscription:
        """A blocking iterator over every event emitted from now on."""
        sub = Subscription(self)
        self._attach(sub)
        return sub

    def asubscribe(self) -> AsyncSubscription:
        """An async iterator over every event emitted from now on, delivered to
        the running event loop. Raises `RuntimeError` without a running loop."""
        import asyncio

        loop = asyncio.get_running_loop()  # RuntimeError: no running event loop
        sub = AsyncSubscription(self, loop)
        self._attach(sub)
        return sub

    def emit(self, event: Event) -> None:
        """Deliver `event` to every current subscription. Never blocks on a
        consumer; a no-op once the bus is closed."""
        if not self._subs:
            return
        with self._lock:
            for sub in self._subs:
                sub._push_locked(event)

    def close(self) -> None:
        """End the stream (producer side; idempotent, any thread). Every
        subscription yields the events it already holds, then stops."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            subs, self._subs = self._subs, ()
            for sub in subs:
                sub._end_locked()

    # -- internals (called with or without the lock as named) ---------------

    def _attach(self, sub: Subscription | AsyncSubscription) -> None:
        with self._lock:
            if self._closed:
                sub._end_locked()
            else:
                self._subs = (*self._subs, sub)

    def _detach_locked(self, sub: Subscription | AsyncSubscription) -> None:
        if sub in self._subs:
            self._subs = tuple(s for s in self._subs if s is not sub)


class Subscription:
    """A blocking iterator over a bus's events.

    Iteration stops once the queue is drained after the bus closed or after
    `close()`: closing stops new deliveries but keeps what was already
    delivered. Iterating again after that returns immediately.
    """

    __slots__ = ("_bus", "_closed", "_cond", "_ended", "_queue", "_waiting")

    def __init__(self, bus: EventBus) -> None:
        self._bus = bus
        from collections import deque
        from threading import Condition

        self._cond = Condition(bus._lock)
        self._queue: deque[Event] = deque()
        self._waiting = 0  # threads blocked in __next__
        self._ended = False  # the bus closed: stop once drained
        self._closed = False  # unsubscribed: stop now

    @property
    def closed(self) -> bool:
        """True once `close()` has been called."""
        return self._closed

    def __iter__(self) -> Subscription:
        return self

    def __next__(self) -> Event:
        with self._cond:
            while True:
                if self._queue:
                    return self._queue.popleft()
                if self._ended or self._closed:
                    raise StopIteration
                self._waiting += 1
                try:
                    self._cond.wait()
                finally:
                    self._waiting -= 1

    def close(self) -> None:
        """Unsubscribe (idempotent, any thread). Events already delivered are
        still yielded; a consumer blocked in iteration stops."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._bus._detach_locked(self)
            if self._waiting:
                self._cond.notify_all()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- called by the bus, lock held ---------------------------------------

    def _push_locked(self, event: Event) -> None:
        self._queue.append(event)
        if self._waiting:
            self._cond.notify()

    def _end_locked(self) -> None:
        self._ended = True
        if self._waiting:
            self._cond.notify_all()


class AsyncSubscription:
    """An async iterator over a bus's events, bound to the event loop that was
    running when it was created.

    Producers on any thread append under the bus lock and, when a consumer is
    waiting, wake it with `loop.call_soon_threadsafe` (one wake-up per batch).
    """

    __slots__ = (
        "_bus",
        "_closed",
        "_ended",
        "_loop",
        "_queue",
        "_waiters",
        "_wake_scheduled",
    )

    def __init__(self, bus: EventBus, loop: asyncio.AbstractEventLoop) -> None:
        self._bus = bus
        self._loop = loop
        from collections import deque

        self._queue: deque[Event] = deque()
        self._waiters: list[asyncio.Future[None]] = []
        self._wake_scheduled = False
        self._ended = False
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once `close()` has been called."""
        return self._closed

    def __aiter__(self) -> AsyncSubscription:
        return self

    async def __anext__(self) -> Event:
        lock = self._bus._lock
        while True:
            with lock:
                if self._queue:
                    return self._queue.popleft()
                if self._ended or self._closed:
                    raise StopAsyncIteration
                waiter = self._loop.create_future()
                self._waiters.append(waiter)
            try:
                await waiter
            finally:
                with lock:
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)

    def close(self) -> None:
        """Unsubscribe (idempotent, any thread). Events already delivered are
        still yielded; a consumer waiting in `async for` stops."""
        with self._bus._lock:
            if self._closed:
                return
            self._closed = True
            self._bus._detach_locked(self)
            self._wake_locked()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- called by the bus, lock held ---------------------------------------

    def _push_locked(self, event: Event) -> None:
        if self._loop.is_closed():
            self._drop_locked()  # nobody can consume any more
            return
        self._queue.append(event)
        self._wake_locked()

    def _end_locked(self) -> None:
        self._ended = True
        self._wake_locked()

    def _wake_locked(self) -> None:
        if not self._waiters or self._wake_scheduled:
            return
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # the loop closed under us
            self._drop_locked()
        else:
            self._wake_scheduled = True

    def _drop_locked(self) -> None:
        self._closed = True
        self._queue.clear()
        self._waiters.clear()
        self._bus._detach_locked(self)

    # -- runs on the loop ----------------------------------------------------

    def _wake(self) -> None:
        with self._bus._lock:
            self._wake_scheduled = False
            waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


_BUS: ContextVar[EventBus | None] = ContextVar("composeai.event_bus", default=None)


def current_bus() -> EventBus | None:
    """The ambient bus, or None."""
    return _BUS.get()


def emit(event: Event) -> None:
    """Emit `event` on the ambient bus; a no-op when there is none."""
    bus = _BUS.get()
    if bus is not None:
        bus.emit(event)


class use_bus:
    """`with use_bus(bus):` makes `bus` ambient for the block (and for anything
    that inherits this context). `use_bus(None)` hides any ambient bus."""

    __slots__ = ("_bus", "_tokens")

    def __init__(self, bus: EventBus | None) -> None:
        self._bus = bus
        self._tokens: list[Any] = []

    def __enter__(self) -> EventBus | None:
        self._tokens.append(_BUS.set(self._bus))
        return self._bus

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _BUS.reset(self._tokens.pop())
