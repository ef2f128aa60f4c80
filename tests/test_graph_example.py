"""The support-ticket triage example runs offline and resumes in a fresh process
(EXT-22 … EXT-33 end to end)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "graph"


def run(script: str, *args: str, env: dict) -> str:
    return subprocess.run(
        [sys.executable, str(EXAMPLE / script), *args],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout


def test_triage_example_suspends_for_review_and_sends_from_another_process(tmp_path):
    env = dict(os.environ, COMPOSE_DIR=str(tmp_path / "state"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(EXAMPLE), env.get("PYTHONPATH")) if p)
    started = run("start.py", "T-7", env=env)
    assert "suspended: True after 5 steps" in started
    assert "waiting: review: Send this reply?" in started
    assert "KB: the billing FAQ" in started and "History: ana@example.com" in started
    finished = run("finish.py", "T-7", "approve", env=env)
    assert "pending: ['review']" in finished
    assert "sent: sent to ana@example.com" in finished
    demo = subprocess.run(
        [sys.executable, str(EXAMPLE / "demo.py")],
        env=dict(env, COMPOSE_DIR=str(tmp_path / "demo")),
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert "◇ ticket-triage" in demo and "compose thread history T-1001" in demo
