"""What a run publishes for readers in other processes: events (the latest
value per key) and durable streams (every value, in order).

Inside a flow body (or a task of a flow) `set_event`, `write_stream` and
`close_stream` are journaled steps: the value and the journal row commit
together before the call returns, and a replayed body writes nothing again.
From any process `get_event`, `get_events`, `read_stream` and `aread_stream`
read them, waiting on the store's wake-up mechanism (notifications on
PostgreSQL, the change check on SQLite) rather than polling in a loop.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

from . import _codec, _core, _engine
from ._engine import FRAME
from .errors import ConfigError

__all__ = [
    "aread_stream",
    "close_stream",
    "get_event",
    "get_events",
    "read_stream",
    "set_event",
    "write_stream",
]

# Values a read asks the store for at once.
_CHUNK = 512
# The longest a read waits inside the core before Python looks again (an
# interrupt reaches the caller between two waits).
_SLICE = 1.0


def _check_key(key: Any, what: str) -> str:
    if not isinstance(key, str):
        raise ConfigError(f"{what}: the key must be a str, got {type(key).__name__}")
    if not key:
        raise ConfigError(f"{what}: the key must be a non-empty string")
    return key


def _check_run_id(run_id: Any, what: str) -> str:
    if not isinstance(run_id, str) or not run_id:
        raise ConfigError(f"{what}: run_id must be a non-empty str, got {run_id!r}")
    return run_id


def _seconds(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        return max(value.total_seconds(), 0.0)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return max(float(value), 0.0)
    raise TypeError(f"{what}: timeout must be a number of seconds or a timedelta")


def _publish(what: str, name: str, journal_value: str, item_json: str) -> None:
    frame = FRAME.get()
    if frame is None or frame.run is None:
        raise ConfigError(
            f"{what}() only works inside a @flow body or a task of a flow -- none is active here"
        )
    attempt = frame.run.attempt
    key, hit = attempt.reserve(frame.scope, what, frame.fence, what)
    if hit is not None:
        return
    _core.attempt_publish(attempt, key, journal_value, _KIND[what], name, item_json, frame.fence)


_KIND = {"set_event": "event", "write_stream": "append", "close_stream": "close"}


def set_event(key: str, value: Any) -> None:
    """Publishes `value` as the latest value of event `key` of the current
    run, journaled (a replayed body does not write it again). Readers in any
    process see it with `get_event`."""
    _check_key(key, "set_event")
    encoded = _codec.dumps(value, f"set_event({key!r})")
    _publish("set_event", key, encoded, encoded)


def write_stream(key: str, value: Any) -> None:
    """Appends `value` to stream `key` of the current run, committed before
    it returns; a replayed body does not append again."""
    _check_key(key, "write_stream")
    encoded = _codec.dumps(value, f"write_stream({key!r})")
    _publish("write_stream", key, _codec.dumps(key), encoded)


def close_stream(key: str) -> None:
    """Ends stream `key` of the current run: readers stop after its last
    value, and later writes to it raise `ConfigError`."""
    _check_key(key, "close_stream")
    _publish("close_stream", key, _codec.dumps(key), "null")


def get_event(
    run_id: str, key: str, *, timeout: float | timedelta | None = None, default: Any = None
) -> Any:
    """The latest value of event `key` of run `run_id`. When it is not set,
    waits up to `timeout` seconds for it (no wait when `None`), then
    returns `default`; a run that completed, failed or was cancelled
    without setting it returns `default` at once. An unknown run id raises
    `ConfigError`."""
    _check_run_id(run_id, "get_event")
    _check_key(key, "get_event")
    limit = _seconds(timeout, "get_event") or 0.0
    store = _engine.get_store()
    deadline = time.monotonic() + limit
    while True:
        left = max(deadline - time.monotonic(), 0.0)
        state, value = _core.event_wait(store, run_id, key, min(left, _SLICE))
        if value is not None:
            return _codec.loads(value)
        if state != "waiting" or time.monotonic() >= deadline:
            return default


def get_events(run_id: str) -> dict[str, Any]:
    """Every event of run `run_id`: its latest value by key."""
    _check_run_id(run_id, "get_events")
    rows = _core.run_events(_engine.get_store(), run_id)
    return {key: _codec.loads(value) for key, value in rows}


def _start_read(run_id: Any, key: Any, what: str, timeout: Any):
    _check_run_id(run_id, what)
    _check_key(key, what)
    limit = _seconds(timeout, what)
    store = _engine.get_store()
    # An unknown run fails here, not at the first value.
    if store.get_run(run_id) is None:
        raise ConfigError(
            f"{what}: no run found with run_id {run_id!r} -- check the id (compose runs lists "
            "them) and that this process uses the run's store (COMPOSE_DIR / COMPOSE_STORE)"
        )
    return store, limit


def read_stream(
    run_id: str, key: str, *, timeout: float | timedelta | None = None
) -> Iterator[Any]:
    """Every value of stream `key` of run `run_id` from the first, then each
    new one as it is committed; ends when the stream is closed or the run
    settles (completes, fails, is cancelled, or pauses for an answer: a run
    parked on a timer or a signal is waited through), or when no value
    arrived for `timeout` seconds (no limit when `None`)."""
    store, limit = _start_read(run_id, key, "read_stream", timeout)
    return _read(store, run_id, key, limit)


def _read(store: Any, run_id: str, key: str, limit: float | None) -> Iterator[Any]:
    after = 0
    quiet_since = time.monotonic()
    while True:
        wait = _SLICE
        if limit is not None:
            wait = min(wait, max(limit - (time.monotonic() - quiet_since), 0.0))
        values, done = _core.stream_read(store, run_id, key, after, _CHUNK, wait)
        for seq, value in values:
            after = seq
            yield _codec.loads(value)
        if values:
            quiet_since = time.monotonic()
        if done:
            return
        if limit is not None and time.monotonic() - quiet_since >= limit:
            return


def aread_stream(
    run_id: str, key: str, *, timeout: float | timedelta | None = None
) -> AsyncIterator[Any]:
    """`read_stream` as an async iterator: the waits happen off the event
    loop."""
    store, limit = _start_read(run_id, key, "aread_stream", timeout)
    return _aread(store, run_id, key, limit)


async def _aread(store: Any, run_id: str, key: str, limit: float | None) -> AsyncIterator[Any]:
    after = 0
    quiet_since = time.monotonic()
    while True:
        wait = _SLICE
        if limit is not None:
            wait = min(wait, max(limit - (time.monotonic() - quiet_since), 0.0))
        values, done = await _engine.off_loop(
            lambda future, *args: _core.astream_read(store, future, *args),
            run_id,
            key,
            after,
            _CHUNK,
            wait,
        )
        for seq, value in values:
            after = seq
            yield _codec.loads(value)
        if values:
            quiet_since = time.monotonic()
        if done:
            return
        if limit is not None and time.monotonic() - quiet_since >= limit:
            return
