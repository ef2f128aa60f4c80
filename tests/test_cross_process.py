"""Durable runs across real processes (FLOW-40 … FLOW-43, leases, OBS-1 store permissions).

Every scenario runs its processes with `subprocess` (`sys.executable`), a per-test
`COMPOSE_DIR`, and flow modules written as real files into tmp_path. Task bodies append one
line per execution to a side-effect log, labelled with the process that ran them (env PROC), so
the tests can prove which process executed what.
"""

from __future__ import annotations

import os
import signal
import stat
import sys
from pathlib import Path

import pytest

try:
    import _proc
except ImportError:  # pragma: no cover - when tests/ is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _proc

RESEARCH = """\
from composeai import approve, flow, task


@task
def search(topic: str) -> list:
    side_effect("search", topic)
    return [f"{topic}-a", f"{topic}-b"]


@task
def summarize(doc: str) -> str:
    side_effect("summarize", doc)
    return doc.upper()


@task
def publish(text: str) -> str:
    side_effect("publish", text)
    return f"published:{text}"


@flow
def research(topic: str) -> dict:
    docs = search(topic)
    summaries = [summarize(d) for d in docs]
    draft = " | ".join(summaries)
    if approve("publish", {"draft": draft}):
        return {"draft": draft, "result": publish(draft)}
    return {"draft": draft, "result": None}
"""

DRAFT = "AI-A | AI-B"
OUTPUT = {"draft": DRAFT, "result": f"published:{DRAFT}"}

START = """
import research
run = research.research.run("ai")
emit(
    status=run.status,
    run_id=run.id,
    output=run.output,
    pending=None if run.pending is None else {
        "id": run.pending.id, "kind": run.pending.kind, "payload": run.pending.payload,
    },
)
"""

RESUME = """
import os
{imports}
from composeai import resume
run = resume(os.environ["RUN_ID"]{extra})
emit(status=run.status, run_id=run.id, output=run.output)
"""


def resume_body(*, import_module: bool = True, extra: str = "") -> str:
    return RESUME.format(imports="import research" if import_module else "", extra=extra)


ANSWERS = ', answers={"publish": True}'


@pytest.fixture
def sb(tmp_path) -> _proc.Sandbox:
    box = _proc.Sandbox(tmp_path)
    box.write_module("research", RESEARCH)
    return box


def pause_in_a(sb: _proc.Sandbox) -> str:
    """Process A runs the flow up to its approval gate; returns the run id."""
    a = sb.run(START, PROC="A").ok()
    assert a["status"] == "paused", a
    assert a["output"] is None
    assert a["pending"] == {"id": "publish", "kind": "approval", "payload": {"draft": DRAFT}}
    assert sb.run_row(a["run_id"])["status"] == "paused"
    assert sorted(sb.side_effects()) == [
        ("search", "ai", "A"),
        ("summarize", "ai-a", "A"),
        ("summarize", "ai-b", "A"),
    ]
    return a["run_id"]


def test_pause_in_one_process_resume_in_another(sb):
    """FLOW-40/42: B resumes A's paused run; no step finished in A runs again in B."""
    run_id = pause_in_a(sb)

    b = sb.run(resume_body(extra=ANSWERS), RUN_ID=run_id, PROC="B").ok()
    assert b == {"status": "completed", "run_id": run_id, "output": OUTPUT}
    assert sorted(sb.side_effects()) == [
        ("publish", DRAFT, "B"),
        ("search", "ai", "A"),
        ("summarize", "ai-a", "A"),
        ("summarize", "ai-b", "A"),
    ]
    row = sb.run_row(run_id)
    assert row["status"] == "completed"
    assert sb.pending(run_id) == []
    assert set(sb.journal(run_id)) == {
        "search#1",
        "summarize#1",
        "summarize#2",
        "__interrupt__:publish",
        "publish#1",
    }

    # FLOW-41 step 5: a completed run resumes to its stored output without executing.
    c = sb.run(resume_body(), RUN_ID=run_id, PROC="C").ok()
    assert c == {"status": "completed", "run_id": run_id, "output": OUTPUT}
    assert len(sb.side_effects()) == 4


def test_edited_flow_source_is_refused_then_allowed(sb):
    """FLOW-41 step 6: a fingerprint mismatch raises ResumeMismatchError (nothing written);
    allow_code_change=True resumes from the journal."""
    run_id = pause_in_a(sb)
    before = sb.snapshot(run_id)

    path = sb.root / "research.py"
    source = path.read_text()
    edited = source.replace(
        '    draft = " | ".join(summaries)\n',
        '    # reviewed: the separator stays the same\n    draft = " | ".join(summaries)\n',
    )
    assert edited != source
    path.write_text(edited)

    b = sb.run(resume_body(extra=ANSWERS), RUN_ID=run_id, PROC="B").error()
    assert (b["error_type"], b["error_module"]) == ("ResumeMismatchError", "composeai.errors")
    assert b["message"] == (
        f"the source of @flow 'research' changed since run '{run_id}' was created (fingerprint "
        "mismatch) -- pass allow_code_change=True to resume anyway (the journal may no longer "
        "match the new code's call sequence)"
    )
    assert sb.snapshot(run_id) == before, "a refused resume must not write anything"
    assert len(sb.side_effects()) == 3

    c = sb.run(
        resume_body(extra=ANSWERS + ", allow_code_change=True"), RUN_ID=run_id, PROC="C"
    ).ok()
    assert c == {"status": "completed", "run_id": run_id, "output": OUTPUT}
    assert sorted(e for e in sb.side_effects() if e[-1] != "A") == [("publish", DRAFT, "C")]
    assert len(sb.side_effects()) == 4


def test_resume_without_importing_the_flow_module(sb):
    """FLOW-41 step 4: the flow must be registered in the resuming process."""
    run_id = pause_in_a(sb)
    before = sb.snapshot(run_id)

    b = sb.run(resume_body(import_module=False, extra=ANSWERS), RUN_ID=run_id, PROC="B")
    err = b.error()
    assert (err["error_type"], err["error_module"]) == ("ConfigError", "composeai.errors")
    assert err["message"] == (
        "flow 'research' is not registered in this process -- import the module that defines "
        "it (so its @flow decoration runs) before calling resume(): `import research` "
        "(compose commands: --import research)"
    )
    assert sb.snapshot(run_id) == before
    assert len(sb.side_effects()) == 3

    c = sb.run(resume_body(extra=ANSWERS), RUN_ID=run_id, PROC="C").ok()
    assert c["output"] == OUTPUT
    assert len(sb.side_effects()) == 4


def test_resume_of_an_unknown_run_id(sb):
    """FLOW-41 step 1, across a fresh process and an existing store."""
    pause_in_a(sb)
    err = sb.run(resume_body(), RUN_ID="01NOSUCHRUN0000000000000000", PROC="B").error()
    assert err["error_type"] == "ConfigError"
    assert err["message"].startswith(
        "no run found with run_id '01NOSUCHRUN0000000000000000' -- searched the SQLite store "
    )


# ---------------------------------------------------------------------------
# Leases

BLOCKING = """\
import os
import time

from composeai import flow, task

GO = os.environ["GO_FILE"]


@task
def before(x: int) -> int:
    side_effect("before", x)
    return x + 1


@task
def wait_for_go(x: int) -> int:
    side_effect("block", x)
    while not os.path.exists(GO):
        time.sleep(0.005)
    return x * 2


@task
def after(x: int) -> int:
    side_effect("after", x)
    return x + 100


@flow
def blocking(x: int) -> int:
    return after(wait_for_go(before(x)))
"""

BLOCKING_START = """
import blocking
run = blocking.blocking.run(1)
emit(status=run.status, output=run.output)
"""

BLOCKING_RESUME = """
import os
import time
import blocking
from composeai import resume
t0 = time.monotonic()
run = resume(os.environ["RUN_ID"])
emit(status=run.status, output=run.output, seconds=time.monotonic() - t0)
"""

# A dead holder is taken over at once; a lease that had to expire would take LEASE_SECONDS
# (60 s). This bound only separates the two; it is not a speed requirement.
TAKEOVER_BOUND = 20.0


def start_blocked(sb: _proc.Sandbox):
    """Process A runs `blocking` and parks inside `wait_for_go`."""
    a = sb.spawn(BLOCKING_START, PROC="A", GO_FILE=str(sb.root / "go"))
    try:
        _proc.wait_until(
            lambda: ("block", "2", "A") in sb.side_effects() or a.poll() is not None,
            what="process A to reach the blocking task",
        )
        assert a.poll() is None, _proc.finish(a).describe()
        (run_id,) = sb.run_ids()
    except BaseException:
        a.kill()
        a.wait()
        raise
    return a, run_id


def test_live_lease_is_refused_and_dead_holder_taken_over(sb):
    sb.write_module("blocking", BLOCKING)
    go = str(sb.root / "go")
    a, run_id = start_blocked(sb)
    try:
        row = sb.run_row(run_id)
        assert row["status"] == "running"

        b = sb.run(BLOCKING_RESUME, RUN_ID=run_id, PROC="B", GO_FILE=go).error()
        assert b["error_type"] == "ConfigError", b
        assert "already being executed by another process" in b["message"], b["message"]
        assert f":{a.pid}:" in b["message"], "the message names the holder (host:pid:start)"
        # B executed nothing and changed nothing.
        assert sb.side_effects() == [("before", "1", "A"), ("block", "2", "A")]
        assert sb.run_row(run_id) == row
        assert a.poll() is None
    finally:
        a.send_signal(signal.SIGKILL)
        a_result = _proc.finish(a)
    assert a_result.killed, a_result.describe()

    # Reaped and dead: C takes the lease over immediately and completes.
    (sb.root / "go").touch()
    c = sb.run(BLOCKING_RESUME, RUN_ID=run_id, PROC="C", GO_FILE=go).ok()
    assert (c["status"], c["output"]) == ("completed", 104)
    assert c["seconds"] < TAKEOVER_BOUND, c
    # `before` committed in A and replays; the step A died in re-runs (FLOW-20).
    assert sb.side_effects() == [
        ("before", "1", "A"),
        ("block", "2", "A"),
        ("block", "2", "C"),
        ("after", "4", "C"),
    ]
    assert sb.run_row(run_id)["status"] == "completed"


def test_killed_but_unreaped_holder_is_taken_over(sb):
    """A holder that was SIGKILLed is dead even while its parent has not reaped it yet."""
    sb.write_module("blocking", BLOCKING)
    go = str(sb.root / "go")
    a, run_id = start_blocked(sb)
    try:
        os.kill(a.pid, signal.SIGKILL)
        # Wait for the kill to land without reaping the child (it stays a zombie).
        _proc.wait_until(
            lambda: Path(f"/proc/{a.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z",
            what="process A to become a zombie",
        )
        (sb.root / "go").touch()
        c = sb.run(BLOCKING_RESUME, RUN_ID=run_id, PROC="C", GO_FILE=go)
    finally:
        a.kill()
        _proc.finish(a)
    out = c.ok()
    assert (out["status"], out["output"]) == ("completed", 104)


# ---------------------------------------------------------------------------
# Store permissions

TINY = """\
from composeai import flow, task


@task
def double(x: int) -> int:
    side_effect("double", x)
    return 2 * x


@flow
def tiny(x: int) -> int:
    return double(x) + 1
"""

PERMISSIONS = """
import os
import stat
os.umask(0)  # the store must not rely on the caller's umask to stay private
import tiny
run = tiny.tiny.run(20)
state = os.environ["COMPOSE_DIR"]
modes = {"<dir>": stat.S_IMODE(os.stat(state).st_mode)}
for name in sorted(os.listdir(state)):
    modes[name] = stat.S_IMODE(os.stat(os.path.join(state, name)).st_mode)
emit(status=run.status, output=run.output, modes=modes)
"""


@pytest.mark.sqlite_file
def test_state_dir_and_database_are_private(sb):
    """The state dir is 0700 and runs.db (and its WAL/SHM companions) 0600, even with umask 0."""
    sb.write_module("tiny", TINY)
    out = sb.run(PERMISSIONS, PROC="A").ok()
    assert (out["status"], out["output"]) == ("completed", 41)
    modes = out["modes"]
    assert modes["<dir>"] == 0o700, oct(modes["<dir>"])
    assert modes["runs.db"] == 0o600, oct(modes["runs.db"])
    for name, mode in modes.items():
        if name.startswith("runs.db"):
            assert mode == 0o600, f"{name}: {oct(mode)}"
    # And as seen from outside once the process has exited.
    assert stat.S_IMODE(os.stat(sb.state).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(sb.db_path).st_mode) == 0o600
