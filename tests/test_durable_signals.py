"""EXT-3 signals and EXT-4 receive/receive_all: buffering, send order,
deterministic replay, timeouts, bad input, and a signal from one process
waking a run blocked in another."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import timedelta

import pytest

import _proc
import composeai as compose
from composeai import flow, task
from composeai.errors import ConfigError, SerializationError
from composeai.testing import fake_clock

SEEN: list = []


@task
def note(value):
    SEEN.append(value)
    return value


@pytest.fixture(autouse=True)
def _reset():
    SEEN.clear()


def _signal_rows(state) -> int:
    with _proc.store_db(state) as db:
        return db.execute("SELECT count(*) FROM signals").fetchone()[0]


def test_ext3_ext4_signals_sent_before_the_body_asks_are_buffered_and_received_in_order(
    isolated_state,
):
    @flow
    def collect() -> list:
        first = compose.receive("item")
        rest = compose.receive_all("item")
        last = compose.receive("item")
        return [note(first), rest, last]

    parked = collect.run(wait=False)
    assert parked.status == "paused"
    assert parked.pending.id == "signal:item#1"
    assert parked.pending.kind == "signal"
    assert parked.pending.payload == {"name": "item"}
    for value in ("a", {"b": [1, 2]}, 3):
        assert compose.signal(parked.id, "item", value) is None
    again = compose.resume(parked.id, wait=False)
    assert again.pending.id == "signal:item#2", "receive_all consumed the buffered rest"
    done = compose.signal(parked.id, "item", "z", resume=True)
    assert (done.status, done.output) == ("completed", ["a", [{"b": [1, 2]}, 3], "z"])
    assert SEEN == ["a"], "replay re-ran no step"


def test_ext4_receive_timeout_returns_the_default_and_journals_it(isolated_state):
    @flow
    def patient() -> object:
        return compose.receive("answer", timeout=timedelta(minutes=30), default="no answer")

    with fake_clock() as clock:
        parked = patient.run(wait=False)
        assert parked.pending.kind == "signal"
        clock.advance(timedelta(minutes=29))
        assert compose.wake_due() == []
        clock.advance(timedelta(minutes=1))
        (done,) = compose.wake_due()
    assert done.output == "no answer"
    assert compose.get_run(done.id).status == "completed"


def test_ext3_bad_signals_are_refused_and_store_nothing(isolated_state):
    @flow
    def waiter() -> object:
        return compose.receive("x")

    parked = waiter.run(wait=False)
    with pytest.raises(SerializationError, match="signal 'x' value"):
        compose.signal(parked.id, "x", object())
    assert _signal_rows(isolated_state) == 0
    with pytest.raises(ConfigError, match="no run found with run_id 'missing'"):
        compose.signal("missing", "x", 1)
    with pytest.raises(ConfigError, match="signal name"):
        compose.signal(parked.id, "", 1)
    done = compose.signal(parked.id, "x", 1, resume=True)
    assert done.status == "completed"
    with pytest.raises(ConfigError, match="is completed -- signals are accepted only"):
        compose.signal(parked.id, "x", 2)
    assert _signal_rows(isolated_state) == 1


def test_ext4_receive_outside_a_flow_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^receive\(\) must be called inside a flow$"):
        compose.receive("x")
    with pytest.raises(ConfigError, match=r"^receive_all\(\) must be called inside a flow$"):
        compose.receive_all("x")


def test_ext3_signal_with_resume_leaves_a_run_parked_on_another_name(isolated_state):
    @flow
    def two() -> list:
        return [compose.receive("a"), compose.receive("b")]

    run = two.run(wait=False)
    assert compose.signal(run.id, "b", 2, resume=True) is None
    mid = compose.signal(run.id, "a", 1, resume=True)
    assert mid.status == "completed" and mid.output == [1, 2], "b was buffered"


def test_ext4_areceive_in_an_async_flow(isolated_state):
    @flow
    async def alisten() -> object:
        return await compose.areceive("go", timeout=0.05, default="timeout")

    assert asyncio.run(alisten.arun()).output == "timeout"

    async def signalled():
        parked = await alisten.arun(wait=False)
        await compose.asignal(parked.id, "go", "now")
        return await compose.aresume(parked.id)

    assert asyncio.run(signalled()).output == "now"


FLOWS = """\
import composeai as compose
from composeai import flow, task


@task
def work(label: str) -> str:
    side_effect("work", label)
    return label


@flow
def listener(label: str) -> list:
    work(label)
    got = compose.receive("go")
    return [label, got]
"""


def test_ext3_a_signal_from_another_process_wakes_a_blocked_run(tmp_path):
    """The run blocks in A; the CLI in C commits a signal; A continues."""
    box = _proc.Sandbox(tmp_path)
    box.write_module("sflows", FLOWS)
    blocked = box.spawn(
        """
        import sflows
        run = sflows.listener.run('L')
        emit(status=run.status, output=run.output)
        """
    )
    _proc.wait_until(lambda: box.side_effects(), what="the first step")
    (run_id,) = box.run_ids()
    sent = subprocess.run(
        [sys.executable, "-m", "composeai.cli", "signal", run_id, "go", "--json", '{"ok": true}'],
        env=box.env(),
        cwd=str(box.root),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert sent.returncode == 0, sent.stderr
    assert f"signal 'go' sent to run {run_id}" in sent.stdout
    assert _proc.finish(blocked).ok() == {"status": "completed", "output": ["L", {"ok": True}]}
    bad = subprocess.run(
        [sys.executable, "-m", "composeai.cli", "signal", run_id, "go", "--json", "{nope"],
        env=box.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 1 and bad.stderr.startswith("compose: --json value is not valid")
    late = subprocess.run(
        [sys.executable, "-m", "composeai.cli", "signal", run_id, "go"],
        env=box.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert late.returncode == 1 and "is completed" in late.stderr


def test_ext4_kill9_during_a_blocked_receive_then_signal_and_resume_elsewhere(tmp_path):
    box = _proc.Sandbox(tmp_path)
    box.write_module("sflows2", FLOWS)
    blocked = box.spawn(
        """
        import sflows2
        sflows2.listener.run('K')
        """
    )
    _proc.wait_until(lambda: box.side_effects(), what="the first step")
    _proc.wait_until(lambda: box.query("SELECT 1 FROM timers"), what="the blocked receive")
    blocked.kill()
    assert _proc.finish(blocked).killed
    (run_id,) = box.run_ids()
    box.run(
        f"""
        import composeai
        composeai.signal({run_id!r}, "go", "after the crash")
        emit(ok=True)
        """
    ).ok()
    done = box.run(
        f"""
        import sflows2, composeai
        run = composeai.resume({run_id!r})
        emit(status=run.status, output=run.output)
        """
    ).ok()
    assert done == {"status": "completed", "output": ["K", "after the crash"]}
    assert [e[:2] for e in box.side_effects()] == [("work", "K")], "the step before ran once"
