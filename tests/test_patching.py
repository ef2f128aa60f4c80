"""OPS-2 patching: `compose.patched(patch_id)` and `compose.deprecate_patch(patch_id)`.

Old runs (started on code without the patch) take the old branch, new runs the new one, in
this process and in fresh ones, across crashes and `kill -9`; never a divergence; the
replayer (`testing.replay`, `compose replay`) understands the markers.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

import _proc
import composeai as compose
from _replay import STORES, Deploy
from composeai.errors import ConfigError
from composeai.testing import replay

pytestmark = pytest.mark.parametrize("store_kind", STORES, indirect=True)


@pytest.fixture
def deploy(tmp_path, monkeypatch):
    d = Deploy(tmp_path, monkeypatch)
    yield d
    d.close()


TASKS = """\
import os
import time

import composeai as compose


def hang(name):
    if os.environ.get("HANG_IN") == name:
        print("HANGING", flush=True)
        time.sleep(600)


@compose.task
def a() -> str:
    side_effect("a")
    return "A"


@compose.task
def old() -> str:
    side_effect("old")
    hang("old")
    return "OLD"


@compose.task
def new() -> str:
    side_effect("new")
    hang("new")
    return "NEW"


@compose.task
async def anew() -> str:
    side_effect("anew")
    return "ANEW"


@compose.task
async def aold() -> str:
    side_effect("aold")
    return "AOLD"
"""


def module(body: str, *, is_async: bool = False) -> str:
    head = "async def" if is_async else "def"
    return (
        TASKS
        + f'\n\n@compose.flow(name="job")\n{head} job() -> object:\n'
        + textwrap.indent(textwrap.dedent(body).strip(), "    ")
        + "\n"
    )


# The old code and the patched code of one flow: the change comes after the gate.
V1_TAIL = 'a()\ncompose.approve("go")\nreturn old()'
V2_TAIL = 'a()\ncompose.approve("go")\nif compose.patched("v2"):\n    return new()\nreturn old()'
# The change comes before the gate: the journal holds the old branch's row, or the marker.
V1_HEAD = 'x = old()\ncompose.approve("go")\nreturn x'
V2_HEAD = 'x = new() if compose.patched("v2") else old()\ncompose.approve("go")\nreturn x'
V3_HEAD = 'compose.deprecate_patch("v2")\nx = new()\ncompose.approve("go")\nreturn x'


def markers(deploy, run_id: str) -> dict:
    return {k: v for k, v in deploy.journal(run_id).items() if k.startswith("patched#")}


def test_ops2_old_runs_take_the_old_branch_where_their_journal_ends_before_the_patch(deploy):
    """OPS-2: a run started on code without the patch, paused before the patched point and
    resumed on the patched code, takes the old branch and journals no marker; a run started on
    the patched code takes the new branch and journals its marker at the call's position."""
    mod = deploy.load("job_mod", module(V1_TAIL))
    old_run = mod.job.run()
    mod = deploy.load("job_mod", module(V2_TAIL))
    new_run = mod.job.run()
    assert old_run.status == new_run.status == "paused"
    assert markers(deploy, new_run.id) == {}
    done_old = compose.resume(old_run.id, answers={"go": True}, allow_code_change=True)
    done_new = compose.resume(new_run.id, answers={"go": True})
    assert (done_old.output, done_new.output) == ("OLD", "NEW")
    assert markers(deploy, old_run.id) == {}
    assert markers(deploy, new_run.id) == {"patched#1": '"v2"'}


def test_ops2_replayed_positions_answer_by_the_journal(deploy):
    """OPS-2: where the journal holds the old branch's row at the patched position, replay
    answers False and the old row replays; where it holds the marker, True and the new row
    replays; no journaled step executes again and nothing is journaled for the old run."""
    mod = deploy.load("job_mod", module(V1_HEAD))
    old_run = mod.job.run()
    mod = deploy.load("job_mod", module(V2_HEAD))
    new_run = mod.job.run()
    executed = deploy.executions()
    assert executed == [("old",), ("new",)]
    journal = deploy.journal(old_run.id)
    done_old = compose.resume(old_run.id, answers={"go": True}, allow_code_change=True)
    done_new = compose.resume(new_run.id, answers={"go": True})
    assert (done_old.output, done_new.output) == ("OLD", "NEW")
    assert deploy.executions() == executed
    assert {k: v for k, v in deploy.journal(old_run.id).items() if k != "__interrupt__:go"} == (
        journal
    )
    assert markers(deploy, new_run.id) == {"patched#1": '"v2"'}


def test_ops2_deprecate_patch_accepts_journals_with_and_without_the_marker(deploy):
    """OPS-2: `deprecate_patch` replays a run that journaled the marker and journals nothing
    in a new run; neither is a divergence."""
    mod = deploy.load("job_mod", module(V2_HEAD))
    patched_run = mod.job.run()
    mod = deploy.load("job_mod", module(V3_HEAD))
    new_run = mod.job.run()
    assert markers(deploy, new_run.id) == {}
    done = compose.resume(patched_run.id, answers={"go": True}, allow_code_change=True)
    assert done.output == "NEW"
    assert compose.resume(new_run.id, answers={"go": True}).output == "NEW"
    assert deploy.executions() == [("new",), ("new",)]


def test_ops2_the_same_patch_twice_in_a_scope_and_inside_a_map(deploy):
    """OPS-2: the same patch id twice in one scope (each call at its own position), and in
    `map` items, replays without divergence and answers as first journaled."""
    body = """\
    first = compose.patched("p")
    second = compose.patched("p")
    items = compose.map(item, [1, 2])
    compose.approve("go")
    return [first, second, items, compose.patched("p")]
    """
    source = module(body).replace(
        "\n\n@compose.flow",
        '\n\n@compose.flow\ndef item(n: int) -> list:\n    return [compose.patched("p"), n]\n'
        "\n\n@compose.flow",
        1,
    )
    mod = deploy.load("job_mod", source)
    run = mod.job.run()
    assert set(markers(deploy, run.id)) == {"patched#1", "patched#2"}
    deploy.load("job_mod", source)
    done = compose.resume(run.id, answers={"go": True})
    assert done.output == [True, True, [[True, 1], [True, 2]], True]
    assert set(markers(deploy, run.id)) == {"patched#1", "patched#2", "patched#3"}


def test_ops2_async_flow_bodies(deploy):
    """OPS-2: `patched` works in `async def` flow bodies (no await) for old and new runs."""
    v1 = 'await a.arun()\ncompose.approve("go")\nreturn await aold.arun()'
    v2 = (
        'await a.arun()\ncompose.approve("go")\n'
        'return await (anew if compose.patched("v2") else aold).arun()'
    )
    mod = deploy.load("job_mod", module(v1, is_async=True).replace("def a()", "async def a()"))
    old_run = asyncio.run(mod.job.arun())
    mod = deploy.load("job_mod", module(v2, is_async=True).replace("def a()", "async def a()"))
    new_run = asyncio.run(mod.job.arun())

    async def finish(run_id, **kw):
        return (await compose.aresume(run_id, answers={"go": True}, **kw)).output

    assert asyncio.run(finish(old_run.id, allow_code_change=True)) == "AOLD"
    assert asyncio.run(finish(new_run.id)) == "ANEW"


def test_ops2_bad_patch_ids_are_config_errors(deploy):
    """OPS-2: an empty or non-string patch id -> `ConfigError` naming the call, in a flow
    body and outside; outside a durable run `patched` answers True."""
    for bad in ("", None, 3, b"v2"):
        with pytest.raises(ConfigError, match="patch id"):
            compose.patched(bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="patch id"):
            compose.deprecate_patch(bad)  # type: ignore[arg-type]
    assert compose.patched("v2") is True
    assert compose.deprecate_patch("v2") is None
    mod = deploy.load("job_mod", module('return compose.patched("")'))
    with pytest.raises(ConfigError):
        mod.job.run()
    assert "patched" not in compose.__all__ and "deprecate_patch" not in compose.__all__


def test_ops2_replayer_understands_markers(deploy):
    """OPS-2: `testing.replay` replays old and new runs under the patched code without
    divergence, counting the marker as a replayed step."""
    mod = deploy.load("job_mod", module(V1_HEAD))
    old_run = mod.job.run()
    mod = deploy.load("job_mod", module(V2_HEAD))
    new_run = mod.job.run()
    old_report = replay(old_run.id)
    new_report = replay(new_run.id)
    assert (old_report.stopped_at, new_report.stopped_at) == ("go", "go")
    assert (old_report.steps, new_report.steps) == (1, 2)


# -- across processes and crashes -----------------------------------------------------------

START = """
import job_mod
run = job_mod.job.run()
emit(id=run.id, status=run.status)
"""

RESUME = """
import os
import job_mod
from composeai import resume
run = resume(os.environ["RUN_ID"], answers={"go": True}, allow_code_change=True)
emit(status=run.status, output=run.output)
"""


def killed_in(box: _proc.Sandbox, body: str, where: str, **env: str) -> None:
    """Runs `body` in a child until the task `where` hangs, then SIGKILLs it."""
    child = box.spawn(body, HANG_IN=where, **env)
    line = _proc.read_line(child)
    assert line == "HANGING\n", _proc.finish(child, prefix=line).describe()
    child.kill()
    assert _proc.finish(child).killed


def test_ops2_old_and_new_runs_across_processes_and_kill_9(tmp_path):
    """OPS-2 across fresh processes: an old run and a new run are each SIGKILLed inside the
    branch they took (real `kill -9`); fresh processes with the patched code resume them and
    each completes on its own branch: the old run never journals a marker, the new one keeps
    its own; `compose replay` reports both ok."""
    box = _proc.Sandbox(tmp_path)
    box.write_module("job_mod", module(V1_TAIL))
    old_id = box.run(START).ok()["id"]
    box.write_module("job_mod", module(V2_TAIL))
    new_id = box.run(START).ok()["id"]
    killed_in(box, RESUME, "old", RUN_ID=old_id)
    killed_in(box, RESUME, "new", RUN_ID=new_id)
    assert not [k for k in box.journal(old_id) if k.startswith("patched#")]
    assert "patched#1" in box.journal(new_id)
    assert box.run(RESUME, RUN_ID=old_id).ok()["output"] == "OLD"
    assert box.run(RESUME, RUN_ID=new_id).ok()["output"] == "NEW"
    lines = [ln[0] for ln in box.side_effects()]
    assert lines.count("old") == 2 and lines.count("new") == 2 and lines.count("a") == 2
    result = subprocess.run(
        [sys.executable, "-m", "composeai.cli", "replay", old_id, new_id, "--import", "job_mod"],
        capture_output=True,
        text=True,
        env=box.env(),
        cwd=str(box.root),
        timeout=_proc.TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 ok, 0 diverged" in result.stdout, result.stdout
