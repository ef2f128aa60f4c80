"""OPS-21 events and OPS-22 durable streams: journaled writes in a flow,
reads from any process (a worker executes, this process and a late child
read), an agent's tokens streamed with `stream_to`, and the bad inputs."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from datetime import timedelta

import pytest

import _proc
import composeai as compose
from composeai import flow, task
from composeai.errors import ConfigError, SerializationError
from composeai.testing import FakeModel

FLOWS = """\
import composeai as compose
from composeai import agent, flow
from composeai.testing import FakeModel


@flow
def counter(n: int) -> int:
    compose.sleep(0.01)
    compose.set_event("progress", {"step": 1})
    go = compose.receive("go")
    compose.set_event("progress", {"step": 2, "go": go})
    for i in range(n):
        compose.write_stream("numbers", i)
    compose.close_stream("numbers")
    return n


@agent(model=FakeModel(["alpha beta gamma delta epsilon"]), stream_to="tokens")
def writer(topic: str) -> str:
    return "write about " + topic


@flow
def story(topic: str) -> str:
    compose.sleep(0.01)
    text = writer(topic)
    compose.receive("go")
    return text
"""


@pytest.fixture
def box(tmp_path):
    sandbox = _proc.Sandbox(tmp_path)
    sandbox.write_module("pubflows", FLOWS)
    return sandbox


def park(box: _proc.Sandbox, call: str) -> str:
    result = box.run(f"import pubflows\nrun = {call}\nemit(id=run.id, status=run.status)").ok()
    assert result["status"] == "paused", result
    return result["id"]


def worker(box: _proc.Sandbox) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "composeai.cli", "worker", "--interval", "0.2"]
        + ["--import", "pubflows"],
        env=box.env(),
        cwd=str(box.root),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    _proc.finish(proc, timeout=60)


def test_ops21_ops22_a_worker_publishes_and_other_processes_read_while_it_executes(box, store_kind):
    """get_event from this process while a worker executes the run; a
    stream of 1,000 values read live here and by a child started after the
    run finished, every value once, in order, from the first."""
    run_id = park(box, "pubflows.counter.run(1000, wait=False)")
    proc = worker(box)
    try:
        first = compose.get_event(run_id, "progress", timeout=_proc.TIMEOUT)
        assert first == {"step": 1}
        # Parked on its signal by the worker: its stream readers wait on.
        assert box.run_row(run_id)["status"] in ("running", "paused")
        # A prune beside the worker leaves its run alone (OPS-23).
        assert compose.delete_runs(older_than=timedelta(0)) == 0
        live: list = []
        reader = threading.Thread(
            target=lambda: live.extend(
                compose.read_stream(run_id, "numbers", timeout=_proc.TIMEOUT)
            )
        )
        reader.start()
        compose.signal(run_id, "go", "now")
        second = compose.get_event(run_id, "progress", timeout=_proc.TIMEOUT, default=None)
        while second == {"step": 1}:
            second = compose.get_event(run_id, "progress", timeout=1.0)
        assert second == {"step": 2, "go": "now"}
        reader.join(_proc.TIMEOUT)
        assert not reader.is_alive()
        assert live == list(range(1000))
        _proc.wait_until(lambda: box.run_row(run_id)["status"] == "completed", what="the run")
    finally:
        stop(proc)
    late = box.run(
        f"import composeai as compose\n"
        f"values = list(compose.read_stream({run_id!r}, 'numbers'))\n"
        f"emit(n=len(values), ordered=values == list(range(1000)),\n"
        f"     events=compose.get_events({run_id!r}))"
    ).ok()
    assert late == {"n": 1000, "ordered": True, "events": {"progress": {"step": 2, "go": "now"}}}
    journal = box.journal(run_id)
    assert {"set_event#1", "set_event#2", "write_stream#1000", "close_stream#1"} <= set(journal)


def test_ops22_agent_tokens_reach_a_reader_before_the_run_ends(box, store_kind):
    """`@agent(stream_to="tokens")` in a flow on a worker: the FakeModel's
    text deltas are read here while the run still waits for a signal."""
    run_id = park(box, "pubflows.story.run('owls', wait=False)")
    proc = worker(box)
    try:
        tokens = compose.read_stream(run_id, "tokens", timeout=_proc.TIMEOUT)
        got = ""
        while got != "alpha beta gamma delta epsilon":
            got += next(tokens)
        assert box.run_row(run_id)["status"] != "completed", "tokens arrive before the run ends"
        compose.signal(run_id, "go", True)
        assert list(tokens) == [], "the stream ends when the run settles"
        assert box.run_row(run_id)["status"] == "completed"
    finally:
        stop(proc)


@task
def double(x: int) -> int:
    return 2 * x


@flow
def publisher(n: int) -> int:
    compose.set_event("stage", "start")
    for i in range(n):
        compose.write_stream("values", double(i))
    compose.approve("go-on")
    compose.set_event("stage", "approved")
    compose.write_stream("values", -1)
    compose.close_stream("values")
    return n


def test_ops21_ops22_a_resumed_body_writes_nothing_again(store_kind):
    """A paused run's reader ends at the pause; the resumed body replays its
    journaled writes without appending; a reader after the end gets every
    value once and ends."""
    run = publisher.run(3)
    assert run.status == "paused"
    assert list(compose.read_stream(run.id, "values")) == [0, 2, 4]
    assert compose.get_events(run.id) == {"stage": "start"}
    done = compose.resume(run.id, {"go-on": True})
    assert done.status == "completed"
    assert list(compose.read_stream(run.id, "values")) == [0, 2, 4, -1]
    assert compose.get_event(run.id, "stage") == "approved"
    assert compose.get_events(run.id) == {"stage": "approved"}

    async def read() -> list:
        return [v async for v in compose.aread_stream(run.id, "values")]

    assert asyncio.run(read()) == [0, 2, 4, -1]


@flow
def silent() -> str:
    return "quiet"


@flow
def closes_then_writes() -> None:
    compose.close_stream("s")
    compose.write_stream("s", 1)


@flow
def unencodable() -> None:
    compose.set_event("bad", object())


def test_ops21_ops22_bad_input(store_kind):
    """Unknown run ids, bad keys, unencodable values, writes outside a flow
    or after close, a stream never written."""
    with pytest.raises(ConfigError, match="no-such-run"):
        compose.get_event("no-such-run", "k", timeout=30)
    with pytest.raises(ConfigError, match="no-such-run"):
        compose.read_stream("no-such-run", "k")
    with pytest.raises(ConfigError, match="no-such-run"):
        compose.get_events("no-such-run")
    run = silent.run()
    assert compose.get_event(run.id, "never", timeout=30, default="d") == "d"
    assert list(compose.read_stream(run.id, "never")) == []
    for bad in ("", 3, None):
        with pytest.raises(ConfigError, match="key"):
            compose.get_event(run.id, bad)
        with pytest.raises(ConfigError, match="key"):
            compose.read_stream(run.id, bad)
    with pytest.raises(ConfigError, match="inside a @flow"):
        compose.set_event("k", 1)
    with pytest.raises(ConfigError, match="inside a @flow"):
        compose.write_stream("k", 1)
    with pytest.raises(ConfigError, match="closed"):
        closes_then_writes()
    with pytest.raises(SerializationError, match="'bad'"):
        unencodable()
    failed = compose.list_runs(name="unencodable")[0]
    assert compose.get_events(failed.id) == {}
    assert not any(k.startswith("set_event") for k, _ in _engine_journal(failed.id))


def _engine_journal(run_id: str) -> list:
    from composeai import _engine

    return _engine.get_store().journal(run_id)


def test_ops22_stream_to_on_a_standalone_agent_and_bad_stream_to(store_kind):
    """A standalone agent call with `stream_to` answers as usual; an empty
    stream name is refused when the agent is declared."""

    @compose.agent(model=FakeModel(["just text"]), stream_to="tokens")
    def plain(x: str) -> str:
        return x

    assert plain("hi") == "just text"
    with pytest.raises(ConfigError, match="stream_to"):
        compose.agent(stream_to="")


def test_ops21_compose_trace_lists_the_events(store_kind, capsys):
    from composeai import cli

    run = publisher.run(1)
    capsys.readouterr()
    assert cli.main(["trace", run.id]) == 0
    out = capsys.readouterr().out
    assert '\nevents:\n  stage = "start"\n' in out


@pytest.fixture(autouse=True)
def registered(isolated_state):
    """The store fixture forgets every flow name; fork() and resume() find
    flows by name."""
    for f in (publisher, silent, closes_then_writes, unencodable):
        flow(f.fn, name=f.name, replace=True)
