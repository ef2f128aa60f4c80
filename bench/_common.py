"""Shared helpers for the benchmark workloads (see README.md).

Every workload script prints exactly one JSON line on stdout and nothing
else; diagnostics go to stderr.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
from typing import Any

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH_DIR)


def temp_dir(tag: str) -> str:
    """A fresh temporary directory, removed at exit unless COMPOSE_BENCH_KEEP=1.
    COMPOSE_BENCH_TMP picks the parent directory (default: the system temp dir)."""
    path = tempfile.mkdtemp(
        prefix=f"composeai-bench-{tag}-", dir=os.environ.get("COMPOSE_BENCH_TMP")
    )
    if os.environ.get("COMPOSE_BENCH_KEEP") != "1":
        atexit.register(shutil.rmtree, path, True)
    return path


def fresh_store(tag: str) -> str:
    """Points COMPOSE_DIR at a fresh temporary directory. Must be called
    before the first run in this process: the store opens lazily, once."""
    path = temp_dir(tag)
    os.environ["COMPOSE_DIR"] = path
    return path


def parser(description: str, default_n: int) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--n", type=int, default=default_n, help=f"workload size (default {default_n})")
    return p


def emit(result: dict[str, Any]) -> None:
    """Prints the workload's one JSON line."""
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def sync_mode() -> str:
    return "full" if os.environ.get("COMPOSE_SYNC", "").lower() == "full" else "normal"


def store_bytes(directory: str) -> int:
    """Checkpoints the store's WAL into the database file (TRUNCATE) and
    returns the size of runs.db + runs.db-wal."""
    import sqlite3

    db = os.path.join(directory, "runs.db")
    conn = sqlite3.connect(db)
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            raise RuntimeError(f"wal_checkpoint(TRUNCATE) of {db} was blocked")
    finally:
        conn.close()
    total = 0
    for name in ("runs.db", "runs.db-wal"):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            total += os.path.getsize(path)
    return total
