"""`Run` results and `Budget`, and the streams of a run.
The classes live below the engine (`_values`, `_streams`); this
module is where the spec names them."""

from __future__ import annotations

# `R` is bound here too: `Run` reports this module, so the dataclass machinery
# and type hints resolve its annotations in this namespace. (`_LazyUsage`:
# `Run.usage`'s default, importable from here as before.)
from ._values import Budget, R, Run, _LazyUsage  # noqa: F401

__all__ = ["Budget", "Run", "reset_default"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    # Loaded lazily by `__getattr__` below; re-exported for type checkers.
    from ._streams import AsyncRunStream as AsyncRunStream  # noqa: PLC0414
    from ._streams import RunStream as RunStream  # noqa: PLC0414


def reset_default() -> None:
    """Drops the process's store handle so a changed `COMPOSE_DIR` is re-read."""
    from . import _engine

    _engine.reset_store()


def __getattr__(name: str) -> Any:
    if name in ("RunStream", "AsyncRunStream"):
        from . import _streams

        return getattr(_streams, name)
    raise AttributeError(f"module 'composeai.runs' has no attribute {name!r}")
