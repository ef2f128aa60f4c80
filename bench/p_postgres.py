"""P0-P2 on PostgreSQL, with DBOS 3.4 beside P1 on the same server.

Starts its own throwaway PostgreSQL cluster (fsync on, the server's
defaults), then:

- P0 the floor: `bench/pg_floor.rs`, one bare round trip committing a journal
  row plus a span row from Rust (µs per commit);
- P1 W1 on PostgreSQL: `w1_steps.py` with `COMPOSE_STORE` pointing at the
  cluster (µs per journaled step; target ≤ 1.3× P0);
- P1-batch W1-batch on PostgreSQL: `w1_steps.py` with
  `COMPOSE_DURABILITY=batch` (µs per step; steps group-commit every 5 ms, so
  it is printed beside the floor it amortizes, P0, as a ratio);
- P2 W4 on PostgreSQL: `w4_runs.py` (ms per 3-step run);
- P4 takeover: a process running a long flow on another (simulated)
  machine is killed -9; a `compose worker` on this one continues the run.
  Reported: ms from the killed holder's lease expiry (its last renewed
  `lease_until`) to the run's first new step executing on the worker
  (target ≤ 1 s), with a 2 s `COMPOSE_LEASE_SECONDS`. The other machine is
  a UTS namespace with its own host name (`unshare -u`); without it the
  holder is on this host, whose death is seen at once, and the figure is
  from the kill instead (`p4_from`).
- DBOS 3.4 running the W1 loop (a `@DBOS.workflow` of N `@DBOS.step`s) on the
  same server, from its own venv created here on first use (cached in the
  temp dir as `composeai-bench-dbos-venv`).

Prints one JSON line. Each measurement is the best of `--repeat` runs (the
machine is shared; contention only adds time).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from _common import BENCH_DIR, REPO, emit
from run import FLOOR_TARGET

sys.path.insert(0, os.path.join(REPO, "tests"))

import _pg

DBOS_VERSION = "3.4.0"

DBOS_W1 = r"""
import json, sys, time
from dbos import DBOS

n, url = int(sys.argv[1]), sys.argv[2]
DBOS(config={"name": "pbench", "system_database_url": url})


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
assert steps(1) == 1
t0 = time.perf_counter()
assert steps(n) == n
elapsed = time.perf_counter() - t0
print(json.dumps({"us_per_step": round(elapsed / n * 1e6, 2)}))
DBOS.destroy()
"""


P4_FLOWS = r"""
import os, time
from composeai import flow, task


@task
def tick(i):
    mark = os.environ.get("P4_MARK")
    if mark and not os.path.exists(mark):
        with open(mark, "w") as f:
            f.write(repr(time.time()))
    time.sleep(0.002)
    return i


@flow
def long(n):
    return sum(tick(i) for i in range(n))
"""

P4_LEASE = "2"


def psql_value(cluster, schema: str, sql: str) -> str:
    out = subprocess.run(
        [os.path.join(cluster.bindir, "psql"), "-qAt", cluster.url().split("?")[0]],
        input=f"SET search_path = {schema};\n{sql};\n",
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def other_machine(argv: list[str]) -> tuple[list[str], bool]:
    probe = ["unshare", "-u", "sh", "-c", 'hostname "$0" && exec "$@"', "p4-victim"]
    ok = subprocess.run([*probe, "true"], capture_output=True, check=False).returncode == 0
    return ([*probe, *argv] if ok else argv), ok


def takeover_ms(cluster, schema: str, work: str) -> tuple[float, str]:
    """One P4 sample: ms from the dead holder's lease expiry (or its kill)
    to the worker executing the run's next step."""
    import time

    url = cluster.url(schema)
    env = {
        **os.environ,
        "COMPOSE_STORE": url,
        "COMPOSE_LEASE_SECONDS": P4_LEASE,
        "PYTHONPATH": work,
        "COMPOSE_DIR": os.path.join(work, schema),
    }
    mark = os.path.join(work, f"{schema}.mark")
    victim_argv, remote = other_machine(
        [sys.executable, "-c", "import p4flows; p4flows.long(1_000_000)"]
    )
    victim = subprocess.Popen(victim_argv, env=env, cwd=work)
    rescuer = subprocess.Popen(
        [sys.executable, "-m", "composeai.cli", "worker", "--import", "p4flows"],
        env={**env, "P4_MARK": mark},
        cwd=work,
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not psql_value(cluster, schema, "SELECT count(*) FROM journal").strip("0 "):
            if time.monotonic() > deadline:
                raise SystemExit("P4: the victim journaled nothing within 60 s")
            time.sleep(0.05)
        time.sleep(0.5)
        victim.kill()
        killed_at = time.time()
        victim.wait()
        until = float(psql_value(cluster, schema, "SELECT lease_until FROM runs"))
        while not os.path.exists(mark):
            if time.monotonic() > deadline + 60:
                raise SystemExit("P4: the worker did not continue the run")
            time.sleep(0.01)
        time.sleep(0.05)
        with open(mark) as f:
            progressed = float(f.read())
    finally:
        rescuer.terminate()
        rescuer.wait(timeout=60)
    start = until if remote else killed_at
    return (progressed - start) * 1000, "lease expiry" if remote else "kill (same host)"


def p4(cluster, repeat: int) -> dict:
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "p4flows.py"), "w") as f:
            f.write(P4_FLOWS)
        samples = [takeover_ms(cluster, f"p4_{i}", work) for i in range(repeat)]
    ms = sorted(round(s[0], 1) for s in samples)
    return {
        "p4_ms_after_expiry": ms[len(ms) // 2],
        "p4_ms_all": ms,
        "p4_from": samples[0][1],
        "p4_lease_seconds": float(P4_LEASE),
    }


def run_json(cmd: list[str], env: dict | None = None) -> dict:
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=REPO,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def dbos_python() -> str:
    venv = os.path.join(
        os.environ.get("COMPOSE_BENCH_TMP") or tempfile.gettempdir(), "composeai-bench-dbos-venv"
    )
    python = os.path.join(venv, "bin", "python")
    probe = [python, "-c", "import importlib.metadata as m; print(m.version('dbos'))"]
    ok = os.path.exists(python) and subprocess.run(
        probe, capture_output=True, text=True, check=False
    )
    if not ok or ok.stdout.strip() != DBOS_VERSION:
        print(f"installing dbos=={DBOS_VERSION} into {venv}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", f"dbos=={DBOS_VERSION}"], check=True)
    return python


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2000, help="steps for P0/P1 (2000)")
    p.add_argument("--n-runs", type=int, default=200, help="runs for P2 (200)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--p4-only", action="store_true", help="only P4 (no build, no DBOS)")
    p.add_argument(
        "--p01-only", action="store_true", help="only P0 and P1 (no DBOS, P2, P4): for ab.py"
    )
    args = p.parse_args()

    bindir = _pg.find_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL (initdb, pg_ctl) is not installed: apt-get install postgresql")
    if args.p4_only:
        cluster = _pg.Cluster(bindir, durable=True).start()
        try:
            emit({"workload": "P4 PostgreSQL", **p4(cluster, args.repeat)})
        finally:
            cluster.stop()
        return
    # Built apart from the extension, whose build cache a plain cargo build
    # of the crate would invalidate (see bench/README.md).
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "--example", "pg_floor"],
        check=True,
        cwd=REPO,
        env={**os.environ, "CARGO_TARGET_DIR": FLOOR_TARGET},
    )
    floor_bin = os.path.join(FLOOR_TARGET, "release", "examples", "pg_floor")
    dbos = None if args.p01_only else dbos_python()
    cluster = _pg.Cluster(bindir, durable=True).start()
    try:
        best: dict[str, float] = {}

        def keep(name: str, value: float) -> None:
            best[name] = min(best.get(name, float("inf")), value)

        for i in range(args.repeat):
            p0 = run_json([floor_bin, str(args.n), cluster.url(f"p0_{i}")])
            keep("p0_us_per_commit", p0["us_per_commit"])
            p1 = run_json(
                [sys.executable, os.path.join(BENCH_DIR, "w1_steps.py"), "--n", str(args.n)],
                {"COMPOSE_STORE": cluster.url(f"p1_{i}")},
            )
            keep("p1_us_per_step", p1["us_per_step"])
            p1_batch = run_json(
                [sys.executable, os.path.join(BENCH_DIR, "w1_steps.py"), "--n", str(args.n)],
                {"COMPOSE_STORE": cluster.url(f"p1b_{i}"), "COMPOSE_DURABILITY": "batch"},
            )
            keep("p1_batch_us_per_step", p1_batch["us_per_step"])
            if dbos is None:
                continue
            p2 = run_json(
                [sys.executable, os.path.join(BENCH_DIR, "w4_runs.py"), "--n", str(args.n_runs)],
                {"COMPOSE_STORE": cluster.url(f"p2_{i}")},
            )
            keep("p2_ms_per_run", p2["ms_per_run"])
            dbos_url = (
                f"postgresql://{cluster.user}@127.0.0.1:{cluster.port}/dbos_bench_{i}"
                "?sslmode=disable"
            )
            d = run_json([dbos, "-c", DBOS_W1, str(args.n), dbos_url])
            keep("dbos_w1_us_per_step", d["us_per_step"])
        takeover = {} if dbos is None else p4(cluster, args.repeat)
    finally:
        cluster.stop()
    p0 = best["p0_us_per_commit"]
    ratios = {
        "p1_over_p0": round(best["p1_us_per_step"] / p0, 3),
        "p1_batch_over_p0": round(best["p1_batch_us_per_step"] / p0, 3),
    }
    if dbos is not None:
        ratios["dbos_over_p1"] = round(best["dbos_w1_us_per_step"] / best["p1_us_per_step"], 2)
    emit({"workload": "P0-P2 PostgreSQL", "n": args.n, **best, **ratios, **takeover})


if __name__ == "__main__":
    main()
