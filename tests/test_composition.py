"""Running compositions: `pipe`/`>>`, `aggregate`, `map`/`amap` and their runtime boundary
validation (composition.md COMP-3 … COMP-33, with FLOW-15 scopes and BUDGET-2/3)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import pytest
from pydantic import BaseModel

import composeai as compose
from composeai import _engine
from composeai.agentfn import agent
from composeai.combinators import Aggregate, MapResult, Pipeline
from composeai.errors import (
    BudgetExceededError,
    ComposeError,
    CompositionTypeError,
    ConfigError,
    StageTypeError,
    TaskTimeoutError,
)
from composeai.messages import Usage
from composeai.runs import Budget, Run
from composeai.testing import FakeModel, reset_registries
from composeai.tools import tool

ARROW = " → "


@pytest.fixture(autouse=True)
def clean_agent_registry():
    reset_registries()
    yield
    reset_registries()


# --------------------------------------------------------------------------- helpers


class Facts(BaseModel):
    name: str


class Shape(Protocol):
    """Not @runtime_checkable: no validator can be built for it (COMP-31)."""

    def area(self) -> float: ...


def store():
    return _engine.get_store()


def row(run_id: str) -> dict | None:
    return store().get_run(run_id)


def journal(run_id: str) -> dict[str, str]:
    return dict(store().journal(run_id))


def db_path() -> str:
    return os.path.join(_engine.state_dir(), "runs.db")


# The store's own SQLite build shares this process's POSIX file locks, so the database is only
# ever read from a child process (read-only), never through an in-process connection.
_READER = r"""
import json, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], uri=True, timeout=30)
rows = conn.execute(sys.argv[2], json.loads(sys.argv[3])).fetchall()
print(json.dumps([[v.hex() if isinstance(v, bytes) else v for v in r] for r in rows]))
"""


def query(sql: str, params: tuple = ()) -> list[tuple]:
    store().flush()
    if not os.path.exists(db_path()):
        return []
    uri = Path(db_path()).as_uri() + "?mode=ro"
    done = subprocess.run(
        [sys.executable, "-c", _READER, uri, sql, json.dumps(list(params))],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [tuple(r) for r in json.loads(done.stdout)]


def all_runs() -> list[dict]:
    return [row(r[0]) for r in query("SELECT run_id FROM runs ORDER BY created_at, rid")]


TABLES = ("runs", "journal", "spans", "pending_interrupts", "agent_state", "traces")


def table_counts() -> dict[str, int]:
    counts = ", ".join(f"(SELECT COUNT(*) FROM {t})" for t in TABLES)
    return dict(zip(TABLES, query(f"SELECT {counts}")[0]))


def db_spans(trace_id: str) -> list[dict]:
    """Persisted spans of one run's trace, in start order: the run owns its
    trace, whose spans are stored under `tid = -rid`."""
    rows = query(
        "SELECT s.kind, s.name, s.status, s.step_key, s.span_id, s.parent, s.rid, "
        "s.input_json, s.output_json FROM spans s JOIN runs r ON s.tid = -r.rid "
        "WHERE r.trace_id = ? ORDER BY s.started_at, s.sid",
        (trace_id,),
    )
    keys = ["kind", "name", "status", "step_key", "id", "parent", "rid", "input", "output"]
    return [dict(zip(keys, r)) for r in rows]


def children(trace, span) -> list:
    return [s for s in trace.spans if s.parent_span_id == span.span_id]


def only(spans: list, **match) -> Any:
    found = [s for s in spans if all(getattr(s, k) == v for k, v in match.items())]
    assert len(found) == 1, (match, [(s.kind, s.name) for s in spans])
    return found[0]


def root_of(trace):
    (root,) = trace.roots()
    return root


def usage(i: int, o: int) -> Usage:
    return Usage(input_tokens=i, output_tokens=o)


PAUSE_TEXT = (
    "{kind} '{name}' paused on an approval/ask_human interrupt, but a bare {kind}()/aggregate() "
    "isn't resumable -- durable pauses need a @flow as the root. Wrap this call in a @flow "
    "function (so it has a name resume() can look up and a fingerprint it can check) and call "
    "that instead, e.g.:\n\n    @flow\n    def run_it(x):\n        return {name}(x)\n"
)


# --------------------------------------------------------------------------- COMP-3


def test_comp3_fewer_than_two_stages():
    ran = []

    def one(x: str) -> str:
        ran.append(x)
        return x

    with pytest.raises(CompositionTypeError) as info:
        compose.pipe(one)
    assert str(info.value) == "pipe() requires at least 2 stages, got 1"
    with pytest.raises(CompositionTypeError) as info:
        compose.pipe()
    assert str(info.value) == "pipe() requires at least 2 stages, got 0"
    assert ran == []


def test_comp3_mismatch_message_exact_and_raised_before_anything_runs():
    ran = []

    def extract(x: str) -> Facts:
        ran.append("extract")
        return Facts(name=x)

    def shout(x: str) -> str:
        ran.append("shout")
        return x.upper()

    def first(x: str) -> str:
        ran.append("first")
        return x

    with pytest.raises(CompositionTypeError) as info:
        compose.pipe(extract, shout)
    assert (
        str(info.value) == "pipe(): stage 1 (extract) returns Facts but stage 2 (shout) expects str"
    )
    # 1-based positions of the failing pair, after earlier compatible pairs
    with pytest.raises(CompositionTypeError) as info:
        compose.pipe(first, extract, shout)
    assert (
        str(info.value) == "pipe(): stage 2 (extract) returns Facts but stage 3 (shout) expects str"
    )
    assert ran == []


def test_comp3_mismatch_with_agents_names_them_and_no_model_call():
    model = FakeModel(["never"])

    @agent(model=model, name="comp3_writer")
    def writer(topic: str) -> Facts:
        return topic

    def count(n: int) -> int:
        return n

    with pytest.raises(CompositionTypeError) as info:
        writer >> count
    assert (
        str(info.value)
        == "pipe(): stage 1 (comp3_writer) returns Facts but stage 2 (count) expects int"
    )
    with pytest.raises(CompositionTypeError) as info:
        compose.pipe(writer, count)
    assert (
        str(info.value)
        == "pipe(): stage 1 (comp3_writer) returns Facts but stage 2 (count) expects int"
    )
    assert model.requests == []


# --------------------------------------------------------------------------- COMP-5 / COMP-6


def make_agent(name: str, replies: list | None = None, **kwargs):
    model = FakeModel(list(replies or ["reply"]), **kwargs)

    @agent(model=model, name=name)
    def body(x: str) -> str:
        return f"prompt {x}"

    return body, model


def test_comp5_rshift_on_agents_both_directions():
    a, _ = make_agent("comp5_a")

    def pre(x: str) -> str:
        return x

    def post(x: str) -> str:
        return x

    p1 = a >> post
    assert isinstance(p1, Pipeline)
    assert p1.stages == (a, post)
    p2 = pre >> a  # __rrshift__
    assert isinstance(p2, Pipeline)
    assert p2.stages == (pre, a)
    b, _ = make_agent("comp5_b")
    p3 = a >> b
    assert p3.stages == (a, b)


def test_comp5_flattening_either_associativity():
    a, _ = make_agent("comp5_flat_a")
    b, _ = make_agent("comp5_flat_b")

    def c(x: str) -> str:
        return x

    def z(x: str) -> str:
        return x

    left = (a >> b) >> c
    right = a >> (b >> c)
    assert len(left.stages) == 3
    assert len(right.stages) == 3
    assert left.stages == right.stages == (a, b, c)
    # a plain callable on the left of a pipeline is flattened too (__rrshift__)
    assert (z >> (a >> c)).stages == (z, a, c)
    # pipeline >> pipeline flattens; pipe() keeps a pipeline as one nested stage (COMP-1)
    assert ((a >> c) >> (b >> z)).stages == (a, c, b, z)
    first, second = a >> c, b >> z
    assert compose.pipe(first, second).stages == (first, second)
    inner = compose.pipe(z, a)
    assert compose.pipe(inner, c).stages == (inner, c)
    assert left.name == f"pipe(comp5_flat_a{ARROW}comp5_flat_b{ARROW}c)"


def test_comp5_aggregate_operands_are_not_flattened():
    def up(x: str) -> str:
        return x.upper()

    def low(x: str) -> str:
        return x.lower()

    def merge(d: dict) -> str:
        return d["u"] + d["l"]

    def pre(x: str) -> str:
        return x

    agg = compose.aggregate(u=up, l=low)
    assert isinstance(agg, Aggregate)
    p = agg >> merge
    assert isinstance(p, Pipeline)
    assert p.stages == (agg, merge)
    q = pre >> agg  # __rrshift__
    assert q.stages == (pre, agg)
    r = pre >> agg >> merge
    assert r.stages == (pre, agg, merge)
    assert r.name == f"pipe(pre{ARROW}aggregate(u, l){ARROW}merge)"
    assert r("Ab") == "ABab"


def test_comp5_rshift_mismatch_is_the_pipe_error():
    def extract(x: str) -> Facts:
        return Facts(name=x)

    def shout(x: str) -> str:
        return x

    agg = compose.aggregate(a=shout)
    with pytest.raises(CompositionTypeError) as info:
        agg >> shout  # aggregate output is dict
    assert str(info.value) == (
        "pipe(): stage 1 (aggregate(a)) returns dict but stage 2 (shout) expects str"
    )
    p = compose.pipe(shout, extract)
    with pytest.raises(CompositionTypeError) as info:
        p >> shout
    assert str(info.value) == (
        "pipe(): stage 2 (extract) returns Facts but stage 3 (shout) expects str"
    )


def test_comp6_names_and_types():
    def extract(x: str) -> Facts:
        return Facts(name=x)

    def describe(f: Facts) -> int:
        return len(f.name)

    @compose.task
    def loud(x: int) -> str:
        return str(x)

    p = compose.pipe(extract, describe, loud, lambda s: s)
    assert p.name == "pipe(extract → describe → loud → <lambda>)"
    assert p.name == f"pipe(extract{ARROW}describe{ARROW}loud{ARROW}<lambda>)"
    assert p.input_type is str
    assert p.output_type is Any
    assert compose.pipe(extract, describe).output_type is int
    outer = compose.pipe(extract, compose.aggregate(d=describe))
    assert outer.name == "pipe(extract → aggregate(d))"
    assert outer.output_type is dict


# --------------------------------------------------------------------------- COMP-10 / COMP-11


@pytest.mark.sqlite_file
def test_comp11_pipe_run_creates_a_row():
    def extract(x: str) -> Facts:
        return Facts(name=x)

    def describe(f: Facts) -> str:
        return f"name={f.name}"

    p = compose.pipe(extract, describe)
    result = p.run("ada")
    assert isinstance(result, Run)
    assert result.status == "completed"
    assert result.output == "name=ada"
    r = row(result.id)
    assert r is not None
    assert r["kind"] == "pipe"
    assert r["name"] == "pipe(extract → describe)"
    assert r["status"] == "completed"
    assert r["fingerprint"] is None
    assert r["args_json"] is None
    assert r["budget_json"] is None
    assert json.loads(r["output_json"]) == "name=ada"
    assert r["trace_id"] == result.trace.trace_id
    assert [x["run_id"] for x in all_runs()] == [result.id]
    root = root_of(result.trace)
    assert (root.kind, root.name, root.status) == ("pipe", p.name, "ok")
    # every span persisted under the run
    spans = db_spans(result.trace.trace_id)
    assert spans[0]["kind"] == "pipe" and spans[0]["parent"] is None
    assert {s["name"] for s in spans} == {p.name, "extract", "describe"}


def test_comp11_aggregate_run_creates_a_row():
    def a(x: int) -> int:
        return x + 1

    def b(x: int) -> int:
        return x * 2

    agg = compose.aggregate(a=a, b=b)
    result = agg.run(5)
    assert result.status == "completed"
    assert result.output == {"a": 6, "b": 10}
    r = row(result.id)
    assert r["kind"] == "aggregate"
    assert r["name"] == "aggregate(a, b)"
    assert r["status"] == "completed"
    assert (r["fingerprint"], r["args_json"], r["budget_json"]) == (None, None, None)
    assert json.loads(r["output_json"]) == {"a": 6, "b": 10}
    root = root_of(result.trace)
    assert (root.kind, root.name) == ("aggregate", "aggregate(a, b)")


@pytest.mark.sqlite_file
def test_comp11_failure_marks_the_row_failed_and_reraises_the_same_exception():
    boom = ValueError("stage two broke")

    def one(x: str) -> str:
        return x

    def two(x: str) -> str:
        raise boom

    p = compose.pipe(one, two)
    with pytest.raises(ValueError) as info:
        p.run("x")
    assert info.value is boom
    (r,) = all_runs()
    assert r["kind"] == "pipe"
    assert r["status"] == "failed"
    assert json.loads(r["error_json"]) == {"type": "ValueError", "message": "stage two broke"}

    agg = compose.aggregate(ok=one, bad=two)
    with pytest.raises(ValueError) as info:
        agg.run("x")
    assert info.value is boom
    r = all_runs()[-1]
    assert (r["kind"], r["status"]) == ("aggregate", "failed")
    assert json.loads(r["error_json"])["message"] == "stage two broke"

    # the async twins settle the same way (ASYNC-2)
    with pytest.raises(ValueError) as info:
        asyncio.run(p.arun("x"))
    assert info.value is boom
    with pytest.raises(ValueError) as info:
        asyncio.run(agg.arun("x"))
    assert info.value is boom
    assert [(r["kind"], r["status"]) for r in all_runs()] == [
        ("pipe", "failed"),
        ("aggregate", "failed"),
        ("pipe", "failed"),
        ("aggregate", "failed"),
    ]


@pytest.mark.sqlite_file
def test_comp11_run_budget_applies_to_the_pipe_root_but_is_not_stored():
    a, _ = make_agent("comp11_budget_agent", ["one"])  # default usage 10 + 20

    def post(x: str) -> str:
        return x

    p = a >> post
    with pytest.raises(BudgetExceededError) as info:
        p.run("x", budget=Budget(tokens=5))
    assert str(info.value) == f"budget exceeded on pipe '{p.name}': tokens budget=5, used=30"
    (r,) = all_runs()
    assert r["status"] == "failed"
    assert r["budget_json"] is None  # BUDGET-7: pipe/aggregate rows store none
    # positionally as 2nd argument too (BUDGET-2)
    b, _ = make_agent("comp11_budget_agent2", ["two"])
    agg = compose.aggregate(only=b)
    with pytest.raises(BudgetExceededError) as info:
        agg.run("x", Budget(tokens=5))
    assert (
        str(info.value)
        == "budget exceeded on aggregate 'aggregate(only)': tokens budget=5, used=30"
    )


@pytest.mark.sqlite_file
def test_comp11_sugar_with_nothing_active_is_run_output():
    def one(x: int) -> int:
        return x + 1

    def two(x: int) -> int:
        return x * 10

    p = compose.pipe(one, two)
    assert p(1) == 20
    (r,) = all_runs()
    assert (r["kind"], r["status"], r["name"]) == ("pipe", "completed", p.name)
    agg = compose.aggregate(one=one, two=two)
    assert agg(2) == {"one": 3, "two": 20}
    assert all_runs()[-1]["kind"] == "aggregate"


@pytest.mark.sqlite_file
def test_comp11_run_inside_a_flow_is_an_independent_run():
    def one(x: int) -> int:
        return x + 1

    def two(x: int) -> int:
        return x * 10

    p = compose.pipe(one, two)
    agg = compose.aggregate(one=one)
    seen = {}

    @compose.flow
    def outer(x: int) -> int:
        inner = p.run(x)
        inner_agg = agg.run(x)
        seen["pipe"] = inner
        seen["agg"] = inner_agg
        return inner.output

    result = outer.run(1)
    assert result.output == 20
    inner, inner_agg = seen["pipe"], seen["agg"]
    assert inner.id != result.id
    assert inner.trace.trace_id != result.trace.trace_id
    assert inner_agg.trace.trace_id not in (result.trace.trace_id, inner.trace.trace_id)
    kinds = sorted((r["kind"], r["status"]) for r in all_runs())
    assert kinds == [("aggregate", "completed"), ("flow", "completed"), ("pipe", "completed")]
    assert row(inner.id)["trace_id"] == inner.trace.trace_id
    # the flow's trace holds no pipe span; the pipe's trace is rooted at its own pipe span
    assert not [s for s in result.trace.spans if s.kind in ("pipe", "aggregate")]
    assert root_of(inner.trace).kind == "pipe"
    assert db_spans(inner.trace.trace_id)[0]["kind"] == "pipe"
    assert journal(result.id) == {}


# --------------------------------------------------------------------------- COMP-12


@pytest.mark.sqlite_file
def test_comp12_pause_in_a_bare_pipe_deletes_everything_and_raises():
    calls = []

    @compose.task
    def prepare(x: str) -> str:
        calls.append("prepare")
        return x + "!"

    a, model = make_agent("comp12_agent", ["drafted"])

    def gate(x: str) -> str:
        calls.append("gate")
        compose.approve("publish", payload={"draft": x})
        return x

    p = compose.pipe(prepare, a, gate)
    with pytest.raises(ConfigError) as info:
        p.run("x")
    expected = PAUSE_TEXT.format(kind="pipe", name=p.name)
    assert str(info.value) == expected
    assert str(info.value).endswith("\n")
    assert calls == ["prepare", "gate"]
    assert len(model.requests) == 1
    # the row and all its rows are gone from every table
    assert table_counts() == {
        "runs": 0,
        "journal": 0,
        "spans": 0,
        "pending_interrupts": 0,
        "agent_state": 0,
        "traces": 0,
    }
    # the sugar raises the same
    with pytest.raises(ConfigError) as info:
        compose.pipe(lambda x: x, gate)("y")
    assert str(info.value) == PAUSE_TEXT.format(kind="pipe", name=f"pipe(<lambda>{ARROW}gate)")
    assert table_counts()["runs"] == 0


@pytest.mark.sqlite_file
def test_comp12_pause_in_a_bare_aggregate_deletes_everything_and_raises():
    @compose.task
    def fine(x: str) -> str:
        return x

    def asks(x: str) -> str:
        return compose.ask_human("who", "Who?")

    agg = compose.aggregate(fine=fine, asks=asks)
    with pytest.raises(ConfigError) as info:
        agg.run("x")
    assert str(info.value) == PAUSE_TEXT.format(kind="aggregate", name="aggregate(fine, asks)")
    assert table_counts()["runs"] == 0
    assert table_counts()["journal"] == 0
    assert table_counts()["spans"] == 0
    assert table_counts()["pending_interrupts"] == 0


@pytest.mark.sqlite_file
def test_comp12_pause_of_an_approval_gated_tool_deletes_agent_state_too():
    sent = []

    @tool(requires_approval=True)
    def send(to: str) -> str:
        """Send a message."""
        sent.append(to)
        return "sent"

    model = FakeModel(
        [{"tool_calls": [{"name": "send", "arguments": {"to": "bob"}, "id": "c1"}]}, "done"]
    )

    @agent(model=model, tools=[send], name="comp12_mailer")
    def mailer(x: str) -> str:
        return x

    @compose.task
    def prep(x: str) -> str:
        return x

    p = compose.pipe(prep, mailer)
    with pytest.raises(ConfigError) as info:
        p.run("hi")
    assert str(info.value) == PAUSE_TEXT.format(kind="pipe", name=p.name)
    assert sent == []
    assert table_counts() == {
        "runs": 0,
        "journal": 0,
        "spans": 0,
        "pending_interrupts": 0,
        "agent_state": 0,
        "traces": 0,
    }


@pytest.mark.sqlite_file
def test_comp12_pause_in_pipe_arun_is_refused_the_same_way():
    def gate(x: str) -> str:
        compose.approve("g")
        return x

    p = compose.pipe(str.strip, gate)

    async def main():
        return await p.arun(" x ")

    with pytest.raises(ConfigError) as info:
        asyncio.run(main())
    assert str(info.value) == PAUSE_TEXT.format(kind="pipe", name=p.name)
    assert table_counts()["runs"] == 0


# --------------------------------------------------------------------------- COMP-13


@pytest.mark.sqlite_file
def test_comp13_adoption_in_a_flow_is_a_span_with_rolled_up_usage_and_no_row():
    a, _ = make_agent("comp13_agent", ["drafted"], usage=usage(3, 4))

    def post(x: str) -> str:
        return x.upper()

    p = a >> post

    @compose.flow
    def wrapper(x: str) -> str:
        return p(x)

    result = wrapper.run("topic")
    assert result.status == "completed"
    assert result.output == "DRAFTED"
    assert [r["kind"] for r in all_runs()] == ["flow"]
    root = root_of(result.trace)
    assert root.kind == "flow"
    pipe_span = only(result.trace.spans, kind="pipe")
    assert pipe_span.parent_span_id == root.span_id
    assert pipe_span.name == p.name
    assert pipe_span.trace_id == result.trace.trace_id
    agent_span = only(result.trace.spans, kind="agent")
    assert agent_span.parent_span_id == pipe_span.span_id
    # usage rolled up into the flow's run
    assert (result.usage.input_tokens, result.usage.output_tokens) == (3, 4)
    # the agent stage journals as a flow step (AGENT-51); the pipe itself has no entry
    assert set(journal(result.id)) == {"comp13_agent#1"}
    persisted = db_spans(result.trace.trace_id)
    assert [s["kind"] for s in persisted].count("pipe") == 1
    assert {s["rid"] for s in persisted} == {persisted[0]["rid"]}


@pytest.mark.sqlite_file
def test_comp13_aggregate_adoption_in_a_flow():
    def a(x: int) -> int:
        return x + 1

    def b(x: int) -> int:
        return x - 1

    agg = compose.aggregate(a=a, b=b)

    @compose.flow
    def wrapper(x: int) -> dict:
        return agg(x)

    result = wrapper.run(10)
    assert result.output == {"a": 11, "b": 9}
    assert [r["kind"] for r in all_runs()] == ["flow"]
    span = only(result.trace.spans, kind="aggregate")
    assert span.parent_span_id == root_of(result.trace).span_id


@pytest.mark.sqlite_file
def test_comp13_adoption_under_a_task_span_outside_any_flow():
    def one(x: int) -> int:
        return x + 1

    def two(x: int) -> int:
        return x * 2

    p = compose.pipe(one, two)

    @compose.task
    def host(x: int) -> int:
        return p(x)

    assert host(3) == 8
    # nothing durable: no row at all, the pipe span nested under the task span
    assert all_runs() == []
    spans = query("SELECT kind, name, rid, span_id, parent FROM spans ORDER BY started_at, sid")
    kinds = [(k, n) for k, n, *_ in spans]
    assert kinds[0] == ("task", "host")
    assert ("pipe", p.name) in kinds
    by_id = {s[3]: s for s in spans}
    pipe_row = next(s for s in spans if s[0] == "pipe")
    assert by_id[pipe_row[4]][1] == "host"
    assert all(s[2] is None for s in spans)


@pytest.mark.sqlite_file
def test_comp13_enclosing_flow_budget_trips_inside_an_adopted_pipe():
    a, _ = make_agent("comp13_budget_a", ["one", "two"])  # 10 + 20 per call
    b, model_b = make_agent("comp13_budget_b", ["never"])

    p = a >> b

    @compose.flow
    def capped(x: str) -> str:
        return p(x)

    with pytest.raises(BudgetExceededError) as info:
        capped.run("x", budget=Budget(tokens=25))
    assert str(info.value) == "budget exceeded on flow 'capped': tokens budget=25, used=30"
    (r,) = all_runs()
    assert (r["kind"], r["status"]) == ("flow", "failed")
    assert model_b.requests == []


def test_comp13_enclosing_budget_trips_inside_an_adopted_aggregate_arun():
    a, _ = make_agent("comp13_budget_agg", ["one"])

    agg = compose.aggregate(a=a)

    @compose.flow
    async def capped(x: str) -> dict:
        return (await agg.arun(x)).output

    async def main():
        return await capped.arun("x", budget=Budget(tokens=10))

    with pytest.raises(BudgetExceededError) as info:
        asyncio.run(main())
    assert str(info.value) == "budget exceeded on flow 'capped': tokens budget=10, used=30"


@pytest.mark.sqlite_file
def test_comp13_pause_in_an_adopted_pipe_propagates_and_resumes_through_the_flow():
    counts = {"first": 0, "middle": 0, "last": 0}

    @compose.task
    def first(x: str) -> str:
        counts["first"] += 1
        return x + "-1"

    def middle(x: str) -> str:
        counts["middle"] += 1
        if not compose.approve("mid", payload=x):
            raise RuntimeError("denied")
        return x + "-2"

    @compose.task
    def last(x: str) -> str:
        counts["last"] += 1
        return x + "-3"

    p = compose.pipe(first, middle, last)

    @compose.flow
    def wrapper(x: str) -> str:
        return p(x)

    paused = wrapper.run("go")
    assert paused.status == "paused"
    assert paused.pending.id == "mid"
    assert paused.pending.payload == "go-1"
    assert row(paused.id)["status"] == "paused"
    assert counts == {"first": 1, "middle": 1, "last": 0}
    assert set(journal(paused.id)) == {"first#1"}
    pipe_span = only(paused.trace.spans, kind="pipe")
    assert pipe_span.status == "paused"

    done = compose.resume(paused.id, answers={"mid": True})
    assert done.status == "completed"
    assert done.output == "go-1-2-3"
    assert done.id == paused.id
    assert counts == {"first": 1, "middle": 2, "last": 1}
    assert set(journal(paused.id)) == {"first#1", "last#1", "__interrupt__:mid"}
    replayed = only(done.trace.spans, kind="task", name="first", replayed=True)
    assert replayed.attributes["step_key"] == "first#1"
    assert [r["kind"] for r in all_runs()] == ["flow"]


def test_comp13_pause_in_an_adopted_aggregate_propagates_to_the_flow():
    @compose.task
    def side(x: str) -> str:
        return x

    def gate(x: str) -> str:
        return "ok" if compose.approve("agg-gate") else "no"

    agg = compose.aggregate(side=side, gate=gate)

    @compose.flow
    def wrapper(x: str) -> dict:
        return agg(x)

    paused = wrapper.run("v")
    assert paused.status == "paused"
    assert paused.pending.id == "agg-gate"
    done = compose.resume(paused.id, answers={"agg-gate": True})
    assert done.output == {"side": "v", "gate": "ok"}


@pytest.mark.sqlite_file
def test_comp13_nested_arun_returns_a_completed_run_with_a_fresh_id():
    a, _ = make_agent("comp13_arun_agent", ["text", "text"], usage=usage(2, 5))

    def post(x: str) -> str:
        return x + "!"

    p = a >> post
    agg = compose.aggregate(p=p)
    seen: dict[str, Any] = {}

    @compose.flow
    async def wrapper(x: str) -> str:
        r = await p.arun(x)
        r2 = await agg.arun(x)
        seen["r"], seen["r2"] = r, r2
        return r.output

    async def main():
        return await wrapper.arun("x")

    outer = asyncio.run(main())
    assert outer.status == "completed"
    r, r2 = seen["r"], seen["r2"]
    assert isinstance(r, Run)
    assert r.status == "completed"
    assert r.output == "text!"
    assert r.messages == []
    assert r.id != outer.id and len(r.id) == 26
    assert r2.id not in (r.id, outer.id)
    assert (r.usage.input_tokens, r.usage.output_tokens) == (2, 5)
    assert r2.status == "completed"
    assert [x["kind"] for x in all_runs()] == ["flow"]
    assert len([s for s in outer.trace.spans if s.kind == "pipe"]) == 2  # one inside the agg


def test_comp13_nested_arun_and_astream_refuse_budget():
    def one(x: str) -> str:
        return x

    def two(x: str) -> str:
        return x

    p = compose.pipe(one, two)
    agg = compose.aggregate(one=one)
    errors: dict[str, str] = {}

    @compose.flow
    async def wrapper(x: str) -> str:
        for label, call in (
            ("pipe.arun", lambda: p.arun(x, budget=Budget(tokens=1))),
            ("agg.arun", lambda: agg.arun(x, budget=Budget(tokens=1))),
        ):
            try:
                await call()
            except ConfigError as exc:
                errors[label] = str(exc)
        for label, obj in (("pipe.astream", p), ("agg.astream", agg)):
            try:
                stream = obj.astream(x, budget=Budget(tokens=1))
                await stream.run()
            except ConfigError as exc:
                errors[label] = str(exc)
        return "ok"

    assert asyncio.run(wrapper.arun("x")).output == "ok"
    pipe_msg = (
        f"pipe '{p.name}': budget= is not supported on a nested arun()/astream() call (the "
        "enclosing run's budget governs); set it on the outer run"
    )
    agg_msg = (
        "aggregate 'aggregate(one)': budget= is not supported on a nested arun()/astream() call "
        "(the enclosing run's budget governs); set it on the outer run"
    )
    assert errors == {
        "pipe.arun": pipe_msg,
        "agg.arun": agg_msg,
        "pipe.astream": pipe_msg,
        "agg.astream": agg_msg,
    }


def test_comp13_arun_with_nothing_active_is_an_independent_run():
    def one(x: int) -> int:
        return x + 1

    def two(x: int) -> int:
        return x * 3

    p = compose.pipe(one, two)

    async def main():
        return await p.arun(1, budget=Budget(tokens=100))

    result = asyncio.run(main())
    assert result.status == "completed"
    assert result.output == 6
    r = row(result.id)
    assert (r["kind"], r["name"], r["status"], r["budget_json"]) == (
        "pipe",
        p.name,
        "completed",
        None,
    )


# --------------------------------------------------------------------------- COMP-14


@pytest.mark.sqlite_file
def test_comp14_sync_sugar_inside_an_async_flow_driven_by_run_raises():
    def one(x: int) -> int:
        return x

    def two(x: int) -> int:
        return x

    p = compose.pipe(one, two)
    agg = compose.aggregate(one=one)
    messages = []

    @compose.flow
    async def body(x: int) -> int:
        for obj in (p, agg):
            try:
                obj(x)
            except RuntimeError as exc:
                messages.append(str(exc))
        return (await p.arun(x)).output

    result = body.run(4)
    assert result.status == "completed"
    assert result.output == 4
    assert messages == ["composeai runtime cannot be re-entered from its own loop thread"] * 2

    @compose.flow(name="comp14_uncaught")
    async def uncaught(x: int) -> int:
        return p(x)

    with pytest.raises(RuntimeError) as info:
        uncaught.run(1)
    assert str(info.value) == "composeai runtime cannot be re-entered from its own loop thread"
    assert all_runs()[-1]["status"] == "failed"


# --------------------------------------------------------------------------- COMP-15 / COMP-16


@pytest.mark.sqlite_file
def test_comp15_plain_callable_stage_gets_a_task_span_with_input_and_output():
    def double(x: int) -> int:
        return x * 2

    class Adder:
        def __call__(self, x: int) -> int:
            return x + 1

    adder = Adder()
    p = compose.pipe(double, adder, lambda x: x - 1)
    result = p.run(5)
    assert result.output == 10
    root = root_of(result.trace)
    kids = children(result.trace, root)
    assert [(s.kind, s.name) for s in kids] == [
        ("task", "double"),
        ("task", repr(adder)),
        ("task", "<lambda>"),
    ]
    assert [(s.input, s.output) for s in kids] == [(5, 10), (10, 11), (11, 10)]
    assert all(s.status == "ok" for s in kids)
    persisted = [s for s in db_spans(result.trace.trace_id) if s["kind"] == "task"]
    assert [(json.loads(s["input"]), json.loads(s["output"])) for s in persisted] == [
        (5, 10),
        (10, 11),
        (11, 10),
    ]


def test_comp15_task_stage_has_a_wrapper_span_and_its_own_journaled_span():
    @compose.task
    def shout(x: str) -> str:
        return x.upper()

    def pre(x: str) -> str:
        return x

    p = compose.pipe(pre, shout)

    @compose.flow
    def wrapper(x: str) -> str:
        return p(x)

    result = wrapper.run("hi")
    assert result.output == "HI"
    pipe_span = only(result.trace.spans, kind="pipe")
    stage_spans = children(result.trace, pipe_span)
    assert [(s.kind, s.name) for s in stage_spans] == [("task", "pre"), ("task", "shout")]
    wrapper_span = stage_spans[1]
    assert "step_key" not in wrapper_span.attributes
    (inner,) = children(result.trace, wrapper_span)
    assert (inner.kind, inner.name) == ("task", "shout")
    assert inner.attributes["step_key"] == "shout#1"
    assert journal(result.id) == {"shout#1": json.dumps("HI")}
    # in a bare pipe run (its own durable run) the same shape
    bare = p.run("yo")
    w = children(bare.trace, root_of(bare.trace))[1]
    assert [(s.kind, s.name) for s in children(bare.trace, w)] == [("task", "shout")]


def test_comp15_agent_stage_is_an_agent_call_journaled_in_a_flow():
    a, model = make_agent("comp15_agent", ["r1"])

    def pre(x: str) -> str:
        return x + "?"

    p = pre >> a

    @compose.flow
    def wrapper(x: str) -> str:
        return p(x)

    result = wrapper.run("q")
    assert result.output == "r1"
    pipe_span = only(result.trace.spans, kind="pipe")
    kinds = [(s.kind, s.name) for s in children(result.trace, pipe_span)]
    assert kinds == [("task", "pre"), ("agent", "comp15_agent")]
    assert "comp15_agent#1" in journal(result.id)
    assert model.requests[0].messages[0].text == "prompt q?"
    # replay: the agent is not called again
    again = compose.resume(result.id)
    assert again.status == "completed"
    assert len(model.requests) == 1


def test_comp15_nested_pipeline_and_aggregate_stages_nest_spans():
    def a(x: int) -> int:
        return x + 1

    def b(x: int) -> int:
        return x * 2

    agg = compose.aggregate(b=b, c=a)

    def merge(d: dict) -> int:
        return d["b"] + d["c"]

    inner = compose.pipe(a, b)
    outer = compose.pipe(agg, merge)
    # inner nested as a stage through pipe() would flatten; nest it inside an aggregate branch
    top = compose.aggregate(inner=inner, outer=outer)
    result = top.run(1)
    assert result.output == {"inner": 4, "outer": 4}
    root = root_of(result.trace)
    kids = children(result.trace, root)
    assert sorted((s.kind, s.name) for s in kids) == sorted(
        [("pipe", inner.name), ("pipe", outer.name)]
    )
    outer_span = only(kids, name=outer.name)
    agg_span = only(children(result.trace, outer_span), kind="aggregate")
    assert agg_span.name == "aggregate(b, c)"
    assert sorted(s.name for s in children(result.trace, agg_span)) == ["a", "b"]


@pytest.mark.sqlite_file
def test_comp16_boundaries_pipeline_input_and_stage_handoff():
    def first(x: int) -> Any:
        return "not an int"

    def second(x: int) -> int:
        return x

    p = compose.pipe(first, second)
    with pytest.raises(StageTypeError) as info:
        p.run("nope")
    assert str(info.value).startswith(
        "pipeline input: stage 'first' expected int but got an incompatible value -- "
    )
    with pytest.raises(StageTypeError) as info:
        p.run(1)
    assert str(info.value).startswith(
        "stage handoff: stage 'second' expected int but got an incompatible value -- "
    )
    assert [r["status"] for r in all_runs()] == ["failed", "failed"]


def test_comp16_stages_run_sequentially():
    events = []

    def s1(x: int) -> int:
        events.append(("start", 1))
        time.sleep(0.02)
        events.append(("end", 1))
        return x

    def s2(x: int) -> int:
        events.append(("start", 2))
        events.append(("end", 2))
        return x

    compose.pipe(s1, s2).run(0)
    assert events == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]


# --------------------------------------------------------------------------- COMP-20 / COMP-21


def test_comp20_construction_errors_and_name():
    with pytest.raises(CompositionTypeError) as info:
        compose.aggregate()
    assert str(info.value) == "aggregate() requires at least 1 branch, got 0"
    with pytest.raises(ConfigError) as info:
        compose.aggregate(timeout_per_branch="5", a=str)
    assert str(info.value) == (
        "aggregate(): timeout_per_branch must be a number of seconds, got <class 'str'>"
    )
    with pytest.raises(ConfigError) as info:
        compose.aggregate(timeout_per_branch=[1], a=str)
    assert str(info.value).endswith("got <class 'list'>")
    agg = compose.aggregate(timeout_per_branch=2, zeta=str, alpha=str)
    assert agg.name == "aggregate(zeta, alpha)"
    assert compose.aggregate(timeout_per_branch=0.5, a=str).name == "aggregate(a)"


def test_comp20_input_type_rules():
    def s1(x: str) -> int:
        return 1

    def s2(x: str) -> str:
        return x

    def i1(x: int) -> int:
        return x

    assert compose.aggregate(a=s1, b=s2).input_type is str
    assert compose.aggregate(a=s1, b=i1).input_type is Any  # never an error
    assert compose.aggregate(a=s1, b=lambda x: x).input_type is Any
    assert compose.aggregate(a=s1).output_type is dict
    assert compose.aggregate(a=s1, b=i1).output_type is dict


def test_comp21_result_in_declaration_order():
    def slow(x: int) -> str:
        time.sleep(0.05)
        return "slow"

    def fast(x: int) -> str:
        return "fast"

    result = compose.aggregate(z_slow=slow, a_fast=fast, m=lambda x: x)(1)
    assert list(result) == ["z_slow", "a_fast", "m"]
    assert result == {"z_slow": "slow", "a_fast": "fast", "m": 1}


def test_comp21_branches_run_concurrently():
    barrier = threading.Barrier(2, timeout=30)

    def left(x: int) -> str:
        barrier.wait()
        return "L"

    def right(x: int) -> str:
        barrier.wait()
        return "R"

    agg = compose.aggregate(left=left, right=right)
    assert agg(0) == {"left": "L", "right": "R"}

    async def main():
        return await agg.arun(0)

    assert asyncio.run(main()).output == {"left": "L", "right": "R"}


def test_comp21_first_failure_in_declaration_order_after_all_settle():
    settled = []
    second_failed = threading.Event()
    first_exc = KeyError("first")

    def first(x: int) -> int:
        second_failed.wait(30)  # fail after the later branch already failed
        settled.append("first")
        raise first_exc

    def second(x: int) -> int:
        settled.append("second")
        second_failed.set()
        raise ValueError("second")

    def slow(x: int) -> int:
        time.sleep(0.1)
        settled.append("slow")
        return x

    agg = compose.aggregate(first=first, second=second, slow=slow)
    with pytest.raises(KeyError) as info:
        agg(1)
    assert info.value is first_exc
    assert sorted(settled) == ["first", "second", "slow"]


def test_comp21_first_failure_in_declaration_order_async():
    first_exc = KeyError("first")
    settled = []

    async def first(x: int) -> int:
        await asyncio.sleep(0.05)
        settled.append("first")
        raise first_exc

    async def second(x: int) -> int:
        settled.append("second")
        raise ValueError("second")

    async def slow(x: int) -> int:
        await asyncio.sleep(0.1)
        settled.append("slow")
        return x

    agg = compose.aggregate(first=first, second=second, slow=slow)

    async def main():
        return await agg.arun(1)

    with pytest.raises(KeyError) as info:
        asyncio.run(main())
    assert info.value is first_exc
    assert sorted(settled) == ["first", "second", "slow"]


def test_comp21_timeout_per_branch_sync():
    release = threading.Event()

    def slow(x: int) -> int:
        release.wait(30)
        return x

    def fast(x: int) -> int:
        return x

    agg = compose.aggregate(timeout_per_branch=0.2, fast=fast, slow=slow)
    try:
        with pytest.raises(TaskTimeoutError) as info:
            agg(1)
    finally:
        release.set()
    assert str(info.value) == (
        "aggregate branch 'slow' exceeded timeout=0.2s -- the abandoned thread keeps running in "
        "the background as a daemon; its eventual result is discarded, and it loses journal "
        "write access immediately (its pure side effects, if any, still run to completion -- "
        "there is no safe way to stop that)"
    )


def test_comp21_timeout_per_branch_async_cancels_cooperatively():
    cancelled = []

    async def slow(x: int) -> int:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return x

    async def fast(x: int) -> int:
        return x

    agg = compose.aggregate(timeout_per_branch=0.2, fast=fast, slow=slow)

    async def main():
        return await agg.arun(1)

    with pytest.raises(TaskTimeoutError) as info:
        asyncio.run(main())
    assert str(info.value) == (
        "aggregate branch 'slow' exceeded timeout=0.2s (cancelled cooperatively)"
    )
    assert cancelled == [True]


def test_comp21_journal_scope_in_a_flow():
    @compose.task
    def t(x: int) -> int:
        return x + 1

    a, _ = make_agent("comp21_writer", ["w1", "w2"])

    def to_str(x: int) -> str:
        return str(x)

    agg = compose.aggregate(a=t, b=to_str >> a)

    @compose.flow
    def wrapper(x: int) -> list:
        first = agg(x)
        second = agg(x + 1)
        return [first, second]

    result = wrapper.run(1)
    assert result.output == [{"a": 2, "b": "w1"}, {"a": 3, "b": "w2"}]
    assert set(journal(result.id)) == {
        "aggregate#1/a/t#1",
        "aggregate#1/b/comp21_writer#1",
        "aggregate#2/a/t#1",
        "aggregate#2/b/comp21_writer#1",
    }


def test_comp21_pause_order_is_declaration_order():
    def gate_a(x: int) -> int:
        compose.approve("a")
        return 1

    def gate_b(x: int) -> int:
        compose.approve("b")
        return 2

    agg = compose.aggregate(first=gate_a, second=gate_b)

    @compose.flow
    def wrapper(x: int) -> dict:
        return agg(x)

    paused = wrapper.run(0)
    assert paused.pending.id == "a"
    paused2 = compose.resume(paused.id, answers={"a": True})
    assert paused2.pending.id == "b"
    done = compose.resume(paused.id, answers={"b": True})
    assert done.output == {"first": 1, "second": 2}


# --------------------------------------------------------------------------- COMP-22 … COMP-27


def test_comp22_amap_argument_checks():
    async def main():
        with pytest.raises(ConfigError) as info:
            await compose.amap(str, [1], on_error="skip")
        assert str(info.value) == "amap(): on_error must be 'raise' or 'collect', got 'skip'"
        with pytest.raises(ValueError) as info:
            await compose.amap(str, [1], max_workers=0)
        assert str(info.value) == "max_workers must be greater than 0"

    asyncio.run(main())


def test_comp22_map_builds_the_validator_before_dispatch():
    calls = []

    def measure(s: Shape) -> float:
        calls.append(s)
        return 1.0

    with pytest.raises(ConfigError) as info:
        compose.map(measure, [object()])
    assert str(info.value).startswith("stage 'measure' declares input type Shape, which composeai")
    with pytest.raises(ConfigError):
        asyncio.run(compose.amap(measure, [object()]))
    assert calls == []


def test_comp23_item_validation_boundary():
    seen = []

    def square(x: int) -> int:
        seen.append(x)
        return x * x

    with pytest.raises(StageTypeError) as info:
        compose.map(square, [1, "two", 3])
    assert str(info.value).startswith(
        "map item 1: stage 'square' expected int but got an incompatible value -- "
    )
    assert "two" not in seen
    with pytest.raises(StageTypeError) as info:
        asyncio.run(compose.amap(square, [1, 2, 3.5]))
    assert str(info.value).startswith("map item 2: stage 'square' expected int")
    # int widens to float per item (COMP-32)
    assert compose.map(lambda v: v, [1]) == [1]

    def half(x: float) -> float:
        return x / 2

    got = compose.map(half, [3, 4.0])
    assert got == [1.5, 2.0]


def test_comp23_map_item_validation_happens_before_any_llm_call():
    model = FakeModel(["never", "never"])

    @agent(model=model, name="comp23_counter")
    def counter(n: int) -> str:
        return f"count {n}"

    with pytest.raises(StageTypeError) as info:
        compose.map(counter, ["one"])
    assert str(info.value).startswith(
        "map item 0: stage 'comp23_counter' expected int but got an incompatible value -- "
    )
    with pytest.raises(StageTypeError):
        asyncio.run(compose.amap(counter, [True]))
    assert model.requests == []


def test_comp24_agent_and_pipeline_map_fns_use_their_own_spans():
    a, _ = make_agent("comp24_agent", ["x", "y"])

    def up(x: str) -> str:
        return x.upper()

    p = compose.pipe(up, up)

    @compose.flow
    def wrapper(items: list) -> list:
        return [compose.map(a, items), compose.map(p, items), compose.map(up, items)]

    result = wrapper.run(["a", "b"])
    assert result.output == [["x", "y"], ["A", "B"], ["A", "B"]]
    maps = [s for s in result.trace.spans if s.kind == "aggregate"]
    assert [s.name for s in maps] == ["map(comp24_agent)", f"map({p.name})", "map(up)"]
    agent_items = children(result.trace, maps[0])
    assert [(s.kind, s.name) for s in agent_items] == [("agent", "comp24_agent")] * 2
    pipe_items = children(result.trace, maps[1])
    assert [(s.kind, s.name) for s in pipe_items] == [("pipe", p.name)] * 2
    plain_items = children(result.trace, maps[2])
    assert sorted((s.kind, s.name) for s in plain_items) == [("task", "up[0]"), ("task", "up[1]")]
    assert set(journal(result.id)) == {"map#1[0]/comp24_agent#1", "map#1[1]/comp24_agent#1"}


def test_comp24_amap_agent_and_task_spans():
    a, _ = make_agent("comp24_amap_agent", ["x", "y"])

    @compose.task
    def t(x: str) -> str:
        return x * 2

    @compose.flow
    async def wrapper(items: list) -> list:
        return [await compose.amap(a, items), await compose.amap(t, items)]

    result = asyncio.run(wrapper.arun(["a", "b"]))
    assert result.output == [["x", "y"], ["aa", "bb"]]
    maps = [s for s in result.trace.spans if s.kind == "aggregate"]
    assert [s.name for s in maps] == ["map(comp24_amap_agent)", "map(t)"]
    assert [s.kind for s in children(result.trace, maps[0])] == ["agent", "agent"]
    wrappers = children(result.trace, maps[1])
    assert sorted(s.name for s in wrappers) == ["t[0]", "t[1]"]
    for w in wrappers:
        (inner,) = children(result.trace, w)
        assert (inner.kind, inner.name) == ("task", "t")
    assert set(journal(result.id)) == {
        "map#1[0]/comp24_amap_agent#1",
        "map#1[1]/comp24_amap_agent#1",
        "map#2[0]/t#1",
        "map#2[1]/t#1",
    }


def test_comp27_amap_order_and_concurrency():
    started = []
    all_started = None

    async def work(x: int) -> int:
        started.append(x)
        if len(started) == 4:
            all_started.set()
        await asyncio.wait_for(all_started.wait(), 30)
        await asyncio.sleep(0.001 * (4 - x))
        return x * 10

    async def main():
        nonlocal all_started
        all_started = asyncio.Event()
        return await compose.amap(work, [0, 1, 2, 3])

    assert asyncio.run(main()) == [0, 10, 20, 30]
    assert asyncio.run(compose.amap(work, [])) == []


def test_comp27_amap_max_workers():
    state = {"now": 0, "peak": 0}

    async def busy(x: int) -> int:
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        await asyncio.sleep(0.01)
        state["now"] -= 1
        return x

    assert asyncio.run(compose.amap(busy, range(8), max_workers=2)) == list(range(8))
    assert 1 <= state["peak"] <= 2

    lock = threading.Lock()
    sync_state = {"now": 0, "peak": 0}

    def sync_busy(x: int) -> int:
        with lock:
            sync_state["now"] += 1
            sync_state["peak"] = max(sync_state["peak"], sync_state["now"])
        time.sleep(0.01)
        with lock:
            sync_state["now"] -= 1
        return x

    assert asyncio.run(compose.amap(sync_busy, range(6), max_workers=3)) == list(range(6))
    assert 1 <= sync_state["peak"] <= 3


def test_comp27_amap_timeout_per_item_async_is_cooperative():
    cancelled = []

    async def slowish(x: int) -> int:
        if x == 1:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(x)
                raise
        return x

    with pytest.raises(TaskTimeoutError) as info:
        asyncio.run(compose.amap(slowish, [0, 1, 2], timeout_per_item=0.2))
    assert str(info.value) == "@task 'slowish[1]' exceeded timeout=0.2s (cancelled cooperatively)"
    assert cancelled == [1]


def test_comp27_amap_timeout_per_item_sync_fn():
    release = threading.Event()

    def slowish(x: int) -> int:
        if x == 2:
            release.wait(30)
        return x

    try:
        with pytest.raises(TaskTimeoutError) as info:
            asyncio.run(compose.amap(slowish, [0, 1, 2], timeout_per_item=0.2))
    finally:
        release.set()
    assert str(info.value).startswith(
        "@task 'slowish[2]' exceeded timeout=0.2s -- the abandoned thread keeps running"
    )


def test_comp25_amap_collect_and_raise():
    async def work(x: int) -> int:
        if x % 2:
            raise ValueError(f"odd {x}")
        return x

    results = asyncio.run(compose.amap(work, [0, 1, 2, 3], on_error="collect"))
    assert results == [
        MapResult(ok=True, value=0),
        MapResult(ok=False, error="odd 1", error_type="ValueError"),
        MapResult(ok=True, value=2),
        MapResult(ok=False, error="odd 3", error_type="ValueError"),
    ]
    with pytest.raises(ValueError) as info:
        asyncio.run(compose.amap(work, [0, 1, 2, 3]))
    assert str(info.value) == "odd 1"


def test_comp25_collect_never_collects_pauses():
    def gate(x: int) -> int:
        if x == 1:
            compose.approve(f"item-{x}")
        if x == 2:
            raise ValueError("bad")
        return x

    @compose.flow
    def wrapper(items: list) -> list:
        return compose.map(gate, items, on_error="collect")

    paused = wrapper.run([0, 1, 2])
    assert paused.status == "paused"
    assert paused.pending.id == "item-1"
    done = compose.resume(paused.id, answers={"item-1": True})
    assert done.output == [
        MapResult(ok=True, value=0),
        MapResult(ok=True, value=1),
        MapResult(ok=False, error="bad", error_type="ValueError"),
    ]


def test_comp26_map_result_is_public_and_generic():
    assert compose.MapResult is MapResult
    assert MapResult[int](ok=True, value=1).value == 1
    r = MapResult(ok=False)
    assert (r.value, r.error, r.error_type) == (None, None, None)


def test_comp23_map_inside_a_pipe_run_journals_item_scopes_under_the_pipe_row():
    @compose.task
    def inc(x: int) -> int:
        return x + 1

    def fan(xs: list) -> list:
        return compose.map(inc, xs)

    def total(xs: list) -> int:
        return sum(xs)

    result = compose.pipe(fan, total).run([1, 2])
    assert result.output == 5
    assert set(journal(result.id)) == {"map#1[0]/inc#1", "map#1[1]/inc#1"}


# --------------------------------------------------------------------------- COMP-30 … COMP-33


def test_comp33_error_classes():
    assert issubclass(StageTypeError, ComposeError)
    assert issubclass(StageTypeError, TypeError)
    assert issubclass(CompositionTypeError, ComposeError)
    assert issubclass(CompositionTypeError, TypeError)
    assert not issubclass(StageTypeError, CompositionTypeError)
    assert not issubclass(CompositionTypeError, StageTypeError)


def test_comp30_stage_type_error_message_shape():
    def count(n: int) -> int:
        return n

    def first(x: Any) -> Any:
        return x

    p = compose.pipe(first, count)
    with pytest.raises(StageTypeError) as info:
        p("abc")
    text = str(info.value)
    prefix = "stage handoff: stage 'count' expected int but got an incompatible value -- "
    assert text.startswith(prefix)
    pydantic_text = text[len(prefix) :]
    assert pydantic_text.startswith("1 validation error for int")
    assert "Input should be a valid integer" in pydantic_text
    assert "int_type" in pydantic_text


def test_comp32_same_object_passes_through():
    received = []

    class Special(Facts):
        pass

    original = Special(name="s")

    def make(x: Any) -> Any:
        return original

    def take(f: Facts) -> Facts:
        received.append(f)
        return f

    out = compose.pipe(make, take).run(None).output
    assert received[0] is original
    assert out is original
    agg_out = compose.aggregate(t=take)(original)
    assert agg_out["t"] is original
    assert compose.map(take, [original])[0] is original


def test_comp32_dict_is_instantiated_at_the_boundary():
    received = []

    def take(f: Facts) -> str:
        received.append(f)
        return f.name

    def ident(x):
        return x

    assert compose.pipe(ident, take)({"name": "from dict"}) == "from dict"
    assert isinstance(received[0], Facts)


def test_comp32_int_widens_to_float_inside_a_running_pipe():
    received = []

    def ident(x):
        return x

    def half(x: float) -> float:
        received.append(x)
        return x / 2

    assert compose.pipe(ident, half).run(3).output == 1.5
    assert type(received[0]) is float
    assert received[0] == 3.0
    # also at the pipeline input
    assert compose.pipe(half, ident)(5) == 2.5
    assert type(received[1]) is float


@pytest.mark.parametrize(
    ("declared", "value"),
    [(int, "1"), (int, 1.0), (int, True), (float, True), (bool, 1)],
)
def test_comp32_strict_rejections_in_a_running_pipe(declared, value):
    ran = []

    def ident(x):
        return x

    def typed(x):
        ran.append(x)
        return x

    typed.__annotations__ = {"x": declared, "return": declared}
    with pytest.raises(StageTypeError) as info:
        compose.pipe(ident, typed)(value)
    assert str(info.value).startswith(
        f"stage handoff: stage 'typed' expected {declared.__name__} but got an incompatible value"
    )
    assert ran == []


def test_comp32_any_and_unannotated_are_untouched():
    payload = {"not": "validated"}
    received = []

    def any_stage(x: Any) -> Any:
        received.append(x)
        return x

    def bare(x):
        received.append(x)
        return x

    out = compose.pipe(any_stage, bare).run(payload).output
    assert out is payload
    assert received[0] is payload and received[1] is payload
    # a final pipeline output is never validated (entry-only)

    def liar(x: int) -> int:
        return "not an int"  # type: ignore[return-value]

    assert compose.pipe(bare, liar)(1) == "not an int"


@pytest.mark.sqlite_file
def test_comp30_wrong_shape_into_a_pipe_with_an_agent_stage_never_calls_the_model():
    model = FakeModel(["never"])

    @agent(model=model, name="comp30_summarizer")
    def summarizer(f: Facts) -> str:
        return f"summarize {f.name}"

    def loader(x: str) -> Any:
        return {"wrong": "shape"}

    p = compose.pipe(loader, summarizer)
    with pytest.raises(StageTypeError) as info:
        p.run("x")
    assert str(info.value).startswith(
        "stage handoff: stage 'comp30_summarizer' expected Facts but got an incompatible value -- "
    )
    assert model.requests == []
    (r,) = all_runs()
    assert r["status"] == "failed"
    assert json.loads(r["error_json"])["type"] == "StageTypeError"

    # at the pipeline input as well, and in a flow
    p2 = compose.pipe(summarizer, lambda s: s)

    @compose.flow
    def wrapper(x: Any) -> str:
        return p2(x)

    with pytest.raises(StageTypeError) as info:
        wrapper.run(42)
    assert str(info.value).startswith(
        "pipeline input: stage 'comp30_summarizer' expected Facts but got an incompatible value"
    )
    assert model.requests == []


# --------------------------------------------------------------------------- COMP-10/11 streams


def test_comp11_stream_is_an_independent_run_and_emits_run_finished():
    def one(x: int) -> int:
        return x + 1

    def two(x: int) -> int:
        return x * 2

    p = compose.pipe(one, two)
    stream = p.stream(1)
    events = list(stream)
    result = stream.run
    assert result.status == "completed"
    assert result.output == 4
    finished = [e for e in events if e.kind == "run_finished"]
    assert len(finished) == 1
    assert finished[0].data == {"status": "completed"}
    assert finished[0].trace_id == result.trace.trace_id
    assert row(result.id)["kind"] == "pipe"
    started = [e for e in events if e.kind == "span_started"]
    assert started[0].name == p.name

    seen = {}

    @compose.flow
    def outer(x: int) -> int:
        s = p.stream(x)
        seen["run"] = s.run
        return seen["run"].output

    flow_run = outer.run(2)
    assert flow_run.output == 6
    assert seen["run"].id != flow_run.id
    assert row(seen["run"].id)["kind"] == "pipe"


@pytest.mark.sqlite_file
def test_comp11_failed_stream_run_finished_failed():
    def bad(x: int) -> int:
        raise ValueError("nope")

    agg = compose.aggregate(bad=bad)
    stream = agg.stream(1)
    events = []
    with pytest.raises(ValueError):
        events.extend(stream)
    finished = [e for e in events if e.kind == "run_finished"]
    assert [e.data for e in finished] == [{"status": "failed", "error": "ValueError"}]
    (r,) = all_runs()
    assert (r["kind"], r["status"]) == ("aggregate", "failed")


@pytest.mark.sqlite_file
def test_comp10_astream_outside_and_inside_a_flow():
    def one(x: int) -> int:
        return x + 1

    p = compose.pipe(one, one)

    async def top():
        stream = p.astream(1)
        kinds = [e.kind async for e in stream]
        return kinds, await stream.run()

    kinds, result = asyncio.run(top())
    assert result.output == 3
    assert kinds[0] == "span_started"  # subscribed before the engine task started (ASYNC-4)
    assert kinds[-1] == "run_finished"
    assert row(result.id)["kind"] == "pipe"

    @compose.flow
    async def outer(x: int) -> int:
        stream = p.astream(x)
        return (await stream.run()).output

    flow_run = asyncio.run(outer.arun(5))
    assert flow_run.output == 7
    # adopted: no second pipe row, the pipe span is in the flow's trace
    assert sorted(r["kind"] for r in all_runs()) == ["flow", "pipe"]
    assert only(flow_run.trace.spans, kind="pipe").parent_span_id == root_of(flow_run.trace).span_id


# --------------------------------------------------------------------------- COMP-13 in tool bodies


@pytest.mark.sqlite_file
def test_comp13_pipe_called_from_a_tool_body_joins_the_agent_run():
    def one(x: str) -> str:
        return x + "1"

    def two(x: str) -> str:
        return x + "2"

    p = compose.pipe(one, two)

    @tool
    def transform(text: str) -> str:
        """Transform text."""
        return p(text)

    model = FakeModel(
        [{"tool_calls": [{"name": "transform", "arguments": {"text": "t"}, "id": "c1"}]}, "done"]
    )

    @agent(model=model, tools=[transform], name="comp13_tool_agent")
    def helper(x: str) -> str:
        return x

    result = helper.run("go")
    assert result.output == "done"
    assert [r["kind"] for r in all_runs()] == ["agent"]
    tool_span = only(result.trace.spans, kind="tool")
    pipe_span = only(result.trace.spans, kind="pipe")
    assert pipe_span.parent_span_id == tool_span.span_id
    assert pipe_span.trace_id == result.trace.trace_id
    tool_msg = model.requests[1].messages[-1]
    assert tool_msg.parts[0].content == "t12"


# --------------------------------------------------------------------------- timeouts: sync vs async-native


def test_comp21_async_branch_timeout_through_the_sync_facade_is_cooperative():
    cancelled = threading.Event()

    async def slow(x: int) -> int:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return x

    agg = compose.aggregate(timeout_per_branch=0.2, slow=slow)
    with pytest.raises(TaskTimeoutError) as info:
        agg(1)
    assert (
        str(info.value) == "aggregate branch 'slow' exceeded timeout=0.2s (cancelled cooperatively)"
    )
    assert cancelled.wait(10)


def test_comp21_sync_branch_timeout_through_arun_is_abandoned():
    release = threading.Event()

    def slow(x: int) -> int:
        release.wait(30)
        return x

    agg = compose.aggregate(timeout_per_branch=0.2, slow=slow)
    try:
        with pytest.raises(TaskTimeoutError) as info:
            asyncio.run(agg.arun(1))
    finally:
        release.set()
    assert str(info.value).startswith(
        "aggregate branch 'slow' exceeded timeout=0.2s -- the abandoned thread keeps running"
    )


def test_comp23_async_item_timeout_through_sync_map_is_cooperative():
    cancelled = threading.Event()

    async def slow(x: int) -> int:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return x

    with pytest.raises(TaskTimeoutError) as info:
        compose.map(slow, [1], timeout_per_item=0.2)
    assert str(info.value) == "@task 'slow[0]' exceeded timeout=0.2s (cancelled cooperatively)"
    assert cancelled.wait(10)


def test_comp11_pipe_run_usage_is_the_rollup_of_its_llm_spans():
    a, _ = make_agent("comp11_usage_a", ["one"], usage=usage(3, 4))
    b, _ = make_agent("comp11_usage_b", ["two"], usage=usage(5, 6))
    result = (a >> b).run("x")
    assert result.output == "two"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (8, 10)


@pytest.mark.sqlite_file
def test_comp12_pause_through_stream_is_refused_and_leaves_nothing():
    def gate(x: int) -> int:
        compose.approve("s")
        return x

    stream = compose.pipe(gate, gate).stream(1)
    with pytest.raises(ConfigError) as info:
        list(stream)
    assert str(info.value) == PAUSE_TEXT.format(kind="pipe", name=f"pipe(gate{ARROW}gate)")
    assert table_counts() == dict.fromkeys(TABLES, 0)


def test_comp31_pipe_and_aggregate_build_validators_eagerly():
    ran = []

    def first(x: str) -> Any:
        ran.append(x)
        return x

    def measure(s: Shape) -> float:
        ran.append(s)
        return 1.0

    hint_start = (
        "stage 'measure' declares input type Shape, which composeai cannot build a runtime "
    )
    with pytest.raises(ConfigError) as info:
        compose.pipe(first, measure)
    assert str(info.value).startswith(hint_start + "validator for: ")
    assert str(info.value).endswith(
        " -- a Protocol boundary must be decorated @runtime_checkable (so it can be validated by"
        " isinstance); add typing.runtime_checkable, or annotate the parameter Any to opt out of"
        " runtime validation"
    )
    with pytest.raises(ConfigError) as info:
        compose.aggregate(m=measure)
    assert str(info.value).startswith(hint_start)
    assert ran == []


def test_comp15_tool_stages_sync_and_async():
    @tool
    def shout(text: str) -> str:
        """Shout."""
        return text.upper()

    @tool
    async def exclaim(text: str) -> str:
        """Exclaim."""
        await asyncio.sleep(0)
        return text + "!"

    p = compose.pipe(shout, exclaim)
    assert p.name == f"pipe(shout{ARROW}exclaim)"
    assert p.input_type is str
    for result in (p.run("hi"), asyncio.run(p.arun("hi"))):
        assert result.output == "HI!"
        kids = children(result.trace, root_of(result.trace))
        assert [(s.kind, s.name, s.input, s.output) for s in kids] == [
            ("task", "shout", "hi", "HI"),
            ("task", "exclaim", "HI", "HI!"),
        ]
    with pytest.raises(StageTypeError) as info:
        p(5)
    assert str(info.value).startswith("pipeline input: stage 'shout' expected str")
