"""Seed 002's `AgentRun` flow, rewritten for composeai (EXT-2, EXT-3, EXT-4,
EXT-12): plan, ask for approval through a signal with a 30-minute timeout,
run the tool; parked in one process, continued by a worker in another,
approved from a third."""

from __future__ import annotations

import signal
import subprocess
import sys
from datetime import timedelta

import _proc
import composeai as compose
from composeai.testing import fake_clock

AGENT_RUN = """\
from datetime import timedelta

import composeai as compose
from composeai import flow, task

# The planner's script: what it proposes after n observations.
SCRIPT = [
    {"tool": "search", "args": {"q": "refund policy"}, "needs_approval": False},
    {"tool": "refund", "args": {"order": 42}, "needs_approval": True},
    {"tool": None, "answer": "refunded order 42"},
]


@task
def plan_step(goal: str, history: list) -> dict:
    side_effect("plan", len(history))
    return SCRIPT[min(len(history), len(SCRIPT) - 1)]


@task
def run_tool(tool: str, args: dict) -> dict:
    side_effect("tool", tool)
    return {"observation": f"{tool}({args}) ok"}


@flow
def agent_run(goal: str, max_steps: int) -> dict:
    history: list = []
    for _ in range(max_steps):
        plan = plan_step(goal, history)
        if plan["tool"] is None:
            return {"answer": plan["answer"], "history": history}
        if plan["needs_approval"]:
            approval = compose.receive("approval", timeout=timedelta(minutes=30))
            if not (approval or {}).get("approved"):
                continue
        history.append(run_tool(plan["tool"], plan["args"])["observation"])
    return {"answer": f"Stopped after {max_steps} steps.", "history": history}
"""


def test_seed002_agent_run_parked_in_a_continued_by_a_worker_in_b_approved_from_c(tmp_path):
    box = _proc.Sandbox(tmp_path)
    box.write_module("agentrun", AGENT_RUN)
    parked = box.run(
        """
        import agentrun
        run = agentrun.agent_run.run('refund the customer', 5, wait=False)
        emit(id=run.id, status=run.status, pending=run.pending.id, kind=run.pending.kind)
        """
    ).ok()
    assert parked["pending"] == "signal:approval#1" and parked["kind"] == "signal"
    run_id = parked["id"]
    worker = subprocess.Popen(
        [sys.executable, "-m", "composeai.cli", "worker", "--import", "agentrun"],
        env=box.env(),
        cwd=str(box.root),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        sent = subprocess.run(
            [
                sys.executable,
                "-m",
                "composeai.cli",
                "signal",
                run_id,
                "approval",
                "--json",
                '{"approved": true}',
            ],
            env=box.env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert sent.returncode == 0, sent.stderr
        _proc.wait_until(lambda: box.run_row(run_id)["status"] == "completed", what="the worker")
    finally:
        worker.send_signal(signal.SIGTERM)
        logged = _proc.finish(worker)
    assert f"finished {run_id} flow=agent_run outcome=completed" in logged.stdout, logged.describe()
    result = box.run(
        f"""
        import composeai
        emit(output=composeai.get_run({run_id!r}).result().output)
        """
    ).ok()
    assert result["output"] == {
        "answer": "refunded order 42",
        "history": ["search({'q': 'refund policy'}) ok", "refund({'order': 42}) ok"],
    }
    effects = [e[:2] for e in box.side_effects()]
    assert effects == [
        ("plan", "0"),
        ("tool", "search"),
        ("plan", "1"),
        ("tool", "refund"),
        ("plan", "2"),
    ], "every task ran exactly once across the processes"


def test_seed002_agent_run_skips_a_tool_whose_approval_times_out(tmp_path, monkeypatch):
    box = _proc.Sandbox(tmp_path)
    box.write_module("agentrun2", AGENT_RUN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SIDE_LOG", str(box.log))
    # Imported afresh (registering its flow) on each store's run of this test.
    monkeypatch.delitem(sys.modules, "agentrun2", raising=False)
    import agentrun2

    with fake_clock() as clock:
        run = agentrun2.agent_run.run("refund", 3, wait=False)
        assert run.pending.id == "signal:approval#1"
        clock.advance(timedelta(minutes=30))
        (again,) = compose.wake_due()
        assert again.pending.id == "signal:approval#2", "the planner proposed the tool again"
        compose.signal(run.id, "approval", {"approved": False})
        (done,) = compose.wake_due()
    assert done.output == {
        "answer": "Stopped after 3 steps.",
        "history": ["search({'q': 'refund policy'}) ok"],
    }
    assert [e[1] for e in box.side_effects() if e[0] == "tool"] == ["search"]
