"""EXT-10 cancellation: parked runs at once, running runs at their next
durable boundary in any process (also while blocked), `compose cancel`,
`AsyncRunStream.cancel()`; and EXT-11 run handles (`Flow.start`,
`get_run`, `RunHandle`)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from datetime import timedelta

import pytest

import _proc
import composeai as compose
from composeai import flow, task
from composeai.errors import ConfigError
from composeai.testing import fake_clock

CLEANED: list[str] = []


@pytest.fixture(autouse=True)
def _reset():
    CLEANED.clear()


@task
def inc(x: int) -> int:
    return x + 1


def test_ext10_a_parked_run_is_cancelled_at_once_and_cannot_be_resumed(isolated_state):
    @flow
    def parked() -> int:
        compose.sleep(3600)
        return 1

    run = parked.run(wait=False)
    assert compose.cancel(run.id, reason="not needed") is None
    handle = compose.get_run(run.id)
    assert (handle.status, handle.pending) == ("cancelled", None)
    with pytest.raises(ConfigError, match=f"^run '{run.id}' was cancelled$"):
        compose.resume(run.id)
    compose.cancel(run.id)  # idempotent
    assert compose.wake_due() == []


def test_ext10_a_blocked_run_observes_the_request_and_cleans_up(isolated_state):
    gate = threading.Event()

    @flow
    def blocked() -> int:
        inc(0)
        try:
            gate.set()
            compose.receive("never")
        finally:
            CLEANED.append("finally")
        return 1

    handle = blocked.start()
    assert gate.wait(30)
    _proc.wait_until(lambda: compose.get_run(handle.id).status == "running", what="running")
    handle.cancel("stop")
    run = handle.result(timeout=60)
    assert run.status == "cancelled"
    assert handle.status == "cancelled"
    assert CLEANED == ["finally"]
    assert {s.name: s.status for s in run.trace.spans}["blocked"] == "cancelled"


def test_ext10_a_running_run_stops_at_its_next_step(isolated_state):
    started = threading.Event()
    release = threading.Event()

    @task
    def hold() -> int:
        started.set()
        release.wait(30)
        return 0

    @flow
    def stepping() -> int:
        hold()
        return inc(1)

    handle = stepping.start()
    assert started.wait(30)
    compose.cancel(handle.id)
    release.set()
    assert handle.result(timeout=60).status == "cancelled"


def test_ext10_async_run_stream_cancel(isolated_state):
    from composeai.runs import AsyncRunStream

    @flow
    async def alisten() -> object:
        return await compose.areceive("never")

    async def main():
        stream = AsyncRunStream.start(lambda: alisten.arun())
        await asyncio.sleep(0.05)
        stream.cancel()
        return await stream.run()

    assert asyncio.run(main()).status == "cancelled"


def test_ext11_handles_wait_for_results_signal_and_reraise_failures(isolated_state):
    @flow
    def echo(x: int) -> list:
        return [inc(x), compose.receive("more")]

    handle = echo.start(1)
    assert isinstance(handle, compose.RunHandle)
    with pytest.raises(TimeoutError):
        handle.result(timeout=0.05)
    handle.signal("more", "m")
    run = handle.result(timeout=60)
    assert (run.status, run.output) == ("completed", [2, "m"])
    assert compose.get_run(handle.id).result().output == [2, "m"]

    @flow
    def broken() -> None:
        raise ConfigError("broken on purpose")

    failing = broken.start()
    with pytest.raises(ConfigError, match="broken on purpose"):
        failing.result(timeout=60)
    assert compose.get_run(failing.id).status == "failed"
    with pytest.raises(ConfigError, match="broken on purpose"):
        compose.get_run(failing.id).result()
    with pytest.raises(ConfigError, match="no run found"):
        compose.get_run("nope")


def test_ext11_a_handle_result_returns_when_the_run_parks_on_a_human(isolated_state):
    @flow
    def gated() -> bool:
        compose.sleep(timedelta(hours=1))
        return compose.approve("ship")

    # On the real clock a short timer may already be due when the run first
    # reaches it (a slow machine), so the run would never park on it.
    with fake_clock() as clock:
        handle = gated.start(wait=False)
        _proc.wait_until(lambda: compose.get_run(handle.id).status == "paused", what="parked")
        assert handle.pending.kind == "timer"
        clock.advance(timedelta(hours=1))
        stop = threading.Event()

        def wake() -> None:
            while not compose.wake_due() and not stop.wait(0.01):
                pass

        # Stopped and joined here: a waker left polling would continue the
        # runs of later tests.
        waker = threading.Thread(target=wake, daemon=True)
        waker.start()
        try:
            run = handle.result(timeout=60)
        finally:
            stop.set()
            waker.join()
        assert run.status == "paused" and run.pending.id == "ship"
        assert handle.resume({"ship": True}).output is True


def test_ext11_handle_result_reflects_a_later_resume(isolated_state):
    """EXT-11: `result()` returns the run's latest settled state, not the
    paused outcome the handle's own drive ended with, whether the run was
    resumed through the handle or through `compose.resume`."""

    @flow
    def twice() -> list:
        return [compose.approve("first"), compose.approve("second")]

    handle = twice.start()
    assert handle.result(timeout=10).pending.id == "first"
    resumed = handle.resume({"first": True})
    assert resumed.status == "paused" and resumed.pending.id == "second"
    parked = handle.result(timeout=10)
    assert (parked.status, parked.pending.id) == ("paused", "second")
    compose.resume(handle.id, {"second": False})
    run = handle.result(timeout=10)
    assert (run.id, run.status, run.output) == (handle.id, "completed", [True, False])
    assert handle.status == "completed"


FLOWS = """\
import composeai as compose
from composeai import flow, task


@task
def work(label: str) -> str:
    side_effect("work", label)
    return label


@flow
def waiting(label: str) -> str:
    work(label)
    compose.receive("go")
    return "never"
"""


def test_ext10_compose_cancel_from_another_process_stops_a_blocked_run(tmp_path):
    box = _proc.Sandbox(tmp_path)
    box.write_module("cflows", FLOWS)
    blocked = box.spawn(
        """
        import cflows
        run = cflows.waiting.run('w')
        emit(status=run.status)
        """
    )
    _proc.wait_until(lambda: box.side_effects(), what="the first step")
    (run_id,) = box.run_ids()
    out = subprocess.run(
        [sys.executable, "-m", "composeai.cli", "cancel", run_id, "--reason", "user"],
        env=box.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "cancel requested" in out.stdout
    assert _proc.finish(blocked).ok() == {"status": "cancelled"}
    assert box.run_row(run_id)["status"] == "cancelled"
    statuses = {r[0]: r[1] for r in box.query("SELECT name, status FROM spans")}
    assert statuses["waiting"] == "cancelled"
    handle = box.run(
        f"""
        import composeai
        emit(status=composeai.get_run({run_id!r}).result(timeout=30).status)
        """
    ).ok()
    assert handle == {"status": "cancelled"}


def test_ext10_an_agent_run_stops_at_its_next_llm_turn(isolated_state):
    from composeai import agent, tool
    from composeai.testing import FakeModel

    entered = threading.Event()
    release = threading.Event()

    @tool
    def wait_here() -> str:
        """Wait until released."""
        entered.set()
        release.wait(30)
        return "released"

    model = FakeModel([{"tool_calls": [{"name": "wait_here", "arguments": {}}]}, "never used"])

    @agent(model=model, tools=[wait_here])
    def cancellable_helper(q: str) -> str:
        """Help."""
        return q

    outcome: list = []
    worker = threading.Thread(
        target=lambda: outcome.append(cancellable_helper.run("go")), daemon=True
    )
    worker.start()
    assert entered.wait(30)
    run_id = _only_run_id(isolated_state)
    compose.cancel(run_id, "enough")
    release.set()
    worker.join(30)
    assert outcome and outcome[0].status == "cancelled"
    assert len(model.requests) == 1, "no second model call after the cancel"
    assert compose.get_run(run_id).status == "cancelled"


def _only_run_id(state) -> str:
    with _proc.store_db(state) as db:
        (row,) = db.execute("SELECT run_id FROM runs").fetchall()
    return row[0]


def test_ext10_a_run_stream_cancel_ends_a_blocking_wait(isolated_state):
    @flow
    def listening() -> object:
        return compose.receive("never")

    stream = listening.stream()

    def blocked() -> bool:
        return bool(_timer_rows(isolated_state))

    _proc.wait_until(blocked, what="the run to block on its receive")
    stream.cancel()
    assert stream.run.status == "cancelled"


def _timer_rows(state) -> list:
    import sqlite3

    with _proc.store_db(state) as db:
        try:
            return db.execute("SELECT step_key FROM timers").fetchall()
        except (sqlite3.OperationalError, RuntimeError):
            # The store (or its tables) does not exist yet.
            return []
