"""`Run` results and `Budget` (AGENT-55, BUDGET-1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from .errors import ConfigError

__all__ = ["Budget", "Run", "reset_default"]

if TYPE_CHECKING:
    import typing_extensions

    # Loaded lazily by `__getattr__` below; re-exported for type checkers.
    from ._streams import AsyncRunStream as AsyncRunStream  # noqa: PLC0414
    from ._streams import RunStream as RunStream  # noqa: PLC0414

    R = typing_extensions.TypeVar("R", default=Any)  # bare `Run` means `Run[Any]` (COMP-46)
else:
    R = TypeVar("R")


class _LazyUsage:
    """Descriptor behind `Run.usage`: runs that made no model call hold no
    `Usage` object until one is asked for, so a flow that never touches a
    model never imports pydantic."""

    def __set_name__(self, owner, name):
        self._slot = "_" + name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        value = obj.__dict__.get(self._slot)
        if value is None or isinstance(value, tuple):
            from .messages import Usage

            value = Usage() if value is None else Usage(**dict(value))
            obj.__dict__[self._slot] = value
        return value

    def __set__(self, obj, value):
        # The dataclass default is the descriptor itself: "nothing yet".
        obj.__dict__[self._slot] = None if value is self else value


@dataclass
class Run(Generic[R]):
    """The outcome of a run. `pending` is set exactly when `status == "paused"`;
    a returned `Run` is never `failed` (failures raise)."""

    id: str
    status: Literal["completed", "paused", "failed", "cancelled"]
    output: R
    usage: Any = _LazyUsage()
    trace: Any = None
    messages: list[Any] = field(default_factory=list)
    pending: Any = None


@dataclass
class Budget:
    """A spending cap: USD, tokens, or both (BUDGET-1)."""

    usd: float | None = None
    tokens: int | None = None

    def __post_init__(self) -> None:
        if self.usd is None and self.tokens is None:
            raise ConfigError("Budget requires at least one of `usd` or `tokens` to be set")


def reset_default() -> None:
    """Drops the process's store handle so a changed `COMPOSE_DIR` is re-read."""
    from . import _engine

    _engine.reset_store()


def __getattr__(name: str) -> Any:
    if name in ("RunStream", "AsyncRunStream"):
        from . import _streams

        return getattr(_streams, name)
    raise AttributeError(f"module 'composeai.runs' has no attribute {name!r}")
