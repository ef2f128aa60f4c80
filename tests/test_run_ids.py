"""OPS-10: idempotent starts under a caller's `run_id=`, on both stores: the same
id, flow and arguments give the one existing run (never a second one, from any
number of processes); other arguments or another flow are a `ConfigError` with
nothing stored; ids outside the alphabet or length are refused; `get_run` and
the CLI accept such ids, an exact id beating a prefix match."""

from __future__ import annotations

import asyncio
import json
import signal

import pytest

import _proc
import composeai as compose
from composeai.cli import main as cli
from composeai.errors import ConfigError

WEBHOOK = """\
import os
import time

import composeai as compose


@compose.task
def charge(order: str, cents: int) -> str:
    side_effect("charge", order)
    time.sleep(float(os.environ.get("HOLD", "0")))
    return f"charged:{order}:{cents}"


@compose.task
def ship(order: str) -> str:
    side_effect("ship", order)
    return f"shipped:{order}"


@compose.flow
def fulfil(order: str, cents: int) -> list:
    return [charge(order, cents), ship(order)]
"""


@pytest.fixture
def box(tmp_path):
    sandbox = _proc.Sandbox(tmp_path)
    sandbox.write_module("hooks", WEBHOOK)
    return sandbox


def _counting_flow(calls: list):
    @compose.task
    def step(x: int) -> int:
        calls.append(x)
        return x * 2

    @compose.flow
    def double(x: int, label: str = "a") -> int:
        return step(x)

    return double


def test_ops10_same_id_returns_the_stored_run_and_executes_nothing(store_kind):
    calls: list = []
    double = _counting_flow(calls)
    first = double.run(21, run_id="order-1")
    again = double.run(21, run_id="order-1")
    assert first.id == again.id == "order-1"
    assert again.status == "completed" and again.output == 42
    assert calls == [21]
    # Keyword order does not make the arguments differ.
    assert double.run(x=21, label="b", run_id="kw").output == 42
    assert double.run(label="b", x=21, run_id="kw").output == 42
    assert calls == [21, 21]
    assert compose.get_run("order-1").status == "completed"


def test_ops10_other_arguments_or_flow_is_a_config_error_and_stores_nothing(store_kind):
    from composeai import _engine

    calls: list = []
    double = _counting_flow(calls)

    @compose.flow
    def other(x: int) -> int:
        return x

    double.run(1, run_id="same")
    with pytest.raises(
        ConfigError, match=r"run 'same' already exists for flow 'double' with other"
    ):
        double.run(2, run_id="same")
    with pytest.raises(ConfigError, match=r"run 'same' already exists for flow 'double', not"):
        other.run(1, run_id="same")
    with pytest.raises(ConfigError, match="other arguments"):
        double.start(2, run_id="same")
    assert calls == [1]
    row = _engine.get_store().get_run("same")
    assert json.loads(row["args_json"]) == {"args": [1], "kwargs": {}}


@pytest.mark.parametrize(
    "bad",
    ["", "x" * 129, "has space", "semi;colon", "caf\u00e9", "new\nline", 7, b"bytes"],
    ids=["empty", "too-long", "space", "semicolon", "non-ascii", "newline", "int", "bytes"],
)
def test_ops10_run_ids_outside_the_alphabet_or_length_are_refused(store_kind, bad):
    from composeai import _engine

    calls: list = []
    double = _counting_flow(calls)
    with pytest.raises(ConfigError, match="run_id"):
        double.run(1, run_id=bad)
    with pytest.raises(ConfigError, match="run_id"):
        double.start(1, run_id=bad)
    assert calls == []
    if isinstance(bad, str) and bad:
        assert _engine.get_store().get_run(bad) is None


def test_ops10_the_whole_alphabet_and_128_characters_are_accepted(store_kind):
    calls: list = []
    double = _counting_flow(calls)
    for run_id in ("aZ09-_.:@/", "x" * 128, "stripe:evt_1N2b/attempt@2"):
        assert double.run(3, run_id=run_id).id == run_id
    assert len(calls) == 3


def test_ops10_start_stream_arun_and_queued_starts_share_the_id(store_kind):
    calls: list = []
    double = _counting_flow(calls)
    handle = double.start(5, run_id="bg")
    assert handle.id == "bg"
    assert handle.result(timeout=60).output == 10
    assert double.start(5, run_id="bg").result(timeout=60).output == 10
    assert double.stream(5, run_id="bg").run.output == 10
    assert asyncio.run(double.arun(5, run_id="bg")).output == 10
    assert calls == [5]

    jobs = compose.Queue("jobs")
    queued = double.start(6, queue=jobs, run_id="q-1")
    assert queued.id == "q-1" and queued.status == "queued"
    assert double.start(6, queue="jobs", run_id="q-1").id == "q-1"
    with pytest.raises(ConfigError, match="other arguments"):
        double.start(7, queue=jobs, run_id="q-1")
    assert calls == [5]


def test_ops10_nested_arun_refuses_run_id(store_kind):
    @compose.flow
    async def inner(x: int) -> int:
        return x

    @compose.flow
    async def outer() -> int:
        return (await inner.arun(1, run_id="nested")).output

    with pytest.raises(ConfigError, match="run_id= is not supported on a nested flow call"):
        asyncio.run(outer.arun())


def test_ops10_webhook_double_start_from_two_processes(box):
    """Two processes receive the same webhook at once: one run, each step executed once,
    both get its output."""
    go = box.root / "go"
    body = f"""
        import os, time
        import hooks
        while not os.path.exists({str(go)!r}):
            time.sleep(0.005)
        run = hooks.fulfil.run("A-7", 1250, run_id="stripe:evt_A-7")
        emit(id=run.id, status=run.status, output=run.output)
    """
    procs = [box.spawn(body, PROC=f"p{i}", HOLD="0.3") for i in range(2)]
    go.write_text("")
    results = [_proc.finish(p).ok() for p in procs]
    expected = {"id": "stripe:evt_A-7", "status": "completed"}
    expected["output"] = ["charged:A-7:1250", "shipped:A-7"]
    assert results == [expected, expected]
    effects = [e[:2] for e in box.side_effects()]
    assert sorted(effects) == [("charge", "A-7"), ("ship", "A-7")]
    assert box.run_ids() == ["stripe:evt_A-7"]


def test_ops10_many_racing_starts_create_one_run(box):
    go = box.root / "go"
    body = f"""
        import os, time
        import hooks
        while not os.path.exists({str(go)!r}):
            time.sleep(0.002)
        handle = hooks.fulfil.start("B-1", 5, run_id="evt-B-1")
        emit(output=handle.result(timeout=100).output)
    """
    procs = [box.spawn(body, PROC=f"p{i}") for i in range(4)]
    go.write_text("")
    outputs = [_proc.finish(p).ok()["output"] for p in procs]
    assert outputs == [["charged:B-1:5", "shipped:B-1"]] * 4
    assert sorted(e[0] for e in box.side_effects()) == ["charge", "ship"]
    assert box.run_ids() == ["evt-B-1"]


def test_ops10_a_dead_holders_run_is_taken_over_by_the_same_start(box):
    """The first process dies (kill -9) inside the run; the retried start continues it:
    the journaled step is not executed again."""
    first = box.spawn(
        """
        import hooks
        hooks.fulfil.run("C-3", 9, run_id="evt-C-3")
        """,
        PROC="first",
        HOLD="60",
    )
    _proc.wait_until(lambda: box.side_effects(), what="the first charge")
    # Killed while `charge` executes: nothing of it is journaled.
    first.send_signal(signal.SIGKILL)
    first.wait()
    retried = box.run(
        """
        import hooks
        run = hooks.fulfil.run("C-3", 9, run_id="evt-C-3")
        emit(status=run.status, output=run.output)
        """,
        PROC="second",
    ).ok()
    assert retried == {"status": "completed", "output": ["charged:C-3:9", "shipped:C-3"]}
    effects = [(e[0], e[-1]) for e in box.side_effects()]
    # The step executing at the kill runs again (at most that one), then the rest once.
    assert effects == [("charge", "first"), ("charge", "second"), ("ship", "second")]
    assert box.run_ids() == ["evt-C-3"]


def test_ops10_cli_and_get_run_accept_such_ids_and_exact_beats_prefix(store_kind, capsys):
    from composeai import _engine

    calls: list = []
    double = _counting_flow(calls)
    double.run(1, run_id="job")
    double.run(2, run_id="job:2026-01-01T00:00:00Z")
    assert compose.get_run("job").status == "completed"
    assert compose.get_run("job:2026-01-01T00:00:00Z").status == "completed"
    store = _engine.get_store()
    exact = store.get_run("job")["trace_id"]
    other = store.get_run("job:2026-01-01T00:00:00Z")["trace_id"]
    # "job" prefixes the other id too: the exact id wins.
    assert cli(["trace", "job"]) == 0
    assert f"trace {exact}" in capsys.readouterr().out
    assert cli(["trace", "job:2026-01-01T00:00:00Z"]) == 0
    assert f"trace {other}" in capsys.readouterr().out
    # A unique prefix still resolves.
    assert cli(["trace", "job:2026"]) == 0
    assert f"trace {other}" in capsys.readouterr().out
    assert cli(["cancel", "job"]) == 1
    assert "completed" in capsys.readouterr().err


def test_ops10_without_run_id_nothing_changes(store_kind):
    calls: list = []
    double = _counting_flow(calls)
    a, b = double.run(1), double.run(1)
    assert a.id != b.id and calls == [1, 1]
    assert len(a.id) == 26
