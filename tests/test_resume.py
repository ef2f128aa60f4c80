"""`resume()` checks and answers, human-in-the-loop pauses (FLOW-30 … FLOW-43)."""

import asyncio
import json
import sqlite3

import pytest

import composeai as compose
from composeai import _engine
from composeai.errors import ConfigError, ResumeMismatchError, SerializationError


def pending_rows(run_id):
    return _engine.get_store().pending(run_id)


def test_flow30_approve_and_ask_human_pause_then_read_answers():
    @compose.flow
    def f() -> str:
        style = compose.ask_human("style", "Which style?", payload={"choices": ["a", "b"]})
        ok = compose.approve("publish")
        return f"{style}:{ok}"

    first = f.run()
    assert first.status == "paused"
    assert first.pending == compose.Interrupt(
        id="style", kind="question", question="Which style?", payload={"choices": ["a", "b"]}
    )
    assert first.output is None
    assert pending_rows(first.id) == [
        ("style", "question", "Which style?", '{"choices":["a","b"]}')
    ]
    second = compose.resume(first.id, answers={"style": "formal"})
    assert second.status == "paused" and second.pending.id == "publish"
    third = compose.resume(first.id, answers={"publish": 1})
    assert third.status == "completed" and third.output == "formal:True"
    assert pending_rows(first.id) == []


def test_flow31_interrupts_outside_a_run_are_a_config_error():
    with pytest.raises(ConfigError) as info:
        compose.approve("x")
    assert str(info.value) == (
        "approve()/ask_human() (and approval-gated @tool calls) only work inside an active @flow "
        "body or a durable @agent run -- none is active here"
    )


def test_flow32_pause_is_not_caught_by_except_exception_or_retries():
    attempts = []

    @compose.task(retries=3)
    def gated() -> str:
        attempts.append(1)
        try:
            compose.approve("inside-task")
        except Exception:  # noqa: BLE001 -- must not swallow the pause
            return "swallowed"
        return "approved"

    @compose.flow
    def f() -> str:
        return gated()

    run = f.run()
    assert run.status == "paused" and attempts == [1]
    statuses = {s.name: s.status for s in run.trace.spans}
    assert statuses == {"f": "paused", "gated": "paused", "inside-task": "paused"}
    assert all(s.error is None for s in run.trace.spans)
    assert compose.resume(run.id, answers={"inside-task": True}).output == "approved"


def test_flow33_interrupt_is_a_frozen_model():
    from pydantic import ValidationError

    i = compose.Interrupt(id="a", kind="approval")
    assert (i.question, i.payload) == (None, None)
    with pytest.raises(ValidationError):
        i.id = "b"
    from composeai import hitl

    assert hitl.Interrupt is compose.Interrupt


def test_flow34_repause_on_the_same_id_upserts_the_pending_row():
    @compose.flow
    def f() -> str:
        compose.approve("same", payload={"n": 1})
        return "x"

    first = f.run()
    second = compose.resume(first.id)
    assert second.status == "paused" and second.id == first.id
    assert pending_rows(first.id) == [("same", "approval", None, '{"n":1}')]


def test_flow41_check_order_missing_run():
    with pytest.raises(ConfigError) as info:
        compose.resume("01NOTARUN0000000000000000")
    assert str(info.value).startswith(
        "no run found with run_id '01NOTARUN0000000000000000' -- searched the "
    )


def test_flow41_callbacks_are_refused_for_flow_runs():
    @compose.flow
    def f() -> int:
        compose.approve("go")
        return 1

    run = f.run()
    with pytest.raises(ConfigError) as info:
        compose.resume(run.id, approver=lambda i: True)
    assert str(info.value) == (
        "approver=, context_manager= and tool_interceptor= apply only to standalone agent runs, "
        "not @flow runs"
    )


def test_flow41_unregistered_flow_names_the_fix():
    @compose.flow
    def gone() -> int:
        compose.approve("go")
        return 1

    run = gone.run()
    from composeai.flow import reset_registries

    reset_registries()
    with pytest.raises(ConfigError) as info:
        compose.resume(run.id)
    assert str(info.value) == (
        "flow 'gone' is not registered in this process -- import the module that defines it (so "
        f"its @flow decoration runs) before calling resume(): `import {__name__}` (compose "
        f"commands: --import {__name__})"
    )


def test_flow41_completed_run_returns_stored_output_without_executing():
    calls = []

    @compose.flow
    def f() -> dict:
        calls.append(1)
        return {"a": (1, 2)}

    run = f.run()
    again = compose.resume(run.id)
    assert calls == [1]
    assert again.status == "completed" and again.output == {"a": (1, 2)}
    assert again.trace.trace_id == run.trace.trace_id and again.trace.spans == []
    assert again.pending is None and again.messages == []


def test_flow41_fingerprint_mismatch_and_allow_code_change():
    @compose.flow(name="evolving")
    def v1() -> str:
        compose.approve("go")
        return "v1"

    run = v1.run()

    @compose.flow(name="evolving", replace=True)
    def v2() -> str:
        compose.approve("go")
        return "v2"

    with pytest.raises(ResumeMismatchError) as info:
        compose.resume(run.id, answers={"go": True})
    assert str(info.value) == (
        f"the source of @flow 'evolving' changed since run '{run.id}' was created (fingerprint "
        "mismatch) -- pass allow_code_change=True to resume anyway (the journal may no longer "
        "match the new code's call sequence)"
    )
    assert pending_rows(run.id) == [("go", "approval", None, None)]
    done = compose.resume(run.id, answers={"go": True}, allow_code_change=True)
    assert done.output == "v2"


@pytest.mark.sqlite_file
def test_flow42_failed_runs_reexecute_and_budget_override_is_stored():
    state = {"fail": True}
    calls = []

    @compose.task
    def first() -> int:
        calls.append("first")
        return 1

    @compose.task
    def second() -> int:
        calls.append("second")
        if state["fail"]:
            raise RuntimeError("transient")
        return 2

    @compose.flow
    def f() -> int:
        return first() + second()

    with pytest.raises(RuntimeError):
        f.run(budget=compose.Budget(tokens=100))
    db = sqlite3.connect(_engine.get_store().path)
    run_id, budget_json = db.execute("SELECT run_id, budget_json FROM runs").fetchone()
    assert json.loads(budget_json) == {"usd": None, "tokens": 100}
    state["fail"] = False
    run = compose.resume(run_id, budget=compose.Budget(usd=2.5))
    assert run.output == 3 and calls == ["first", "second", "second"]
    (budget_json,) = db.execute("SELECT budget_json FROM runs").fetchone()
    assert json.loads(budget_json) == {"usd": 2.5, "tokens": None}


def test_budget1_needs_a_field():
    with pytest.raises(ConfigError) as info:
        compose.Budget()
    assert str(info.value) == "Budget requires at least one of `usd` or `tokens` to be set"


def _paused_on(*ids):
    @compose.flow(name="gates", replace=True)
    def gates() -> list:
        return [compose.approve(i) for i in ids]

    run = gates.run()
    # Store every gate as pending, as concurrent branches would leave them.
    attempt = _engine.get_store().resume(run.id)
    attempt.settle("paused", None, None, [(i, "approval", None, None) for i in ids])
    return run


def test_flow43_bare_tool_name_resolves_to_the_single_pending_call():
    run = _paused_on("tool:send_email:call_1")
    done = compose.resume(run.id, answers={"send_email": True})
    assert done.output == [True]
    journal = dict(_engine.get_store().journal(run.id))
    assert journal["__interrupt__:tool:send_email:call_1"] == "true"


def test_flow43_ambiguous_tool_name():
    run = _paused_on("tool:send:b", "tool:send:a")
    with pytest.raises(ConfigError) as info:
        compose.resume(run.id, answers={"send": True})
    assert str(info.value) == (
        "answer key 'send' is ambiguous -- it matches multiple pending interrupts "
        "['tool:send:a', 'tool:send:b']; use the full interrupt id to disambiguate"
    )


def test_flow43_unmatched_key_when_only_tool_calls_are_pending():
    run = _paused_on("tool:send:a")
    with pytest.raises(ConfigError) as info:
        compose.resume(run.id, answers={"other": True})
    assert str(info.value) == (
        "answer key 'other' does not match any pending interrupt -- currently pending: "
        "['tool:send:a'] (a tool-call answer can't be supplied ahead of the tool actually being "
        "called, unlike a bare approve()/ask_human() id)"
    )


def test_flow43_unknown_keys_are_journaled_verbatim_for_later_gates():
    @compose.flow
    def f() -> list:
        return [compose.approve("one"), compose.approve("two")]

    run = f.run()
    done = compose.resume(run.id, answers={"one": True, "two": False})
    assert done.output == [True, False]


def test_flow43_first_answer_wins():
    @compose.flow
    def f() -> str:
        compose.approve("a")
        return compose.ask_human("q", "?")

    run = f.run()
    compose.resume(run.id, answers={"a": True, "q": "first"})
    again = compose.resume(run.id, answers={"q": "second"})
    assert again.output == "first"


def test_flow43_unencodable_answer():
    @compose.flow
    def f() -> str:
        return compose.ask_human("q", "?")

    run = f.run()
    with pytest.raises(SerializationError) as info:
        compose.resume(run.id, answers={"q": object()})
    assert str(info.value).startswith("answer 'q': ")
    assert pending_rows(run.id) == [("q", "question", "?", None)]


def test_aresume_runs_on_the_callers_loop():
    @compose.flow
    async def f() -> str:
        ok = compose.approve("go")
        return f"async:{ok}"

    async def main():
        first = await f.arun()
        assert first.status == "paused"
        return await compose.aresume(first.id, answers={"go": True})

    run = asyncio.run(main())
    assert run.output == "async:True"


def test_lease_refuses_a_second_attempt_in_the_same_process():
    """One attempt of a run executes at a time, even within one process."""

    @compose.task
    def reenter() -> str:
        try:
            compose.resume(state["id"], answers={"go": True})
        except ConfigError as exc:
            return str(exc)
        return "ran twice"

    @compose.flow
    def starter() -> str:
        compose.approve("go")
        return reenter()

    state = {}
    run = starter.run()
    state["id"] = run.id
    done = compose.resume(run.id, answers={"go": True})
    assert done.output == (
        f"run '{run.id}' is already being executed in this process -- one attempt of a run "
        "executes at a time; resume it after the current attempt returns"
    )
