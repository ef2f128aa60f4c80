"""`compose.fork(run_id, at=KEY)` and `compose fork RUN_ID --at KEY` (issue 27): time travel
for flow runs. A fork is a new run (new id) of the same flow and arguments whose journal is
the old run's up to — not including — the step `at` in body order (FLOW-14 keys); the steps
before `at` replay (FLOW-16), `at` and everything after it execute (FLOW-17), an answer given
before `at` stays given and a gate after it asks again (FLOW-30/43). The old run is untouched.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import _proc
import composeai as compose
from _replay import STORES, Deploy
from composeai.errors import ConfigError

pytestmark = pytest.mark.parametrize("store_kind", STORES, indirect=True)


@pytest.fixture
def deploy(tmp_path, monkeypatch):
    d = Deploy(tmp_path, monkeypatch)
    yield d
    d.close()


# Body order: fetch#1, summarize#1, __interrupt__:first, summarize#2, __interrupt__:second,
# publish#1, archive#1 — `archive#1` sorts first but runs last.
DIGEST = """\
import composeai as compose


@compose.task
def fetch(topic: str) -> str:
    side_effect("fetch", topic)
    return f"text about {topic}"


@compose.task
def summarize(text: str, n: int) -> str:
    side_effect("summarize", n)
    return f"summary {n} of {text}"


@compose.task
def publish(summary: str) -> str:
    side_effect("publish")
    return summary.upper()


@compose.task
def archive(summary: str) -> int:
    side_effect("archive")
    return len(summary)


@compose.flow(name="digest")
def digest(topic: str) -> dict:
    text = fetch(topic)
    first = summarize(text, 1)
    ok1 = compose.approve("first")
    second = summarize(text, 2)
    ok2 = compose.approve("second")
    published = publish(second)
    return {
        "first": first,
        "second": second,
        "published": published,
        "ok": [ok1, ok2],
        "archived": archive(second),
    }
"""

OUTPUT = {
    "first": "summary 1 of text about owls",
    "second": "summary 2 of text about owls",
    "published": "SUMMARY 2 OF TEXT ABOUT OWLS",
    "ok": [True, True],
    "archived": 28,
}


def fork(run_id, **kwargs):
    """`compose.fork`, looked up per call so each test reports its absence."""
    return compose.fork(run_id, **kwargs)


def completed_run(deploy):
    mod = deploy.load("digest_mod", DIGEST)
    run = mod.digest.run("owls")
    assert run.pending.id == "first"
    assert compose.resume(run.id, answers={"first": True}).pending.id == "second"
    done = compose.resume(run.id, answers={"second": True})
    assert done.output == OUTPUT
    return run


def steps(deploy, run_id: str) -> dict[str, str]:
    """The run's journaled steps and answers, without bookkeeping rows the engine may keep
    under other reserved `__` keys (the fork's origin, say)."""
    return {
        k: v
        for k, v in deploy.journal(run_id).items()
        if not k.startswith("__") or k.startswith("__interrupt__:")
    }


def counts(deploy) -> dict[tuple, int]:
    found: dict[tuple, int] = {}
    for line in deploy.executions():
        found[line] = found.get(line, 0) + 1
    return found


def test_issue27_fork_copies_the_journal_before_at_and_executes_from_at(deploy):
    """`fork(run_id, at="summarize#2")`: a new run whose journal holds the old one's steps
    before `summarize#2` in body order; those do not execute again, `summarize#2` does; the
    gate `first` (before `at`) stays answered, the gate `second` (after it) asks again."""
    run = completed_run(deploy)
    before = counts(deploy)
    forked = fork(run.id, at="summarize#2")
    assert isinstance(forked, compose.Run)
    assert forked.id != run.id
    assert forked.status == "paused" and forked.pending.id == "second"
    journal = steps(deploy, forked.id)
    assert set(journal) == {"fetch#1", "summarize#1", "__interrupt__:first", "summarize#2"}
    old = deploy.journal(run.id)
    for key in ("fetch#1", "summarize#1", "__interrupt__:first"):
        assert journal[key] == old[key]
    after = counts(deploy)
    assert after[("fetch", "owls")] == before[("fetch", "owls")] == 1
    assert after[("summarize", "1")] == 1
    assert after[("summarize", "2")] == 2
    done = compose.resume(forked.id, answers={"second": True})
    assert (done.id, done.status, done.output) == (forked.id, "completed", OUTPUT)
    assert counts(deploy)[("publish",)] == 2 and counts(deploy)[("archive",)] == 2


def test_issue27_fork_is_a_new_run_of_the_same_flow_and_arguments(deploy):
    """The fork's runs row: a new id, kind `flow`, the same flow name and `args_json`
    (FLOW-11); the old run's row, journal, pending interrupts and spans are untouched."""
    run = completed_run(deploy)
    old_state = deploy.state(run.id)
    forked = fork(run.id, at="summarize#2")
    assert deploy.state(run.id) == old_state
    new_row, old_row = deploy.run_row(forked.id), deploy.run_row(run.id)
    assert (new_row["kind"], new_row["name"], new_row["status"]) == ("flow", "digest", "paused")
    assert new_row["args_json"] == old_row["args_json"]
    assert new_row["trace_id"] != old_row["trace_id"]
    assert set(deploy.run_ids()) == {run.id, forked.id}


def test_issue27_fork_order_is_body_order_not_key_order(deploy):
    """`at` splits the journal in body order: `archive#1` sorts before `summarize#2` but
    ran after it, so a fork at `summarize#2` executes `archive` again."""
    run = completed_run(deploy)
    forked = fork(run.id, at="summarize#2")
    assert "archive#1" not in deploy.journal(forked.id)
    assert "publish#1" not in deploy.journal(forked.id)
    compose.resume(forked.id, answers={"second": True})
    assert counts(deploy)[("archive",)] == 2


def test_issue27_fork_before_a_gate_asks_it_again(deploy):
    """A fork at `summarize#1` keeps only `fetch#1`: the gate `first` comes after `at`, so
    the fork pauses there again although the old run answered it."""
    run = completed_run(deploy)
    forked = fork(run.id, at="summarize#1")
    assert forked.status == "paused" and forked.pending.id == "first"
    assert set(steps(deploy, forked.id)) == {"fetch#1", "summarize#1"}
    assert counts(deploy)[("fetch", "owls")] == 1
    assert counts(deploy)[("summarize", "1")] == 2


def test_issue27_fork_after_every_gate_completes(deploy):
    """A fork at `publish#1` has both answers before `at`: it runs `publish` and `archive`
    and completes with the same output, returning a completed `Run`."""
    run = completed_run(deploy)
    forked = fork(run.id, at="publish#1")
    assert (forked.status, forked.output) == ("completed", OUTPUT)
    assert forked.id != run.id
    c = counts(deploy)
    assert (c[("publish",)], c[("archive",)], c[("summarize", "2")]) == (2, 2, 1)


def test_issue27_fork_at_the_first_step_reruns_everything(deploy):
    """A fork at the first step copies nothing: every step executes again."""
    run = completed_run(deploy)
    forked = fork(run.id, at="fetch#1")
    assert forked.pending.id == "first"
    assert counts(deploy)[("fetch", "owls")] == 2
    assert set(steps(deploy, forked.id)) == {"fetch#1", "summarize#1"}


def test_issue27_fork_of_a_paused_run_leaves_it_paused(deploy):
    """Forking a run that is paused (at `second`) leaves the old run paused with its
    pending interrupt; each fork is a run of its own."""
    mod = deploy.load("digest_mod", DIGEST)
    run = mod.digest.run("owls")
    compose.resume(run.id, answers={"first": True})
    old_state = deploy.state(run.id)
    one = fork(run.id, at="summarize#2")
    two = fork(run.id, at="summarize#2")
    assert len({run.id, one.id, two.id}) == 3
    assert deploy.state(run.id) == old_state
    assert deploy.run_row(run.id)["status"] == "paused"
    assert compose.resume(run.id, answers={"second": True}).output == OUTPUT
    assert compose.resume(one.id, answers={"second": False}).output["ok"] == [True, False]
    assert deploy.run_row(two.id)["status"] == "paused"


def test_issue27_fork_runs_the_current_code_from_at(deploy):
    """The steps from `at` on run the code deployed now (the point of time travel: fix a
    step, fork before it); the copied steps keep their journaled values."""
    run = completed_run(deploy)
    deploy.load("digest_mod", DIGEST.replace("return summary.upper()", "return summary.title()"))
    forked = fork(run.id, at="publish#1")
    assert forked.output["published"] == "Summary 2 Of Text About Owls"
    assert forked.output["second"] == OUTPUT["second"]


BOOK = (
    DIGEST
    + """

@compose.flow(name="section")
def section(topic: str) -> str:
    return summarize(fetch(topic), 1)


@compose.flow(name="book")
def book(topic: str) -> str:
    return publish(section(topic))
"""
)


def test_issue27_fork_at_a_step_inside_a_nested_flow_executes_it(deploy):
    """A fork at `section#1/summarize#1` (FLOW-15/FLOW-50 scope of a nested flow) keeps
    `section#1/fetch#1` and executes `summarize` — and so the nested flow and `publish` —
    again: `at` always executes."""
    mod = deploy.load("digest_mod", BOOK)
    run = mod.book.run("owls")
    assert run.output == "SUMMARY 1 OF TEXT ABOUT OWLS"
    forked = fork(run.id, at="section#1/summarize#1")
    assert (forked.status, forked.output) == ("completed", run.output)
    c = counts(deploy)
    assert (c[("fetch", "owls")], c[("summarize", "1")], c[("publish",)]) == (1, 2, 2)


def test_issue27_a_forks_copied_steps_keep_their_identities(deploy):
    """The steps a fork copies keep their recorded identities: resuming the fork under a
    body that now calls `summarize(text, 11)` diverges at `summarize#1`."""
    run = completed_run(deploy)
    forked = fork(run.id, at="summarize#2")
    deploy.load("digest_mod", DIGEST.replace("summarize(text, 1)", "summarize(text, 11)"))
    with pytest.raises(compose.NondeterminismError) as info:
        compose.resume(forked.id, answers={"second": True}, allow_code_change=True)
    assert (info.value.run_id, info.value.key) == (forked.id, "summarize#1")


MAPPED = (
    DIGEST
    + """

@compose.flow(name="digests")
def digests(topics: list) -> list:
    return compose.map(fetch, topics)
"""
)


def test_issue27_fork_at_a_map_item_keeps_the_items_before_it(deploy):
    """A fork at `map#1[1]/fetch#1` (FLOW-15 item scopes, reserved in input order) keeps
    item 0 and executes items 1 and 2."""
    mod = deploy.load("digest_mod", MAPPED)
    run = mod.digests.run(["ant", "bee", "cat"])
    forked = fork(run.id, at="map#1[1]/fetch#1")
    assert forked.output == run.output == ["text about ant", "text about bee", "text about cat"]
    c = counts(deploy)
    assert (c[("fetch", "ant")], c[("fetch", "bee")], c[("fetch", "cat")]) == (1, 2, 2)


def test_issue27_fork_of_an_unknown_run_is_a_config_error(deploy):
    """An unknown run id → `ConfigError`; nothing is created."""
    deploy.load("digest_mod", DIGEST)
    with pytest.raises(ConfigError) as info:
        fork("01NOTARUN0000000000000000", at="fetch#1")
    assert "01NOTARUN0000000000000000" in str(info.value)
    assert deploy.run_ids() == []


@pytest.mark.parametrize("key", ["summarize#3", "nope#1", "map#1[0]/fetch#1"])
def test_issue27_fork_at_a_key_the_journal_lacks_is_a_config_error(deploy, key):
    """A key the run's journal does not have → `ConfigError` naming the key; nothing is
    created and the run is untouched."""
    run = completed_run(deploy)
    old_state = deploy.state(run.id)
    with pytest.raises(ConfigError) as info:
        fork(run.id, at=key)
    assert key in str(info.value)
    assert deploy.run_ids() == [run.id]
    assert deploy.state(run.id) == old_state


# -- compose fork ---------------------------------------------------------------------------


def cli(box: _proc.Sandbox, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "composeai.cli", "fork", *argv],
        capture_output=True,
        text=True,
        env=box.env(),
        cwd=str(box.root),
        timeout=_proc.TIMEOUT,
        check=False,
    )


def cli_completed_run(box: _proc.Sandbox) -> str:
    box.write_module("digest_mod", DIGEST)
    return box.run(
        """
        import digest_mod
        from composeai import resume
        run = digest_mod.digest.run("owls")
        resume(run.id, answers={"first": True})
        resume(run.id, answers={"second": True})
        emit(id=run.id)
        """
    ).ok()["id"]


def test_issue27_compose_fork_prints_the_new_run_and_its_status(tmp_path):
    """`compose fork RUN_ID --at KEY --import M` prints a line with the new run's id and
    status and exits 0 (paused here); another process then resumes the fork."""
    box = _proc.Sandbox(tmp_path)
    old = cli_completed_run(box)
    executed = box.side_effects()
    result = cli(box, old, "--at", "summarize#2", "--import", "digest_mod")
    assert result.returncode == 0, result.stdout + result.stderr
    (new,) = [i for i in box.run_ids() if i != old]
    assert [ln for ln in result.stdout.splitlines() if new in ln and "paused" in ln]
    assert len(box.side_effects()) == len(executed) + 1
    assert box.side_effects()[-1][:2] == ("summarize", "2")
    done = box.run(
        f"from composeai import resume\nimport digest_mod\n"
        f"run = resume({new!r}, answers={{'second': True}})\nemit(output=run.output)"
    ).ok()
    assert done["output"] == OUTPUT
    assert box.run_row(old)["status"] == "completed"


def test_issue27_compose_fork_that_completes_prints_completed(tmp_path):
    """`compose fork` whose fork runs to completion prints `completed`, exit 0."""
    box = _proc.Sandbox(tmp_path)
    old = cli_completed_run(box)
    result = cli(box, old, "--at", "publish#1", "--import", "digest_mod")
    assert result.returncode == 0, result.stdout + result.stderr
    (new,) = [i for i in box.run_ids() if i != old]
    assert [ln for ln in result.stdout.splitlines() if new in ln and "completed" in ln]
    assert box.run_row(new)["status"] == "completed"


def test_issue27_compose_fork_of_an_unknown_run_fails(tmp_path):
    """`compose fork` of a run id the store lacks exits 1 naming it."""
    box = _proc.Sandbox(tmp_path)
    cli_completed_run(box)
    result = cli(box, "01NOTARUN0000000000000000", "--at", "fetch#1", "--import", "digest_mod")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "01NOTARUN0000000000000000" in result.stderr


def test_issue27_compose_fork_at_an_unknown_key_fails_naming_it(tmp_path):
    """`compose fork` at a key the journal lacks exits non-zero naming the key and
    creates no run."""
    box = _proc.Sandbox(tmp_path)
    old = cli_completed_run(box)
    result = cli(box, old, "--at", "summarize#7", "--import", "digest_mod")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith("compose: ") and "summarize#7" in result.stderr
    assert box.run_ids() == [old]
