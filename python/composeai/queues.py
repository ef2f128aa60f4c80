"""Queues: `Queue` declares one; `Flow.start(queue=…)`
and `Queue.enqueue` create `queued` runs that `compose worker --queue NAME`
executes.

A queue's limits are enforced by the core when a worker claims runs, in the
claim's own transaction, so they hold across every worker process and
machine sharing the store: `concurrency` (runs of the queue executing at
once), `rate_limit=(n, seconds)` (claims per window) and the claim order
(`priority=True`: lower `priority` values first, then FIFO).
`worker_concurrency` bounds one worker process.
"""

from __future__ import annotations

import threading
from typing import Any

from . import _codec, _core, _engine
from ._lifecycle import OWNERS, REGISTRIES, RunHandle, queue_not_declared
from .errors import ConfigError
from .flow import Flow, _args_payload

__all__ = ["Queue"]

_QUEUES: dict[str, Queue] = {}
_LOCK = threading.Lock()


def _positive_int(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what} must be a positive integer or None, got {value!r}")
    return value


def _rate_limit(value: Any, name: str) -> tuple[int, float] | None:
    if value is None:
        return None
    ok = (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], int)
        and not isinstance(value[0], bool)
        and value[0] >= 1
        and isinstance(value[1], (int, float))
        and not isinstance(value[1], bool)
        and value[1] > 0
    )
    if not ok:
        raise ConfigError(
            f"Queue {name!r}: rate_limit must be a tuple (n, seconds) with n a positive integer "
            f"and seconds a positive number, got {value!r}"
        )
    return (value[0], float(value[1]))


class Queue:
    """Declares a named queue of flow runs that workers execute.

    `flow_fn.start(*args, queue=name)` (or `enqueue(flow_fn, *args)`) adds a
    run; `compose worker --queue NAME` executes them. A queue is declared once
    per process; declaring the same name with other limits is a
    `ConfigError`.

    Args:
        name: the queue's name.
        concurrency: runs of this queue executing at once, across all workers.
        worker_concurrency: runs of this queue executing at once per worker.
        priority: claim lower `priority=` values first (else in arrival order).
        rate_limit: `(n, seconds)`: at most `n` starts per window, across all
            workers.
    """

    def __init__(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        worker_concurrency: int | None = None,
        priority: bool = False,
        rate_limit: tuple[int, float] | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a queue name must be a non-empty string, got {name!r}")
        if not isinstance(priority, bool):
            raise ConfigError(f"Queue {name!r}: priority must be True or False, got {priority!r}")
        self.name = name
        self.concurrency = _positive_int(concurrency, f"Queue {name!r}: concurrency")
        self.worker_concurrency = _positive_int(
            worker_concurrency, f"Queue {name!r}: worker_concurrency"
        )
        self.priority = priority
        self.rate_limit = _rate_limit(rate_limit, name)
        with _LOCK:
            existing = _QUEUES.get(name)
            if existing is not None and existing._limits() != self._limits():
                raise ConfigError(
                    f"queue {name!r} is already declared with {existing._describe()} -- a queue "
                    f"is declared once per process; this declaration has {self._describe()}"
                )
            if existing is None:
                _QUEUES[name] = self

    def _limits(self) -> tuple:
        return (self.concurrency, self.worker_concurrency, self.priority, self.rate_limit)

    def _describe(self) -> str:
        return (
            f"concurrency={self.concurrency!r}, worker_concurrency={self.worker_concurrency!r}, "
            f"priority={self.priority!r}, rate_limit={self.rate_limit!r}"
        )

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, {self._describe()})"

    def enqueue(self, flow: Any, *args: Any, **kwargs: Any):
        """`flow.start(*args, queue=self, **kwargs)`: a `queued` run's `RunHandle`."""
        if not isinstance(flow, Flow):
            raise TypeError(f"enqueue() takes a @flow, got {type(flow).__name__}")
        return flow.start(*args, queue=self, **kwargs)


def declared(name: str) -> Queue | None:
    return _QUEUES.get(name)


def resolve(queue: Any) -> Queue:
    """The declared `Queue` named by `queue` (a `Queue` or its name)."""
    if isinstance(queue, Queue):
        return _QUEUES.get(queue.name, queue)
    if isinstance(queue, str):
        found = _QUEUES.get(queue)
        if found is None:
            raise ConfigError(queue_not_declared(queue))
        return found
    raise TypeError(f"queue must be a Queue or a queue name, got {type(queue).__name__}")


def start_queued(
    flow_obj: Any, args: tuple, kwargs: dict, budget: Any, queue: Any, priority: Any, dedup_id: Any
):
    """`Flow.start(queue=…)`: the run row is created `queued`; nothing executes here."""
    q = resolve(queue)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ConfigError(f"priority must be an integer, got {priority!r}")
    if dedup_id is not None and (not isinstance(dedup_id, str) or not dedup_id):
        raise ConfigError(f"dedup_id must be a non-empty string or None, got {dedup_id!r}")
    args_json = _codec.dumps(_args_payload(args, kwargs))
    run_id = _core.queue_enqueue(
        _engine.get_store(),
        "flow",
        flow_obj.name,
        q.name,
        flow_obj.fingerprint,
        args_json,
        _engine.budget_json(budget),
        priority,
        dedup_id,
        flow_obj._module,
    )
    return RunHandle(run_id)


OWNERS["queue"] = start_queued
REGISTRIES.append(_QUEUES)
