"""Schedules: `schedule()` stores a cron schedule of a flow in the
store, and `compose worker` fires it: each tick starts one run with the id
`sched:<name>:<tick>` (UTC, ISO 8601, seconds), so any number of workers on
one store start exactly one run per tick.

Cron patterns are parsed and evaluated by the core (the `croner` crate) in
the schedule's IANA time zone: the 5-field form (minute hour day-of-month
month day-of-week, with `*`, lists, ranges, steps and month/day names) and
`@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`. Across daylight saving
changes a local time that does not exist is skipped, and one that occurs
twice fires once (its first occurrence).

After every worker was down, `catchup` says what fires: `"latest"` the
latest missed tick only, `"none"` nothing (a tick counts as missed once it is
more than a second old), `"all"` each missed tick, oldest first, at most
1,000. The next fire is always computed from the latest tick passed, so a
clock that jumps never fires a tick twice.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from . import _codec, _core, _engine
from ._engine import FRAME
from ._lifecycle import _FLOWS, RunHandle
from .errors import ConfigError
from .flow import Flow, _args_payload

__all__ = ["Schedule", "list_schedules", "schedule", "scheduled_time"]

_CATCHUPS = ("latest", "none", "all")

# How recently a worker must have reported the flows it serves to count as live.
SERVED_WITHIN = 30.0


def _when(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, timezone.utc)


class Schedule:
    """A schedule as stored: `name`, `flow` (the flow's name), `cron`,
    `timezone`, `catchup`, `queue`, `paused`, `next_fire` and `last_fire`
    (aware UTC datetimes, or `None`), and `last_run_id`."""

    __slots__ = (
        "_args_json",
        "catchup",
        "cron",
        "flow",
        "last_fire",
        "last_run_id",
        "name",
        "next_fire",
        "paused",
        "queue",
        "timezone",
    )

    def __init__(self, row: dict) -> None:
        self._load(row)

    def _load(self, row: dict) -> None:
        self.name: str = row["name"]
        self.flow: str = row["flow"]
        self.cron: str = row["cron"]
        self.timezone: str = row["timezone"]
        self.catchup: str = row["catchup"]
        self.queue: str | None = row["queue"]
        self.paused: bool = bool(row["paused"])
        self.next_fire = _when(row["next_fire"])
        self.last_fire = _when(row["last_fire"])
        self.last_run_id: str | None = row["last_run_id"]
        self._args_json: str = row["args_json"]

    def __repr__(self) -> str:
        state = "paused" if self.paused else f"next_fire={self.next_fire}"
        return f"<Schedule {self.name!r} {self.cron!r} {self.timezone} flow={self.flow!r} {state}>"

    def _reload(self) -> None:
        rows = _core.schedules_list(_engine.get_store(), self.name)
        if rows:
            self._load(rows[0])

    def pause(self) -> None:
        """Stops firing until `resume()` (from any process)."""
        _core.schedule_set_paused(_engine.get_store(), self.name, True)
        self._reload()

    def resume(self) -> None:
        """Fires again from the next tick after now; ticks passed while
        paused are not fired."""
        _core.schedule_set_paused(_engine.get_store(), self.name, False)
        self._reload()

    def delete(self) -> None:
        """Removes the schedule; runs it started are kept."""
        _core.schedule_delete(_engine.get_store(), self.name)

    def trigger(self) -> RunHandle:
        """Starts one run now, with id `sched:<name>:manual:<ULID>`: in this
        process (the flow must be imported here), or enqueued on the
        schedule's queue."""
        flow = _FLOWS.get(self.flow)
        if flow is None:
            raise ConfigError(
                f"flow {self.flow!r} of schedule {self.name!r} is not registered in this process "
                "-- import the module that defines it (compose schedule trigger --import MODULE)"
            )
        payload = _codec.loads(self._args_json)
        args, kwargs = tuple(payload.get("args", ())), dict(payload.get("kwargs", {}))
        run_id = f"sched:{self.name}:manual:{_core.ulid()}"
        if self.queue is not None:
            return flow.start(*args, queue=self.queue, run_id=run_id, **kwargs)  # type: ignore[no-any-return]
        return flow.start(*args, run_id=run_id, **kwargs)  # type: ignore[no-any-return]


def schedule(
    flow: Any,
    cron: str,
    *,
    name: str | None = None,
    args: tuple = (),
    kwargs: dict | None = None,
    timezone: str = "UTC",
    catchup: str = "latest",
    queue: Any = None,
) -> Schedule:
    """Creates or updates (by `name`, default the flow's name) the schedule
    of `flow` on `cron` in `timezone`, stored in the store: calling it at
    import time in every process is safe. Re-declared with another pattern or
    zone, it is updated in place and its next fire recomputed; its paused
    state and last fire are kept. `compose worker` fires it."""
    if not isinstance(flow, Flow):
        raise ConfigError(f"schedule() takes a @flow, got {type(flow).__name__}")
    name = flow.name if name is None else name
    if not isinstance(name, str):
        raise ConfigError(f"schedule name must be a string, got {type(name).__name__}")
    if not isinstance(cron, str):
        raise ConfigError(f"cron must be a string such as '0 9 * * MON-FRI', got {cron!r}")
    if not isinstance(timezone, str):
        raise ConfigError(f"timezone must be an IANA zone name such as 'UTC', got {timezone!r}")
    if catchup not in _CATCHUPS:
        raise ConfigError(f'catchup must be "latest", "none" or "all", got {catchup!r}')
    if not isinstance(args, tuple):
        raise ConfigError(f"args must be a tuple, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ConfigError(f"kwargs must be a dict or None, got {type(kwargs).__name__}")
    queue_name = _queue_name(queue)
    _core.schedule_check(name, cron, timezone)
    args_json = _codec.dumps(_args_payload(args, kwargs or {}))
    row = _core.schedule_declare(
        _engine.get_store(), name, flow.name, cron, timezone, catchup, queue_name, args_json
    )
    return Schedule(row)


def _queue_name(queue: Any) -> str | None:
    if queue is None:
        return None
    from .queues import resolve

    return resolve(queue).name


def list_schedules() -> list[Schedule]:
    """Every schedule in the store, by name."""
    return [Schedule(row) for row in _core.schedules_list(_engine.get_store())]


def get_schedule(name: str) -> Schedule:
    """The schedule `name` (`ConfigError` when the store has none)."""
    rows = _core.schedules_list(_engine.get_store(), name)
    if not rows:
        raise ConfigError(
            f"no schedule named {name!r} -- `compose schedules` lists them; a schedule is "
            "created by compose.schedule(...)"
        )
    return Schedule(rows[0])


def scheduled_time() -> datetime | None:
    """Inside a run a schedule started, the tick it was started for (an aware
    UTC datetime; for `trigger()`, when it was triggered); elsewhere `None`.
    Read from the run's id, so a resumed run gets the same value."""
    frame = FRAME.get()
    if frame is None or frame.run is None:
        return None
    return _when(_core.scheduled_time_of(frame.run.run_id))


def unserved(flows: list[str]) -> set[str]:
    """Which of `flows` no live worker reported importing."""
    served = set(_core.served_flows(_engine.get_store(), SERVED_WITHIN))
    return {f for f in flows if f not in served}
