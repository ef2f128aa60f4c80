"""Deploying new code under runs in flight (OPS-1, OPS-3), on both stores:
workers continue only the runs of the code they imported; `compose
versions` counts the unsettled runs per code version; `compose upgrade`,
`composeai.testing.upgrade` and `compose worker --upgrade` move runs to new
code only where their journal replays cleanly under it.

Old and new code are two copies of one module in two directories; each
child process imports one of them (its own PYTHONPATH).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

import _proc
import composeai as compose
from composeai import _answer, _core, _engine
from composeai.errors import ConfigError, NondeterminismError
from composeai.flow import reset_registries
from composeai.testing import upgrade

OLD = """\
import composeai as compose
from composeai import flow, task


@task
def work(label: str, i: int) -> int:
    side_effect("work", label, i)
    return i + 1


@task
def other(label: str) -> int:
    side_effect("other", label)
    return 0


@flow
def job(label: str) -> int:
    a = work(label, 1)
    compose.sleep(0.3)
    return work(label, a)
"""

# A comment line inside the body: a new fingerprint, the same calls.
COMMENTED = OLD.replace(
    "    a = work(label, 1)\n", "    # Reviewed: no behaviour change.\n    a = work(label, 1)\n"
)

# The first step is another task now: old runs diverge at their first key.
DIVERGENT = OLD.replace("    a = work(label, 1)\n", "    a = other(label) + 2\n")


@pytest.fixture
def box(tmp_path):
    sandbox = _proc.Sandbox(tmp_path)
    for name, source in (("old", OLD), ("new", COMMENTED), ("bad", DIVERGENT)):
        (tmp_path / name).mkdir()
        sandbox.write_module(f"{name}/app", source)
    return sandbox


def code(box: _proc.Sandbox, version: str) -> dict[str, str]:
    """The environment of a child running `version` of the code."""
    return {"PYTHONPATH": str(box.root / version), "PROC": version}


def park(box: _proc.Sandbox, version: str, label: str) -> str:
    result = box.run(
        f"""
        import app
        run = app.job.run({label!r}, wait=False)
        emit(id=run.id, status=run.status)
        """,
        **code(box, version),
    ).ok()
    assert result["status"] == "paused", result
    return result["id"]


def cli(box: _proc.Sandbox, version: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "composeai.cli", *args],
        env=box.env(**code(box, version)),
        cwd=str(box.root),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=_proc.TIMEOUT,
        check=False,
    )


def worker_once(box: _proc.Sandbox, version: str, *extra: str) -> str:
    done = cli(box, version, "worker", "--once", "--import", "app", *extra)
    assert done.returncode == 0, done.stderr
    return done.stdout


def due(box: _proc.Sandbox, *run_ids: str) -> None:
    """Waits until every run's 0.3 s sleep is over."""
    for run_id in run_ids:
        wake = box.query(
            "SELECT wake_at FROM waits w JOIN runs r ON r.rid = w.rid WHERE r.run_id = ?", (run_id,)
        )
        if wake and wake[0][0] is not None:
            _proc.wait_until(lambda w=wake[0][0]: _core.clock_now() > w + 0.01, what="the timer")


def effects(box: _proc.Sandbox, label: str) -> list[tuple[str, ...]]:
    return [e for e in box.side_effects() if e[1] == label]


def test_ops1_ops3_comment_only_change_upgraded_then_continued_by_a_new_code_worker(box):
    """A comment-only change strands nothing: the new worker leaves the old
    run alone (no claim, no log line), `compose versions` shows it on the
    old version, `compose upgrade` re-stamps it, and the new worker then
    continues it without re-running the journaled step."""
    run_id = park(box, "old", "a")
    due(box, run_id)
    out = worker_once(box, "new")
    assert run_id not in out, out
    assert box.run_row(run_id)["status"] == "paused"

    versions = json.loads(cli(box, "new", "versions", "--import", "app", "--json").stdout)
    old_fp = box.run_row(run_id)["fingerprint"]
    assert [(v["flow"], v["unsettled"], v["current"]) for v in versions] == [
        ("job", 0, True),
        ("job", 1, False),
    ]
    assert versions[1]["fingerprint"] == old_fp
    assert versions[1]["version"] == old_fp[:12]
    text = cli(box, "new", "versions", "--import", "app").stdout
    assert old_fp[:12] in text and "current" in text, text

    dry = cli(box, "new", "upgrade", "--import", "app", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"{run_id}  job  upgraded (dry run" in dry.stdout, dry.stdout
    assert box.run_row(run_id)["fingerprint"] == old_fp

    done = cli(box, "new", "upgrade", "--import", "app")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{run_id}  job  upgraded" in done.stdout
    assert "1 runs: 1 upgraded, 0 diverged, 0 skipped" in done.stdout
    new_fp = box.run_row(run_id)["fingerprint"]
    assert new_fp != old_fp
    record = json.loads(box.journal(run_id)["__upgrade__:1"])
    assert (record["from"], record["to"]) == (old_fp, new_fp)

    out = worker_once(box, "new")
    assert f"finished {run_id}" in out and "outcome=completed" in out, out
    assert box.run_row(run_id)["status"] == "completed"
    # The step journaled by the old code is not executed again.
    assert [e[:3] + e[3:] for e in effects(box, "a")] == [
        ("work", "a", "1", "old"),
        ("work", "a", "2", "new"),
    ]
    trace = cli(box, "new", "trace", run_id).stdout
    assert f"upgraded  {old_fp[:12]} -> {new_fp[:12]}" in trace, trace
    again = cli(box, "new", "upgrade", "--import", "app", run_id)
    assert "skipped: completed: nothing to upgrade" in again.stdout, again.stdout


def test_ops1_old_and_new_workers_side_by_side_each_continue_only_their_own_runs(box):
    old_run = park(box, "old", "o")
    new_run = park(box, "new", "n")
    due(box, old_run, new_run)
    old_out = worker_once(box, "old")
    assert f"finished {old_run}" in old_out and new_run not in old_out, old_out
    assert box.run_row(new_run)["status"] == "paused"
    new_out = worker_once(box, "new")
    assert f"finished {new_run}" in new_out and old_run not in new_out, new_out
    assert {box.run_row(r)["status"] for r in (old_run, new_run)} == {"completed"}
    assert {e[-1] for e in effects(box, "o")} == {"old"}
    assert {e[-1] for e in effects(box, "n")} == {"new"}


def test_ops3_divergent_change_is_reported_not_upgraded_and_an_old_worker_continues_it(box):
    run_id = park(box, "old", "d")
    old_fp = box.run_row(run_id)["fingerprint"]
    due(box, run_id)
    done = cli(box, "bad", "upgrade", "--import", "app")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{run_id}  job  diverged at work#1: recorded " in done.stdout, done.stdout
    assert "1 runs: 0 upgraded, 1 diverged, 0 skipped" in done.stdout
    assert box.run_row(run_id)["fingerprint"] == old_fp
    assert not any(k.startswith("__upgrade__") for k in box.journal(run_id))

    # A worker with --upgrade checks it, logs it once (not on every poll),
    # and leaves it.
    w = subprocess.Popen(
        [sys.executable, "-m", "composeai.cli", "worker", "--upgrade", "--interval", "0.2"]
        + ["--import", "app"],
        env=box.env(**code(box, "bad")),
        cwd=str(box.root),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = ""
    try:
        while "not upgraded" not in seen:
            line = _proc.read_line(w)
            assert line, "the worker exited"
            seen += line
        time.sleep(1.0)  # several passes of the loop (--interval 0.2)
    finally:
        w.send_signal(signal.SIGTERM)
        result = _proc.finish(w, timeout=60)
    log = seen + result.stdout
    assert log.count(f"not upgraded {run_id} flow=job: diverged at work#1") == 1, log
    assert f"started  {run_id}" not in log
    assert box.run_row(run_id)["fingerprint"] == old_fp

    out = worker_once(box, "old")
    assert f"finished {run_id}" in out and "outcome=completed" in out, out
    assert not [e for e in effects(box, "d") if e[0] == "other"]


def test_ops3_worker_upgrade_takes_over_a_run_that_replays_and_continues_it(box):
    run_id = park(box, "old", "w")
    due(box, run_id)
    out = worker_once(box, "new", "--upgrade")
    assert f"upgraded {run_id} flow=job" in out, out
    assert f"finished {run_id}" in out and "outcome=completed" in out, out
    assert [e[-1] for e in effects(box, "w")] == ["old", "new"]


# -- in-process: composeai.testing.upgrade ------------------------------------


def _v1():
    @compose.task
    def inc(x: int) -> int:
        return x + 1

    @compose.flow
    def deal(x: int) -> int:
        y = inc(x)
        compose.approve("go")
        return y

    return deal


def _v2_commented():
    @compose.task
    def inc(x: int) -> int:
        return x + 1

    @compose.flow
    def deal(x: int) -> int:
        # Same calls, one comment more.
        y = inc(x)
        compose.approve("go")
        return y

    return deal


def _v3_divergent():
    @compose.task
    def dec(x: int) -> int:
        return x - 1

    @compose.flow
    def deal(x: int) -> int:
        y = dec(x)
        compose.approve("go")
        return y

    return deal


def _load(version) -> compose.Flow:
    reset_registries()
    return version()


def test_ops3_testing_upgrade_reports_each_case_and_restores_a_run_failed_by_divergence():
    v1 = _load(_v1)
    paused = v1.run(1)
    assert paused.status == "paused"
    finished = compose.resume(v1.run(5).id, answers={"go": True})
    assert finished.status == "completed"
    store = _engine.get_store()
    old_fp = v1.fingerprint

    # A resume under divergent code fails the run with NondeterminismError.
    failing = v1.run(7)
    _load(_v3_divergent)
    with pytest.raises(NondeterminismError):
        compose.resume(failing.id, answers={"go": True}, allow_code_change=True)
    assert store.get_run(failing.id)["status"] == "failed"

    v2 = _load(_v2_commented)
    assert v2.fingerprint != old_fp
    dry = upgrade(dry_run=True)
    assert {(r.run_id, r.outcome, r.dry_run) for r in dry} == {
        (paused.id, "upgraded", True),
        (failing.id, "upgraded", True),
    }
    assert store.get_run(paused.id)["fingerprint"] == old_fp

    reports = {r.run_id: r for r in upgrade([paused.id, failing.id, finished.id, "nope"])}
    assert reports[paused.id].outcome == "upgraded"
    assert reports[paused.id].status == "paused"
    assert (reports[paused.id].from_fingerprint, reports[paused.id].to_fingerprint) == (
        old_fp,
        v2.fingerprint,
    )
    assert reports[failing.id].outcome == "upgraded"
    assert reports[finished.id].reason == "completed: nothing to upgrade"
    assert reports["nope"].reason == "no such run"
    # The failed run is back where it failed from: answered, so due now.
    row = store.get_run(failing.id)
    assert (row["status"], row["error_json"], row["fingerprint"]) == (
        "paused",
        None,
        v2.fingerprint,
    )
    assert compose.resume(failing.id).output == 8
    assert compose.resume(paused.id, answers={"go": True}).output == 2
    # Upgraded again (to the first code), every upgrade row is kept.
    again = _load(_v1).run(3)
    _load(_v2_commented)
    assert upgrade([again.id])[0].outcome == "upgraded"
    _load(_v1)
    assert upgrade([again.id])[0].outcome == "upgraded"
    rows = [k for k, _ in store.journal(again.id) if k.startswith("__upgrade__:")]
    assert sorted(rows) == ["__upgrade__:1", "__upgrade__:2"]


def test_ops3_a_queued_run_is_restamped_and_a_second_upgrade_finds_it_already_upgraded():
    v1 = _load(_v1)
    queue = compose.Queue("deploys")
    queued = v1.start(1, queue=queue)
    v2 = _load(_v2_commented)
    [report] = upgrade(flow="deal")
    assert (report.run_id, report.outcome, report.status) == (queued.id, "upgraded", "queued")
    store = _engine.get_store()
    assert store.get_run(queued.id)["fingerprint"] == v2.fingerprint
    # A second upgrade that checked the run before the first re-stamped it.
    outcome = _core.upgrade_run(store, queued.id, v1.fingerprint, v2.fingerprint, "queued", 0)
    assert outcome == ("already", "")
    [later] = upgrade([queued.id])
    assert later.outcome == "skipped" and "already on the imported code" in later.reason


def test_ops3_a_run_of_a_flow_not_imported_is_skipped_naming_import():
    run = _load(_v1).run(1)
    reset_registries()
    [report] = upgrade([run.id])
    assert report.outcome == "skipped"
    assert "--import" in report.reason and "'deal'" in report.reason
    with pytest.raises(ConfigError, match="--import"):
        upgrade(flow="deal")


def test_ops3_a_run_executing_elsewhere_is_left_to_its_attempt():
    v1 = _load(_v1)
    run = v1.run(1)
    attempt = _engine.get_store().resume(run.id)
    try:
        _load(_v2_commented)
        [report] = upgrade([run.id])
    finally:
        attempt.settle("paused", None, None)
    assert report.outcome == "skipped"
    assert "executing in another process" in report.reason


def test_ops1_due_runs_are_filtered_by_code_version_in_the_query():
    v1 = _load(_v1)
    run = v1.run(1)
    store = _engine.get_store()
    assert _core.due_runs(store) == []
    # Answered from outside, the paused run is due for a worker.
    _answer.answer(run.id, "go", True, resume=False)
    listed = [r[0] for r in _core.due_runs(store)]
    assert listed == [run.id]
    assert [r[0] for r in _core.due_runs(store, versions=[("deal", v1.fingerprint)])] == [run.id]
    assert _core.due_runs(store, versions=[("deal", "another")]) == []
    assert [r[0] for r in _core.due_runs(store, versions=[("other", "x")])] == [run.id]
    mismatched = _core.due_runs(store, versions=[("deal", "another")], mismatched=True)
    assert [r[0] for r in mismatched] == [run.id]
    assert _core.due_runs(store, versions=[("deal", v1.fingerprint)], mismatched=True) == []


def test_ops1_a_worker_claims_queued_runs_of_its_own_code_only():
    v1 = _load(_v1)
    queue = compose.Queue("versions")
    queued = v1.start(1, queue=queue)
    store = _engine.get_store()
    assert _core.queue_claim(store, "versions", 5, ["deal"], fingerprints=["another"]) == []
    claimed = _core.queue_claim(store, "versions", 5, ["deal"], fingerprints=[v1.fingerprint])
    assert [c[0] for c in claimed] == [queued.id]


def test_ops1_the_ui_run_page_shows_the_code_version_and_whether_it_matches():
    from composeai.ui import views

    run = _load(_v1).run(1)
    fingerprint = _engine.get_store().get_run(run.id)["fingerprint"]
    _, page = views.run_page(run.id, "token")
    assert f"data-matches='yes'>{fingerprint[:12]}</code> matches the imported code" in page
    _load(_v2_commented)
    _, page = views.run_page(run.id, "token")
    assert f"data-matches='no'>{fingerprint[:12]}</code>" in page
    assert "compose upgrade --import MODULE" in page
    reset_registries()
    _, page = views.run_page(run.id, "token")
    assert "data-matches='unknown'" in page
