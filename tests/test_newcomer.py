"""Issue 36, part 2: what a newcomer meets first.

- A `FakeModel` scripted `[tool_call, "Refunded."]` behind an approval-gated tool, paused in
  one process and resumed in a fresh one, continues its script where the conversation is and
  completes with one refund; in one process nothing changes; a misspelt key is refused.
- Errors that name the fix: each run records its flow's module, so a fresh process is told
  `import myapp.flows` / `--import myapp.flows` (resume, `compose trace`'s hint, `compose
  answer --resume`, `compose replay`/`fork`); a run id not found names the store searched, and
  `resume()` from another directory creates nothing.

Cross-process behaviour runs in real subprocesses (tests/_proc.py); on both stores.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from contextlib import closing

import pytest

import composeai as compose
from composeai import _engine
from composeai.errors import ConfigError
from composeai.testing import FakeModel

try:
    import _proc
except ImportError:  # pragma: no cover - when tests/ is not on sys.path
    sys.path.insert(0, os.path.dirname(__file__))
    import _proc

pytestmark = pytest.mark.parametrize("store_kind", ["sqlite", "postgresql"], indirect=True)

# The newcomer's app: a flow around an agent whose refund tool needs approval.
APP = """\
import composeai as compose
from composeai.testing import FakeModel

REFUND = {"tool_calls": [{"name": "refund", "arguments": {"order": "A-17", "amount": 30}}]}
MODEL = FakeModel([REFUND, "Refunded."])


@compose.tool(requires_approval=True)
def refund(order: str, amount: int) -> str:
    \"\"\"Refund an order.\"\"\"
    side_effect("refund", order, amount)
    return f"refunded {amount} on {order}"


@compose.agent(model=MODEL, tools=[refund])
def support(ticket: str) -> str:
    \"\"\"You resolve support tickets.\"\"\"
    return ticket


@compose.flow
def handle_ticket(ticket: str) -> str:
    return support(ticket)
"""

START = """
from myapp import flows
run = flows.handle_ticket.run("Order A-17 arrived broken, please refund")
emit(status=run.status, run_id=run.id, pending=run.pending.id if run.pending else None)
"""

RESUME = """
import os
from myapp import flows
from composeai import resume
run = resume(os.environ["RUN_ID"], answers={"refund": True})
emit(status=run.status, output=run.output, requests=len(flows.MODEL.requests))
"""


@pytest.fixture
def app(tmp_path) -> _proc.Sandbox:
    box = _proc.Sandbox(tmp_path)
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    box.write_module("myapp/flows", APP)
    return box


def _paused(app: _proc.Sandbox) -> str:
    a = app.run(START, PROC="A").ok()
    assert a["status"] == "paused" and a["pending"].startswith("tool:refund:")
    return a["run_id"]


def test_fakemodel_script_continues_in_a_fresh_process_with_one_refund_issue36(app):
    """Paused on the refund's approval in process A, resumed in process B: B's FakeModel (a
    fresh copy of the whole script) answers the conversation's second turn with the second
    item, so the run completes with one refund, executed once, by B."""
    run_id = _paused(app)
    b = app.run(RESUME, RUN_ID=run_id, PROC="B").ok()
    assert (b["status"], b["output"]) == ("completed", "Refunded.")
    assert b["requests"] == 1
    assert app.side_effects() == [("refund", "A-17", "30", "B")]


def test_fakemodel_in_one_process_keeps_its_order_issue36():
    """0.11.0's behaviour in one process: one item per call in script order, across
    separate conversations, and an in-process resume continues the same script."""
    model = FakeModel(
        [{"tool_calls": [{"name": "refund", "arguments": {"order": "B-2"}}]}, "Done.", "Again."]
    )
    refunds = []

    @compose.tool(requires_approval=True)
    def refund(order: str) -> str:
        """Refund."""
        refunds.append(order)
        return "ok"

    @compose.agent(model=model, tools=[refund])
    def desk(ticket: str) -> str:
        return ticket

    paused = desk.run("refund B-2")
    assert paused.status == "paused"
    done = compose.resume(paused.id, answers={"refund": True})
    assert (done.status, done.output, refunds) == ("completed", "Done.", ["B-2"])
    # A new conversation takes the next item.
    assert desk.run("another").output == "Again."
    assert len(model.requests) == 3


def _request(messages):
    from composeai.models.base import new_request

    return new_request("m", messages, None, [], None, 256, None, None, False, None, None, None)


def test_fakemodel_skips_only_matching_history_issue36():
    """Hand-written history that the script did not produce skips nothing."""
    from composeai.messages import Message

    model = FakeModel(["first", "second"])
    history = [Message.user("hi"), Message.assistant("an earlier reply"), Message.user("and?")]
    assert model.complete(_request(history)).message.text == "first"
    produced = [Message.user("q"), Message.assistant("first"), Message.user("more")]
    fresh = FakeModel(["first", "second"])
    assert fresh.complete(_request(produced)).message.text == "second"


def test_fakemodel_unknown_key_is_a_config_error_naming_it_issue36():
    with pytest.raises(ConfigError) as info:
        FakeModel([{"tool_calls": [{"name": "refund", "args": {"order": "A"}}]}])
    assert str(info.value) == (
        "FakeModel: unknown key 'args' in tool call {'name': 'refund', 'args': {'order': 'A'}}; "
        "valid keys: name, arguments, id"
    )
    with pytest.raises(
        ConfigError, match="unknown key 'txt' .* valid keys: tool_calls, text, json"
    ):
        FakeModel([{"tool_calls": [], "txt": "x"}])
    # A callable's dict is checked when it is called.
    with pytest.raises(ConfigError, match="unknown key 'jsn'"):
        FakeModel([lambda request: {"jsn": {}}]).complete(_request([]))


# -- errors that name the fix ---------------------------------------------------


def test_resume_in_a_process_without_the_import_names_the_module_issue36(app):
    run_id = _paused(app)
    body = """
import os
from composeai import resume
resume(os.environ["RUN_ID"], answers={"refund": True})
"""
    err = app.run(body, RUN_ID=run_id, PROC="B").error()
    assert err["message"] == (
        "flow 'handle_ticket' is not registered in this process -- import the module that "
        "defines it (so its @flow decoration runs) before calling resume(): "
        "`import myapp.flows` (compose commands: --import myapp.flows)"
    )


def _compose(app: _proc.Sandbox, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "composeai.cli", *argv],
        check=False,
        env=app.env(PROC="CLI"),
        cwd=str(app.root),
        capture_output=True,
        text=True,
        timeout=_proc.TIMEOUT,
    )


def test_trace_hint_answer_resume_replay_and_fork_name_the_import_issue36(app):
    """`compose trace` prints a resume hint that works as written (it imports the module);
    `compose answer --resume` without --import stores the answer, says so and names
    --import; the same command with --import then continues the run; `compose replay` and
    `compose fork` name --import."""
    run_id = _paused(app)
    trace = _compose(app, "trace", run_id)
    assert trace.returncode == 0, trace.stderr
    hint = trace.stdout.split("To resume:\n", 1)[1]
    assert hint.startswith("    import myapp.flows\n    from composeai import resume\n")
    assert "--resume --import myapp.flows" in hint

    interrupt = next(ln for ln in hint.splitlines() if "compose answer" in ln).split()[5]
    first = _compose(app, "answer", run_id, interrupt, "--yes", "--resume")
    assert first.returncode == 1
    assert (
        f"the answer to interrupt '{interrupt}' of run '{run_id}' is stored, but the run "
        "could not continue in this process"
    ) in first.stderr
    assert "run the same command again with --import myapp.flows" in first.stderr
    assert app.side_effects() == []

    again = _compose(
        app, "answer", run_id, interrupt, "--yes", "--resume", "--import", "myapp.flows"
    )
    assert again.returncode == 0, again.stderr
    assert f"run {run_id} continued here: completed" in again.stdout
    assert app.side_effects() == [("refund", "A-17", "30", "CLI")]

    replay = _compose(app, "replay", run_id)
    assert replay.returncode == 1
    assert "before replay(): `import myapp.flows` (compose commands: --import myapp.flows)" in (
        replay.stdout
    )
    fork = _compose(app, "fork", run_id, "--at", "support#1")
    assert fork.returncode == 1
    assert "--import myapp.flows" in fork.stderr


def test_run_not_found_names_the_store_and_creates_nothing_issue36(tmp_path, monkeypatch):
    """`resume()` from a directory without a store says which store it searched and how to
    point at the right one, and leaves no empty `.compose/` behind; so does the CLI."""
    if os.environ.get("COMPOSE_STORE"):
        with pytest.raises(ConfigError) as info:
            compose.resume("01NOSUCHRUN0000000000000000")
        assert "-- searched the postgresql store" in str(info.value)
        return
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("COMPOSE_DIR")
    _engine.reset_store()
    with pytest.raises(ConfigError) as info:
        compose.resume("01NOSUCHRUN0000000000000000")
    assert str(info.value) == (
        "no run found with run_id '01NOSUCHRUN0000000000000000' -- searched the SQLite store "
        f"'{elsewhere / '.compose' / 'runs.db'}' (COMPOSE_DIR is unset: ./.compose under "
        f"{elsewhere}); run from the directory the run was started in, or set COMPOSE_DIR / "
        "COMPOSE_STORE to its store"
    )
    assert not (elsewhere / ".compose").exists()
    from composeai.cli import main

    assert main(["trace", "01NOSUCHRUN0000000000000000"]) == 1
    assert not (elsewhere / ".compose").exists()


@pytest.mark.sqlite_file
def test_a_store_from_before_the_module_column_gains_it_issue36(tmp_path):
    """A SQLite store stamped with the schema before the module column is migrated on open:
    its runs keep working, with no module recorded; new runs record theirs."""

    @compose.flow
    def old() -> int:
        compose.approve("go")
        return 1

    before = old.run()
    _engine.reset_store()
    path = tmp_path / "state" / "runs.db"
    with closing(sqlite3.connect(str(path))) as db:
        db.execute("ALTER TABLE runs DROP COLUMN module")
        db.execute("PRAGMA user_version = 11")
        db.commit()
    assert compose.resume(before.id, answers={"go": True}).output == 1
    assert _engine.get_store().get_run(before.id)["module"] is None
    with closing(sqlite3.connect(str(path))) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 12
    assert _engine.get_store().get_run(old.run().id)["module"] == __name__
