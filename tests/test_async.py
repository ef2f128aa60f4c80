"""The async surface and the sync facade (async.md ASYNC-1 … ASYNC-12, with FLOW-50/52 nested
flows and FLOW-61's abandon guard)."""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

import composeai as compose
from composeai import _engine, _runtime
from composeai.agentfn import agent
from composeai.errors import TaskTimeoutError
from composeai.messages import Usage
from composeai.runs import Run
from composeai.testing import FakeModel, reset_registries
from composeai.tools import tool

REENTRY = "composeai runtime cannot be re-entered from its own loop thread"
WAIT = 30  # generous bound for every wait on another thread or task; never a speed assertion


@pytest.fixture(autouse=True)
def clean_agent_registry():
    reset_registries()
    yield
    reset_registries()


# --------------------------------------------------------------------------- helpers


def store():
    return _engine.get_store()


def row(run_id: str) -> dict | None:
    return store().get_run(run_id)


def journal(run_id: str) -> dict[str, Any]:
    return {k: json.loads(v) for k, v in store().journal(run_id)}


_READER = r"""
import json, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], uri=True, timeout=30)
print(json.dumps(conn.execute(sys.argv[2]).fetchall()))
"""


def run_ids() -> list[str]:
    """Every run id in the store, oldest first (read from a child process: the store's SQLite
    shares this process's POSIX locks, so it is never opened in-process)."""
    store().flush()
    path = os.path.join(_engine.state_dir(), "runs.db")
    if not os.path.exists(path):
        return []
    from pathlib import Path

    uri = Path(path).as_uri() + "?mode=ro"
    done = subprocess.run(
        [sys.executable, "-c", _READER, uri, "SELECT run_id FROM runs ORDER BY created_at, rid"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [r[0] for r in json.loads(done.stdout)]


def bounded(fn, timeout: float = 60):
    """Runs `fn` on a daemon thread; fails (instead of hanging the suite) on a deadlock."""
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 -- re-raised below
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"deadlock: call did not return within {timeout}s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def usage(i: int, o: int) -> Usage:
    return Usage(input_tokens=i, output_tokens=o)


def only(spans, **match):
    found = [s for s in spans if all(getattr(s, k) == v for k, v in match.items())]
    assert len(found) == 1, (match, [(s.kind, s.name) for s in spans])
    return found[0]


# --------------------------------------------------------------------------- ASYNC-1


def test_async1_sync_facade_works_inside_a_running_event_loop():
    """A Jupyter cell / ASGI handler: the loop is running on this thread."""
    model = FakeModel(["agent says hi", "agent sugar"])

    @agent(model=model, name="async1_agent")
    def greeter(x: str) -> str:
        return f"greet {x}"

    @compose.task
    def inc(x: int) -> int:
        return x + 1

    @compose.task
    async def ainc(x: int) -> int:
        await asyncio.sleep(0)
        return x + 1

    @compose.flow
    def sync_flow(x: int) -> int:
        return inc(x) + ainc(x)

    @compose.flow
    async def async_flow(x: int) -> int:
        return await ainc.arun(x)

    @compose.flow
    def gated(x: int) -> int:
        return x if compose.approve("ok") else -1

    def double(x: int) -> int:
        return x * 2

    p = compose.pipe(double, double)

    async def main():
        assert asyncio.get_running_loop().is_running()
        out = {}
        out["flow"] = sync_flow.run(1).output
        out["flow_sugar"] = sync_flow(2)
        out["async_flow"] = async_flow.run(3).output
        out["agent"] = greeter.run("bob").output
        out["agent_sugar"] = greeter("ann")
        out["map"] = compose.map(double, [1, 2, 3])
        out["pipe"] = p(3)
        out["pipe_run"] = p.run(1).output
        out["agg"] = compose.aggregate(d=double)(4)
        out["task"] = inc(10)
        out["atask"] = ainc(20)
        paused = gated.run(7)
        out["resume"] = compose.resume(paused.id, answers={"ok": True}).output
        out["now"] = compose.now() is not None
        out["random"] = 0 <= compose.random() < 1
        return out

    out = asyncio.run(main())
    assert out == {
        "flow": 4,
        "flow_sugar": 6,
        "async_flow": 4,
        "agent": "agent says hi",
        "agent_sugar": "agent sugar",
        "map": [2, 4, 6],
        "pipe": 12,
        "pipe_run": 4,
        "agg": {"d": 8},
        "task": 11,
        "atask": 21,
        "resume": 7,
        "now": True,
        "random": True,
    }


def test_async1_sync_facade_inside_a_running_loop_on_a_worker_thread():
    """An ASGI server thread with its own running loop calling the sync facade."""

    @compose.flow
    def wf(x: int) -> int:
        return compose.map(lambda v: v + 1, [x, x])[0]

    def thread_main():
        async def handler():
            return wf.run(1).output

        return asyncio.run(handler())

    assert bounded(thread_main) == 2


# --------------------------------------------------------------------------- ASYNC-2


def test_async2_gathered_flow_aruns_run_concurrently_on_the_callers_loop():
    n = 3
    started: list[int] = []
    loops = []
    threads = []
    all_started: asyncio.Event | None = None

    @compose.task
    async def meet(i: int) -> int:
        loops.append(asyncio.get_running_loop())
        threads.append(threading.current_thread())
        started.append(i)
        if len(started) == n:
            all_started.set()
        await asyncio.wait_for(all_started.wait(), WAIT)
        return i * 10

    @compose.flow
    async def wf(i: int) -> int:
        return await meet.arun(i)

    async def main():
        nonlocal all_started
        all_started = asyncio.Event()
        runs = await asyncio.gather(*(wf.arun(i) for i in range(n)))
        return runs, asyncio.get_running_loop()

    runs, loop = asyncio.run(main())
    assert [r.output for r in runs] == [0, 10, 20]
    assert all(r.status == "completed" for r in runs)
    assert len({r.id for r in runs}) == n
    assert all(lp is loop for lp in loops)
    assert all(t is threading.main_thread() for t in threads)
    for r in runs:
        assert row(r.id)["status"] == "completed"
        assert set(journal(r.id)) == {"meet#1"}


def test_async2_gathered_sync_body_flows_overlap_too():
    barrier = threading.Barrier(3, timeout=WAIT)

    @compose.task
    def meet(i: int) -> int:
        barrier.wait()
        return i

    @compose.flow
    def wf(i: int) -> int:
        return meet(i)

    async def main():
        return await asyncio.gather(*(wf.arun(i) for i in range(3)))

    runs = asyncio.run(main())
    assert [r.output for r in runs] == [0, 1, 2]


def test_async2_task_arun_agent_arun_and_amap_on_the_callers_loop():
    gate_count = 0
    all_in: asyncio.Event | None = None

    class GateModel:
        """Answers once every concurrent caller has arrived (proves overlap)."""

        model_id = "gate-model"

        def __init__(self, n: int):
            self.n = n
            self.fake = FakeModel(["a", "b"], usage=usage(1, 2))

        def complete(self, request):
            raise AssertionError("the async surface prefers acomplete (ASYNC-14)")

        async def acomplete(self, request):
            nonlocal gate_count
            gate_count += 1
            if gate_count == self.n:
                all_in.set()
            await asyncio.wait_for(all_in.wait(), WAIT)
            return self.fake.complete(request)

    model = GateModel(2)

    @agent(model=model, name="async2_agent")
    def replier(x: str) -> str:
        return x

    @compose.task
    async def atask(x: int) -> int:
        return x + 1

    async def item(x: int) -> tuple:
        await asyncio.sleep(0)
        return x, asyncio.get_running_loop()

    async def main():
        nonlocal all_in
        all_in = asyncio.Event()
        loop = asyncio.get_running_loop()
        r1, r2 = await asyncio.gather(replier.arun("p"), replier.arun("q"))
        t = await atask.arun(1)
        mapped = await compose.amap(item, [1, 2])
        return loop, r1, r2, t, mapped

    loop, r1, r2, t, mapped = asyncio.run(main())
    assert sorted([r1.output, r2.output]) == ["a", "b"]
    assert r1.status == r2.status == "completed"
    assert (r1.usage.input_tokens, r1.usage.output_tokens) == (1, 2)
    assert t == 2
    assert [m[0] for m in mapped] == [1, 2]
    assert all(m[1] is loop for m in mapped)


def test_async2_aresume_and_anow_arandom():
    @compose.flow
    async def wf(x: int) -> list:
        when = await compose.anow()
        r = await compose.arandom()
        ok = compose.approve("go")
        return [when.isoformat(), r, ok]

    async def main():
        paused = await wf.arun(1)
        assert paused.status == "paused"
        done = await compose.aresume(paused.id, answers={"go": True})
        return paused, done

    paused, done = asyncio.run(main())
    assert done.status == "completed"
    assert done.id == paused.id
    j = journal(paused.id)
    assert set(j) == {"now#1", "random#1", "__interrupt__:go"}
    assert done.output[1] == j["random#1"]
    assert done.output[2] is True

    # gathered aresumes overlap as well
    all_in: asyncio.Event | None = None
    arrived = []

    @compose.task
    async def meet(i: int) -> int:
        arrived.append(i)
        if len(arrived) == 2:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), WAIT)
        return i

    @compose.flow(name="async2_gated")
    async def gated(i: int) -> int:
        compose.approve("g")
        return await meet.arun(i)

    async def main2():
        nonlocal all_in
        all_in = asyncio.Event()
        a = await gated.arun(1)
        b = await gated.arun(2)
        return await asyncio.gather(
            compose.aresume(a.id, answers={"g": True}), compose.aresume(b.id, answers={"g": True})
        )

    ra, rb = asyncio.run(main2())
    assert (ra.output, rb.output) == (1, 2)


def test_async2_arun_of_async_bodies_never_starts_the_background_loop(tmp_path):
    """Checked in a fresh interpreter: `composeai._runtime._loop` stays None."""
    script = textwrap.dedent(
        """
        import asyncio, json
        import composeai as compose
        from composeai import _runtime
        from composeai.agentfn import agent
        from composeai.testing import FakeModel

        @compose.task
        async def t(x):
            await asyncio.sleep(0)
            return x + 1

        @compose.tool
        async def lookup(q: str) -> str:
            '''Look something up.'''
            return q.upper()

        model = FakeModel([{"tool_calls": [{"name": "lookup", "arguments": {"q": "a"}}]}, "done"])

        @agent(model=model, tools=[lookup])
        async def helper(x: str) -> str:
            return x

        @compose.flow
        async def inner(x):
            return await t.arun(x)

        async def stage(x: int) -> int:
            return x * 2

        @compose.flow
        async def wf(x):
            a = await t.arun(x)
            b = (await helper.arun("q")).output
            c = await compose.amap(stage, [1, 2])
            d = (await compose.pipe(stage, stage).arun(x)).output
            e = (await compose.aggregate(s=stage).arun(x)).output
            f = (await inner.arun(x)).output
            await compose.anow()
            await compose.arandom()
            ok = compose.approve("go")
            return [a, b, c, d, e, f, ok]

        async def main():
            paused = await wf.arun(1)
            done = await compose.aresume(paused.id, answers={"go": True})
            p = await compose.pipe(stage, stage).arun(3)
            m = await compose.amap(t, [1])
            return done.output, p.output, m, await t.arun(5)

        out = asyncio.run(main())
        print(json.dumps({"out": out, "loop_is_none": _runtime._loop is None}))
        """
    )
    env = dict(os.environ, COMPOSE_DIR=str(tmp_path / "child-state"))
    done = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout.strip().splitlines()[-1])
    assert data["out"] == [[2, "done", [2, 4], 4, {"s": 2}, 2, True], 12, [2], 6]
    assert data["loop_is_none"] is True


def test_async2_arun_paths_never_call_into_the_background_loop(monkeypatch):
    def refuse():
        raise AssertionError("the background loop was started")

    monkeypatch.setattr(_runtime, "_ensure_loop", refuse)

    @compose.task
    async def t(x: int) -> int:
        return x + 1

    async def stage(x: int) -> int:
        return x - 1

    @compose.flow
    async def wf(x: int) -> list:
        return [
            await t.arun(x),
            await compose.amap(stage, [x]),
            (await compose.pipe(stage, stage).arun(x)).output,
        ]

    assert asyncio.run(wf.arun(5)).output == [6, [4], 3]


def test_async2_standalone_agent_arun_pause_and_aresume():
    sent = []

    @tool(requires_approval=True)
    def send(to: str) -> str:
        """Send a message."""
        sent.append(to)
        return "sent"

    model = FakeModel(
        [{"tool_calls": [{"name": "send", "arguments": {"to": "ann"}, "id": "c1"}]}, "all done"]
    )

    @agent(model=model, tools=[send], name="async2_mailer")
    def mailer(x: str) -> str:
        return x

    async def main():
        paused = await mailer.arun("mail ann")
        assert paused.status == "paused"
        assert paused.pending.id == "tool:send:c1"
        return paused, await compose.aresume(paused.id, answers={"send": True})

    paused, done = asyncio.run(main())
    assert done.status == "completed"
    assert done.output == "all done"
    assert done.id == paused.id
    assert sent == ["ann"]
    assert row(paused.id)["status"] == "completed"


def test_async13_approver_runs_off_the_loop_and_async14_sync_models_too():
    where = {}

    class SyncOnly:
        model_id = "sync-only"

        def __init__(self):
            self.fake = FakeModel(
                [{"tool_calls": [{"name": "wipe", "arguments": {}, "id": "c1"}]}, "fine"]
            )

        def complete(self, request):
            where.setdefault("model", threading.current_thread())
            return self.fake.complete(request)

    @tool(requires_approval=True)
    def wipe() -> str:
        """Wipe."""
        return "wiped"

    def approver(interrupt) -> bool:
        where["approver"] = threading.current_thread()
        return True

    @agent(model=SyncOnly(), tools=[wipe], name="async13_agent")
    def cleaner(x: str) -> str:
        return x

    result = asyncio.run(cleaner.arun("go", approver=approver))
    assert result.output == "fine"
    assert where["approver"] is not threading.main_thread()
    assert where["model"] is not threading.main_thread()


# --------------------------------------------------------------------------- ASYNC-5


def test_async5_async_bodies_from_sync_and_async():
    calls = []

    @compose.task
    async def atask(x: int) -> int:
        await asyncio.sleep(0)
        calls.append(("task", x))
        return x + 1

    @tool
    async def shout(text: str) -> str:
        """Shout text."""
        await asyncio.sleep(0)
        return text.upper()

    def script():
        return [
            {"tool_calls": [{"name": "shout", "arguments": {"text": "hey"}, "id": "c1"}]},
            "final",
        ]

    model = FakeModel(script() * 4)

    @agent(model=model, tools=[shout], name="async5_agent")
    async def talker(x: str) -> str:
        await asyncio.sleep(0)
        return f"talk {x}"

    @compose.flow
    async def aflow(x: int) -> list:
        y = await atask.arun(x)
        z = (await talker.arun("a")).output
        return [y, z]

    @compose.flow
    def sflow(x: int) -> list:
        return [atask(x), talker("s")]

    # reached from sync
    assert atask(1) == 2
    assert talker.run("plain").output == "final"
    assert aflow.run(10).output == [11, "final"]
    # reached from async
    assert asyncio.run(aflow.arun(20)).output == [21, "final"]
    assert asyncio.run(atask.arun(30)) == 31
    # a sync flow calling async bodies through sugar, reached from async
    assert asyncio.run(sflow.arun(40)).output == [41, "final"]
    # the prompts came from the async agent body; the tool results from the async tool
    prompts = [r.messages[0].text for r in model.requests if len(r.messages) == 1]
    assert prompts == ["talk plain", "talk a", "talk a", "talk s"]
    tool_results = [r.messages[-1].parts[0].content for r in model.requests if len(r.messages) > 1]
    assert tool_results == ["HEY"] * 4
    assert ("task", 40) in calls


def test_async5_sync_bodies_run_off_the_loop_and_async_bodies_on_it():
    where = {}

    @compose.task
    def sync_task(x: int) -> int:
        where["sync"] = threading.current_thread()
        return x

    @compose.task
    async def async_task(x: int) -> int:
        where["async"] = (threading.current_thread(), asyncio.get_running_loop())
        return x

    @compose.flow
    async def wf(x: int) -> int:
        await sync_task.arun(x)
        return await async_task.arun(x)

    async def main():
        await wf.arun(1)
        return asyncio.get_running_loop()

    loop = asyncio.run(main())
    assert where["sync"] is not threading.main_thread()
    assert where["async"] == (threading.main_thread(), loop)


# --------------------------------------------------------------------------- ASYNC-6


def test_async6_sync_calls_in_an_async_body_driven_by_run_raise_but_approve_works():
    errors = []
    executed = []

    @compose.task
    def step(x: int) -> int:
        executed.append(x)
        return x

    @compose.flow
    def other(x: int) -> int:
        return x

    @compose.flow
    async def wf(x: int) -> int:
        for label, call in (
            ("task", lambda: step(x)),
            ("flow", lambda: other(x)),
            ("map", lambda: compose.map(step, [x])),
            ("resume", lambda: compose.resume("nope")),
        ):
            try:
                call()
            except RuntimeError as exc:
                errors.append((label, str(exc)))
        ok = compose.approve("gate")
        return (await step.arun(x)) if ok else -1

    paused = wf.run(3)
    assert paused.status == "paused"
    assert paused.pending.id == "gate"
    assert errors == [
        ("task", REENTRY),
        ("flow", REENTRY),
        ("map", REENTRY),
        ("resume", REENTRY),
    ]
    assert executed == []
    done = compose.resume(paused.id, answers={"gate": True})
    assert done.status == "completed"
    assert done.output == 3
    assert executed == [3]
    assert set(journal(paused.id)) == {"__interrupt__:gate", "step#1"}


@pytest.mark.sqlite_file
def test_async6_uncaught_reentry_fails_the_run_with_the_exact_message():
    @compose.task
    def step(x: int) -> int:
        return x

    @compose.flow
    async def wf(x: int) -> int:
        return step(x)

    with pytest.raises(RuntimeError) as info:
        wf.run(1)
    assert str(info.value) == REENTRY
    (rid,) = run_ids()
    assert row(rid)["status"] == "failed"
    assert json.loads(row(rid)["error_json"]) == {"type": "RuntimeError", "message": REENTRY}


def test_async6_reentry_from_an_async_task_body_reached_through_sugar():
    def one(x: int) -> int:
        return x

    p = compose.pipe(one, one)

    @compose.task
    async def inner(x: int) -> str:
        try:
            p(x)
        except RuntimeError as exc:
            return str(exc)
        return "no error"

    @compose.flow
    def wf(x: int) -> str:
        return inner(x)  # a sync body: the async task is driven on the background loop

    assert wf.run(1).output == REENTRY
    assert inner(2) == REENTRY  # outside any flow as well


def test_async6_now_and_random_in_an_async_body_driven_by_run_raise():
    errors = []

    @compose.flow
    async def wf(x: int) -> int:
        for call in (compose.now, compose.random):
            try:
                call()
            except RuntimeError as exc:
                errors.append(str(exc))
        return x

    wf.run(1)
    assert errors == [REENTRY, REENTRY]


def test_async6_sync_facade_inside_an_async_body_driven_by_arun_raises():
    errors = []

    @compose.task
    def step(x: int) -> int:
        return x

    @compose.flow
    async def wf(x: int) -> int:
        try:
            step(x)
        except RuntimeError as exc:
            errors.append(str(exc))
        return x

    asyncio.run(wf.arun(1))
    assert errors == [REENTRY]


def test_async6_ask_human_is_callable_synchronously_from_an_async_body():
    @compose.flow
    async def wf(x: int) -> str:
        return compose.ask_human("name", "Your name?")

    paused = asyncio.run(wf.arun(1))
    assert paused.pending.kind == "question"
    done = asyncio.run(compose.aresume(paused.id, answers={"name": "Ada"}))
    assert done.output == "Ada"


# --------------------------------------------------------------------------- ASYNC-7


def test_async7_sync_flow_calling_an_async_task_journals_like_a_sync_step():
    counts = {"async": 0, "sync": 0}

    @compose.task
    async def fetch(x: int) -> dict:
        counts["async"] += 1
        await asyncio.sleep(0)
        return {"value": x, "tuple": (x, x)}

    @compose.task
    def fetch_sync(x: int) -> dict:
        counts["sync"] += 1
        return {"value": x, "tuple": (x, x)}

    @compose.flow
    def wf(x: int) -> list:
        a = fetch(x)
        b = fetch_sync(x)
        ok = compose.approve("go")
        return [a, b, ok]

    paused = wf.run(5)
    assert paused.status == "paused"
    j = journal(paused.id)
    assert set(j) == {"fetch#1", "fetch_sync#1"}
    assert j["fetch#1"] == j["fetch_sync#1"]
    span = only(paused.trace.spans, kind="task", name="fetch")
    assert span.attributes["step_key"] == "fetch#1"
    assert span.status == "ok"
    done = compose.resume(paused.id, answers={"go": True})
    a, b, ok = done.output
    assert ok is True
    assert a == b == {"value": 5, "tuple": (5, 5)}
    assert isinstance(a["tuple"], tuple)
    assert counts == {"async": 1, "sync": 1}
    replayed = only(done.trace.spans, kind="task", name="fetch")
    assert replayed.replayed is True


def test_async7_a_sync_tool_calling_another_agents_run_does_not_deadlock():
    inner_model = FakeModel(["inner answer"] * 4)

    @agent(model=inner_model, name="async7_inner")
    def inner(q: str) -> str:
        return q

    @tool
    def delegate(q: str) -> str:
        """Ask the inner agent."""
        return inner.run(q).output

    def outer_script():
        return [{"tool_calls": [{"name": "delegate", "arguments": {"q": "sub"}}]}, "outer done"]

    outer_model = FakeModel(outer_script() * 4)

    @agent(model=outer_model, tools=[delegate], name="async7_outer")
    def outer(x: str) -> str:
        return x

    @compose.flow
    def wf(x: str) -> str:
        return outer(x)

    assert bounded(lambda: outer.run("go").output) == "outer done"
    assert bounded(lambda: wf.run("go").output) == "outer done"
    assert bounded(lambda: asyncio.run(outer.arun("go")).output) == "outer done"
    assert bounded(lambda: asyncio.run(wf.arun("go")).output) == "outer done"
    tool_contents = [r.messages[-1].parts[0].content for r in outer_model.requests[1::2]]
    assert tool_contents == ["inner answer"] * 4


def test_async7_nested_fan_out_with_max_workers_1_at_both_levels_does_not_deadlock():
    @compose.task
    def leaf(x: int) -> int:
        return x * 10

    @compose.task
    def branch(x: int) -> list:
        return compose.map(leaf, [x, x + 1], max_workers=1)

    @compose.flow
    def wf(xs: list) -> list:
        return compose.map(branch, xs, max_workers=1)

    result = bounded(lambda: wf.run([1, 3]))
    assert result.output == [[10, 20], [30, 40]]
    assert set(journal(result.id)) == {
        "map#1[0]/branch#1",
        "map#1[1]/branch#1",
        "map#1[0]/branch#1/map#1[0]/leaf#1",
        "map#1[0]/branch#1/map#1[1]/leaf#1",
        "map#1[1]/branch#1/map#1[0]/leaf#1",
        "map#1[1]/branch#1/map#1[1]/leaf#1",
    }
    # the same through the async surface
    again = bounded(lambda: asyncio.run(wf.arun([2])))
    assert again.output == [[20, 30]]


def test_async7_wide_fan_out_of_blocking_items_inside_items_does_not_deadlock():
    """No bounded shared pool under sync stages: 12 outer items each waiting for 4 inner items
    that all meet on one barrier needs 48 concurrent inner threads."""
    barrier = threading.Barrier(48, timeout=WAIT)

    def inner(x: int) -> int:
        barrier.wait()
        return x

    def outer(x: int) -> list:
        return compose.map(inner, [x] * 4)

    result = bounded(lambda: compose.map(outer, range(12)), timeout=90)
    assert result == [[i] * 4 for i in range(12)]


# --------------------------------------------------------------------------- ASYNC-8


@pytest.mark.sqlite_file
def test_async8_nested_flows_both_directions():
    counts = {"t": 0, "inner_sync": 0, "inner_async": 0}

    @compose.task
    def t(x: int) -> int:
        counts["t"] += 1
        return x + 1

    @compose.flow
    async def inner_async(x: int) -> int:
        counts["inner_async"] += 1
        return await t.arun(x)

    @compose.flow
    def inner_sync(x: int) -> int:
        counts["inner_sync"] += 1
        return t(x)

    @compose.flow
    def outer_sync(x: int) -> list:
        a = inner_async(x)  # sync sugar -> async inner
        b = inner_sync(x)
        ok = compose.approve("go")
        return [a, b, ok]

    paused = outer_sync.run(1)
    assert paused.status == "paused"
    j = journal(paused.id)
    assert set(j) == {"inner_async#1", "inner_async#1/t#1", "inner_sync#1", "inner_sync#1/t#1"}
    assert j["inner_async#1"] == 2
    assert [r for r in run_ids()] == [paused.id]  # no row for the nested flows
    span = only(paused.trace.spans, kind="flow", name="inner_async")
    assert span.attributes["step_key"] == "inner_async#1"
    done = compose.resume(paused.id, answers={"go": True})
    assert done.output == [2, 2, True]
    assert counts == {"t": 2, "inner_sync": 1, "inner_async": 1}

    seen: dict[str, Run] = {}

    @compose.flow
    async def outer_async(x: int) -> list:
        r1 = await inner_sync.arun(x)
        r2 = await inner_async.arun(x)
        seen["r1"], seen["r2"] = r1, r2
        return [r1.output, r2.output]

    result = asyncio.run(outer_async.arun(5))
    assert result.output == [6, 6]
    r1, r2 = seen["r1"], seen["r2"]
    assert r1.status == r2.status == "completed"
    assert len({r1.id, r2.id, result.id}) == 3
    assert set(journal(result.id)) == {
        "inner_sync#1",
        "inner_sync#1/t#1",
        "inner_async#1",
        "inner_async#1/t#1",
    }
    # also driven by the sync facade (async outer on the background loop)
    assert outer_async.run(7).output == [8, 8]


def test_async8_nested_arun_budget_refused():
    from composeai.errors import ConfigError
    from composeai.runs import Budget

    @compose.flow
    async def inner(x: int) -> int:
        return x

    @compose.flow
    async def outer(x: int) -> str:
        try:
            await inner.arun(x, budget=Budget(tokens=1))
        except ConfigError as exc:
            return str(exc)
        return "no error"

    assert asyncio.run(outer.arun(1)).output == (
        "@flow 'inner': budget= is not supported on a nested flow call (the enclosing run's "
        "budget governs); set it on the outer run"
    )


# --------------------------------------------------------------------------- ASYNC-10


def _cancel_when(event: threading.Event, make):
    async def main():
        task = asyncio.ensure_future(make())
        deadline = time.monotonic() + WAIT
        while not event.is_set():
            assert time.monotonic() < deadline, "the body never started"
            assert not task.done(), task
            await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "not cancelled"

    return asyncio.run(main())


@pytest.mark.sqlite_file
def test_async10_cancelling_an_inflight_arun_fails_the_row_revokes_the_zombie_and_resumes():
    attempts = []
    started = threading.Event()
    release = threading.Event()
    zombie = {}
    zombie_done = threading.Event()
    after_runs = []

    @compose.task
    def after(x: int) -> int:
        after_runs.append(x)
        return x + 100

    @compose.task
    def slow(x: int) -> int:
        attempts.append(x)
        if len(attempts) == 1:
            started.set()
            release.wait(WAIT)
            try:
                return after(x)
            except BaseException as exc:
                zombie["error"] = exc
                raise
            finally:
                zombie_done.set()
        return after(x)

    @compose.flow
    async def wf(x: int) -> int:
        return await slow.arun(x)

    assert _cancel_when(started, lambda: wf.arun(1)) == "cancelled"
    (rid,) = run_ids()
    r = row(rid)
    assert r["status"] == "failed"
    assert json.loads(r["error_json"]) == {"type": "CancelledError", "message": "cancelled"}

    # the zombie sync thread keeps running, but its journal access is gone
    release.set()
    assert zombie_done.wait(WAIT)
    assert after_runs == []
    assert not isinstance(zombie.get("error"), Exception)  # an internal BaseException
    assert zombie.get("error") is not None
    assert journal(rid) == {}
    assert row(rid)["status"] == "failed"

    done = compose.resume(rid)
    assert done.status == "completed"
    assert done.output == 101
    assert after_runs == [1]
    assert journal(rid) == {"slow#1/after#1": 101, "slow#1": 101}


@pytest.mark.sqlite_file
def test_async10_cancelling_arun_of_a_sync_flow_body_revokes_its_thread():
    started = threading.Event()
    release = threading.Event()
    finished = threading.Event()
    first_attempt = []
    later_steps = []

    @compose.task
    def record(x: int) -> int:
        later_steps.append(x)
        return x

    @compose.task
    def early(x: int) -> int:
        return x

    @compose.flow
    def wf(x: int) -> int:
        early(x)
        if not first_attempt:
            first_attempt.append(True)
            started.set()
            release.wait(WAIT)
            try:
                compose.now()
                record(x)
            finally:
                finished.set()
        return record(x)

    assert _cancel_when(started, lambda: wf.arun(1)) == "cancelled"
    (rid,) = run_ids()
    assert row(rid)["status"] == "failed"
    assert json.loads(row(rid)["error_json"])["message"] == "cancelled"
    release.set()
    assert finished.wait(WAIT)
    assert later_steps == []
    assert set(journal(rid)) == {"early#1"}
    done = asyncio.run(compose.aresume(rid))
    assert done.status == "completed"
    assert set(journal(rid)) == {"early#1", "record#1"}


@pytest.mark.sqlite_file
def test_async10_cancelling_an_astream_awaiter_fails_the_pipe_row():
    started = threading.Event()
    release = threading.Event()

    def slow(x: int) -> int:
        started.set()
        release.wait(WAIT)
        return x

    p = compose.pipe(slow, slow)
    try:
        assert _cancel_when(started, lambda: p.astream(1).run()) == "cancelled"
    finally:
        release.set()
    (rid,) = run_ids()
    r = row(rid)
    assert (r["kind"], r["status"]) == ("pipe", "failed")
    assert json.loads(r["error_json"]) == {"type": "CancelledError", "message": "cancelled"}


# --------------------------------------------------------------------------- ASYNC-11


def test_async11_async_task_timeouts_cancel_cooperatively_from_both_surfaces():
    cancelled = []

    @compose.task(timeout=0.2)
    async def slow(x: int) -> int:
        try:
            await asyncio.sleep(WAIT)
        except asyncio.CancelledError:
            cancelled.append(x)
            raise
        return x

    @compose.flow
    def sync_wf(x: int) -> int:
        return slow(x)

    @compose.flow
    async def async_wf(x: int) -> int:
        return await slow.arun(x)

    message = "@task 'slow' exceeded timeout=0.2s (cancelled cooperatively)"
    with pytest.raises(TaskTimeoutError) as info:
        sync_wf.run(1)
    assert str(info.value) == message
    with pytest.raises(TaskTimeoutError) as info:
        asyncio.run(async_wf.arun(2))
    assert str(info.value) == message
    with pytest.raises(TaskTimeoutError) as info:
        slow(3)
    assert str(info.value) == message
    deadline = time.monotonic() + WAIT
    while sorted(cancelled) != [1, 2, 3] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(cancelled) == [1, 2, 3]


def test_async11_sync_task_timeout_through_arun_abandons_the_thread():
    release = threading.Event()

    @compose.task(timeout=0.2)
    def slow(x: int) -> int:
        release.wait(WAIT)
        return x

    @compose.flow
    async def wf(x: int) -> int:
        return await slow.arun(x)

    try:
        with pytest.raises(TaskTimeoutError) as info:
            asyncio.run(wf.arun(1))
    finally:
        release.set()
    assert str(info.value).startswith(
        "@task 'slow' exceeded timeout=0.2s -- the abandoned thread keeps running"
    )


def test_async11_async_tool_timeout_is_cooperative():
    cancelled = threading.Event()

    @tool(timeout=0.2)
    async def crawl(url: str) -> str:
        """Crawl a URL."""
        try:
            await asyncio.sleep(WAIT)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "page"

    def script():
        return [{"tool_calls": [{"name": "crawl", "arguments": {"url": "u"}, "id": "c1"}]}, "ok"]

    model = FakeModel(script() + script())

    @agent(model=model, tools=[crawl], name="async11_crawler")
    def crawler(x: str) -> str:
        return x

    expected = "TaskTimeoutError: @tool 'crawl' exceeded timeout=0.2s (cancelled cooperatively)"
    assert crawler.run("a").output == "ok"
    assert model.requests[1].messages[-1].parts[0].content == expected
    assert cancelled.wait(WAIT)
    cancelled.clear()
    assert asyncio.run(crawler.arun("b")).output == "ok"
    assert model.requests[3].messages[-1].parts[0].content == expected
    assert cancelled.wait(WAIT)


# --------------------------------------------------------------------------- ASYNC-12


REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")


def test_async12_caller_contextvars_reach_sync_stage_threads():
    seen: dict[str, tuple[str, bool]] = {}

    def note(label: str) -> None:
        on_main = threading.current_thread() is threading.main_thread()
        seen[label] = (REQUEST_ID.get(), on_main)

    @compose.task(timeout=10)
    def threaded_task(x: int) -> int:
        note("task-thread")
        return x

    def item(x: int) -> int:
        time.sleep(0.01)
        note(f"map-{x}")
        return x

    def branch_a(x: int) -> int:
        note("branch-a")
        return x

    def branch_b(x: int) -> int:
        note("branch-b")
        return x

    @compose.flow
    def wf(x: int) -> int:
        threaded_task(x)
        compose.map(item, [0, 1, 2])
        compose.aggregate(a=branch_a, b=branch_b)(x)
        return x

    @compose.flow
    def streamed(x: int) -> int:
        note("stream-body")
        return x

    REQUEST_ID.set("req-42")
    try:
        wf.run(1)
        list(streamed.stream(1))
    finally:
        REQUEST_ID.set("unset")
    assert {k: v[0] for k, v in seen.items()} == {
        "task-thread": "req-42",
        "map-0": "req-42",
        "map-1": "req-42",
        "map-2": "req-42",
        "branch-a": "req-42",
        "branch-b": "req-42",
        "stream-body": "req-42",
    }
    assert seen["task-thread"][1] is False
    assert seen["stream-body"][1] is False


def test_async12_contextvars_reach_sync_bodies_under_the_async_surface():
    seen = {}

    @compose.task
    def sync_task(x: int) -> int:
        seen["task"] = (REQUEST_ID.get(), threading.current_thread() is threading.main_thread())
        return x

    def stage(x: int) -> int:
        seen["stage"] = REQUEST_ID.get()
        return x

    @compose.flow
    def sync_body(x: int) -> int:
        seen["flow"] = REQUEST_ID.get()
        return x

    @compose.flow
    async def wf(x: int) -> int:
        await sync_task.arun(x)
        await compose.pipe(stage, stage).arun(x)
        return x

    async def main():
        REQUEST_ID.set("async-req")
        await wf.arun(1)
        await sync_body.arun(1)

    asyncio.run(main())
    assert seen == {"task": ("async-req", False), "stage": "async-req", "flow": "async-req"}


def test_async12_composeai_ambient_state_reaches_worker_threads():
    """Steps made on map/branch/timeout threads journal into the enclosing run."""

    @compose.task(timeout=10)
    def timed(x: int) -> float:
        return compose.random()

    def item(x: int) -> str:
        return compose.now().isoformat()

    @compose.flow
    def wf(x: int) -> int:
        timed(x)
        compose.map(item, [0, 1])
        return x

    result = wf.run(1)
    assert set(journal(result.id)) == {
        "timed#1/random#1",
        "timed#1",
        "map#1[0]/now#1",
        "map#1[1]/now#1",
    }


def test_async12_budget_stack_and_event_bus_reach_item_and_branch_threads():
    from composeai.errors import BudgetExceededError
    from composeai.runs import Budget

    model = FakeModel(["a", "b", "c", "d"])  # 10 + 20 tokens per call

    @agent(model=model, name="async12_agent")
    def writer(x: str) -> str:
        return x

    @compose.flow
    def fan(items: list) -> list:
        return compose.map(writer, items, max_workers=1)

    with pytest.raises(BudgetExceededError) as info:
        fan.run(["x", "y"], budget=Budget(tokens=25))
    assert str(info.value) == "budget exceeded on flow 'fan': tokens budget=25, used=30"

    @compose.flow
    def branches(x: str) -> dict:
        return compose.aggregate(only=writer)(x)

    with pytest.raises(BudgetExceededError):
        branches.run("x", budget=Budget(tokens=25))

    @compose.task
    def leaf(x: int) -> int:
        return x

    def left(x: int) -> int:
        return leaf(x)

    def right(x: int) -> int:
        return leaf(x + 1)

    @compose.flow
    def streamed(xs: list) -> list:
        return [compose.map(leaf, xs), compose.aggregate(left=left, right=right)(0)]

    stream = streamed.stream([1, 2])
    names = {e.name for e in stream if e.kind == "span_started"}
    assert stream.run.output == [[1, 2], {"left": 0, "right": 1}]
    assert {"leaf[0]", "leaf[1]", "left", "right", "leaf", "map(leaf)"} <= names


# --------------------------------------------------------------------------- ASYNC-16


def test_async16_async_body_reached_from_sync_code_during_shutdown_raises(tmp_path):
    """After the background loop stopped at interpreter exit, a sync facade call that needs
    it raises instead of hanging (run in a child interpreter with a timeout)."""
    script = textwrap.dedent(
        """
        import asyncio, atexit, sys
        import composeai as compose

        @compose.task
        async def t(x):
            await asyncio.sleep(0)
            return x + 1

        def at_exit():
            # registered before the runtime's own handler, so it runs after it (LIFO)
            try:
                t(1)
                print("RESULT no error", flush=True)
            except RuntimeError as exc:
                print("RESULT " + str(exc), flush=True)

        atexit.register(at_exit)
        print("FIRST", t(1), flush=True)  # starts the background loop
        """
    )
    env = dict(os.environ, COMPOSE_DIR=str(tmp_path / "child-state"))
    done = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert "FIRST 2" in done.stdout, done.stderr
    assert "RESULT composeai runtime is shut down (interpreter exit in progress?)" in done.stdout, (
        done.stdout + done.stderr
    )


@pytest.mark.sqlite_file
def test_async10_cancelling_a_standalone_agent_arun_fails_its_row_and_it_resumes():
    entered = threading.Event()
    calls = []

    class SlowModel:
        model_id = "slow"

        def complete(self, request):
            raise AssertionError("acomplete is preferred")

        async def acomplete(self, request):
            calls.append(request)
            if len(calls) == 1:
                entered.set()
                await asyncio.sleep(WAIT)
            return FakeModel(["finally"]).complete(request)

    @agent(model=SlowModel(), name="async10_agent")
    def slowpoke(x: str) -> str:
        return x

    assert _cancel_when(entered, lambda: slowpoke.arun("q")) == "cancelled"
    (rid,) = run_ids()
    r = row(rid)
    assert (r["kind"], r["status"]) == ("agent", "failed")
    assert json.loads(r["error_json"]) == {"type": "CancelledError", "message": "cancelled"}
    done = asyncio.run(compose.aresume(rid))
    assert done.status == "completed"
    assert done.output == "finally"
    assert row(rid)["status"] == "completed"


def test_async2_gathered_pipe_and_aggregate_aruns_overlap():
    arrived = []
    all_in: asyncio.Event | None = None

    async def meet(x: int) -> int:
        arrived.append(x)
        if len(arrived) == 3:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), WAIT)
        return x

    async def plus(x: int) -> int:
        return x + 100

    p = compose.pipe(meet, plus)
    agg = compose.aggregate(m=meet)

    async def main():
        nonlocal all_in
        all_in = asyncio.Event()
        return await asyncio.gather(p.arun(1), p.arun(2), agg.arun(3))

    r1, r2, r3 = asyncio.run(main())
    assert (r1.output, r2.output, r3.output) == (101, 102, {"m": 3})
    assert len({r1.id, r2.id, r3.id}) == 3
    assert sorted(row(r.id)["kind"] for r in (r1, r2, r3)) == ["aggregate", "pipe", "pipe"]


def test_async3_the_twins_missing_by_design_stay_missing():
    """ASYNC-3: no `Flow.astream`, no `Task.run`, no async chat methods; flows stream
    synchronously and tasks run through `__call__`/`arun` only."""
    from composeai.chat import Chat
    from composeai.flow import Flow, Task

    assert not hasattr(Flow, "astream") and hasattr(Flow, "stream")
    assert not hasattr(Task, "run") and hasattr(Task, "arun")
    public = [name for name in dir(Chat) if not name.startswith("_")]
    assert [name for name in public if name.startswith("a") and name[1:] in public] == []


# --------------------------------------------------------------------------- ASYNC-7/10/11, AGENT-91/92/93


def _done_event(text: str) -> Any:
    from composeai.messages import Message, StopReason
    from composeai.models.base import ModelResponse, RawStreamEvent

    response = ModelResponse(
        message=Message.assistant(text),
        stop_reason=StopReason.END_TURN,
        raw_stop_reason="end_turn",
        usage=usage(1, 1),
        model_id="m",
    )
    return RawStreamEvent("response_done", response=response)


class _GatedStreams:
    """A provider whose streams yield one delta, then wait for `gate`; each records its
    cleanup in `closed`. `sync=True` offers only `stream()`, else only `astream()`."""

    def __init__(self, sync: bool):
        self.gate = threading.Event()
        self.opened = 0
        self.closed: list[int] = []
        if sync:
            self.stream = self._sync_stream
        else:
            self.astream = self._async_stream

    def complete(self, request):
        raise AssertionError("a streamed call streams")

    def _sync_stream(self, request):
        from composeai.models.base import RawStreamEvent

        self.opened += 1
        n = self.opened

        def events():
            try:
                yield RawStreamEvent("text_delta", text="first")
                assert self.gate.wait(WAIT)
                yield _done_event("first")
            finally:
                self.closed.append(n)

        return events()

    def _async_stream(self, request):
        from composeai.models.base import RawStreamEvent

        self.opened += 1
        n = self.opened

        async def events():
            try:
                yield RawStreamEvent("text_delta", text="first")
                while not self.gate.is_set():
                    await asyncio.sleep(0.005)
                yield _done_event("first")
            finally:
                self.closed.append(n)

        return events()


@pytest.mark.parametrize("sync_model", [True, False], ids=["sync-model", "async-model"])
def test_async7_agent93_async_work_and_abandoned_streams_leave_no_thread_span_or_lease(
    isolated_state, sync_model
):
    """Once async work settles (arun, amap, timeouts, astream drained, broken out of,
    closed, dropped, cancelled, its awaiter cancelled, and a sync stream cancelled), no
    thread it started is left beyond the background loop (ASYNC-7, ASYNC-11), every
    provider stream it opened is closed (AGENT-93), and no span or run stays `running`
    or keeps its lease (ASYNC-10)."""
    import gc

    import _proc

    before = {t.ident for t in threading.enumerate()}
    model = _GatedStreams(sync_model)

    @agent(model=model, name="census_talker")
    def talker(x: str) -> str:
        return x

    @compose.task(timeout=0.05)
    async def stuck() -> None:
        await asyncio.sleep(WAIT)

    @compose.task
    def inc(x: int) -> int:
        return x + 1

    @compose.flow
    async def steps() -> list[int]:
        with pytest.raises(TaskTimeoutError):
            await stuck.arun()
        return await compose.amap(inc, [1, 2, 3])

    async def first_delta(stream) -> None:
        async for event in stream:
            if event.kind == "text_delta":
                return

    async def main() -> list[str]:
        statuses = [str((await steps.arun()).output)]
        # Broken out of, then closed: the run goes on to its end.
        model.gate.clear()
        stream = talker.astream("a")
        await first_delta(stream)
        stream.close()
        model.gate.set()
        statuses.append((await stream.run()).status)
        # Dropped unread after its first event.
        model.gate.clear()
        dropped = talker.astream("b")
        await first_delta(dropped)
        del dropped
        gc.collect()
        model.gate.set()
        # Cancelled between provider events.
        model.gate.clear()
        stream = talker.astream("c")
        await first_delta(stream)
        stream.cancel()
        model.gate.set()
        statuses.append((await stream.run()).status)
        # Its awaiter cancelled mid-stream (ASYNC-10).
        model.gate.clear()
        stream = talker.astream("d")
        await first_delta(stream)
        awaiter = asyncio.ensure_future(stream.run())
        await asyncio.sleep(0.01)
        awaiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await awaiter
        model.gate.set()
        return statuses

    assert asyncio.run(main()) == ["[2, 3, 4]", "completed", "cancelled"]
    # A sync stream broken out of and cancelled (AGENT-91, AGENT-93).
    model.gate.clear()
    sync_stream = talker.stream("e")
    for event in sync_stream:
        if event.kind == "text_delta":
            break
    sync_stream.cancel()
    model.gate.set()
    assert sync_stream.run.status == "cancelled"

    def left() -> list[str]:
        return sorted(
            t.name
            for t in threading.enumerate()
            if t.ident not in before and t.name != "composeai-runtime"
        )

    deadline = time.monotonic() + WAIT
    while (left() or len(model.closed) < model.opened) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert left() == []
    assert sorted(model.closed) == list(range(1, model.opened + 1)) and model.opened == 5
    store().flush()
    with _proc.store_db(isolated_state) as db:
        running = db.execute("SELECT kind, name FROM spans WHERE status = 'running'").fetchall()
        runs = db.execute("SELECT status, lease_owner FROM runs").fetchall()
    assert running == []
    assert sorted(status for status, _ in runs) == [
        "cancelled",
        "cancelled",
        "completed",
        "completed",
        "completed",
        "failed",
    ]
    assert [owner for _, owner in runs if owner is not None] == []
