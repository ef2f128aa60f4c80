"""Waiting on the PostgreSQL server without stalling Python (issue 12's
drivers, STORE-30): an async step's commit leaves the event loop running,
a sync step's commit releases the GIL.

Each test makes a step's commit wait on the server for real: another
session locks the run's row, so the commit's fence waits for that lock.
The lock is released by code that can only run while the commit waits
(another task on the loop, another thread); if it could not run, the
lock would fall only at the other session's own end, after the commit,
and the order of events would show it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time

import _proc
import composeai as compose

# The server ends the other session after it idled this long in its
# transaction, so that a stalled commit fails the test instead of hanging it.
SAFETY_SECONDS = 60


def lock_the_run_row(cluster, schema: str) -> subprocess.Popen:
    """A psql session holding `FOR UPDATE` on every run row; returns once
    the lock is held."""
    proc = subprocess.Popen(
        [os.path.join(cluster.bindir, "psql"), "-qAt", cluster.url().split("?")[0]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    proc.stdin.write(
        f"SET search_path = {schema};\n"
        f"SET idle_in_transaction_session_timeout = '{SAFETY_SECONDS}s';\n"
        "BEGIN;\nSELECT run_id FROM runs FOR UPDATE;\n"
    )
    proc.stdin.flush()
    assert _proc.read_line(proc).strip(), "the run row was not locked"
    return proc


def release(proc: subprocess.Popen) -> None:
    proc.stdin.write("COMMIT;\n")
    proc.stdin.close()
    proc.wait(_proc.TIMEOUT)


def test_store_30_an_async_step_commit_on_postgresql_leaves_the_event_loop_running(
    pg_cluster, monkeypatch
):
    schema = "bridge_async"
    monkeypatch.setenv("COMPOSE_STORE", pg_cluster.url(schema))
    events: list[str] = []
    locker: dict[str, subprocess.Popen] = {}

    @compose.task
    async def first() -> int:
        locker["proc"] = lock_the_run_row(pg_cluster, schema)
        return 1

    @compose.task
    async def second(x: int) -> int:
        return x + 1

    @compose.flow
    async def f() -> int:
        x = await first.arun()
        events.append("committed")
        return await second.arun(x)

    async def releaser() -> None:
        while "proc" not in locker:
            await asyncio.sleep(0.01)
        # Runs only while the loop is free, i.e. while the commit waits.
        await asyncio.sleep(0.2)
        events.append("released")
        release(locker["proc"])

    async def main():
        task = asyncio.ensure_future(releaser())
        run = await f.arun()
        await task
        return run

    run = asyncio.run(main())
    assert run.status == "completed" and run.output == 2
    assert events == ["released", "committed"]


def test_store_30_a_sync_step_commit_on_postgresql_releases_the_gil(pg_cluster, monkeypatch):
    schema = "bridge_sync"
    monkeypatch.setenv("COMPOSE_STORE", pg_cluster.url(schema))
    events: list[str] = []
    locked = threading.Event()
    locker: dict[str, subprocess.Popen] = {}

    @compose.task
    def first() -> int:
        locker["proc"] = lock_the_run_row(pg_cluster, schema)
        locked.set()
        return 1

    @compose.flow
    def f() -> int:
        x = first()
        events.append("committed")
        return x

    def releaser() -> None:
        locked.wait(_proc.TIMEOUT)
        time.sleep(0.2)
        # Python code: it runs only while the committing thread has let go
        # of the GIL.
        events.append("released")
        release(locker["proc"])

    thread = threading.Thread(target=releaser)
    thread.start()
    run = f.run()
    thread.join()
    assert run.status == "completed" and run.output == 1
    assert events == ["released", "committed"]
