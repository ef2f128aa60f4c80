"""The example web app (examples/webapp), end to end: the service and a
worker as subprocesses, an HTTP client reading the agent's tokens as
server-sent events, the run's progress event, the run list, an idempotent
start and the approval answered over HTTP."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import _proc

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

APP = Path(__file__).resolve().parent.parent / "examples" / "webapp"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(box: _proc.Sandbox, *args: str) -> subprocess.Popen:
    env = box.env()
    env["PYTHONPATH"] = f"{APP}{':' + env['PYTHONPATH'] if env.get('PYTHONPATH') else ''}"
    return subprocess.Popen(
        [sys.executable, "-m", *args],
        env=env,
        cwd=str(APP),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _sse(client, url: str) -> list[tuple[str, str]]:
    """The `(event, data)` pairs of a server-sent event stream, to its end."""
    events, event, data = [], "message", ""
    with client.stream("GET", url) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: "):
                data = line[len("data: ") :]
            elif line == "":
                events.append((event, data))
                event, data = "message", ""
    return events


def test_ops20_23_example_web_app_streams_a_workers_agent_to_a_browser(tmp_path):
    box = _proc.Sandbox(tmp_path)
    port = _free_port()
    server = _spawn(box, "uvicorn", "app:app", "--port", str(port), "--log-level", "warning")
    worker = None
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=_proc.TIMEOUT) as client:

            def up() -> bool:
                assert server.poll() is None, server.stderr.read() if server.stderr else ""
                try:
                    return client.get("/").status_code == 200
                except httpx.TransportError:
                    return False

            _proc.wait_until(up, what="the web app")
            started = client.post("/runs", json={"topic": "owls", "request_id": "req-1"})
            assert started.status_code == 201, started.text
            run_id = started.json()["run_id"]
            again = client.post("/runs", json={"topic": "owls", "request_id": "req-1"}).json()
            # The same request id names the same run (its run id).
            assert again == {"run_id": run_id, "created": False}
            assert run_id == "article:req-1"
            other = client.post("/runs", json={"topic": "bats", "request_id": "req-1"})
            assert other.status_code == 409 and "argument" in other.json()["error"]
            assert client.post("/runs", json={"topic": ""}).status_code == 400
            worker = _spawn(
                box,
                "composeai.cli",
                "worker",
                "--interval",
                "0.2",
                "--queue",
                "articles",
                "--import",
                "articles",
            )

            events = _sse(client, f"/runs/{run_id}/tokens")
            assert events[-1] == ("end", "{}")
            draft = "".join(json.loads(data) for kind, data in events if kind == "token")
            assert draft.startswith("Owls in three sentences.")

            progress = client.get(f"/runs/{run_id}/progress", params={"wait": 30}).json()
            assert progress["status"] == "paused"
            assert progress["progress"]["stage"] == "awaiting approval"
            listed = client.get("/runs").json()
            assert [r["id"] for r in listed] == [run_id]
            assert listed[0]["pending"] == ["publish"]

            answered = client.post(f"/runs/{run_id}/approval", json={"approved": True}).json()
            assert answered["status"] == "completed"
            assert answered["output"] == {"topic": "owls", "draft": draft, "published": True}
            final = client.get(f"/runs/{run_id}/progress").json()
            assert final == {"status": "completed", "progress": {"stage": "published"}}
            again = client.post(f"/runs/{run_id}/approval", json={"approved": True})
            assert again.status_code == 409
            assert client.get("/runs/nope/progress").status_code == 404
            # A retried request after the run finished still names that run.
            retried = client.post("/runs", json={"topic": "owls", "request_id": "req-1"})
            assert retried.json() == {"run_id": run_id, "created": False}
            # A late reader gets every token again, then the end.
            assert _sse(client, f"/runs/{run_id}/tokens") == events
    finally:
        for proc in (server, worker):
            if proc is not None:
                proc.terminate()
                _proc.finish(proc, timeout=60)
