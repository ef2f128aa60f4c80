"""Replay safety (issue 27): a resumed body that no longer makes the journaled calls raises
`NondeterminismError` instead of silently mixing old results into new code.

Each journaled step carries its identity (kind, name, key — FLOW-14/FLOW-15 — a hash of its
arguments, and its position among the journaled calls of its scope). On replay (FLOW-41/42
resume) the call the body makes now is compared with it. The divergent shapes below start from
a run paused at `approve("go")` after its steps, then resume it under a changed module with
`allow_code_change=True` (the fingerprint check, FLOW-41 step 6, keeps its own meaning).
"""

from __future__ import annotations

import asyncio
import json
import textwrap
import warnings

import pytest

import _proc
import composeai as compose
from _replay import STORES, Deploy, raw_sql
from composeai.errors import ComposeError, ConfigError, ResumeMismatchError

pytestmark = pytest.mark.parametrize("store_kind", STORES, indirect=True)


@pytest.fixture
def deploy(tmp_path, monkeypatch):
    d = Deploy(tmp_path, monkeypatch)
    yield d
    d.close()


TASKS = """\
import composeai as compose


@compose.task
def a() -> str:
    side_effect("a")
    return "A"


@compose.task
def b() -> str:
    side_effect("b")
    return "B"


@compose.task
def b2() -> str:
    side_effect("b2")
    return "B2"


@compose.task
def c() -> str:
    side_effect("c")
    return "C"


@compose.task
def x() -> str:
    side_effect("x")
    return "X"


@compose.task
def fetch(n: int) -> int:
    side_effect("fetch", n)
    return n * 10
"""


def flow_source(body: str, *, options: str = "") -> str:
    """The task module plus `@flow(name="pipeline")` with `body` (statements)."""
    opts = f", {options}" if options else ""
    return (
        TASKS
        + f'\n\n@compose.flow(name="pipeline"{opts})\ndef pipeline() -> object:\n'
        + textwrap.indent(textwrap.dedent(body).strip(), "    ")
        + "\n"
    )


def gated(steps: str) -> str:
    """`steps`, then the approval the first run pauses at, then a return."""
    return steps + '\ncompose.approve("go")\nreturn "done"'


# (before, after, key the journal recorded where the calls differ)
SHAPES = [
    pytest.param("a()\nb()", "a()\nb2()", "b#1", id="renamed-task"),
    pytest.param("a()\nb()", "b()\na()", "a#1", id="reordered-calls"),
    pytest.param("fetch(1)", "fetch(2)", "fetch#1", id="changed-arguments"),
    pytest.param("a()\nb()\nc()", "a()\nc()", "b#1", id="removed-step"),
    pytest.param("a()\nb()", "a()\nx()\nb()", "b#1", id="inserted-step"),
    pytest.param("a()\nb()", "a()", "b#1", id="returns-before-journaled-steps"),
    pytest.param("fetch(1)\nfetch(2)", "fetch(2)\nfetch(1)", "fetch#1", id="swapped-arguments"),
    pytest.param(
        "fetch(1)\nfetch(2)\nfetch(3)", "fetch(1)\nfetch(3)", "fetch#2", id="removed-repeat-call"
    ),
]


def paused_run(deploy, before: str):
    deploy.load("pipeline_mod", flow_source(gated(before)))
    run = deploy_run(deploy)
    assert run.status == "paused" and run.pending.id == "go"
    return run


def deploy_run(deploy):
    import pipeline_mod

    return pipeline_mod.pipeline.run()


def diverge(deploy, run, after: str) -> compose.NondeterminismError:
    """Deploys `after` and resumes the paused run with its answer; returns the error."""
    deploy.load("pipeline_mod", flow_source(gated(after)))
    with pytest.raises(compose.NondeterminismError) as info:
        compose.resume(run.id, answers={"go": True}, allow_code_change=True)
    return info.value


def without_answer(journal: dict) -> dict:
    """The journal less the answer `resume(answers=...)` records before replay starts."""
    return {k: v for k, v in journal.items() if k != "__interrupt__:go"}


# -- the divergent shapes -----------------------------------------------------------------


@pytest.mark.parametrize(("before", "after", "key"), SHAPES)
def test_issue27_divergent_body_raises_nondeterminism_error_naming_the_recorded_key(
    deploy, before, after, key
):
    """Issue 27: on replay, a body whose calls differ from the journal's raises
    `NondeterminismError` naming the run, the key the journal recorded at the first
    difference (FLOW-14 key), and what was recorded vs. what was called."""
    run = paused_run(deploy, before)
    err = diverge(deploy, run, after)
    assert isinstance(err, ComposeError)
    assert err.run_id == run.id
    assert err.key == key
    assert isinstance(err.recorded, str) and isinstance(err.called, str)
    assert err.recorded and err.called and err.recorded != err.called
    message = str(err)
    for part in (run.id, key, err.recorded, err.called):
        assert part in message, (part, message)


def test_issue27_renamed_task_describes_both_names(deploy):
    """Issue 27: for a renamed task the error says task 'b' was recorded and task 'b2'
    was called at key `b#1`."""
    run = paused_run(deploy, "a()\nb()")
    err = diverge(deploy, run, "a()\nb2()")
    assert err.key == "b#1"
    assert "b2" in err.called and "b2" not in err.recorded
    assert "b" in err.recorded


@pytest.mark.parametrize(("before", "after", "key"), SHAPES)
def test_issue27_divergence_journals_nothing_and_fails_the_run(deploy, before, after, key):
    """Issue 27: after a divergence nothing new is journaled (only the answer that
    `resume(answers=...)` records up front, FLOW-42/43), no new work has executed, and the
    run row is `failed` with error type `NondeterminismError`."""
    run = paused_run(deploy, before)
    journal = deploy.journal(run.id)
    executed = deploy.executions()
    diverge(deploy, run, after)
    assert without_answer(deploy.journal(run.id)) == journal
    assert deploy.executions() == executed, "replay executed work after the divergence"
    row = deploy.run_row(run.id)
    assert row["status"] == "failed"
    assert json.loads(row["error_json"])["type"] == "NondeterminismError"
    assert key in json.loads(row["error_json"])["message"]


@pytest.mark.parametrize(("before", "after", "key"), SHAPES)
def test_issue27_restoring_the_code_resumes_from_the_journal_without_reexecuting(
    deploy, before, after, key
):
    """Issue 27: the run stays resumable once the code is fixed: with the original module
    deployed again (same fingerprint, no allow_code_change) resume completes from the journaled
    values and no journaled step executes a second time (FLOW-16 hits)."""
    run = paused_run(deploy, before)
    executed = deploy.executions()
    diverge(deploy, run, after)
    deploy.load("pipeline_mod", flow_source(gated(before)))
    done = compose.resume(run.id, answers={"go": True})
    assert (done.status, done.output) == ("completed", "done")
    assert deploy.executions() == executed
    assert deploy.run_row(run.id)["status"] == "completed"


def test_issue27_values_replayed_after_the_fix_are_the_journaled_ones(deploy):
    """Issue 27: the fixed body receives the values the first attempt journaled."""
    body = 'n = fetch(3)\ncompose.approve("go")\nreturn [n, a()]'
    deploy.load("pipeline_mod", flow_source(body))
    run = deploy_run(deploy)
    deploy.load("pipeline_mod", flow_source(body.replace("fetch(3)", "fetch(4)")))
    with pytest.raises(compose.NondeterminismError) as info:
        compose.resume(run.id, answers={"go": True}, allow_code_change=True)
    assert info.value.key == "fetch#1"
    deploy.load("pipeline_mod", flow_source(body))
    done = compose.resume(run.id, answers={"go": True})
    assert done.output == [30, "A"]
    assert deploy.executions() == [("fetch", "3"), ("a",)]


def test_issue27_a_body_that_swallows_the_error_still_fails_and_journals_nothing(deploy):
    """Issue 27: a body that catches the divergence (`except Exception`) and goes on to new
    work does not escape it: the run still fails with `NondeterminismError`, the fallback
    step is neither executed nor journaled."""
    run = paused_run(deploy, "a()\nb()")
    journal = deploy.journal(run.id)
    swallow = "a()\ntry:\n    b2()\nexcept Exception:\n    c()"
    deploy.load("pipeline_mod", flow_source(gated(swallow)))
    with pytest.raises(compose.NondeterminismError) as info:
        compose.resume(run.id, answers={"go": True}, allow_code_change=True)
    assert info.value.key == "b#1"
    assert without_answer(deploy.journal(run.id)) == journal
    assert deploy.executions() == [("a",), ("b",)]
    assert json.loads(deploy.run_row(run.id)["error_json"])["type"] == "NondeterminismError"


def test_issue27_flow41_fingerprint_check_keeps_its_meaning(deploy):
    """FLOW-41 step 6 still refuses a changed source without allow_code_change (a
    `ResumeMismatchError`, nothing written); with it, divergence is still detected."""
    run = paused_run(deploy, "a()\nb()")
    before = deploy.state(run.id)
    deploy.load("pipeline_mod", flow_source(gated("a()\nb2()")))
    with pytest.raises(ResumeMismatchError):
        compose.resume(run.id, answers={"go": True})
    assert deploy.state(run.id) == before
    with pytest.raises(compose.NondeterminismError) as info:
        compose.resume(run.id, answers={"go": True}, allow_code_change=True)
    assert info.value.key == "b#1"


def test_issue27_a_code_change_that_keeps_the_calls_replays(deploy):
    """Issue 27: divergence is about the calls, not the source: a changed body that makes
    the same journaled calls (FLOW-41 allow_code_change) replays and completes."""
    run = paused_run(deploy, "a()\nfirst = fetch(1)")
    changed = "# fetch first, then a\nfirst_value = a()\nn = fetch(1)\nassert n == 10"
    deploy.load("pipeline_mod", flow_source(gated(changed)))
    done = compose.resume(run.id, answers={"go": True}, allow_code_change=True)
    assert (done.status, done.output) == ("completed", "done")
    assert deploy.executions() == [("a",), ("fetch", "1")]


def test_issue27_new_steps_after_the_journaled_ones_are_not_a_divergence(deploy):
    """Issue 27: code that adds work after every journaled step (here after the gate)
    replays the journal and executes the new step."""
    run = paused_run(deploy, "a()\nb()")
    after = 'a()\nb()\ncompose.approve("go")\nreturn x()'
    deploy.load("pipeline_mod", flow_source(after))
    done = compose.resume(run.id, answers={"go": True}, allow_code_change=True)
    assert done.output == "X"
    assert deploy.executions() == [("a",), ("b",), ("x",)]


# -- the error types and the on_divergence option -----------------------------------------


def test_issue27_error_and_warning_types():
    """`compose.NondeterminismError` is a `ComposeError`; `compose.NondeterminismWarning`
    a `UserWarning`."""
    assert issubclass(compose.NondeterminismError, ComposeError)
    assert issubclass(compose.NondeterminismWarning, UserWarning)
    assert not issubclass(compose.NondeterminismWarning, ComposeError)


def test_issue27_on_divergence_bogus_is_a_config_error():
    """`@flow(on_divergence=...)` accepts "raise" and "warn" only; anything else is a
    `ConfigError` naming the option."""
    with pytest.raises(ConfigError) as info:

        @compose.flow(name="bogus_divergence", on_divergence="bogus")
        def f() -> int:
            return 1

    assert "on_divergence" in str(info.value)

    @compose.flow(name="explicit_raise", on_divergence="raise")
    def g() -> int:
        return 1

    @compose.flow(name="explicit_warn", on_divergence="warn")
    def h() -> int:
        return 2

    assert (g.run().output, h.run().output) == (1, 2)


WARN_BEFORE = """\
first = fetch(1)
second = a()
compose.approve("go")
third = c()
compose.approve("go2")
return [first, second, third]
"""
WARN_AFTER = WARN_BEFORE.replace("fetch(1)", "fetch(2)").replace("a()", "b2()")


def resume_recording(*args, **kwargs):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run = compose.resume(*args, **kwargs)
    return run, [w for w in seen if issubclass(w.category, compose.NondeterminismWarning)]


def test_issue27_on_divergence_warn_warns_once_per_attempt_and_continues(deploy):
    """`@flow(on_divergence="warn")`: a divergent replay emits one `NondeterminismWarning`
    per attempt and carries on as before issue 27: a key the journal has returns the journaled
    value (FLOW-16: `fetch(2)` gets fetch(1)'s 10), a new key executes (FLOW-17)."""
    deploy.load("pipeline_mod", flow_source(WARN_BEFORE))
    run = deploy_run(deploy)
    assert run.pending.id == "go"
    deploy.load("pipeline_mod", flow_source(WARN_AFTER, options='on_divergence="warn"'))
    second, seen = resume_recording(run.id, answers={"go": True}, allow_code_change=True)
    assert second.status == "paused" and second.pending.id == "go2"
    assert len(seen) == 1, [str(w.message) for w in seen]
    assert run.id in str(seen[0].message)
    third, seen = resume_recording(run.id, answers={"go2": True}, allow_code_change=True)
    assert len(seen) == 1, [str(w.message) for w in seen]
    assert (third.status, third.output) == ("completed", [10, "B2", "C"])
    assert deploy.executions() == [("fetch", "1"), ("a",), ("b2",), ("c",)]


def test_issue27_on_divergence_warn_is_silent_for_an_unchanged_body(deploy):
    """`on_divergence="warn"` warns only on a divergence."""
    deploy.load("pipeline_mod", flow_source(WARN_BEFORE, options='on_divergence="warn"'))
    run = deploy_run(deploy)
    second, seen = resume_recording(run.id, answers={"go": True})
    assert seen == [] and second.pending.id == "go2"
    third, seen = resume_recording(run.id, answers={"go2": True})
    assert seen == [] and third.output == [10, "A", "C"]


def test_issue27_on_divergence_warn_completes_a_body_that_skips_journaled_steps(deploy):
    """`on_divergence="warn"`: a body that returns without reaching journaled `b#1` warns
    once and completes, as before issue 27."""
    run = paused_run(deploy, "a()\nb()")
    deploy.load("pipeline_mod", flow_source(gated("a()"), options='on_divergence="warn"'))
    done, seen = resume_recording(run.id, answers={"go": True}, allow_code_change=True)
    assert (done.status, done.output) == ("completed", "done")
    assert len(seen) == 1, [str(w.message) for w in seen]
    assert deploy.executions() == [("a",), ("b",)]


def test_issue27_on_divergence_warn_in_an_async_flow(deploy):
    """`on_divergence="warn"` on an `async def` flow resumed with `aresume`: one warning,
    the renamed step runs, the run completes."""
    source = """\
import composeai as compose


@compose.task
async def a() -> str:
    side_effect("a")
    return "A"


@compose.task
async def b() -> str:
    side_effect("b")
    return "B"


@compose.task
async def b2() -> str:
    side_effect("b2")
    return "B2"


@compose.flow(name="async_warn", on_divergence="warn")
async def async_warn() -> list:
    out = [await a.arun(), await SECOND.arun()]
    compose.approve("go")
    return out
"""
    mod = deploy.load("async_warn_mod", source.replace("SECOND", "b"))
    run = asyncio.run(mod.async_warn.arun())
    deploy.load("async_warn_mod", source.replace("SECOND", "b2"))

    async def main():
        return await compose.aresume(run.id, answers={"go": True}, allow_code_change=True)

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        done = asyncio.run(main())
    assert done.output == ["A", "B2"]
    assert len([w for w in seen if issubclass(w.category, compose.NondeterminismWarning)]) == 1
    assert deploy.executions() == [("a",), ("b",), ("b2",)]


def test_issue27_on_divergence_warn_once_for_many_diverging_map_items(deploy):
    """`on_divergence="warn"`: three `map` items diverging concurrently in one attempt
    give one warning; each item returns its journaled value (FLOW-16)."""
    body = 'values = compose.map(fetch, [1, 2, 3])\ncompose.approve("go")\nreturn values'
    deploy.load("pipeline_mod", flow_source(body))
    run = deploy_run(deploy)
    changed = flow_source(body.replace("[1, 2, 3]", "[4, 5, 6]"), options='on_divergence="warn"')
    deploy.load("pipeline_mod", changed)
    done, seen = resume_recording(run.id, answers={"go": True}, allow_code_change=True)
    assert done.output == [10, 20, 30]
    assert len(seen) == 1, [str(w.message) for w in seen]
    assert sorted(deploy.executions()) == [("fetch", "1"), ("fetch", "2"), ("fetch", "3")]


def test_issue27_default_is_raise(deploy):
    """Without `on_divergence` a divergence raises (the default is "raise") — and no
    warning is emitted."""
    deploy.load("pipeline_mod", flow_source(WARN_BEFORE))
    run = deploy_run(deploy)
    deploy.load("pipeline_mod", flow_source(WARN_AFTER))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(compose.NondeterminismError) as info:
            compose.resume(run.id, answers={"go": True}, allow_code_change=True)
    assert info.value.key == "fetch#1"
    assert not [w for w in seen if issubclass(w.category, compose.NondeterminismWarning)]


# -- journals written before issue 27 -----------------------------------------------------


@pytest.mark.parametrize(
    ("after", "output", "ran"),
    [
        pytest.param("a()\nb2()", "done", [("b2",)], id="renamed-task"),
        pytest.param("fetch(2)", "done", [], id="changed-arguments"),
    ],
)
def test_issue27_old_journal_without_identities_replays_as_before(deploy, after, output, ran):
    """Issue 27: journal rows written without an identity (`ident` NULL, as before the
    column existed) replay as they did: a key hit returns the journaled value, a miss runs."""
    before = "fetch(1)" if "fetch" in after else "a()\nb()"
    run = paused_run(deploy, before)
    executed = deploy.executions()
    raw_sql("UPDATE journal SET ident = NULL")
    deploy.load("pipeline_mod", flow_source(gated(after)))
    done = compose.resume(run.id, answers={"go": True}, allow_code_change=True)
    assert (done.status, done.output) == ("completed", output)
    assert deploy.executions() == executed + ran


def test_issue27_rows_journaled_after_an_upgrade_are_checked(deploy):
    """Issue 27: a run journaled partly before identities existed (`a#1`, ident NULL) and
    partly after (`fetch#1`) still detects a change at the row that has one; replaying the
    unchanged code over the mixed journal completes."""
    body = 'a()\ncompose.approve("go")\nfetch(1)\ncompose.approve("go2")\nreturn "done"'
    deploy.load("pipeline_mod", flow_source(body))
    run = deploy_run(deploy)
    raw_sql("UPDATE journal SET ident = NULL")
    assert compose.resume(run.id, answers={"go": True}).pending.id == "go2"
    deploy.load("pipeline_mod", flow_source(body.replace("fetch(1)", "fetch(2)")))
    with pytest.raises(compose.NondeterminismError) as info:
        compose.resume(run.id, answers={"go2": True}, allow_code_change=True)
    assert info.value.key == "fetch#1"
    deploy.load("pipeline_mod", flow_source(body))
    done = compose.resume(run.id, answers={"go2": True})
    assert done.output == "done"
    assert deploy.executions() == [("a",), ("fetch", "1")]


# -- unchanged bodies never raise ---------------------------------------------------------


RICH = """\
import random as py_random
import time

import composeai as compose
from composeai.testing import FakeModel


WORDS = ["ant", "bee", "cat", "dog", "eel", "fox"]


def shuffled() -> dict:
    \"\"\"An equal dict built in another insertion order on every call (issue 31).\"\"\"
    return {w: len(w) for w in py_random.sample(WORDS, len(WORDS))}


@compose.task
def tally(d: dict, **kw) -> int:
    side_effect("tally")
    return sum(d.values()) + len(kw)


@compose.task
def double(n: int) -> int:
    side_effect("double", n)
    # Items finish in reverse order; keys are reserved in call order (FLOW-14).
    time.sleep(0.002 * (5 - n % 5))
    return 2 * n


@compose.task
def upper(s: str) -> str:
    side_effect("upper", s)
    return s.upper()


@compose.task
def shout(s: str) -> str:
    side_effect("shout", s)
    return s + "!"


@compose.tool
def lookup(q: str) -> str:
    \"\"\"Look a word up.\"\"\"
    side_effect("lookup", q)
    return upper(q)


@compose.agent(
    model=FakeModel(
        [{"tool_calls": [{"name": "lookup", "arguments": {"q": "w"}, "id": "c1"}]}, "found"]
    ),
    tools=[lookup],
    name="researcher",
)
def researcher(topic: str) -> str:
    return f"research {topic}"


@compose.flow
def inner(n: int) -> int:
    return double(n) + double(n + 1)


@compose.flow(name="rich")
def rich(n: int) -> dict:
    out = {"loop": [double(i) for i in range(3)]}
    out["loop_again"] = [double(i) for i in range(3)]
    out["map"] = compose.map(double, list(range(6)))
    out["agg"] = compose.aggregate(u=upper, s=shout)("hey")
    out["nested"] = [inner(n), inner(n + 10)]
    out["agent"] = researcher("birds")
    handles = [compose.start(double, 100 + i) for i in range(3)]
    out["gathered"] = compose.gather(*handles)
    out["t"] = compose.now().isoformat()
    out["r"] = compose.random()
    out["tally"] = [tally(shuffled(), **shuffled()), tally({"n": 0}, rows=[shuffled(), {"in": shuffled()}])]
    out["ok"] = compose.approve("go")
    out["after"] = double(n)
    out["ok2"] = compose.approve("go2")
    out["t2"] = compose.now().isoformat()
    return out
"""


def test_issue27_unchanged_sync_body_replays_every_step_kind_without_divergence(deploy):
    """Issue 27: an unchanged body never raises: tasks called repeatedly with different
    arguments, `map` (items finishing out of order), `aggregate`, nested flows, an agent with
    a tool, `start`/`gather`, `now()`/`random()` and gates all replay (FLOW-14/15/16) over
    several attempts, and no journaled step executes twice."""
    mod = deploy.load("rich_mod", RICH)
    first = mod.rich.run(1)
    assert first.status == "paused" and first.pending.id == "go"
    executed = deploy.executions()
    second = compose.resume(first.id, answers={"go": True})
    assert second.status == "paused" and second.pending.id == "go2"
    assert deploy.executions() == executed + [("double", "1")]
    third = compose.resume(first.id, answers={"go2": True})
    assert third.status == "completed"
    out = third.output
    assert out["loop"] == out["loop_again"] == [0, 2, 4]
    assert out["map"] == [0, 2, 4, 6, 8, 10]
    assert out["agg"] == {"u": "HEY", "s": "hey!"}
    assert out["nested"] == [2 + 4, 22 + 24]
    assert out["agent"] == "found"
    assert out["gathered"] == [200, 202, 204]
    assert out["tally"] == [24, 1]
    assert out["after"] == 2 and out["ok"] is True and out["ok2"] is True
    assert deploy.executions() == executed + [("double", "1")]
    assert [e for e in executed if e[0] == "lookup"] == [("lookup", "w")]


def test_issue27_unchanged_body_replays_in_a_fresh_deploy_of_the_same_code(deploy):
    """Issue 27: re-importing the same source (what a new process does) replays without
    divergence and without allow_code_change."""
    mod = deploy.load("rich_mod", RICH)
    first = mod.rich.run(2)
    executed = deploy.executions()
    deploy.load("rich_mod", RICH)
    done = compose.resume(first.id, answers={"go": True, "go2": True})
    assert done.status == "completed" and done.output["after"] == 4
    assert deploy.executions() == executed + [("double", "2")]


ASYNC = """\
import asyncio
import random as py_random

import composeai as compose


@compose.task
async def tally(d: dict, **kw) -> int:
    side_effect("tally")
    return sum(d.values()) + len(kw)


def shuffled() -> dict:
    keys = ["ant", "bee", "cat", "dog"]
    return {k: len(k) for k in py_random.sample(keys, len(keys))}


@compose.task
async def double(n: int) -> int:
    side_effect("double", n)
    await asyncio.sleep(0.002 * (5 - n % 5))
    return 2 * n


@compose.task
def shout(s: str) -> str:
    side_effect("shout", s)
    return s + "!"


@compose.flow
async def inner(n: int) -> int:
    return await double.arun(n) + await double.arun(n + 1)


@compose.flow(name="async_rich")
async def async_rich(n: int) -> dict:
    out = {"loop": [await double.arun(i) for i in range(3)]}
    out["map"] = await compose.amap(double, list(range(5)))
    out["agg"] = (await compose.aggregate(s=shout, d=shout).arun("a")).output
    out["nested"] = (await inner.arun(n)).output
    out["t"] = (await compose.anow()).isoformat()
    out["r"] = await compose.arandom()
    out["tally"] = await tally.arun(shuffled(), **shuffled())
    out["ok"] = compose.approve("go")
    out["after"] = await double.arun(n)
    return out
"""


def test_issue27_unchanged_async_body_replays_without_divergence(deploy):
    """Issue 27: an unchanged `async def` flow (task `.arun`, `amap`, `aggregate().arun`,
    nested `arun`, `anow()`/`arandom()`, FLOW-24) replays through
    `aresume` without divergence."""
    mod = deploy.load("async_mod", ASYNC)

    async def main():
        first = await mod.async_rich.arun(7)
        assert first.status == "paused"
        executed = deploy.executions()
        done = await compose.aresume(first.id, answers={"go": True})
        return executed, done

    executed, done = asyncio.run(main())
    assert done.status == "completed"
    assert done.output["loop"] == [0, 2, 4] and done.output["map"] == [0, 2, 4, 6, 8]
    assert done.output["nested"] == 14 + 16 and done.output["after"] == 14
    assert done.output["agg"] == {"s": "a!", "d": "a!"}
    assert done.output["tally"] == 12 + 4
    assert deploy.executions() == executed + [("double", "7")]


def test_issue27_agent_paused_on_an_approval_gated_tool_resumes_without_divergence(deploy):
    """Issue 27: an agent step paused on an approval-gated tool (FLOW-36) inside a flow
    resumes under detection: the earlier steps replay, the tool runs once, the agent ends."""
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
    return f"sent to {to}"


MODEL = FakeModel(
    [{"tool_calls": [{"name": "send", "arguments": {"to": "ann"}, "id": "c1"}]}, "mailed"]
)


@compose.agent(model=MODEL, tools=[send], name="mailer")
def mailer(topic: str) -> str:
    return f"mail about {topic}"


@compose.flow(name="mailing")
def mailing(topic: str) -> list:
    return [prepare(topic), mailer(prepare(topic + "s")), prepare("end")]
"""
    mod = deploy.load("mailing_mod", source)
    run = mod.mailing.run("owl")
    assert run.status == "paused" and run.pending.id == "tool:send:c1"
    done = compose.resume(run.id, answers={"send": True})
    assert done.output == ["Owl", "mailed", "End"]
    assert deploy.executions() == [
        ("prepare", "owl"),
        ("prepare", "owls"),
        ("send", "ann"),
        ("prepare", "end"),
    ]
    assert len(mod.MODEL.requests) == 2


def test_issue27_journal_failures_flow_replays_its_caught_failure_without_divergence(deploy):
    """Issue 27 with EXT-7: a journaled task failure that the body catches replays as the
    same `TaskFailed` and takes the same fallback path — no divergence."""
    source = """\
import composeai as compose
from composeai.durable import TaskFailed


@compose.task
def flaky(n: int) -> int:
    side_effect("flaky", n)
    raise ValueError(f"no luck with {n}")


@compose.task
def fallback(n: int) -> int:
    side_effect("fallback", n)
    return -n


@compose.flow(name="careful", journal_failures=True)
def careful(n: int) -> int:
    try:
        value = flaky(n)
    except TaskFailed:
        value = fallback(n)
    compose.approve("go")
    return value
"""
    mod = deploy.load("careful_mod", source)
    run = mod.careful.run(4)
    assert run.status == "paused"
    done = compose.resume(run.id, answers={"go": True})
    assert done.output == -4
    assert deploy.executions() == [("flaky", "4"), ("fallback", "4")]


def test_issue27_task_retries_and_a_failed_attempt_resume_without_divergence(deploy):
    """Issue 27 with FLOW-2 retries and FLOW-42: a task that succeeded on its second try
    replays as one step; a run that failed on a later step resumes (that step re-executes, it
    was never journaled) with no divergence."""
    flag = deploy.root / "broken"
    flag.write_text("1")
    source = f"""\
import os

import composeai as compose

TRIES = []


@compose.task(retries=2)
def wobbly(n: int) -> int:
    side_effect("wobbly", n)
    TRIES.append(n)
    if len(TRIES) == 1:
        raise RuntimeError("first try fails")
    return n + 1


@compose.task
def fragile(n: int) -> int:
    side_effect("fragile", n)
    if os.path.exists({str(flag)!r}):
        raise RuntimeError("still broken")
    return n * 2


@compose.flow(name="sturdy")
def sturdy(n: int) -> int:
    return fragile(wobbly(n))
"""
    mod = deploy.load("sturdy_mod", source)
    with pytest.raises(RuntimeError, match="still broken"):
        mod.sturdy.run(1)
    (run_id,) = deploy.run_ids()
    assert deploy.run_row(run_id)["status"] == "failed"
    flag.unlink()
    done = compose.resume(run_id)
    assert done.output == 4
    assert deploy.executions() == [
        ("wobbly", "1"),
        ("wobbly", "1"),
        ("fragile", "2"),
        ("fragile", "2"),
    ]


NESTED = """\
import composeai as compose


@compose.task
def b() -> str:
    side_effect("b")
    return "B"


@compose.task
def b2() -> str:
    side_effect("b2")
    return "B2"


@compose.flow(name="sub")
def sub() -> str:
    value = CALL()
    compose.approve("go")
    return value


@compose.flow(name="outer")
def outer() -> str:
    return sub()
"""


def test_issue27_divergence_inside_a_nested_flow_names_the_scoped_key(deploy):
    """Issue 27 with FLOW-15/FLOW-50 scopes: a renamed call inside a nested flow is
    reported under its scoped key (`sub#1/b#1`)."""
    mod = deploy.load("nested_mod", NESTED.replace("CALL", "b"))
    run = mod.outer.run()
    assert run.status == "paused"
    assert "sub#1/b#1" in deploy.journal(run.id)
    deploy.load("nested_mod", NESTED.replace("CALL", "b2"))
    with pytest.raises(compose.NondeterminismError) as info:
        compose.resume(run.id, answers={"go": True}, allow_code_change=True)
    assert info.value.key == "sub#1/b#1"
    assert deploy.executions() == [("b",)]


def test_issue27_divergence_inside_a_map_item_names_the_item_key(deploy):
    """Issue 27 with FLOW-15: `map` items keep their scopes (`map#1[<i>]/...`); a changed
    argument inside an item is reported under that item's key."""
    body = 'values = compose.map(fetch, [1, 2, 3])\ncompose.approve("go")\nreturn values'
    deploy.load("pipeline_mod", flow_source(body))
    run = deploy_run(deploy)
    deploy.load("pipeline_mod", flow_source(body.replace("[1, 2, 3]", "[1, 5, 3]")))
    with pytest.raises(compose.NondeterminismError) as info:
        compose.resume(run.id, answers={"go": True}, allow_code_change=True)
    assert info.value.key == "map#1[1]/fetch#1"


AGGREGATE = """\
import composeai as compose


@compose.task
def upper(s: str) -> str:
    side_effect("upper", s)
    return s.upper()


@compose.task
def shout(s: str) -> str:
    side_effect("shout", s)
    return s + "!"


def loud(s: str) -> str:
    return shout(s + SUFFIX)


@compose.flow(name="fanout")
def fanout() -> dict:
    out = compose.aggregate(u=upper, s=loud)("hey")
    compose.approve("go")
    return out
"""


def test_issue27_divergence_inside_an_aggregate_branch_names_the_branch_key(deploy):
    """Issue 27 with FLOW-15: a changed call inside one `aggregate` branch is reported
    under that branch's scope (`aggregate#1/s/shout#1`); the other branch replays."""
    mod = deploy.load("fanout_mod", AGGREGATE.replace("SUFFIX", '""'))
    run = mod.fanout.run()
    assert "aggregate#1/s/shout#1" in deploy.journal(run.id)
    deploy.load("fanout_mod", AGGREGATE.replace("SUFFIX", '"?"'))
    with pytest.raises(compose.NondeterminismError) as info:
        compose.resume(run.id, answers={"go": True}, allow_code_change=True)
    assert info.value.key == "aggregate#1/s/shout#1"
    assert sorted(deploy.executions()) == [("shout", "hey"), ("upper", "hey")]


def test_issue27_fewer_map_items_is_a_divergence_at_the_missing_item(deploy):
    """Issue 27 with FLOW-15: a `map` over fewer items no longer reaches the journaled
    `map#1[2]/fetch#1`; the run raises when it would complete, naming that key."""
    body = 'compose.map(fetch, [1, 2, 3])\ncompose.approve("go")\nreturn "done"'
    deploy.load("pipeline_mod", flow_source(body))
    run = deploy_run(deploy)
    deploy.load("pipeline_mod", flow_source(body.replace("[1, 2, 3]", "[1, 2]")))
    with pytest.raises(compose.NondeterminismError) as info:
        compose.resume(run.id, answers={"go": True}, allow_code_change=True)
    assert info.value.key == "map#1[2]/fetch#1"
    assert deploy.run_row(run.id)["status"] == "failed"


def test_issue27_a_different_kind_at_the_same_key_is_a_divergence(deploy):
    """Issue 27: the identity includes the step's kind — a nested flow named `b` where the
    journal recorded task `b` (both key `b#1`) diverges."""
    run = paused_run(deploy, "a()\nb()")
    source = flow_source(gated("a()\nb()")).replace("def b() -> str:", "def b_task() -> str:")
    source = source.replace(
        '@compose.flow(name="pipeline")',
        '@compose.flow(name="b")\ndef b() -> str:\n    return "nested B"\n\n\n'
        '@compose.flow(name="pipeline")',
    )
    deploy.load("pipeline_mod", source)
    with pytest.raises(compose.NondeterminismError) as info:
        compose.resume(run.id, answers={"go": True}, allow_code_change=True)
    assert info.value.key == "b#1"
    assert info.value.recorded != info.value.called
    assert deploy.executions() == [("a",), ("b",)]


def test_issue27_now_replaced_by_random_is_a_divergence(deploy):
    """Issue 27 with FLOW-22/23: `random()` where the journal recorded `now()` diverges
    at `now#1`."""
    run = paused_run(deploy, "compose.now()\na()")
    err = diverge(deploy, run, "compose.random()\na()")
    assert err.key == "now#1"
    assert "now" in err.recorded and "random" in err.called


def test_issue27_changed_agent_arguments_are_a_divergence(deploy):
    """Issue 27 with AGENT steps (FLOW-13): an agent called with other arguments diverges
    at its key and no model is asked."""
    source = """\
import composeai as compose
from composeai.testing import FakeModel

MODEL = FakeModel(["summary one", "summary two"])


@compose.agent(model=MODEL, name="summarizer")
def summarizer(text: str) -> str:
    return f"summarize {text}"


@compose.flow(name="summing")
def summing() -> str:
    out = summarizer(TOPIC)
    compose.approve("go")
    return out
"""
    mod = deploy.load("summing_mod", source.replace("TOPIC", '"owls"'))
    run = mod.summing.run()
    assert len(mod.MODEL.requests) == 1
    mod = deploy.load("summing_mod", source.replace("TOPIC", '"bats"'))
    with pytest.raises(compose.NondeterminismError) as info:
        compose.resume(run.id, answers={"go": True}, allow_code_change=True)
    assert info.value.key == "summarizer#1"
    assert mod.MODEL.requests == []


def test_issue27_aresume_raises_on_an_async_divergence(deploy):
    """Issue 27: an `async def` flow resumed with `aresume` raises the same error."""
    body = """\
import composeai as compose


@compose.task
async def a() -> str:
    side_effect("a")
    return "A"


@compose.task
async def b() -> str:
    side_effect("b")
    return "B"


@compose.task
async def b2() -> str:
    side_effect("b2")
    return "B2"


@compose.flow(name="async_pipeline")
async def async_pipeline() -> str:
    await a.arun()
    await SECOND.arun()
    compose.approve("go")
    return "done"
"""
    mod = deploy.load("async_pipeline_mod", body.replace("SECOND", "b"))
    run = asyncio.run(mod.async_pipeline.arun())
    assert run.status == "paused"
    deploy.load("async_pipeline_mod", body.replace("SECOND", "b2"))

    async def main():
        return await compose.aresume(run.id, answers={"go": True}, allow_code_change=True)

    with pytest.raises(compose.NondeterminismError) as info:
        asyncio.run(main())
    assert (info.value.run_id, info.value.key) == (run.id, "b#1")
    assert deploy.executions() == [("a",), ("b",)]


# -- across processes ---------------------------------------------------------------------


CRASHY = (
    TASKS
    + """

import os
import time


@compose.task
def slow(i: int) -> int:
    side_effect("slow", i)
    if i == int(os.environ.get("HANG_AT", "-1")):
        print("HANGING", flush=True)
        time.sleep(600)
    return i * i


@compose.flow(name="crashy")
def crashy(n: int) -> list:
    head = [a(), b()]
    squares = [slow(i) for i in range(n)]
    items = compose.map(slow, [100, 101])
    compose.approve("go")
    return [head, squares, items]
"""
)

START_CHILD = """
import crashy_mod
run = crashy_mod.crashy.run(8)
emit(status=run.status, run_id=run.id)
"""

RESUME_CHILD = """
import os
import crashy_mod
from composeai import resume
run = resume(os.environ["RUN_ID"], answers={"go": True}, allow_code_change=True)
emit(status=run.status, output=run.output)
"""


def killed_mid_run(box: _proc.Sandbox) -> str:
    """Starts `crashy` in a child that hangs inside `slow(5)` and SIGKILLs it there."""
    box.write_module("crashy_mod", CRASHY)
    child = box.spawn(START_CHILD, HANG_AT="5")
    line = _proc.read_line(child)
    assert line == "HANGING\n", _proc.finish(child, prefix=line).describe()
    child.kill()
    assert _proc.finish(child).killed
    (run_id,) = box.run_ids()
    assert box.run_row(run_id)["status"] == "running"
    return run_id


def test_issue27_kill_9_mid_run_then_resume_in_another_process_never_diverges(tmp_path):
    """Issue 27 across processes: a run SIGKILLed inside a step (real `kill -9`) resumes in
    another process with the same code — the journaled steps replay with no divergence and
    execute no second time; the interrupted step runs again (FLOW-20)."""
    box = _proc.Sandbox(tmp_path)
    run_id = killed_mid_run(box)
    journaled = set(box.journal(run_id))
    assert {"a#1", "b#1", "slow#5"} <= journaled and "slow#6" not in journaled
    result = box.run(RESUME_CHILD, RUN_ID=run_id).ok()
    assert result["status"] == "completed"
    assert result["output"] == [["A", "B"], [i * i for i in range(8)], [10000, 10201]]
    counts: dict[tuple, int] = {}
    for line in box.side_effects():
        counts[line[:-1]] = counts.get(line[:-1], 0) + 1
    assert counts.pop(("slow", "5")) == 2
    assert set(counts.values()) == {1}


def test_issue27_kill_9_inside_a_map_then_resume_never_diverges(tmp_path):
    """Issue 27 across processes with FLOW-15: a run SIGKILLed while one `map` item hangs
    and another has been journaled resumes in another process without divergence; only the
    unfinished item runs again."""
    box = _proc.Sandbox(tmp_path)
    box.write_module("crashy_mod", CRASHY)
    child = box.spawn(START_CHILD, HANG_AT="101")
    line = _proc.read_line(child)
    assert line == "HANGING\n", _proc.finish(child, prefix=line).describe()
    (run_id,) = box.run_ids()
    _proc.wait_until(lambda: "map#1[0]/slow#1" in box.journal(run_id), what="item 0 journaled")
    child.kill()
    assert _proc.finish(child).killed
    assert "map#1[1]/slow#1" not in box.journal(run_id)
    result = box.run(RESUME_CHILD, RUN_ID=run_id).ok()
    assert result["output"][2] == [10000, 10201]
    lines = [ln[:-1] for ln in box.side_effects()]
    assert lines.count(("slow", "100")) == 1 and lines.count(("slow", "101")) == 2
    assert lines.count(("slow", "3")) == 1


FAN = """\
import asyncio
import os
import time

import composeai as compose


@compose.task
def piece(i: int) -> int:
    side_effect("piece", i)
    if i == int(os.environ.get("HANG_AT", "-1")):
        print("HANGING", flush=True)
        time.sleep(600)
    return i * 3


@compose.flow(name="fan")
def fan() -> list:
    first = piece(10)
    handles = [compose.start(piece, i) for i in range(3)]
    return [first, *compose.gather(*handles)]


@compose.flow(name="afan")
async def afan() -> list:
    first = await piece.arun(10)
    rest = await asyncio.gather(*(piece.arun(i) for i in range(3)))
    return [first, *rest]
"""


@pytest.mark.parametrize(
    "start",
    [
        pytest.param("fan_mod.fan.run()", id="start-gather"),
        pytest.param("__import__('asyncio').run(fan_mod.afan.arun())", id="asyncio-gather"),
    ],
)
def test_issue27_kill_9_with_later_siblings_journaled_resumes_without_divergence(tmp_path, start):
    """Issue 27 with FLOW-14 (keys reserved in call order, journaled in completion order):
    concurrent steps of one scope — `start`/`gather` (EXT-6) or `asyncio.gather` of `arun`
    calls — where the later `piece#3`/`piece#4` were journaled and the earlier `piece#2` was
    still running when the process was SIGKILLed resume in another process without
    divergence; only `piece(0)` runs again."""
    box = _proc.Sandbox(tmp_path)
    box.write_module("fan_mod", FAN)
    child = box.spawn(f"import fan_mod\n{start}", HANG_AT="0")
    line = _proc.read_line(child)
    assert line == "HANGING\n", _proc.finish(child, prefix=line).describe()
    (run_id,) = box.run_ids()
    _proc.wait_until(
        lambda: {"piece#3", "piece#4"} <= set(box.journal(run_id)), what="the later siblings"
    )
    child.kill()
    assert _proc.finish(child).killed
    assert "piece#2" not in box.journal(run_id)
    result = box.run(
        "import os, fan_mod\nfrom composeai import resume\n"
        "run = resume(os.environ['RUN_ID'])\nemit(status=run.status, output=run.output)",
        RUN_ID=run_id,
    ).ok()
    assert (result["status"], result["output"]) == ("completed", [30, 0, 3, 6])
    lines = [ln[:-1] for ln in box.side_effects()]
    assert sorted(lines) == sorted(
        [("piece", "10"), ("piece", "0"), ("piece", "0"), ("piece", "1"), ("piece", "2")]
    )


def test_issue27_kill_9_then_resume_with_changed_code_in_another_process_diverges(tmp_path):
    """Issue 27 across processes: a crashed run resumed by a process running a changed
    body raises `NondeterminismError` there (key `b#1`); nothing new is journaled; a process
    with the original code then completes it."""
    box = _proc.Sandbox(tmp_path)
    run_id = killed_mid_run(box)
    journal = box.journal(run_id)
    executed = box.side_effects()
    box.write_module("crashy_mod", CRASHY.replace("head = [a(), b()]", "head = [a(), b2()]"))
    err = box.run(RESUME_CHILD, RUN_ID=run_id).error()
    assert err["error_type"] == "NondeterminismError", err
    assert run_id in err["message"] and "b#1" in err["message"]
    assert {k: v for k, v in box.journal(run_id).items() if k != "__interrupt__:go"} == journal
    assert box.side_effects() == executed
    assert box.run_row(run_id)["status"] == "failed"
    box.write_module("crashy_mod", CRASHY)
    result = box.run(RESUME_CHILD, RUN_ID=run_id).ok()
    assert result["status"] == "completed"
    assert not [ln for ln in box.side_effects()[len(executed) :] if ln[0] in ("a", "b", "b2")]


def test_issue27_paused_run_resumed_by_another_process_with_changed_code_diverges(tmp_path):
    """Issue 27 across processes: a run paused in one process and resumed with changed
    arguments in another raises `NondeterminismError` naming `fetch#1`."""
    box = _proc.Sandbox(tmp_path)
    box.write_module("cp_mod", flow_source(gated("fetch(1)\na()")))
    started = box.run("import cp_mod\nrun = cp_mod.pipeline.run()\nemit(id=run.id)").ok()
    box.write_module("cp_mod", flow_source(gated("fetch(9)\na()")))
    err = box.run(
        """
        import os
        import cp_mod
        import composeai as compose
        try:
            compose.resume(os.environ["RUN_ID"], answers={"go": True}, allow_code_change=True)
        except compose.NondeterminismError as exc:
            emit(run_id=exc.run_id, key=exc.key, recorded=exc.recorded, called=exc.called)
        """,
        RUN_ID=started["id"],
    ).ok()
    assert (err["run_id"], err["key"]) == (started["id"], "fetch#1")
    assert err["recorded"] != err["called"]


HASHED = """\
import dataclasses

import composeai as compose


@dataclasses.dataclass(frozen=True)
class Tag:
    name: str


@compose.task
def count(tags: frozenset[Tag]) -> int:
    side_effect("count")
    return len(tags)


@compose.task
def size(items: set) -> int:
    side_effect("size")
    return len(items)


@compose.flow(name="tagging")
def tagging() -> list:
    names = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen"]
    out = CALL
    compose.approve("go")
    return out
"""


@pytest.mark.parametrize(
    ("call", "output", "task"),
    [
        pytest.param("count(frozenset(Tag(n) for n in names))", 8, "count", id="dataclass-set"),
        pytest.param('size({"ant", 1, "bee", 2, "cat"})', 5, "size", id="mixed-set"),
        pytest.param("size(set(names))", 8, "size", id="string-set"),
        pytest.param(
            'size(items={"héllo": [1, 2.5, None], "b": {"x": "ü"}})', 2, "size", id="kwargs"
        ),
    ],
)
def test_issue27_set_arguments_replay_in_a_process_with_another_hash_seed(
    tmp_path, call, output, task
):
    """Issue 27: an unchanged body never diverges across processes, even when a step's
    arguments are sets whose iteration order depends on the string hash seed (a frozenset
    of dataclasses, a set of mixed types): resumed under another `PYTHONHASHSEED`, the
    journaled calls still match."""
    box = _proc.Sandbox(tmp_path)
    box.write_module("tagging_mod", HASHED.replace("CALL", call))
    started = box.run(
        "import tagging_mod\nrun = tagging_mod.tagging.run()\nemit(id=run.id, status=run.status)",
        PYTHONHASHSEED="1",
    ).ok()
    assert started["status"] == "paused"
    done = box.run(
        """
        import os
        import tagging_mod
        from composeai import resume
        run = resume(os.environ["RUN_ID"], answers={"go": True})
        emit(status=run.status, output=run.output)
        """,
        RUN_ID=started["id"],
        PYTHONHASHSEED="2",
    ).ok()
    assert (done["status"], done["output"]) == ("completed", output)
    assert [ln[0] for ln in box.side_effects()] == [task]
