"""OPS-12: `@flow(timeout=...)`, a durable deadline stored on the run (engine time, so
`fake_clock` moves it), on both stores: an executing attempt observes it at its next durable
boundary, a blocking `run()` waiting on a timer wakes for it, the worker fails a parked or queued
run past it; the run ends `failed` with `FlowTimeoutError` and is not resumable; a nested flow
runs under the tighter of its own deadline and its parent's."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

import _proc
import composeai as compose
from composeai import _engine
from composeai.errors import ComposeError, ConfigError
from composeai.testing import fake_clock
from composeai.worker import Worker

START = datetime(2031, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    "bad", [0, -1, 0.0, "5", True, math.nan, math.inf, timedelta(0), timedelta(seconds=-3)]
)
def test_ops12_timeout_must_be_a_positive_number_or_timedelta(bad):
    with pytest.raises(ConfigError, match=r"@flow\(timeout=\.\.\.\) must be a positive number"):

        @compose.flow(timeout=bad)
        def f() -> None:
            return None


def test_ops12_flow_timeout_error_is_a_compose_error_reached_as_an_attribute():
    assert issubclass(compose.FlowTimeoutError, ComposeError)
    assert "FlowTimeoutError" not in compose.__all__


def test_ops12_an_executing_attempt_fails_at_its_next_boundary(store_kind):
    calls: list[str] = []

    with fake_clock(START) as clock:

        @compose.task
        def work(label: str) -> str:
            calls.append(label)
            if label == "slow":
                clock.advance(timedelta(seconds=31))
            return label

        @compose.flow(timeout=timedelta(seconds=30))
        def report() -> list:
            return [work("fast"), work("slow"), work("never")]

        with pytest.raises(compose.FlowTimeoutError) as info:
            report.run(run_id="report-1")
    message = str(info.value)
    assert "flow 'report'" in message and "run 'report-1'" in message
    assert "2031-01-01T00:00:30" in message
    assert calls == ["fast", "slow"]
    row = _engine.get_store().get_run("report-1")
    assert row["status"] == "failed"
    with pytest.raises(ConfigError, match="passed its deadline and cannot be resumed"):
        compose.resume("report-1")


def test_ops12_a_body_that_catches_the_error_still_fails(store_kind):
    with fake_clock(START) as clock:

        @compose.task
        def tick() -> int:
            clock.advance(5)
            return 1

        @compose.flow(timeout=2)
        def stubborn() -> str:
            try:
                tick()
                tick()
            except compose.FlowTimeoutError:
                return "swallowed"
            return "done"

        with pytest.raises(compose.FlowTimeoutError):
            stubborn.run()


def test_ops12_a_blocking_run_waiting_on_a_timer_wakes_for_the_deadline(store_kind):
    with fake_clock(START) as clock:

        @compose.flow(timeout=60)
        def napper() -> str:
            compose.sleep(timedelta(days=1))
            return "woke"

        handle = napper.start(run_id="nap")
        _proc.wait_until(
            lambda: any(k == "sleep#1" for k, _ in _engine.get_store().journal("nap")),
            what="the run to block on its timer",
        )
        clock.advance(61)
        with pytest.raises(compose.FlowTimeoutError, match="run 'nap'"):
            handle.result(timeout=30)
    assert _engine.get_store().get_run("nap")["status"] == "failed"


def test_ops12_the_worker_fails_a_parked_run_past_its_deadline(store_kind):
    with fake_clock(START) as clock:

        @compose.flow(timeout=timedelta(hours=1))
        def approval() -> str:
            return compose.receive("go")

        parked = approval.run(wait=False, run_id="parked")
        assert parked.status == "paused"
        worker = Worker(out=open("/dev/null", "w"))  # noqa: SIM115 -- closed with the process
        clock.advance(timedelta(minutes=59))
        worker.once()
        assert _engine.get_store().get_run("parked")["status"] == "paused"
        clock.advance(timedelta(minutes=2))
        worker.once()
        worker._pool.shutdown(wait=True)
    row = _engine.get_store().get_run("parked")
    assert row["status"] == "failed"
    assert _engine.get_store().pending("parked") == []
    with pytest.raises(compose.FlowTimeoutError, match="flow 'approval' of run 'parked'"):
        compose.get_run("parked").result(timeout=10)


def test_ops12_a_queued_run_past_its_deadline_is_failed_unclaimed(store_kind):
    with fake_clock(START) as clock:
        compose.Queue("slow-lane")

        @compose.flow(timeout=10)
        def job() -> str:
            return "ran"

        handle = job.start(queue="slow-lane", run_id="queued-1")
        clock.advance(11)
        compose.wake_due()
    assert handle.status == "failed"


def test_ops12_nested_flow_runs_under_the_tighter_deadline(store_kind):
    steps: list[str] = []
    with fake_clock(START) as clock:

        @compose.task
        def step(label: str, advance: float = 0) -> str:
            steps.append(label)
            clock.advance(advance)
            return label

        @compose.flow(timeout=100)
        def loose() -> str:
            step("inner-1", 11)
            return step("inner-2")

        @compose.flow(timeout=10)
        def tight_parent() -> str:
            return loose()

        with pytest.raises(compose.FlowTimeoutError, match="flow 'tight_parent'"):
            tight_parent.run()
        assert steps == ["inner-1"]

        @compose.flow(timeout=5)
        def quick() -> str:
            step("quick-1", 6)
            return step("quick-2")

        @compose.flow(timeout=100)
        def tolerant() -> str:
            try:
                return quick()
            except compose.FlowTimeoutError as exc:
                return f"caught: {exc}".split(" of run")[0]

        steps.clear()
        run = tolerant.run()
    assert run.output == "caught: flow 'quick'"
    assert steps == ["quick-1"]


def test_ops12_a_worker_process_fails_a_parked_run_when_its_deadline_passes(store_kind, tmp_path):
    box = _proc.Sandbox(tmp_path)
    box.write_module(
        "gated",
        """
        import composeai as compose

        @compose.flow(timeout=1.5)
        def gated() -> str:
            return compose.receive("approve")
        """,
    )
    box.run(
        """
        import gated
        run = gated.gated.run(wait=False, run_id="gated-1")
        emit(status=run.status)
        """
    ).ok()
    worker = subprocess.Popen(
        [sys.executable, "-m", "composeai.cli", "worker", "--import", "gated"],
        env=box.env(),
        cwd=str(box.root),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _proc.wait_until(
            lambda: box.run_row("gated-1")["status"] == "failed", what="the worker to expire it"
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        out = _proc.finish(worker, timeout=60)
    assert "expired  gated-1" in out.stdout
    assert "FlowTimeoutError" in box.run_row("gated-1")["error_json"]
