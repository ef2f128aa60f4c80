"""W6: persisted state bytes per journaled step.

Runs a W1-style flow of N steps in one fresh store and a 0-step flow in
another; after each run completes, checkpoints the WAL (TRUNCATE, through
Python's sqlite3) and measures runs.db + runs.db-wal. Reports
(size_N - size_empty) / N, plus a per-table breakdown from `dbstat` when the
sqlite3 module has it. Each store is measured in its own subprocess so that
each gets a fresh COMPOSE_DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from _common import emit, fresh_store, parser, store_bytes

CHILD_FLAG = "--child"


def child(n: int) -> None:
    directory = fresh_store("w6")

    import composeai as compose

    @compose.task
    def inc(x):
        return x + 1

    @compose.flow
    def steps(n):
        x = 0
        for _ in range(n):
            x = inc(x)
        return x

    run = steps.run(n)
    assert run.status == "completed" and run.output == n
    size = store_bytes(directory)
    tables = table_bytes(os.path.join(directory, "runs.db"))
    emit({"n": n, "bytes": size, "tables": tables})


def table_bytes(db: str) -> dict[str, int] | None:
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return {name: size for name, size in rows}


def measure(n: int) -> dict:
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), CHILD_FLAG, "--n", str(n)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"W6 child (n={n}) failed:\n{proc.stderr}")
    return json.loads(proc.stdout)


def main() -> None:
    p = parser(__doc__.splitlines()[0], 2000)
    p.add_argument(CHILD_FLAG, action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.n)
        return
    full = measure(args.n)
    empty = measure(0)
    per_table = None
    if full["tables"] is not None and empty["tables"] is not None:
        per_table = {
            name: round((size - empty["tables"].get(name, 0)) / args.n, 1)
            for name, size in sorted(full["tables"].items())
            if size != empty["tables"].get(name, 0)
        }
    emit(
        {
            "workload": "W6",
            "n": args.n,
            "bytes_per_step": round((full["bytes"] - empty["bytes"]) / args.n, 1),
            "store_bytes": full["bytes"],
            "empty_store_bytes": empty["bytes"],
            "bytes_per_step_by_table": per_table,
        }
    )


if __name__ == "__main__":
    main()
