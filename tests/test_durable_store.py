"""EXT-0.1/EXT-0.3: the durable tables are an additive migration (schema
version 4), a version-2 store is upgraded in place, and runs that use no
extension write no row to them."""

from __future__ import annotations

import gc
import sqlite3
from contextlib import closing

import pytest

import _proc
import composeai as compose
from composeai import _engine, flow, task

DURABLE_TABLES = ("timers", "signals", "cancel_requests", "waits")


def _tables(path) -> set[str]:
    with closing(sqlite3.connect(str(path))) as db:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


@pytest.mark.sqlite_file
def test_ext03_a_version_2_store_is_upgraded_in_place(isolated_state):
    @task
    def one() -> int:
        return 1

    @flow
    def before() -> int:
        return one()

    old = before.run()
    # The engine's connection must be closed before the file is rewritten.
    _engine.reset_store()
    gc.collect()
    path = isolated_state / "runs.db"
    with closing(sqlite3.connect(str(path))) as db:
        for table in DURABLE_TABLES:
            db.execute(f"DROP TABLE {table}")
        db.execute("PRAGMA user_version = 2")
        db.commit()
    assert not set(DURABLE_TABLES) & _tables(path)
    # Any thread of the process (another test's, still finishing) may have
    # reopened the store meanwhile, migrated before the rewrite: the next use
    # must open the rewritten file.
    _engine.reset_store()

    @flow
    def after() -> int:
        compose.sleep(0)
        return one()

    assert after.run().output == 1
    assert set(DURABLE_TABLES) <= _tables(path)
    with closing(sqlite3.connect(str(path))) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 13
    assert compose.resume(old.id).output == 1


def test_ext01_runs_without_extensions_write_no_durable_rows(isolated_state):
    @task
    def double(x: int) -> int:
        return 2 * x

    @flow
    def plain(x: int) -> int:
        return double(x) + int(compose.approve("ok"))

    paused = plain.run(2)
    assert paused.pending.kind == "approval"
    assert compose.resume(paused.id, {"ok": True}).output == 5
    with _proc.store_db(isolated_state) as db:
        counts = {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in DURABLE_TABLES}
        keys = [r[0] for r in db.execute("SELECT step_key FROM journal ORDER BY step_key")]
    assert counts == dict.fromkeys(DURABLE_TABLES, 0)
    assert keys == ["__interrupt__:ok", "double#1"]
