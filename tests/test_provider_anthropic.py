"""The Anthropic adapter (PROV-10 … PROV-14, PROV-40, PROV-41) against the real SDK.

The pure wire-mapping functions are tested with plain values; everything else drives the
real `anthropic` SDK over HTTP against a loopback server speaking the Messages API wire format
(tests/_anthropic_wire.py), which records the JSON the SDK sent.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import subprocess
import sys

import pytest
from pydantic import BaseModel

pytest.importorskip("anthropic")

import _anthropic_wire as w
import _proc
from composeai import agent, tool
from composeai.errors import ComposeError, ConfigError, ProviderError
from composeai.messages import (
    ImagePart,
    Message,
    StopReason,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
    Usage,
)
from composeai.models import anthropic as adapter
from composeai.models import registry
from composeai.models.anthropic import (
    AnthropicModel,
    StreamAccumulator,
    create_model,
    fit_kwargs,
    parse_response,
    request_to_kwargs,
    usage_from_wire,
)
from composeai.models.base import ModelRequest, ToolSpec

SONNET = "claude-sonnet-5"
MISSING_KEY = (
    "Missing Anthropic API key: set the ANTHROPIC_API_KEY environment variable, or pass "
    "api_key=... / client=... to AnthropicModel."
)
INSTALL = "Install the provider SDK: pip install 'composeai[anthropic]'"


@pytest.fixture(autouse=True)
def _fresh_agent_names():
    """Tests here reuse agent names (parametrized ones especially)."""
    from composeai.testing import reset_registries

    reset_registries()


def sent_key(received) -> str:
    # Depending on the SDK release the key travels as x-api-key or as a bearer token.
    return received.headers.get("x-api-key") or received.headers.get("authorization", "")


@pytest.fixture
def wire():
    server = w.WireServer().start()
    yield server
    server.close()


def make(wire, model_id=SONNET, **kw):
    kw.setdefault("max_retries", 0)
    return AnthropicModel(model_id, api_key="test-key", base_url=wire.url, **kw)


def req(*messages, **kw):
    msgs = list(messages) or [Message.user("hi")]
    return ModelRequest(model=kw.pop("model", SONNET), messages=msgs, **kw)


def sonnet_cost(inp, out, cache_read=0, w5=0, w1=0):
    return (inp * 3 + out * 15 + cache_read * 0.3 + w5 * 3.75 + w1 * 6) / 1e6


# --------------------------------------------------------------------------- PROV-11 (pure)


def test_prov11_plain_request():
    kwargs = request_to_kwargs(req(system="Be brief."), SONNET)
    assert kwargs == {
        "model": SONNET,
        "max_tokens": 16000,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "system": "Be brief.",
    }


def test_prov11_prompt_cache_breakpoints():
    one = request_to_kwargs(req(system="S", prompt_cache=True), SONNET)
    assert one["system"] == [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}]
    assert "cache_control" not in one["messages"][0]["content"][0]  # single message: no tail
    convo = [
        Message.user("a"),
        Message.assistant("b"),
        Message.user([TextPart(text="c"), TextPart(text="d")]),
    ]
    many = request_to_kwargs(req(*convo, prompt_cache=True), SONNET)
    assert many["messages"][-1]["content"] == [
        {"type": "text", "text": "c"},
        {"type": "text", "text": "d", "cache_control": {"type": "ephemeral"}},
    ]
    assert all("cache_control" not in b for m in many["messages"][:-1] for b in m["content"])
    assert "system" not in many
    off = request_to_kwargs(req(*convo), SONNET)
    assert all("cache_control" not in b for m in off["messages"] for b in m["content"])


def test_prov11_images_tool_use_and_tool_results():
    convo = [
        Message.user(
            [
                TextPart(text="look"),
                ImagePart(media_type="image/png", data="AAAA"),
                ImagePart(media_type="image/jpeg", url="https://example.com/x.jpg"),
            ]
        ),
        Message.assistant([ToolCallPart(id="tu_1", name="add", arguments={"a": 1})]),
        Message.user(
            [
                ToolResultPart(tool_call_id="tu_1", content="2"),
                ToolResultPart(tool_call_id="tu_2", content="boom", is_error=True),
            ]
        ),
    ]
    messages = request_to_kwargs(req(*convo), SONNET)["messages"]
    assert messages[0]["content"][1:] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/x.jpg"}},
    ]
    assert messages[1] == {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "tu_1", "name": "add", "input": {"a": 1}}],
    }
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "tu_1", "content": "2"},
        {"type": "tool_result", "tool_use_id": "tu_2", "content": "boom", "is_error": True},
    ]


def test_prov11_mixing_tool_result_with_other_parts_is_a_caller_bug():
    bad = Message.user([ToolResultPart(tool_call_id="t", content="x"), TextPart(text="and")])
    with pytest.raises(ComposeError) as ei:
        request_to_kwargs(req(Message.user("q"), bad), SONNET)
    assert type(ei.value) is ComposeError
    assert "messages[1]" in str(ei.value) and "tool_result" in str(ei.value)


def _thinking_part(model_id, **block_extra):
    block = {"type": "thinking", "thinking": "hmm", "signature": "sig", **block_extra}
    return ThinkingPart(
        text="hmm",
        provider="anthropic",
        provider_token=json.dumps({"block": block, "model": model_id}),
    )


def test_prov11_thinking_echoed_only_to_the_same_model():
    convo = [
        Message.user("q"),
        Message.assistant([_thinking_part(SONNET, extra=None), TextPart(text="a")]),
    ]
    same = request_to_kwargs(req(*convo), SONNET)["messages"][1]["content"]
    assert same[0] == {"type": "thinking", "thinking": "hmm", "signature": "sig"}  # None stripped
    other = request_to_kwargs(req(*convo), "claude-haiku-4-5")["messages"][1]["content"]
    assert other == [{"type": "text", "text": "a"}]
    foreign = [
        ThinkingPart(text="r", provider="openai", provider_token=json.dumps({"model": SONNET})),
        ThinkingPart(text="r", provider="anthropic", provider_token="not json"),
        ThinkingPart(text="r", provider="anthropic"),
    ]
    msgs = request_to_kwargs(req(Message.user("q"), Message.assistant(foreign)), SONNET)
    assert msgs["messages"][1]["content"] == []


def test_prov11_tools_temperature_and_output_config():
    spec = ToolSpec("add", "Adds.", {"type": "object"}, strict=False)
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    kwargs = request_to_kwargs(
        req(tools=[spec], temperature=0.2, output_schema=schema, effort="high"), SONNET
    )
    assert kwargs["tools"] == [
        {"name": "add", "description": "Adds.", "input_schema": {"type": "object"}, "strict": False}
    ]
    assert kwargs["temperature"] == 0.2
    assert kwargs["output_config"] == {
        "format": {"type": "json_schema", "schema": schema},
        "effort": "high",
    }
    assert request_to_kwargs(req(effort="low"), SONNET)["output_config"] == {"effort": "low"}


@pytest.mark.parametrize(
    ("thinking", "budget", "expected", "keeps_temperature"),
    [
        (None, None, None, True),
        (False, 2048, {"type": "disabled"}, True),
        (True, 2048, {"type": "enabled", "budget_tokens": 2048, "display": "summarized"}, False),
        (None, 4096, {"type": "enabled", "budget_tokens": 4096, "display": "summarized"}, False),
        (True, None, {"type": "adaptive", "display": "summarized"}, True),
    ],
)
def test_prov40_thinking_modes(thinking, budget, expected, keeps_temperature):
    kwargs = request_to_kwargs(
        req(thinking=thinking, thinking_budget=budget, temperature=0.5), SONNET
    )
    assert kwargs.get("thinking") == expected
    assert ("temperature" in kwargs) is keeps_temperature


# --------------------------------------------------------------------------- PROV-12/13 (pure)


@pytest.mark.parametrize(
    ("raw", "stop"),
    [
        ("end_turn", StopReason.END_TURN),
        ("tool_use", StopReason.TOOL_USE),
        ("max_tokens", StopReason.MAX_TOKENS),
        ("refusal", StopReason.REFUSAL),
        ("stop_sequence", StopReason.OTHER),
        ("model_context_window_exceeded", StopReason.OTHER),
        (None, StopReason.OTHER),
    ],
)
def test_prov12_stop_map(raw, stop):
    response = parse_response(w.message(w.text("x"), stop_reason=raw), SONNET)
    assert response.stop_reason is stop
    assert response.raw_stop_reason == raw


def test_prov12_blocks_to_parts():
    msg = w.message(
        w.thinking("plan", "sig-9"),
        w.text("Hello"),
        {"type": "redacted_thinking", "data": "xyz"},
        {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}},
        w.tool_use("tu_1", "add", {"a": 1}),
        stop_reason="tool_use",
    )
    response = parse_response(msg, SONNET)
    thinking, text, call = response.message.parts
    assert text == TextPart(text="Hello")
    assert call == ToolCallPart(id="tu_1", name="add", arguments={"a": 1})
    assert thinking.text == "plan" and thinking.provider == "anthropic"
    assert json.loads(thinking.provider_token) == {
        "block": {"type": "thinking", "thinking": "plan", "signature": "sig-9"},
        "model": SONNET,
    }
    assert response.model_id == SONNET and response.parsed is None


def test_prov12_structured_output_parsing():
    ok = parse_response(w.message(w.text('{"x": 1}')), SONNET, structured=True)
    assert ok.parsed == {"x": 1}
    not_end = parse_response(
        w.message(w.text("{"), stop_reason="max_tokens"), SONNET, structured=True
    )
    assert not_end.parsed is None
    with pytest.raises(ProviderError) as ei:
        parse_response(w.message(w.text("nope")), SONNET, structured=True)
    assert str(ei.value) == (
        "Anthropic returned non-JSON text for a structured-output request: "
        "Expecting value: line 1 column 1 (char 0)"
    )
    assert (ei.value.provider, ei.value.model) == ("anthropic", SONNET)


def test_prov13_usage_and_cost_with_ttl_split():
    u = w.usage(1000, 200, cache_read=4000, cache_creation=3000, ttl=(1000, 2000), thinking=50)
    usage = usage_from_wire(u, SONNET)
    assert usage.model_dump() == {
        "input_tokens": 1000,
        "output_tokens": 200,
        "cache_read_tokens": 4000,
        "cache_creation_tokens": 3000,
        "reasoning_tokens": 50,
        "cost_usd": pytest.approx(sonnet_cost(1000, 200, 4000, 1000, 2000)),
        "cost_complete": True,
    }


def test_prov13_cost_is_compute_cost_exactly():
    from composeai.models.prices import compute_cost, get_price

    u = w.usage(1234, 567, cache_read=89, cache_creation=1000, ttl=(400, 600))
    usage = usage_from_wire(u, SONNET)
    price = get_price("anthropic", SONNET)
    assert usage.cost_usd == compute_cost(usage, price, 400, 600)


def test_prov13_registered_price_applies(monkeypatch):
    from composeai.models import prices

    monkeypatch.setattr(prices, "_PRICES", dict(prices._PRICES))
    prices.register_price("anthropic", "claude-custom", prices.ModelPrice(2.0, 4.0, cache_read=1.0))
    usage = usage_from_wire(w.usage(100, 10, cache_read=50), "claude-custom")
    assert usage.cost_usd == pytest.approx((100 * 2 + 10 * 4 + 50 * 1) / 1e6)


def test_prov13_creation_without_split_counts_as_5m_writes():
    usage = usage_from_wire(w.usage(10, 20, cache_creation=3000), SONNET)
    assert usage.cost_usd == pytest.approx(sonnet_cost(10, 20, 0, 3000, 0))


def test_prov13_unpriced_model():
    usage = usage_from_wire(w.usage(10, 20), "claude-unlisted-9")
    assert usage == Usage(input_tokens=10, output_tokens=20, cost_usd=None, cost_complete=False)


def test_prov12_continuation_limit_message():
    replies = [w.message(w.text(str(i)), stop_reason="pause_turn") for i in range(6)]
    base = request_to_kwargs(req(), SONNET)
    nxt = adapter.continuation_kwargs(base, replies[:2], SONNET)
    assert nxt["messages"][-1] == {"role": "assistant", "content": [w.text("0"), w.text("1")]}
    assert nxt["messages"][:-1] == base["messages"]
    with pytest.raises(ProviderError) as ei:
        adapter.continuation_kwargs(base, replies, SONNET)
    assert str(ei.value) == (
        "Anthropic paused 6 times in a row for model 'claude-sonnet-5' "
        "(exceeded the 5-continuation limit)"
    )


# --------------------------------------------------------------------------- PROV-14 (pure)


def test_prov14_accumulator_maps_events_and_folds_the_reply():
    msg = w.message(
        w.thinking("deep"),
        w.text("Hi there"),
        w.tool_use("tu_1", "add", {"a": 1, "b": [2, 3]}),
        stop_reason="tool_use",
        usage_=w.usage(7, 30, thinking=4),
    )
    acc = StreamAccumulator(SONNET)
    out = [e for e in map(acc.feed, w.stream_events(msg)) if e is not None]
    kinds = [e.kind for e in out]
    assert kinds[0] == "thinking_delta" and "text_delta" in kinds
    assert "".join(e.text for e in out if e.kind == "text_delta") == "Hi there"
    assert "".join(e.text for e in out if e.kind == "thinking_delta") == "deep"
    tool_events = [e for e in out if e.kind.startswith("tool_")]
    assert (
        tool_events[0].kind == "tool_call_started" and tool_events[-1].kind == "tool_call_finished"
    )
    assert {(e.tool_call_id, e.tool_name) for e in tool_events} == {("tu_1", "add")}
    args = "".join(e.text for e in tool_events if e.kind == "tool_args_delta")
    assert json.loads(args) == {"a": 1, "b": [2, 3]}
    assert parse_response(acc.finish(), SONNET) == parse_response(msg, SONNET)


def test_prov14_accumulator_rejects_bad_arguments_and_truncated_streams():
    msg = w.message(w.tool_use("tu_1", "add", {}), stop_reason="tool_use")
    msg["content"][0]["raw_json"] = '{"a": 1'
    acc = StreamAccumulator(SONNET)
    with pytest.raises(ProviderError) as ei:
        for event in w.stream_events(msg):
            acc.feed(event)
    assert str(ei.value).startswith("Anthropic returned non-JSON arguments for tool_use 'add': ")
    cut = StreamAccumulator(SONNET)
    for event in w.stream_events(w.message(w.text("abc")))[:-1]:
        cut.feed(event)
    with pytest.raises(ProviderError) as ei:
        cut.finish()
    assert "ended without a message_stop event" in str(ei.value)


def test_prov14_tool_call_without_argument_deltas_gets_empty_input():
    events = [
        {"type": "message_start", "message": w.message(stop_reason=None)},
        {"type": "content_block_start", "index": 0, "content_block": w.tool_use("t", "ping", {})},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use"},
            "usage": {"output_tokens": 3},
        },
        {"type": "message_stop"},
    ]
    acc = StreamAccumulator(SONNET)
    for event in events:
        acc.feed(event)
    (call,) = parse_response(acc.finish(), SONNET).message.parts
    assert call == ToolCallPart(id="t", name="ping", arguments={})


# --------------------------------------------------------------------------- SDK drift


class _StubMessages:
    """An SDK stand-in whose create() takes no temperature/system/thinking/output_config."""

    def __init__(self):
        self.calls = []

    def create(self, *, model, max_tokens, messages, stream=False, tools=None, extra_body=None):
        self.calls.append(
            {"model": model, "messages": messages, "tools": tools, "extra_body": extra_body}
        )
        return w.message(w.text('{"ok": true}'))


class _StubClient:
    def __init__(self):
        self.messages = _StubMessages()


def test_prov11_fields_the_sdk_does_not_name_go_through_extra_body(monkeypatch):
    stub = _StubClient()
    model = AnthropicModel(SONNET, client=stub)
    counted = []
    real = inspect.signature
    monkeypatch.setattr(adapter.inspect, "signature", lambda fn: counted.append(fn) or real(fn))
    request = req(
        system="S", temperature=0.3, thinking=True, output_schema={"type": "object"}, effort="low"
    )
    assert model.complete(request).parsed == {"ok": True}
    model.complete(request)
    (call, _) = stub.messages.calls
    assert call["extra_body"] == {
        "system": "S",
        "temperature": 0.3,
        "thinking": {"type": "adaptive", "display": "summarized"},
        "output_config": {
            "format": {"type": "json_schema", "schema": {"type": "object"}},
            "effort": "low",
        },
    }
    assert len(counted) == 1  # the signature is inspected once, not per call


def test_prov11_fit_kwargs_leaves_accepting_signatures_alone():
    kwargs = {"model": "m", "max_tokens": 1, "messages": [], "temperature": 0.1}

    def takes_all(**kw):
        return kw

    def named(*, model, max_tokens, messages, temperature, extra_body=None):
        return None

    assert fit_kwargs(takes_all, kwargs) is kwargs
    assert fit_kwargs(named, kwargs) is kwargs

    def narrow(*, model, max_tokens, messages, extra_body=None):
        return None

    merged = fit_kwargs(narrow, {**kwargs, "extra_body": {"x": 1}})
    assert merged == {
        "model": "m",
        "max_tokens": 1,
        "messages": [],
        "extra_body": {"x": 1, "temperature": 0.1},
    }


def test_prov11_temperature_reaches_the_wire_with_the_installed_sdk(wire):
    wire.push(w.JsonReply(w.message(w.text("ok"))))
    make(wire).complete(req(temperature=0.25, thinking=True, effort="medium"))
    (body,) = wire.bodies()
    assert body["temperature"] == 0.25
    assert body["thinking"] == {"type": "adaptive", "display": "summarized"}
    assert body["output_config"] == {"effort": "medium"}


# --------------------------------------------------------------------------- PROV-10 clients


def test_prov10_construction_needs_no_sdk_and_no_key(monkeypatch):
    monkeypatch.setitem(sys.modules, "anthropic", None)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    model = AnthropicModel(SONNET)
    assert model.model_id == SONNET and model._client is None and model._async_client is None
    assert isinstance(create_model("claude-haiku-4-5"), AnthropicModel)
    with pytest.raises(ConfigError) as ei:
        model.complete(req())
    assert str(ei.value) == INSTALL
    injected = AnthropicModel(SONNET, client=_StubClient())
    with pytest.raises(ConfigError) as ei:
        injected.complete(req())
    assert str(ei.value) == INSTALL
    with pytest.raises(ConfigError) as ei:
        asyncio.run(model.acomplete(req()))
    assert str(ei.value) == INSTALL


def test_prov10_model_protocol_and_bad_model_id():
    from composeai.models.base import Model

    model = AnthropicModel(SONNET)
    assert isinstance(model, Model) and callable(model.stream) and callable(model.astream)
    with pytest.raises(ConfigError) as ei:
        AnthropicModel("")
    assert "AnthropicModel needs a non-empty model id string, got ''" in str(ei.value)


def test_prov10_missing_key_is_checked_at_first_call(wire, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    model = AnthropicModel(SONNET, base_url=wire.url)
    for call in (lambda: model.complete(req()), lambda: list(model.stream(req()))):
        with pytest.raises(ConfigError) as ei:
            call()
        assert str(ei.value) == MISSING_KEY
    with pytest.raises(ConfigError) as ei:
        asyncio.run(model.acomplete(req()))
    assert str(ei.value) == MISSING_KEY
    assert model._client is None and wire.requests == []


def test_prov10_key_and_base_url_from_the_environment(wire, monkeypatch):
    import anthropic

    monkeypatch.setenv("ANTHROPIC_API_KEY", "env-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", wire.url)
    wire.push(w.JsonReply(w.message(w.text("from env"))))
    model = AnthropicModel(SONNET)
    assert model.complete(req()).message.text == "from env"
    (received,) = wire.requests
    assert sent_key(received).endswith("env-key")  # read by the SDK itself
    assert model._client.max_retries == 2
    assert model._client.timeout == anthropic.DEFAULT_TIMEOUT  # SDK default: nothing passed
    bounded = make(wire, timeout=7.5, max_retries=1)
    wire.push(w.JsonReply(w.message(w.text("x"))))
    bounded.complete(req())
    assert bounded._client.timeout == 7.5 and bounded._client.max_retries == 1


def test_prov10_clients_are_lazy_and_patchable(wire):
    model = make(wire)
    assert model._client is None and model._async_client is None
    wire.push(w.JsonReply(w.message(w.text("a"))), w.JsonReply(w.message(w.text("b"))))
    model.complete(req())
    sync_client = model._client
    assert sync_client is not None and model._async_client is None
    asyncio.run(model.acomplete(req()))
    assert model._async_client is not None and model._client is sync_client
    stub = _StubClient()
    model._client = stub
    assert model.complete(req()).message.text == '{"ok": true}'
    assert len(stub.messages.calls) == 1 and len(wire.requests) == 2


def test_prov10_injected_client_is_sync_only(wire):
    import anthropic

    client = anthropic.Anthropic(api_key="k", base_url=wire.url, max_retries=0)
    model = AnthropicModel(SONNET, client=client)
    assert model._client is client
    assert model.acomplete is None and model.astream is None
    wire.push(w.JsonReply(w.message(w.text("sync"))))

    @agent(model=model)
    def echo(x: str) -> str:
        """Echo."""
        return x

    assert asyncio.run(echo.arun("hi")).output == "sync"  # complete() off the loop
    assert len(wire.requests) == 1


def test_prov1_registry_resolves_the_adapter_lazily(monkeypatch):
    monkeypatch.setattr(registry, "_CACHE", {})
    model = registry.resolve("anthropic/claude-sonnet-5")
    assert isinstance(model, AnthropicModel) and model.model_id == SONNET


def test_pkg5_import_and_construction_import_no_sdk():
    code = (
        "import sys\n"
        "import composeai\n"
        "assert 'composeai.models.anthropic' not in sys.modules\n"
        "from composeai.models import registry\n"
        "m = registry.resolve('anthropic/claude-sonnet-5')\n"
        "assert type(m).__name__ == 'AnthropicModel'\n"
        "bad = [n for n in ('anthropic', 'httpx', 'httpx2') if n in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- over the wire


def test_prov12_text_complete_over_the_wire(wire):
    wire.push(w.JsonReply(w.message(w.text("Hello!"), usage_=w.usage(12, 3))))
    response = make(wire).complete(req(system="Sys"))
    assert response.message == Message.assistant("Hello!")
    assert response.stop_reason is StopReason.END_TURN and response.raw_stop_reason == "end_turn"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (12, 3)
    assert response.usage.cost_usd == pytest.approx(sonnet_cost(12, 3))
    (received,) = wire.requests
    assert received.path == "/v1/messages"
    assert sent_key(received).endswith("test-key")
    assert received.body == {
        "model": SONNET,
        "max_tokens": 16000,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "system": "Sys",
    }


def test_prov11_tool_round_trip_through_an_agent(wire):
    wire.push(
        w.JsonReply(
            w.message(
                w.text("Let me add."),
                w.tool_use("tu_1", "add", {"a": 2, "b": 3}),
                stop_reason="tool_use",
            )
        ),
        w.JsonReply(w.message(w.text("The sum is 5."))),
    )

    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    @agent(model=make(wire), tools=[add])
    def calculator(question: str) -> str:
        """You add numbers."""
        return question

    run = calculator.run("What is 2+3?")
    assert run.output == "The sum is 5."
    first, second = wire.bodies()
    assert first["tools"] == [
        {
            "name": "add",
            "description": "Add two numbers.",
            "input_schema": add.spec.input_schema,
            "strict": True,
        }
    ]
    assert first["system"] == [
        {"type": "text", "text": "You add numbers.", "cache_control": {"type": "ephemeral"}}
    ]
    assert second["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me add."},
            {"type": "tool_use", "id": "tu_1", "name": "add", "input": {"a": 2, "b": 3}},
        ],
    }
    assert second["messages"][2] == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "tu_1",
                "content": "5",
                "cache_control": {"type": "ephemeral"},
            }
        ],
    }
    assert run.usage.cost_usd == pytest.approx(2 * sonnet_cost(10, 5))


def test_prov11_parallel_tool_calls(wire):
    wire.push(
        w.JsonReply(
            w.message(
                w.tool_use("tu_a", "shout", {"word": "x"}),
                w.tool_use("tu_b", "shout", {"word": "y"}),
                stop_reason="tool_use",
            )
        ),
        w.JsonReply(w.message(w.text("done"))),
    )

    @tool
    def shout(word: str) -> str:
        """Shout a word."""
        return word.upper()

    @agent(model=make(wire), tools=[shout], prompt_cache=False)
    def shouter(q: str) -> str:
        """Shout."""
        return q

    assert shouter("go") == "done"
    results = wire.bodies()[1]["messages"][2]["content"]
    assert results == [
        {"type": "tool_result", "tool_use_id": "tu_a", "content": "X"},
        {"type": "tool_result", "tool_use_id": "tu_b", "content": "Y"},
    ]


class Fact(BaseModel):
    name: str
    year: int


def test_prov11_structured_output_through_an_agent(wire):
    wire.push(w.JsonReply(w.message(w.text('{"name": "Ada", "year": 1843}'))))

    @agent(model=make(wire), effort="low")
    def fact(topic: str) -> Fact:
        """Facts."""
        return topic

    assert fact("Ada") == Fact(name="Ada", year=1843)
    (body,) = wire.bodies()
    assert body["output_config"]["effort"] == "low"
    assert body["output_config"]["format"]["type"] == "json_schema"
    assert body["output_config"]["format"]["schema"]["properties"]["year"] == {"type": "integer"}


def test_prov14_stream_equals_complete(wire):
    msg = w.message(
        w.thinking("considering"),
        w.text("Answer: 42"),
        w.tool_use("tu_1", "look", {"q": "life"}),
        stop_reason="tool_use",
        usage_=w.usage(50, 40, cache_read=10, cache_creation=20, ttl=(5, 15), thinking=12),
    )
    wire.push(w.reply_for(msg), w.reply_for(msg))
    model = make(wire)
    request = req(thinking=True)
    complete = model.complete(request)
    events = list(model.stream(request))
    assert [e.kind for e in events].count("response_done") == 1 and events[
        -1
    ].kind == "response_done"
    assert events[-1].response == complete
    assert complete.usage.cost_usd == pytest.approx(sonnet_cost(50, 40, 10, 5, 15))
    assert complete.usage.reasoning_tokens == 12
    assert wire.bodies()[1]["stream"] is True


def test_prov14_async_stream_equals_async_complete(wire):
    msg = w.message(w.text("async hello"), w.tool_use("t", "f", {"k": [1]}), stop_reason="tool_use")
    wire.push(w.reply_for(msg), w.reply_for(msg))
    model = make(wire)

    async def main():
        complete = await model.acomplete(req())
        events = [e async for e in model.astream(req())]
        return complete, events

    complete, events = asyncio.run(main())
    assert events[-1].response == complete
    kinds = [e.kind for e in events if e.kind.startswith("tool")]
    assert kinds[0] == "tool_call_started" and kinds[-1] == "tool_call_finished"
    assert set(kinds[1:-1]) == {"tool_args_delta"}


def test_prov14_agent_stream_emits_deltas(wire):
    msg = w.message(w.text("one two three"))
    wire.push(w.reply_for(msg))

    @agent(model=make(wire))
    def talker(q: str) -> str:
        """Talk."""
        return q

    stream = talker.stream("hi")
    deltas = [e.text for e in stream if e.kind == "text_delta"]
    assert "".join(deltas) == "one two three" and len(deltas) > 1
    assert stream.run.output == "one two three"
    assert wire.bodies()[0]["stream"] is True


def test_prov62_thinking_echoed_to_the_same_model_only_over_the_wire(wire):
    wire.push(
        w.JsonReply(
            w.message(
                w.thinking("I should call it", "sig-A"),
                w.tool_use("tu_1", "now", {}),
                stop_reason="tool_use",
            )
        ),
        w.JsonReply(w.message(w.text("It is noon."))),
        w.JsonReply(w.message(w.text("other model"), model="claude-haiku-4-5")),
    )

    @tool
    def now() -> str:
        """The time."""
        return "12:00"

    @agent(model=make(wire), tools=[now], thinking=True)
    def clock(q: str) -> str:
        """Tell the time."""
        return q

    run = clock.run("time?")
    first, second = wire.bodies()
    assert first["thinking"] == {"type": "adaptive", "display": "summarized"}
    assert second["messages"][1]["content"][0] == {
        "type": "thinking",
        "thinking": "I should call it",
        "signature": "sig-A",
    }
    make(wire, "claude-haiku-4-5").complete(req(*run.messages, model="claude-haiku-4-5"))
    third = wire.bodies()[2]
    assert all(b["type"] != "thinking" for m in third["messages"] for b in m["content"])


def test_prov12_pause_turn_is_continued(wire):
    paused = w.message(
        {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {"query": "x"}},
        w.text("Searching"),
        stop_reason="pause_turn",
        usage_=w.usage(100, 10),
    )
    final = w.message(w.text(" found it."), usage_=w.usage(120, 20))
    wire.push(w.reply_for(paused), w.reply_for(final), w.reply_for(paused), w.reply_for(final))
    model = make(wire)
    response = model.complete(req())
    assert response.message.parts == [TextPart(text="Searching"), TextPart(text=" found it.")]
    assert response.usage.input_tokens == 220 and response.usage.output_tokens == 30
    assert response.usage.cost_usd == pytest.approx(sonnet_cost(220, 30))
    first, second = wire.bodies()
    assert second["messages"][:1] == first["messages"]
    assert second["messages"][1] == {"role": "assistant", "content": paused["content"]}
    events = list(model.stream(req()))
    assert events[-1].response == response
    assert "".join(e.text for e in events if e.kind == "text_delta") == "Searching found it."


def test_prov12_pause_turn_limit(wire):
    paused = w.message(w.text("."), stop_reason="pause_turn")
    wire.push(*[w.reply_for(paused)] * 6)
    with pytest.raises(ProviderError) as ei:
        make(wire).complete(req())
    assert str(ei.value) == (
        "Anthropic paused 6 times in a row for model 'claude-sonnet-5' "
        "(exceeded the 5-continuation limit)"
    )
    assert len(wire.requests) == 6
    assert len(wire.bodies()[-1]["messages"][-1]["content"]) == 5


def test_prov12_long_non_streaming_call_is_collected_from_a_stream(wire):
    # The SDK refuses (before sending) a non-streaming call it expects to exceed its default
    # timeout; complete() then streams the same request instead of failing.
    msg = w.message(w.text("long answer"))
    wire.push(w.reply_for(msg), w.reply_for(msg))
    model = make(wire)
    expected = parse_response(msg, SONNET)
    assert model.complete(req(max_tokens=64000)) == expected
    assert asyncio.run(model.acomplete(req(max_tokens=64000))) == expected
    assert len(wire.requests) == 2


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (500, "api_error"),
        (529, "overloaded_error"),
    ],
)
def test_prov12_http_errors_become_provider_errors(wire, status, kind):
    wire.push(w.JsonReply(w.error_body(kind, "bad thing happened"), status=status))
    with pytest.raises(ProviderError) as ei:
        make(wire).complete(req())
    assert f"Error code: {status}" in str(ei.value) and "bad thing happened" in str(ei.value)
    assert (ei.value.provider, ei.value.model) == ("anthropic", SONNET)
    assert len(wire.requests) == 1
    wire.push(w.JsonReply(w.error_body(kind, "streamed"), status=status))
    with pytest.raises(ProviderError):
        list(make(wire).stream(req()))


def test_prov41_timeout_becomes_provider_error(wire):
    wire.push(w.SlowReply(3.0, w.JsonReply(w.message(w.text("late")))))
    with pytest.raises(ProviderError) as ei:
        make(wire, timeout=0.2).complete(req())
    assert ei.value.provider == "anthropic" and "timed out" in str(ei.value).lower()


def test_prov12_connection_refused_becomes_provider_error():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = AnthropicModel(SONNET, api_key="k", base_url=f"http://127.0.0.1:{port}", max_retries=0)
    with pytest.raises(ProviderError) as ei:
        model.complete(req())
    assert ei.value.model == SONNET
    with pytest.raises(ProviderError):
        asyncio.run(model.acomplete(req()))


def test_prov14_error_event_mid_stream(wire):
    events = w.stream_events(w.message(w.text("abcdefgh")))[:4]
    events.append({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    wire.push(w.SseReply(events))
    with pytest.raises(ProviderError) as ei:
        list(make(wire).stream(req()))
    assert "Overloaded" in str(ei.value)


@pytest.mark.parametrize("how", ["cut", "end"])
def test_agent25_stream_cut_short_is_streamed_again(wire, how):
    msg = w.message(w.text("complete answer"))
    events = w.stream_events(msg)
    broken = w.SseReply(events, cut_after=5) if how == "cut" else w.SseReply(events, end_after=5)
    wire.push(broken)
    model = make(wire)
    with pytest.raises(ProviderError) as ei:
        list(model.stream(req()))
    assert ei.value.provider == "anthropic"
    if how == "cut":  # the transport's own error, wrapped
        assert str(ei.value).startswith("Anthropic request failed: ")
        assert ei.value.__cause__ is not None
    else:
        assert "ended without a message_stop event" in str(ei.value)
    wire.push(broken, w.reply_for(msg))

    @agent(model=model, retries=1)
    def resilient(q: str) -> str:
        """Answer."""
        return q

    stream = resilient.stream("q")
    deltas = [e.text for e in stream if e.kind == "text_delta"]
    run = stream.run
    assert run.output == "complete answer"
    assert "".join(deltas).endswith("complete answer")  # deltas of the failed attempt repeat
    assert len(wire.requests) == 3
    llm = [s for s in run.trace.spans if s.kind == "llm"]
    assert [r["type"] for r in llm[0].attributes["retries"]] == ["ProviderError"]


def test_agent25_async_stream_cut_short_is_streamed_again(wire):
    msg = w.message(w.text("async answer"))
    wire.push(w.SseReply(w.stream_events(msg), cut_after=4), w.reply_for(msg))

    @agent(model=make(wire), retries=1)
    def aresilient(q: str) -> str:
        """Answer."""
        return q

    async def main():
        stream = aresilient.astream("q")
        deltas = [e.text async for e in stream if e.kind == "text_delta"]
        return deltas, await stream.run()

    deltas, run = asyncio.run(main())
    assert run.output == "async answer" and "".join(deltas).endswith("async answer")
    assert len(wire.requests) == 2 and all(b["stream"] for b in wire.bodies())


def test_prov14_non_json_tool_arguments(wire):
    msg = w.message(w.tool_use("tu_1", "add", {}), stop_reason="tool_use")
    msg["content"][0]["raw_json"] = '{"a": '
    wire.push(w.SseReply(w.stream_events(msg)))
    with pytest.raises(ProviderError) as ei:
        list(make(wire).stream(req()))
    assert str(ei.value).startswith("Anthropic returned non-JSON arguments for tool_use 'add'")
    odd = w.message(w.tool_use("tu_1", "add", {}), stop_reason="tool_use")
    odd["content"][0]["input"] = "not an object"
    wire.push(w.JsonReply(odd))
    with pytest.raises(ProviderError) as ei:
        make(wire).complete(req())
    assert "non-object input for tool_use 'add'" in str(ei.value)


def test_agent23_retries_and_fallback_act_on_adapter_errors(wire):
    wire.push(
        w.JsonReply(w.error_body("api_error", "first"), status=500),
        w.JsonReply(w.message(w.text("retried"))),
    )

    @agent(model=make(wire), retries=1)
    def retrying(q: str) -> str:
        """R."""
        return q

    run = retrying.run("q")
    assert run.output == "retried"
    wire.push(
        w.JsonReply(w.error_body("overloaded_error", "busy"), status=529),
        w.JsonReply(w.message(w.text("from haiku"), model="claude-haiku-4-5")),
    )

    @agent(model=make(wire), fallback=make(wire, "claude-haiku-4-5"))
    def falling(q: str) -> str:
        """F."""
        return q

    run = falling.run("q")
    assert run.output == "from haiku"
    assert [b["model"] for b in wire.bodies()[2:]] == [SONNET, "claude-haiku-4-5"]
    root = next(s for s in run.trace.spans if s.kind == "agent")
    assert root.attributes["fallback_used"] == "claude-haiku-4-5"


# --------------------------------------------------------------------------- cancellation


def _hanging(wire):
    start = w.stream_events(w.message(w.text("x")))[:3]  # message_start, ping, block start
    trickle = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "."},
    }
    wire.push(w.HangingSse(start, trickle=trickle))


def test_agent93_closing_the_stream_aborts_the_request(wire):
    _hanging(wire)
    events = make(wire).stream(req())
    assert next(events).kind == "text_delta"
    events.close()
    assert wire.disconnected.wait(10)


def test_agent93_aclose_aborts_the_request(wire):
    _hanging(wire)
    model = make(wire)

    async def main():
        events = model.astream(req())
        first = await events.__anext__()
        await events.aclose()
        return first

    assert asyncio.run(main()).kind == "text_delta"
    assert wire.disconnected.wait(10)


def test_agent93_run_stream_cancel_closes_the_provider_stream(wire):
    _hanging(wire)

    @agent(model=make(wire))
    def slow(q: str) -> str:
        """Slow."""
        return q

    stream = slow.stream("q")
    for event in stream:
        if event.kind == "text_delta":
            stream.cancel()
    assert stream.run.status == "cancelled"
    assert wire.disconnected.wait(10)


# --------------------------------------------------------------------------- event loops


def test_prov10_async_client_follows_the_event_loop(wire):
    msg = w.message(w.text("looped"))
    wire.push(w.reply_for(msg), w.reply_for(msg), w.reply_for(msg))
    model = make(wire, max_retries=2)

    @agent(model=model)
    def looper(q: str) -> str:
        """Loop."""
        return q

    assert asyncio.run(looper.arun("a")).output == "looped"
    first = model._async_client
    assert asyncio.run(looper.arun("b")).output == "looped"
    assert model._async_client is not first
    assert len(wire.requests) == 2  # one request per call, never a retry on a dead loop

    async def twice():
        await model.acomplete(req())
        same = model._async_client
        await model.acomplete(req())
        return same is model._async_client

    wire.push(w.reply_for(msg))
    assert asyncio.run(twice())  # one loop keeps its client
    assert len(wire.requests) == 4


def test_prov10_event_loops_in_two_threads_share_one_model(wire):
    import threading

    msg = w.message(w.text("threaded"))
    wire.push(*[w.reply_for(msg)] * 12)
    model = make(wire, max_retries=2)
    results: list[str] = []
    barrier = threading.Barrier(2)

    async def calls():
        barrier.wait()
        for _ in range(3):
            results.append((await model.acomplete(req())).message.text)

    def worker():
        for _ in range(2):  # a fresh loop each time, as asyncio.run makes
            asyncio.run(calls())

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["threaded"] * 12
    assert len(wire.requests) == 12  # each call sent exactly once


def test_prov10_assigned_async_client_is_used_as_given(wire):
    import anthropic

    wire.push(w.reply_for(w.message(w.text("mine"))), w.reply_for(w.message(w.text("mine"))))
    model = make(wire)
    mine = anthropic.AsyncAnthropic(api_key="k", base_url=wire.url, max_retries=0)
    model._async_client = mine
    assert asyncio.run(model.acomplete(req())).message.text == "mine"
    assert model._async_client is mine


# --------------------------------------------------------------------------- across processes

RESEARCH = """\
import composeai as compose


@compose.task
def fetch_sources(topic: str) -> list[str]:
    return [f"https://example.com/{topic}"]


@compose.task
def summarize(source: str) -> str:
    return f"summary of {source}"


@compose.agent(model="anthropic/claude-sonnet-5")
def editor(summaries: list[str]) -> str:
    \"\"\"Turn source summaries into a short draft.\"\"\"
    return compose.prompt(f"Draft a short paragraph from: {summaries}")


@compose.task
def publish(draft: str) -> str:
    return f"published: {draft}"


@compose.flow
def research(topic: str) -> str:
    sources = fetch_sources(topic)
    summaries = compose.map(summarize, sources)
    draft = editor(summaries)
    if compose.approve("publish", payload={"draft": draft}):
        return publish(draft)
    return f"kept as draft: {draft}"
"""


def test_prov1_seed_research_flow_bills_the_model_once_across_processes(wire, tmp_path):
    box = _proc.Sandbox(tmp_path)
    box.write_module("research_flow", RESEARCH, helper=False)
    wire.push(w.reply_for(w.message(w.text("A short draft."), usage_=w.usage(400, 60))))
    env = {"ANTHROPIC_BASE_URL": wire.url, "ANTHROPIC_API_KEY": "test-key"}
    a = box.run(
        """
        from research_flow import research
        run = research.run("quantum")
        emit(status=run.status, run_id=run.id, pending=run.pending.id)
        """,
        **env,
    ).ok()
    assert (a["status"], a["pending"]) == ("paused", "publish")
    b = box.run(
        """
        import os
        import research_flow  # noqa: F401
        from composeai import resume
        run = resume(os.environ["RUN_ID"], answers={"publish": True})
        emit(status=run.status, output=run.output)
        """,
        RUN_ID=a["run_id"],
        **env,
    ).ok()
    assert b == {"status": "completed", "output": "published: A short draft."}
    (received,) = wire.requests
    assert received.body["model"] == SONNET
    assert "summary of https://example.com/quantum" in json.dumps(received.body["messages"])
    rows = json.loads(
        subprocess.run(
            [sys.executable, "-m", "composeai.cli", "runs", "--json"],
            env=box.env(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    (row,) = rows
    assert row["run_id"] == a["run_id"] and row["tokens"] == 460
    assert row["cost_usd"] == pytest.approx(sonnet_cost(400, 60)) and row["cost_complete"]


# --------------------------------------------------------------------------- live

LIVE = os.environ.get("COMPOSE_LIVE_TESTS") == "1" and bool(os.environ.get("ANTHROPIC_API_KEY"))


@pytest.mark.skipif(not LIVE, reason="needs COMPOSE_LIVE_TESTS=1 and ANTHROPIC_API_KEY")
def test_prov10_live_smoke():
    model = AnthropicModel(os.environ.get("COMPOSE_LIVE_ANTHROPIC_MODEL", "claude-haiku-4-5"))
    response = model.complete(req(Message.user("Reply with the single word: pong"), max_tokens=20))
    assert "pong" in response.message.text.lower()
    events = list(model.stream(req(Message.user("Say hi"), max_tokens=20)))
    assert events[-1].kind == "response_done"


def test_prov12_hand_built_replies_of_a_stub_client_are_read_by_attribute():
    """A test double returning plain attribute objects (not SDK models) still parses."""
    from types import SimpleNamespace as NS

    reply = NS(
        content=[
            NS(type="text", text="checking"),
            NS(type="tool_use", id="t1", name="f", input={}),
        ],
        stop_reason="tool_use",
        usage=NS(input_tokens=10, output_tokens=5),
    )
    client = NS(messages=NS(create=lambda **kwargs: reply))
    response = AnthropicModel(SONNET, client=client).complete(req())
    assert response.message.text == "checking"
    assert [p.name for p in response.message.parts if isinstance(p, ToolCallPart)] == ["f"]
    assert response.stop_reason is StopReason.TOOL_USE
    assert (response.usage.input_tokens, response.usage.output_tokens) == (10, 5)
    assert response.usage.cost_usd == pytest.approx((10 * 3 + 5 * 15) / 1e6)


def _rich_reply() -> dict:
    return w.message(
        w.thinking("let me see", signature="sig-9"),
        w.text("Adding."),
        w.tool_use("toolu_1", "add", {"a": 1, "b": 2}),
        stop_reason="tool_use",
        usage_=w.usage(30, 7, cache_read=4, cache_creation=6, ttl=(2, 4), thinking=3),
    )


def test_prov12_reply_read_from_the_raw_body_equals_the_typed_sdk_reply(wire):
    """PROV-10/12/13: the SDK's own client has its reply read from the JSON body; a client of
    another class (here a subclass) goes through the SDK's typed reply. Both map alike, sync
    and async, thinking token and priced usage included."""
    import anthropic

    class Sub(anthropic.Anthropic):
        pass

    class AsyncSub(anthropic.AsyncAnthropic):
        pass

    raw_model = make(wire)
    typed_model = make(wire)
    typed_model._client = Sub(api_key="k", base_url=wire.url, max_retries=0)
    wire.push(*[w.JsonReply(_rich_reply())] * 4)
    raw = raw_model.complete(req())
    typed = typed_model.complete(req())
    assert raw == typed
    assert raw.usage.cost_usd == pytest.approx(sonnet_cost(30, 7, cache_read=4, w5=2, w1=4))
    assert [type(p).__name__ for p in raw.message.parts] == [
        "ThinkingPart",
        "TextPart",
        "ToolCallPart",
    ]

    async def both():
        typed_model._async_client = AsyncSub(api_key="k", base_url=wire.url, max_retries=0)
        return await raw_model.acomplete(req()), await typed_model.acomplete(req())

    araw, atyped = asyncio.run(both())
    assert araw == atyped == raw
    assert len(wire.requests) == 4


def test_prov10_a_patched_create_of_the_sdk_client_is_still_called(wire):
    """PROV-10: a test suite that patches ``messages.create`` on the adapter's own client
    gets its stand-in called (the raw-body read applies only to the SDK's own method)."""
    model = make(wire)
    wire.push(w.JsonReply(w.message(w.text("first"))))
    assert model.complete(req()).message.text == "first"
    real = model._client.messages.create
    seen = []

    def patched(**kwargs):
        seen.append(kwargs["model"])
        return real(**kwargs)

    model._client.messages.create = patched
    wire.push(w.JsonReply(w.message(w.text("second"))))
    assert model.complete(req()).message.text == "second"
    assert seen == [SONNET] and len(wire.requests) == 2
