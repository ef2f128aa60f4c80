"""Dedicated threads for sync bodies, reused once they finish.

Every sync stage that must leave the calling thread (a timeout, an async
caller, a parallel branch) gets a thread of its own at once: there is no
bound and no queueing, so a body that blocks or calls back into
the engine can never starve another. A thread whose body returned waits
briefly for the next body instead of exiting: reused while work keeps
coming, gone within a second once it stops.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

IDLE_SECONDS = 0.5

_lock = threading.Lock()
_idle: list[_Worker] = []


class _Worker:
    __slots__ = ("_job", "_name", "_ready")

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._job: Callable[[], None] | None = None
        self._name: str | None = None

    def start(self, job: Callable[[], None], name: str) -> None:
        self._job = job
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def give(self, job: Callable[[], None], name: str) -> None:
        self._job = job
        self._name = name
        self._ready.set()

    def _serve(self) -> None:
        while True:
            job, self._job = self._job, None
            if self._name is not None:
                # Named after what it runs, for thread dumps.
                threading.current_thread().name = self._name
            if job is not None:
                job()
            self._ready.clear()
            with _lock:
                _idle.append(self)
            if self._ready.wait(IDLE_SECONDS):
                continue
            with _lock:
                if self in _idle:
                    _idle.remove(self)
                    return
            # Handed a job between the timeout and taking the lock.
            self._ready.wait()


def spawn(job: Callable[[], None], name: str) -> None:
    """Runs `job` (which must not raise) on a thread of its own, named `name`."""
    with _lock:
        worker = _idle.pop() if _idle else None
    if worker is None:
        _Worker().start(job, name)
    else:
        worker.give(job, name)
