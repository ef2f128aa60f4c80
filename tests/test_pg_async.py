"""ASYNC-1 / STORE-2 on PostgreSQL: the async entry points never block the event loop for a
server round trip. Run creation (`Flow.arun`, a standalone `Agent.arun`), settlement, the lease
claim of `aresume` and its answer writes are awaited off the loop.

Each test holds a lock on the `runs` table from another connection, so the round trip under
test waits on the server until the test releases it. Meanwhile a ticker task must keep
advancing and the test's own coroutine must see the waiting statement; only then is the lock
released. A blocked loop could do neither: a watchdog thread then releases the lock so the test
ends, and the test fails because the watchdog had to step in.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import composeai as compose
from composeai import _core, _engine
from composeai.errors import ConfigError
from composeai.testing import FakeModel

try:
    import _proc
except ImportError:  # pragma: no cover - when tests/ is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _proc

pytestmark = pytest.mark.parametrize("store_kind", ["postgresql"], indirect=True)

# How long the lock may be held before the watchdog gives up on the loop (not a speed
# assertion: a responsive loop releases it as soon as it has seen the statement waiting).
WATCHDOG_SECONDS = 30.0


class HeldLock:
    """A lock (`lock_sql`) held by a `psql` session of its own until `release()`;
    `waiting_sql` counts the statements of other sessions waiting for it."""

    def __init__(self, lock_sql: str, waiting_sql: str) -> None:
        import _pg

        url = os.environ["COMPOSE_STORE"]
        base, _, query = url.partition("?")
        options = dict(kv.split("=", 1) for kv in query.split("&") if "=" in kv)
        bindir = _pg.find_bindir() or ""
        psql = os.path.join(bindir, "psql") if bindir else "psql"
        env = {**os.environ, "PGOPTIONS": f"-c search_path={options.get('schema', 'composeai')}"}
        self.proc = subprocess.Popen(
            [psql, "-qAtX", "-v", "ON_ERROR_STOP=1", base],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.waiting_sql = waiting_sql
        self.by_watchdog = False
        self._released = threading.Event()
        self._send(f"BEGIN; {lock_sql}; SELECT 'locked';")
        assert self.proc.stdout.readline().strip() == "locked"
        self._watchdog = threading.Thread(target=self._watch, daemon=True)
        self._watchdog.start()

    def _send(self, sql: str) -> None:
        self.proc.stdin.write(sql + "\n")
        self.proc.stdin.flush()

    def _watch(self) -> None:
        if not self._released.wait(WATCHDOG_SECONDS):
            self.by_watchdog = True
            self.release()

    def release(self) -> None:
        if self._released.is_set() and self.proc.stdin.closed:
            return
        self._released.set()
        self._send("COMMIT;")
        self.proc.stdin.close()
        self.proc.wait(timeout=30)

    def waiters(self) -> int:
        """Statements of other sessions waiting for the lock right now."""
        return _proc.pg_exec(os.environ["COMPOSE_STORE"], self.waiting_sql).strip()


def RunsLock(mode: str = "EXCLUSIVE", table: str = "runs") -> HeldLock:
    """`LOCK TABLE runs IN EXCLUSIVE MODE` (or `mode`, on `table`): with the default, every
    write to `runs` (and every row lock on it) waits; `ACCESS EXCLUSIVE` makes reads wait
    too."""
    _engine.get_store()  # the schema exists before its table is locked
    return HeldLock(
        f"LOCK TABLE {table} IN {mode} MODE",
        "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
        f"WHERE NOT l.granted AND c.relname = '{table}'",
    )


def MigrationLock() -> HeldLock:
    """The advisory lock a store's first open takes to check (and apply) migrations
    (STORE-3), held so that the open waits."""
    schema = os.environ["COMPOSE_STORE"].partition("schema=")[2].partition("&")[0]
    return HeldLock(
        f"DO $$BEGIN PERFORM pg_advisory_xact_lock(hashtext('composeai.migrate.{schema}')); END$$",
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
    )


async def _responsive_while_blocked(lock: RunsLock, task: asyncio.Task, check=None) -> None:
    """Asserts that while `task` waits on the lock the loop keeps running: a ticker
    advances and this coroutine observes the waiting statement (then calls `check`, if
    given, to say what the task has done so far); then releases the lock."""
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    tick_task = asyncio.create_task(ticker())
    try:
        while True:
            waiting = await asyncio.to_thread(lock.waiters)
            if waiting != "0" or task.done():
                break
        assert not task.done(), "the call finished while the lock was held"
        assert not lock.by_watchdog, "the event loop was blocked by the round trip"
        before = ticks
        while ticks < before + 50:
            await asyncio.sleep(0)
        # Still in flight: the server has not answered yet.
        assert not task.done()
        assert await asyncio.to_thread(lock.waiters) != "0"
        if check is not None:
            check()
    finally:
        lock.release()
        tick_task.cancel()
    assert not lock.by_watchdog


@compose.task
async def add(x: int, y: int) -> int:
    return x + y


@compose.flow
async def adder(n: int) -> int:
    return await add.arun(n, 1)


def test_async_run_creation_awaits_the_server_off_the_loop(store_kind):
    """ASYNC-1: `Flow.arun` creates its run row off the loop."""

    async def main():
        lock = RunsLock()
        task = asyncio.create_task(adder.arun(41))
        await _responsive_while_blocked(lock, task)
        return await task

    run = asyncio.run(main())
    assert run.output == 42 and run.status == "completed"
    assert _engine.get_store().get_run(run.id)["status"] == "completed"


GATE: dict = {}


@compose.flow
async def gated(n: int) -> int:
    value = await add.arun(n, 2)
    GATE["entered"].set()
    await GATE["open"].wait()
    return value


def test_async_settlement_awaits_the_server_off_the_loop(store_kind):
    """ASYNC-1: the settlement of an async flow run is awaited off the loop; the row is
    completed once the call returns."""

    async def main():
        GATE["entered"], GATE["open"] = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(gated.arun(1))
        await GATE["entered"].wait()
        lock = await asyncio.to_thread(RunsLock)
        GATE["open"].set()
        await _responsive_while_blocked(lock, task)
        return await task

    run = asyncio.run(main())
    assert run.output == 3
    assert _engine.get_store().get_run(run.id)["status"] == "completed"


def test_aresume_claims_the_lease_and_records_answers_off_the_loop(store_kind):
    """ASYNC-1 / FLOW-40: `aresume` takes the lease, journals the answer and settles
    without blocking the loop."""

    @compose.flow
    async def asks(n: int) -> int:
        value = await add.arun(n, 0)
        answer = compose.ask_human("more", "how many more?")
        return value + int(answer)

    paused = asyncio.run(asks.arun(5))
    assert paused.status == "paused"

    async def main():
        lock = RunsLock()
        task = asyncio.create_task(compose.aresume(paused.id, {"more": "4"}))
        await _responsive_while_blocked(lock, task)
        return await task

    run = asyncio.run(main())
    assert run.status == "completed" and run.output == 9
    assert _engine.get_store().pending(paused.id) == []


def _asks_more():
    """A flow (registered for each test) that pauses on one question."""

    @compose.flow
    async def asks_more(n: int) -> int:
        value = await add.arun(n, 0)
        answer = compose.ask_human("more", "how many more?")
        return value + int(answer)

    return asks_more


@pytest.mark.parametrize(
    "table", ["runs", "pending_interrupts"], ids=["get_run", "pending_interrupts"]
)
def test_aresume_reads_the_run_and_its_interrupts_off_the_loop(store_kind, table):
    """ASYNC-1 / FLOW-41 / FLOW-43: `compose.aresume`'s checks before the claim (the run
    row, then the pending interrupts its answers are matched against) are read off the
    loop: each table in turn is locked against reads too."""
    paused = asyncio.run(_asks_more().arun(5))
    assert paused.status == "paused"

    async def main():
        lock = RunsLock("ACCESS EXCLUSIVE", table)
        task = asyncio.create_task(compose.aresume(paused.id, {"more": "2"}))
        await _responsive_while_blocked(lock, task)
        return await task

    run = asyncio.run(main())
    assert run.status == "completed" and run.output == 7


@pytest.mark.parametrize("entry", ["arun", "aresume"])
def test_the_first_store_open_is_awaited_off_the_loop(store_kind, entry):
    """ASYNC-1 / STORE-3: the first store use of an async entry point (`Flow.arun`,
    `compose.aresume`) connects and checks the schema off the loop; the migration lock
    is held so that the open waits."""
    paused = asyncio.run(_asks_more().arun(1)) if entry == "aresume" else None
    _engine.reset_store()

    async def main():
        lock = MigrationLock()
        if paused is None:
            task = asyncio.create_task(adder.arun(41))
        else:
            task = asyncio.create_task(compose.aresume(paused.id, {"more": "41"}))
        await _responsive_while_blocked(lock, task)
        return await task

    run = asyncio.run(main())
    assert run.status == "completed" and run.output == 42
    assert _engine.get_store().get_run(run.id)["status"] == "completed"


def test_a_graph_storage_of_its_own_opens_off_the_loop(store_kind):
    """ASYNC-1 / EXT-30: a graph whose `Storage` names a PostgreSQL URL opens that store
    (connection, schema check) off the loop on its first async run."""
    from composeai.graph import END, Graph, Storage

    async def node(state: dict) -> dict:
        return {"y": state["x"] + 1}

    storage = Storage(os.environ["COMPOSE_STORE"])
    wf = Graph(name="pg_async_storage").add_node("node", node).start("node")
    app = wf.edge("node", END).compile(storage, replace=True)

    async def main():
        lock = MigrationLock()
        task = asyncio.create_task(app.arun({"x": 1}))
        await _responsive_while_blocked(lock, task)
        return await task

    result = asyncio.run(main())
    assert result.state == {"x": 1, "y": 2}
    assert storage.store().get_run(result.run_id)["status"] == "completed"


def test_standalone_agent_arun_creates_and_settles_off_the_loop(store_kind):
    """ASYNC-1 / AGENT-52: a standalone `Agent.arun` creates its row off the loop."""

    @compose.agent(model=FakeModel(["hello"]))
    async def greeter(name: str) -> str:
        return f"greet {name}"

    async def main():
        lock = RunsLock()
        task = asyncio.create_task(greeter.arun("ada"))
        await _responsive_while_blocked(lock, task)
        return await task

    run = asyncio.run(main())
    assert run.output == "hello"
    assert _engine.get_store().get_run(run.id)["status"] == "completed"


def test_a_failing_settlement_raises_on_the_awaiting_task(store_kind):
    """A store error of an off-loop call reaches the awaiting coroutine as its exception:
    a run whose lease moved on cannot settle."""

    async def main():
        GATE["entered"], GATE["open"] = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(gated.arun(1))
        await GATE["entered"].wait()
        _proc.pg_exec(
            os.environ["COMPOSE_STORE"],
            "UPDATE runs SET lease_owner = 'someone-else' WHERE status = 'running'",
        )
        GATE["open"].set()
        return await task

    with pytest.raises(ConfigError, match="moved to another owner"):
        asyncio.run(main())


def test_async_batch_flow_queues_steps_and_its_pause_commits_them(store_kind):
    """Issue 13's batch durability from an async flow on PostgreSQL: a step's value is handed
    back without awaiting the server, and the pause commits every waiting row first."""
    calls = []

    @compose.task
    async def inc(x: int) -> int:
        calls.append(x)
        return x + 1

    @compose.flow(durability="batch")
    async def counted(n: int) -> tuple:
        x = 0
        for _ in range(n):
            x = await inc.arun(x)
        return x, compose.ask_human("go", "continue?")

    paused = asyncio.run(counted.arun(30))
    assert paused.status == "paused"
    journal = dict(_engine.get_store().journal(paused.id))
    assert [journal[f"inc#{i}"] for i in range(1, 31)] == [str(i) for i in range(1, 31)]
    done = asyncio.run(compose.aresume(paused.id, {"go": "yes"}))
    assert done.status == "completed" and done.output == (30, "yes")
    assert calls == list(range(30)), "a batched step never runs again once durable"


def test_a_fenced_async_step_in_batch_mode_flushes_off_the_loop(store_kind):
    """ASYNC-1 / issue 13's batch mode: an aggregate's branch steps are fenced, so each
    commits the waiting batch first; with the batch's group-commit waiting on the server,
    that flush is awaited off the loop."""

    @compose.task
    async def plus10(x: int) -> int:
        return x + 10

    agg = compose.aggregate(a=plus10, b=plus10)

    @compose.flow(durability="batch")
    async def fanned(n: int) -> dict:
        GATE["entered"].set()
        await GATE["open"].wait()
        x = await add.arun(n, 1)
        return (await agg.arun(x)).output

    async def main():
        GATE["entered"], GATE["open"] = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(fanned.arun(1))
        await GATE["entered"].wait()
        lock = await asyncio.to_thread(RunsLock)
        GATE["open"].set()
        await _responsive_while_blocked(lock, task)
        return await task

    run = asyncio.run(main())
    assert run.status == "completed" and run.output == {"a": 12, "b": 12}
    journal = dict(_engine.get_store().journal(run.id))
    assert journal["add#1"] == "2"


# -- graphs (EXT-27, EXT-30): the same round trips of `CompiledGraph.arun` and
# `GraphThread.aresume`, awaited off the loop.


def _gated_graph(name: str, order: list, nodes: int):
    """A graph of `nodes` async nodes in a line; the first waits on GATE["open"] after
    setting GATE["entered"], each appends its name to `order`."""
    from composeai.graph import END, Graph

    names = [f"n{i}" for i in range(nodes)]

    def make(node: str, first: bool):
        async def run(state: dict) -> dict:
            if first:
                GATE["entered"].set()
                await GATE["open"].wait()
            order.append(node)
            return {node: state.get("x", 0) + 1}

        return run

    wf = Graph(name=name)
    for i, node in enumerate(names):
        wf.add_node(node, make(node, i == 0))
    wf.start(names[0])
    for a, b in itertools.pairwise(names):
        wf.edge(a, b)
    wf.edge(names[-1], END)
    return wf.compile(replace=True)


def test_graph_arun_creates_its_run_off_the_loop(store_kind):
    """ASYNC-1 / EXT-27: `CompiledGraph.arun` creates its run row off the loop."""
    order: list = []
    app = _gated_graph("pg_async_create", order, 1)

    async def main():
        GATE["entered"], GATE["open"] = asyncio.Event(), asyncio.Event()
        GATE["open"].set()
        lock = RunsLock()
        task = asyncio.create_task(app.arun({"x": 1}))
        await _responsive_while_blocked(lock, task)
        return await task

    result = asyncio.run(main())
    assert result.state == {"x": 1, "n0": 2} and order == ["n0"]
    assert _engine.get_store().get_run(result.run_id)["status"] == "completed"


def test_graph_step_checkpoint_is_awaited_off_the_loop(store_kind):
    """ASYNC-1 / EXT-27: a step's checkpoint is committed off the loop, before the next
    step's node runs."""
    order: list = []
    app = _gated_graph("pg_async_step", order, 2)

    async def main():
        GATE["entered"], GATE["open"] = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(app.arun({"x": 1}))
        await GATE["entered"].wait()
        lock = await asyncio.to_thread(RunsLock)
        GATE["open"].set()

        def first_step_only() -> None:
            assert order == ["n0"], "the next step ran before the checkpoint was durable"

        await _responsive_while_blocked(lock, task, first_step_only)
        return await task

    result = asyncio.run(main())
    assert order == ["n0", "n1"] and result.steps == 2
    assert result.state == {"x": 1, "n0": 2, "n1": 2}
    assert _engine.get_store().get_run(result.run_id)["status"] == "completed"


def test_graph_settlement_is_awaited_off_the_loop(store_kind):
    """ASYNC-1 / EXT-27: the last checkpoint and the settlement of an async graph run
    (one transaction) are awaited off the loop; the row is completed once it returns."""
    order: list = []
    app = _gated_graph("pg_async_settle", order, 1)
    seen: list = []

    async def main():
        GATE["entered"], GATE["open"] = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(app.arun({"x": 5}))
        await GATE["entered"].wait()
        lock = await asyncio.to_thread(RunsLock)
        GATE["open"].set()

        def still_running() -> None:
            # The node has returned; the run stays running until the settlement commits.
            assert order == ["n0"]
            seen.append(
                _proc.pg_exec(
                    os.environ["COMPOSE_STORE"],
                    "SELECT status FROM runs WHERE name = 'pg_async_settle'",
                ).strip()
            )

        await _responsive_while_blocked(lock, task, still_running)
        return await task

    result = asyncio.run(main())
    assert seen == ["running"]
    assert result.state == {"x": 5, "n0": 6}
    assert _engine.get_store().get_run(result.run_id)["status"] == "completed"


def test_graph_failure_settles_off_the_loop(store_kind):
    """ASYNC-1 / EXT-31: a node's failure releases the thread and settles the run failed
    off the loop; the error reaches the awaiting task."""
    from composeai.graph import END, Graph, GraphError

    async def boom(state: dict) -> dict:
        GATE["entered"].set()
        await GATE["open"].wait()
        raise ValueError("no")

    app = Graph(name="pg_async_fail").add_node("boom", boom).start("boom")
    app = app.edge("boom", END).compile(replace=True)
    thread = app.thread("pg-async-fail")

    async def main():
        GATE["entered"], GATE["open"] = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(thread.arun({"x": 1}))
        await GATE["entered"].wait()
        lock = await asyncio.to_thread(RunsLock)
        GATE["open"].set()
        await _responsive_while_blocked(lock, task)
        return await task

    with pytest.raises(GraphError, match="node 'boom' failed"):
        asyncio.run(main())
    info = json.loads(_core.thread_info(_engine.get_store(), "pg-async-fail"))
    assert info["status"] == "failed"
    assert _engine.get_store().get_run(info["run_id"])["status"] == "failed"


def test_graph_thread_aresume_claims_the_lease_off_the_loop(store_kind):
    """ASYNC-1 / EXT-30: `GraphThread.aresume` of a suspended thread takes the run's lease,
    records the answer and settles without blocking the loop."""
    from composeai.graph import END, Graph, suspend

    def ask(state, ctx):
        return suspend("how many?") if ctx.resume is None else {"n": ctx.resume}

    app = Graph(name="pg_async_resume").add_node("ask", ask).start("ask")
    app = app.edge("ask", END).compile(replace=True)
    thread = app.thread("pg-async-resume")
    paused = thread.run({"x": 1})
    assert paused.suspended

    async def main():
        lock = RunsLock()
        task = asyncio.create_task(thread.aresume({"ask": 4}))
        await _responsive_while_blocked(lock, task)
        return await task

    result = asyncio.run(main())
    assert not result.suspended and result.state == {"x": 1, "n": 4}
    assert result.run_id == paused.run_id
    assert _engine.get_store().get_run(paused.run_id)["status"] == "completed"
    assert _engine.get_store().pending(paused.run_id) == []
    assert thread.state() == {"x": 1, "n": 4}


def test_graph_aresume_of_a_snapshot_claims_the_lease_off_the_loop(store_kind):
    """ASYNC-1 / EXT-29: `CompiledGraph.aresume` of a thread-less suspended run reads the
    run, takes its lease, records the answer and settles without blocking the loop."""
    from composeai.graph import END, Graph, suspend

    def ask(state, ctx):
        return suspend("which?") if ctx.resume is None else {"pick": ctx.resume}

    app = Graph(name="pg_async_snapshot").add_node("ask", ask).start("ask")
    app = app.edge("ask", END).compile(replace=True)
    paused = app.run({"x": 2})
    assert paused.suspended

    async def main():
        lock = RunsLock()
        task = asyncio.create_task(app.aresume(paused.snapshot, {"ask": "b"}))
        await _responsive_while_blocked(lock, task)
        return await task

    result = asyncio.run(main())
    assert result.state == {"x": 2, "pick": "b"} and result.run_id == paused.run_id
    assert _engine.get_store().get_run(paused.run_id)["status"] == "completed"


def test_graph_ask_human_in_an_async_node_resumes_on_postgresql(store_kind):
    """EXT-21 / ASYNC-1: a resumed async node's `ask_human()` answer is journaled through
    the off-loop bridge before the node runs again."""
    from composeai.graph import END, Graph

    async def interview(state):
        name = compose.ask_human("name", "Who are you?")
        await asyncio.sleep(0)
        city = compose.ask_human("city", f"Where do you live, {name}?")
        return {"profile": f"{name}@{city}"}

    wf = Graph(name="pg_async_hitl").add_node("interview", interview)
    app = wf.start("interview").edge("interview", END).compile(replace=True)

    async def main():
        thread = app.thread("pg-async-hitl")
        first = await thread.arun({})
        second = await thread.aresume({"interview": "Ada"})
        third = await thread.aresume({"interview": "London"})
        return first, second, third

    first, second, third = asyncio.run(main())
    assert first.interrupts[0].payload["id"] == "name"
    assert second.interrupts[0].payload["question"] == "Where do you live, Ada?"
    assert third.state == {"profile": "Ada@London"} and not third.suspended
    journal = dict(_engine.get_store().journal(third.run_id))
    assert journal["__interrupt__:name"] == '"Ada"'
    assert journal["__interrupt__:city"] == '"London"'


def test_compose_aresume_of_a_graph_run_with_a_budget_off_the_loop(store_kind):
    """ASYNC-1 / EXT-29: `compose.aresume(run_id, answers, budget=...)` of a graph run reads
    its interrupts, takes the lease, records the answer and the budget, reads the usage
    earlier attempts spent and settles, without blocking the loop."""
    from composeai.graph import END, Graph, suspend

    def ask(state, ctx):
        return suspend("size?") if ctx.resume is None else {"size": ctx.resume}

    app = Graph(name="pg_async_compose").add_node("ask", ask).start("ask")
    app = app.edge("ask", END).compile(replace=True)
    paused = app.run({})
    assert paused.suspended

    async def main():
        lock = RunsLock()
        task = asyncio.create_task(
            compose.aresume(paused.run_id, {"ask": 3}, budget=compose.Budget(tokens=100))
        )
        await _responsive_while_blocked(lock, task)
        return await task

    result = asyncio.run(main())
    assert (result.status, result.output) == ("completed", {"size": 3})
    row = _engine.get_store().get_run(paused.run_id)
    assert row["status"] == "completed" and json.loads(row["budget_json"])["tokens"] == 100
