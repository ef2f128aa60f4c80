"""P3 on PostgreSQL: queue throughput, with DBOS 3.4 beside it in the same run.

Starts its own throwaway PostgreSQL cluster (fsync on, the server's defaults).
One round on each side, interleaved, `--repeat` times:

- composeai: two `compose worker --queue p3 --concurrency 32` processes wait
  on an empty queue; a driver process enqueues `--flows` runs of a flow of
  `--steps` journaled `@task` steps (`Flow.start(queue="p3")`) and reads
  `compose queues`' counts every 20 ms until all completed;
- DBOS: two processes launch DBOS with the same workflow (`@DBOS.workflow`
  of `@DBOS.step`s) and queue (`worker_concurrency=32`, polled every 0.1 s);
  a `DBOSClient` enqueues the same runs and waits for their results.

Both sides are timed from the first enqueue to the last completion; steps
per second is flows × steps over that time. The CPU time the server and the
worker processes spent per step (from /proc) is reported beside it: with
the round trips per step and the WAL bytes written per step, it is what a
calculation for more workers starts from. DBOS runs from its own venv,
made on first use (shared with p_postgres.py). Prints one JSON line: the
best round of each side and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap

from _common import REPO, emit
from p_postgres import dbos_python

sys.path.insert(0, os.path.join(REPO, "tests"))

import _pg

COMPOSE_FLOWS = """
import composeai as compose
from composeai import flow, task

p3 = compose.Queue("p3")


@task
def inc(x: int) -> int:
    return x + 1


@flow
def steps(n: int) -> int:
    x = 0
    for _ in range(n):
        x = inc(x)
    return x
"""

COMPOSE_DRIVER = """
import json, sys, time
import p3flows
from composeai import _core, _engine

flows, n = int(sys.argv[1]), int(sys.argv[2])
store = _engine.get_store()
t0 = time.perf_counter()
ids = [p3flows.steps.start(n, queue="p3").id for _ in range(flows)]
while True:
    [(_, queued, running, done, _)] = _core.queue_stats(store)
    if done >= flows:
        break
    time.sleep(0.02)
elapsed = time.perf_counter() - t0
assert all(store.get_run(i)["output_json"] == str(n) for i in ids)
print(json.dumps({"seconds": elapsed}))
"""

DBOS_APP = """
import sys, threading
from dbos import DBOS

url, executor, per_worker = sys.argv[1], sys.argv[2], int(sys.argv[3])
DBOS(config={"name": "p3bench", "system_database_url": url, "executor_id": executor})


@DBOS.step()
def inc(x):
    return x + 1


@DBOS.workflow()
def steps(n):
    x = 0
    for _ in range(n):
        x = inc(x)
    return x


DBOS.launch()
DBOS.register_queue("p3", worker_concurrency=per_worker, polling_interval_sec=0.1)
print("ready", flush=True)
threading.Event().wait()
"""

DBOS_DRIVER = """
import json, sys, time
from dbos import DBOSClient

url, flows, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
client = DBOSClient(system_database_url=url)
t0 = time.perf_counter()
handles = [
    client.enqueue({"queue_name": "p3", "workflow_name": "steps"}, n) for _ in range(flows)
]
results = [h.get_result() for h in handles]
elapsed = time.perf_counter() - t0
assert results == [n] * flows, results[:3]
print(json.dumps({"seconds": elapsed}))
client.destroy()
"""


TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, children: bool = False) -> float:
    """utime + stime of a process (with `children`, also of its reaped children)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICK


def server_cpu(cluster) -> float:
    """CPU seconds the cluster has used: the postmaster with its reaped
    backends, plus the live ones."""
    with open(os.path.join(cluster.data, "postmaster.pid")) as f:
        root = int(f.readline())
    total = cpu_seconds(root, children=True)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == root:
                total += cpu_seconds(int(entry))
        except (OSError, ValueError):
            continue
    return total


def start_worker(cmd: list[str], env: dict, cwd: str, ready: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while True:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"{cmd[:4]} exited before ready:\n{proc.stderr.read()[-3000:]}")
        if ready in line:
            return proc


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def driver(cmd: list[str], env: dict, cwd: str) -> float:
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def wal_position(cluster) -> str:
    psql = os.path.join(cluster.bindir, "psql")
    dsn = f"postgresql://{cluster.user}@127.0.0.1:{cluster.port}/postgres"
    out = subprocess.run(
        [psql, "-qAt", dsn, "-c", "SELECT pg_current_wal_lsn()"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def wal_bytes(cluster, start: str) -> int:
    psql = os.path.join(cluster.bindir, "psql")
    dsn = f"postgresql://{cluster.user}@127.0.0.1:{cluster.port}/postgres"
    sql = f"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{start}')::bigint"
    out = subprocess.run([psql, "-qAt", dsn, "-c", sql], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def timed(cluster, workers: list[subprocess.Popen], run) -> tuple[float, float, float, int]:
    """(seconds, server CPU s, worker CPU s, WAL bytes) of `run()`."""
    server0 = server_cpu(cluster)
    workers0 = sum(cpu_seconds(w.pid) for w in workers)
    wal0 = wal_position(cluster)
    seconds = run()
    workers1 = sum(cpu_seconds(w.pid) for w in workers)
    server = server_cpu(cluster) - server0
    return seconds, server, workers1 - workers0, wal_bytes(cluster, wal0)


def compose_round(cluster, schema: str, work: str, args) -> tuple[float, float, float, int]:
    env = {
        **os.environ,
        "COMPOSE_STORE": cluster.url(schema),
        "COMPOSE_DIR": os.path.join(work, "state"),
        "PYTHONPATH": os.pathsep.join(p for p in (work, os.environ.get("PYTHONPATH")) if p),
    }
    cmd = [
        sys.executable,
        "-m",
        "composeai.cli",
        "worker",
        "--import",
        "p3flows",
        "--queue",
        "p3",
        "--concurrency",
        str(args.per_worker),
    ]
    # One after the other: the first one creates the schema.
    workers = [start_worker(cmd, env, work, "worker ready") for _ in range(args.workers)]
    argv = [sys.executable, "-c", COMPOSE_DRIVER, str(args.flows), str(args.steps)]
    try:
        return timed(cluster, workers, lambda: driver(argv, env, work))
    finally:
        stop(workers)


def dbos_round(cluster, python: str, db: str, work: str, args) -> tuple[float, float, float, int]:
    url = f"postgresql://{cluster.user}@127.0.0.1:{cluster.port}/{db}?sslmode=disable"
    env = {**os.environ, "PYTHONPATH": ""}
    workers = [
        start_worker(
            [python, "-c", DBOS_APP, url, f"w{k}", str(args.per_worker)], env, work, "ready"
        )
        for k in range(args.workers)
    ]
    argv = [python, "-c", DBOS_DRIVER, url, str(args.flows), str(args.steps)]
    try:
        return timed(cluster, workers, lambda: driver(argv, env, work))
    finally:
        stop(workers)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flows", type=int, default=64)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--per-worker", type=int, default=32, help="threads per worker (32)")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--no-dbos", action="store_true", help="composeai only")
    args = p.parse_args()
    load_before = os.getloadavg()[0]

    bindir = _pg.find_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL (initdb, pg_ctl) is not installed: apt-get install postgresql")
    python = None if args.no_dbos else dbos_python()
    work = tempfile.mkdtemp(prefix="composeai-p3-")
    with open(os.path.join(work, "p3flows.py"), "w") as f:
        f.write(textwrap.dedent(COMPOSE_FLOWS))
    cluster = _pg.Cluster(bindir, durable=True).start()
    ours: list[tuple[float, float, float, int]] = []
    theirs: list[tuple[float, float, float, int]] = []
    try:
        for i in range(args.repeat):
            ours.append(compose_round(cluster, f"p3_{i}", work, args))
            if python is not None:
                theirs.append(dbos_round(cluster, python, f"dbos_p3_{i}", work, args))
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    total = args.flows * args.steps

    def side(prefix: str, rounds: list[tuple[float, float, float, int]]) -> dict:
        seconds, server, workers, wal = min(rounds)
        return {
            f"{prefix}_steps_per_s": round(total / seconds),
            f"{prefix}_steps_per_s_rounds": [round(total / r[0]) for r in rounds],
            f"{prefix}_server_cpu_us_per_step": round(server / total * 1e6, 1),
            f"{prefix}_worker_cpu_us_per_step": round(workers / total * 1e6, 1),
            f"{prefix}_wal_bytes_per_step": round(wal / total),
        }

    out = {
        "workload": "P3 queue throughput (PostgreSQL)",
        "flows": args.flows,
        "steps": args.steps,
        "workers": args.workers,
        "cores": os.cpu_count(),
        "load_before": round(load_before, 2),
        **side("p3", ours),
    }
    if theirs:
        out.update(side("dbos", theirs))
        out["p3_over_dbos"] = round(min(theirs)[0] / min(ours)[0], 2)
    emit(out)


if __name__ == "__main__":
    main()
