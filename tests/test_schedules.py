"""OPS-11: schedules stored in the store and fired by `compose worker`, on both stores:
one run per tick with the id `sched:<name>:<tick>` however many workers race for it;
`catchup` latest/none/all after the workers were down; `scheduled_time()`;
pause/resume/delete/trigger; `compose schedules` and `compose schedule ...`; the bad
inputs of the issue. In-process cases move the engine clock with `fake_clock`; the
three-worker case runs real subprocesses whose engine clocks follow one shared,
accelerated timeline (a minute tick every 2 s)."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest

import _proc
import composeai as compose
from composeai import _core, _engine
from composeai.cli import main as cli
from composeai.errors import ConfigError
from composeai.testing import fake_clock
from composeai.worker import Worker

START = datetime(2031, 3, 3, 9, 0, 30, tzinfo=timezone.utc)
TICK = datetime(2031, 3, 3, 9, 1, tzinfo=timezone.utc)


def _report_flow(seen: list):
    @compose.flow
    def report(region: str = "eu") -> str:
        seen.append((compose.scheduled_time(), region))
        return region

    return report


def _worker() -> Worker:
    return Worker(out=open("/dev/null", "w"))


def _once(worker: Worker) -> None:
    worker.once()


@pytest.mark.parametrize(
    ("cron", "tz", "catchup", "match"),
    [
        ("0 0 * * * *", "UTC", "latest", "has 6 fields"),
        ("61 * * * *", "UTC", "latest", "minute field"),
        ("0 0 30 FEB *", "UTC", "latest", "never fires"),
        ("0 9 * * MON", "Mars/Olympus_Mons", "latest", "unknown time zone"),
        ("0 9 * * MON", "UTC", "sometimes", 'catchup must be "latest", "none" or "all"'),
        ("", "UTC", "latest", "has 0 fields"),
    ],
)
def test_ops11_bad_inputs_are_config_errors_and_store_nothing(store_kind, cron, tz, catchup, match):
    report = _report_flow([])
    with pytest.raises(ConfigError, match=match):
        compose.schedule(report, cron, timezone=tz, catchup=catchup)
    assert compose.list_schedules() == []


def test_ops11_bad_names_and_arguments(store_kind):
    report = _report_flow([])
    with pytest.raises(ConfigError, match="schedule name"):
        compose.schedule(report, "@daily", name="has space")
    with pytest.raises(ConfigError, match="takes a @flow"):
        compose.schedule(lambda: None, "@daily")
    with pytest.raises(ConfigError, match="args must be a tuple"):
        compose.schedule(report, "@daily", args=["eu"])
    assert compose.list_schedules() == []


def test_ops11_redeclared_with_another_cron_is_updated_in_place(store_kind):
    report = _report_flow([])
    with fake_clock(START):
        first = compose.schedule(report, "*/5 * * * *", timezone="Europe/Paris")
        assert first.next_fire == datetime(2031, 3, 3, 9, 5, tzinfo=timezone.utc)
        again = compose.schedule(report, "*/5 * * * *", timezone="Europe/Paris")
        assert again.next_fire == first.next_fire
        first.pause()
        moved = compose.schedule(report, "0 12 * * *", timezone="Europe/Paris")
    assert [s.name for s in compose.list_schedules()] == ["report"]
    assert moved.cron == "0 12 * * *" and moved.paused
    # 12:00 in Paris (UTC+1 in March) is 11:00 UTC.
    assert moved.next_fire == datetime(2031, 3, 3, 11, 0, tzinfo=timezone.utc)


def test_ops11_the_worker_fires_each_tick_once_with_its_id_and_scheduled_time(store_kind):
    seen: list = []
    report = _report_flow(seen)
    with fake_clock(START) as clock:
        compose.schedule(report, "* * * * *", kwargs={"region": "us"})
        worker = _worker()
        _once(worker)
        assert seen == []
        clock.advance(30)
        _once(worker)
        _once(worker)
        clock.advance(60)
        _once(worker)
    assert seen == [(TICK, "us"), (TICK + timedelta(minutes=1), "us")]
    first = compose.get_run("sched:report:2031-03-03T09:01:00Z")
    assert first.status == "completed"
    assert compose.get_run("sched:report:2031-03-03T09:02:00Z").status == "completed"
    sched = compose.list_schedules()[0]
    assert sched.last_fire == TICK + timedelta(minutes=1)
    assert sched.last_run_id == "sched:report:2031-03-03T09:02:00Z"
    assert sched.next_fire == TICK + timedelta(minutes=2)
    assert compose.scheduled_time() is None


@pytest.mark.parametrize(
    ("catchup", "fired"),
    [("latest", ["09:03"]), ("none", []), ("all", ["09:01", "09:02", "09:03"])],
)
def test_ops11_catchup_after_the_workers_were_down_for_three_ticks(store_kind, catchup, fired):
    seen: list = []
    report = _report_flow(seen)
    with fake_clock(START) as clock:
        compose.schedule(report, "* * * * *", catchup=catchup)
        # No worker from 09:00:30 to 09:03:20: ticks 09:01, 09:02 and 09:03 are missed.
        clock.advance(170)
        worker = _worker()
        _once(worker)
        _once(worker)
        # The worker executes fired runs side by side: compare them as a set.
        assert sorted(t.strftime("%H:%M") for t, _ in seen) == fired
        # The next tick fires on time whatever the catchup.
        clock.advance(40)
        _once(worker)
    assert seen[-1][0] == datetime(2031, 3, 3, 9, 4, tzinfo=timezone.utc)
    assert len(seen) == len(fired) + 1


def test_ops11_a_clock_that_jumps_back_never_fires_a_tick_twice(store_kind):
    seen: list = []
    report = _report_flow(seen)
    with fake_clock(START) as clock:
        compose.schedule(report, "* * * * *")
        clock.advance(31)
        worker = _worker()
        _once(worker)
        _core.clock_set_fake(START.timestamp() - 3600)
        _once(worker)
        _core.clock_set_fake(TICK.timestamp() + 5)
        _once(worker)
    assert seen == [(TICK, "eu")]


def test_ops11_pause_resume_delete_and_trigger(store_kind):
    seen: list = []
    report = _report_flow(seen)
    with fake_clock(START) as clock:
        sched = compose.schedule(report, "* * * * *", name="nightly", args=("apac",))
        sched.pause()
        clock.advance(120)
        worker = _worker()
        _once(worker)
        assert seen == []
        sched.resume()
        assert sched.next_fire == datetime(2031, 3, 3, 9, 3, tzinfo=timezone.utc)
        handle = sched.trigger()
        run = handle.result(timeout=30)
        assert run.output == "apac"
        assert handle.id.startswith("sched:nightly:manual:")
        assert seen[0][0] is not None
        sched.delete()
    assert compose.list_schedules() == []
    with pytest.raises(ConfigError, match="no schedule named 'nightly'"):
        sched.pause()


def test_ops11_a_queued_schedule_enqueues_its_runs(store_kind):
    report = _report_flow([])
    compose.Queue("reports")
    with fake_clock(START) as clock:
        compose.schedule(report, "* * * * *", queue="reports")
        clock.advance(30)
        _once(_worker())
    handle = compose.get_run("sched:report:2031-03-03T09:01:00Z")
    assert handle.status == "queued"


def test_ops11_cli_lists_and_drives_schedules(store_kind, capsys):
    report = _report_flow([])
    with fake_clock(START):
        compose.schedule(report, "0 9 * * MON-FRI", timezone="America/New_York")
    assert cli(["schedules"]) == 0
    out = capsys.readouterr().out
    assert "report" in out and "0 9 * * MON-FRI" in out and "America/New_York" in out
    assert "no worker has imported flow report" in out
    _core.serve_flows(_engine.get_store(), ["report"])
    assert cli(["schedules", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["state"] == "active" and rows[0]["last_fire"] is None
    assert rows[0]["next_fire"] == "2031-03-03T14:00:00+00:00"
    assert cli(["schedule", "pause", "report"]) == 0
    assert compose.list_schedules()[0].paused
    assert cli(["schedule", "resume", "report"]) == 0
    assert not compose.list_schedules()[0].paused
    assert cli(["schedule", "delete", "report"]) == 0
    assert cli(["schedule", "pause", "report"]) == 1
    assert "no schedule named 'report'" in capsys.readouterr().err


ACCELERATED = """\
import math, os, threading, time

import composeai as compose
from composeai import _core

_ORIGIN = float(os.environ["CLOCK_ORIGIN"])
_FAKE = float(os.environ["CLOCK_FAKE"])
_SCALE = 30.0


def _follow():
    # Engine time runs 30x real time from one origin shared by every process;
    # it is set when each engine minute begins, so a worker wakes on the set.
    while True:
        now = _FAKE + (time.time() - _ORIGIN) * _SCALE
        tick = math.floor(now / 60.0 + 1.0) * 60.0
        time.sleep(max(0.0, _ORIGIN + (tick - _FAKE) / _SCALE - time.time()))
        _core.clock_set_fake(tick)


_core.clock_set_fake(_FAKE + (time.time() - _ORIGIN) * _SCALE)
threading.Thread(target=_follow, daemon=True).start()


@compose.flow
def tick() -> str:
    side_effect("tick", compose.scheduled_time().isoformat())
    return "ok"
"""


def test_ops11_three_workers_start_exactly_one_run_per_tick(store_kind, tmp_path):
    box = _proc.Sandbox(tmp_path)
    box.write_module("ticking", ACCELERATED)
    origin = time.time()
    fake = START.timestamp()
    env = {"CLOCK_ORIGIN": repr(origin), "CLOCK_FAKE": repr(fake)}
    box.run(
        "import ticking\nticking.compose.schedule(ticking.tick, '* * * * *')\nemit(ok=1)", **env
    ).ok()
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "composeai.cli", "worker", "--import", "ticking"],
            env=box.env(PROC=f"w{i}", **env),
            cwd=str(box.root),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    try:
        # About five accelerated minutes: ticks every 2 s of real time.
        _proc.wait_until(lambda: len(box.side_effects()) >= 5, timeout=90, what="five fired ticks")
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        results = [_proc.finish(w, timeout=60) for w in workers]
    ticks = [e[1] for e in box.side_effects()]
    assert len(ticks) == len(set(ticks)), ticks
    fired = sorted(datetime.fromisoformat(t) for t in ticks)
    assert all(b - a == timedelta(minutes=1) for a, b in itertools.pairwise(fired)), fired
    completed = [
        r for r in box.run_ids() if box.run_row(r)["status"] == "completed" and "sched:" in r
    ]
    assert sorted(completed) == [f"sched:tick:{t.strftime('%Y-%m-%dT%H:%M:%SZ')}" for t in fired]
    created = sum(r.stdout.count("fired    sched:tick:") for r in results)
    assert created == len([r for r in box.run_ids() if r.startswith("sched:tick:")])
