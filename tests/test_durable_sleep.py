"""EXT-1 durable sleep and EXT-12 engine time (in-process; the cross-process
cases are in test_durable_worker.py)."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone

import pytest

import _proc
import composeai as compose
from _proc import wait_until
from composeai import flow, task
from composeai.testing import fake_clock

CALLS: list[str] = []


@task
def step(x: int) -> int:
    CALLS.append(f"step:{x}")
    return x + 1


@pytest.fixture(autouse=True)
def _reset_calls():
    CALLS.clear()


def _db(state):
    """A read-only connection, closed by the `with` block."""
    return _proc.store_db(state)


def _journal(state, run_id: str) -> dict:
    with _db(state) as db:
        rows = db.execute(
            "SELECT j.step_key, j.value_json FROM journal j JOIN runs r ON r.rid = j.rid "
            "WHERE r.run_id = ?",
            (run_id,),
        ).fetchall()
    return dict(rows)


def test_ext1_blocking_sleep_journals_the_wake_time_and_traces_a_pause_span(isolated_state):
    @flow
    def napper(x: int) -> int:
        a = step(x)
        compose.sleep(timedelta(milliseconds=50))
        return step(a)

    run = napper.run(1)
    assert (run.status, run.output) == ("completed", 3)
    journal = _journal(isolated_state, run.id)
    wake = datetime.fromisoformat(json.loads(journal["sleep#1"]))
    assert wake.tzinfo is not None and wake.utcoffset() == timedelta(0)
    pauses = [s for s in run.trace.spans if s.kind == "pause"]
    assert [(s.name, s.status) for s in pauses] == [("sleep#1", "ok")]
    assert pauses[0].ended_at - pauses[0].started_at >= 0.04, "the span's duration is the wait"
    with _db(isolated_state) as db:
        assert db.execute("SELECT count(*) FROM timers").fetchone()[0] == 0, "satisfied timers go"


def test_ext1_wait_false_parks_with_a_timer_interrupt_and_resume_before_wake_reparks(
    isolated_state,
):
    @flow
    def weekly(x: int) -> int:
        a = step(x)
        compose.sleep(timedelta(days=7))
        return step(a)

    with fake_clock(datetime(2030, 1, 1, tzinfo=timezone.utc)) as clock:
        run = weekly.run(1, wait=False)
        assert run.status == "paused"
        assert run.pending.id == "timer:sleep#1"
        assert run.pending.kind == "timer"
        assert run.pending.payload == {"wake_at": "2030-01-08T00:00:00.000000+00:00"}
        with _db(isolated_state) as db:
            assert db.execute("SELECT status FROM runs").fetchone()[0] == "paused"
            assert db.execute("SELECT step_key, wake_at FROM timers").fetchall() == [
                ("sleep#1", datetime(2030, 1, 8, tzinfo=timezone.utc).timestamp())
            ]
        again = compose.resume(run.id, wait=False)
        assert again.status == "paused" and again.pending.id == "timer:sleep#1"
        assert CALLS == ["step:1"], "a re-park runs nothing else"
        clock.advance(timedelta(days=7))
        done = compose.resume(run.id)
        assert (done.status, done.output) == ("completed", 3)
    assert CALLS == ["step:1", "step:2"]


def test_ext1_nonpositive_duration_returns_at_once_but_is_journaled(isolated_state):
    @flow
    def instant() -> str:
        compose.sleep(0)
        compose.sleep(-5.0)
        return "ok"

    run = instant.run(wait=False)
    assert run.status == "completed"
    assert {"sleep#1", "sleep#2"} <= set(_journal(isolated_state, run.id))


def test_ext1_outside_a_flow_sleep_is_time_sleep_and_bad_durations_are_refused():
    assert compose.sleep(0.001) is None
    with pytest.raises(TypeError, match="sleep\\(\\) duration must be a timedelta"):
        compose.sleep("1s")


def test_ext12_a_week_long_blocked_sleep_wakes_when_the_fake_clock_advances(isolated_state):
    @flow
    def long_nap() -> str:
        before = compose.now()
        compose.sleep(timedelta(weeks=1))
        return f"{before.isoformat()} -> {compose.now().isoformat()}"

    start = datetime(2031, 5, 1, 12, tzinfo=timezone.utc)
    with fake_clock(start) as clock:
        assert clock.now() == start
        handle = long_nap.start()
        wait_until(lambda: _timers(isolated_state), what="the run to block on its timer")
        assert handle.status == "running"
        clock.advance(timedelta(weeks=1))
        run = handle.result(timeout=30)
    assert run.output == "2031-05-01T12:00:00+00:00 -> 2031-05-08T12:00:00+00:00"


def _timers(state) -> list:
    with _db(state) as db:
        return db.execute("SELECT step_key FROM timers").fetchall()


def test_ext12_fake_clock_validates_its_arguments_and_restores_the_real_clock():
    with pytest.raises(ValueError, match="aware datetime"):
        fake_clock(datetime(2030, 1, 1))
    with fake_clock() as clock, pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)
    assert abs(compose.now().timestamp() - datetime.now(timezone.utc).timestamp()) < 60


def test_ext1_asleep_blocks_on_the_loop_and_parks_with_wait_false(isolated_state):
    @flow
    async def anap(x: int) -> int:
        await compose.asleep(0.05)
        return x * 2

    run = asyncio.run(anap.arun(4))
    assert (run.status, run.output) == ("completed", 8)
    with fake_clock() as clock:
        parked = asyncio.run(anap.arun(5, wait=False))
        assert parked.pending.kind == "timer"
        clock.advance(60)
        done = asyncio.run(compose.aresume(parked.id))
    assert done.output == 10


def test_ext1_a_sleep_replays_without_waiting_again(isolated_state):
    @flow
    def twice() -> int:
        compose.sleep(0.02)
        compose.approve("go")
        return step(0)

    run = twice.run()
    assert run.pending.id == "go"
    again = compose.resume(run.id, {"go": True})
    assert again.output == 1
    replayed = [s for s in again.trace.spans if s.kind == "pause"]
    assert replayed and all(s.replayed for s in replayed)


def test_ext1_ctrl_c_interrupts_a_blocking_sleep_and_leaves_the_run_resumable(tmp_path):
    import signal

    import _proc

    box = _proc.Sandbox(tmp_path)
    box.write_module(
        "napmod",
        """
        import composeai as compose
        from composeai import flow


        @flow
        def nap() -> str:
            side_effect("before")
            compose.sleep(3600)
            return "woke"
        """,
    )
    proc = box.spawn(
        """
        import signal

        # Ctrl-C as from a terminal: a shell that started the tests in the
        # background may have left SIGINT ignored for its children.
        signal.signal(signal.SIGINT, signal.default_int_handler)

        import napmod
        napmod.nap.run()
        """
    )
    _proc.wait_until(lambda: box.side_effects(), what="the run to start sleeping")
    _proc.wait_until(lambda: box.query("SELECT 1 FROM timers"), what="the timer")
    proc.send_signal(signal.SIGINT)
    result = _proc.finish(proc)
    assert result.error()["error_type"] == "KeyboardInterrupt"
    (run_id,) = box.run_ids()
    assert box.run_row(run_id)["status"] == "failed"
    assert "sleep#1" in box.journal(run_id), "the wake time stays journaled"
