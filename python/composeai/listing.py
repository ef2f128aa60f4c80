"""Listing runs from any process: `list_runs` and its `RunInfo` rows.

The filters are those of `compose runs`; pages are keyset-paged by run id
(`before=` the last id of the previous page), so a page costs the same
however many runs the store holds.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from . import _core, _engine
from ._show import _KINDS, _STATUSES, _parse_since
from .errors import ComposeError, ConfigError

__all__ = ["RunInfo", "list_runs"]


@dataclass(frozen=True)
class RunInfo:
    """One run as `list_runs` reports it: the run row, the usage of its
    model calls, its pending interrupt ids, the queue it was started on and
    the run it was forked from (`parent_id`)."""

    id: str
    kind: str
    name: str
    status: str
    created_at: datetime
    updated_at: datetime
    cost_usd: float | None
    input_tokens: int
    output_tokens: int
    pending: list[str]
    error_type: str | None
    error_message: str | None
    queue: str | None
    fingerprint: str | None
    parent_id: str | None


def _instant(value: Any, what: str) -> float | None:
    """A `datetime`, a `timedelta` back from now, or the CLI's `3d`, `12h`
    or `YYYY-MM-DD`, as Unix seconds."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, timedelta):
        return time.time() - value.total_seconds()
    if isinstance(value, str):
        try:
            return _parse_since(value)
        except ComposeError:
            raise ConfigError(
                f"{what}={value!r}: expected a datetime, a timedelta, '<N>d', '<N>h' or "
                "'YYYY-MM-DD'"
            ) from None
    raise ConfigError(
        f"{what} must be a datetime, a timedelta or a string like '3d', got {type(value).__name__}"
    )


def _choices(value: str | Iterable[str] | None, allowed: tuple, what: str) -> list[str]:
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    for item in items:
        if item not in allowed:
            raise ConfigError(f"{what}={item!r}: expected one of {', '.join(allowed)}")
    return items


def _error(error_json: str | None) -> tuple[str | None, str | None]:
    if not error_json:
        return None, None
    import json

    try:
        err = json.loads(error_json)
    except ValueError:
        return None, error_json
    if not isinstance(err, dict):
        return None, str(err)
    return err.get("type"), err.get("message")


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, timezone.utc)


def _info(row: dict) -> RunInfo:
    error_type, error_message = _error(row["error_json"])
    return RunInfo(
        id=row["run_id"],
        kind=row["kind"],
        name=row["name"],
        status=row["status"],
        created_at=_utc(row["created_at"]),
        updated_at=_utc(row["updated_at"]),
        cost_usd=row["cost_usd"],
        input_tokens=row["input_tokens"],
        output_tokens=row["output_tokens"],
        pending=list(row["pending"]),
        error_type=error_type,
        error_message=error_message,
        queue=row["queue"],
        fingerprint=row["fingerprint"],
        parent_id=row["parent_id"],
    )


def list_runs(
    *,
    status: str | Iterable[str] | None = None,
    kind: str | Iterable[str] | None = None,
    name: str | None = None,
    since: datetime | timedelta | str | None = None,
    until: datetime | timedelta | str | None = None,
    query: str | None = None,
    limit: int = 100,
    before: str | None = None,
) -> list[RunInfo]:
    """Runs of the store, newest first, filtered as `compose runs` filters
    them: `status`/`kind` one value or several, `since`/`until` bounds on
    the creation time, `query` a full-text search of span names and
    payloads. At most `limit` runs; the next page starts after the run
    `before`. Reads run rows only, so a page costs the same in a store of a
    million runs as in one of a thousand."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
        raise ConfigError(f"list_runs(limit=...) must be a positive int, got {limit!r}")
    if name is not None and not isinstance(name, str):
        raise ConfigError(f"list_runs(name=...) must be a str, got {type(name).__name__}")
    if before is not None and not isinstance(before, str):
        raise ConfigError(f"list_runs(before=...) must be a run id, got {before!r}")
    rows = _core.list_runs(
        _engine.get_store(),
        _choices(status, _STATUSES, "status"),
        _choices(kind, _KINDS, "kind"),
        name,
        _instant(since, "since"),
        _instant(until, "until"),
        query,
        limit,
        before,
    )
    return [_info(row) for row in rows]
