"""The SQLite store and Python's `sqlite3` in one process; WAL checkpoints (OBS-1, OBS-2).

The core links the same SQLite library as Python's `sqlite3` module, so a connection a user
(or a test) opens on `runs.db` sees the engine's connections and locks. With a second library
in the process, such a connection would believe it is alone on the file: closing it would
delete the WAL the engine writes to, and opening it could truncate the `-shm` file the engine
has mapped (SIGBUS). A store's WAL is copied into the database by a checkpoint thread of its
own, not by the commit that grows it.
"""

from __future__ import annotations

import gc
import os
import sqlite3
from contextlib import closing
from pathlib import Path

import composeai as compose
from _proc import Sandbox, wait_until
from composeai import _core

CHECKPOINT_THREAD = "composeai-ckpt"


def wal_frame(db: Path | str) -> int:
    """Bytes per WAL frame of the store at `db`: its page and the frame's 24-byte header."""
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute("PRAGMA page_size").fetchone()[0] + 24


def wal_sequence(db: Path) -> bytes:
    """The WAL header's checkpoint sequence number: it changes when the WAL starts over,
    which happens only once a checkpoint has copied every frame."""
    with open(f"{db}-wal", "rb") as f:
        return f.read(16)[12:16]


def checkpoint_threads() -> set[str]:
    """Thread ids of this process's checkpoint threads."""
    tasks = Path("/proc/self/task")
    found = set()
    for task in tasks.iterdir():
        try:
            if (task / "comm").read_text().strip() == CHECKPOINT_THREAD:
                found.add(task.name)
        except FileNotFoundError:  # the thread ended while listing
            pass
    return found


@compose.task
def payload(i: int) -> str:
    return f"{i:06d}" + "x" * 3000


@compose.flow
def fill(n: int) -> int:
    for i in range(n):
        payload(i)
    return n


def test_obs1_closing_an_in_process_sqlite3_connection_keeps_the_engines_wal(isolated_state):
    """OBS-1: Python's sqlite3 sees the engine's open connection, so closing its own (the
    last one of a second library would be) neither checkpoints nor deletes the WAL."""
    assert fill.run(3).output == 3
    db = isolated_state / "runs.db"
    wal = Path(f"{db}-wal")
    assert wal.exists()
    for _ in range(3):
        with closing(sqlite3.connect(db)) as conn:
            assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] >= 1
        assert wal.exists()
    assert fill.run(2).output == 2
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT count(*) FROM journal").fetchone()[0] == 5


def test_obs1_sqlite3_connections_during_and_after_runs_with_checkpoints_running(tmp_path):
    """OBS-1: while flows and a graph thread commit (their WAL checkpointed by the store's
    thread), another thread of the same process keeps opening, reading and closing its own
    sqlite3 connections on runs.db, and goes on after the runs; the process survives, the
    WAL started over several times, and every row is there, intact."""
    box = Sandbox(tmp_path)
    result = box.run(
        """
        import os, sqlite3, threading
        from contextlib import closing
        import composeai as compose
        from composeai.graph import END, Graph

        db = os.path.join(os.environ["COMPOSE_DIR"], "runs.db")

        def peek():
            with closing(sqlite3.connect(db, timeout=30)) as conn:
                return conn.execute("SELECT count(*) FROM runs").fetchone()[0]

        @compose.task
        def payload(i):
            return f"{i:06d}" + "x" * 3000

        @compose.flow
        def fill(n):
            for i in range(n):
                payload(i)
            return n

        g = Graph(name="blobs")
        g.add_node("a", lambda s: {"blob": "y" * 3000, "n": s.get("n", 0) + 1})
        g.add_node("b", lambda s: {"blob": "z" * 3000})
        g.start("a").edge("a", "b").edge("b", END)
        thread = g.compile().thread("t")

        stop, peeks = threading.Event(), [0]

        # SQLite starts a WAL over only at a commit that no reader's snapshot
        # holds back: a reader never idle could hold one at every commit
        # (checkpoint starvation). It pauses between peeks, as a poller does.
        def reader():
            while not stop.wait(0.001):
                peek()
                peeks[0] += 1

        fill.run(1)
        sequences = set()
        background = threading.Thread(target=reader)
        background.start()
        for _ in range(12):
            fill.run(250)
            thread.run()
            with open(db + "-wal", "rb") as f:
                sequences.add(f.read(16)[12:16])
        threads_named = [
            open(f"/proc/self/task/{t}/comm").read().strip()
            for t in os.listdir("/proc/self/task")
        ]
        stop.set()
        background.join()
        after = [peek() for _ in range(20)]
        with closing(sqlite3.connect(db)) as conn:
            integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
            steps = conn.execute("SELECT count(*) FROM journal").fetchone()[0]
        emit(
            threads=threads_named,
            restarts=len(sequences),
            peeks=peeks[0],
            after=sorted(set(after)),
            integrity=integrity,
            steps=steps,
            n=thread.state()["n"],
        )
        """
    )
    data = result.ok()
    assert CHECKPOINT_THREAD in data["threads"]
    assert data["restarts"] > 1, "the workload must outgrow the WAL several times"
    assert data["peeks"] > 0
    assert data["after"] == [25]
    assert data["integrity"] == "ok"
    assert data["steps"] == 1 + 12 * 250
    assert data["n"] == 12


def test_obs1_a_pause_lets_the_checkpoint_thread_copy_the_whole_wal(isolated_state):
    """OBS-1: a WAL grown past the checkpoint limit, then left alone, is copied into the
    database by the store's thread: the next commit starts it over, although no commit
    checkpointed (the writer's own checkpoint only comes far later)."""
    db = isolated_state / "runs.db"
    fill.run(1)
    start = wal_sequence(db)
    # About 1,500 frames: past the 1,000 that wake the thread, well short of the
    # writer's own checkpoint.
    fill.run(500)
    largest = os.path.getsize(f"{db}-wal")
    frame = wal_frame(db)
    assert 1000 * frame < largest < 8000 * frame

    def started_over():
        fill.run(1)
        return wal_sequence(db) != start

    wait_until(started_over, what="the WAL to start over")


def test_obs1_the_checkpoint_thread_starts_with_the_wal_and_stops_with_its_store(tmp_path):
    """OBS-1: a store starts its checkpoint thread once its WAL has grown enough to need
    copying (a process that commits little, like a CLI command, never starts one), and
    dropping the store stops and joins it."""
    gc.collect()
    # Stores of earlier tests may still be stopping: follow this store's thread by id.
    before = checkpoint_threads()
    store = _core.Store(str(tmp_path / "own.db"))

    def commit_runs(store: _core.Store, n: int) -> None:
        for _ in range(n):
            store.start_run("agent", "a", None, '{"args":[],"kwargs":{}}', None).settle(
                "completed", '"done"', None
            )

    commit_runs(store, 20)
    assert not checkpoint_threads() - before
    for _ in range(200):
        commit_runs(store, 20)
        if checkpoint_threads() - before:
            break
    (own,) = checkpoint_threads() - before
    del store
    gc.collect()
    wait_until(lambda: own not in checkpoint_threads(), what="the checkpoint thread to stop")


def test_obs1_the_last_process_to_close_the_store_leaves_no_wal(tmp_path):
    """OBS-1: a process that wrote thousands of steps and exits, with no other process on
    the store, closes it last: SQLite copies the WAL into the database and deletes it, so
    the next process neither reads a WAL back on open nor copies it again. With another
    process holding the store open, the exiting one leaves the WAL to that one."""
    box = Sandbox(tmp_path)
    body = """
        import composeai as compose

        @compose.task
        def payload(i):
            return f"{i:06d}" + "x" * 3000

        @compose.flow
        def fill(n):
            for i in range(n):
                payload(i)
            return n

        emit(n=fill.run(N).output)
        """
    assert box.run(body.replace("N", "2000")).ok() == {"n": 2000}
    wal = Path(f"{box.db_path}-wal")
    assert not wal.exists() or wal.stat().st_size == 0

    # Another process on the store (this one): the exiting child is not the last.
    with closing(sqlite3.connect(box.db_path)) as conn:
        assert conn.execute("SELECT count(*) FROM journal").fetchone()[0] == 2000
        assert box.run(body.replace("N", "300")).ok() == {"n": 300}
        assert wal.stat().st_size > 300 * wal_frame(box.db_path)
        assert conn.execute("SELECT count(*) FROM journal").fetchone()[0] == 2300
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_obs1_a_new_store_has_2048_byte_pages_and_an_older_store_keeps_its_own(tmp_path):
    """OBS-1: every commit writes each page it changed to the WAL whole, so a new store is
    created with 2,048-byte pages (the engine's rows are small). A store created with other
    pages keeps them: it opens, commits and reads back as before."""

    def commit_runs(path: Path, n: int) -> None:
        store = _core.Store(str(path))
        for i in range(n):
            store.start_run("agent", "a", None, '{"args":[],"kwargs":{}}', None).settle(
                "completed", f'"done {i}"', None
            )
        store.close()

    def page_size(path: Path) -> int:
        with closing(sqlite3.connect(path)) as conn:
            return conn.execute("PRAGMA page_size").fetchone()[0]

    new = tmp_path / "new.db"
    commit_runs(new, 3)
    assert page_size(new) == 2048

    older = tmp_path / "older.db"
    commit_runs(older, 3)
    with closing(sqlite3.connect(older, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.execute("PRAGMA page_size=4096")
        conn.execute("VACUUM")
        conn.execute("PRAGMA journal_mode=WAL")
    assert page_size(older) == 4096
    commit_runs(older, 3)
    assert page_size(older) == 4096
    with closing(sqlite3.connect(older)) as conn:
        outputs = [r[0] for r in conn.execute("SELECT output_json FROM runs ORDER BY rid")]
        assert outputs == ['"done 0"', '"done 1"', '"done 2"'] * 2
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
