"""Graph threads: state, history, rewind, fork, delete, retry, errors, audit, storage
growth and the CLI (EXT-30 … EXT-33)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from contextlib import closing

import pytest

import _proc
from composeai import _engine
from composeai.cli import main
from composeai.errors import ConfigError
from composeai.graph import (
    END,
    Graph,
    GraphError,
    GraphInterrupt,
    GraphStorageError,
    GraphValidationError,
    Storage,
    ThreadBusyError,
    ThreadSuspendedError,
    suspend,
)


def read(path, sql: str) -> list:
    """Reads a store the engine has open, read-only and closed at once. A
    PostgreSQL store is read with `psql`."""
    if str(path).startswith("postgresql://"):
        return _proc._pg_read(str(path), sql, (), None)
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return db.execute(sql).fetchall()


def checkpoints(path) -> str:
    """Every checkpoint row of a store, as a table expression: on SQLite, a
    thread's rows from schema version 9 on are in `graph_steps`."""
    if str(path).startswith("postgresql://"):
        return "graph_checkpoints"
    columns = "delta_json, snapshot_json, meta_json"
    return f"(SELECT {columns} FROM graph_checkpoints UNION ALL SELECT {columns} FROM graph_steps)"


def counter_graph(name="counter", storage=None, audit=False):
    wf = Graph(reducers={"log": "append"}, name=name)
    wf.add_node("inc", lambda s: {"n": s.get("n", 0) + 1, "log": [s.get("tag", "-")]})
    wf.start("inc").edge("inc", END)
    return wf.compile(storage, audit=audit, replace=True)


def review_graph(name="review", storage=None, audit=False):
    def review(state, ctx):
        if ctx.resume is None:
            return suspend({"question": f"approve {state['text']}?"})
        return {"verdict": ctx.resume}

    wf = Graph(name=name)
    wf.add_node("draft", lambda s: {"text": s["topic"].upper()})
    wf.add_node("review", review)
    wf.start("draft").edge("draft", "review").edge("review", END)
    return wf.compile(storage, audit=audit, replace=True)


def test_ext30_thread_is_lazy_and_runs_continue_from_the_stored_state(isolated_state):
    app = counter_graph()
    thread = app.thread("t1")
    assert not isolated_state.exists(), "thread() does no I/O"
    assert thread.state() == {}
    first = thread.run({"tag": "a"})
    assert first.state == {"tag": "a", "n": 1, "log": ["a"]}
    assert first.checkpoint_id and first.version >= 1
    second = thread.run({"tag": "b"})
    assert second.state == {"tag": "b", "n": 2, "log": ["a", "b"]}
    assert second.version > first.version
    assert thread.state() == second.state
    assert app.thread("t2").run().state == {"n": 1, "log": ["-"]}


def test_ext30_history_rewind_fork_delete():
    app = counter_graph()
    thread = app.thread("h1")
    thread.run({"tag": "a"})
    mid = thread.run({"tag": "b"})
    thread.run({"tag": "c"})
    history = thread.history()
    assert history[0]["id"] != mid.checkpoint_id
    assert all(
        set(h)
        == {"id", "parent_id", "version", "source", "status", "run_id", "step", "created_at_ms"}
        for h in history
    )
    assert [h["version"] for h in history] == sorted((h["version"] for h in history), reverse=True)
    assert history[0]["parent_id"] == history[1]["id"]
    assert len(thread.history(limit=2)) == 2
    head = thread.rewind(mid.checkpoint_id)
    assert head["source"] == "rewind" and head["parent_id"] == history[0]["id"]
    assert thread.state()["log"] == ["a", "b"]
    assert len(thread.history(limit=100)) == len(history) + 1, "history is kept"
    assert thread.run({"tag": "d"}).state["log"] == ["a", "b", "d"]
    with pytest.raises(GraphStorageError) as info:
        thread.rewind("nope")
    assert info.value.code == "checkpoint_not_found"
    from composeai import _core

    _engine.get_store().flush()
    assert _core.take_span_write_error() is None, "a refused operation keeps queued spans"
    forked = thread.fork(mid.checkpoint_id, "h1-fork")
    assert forked.state()["log"] == ["a", "b"]
    assert forked.run({"tag": "x"}).state["log"] == ["a", "b", "x"]
    assert thread.state()["log"] == ["a", "b", "d"], "the original is untouched"
    with pytest.raises(GraphStorageError) as info:
        thread.fork(mid.checkpoint_id, "h1-fork")
    assert info.value.code == "thread_exists"
    assert forked.delete() is True
    assert forked.delete() is False
    assert forked.state() == {}


def test_ext30_suspend_resume_and_interrupts():
    app = review_graph()
    thread = app.thread("r1")
    paused = thread.run({"topic": "solar"})
    assert paused.suspended and paused.state == {"topic": "solar", "text": "SOLAR"}
    assert thread.interrupts() == [GraphInterrupt("review", {"question": "approve SOLAR?"})]
    with pytest.raises(ThreadSuspendedError) as info:
        thread.run({"topic": "again"})
    assert info.value.code == "thread_suspended" and isinstance(info.value.details, dict)
    with pytest.raises(GraphValidationError) as info:
        thread.resume({"draft": "yes"})
    assert info.value.code == "resume_invalid"
    assert thread.interrupts(), "the thread keeps waiting"
    done = thread.resume({"review": "yes"})
    assert done.state["verdict"] == "yes" and thread.interrupts() == []
    assert done.run_id == paused.run_id
    again = thread.run({"topic": "wind"})
    assert again.suspended and again.run_id != paused.run_id


def test_ext30_retry_continues_without_rerunning_saved_nodes():
    calls = []
    fail = {"now": True}

    def first(state):
        calls.append("first")
        return {"a": 1}

    def second(state):
        calls.append("second")
        if fail["now"]:
            raise RuntimeError("flaky")
        return {"b": 2}

    wf = Graph(name="flaky")
    wf.add_node("first", first).add_node("second", second)
    wf.start("first").edge("first", "second").edge("second", END)
    app = wf.compile()
    thread = app.thread("f1")
    with pytest.raises(GraphError) as info:
        thread.run()
    assert info.value.code == "node_failed"
    with pytest.raises(GraphError) as info:
        thread.run()
    assert info.value.code == "thread_interrupted"
    fail["now"] = False
    done = thread.retry()
    assert done.state == {"a": 1, "b": 2}
    assert calls == ["first", "second", "second"]
    with pytest.raises(GraphError) as info:
        thread.retry()
    assert info.value.code == "nothing_to_retry"


def test_ext31_a_second_concurrent_caller_is_busy_or_waits():
    entered = threading.Event()
    release = threading.Event()

    def slow(state):
        entered.set()
        assert release.wait(30)
        return {"done": state.get("done", 0) + 1}

    def build(storage):
        wf = Graph(name="slow").add_node("slow", slow).start("slow").edge("slow", END)
        return wf.compile(storage, replace=True)

    app = build(None)
    outcome = {}
    worker = threading.Thread(target=lambda: outcome.setdefault("r", app.thread("b1").run()))
    worker.start()
    assert entered.wait(30)
    with pytest.raises(ThreadBusyError) as info:
        app.thread("b1").run()
    assert info.value.code == "thread_busy"
    waiting = build(Storage(None, on_busy="wait"))
    second = {}
    entered.clear()
    waiter = threading.Thread(target=lambda: second.setdefault("r", waiting.thread("b1").run()))
    waiter.start()
    release.set()
    worker.join(30)
    waiter.join(30)
    assert outcome["r"].state["done"] == 1
    assert second["r"].state["done"] == 2


def test_ext31_a_thread_of_another_graph_is_workflow_mismatch():
    counter_graph().thread("shared").run()
    other = review_graph()
    for call in (
        lambda t: t.run({"topic": "x"}),
        lambda t: t.state(),
        lambda t: t.history(),
        lambda t: t.delete(),
    ):
        with pytest.raises(GraphError) as info:
            call(other.thread("shared"))
        assert info.value.code == "workflow_mismatch"


def test_ext32_audit_records_every_operation_with_its_actor():
    app = review_graph(audit=True)
    thread = app.thread("a1", actor="reviewer-7")
    paused = thread.run({"topic": "t"})
    thread.interrupts()
    done = thread.resume({"review": "ok"})
    thread.history()
    entries = thread.audit()
    # Reads act on nothing and leave no entry; run and resume act on the thread.
    assert [e["action"] for e in entries] == ["resume", "run"]
    assert {e["actor"] for e in entries} == {"reviewer-7"}
    assert entries[0]["checkpoint_id"] == done.checkpoint_id
    assert entries[1]["checkpoint_id"] == paused.checkpoint_id
    assert all(isinstance(e["at_ms"], int) for e in entries)
    assert len(thread.audit(limit=1)) == 1
    plain = review_graph(name="noaudit")
    plain.thread("a2").run({"topic": "t"})
    assert plain.thread("a2").audit() == []


def test_ext32_audit_covers_every_acting_operation_and_no_read_sync_or_async():
    import asyncio

    fails = {"left": 1}

    def flaky(state):
        if fails["left"]:
            fails["left"] -= 1
            raise RuntimeError("flaky")
        return {"n": state.get("n", 0) + 1}

    wf = Graph(name="audited")
    wf.add_node("flaky", flaky).start("flaky").edge("flaky", END)
    app = wf.compile(audit=True, replace=True)
    thread = app.thread("t", actor="ops")
    with pytest.raises(GraphError):
        thread.run()
    retried = thread.retry()
    again = thread.run()
    rewound = thread.rewind(retried.checkpoint_id)
    forked = thread.fork(again.checkpoint_id, "t-fork")
    before = thread.audit()

    async def reads():
        await thread.astate()
        await thread.ainterrupts()
        await thread.ahistory()
        await thread.aaudit()

    thread.state()
    thread.interrupts()
    thread.history()
    asyncio.run(reads())
    assert thread.audit() == before
    assert [e["action"] for e in before] == ["fork", "rewind", "run", "retry", "run"]
    assert before[0]["checkpoint_id"] == forked.history()[0]["id"]
    assert before[1]["checkpoint_id"] == rewound["id"]
    assert before[2]["checkpoint_id"] == again.checkpoint_id
    assert before[3]["checkpoint_id"] == retried.checkpoint_id
    assert {e["actor"] for e in before} == {"ops"}
    assert [e["action"] for e in forked.audit()] == ["forked"]
    assert forked.delete() is True
    assert [e["action"] for e in forked.audit()] == ["delete", "forked"]

    async def acting():
        await thread.arun()
        return await thread.aaudit()

    assert [e["action"] for e in asyncio.run(acting())][:2] == ["run", "fork"]


def test_ext30_memory_and_sqlite_storage(tmp_path, isolated_state):
    mem = counter_graph("mem", ":memory:")
    assert mem.thread("m").run().state["n"] == 1
    assert mem.thread("m").run().state["n"] == 2
    path = tmp_path / "threads.db"
    disk = counter_graph("disk", f"sqlite:///{path}")
    disk.thread("d").run()
    assert path.exists() and not isolated_state.exists()
    assert read(path, "SELECT count(*) FROM graph_threads") == [(1,)]
    assert Storage("postgresql://localhost/x").url == "postgresql://localhost/x"
    with pytest.raises(Exception, match="store URL"):
        Storage("mysql://x")


def test_ext30_storage_accepts_every_store_url_form(tmp_path, monkeypatch, store_kind):
    """EXT-30 / STORE-1: graph storage takes the store URLs COMPOSE_STORE takes,
    the seed's `compile("sqlite://workflows.db")` included (relative to the
    current directory); a password never shows in the error."""
    monkeypatch.chdir(tmp_path)
    relative = review_graph("relative", "sqlite://workflows.db")
    first = relative.thread("request-1", actor="reviewer-7").run({"topic": "solar"})
    assert first.suspended and (tmp_path / "workflows.db").exists()
    done = relative.thread("request-1").resume({"review": "yes"})
    assert done.state["verdict"] == "yes" and not done.suspended
    assert read(tmp_path / "workflows.db", "SELECT count(*) FROM graph_threads") == [(1,)]
    path = tmp_path / "nested" / "abs.db"
    path.parent.mkdir()
    assert counter_graph("absolute", f"sqlite:///{path}").thread("a").run().state["n"] == 1
    assert read(path, "SELECT count(*) FROM graph_threads") == [(1,)]
    if store_kind == "postgresql":
        served = counter_graph("served", os.environ["COMPOSE_STORE"])
        assert served.thread("p").run().state["n"] == 1
        assert served.thread("p").run().state["n"] == 2
    with pytest.raises(ConfigError, match="store URL") as bad:
        Storage("postgresql://user:hunter2@localhost/db?sslmode=sometimes")
    assert "hunter2" not in str(bad.value)


def test_ext30a_checkpoints_store_deltas_and_periodic_snapshots():
    """A thread whose state holds a growing message list: bytes per step do not grow."""
    wf = Graph(reducers={"messages": "append"}, name="chat")
    wf.add_node(
        "say", lambda s: {"messages": [{"role": "user", "text": f"message {len(s['messages'])}"}]}
    )
    wf.start("say").edge("say", END)
    app = wf.compile()
    thread = app.thread("long")
    history = [{"role": "user", "text": "x" * 80} for _ in range(200)]
    thread.run({"messages": history})
    path = _engine.get_store().path

    def stored_bytes() -> int:
        return read(
            path,
            "SELECT sum(length(coalesce(delta_json, '')) + length(coalesce(snapshot_json, '')) "
            f"+ length(meta_json)) FROM {checkpoints(path)}",
        )[0][0]

    base = stored_bytes()
    for _ in range(100):
        thread.run()
    at_100 = stored_bytes()
    for _ in range(300):
        thread.run()
    at_400 = stored_bytes()
    # Bytes per step after N steps (all the thread's storage over its steps).
    per_step_100 = at_100 / 101
    per_step_400 = at_400 / 401
    assert 0.5 < per_step_400 / per_step_100 < 2, (per_step_100, per_step_400)
    state_bytes = len(json.dumps(thread.state()))
    assert (at_400 - base) / 400 < state_bytes / 50, "far below a full state per step"
    (kinds,) = read(
        path,
        "SELECT count(snapshot_json) AS snapshots, count(delta_json) AS deltas "
        f"FROM {checkpoints(path)}",
    )
    assert kinds[0] >= 2 and kinds[1] > kinds[0] * 10
    assert len(thread.state()["messages"]) == 601
    assert thread.state()["messages"][-1]["text"] == "message 600"


def test_ext33_cli_threads_history_rewind_and_prune(capsys):
    app = counter_graph()
    thread = app.thread("cli-1")
    first = thread.run({"tag": "a"})
    thread.run({"tag": "b"})
    review_graph().thread("cli-2").run({"topic": "x"})
    assert main(["threads"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and {ln.split()[0] for ln in lines} == {"cli-1", "cli-2"}
    assert "suspended" in next(ln for ln in lines if ln.startswith("cli-2"))
    assert main(["threads", "--graph", "counter", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["thread_id"] for r in rows] == ["cli-1"] and rows[0]["status"] == "idle"
    assert main(["thread", "history", "cli-1", "--json"]) == 0
    history = json.loads(capsys.readouterr().out)
    assert history == thread.history()
    assert main(["thread", "history", "cli-1"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith(history[0]["id"])
    assert main(["thread", "rewind", "cli-1", first.checkpoint_id]) == 0
    assert "rewound" in capsys.readouterr().out
    assert thread.state()["log"] == ["a"]
    assert main(["thread", "rewind", "cli-1", "bogus"]) == 1
    assert capsys.readouterr().err.startswith("compose: thread 'cli-1' has no checkpoint 'bogus'")
    assert main(["thread", "history", "nope"]) == 1
    assert capsys.readouterr().err == "compose: no thread 'nope' in this storage\n"
    assert main(["threads", "--prune", "--older-than", "1d"]) == 0
    assert capsys.readouterr().out == "pruned 0 threads\n"
    path = _engine.get_store().path
    # A cutoff date in the future: every thread is older.
    assert main(["threads", "--prune", "--older-than", "2999-01-01", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == ["cli-1", "cli-2"]
    assert thread.state() == {}
    assert read(path, f"SELECT count(*) FROM {checkpoints(path)}") == [(0,)]
    assert main(["threads", "--prune", "--older-than", "30d"]) == 0
    assert capsys.readouterr().out == "pruned 0 threads\n"
    assert main(["threads", "--prune"]) == 1
    assert "--older-than" in capsys.readouterr().err


def test_ext30_rewinding_to_a_suspended_checkpoint_waits_again_and_resumes_in_a_new_run():
    app = review_graph(name="rewound")
    thread = app.thread("rw")
    paused = thread.run({"topic": "a"})
    thread.resume({"review": "no"})
    assert thread.interrupts() == []
    thread.rewind(paused.checkpoint_id)
    assert [i.node for i in thread.interrupts()] == ["review"]
    again = thread.resume({"review": "yes"})
    assert again.state["verdict"] == "yes" and again.run_id != paused.run_id


def test_ext27_thread_methods_have_async_twins():
    import asyncio

    app = counter_graph(name="aio-thread")

    async def main():
        thread = app.thread("x")
        first = await thread.arun({"tag": "a"})
        state = await thread.astate()
        history = await thread.ahistory()
        return first, state, history

    first, state, history = asyncio.run(main())
    assert first.state == state and history[0]["id"] == first.checkpoint_id


@pytest.mark.sqlite_file
def test_ext0_3_a_version_2_store_gains_the_graph_tables_in_place(tmp_path):
    path = tmp_path / "old" / "runs.db"
    # Made by another process.
    subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import composeai as c\n"
                "@c.flow\ndef f():\n    return 1\n"
                "f.run()\n"
                "from composeai import _engine\n_engine.get_store().flush()\n"
            ),
        ],
        env={**os.environ, "COMPOSE_DIR": str(path.parent)},
        check=True,
        timeout=60,
    )
    with closing(sqlite3.connect(path)) as db:
        db.executescript(
            "DROP TABLE graph_threads; DROP TABLE graph_checkpoints; DROP TABLE graph_audit; "
            "DROP TABLE graph_steps; "
            "PRAGMA user_version = 2;"
        )
        runs_before = db.execute("SELECT count(*) FROM runs").fetchone()[0]
    app = counter_graph("v2b", f"sqlite:///{path}")
    assert app.thread("new").run().state["n"] == 1
    assert read(path, "PRAGMA user_version") == [(13,)]
    assert read(path, "SELECT count(*) FROM runs") == [(runs_before + 1,)]


# A version 8 store: every checkpoint in `graph_checkpoints` under a ULID,
# threads without a chain. Made from a version 9 store by moving its rows.
TO_VERSION_8 = """
import sqlite3, sys
from composeai import _core

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def ulid_text(blob):
    n = int.from_bytes(blob, "big")
    return "".join(CROCKFORD[(n >> (5 * (25 - i))) & 31] for i in range(26))


db = sqlite3.connect(sys.argv[1])
rows = db.execute(
    "SELECT s.ckpt, t.thread_id, s.source, s.status, s.run_id, s.step, s.created_at_ms, "
    "s.delta_json, s.snapshot_json, s.meta_json FROM graph_steps s "
    "JOIN graph_threads t ON t.chain = s.ckpt >> 28 ORDER BY s.ckpt"
).fetchall()
ids = {}
for ckpt, thread_id, source, status, run_id, step, at, delta, snap, meta in rows:
    ids[ckpt] = _core.ulid()
    run_id = ulid_text(run_id)
    (rid,) = db.execute("SELECT rid FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    db.execute(
        "INSERT INTO graph_checkpoints(checkpoint_id, thread_id, rid, parent_id, version, "
        "source, status, run_id, step, created_at_ms, delta_json, snapshot_json, meta_json) "
        "VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (ids[ckpt], thread_id, rid, ids.get(ckpt - 1), ckpt & ((1 << 28) - 1), source,
         status, run_id, step, at, delta, snap, meta),
    )
db.executescript(
    "DROP TABLE graph_steps; DROP INDEX graph_threads_by_chain; "
    "ALTER TABLE graph_threads DROP COLUMN chain; PRAGMA user_version = 8;"
)
db.commit()
"""

MAKE_V9_THREAD = """
import sys
from composeai.graph import END, Graph
wf = Graph(reducers={"log": "append"}, name="upgraded")
wf.add_node("inc", lambda s: {"n": s.get("n", 0) + 1, "log": [s.get("tag", "-")]})
wf.start("inc").edge("inc", END)
thread = wf.compile(sys.argv[1]).thread("old")
thread.run({"tag": "a"})
thread.run({"tag": "b"})
thread.graph._store().flush()
"""


@pytest.mark.sqlite_file
def test_ext30_a_version_8_thread_keeps_its_history_and_continues_in_graph_steps(tmp_path):
    """EXT-0.3/EXT-30: a thread stored before schema version 9 (checkpoints
    with ULIDs in `graph_checkpoints`) is read, continued, rewound and
    forked after the upgrade; its new checkpoints go to `graph_steps`,
    linked to the old head."""
    path = tmp_path / "v8" / "runs.db"
    path.parent.mkdir()
    url = f"sqlite:///{path}"
    for script, arg in ((MAKE_V9_THREAD, url), (TO_VERSION_8, str(path))):
        subprocess.run([sys.executable, "-c", script, arg], check=True, timeout=60)
    assert read(path, "PRAGMA user_version") == [(8,)]
    old_ids = [
        r[0] for r in read(path, "SELECT checkpoint_id FROM graph_checkpoints ORDER BY version")
    ]
    assert len(old_ids) == 4 and all(len(i) == 26 for i in old_ids)
    thread = counter_graph("upgraded", url).thread("old")
    before = thread.history()
    assert [h["id"] for h in before] == old_ids[::-1]
    assert thread.state() == {"n": 2, "log": ["a", "b"], "tag": "b"}
    assert read(path, "PRAGMA user_version") == [(13,)]
    third = thread.run({"tag": "c"})
    assert third.state["log"] == ["a", "b", "c"]
    after = thread.history()
    assert [h["version"] for h in after] == [6, 5, 4, 3, 2, 1]
    assert after[0]["id"] == third.checkpoint_id and third.checkpoint_id not in old_ids
    assert after[1]["parent_id"] == old_ids[-1], "the first new checkpoint follows the old head"
    assert after[2:] == before
    assert read(path, "SELECT count(*) FROM graph_steps") == [(2,)]
    rewound = thread.rewind(old_ids[1])
    assert rewound["parent_id"] == third.checkpoint_id and rewound["version"] == 7
    assert thread.state()["log"] == ["a"]
    forked = thread.fork(old_ids[3], "old-fork")
    assert forked.state()["log"] == ["a", "b"]
    assert forked.run({"tag": "d"}).state["log"] == ["a", "b", "d"]
    assert forked.history()[-1]["parent_id"] == old_ids[3]
    assert thread.run({"tag": "e"}).state["log"] == ["a", "e"]
    assert thread.delete() and forked.delete()
    assert read(path, f"SELECT count(*) FROM {checkpoints(path)}") == [(0,)]
