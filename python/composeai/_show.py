"""What the `compose` command line and the web UI (`compose ui`) both show:
the configured store, run filters, and the short forms of ages, durations
and costs. Like `cli`, it needs only the standard library, the compiled core
and `composeai.errors` at import time.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from . import _core
from .errors import ComposeError

# 0.11.0's choices omitted `cancelled`, so cancelled rows could not be
# selected (a defect the spec asks us to fix).
_STATUSES = ("completed", "failed", "paused", "running", "cancelled", "queued")
_KINDS = ("agent", "flow", "pipe", "aggregate", "graph")

_SINCE_RELATIVE = re.compile(r"([0-9]+)([dh])")
_SINCE_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")


def _state_dir() -> Path:
    return Path(os.environ.get("COMPOSE_DIR") or "./.compose")


def _store_target() -> tuple[str, str]:
    """`(kind, target)` of the configured store."""
    from . import _engine

    return _core.store_target(_engine.store_spec(), str(_state_dir() / "runs.db"))


def _db_path() -> str:
    """The configured store for the query commands: a SQLite file path or a
    PostgreSQL URL (every command reads either). The URL keeps its
    password for connecting; the core shows it redacted."""
    from . import _engine

    kind, target = _store_target()
    return _engine.store_spec() if kind == "postgresql" else target


def _parse_since(value: str) -> float:
    """`<N>d`, `<N>h` (before now) or `YYYY-MM-DD` (local midnight) as Unix seconds."""
    m = _SINCE_RELATIVE.fullmatch(value)
    if m:
        seconds = 86400 if m.group(2) == "d" else 3600
        return time.time() - int(m.group(1)) * seconds
    m = _SINCE_DATE.fullmatch(value)
    if m:
        from datetime import datetime

        try:
            return datetime(int(m.group(1)), int(m.group(2)), int(m.group(3))).timestamp()
        except (ValueError, OverflowError, OSError):
            pass
    raise ComposeError(f"invalid --since value '{value}': expected '<N>d', '<N>h', or 'YYYY-MM-DD'")


def _age(created_at: float, now: float) -> str:
    s = max(0, int(now - created_at))
    if s < 60:
        return f"{s}s ago"
    if s < 3600:
        return f"{s // 60}m ago"
    if s < 86400:
        return f"{s // 3600}h ago"
    return f"{s // 86400}d ago"


def _cost(cost_usd: float | None, complete: bool) -> str:
    if cost_usd is None:
        return "-"
    return f"{'' if complete else '≥'}${cost_usd:.4f}"


def _parked(rows: list[dict]) -> dict[str, str]:
    """The pending column of runs parked on a timer or a signal;
    other rows keep the 0.11.0 line."""
    ids = [r["run_id"] for r in rows if r["status"] == "paused"]
    if not ids:
        return {}
    out = {}
    for run_id, (key, wake_at, signal_name) in _core.parked_waits(_db_path(), ids).items():
        if key.startswith("__interrupt__:"):
            # Answered (`compose answer`): due for a worker now.
            out[run_id] = "  answered, due"
            continue
        wake = "" if wake_at is None else f" until {_core.clock_iso(wake_at)}"
        out[run_id] = f"  signal {signal_name}{wake}" if signal_name else f"  timer {wake.strip()}"
    return out


def _ambiguous(prefix: str, ids: list[str]) -> ComposeError:
    return ComposeError(
        f"run id prefix '{prefix}' is ambiguous -- it matches {len(ids)} runs: "
        f"{', '.join(ids)} -- use a longer prefix or the full id"
    )


def _duration(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


_GLYPHS = {
    "flow": "▶",
    "task": "•",
    "agent": "◆",
    "llm": "▸",
    "tool": "⚙",
    "pause": "⏸",
    "pipe": "→",
    "aggregate": "⇉",
    "graph": "◇",
}


def _bucket_cost(cost: float | None, incomplete: bool) -> str:
    if cost is None:
        return "-"
    return f"{'≥' if incomplete else ''}${cost:.4f}"


def _graph_store():
    """The store when the state directory has one (threads need no migration to list)."""
    kind, path = _store_target()
    if kind == "sqlite" and not os.path.exists(path):
        return None
    return _core.Store(_db_path())
