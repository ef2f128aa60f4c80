"""P0-P2 on PostgreSQL, with DBOS 3.4 beside P1 on the same server.

Starts its own throwaway PostgreSQL cluster (fsync on, the server's
defaults), then:

- P0 the floor: `bench/pg_floor.rs`, one bare round trip committing a journal
  row plus a span row from Rust (µs per commit);
- P1 W1 on PostgreSQL: `w1_steps.py` with `COMPOSE_STORE` pointing at the
  cluster (µs per journaled step; target ≤ 1.3× P0);
- P2 W4 on PostgreSQL: `w4_runs.py` (ms per 3-step run);
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
    args = p.parse_args()

    bindir = _pg.find_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL (initdb, pg_ctl) is not installed: apt-get install postgresql")
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "--example", "pg_floor"], check=True, cwd=REPO
    )
    floor_bin = os.path.join(REPO, "target", "release", "examples", "pg_floor")
    dbos = dbos_python()
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
    finally:
        cluster.stop()
    emit(
        {
            "workload": "P0-P2 PostgreSQL",
            "n": args.n,
            **best,
            "p1_over_p0": round(best["p1_us_per_step"] / best["p0_us_per_commit"], 3),
            "dbos_over_p1": round(best["dbos_w1_us_per_step"] / best["p1_us_per_step"], 2),
        }
    )


if __name__ == "__main__":
    main()
