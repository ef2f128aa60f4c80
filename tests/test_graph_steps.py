"""The graph step path: a thread run claimed, created and opened in one core
call, node spans queued by the core with their step, plain updates encoded
without the general codec, and the compact progress a checkpoint stores
(EXT-21, EXT-27, EXT-30, EXT-30a)."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing

import pytest

from composeai import _codec, _engine
from composeai.graph import (
    END,
    Graph,
    GraphStorageError,
    _input_json,
    _plain_update_json,
    suspend,
)


def _rows(path, sql: str, args: tuple = ()) -> list:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return db.execute(sql, args).fetchall()


def _linear(name: str, storage=None):
    wf = Graph(name=name)
    wf.add_node("a", lambda s: {"x": s["x"] + 1, "tag": "é"})
    wf.add_node("b", lambda s: {"x": s["x"] + 1, "done": True})
    wf.start("a").edge("a", "b").edge("b", END)
    return wf.compile(storage, replace=True)


@pytest.mark.sqlite_file
def test_ext21_thread_node_spans_store_step_node_attempt_and_update(isolated_state):
    """Each node span of a thread run is stored under the run's root span
    with its step, node, attempt and step key, its output the node's update;
    the root span carries the thread id and the run's summary."""
    result = _linear("spans-stored").thread("t1").run({"x": 0})
    _engine.get_store().flush()
    db = isolated_state / "runs.db"
    (rid,) = _rows(db, "SELECT rid FROM runs WHERE run_id = ?", (result.run_id,))[0]
    spans = _rows(
        db,
        "SELECT kind, name, step_key, attributes_json, output_json, status, parent, span_id "
        "FROM spans WHERE rid = ? ORDER BY started_at",
        (rid,),
    )
    root = [s for s in spans if s[0] == "graph"]
    nodes = [s for s in spans if s[0] == "task"]
    assert len(root) == 1 and root[0][1] == "spans-stored" and root[0][6] is None
    assert json.loads(root[0][3]) == {"thread_id": "t1"}
    assert json.loads(root[0][4]) == {"steps": 2, "status": "completed", "thread_id": "t1"}
    assert [(n[1], n[2], n[5]) for n in nodes] == [("a", "a@0", "ok"), ("b", "b@1", "ok")]
    assert [json.loads(n[3]) for n in nodes] == [
        {"step": 0, "node": "a", "attempt": 1},
        {"step": 1, "node": "b", "attempt": 1},
    ]
    assert [json.loads(n[4]) for n in nodes] == [{"x": 1, "tag": "é"}, {"x": 2, "done": True}]
    assert {n[6] for n in nodes} == {root[0][7]}, "node spans hang under the run's root"


@pytest.mark.sqlite_file
def test_ext30_a_thread_run_that_cannot_open_fails_its_run_and_frees_the_thread(isolated_state):
    """A head that cannot be rebuilt: `run()` raises `checkpoint_corrupt`, its
    new run is settled failed and the thread is released, not left busy."""
    thread = _linear("corrupt-head").thread("t1")
    first = thread.run({"x": 0})
    # A rewound head was not settled by a run of this process (not cached).
    head = thread.rewind(first.checkpoint_id)["id"]
    _engine.get_store().flush()
    db = isolated_state / "runs.db"
    with closing(sqlite3.connect(db)) as conn:
        # A thread's checkpoint id is its chain (hex) and version; its row in
        # `graph_steps` has the chain in the rowid's high bits.
        chain, version = head.split(".")
        changed = conn.execute(
            "UPDATE graph_steps SET meta_json = '{' WHERE ckpt = ?",
            ((int(chain, 16) << 28) | int(version),),
        ).rowcount
        conn.commit()
    assert changed == 1
    with pytest.raises(GraphStorageError) as info:
        thread.run({"x": 5})
    assert info.value.code == "checkpoint_corrupt"
    status, error = _rows(
        db, "SELECT status, error_json FROM runs WHERE kind = 'graph' ORDER BY rid DESC LIMIT 1"
    )[0]
    assert status == "failed" and json.loads(error)["type"] == "GraphStorageError"
    assert _rows(db, "SELECT status, owner FROM graph_threads")[0] == ("failed", None)


@pytest.mark.parametrize(
    "update",
    [
        {},
        {"x": 1, "neg": -(10**17), "t": True, "f": False, "none": None, "s": 'a "q" \\ \n\t'},
        {"key with space": "v", "ctl": "\x01"},
    ],
)
def test_ext23_plain_updates_are_encoded_as_the_codec_writes_them(update):
    assert _plain_update_json(update) == _codec.dumps(update)
    assert _input_json(update) == _codec.dumps(update)


@pytest.mark.parametrize(
    "update",
    [
        {"f": 1.5},
        {"big": 10**18},
        {"u": "é"},
        {"é": 1},
        {1: "int key"},
        {"l": [1, 2]},
        {"d": {"a": 1}},
    ],
)
def test_ext23_other_updates_take_the_codec(update):
    assert _plain_update_json(update) is None


@pytest.mark.sqlite_file
def test_ext30a_checkpoints_store_join_and_pending_progress_only_when_there_is_some(
    isolated_state,
):
    """A step's checkpoint leaves out empty join and pending lists; a join
    that waits for a source and a suspended node are stored, and the run
    resumes from them."""

    def wait(state, ctx):
        if ctx.resume is None:
            return suspend("go?")
        return {"w": ctx.resume}

    wf = Graph(name="join-progress")
    wf.add_node("s", lambda s: {})
    wf.add_node("fast", lambda s: {"f": 1})
    wf.add_node("slow", wait)
    wf.add_node("j", lambda s: {"joined": [s.get("f"), s.get("w")]})
    wf.start("s").edge("s", "fast").edge("s", "slow")
    wf.join(["fast", "slow"], "j").edge("j", END)
    thread = wf.compile(replace=True).thread("t1")
    paused = thread.run()
    assert paused.suspended and [i.node for i in paused.interrupts] == ["slow"]
    _engine.get_store().flush()
    metas = [
        json.loads(m)
        for (m,) in _rows(
            isolated_state / "runs.db",
            "SELECT meta_json FROM graph_steps ORDER BY ckpt",
        )
    ]
    assert metas[-2] == {"step": 1, "next": ["fast", "slow"]}
    assert metas[-1]["joins"] == [["fast"]]
    assert [p["node"] for p in metas[-1]["pending"]] == ["slow"]
    assert [i.node for i in thread.interrupts()] == ["slow"]
    resumed = thread.resume({"slow": "yes"})
    assert resumed.state["joined"] == [1, "yes"] and not resumed.suspended
