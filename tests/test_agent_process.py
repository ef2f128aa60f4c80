"""Agents across real processes: a standalone agent paused on an approval-gated tool in one
process and resumed in another; an agent step of a flow replayed after a cross-process resume
(agents.md AGENT-20, AGENT-41, AGENT-51 … AGENT-54; flows.md FLOW-16, FLOW-36, FLOW-43;
observability.md OBS-23).

Each child runs `sys.executable` with a per-test `COMPOSE_DIR` and the agent module written as a
real file into tmp_path. Tool bodies append one line per execution to the side-effect log
(labelled with the process, env PROC), so the tests prove which process executed what. Which
FakeModel replies a process needs is chosen by env PHASE: A gets the replies for its part, B
only the remaining ones (an empty script in B means any model call would raise).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import _proc
except ImportError:  # pragma: no cover - when tests/ is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _proc

MAILER = """\
import os

import composeai as compose
from composeai.testing import FakeModel

TOOL_CALL = {
    "tool_calls": [
        {"name": "send_email", "arguments": {"to": "bob@example.com"}, "id": "call_1"}
    ]
}
SCRIPTS = {"A": [TOOL_CALL], "B": ["Email sent to bob."]}
MODEL = FakeModel(SCRIPTS[os.environ["PHASE"]])


@compose.tool(requires_approval=True)
def send_email(to: str) -> str:
    \"\"\"Send an email.\"\"\"
    side_effect("send_email", to)
    return f"sent to {to}"


@compose.agent(model=MODEL, tools=[send_email])
def mailer(request: str) -> str:
    \"\"\"You send emails.\"\"\"
    return request
"""

START_MAILER = """
import mailermod
run = mailermod.mailer.run("Please email bob")
emit(
    status=run.status,
    run_id=run.id,
    output=run.output,
    pending=None if run.pending is None else {
        "id": run.pending.id, "kind": run.pending.kind, "payload": run.pending.payload,
    },
    requests=len(mailermod.MODEL.requests),
)
"""

RESUME_MAILER = """
import os
import mailermod
from composeai import resume
run = resume(os.environ["RUN_ID"], answers={"send_email": True})
emit(
    status=run.status,
    run_id=run.id,
    output=run.output,
    requests=[
        {
            "system": r.system,
            "messages": [m.model_dump(mode="json") for m in r.messages],
        }
        for r in mailermod.MODEL.requests
    ],
    messages=[m.model_dump(mode="json") for m in run.messages],
)
"""

EDITOR = """\
import os

import composeai as compose
from composeai.testing import FakeModel

SCRIPTS = {"A": ["Polished draft."], "B": []}
MODEL = FakeModel(SCRIPTS[os.environ["PHASE"]])


@compose.agent(model=MODEL)
def editor(draft: str) -> str:
    \"\"\"You edit drafts.\"\"\"
    side_effect("editor-body", draft)
    return f"Edit this: {draft}"


@compose.flow
def publish(draft: str) -> str:
    edited = editor(draft)
    if compose.approve("publish", {"edited": edited}):
        return edited
    return "rejected"
"""

START_EDITOR = """
import editormod
run = editormod.publish.run("rough draft")
emit(
    status=run.status,
    run_id=run.id,
    pending=None if run.pending is None else run.pending.id,
    requests=len(editormod.MODEL.requests),
)
"""

RESUME_EDITOR = """
import os
import editormod
from composeai import resume
run = resume(os.environ["RUN_ID"], answers={"publish": True})
agents = [s for s in run.trace.spans if s.kind == "agent"]
emit(
    status=run.status,
    output=run.output,
    requests=len(editormod.MODEL.requests),
    agent_spans=[
        {"name": s.name, "replayed": s.replayed, "attributes": s.attributes} for s in agents
    ],
    llm_spans=len([s for s in run.trace.spans if s.kind == "llm"]),
)
"""


# A model (and a tool) that, in process A, block after recording the call: the test kills A
# there with `kill -9`.
STALLER = """\
import os
import threading

import composeai as compose
from composeai.messages import Message, StopReason, Usage
from composeai.models.base import ModelResponse
from composeai.testing import FakeModel

PHASE = os.environ["PHASE"]


class StallingModel:
    def __init__(self):
        self.requests = []

    def complete(self, request):
        self.requests.append(request)
        side_effect("model", len(request.messages))
        if PHASE == "A":
            threading.Event().wait()
        return ModelResponse(
            message=Message.assistant("Hello, Ada."),
            stop_reason=StopReason.END_TURN,
            raw_stop_reason="end_turn",
            usage=Usage(input_tokens=3, output_tokens=4),
            model_id=request.model,
        )


MODEL = StallingModel()


@compose.agent(model=MODEL)
def greeter(name: str) -> str:
    \"\"\"Greet the user.\"\"\"
    return f"Say hello to {name}."


def _lookup(q, call_id):
    return {"tool_calls": [{"name": "lookup", "arguments": {"q": q}, "id": call_id}]}


TOOL_MODEL = FakeModel(
    {"A": [_lookup("ada", "call_1"), _lookup("stall", "call_2")], "B": ["Found Ada."]}[PHASE]
)


@compose.tool
def lookup(q: str) -> str:
    \"\"\"Look someone up.\"\"\"
    side_effect("lookup", q)
    if q == "stall" and PHASE == "A":
        threading.Event().wait()
    return f"{q}: mathematician"


@compose.agent(model=TOOL_MODEL, tools=[lookup])
def researcher(name: str) -> str:
    \"\"\"You look people up.\"\"\"
    return f"Who is {name}?"
"""

RESUME_STALLER = """
import os
import stallmod
from composeai import resume
run = resume(os.environ["RUN_ID"])
model = stallmod.MODEL if os.environ["AGENT"] == "greeter" else stallmod.TOOL_MODEL
emit(
    status=run.status,
    output=run.output,
    requests=[[m.model_dump(mode="json") for m in r.messages] for r in model.requests],
)
"""


@pytest.fixture
def sb(tmp_path) -> _proc.Sandbox:
    box = _proc.Sandbox(tmp_path)
    box.write_module("mailermod", MAILER)
    box.write_module("editormod", EDITOR)
    box.write_module("stallmod", STALLER)
    return box


def _kill_once(sb: _proc.Sandbox, proc: subprocess.Popen, effect: tuple) -> str:
    """Waits until A recorded `effect` and its run row is stored, kills A with SIGKILL and
    returns the run id."""
    _proc.wait_until(lambda: effect in sb.side_effects(), what=f"{effect} in process A")
    run_ids = _proc.wait_until(sb.run_ids, what="the run row")
    proc.kill()
    assert _proc.finish(proc).killed
    assert len(run_ids) == 1
    return run_ids[0]


def test_standalone_agent_killed_during_its_model_call_is_stored_running_and_resumes(sb):
    """AGENT-52/AGENT-54, STORE-10: the run row of a standalone agent call is stored (running,
    leased to the caller) while its model call is still in flight, with no commit of the
    caller's own: after `kill -9` there, another process sees it running and resumes it. The
    interrupted call journaled nothing, so it is made again, once."""
    proc = sb.spawn("import stallmod\nstallmod.greeter.run('Ada')", PROC="A", PHASE="A")
    run_id = _kill_once(sb, proc, ("model", "1", "A"))
    row = sb.run_row(run_id)
    assert (row["kind"], row["name"], row["status"]) == ("agent", "greeter", "running")
    assert row["lease_owner"] is not None
    assert json.loads(row["args_json"]) == {"args": ["Ada"], "kwargs": {}}

    b = sb.run(RESUME_STALLER, RUN_ID=run_id, AGENT="greeter", PROC="B", PHASE="B").ok()
    assert b["status"] == "completed" and b["output"] == "Hello, Ada."
    assert sb.side_effects() == [("model", "1", "A"), ("model", "1", "B")]
    row = sb.run_row(run_id)
    assert row["status"] == "completed" and row["lease_owner"] is None
    spans = sb.query(
        "SELECT s.kind FROM spans s JOIN runs r ON r.rid = s.rid WHERE r.run_id = ? ORDER BY s.sid",
        (run_id,),
    )
    assert [k for (k,) in spans] == ["llm", "agent"]
    assert sb.integrity_ok()


def test_standalone_agent_killed_after_a_tool_batch_resumes_from_its_snapshot(sb):
    """AGENT-53: a completed tool batch is snapshotted (and with it the run row stored) before
    the loop acts on it, so after `kill -9` in the next turn's tool the resumed run continues
    from that snapshot: the first turn's model call is not made again (no second bill) and its
    tool does not run again."""
    proc = sb.spawn("import stallmod\nstallmod.researcher.run('Ada')", PROC="A", PHASE="A")
    run_id = _kill_once(sb, proc, ("lookup", "stall", "A"))
    assert sb.run_row(run_id)["status"] == "running"

    b = sb.run(RESUME_STALLER, RUN_ID=run_id, AGENT="researcher", PROC="B", PHASE="B").ok()
    assert b["status"] == "completed" and b["output"] == "Found Ada."
    # B's one model request starts from the snapshot: the first turn and its tool result.
    assert len(b["requests"]) == 1
    roles = [(m["role"], m["parts"][0]["type"]) for m in b["requests"][0]]
    assert roles == [("user", "text"), ("assistant", "tool_call"), ("user", "tool_result")]
    assert sb.side_effects() == [("lookup", "ada", "A"), ("lookup", "stall", "A")]
    assert sb.integrity_ok()


def test_standalone_agent_paused_in_a_resumed_in_b_with_the_bare_tool_name(sb):
    a = sb.run(START_MAILER, PROC="A", PHASE="A").ok()
    assert a["status"] == "paused" and a["output"] is None
    assert a["pending"] == {
        "id": "tool:send_email:call_1",
        "kind": "approval",
        "payload": {"tool": "send_email", "arguments": {"to": "bob@example.com"}},
    }
    assert a["requests"] == 1
    run_id = a["run_id"]
    row = sb.run_row(run_id)
    assert row["kind"] == "agent" and row["name"] == "mailer" and row["status"] == "paused"
    assert sb.pending(run_id) == [
        (
            "tool:send_email:call_1",
            "approval",
            None,
            '{"tool":"send_email","arguments":{"to":"bob@example.com"}}',
        )
    ]
    assert sb.side_effects() == []  # the gated tool did not run in A

    b = sb.run(RESUME_MAILER, RUN_ID=run_id, PROC="B", PHASE="B").ok()
    assert b["status"] == "completed"
    assert b["run_id"] == run_id
    assert b["output"] == "Email sent to bob."
    # the tool body ran exactly once, in B
    assert sb.side_effects() == [("send_email", "bob@example.com", "B")]
    # B's model continues from A's snapshot: one request, carrying the whole conversation
    user = {"role": "user", "parts": [{"type": "text", "text": "Please email bob"}]}
    call = {
        "role": "assistant",
        "parts": [
            {
                "type": "tool_call",
                "id": "call_1",
                "name": "send_email",
                "arguments": {"to": "bob@example.com"},
            }
        ],
    }
    result = {
        "role": "user",
        "parts": [
            {
                "type": "tool_result",
                "tool_call_id": "call_1",
                "content": "sent to bob@example.com",
                "is_error": False,
            }
        ],
    }
    reply = {"role": "assistant", "parts": [{"type": "text", "text": "Email sent to bob."}]}
    assert b["requests"] == [{"system": "You send emails.", "messages": [user, call, result]}]
    assert b["messages"] == [user, call, result, reply]

    row = sb.run_row(run_id)
    assert row["status"] == "completed"
    assert json.loads(row["output_json"]) == "Email sent to bob."
    assert sb.pending(run_id) == []
    assert json.loads(sb.journal(run_id)["__interrupt__:tool:send_email:call_1"]) is True


def test_flow_agent_step_replayed_in_b_and_trace_shows_it(sb):
    a = sb.run(START_EDITOR, PROC="A", PHASE="A").ok()
    assert a == {"status": "paused", "run_id": a["run_id"], "pending": "publish", "requests": 1}
    run_id = a["run_id"]
    assert sb.side_effects() == [("editor-body", "rough draft", "A")]
    assert json.loads(sb.journal(run_id)["editor#1"]) == "Polished draft."

    # B's FakeModel script is empty: a model call would raise "script exhausted"
    b = sb.run(RESUME_EDITOR, RUN_ID=run_id, PROC="B", PHASE="B").ok()
    assert b["status"] == "completed"
    assert b["output"] == "Polished draft."
    assert b["requests"] == 0
    assert b["llm_spans"] == 0
    assert b["agent_spans"] == [
        {"name": "editor", "replayed": True, "attributes": {"step_key": "editor#1"}}
    ]
    assert sb.side_effects() == [("editor-body", "rough draft", "A")]  # body not re-run
    assert sb.run_row(run_id)["status"] == "completed"

    cli = subprocess.run(
        [sys.executable, "-m", "composeai.cli", "trace", run_id],
        check=False,
        env=sb.env(NO_COLOR="1"),
        cwd=str(sb.root),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=_proc.TIMEOUT,
    )
    assert cli.returncode == 0, cli.stderr
    lines = cli.stdout.splitlines()
    editor_lines = [ln for ln in lines if "◆ editor" in ln]
    assert len(editor_lines) == 2, cli.stdout  # attempt A (live) and attempt B (replayed)
    live, replayed = editor_lines
    assert "(replayed)" not in live
    assert replayed.endswith("(replayed)"), cli.stdout
    assert "\x1b[" not in cli.stdout
    # the live attempt's llm call is in A's part of the trace; none in B's
    assert sum("▸ FakeModel" in ln for ln in lines) == 1, cli.stdout
