"""The `@task` call made in the core (`_core.TaskCall`) keeps every
documented step and span behaviour: a step's value is journaled and
handed back decoded from what was stored (FLOW-17, FLOW-18), a replay runs
no body (FLOW-16), and each step's span is persisted with the fields a
`Span` gives it (OBS-5, OBS-10, OBS-70) -- although a plain task's step
builds no `Span` unless its body reads one. These tests run on SQLite,
where the core path is taken (task spans are read back from the store)."""

from __future__ import annotations

import asyncio
import sqlite3
import traceback

import pytest

import composeai as compose
from composeai import _codec, _core, _engine
from composeai.errors import SerializationError
from composeai.flow import Task


def _rows(sql: str, *params):
    db = sqlite3.connect(_engine.get_store().path)
    try:
        return db.execute(sql, params).fetchall()
    finally:
        db.close()


def test_flow17_a_plain_task_step_runs_in_the_core_and_its_span_is_read_back():
    seen = []

    @compose.task
    def inc(x: int) -> int:
        frame = _engine.FRAME.get()
        seen.append((type(frame), frame.scope, frame.span_built))
        return x + 1

    @compose.flow
    def f(n: int) -> int:
        x = 0
        for _ in range(n):
            x = inc(x)
        return x

    run = f.run(2)
    assert run.output == 2
    # The body ran under the core's frame, whose span nobody built.
    assert seen == [(_core.StepFrame, "inc#1", False), (_core.StepFrame, "inc#2", False)]
    root, *steps = run.trace.spans
    assert [s.attributes for s in steps] == [{"step_key": "inc#1"}, {"step_key": "inc#2"}]
    for i, span in enumerate(steps):
        assert (span.kind, span.name, span.status, span.replayed) == ("task", "inc", "ok", False)
        assert span.parent_span_id == root.span_id and span.trace_id == run.trace.trace_id
        assert span.input == {"args": [i], "kwargs": {}} and span.output == i + 1
        assert span.started_at <= span.ended_at and len(span.span_id) == 26
        assert span.error is None and span.usage is None
    assert steps[0].span_id < steps[1].span_id  # start order


@pytest.mark.sqlite_file
@pytest.mark.parametrize(
    "args",
    [
        (0, -1, 999_999_999_999_999_999, -999_999_999_999_999_999),
        (10**18, -(10**18), 2**70),
        ("plain", 'q"uote\\back', "\n\r\t\b\f\x00\x1f\x7f", ""),
        ("é", "\ud800", "😀"),
        (True, False, None),
        (1.5, [1, "a"], {"k": (1, 2)}),
        (),
    ],
)
def test_obs4_step_input_and_value_are_stored_as_the_codec_writes_them(args):
    @compose.task
    def echo(*a):
        return a[0] if a else None

    @compose.flow
    def f(a: tuple):
        return echo(*a)

    f.run(args)
    (stored,) = _rows("SELECT input_json FROM spans WHERE name = 'echo'")
    assert stored[0] == _codec.dumps_lenient({"args": list(args), "kwargs": {}})
    (value,) = _rows("SELECT value_json FROM journal WHERE step_key = 'echo#1'")
    assert value[0] == _codec.dumps(args[0] if args else None)


@pytest.mark.sqlite_file
def test_obs4_keyword_arguments_are_part_of_the_stored_input():
    @compose.task
    def join(a: str, *, sep: str = "-") -> str:
        return sep.join(a)

    @compose.flow
    def f() -> str:
        return join("ab", sep="+")

    assert f.run().output == "a+b"
    (stored,) = _rows("SELECT input_json FROM spans WHERE name = 'join'")
    assert stored[0] == _codec.dumps_lenient({"args": ["ab"], "kwargs": {"sep": "+"}})


def test_flow18_the_value_handed_back_is_decoded_from_what_was_stored():
    @compose.task
    def pair() -> tuple:
        return (1, [2, 3])

    @compose.task
    def big() -> int:
        return 2**80

    @compose.flow
    def f():
        return pair(), big()

    assert f.run().output == ((1, [2, 3]), 2**80)


def test_obs70_without_content_capture_no_input_or_output_is_stored(monkeypatch):
    monkeypatch.setenv("COMPOSE_TRACE_CONTENT", "0")

    @compose.task
    def inc(x: int) -> int:
        return x + 1

    @compose.flow
    def f() -> int:
        return inc(1)

    run = f.run()
    monkeypatch.delenv("COMPOSE_TRACE_CONTENT")
    (step,) = [s for s in run.trace.spans if s.name == "inc"]
    assert step.input is None and step.output is None and run.output == 2


def test_obs10_a_body_that_reads_its_span_finishes_with_what_it_wrote():
    @compose.task
    def tagged(x: int) -> int:
        span = _engine.FRAME.get().span
        assert span.attributes == {"step_key": "tagged#1"} and span.input == {
            "args": [x],
            "kwargs": {},
        }
        span.attributes["note"] = "kept"
        return x * 2

    @compose.flow
    def f() -> int:
        return tagged(21)

    run = f.run()
    (step,) = [s for s in run.trace.spans if s.name == "tagged"]
    assert step.attributes == {"step_key": "tagged#1", "note": "kept"}
    assert (step.output, step.status, run.output) == (42, "ok", 42)


def test_obs11_a_nested_task_is_a_child_of_the_outer_step_span():
    @compose.task
    def inner(x: int) -> int:
        return x + 1

    @compose.task
    def outer(x: int) -> int:
        return inner(x) * 10

    @compose.flow
    def f() -> int:
        return outer(1)

    run = f.run()
    assert run.output == 20
    by_name = {s.name: s for s in run.trace.spans}
    assert by_name["inner"].parent_span_id == by_name["outer"].span_id
    assert by_name["inner"].attributes == {"step_key": "outer#1/inner#1"}
    done = compose.resume(run.id)
    assert done.output == 20


@pytest.mark.sqlite_file
def test_flow12_a_failing_body_raises_unchanged_and_its_span_is_an_error():
    calls = []

    @compose.task
    def boom(x: int) -> int:
        calls.append(x)
        if len(calls) == 1:
            raise ValueError(f"bad {x}")
        return x

    @compose.flow
    def f() -> int:
        return boom(7)

    with pytest.raises(ValueError, match="bad 7") as info:
        f.run()
    # The traceback still reaches the body's own frame.
    assert traceback.extract_tb(info.value.__traceback__)[-1].name == "boom"
    (run_id,) = _rows("SELECT run_id FROM runs")[0]
    assert _rows("SELECT status FROM spans WHERE name = 'boom'") == [("error",)]
    assert compose.resume(run_id).output == 7
    assert calls == [7, 7]


@pytest.mark.sqlite_file
def test_flow17_an_unencodable_value_fails_the_step_naming_its_key():
    @compose.task
    def opaque():
        return object()

    @compose.flow
    def f():
        return opaque()

    with pytest.raises(SerializationError, match="step 'opaque#1'"):
        f.run()
    assert _rows("SELECT status FROM spans WHERE name = 'opaque'") == [("error",)]
    assert _rows("SELECT count(*) FROM journal") == [(0,)]


def test_flow16_a_replayed_plain_task_runs_no_body_and_its_span_is_replayed():
    calls = []

    @compose.task
    def inc(x: int) -> int:
        calls.append(x)
        return x + 1

    @compose.flow
    def f(n: int) -> int:
        x = 0
        for _ in range(n):
            x = inc(x)
        return x if compose.approve("go") else -1

    first = f.run(3)
    done = compose.resume(first.id, answers={"go": True})
    assert done.output == 3 and calls == [0, 1, 2]
    replayed = [s for s in done.trace.spans if s.replayed]
    assert [s.attributes["step_key"] for s in replayed] == ["inc#1", "inc#2", "inc#3"]
    assert [s.output for s in replayed] == [1, 2, 3]


def test_agent80_a_bus_installed_between_two_steps_sees_the_later_steps():
    """AGENT-80/FLOW-17: the core path is taken step by step, not decided once per flow body:
    steps run after a bus is installed in the body emit their span events, live and replayed."""
    from composeai.events import EventBus, use_bus

    @compose.task
    def inc(x: int) -> int:
        return x + 1

    seen: list[list[str]] = []

    @compose.flow
    def f() -> int:
        x = inc(inc(0))
        bus = EventBus()
        sub = bus.subscribe()
        with use_bus(bus):
            x = inc(x)
        bus.close()
        seen.append([e.data.get("kind") for e in sub if e.kind == "span_started"])
        return x if compose.approve("go") else -1

    first = f.run()
    assert first.status == "paused" and seen == [["task"]]
    done = compose.resume(first.id, answers={"go": True})
    assert done.output == 3 and seen == [["task"], ["task"]]


def test_flow6_a_task_called_outside_a_flow_runs_plainly():
    @compose.task
    def inc(x: int) -> int:
        return x + 1

    assert inc(1) == 2
    assert inc(x=2) == 3


def test_async7_an_async_task_in_a_sync_flow_takes_the_core_path():
    @compose.task
    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    @compose.flow
    def f() -> int:
        return double(4) + double(5)

    run = f.run()
    assert run.output == 18
    assert [s.output for s in run.trace.spans if s.name == "double"] == [8, 10]


def test_flow1_bound_method_tasks_and_the_task_type_are_unchanged():
    class Counter:
        base = 100

        @compose.task
        def add(self, x: int) -> int:
            return self.base + x

    @compose.flow
    def f() -> int:
        return Counter().add(1)

    assert f.run().output == 101
    assert isinstance(Counter.add, Task) and Counter.add.__name__ == "add"
    assert repr(Counter.add) == "<Task 'add'>"
