"""The background event loop that runs `async def` bodies reached from sync
code. It starts only when such a body is first reached."""

from __future__ import annotations

import atexit
import contextvars
import threading
from collections.abc import Awaitable, Callable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_lock = threading.Lock()
_loop: Any = None
_thread: threading.Thread | None = None
_shut_down = False

REENTRY = "composeai runtime cannot be re-entered from its own loop thread"
SHUT_DOWN = "composeai runtime is shut down (interpreter exit in progress?)"


def _ensure_loop():
    global _loop, _thread
    if _shut_down:
        raise RuntimeError(SHUT_DOWN)
    if _loop is not None:
        return _loop
    with _lock:
        if _loop is None:
            import asyncio

            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            thread = threading.Thread(target=serve, name="composeai-runtime", daemon=True)
            thread.start()
            ready.wait()
            _thread = thread
            _loop = loop
    return _loop


def on_loop_thread() -> bool:
    return _thread is not None and threading.current_thread() is _thread


def run_sync(make_coro: Callable[[], Awaitable[Any]]) -> Any:
    """Runs the coroutine made by `make_coro` on the background loop, in a
    copy of the caller's context, and blocks until it settles. Ctrl-C
    cancels it (a real CancelledError into it) and re-raises."""
    if on_loop_thread():
        raise RuntimeError(REENTRY)
    loop = _ensure_loop()
    import asyncio
    import concurrent.futures

    ctx = contextvars.copy_context()
    done: concurrent.futures.Future = concurrent.futures.Future()
    handle: dict[str, Any] = {}

    def start() -> None:
        task = ctx.run(loop.create_task, make_coro())
        handle["task"] = task

        def settle(t: asyncio.Task) -> None:
            if t.cancelled():
                done.set_exception(asyncio.CancelledError())
            elif t.exception() is not None:
                done.set_exception(t.exception())
            else:
                done.set_result(t.result())

        task.add_done_callback(settle)

    loop.call_soon_threadsafe(start)
    try:
        return done.result()
    except KeyboardInterrupt:
        task = handle.get("task")
        if task is not None:
            loop.call_soon_threadsafe(task.cancel)
            try:
                done.result(timeout=5)
            except BaseException:  # noqa: BLE001, S110 -- the interrupt is what we re-raise
                pass
        raise


class _OwnedLoop:
    """A thread's own event loop, closed when the thread ends."""

    __slots__ = ("loop",)

    def __init__(self, loop: Any):
        self.loop = loop

    def __del__(self) -> None:
        loop = self.loop
        if not loop.is_closed() and not loop.is_running():
            loop.close()


_local = threading.local()


def run_here(make_coro: Callable[[], Awaitable[Any]], driver: Any) -> Any:
    """Runs the coroutine made by `make_coro` to completion on the calling
    thread, on an event loop of this thread's own (made once per thread), so
    a sync call of an `async def` body costs no thread hop. The
    `driver` context variable names that loop while it runs, so a sync
    facade call inside the body raises instead of re-entering. A
    thread whose own loop is already running (a notebook cell)
    uses the background loop instead. Ctrl-C cancels the coroutine (a real
    CancelledError into it) and re-raises."""
    import asyncio

    if _shut_down:
        raise RuntimeError(SHUT_DOWN)
    if asyncio._get_running_loop() is not None:
        return run_sync(make_coro)
    owned = getattr(_local, "owned", None)
    if owned is None or owned.loop.is_closed():
        owned = _local.owned = _OwnedLoop(asyncio.new_event_loop())
    loop = owned.loop
    token = driver.set(loop)
    try:
        task = loop.create_task(make_coro())
    finally:
        driver.reset(token)
    try:
        return loop.run_until_complete(task)
    except KeyboardInterrupt:
        if not task.done():
            task.cancel()
            try:
                loop.run_until_complete(task)
            except BaseException:  # noqa: BLE001, S110 -- the interrupt is what we re-raise
                pass
        raise


def _shutdown() -> None:
    global _shut_down
    _shut_down = True
    loop = _loop
    if loop is not None and loop.is_running():
        loop.call_soon_threadsafe(loop.stop)


# From the first async body reached from sync code on, interpreter exit ends
# this runtime (ASYNC-16), whichever loop ran the body.
atexit.register(_shutdown)
