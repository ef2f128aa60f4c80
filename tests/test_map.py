"""`map()` inside and outside flows (COMP-22 … COMP-27, FLOW-15, FLOW-35)."""

import sqlite3
import threading
import time

import pytest

import composeai as compose
from composeai import _engine
from composeai.errors import ConfigError, TaskTimeoutError


def test_comp22_argument_checks_before_any_work():
    calls = []
    with pytest.raises(ConfigError) as info:
        compose.map(calls.append, [1], on_error="ignore")
    assert str(info.value) == "map(): on_error must be 'raise' or 'collect', got 'ignore'"
    with pytest.raises(ValueError) as info:
        compose.map(calls.append, [1], max_workers=0)
    assert str(info.value) == "max_workers must be greater than 0"
    assert calls == []


def test_comp23_order_is_input_order_and_empty_is_empty():
    def slow_for_small(x):
        time.sleep(0.002 * (5 - x))
        return x * x

    assert compose.map(slow_for_small, range(5)) == [0, 1, 4, 9, 16]
    assert compose.map(slow_for_small, []) == []


def test_comp23_items_run_concurrently_even_when_they_wait_on_each_other():
    barrier = threading.Barrier(12, timeout=10)

    def meet(x):
        barrier.wait()
        return x

    assert compose.map(meet, range(12)) == list(range(12))


def test_comp23_max_workers_bounds_concurrency():
    lock = threading.Lock()
    state = {"now": 0, "peak": 0}

    def busy(x):
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        time.sleep(0.01)
        with lock:
            state["now"] -= 1
        return x

    assert compose.map(busy, range(12), max_workers=3) == list(range(12))
    assert 1 <= state["peak"] <= 3


def test_comp23_timeout_per_item():
    def maybe_slow(x):
        if x == 1:
            time.sleep(1)
        return x

    with pytest.raises(TaskTimeoutError) as info:
        compose.map(maybe_slow, [0, 1, 2], timeout_per_item=0.05)
    assert str(info.value).startswith(
        "@task 'maybe_slow[1]' exceeded timeout=0.05s -- the abandoned"
    )


def test_comp25_raise_reraises_the_first_failure_by_index_after_all_settle():
    settled = []

    def work(x):
        if x in (1, 3):
            raise ValueError(f"bad {x}")
        time.sleep(0.01)
        settled.append(x)
        return x

    with pytest.raises(ValueError) as info:
        compose.map(work, range(5))
    assert str(info.value) == "bad 1"
    assert sorted(settled) == [0, 2, 4]


def test_comp25_collect_returns_map_results():
    def work(x):
        if x == 1:
            raise KeyError("k")
        return x * 2

    results = compose.map(work, [0, 1, 2], on_error="collect")
    assert results == [
        compose.MapResult(ok=True, value=0),
        compose.MapResult(ok=False, error="'k'", error_type="KeyError"),
        compose.MapResult(ok=True, value=4),
    ]


def test_comp26_map_result_journals_as_a_step_value():
    @compose.task
    def collect(xs: list) -> list:
        return compose.map(lambda x: 10 // x, xs, on_error="collect")

    @compose.flow
    def f(xs: list) -> list:
        out = collect(xs)
        compose.approve("go")
        return out

    run = f.run([1, 0])
    done = compose.resume(run.id, answers={"go": True})
    assert done.output[0] == compose.MapResult(ok=True, value=10)
    assert done.output[1].ok is False and done.output[1].error_type == "ZeroDivisionError"


def test_flow15_map_items_journal_per_item_and_replay():
    calls = []

    @compose.task
    def summarize(s: str) -> str:
        calls.append(s)
        return s.upper()

    @compose.flow
    def f(items: list) -> list:
        out = compose.map(summarize, items)
        compose.approve("go")
        return out

    run = f.run(["a", "b", "c"])
    assert sorted(calls) == ["a", "b", "c"]
    journal = dict(_engine.get_store().journal(run.id))
    assert journal == {
        "map#1[0]/summarize#1": '"A"',
        "map#1[1]/summarize#1": '"B"',
        "map#1[2]/summarize#1": '"C"',
    }
    done = compose.resume(run.id, answers={"go": True})
    assert done.output == ["A", "B", "C"] and len(calls) == 3


def test_comp24_spans_of_a_task_map():
    @compose.task
    def tag(x: int) -> int:
        return x

    @compose.flow
    def f() -> list:
        return compose.map(tag, [1, 2])

    run = f.run()
    kinds = sorted((s.kind, s.name) for s in run.trace.spans)
    assert kinds == [
        ("aggregate", "map(tag)"),
        ("flow", "f"),
        ("task", "tag"),
        ("task", "tag"),
        ("task", "tag[0]"),
        ("task", "tag[1]"),
    ]
    by_id = {s.span_id: s for s in run.trace.spans}
    inner = [s for s in run.trace.spans if s.name == "tag"]
    assert {by_id[s.parent_span_id].name for s in inner} == {"tag[0]", "tag[1]"}


def test_flow35_only_the_first_pause_by_index_is_raised():
    @compose.task
    def gate(name: str) -> str:
        return name if compose.approve(name) else "-"

    @compose.flow
    def f() -> list:
        return compose.map(gate, ["b", "a"])

    run = f.run()
    assert run.status == "paused" and run.pending.id == "b"
    second = compose.resume(run.id, answers={"b": True})
    assert second.status == "paused" and second.pending.id == "a"
    done = compose.resume(run.id, answers={"a": True})
    assert done.output == ["b", "a"]


@pytest.mark.sqlite_file
def test_comp23_map_outside_a_run_persists_spans_without_a_run_row():
    compose.map(lambda x: x, [1, 2])
    db = sqlite3.connect(_engine.get_store().path)
    assert db.execute("SELECT count(*) FROM runs").fetchone() == (0,)
    rows = db.execute("SELECT kind, name, rid FROM spans ORDER BY name").fetchall()
    assert rows == [
        ("task", "<lambda>[0]", None),
        ("task", "<lambda>[1]", None),
        ("aggregate", "map(<lambda>)", None),
    ]
