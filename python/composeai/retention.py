"""Retention: deleting settled runs, and every row that belongs to them,
once they are older than a cutoff (`delete_runs`, `compose runs --prune`,
`compose worker --retention`).

The store deletes in batches of bounded size, one transaction each, so
other writers never wait long; it never deletes a queued, running or
paused run, nor a run that an unfinished fork still borrows journal rows
from. Graph runs follow their threads (`compose threads --prune`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from . import _core, _engine
from .errors import ConfigError

__all__ = ["delete_runs"]

_SETTLED = ("completed", "failed", "cancelled")
_KINDS = ("agent", "flow", "pipe", "aggregate")
# Runs deleted per transaction: each batch holds the write lock for
# milliseconds.
BATCH = 200

_AGE = re.compile(r"([0-9]+)([dhm])")


def parse_age(text: str, what: str) -> timedelta:
    """`30d`, `12h` or `45m` as a `timedelta`."""
    m = _AGE.fullmatch(text.strip())
    if not m:
        raise ConfigError(f"invalid {what} value {text!r}: expected '<N>d', '<N>h' or '<N>m'")
    unit = {"d": 86400, "h": 3600, "m": 60}[m.group(2)]
    return timedelta(seconds=int(m.group(1)) * unit)


def _cutoff(older_than: Any) -> float:
    if isinstance(older_than, timedelta):
        if older_than < timedelta(0):
            raise ConfigError("delete_runs(older_than=...) must not be a negative timedelta")
        return time.time() - older_than.total_seconds()
    if isinstance(older_than, datetime):
        return older_than.timestamp()
    raise ConfigError(
        "delete_runs(older_than=...) is required: a timedelta (runs last updated longer ago) "
        f"or a datetime (runs last updated before it), got {type(older_than).__name__}"
    )


def _statuses(status: str | Iterable[str]) -> list[str]:
    items = [status] if isinstance(status, str) else list(status)
    if not items:
        raise ConfigError("delete_runs(status=...) names no status")
    for item in items:
        if item not in _SETTLED:
            raise ConfigError(
                f"delete_runs(status={item!r}): only settled runs are deleted -- use "
                f"{', '.join(_SETTLED)} (a queued, running or paused run is never deleted)"
            )
    return items


def delete_runs(
    *,
    older_than: timedelta | datetime | None = None,
    status: str | Iterable[str] = _SETTLED,
    name: str | None = None,
    kind: str | None = None,
    dry_run: bool = False,
) -> int:
    """Deletes the settled runs (`status`) last updated before `older_than`
    (a `timedelta` back from now, or a `datetime`) with every row that
    belongs to them, optionally only those of flow or agent `name` and of
    `kind`; returns how many were deleted (with `dry_run`, how many would
    be, deleting nothing). `older_than` is required."""
    cutoff = _cutoff(older_than)
    statuses = _statuses(status)
    if name is not None and not isinstance(name, str):
        raise ConfigError(f"delete_runs(name=...) must be a str, got {type(name).__name__}")
    if kind is not None and kind not in _KINDS:
        hint = (
            " -- graph runs follow their threads: compose threads --prune"
            if kind == "graph"
            else ""
        )
        raise ConfigError(f"delete_runs(kind={kind!r}): expected one of {', '.join(_KINDS)}{hint}")
    return _core.prune_runs(_engine.get_store(), cutoff, statuses, name, kind, bool(dry_run), BATCH)


def compact() -> tuple[int, int] | None:
    """Returns the store's free pages to the file system (SQLite); returns
    the file's bytes before and after, or `None` for a server store, which
    reclaims space itself."""
    return _core.compact_store(_engine.get_store())
