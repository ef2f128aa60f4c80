"""The replayer (issue 27): `composeai.testing.replay()` and `compose replay` re-run stored
flow runs' bodies against their journals without executing any step or model and without
writing anything, and report which diverge from the current code — a code change checked
against yesterday's runs before it is deployed.

Replay is resume's replay (FLOW-16 hits, FLOW-14/15 keys) with every miss a stop: a completed
run replays to its end, a paused one up to its interrupt, a failed or crashed one up to the
first step its journal does not have.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

import _proc
import composeai as compose
from _replay import STORES, Deploy
from composeai import _engine
from composeai.errors import ComposeError

pytestmark = pytest.mark.parametrize("store_kind", STORES, indirect=True)


def replay(run, **kwargs):
    """`composeai.testing.replay`, imported per call so each test reports its absence."""
    from composeai.testing import replay as replay_run

    return replay_run(run, **kwargs)


@pytest.fixture
def deploy(tmp_path, monkeypatch):
    d = Deploy(tmp_path, monkeypatch)
    yield d
    d.close()


FLOWS = """\
import os
import time

import composeai as compose
from composeai.testing import FakeModel


@compose.task
def a(n: int) -> int:
    side_effect("a", n)
    return n + 1


@compose.task
def b(n: int) -> int:
    side_effect("b", n)
    if os.environ.get("B_FAILS"):
        raise RuntimeError("b is down")
    if n == int(os.environ.get("HANG_AT", "-1")):
        print("HANGING", flush=True)
        time.sleep(600)
    return n * 2


@compose.task
def c(n: int) -> int:
    side_effect("c", n)
    return n - 3


MODEL = FakeModel(["a summary"] * 10)


@compose.agent(model=MODEL, name="summarizer")
def summarizer(text: str) -> str:
    return f"summarize {text}"


@compose.flow(name="three")
def three(n: int) -> int:
    return c(b(a(n)))


@compose.flow(name="gated")
def gated(n: int) -> int:
    x = b(a(n))
    compose.approve("go")
    return c(x)


@compose.flow(name="assorted")
def assorted(n: int) -> dict:
    return {
        "map": compose.map(a, [n, n + 1]),
        "t": compose.now().isoformat(),
        "r": compose.random(),
        "summary": summarizer(str(n)),
        "tail": c(n),
    }


@compose.flow(name="async_three")
async def async_three(n: int) -> int:
    first = await a.arun(n)
    return await c.arun(await b.arun(first))
"""


def load(deploy, source: str = FLOWS):
    return deploy.load("replay_mod", source)


def untouched(deploy, run_id: str):
    """What replay must leave as it is: the row (incl. updated_at), journal, spans."""
    return deploy.state(run_id)


# -- testing.replay ---------------------------------------------------------------------


def test_issue27_replay_of_a_completed_run_executes_and_writes_nothing(deploy):
    """`testing.replay(run_id)` re-runs a completed run's body against its journal: the
    report names the run and flow, counts the replayed steps, `stopped_at` is None; no step
    executes and the runs row (updated_at too), journal and spans are unchanged."""
    mod = load(deploy)
    run = mod.three.run(1)
    assert run.output == 1
    executed = deploy.executions()
    before = untouched(deploy, run.id)
    time.sleep(0.01)
    report = replay(run.id)
    assert report.run_id == run.id
    assert report.flow == "three"
    assert report.steps == 3
    assert report.stopped_at is None
    assert deploy.executions() == executed
    assert untouched(deploy, run.id) == before


def test_issue27_replay_accepts_a_run_object(deploy):
    """`testing.replay(Run)` is the same as `replay(run.id)`."""
    mod = load(deploy)
    run = mod.three.run(2)
    report = replay(run)
    assert (report.run_id, report.flow, report.steps, report.stopped_at) == (
        run.id,
        "three",
        3,
        None,
    )


def test_issue27_replay_of_a_paused_run_stops_at_its_interrupt(deploy):
    """A paused run replays up to the interrupt it waits on: `stopped_at` is its id."""
    mod = load(deploy)
    run = mod.gated.run(5)
    assert run.status == "paused"
    before = untouched(deploy, run.id)
    report = replay(run.id)
    assert (report.flow, report.steps, report.stopped_at) == ("gated", 2, "go")
    assert untouched(deploy, run.id) == before
    assert deploy.executions() == [("a", "5"), ("b", "6")]
    # Still resumable, and the replay answered nothing.
    assert compose.resume(run.id, answers={"go": True}).output == 9


def test_issue27_replay_of_a_failed_run_stops_at_the_first_step_not_journaled(deploy, monkeypatch):
    """A failed run replays up to the first step its journal does not have (`b#1`)
    without executing it."""
    mod = load(deploy)
    monkeypatch.setenv("B_FAILS", "1")
    with pytest.raises(RuntimeError, match="b is down"):
        mod.three.run(1)
    (run_id,) = deploy.run_ids()
    assert deploy.run_row(run_id)["status"] == "failed"
    before = untouched(deploy, run_id)
    monkeypatch.delenv("B_FAILS")
    report = replay(run_id)
    assert (report.run_id, report.steps, report.stopped_at) == (run_id, 1, "b#1")
    assert deploy.executions() == [("a", "1"), ("b", "2")]
    assert untouched(deploy, run_id) == before


def test_issue27_replay_of_a_crashed_run_stops_at_the_step_it_died_in(deploy):
    """A run SIGKILLed inside `b` (real `kill -9` of a child process; its row is left
    `running`) replays in this process up to `b#1`."""
    load(deploy)
    child = deploy.box.spawn("import replay_mod\nreplay_mod.three.run(7)", HANG_AT="8")
    line = _proc.read_line(child)
    assert line == "HANGING\n", _proc.finish(child, prefix=line).describe()
    child.kill()
    assert _proc.finish(child).killed
    (run_id,) = deploy.run_ids()
    assert deploy.run_row(run_id)["status"] == "running"
    before = untouched(deploy, run_id)
    report = replay(run_id)
    assert (report.flow, report.steps, report.stopped_at) == ("three", 1, "b#1")
    assert untouched(deploy, run_id) == before
    assert [e[:2] for e in deploy.box.side_effects()] == [("a", "7"), ("b", "8")]


def test_issue27_replay_of_a_run_another_process_is_executing(deploy):
    """Replay takes no lease and writes nothing, so it reads a run that another live
    process is executing (hanging inside `b`) without waiting for or disturbing it."""
    load(deploy)
    child = deploy.box.spawn("import replay_mod\nreplay_mod.three.run(7)", HANG_AT="8")
    try:
        line = _proc.read_line(child)
        assert line == "HANGING\n", _proc.finish(child, prefix=line).describe()
        (run_id,) = deploy.run_ids()
        before = untouched(deploy, run_id)
        report = replay(run_id)
        assert (report.steps, report.stopped_at) == (1, "b#1")
        assert untouched(deploy, run_id) == before
        assert child.poll() is None, "the executing process was disturbed"
    finally:
        child.kill()
        _proc.finish(child)


def test_issue27_replay_covers_map_now_random_and_agents_without_calling_the_model(deploy):
    """Replay of a run with `map` items (FLOW-15), `now()`/`random()` and an agent step
    returns the journaled values: no task runs and no model is asked — the redeployed agent's
    model has no scripted reply left to give."""
    mod = load(deploy)
    run = mod.assorted.run(3)
    assert run.output["summary"] == "a summary"
    executed = deploy.executions()
    mod = load(deploy, FLOWS.replace('["a summary"] * 10', "[]"))
    before = untouched(deploy, run.id)
    report = replay(run.id)
    assert report.stopped_at is None and report.steps == 6
    assert mod.MODEL.requests == []
    assert deploy.executions() == executed
    assert untouched(deploy, run.id) == before


def test_issue27_replay_of_a_run_paused_on_a_gated_tool_asks_no_model(deploy):
    """A run paused inside an agent on an approval-gated tool (FLOW-36) replays up to that
    interrupt: `stopped_at` is `tool:send:c1`, the tool does not run, no model is asked."""
    source = """\
import composeai as compose
from composeai.testing import FakeModel


@compose.task
def prepare(topic: str) -> str:
    side_effect("prepare", topic)
    return topic.title()


@compose.tool(requires_approval=True)
def send(to: str) -> str:
    \"\"\"Send it.\"\"\"
    side_effect("send", to)
    return "sent"


MODEL = FakeModel(
    [{"tool_calls": [{"name": "send", "arguments": {"to": "ann"}, "id": "c1"}]}, "mailed"]
)


@compose.agent(model=MODEL, tools=[send], name="mailer")
def mailer(topic: str) -> str:
    return f"mail about {topic}"


@compose.flow(name="mailing")
def mailing(topic: str) -> str:
    return mailer(prepare(topic))
"""
    mod = deploy.load("mailing_mod", source)
    run = mod.mailing.run("owl")
    assert run.pending.id == "tool:send:c1"
    before = untouched(deploy, run.id)
    asked = len(mod.MODEL.requests)
    report = replay(run.id)
    assert len(mod.MODEL.requests) == asked
    assert deploy.executions() == [("prepare", "owl")]
    assert untouched(deploy, run.id) == before
    assert (report.flow, report.steps) == ("mailing", 1)
    assert report.stopped_at == "tool:send:c1"


def test_issue27_replay_of_an_async_flow(deploy):
    """An `async def` flow replays through the sync `testing.replay()`."""
    mod = load(deploy)
    run = asyncio.run(mod.async_three.arun(4))
    assert run.output == 7
    report = replay(run.id)
    assert (report.flow, report.steps, report.stopped_at) == ("async_three", 3, None)
    assert deploy.executions() == [("a", "4"), ("b", "5"), ("c", "10")]


def test_issue27_replay_raises_on_divergence_without_allow_code_change(deploy):
    """A divergent body raises `NondeterminismError` from `testing.replay()` — the
    fingerprint differs, but replay checks the calls, not the source (FLOW-41 step 6 is
    resume's concern) — and writes nothing."""
    mod = load(deploy)
    run = mod.three.run(1)
    before = untouched(deploy, run.id)
    load(deploy, FLOWS.replace("return c(b(a(n)))", "return c(b(a(n + 1)))"))
    with pytest.raises(compose.NondeterminismError) as info:
        replay(run.id)
    assert (info.value.run_id, info.value.key) == (run.id, "a#1")
    assert untouched(deploy, run.id) == before
    assert deploy.executions() == [("a", "1"), ("b", "2"), ("c", "4")]


def test_issue27_replay_raises_even_for_an_on_divergence_warn_flow(deploy):
    """`on_divergence="warn"` governs resume; the replayer reports the divergence anyway."""
    mod = load(deploy)
    run = mod.three.run(1)
    changed = FLOWS.replace(
        '@compose.flow(name="three")', '@compose.flow(name="three", on_divergence="warn")'
    ).replace("return c(b(a(n)))", "return b(c(a(n)))")
    load(deploy, changed)
    with pytest.raises(compose.NondeterminismError) as info:
        replay(run.id)
    assert info.value.key == "b#1"


def test_issue27_replay_passes_a_change_that_keeps_the_calls(deploy):
    """A source change that makes the same calls (a refactor) replays clean."""
    mod = load(deploy)
    run = mod.three.run(6)
    refactor = FLOWS.replace(
        "return c(b(a(n)))", "first = a(n)\n    second = b(first)\n    return c(second)"
    )
    load(deploy, refactor)
    report = replay(run.id)
    assert (report.steps, report.stopped_at) == (3, None)


def test_issue27_replay_reads_the_store_given_as_a_url(deploy, tmp_path, monkeypatch):
    """`testing.replay(run_id, store=URL)` reads that store (STORE-1 URL) rather than the
    configured one."""
    mod = load(deploy)
    run = mod.three.run(1)
    url = _engine.get_store().path
    if _engine.get_store().kind == "sqlite":
        url = f"sqlite://{url}"
    else:
        url = os.environ["COMPOSE_STORE"]
    monkeypatch.delenv("COMPOSE_STORE", raising=False)
    monkeypatch.setenv("COMPOSE_DIR", str(tmp_path / "elsewhere"))
    _engine.reset_store()
    with pytest.raises(ComposeError):
        replay(run.id)
    report = replay(run.id, store=url)
    assert (report.run_id, report.flow, report.steps) == (run.id, "three", 3)


def test_issue27_replay_of_an_unknown_run_or_unregistered_flow_is_an_error(deploy):
    """`testing.replay()` of a run id the store lacks, or of a run whose flow no imported
    module registers (as FLOW-41 step 4 for resume), raises a `ConfigError`."""
    from composeai.errors import ConfigError

    mod = load(deploy)
    run = mod.three.run(1)
    with pytest.raises(ConfigError) as info:
        replay("01NOTARUN0000000000000000")
    assert "01NOTARUN0000000000000000" in str(info.value)
    deploy.load("empty_mod", "")
    with pytest.raises(ConfigError) as info:
        replay(run.id)
    assert "three" in str(info.value)


# -- compose replay -----------------------------------------------------------------------


def cli(box: _proc.Sandbox, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "composeai.cli", "replay", *argv],
        capture_output=True,
        text=True,
        env=box.env(),
        cwd=str(box.root),
        timeout=_proc.TIMEOUT,
        check=False,
    )


def outcomes(stdout: str) -> dict[str, str]:
    """run id -> ok/diverged/skipped, from the per-run lines."""
    found = {}
    for line in stdout.splitlines():
        words = line.split()
        if words and words[0] in ("ok", "diverged", "skipped"):
            assert len(words) >= 2, line
            assert words[1] not in found, line
            found[words[1]] = words[0]
    return found


def summary(stdout: str) -> str:
    (line,) = [ln for ln in stdout.splitlines() if ln.startswith("replayed ")]
    return line


def start_runs(box: _proc.Sandbox, calls: str) -> list[str]:
    """Runs `calls` (expressions giving Runs, one per line) in a child; their ids."""
    body = "import replay_mod as m\nids = []\n" + "".join(
        f"ids.append(({line}).id)\n" for line in calls.strip().splitlines()
    )
    return box.run(body + "emit(ids=ids)").ok()["ids"]


def test_issue27_compose_replay_reports_ok_runs_and_exits_0(tmp_path):
    """`compose replay RUN_ID... --import M`: one line per run starting with `ok` and the
    run id, a summary line, exit 0 when all replay clean — completed, paused and async runs."""
    box = _proc.Sandbox(tmp_path)
    box.write_module("replay_mod", FLOWS)
    ids = start_runs(
        box,
        "m.three.run(1)\nm.gated.run(2)\n__import__('asyncio').run(m.async_three.arun(3))",
    )
    executed = box.side_effects()
    result = cli(box, *ids, "--import", "replay_mod")
    assert result.returncode == 0, result.stdout + result.stderr
    assert outcomes(result.stdout) == dict.fromkeys(ids, "ok")
    assert summary(result.stdout) == "replayed 3 runs: 3 ok, 0 diverged, 0 skipped"
    assert box.side_effects() == executed


OTHER = """\
import composeai as compose


@compose.task
def bump(n: int) -> int:
    side_effect("bump", n)
    return n + 100


@compose.flow(name="other")
def other(n: int) -> int:
    return bump(n)
"""


def test_issue27_compose_replay_ok_diverged_and_skipped(tmp_path):
    """`compose replay`: `ok` for a clean run, `diverged` for one the changed module no
    longer matches, `skipped` for a run whose flow no module registers; the summary line
    counts each and the exit code is 1."""
    box = _proc.Sandbox(tmp_path)
    box.write_module("replay_mod", FLOWS)
    box.write_module("other_mod", OTHER)
    ids = start_runs(box, "m.three.run(1)\nm.gated.run(2)\nm.three.run(3)")
    other = box.run("import other_mod\nemit(id=other_mod.other.run(1).id)").ok()["id"]
    clean = cli(box, *ids, other, "--import", "replay_mod", "--import", "other_mod")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert outcomes(clean.stdout) == dict.fromkeys([*ids, other], "ok")
    assert summary(clean.stdout) == "replayed 4 runs: 4 ok, 0 diverged, 0 skipped"
    executed = box.side_effects()

    box.write_module("replay_mod", FLOWS.replace("x = b(a(n))", "x = b(a(n) + 1)"))
    result = cli(box, *ids, other, "--import", "replay_mod")
    assert result.returncode == 1, result.stdout + result.stderr
    assert outcomes(result.stdout) == {
        ids[0]: "ok",
        ids[1]: "diverged",
        ids[2]: "ok",
        other: "skipped",
    }
    assert summary(result.stdout) == "replayed 4 runs: 2 ok, 1 diverged, 1 skipped"
    assert box.side_effects() == executed


def test_issue27_compose_replay_since_selects_recent_flow_runs(tmp_path):
    """`compose replay --since 7d` (no RUN_ID) replays the flow runs created in the last
    seven days: older runs and standalone agent runs are not selected."""
    box = _proc.Sandbox(tmp_path)
    box.write_module("replay_mod", FLOWS)
    ids = start_runs(box, "m.three.run(1)\nm.three.run(2)\nm.three.run(3)\nm.summarizer.run('x')")
    flows, agent_run = ids[:3], ids[3]
    raw_edit(box, f"UPDATE runs SET created_at = created_at - 10 * 86400 WHERE run_id = '{ids[0]}'")
    result = cli(box, "--since", "7d", "--import", "replay_mod")
    assert result.returncode == 0, result.stdout + result.stderr
    assert outcomes(result.stdout) == dict.fromkeys(flows[1:], "ok")
    assert agent_run not in result.stdout
    assert summary(result.stdout) == "replayed 2 runs: 2 ok, 0 diverged, 0 skipped"
    wide = cli(box, "--since", "30d", "--import", "replay_mod")
    assert outcomes(wide.stdout) == dict.fromkeys(flows, "ok")


def test_issue27_compose_replay_since_with_no_runs_in_the_window(tmp_path):
    """`compose replay --since 1d` over a store whose flow runs are all older replays
    nothing: `replayed 0 runs: 0 ok, 0 diverged, 0 skipped`, exit 0."""
    box = _proc.Sandbox(tmp_path)
    box.write_module("replay_mod", FLOWS)
    (run_id,) = start_runs(box, "m.three.run(1)")
    raw_edit(box, f"UPDATE runs SET created_at = created_at - 3 * 86400 WHERE run_id = '{run_id}'")
    result = cli(box, "--since", "1d", "--import", "replay_mod")
    assert result.returncode == 0, result.stdout + result.stderr
    assert outcomes(result.stdout) == {}
    assert summary(result.stdout) == "replayed 0 runs: 0 ok, 0 diverged, 0 skipped"


@pytest.mark.sqlite_file
def test_issue27_compose_replay_invalid_since_is_the_runs_error(tmp_path):
    """`compose replay --since` takes the values `compose runs --since` does (OBS-31) and
    refuses others the same way, exit 1."""
    box = _proc.Sandbox(tmp_path)
    result = cli(box, "--since", "2w")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        "compose: invalid --since value '2w': expected '<N>d', '<N>h', or 'YYYY-MM-DD'\n"
    )


def raw_edit(box: _proc.Sandbox, sql: str) -> None:
    if box.store:
        _proc.pg_exec(box.store, sql)
        return
    subprocess.run([sys.executable, "-c", _RAW_SQL, str(box.db_path), sql], check=True, timeout=60)


_RAW_SQL = """
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
with con:
    con.execute(sys.argv[2])
con.close()
"""


FLEET = """\
import composeai as compose


@compose.task
def one(i: int) -> int:
    side_effect("one", i)
    return i + 1


@compose.task
def two(i: int) -> int:
    side_effect("two", i)
    return i * 2


@compose.flow(name="alpha")
def alpha(i: int) -> int:
    return two(one(i))


@compose.flow(name="beta")
def beta(i: int) -> int:
    return two(one(i))
"""


@pytest.mark.sqlite_file
def test_issue27_compose_replay_over_1000_stored_runs_counts_divergence_exactly(tmp_path):
    """`compose replay --since 7d` over 1,000 stored runs, half of them (flow `beta`)
    checked against a module whose `beta` now calls `one(i + 1)`: exactly 500 diverged, 500
    ok, exit 1; no step executes and the store is unchanged."""
    box = _proc.Sandbox(tmp_path)
    box.write_module("fleet", FLEET)
    made = box.run(
        """
        import fleet
        alpha, beta = [], []
        for i in range(500):
            alpha.append(fleet.alpha.run(i).id)
            beta.append(fleet.beta.run(i).id)
        emit(alpha=alpha, beta=beta)
        """
    ).ok()
    head, _, tail = FLEET.rpartition("return two(one(i))")
    box.write_module("fleet", head + "return two(one(i + 1))" + tail)
    executed = len(box.side_effects())
    assert executed == 2000
    before = box.query(
        "SELECT (SELECT count(*) FROM journal) AS j, (SELECT count(*) FROM spans) AS s, "
        "(SELECT max(updated_at) FROM runs) AS u, (SELECT count(*) FROM runs) AS r"
    )
    result = cli(box, "--since", "7d", "--import", "fleet")
    assert result.returncode == 1, result.stderr
    found = outcomes(result.stdout)
    assert found == {
        **dict.fromkeys(made["alpha"], "ok"),
        **dict.fromkeys(made["beta"], "diverged"),
    }
    assert summary(result.stdout) == "replayed 1000 runs: 500 ok, 500 diverged, 0 skipped"
    assert len(box.side_effects()) == executed
    assert (
        box.query(
            "SELECT (SELECT count(*) FROM journal) AS j, (SELECT count(*) FROM spans) AS s, "
            "(SELECT max(updated_at) FROM runs) AS u, (SELECT count(*) FROM runs) AS r"
        )
        == before
    )


def test_issue27_compose_replay_of_paused_failed_and_completed_runs(tmp_path):
    """`compose replay` of a paused and a failed run (replayed up to where they stopped)
    is `ok` like a completed one; the runs' rows and journals are unchanged."""
    box = _proc.Sandbox(tmp_path)
    box.write_module("replay_mod", FLOWS)
    ids = start_runs(box, "m.three.run(1)\nm.gated.run(2)")
    failed = box.run("import replay_mod as m\nm.three.run(9)", B_FAILS="1").error()
    assert failed["error_type"] == "RuntimeError"
    (failed_id,) = [i for i in box.run_ids() if i not in ids]
    snapshot = [box.snapshot(i) for i in (*ids, failed_id)]
    result = cli(box, *ids, failed_id, "--import", "replay_mod")
    assert result.returncode == 0, result.stdout + result.stderr
    assert outcomes(result.stdout) == dict.fromkeys([*ids, failed_id], "ok")
    assert [box.snapshot(i) for i in (*ids, failed_id)] == snapshot


def test_issue27_compose_replay_calls_the_body_with_the_stored_arguments(tmp_path):
    """The replayed body gets the run's stored arguments (`args_json`, FLOW-11): with
    any other arguments its first call's argument hash would differ."""
    box = _proc.Sandbox(tmp_path)
    box.write_module("replay_mod", FLOWS)
    (run_id,) = start_runs(box, "m.three.run(40)")
    row = box.run_row(run_id)
    assert json.loads(row["args_json"]) == {"args": [40], "kwargs": {}}
    result = cli(box, run_id, "--import", "replay_mod")
    assert (result.returncode, outcomes(result.stdout)) == (0, {run_id: "ok"})
