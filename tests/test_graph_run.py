"""Running graphs: nodes, reducers, steps, routes, joins, goto, limits, results,
suspend/resume, durable runs and traces (EXT-21 … EXT-29), including every example of
the third founding seed rewritten for composeai.graph."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import threading
from contextlib import closing

import pytest

import composeai as compose
from composeai import task
from composeai.errors import BudgetExceededError, SerializationError
from composeai.graph import (
    END,
    Graph,
    GraphError,
    GraphInterrupt,
    GraphLimitError,
    GraphResult,
    GraphValidationError,
    NodeContext,
    goto,
    suspend,
)

# -- the seed's examples ---------------------------------------------------------------


def test_seed_intro_one_node_graph():
    wf = Graph()
    wf.add_node("draft", lambda state: {"text": f"About {state['topic']}"})
    wf.start("draft").edge("draft", END)
    result = wf.compile().run({"topic": "solar panels"})
    assert result.state == {"topic": "solar panels", "text": "About solar panels"}
    assert (result.steps, result.suspended, result.interrupts) == (1, False, [])


def test_seed_reducers_append_notes():
    wf = Graph(reducers={"notes": "append"})

    @wf.node
    def research(state):
        return {"notes": [f"facts about {state['topic']}"]}

    @wf.node
    def write(state):
        return {"text": "; ".join(state["notes"])}

    wf.start("research").edge("research", "write").edge("write", END)
    result = wf.compile().run({"topic": "solar panels"})
    assert result.state["text"] == "facts about solar panels"


def test_seed_node_decorator_summarize():
    wf = Graph()

    @wf.node
    def summarize(state):
        return {"summary": state["text"][:5]}

    wf.start("summarize").edge("summarize", END)
    assert wf.compile().run({"text": "Hello world"}).state["summary"] == "Hello"


def test_seed_route_classify():
    wf = Graph()
    wf.add_node("classify", lambda s: {"kind": "refund" if "money" in s["text"] else "other"})
    wf.add_node("refunds", lambda s: {"team": "refunds"})
    wf.add_node("general", lambda s: {"team": "general"})
    wf.route("classify", lambda s: s["kind"], {"refund": "refunds", "other": "general"})
    wf.start("classify").edge("refunds", END).edge("general", END)
    app = wf.compile()
    assert app.run({"text": "my money back"}).state["team"] == "refunds"
    assert app.run({"text": "hello"}).state["team"] == "general"


def test_seed_join_begin_a_b_merge():
    wf = Graph(reducers={"seen": "append"})
    wf.add_node("begin", lambda s: {"seen": ["begin"]})
    wf.add_node("a", lambda s: {"seen": ["a"]})
    wf.add_node("b", lambda s: {"seen": ["b"]})
    wf.add_node("merge", lambda s: {"merged": list(s["seen"])})
    wf.edge("begin", "a").edge("begin", "b").join(["a", "b"], "merge")
    wf.start("begin").edge("merge", END)
    result = wf.compile().run()
    assert result.state["merged"] == ["begin", "a", "b"]
    assert result.steps == 3


def test_seed_review_with_ctx_and_approve_suspend_resume():
    def approve(state, ctx):
        if ctx.resume is None:
            return suspend({"question": "Send this message?", "text": state["text"]})
        return {"approved": ctx.resume == "yes"}

    wf = Graph()
    wf.add_node("approve", approve)
    wf.start("approve").edge("approve", END)
    app = wf.compile()
    paused = app.run({"text": "Hello"})
    assert paused.suspended
    assert paused.interrupts == [
        GraphInterrupt("approve", {"question": "Send this message?", "text": "Hello"})
    ]
    assert paused.snapshot is not None and "snapshot" not in repr(paused)
    done = app.resume(paused.snapshot, {"approve": "yes"})
    assert done.state == {"text": "Hello", "approved": True}
    assert done.snapshot is None and not done.suspended
    assert done.run_id == paused.run_id


def test_seed_goto_pick():
    def pick(state):
        return goto("big" if state["n"] > 10 else "small", {"checked": True})

    wf = Graph()
    wf.add_node("pick", pick)
    wf.add_node("big", lambda s: {"size": "big"})
    wf.add_node("small", lambda s: {"size": "small"})
    wf.goto("pick", ["big", "small"])
    wf.start("pick").edge("big", END).edge("small", END)
    app = wf.compile()
    assert app.run({"n": 3}).state == {"n": 3, "checked": True, "size": "small"}
    assert app.run({"n": 30}).state["size"] == "big"


def test_seed_thread_in_sqlite_storage(tmp_path):
    def review(state, ctx):
        if ctx.resume is None:
            return suspend({"question": "Approve?"})
        return {"approve": ctx.resume}

    wf = Graph()
    wf.add_node("review", review).start("review").edge("review", END)
    app = wf.compile(f"sqlite:///{tmp_path / 'workflows.db'}")
    thread = app.thread("request-1", actor="reviewer-7")
    first = thread.run({"text": "Hello"})
    assert first.suspended and first.checkpoint_id and first.version > 0
    done = thread.resume({"review": "yes"})
    assert done.state == {"text": "Hello", "approve": "yes"}
    assert (tmp_path / "workflows.db").exists()


# -- EXT-21 nodes -------------------------------------------------------------------------


def test_ext21_sync_async_and_ctx_signatures():
    seen = {}

    async def fetch(state):
        await asyncio.sleep(0)
        return {"fetched": state["q"] * 2}

    def inspect_ctx(state, ctx: NodeContext):
        seen["ctx"] = ctx

    wf = Graph(name="sig")
    wf.add_node("fetch", fetch).add_node("inspect", inspect_ctx)
    wf.start("fetch").edge("fetch", "inspect").edge("inspect", END)
    result = wf.compile().run({"q": 2})
    assert result.state == {"q": 2, "fetched": 4}
    ctx = seen["ctx"]
    assert (ctx.run_id, ctx.step, ctx.node, ctx.attempt, ctx.resume) == (
        result.run_id,
        1,
        "inspect",
        1,
        None,
    )
    with pytest.raises(AttributeError):
        ctx.step = 5


def test_ext21_a_node_exception_is_node_failed_with_the_cause():
    def boom(state):
        raise KeyError("missing")

    wf = Graph(name="boom").add_node("boom", boom).start("boom").edge("boom", END)
    with pytest.raises(GraphError) as info:
        wf.compile().run()
    assert info.value.code == "node_failed"
    assert isinstance(info.value.__cause__, KeyError)
    assert "'boom'" in str(info.value) and info.value.details["node"] == "boom"


def test_ext21_tasks_inside_a_node_replay_after_suspend():
    calls = []

    @task
    def expensive(x: int) -> int:
        calls.append(x)
        return x * 10

    def node(state, ctx):
        value = expensive(state["x"])
        stamp = compose.now()
        if ctx.resume is None:
            return suspend({"value": value})
        return {"value": value, "answer": ctx.resume, "stamp": stamp.isoformat()}

    wf = Graph(name="replay").add_node("work", node).start("work").edge("work", END)
    app = wf.compile()
    paused = app.run({"x": 4})
    assert calls == [4]
    done = app.resume(paused.snapshot, {"work": "ok"})
    assert calls == [4], "the task journaled under the node's scope replayed"
    assert done.state["value"] == 40 and done.state["answer"] == "ok"
    from composeai import _engine

    journal = dict(_engine.get_store().journal(done.run_id))
    assert "work@0/expensive#1" in journal and "work@0/now#1" in journal


def test_ext21_node_spans_carry_step_node_and_attempt(capsys):
    from composeai import _engine
    from composeai.cli import main

    wf = Graph(name="spans")
    wf.add_node("one", lambda s: {"a": 1}).add_node("two", lambda s: {"b": 2})
    wf.start("one").edge("one", "two").edge("two", END)
    result = wf.compile().run()
    _engine.get_store().flush()
    assert main(["trace", result.run_id]) == 0
    out = capsys.readouterr().out
    assert "◇ spans" in out and "• one" in out and "• two" in out
    assert main(["runs", "--kind", "graph", "--json"]) == 0
    import json

    rows = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in rows] == [result.run_id]
    assert rows[0]["kind"] == "graph" and rows[0]["status"] == "completed"


# -- EXT-23 reducers ---------------------------------------------------------------------


def test_ext23_two_replace_writes_in_one_step_conflict():
    wf = Graph(name="conflict")
    wf.add_node("s", lambda s: None)
    wf.add_node("a", lambda s: {"x": 1}).add_node("b", lambda s: {"x": 2})
    wf.start("s").edge("s", "a").edge("s", "b").edge("a", END).edge("b", END)
    with pytest.raises(GraphError) as info:
        wf.compile().run()
    assert info.value.code == "update_conflict"
    assert info.value.details == {"key": "x", "nodes": ["a", "b"]}


def test_ext23_append_merges_in_declaration_order_and_replace_marker():
    barrier = threading.Barrier(2, timeout=30)

    def late(state):
        barrier.wait()
        return {"log": ["first-declared"]}

    def early(state):
        barrier.wait()
        return {"log": ["second-declared"]}

    wf = Graph(reducers={"log": "append"}, name="order")
    wf.add_node("s", lambda s: {"log": {"$replace": ["reset"]}})
    wf.add_node("late", late).add_node("early", early)
    wf.start("s").edge("s", "late").edge("s", "early").edge("late", END).edge("early", END)
    result = wf.compile().run({"log": ["old"]})
    assert result.state["log"] == ["reset", "first-declared", "second-declared"]


def test_ext23_upsert_by_id_adds_replaces_and_removes():
    wf = Graph(reducers={"items": "upsert_by_id"}, name="upsert")
    wf.add_node(
        "edit",
        lambda s: {
            "items": [
                {"id": "b", "v": 20},
                {"id": "c", "v": 3},
                {"id": "a", "$remove": True},
            ]
        },
    )
    wf.add_node("again", lambda s: {"items": {"$replace": s["items"][:1]}})
    wf.start("edit").edge("edit", "again").edge("again", END)
    app = wf.compile()
    start = {"items": [{"id": "a", "v": 1}, {"id": "b", "v": 2}]}
    result = app.run(start)
    assert result.state["items"] == [{"id": "b", "v": 20}]
    thread = app.thread("u1")
    thread.run(start)
    assert thread.state()["items"] == [{"id": "b", "v": 20}]


# -- EXT-24 / EXT-25 steps, routes, joins, goto -------------------------------------------


def test_ext24_nodes_ready_together_run_concurrently():
    barrier = threading.Barrier(3, timeout=30)

    def branch(name):
        def body(state):
            barrier.wait()  # all three must be running at once
            return {name: True}

        return body

    wf = Graph(name="fan")
    wf.add_node("s", lambda s: None)
    for n in ("x", "y", "z"):
        wf.add_node(n, branch(n))
        wf.edge("s", n).edge(n, END)
    wf.start("s")
    result = wf.compile().run()
    assert result.state == {"x": True, "y": True, "z": True}
    assert result.steps == 2
    from composeai import _engine

    journal = dict(_engine.get_store().journal(result.run_id))
    assert {"x@1", "y@1", "z@1"} <= set(journal), "each finished node of a fan-out is journaled"


def test_ext24_a_node_is_scheduled_once_per_step_and_loops_run_again():
    runs = []

    def count(state):
        runs.append(state.get("n", 0))
        return {"n": state.get("n", 0) + 1}

    wf = Graph(name="loop")
    wf.add_node("a", lambda s: None).add_node("b", lambda s: None).add_node("count", count)
    wf.start("a").edge("a", "b").edge("a", "count").edge("b", "count")
    wf.route("count", lambda s: "again" if s["n"] < 3 else "stop", {"again": "count", "stop": END})
    result = wf.compile().run()
    assert runs == [0, 1, 2], "count once in step 1, then once per loop step"
    assert result.state["n"] == 3


def test_ext25_route_label_errors():
    wf = Graph(name="routes")
    wf.add_node("a", lambda s: None).add_node("b", lambda s: None)
    wf.route("a", lambda s: s["label"], {"go": "b"}).edge("b", END).start("a")
    app = wf.compile()
    with pytest.raises(GraphError) as info:
        app.run({"label": "nope"})
    assert info.value.code == "route_unknown_label"
    assert info.value.details["label"] == "nope"
    with pytest.raises(GraphError) as info:
        app.run({"label": 5})
    assert info.value.code == "route_unknown_label" and "int" in str(info.value)


def test_ext25_goto_outside_the_declaration_fails():
    wf = Graph(name="jump")
    wf.add_node("a", lambda s: goto(s["to"])).add_node("b", lambda s: None)
    wf.add_node("c", lambda s: None)
    wf.goto("a", ["b", END]).start("a").edge("b", "c").edge("c", END)
    app = wf.compile()
    assert app.run({"to": END}).steps == 1
    assert app.run({"to": ["b"]}).steps == 3
    with pytest.raises(GraphError) as info:
        app.run({"to": "c"})
    assert info.value.code == "goto_undeclared"
    assert info.value.details["target"] == "c"


def test_ext25_a_join_waits_for_branches_of_different_length():
    wf = Graph(reducers={"log": "append"}, name="uneven")
    wf.add_node("s", lambda s: None)
    wf.add_node("short", lambda s: {"log": ["short"]})
    wf.add_node("long1", lambda s: {"log": ["long1"]})
    wf.add_node("long2", lambda s: {"log": ["long2"]})
    wf.add_node("done", lambda s: {"final": list(s["log"])})
    wf.start("s").edge("s", "short").edge("s", "long1").edge("long1", "long2")
    wf.join(["short", "long2"], "done").edge("done", END)
    result = wf.compile().run()
    assert result.state["final"] == ["short", "long1", "long2"]


# -- EXT-27 limits and bad input -------------------------------------------------------------


def _looping(name="spin"):
    wf = Graph(name=name)
    wf.add_node("spin", lambda s: {"n": s.get("n", 0) + 1})
    wf.route("spin", lambda s: "again", {"again": "spin", "stop": END}).start("spin")
    return wf.compile()


def test_ext27_max_steps_and_deadline():
    app = _looping()
    with pytest.raises(GraphLimitError) as info:
        app.run(max_steps=5)
    assert info.value.code == "step_limit_exceeded" and info.value.details["steps"] == 5
    with pytest.raises(GraphLimitError) as info:
        app.run(max_steps=10**9, deadline=0.05)
    assert info.value.code == "deadline_exceeded"
    with pytest.raises(ValueError):
        app.run(max_steps=0)


def test_ext27_async_arun_and_aresume():
    def ask(state, ctx):
        return suspend("q") if ctx.resume is None else {"a": ctx.resume}

    app = Graph(name="aio").add_node("ask", ask).start("ask").edge("ask", END).compile()

    async def main():
        paused = await app.arun({"x": 1})
        return await app.aresume(paused.snapshot, {"ask": 7})

    assert asyncio.run(main()).state == {"x": 1, "a": 7}


def test_ext27_budget_counts_model_calls_in_nodes():
    from composeai import Budget, agent
    from composeai.testing import FakeModel

    model = FakeModel(["one", "two", "three"])  # 30 tokens per call

    @agent(model=model)
    def summarizer(x: str) -> str:
        return x

    def ask(state):
        return {"n": state.get("n", 0) + 1, "reply": summarizer("hi")}

    wf = Graph(name="budget").add_node("ask", ask)
    wf.route("ask", lambda s: "again", {"again": "ask", "stop": END}).start("ask")
    with pytest.raises(BudgetExceededError):
        wf.compile().run(budget=Budget(tokens=50))
    assert len(model.requests) == 2


def test_bad_input_unencodable_state_names_node_and_key_and_stores_nothing():
    wf = Graph(name="bad")
    wf.add_node("ok", lambda s: {"fine": 1})
    wf.add_node("bad", lambda s: {"good": 1, "blob": object()})
    wf.start("ok").edge("ok", "bad").edge("bad", END)
    app = wf.compile()
    thread = app.thread("b1")
    with pytest.raises(SerializationError) as info:
        thread.run({"x": 1})
    assert "'bad'" in str(info.value) and "'blob'" in str(info.value)
    assert thread.state() == {"x": 1, "fine": 1}, "nothing of the failing step is stored"
    assert [h["step"] for h in thread.history()] == [0, -1]


def test_bad_input_node_return_type_and_router_type():
    wf = Graph(name="types")
    wf.add_node("a", lambda s: ["not", "a", "dict"]).start("a").edge("a", END)
    with pytest.raises(GraphError) as info:
        wf.compile().run()
    assert info.value.code == "node_failed"
    assert "'a'" in str(info.value) and "list" in str(info.value)


# -- EXT-28 / EXT-29 results, suspend, resume ----------------------------------------------


def test_ext28_result_fields():
    result = Graph(name="r").add_node("a", lambda s: {"v": 1}).start("a").edge("a", END)
    res = result.compile().run()
    assert isinstance(res, GraphResult)
    assert (res.checkpoint_id, res.version, res.snapshot) == ("", 0, None)
    with pytest.raises(AttributeError):
        GraphInterrupt("a", 1).node = "b"


def test_ext29_suspend_applies_its_update_and_parallel_suspends_each_interrupt():
    def ask(name):
        def body(state, ctx):
            if ctx.resume is None:
                return suspend({"who": name}, update={f"asked_{name}": True})
            return {f"answer_{name}": ctx.resume}

        return body

    wf = Graph(name="two")
    wf.add_node("s", lambda s: None).add_node("x", ask("x")).add_node("y", ask("y"))
    wf.add_node("after", lambda s: {"both": [s["answer_x"], s["answer_y"]]})
    wf.start("s").edge("s", "x").edge("s", "y").join(["x", "y"], "after").edge("after", END)
    app = wf.compile()
    paused = app.run()
    assert paused.state == {"asked_x": True, "asked_y": True}
    assert [i.node for i in paused.interrupts] == ["x", "y"]
    with pytest.raises(GraphValidationError) as info:
        app.resume(paused.snapshot, {"x": 1})
    assert info.value.code == "resume_invalid"
    with pytest.raises(GraphValidationError):
        app.resume(paused.snapshot, {"x": 1, "y": 2, "z": 3})
    done = app.resume(paused.snapshot, {"x": 1, "y": 2})
    assert done.state["both"] == [1, 2]


def test_ext29_a_snapshot_of_another_graph_is_workflow_mismatch():
    def ask(state, ctx):
        return suspend("?") if ctx.resume is None else None

    one = Graph(name="one").add_node("a", ask).start("a").edge("a", END).compile()
    two = Graph(name="two2").add_node("a", ask).start("a").edge("a", END).compile()
    paused = one.run()
    with pytest.raises(GraphValidationError) as info:
        two.resume(paused.snapshot, {"a": 1})
    assert info.value.code == "workflow_mismatch"


def test_ext29_compose_resume_with_node_answers():
    def ask(state, ctx):
        return suspend({"q": 1}) if ctx.resume is None else {"got": ctx.resume}

    app = Graph(name="via").add_node("ask", ask).start("ask").edge("ask", END).compile()
    paused = app.run({"k": 1})
    from composeai import _engine

    pending = _engine.get_store().pending(paused.run_id)
    assert [p[0] for p in pending] == ["node:ask"]
    # `compose.resume` returns a `Run` for every run kind (FLOW-40).
    done = compose.resume(paused.run_id, answers={"node:ask": "yes"})
    assert isinstance(done, compose.Run) and (done.id, done.status) == (paused.run_id, "completed")
    assert done.output == {"k": 1, "got": "yes"} and done.pending is None
    assert _engine.get_store().get_run(paused.run_id)["status"] == "completed"


def test_ext29_a_snapshot_resumes_again_as_a_new_run():
    def ask(state, ctx):
        return suspend("?") if ctx.resume is None else {"v": ctx.resume}

    app = Graph(name="again").add_node("a", ask).start("a").edge("a", END).compile()
    paused = app.run()
    first = app.resume(paused.snapshot, {"a": 1})
    second = app.resume(paused.snapshot, {"a": 2})
    assert (first.state, second.state) == ({"v": 1}, {"v": 2})
    assert second.run_id != first.run_id


# -- EXT-21 async nodes on the caller's loop, EXT-24 concurrent under arun -------------------


def test_ext21_arun_awaits_async_nodes_on_the_callers_loop_with_its_context():
    import contextvars

    request_id = contextvars.ContextVar("request_id", default=None)
    seen: dict = {}

    async def fetch(state):
        seen["loop"] = asyncio.get_running_loop()
        seen["request_id"] = request_id.get()
        # A loop-bound resource of the caller: awaiting it from another loop fails.
        await seen["event"].wait()
        return {"fetched": True}

    def after(state):
        seen["after_thread"] = threading.current_thread()
        return {"done": True}

    wf = Graph(name="aio-loop")
    wf.add_node("fetch", fetch).add_node("after", after)
    wf.start("fetch").edge("fetch", "after").edge("after", END)
    app = wf.compile()

    async def main():
        seen["event"] = asyncio.Event()
        request_id.set("req-7")
        asyncio.get_running_loop().call_soon(seen["event"].set)
        result = await app.arun({})
        return result, asyncio.get_running_loop(), threading.current_thread()

    result, loop, caller = asyncio.run(main())
    assert result.state == {"fetched": True, "done": True}
    assert seen["loop"] is loop and seen["request_id"] == "req-7"
    # A sync node does not block the caller's loop: it runs on a thread of its own.
    assert seen["after_thread"] is not caller


def test_ext24_nodes_ready_together_run_concurrently_under_arun():
    async def left(state):
        events["left"].set()
        await asyncio.wait_for(events["right"].wait(), 60)
        return {"log": ["left"]}

    async def right(state):
        events["right"].set()
        await asyncio.wait_for(events["left"].wait(), 60)
        return {"log": ["right"]}

    def plain(state):
        # A sync node beside them, on its own thread, sees the same step's state.
        return {"log": [f"plain:{threading.current_thread() is not threading.main_thread()}"]}

    wf = Graph(reducers={"log": "append"}, name="aio-fan")
    wf.add_node("begin", lambda s: None)
    for name, fn in (("left", left), ("right", right), ("plain", plain)):
        wf.add_node(name, fn).edge("begin", name)
    wf.add_node("merge", lambda s: {"merged": sorted(s["log"])})
    wf.start("begin").join(["left", "right", "plain"], "merge").edge("merge", END)
    app = wf.compile()

    async def main():
        events.update(left=asyncio.Event(), right=asyncio.Event())
        return await app.arun({})

    events: dict = {}
    result = asyncio.run(main())
    # Each waited for the other: they only finish if they ran at the same time.
    assert result.state["log"] == ["left", "right", "plain:True"]
    assert result.steps == 3


def test_ext27_arun_is_cancelled_with_the_callers_task_and_retry_continues():
    from composeai import _engine

    seen = []
    entered: dict = {}

    firsts = []

    async def wait_forever(state):
        if seen:
            return {"waited": True}
        entered["event"].set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    def first(state):
        firsts.append(1)
        return {"a": 1}

    async def main():
        wf = Graph(name="aio-cancel")
        wf.add_node("first", first).add_node("wait", wait_forever)
        wf.start("first").edge("first", "wait").edge("wait", END)
        app = wf.compile()
        thread = app.thread("c1")
        entered["event"] = asyncio.Event()
        running = asyncio.ensure_future(thread.arun({}))
        await entered["event"].wait()
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        return thread

    thread = asyncio.run(main())
    assert seen == ["cancelled"]
    run_id = next(h for h in thread.history() if h["run_id"])["run_id"]
    assert _engine.get_store().get_run(run_id)["status"] == "failed"
    assert thread.state() == {"a": 1}
    done = thread.retry()
    assert done.state == {"a": 1, "waited": True} and firsts == [1]


def test_ext21_sync_run_awaits_async_nodes_on_the_calling_threads_own_loop():
    seen: dict = {"loops": [], "threads": []}

    async def note(name):
        seen["loops"].append(asyncio.get_running_loop())
        seen["threads"].append(threading.current_thread())
        events[name].set()
        other = "b" if name == "a" else "a"
        await asyncio.wait_for(events[other].wait(), 60)
        return {"log": [name]}

    async def a(state):
        return await note("a")

    async def b(state):
        return await note("b")

    async def solo(state):
        seen["loops"].append(asyncio.get_running_loop())
        seen["threads"].append(threading.current_thread())
        return {"solo": True}

    wf = Graph(reducers={"log": "append"}, name="aio-sync")
    wf.add_node("begin", lambda s: None).add_node("a", a).add_node("b", b)
    wf.add_node("solo", solo)
    wf.start("begin").edge("begin", "a").edge("begin", "b").join(["a", "b"], "solo")
    wf.edge("solo", END)
    app = wf.compile()
    events: dict = {}
    for _ in range(2):
        # Events bound to no loop yet; each run's pair meets on one loop.
        events.update(a=asyncio.Event(), b=asyncio.Event())
        result = app.run({})
        assert sorted(result.state["log"]) == ["a", "b"] and result.state["solo"]
    # Every async node ran on the caller's thread, on one loop made once for it.
    assert set(seen["threads"]) == {threading.current_thread()}
    assert len(set(map(id, seen["loops"]))) == 1 and len(seen["loops"]) == 6


def test_ext21_sync_run_inside_a_running_loop_awaits_async_nodes_on_the_background_loop():
    async def node(state):
        return {"thread": threading.current_thread().name}

    app = Graph(name="aio-bg").add_node("n", node).start("n").edge("n", END).compile()

    async def main():
        # A plain coroutine calling the sync facade (a notebook cell): allowed.
        return app.run({})

    assert asyncio.run(main()).state["thread"] == "composeai-runtime"


# -- EXT-21/EXT-29 approve() and ask_human() inside function nodes ---------------------------


def test_ext21_approve_in_a_node_suspends_and_resume_delivers_the_answer():
    from composeai import approve

    calls = []

    @task
    def draft_text(topic: str) -> str:
        calls.append(topic)
        return f"About {topic}"

    def review(state):
        text = draft_text(state["topic"])
        if approve("ship", {"text": text}):
            return {"sent": text}
        return {"sent": None}

    app = Graph(name="hitl").add_node("review", review).start("review").edge("review", END)
    app = app.compile()
    paused = app.run({"topic": "solar"})
    assert paused.suspended and paused.interrupts == [
        GraphInterrupt(
            "review",
            {
                "id": "ship",
                "kind": "approval",
                "question": None,
                "payload": {"text": "About solar"},
            },
        )
    ]
    done = app.resume(paused.snapshot, {"review": True})
    assert done.state == {"topic": "solar", "sent": "About solar"} and not done.suspended
    # The node ran again; its finished task replayed (EXT-21).
    assert calls == ["solar"]
    denied = app.resume(app.run({"topic": "wind"}).snapshot, {"review": False})
    assert denied.state["sent"] is None


def test_ext21_ask_human_in_async_nodes_under_arun_one_question_at_a_time():
    from composeai import ask_human

    async def interview(state):
        name = ask_human("name", "Who are you?")
        await asyncio.sleep(0)
        city = ask_human("city", f"Where do you live, {name}?", {"hint": "a city"})
        return {"profile": f"{name}@{city}"}

    wf = Graph(name="hitl-async").add_node("interview", interview)
    app = wf.start("interview").edge("interview", END).compile()

    async def main():
        thread = app.thread("i1")
        first = await thread.arun({})
        second = await thread.aresume({"interview": "Ada"})
        third = await thread.aresume({"interview": "London"})
        return first, second, third

    first, second, third = asyncio.run(main())
    assert first.interrupts[0].payload == {
        "id": "name",
        "kind": "question",
        "question": "Who are you?",
        "payload": None,
    }
    assert second.suspended and second.interrupts[0].payload["id"] == "city"
    assert second.interrupts[0].payload["question"] == "Where do you live, Ada?"
    assert third.state == {"profile": "Ada@London"} and not third.suspended


def test_ext29_compose_resume_answers_a_node_by_its_interrupt_id_or_node_name():
    from composeai import approve

    def gate(state):
        return {"ok": approve("deploy")}

    def note(state):
        return {"ok2": approve("announce")}

    wf = Graph(name="hitl-ids").add_node("gate", gate).add_node("note", note)
    app = wf.start("gate").edge("gate", "note").edge("note", END).compile()
    paused = app.run({})
    assert [i.payload["id"] for i in paused.interrupts] == ["deploy"]
    # By the approve() id, as for a flow (FLOW-43)...
    second = compose.resume(paused.run_id, answers={"deploy": True})
    assert (second.status, second.output) == ("paused", None)
    assert (second.pending.id, second.pending.kind) == ("node:note", "approval")
    # ... or by node, as for any suspended graph node (EXT-29).
    done = compose.resume(paused.run_id, answers={"node:note": False})
    assert done.status == "completed" and done.output == {"ok": True, "ok2": False}


def test_ext29_compose_resume_answers_graph_and_flow_runs_alike():
    """EXT-29 / FLOW-40: `compose.resume` and `aresume` return a `Run` for a graph run
    too (id, status, output = the final state, pending = an `Interrupt` with id
    `node:<name>`), so one loop answers paused runs of any kind; a handle from
    `compose.get_run` shows the same pending interrupt."""

    @compose.flow
    def checklist() -> list:
        return [compose.approve("lint"), compose.approve("tests")]

    def gate(state, ctx):
        return suspend({"check": "lint"}) if ctx.resume is None else {"lint": ctx.resume}

    def note(state):
        return {"tests": compose.approve("tests")}

    wf = Graph(name="generic").add_node("gate", gate).add_node("note", note)
    app = wf.start("gate").edge("gate", "note").edge("note", END).compile()
    paused_graph = app.run({})
    assert compose.get_run(paused_graph.run_id).pending.id == "node:gate"

    def answer_all(run_id: str) -> tuple[list, compose.Run]:
        asked = []
        run = compose.get_run(run_id).result(timeout=10)
        while run.status == "paused":
            asked.append((run.pending.id, run.pending.kind))
            run = compose.resume(run.id, {run.pending.id: True})
        return asked, run

    asked, flow_run = answer_all(checklist.start().id)
    assert asked == [("lint", "approval"), ("tests", "approval")]
    assert flow_run.output == [True, True]
    asked, graph_run = answer_all(paused_graph.run_id)
    assert asked == [("node:gate", "question"), ("node:note", "approval")]
    assert (graph_run.id, graph_run.status) == (paused_graph.run_id, "completed")
    assert graph_run.output == {"lint": True, "tests": True}

    again = app.run({})

    async def answer_async() -> compose.Run:
        run = await compose.aresume(again.run_id, {"node:gate": False})
        assert (run.status, run.pending.id) == ("paused", "node:note")
        return await compose.aresume(run.id, {run.pending.id: False})

    done = asyncio.run(answer_async())
    assert done.status == "completed" and done.output == {"lint": False, "tests": False}


def test_ext21_ext04_a_task_replayed_in_a_node_is_traced_replayed_when_resume_returns():
    """EXT-21 / EXT-0.4 / OBS-5: a `@task` that a resumed node replays shows as
    `(replayed)` in `compose trace` (another process) as soon as `compose.resume`
    or a thread's `resume` returns, with the resumed attempt's node and root."""

    @task
    def lookup(topic: str) -> str:
        return f"facts:{topic}"

    def ask(state, ctx):
        facts = lookup("solar")
        return suspend("ship?") if ctx.resume is None else {"facts": facts}

    from composeai import _engine

    def stored_spans(run_id: str) -> int | None:
        """The run's span rows, read at once through a connection of its own
        (on SQLite; the CLI below reads either store)."""
        store = _engine.get_store()
        if store.kind != "sqlite":
            return None
        with closing(sqlite3.connect(f"file:{store.path}?mode=ro", uri=True)) as db:
            sql = "SELECT count(*) FROM spans JOIN runs USING (rid) WHERE runs.run_id = ?"
            return db.execute(sql, (run_id,)).fetchone()[0]

    app = Graph(name="traced").add_node("ask", ask).start("ask").edge("ask", END).compile()
    paused = app.run({})
    compose.resume(paused.run_id, {"node:ask": True})
    assert stored_spans(paused.run_id) in (None, 6)
    thread = app.thread("traced-1")
    first = thread.run({})
    thread.resume({"ask": True})
    assert stored_spans(first.run_id) in (None, 6)
    for run_id in (paused.run_id, first.run_id):
        cli = subprocess.run(
            [sys.executable, "-m", "composeai.cli", "trace", run_id],
            capture_output=True,
            text=True,
            check=False,
            env=dict(os.environ, NO_COLOR="1"),
            timeout=120,
        )
        assert cli.returncode == 0, cli.stderr
        tree = [line.split("─ ", 1)[1] for line in cli.stdout.splitlines() if "─ " in line]
        names = [
            " ".join(part for part in line.split() if not part.startswith("[")) for line in tree
        ]
        assert names == [
            "◇ traced ⏸ paused",
            "• ask",
            "• lookup",
            "◇ traced",
            "• ask",
            "• lookup (replayed)",
        ], cli.stdout


def test_ext21_a_sync_facade_call_inside_an_async_node_under_arun_raises_not_deadlocks():
    inner = Graph(name="inner").add_node("i", lambda s: {"i": 1}).start("i").edge("i", END)
    inner_app = inner.compile()

    async def outer_node(state):
        inner_app.run({})  # ASYNC-6: would block the loop that drives this run

    outer = Graph(name="outer").add_node("o", outer_node).start("o").edge("o", END).compile()

    async def main():
        with pytest.raises(GraphError) as info:
            await outer.arun({})
        return info.value

    error = asyncio.run(main())
    assert error.code == "node_failed"
    assert isinstance(error.__cause__, RuntimeError)
    assert str(error.__cause__) == "composeai runtime cannot be re-entered from its own loop thread"
