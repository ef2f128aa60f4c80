"""Budgets: caps, messages, check timing, nesting, cumulative spend across resumes and
overrides (budgets.md BUDGET-1 … BUDGET-9)."""

import asyncio
import json
import os
import sqlite3

import pytest

import composeai as compose
from composeai import _engine
from composeai.agentfn import agent
from composeai.errors import BudgetExceededError, ComposeError, ConfigError
from composeai.messages import Usage
from composeai.runs import Budget
from composeai.testing import FakeModel, reset_registries
from composeai.tools import tool


@pytest.fixture(autouse=True)
def clean_agent_registry():
    reset_registries()
    yield
    reset_registries()


def row(run_id: str) -> dict:
    return _engine.get_store().get_run(run_id)


def only_run_id() -> str:
    db = os.path.join(_engine.state_dir(), "runs.db")
    conn = sqlite3.connect(db)
    try:
        (rid,) = conn.execute("SELECT run_id FROM runs").fetchall()
    finally:
        conn.close()
    return rid[0]


def persisted_llm_spans(run_id: str) -> list[tuple]:
    _engine.get_store().flush()
    db = os.path.join(_engine.state_dir(), "runs.db")
    conn = sqlite3.connect(db)
    try:
        return conn.execute(
            "SELECT s.status, s.input_tokens, s.output_tokens, s.error_json FROM spans s "
            "JOIN runs r ON r.rid = s.rid WHERE r.run_id = ? AND s.kind = 'llm' "
            "ORDER BY s.started_at",
            (run_id,),
        ).fetchall()
    finally:
        conn.close()


def usage(i: int, o: int, cost: float | None = None) -> Usage:
    return Usage(input_tokens=i, output_tokens=o, cost_usd=cost, cost_complete=cost is not None)


def gated_mailer(sent: list):
    @tool(requires_approval=True)
    def send_email(to: str) -> str:
        """Send an email."""
        sent.append(to)
        return "sent"

    return send_email


def calls(name: str, arguments: dict, call_id: str) -> dict:
    return {"tool_calls": [{"name": name, "arguments": arguments, "id": call_id}]}


# --------------------------------------------------------------------------- BUDGET-1


def test_budget1_requires_a_field():
    with pytest.raises(ConfigError) as info:
        Budget()
    assert str(info.value) == "Budget requires at least one of `usd` or `tokens` to be set"
    assert Budget(usd=0.5) == Budget(0.5, None)
    assert Budget(tokens=10).tokens == 10
    assert compose.Budget is Budget
    b = Budget(tokens=1)
    b.tokens = 2  # a plain mutable dataclass
    assert b.tokens == 2


# --------------------------------------------------------------------------- BUDGET-5/6


@pytest.mark.sqlite_file
def test_budget6_tokens_message_and_the_tripping_call_already_happened():
    model = FakeModel(["one", "two"])  # default usage: 10 + 20 tokens

    @agent(model=model)
    def summarizer(x: str) -> str:
        return x

    with pytest.raises(BudgetExceededError) as info:
        summarizer.run("q", budget=Budget(tokens=25))
    assert isinstance(info.value, ComposeError)
    assert str(info.value) == "budget exceeded on agent 'summarizer': tokens budget=25, used=30"
    assert len(model.requests) == 1
    run_id = only_run_id()
    r = row(run_id)
    assert r["status"] == "failed"
    assert json.loads(r["error_json"]) == {
        "type": "BudgetExceededError",
        "message": "budget exceeded on agent 'summarizer': tokens budget=25, used=30",
    }
    assert json.loads(r["budget_json"]) == {"usd": None, "tokens": 25}
    # the call that crossed the line is recorded (and billed) on an errored llm span
    ((status, inp, out, error_json),) = persisted_llm_spans(run_id)
    assert (status, inp, out) == ("error", 10, 20)
    assert json.loads(error_json)["type"] == "BudgetExceededError"


def test_budget6_usd_message_uses_four_decimals_and_str_of_the_cap():
    model = FakeModel(["a"], usage=usage(100, 100, 0.312))

    @agent(model=model)
    def summarizer(x: str) -> str:
        return x

    with pytest.raises(BudgetExceededError) as info:
        summarizer.run("q", budget=Budget(usd=0.25))
    assert str(info.value) == "budget exceeded on agent 'summarizer': usd budget=0.25, used=$0.3120"

    @agent(model=FakeModel(["a"], usage=usage(1, 1, 1.5)))
    def pricey(x: str) -> str:
        return x

    with pytest.raises(BudgetExceededError) as info:
        pricey.run("q", budget=Budget(usd=1))
    assert str(info.value) == "budget exceeded on agent 'pricey': usd budget=1, used=$1.5000"


def test_budget6_tokens_are_checked_first():
    @agent(model=FakeModel(["a"], usage=usage(50, 50, 9.0)))
    def both(x: str) -> str:
        return x

    with pytest.raises(BudgetExceededError) as info:
        both.run("q", budget=Budget(usd=1.0, tokens=10))
    assert str(info.value) == "budget exceeded on agent 'both': tokens budget=10, used=100"


def test_budget5_exceeded_only_when_strictly_greater():
    @agent(model=FakeModel(["a", "b"], usage=usage(10, 20, 0.5)))
    def exact(x: str) -> str:
        return x

    assert exact.run("q", budget=Budget(tokens=30)).output == "a"
    assert exact.run("q", budget=Budget(usd=0.5)).output == "b"


def test_budget5_tokens_count_input_plus_output_only():
    u = Usage(
        input_tokens=10,
        output_tokens=10,
        cache_read_tokens=500,
        cache_creation_tokens=500,
        reasoning_tokens=5,
    )

    @agent(model=FakeModel(["a"], usage=u))
    def cachey(x: str) -> str:
        return x

    assert cachey.run("q", budget=Budget(tokens=20)).status == "completed"


def test_budget5_unpriced_calls_are_invisible_to_usd_caps():
    @tool
    def noop() -> str:
        """Noop."""
        return "ok"

    model = FakeModel([calls("noop", {}, f"c{i}") for i in range(5)] + ["done"])

    @agent(model=model, tools=[noop])
    def unpriced(x: str) -> str:
        return x

    run = unpriced.run("q", budget=Budget(usd=0.000001))
    assert run.output == "done"
    assert run.usage.cost_usd is None and run.usage.cost_complete is False

    # but the same calls trip a tokens cap
    model2 = FakeModel([calls("noop", {}, f"c{i}") for i in range(5)] + ["done"])

    @agent(model=model2, tools=[noop])
    def counted(x: str) -> str:
        return x

    with pytest.raises(BudgetExceededError, match=r"tokens budget=100, used=120$"):
        counted.run("q", budget=Budget(usd=0.000001, tokens=100))
    assert len(model2.requests) == 4


def test_budget4_usd_accumulates_over_calls_within_the_run():
    @tool
    def noop() -> str:
        """Noop."""
        return "ok"

    model = FakeModel([calls("noop", {}, "c1"), "done"], usage=usage(1, 1, 0.2))

    @agent(model=model, tools=[noop])
    def spender(x: str) -> str:
        return x

    with pytest.raises(BudgetExceededError) as info:
        spender.run("q", budget=Budget(usd=0.3))
    assert str(info.value) == "budget exceeded on agent 'spender': usd budget=0.3, used=$0.4000"
    assert len(model.requests) == 2


def test_budget2_accepted_on_sugar_arun_and_stream():
    @agent(model=FakeModel(["a", "b", "c"]))
    def small(x: str) -> str:
        return x

    with pytest.raises(BudgetExceededError):
        small("q", budget=Budget(tokens=1))
    with pytest.raises(BudgetExceededError):
        asyncio.run(small.arun("q", budget=Budget(tokens=1)))
    stream = small.stream("q", budget=Budget(tokens=1))
    with pytest.raises(BudgetExceededError):
        for _ in stream:
            pass


# --------------------------------------------------------------------------- BUDGET-3: nesting


@pytest.mark.sqlite_file
def test_budget3_nested_agent_budget_inside_a_flow_budget():
    model = FakeModel(["a"])

    @agent(model=model)
    def inner(x: str) -> str:
        return x

    @compose.flow
    def outer() -> str:
        return inner.run("q", budget=Budget(tokens=25)).output

    with pytest.raises(BudgetExceededError) as info:
        outer.run(budget=Budget(tokens=1000))
    assert str(info.value) == "budget exceeded on agent 'inner': tokens budget=25, used=30"
    run_id = only_run_id()
    assert row(run_id)["status"] == "failed"


@pytest.mark.sqlite_file
def test_budget3_outer_flow_budget_trips_across_agent_steps():
    model = FakeModel(["a", "b", "c"])

    @agent(model=model)
    def step(x: str) -> str:
        return x

    @compose.flow
    def outer() -> list:
        return [step.run(str(i), budget=Budget(tokens=1000)).output for i in range(3)]

    with pytest.raises(BudgetExceededError) as info:
        outer.run(budget=Budget(tokens=40))
    assert str(info.value) == "budget exceeded on flow 'outer': tokens budget=40, used=60"
    assert len(model.requests) == 2
    run_id = only_run_id()
    r = row(run_id)
    assert r["status"] == "failed"
    assert json.loads(r["error_json"])["type"] == "BudgetExceededError"
    assert json.loads(r["budget_json"]) == {"usd": None, "tokens": 40}
    statuses = [s[0] for s in persisted_llm_spans(run_id)]
    assert statuses == ["ok", "error"]


@pytest.mark.sqlite_file
def test_budget3_tripping_span_tree_statuses():
    model = FakeModel(["a"])

    @agent(model=model)
    def writer(x: str) -> str:
        return x

    holder = {}

    @compose.flow
    def f() -> str:
        try:
            return writer("q")
        except BudgetExceededError as exc:
            holder["exc"] = exc
            raise

    with pytest.raises(BudgetExceededError) as info:
        f.run(budget=Budget(tokens=5))
    assert info.value is holder["exc"]  # propagates unchanged
    run_id = only_run_id()
    _engine.get_store().flush()
    conn = sqlite3.connect(os.path.join(_engine.state_dir(), "runs.db"))
    try:
        found = conn.execute(
            "SELECT s.kind, s.name, s.status FROM spans s JOIN runs r ON r.rid = s.rid "
            "WHERE r.run_id = ? ORDER BY s.started_at",
            (run_id,),
        ).fetchall()
    finally:
        conn.close()
    assert sorted(found) == [
        ("agent", "writer", "error"),
        ("flow", "f", "error"),
        ("llm", "FakeModel", "error"),
    ]


def test_budget3_nested_plain_agent_run_budget_inside_a_tool():
    inner_model = FakeModel(["inner reply"])

    @agent(model=inner_model)
    def helper(x: str) -> str:
        return x

    @tool
    def delegate(q: str) -> str:
        """Delegate."""
        return helper.run(q, budget=Budget(tokens=5)).output

    outer_model = FakeModel([calls("delegate", {"q": "sub"}, "c1"), "outer done"])

    @agent(model=outer_model, tools=[delegate])
    def boss(x: str) -> str:
        return x

    run = boss.run("q")
    assert run.output == "outer done"
    (part,) = outer_model.requests[1].messages[-1].parts
    assert part.is_error
    assert part.content == (
        "BudgetExceededError: budget exceeded on agent 'helper': tokens budget=5, used=30"
    )


# --------------------------------------------------------------------------- BUDGET-7/8/9


def test_budget9_worked_example_and_override():
    model = FakeModel(["step one", "step two", "step two again"], usage=usage(5, 5))

    @agent(model=model)
    def first(x: str) -> str:
        return x

    @agent(model=model)
    def second(x: str) -> str:
        return x

    @compose.flow
    def two_steps() -> str:
        a = first("a")
        compose.approve("continue")
        b = second("b")
        return f"{a} + {b}"

    attempt1 = two_steps.run(budget=Budget(tokens=15))
    assert attempt1.status == "paused" and attempt1.pending.id == "continue"
    assert len(model.requests) == 1
    assert json.loads(row(attempt1.id)["budget_json"]) == {"usd": None, "tokens": 15}

    with pytest.raises(BudgetExceededError) as info:
        compose.resume(attempt1.id, answers={"continue": True})
    assert str(info.value) == "budget exceeded on flow 'two_steps': tokens budget=15, used=20"
    assert len(model.requests) == 2  # step 1 replayed (no new spend), step 2 ran
    r = row(attempt1.id)
    assert r["status"] == "failed"
    assert json.loads(r["error_json"])["type"] == "BudgetExceededError"

    attempt3 = compose.resume(attempt1.id, budget=Budget(tokens=100))
    assert attempt3.status == "completed"
    assert attempt3.output == "step one + step two again"
    assert json.loads(row(attempt1.id)["budget_json"]) == {"usd": None, "tokens": 100}
    assert row(attempt1.id)["status"] == "completed"


def test_budget8_override_is_persisted_for_later_attempts_and_earlier_spend_counts():
    model = FakeModel(["one", "two", "three"], usage=usage(5, 5))

    @agent(model=model)
    def writer(x: str) -> str:
        return x

    @compose.flow
    def f() -> list:
        out = [writer("1")]
        compose.approve("a")
        out.append(writer("2"))
        compose.approve("b")
        out.append(writer("3"))
        return out

    p1 = f.run(budget=Budget(tokens=100))
    p2 = compose.resume(p1.id, answers={"a": True}, budget=Budget(tokens=25))
    assert p2.status == "paused"  # lifetime 20 <= 25
    assert json.loads(row(p1.id)["budget_json"]) == {"usd": None, "tokens": 25}
    # no budget given: the stored (overridden) one applies, with all earlier spend
    with pytest.raises(BudgetExceededError, match=r"tokens budget=25, used=30$"):
        compose.resume(p1.id, answers={"b": True})


def test_budget7_standalone_agent_budget_is_cumulative_across_resumes():
    sent: list = []
    send_email = gated_mailer(sent)
    model = FakeModel([calls("send_email", {"to": "x"}, "c1"), "done"])

    @agent(model=model, tools=[send_email])
    def mailer(x: str) -> str:
        return x

    paused = mailer.run("q", budget=Budget(tokens=50))
    assert paused.status == "paused"
    assert json.loads(row(paused.id)["budget_json"]) == {"usd": None, "tokens": 50}
    with pytest.raises(BudgetExceededError) as info:
        compose.resume(paused.id, answers={"send_email": True})
    assert str(info.value) == "budget exceeded on agent 'mailer': tokens budget=50, used=60"
    assert row(paused.id)["status"] == "failed"
    assert sent == ["x"]


def test_budget8_standalone_resume_budget_override():
    sent: list = []
    send_email = gated_mailer(sent)
    model = FakeModel([calls("send_email", {"to": "x"}, "c1"), "done"])

    @agent(model=model, tools=[send_email])
    def mailer(x: str) -> str:
        return x

    paused = mailer.run("q", budget=Budget(tokens=50))
    done = compose.resume(paused.id, answers={"send_email": True}, budget=Budget(tokens=60))
    assert done.status == "completed"
    assert json.loads(row(paused.id)["budget_json"]) == {"usd": None, "tokens": 60}


def test_budget7_nested_agent_budget_baseline_is_only_its_own_step():
    sent: list = []
    send_email = gated_mailer(sent)
    model = FakeModel(
        ["warmup", calls("send_email", {"to": "x"}, "c1"), "done"], usage=usage(10, 10)
    )

    @agent(model=model)
    def warm(x: str) -> str:
        return x

    @agent(model=model, tools=[send_email])
    def mailer(x: str) -> str:
        return x

    @compose.flow
    def f() -> str:
        warm("w")  # 20 tokens: another step, never counted against mailer's own budget
        return mailer.run("q", budget=Budget(tokens=35)).output

    paused = f.run()
    assert paused.status == "paused"
    # mailer's lifetime: 20 (first attempt of this step) + 20 = 40 > 35
    with pytest.raises(BudgetExceededError) as info:
        compose.resume(paused.id, answers={"send_email": True})
    assert str(info.value) == "budget exceeded on agent 'mailer': tokens budget=35, used=40"

    model2 = FakeModel(
        ["warmup", calls("send_email", {"to": "x"}, "c1"), "done"], usage=usage(10, 10)
    )

    @agent(model=model2, name="warm", replace=True)
    def warm2(x: str) -> str:
        return x

    @agent(model=model2, tools=[send_email], name="mailer", replace=True)
    def mailer2(x: str) -> str:
        return x

    @compose.flow(name="g")
    def g() -> str:
        warm2("w")
        return mailer2.run("q", budget=Budget(tokens=45)).output

    paused = g.run()
    done = compose.resume(paused.id, answers={"send_email": True})
    assert done.status == "completed" and done.output == "done"  # 40 <= 45
