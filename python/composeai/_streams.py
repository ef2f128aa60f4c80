"""`RunStream` and `AsyncRunStream`.

Both run one call with a fresh private `EventBus` made ambient for it, and
subscribe before the call starts, so no event is lost. The bus is closed when
the call settles, which ends iteration once the queued events are drained.

`RunStream` also carries a `CancelToken`, ambient inside the call through the
`CANCEL_TOKEN` ContextVar; the engine polls it (`current_cancel_token()`) and
turns a cancellation into `Run(status="cancelled", ...)` itself.

This module imports only cheap stdlib modules; asyncio is imported lazily.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from . import _core, _engine
from ._cancel import CANCEL_TOKEN, CancelToken, current_cancel_token, use_cancel_token
from ._values import Run
from .events import AsyncSubscription, Event, EventBus, Subscription, use_bus

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "CANCEL_TOKEN",
    "AsyncRunStream",
    "CancelToken",
    "RunStream",
    "current_cancel_token",
    "use_cancel_token",
]

if TYPE_CHECKING:
    import typing_extensions

    # Bare `RunStream` / `AsyncRunStream` mean `[Any]` (COMP-46).
    R = typing_extensions.TypeVar("R", default=Any)
else:
    R = TypeVar("R")


class RunStream(Generic[R]):
    """Events of a run executing on a background thread.

    Iterating yields `Event`s until the run settles, then stops; if the run
    raised, the first full drain re-raises that same exception object. Later
    iterations return at once. Made by `RunStream.start`, not directly.
    """

    def __init__(
        self,
        bus: EventBus,
        subscription: Subscription,
        cancel_token: CancelToken,
        cancellable: bool,
    ) -> None:
        self._bus = bus
        self._sub = subscription
        self._token = cancel_token
        self._cancellable = cancellable
        self._thread: threading.Thread | None = None
        self._result: Run[R] | None = None
        self._error: BaseException | None = None
        self._drained = False
        self._lock = threading.Lock()

    @classmethod
    def start(cls, call: Callable[[], Run[R]], *, cancellable: bool) -> RunStream[R]:
        """Run `call()` on a daemon thread that inherits the caller's context,
        with a fresh bus and this stream's cancel token ambient."""
        bus = EventBus()
        stream = cls(bus, bus.subscribe(), CancelToken(), cancellable)
        ctx = contextvars.copy_context()
        thread = threading.Thread(
            target=ctx.run, args=(stream._main, call), name="composeai-stream", daemon=True
        )
        stream._thread = thread
        thread.start()
        return stream

    def _main(self, call: Callable[[], Run[R]]) -> None:
        try:
            with use_bus(self._bus), use_cancel_token(self._token):
                result = call()
        except BaseException as exc:  # noqa: BLE001 -- handed to the consumer, re-raised there
            cancelled = _cancelled_run(exc) if self._cancellable else None
            if cancelled is None:
                self._error = exc
            else:
                self._result = cancelled
        else:
            self._result = result
        finally:
            self._bus.close()

    def __iter__(self) -> RunStream[R]:
        return self

    def __next__(self) -> Event:
        try:
            return next(self._sub)
        except StopIteration:
            pass
        if not self._sub.closed:
            # The bus closed, so the call has settled (its outcome is recorded
            # before the close). Report a failure once, on the first drain.
            with self._lock:
                first, self._drained = not self._drained, True
            if first and self._error is not None:
                raise self._error
        raise StopIteration

    @property
    def run(self) -> Run[R]:
        """Wait for the call to settle; return its `Run` or re-raise."""
        assert self._thread is not None
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]

    @property
    def cancel_token(self) -> CancelToken:
        """The token the engine polls inside the call."""
        return self._token

    @property
    def cancellable(self) -> bool:
        return self._cancellable

    def cancel(self) -> None:
        """Ask the run to stop (any thread, idempotent). Accepted and ignored
        on a stream started with `cancellable=False`."""
        if self._cancellable:
            self._token.set()

    def close(self) -> None:
        """Stop receiving events (idempotent, any thread); the run continues."""
        self._sub.close()


def _cancelled_run(exc: BaseException) -> Run | None:
    """The `Run` a cancelled call returns when the engine's cancel signal
    reached the stream itself: a stream nested in a flow step has no run row
    to settle, and the signal must never reach user code."""
    if not isinstance(exc, _engine._Cancelled):
        return None
    frame = _engine.FRAME.get()
    return Run(
        id=_core.ulid(),
        status="cancelled",
        output=None,
        usage=None,
        trace=frame.trace if frame is not None else None,
        messages=[],
    )


# Tasks started by `AsyncRunStream`: asyncio keeps only weak references.
_LIVE_TASKS: set[asyncio.Task[Any]] = set()


class AsyncRunStream(Generic[R]):
    """Events of a run executing as an `asyncio.Task` on the caller's loop. Made by `AsyncRunStream.start`, not directly."""

    def __init__(self, bus: EventBus, subscription: AsyncSubscription) -> None:
        self._bus = bus
        self._sub = subscription
        self._task: asyncio.Task[Run[R]] | None = None
        self._error: BaseException | None = None
        self._drained = False
        self._token = CancelToken()

    @classmethod
    def start(cls, make_coro: Callable[[], Awaitable[Run[R]]]) -> AsyncRunStream[R]:
        """Subscribe, then start `make_coro()` as a task on the running loop
        (`RuntimeError` without one) with a fresh bus ambient."""
        import asyncio

        loop = asyncio.get_running_loop()
        bus = EventBus()
        stream = cls(bus, bus.asubscribe())
        # The task copies the caller's context (ASYNC-12); `_drive` installs
        # the bus inside that copy only.
        task = loop.create_task(stream._drive(make_coro), name="composeai-astream")
        stream._task = task
        _LIVE_TASKS.add(task)
        task.add_done_callback(_LIVE_TASKS.discard)
        return stream

    async def _drive(self, make_coro: Callable[[], Awaitable[Run[R]]]) -> Run[R]:
        try:
            # No sync stream's token applies here: an async run is cancelled by
            # cancelling its task (ASYNC-10), or by this stream's `cancel()`.
            with use_bus(self._bus), use_cancel_token(self._token):
                return await make_coro()
        except BaseException as exc:
            self._error = exc
            raise
        finally:
            self._bus.close()

    def __aiter__(self) -> AsyncRunStream[R]:
        return self

    async def __anext__(self) -> Event:
        try:
            return await self._sub.__anext__()
        except StopAsyncIteration:
            pass
        if self._sub.closed or self._drained:
            raise StopAsyncIteration
        task = self._task
        assert task is not None
        if not task.done():  # the bus closes just before the task finishes
            import asyncio

            await asyncio.wait((task,))
        if self._drained:
            raise StopAsyncIteration
        self._drained = True
        error = self._error
        if error is not None:
            if not task.cancelled():
                task.exception()  # retrieved: no "never retrieved" warning
            raise error
        raise StopAsyncIteration

    async def run(self) -> Run[R]:
        """Wait for the run; return its `Run` or re-raise. Cancelling the
        awaiting task cancels the run."""
        assert self._task is not None
        return await self._task

    def close(self) -> None:
        """Stop receiving events (idempotent); the run continues."""
        self._sub.close()

    def cancel(self) -> None:
        """Cancels the run at its next step or wait: `run()` then
        returns `Run(status="cancelled")`. Idempotent."""
        self._token.set()
