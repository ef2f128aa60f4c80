"""Graph runs across real processes and after a real `kill -9` (EXT-21, EXT-27, EXT-29,
EXT-30, EXT-31).

The graph module is written to tmp_path as a real file; every child is a fresh
`sys.executable` with its own interpreter state. Node and task bodies append one line per
execution to a side-effect log, labelled with the process (env PROC), so the tests prove
which process ran what and that saved work never runs twice.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import sys
from pathlib import Path

import pytest

try:
    import _proc
except ImportError:  # pragma: no cover - when tests/ is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _proc

TICKETS = """\
import os
import signal

from composeai import task
from composeai.graph import END, Graph, suspend


@task
def lookup(topic: str) -> str:
    side_effect("lookup", topic)
    return f"facts:{topic}"


def first(state):
    side_effect("node", "first")
    return {"a": 1}


def second(state):
    side_effect("node", "second")
    facts = lookup(state["topic"])
    if os.environ.get("CRASH_AT") == "second":
        os.kill(os.getpid(), signal.SIGKILL)
    return {"facts": facts}


def third(state):
    side_effect("node", "third")
    return {"c": state["facts"].upper()}


def review(state, ctx):
    side_effect("node", "review", ctx.attempt)
    noted = lookup("review-" + state["topic"])
    if ctx.resume is None:
        return suspend({"question": "ship?", "noted": noted})
    return {"verdict": ctx.resume}


wf = Graph(name="tickets")
for fn in (first, second, third, review):
    wf.add_node(fn.__name__, fn)
wf.start("first").edge("first", "second").edge("second", "third").edge("third", "review")
wf.edge("review", END)
app = wf.compile()
"""


@pytest.fixture
def box(tmp_path) -> _proc.Sandbox:
    sandbox = _proc.Sandbox(tmp_path)
    sandbox.write_module("tickets", TICKETS)
    return sandbox


def effects(box: _proc.Sandbox, kind: str) -> list[tuple[str, ...]]:
    return [e for e in box.side_effects() if e[0] == kind]


def test_ext30_a_thread_suspended_in_one_process_resumes_in_another(box):
    first = box.run(
        """
        from tickets import app
        r = app.thread("case-1").run({"topic": "billing"})
        emit(suspended=r.suspended, run_id=r.run_id, interrupts=[i.payload for i in r.interrupts])
        """,
        PROC="A",
    ).ok()
    assert first["suspended"]
    assert first["interrupts"] == [{"question": "ship?", "noted": "facts:review-billing"}]
    second = box.run(
        """
        from tickets import app
        t = app.thread("case-1")
        pending = [i.node for i in t.interrupts()]
        r = t.resume({"review": "yes"})
        emit(pending=pending, state=r.state, run_id=r.run_id, history=len(t.history(limit=100)))
        """,
        PROC="B",
    ).ok()
    assert second["pending"] == ["review"]
    assert second["state"]["verdict"] == "yes" and second["run_id"] == first["run_id"]
    nodes = [(e[1], e[-1]) for e in effects(box, "node")]
    assert nodes == [
        ("first", "A"),
        ("second", "A"),
        ("third", "A"),
        ("review", "A"),
        ("review", "B"),
    ]
    # The review's lookup ran once, in A; B replayed it from the journal (EXT-21).
    assert [(e[1], e[-1]) for e in effects(box, "lookup")] == [
        ("billing", "A"),
        ("review-billing", "A"),
    ]
    status = box.query("SELECT status FROM runs WHERE run_id = ?", (first["run_id"],))
    assert status == [("completed",)]


def test_ext29_compose_resume_of_a_threadless_run_from_a_fresh_process(box):
    first = box.run(
        """
        from tickets import app
        r = app.run({"topic": "refund"})
        emit(run_id=r.run_id, suspended=r.suspended)
        """,
        PROC="A",
    ).ok()
    assert first["suspended"]
    assert box.pending(first["run_id"])[0][:2] == ("node:review", "graph")
    done = box.run(
        f"""
        import composeai as compose
        import tickets
        r = compose.resume({first["run_id"]!r}, answers={{"review": "no"}})
        emit(id=r.id, status=r.status, output=r.output)
        """,
        PROC="B",
    ).ok()
    assert (done["id"], done["status"]) == (first["run_id"], "completed")
    assert done["output"]["verdict"] == "no"
    assert [e[1:] for e in effects(box, "node")][-1] == ("review", "2", "B")
    assert [e[-1] for e in effects(box, "lookup")] == ["A", "A"]
    unknown = box.run(
        f"""
        import composeai as compose
        compose.resume({first["run_id"]!r})
        """
    ).error()
    assert unknown["error_type"] == "ConfigError" and "not compiled" in unknown["message"]


def test_ext30_kill_9_inside_a_node_then_retry_in_a_fresh_process(box):
    crashed = box.run(
        """
        from tickets import app
        app.thread("crash-1").run({"topic": "outage"})
        """,
        PROC="A",
        CRASH_AT="second",
    )
    assert crashed.killed, crashed.describe()
    refused = box.run(
        """
        from tickets import app
        app.thread("crash-1").run({"topic": "outage"})
        """
    ).error()
    assert refused["message"].startswith("thread 'crash-1': its last run did not finish")
    done = box.run(
        """
        from tickets import app
        r = app.thread("crash-1").retry()
        emit(state=r.state, suspended=r.suspended)
        """,
        PROC="B",
    ).ok()
    assert done["suspended"] and done["state"]["c"] == "FACTS:OUTAGE"
    nodes = [(e[1], e[-1]) for e in effects(box, "node")]
    assert nodes == [
        ("first", "A"),
        ("second", "A"),
        ("second", "B"),
        ("third", "B"),
        ("review", "B"),
    ], "the saved first node did not run again"
    lookups = [(e[1], e[-1]) for e in effects(box, "lookup")]
    assert lookups == [("outage", "A"), ("review-outage", "B")], "the journaled task replayed"
    if not box.store:
        with sqlite3.connect(box.db_path) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


LOOP = """\
import time

from composeai.graph import END, Graph


def tick(state):
    n = state.get("n", 0) + 1
    side_effect("tick", n)
    # Long enough that the driver's 10 ms polls see the run mid-way, so its
    # kill lands inside the run however fast the machine commits.
    time.sleep(0.005)
    return {"n": n, "log": [n]}


wf = Graph(reducers={"log": "append"}, name="loop")
wf.add_node("tick", tick)
wf.route("tick", lambda s: "again" if s["n"] < 40 else "stop", {"again": "tick", "stop": END})
wf.start("tick")
app = wf.compile()
"""

DRIVE_LOOP = """
import os
from composeai.graph import GraphError
from loop import app
t = app.thread("spin")
# A kill after the last checkpoint leaves the thread finished.
state = t.state()
if state.get("n") != 40:
    try:
        state = t.run().state
    except GraphError as exc:
        if exc.code != "thread_interrupted":
            raise
        state = t.retry().state
emit(n=state["n"], log=state["log"])
"""


def test_ext30_kill_9_at_random_points_never_loses_or_repeats_saved_steps(tmp_path):
    box = _proc.Sandbox(tmp_path)
    box.write_module("loop", LOOP)
    rng = random.Random(11)
    kills = 0
    for attempt in range(12):
        proc = box.spawn(DRIVE_LOOP, PROC=f"p{attempt}")
        if attempt < 6:
            # Kill once some ticks have run, at a random point of the run.
            target = len(box.side_effects()) + rng.randint(1, 6)
            _proc.wait_until(
                lambda t=target, p=proc: len(box.side_effects()) >= t or p.poll() is not None,
                what="ticks",
            )
            proc.send_signal(signal.SIGKILL)
        result = _proc.finish(proc)
        if result.killed:
            kills += 1
            continue
        data = result.ok()
        assert data["n"] == 40 and data["log"] == list(range(1, 41))
        break
    else:
        raise AssertionError("the loop never finished")
    ticks = [int(e[1]) for e in box.side_effects()]
    # Each tick ran at least once; a tick re-ran only after a kill, at most once per kill.
    assert set(ticks) == set(range(1, 41))
    assert kills >= 1 and len(ticks) - 40 <= kills
    if not box.store:
        with sqlite3.connect(box.db_path) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert os.path.exists(box.db_path)


def test_ext27_a_threadless_run_killed_mid_node_continues_with_compose_resume(box):
    crashed = box.run(
        """
        from tickets import app
        app.run({"topic": "dns"})
        """,
        PROC="A",
        CRASH_AT="second",
    )
    assert crashed.killed, crashed.describe()
    (run_id,) = box.run_ids()
    assert box.run_row(run_id)["status"] == "running"
    done = box.run(
        f"""
        import composeai as compose
        import tickets
        r = compose.resume({run_id!r})
        paused = [r.status, r.id, r.pending.id]
        r = compose.resume({run_id!r}, answers={{r.pending.id: "ok"}})
        emit(paused=paused, status=r.status, output=r.output)
        """,
        PROC="B",
    ).ok()
    assert done["paused"] == ["paused", run_id, "node:review"]
    assert done["status"] == "completed" and done["output"]["c"] == "FACTS:DNS"
    nodes = [(e[1], e[-1]) for e in effects(box, "node")]
    assert nodes[:3] == [("first", "A"), ("second", "A"), ("second", "B")]
    assert effects(box, "lookup")[0][1:] == ("dns", "A")


GATES = """\
from composeai import approve, ask_human, task
from composeai.graph import END, Graph


@task
def draft(topic: str) -> str:
    side_effect("draft", topic)
    return f"draft:{topic}"


def write(state):
    side_effect("node", "write")
    text = draft(state["topic"])
    return {"text": text, "sent": approve("ship", {"text": text})}


async def why(state):
    side_effect("node", "why")
    return {"reason": ask_human("reason", "Why send it?")}


wf = Graph(name="gates")
wf.add_node("write", write).add_node("why", why)
wf.start("write").edge("write", "why").edge("why", END)
app = wf.compile()
"""


@pytest.fixture
def gates(tmp_path) -> _proc.Sandbox:
    sandbox = _proc.Sandbox(tmp_path)
    sandbox.write_module("gates", GATES)
    return sandbox


def test_ext21_approve_and_ask_human_in_nodes_resume_by_id_from_fresh_processes(gates):
    first = gates.run(
        """
        from gates import app
        r = app.run({"topic": "solar"})
        emit(run_id=r.run_id, suspended=r.suspended, interrupts=[[i.node, i.payload] for i in r.interrupts])
        """,
        PROC="A",
    ).ok()
    run_id = first["run_id"]
    assert first["suspended"] and first["interrupts"] == [
        [
            "write",
            {
                "id": "ship",
                "kind": "approval",
                "question": None,
                "payload": {"text": "draft:solar"},
            },
        ]
    ]
    assert [p[:2] for p in gates.pending(run_id)] == [("node:write", "graph")]
    # The approve() id answers it, as for a flow (FLOW-43); the async node then asks.
    second = gates.run(
        f"""
        import composeai as compose
        import gates
        r = compose.resume({run_id!r}, answers={{"ship": True}})
        emit(status=r.status, pending=r.pending.model_dump())
        """,
        PROC="B",
    ).ok()
    assert second["status"] == "paused"
    assert second["pending"] == {
        "id": "node:why",
        "kind": "question",
        "question": "Why send it?",
        "payload": None,
    }
    third = gates.run(
        f"""
        import asyncio
        import composeai as compose
        import gates
        r = asyncio.run(compose.aresume({run_id!r}, answers={{"reason": "urgent"}}))
        emit(id=r.id, status=r.status, output=r.output)
        """,
        PROC="C",
    ).ok()
    assert (third["id"], third["status"]) == (run_id, "completed")
    assert third["output"] == {
        "topic": "solar",
        "text": "draft:solar",
        "sent": True,
        "reason": "urgent",
    }
    nodes = [(e[1], e[-1]) for e in effects(gates, "node")]
    assert nodes == [("write", "A"), ("write", "B"), ("why", "B"), ("why", "C")]
    # The node's finished task ran once, in A; B replayed it (EXT-21).
    assert [(e[1], e[-1]) for e in effects(gates, "draft")] == [("solar", "A")]
    assert gates.query("SELECT status FROM runs WHERE run_id = ?", (run_id,)) == [("completed",)]


def test_ext30_thread_resume_answers_approve_and_ask_human_across_processes(gates):
    first = gates.run(
        """
        from gates import app
        r = app.thread("g-1", actor="alice").run({"topic": "wind"})
        emit(suspended=r.suspended, node=r.interrupts[0].node)
        """,
        PROC="A",
    ).ok()
    assert first == {"suspended": True, "node": "write"}
    second = gates.run(
        """
        from gates import app
        t = app.thread("g-1")
        pending = [i.payload["id"] for i in t.interrupts()]
        r = t.resume({"write": False})
        emit(pending=pending, asked=[i.payload["question"] for i in r.interrupts])
        """,
        PROC="B",
    ).ok()
    assert second == {"pending": ["ship"], "asked": ["Why send it?"]}
    third = gates.run(
        """
        import asyncio
        from gates import app
        r = asyncio.run(app.thread("g-1").aresume({"why": "policy"}))
        emit(state=r.state, suspended=r.suspended)
        """,
        PROC="C",
    ).ok()
    assert third["state"]["sent"] is False and third["state"]["reason"] == "policy"
    assert not third["suspended"]
    assert [(e[1], e[-1]) for e in effects(gates, "draft")] == [("wind", "A")]
