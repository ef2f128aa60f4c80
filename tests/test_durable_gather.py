"""EXT-6 `start`/`gather`/`StepHandle`: keys reserved in call order, steps
run concurrently, journaled handles resolve at once on replay, structured
concurrency; kill -9 during a gather leaves a run `resume()` completes
without re-running the items that finished."""

from __future__ import annotations

import threading

import pytest

import _proc
import composeai as compose
from composeai import _engine, flow, task
from composeai.errors import ConfigError

CALLS: list[int] = []


@pytest.fixture(autouse=True)
def _reset():
    CALLS.clear()


def test_ext6_started_steps_run_concurrently_with_direct_call_keys(isolated_state):
    barrier = threading.Barrier(3, timeout=30)

    @task
    def meet(i: int) -> int:
        CALLS.append(i)
        barrier.wait()  # all three must be running at once
        return i * 10

    @flow
    def fan() -> list:
        handles = [compose.start(meet, i) for i in range(3)]
        assert [h.key for h in handles] == ["meet#1", "meet#2", "meet#3"]
        return compose.gather(*handles)

    run = fan.run()
    assert run.output == [0, 10, 20]
    journal = dict(_engine.get_store().journal(run.id))
    assert {k: journal[k] for k in ("meet#1", "meet#2", "meet#3")} == {
        "meet#1": "0",
        "meet#2": "10",
        "meet#3": "20",
    }


def test_ext6_replayed_handles_resolve_at_once_and_failures_are_structured(isolated_state):
    @task
    def square(i: int) -> int:
        CALLS.append(i)
        if i < 0:
            raise ValueError(f"negative {i}")
        return i * i

    @flow
    def fan(xs: list) -> list:
        handles = [compose.start(square, x) for x in xs]
        values = compose.gather(*handles, return_exceptions=True)
        compose.approve("go")
        return [v if isinstance(v, int) else str(v) for v in values]

    paused = fan.run([2, -1, 3])
    assert paused.status == "paused"
    done = compose.resume(paused.id, {"go": True})
    assert done.output == [4, "negative -1", 9]
    assert sorted(CALLS) == [-1, -1, 2, 3], "only the failed item re-ran"

    @flow
    def careless() -> str:
        compose.start(square, -5)
        return "returned"

    with pytest.raises(ValueError, match="negative -5"):
        careless.run()
    with pytest.raises(TypeError, match="takes a @task, an @agent or a @flow"):

        @flow
        def wrong() -> None:
            compose.start(print, 1)

        wrong.run()
    with pytest.raises(ConfigError, match=r"start\(\) must be called inside a flow"):
        compose.start(square, 1)


FLOWS = """\
import os
import time

import composeai as compose
from composeai import flow, task


@task
def item(i: int) -> int:
    side_effect("start", i)
    if not os.environ.get("FAST"):
        time.sleep(0.05 if i == 0 else 60)
    side_effect("done", i)
    return i * i


@flow
def fan(n: int) -> list:
    return compose.gather(*[compose.start(item, i) for i in range(n)])
"""


def test_ext6_kill9_during_a_gather_then_resume_in_another_process(tmp_path):
    box = _proc.Sandbox(tmp_path)
    box.write_module("gflows", FLOWS)
    proc = box.spawn(
        """
        import gflows
        emit(output=gflows.fan.run(3).output)
        """
    )
    _proc.wait_until(
        lambda: box.run_ids() and "item#1" in box.journal(box.run_ids()[0]), what="item 0"
    )
    _proc.wait_until(lambda: len([e for e in box.side_effects() if e[0] == "start"]) == 3)
    proc.kill()
    assert _proc.finish(proc).killed
    (run_id,) = box.run_ids()
    assert set(box.journal(run_id)) == {"item#1"}
    done = box.run(
        f"""
        import gflows, composeai
        emit(output=composeai.resume({run_id!r}).output)
        """,
        FAST="1",
    ).ok()
    assert done == {"output": [0, 1, 4]}
    starts = sorted(int(e[1]) for e in box.side_effects() if e[0] == "start")
    assert starts == [0, 1, 1, 2, 2], "the finished item did not run again"


def test_ext6_an_agent_can_be_started_and_takes_its_direct_call_key(isolated_state):
    from composeai import agent
    from composeai.testing import FakeModel

    @agent(model=FakeModel(["one", "two"]))
    def gather_writer(topic: str) -> str:
        """Write."""
        return topic

    @flow
    def drafts() -> list:
        first = compose.start(gather_writer, "a")
        second = gather_writer("b")
        return [first.key, first.result(), second]

    run = drafts.run()
    assert run.output[0] == "gather_writer#1"
    assert sorted(run.output[1:]) == ["one", "two"]
    journal = dict(_engine.get_store().journal(run.id))
    assert {"gather_writer#1", "gather_writer#2"} <= set(journal)


def test_ext6_handles_in_an_async_flow(isolated_state):
    import asyncio

    @task
    async def twice(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    @flow
    async def afan() -> list:
        handles = [compose.start(twice, i) for i in range(3)]
        return [await h.aresult() for h in handles]

    assert asyncio.run(afan.arun()).output == [0, 2, 4]
