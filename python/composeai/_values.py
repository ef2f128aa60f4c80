"""Value types below the engine: `Run` and `Budget`,
re-exported by `composeai.runs`, and `TaskFailed`, re-exported by
`composeai.durable`. Each reports its public module as `__module__`, so type
tags, reprs and pickles name the module the spec names."""

from __future__ import annotations

import reprlib

from . import _dataclass
from .errors import ComposeError, ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Generic, Literal

    import typing_extensions

    R = typing_extensions.TypeVar("R", default=Any)  # bare `Run` means `Run[Any]` (COMP-46)
else:
    from ._typing import Generic, TypeVar

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


class Run(Generic[R]):
    """The outcome of a run, as `run()`, `resume()` and `RunHandle.result()` return it.

    Attributes:
        id: the run's id (a ULID): what `resume()`, `compose trace` and the
            web UI take.
        status: `"completed"`, `"paused"` (waiting for an answer, a timer or a
            signal) or `"cancelled"`; a failed run raises instead.
        output: the flow's or agent's return value (`None` unless completed).
        usage: tokens and USD of the run's model calls (`Usage`).
        trace: the run's spans (`Trace`).
        messages: an agent run's conversation.
        pending: what a paused run waits on (`Interrupt`), else `None`.
    """

    # A dataclass (AGENT-55), written out; see `_dataclass`.
    id: str
    status: Literal["completed", "paused", "failed", "cancelled"]
    output: R
    usage: Any = _LazyUsage()
    trace: Any = None
    messages: list[Any]
    pending: Any = None

    __dataclass_fields__ = _dataclass.metadata({}, factories={"messages": list})
    __dataclass_params__ = _dataclass.metadata({}, factories={"messages": list})
    __match_args__ = ("id", "status", "output", "usage", "trace", "messages", "pending")
    __hash__ = None  # type: ignore[assignment]

    def __init__(
        self,
        id: str,
        status: Literal["completed", "paused", "failed", "cancelled"],
        output: R,
        usage: Any = usage,
        trace: Any = None,
        messages: list[Any] = _dataclass.FACTORY,
        pending: Any = None,
    ) -> None:
        self.id = id
        self.status = status
        self.output = output
        self.usage = usage
        self.trace = trace
        self.messages = [] if messages is _dataclass.FACTORY else messages
        self.pending = pending

    @reprlib.recursive_repr()
    def __repr__(self) -> str:
        return (
            f"{self.__class__.__qualname__}(id={self.id!r}, status={self.status!r}, "
            f"output={self.output!r}, usage={self.usage!r}, trace={self.trace!r}, "
            f"messages={self.messages!r}, pending={self.pending!r})"
        )

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return (
                self.id,
                self.status,
                self.output,
                self.usage,
                self.trace,
                self.messages,
                self.pending,
            ) == (
                other.id,  # type: ignore[attr-defined]
                other.status,  # type: ignore[attr-defined]
                other.output,  # type: ignore[attr-defined]
                other.usage,  # type: ignore[attr-defined]
                other.trace,  # type: ignore[attr-defined]
                other.messages,  # type: ignore[attr-defined]
                other.pending,  # type: ignore[attr-defined]
            )
        return NotImplemented


class Budget:
    """A spending cap on a run's model calls: USD, tokens, or both.

    Counted over every attempt of the run and checked after each model call:
    once the spending is over the cap, `BudgetExceededError` is raised (the
    call that crossed it has been made and is counted). Pass it as `budget=`
    to `run()`, `resume()` or an agent call.

    Attributes:
        usd: the most the run may spend, in US dollars.
        tokens: the most input plus output tokens the run may use.
    """

    # A dataclass (BUDGET-1), written out; see `_dataclass`.
    usd: float | None = None
    tokens: int | None = None

    __dataclass_fields__ = _dataclass.metadata({})
    __dataclass_params__ = _dataclass.metadata({})
    __match_args__ = ("usd", "tokens")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, usd: float | None = None, tokens: int | None = None) -> None:
        self.usd = usd
        self.tokens = tokens
        self.__post_init__()

    def __post_init__(self) -> None:
        if self.usd is None and self.tokens is None:
            raise ConfigError("Budget requires at least one of `usd` or `tokens` to be set")

    @reprlib.recursive_repr()
    def __repr__(self) -> str:
        return f"{self.__class__.__qualname__}(usd={self.usd!r}, tokens={self.tokens!r})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return (self.usd, self.tokens) == (other.usd, other.tokens)  # type: ignore[attr-defined]
        return NotImplemented


class TaskFailed(ComposeError):
    """A step of a `@flow(journal_failures=True)` failed after its
    retries; journaled, so a replay raises the same failure again."""

    def __init__(self, step_key: str, error_type: str, message: str) -> None:
        super().__init__(f"step '{step_key}' failed: {error_type}: {message}")
        self.step_key = step_key
        self.error_type = error_type
        self.message = message


Run.__module__ = "composeai.runs"
Budget.__module__ = "composeai.runs"
TaskFailed.__module__ = "composeai.durable"
