"""D1-D4: durable primitives under `compose worker`.

D1 timer lateness: N parked runs due over ~2 s; a worker process continues
   each; lateness = the first step after the sleep started - its wake time
   (p50/p99 in ms).
D2 signal latency: a run blocked on `receive` in another process; the time
   from a signal's commit to the run's next step (p50/p99 in ms, SQLite).
D3 a worker process idle over 10,000 parked sleeping runs: its thread count
   and RSS (MB).
D4 worker throughput: runs of 3 steps each, parked on a passed timer,
   continued by one worker (`Worker.once`, in this process) per second.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time

from _common import emit, parser, sync_mode, temp_dir

FLOWS = """\
import time

import composeai as compose
from composeai import flow, task


@task
def stamp() -> float:
    return time.time()


@task
def add(x: int, y: int) -> int:
    return x + y


@flow
def timed(seconds: float) -> float:
    compose.sleep(seconds)
    return stamp()


@flow
def listen(n: int) -> int:
    for _ in range(n):
        compose.receive("ping")
        stamp()
    return n


@flow
def dormant() -> None:
    compose.sleep(86400)


@flow
def three(x: int) -> int:
    compose.sleep(0.001)
    return add(add(add(x, 1), 2), 3)
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Env:
    """One store directory with the bench's flow module importable."""

    def __init__(self, tag: str, code_dir: str) -> None:
        self.dir = temp_dir(tag)
        self.code_dir = code_dir

    def activate(self) -> None:
        from composeai.runs import reset_default

        os.environ["COMPOSE_DIR"] = self.dir
        reset_default()

    def env(self) -> dict:
        env = dict(os.environ)
        env["COMPOSE_DIR"] = self.dir
        env["PYTHONPATH"] = os.pathsep.join(p for p in (self.code_dir, env.get("PYTHONPATH")) if p)
        return env

    def worker(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "composeai.cli", "worker", "--import", "dbench", *args],
            env=self.env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def db(self) -> sqlite3.Connection:
        return sqlite3.connect(os.path.join(self.dir, "runs.db"), timeout=30)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_for(predicate, timeout: float = 120.0, what: str = "") -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def d1(code_dir: str, n: int) -> dict:
    import json
    from datetime import datetime

    import dbench

    env = Env("d1", code_dir)
    env.activate()
    proc = env.worker("--concurrency", "4")
    time.sleep(1.0)  # the worker is up and idle before the first timer
    ids = [dbench.timed.run(1.0 + 2.0 * i / n, wait=False).id for i in range(n)]
    db = env.db()
    wait_for(
        lambda: (
            db.execute("SELECT count(*) FROM runs WHERE status = 'completed'").fetchone()[0] == n
        ),
        what="D1 runs",
    )
    stop(proc)
    late = []
    for run_id in ids:
        rows = dict(
            db.execute(
                "SELECT j.step_key, j.value_json FROM journal j JOIN runs r ON r.rid = j.rid "
                "WHERE r.run_id = ?",
                (run_id,),
            ).fetchall()
        )
        wake = datetime.fromisoformat(json.loads(rows["sleep#1"])).timestamp()
        late.append((float(rows["stamp#1"]) - wake) * 1e3)
    db.close()
    return {
        "timers": n,
        "lateness_p50_ms": round(pct(late, 0.5), 2),
        "lateness_p99_ms": round(pct(late, 0.99), 2),
    }


def d2(code_dir: str, n: int) -> dict:
    env = Env("d2", code_dir)
    env.activate()
    from composeai import durable

    child = subprocess.Popen(
        [sys.executable, "-c", f"import dbench; dbench.listen.run({n})"],
        env=env.env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    db = env.db()

    def journal_count(prefix: str) -> int:
        return db.execute(
            "SELECT count(*) FROM journal WHERE step_key LIKE ?", (prefix + "%",)
        ).fetchone()[0]

    wait_for(lambda: os.path.exists(os.path.join(env.dir, "runs.db")) and _has_run(db), what="D2")
    run_id = db.execute("SELECT run_id FROM runs").fetchone()[0]
    latencies = []
    for k in range(n):
        wait_for(lambda: _blocked(db), what="the run to block")
        durable.signal(run_id, "ping", k)
        sent = time.time()
        wait_for(lambda k=k: journal_count("stamp#") > k, what="the run to continue")
        stamp = float(
            db.execute(
                "SELECT value_json FROM journal WHERE step_key = ?", (f"stamp#{k + 1}",)
            ).fetchone()[0]
        )
        latencies.append((stamp - sent) * 1e3)
    child.wait(60)
    db.close()
    return {
        "signals": n,
        "latency_p50_ms": round(pct(latencies, 0.5), 2),
        "latency_p99_ms": round(pct(latencies, 0.99), 2),
    }


def _has_run(db: sqlite3.Connection) -> bool:
    try:
        return db.execute("SELECT count(*) FROM runs").fetchone()[0] > 0
    except sqlite3.OperationalError:
        return False


def _blocked(db: sqlite3.Connection) -> bool:
    # A blocked receive has recorded when its wait began.
    return db.execute("SELECT count(*) FROM timers").fetchone()[0] > 0


def d3(code_dir: str, n: int) -> dict:
    import dbench

    env = Env("d3", code_dir)
    env.activate()
    for _ in range(n):
        dbench.dormant.run(wait=False)
    proc = env.worker("--concurrency", "8")
    time.sleep(3.0)  # imports, a first pass over the store, then idle
    with open(f"/proc/{proc.pid}/status") as f:
        status = f.read()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss_mb = int(fields["VmRSS"].split()[0]) / 1024
    threads = int(fields["Threads"])
    stop(proc)
    return {"parked_runs": n, "worker_rss_mb": round(rss_mb, 1), "worker_threads": threads}


def d4(code_dir: str, n: int, concurrency: int) -> dict:
    import dbench

    from composeai.worker import Worker

    env = Env(f"d4c{concurrency}", code_dir)
    env.activate()
    for i in range(n):
        dbench.three.run(i, wait=False)
    time.sleep(0.01)
    with open(os.devnull, "w") as sink:
        worker = Worker(concurrency=concurrency, out=sink)
        t0 = time.perf_counter()
        worker.once()
        elapsed = time.perf_counter() - t0
    db = env.db()
    done = db.execute("SELECT count(*) FROM runs WHERE status = 'completed'").fetchone()[0]
    db.close()
    assert done == n, (done, n)
    return {"runs": n, "concurrency": concurrency, "runs_per_s": round(n / elapsed, 1)}


def main() -> None:
    p = parser(__doc__.splitlines()[0], 200)
    p.add_argument("--d4-only", action="store_true", help="D4 alone (for bench/ab.py)")
    args = p.parse_args()
    code_dir = temp_dir("dcode")
    with open(os.path.join(code_dir, "dbench.py"), "w") as f:
        f.write(FLOWS)
    sys.path.insert(0, code_dir)
    result = {"workload": "D", "sync": sync_mode()}
    result["D4"] = d4(code_dir, 2000, 1)
    result["D4_concurrency_4"] = d4(code_dir, 2000, 4)
    # Top-level numbers, which bench/ab.py compares.
    result["d4_runs_per_s"] = result["D4"]["runs_per_s"]
    result["d4_c4_runs_per_s"] = result["D4_concurrency_4"]["runs_per_s"]
    if args.d4_only:
        emit(result)
        return
    result["D1"] = d1(code_dir, args.n)
    result["D2"] = d2(code_dir, 30)
    result["D3"] = d3(code_dir, 10_000)
    emit(result)


if __name__ == "__main__":
    main()
