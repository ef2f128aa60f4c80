"""Graph values: `END`, the graph errors (each carries `.code` and
`.details`), `GraphResult`, `GraphInterrupt`, `NodeContext`, and what a node
returns to `suspend` or `goto`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ComposeError, ConfigError

END = "__end__"

# ---------------------------------------------------------------------------
# Errors (EXT-31: every graph error carries `.code` and `.details`)


class GraphError(ComposeError):
    """A graph run or thread operation failed; `.code` says how."""

    def __init__(self, message: str = "", *, code: str = "graph_error", details: Any = None):
        super().__init__(message)
        self.code = code
        self.details: dict = dict(details or {})

    def __reduce__(self):
        return (_rebuild, (type(self), str(self), self.code, self.details))


def _rebuild(cls, message, code, details):
    return cls(message, code=code, details=details)


class GraphValidationError(ConfigError, GraphError):
    """The graph, a snapshot or resume values do not fit."""

    def __init__(
        self,
        message: str = "",
        *,
        code: str = "invalid_workflow",
        issues: list[dict] | None = None,
        details: Any = None,
    ):
        GraphError.__init__(self, message, code=code, details=details)
        self.issues: list[dict] = list(issues or [])
        if issues is not None:
            self.details.setdefault("issues", self.issues)

    def __reduce__(self):
        return (_rebuild, (type(self), str(self), self.code, self.details))


class GraphLimitError(GraphError):
    """`max_steps` or `deadline` was reached."""


class GraphStorageError(GraphError):
    """A thread's storage has no such checkpoint or thread."""


class ThreadSuspendedError(GraphError):
    """`run()` on a thread whose nodes wait for `resume()`."""


class ThreadBusyError(GraphError):
    """Another caller holds the thread."""


_ERROR_CLASSES: dict[str, type[GraphError]] = {
    "resume_invalid": GraphValidationError,
    "invalid_workflow": GraphValidationError,
    "step_limit_exceeded": GraphLimitError,
    "deadline_exceeded": GraphLimitError,
    "checkpoint_not_found": GraphStorageError,
    "checkpoint_corrupt": GraphStorageError,
    "thread_not_found": GraphStorageError,
    "thread_exists": GraphStorageError,
    "thread_suspended": ThreadSuspendedError,
    "thread_busy": ThreadBusyError,
}


def _error_from_core(code: str, message: str, details_json: str) -> GraphError:
    """The exception for a core graph error (called by the bindings)."""
    cls = _ERROR_CLASSES.get(code, GraphError)
    return cls(message, code=code, details=json.loads(details_json or "{}"))


# ---------------------------------------------------------------------------
# Values


@dataclass(frozen=True)
class GraphInterrupt:
    """A suspended node and what it asked."""

    node: str
    payload: Any


@dataclass(frozen=True)
class NodeContext:
    """What a node knows about its execution."""

    run_id: str
    step: int
    node: str
    attempt: int
    resume: Any = None


@dataclass
class GraphResult:
    """What a graph run produced."""

    state: dict
    steps: int
    suspended: bool
    interrupts: list[GraphInterrupt]
    run_id: str
    snapshot: dict | None = field(default=None, repr=False)
    checkpoint_id: str = ""
    version: int = 0


class _Suspend:
    __slots__ = ("payload", "update")

    def __init__(self, payload: Any, update: dict | None):
        self.payload = payload
        self.update = update


class _Goto:
    __slots__ = ("targets", "update")

    def __init__(self, targets: list[str], update: dict | None):
        self.targets = targets
        self.update = update


def suspend(payload: Any, update: dict | None = None) -> Any:
    """Return this from a node to pause the run until someone answers."""
    if update is not None and not isinstance(update, dict):
        raise TypeError(f"suspend(update=...) takes a dict, got {type(update).__name__}")
    return _Suspend(payload, update)


def goto(targets: str | Sequence[str], update: dict | None = None) -> Any:
    """Return this from a node to choose its next nodes among those declared
    with `Graph.goto`."""
    if isinstance(targets, str):
        names = [targets]
    else:
        names = list(targets)
        if not all(isinstance(t, str) for t in names):
            raise TypeError("goto() targets must be node names (str)")
    if update is not None and not isinstance(update, dict):
        raise TypeError(f"goto(update=...) takes a dict, got {type(update).__name__}")
    return _Goto(names, update)
