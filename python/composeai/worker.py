"""`compose worker`: the long-running loop that continues
due runs and executes queued ones.

The core says which runs are due (`due_runs`) and when the next timer falls
(`next_wake`), and claims queued runs of the worker's queues within their
limits (`queue_claim`); each run continues through the ordinary resume path,
parking on its next wait, on one of `concurrency` threads. Between passes
the worker sleeps in the core (GIL released) until the next timer, another
process's commit (a new signal, a parked or queued run: polled on SQLite, a
`LISTEN` hint on PostgreSQL), or a run of its own settling.
"""

from __future__ import annotations

import signal as _signal
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import IO, Any

from . import _core, _engine
from . import durable as _durable
from ._lifecycle import _FLOWS, NotDue
from .errors import ConfigError
from .queues import Queue

# How long in-flight runs may take to settle after SIGINT/SIGTERM before the
# worker gives up their leases and exits (they stay resumable).
STOP_GRACE = 2.0

# How often `--retention` prunes.
PRUNE_EVERY = 3600.0


def _flow_names() -> list[str]:
    return list(_FLOWS)


class Worker:
    def __init__(
        self,
        *,
        concurrency: int = 4,
        interval: float = 1.0,
        out: IO[str] | None = None,
        queues: tuple[Queue, ...] = (),
        retention: timedelta | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"--concurrency must be at least 1, got {concurrency}")
        if interval <= 0:
            raise ValueError(f"--interval must be positive, got {interval}")
        self.concurrency = concurrency
        self.interval = interval
        self.out = out if out is not None else sys.stdout
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._inflight: dict[str, Future] = {}
        self._skipped: set[str] = set()
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="composeai-worker")
        self.queues = queues
        # Queue of each in-flight run this worker claimed (worker_concurrency).
        self._claimed: dict[str, str] = {}
        # False once the store turned out to keep no durable waits.
        self._durable = True
        # Settled runs older than this are pruned once an hour (OPS-23).
        self.retention = retention
        self._next_prune = time.monotonic()

    # -- logging -------------------------------------------------------------

    def log(self, text: str) -> None:
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        with self._lock:
            self.out.write(f"{stamp} {text}\n")
            self.out.flush()

    # -- one run ------------------------------------------------------------

    def _execute(self, run_id: str, kind: str, name: str, reason: str) -> None:
        start = time.perf_counter()
        self.log(f"started  {run_id} {kind}={name} reason={reason}")
        try:
            run = _durable.continue_run(run_id)
            # Log text: the status, or what became of the run instead.
            outcome: str = run.status
            if run.status == "paused" and run.pending is not None:
                outcome = f"paused({run.pending.kind})"
        except NotDue:
            outcome = "skipped (settled by another process)"
        except Exception as exc:  # noqa: BLE001 -- logged; the worker carries on
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            outcome = f"failed ({type(exc).__name__}: {first_line})"
            row = _engine.get_store().get_run(run_id)
            if "is already being executed" in first_line:
                # Another process took it first; it is not due while that
                # process holds its lease.
                outcome = "busy (executed by another process)"
            elif row is not None and row["status"] not in ("failed", "completed", "cancelled"):
                # Refused before it ran (e.g. its flow's source changed): it
                # would be due again at once, so it is not retried here.
                outcome = f"skipped ({type(exc).__name__}: {first_line})"
                with self._lock:
                    self._skipped.add(run_id)
        except BaseException as exc:  # noqa: BLE001 -- a stopping worker's abandoned run
            outcome = f"interrupted ({type(exc).__name__})"
        ms = (time.perf_counter() - start) * 1000
        self.log(f"finished {run_id} {kind}={name} outcome={outcome} duration={ms:.0f}ms")
        with self._lock:
            self._inflight.pop(run_id, None)
            self._claimed.pop(run_id, None)
        _core.clock_poke()

    def _submit(self, due: list[tuple]) -> int:
        started = 0
        for run_id, kind, name, reason, module in due:
            with self._lock:
                if run_id in self._inflight or run_id in self._skipped:
                    continue
            if not _durable._continued(kind, reason):
                continue
            missing = _durable.missing_owner_message(run_id, kind, name, module)
            if missing is not None:
                self._skipped.add(run_id)
                print("compose worker: warning: " + missing, file=sys.stderr, flush=True)
                continue
            with self._lock:
                self._inflight[run_id] = self._pool.submit(
                    self._execute, run_id, kind, name, reason
                )
            started += 1
        return started

    # -- queues (STORE-21) ----------------------------------------------------

    def _claim(self, store: Any) -> float | None:
        """Claims queued runs for the free threads, queue by queue; returns
        when a rate-limited queue next has room, if one is full."""
        soonest = None
        # Only runs of flows imported here: another worker may have them.
        flows = sorted(_flow_names())
        for q in self.queues:
            with self._lock:
                room = self.concurrency - len(self._inflight)
                if q.worker_concurrency is not None:
                    mine = sum(1 for name in self._claimed.values() if name == q.name)
                    room = min(room, q.worker_concurrency - mine)
            if room <= 0:
                continue
            claimed = _core.queue_claim(
                store, q.name, room, flows, q.concurrency, q.rate_limit, q.priority
            )
            with self._lock:
                for run_id, _kind, _name in claimed:
                    self._claimed[run_id] = q.name
            self._submit([(r, k, n, f"queue:{q.name}", None) for r, k, n in claimed])
            with self._lock:
                # A claimed run skipped by `_submit` (its flow is not
                # imported here) takes no slot of this worker.
                for run_id, _kind, _name in claimed:
                    if run_id not in self._inflight:
                        self._claimed.pop(run_id, None)
            if q.rate_limit is not None and len(claimed) < room:
                slot = _core.queue_next_slot(store, q.name, q.rate_limit)
                if slot is not None and (soonest is None or slot < soonest):
                    soonest = slot
        return soonest

    def _due(self, store: Any, limit: int) -> list[tuple]:
        if not self._durable:
            return []
        try:
            return _core.due_runs(store, None, limit)
        except ConfigError:
            if store.kind == "sqlite":
                raise
            # This store keeps no durable waits: only queued runs come due.
            self._durable = False
            return []

    def _next_wake(self, store: Any) -> float | None:
        return _core.next_wake(store, _core.clock_now()) if self._durable else None

    # -- the loop -----------------------------------------------------------

    def once(self) -> None:
        """One pass over what is due now and what the queues let it claim;
        waits for those runs to settle."""
        store = _engine.get_store()
        self._prune_if_due()
        self._submit(self._due(store, 1_000_000))
        self._claim(store)
        self._drain(None)

    def _prune_if_due(self) -> None:
        if self.retention is None or time.monotonic() < self._next_prune:
            return
        self._next_prune = time.monotonic() + PRUNE_EVERY
        from .retention import delete_runs

        try:
            deleted = delete_runs(older_than=self.retention)
        except Exception as exc:  # noqa: BLE001 -- a failed prune is retried next hour
            self.log(f"prune failed: {type(exc).__name__}: {exc}")
            return
        if deleted:
            self.log(f"pruned   {deleted} runs last updated over {self.retention} ago")

    def serve(self) -> None:
        store = _engine.get_store()
        while not self.stopping.is_set():
            self._prune_if_due()
            with self._lock:
                free = self.concurrency - len(self._inflight)
            if free > 0:
                # Ask for enough rows to see past runs already in flight or skipped.
                limit = free + len(self._inflight) + len(self._skipped)
                self._submit(self._due(store, limit))
            slot = self._claim(store)
            with self._lock:
                busy = len(self._inflight) >= self.concurrency
            until = None if busy else self._next_wake(store)
            if slot is not None and not busy:
                # Wall time, as the store's claim times are.
                slot = _core.clock_now() + max(0.0, slot - time.time())
                until = slot if until is None else min(until, slot)
            deadline = time.monotonic() + self.interval
            while not self.stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                # Short slices so SIGINT/SIGTERM are handled promptly.
                if _core.wait_for_work(store, until, min(left, 0.2)):
                    break

    def _drain(self, timeout: float | None) -> bool:
        """Waits for in-flight runs; whether all settled."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                pending = list(self._inflight.values())
            if not pending:
                return True
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return False
            try:
                pending[0].result(timeout=left if left is None else min(left, 0.2))
            except Exception:  # noqa: BLE001, S110 -- outcomes are logged by _execute
                pass

    def stop(self) -> int:
        """Lets in-flight runs settle for a moment, then gives up the leases
        of those still executing; returns how many were left."""
        self.stopping.set()
        if self._drain(STOP_GRACE):
            self._pool.shutdown(wait=True)
            return 0
        store = _engine.get_store()
        with self._lock:
            left = sorted(self._inflight)
        _core.release_leases(store)
        for run_id in left:
            self.log(f"stopped  {run_id} left resumable")
        return len(left)


def declared_queues(names: list[str]) -> tuple[Queue, ...]:
    """The `Queue` declarations of `compose worker --queue NAME ...`."""
    from .queues import declared

    out = []
    for name in names:
        q = declared(name)
        if q is None:
            raise ConfigError(
                f"queue {name!r} is not declared in this process -- declare it with "
                f"composeai.Queue({name!r}, ...) in a module passed with --import"
            )
        if q not in out:
            out.append(q)
    return tuple(out)


def run_worker(
    imports: list[str],
    *,
    once: bool,
    interval: float,
    concurrency: int,
    out=None,
    queues: tuple[str, ...] = (),
    retention: timedelta | None = None,
) -> int:
    """The `compose worker` command; returns the exit code."""
    import importlib

    for module in imports:
        importlib.import_module(module)
    worker = Worker(
        concurrency=concurrency,
        interval=interval,
        out=out,
        queues=declared_queues(list(queues)),
        retention=retention,
    )
    if once:
        worker.once()
        worker._pool.shutdown(wait=True)
        return 0

    def handle(signum, _frame):
        worker.stopping.set()
        _core.clock_poke()

    if threading.current_thread() is threading.main_thread():
        _signal.signal(_signal.SIGINT, handle)
        _signal.signal(_signal.SIGTERM, handle)
    worker.log(
        f"worker ready pid={__import__('os').getpid()} concurrency={concurrency} "
        + "".join(f"queue={q.name} " for q in worker.queues)
        + f"store={_engine.get_store().path}"
    )
    worker.serve()
    left = worker.stop()
    worker.log("worker stopped")
    _engine.get_store().flush()
    if left:
        # Threads still inside user code cannot be stopped; their runs'
        # leases are released, so exiting now leaves them resumable.
        sys.stdout.flush()
        sys.stderr.flush()
        import os

        os._exit(0)
    return 0
