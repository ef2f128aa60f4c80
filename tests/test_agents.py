"""`@agent`: decoration, structured output, the loop, tools in the loop, approval,
interception, context management and durability (agents.md AGENT-1 … AGENT-54)."""

import asyncio
import inspect
import json
import os
import sqlite3
import threading
import time
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

import composeai as compose
from composeai import _engine
from composeai.agentfn import AgentFunction, agent, prompt
from composeai.errors import (
    AgentTimeoutError,
    ComposeError,
    ConfigError,
    MaxTurnsExceededError,
    ModelRefusalError,
    ProviderError,
    SerializationError,
)
from composeai.hitl import ApprovalReply, Interrupt
from composeai.interception import BeforeTool, ToolInterceptor
from composeai.messages import Message, StopReason, ToolCallPart, ToolResultPart, Usage
from composeai.models import registry
from composeai.models.base import ModelRequest, ModelResponse
from composeai.testing import FakeModel, reset_registries
from composeai.tools import tool

NO_RUN = (
    "approve()/ask_human() (and approval-gated @tool calls) only work inside an active @flow "
    "body or a durable @agent run -- none is active here"
)
REPAIR = (
    "Your previous reply did not match the required output schema. Error: {error}\n"
    "Reply again with ONLY a corrected JSON object matching the schema -- no markdown fences, "
    "no commentary."
)


@pytest.fixture(autouse=True)
def clean_agent_registry():
    reset_registries()
    yield
    reset_registries()


@pytest.fixture
def clean_providers(monkeypatch):
    """Isolate register_provider() and the instance cache."""
    monkeypatch.setattr(registry, "_FACTORIES", {})
    monkeypatch.setattr(registry, "_CACHE", {})


class Facts(BaseModel):
    title: str
    count: int


class Inner(BaseModel):
    label: str


class Outer(BaseModel):
    inner: Inner
    items: list[Inner]


def calls(*specs: tuple) -> dict:
    """A FakeModel tool-call item: each spec is `(name, arguments, id)`."""
    return {"tool_calls": [{"name": n, "arguments": a, "id": i} for n, a, i in specs]}


def response(stop: StopReason, raw: str | None, *, text: str = "", usage: Usage | None = None):
    return ModelResponse(
        message=Message.assistant(text),
        stop_reason=stop,
        raw_stop_reason=raw,
        usage=usage or Usage(),
        model_id="FakeModel",
    )


def spans(run, kind: str) -> list:
    return [s for s in run.trace.spans if s.kind == kind]


def root_agent_span(run):
    return next(s for s in run.trace.spans if s.kind == "agent")


def row(run_id: str) -> dict | None:
    return _engine.get_store().get_run(run_id)


def journal(run_id: str) -> dict:
    return dict(_engine.get_store().journal(run_id))


def run_rows() -> list:
    db = os.path.join(_engine.state_dir(), "runs.db")
    if not os.path.exists(db):
        return []
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT run_id FROM runs").fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


def raising(exc: BaseException):
    def item(request):
        raise exc

    return item


# =========================================================================== decoration


def test_agent1_returns_an_agent_function_with_name_and_types():
    @agent(model=FakeModel([]))
    def summarize(text: str, n: int = 3):
        """Summarize."""
        return text

    assert isinstance(summarize, AgentFunction)
    assert summarize.name == "summarize"
    assert summarize.input_type is str
    assert summarize.output_type is str  # AGENT-6: str when the return annotation is absent

    @agent(model=FakeModel([]))
    def facts(x) -> Facts:
        return "q"

    assert facts.input_type is Any
    assert facts.output_type is Facts

    @agent(model=FakeModel([]))
    def no_params() -> list[int]:
        return "q"

    assert no_params.input_type is Any
    assert no_params.output_type == list[int]


def test_agent6_unresolvable_hints_fall_back_to_raw_annotations():
    @agent(model=FakeModel([]))
    def forward(x: "NotDefinedAnywhere") -> str:  # noqa: F821
        return "q"

    assert forward.input_type == "NotDefinedAnywhere"
    assert forward.output_type is str


def test_agent1_keyword_only_knobs_and_name_override():
    @agent(model=FakeModel([]), name="custom_name", max_turns=None, retries=2)
    def original(x: str) -> str:
        return x

    assert original.name == "custom_name"
    assert original.max_turns is None and original.retries == 2


def test_agent5_docstring_is_the_cleandoc_system_prompt():
    model = FakeModel(["ok"])

    @agent(model=model)
    def terse(x: str) -> str:
        """
        You are terse.
            Keep the indent.

        Second paragraph.
        """
        return x

    expected = inspect.cleandoc(terse.fn.__doc__)
    assert expected == "You are terse.\n    Keep the indent.\n\nSecond paragraph."
    assert terse.run("q").output == "ok"
    assert model.requests[0].system == expected


@pytest.mark.parametrize("doc", [None, "", "   \n   "])
def test_agent5_missing_or_blank_docstring_means_no_system_prompt(doc):
    model = FakeModel(["ok"])

    def fn(x: str) -> str:
        return x

    fn.__doc__ = doc
    a = agent(model=model, name=f"blank_{len(doc or 'x')}")(fn)
    a.run("q")
    assert model.requests[0].system is None


def test_agent20_system_override_replaces_the_docstring():
    model = FakeModel(["ok"])

    @agent(model=model)
    def with_doc(x: str) -> str:
        """Docstring."""
        return x

    with_doc.run("q", system="Override.")
    assert model.requests[0].system == "Override."


def test_agent7_str_body_is_one_user_message():
    model = FakeModel(["ok"])

    @agent(model=model)
    def ask(topic: str) -> str:
        return f"Tell me about {topic}"

    run = ask.run("owls")
    assert model.requests[0].messages == [Message.user("Tell me about owls")]
    assert run.messages == [Message.user("Tell me about owls"), Message.assistant("ok")]


def test_agent7_list_body_is_the_whole_conversation():
    model = FakeModel(["fourth"])
    convo = [Message.user("one"), Message.assistant("two"), Message.user("three")]

    @agent(model=model)
    def chatty(x: str) -> str:
        return list(convo)

    run = chatty.run("ignored")
    assert model.requests[0].messages == convo
    assert run.messages == [*convo, Message.assistant("fourth")]


def test_agent7_async_body_sync_and_async_callers():
    model = FakeModel(["a", "b"])

    @agent(model=model)
    async def asynchronous(x: str) -> str:
        await asyncio.sleep(0)
        return f"async {x}"

    assert asynchronous.run("1").output == "a"
    assert asyncio.run(asynchronous.arun("2")).output == "b"
    assert [r.messages[0] for r in model.requests] == [
        Message.user("async 1"),
        Message.user("async 2"),
    ]


@pytest.mark.parametrize(
    ("value", "type_repr"),
    [(42, "<class 'int'>"), (["not a message"], "<class 'list'>"), (None, "<class 'NoneType'>")],
)
def test_agent7_bad_body_return_is_a_config_error(value, type_repr):
    model = FakeModel(["never"])

    @agent(model=model, name="bad_body")
    def bad(x: str) -> str:
        return value

    with pytest.raises(ConfigError) as info:
        bad.run("q")
    assert str(info.value) == (
        "@agent function 'bad_body' must return a str (the user prompt) or a list[Message] "
        f"(the full conversation) from its body, got {type_repr}"
    )
    assert model.requests == []


def test_agent4_duplicate_names_and_replace():
    model = FakeModel(["first", "second"])

    @agent(model=model)
    def dup(x: str) -> str:
        return "v1"

    with pytest.raises(ConfigError) as info:

        @agent(model=model)
        def dup(x: str) -> str:
            return "v2"

    assert str(info.value) == (
        "@agent name 'dup' is already registered -- agent names must be unique per process "
        "(needed so resume() can route a paused agent run back to its definition); pass "
        "name=... or replace=True, or rename the function"
    )
    with pytest.raises(ConfigError):

        @agent(model=model, name="dup")
        def other(x: str) -> str:
            return "v3"

    @agent(model=model, replace=True)
    def dup(x: str) -> str:
        return "v2"

    dup.run("q")
    assert model.requests[0].messages == [Message.user("v2")]


def test_agent2_bare_agent_is_accepted_and_fails_only_when_run():
    @agent
    def bare(x: str) -> str:
        """S."""
        return x

    assert isinstance(bare, AgentFunction)
    assert bare.name == "bare" and bare.output_type is str
    with pytest.raises(ConfigError) as info:
        bare.run("q")
    assert str(info.value) == (
        "@agent 'bare' has no model -- give it one: @agent(model=...) with a 'provider/model-id' "
        "string (e.g. 'anthropic/claude-sonnet-4-5') or a Model instance (e.g. "
        "composeai.testing.FakeModel([...]) in tests), or pass model= to the call: "
        "bare.run(..., model=...)"
    )
    # a call-level model override makes it runnable
    assert bare.run("q", model=FakeModel(["fine"])).output == "fine"


def test_agent2_model_strings_are_resolved_lazily(clean_providers):
    @agent(model="no-slash")
    def lazy(x: str) -> str:
        return x

    with pytest.raises(ConfigError) as info:
        lazy.run("q")
    assert str(info.value) == (
        "Invalid model string 'no-slash': expected 'provider/model-id'. "
        "Known providers: anthropic, openai"
    )


def test_agent8_prompt_is_identity():
    text = "hello"
    msgs = [Message.user("x")]
    assert prompt(text) is text
    assert prompt(msgs) is msgs
    assert compose.prompt is prompt


# =========================================================================== structured output


def test_agent10_str_output_has_no_schema():
    model = FakeModel(["plain text"])

    @agent(model=model)
    def plain(x: str) -> str:
        return x

    assert plain.run("q").output == "plain text"
    assert model.requests[0].output_schema is None


def test_agent11_pydantic_output_sealed_schema_sent_on_every_turn():
    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        return "found"

    model = FakeModel([calls(("lookup", {"q": "x"}, "c1")), {"json": {"title": "T", "count": "5"}}])

    @agent(model=model, tools=[lookup])
    def extract(x: str) -> Facts:
        return x

    run = extract.run("q")
    assert run.output == Facts(title="T", count=5)  # lax validation coerces "5"
    expected = {
        "properties": {"title": {"type": "string"}, "count": {"type": "integer"}},
        "required": ["title", "count"],
        "type": "object",
        "additionalProperties": False,
    }
    assert [r.output_schema for r in model.requests] == [expected, expected]


def test_agent11_defs_are_sealed_and_reattached_at_the_root():
    model = FakeModel([{"json": {"inner": {"label": "a"}, "items": [{"label": "b"}]}}])

    @agent(model=model)
    def nested(x: str) -> Outer:
        return x

    assert nested.run("q").output == Outer(inner=Inner(label="a"), items=[Inner(label="b")])
    schema = model.requests[0].output_schema
    assert schema["$defs"] == {
        "Inner": {
            "properties": {"label": {"type": "string"}},
            "required": ["label"],
            "type": "object",
            "additionalProperties": False,
        }
    }
    assert schema["properties"] == {
        "inner": {"$ref": "#/$defs/Inner"},
        "items": {"items": {"$ref": "#/$defs/Inner"}, "type": "array"},
    }
    assert schema["additionalProperties"] is False
    assert "title" not in json.dumps(schema)


def test_agent11_non_object_output_is_wrapped_and_unwrapped():
    model = FakeModel([{"json": {"result": [1, "2", 3]}}])

    @agent(model=model)
    def numbers(x: str) -> list[int]:
        return x

    assert numbers.run("q").output == [1, 2, 3]
    assert model.requests[0].output_schema == {
        "type": "object",
        "properties": {"result": {"items": {"type": "integer"}, "type": "array"}},
        "required": ["result"],
        "additionalProperties": False,
    }


def test_agent12_payload_from_message_text_when_parsed_is_unset():
    model = FakeModel(['{"result": 7}'])

    @agent(model=model)
    def seven(x: str) -> int:
        return x

    assert seven.run("q").output == 7
    assert model.requests[0].output_schema == {
        "type": "object",
        "properties": {"result": {"type": "integer"}},
        "required": ["result"],
        "additionalProperties": False,
    }


def test_agent11_wrapped_schema_with_defs_keeps_defs_at_the_root():
    model = FakeModel([{"json": {"result": [{"label": "x"}]}}])

    @agent(model=model)
    def labels(x: str) -> list[Inner]:
        return x

    assert labels.run("q").output == [Inner(label="x")]
    schema = model.requests[0].output_schema
    assert schema["properties"] == {"result": {"items": {"$ref": "#/$defs/Inner"}, "type": "array"}}
    assert set(schema["$defs"]) == {"Inner"}
    assert schema["$defs"]["Inner"]["additionalProperties"] is False


def test_agent11_open_mapping_keeps_its_additional_properties():
    model = FakeModel([{"json": {"a": 1}}])

    @agent(model=model)
    def mapping(x: str) -> dict[str, int]:
        return x

    assert mapping.run("q").output == {"a": 1}
    assert model.requests[0].output_schema == {
        "additionalProperties": {"type": "integer"},
        "type": "object",
    }


def test_agent12_text_that_is_not_json_is_an_exact_compose_error():
    @agent(model=FakeModel(["not json"]))
    def strict(x: str) -> Facts:
        return x

    with pytest.raises(ComposeError) as info:
        strict.run("q")
    assert type(info.value) is ComposeError
    assert str(info.value) == (
        "@agent 'strict': model returned no structured payload (response.parsed was unset and "
        'the message text is not valid JSON); the model replied: "not json"'
    )


def test_agent12_wrapped_payload_without_result_key():
    @agent(model=FakeModel([{"json": {"values": [1]}}]))
    def wrapped(x: str) -> list[int]:
        return x

    with pytest.raises(ComposeError) as info:
        wrapped.run("q")
    assert str(info.value) == (
        "@agent 'wrapped': model returned no structured payload (expected a JSON object with a "
        "'result' key)"
    )


def test_agent12_validation_failure_message_and_no_raw_validation_error():
    @agent(model=FakeModel([{"json": {"title": "t"}}]))
    def invalid(x: str) -> Facts:
        return x

    with pytest.raises(Exception) as info:
        invalid.run("q")
    exc = info.value
    assert type(exc) is ComposeError
    assert not isinstance(exc, ValidationError)
    prefix = f"@agent 'invalid': model output failed validation for {Facts!r}: "
    assert str(exc).startswith(prefix + "1 validation error for Facts\ncount\n  Field required")


def test_agent13_repair_turn_message_and_span_attribute():
    model = FakeModel(["oops", {"json": {"title": "T", "count": 1}}])

    @agent(model=model, max_repairs=1)
    def repaired(x: str) -> Facts:
        return x

    run = repaired.run("q")
    assert run.output == Facts(title="T", count=1)
    error = (
        "@agent 'repaired': model returned no structured payload (response.parsed was unset "
        'and the message text is not valid JSON); the model replied: "oops"'
    )
    assert model.requests[1].messages == [
        Message.user("q"),
        Message.assistant("oops"),
        Message.user(REPAIR.format(error=error)),
    ]
    assert root_agent_span(run).attributes["repairs"] == [error]
    assert run.messages[-1] == Message.assistant(json.dumps({"title": "T", "count": 1}))


def test_agent13_repairs_exhausted_reraise_and_count_against_max_turns():
    @agent(model=FakeModel(["bad1", "bad2", "bad3"]), max_repairs=1)
    def exhausted(x: str) -> Facts:
        return x

    with pytest.raises(ComposeError) as info:
        exhausted.run("q")
    assert "model returned no structured payload" in str(info.value)

    model = FakeModel(["bad"] * 5)

    @agent(model=model, max_repairs=5, max_turns=2)
    def capped(x: str) -> Facts:
        return x

    with pytest.raises(MaxTurnsExceededError):
        capped.run("q")
    assert len(model.requests) == 2


# =========================================================================== the loop


def test_agent21_max_turns_on_a_model_that_never_stops_calling_tools():
    @tool
    def noop() -> str:
        """Does nothing."""
        return "ok"

    model = FakeModel([lambda req: {"tool_calls": [{"name": "noop"}]}] * 50)

    @agent(model=model, tools=[noop])
    def looper(x: str) -> str:
        return x

    with pytest.raises(MaxTurnsExceededError) as info:
        looper.run("q")
    assert str(info.value) == (
        "@agent 'looper' exceeded max_turns=10 (it kept calling tools/turns without finishing; "
        "raise max_turns if this agent legitimately needs more)"
    )
    assert len(model.requests) == 10

    model3 = FakeModel([calls(("noop", {}, f"c{i}")) for i in range(5)])

    @agent(model=model3, tools=[noop], max_turns=3)
    def three(x: str) -> str:
        return x

    with pytest.raises(MaxTurnsExceededError, match=r"max_turns=3 "):
        three.run("q")
    assert len(model3.requests) == 3


def test_agent21_max_turns_none_is_unbounded():
    @tool
    def noop() -> str:
        """Does nothing."""
        return "ok"

    model = FakeModel([calls(("noop", {}, f"c{i}")) for i in range(12)] + ["done"])

    @agent(model=model, tools=[noop], max_turns=None)
    def unbounded(x: str) -> str:
        return x

    assert unbounded.run("q").output == "done"
    assert len(model.requests) == 13


def test_agent21_timeout_checked_at_turn_starts():
    @tool
    def noop() -> str:
        """Does nothing."""
        return "ok"

    def slow(request):
        time.sleep(0.3)
        return calls(("noop", {}, "c1"))

    model = FakeModel([slow, "never"])

    @agent(model=model, tools=[noop], timeout=0.2)
    def sluggish(x: str) -> str:
        return x

    with pytest.raises(AgentTimeoutError) as info:
        sluggish.run("q")
    assert str(info.value) == (
        "@agent 'sluggish' exceeded timeout=0.2s (checked at turn boundaries only; an in-flight "
        "model call is never interrupted)"
    )
    assert len(model.requests) == 1


def test_agent21_in_flight_call_is_never_interrupted_by_the_timeout():
    def slow(request):
        time.sleep(0.3)
        return "finished"

    @agent(model=FakeModel([slow]), timeout=0.1)
    def patient(x: str) -> str:
        return x

    assert patient.run("q").output == "finished"


def test_agent23_retries_on_provider_error_inside_one_llm_span():
    model = FakeModel(
        [raising(ProviderError("boom 1")), raising(ProviderError("boom 2")), "recovered"]
    )

    @agent(model=model, retries=2)
    def resilient(x: str) -> str:
        return x

    run = resilient.run("q")
    assert run.output == "recovered"
    llm = spans(run, "llm")
    assert len(llm) == 1
    assert llm[0].status == "ok"
    assert llm[0].attributes["retries"] == [
        {"type": "ProviderError", "message": "boom 1"},
        {"type": "ProviderError", "message": "boom 2"},
    ]
    assert len(model.requests) == 3
    assert model.requests[0] == model.requests[2]  # the same request, retried


def test_agent23_exhausted_retries_propagate_the_provider_error_unchanged():
    err = ProviderError("down", provider="p", model="m")

    @agent(model=FakeModel([raising(ProviderError("first")), raising(err)]), retries=1)
    def fragile(x: str) -> str:
        return x

    with pytest.raises(ProviderError) as info:
        fragile.run("q")
    assert info.value is err


@pytest.mark.sqlite_file
def test_agent23_a_failed_call_without_retries_is_recorded_on_its_span():
    """An agent with no retries makes its first turn on the calling thread
    (no effect loop): a provider failure is still recorded on the llm span,
    which is stored failed with the run."""

    @agent(model=FakeModel([raising(ProviderError("down"))]))
    def once(x: str) -> str:
        return x

    with pytest.raises(ProviderError, match="down"):
        once.run("q")
    db = sqlite3.connect(f"{_engine.state_dir()}/runs.db")
    status, attributes = db.execute(
        "SELECT s.status, s.attributes_json FROM spans s JOIN runs r ON r.rid = s.rid "
        "WHERE s.kind = 'llm' AND r.name = 'once'"
    ).fetchone()
    (run_status,) = db.execute("SELECT status FROM runs WHERE name = 'once'").fetchone()
    db.close()
    assert (status, run_status) == ("error", "failed")
    assert json.loads(attributes)["retries"] == [{"type": "ProviderError", "message": "down"}]


@pytest.mark.parametrize(
    "reply",
    [
        response(StopReason.MAX_TOKENS, "max_tokens"),
        response(StopReason.REFUSAL, "refusal"),
        response(StopReason.OTHER, "pause"),
    ],
)
def test_agent24_first_turn_stop_reasons_match_the_loop_with_retries(reply):
    """AGENT-24: a first reply that is not a final text ends the same way
    whether the turn was made directly (no retries) or through the effect
    loop (retries allowed)."""
    outcomes = []
    for retries in (0, 1):

        @agent(model=FakeModel([reply]), retries=retries, name=f"stops_{retries}")
        def stops(x: str) -> str:
            return x

        with pytest.raises(ComposeError) as info:
            stops.run("q")
        outcomes.append((type(info.value), str(info.value).replace(f"stops_{retries}", "A")))
    assert outcomes[0] == outcomes[1]


@pytest.mark.sqlite_file
def test_agent22_llm_span_rows_match_with_and_without_the_direct_turn():
    """The stored llm and agent span rows of a call whose first turn is made
    directly equal those of the effect loop's, but for ids and times."""

    def stored(name: str) -> list:
        db = sqlite3.connect(f"{_engine.state_dir()}/runs.db")
        rows = db.execute(
            "SELECT s.kind, s.name, s.status, s.attributes_json, s.input_tokens, "
            "s.output_tokens, s.input_json, s.output_json FROM spans s "
            "JOIN runs r ON r.rid = s.rid WHERE r.name = ? ORDER BY s.span_id",
            (name,),
        ).fetchall()
        db.close()
        return [r[:1] + r[2:] for r in rows]

    for retries in (0, 1):

        @agent(model=FakeModel(["hi there"]), retries=retries, name=f"same_{retries}")
        def same(x: str) -> str:
            """Be brief."""
            return x

        assert same.run("q").output == "hi there"
    assert stored("same_0") == stored("same_1")
    assert len(stored("same_0")) == 2


def _stored_call(name: str) -> tuple:
    """Every stored column of a standalone call's run and span rows, but for
    ids, times and the agent's name (the error stacktraces, which name the engine's frames,
    are reduced to type and message)."""
    db = sqlite3.connect(f"{_engine.state_dir()}/runs.db")
    run = db.execute(
        "SELECT kind, status, fingerprint, args_json, output_json, error_json, budget_json, "
        "lease_owner, lease_until, created_at <= updated_at, "
        "(SELECT count(*) FROM traces t WHERE t.trace_id = runs.trace_id), "
        "(SELECT count(*) FROM journal j WHERE j.rid = runs.rid), "
        "(SELECT count(*) FROM agent_state a WHERE a.rid = runs.rid), "
        "(SELECT count(*) FROM pending_interrupts p WHERE p.rid = runs.rid) "
        "FROM runs WHERE name = ?",
        (name,),
    ).fetchall()
    rows = db.execute(
        "SELECT s.kind, s.name, s.status, s.flags, s.step_key, s.attributes_json, s.error_json, "
        "s.input_tokens, s.output_tokens, s.cache_read_tokens, s.cache_creation_tokens, "
        "s.reasoning_tokens, s.cost_usd, s.cost_complete, s.input_json, s.output_json, "
        "s.parent IS NULL, p.kind, length(s.span_id), s.started_at <= s.ended_at, "
        "s.tid = -r.rid "
        "FROM spans s JOIN runs r ON r.rid = s.rid "
        "LEFT JOIN spans p ON p.span_id = s.parent AND p.tid = s.tid "
        "WHERE r.name = ? ORDER BY s.sid",
        (name,),
    ).fetchall()
    db.close()

    def unnamed(row) -> list:
        return [v.replace(name, "A") if type(v) is str else v for v in row]

    spans = []
    for r in map(unnamed, rows):
        if r[6] is not None:
            error = json.loads(r[6])
            r[6] = (error["type"], error["message"])
        spans.append(tuple(r))
    return [tuple(unnamed(r)) for r in run], spans


def _run_view(run, name: str) -> tuple:
    """A returned `Run` and its trace, but for ids, times and the agent's
    name."""
    index = {s.span_id: i for i, s in enumerate(run.trace.spans)}
    return (
        run.status,
        run.output,
        run.usage,
        run.messages,
        run.pending,
        [
            (
                s.kind,
                "A" if s.name == name else s.name,
                s.status,
                s.input,
                s.output,
                s.usage,
                s.attributes,
                s.replayed,
                None if s.error is None else (s.error.type, s.error.message),
                index.get(s.parent_span_id),
                s.trace_id == run.trace.trace_id,
                s.ended_at is not None and s.started_at <= s.ended_at,
            )
            for s in run.trace.spans
        ],
        run.trace.status,
    )


@tool
def _shout(text: str) -> str:
    """Shouts the text."""
    return text.upper()


_PLAIN_CASES = {
    "text": (lambda: FakeModel(["hi there"]), {}, {}),
    "content off": (lambda: FakeModel(["hi there"]), {}, {"COMPOSE_TRACE_CONTENT": "0"}),
    "non-ascii, kwargs, system": (
        lambda: FakeModel(["Grüß dich, Zoë ✓"]),
        {"system": "Be terse.", "call": {"greeting": "Hi"}, "who": "Zoë"},
        {},
    ),
    "kwargs": (lambda: FakeModel(["hi there"]), {"call": {"greeting": "Hi"}}, {}),
    "tool then text": (
        lambda: FakeModel([calls(("_shout", {"text": "hey"}, "c1")), "done"]),
        {"tools": [_shout]},
        {},
    ),
    "structured": (lambda: FakeModel([{"json": {"title": "t", "count": 2}}]), {"out": Facts}, {}),
    "retried": (
        lambda: FakeModel([raising(ProviderError("flaky")), "after retry"]),
        {"retries": 1},
        {},
    ),
    "max tokens": (lambda: FakeModel([response(StopReason.MAX_TOKENS, "length")]), {}, {}),
    "provider error": (lambda: FakeModel([raising(ProviderError("down"))]), {}, {}),
}


@pytest.mark.sqlite_file
@pytest.mark.parametrize("case", list(_PLAIN_CASES))
def test_agent52_straight_line_standalone_call_stores_what_the_general_path_stores(
    case, monkeypatch
):
    """AGENT-52, OBS-5, AGENT-55: a fresh standalone call made in one straight
    line (`_standalone_plain`) stores the same run and span rows, column by
    column, and returns the same `Run` and trace as the general standalone
    path, for a text reply (with and without keyword arguments, a system
    override, content capture off), a tool batch, structured output, a
    retried call, a stop reason that fails and a provider error."""
    from composeai import agentfn

    make_model, options, env = _PLAIN_CASES[case]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    straight = []
    made = agentfn._standalone_plain

    def counted(*args):
        straight.append(True)
        return made(*args)

    monkeypatch.setattr(agentfn, "_standalone_plain", counted)
    outcomes = {}
    for side in ("general", "straight"):

        def plain(who, *, greeting="Hello"):
            """You greet people."""
            return f"{greeting}, {who}!"

        plain.__annotations__ = {"who": str, "greeting": str, "return": options.get("out", str)}
        decorated = agent(
            model=make_model(),
            name=f"plain_{side}",
            tools=options.get("tools", ()),
            retries=options.get("retries", 0),
        )(plain)
        kwargs = dict(options.get("call", {}))
        if "system" in options:
            kwargs["system"] = options["system"]
        with monkeypatch.context() as patch:
            if side == "general":
                patch.setattr(agentfn, "_plain_standalone", lambda agent, opts: False)
            try:
                result = _run_view(
                    decorated.run(options.get("who", "Ada"), **kwargs), f"plain_{side}"
                )
            except ComposeError as exc:
                result = (type(exc), str(exc).replace(f"plain_{side}", "A"))
        outcomes[side] = (result, _stored_call(f"plain_{side}"))
    assert straight == [True]
    assert outcomes["straight"] == outcomes["general"]
    runs, spans = outcomes["straight"][1]
    assert len(runs) == 1 and spans
    # The run owns its trace: no `traces` row, every span under -rid.
    assert runs[0][10] == 0 and all(s[-1] == 1 for s in spans)


def test_agent23_stop_reason_error_becomes_a_retryable_provider_error():
    @agent(model=FakeModel([response(StopReason.ERROR, "overloaded")]))
    def errs(x: str) -> str:
        return x

    with pytest.raises(ProviderError) as info:
        errs.run("q")
    assert str(info.value) == "model returned stop_reason=ERROR (raw='overloaded')"

    model = FakeModel([response(StopReason.ERROR, "overloaded"), "fine"])

    @agent(model=model, retries=1)
    def retried(x: str) -> str:
        return x

    run = retried.run("q")
    assert run.output == "fine"
    assert spans(run, "llm")[0].attributes["retries"] == [
        {"type": "ProviderError", "message": "model returned stop_reason=ERROR (raw='overloaded')"}
    ]


def test_agent23_fallback_model_takes_over_the_rest_of_the_attempt():
    @tool
    def noop() -> str:
        """Does nothing."""
        return "ok"

    primary = FakeModel([raising(ProviderError("primary down")), "unused"])
    backup = FakeModel([calls(("noop", {}, "c1")), "from fallback"])

    @agent(model=primary, fallback=backup, tools=[noop])
    def sturdy(x: str) -> str:
        return x

    run = sturdy.run("q")
    assert run.output == "from fallback"
    assert root_agent_span(run).attributes["fallback_used"] == "FakeModel"
    assert len(primary.requests) == 1
    assert len(backup.requests) == 2
    assert spans(run, "llm")[-1].status == "ok"


def test_agent23_fallback_string_is_resolved_lazily_and_labelled(clean_providers):
    made = []

    def factory(model_id):
        made.append(model_id)
        return FakeModel(["backup answer"])

    registry.register_provider("acme", factory)
    primary = FakeModel([raising(ProviderError("down"))])

    @agent(model=primary, fallback="acme/backup-1")
    def lazy_fallback(x: str) -> str:
        return x

    assert made == []
    run = lazy_fallback.run("q")
    assert run.output == "backup answer"
    assert made == ["backup-1"]
    assert root_agent_span(run).attributes["fallback_used"] == "acme/backup-1"
    last = spans(run, "llm")[-1]
    assert last.name == "acme/backup-1"
    assert last.attributes == {"model": "backup-1", "provider": "acme"}


def test_agent23_fallback_failure_propagates():
    final = ProviderError("backup down too")

    @agent(model=FakeModel([raising(ProviderError("x"))]), fallback=FakeModel([raising(final)]))
    def doomed(x: str) -> str:
        return x

    with pytest.raises(ProviderError) as info:
        doomed.run("q")
    assert info.value is final


def test_agent24_max_tokens_messages():
    @agent(model=FakeModel([response(StopReason.MAX_TOKENS, "max_tokens", text="cut")]))
    def short(x: str) -> str:
        return x

    with pytest.raises(ComposeError) as info:
        short.run("q")
    assert type(info.value) is ComposeError
    assert str(info.value) == (
        "@agent 'short' hit max_tokens=16000 before finishing its response; raise max_tokens to "
        "give it more room"
    )

    usage = Usage(input_tokens=5, output_tokens=500, reasoning_tokens=480)

    @agent(
        model=FakeModel([response(StopReason.MAX_TOKENS, "length", usage=usage)]), max_tokens=500
    )
    def thinker(x: str) -> str:
        return x

    with pytest.raises(ComposeError) as info:
        thinker.run("q")
    assert str(info.value) == (
        "@agent 'thinker' hit max_tokens=500 before finishing its response; raise max_tokens to "
        "give it more room (it spent 480 tokens on internal reasoning before any visible output "
        "-- reasoning models can need a much larger max_tokens)"
    )


def test_agent24_refusal():
    @agent(model=FakeModel([response(StopReason.REFUSAL, "content_filter")]))
    def prude(x: str) -> str:
        return x

    with pytest.raises(ModelRefusalError) as info:
        prude.run("q")
    assert str(info.value) == "@agent 'prude': the model refused to respond"
    assert info.value.raw == "content_filter"


def test_agent24_tool_use_without_tool_calls():
    @agent(model=FakeModel([response(StopReason.TOOL_USE, "tool_use", text="hm")]))
    def confused(x: str) -> str:
        return x

    with pytest.raises(ComposeError) as info:
        confused.run("q")
    assert str(info.value) == (
        "@agent 'confused': the model returned stop_reason=TOOL_USE but the response contained "
        "no tool call parts (a provider/adapter bug) -- refusing to append an empty tool-results "
        "message"
    )


def test_agent24_unhandled_stop_reason():
    @agent(model=FakeModel([response(StopReason.OTHER, "weird")]))
    def odd(x: str) -> str:
        return x

    with pytest.raises(ComposeError) as info:
        odd.run("q")
    assert str(info.value) == (
        f"@agent 'odd': unhandled stop_reason {StopReason.OTHER!r} (raw='weird')"
    )


def test_agent22_llm_span_and_default_request_fields():
    model = FakeModel(["hi"])

    @agent(model=model)
    def defaults(x: str) -> str:
        """Sys."""
        return x

    run = defaults.run("q")
    (llm,) = spans(run, "llm")
    assert llm.name == "FakeModel"
    assert llm.attributes == {"model": "FakeModel"}
    assert llm.input == {"system": "Sys.", "messages": [Message.user("q")]}
    assert llm.output == Message.assistant("hi")
    assert llm.usage == Usage(input_tokens=10, output_tokens=20, cost_complete=False)
    assert llm.parent_span_id == root_agent_span(run).span_id
    (req,) = model.requests
    assert req == ModelRequest(
        model="FakeModel",
        messages=[Message.user("q")],
        system="Sys.",
        tools=None,
        output_schema=None,
        max_tokens=16000,
        temperature=None,
        provider=None,
        prompt_cache=True,
        thinking=None,
        effort=None,
        thinking_budget=None,
    )


def test_agent22_knobs_are_passed_on_every_request():
    model = FakeModel(["hi"])

    @agent(
        model=model,
        temperature=0.3,
        max_tokens=123,
        prompt_cache=False,
        thinking=True,
        effort="low",
        thinking_budget=2048,
    )
    def knobs(x: str) -> str:
        return x

    knobs.run("q")
    req = model.requests[0]
    assert (req.temperature, req.max_tokens, req.prompt_cache) == (0.3, 123, False)
    assert (req.thinking, req.effort, req.thinking_budget) == (True, "low", 2048)


def test_agent22_model_label_from_model_id_and_from_strings(clean_providers):
    inner = FakeModel(["a"])

    class Labelled:
        model_id = "m-1"

        def complete(self, request):
            return inner.complete(request)

    @agent(model=Labelled())
    def labelled(x: str) -> str:
        return x

    run = labelled.run("q")
    (llm,) = spans(run, "llm")
    assert llm.name == "m-1" and llm.attributes == {"model": "m-1"}
    assert inner.requests[0].model == "m-1" and inner.requests[0].provider is None

    target = FakeModel(["b"])
    registry.register_provider("acme", lambda model_id: target)

    @agent(model="acme/family/model-2")
    def stringly(x: str) -> str:
        return x

    run = stringly.run("q")
    (llm,) = spans(run, "llm")
    assert llm.name == "acme/family/model-2"
    assert llm.attributes == {"model": "family/model-2", "provider": "acme"}
    assert target.requests[0].model == "family/model-2"
    assert target.requests[0].provider == "acme"


def test_agent26_completed_run_fields():
    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    model = FakeModel([calls(("add", {"a": 1, "b": 2}, "c1")), "three"])

    @agent(model=model, tools=[add])
    def adder(x: str) -> str:
        return x

    run = adder.run("q")
    assert run.status == "completed" and run.output == "three" and run.pending is None
    assert run.usage == Usage(input_tokens=20, output_tokens=40, cost_usd=None, cost_complete=False)
    assert run.messages == [
        Message.user("q"),
        Message(
            role="assistant", parts=[ToolCallPart(id="c1", name="add", arguments={"a": 1, "b": 2})]
        ),
        Message(role="user", parts=[ToolResultPart(tool_call_id="c1", content="3")]),
        Message.assistant("three"),
    ]
    assert run.trace.trace_id == row(run.id)["trace_id"]
    assert run.trace.spans[0].kind == "agent" and run.trace.spans[0].parent_span_id is None


def test_agent48_call_sugar_returns_the_output():
    @agent(model=FakeModel(["sugar"]))
    def sweet(x: str) -> str:
        return x

    assert sweet("q") == "sugar"


# =========================================================================== tools in the loop


def test_agent35_results_fed_back_in_call_order_as_one_user_message():
    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    @tool
    def info(name: str) -> dict:
        """Info."""
        return {"name": name, "n": 1}

    model = FakeModel(
        [calls(("add", {"a": 1, "b": 2}, "c1"), ("info", {"name": "x"}, "c2")), "done"]
    )

    @agent(model=model, tools=[add, info])
    def two_tools(x: str) -> str:
        return x

    run = two_tools.run("q")
    assert model.requests[1].messages[-1] == Message(
        role="user",
        parts=[
            ToolResultPart(tool_call_id="c1", content="3"),
            ToolResultPart(tool_call_id="c2", content=json.dumps({"name": "x", "n": 1})),
        ],
    )
    tool_spans = spans(run, "tool")
    assert sorted(s.name for s in tool_spans) == ["add", "info"]
    add_span = next(s for s in tool_spans if s.name == "add")
    assert add_span.input == {"a": 1, "b": 2} and add_span.output == "3"
    assert add_span.status == "ok"
    assert model.requests[0].tools == [add.spec, info.spec]


def test_agent36_tool_exception_becomes_an_error_result_and_the_loop_continues():
    @tool
    def explode(x: int) -> str:
        """Explode."""
        raise ValueError(f"bad input {x}")

    model = FakeModel([calls(("explode", {"x": 3}, "c1"), ("explode", {"x": "nope"}, "c2")), "ok"])

    @agent(model=model, tools=[explode])
    def careless(x: str) -> str:
        return x

    run = careless.run("q")
    assert run.output == "ok"
    first, second = model.requests[1].messages[-1].parts
    assert first == ToolResultPart(
        tool_call_id="c1", content="ValueError: bad input 3", is_error=True
    )
    assert second.is_error and second.content.startswith("ValidationError: ")
    tool_spans = spans(run, "tool")
    assert {s.status for s in tool_spans} == {"error"}
    assert {s.error.type for s in tool_spans} == {"ValueError", "ValidationError"}


def test_agent36_unknown_tool():
    model = FakeModel([calls(("ghost", {"a": 1}, "c1")), "ok"])

    @agent(model=model)
    def haunted(x: str) -> str:
        return x

    run = haunted.run("q")
    assert model.requests[1].messages[-1].parts == [
        ToolResultPart(tool_call_id="c1", content="unknown tool", is_error=True)
    ]
    (span,) = spans(run, "tool")
    assert span.name == "ghost" and span.status == "error"
    assert span.error.type == "UnknownToolError"
    assert span.error.message == "the model called tool 'ghost' but this agent has no such tool"


def test_agent35_unencodable_tool_result_is_an_error_result_not_a_crash():
    class Opaque:
        pass

    @tool
    def weird() -> Any:
        """Returns something unencodable."""
        return Opaque()

    model = FakeModel([calls(("weird", {}, "c1")), "ok"])

    @agent(model=model, tools=[weird])
    def handles_weird(x: str) -> str:
        return x

    run = handles_weird.run("q")
    assert run.output == "ok"
    (part,) = model.requests[1].messages[-1].parts
    assert part.is_error and part.tool_call_id == "c1"
    assert part.content.startswith("SerializationError: ")
    assert row(run.id)["status"] == "completed"


def test_agent35_unencodable_tool_result_inside_a_flow_keeps_the_journal_entry():
    class Opaque:
        pass

    @tool
    def weird() -> Any:
        """Returns something unencodable."""
        return Opaque()

    model = FakeModel([calls(("weird", {}, "c1")), "ok"])

    @agent(model=model, tools=[weird])
    def flow_weird(x: str) -> str:
        return x

    @compose.flow
    def wrapper() -> str:
        return flow_weird("q")

    run = wrapper.run()
    assert run.status == "completed" and run.output == "ok"
    assert journal(run.id)["flow_weird#1"] == '"ok"'


def test_agent37_sync_tool_timeout_is_an_error_result():
    release = threading.Event()

    @tool(timeout=0.2)
    def stuck() -> str:
        """Hangs."""
        release.wait(10)
        return "late"

    model = FakeModel([calls(("stuck", {}, "c1")), "ok"])

    @agent(model=model, tools=[stuck])
    def impatient(x: str) -> str:
        return x

    try:
        t0 = time.monotonic()
        assert impatient.run("q").output == "ok"
        assert time.monotonic() - t0 < 5
    finally:
        release.set()
    (part,) = model.requests[1].messages[-1].parts
    assert part == ToolResultPart(
        tool_call_id="c1",
        content=(
            "TaskTimeoutError: @tool 'stuck' exceeded timeout=0.2s -- the abandoned thread keeps "
            "running in the background as a daemon; its eventual result is discarded, and it "
            "loses journal write access immediately (its pure side effects, if any, still run to "
            "completion -- there is no safe way to stop that)"
        ),
        is_error=True,
    )


def test_agent37_async_tool_timeout_is_cancelled_cooperatively():
    @tool(timeout=0.2)
    async def stuck_async() -> str:
        """Hangs."""
        await asyncio.sleep(10)
        return "late"

    model = FakeModel(
        [calls(("stuck_async", {}, "c1")), "ok", calls(("stuck_async", {}, "c2")), "ok"]
    )

    @agent(model=model, tools=[stuck_async])
    def impatient_async(x: str) -> str:
        return x

    expected = (
        "TaskTimeoutError: @tool 'stuck_async' exceeded timeout=0.2s (cancelled cooperatively)"
    )
    assert impatient_async.run("q").output == "ok"
    assert model.requests[1].messages[-1].parts[0].content == expected
    assert asyncio.run(impatient_async.arun("q")).output == "ok"
    assert model.requests[3].messages[-1].parts[0].content == expected


def test_agent40_sync_tools_in_one_batch_run_concurrently():
    barrier = threading.Barrier(2, timeout=10)

    @tool
    def left() -> str:
        """Left."""
        barrier.wait()
        return "L"

    @tool
    def right() -> str:
        """Right."""
        barrier.wait()
        return "R"

    def script():
        return [calls(("left", {}, "c1"), ("right", {}, "c2")), "done"]

    model = FakeModel(script() + script())

    @agent(model=model, tools=[left, right])
    def parallel(x: str) -> str:
        return x

    assert parallel.run("q").output == "done"
    assert model.requests[1].messages[-1].parts == [
        ToolResultPart(tool_call_id="c1", content="L"),
        ToolResultPart(tool_call_id="c2", content="R"),
    ]
    barrier.reset()
    assert asyncio.run(parallel.arun("q")).output == "done"
    assert [p.content for p in model.requests[3].messages[-1].parts] == ["L", "R"]


def test_agent40_async_tools_in_one_batch_run_concurrently():
    events: dict[str, asyncio.Event] = {}

    def ev(name):
        return events.setdefault(name, asyncio.Event())

    @tool
    async def ping() -> str:
        """Ping."""
        ev("ping").set()
        await asyncio.wait_for(ev("pong").wait(), 10)
        return "ping"

    @tool
    async def pong() -> str:
        """Pong."""
        ev("pong").set()
        await asyncio.wait_for(ev("ping").wait(), 10)
        return "pong"

    model = FakeModel([calls(("ping", {}, "c1"), ("pong", {}, "c2")), "done"])

    @agent(model=model, tools=[ping, pong])
    def handshake(x: str) -> str:
        return x

    assert asyncio.run(handshake.arun("q")).output == "done"
    assert model.requests[1].messages[-1].parts == [
        ToolResultPart(tool_call_id="c1", content="ping"),
        ToolResultPart(tool_call_id="c2", content="pong"),
    ]


def test_agent30_async_tool_bodies_from_a_sync_run():
    @tool
    async def fetch(url: str) -> str:
        """Fetch."""
        await asyncio.sleep(0)
        return f"page {url}"

    model = FakeModel([calls(("fetch", {"url": "u"}, "c1")), "done"])

    @agent(model=model, tools=[fetch])
    def browser(x: str) -> str:
        return x

    assert browser.run("q").output == "done"
    assert model.requests[1].messages[-1].parts == [
        ToolResultPart(tool_call_id="c1", content="page u")
    ]


# =========================================================================== approval


def make_mailer(counter: list):
    @tool(requires_approval=True)
    def send_email(to: str) -> str:
        """Send an email."""
        counter.append(to)
        return f"sent to {to}"

    return send_email


def test_agent41_gated_tool_pauses_a_standalone_run():
    sent: list = []
    send_email = make_mailer(sent)
    model = FakeModel(
        [calls(("send_email", {"to": "a@b"}, "c1")), calls(("send_email", {"to": "z"}, "c9"))]
    )

    @agent(model=model, tools=[send_email])
    def mailer(x: str) -> str:
        return x

    run = mailer.run("q")
    assert run.status == "paused"
    assert run.output is None and run.messages == [] and run.usage == Usage()
    assert run.pending == Interrupt(
        id="tool:send_email:c1",
        kind="approval",
        question=None,
        payload={"tool": "send_email", "arguments": {"to": "a@b"}},
    )
    assert sent == []
    assert row(run.id)["status"] == "paused" and row(run.id)["kind"] == "agent"
    assert _engine.get_store().pending(run.id) == [
        ("tool:send_email:c1", "approval", None, '{"tool":"send_email","arguments":{"to":"a@b"}}')
    ]
    (pause,) = spans(run, "pause")
    assert pause.name == "tool:send_email:c1" and pause.status == "paused"
    assert root_agent_span(run).status == "paused"
    assert mailer("again") is None  # sugar on a paused run


@pytest.mark.parametrize("key", ["tool:send_email:c1", "send_email"])
def test_agent41_resume_with_true_runs_the_tool(key):
    sent: list = []
    send_email = make_mailer(sent)
    model = FakeModel([calls(("send_email", {"to": "a@b"}, "c1")), "done"])

    @agent(model=model, tools=[send_email])
    def mailer(x: str) -> str:
        return x

    paused = mailer.run("q")
    resumed = compose.resume(paused.id, answers={key: True})
    assert resumed.status == "completed" and resumed.output == "done"
    assert resumed.id == paused.id
    assert sent == ["a@b"]
    assert len(model.requests) == 2
    assert model.requests[1].messages[-1].parts == [
        ToolResultPart(tool_call_id="c1", content="sent to a@b")
    ]
    assert resumed.messages[0] == Message.user("q")
    assert row(paused.id)["status"] == "completed"
    assert journal(paused.id)["__interrupt__:tool:send_email:c1"] == "true"
    assert resumed.trace.trace_id == paused.trace.trace_id


def test_agent41_resume_with_false_denies():
    sent: list = []
    send_email = make_mailer(sent)
    model = FakeModel([calls(("send_email", {"to": "a@b"}, "c1")), "ok, not sent"])

    @agent(model=model, tools=[send_email])
    def mailer(x: str) -> str:
        return x

    paused = mailer.run("q")
    resumed = compose.resume(paused.id, answers={"send_email": False})
    assert resumed.output == "ok, not sent"
    assert sent == []
    assert model.requests[1].messages[-1].parts == [
        ToolResultPart(tool_call_id="c1", content="denied by user", is_error=True)
    ]
    (span,) = spans(resumed, "tool")
    assert span.name == "send_email" and span.status == "ok" and span.output == "denied by user"


def test_agent45_approver_bool_and_approval_reply():
    sent: list = []
    send_email = make_mailer(sent)
    seen: list = []

    def approver(interrupt):
        seen.append(interrupt)
        return interrupt.payload["arguments"]["to"] == "ok@x"

    model = FakeModel(
        [calls(("send_email", {"to": "ok@x"}, "c1"), ("send_email", {"to": "no@x"}, "c2")), "done"]
    )

    @agent(model=model, tools=[send_email])
    def mailer(x: str) -> str:
        return x

    run = mailer.run("q", approver=approver)
    assert run.status == "completed"
    assert sent == ["ok@x"]
    assert [i.id for i in seen] == ["tool:send_email:c1", "tool:send_email:c2"]
    assert seen[0] == Interrupt(
        id="tool:send_email:c1",
        kind="approval",
        payload={"tool": "send_email", "arguments": {"to": "ok@x"}},
    )
    assert model.requests[1].messages[-1].parts == [
        ToolResultPart(tool_call_id="c1", content="sent to ok@x"),
        ToolResultPart(tool_call_id="c2", content="denied by user", is_error=True),
    ]
    decisions = journal(run.id)
    assert decisions["__interrupt__:tool:send_email:c1"] == "true"
    assert decisions["__interrupt__:tool:send_email:c2"] == "false"


def test_agent43_approval_reply_message_is_the_denied_result():
    sent: list = []
    send_email = make_mailer(sent)
    replies = iter(
        [ApprovalReply(allow=False, message="not to them"), ApprovalReply(allow=True, message="x")]
    )
    model = FakeModel(
        [calls(("send_email", {"to": "a"}, "c1"), ("send_email", {"to": "b"}, "c2")), "done"]
    )

    @agent(model=model, tools=[send_email])
    def mailer(x: str) -> str:
        return x

    run = mailer.run("q", approver=lambda i: next(replies))
    assert run.output == "done"
    assert sent == ["b"]
    assert model.requests[1].messages[-1].parts == [
        ToolResultPart(tool_call_id="c1", content="not to them", is_error=True),
        ToolResultPart(tool_call_id="c2", content="sent to b"),
    ]


def test_agent41_gated_tools_sequential_and_several_pauses_persisted():
    sent: list = []
    send_email = make_mailer(sent)
    model = FakeModel(
        [calls(("send_email", {"to": "a"}, "c1"), ("send_email", {"to": "b"}, "c2")), "done"]
    )

    @agent(model=model, tools=[send_email])
    def mailer(x: str) -> str:
        return x

    paused = mailer.run("q")
    assert paused.pending.id == "tool:send_email:c1"  # first in call order wins
    ids = sorted(p[0] for p in _engine.get_store().pending(paused.id))
    assert ids == ["tool:send_email:c1", "tool:send_email:c2"]
    with pytest.raises(ConfigError, match="ambiguous"):
        compose.resume(paused.id, answers={"send_email": True})
    done = compose.resume(
        paused.id, answers={"tool:send_email:c1": True, "tool:send_email:c2": False}
    )
    assert done.output == "done"
    assert sent == ["a"]


def test_agent42_gated_tool_without_a_durable_run_is_a_config_error():
    sent: list = []
    send_email = make_mailer(sent)
    model = FakeModel([calls(("send_email", {"to": "a"}, "c1")), "done"])

    @agent(model=model, tools=[send_email])
    def mailer(x: str) -> str:
        return x

    @compose.task
    def outside() -> str:
        return mailer("q")  # nested plain run: no row, no flow

    with pytest.raises(ConfigError) as info:
        outside()
    assert str(info.value) == NO_RUN
    assert sent == []


# =========================================================================== interception


class Interceptor:
    def __init__(self, before=None, after=None):
        self._before = before
        self._after = after
        self.befores: list = []
        self.afters: list = []

    def before(self, call):
        self.befores.append(call)
        return self._before(call) if self._before else None

    def after(self, call, result):
        self.afters.append((call, result))
        return self._after(call, result) if self._after else None


def test_agent46_interceptor_deny_and_rewrite_arguments():
    executed: list = []

    @tool
    def rm(path: str) -> str:
        """Remove a file."""
        executed.append(path)
        return f"removed {path}"

    def before(call):
        if call.arguments["path"] == "/":
            return BeforeTool(action="deny", message="refusing to remove /")
        if call.arguments["path"] == "/tmp/x":
            return BeforeTool(arguments={"path": "/tmp/safe"})
        if call.arguments["path"] == "quiet":
            return BeforeTool(action="deny")
        return BeforeTool()

    interceptor = Interceptor(before=before)
    assert isinstance(interceptor, ToolInterceptor)
    model = FakeModel(
        [
            calls(
                ("rm", {"path": "/"}, "c1"),
                ("rm", {"path": "/tmp/x"}, "c2"),
                ("rm", {"path": "quiet"}, "c3"),
                ("rm", {"path": "plain"}, "c4"),
            ),
            "done",
        ]
    )

    @agent(model=model, tools=[rm])
    def cleaner(x: str) -> str:
        return x

    run = cleaner.run("q", tool_interceptor=interceptor)
    assert run.output == "done"
    assert sorted(executed) == ["/tmp/safe", "plain"]
    assert [c.id for c in interceptor.befores] == ["c1", "c2", "c3", "c4"]
    assert model.requests[1].messages[-1].parts == [
        ToolResultPart(tool_call_id="c1", content="refusing to remove /", is_error=True),
        ToolResultPart(tool_call_id="c2", content="removed /tmp/safe"),
        ToolResultPart(tool_call_id="c3", content="blocked by tool interceptor", is_error=True),
        ToolResultPart(tool_call_id="c4", content="removed plain"),
    ]
    # after() runs for live executions only, never for denials
    assert sorted(c.id for c, _ in interceptor.afters) == ["c2", "c4"]
    # AGENT-44: a denied call still has a tool span, status ok
    denied_spans = [s for s in spans(run, "tool") if s.output == "refusing to remove /"]
    assert len(denied_spans) == 1 and denied_spans[0].status == "ok"


def test_agent46_interceptor_after_replaces_results():
    @tool
    def secret() -> str:
        """Secret."""
        return "password123"

    def after(call, result):
        return ToolResultPart(tool_call_id=result.tool_call_id, content="[redacted]")

    model = FakeModel([calls(("secret", {}, "c1")), "done"])

    @agent(model=model, tools=[secret])
    def leaky(x: str) -> str:
        return x

    leaky.run("q", tool_interceptor=Interceptor(after=after))
    assert model.requests[1].messages[-1].parts == [
        ToolResultPart(tool_call_id="c1", content="[redacted]")
    ]


def test_agent46_interceptor_deny_skips_the_approver():
    sent: list = []
    send_email = make_mailer(sent)
    asked: list = []
    model = FakeModel([calls(("send_email", {"to": "a"}, "c1")), "done"])

    @agent(model=model, tools=[send_email])
    def mailer(x: str) -> str:
        return x

    run = mailer.run(
        "q",
        approver=lambda i: asked.append(i) or True,
        tool_interceptor=Interceptor(before=lambda c: BeforeTool(action="deny")),
    )
    assert run.status == "completed"
    assert asked == [] and sent == []


def test_agent46_after_is_not_called_for_approver_denials():
    sent: list = []
    send_email = make_mailer(sent)
    interceptor = Interceptor()
    model = FakeModel([calls(("send_email", {"to": "a"}, "c1")), "done"])

    @agent(model=model, tools=[send_email])
    def mailer(x: str) -> str:
        return x

    run = mailer.run("q", approver=lambda i: False, tool_interceptor=interceptor)
    assert run.status == "completed"
    assert interceptor.afters == []


# =========================================================================== context manager


def test_agent47_context_manager_sees_a_copy_and_previous_input_tokens():
    @tool
    def noop() -> str:
        """Noop."""
        return "ok"

    seen: list = []

    def manage(messages, input_tokens):
        seen.append((list(messages), input_tokens))
        messages.append(Message.user("mutating the copy must not leak"))
        return messages[:-1]

    model = FakeModel([calls(("noop", {}, "c1")), "done"], usage=Usage(input_tokens=7))

    @agent(model=model, tools=[noop])
    def managed(x: str) -> str:
        return x

    run = managed.run("q", context_manager=manage)
    assert run.output == "done"
    assert [(len(m), t) for m, t in seen] == [(1, 0), (3, 7)]
    assert seen[0][0] == [Message.user("q")]
    assert model.requests[1].messages == seen[1][0]


def test_agent47_returned_list_replaces_the_conversation():
    model = FakeModel(["answer"])

    @agent(model=model)
    def trimmed(x: str) -> str:
        return x

    run = trimmed.run("long prompt", context_manager=lambda m, t: [Message.user("short")])
    assert model.requests[0].messages == [Message.user("short")]
    assert run.messages == [Message.user("short"), Message.assistant("answer")]


@pytest.mark.parametrize("bad", ["text", [Message.user("ok"), "str"], None, (Message.user("t"),)])
def test_agent47_bad_return_is_a_config_error(bad):
    model = FakeModel(["never"])

    @agent(model=model, name="cm_bad")
    def cm_bad(x: str) -> str:
        return x

    with pytest.raises(ConfigError) as info:
        cm_bad.run("q", context_manager=lambda m, t: bad)
    assert str(info.value) == "context_manager must return list[Message]"
    assert model.requests == []


# =========================================================================== durability


@pytest.mark.sqlite_file
def test_agent51_agent_call_in_a_flow_is_one_journaled_step():
    model = FakeModel(["draft one", "draft two"])

    @agent(model=model)
    def writer(topic: str) -> str:
        return topic

    @compose.flow
    def pipeline() -> list:
        return [writer("a"), writer.run("b").output]

    run = pipeline.run()
    assert run.output == ["draft one", "draft two"]
    entries = journal(run.id)
    assert entries["writer#1"] == '"draft one"'
    assert entries["writer#2"] == '"draft two"'
    agent_spans = spans(run, "agent")
    assert [s.attributes["step_key"] for s in agent_spans] == ["writer#1", "writer#2"]
    assert all(s.replayed is False for s in agent_spans)
    assert [r[0] for r in run_rows()] == [run.id]


def test_agent51_resume_replays_the_agent_step_without_calling_the_model():
    model = FakeModel(["the draft"])

    @agent(model=model)
    def writer(topic: str) -> str:
        return topic

    @compose.flow
    def publish() -> str:
        draft = writer("owls")
        if compose.approve("publish"):
            return draft
        return "rejected"

    first = publish.run()
    assert first.status == "paused" and first.pending.id == "publish"
    assert len(model.requests) == 1
    second = compose.resume(first.id, answers={"publish": True})
    assert second.status == "completed" and second.output == "the draft"
    assert len(model.requests) == 1  # replayed, not re-called
    (replayed,) = spans(second, "agent")
    assert replayed.name == "writer" and replayed.replayed is True
    assert replayed.attributes == {"step_key": "writer#1"}
    assert replayed.output == "the draft"
    assert spans(second, "llm") == []


def test_agent51_replayed_step_run_shape():
    model = FakeModel(["x"])

    @agent(model=model)
    def writer(topic: str) -> str:
        return topic

    captured = []

    @compose.flow
    def f() -> str:
        r = writer.run("t")
        captured.append(r)
        compose.approve("go")
        return r.output

    first = f.run()
    compose.resume(first.id, answers={"go": True})
    live, replay = captured
    assert live.status == "completed" and live.output == "x"
    assert live.messages == [Message.user("t"), Message.assistant("x")]
    assert live.usage == Usage(input_tokens=10, output_tokens=20, cost_complete=False)
    assert replay.status == "completed" and replay.output == "x"
    assert replay.usage == Usage() and replay.messages == []
    assert replay.id != live.id and len(replay.id) == 26


def test_agent52_standalone_run_row():
    model = FakeModel(["a", "b"])

    @agent(model=model)
    def solo(topic: str, *, tone: str = "dry") -> str:
        return topic

    run = solo.run("t", tone="wet")
    r = row(run.id)
    assert r["kind"] == "agent" and r["name"] == "solo" and r["status"] == "completed"
    assert json.loads(r["args_json"]) == {"args": ["t"], "kwargs": {"tone": "wet"}}
    assert r["output_json"] == '"a"'
    assert r["budget_json"] is None
    assert r["trace_id"] == run.trace.trace_id


def test_agent52_overrides_are_stored_in_args_json(clean_providers):
    registry.register_provider("acme", lambda model_id: FakeModel(["from acme"]))

    @agent(model=FakeModel([]))
    def solo(topic: str) -> str:
        return topic

    run = solo.run("t", system="Sys override", model="acme/zzz")
    assert run.output == "from acme"
    assert json.loads(row(run.id)["args_json"]) == {
        "args": ["t"],
        "kwargs": {},
        "system": "Sys override",
        "model": "acme/zzz",
    }


def test_agent52_unencodable_arguments_fail_before_any_row():
    model = FakeModel(["never"])

    @agent(model=model)
    def takes_anything(x: Any) -> str:
        return "q"

    class Opaque:
        pass

    with pytest.raises(SerializationError):
        takes_anything.run(Opaque())
    assert run_rows() == []
    assert model.requests == []


@pytest.mark.sqlite_file
def test_agent52_failed_standalone_run_reraises_and_marks_the_row():
    err = ProviderError("nope")
    rows_before = len(run_rows())

    @agent(model=FakeModel([raising(err)]))
    def failing(x: str) -> str:
        return x

    with pytest.raises(ProviderError) as info:
        failing.run("q")
    assert info.value is err
    (run_id,) = [r[0] for r in run_rows()][rows_before:]
    r = row(run_id)
    assert r["status"] == "failed"
    assert json.loads(r["error_json"]) == {"type": "ProviderError", "message": "nope"}


def test_agent53_snapshot_restore_does_not_rerun_completed_tools_of_the_batch():
    counted: list = []
    sent: list = []

    @tool
    def count_words(text: str) -> int:
        """Count words."""
        counted.append(text)
        return len(text.split())

    send_email = make_mailer(sent)
    model = FakeModel(
        [
            calls(("count_words", {"text": "a b c"}, "c1"), ("send_email", {"to": "x"}, "c2")),
            "all done",
        ]
    )

    @agent(model=model, tools=[count_words, send_email])
    def assistant(x: str) -> str:
        return x

    paused = assistant.run("q")
    assert paused.status == "paused" and paused.pending.id == "tool:send_email:c2"
    assert counted == ["a b c"] and sent == []
    resumed = compose.resume(paused.id, answers={"send_email": True})
    assert resumed.status == "completed" and resumed.output == "all done"
    assert counted == ["a b c"]  # not re-run
    assert sent == ["x"]
    assert len(model.requests) == 2
    assert model.requests[1].messages == [
        Message.user("q"),
        Message(
            role="assistant",
            parts=[
                ToolCallPart(id="c1", name="count_words", arguments={"text": "a b c"}),
                ToolCallPart(id="c2", name="send_email", arguments={"to": "x"}),
            ],
        ),
        Message(
            role="user",
            parts=[
                ToolResultPart(tool_call_id="c1", content="3"),
                ToolResultPart(tool_call_id="c2", content="sent to x"),
            ],
        ),
    ]
    assert resumed.messages[-1] == Message.assistant("all done")


def test_agent53_turn_counter_is_restored_from_the_snapshot():
    sent: list = []
    send_email = make_mailer(sent)

    @tool
    def noop() -> str:
        """Noop."""
        return "ok"

    model = FakeModel(
        [
            calls(("noop", {}, "c1")),
            calls(("send_email", {"to": "x"}, "c2")),
            calls(("noop", {}, "c3")),
            "done",
        ]
    )

    @agent(model=model, tools=[noop, send_email], max_turns=3)
    def bounded(x: str) -> str:
        return x

    paused = bounded.run("q")
    assert paused.status == "paused"
    # turn 3 is the last allowed turn; a fourth must fail even across the resume
    with pytest.raises(MaxTurnsExceededError):
        compose.resume(paused.id, answers={"send_email": True})
    assert len(model.requests) == 3
    assert row(paused.id)["status"] == "failed"


def test_agent54_resume_of_an_unregistered_agent():
    sent: list = []
    send_email = make_mailer(sent)

    @agent(model=FakeModel([calls(("send_email", {"to": "x"}, "c1"))]), tools=[send_email])
    def forgotten(x: str) -> str:
        return x

    paused = forgotten.run("q")
    reset_registries()
    with pytest.raises(ConfigError) as info:
        compose.resume(paused.id, answers={"send_email": True})
    assert str(info.value) == (
        "agent 'forgotten' is not registered in this process -- import the module that defines "
        f"it (so its @agent decoration runs) before calling resume(): `import {__name__}` "
        f"(compose commands: --import {__name__})"
    )
    assert row(paused.id)["status"] == "paused"


def test_agent54_resume_of_a_completed_standalone_run_returns_the_stored_output():
    model = FakeModel(["stored"])

    @agent(model=model)
    def once(x: str) -> str:
        return x

    run = once.run("q")
    again = compose.resume(run.id)
    assert again.status == "completed" and again.output == "stored" and again.id == run.id
    assert again.messages == [] and again.usage == Usage()
    assert len(model.requests) == 1


def test_agent54_resume_reuses_stored_overrides(clean_providers):
    sent: list = []
    send_email = make_mailer(sent)
    target = FakeModel([calls(("send_email", {"to": "x"}, "c1")), "done via acme"])
    registry.register_provider("acme", lambda model_id: target)

    @agent(model=FakeModel([]), tools=[send_email])
    def routed(x: str) -> str:
        """Doc."""
        return x

    paused = routed.run("q", system="Override", model="acme/m")
    assert paused.status == "paused"
    done = compose.resume(paused.id, answers={"send_email": True})
    assert done.output == "done via acme"
    assert [r.system for r in target.requests] == ["Override", "Override"]


def test_agent54_resume_passes_approver_interceptor_and_context_manager():
    sent: list = []
    send_email = make_mailer(sent)
    model = FakeModel(
        [calls(("send_email", {"to": "x"}, "c1")), calls(("send_email", {"to": "y"}, "c2")), "ok"]
    )

    @agent(model=model, tools=[send_email])
    def mailer(x: str) -> str:
        return x

    paused = mailer.run("q")
    seen_cm: list = []
    interceptor = Interceptor()
    done = compose.resume(
        paused.id,
        answers={"send_email": True},
        approver=lambda i: True,
        tool_interceptor=interceptor,
        context_manager=lambda m, t: seen_cm.append(t) or m,
    )
    assert done.output == "ok"
    assert sent == ["x", "y"]
    assert len(seen_cm) == 2
    # restored results never pass through after(); c1 runs live on resume, c2 too
    assert sorted(c.id for c, _ in interceptor.afters) == ["c1", "c2"]


def test_flow15_tool_calls_in_a_flow_journal_under_tool_scope_keys():
    @compose.task
    def t(x: str) -> str:
        return x.upper()

    @tool
    def shout(text: str) -> str:
        """Shout."""
        return t(text)

    model = FakeModel([calls(("shout", {"text": "hi"}, "c1")), "done"])

    @agent(model=model, tools=[shout])
    def loud(x: str) -> str:
        return x

    @compose.flow
    def f() -> str:
        return loud("q")

    run = f.run()
    assert run.output == "done"
    entries = journal(run.id)
    assert entries["tool:c1/t#1"] == '"HI"'
    assert entries["loud#1"] == '"done"'
    assert model.requests[1].messages[-1].parts == [ToolResultPart(tool_call_id="c1", content="HI")]


def test_agent51_gated_tool_in_a_flow_pauses_the_flow_and_resumes_from_the_snapshot():
    sent: list = []
    counted: list = []
    send_email = make_mailer(sent)

    @tool
    def note(text: str) -> str:
        """Note."""
        counted.append(text)
        return "noted"

    model = FakeModel(
        [calls(("note", {"text": "n"}, "c1"), ("send_email", {"to": "x"}, "c2")), "done"]
    )

    @agent(model=model, tools=[note, send_email])
    def helper(x: str) -> str:
        return x

    @compose.flow
    def f() -> str:
        return helper("q")

    paused = f.run()
    assert paused.status == "paused" and paused.pending.id == "tool:send_email:c2"
    done = compose.resume(paused.id, answers={"send_email": True})
    assert done.output == "done"
    assert counted == ["n"] and sent == ["x"]
    assert journal(paused.id)["helper#1"] == '"done"'


def test_agent50_nested_plain_run_inside_a_task_has_no_row():
    model = FakeModel(["inner"])

    @agent(model=model)
    def inner_agent(x: str) -> str:
        return x

    holder = []

    @compose.task
    def outer() -> str:
        run = inner_agent.run("q")
        holder.append(run)
        return run.output

    assert outer() == "inner"
    (run,) = holder
    assert run.status == "completed" and len(run.id) == 26
    assert row(run.id) is None
    assert run_rows() == []
    agent_span = next(s for s in run.trace.spans if s.kind == "agent")
    task_span = next(s for s in run.trace.spans if s.kind == "task")
    assert agent_span.parent_span_id == task_span.span_id


def test_agent52_async_standalone_pause_and_aresume():
    sent: list = []
    send_email = make_mailer(sent)
    model = FakeModel([calls(("send_email", {"to": "x"}, "c1")), "async done"])

    @agent(model=model, tools=[send_email])
    def amailer(x: str) -> str:
        return x

    async def main():
        paused = await amailer.arun("q")
        assert paused.status == "paused" and paused.pending.id == "tool:send_email:c1"
        return paused, await compose.aresume(paused.id, answers={"send_email": True})

    paused, done = asyncio.run(main())
    assert done.status == "completed" and done.output == "async done" and done.id == paused.id
    assert sent == ["x"]
    assert row(paused.id)["status"] == "completed"


def test_agent51_async_flow_step_is_journaled():
    model = FakeModel(["async draft"])

    @agent(model=model)
    def awriter(topic: str) -> str:
        return topic

    @compose.flow
    async def aflow() -> str:
        run = await awriter.arun("t")
        return run.output

    run = asyncio.run(aflow.arun())
    assert run.output == "async draft"
    assert journal(run.id)["awriter#1"] == '"async draft"'


def test_flow31_approve_inside_a_tool_of_a_standalone_agent():
    executions: list = []

    @tool
    def deploy(env: str) -> str:
        """Deploy."""
        executions.append(env)
        if not compose.approve("confirm-deploy", payload={"env": env}):
            return "cancelled"
        return f"deployed {env}"

    model = FakeModel([calls(("deploy", {"env": "prod"}, "c1")), "shipped"])

    @agent(model=model, tools=[deploy])
    def ops(x: str) -> str:
        return x

    paused = ops.run("q")
    assert paused.status == "paused"
    assert paused.pending == Interrupt(
        id="confirm-deploy", kind="approval", payload={"env": "prod"}
    )
    done = compose.resume(paused.id, answers={"confirm-deploy": True})
    assert done.output == "shipped"
    assert executions == ["prod", "prod"]  # FLOW-37: the tool re-executes from its beginning
    assert model.requests[1].messages[-1].parts == [
        ToolResultPart(tool_call_id="c1", content="deployed prod")
    ]
    assert len(model.requests) == 2


def test_agent46_restored_results_skip_before_and_after():
    counted: list = []
    sent: list = []
    send_email = make_mailer(sent)

    @tool
    def count_words(text: str) -> int:
        """Count words."""
        counted.append(text)
        return len(text.split())

    model = FakeModel(
        [
            calls(("count_words", {"text": "a b"}, "c1"), ("send_email", {"to": "x"}, "c2")),
            "done",
        ]
    )

    @agent(model=model, tools=[count_words, send_email])
    def assistant(x: str) -> str:
        return x

    paused = assistant.run("q")
    interceptor = Interceptor()
    done = compose.resume(paused.id, answers={"send_email": True}, tool_interceptor=interceptor)
    assert done.output == "done"
    assert counted == ["a b"]
    assert [c.id for c in interceptor.befores] == ["c2"]
    assert [c.id for c, _ in interceptor.afters] == ["c2"]


def test_agent53_snapshot_is_written_in_full_without_trace_content(monkeypatch):
    monkeypatch.setenv("COMPOSE_TRACE_CONTENT", "0")
    sent: list = []
    send_email = make_mailer(sent)
    model = FakeModel([calls(("send_email", {"to": "x"}, "c1")), "done"])

    @agent(model=model, tools=[send_email])
    def private(x: str) -> str:
        return x

    paused = private.run("secret prompt")
    done = compose.resume(paused.id, answers={"send_email": True})
    assert done.output == "done"
    assert model.requests[1].messages[0] == Message.user("secret prompt")
    assert all(s.input is None and s.output is None for s in done.trace.spans)


def test_test40_cache_true_serves_a_repeat_request_from_disk():
    model = FakeModel(["cached answer"])

    @agent(model=model, cache=True)
    def cached(x: str) -> str:
        return x

    first = cached.run("q")
    second = cached.run("q")
    assert first.output == second.output == "cached answer"
    assert len(model.requests) == 1
    (llm,) = spans(second, "llm")
    assert llm.attributes.get("cached") is True
    assert llm.usage == Usage()
    assert "cached" not in spans(first, "llm")[0].attributes


# =========================================================================== driver parity
# The loop is one generator with a sync and an async driver, and streaming calls take the
# provider-stream path: the same scenarios must behave identically under every entry point.

MODES = ["run", "arun", "stream", "astream"]


def invoke(fn, mode: str, *args, **kwargs):
    if mode == "run":
        return fn.run(*args, **kwargs)
    if mode == "arun":
        return asyncio.run(fn.arun(*args, **kwargs))
    if mode == "stream":
        stream = fn.stream(*args, **kwargs)
        return stream.run
    if mode == "astream":

        async def main():
            stream = fn.astream(*args, **kwargs)
            return await stream.run()

        return asyncio.run(main())
    raise AssertionError(mode)


@pytest.mark.parametrize("mode", MODES)
def test_parity_tools_errors_unknown_and_order(mode):
    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    @tool
    def explode() -> str:
        """Explode."""
        raise RuntimeError("kaboom")

    @tool
    async def shout(text: str) -> str:
        """Shout."""
        return text.upper()

    model = FakeModel(
        [
            calls(
                ("add", {"a": 2, "b": 3}, "c1"),
                ("explode", {}, "c2"),
                ("ghost", {}, "c3"),
                ("shout", {"text": "hi"}, "c4"),
            ),
            "done",
        ]
    )

    @agent(model=model, tools=[add, explode, shout])
    def mixed(x: str) -> str:
        return x

    run = invoke(mixed, mode, "q")
    assert run.status == "completed" and run.output == "done"
    assert model.requests[1].messages[-1] == Message(
        role="user",
        parts=[
            ToolResultPart(tool_call_id="c1", content="5"),
            ToolResultPart(tool_call_id="c2", content="RuntimeError: kaboom", is_error=True),
            ToolResultPart(tool_call_id="c3", content="unknown tool", is_error=True),
            ToolResultPart(tool_call_id="c4", content="HI"),
        ],
    )
    statuses = {s.name: s.status for s in spans(run, "tool")}
    assert statuses == {"add": "ok", "explode": "error", "ghost": "error", "shout": "ok"}


@pytest.mark.parametrize("mode", MODES)
def test_parity_structured_output_with_repair(mode):
    model = FakeModel(["{broken", {"json": {"title": "T", "count": 2}}])

    @agent(model=model, max_repairs=1)
    def facts(x: str) -> Facts:
        return x

    run = invoke(facts, mode, "q")
    assert run.output == Facts(title="T", count=2)
    assert len(root_agent_span(run).attributes["repairs"]) == 1
    assert (
        model.requests[1]
        .messages[-1]
        .text.startswith("Your previous reply did not match the required output schema.")
    )


@pytest.mark.parametrize("mode", MODES)
def test_parity_retries_and_fallback(mode):
    primary = FakeModel([raising(ProviderError("p1")), raising(ProviderError("p2"))])
    backup = FakeModel(["backup"])

    @agent(model=primary, retries=1, fallback=backup)
    def sturdy(x: str) -> str:
        return x

    run = invoke(sturdy, mode, "q")
    assert run.output == "backup"
    assert root_agent_span(run).attributes["fallback_used"] == "FakeModel"
    assert len(primary.requests) == 2 and len(backup.requests) == 1
    first_llm = spans(run, "llm")[0]
    assert first_llm.attributes["retries"] == [
        {"type": "ProviderError", "message": "p1"},
        {"type": "ProviderError", "message": "p2"},
    ]


@pytest.mark.parametrize("mode", MODES)
def test_parity_max_turns(mode):
    @tool
    def noop() -> str:
        """Noop."""
        return "ok"

    model = FakeModel([calls(("noop", {}, f"c{i}")) for i in range(10)])

    @agent(model=model, tools=[noop], max_turns=2)
    def looper(x: str) -> str:
        return x

    with pytest.raises(MaxTurnsExceededError):
        invoke(looper, mode, "q")
    assert len(model.requests) == 2


@pytest.mark.parametrize("mode", MODES)
def test_parity_context_manager_approver_and_interceptor(mode):
    sent: list = []
    send_email = make_mailer(sent)
    seen_cm: list = []
    asked: list = []
    interceptor = Interceptor(
        after=lambda c, r: ToolResultPart(tool_call_id=r.tool_call_id, content="[after]")
    )
    model = FakeModel(
        [calls(("send_email", {"to": "a"}, "c1"), ("send_email", {"to": "b"}, "c2")), "done"],
        usage=Usage(input_tokens=3),
    )

    @agent(model=model, tools=[send_email])
    def mailer(x: str) -> str:
        return x

    run = invoke(
        mailer,
        mode,
        "q",
        approver=lambda i: asked.append(i.id) or i.payload["arguments"]["to"] == "a",
        tool_interceptor=interceptor,
        context_manager=lambda m, t: seen_cm.append(t) or m,
    )
    assert run.status == "completed"
    assert seen_cm == [0, 3]
    assert asked == ["tool:send_email:c1", "tool:send_email:c2"]
    assert sent == ["a"]
    assert model.requests[1].messages[-1].parts[0] == ToolResultPart(
        tool_call_id="c1", content="[after]"
    )


@pytest.mark.parametrize("mode", MODES)
def test_parity_gated_pause_and_resume(mode):
    counted: list = []
    sent: list = []
    send_email = make_mailer(sent)

    @tool
    def count_words(text: str) -> int:
        """Count words."""
        counted.append(text)
        return len(text.split())

    model = FakeModel(
        [
            calls(("count_words", {"text": "x y"}, "c1"), ("send_email", {"to": "z"}, "c2")),
            "done",
        ]
    )

    @agent(model=model, tools=[count_words, send_email])
    def assistant(x: str) -> str:
        return x

    paused = invoke(assistant, mode, "q")
    assert paused.status == "paused" and paused.pending.id == "tool:send_email:c2"
    assert row(paused.id)["status"] == "paused"
    if mode in ("arun", "astream"):
        done = asyncio.run(compose.aresume(paused.id, answers={"send_email": True}))
    else:
        done = compose.resume(paused.id, answers={"send_email": True})
    assert done.output == "done"
    assert counted == ["x y"] and sent == ["z"]
    assert [p.content for p in model.requests[1].messages[-1].parts] == ["2", "sent to z"]


@pytest.mark.parametrize("mode", ["run", "stream"])
def test_parity_agent_step_in_a_flow(mode):
    model = FakeModel(["first", "second"])

    @agent(model=model)
    def writer(x: str) -> str:
        return x

    captured: list = []

    @compose.flow
    def f() -> str:
        captured.append(invoke(writer, mode, "t"))
        return writer("u")

    run = f.run()
    assert run.output == "second"
    assert set(journal(run.id)) == {"writer#1", "writer#2"}
    assert captured[0].output == "first"


# =========================================================================== more durability


def test_flow35_several_tool_bodies_pause_in_one_batch():
    executions: list = []

    @tool
    def step(name: str) -> str:
        """Step."""
        executions.append(name)
        compose.approve(f"ok-{name}")
        return f"{name} done"

    model = FakeModel([calls(("step", {"name": "a"}, "c1"), ("step", {"name": "b"}, "c2")), "fin"])

    @agent(model=model, tools=[step])
    def stepper(x: str) -> str:
        return x

    paused = stepper.run("q")
    assert paused.status == "paused" and paused.pending.id == "ok-a"  # first in call order
    assert sorted(executions) == ["a", "b"]  # the other call still ran to its pause
    assert sorted(p[0] for p in _engine.get_store().pending(paused.id)) == ["ok-a", "ok-b"]
    done = compose.resume(paused.id, answers={"ok-a": True, "ok-b": True})
    assert done.output == "fin"
    assert model.requests[1].messages[-1].parts == [
        ToolResultPart(tool_call_id="c1", content="a done"),
        ToolResultPart(tool_call_id="c2", content="b done"),
    ]


@pytest.mark.sqlite_file
def test_agent54_failed_standalone_run_without_snapshot_reruns_the_body():
    bodies: list = []
    model = FakeModel([raising(ProviderError("transient")), "second time lucky"])

    @agent(model=model)
    def flaky(x: str) -> str:
        bodies.append(x)
        return x

    with pytest.raises(ProviderError):
        flaky.run("q")
    (run_id,) = [r[0] for r in run_rows()]
    assert row(run_id)["status"] == "failed"
    done = compose.resume(run_id)
    assert done.status == "completed" and done.output == "second time lucky"
    assert done.id == run_id
    assert bodies == ["q", "q"]
    assert row(run_id)["status"] == "completed"


@pytest.mark.sqlite_file
def test_agent54_failed_standalone_run_resumes_from_its_last_snapshot():
    counted: list = []

    @tool
    def count_words(text: str) -> int:
        """Count."""
        counted.append(text)
        return len(text.split())

    model = FakeModel(
        [calls(("count_words", {"text": "a b"}, "c1")), raising(ProviderError("down")), "ok"]
    )

    @agent(model=model, tools=[count_words])
    def counter(x: str) -> str:
        return x

    with pytest.raises(ProviderError):
        counter.run("q")
    (run_id,) = [r[0] for r in run_rows()]
    done = compose.resume(run_id)
    assert done.output == "ok"
    assert counted == ["a b"]
    assert model.requests[2].messages == model.requests[1].messages
    assert model.requests[2].messages[-1].parts == [ToolResultPart(tool_call_id="c1", content="2")]


def test_agent41_journaled_approver_decision_is_not_asked_again_in_a_flow():
    asked: list = []
    executions: list = []

    @tool(requires_approval=True)
    def deploy(env: str) -> str:
        """Deploy."""
        executions.append(env)
        compose.approve("final-check")
        return f"deployed {env}"

    model = FakeModel([calls(("deploy", {"env": "prod"}, "c1")), "deployed"])

    @agent(model=model, tools=[deploy])
    def ops(x: str) -> str:
        return x

    @compose.flow
    def release() -> str:
        return ops.run("go", approver=lambda i: asked.append(i.id) or True).output

    paused = release.run()
    assert paused.status == "paused" and paused.pending.id == "final-check"
    assert journal(paused.id)["__interrupt__:tool:deploy:c1"] == "true"
    done = compose.resume(paused.id, answers={"final-check": True})
    assert done.output == "deployed"
    assert asked == ["tool:deploy:c1"]  # the journaled decision is reused
    assert executions == ["prod", "prod"]


def test_flow15_parallel_tool_calls_get_their_own_scopes():
    @compose.task
    def t(x: str) -> str:
        return x * 2

    @tool
    def double(text: str) -> str:
        """Double."""
        return t(text)

    model = FakeModel(
        [calls(("double", {"text": "a"}, "c1"), ("double", {"text": "b"}, "c2")), "done"]
    )

    @agent(model=model, tools=[double])
    def doubler(x: str) -> str:
        return x

    @compose.flow
    def f() -> str:
        return doubler("q")

    run = f.run()
    entries = journal(run.id)
    assert entries["tool:c1/t#1"] == '"aa"'
    assert entries["tool:c2/t#1"] == '"bb"'


def test_agent4_standalone_resume_continues_against_a_replaced_definition():
    sent: list = []
    send_email = make_mailer(sent)

    @agent(model=FakeModel([calls(("send_email", {"to": "x"}, "c1"))]), tools=[send_email])
    def mailer(x: str) -> str:
        return x

    paused = mailer.run("q")
    new_model = FakeModel(["answered by v2"])

    @agent(model=new_model, tools=[send_email], replace=True)
    def mailer(x: str) -> str:
        """Version two."""
        return x

    done = compose.resume(paused.id, answers={"send_email": True})
    assert done.output == "answered by v2"
    assert sent == ["x"]
    assert new_model.requests[0].system == "Version two."
    assert len(new_model.requests[0].messages) == 3


def test_agent50_nested_agent_in_a_tool_resumes_from_its_snapshot():
    sent: list = []
    send_email = make_mailer(sent)
    inner_model = FakeModel([calls(("send_email", {"to": "x"}, "c9")), "inner done", "spare"])

    @agent(model=inner_model, tools=[send_email])
    def inner(x: str) -> str:
        return x

    @tool
    def delegate(q: str) -> str:
        """Delegate."""
        return inner.run(q).output

    outer_model = FakeModel([calls(("delegate", {"q": "sub"}, "c1")), "outer done"])

    @agent(model=outer_model, tools=[delegate])
    def outer(x: str) -> str:
        return x

    paused = outer.run("q")
    assert paused.status == "paused" and paused.pending.id == "tool:send_email:c9"
    done = compose.resume(paused.id, answers={"send_email": True})
    assert done.output == "outer done"
    assert sent == ["x"]
    assert len(inner_model.requests) == 2
    assert [m.role for m in inner_model.requests[1].messages] == ["user", "assistant", "user"]
    assert inner_model.requests[1].messages[-1].parts == [
        ToolResultPart(tool_call_id="c9", content="sent to x")
    ]


def _end_turn(parts, parsed=None) -> ModelResponse:
    return ModelResponse(
        message=Message(role="assistant", parts=parts),
        stop_reason=StopReason.END_TURN,
        raw_stop_reason="end_turn",
        usage=Usage(),
        model_id="FakeModel",
        parsed=parsed,
    )


def test_agent10_output_is_the_concatenated_text_parts():
    from composeai.messages import TextPart, ThinkingPart

    reply = _end_turn([ThinkingPart(text="hidden"), TextPart(text="Hello, "), TextPart(text="you")])

    @agent(model=FakeModel([reply]))
    def joiner(x: str) -> str:
        return x

    assert joiner.run("q").output == "Hello, you"


def test_agent12_parsed_takes_precedence_over_the_message_text():
    from composeai.messages import TextPart

    good = _end_turn([TextPart(text="not json at all")], parsed={"title": "P", "count": 1})
    empty = _end_turn([TextPart(text='{"title": "T", "count": 2}')], parsed={})

    @agent(model=FakeModel([good, empty]))
    def precise(x: str) -> Facts:
        return x

    assert precise.run("q").output == Facts(title="P", count=1)
    with pytest.raises(ComposeError, match=r"model output failed validation for "):
        precise.run("q")  # parsed={} is set (not None): the valid-looking text is ignored
