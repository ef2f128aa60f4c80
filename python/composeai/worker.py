"""`compose worker`: the long-running loop that continues
due runs and executes queued ones.

The core says which runs are due (`due_runs`) and when the next timer falls
(`next_wake`), and claims queued runs of the worker's queues within their
limits (`queue_claim`); each run continues through the ordinary resume path,
parking on its next wait, on one of `concurrency` threads. Between passes
the worker sleeps in the core (GIL released) until the next timer, another
process's commit (a new signal, a parked or queued run: polled on SQLite, a
`LISTEN` hint on PostgreSQL), or a run of its own settling.

A worker continues only the runs of the code it imported: the
core's due and claim queries compare each flow run's stored fingerprint
with the imported flow's, so runs started on other code are left to the
workers running that code. With `--upgrade` it first checks each
such run it could otherwise not claim against its own code, replaying the
journal without executing anything, and takes over the ones that replay
cleanly.
"""

from __future__ import annotations

import signal as _signal
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import IO, Any

from . import _codec, _core, _engine
from . import durable as _durable
from ._lifecycle import _FLOWS, NotDue, flow_versions
from .errors import ConfigError, StoreError, StoreUnavailableError
from .queues import Queue

# How often a worker reports the flows it serves (seconds).
SERVE_EVERY = 5.0

# How long in-flight runs may take to settle after SIGINT/SIGTERM before the
# worker gives up their leases and exits (they stay resumable).
STOP_GRACE = 10.0

# How long a pass waits before looking again after the store stayed
# unreachable past COMPOSE_STORE_OUTAGE_SECONDS.
_OUTAGE_PAUSE = 1.0

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
        grace: float = STOP_GRACE,
        upgrade: bool = False,
        retention: timedelta | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"--concurrency must be at least 1, got {concurrency}")
        if interval <= 0:
            raise ValueError(f"--interval must be positive, got {interval}")
        if grace < 0:
            raise ValueError(f"--grace must be 0 or more seconds, got {grace}")
        self.grace = grace
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
        # When this worker last reported the flows it serves (monotonic).
        self._served_at = float("-inf")
        # `--upgrade`: runs found not to replay under this code, by the
        # fingerprint they were checked at; they are not checked again
        # (a run skipped for a race with another process is).
        self.upgrade = upgrade
        self._not_upgraded: set[tuple[str, str | None]] = set()
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
        except StoreError as exc:
            # The store failed under the run: it is left resumable (running,
            # its lease to lapse) and comes due again once the store is back.
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            outcome = f"left resumable ({type(exc).__name__}: {first_line})"
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
                store,
                q.name,
                room,
                flows,
                q.concurrency,
                q.rate_limit,
                q.priority,
                [_FLOWS[name].fingerprint for name in flows],
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
            return _core.due_runs(store, None, limit, flow_versions())
        except (ConfigError, StoreError) as exc:
            if store.kind == "sqlite" or isinstance(exc, StoreUnavailableError):
                raise
            # This store keeps no durable waits: only queued runs come due.
            self._durable = False
            return []

    def _expire(self, store: Any) -> None:
        """Fails the paused and queued runs whose deadline passed."""
        if not self._durable:
            return
        for run_id in _core.expire_runs(store):
            self.log(f"expired  {run_id} outcome=failed (FlowTimeoutError: its deadline passed)")

    # -- schedules (OPS-11) -----------------------------------------------------

    def _fire_schedules(self, store: Any) -> None:
        """Starts the runs of every due tick of the schedules of flows
        imported here, then moves each schedule on. A tick's run id decides
        which worker's start creates it; the others find it and move on."""
        for row, run_ids, ticks, next_fire in _core.schedules_due(store, _flow_names()):
            moved_on = True
            for run_id in run_ids:
                try:
                    self._fire(store, row, run_id)
                except ConfigError as exc:
                    self.log(f"fired    {run_id} outcome=refused ({exc})")
                except Exception as exc:  # noqa: BLE001 -- logged; the tick is fired again
                    self.log(f"fired    {run_id} outcome=failed ({type(exc).__name__}: {exc})")
                    moved_on = False
            if not moved_on:
                continue
            last = (ticks[-1], run_ids[-1]) if ticks else (None, None)
            _core.schedule_advance(store, row["name"], row["next_fire"], next_fire, *last)

    def _fire(self, store: Any, row: dict, run_id: str) -> None:
        flow = _FLOWS[row["flow"]]
        if row["queue"] is not None:
            _core.queue_enqueue(
                store,
                "flow",
                flow.name,
                row["queue"],
                flow.fingerprint,
                row["args_json"],
                None,
                0,
                None,
                flow._module,
                run_id,
                flow.timeout,
            )
            self.log(f"fired    {run_id} flow={flow.name} queue={row['queue']}")
            return
        attempt, _row, _live = store.start_keyed(
            "flow",
            flow.name,
            flow.fingerprint,
            row["args_json"],
            None,
            run_id,
            flow.timeout,
            flow._module,
        )
        if attempt is None:
            return  # another worker started this tick's run
        self.log(f"fired    {run_id} flow={flow.name}")
        with self._lock:
            self._inflight[run_id] = self._pool.submit(
                self._execute_started, attempt, flow, row["args_json"]
            )

    def _execute_started(self, attempt: Any, flow: Any, args_json: str) -> None:
        """Executes a run this worker just created, parking on its next wait."""
        run_id = attempt.run_id
        start = time.perf_counter()
        self.log(f"started  {run_id} flow={flow.name} reason=schedule")
        try:
            payload = _codec.loads(args_json)
            run = flow._drive(
                _engine.RunState(attempt, flow.name, True),
                tuple(payload.get("args", ())),
                dict(payload.get("kwargs", {})),
            )
            outcome = run.status
        except Exception as exc:  # noqa: BLE001 -- logged; the run is failed
            outcome = (
                f"failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
            )
        except BaseException as exc:  # noqa: BLE001 -- a stopping worker's abandoned run
            outcome = f"interrupted ({type(exc).__name__})"
        ms = (time.perf_counter() - start) * 1000
        self.log(f"finished {run_id} flow={flow.name} outcome={outcome} duration={ms:.0f}ms")
        with self._lock:
            self._inflight.pop(run_id, None)
        _core.clock_poke()

    def _serve(self, store: Any) -> None:
        """Reports the flows imported here, at most every few seconds, so that
        `compose schedules` can name a schedule no live worker serves."""
        now = time.monotonic()
        if now - self._served_at >= SERVE_EVERY:
            self._served_at = now
            _core.serve_flows(store, _flow_names())

    def _next_fire(self, store: Any) -> float | None:
        return _core.schedules_next_fire(store, _flow_names())

    # -- upgrades (OPS-3) ------------------------------------------------------

    def _upgrade_pass(self, store: Any) -> None:
        """Checks each run of an imported flow started on other code that
        this worker could otherwise continue (due, or queued on one of its
        queues) against the imported code; re-stamps the ones whose journal
        replays cleanly, so this pass continues them. A run that diverges is
        left to the workers of its own code, logged once."""
        from . import _upgrade

        versions = flow_versions()
        if not versions:
            return
        found: list[tuple[str, str | None]] = []
        if self._durable:
            limit = 100 + len(self._not_upgraded)
            try:
                due = _core.due_runs(store, None, limit, versions, True)
            except ConfigError:
                due = []
            found += [(r[0], None) for r in due if r[1] == "flow"]
        if self.queues:
            mine = {q.name for q in self.queues}
            found += [
                (c[0], c[3])
                for c in _core.upgrade_candidates(store, versions)
                if c[2] == "queued" and c[4] in mine
            ]
        for run_id, _fp in found:
            row = store.get_run(run_id)
            if row is None or (run_id, row["fingerprint"]) in self._not_upgraded:
                continue
            with self._lock:
                if run_id in self._inflight:
                    continue
            try:
                report = _upgrade.upgrade_one(store, run_id)
            except Exception as exc:  # noqa: BLE001 -- logged; the worker carries on
                self._not_upgraded.add((run_id, row["fingerprint"]))
                self.log(f"not upgraded {run_id} flow={row['name']}: {type(exc).__name__}: {exc}")
                continue
            if report.outcome == "upgraded":
                # Another worker of the old code may have listed it already;
                # it now finds the run on other code and skips it.
                self._skipped.discard(run_id)
                self.log(
                    f"upgraded {run_id} flow={report.flow} "
                    f"{_upgrade._short(report.from_fingerprint)} -> "
                    f"{_upgrade._short(report.to_fingerprint)}"
                )
                continue
            if report.outcome == "diverged":
                why = (
                    f"diverged at {report.key}: recorded {report.recorded}, called {report.called}"
                )
            else:
                why = f"skipped: {report.reason}"
            if _upgrade.lasting(report):
                self._not_upgraded.add((run_id, row["fingerprint"]))
            self.log(
                f"not upgraded {run_id} flow={report.flow}: {why} -- left for the workers of "
                f"its code version {_upgrade._short(row['fingerprint'])}"
            )

    def _next_wake(self, store: Any) -> float | None:
        return _core.next_wake(store, _core.clock_now()) if self._durable else None

    # -- the loop -----------------------------------------------------------

    def once(self) -> None:
        """One pass over what is due now and what the queues let it claim;
        waits for those runs to settle."""
        store = _engine.get_store()
        self._expire(store)
        self._fire_schedules(store)
        self._prune_if_due()
        if self.upgrade:
            self._upgrade_pass(store)
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
            try:
                self._pass(store)
            except StoreUnavailableError:
                # Still unreachable past COMPOSE_STORE_OUTAGE_SECONDS: the
                # outage is logged by the watcher; the worker keeps waiting.
                self.stopping.wait(_OUTAGE_PAUSE)

    def _pass(self, store: Any) -> None:
        """Starts what is due and what the queues let it claim, then sleeps
        until more could be (at most `interval`)."""
        self._expire(store)
        self._serve(store)
        self._fire_schedules(store)
        self._prune_if_due()
        with self._lock:
            free = self.concurrency - len(self._inflight)
        if free > 0 and self.upgrade:
            self._upgrade_pass(store)
        if free > 0:
            # Ask for enough rows to see past runs already in flight or skipped.
            limit = free + len(self._inflight) + len(self._skipped)
            self._submit(self._due(store, limit))
        slot = self._claim(store)
        with self._lock:
            busy = len(self._inflight) >= self.concurrency
        until = None if busy else self._next_wake(store)
        fire = self._next_fire(store)
        if fire is not None:
            # A schedule fires even while every thread is busy.
            until = fire if until is None else min(until, fire)
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

    # -- store outages (STORE-40) ---------------------------------------------

    def watch_outages(self) -> threading.Thread:
        """Logs one line when the store becomes unreachable and one when it
        is back, from a daemon thread that sleeps in the core until the
        store's reachability changes."""

        def watch() -> None:
            seen, down, _ = _core.store_outage_wait(0, 0.0)
            if down is not None:
                self._log_down(down)
            while not self.stopping.is_set():
                generation, now_down, back = _core.store_outage_wait(seen, 5.0)
                if generation == seen:
                    continue
                seen = generation
                if now_down is not None and down is None:
                    self._log_down(now_down)
                elif now_down is None and down is not None and back is not None:
                    self.log(f"store reachable again after {back[1]:.1f}s: continuing")
                down = now_down

        thread = threading.Thread(target=watch, name="composeai-outage-log", daemon=True)
        thread.start()
        return thread

    def _log_down(self, down: tuple[float, str, str]) -> None:
        import os

        limit = os.environ.get("COMPOSE_STORE_OUTAGE_SECONDS", "").strip() or "300"
        self.log(
            f"store unreachable: {down[2]} -- runs wait and continue when it is back "
            f"(retrying for up to {limit}s, COMPOSE_STORE_OUTAGE_SECONDS)"
        )

    def stop(self) -> int:
        """Lets in-flight runs settle for up to `grace` seconds, then gives
        up the leases of those still executing so another worker continues
        them at once; returns how many were left."""
        self.stopping.set()
        if self._drain(self.grace):
            self._pool.shutdown(wait=True)
            return 0
        store = _engine.get_store()
        with self._lock:
            left = sorted(self._inflight)
        if _store_down():
            # Nothing can be released while the server is away: the leases
            # lapse after COMPOSE_LEASE_SECONDS instead.
            self.log("store unreachable: leases are left to lapse")
        else:
            _core.release_leases(store)
        for run_id in left:
            self.log(f"stopped  {run_id} left resumable")
        return len(left)


def _store_down() -> bool:
    """Whether this process finds its store unreachable right now."""
    return _core.store_outage_wait(0, 0.0)[1] is not None


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
    grace: float = STOP_GRACE,
    upgrade: bool = False,
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
        grace=grace,
        upgrade=upgrade,
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
    # Before the store is first opened: a server away at start is logged too.
    worker.watch_outages()
    worker.log(
        f"worker ready pid={__import__('os').getpid()} concurrency={concurrency} "
        + "".join(f"queue={q.name} " for q in worker.queues)
        + ("upgrade=on " if upgrade else "")
        + f"store={_engine.get_store().path}"
    )
    worker.serve()
    left = worker.stop()
    _core.serve_flows(_engine.get_store(), [])
    worker.log("worker stopped")
    if not _store_down():
        _engine.get_store().flush()
    if left:
        # Threads still inside user code cannot be stopped; their runs'
        # leases are released, so exiting now leaves them resumable.
        sys.stdout.flush()
        sys.stderr.flush()
        import os

        os._exit(0)
    return 0
