"""The cancel token of a run's stream: `RunStream` makes one
ambient inside its call through the `CANCEL_TOKEN` ContextVar, and the engine
polls it (`current_cancel_token()`) at its boundaries. Kept below the engine,
which reads it, and the streams, which set it; importing it costs nothing."""

from __future__ import annotations

# `_contextvars` rather than `contextvars`: the engine imports this module
# when `import composeai` runs.
from _contextvars import ContextVar

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType
    from typing import Any

__all__ = ["CANCEL_TOKEN", "CancelToken", "current_cancel_token", "use_cancel_token"]


class CancelToken:
    """A one-way cancellation flag, safe to set and read from any thread."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        # Tokens are made by streams, which have loaded `threading` already.
        import threading

        self._event = threading.Event()

    @property
    def cancelled(self) -> bool:
        """True once `set()` has been called."""
        return self._event.is_set()

    def set(self) -> None:
        """Request cancellation (idempotent)."""
        self._event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until cancelled or `timeout` seconds pass; returns `cancelled`.
        For interruptible sleeps (e.g. retry back-off) on worker threads."""
        return self._event.wait(timeout)

    def __repr__(self) -> str:
        return f"<CancelToken cancelled={self.cancelled}>"


CANCEL_TOKEN: ContextVar[CancelToken | None] = ContextVar("composeai.cancel_token", default=None)


def current_cancel_token() -> CancelToken | None:
    """The ambient cancel token (set inside `RunStream.start`'s call), or None."""
    return CANCEL_TOKEN.get()


class use_cancel_token:
    """`with use_cancel_token(token):` makes `token` ambient for the block;
    `use_cancel_token(None)` hides an enclosing stream's token (e.g. for work
    that must not be cancelled with it)."""

    __slots__ = ("_resets", "_token")

    def __init__(self, token: CancelToken | None) -> None:
        self._token = token
        self._resets: list[Any] = []

    def __enter__(self) -> CancelToken | None:
        self._resets.append(CANCEL_TOKEN.set(self._token))
        return self._token

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        CANCEL_TOKEN.reset(self._resets.pop())
