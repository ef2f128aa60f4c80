"""EXT-2 `wake_due` and `compose worker`, with real processes: a run parks in
one process and a worker in another continues it; kill -9 during a sleep and
of the worker mid-run; SIGTERM leaves runs resumable. Also the pending column
of `compose runs` and the paused banner of `compose trace` for timers."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import warnings
from datetime import timedelta

import pytest

import _proc
import composeai as compose
from composeai import flow, task
from composeai.testing import fake_clock

FLOWS = """\
import os
import time

import composeai as compose
from composeai import flow, task


@task
def work(label: str, i: int) -> int:
    side_effect("work", label, i)
    return i + 1


@task
def slow(label: str) -> int:
    side_effect("slow-start", label)
    time.sleep(float(os.environ.get("SLOW", "0")))
    side_effect("slow-end", label)
    return 1


@flow
def napper(label: str, seconds: float) -> int:
    a = work(label, 1)
    compose.sleep(seconds)
    return work(label, a)


@flow
def boom(label: str) -> int:
    compose.sleep(0.01)
    raise ValueError("boom " + label)


@flow
def sluggish(label: str) -> int:
    # Long enough that the starting process parks it even when slowed by load.
    compose.sleep(0.3)
    work(label, 1)
    slow(label)
    return work(label, 2)
"""

OTHER = """\
import composeai as compose
from composeai import flow


@flow
def elsewhere() -> str:
    compose.sleep(0.01)
    return "x"
"""


@pytest.fixture
def box(tmp_path):
    sandbox = _proc.Sandbox(tmp_path)
    sandbox.write_module("dflows", FLOWS)
    sandbox.write_module("otherflows", OTHER, helper=False)
    return sandbox


def park(box: _proc.Sandbox, call: str) -> str:
    """Starts a run with wait=False in a fresh process; returns its id."""
    result = box.run(
        f"""
        import dflows, otherflows
        run = {call}
        emit(id=run.id, status=run.status)
        """
    ).ok()
    assert result["status"] == "paused", result
    return result["id"]


def worker(box: _proc.Sandbox, *args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "composeai.cli", "worker", "--interval", "0.2", *args],
        env=box.env(**env),
        cwd=str(box.root),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def status(box: _proc.Sandbox, run_id: str) -> str:
    return box.run_row(run_id)["status"]


def stop(proc: subprocess.Popen) -> _proc.Result:
    proc.send_signal(signal.SIGTERM)
    return _proc.finish(proc, timeout=60)


def effects(box: _proc.Sandbox, kind: str, label: str) -> list:
    return [e for e in box.side_effects() if e[0] == kind and e[1] == label]


def test_ext2_a_worker_continues_runs_parked_elsewhere_survives_failures_and_skips_unknown(box):
    """Park in A, worker in B: timers fire, a raising run is logged, an
    unregistered flow is skipped with a warning naming its module."""
    good = park(box, "dflows.napper.run('a', 0.3, wait=False)")
    bad = park(box, "dflows.boom.run('b', wait=False)")
    other = park(box, "otherflows.elsewhere.run(wait=False)")
    proc = worker(box, "--import", "dflows", "--concurrency", "2")
    try:
        _proc.wait_until(lambda: status(box, good) == "completed", what="the parked run")
        _proc.wait_until(lambda: status(box, bad) == "failed", what="the raising run")
        later = park(box, "dflows.napper.run('c', 0.2, wait=False)")
        _proc.wait_until(lambda: status(box, later) == "completed", what="a run parked later")
    finally:
        result = stop(proc)
    assert result.returncode == 0, result.describe()
    assert status(box, other) == "paused", "an unregistered flow is never failed"
    assert "import module 'otherflows'" in result.stderr, result.describe()
    lines = result.stdout.splitlines()
    assert any(f"started  {good} flow=napper reason=timer" in ln for ln in lines), result.stdout
    assert any(f"finished {good} flow=napper outcome=completed duration=" in ln for ln in lines), (
        result.stdout
    )
    assert any(
        f"finished {bad} flow=boom outcome=failed (ValueError: boom b)" in ln for ln in lines
    ), result.stdout
    assert [e[2] for e in effects(box, "work", "a")] == ["1", "2"], "each step ran once"


def test_ext2_worker_once_continues_what_is_due_and_exits(box):
    first = park(box, "dflows.napper.run('x', 0.3, wait=False)")
    second = park(box, "dflows.napper.run('y', 0.3, wait=False)")
    parked = time.monotonic()
    future = park(box, "dflows.napper.run('z', 3600, wait=False)")
    # `--once` continues what is due when it looks: both 0.3 s timers (journaled
    # before their park returned) must have passed by then, however fast the
    # processes start.
    time.sleep(max(0.0, parked + 0.35 - time.monotonic()))
    result = _proc.finish(worker(box, "--once", "--import", "dflows"))
    assert result.returncode == 0, result.describe()
    assert [status(box, r) for r in (first, second, future)] == ["completed", "completed", "paused"]


def test_ext2_kill9_during_a_blocking_sleep_is_recovered_by_the_worker(box):
    proc = box.spawn(
        """
        import dflows
        run = dflows.napper.run('k', 0.6)
        emit(status=run.status)
        """
    )
    _proc.wait_until(
        lambda: box.has_table("timers") and box.query("SELECT 1 FROM timers"),
        what="the run to block on its timer",
    )
    proc.kill()
    assert _proc.finish(proc).killed
    (run_id,) = box.run_ids()
    assert status(box, run_id) == "running"
    w = worker(box, "--import", "dflows")
    try:
        _proc.wait_until(lambda: status(box, run_id) == "completed", what="crash recovery")
    finally:
        result = stop(w)
    assert f"started  {run_id} flow=napper reason=recovered" in result.stdout, result.describe()
    assert [e[2] for e in effects(box, "work", "k")] == ["1", "2"], "no step ran twice"


def test_ext2_worker_killed_mid_run_then_restarted_completes_the_run(box):
    run_id = park(box, "dflows.sluggish.run('m', wait=False)")
    first = worker(box, "--import", "dflows", SLOW="60")
    _proc.wait_until(lambda: effects(box, "slow-start", "m"), what="the slow step to start")
    first.kill()
    assert _proc.finish(first).killed
    second = worker(box, "--import", "dflows", SLOW="0")
    try:
        _proc.wait_until(lambda: status(box, run_id) == "completed", what="the restarted worker")
    finally:
        stop(second)
    assert [e[2] for e in effects(box, "work", "m")] == ["1", "2"]
    assert len(effects(box, "slow-start", "m")) == 2, "the interrupted step re-ran"


def test_ext2_sigterm_stops_the_worker_and_leaves_its_run_resumable(box):
    run_id = park(box, "dflows.sluggish.run('t', wait=False)")
    w = worker(box, "--grace", "1", "--import", "dflows", SLOW="60")
    _proc.wait_until(lambda: effects(box, "slow-start", "t"), what="the slow step to start")
    result = stop(w)
    assert result.returncode == 0, result.describe()
    assert f"stopped  {run_id} left resumable" in result.stdout, result.describe()
    row = box.run_row(run_id)
    assert (row["status"], row["lease_owner"]) == ("running", None)
    done = box.run(
        f"""
        import dflows, composeai
        run = composeai.resume({run_id!r})
        emit(status=run.status, output=run.output)
        """,
        SLOW="0",
    ).ok()
    assert done == {"status": "completed", "output": 3}


def test_ext2_compose_runs_shows_parked_runs_and_trace_says_when_a_timer_wakes(box):
    run_id = park(box, "dflows.napper.run('p', 3600, wait=False)")
    out = subprocess.run(
        [sys.executable, "-m", "composeai.cli", "runs"],
        env=box.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    (line,) = [ln for ln in out.splitlines() if ln.startswith(run_id)]
    assert " paused " in line and "  timer until 20" in line, line
    trace = subprocess.run(
        [sys.executable, "-m", "composeai.cli", "trace", run_id],
        env=box.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "⏸ sleep#1" in trace
    assert "kind='timer' wakes at 20" in trace
    assert "compose worker" in trace


@task
def bump(x: int) -> int:
    return x + 1


def test_ext2_wake_due_continues_due_runs_in_this_process(isolated_state):
    @flow
    def later(x: int) -> int:
        compose.sleep(timedelta(hours=1))
        return bump(x)

    with fake_clock() as clock:
        parked = [later.run(i, wait=False) for i in range(3)]
        assert compose.wake_due() == []
        clock.advance(timedelta(hours=1))
        done = compose.wake_due()
    assert sorted(r.output for r in done) == [1, 2, 3]
    assert {r.id for r in done} == {r.id for r in parked}


def test_ext2_a_run_settled_elsewhere_after_listing_is_left_alone(isolated_state):
    """Two workers may list the same due run; the one that comes second finds
    it completed or failed and neither re-drives it nor reports it again."""
    from composeai.durable import continue_run
    from composeai.flow import NotDue

    calls: list[str] = []

    @task
    def record(label: str) -> str:
        calls.append(label)
        if label == "boom":
            raise RuntimeError("boom")
        return label

    @flow
    def settles(label: str) -> str:
        compose.sleep(timedelta(hours=1))
        return record(label)

    with fake_clock() as clock:
        ok = settles.run("ok", wait=False)
        bad = settles.run("boom", wait=False)
        clock.advance(timedelta(hours=1))
        assert continue_run(ok.id).output == "ok"
        with pytest.raises(RuntimeError, match="boom"):
            continue_run(bad.id)
        assert calls == ["ok", "boom"]
        for run_id in (ok.id, bad.id):
            with pytest.raises(NotDue):
                continue_run(run_id)
        assert compose.wake_due() == []
    assert calls == ["ok", "boom"]
    assert compose.get_run(ok.id).status == "completed"
    assert compose.get_run(bad.id).status == "failed"


def _due(run_id: str) -> bool:
    from composeai import _core, _engine

    return any(row[0] == run_id for row in _core.due_runs(_engine.get_store()))


def test_ext2_wake_due_warns_about_an_unregistered_flow(isolated_state):
    @flow
    def gone() -> int:
        compose.sleep(0.3)
        return 1

    run = gone.run(wait=False)
    from composeai.flow import reset_registries

    reset_registries()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _proc.wait_until(
            lambda: compose.get_run(run.id).status == "paused" and _due(run.id), what="due"
        )
        assert compose.wake_due() == []
    assert any(run.id in str(w.message) and "gone" in str(w.message) for w in caught)


def test_ext2_ops1_a_run_of_other_code_is_never_claimed_nor_logged_by_the_worker(box):
    """A flow whose source changed since the run parked: the worker's due
    query leaves the run to workers of its own code version (OPS-1), so it
    is neither started nor logged, on any pass."""
    run_id = park(box, "dflows.napper.run('s', 0.3, wait=False)")
    changed = box.root / "dflows.py"
    changed.write_text(changed.read_text().replace("return work(label, a)", "return a"))
    w = worker(box, "--import", "dflows")
    try:
        assert "worker ready" in _proc.read_line(w)
        # Past the run's timer, then several passes of the loop (--interval 0.2).
        time.sleep(1.5)
    finally:
        result = stop(w)
    assert run_id not in result.stdout, result.stdout
    assert status(box, run_id) == "paused"


def test_ext2_two_workers_share_a_store_and_each_run_completes_once(box):
    ids = [park(box, f"dflows.napper.run('r{i}', 0.3, wait=False)") for i in range(6)]
    workers = [worker(box, "--import", "dflows", PROC=f"w{k}") for k in range(2)]
    try:
        _proc.wait_until(lambda: all(status(box, r) == "completed" for r in ids), what="all runs")
    finally:
        results = [stop(w) for w in workers]
    for i in range(6):
        assert [e[2] for e in effects(box, "work", f"r{i}")] == ["1", "2"], box.side_effects()
    finished = sum(r.stdout.count("outcome=completed") for r in results)
    assert finished == 6, [r.stdout for r in results]
