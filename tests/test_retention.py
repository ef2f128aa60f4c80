"""OPS-23 retention: `compose.delete_runs`, `compose runs --prune`, and
what is never deleted (queued, running, paused runs; the source of an
unfinished fork); every row of a deleted run goes; a SQLite store reuses
the freed pages."""

from __future__ import annotations

import sqlite3
import threading
from datetime import datetime, timedelta

import pytest

import _proc
import composeai as compose
from composeai import cli, flow, task
from composeai.errors import ConfigError

GATE = threading.Event()
BLOCK = {"b": False}


@task
def a(x: int) -> int:
    compose.write_stream("s", x)
    return x + 1


@task
def b(x: int) -> int:
    if BLOCK["b"]:
        assert GATE.wait(60), "gate never opened"
    return x * 10


@flow
def two(x: int) -> int:
    compose.set_event("e", x)
    return b(a(x))


@flow
def waits(x: int) -> int:
    return compose.receive("go")


@flow
def asks(x: int) -> int:
    compose.approve("ok")
    return x


def _tables(store_kind) -> dict[str, int]:
    """Rows per table of the store (SQLite only: read the file)."""
    from composeai import _engine

    _engine.get_store().flush()
    path = _engine.get_store().path
    with sqlite3.connect(path) as c:
        names = [r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {
            n: c.execute(f"SELECT count(*) FROM {n}").fetchone()[0]
            for n in names
            if not n.startswith(("sqlite_", "span_fts")) and n != "graph_threads"
        }


def test_ops23_prune_keeps_unsettled_runs_and_fork_sources(store_kind):
    """Completed and failed runs go; a queued, a running (executing here),
    a paused run and the source of a fork still executing stay, until the
    fork has borrowed what it needs."""
    old = [two.run(i).id for i in range(30)]
    queue = compose.Queue("later")
    queued = waits.start(1, queue=queue).id
    paused = asks.run(1).id
    executing = waits.start(2)
    source = two.run(100).id
    BLOCK["b"] = True
    GATE.clear()
    forked: list = []

    def fork() -> None:
        try:
            forked.append(compose.fork(source, "b#1"))
        except BaseException as exc:  # noqa: BLE001 -- reported below
            forked.append(exc)

    fork_thread = threading.Thread(target=fork)
    fork_thread.start()
    try:

        def fork_running() -> bool:
            assert not forked, forked
            return any(r.parent_id == source for r in compose.list_runs(status="running"))

        _proc.wait_until(fork_running, what="the fork executing its step")
        assert compose.delete_runs(older_than=timedelta(0), dry_run=True) == 30
        assert compose.delete_runs(older_than=timedelta(0)) == 30
        left = {r.id for r in compose.list_runs()}
        assert set(old).isdisjoint(left)
        fork_id = next(r.id for r in compose.list_runs() if r.parent_id == source)
        assert {queued, paused, executing.id, source, fork_id} == left
    finally:
        GATE.set()
        fork_thread.join(60)
        BLOCK["b"] = False
    assert forked[0].status == "completed" and forked[0].output == 1010
    compose.signal(executing.id, "go", 7)
    assert executing.result().output == 7
    # The fork borrowed its steps: its source may go now, and the fork and the
    # finished run with it.
    assert compose.delete_runs(older_than=timedelta(0)) == 3
    assert {r.id for r in compose.list_runs()} == {queued, paused}
    assert [r.queue for r in compose.list_runs(status="queued")] == ["later"]
    assert compose.list_runs(name="asks")[0].pending == ["ok"]


def test_ops23_every_row_of_a_deleted_run_goes(store_kind):
    if store_kind != "sqlite":
        pytest.skip("counts the SQLite file's rows")
    empty = _tables(store_kind)
    for i in range(5):
        two.run(i)
    r = asks.run(1)
    compose.resume(r.id, {"ok": True})
    grown = _tables(store_kind)
    assert grown["journal"] > empty["journal"] and grown["run_streams"] > 0
    assert compose.delete_runs(older_than=timedelta(0)) == 6
    assert _tables(store_kind) == empty


def test_ops23_a_sqlite_store_does_not_grow_across_fill_and_prune_rounds(store_kind):
    if store_kind != "sqlite":
        pytest.skip("measures the SQLite file")
    from composeai import _engine

    pages = []
    for _ in range(5):
        for i in range(150):
            two.run(i)
        assert compose.delete_runs(older_than=timedelta(0)) == 150
        _engine.get_store().flush()
        with sqlite3.connect(_engine.get_store().path) as c:
            c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            pages.append(c.execute("PRAGMA page_count").fetchone()[0])
    # The first rounds size the file; later rounds reuse its freed pages.
    assert pages[4] <= pages[1], pages


def test_ops23_delete_runs_bad_input(store_kind):
    with pytest.raises(ConfigError, match="older_than"):
        compose.delete_runs()
    with pytest.raises(ConfigError, match="older_than"):
        compose.delete_runs(older_than="30d")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="paused"):
        compose.delete_runs(older_than=timedelta(days=1), status="paused")
    with pytest.raises(ConfigError, match="threads --prune"):
        compose.delete_runs(older_than=timedelta(days=1), kind="graph")
    two.run(1)
    assert compose.delete_runs(older_than=timedelta(days=1)) == 0
    assert compose.delete_runs(older_than=datetime.now() + timedelta(1), name="other") == 0
    assert compose.delete_runs(older_than=datetime.now() + timedelta(1), name="two") == 1


def test_ops23_compose_runs_prune(store_kind, capsys):
    for i in range(3):
        two.run(i)
    asks.run(1)
    assert cli.main(["runs", "--prune", "--older-than", "0d", "--dry-run"]) == 0
    assert capsys.readouterr().out.strip() == "would delete 3 runs"
    assert cli.main(["runs", "--prune", "--older-than", "0d", "--vacuum"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("deleted 3 runs\nvacuum: ")
    assert [r.name for r in compose.list_runs()] == ["asks"]
    with pytest.raises(SystemExit):
        cli.main(["runs", "--prune"])
    assert "--older-than" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["runs", "--prune", "--older-than", "1d", "--status", "paused"])
    assert cli.main(["runs", "--prune", "--older-than", "soon"]) == 1
    assert "invalid --older-than value 'soon'" in capsys.readouterr().err


def test_ops23_worker_retention_prunes_when_it_starts(store_kind, capsys):
    """`compose worker --retention AGE` prunes at start, then hourly."""
    two.run(1)
    asks.run(2)
    assert cli.main(["worker", "--once", "--retention", "0m"]) == 0
    assert "pruned   1 runs" in capsys.readouterr().out
    assert [r.name for r in compose.list_runs()] == ["asks"]
    with pytest.raises(SystemExit):
        cli.main(["worker", "--once", "--retention", "soon"])
    assert "invalid --retention value 'soon'" in capsys.readouterr().err


@pytest.fixture(autouse=True)
def registered(isolated_state):
    """The store fixture forgets every flow name; fork() and resume() find
    flows by name."""
    for f in (two, waits, asks):
        flow(f.fn, name=f.name, replace=True)
