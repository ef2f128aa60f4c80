"""The OpenAI adapter over the Responses API (providers.md PROV-15 … PROV-19, PROV-40/41;
agents.md AGENT-23/25, AGENT-93).

The REAL ``openai`` SDK talks HTTP to a loopback server (tests/_openai_wire.py) that speaks
the Responses API's JSON and SSE formats and records every request, so the assertions are on
the JSON the SDK actually sent. The pure mapping functions are also tested directly.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import subprocess
import sys

import pytest

openai = pytest.importorskip("openai")

from pydantic import BaseModel, Field

import _openai_wire as wire
import composeai
from composeai import agent, tool
from composeai.errors import ConfigError, ProviderError
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
from composeai.models import _openai_common as common
from composeai.models import openai as oai
from composeai.models.base import ModelRequest, ToolSpec
from composeai.models.openai import OpenAIModel, create_model

KEY = "sk-test"


@pytest.fixture
def server():
    s = wire.WireServer()
    yield s
    s.close()


@pytest.fixture
def model(server):
    return OpenAIModel("gpt-5.4", api_key=KEY, base_url=server.url, max_retries=0)


def req(text="hi", **kw) -> ModelRequest:
    return ModelRequest(model="gpt-5.4", messages=[Message.user(text)], **kw)


def text_reply(text="Hello!", **kw) -> dict:
    return wire.response([wire.message_item(text)], **kw)


ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}


# -- construction, SDK, key, clients (PROV-15, PKG-5) ----------------------------


def test_prov15_import_and_construction_import_no_sdk():
    code = (
        "import sys, composeai\n"
        "from composeai.models.openai import OpenAIModel, create_model\n"
        "from composeai.models.compatible import OpenAICompatibleModel\n"
        "m = create_model('gpt-5.4'); OpenAIModel('x', api_key='k')\n"
        "composeai.openai_compatible('http://127.0.0.1:1/v1', 'm')\n"
        "assert 'openai' not in sys.modules and 'httpx' not in sys.modules, 'imported'\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.stdout.strip() == "ok", out.stderr


def test_prov15_missing_sdk_is_a_config_error_at_call(monkeypatch):
    monkeypatch.setattr(common, "_SDK", None)
    monkeypatch.setitem(sys.modules, "openai", None)
    m = OpenAIModel("gpt-5.4", api_key=KEY)  # construction needs no SDK
    for call in (lambda: m.complete(req()), lambda: next(m.stream(req()))):
        with pytest.raises(ConfigError) as ei:
            call()
        assert str(ei.value) == "Install the provider SDK: pip install 'composeai[openai]'"
    with pytest.raises(ConfigError, match=r"pip install 'composeai\[openai\]'"):
        asyncio.run(m.acomplete(req()))


def test_prov15_missing_key_checked_at_first_call(server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    m = OpenAIModel("gpt-5.4", base_url=server.url)
    with pytest.raises(ConfigError) as ei:
        m.complete(req())
    assert str(ei.value) == (
        "Missing OpenAI API key: set the OPENAI_API_KEY environment variable, or pass "
        "api_key=... / client=... to OpenAIModel."
    )
    with pytest.raises(ConfigError, match="Missing OpenAI API key"):
        asyncio.run(m.acomplete(req()))
    assert server.requests == []
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    server.queue(wire.Reply(body=text_reply()))
    assert m.complete(req()).message.text == "Hello!"
    assert server.requests[0].headers["authorization"] == "Bearer sk-env"


def test_prov15_client_gets_only_the_options_that_are_set(monkeypatch):
    seen = []

    class Recorder:
        def __init__(self, **kwargs):
            seen.append(kwargs)
            self.responses = self

        def create(self, **kwargs):
            return text_reply()

    monkeypatch.setattr(openai, "OpenAI", Recorder)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    OpenAIModel("gpt-5.4").complete(req())
    OpenAIModel(
        "gpt-5.4", api_key="k", max_retries=5, base_url="http://h/v1", timeout=3.5
    ).complete(req())
    assert seen == [
        {"max_retries": 2},
        {"api_key": "k", "max_retries": 5, "base_url": "http://h/v1", "timeout": 3.5},
    ]


def test_prov15_openai_base_url_environment_is_honoured(server, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server.queue(wire.Reply(body=text_reply("via env")))
    assert create_model("gpt-5.4").complete(req()).message.text == "via env"
    assert server.requests[0].path == "/v1/responses"


def test_prov15_clients_built_lazily_and_kept_on_the_instance(model, server):
    assert model._client is None and model._async_client is None
    server.repeat = wire.Reply(body=text_reply())
    model.complete(req())
    assert isinstance(model._client, openai.OpenAI)
    assert model._async_client is None
    first = model._client
    model.complete(req())
    assert model._client is first
    asyncio.run(model.acomplete(req()))
    assert isinstance(model._async_client, openai.AsyncOpenAI)


def test_prov15_patched_client_attributes_are_used(model):
    class Stub:
        def __init__(self):
            self.responses = self
            self.calls = []

        def create(self, **kwargs):
            self.calls.append(kwargs)
            return text_reply("stubbed")

    class AsyncStub(Stub):
        async def create(self, **kwargs):
            self.calls.append(kwargs)
            return text_reply("async stubbed")

    model._client = Stub()
    model._async_client = AsyncStub()
    assert model.complete(req()).message.text == "stubbed"
    assert asyncio.run(model.acomplete(req())).message.text == "async stubbed"
    assert asyncio.run(model.acomplete(req())).message.text == "async stubbed"
    assert len(model._async_client.calls) == 2


def test_prov15_injected_client_is_sync_only_and_skips_the_key_check(server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    client = openai.OpenAI(api_key="injected", base_url=server.url, max_retries=0)
    m = OpenAIModel("gpt-5.4", client=client)
    assert m.acomplete is None and m.astream is None and m._async_client is None
    assert isinstance(m, composeai.models.base.Model)
    server.queue(wire.Reply(body=text_reply()))
    assert m.complete(req()).message.text == "Hello!"
    assert server.requests[0].headers["authorization"] == "Bearer injected"


def test_prov1_model_string_resolves_to_an_openai_model():
    from composeai.models import registry

    m = registry.resolve("openai/gpt-5.4")
    assert isinstance(m, OpenAIModel) and m.model_id == "gpt-5.4"
    assert registry.resolve("openai/gpt-5.4") is m


# -- request mapping (PROV-16, PROV-40) ------------------------------------------


def test_prov16_request_kwargs_full_mapping():
    token = json.dumps(
        {"item": {"type": "reasoning", "id": "rs_9", "summary": []}, "model": "gpt-5.4"}
    )
    messages = [
        Message.user(
            [
                TextPart(text="look"),
                ImagePart(media_type="image/png", data="AAAA"),
                ImagePart(media_type="image/jpeg", url="https://x/y.jpg"),
            ]
        ),
        Message.assistant(
            [
                ThinkingPart(text="hmm", provider="openai", provider_token=token),
                TextPart(text="calling"),
                ToolCallPart(id="c1", name="add", arguments={"a": 1, "b": 2}),
            ]
        ),
        Message(
            role="user",
            parts=[
                ToolResultPart(tool_call_id="c1", content="3"),
                ToolResultPart(tool_call_id="c2", content="bad", is_error=True),
            ],
        ),
    ]
    tools = [ToolSpec(name="add", description="Add.", input_schema=ADD_SCHEMA)]
    request = ModelRequest(
        model="gpt-5.4",
        messages=messages,
        system="Be brief.",
        tools=tools,
        output_schema=ADD_SCHEMA,
        max_tokens=123,
        temperature=0.2,
        prompt_cache=True,
        thinking=True,
        effort="high",
        thinking_budget=999,
    )
    assert oai.request_kwargs(request, "gpt-5.4") == {
        "model": "gpt-5.4",
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "look"},
                    {
                        "type": "input_image",
                        "image_url": "data:image/png;base64,AAAA",
                        "detail": "auto",
                    },
                    {"type": "input_image", "image_url": "https://x/y.jpg", "detail": "auto"},
                ],
            },
            {"type": "reasoning", "id": "rs_9", "summary": []},
            {"role": "assistant", "content": [{"type": "input_text", "text": "calling"}]},
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "add",
                "arguments": '{"a": 1, "b": 2}',
            },
            {"type": "function_call_output", "call_id": "c1", "output": "3"},
            {"type": "function_call_output", "call_id": "c2", "output": "ERROR: bad"},
        ],
        "max_output_tokens": 123,
        "instructions": "Be brief.",
        "temperature": 0.2,
        "tools": [
            {
                "type": "function",
                "name": "add",
                "description": "Add.",
                "parameters": ADD_SCHEMA,
                "strict": True,
            }
        ],
        "text": {
            "format": {
                "type": "json_schema",
                "name": "response",
                "schema": ADD_SCHEMA,
                "strict": True,
            }
        },
        "reasoning": {"effort": "high"},
    }


def test_prov40_defaults_send_nothing_extra():
    assert oai.request_kwargs(req(), "gpt-5.4") == {
        "model": "gpt-5.4",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        "max_output_tokens": 16000,
    }


def test_prov16_wire_body_is_the_mapped_request(model, server):
    request = req(system="sys", temperature=0.0, effort="low", output_schema=ADD_SCHEMA)
    server.queue(wire.Reply(body=text_reply('{"a": 1, "b": 2}')))
    assert model.complete(request).parsed == {"a": 1, "b": 2}
    assert server.requests[0].path == "/v1/responses"
    assert server.requests[0].body == oai.request_kwargs(request, "gpt-5.4")


def test_prov16_reasoning_items_echoed_only_to_the_same_model_without_encrypted_content():
    item = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "SECRET"}
    same = ThinkingPart(
        text="t", provider="openai", provider_token=json.dumps({"item": item, "model": "gpt-5.4"})
    )
    other_model = ThinkingPart(
        text="t", provider="openai", provider_token=json.dumps({"item": item, "model": "gpt-5.5"})
    )
    other_provider = ThinkingPart(text="t", provider="anthropic", provider_token="{}")
    no_token = ThinkingPart(text="t")
    messages = [Message.assistant([same, other_model, other_provider, no_token])]
    items = oai.input_items(messages, "gpt-5.4")
    assert items == [{"type": "reasoning", "id": "rs_1", "summary": []}]
    assert "SECRET" not in json.dumps(items)
    assert oai.input_items(messages, "gpt-5.5") == items
    assert oai.input_items(messages, "o9") == []


def test_prov16_schema_name_rule():
    assert common.schema_name({"title": "Fact_Sheet-2"}) == "Fact_Sheet-2"
    assert common.schema_name({"title": "has space"}) == "response"
    assert common.schema_name({"title": "x" * 65}) == "response"
    assert common.schema_name({"title": 3}) == "response"
    assert common.schema_name({}) == "response"
    fmt = oai.text_format({"title": "Answer", "type": "object"})["format"]
    assert fmt["name"] == "Answer"


# -- strict flag (PROV-17) -------------------------------------------------------


def _obj(props: dict, required=None, **extra) -> dict:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
        **extra,
    }


STRICT_CASES = [
    (_obj({"a": {"type": "string"}}), True),
    (_obj({}), True),
    ({"type": "object", "additionalProperties": False}, True),
    (_obj({"a": {"type": "string", "default": "x"}}), False),
    (_obj({"a": {"type": "string"}}, required=[]), False),
    (_obj({"a": {"type": "string"}, "b": {"type": "integer"}}, required=["a"]), False),
    ({"type": "object", "additionalProperties": {"type": "string"}}, False),
    (_obj({"a": {"type": "string", "format": "date-time"}}), True),
    (_obj({"a": {"type": "string", "format": "uuid"}}), True),
    (_obj({"a": {"type": "string", "format": "uri"}}), False),
    (_obj({"a": {"type": "array", "items": {"type": "string", "maxLength": 3}}}), False),
    (_obj({"a": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]}}), False),
    (
        _obj({"a": {"$ref": "#/$defs/B"}}, **{"$defs": {"B": _obj({"x": {"type": "integer"}})}}),
        True,
    ),
    (
        _obj({"a": {"$ref": "#/$defs/B"}}, **{"$defs": {"B": _obj({"x": {}}, required=[])}}),
        False,
    ),
    # property *names* and data values are not keywords
    (_obj({"default": {"type": "string"}, "pattern": {"type": "string"}}), True),
    (_obj({"a": {"enum": [{"minimum": 1}], "const": {"default": 2}}}), True),
]
KEYWORDS = [
    "minLength maxLength pattern minimum maximum exclusiveMinimum exclusiveMaximum multipleOf",
    "patternProperties unevaluatedProperties propertyNames minProperties maxProperties",
    "unevaluatedItems contains minContains maxContains minItems maxItems uniqueItems",
]


@pytest.mark.parametrize(("schema", "strict"), STRICT_CASES)
def test_prov17_strict_flag(schema, strict):
    before = copy.deepcopy(schema)
    assert common.strict_flag(schema) is strict
    assert schema == before  # never mutated


@pytest.mark.parametrize("keyword", " ".join(KEYWORDS).split())
def test_prov17_each_unsupported_keyword_disables_strict(keyword):
    assert common.strict_flag(_obj({"a": {"type": "string", keyword: 1}})) is False


def test_prov17_strict_flag_on_tools_and_output_schema_over_the_wire(model, server):
    loose = _obj({"n": {"type": "integer", "maximum": 9}})
    tools = [
        ToolSpec(name="tight", description="T.", input_schema=ADD_SCHEMA),
        ToolSpec(name="loose", description="L.", input_schema=loose),
        ToolSpec(name="optout", description="O.", input_schema=ADD_SCHEMA, strict=False),
    ]
    server.queue(wire.Reply(body=text_reply('{"n": 1}')))
    model.complete(req(tools=tools, output_schema=loose))
    body = server.requests[0].body
    assert [t["strict"] for t in body["tools"]] == [True, False, False]
    assert body["text"]["format"]["strict"] is False
    assert body["tools"][1]["parameters"] == loose


# -- responses (PROV-18, PROV-19) ------------------------------------------------


def test_prov18_text_reply(model, server):
    server.queue(wire.Reply(body=text_reply("Hello!")))
    r = model.complete(req())
    assert r.message == Message.assistant("Hello!")
    assert r.stop_reason is StopReason.END_TURN and r.raw_stop_reason == "completed"
    assert r.model_id == "gpt-5.4" and r.parsed is None


def test_prov18_output_items_mapping_pure():
    resp = wire.response(
        [
            wire.reasoning_item("first thought", encrypted="ENC"),
            wire.message_item("answer"),
            wire.call_item("call_1", "add", {"a": 1}),
        ]
    )
    r = oai.parse_response(resp, req(), "gpt-5.4")
    thinking, text, call = r.message.parts
    assert thinking.text == "first thought" and thinking.provider == "openai"
    assert "ENC" not in thinking.provider_token
    assert json.loads(thinking.provider_token) == {
        "item": {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "first thought"}],
        },
        "model": "gpt-5.4",
    }
    assert text == TextPart(text="answer")
    assert call == ToolCallPart(id="call_1", name="add", arguments={"a": 1})
    assert r.stop_reason is StopReason.TOOL_USE and r.raw_stop_reason == "completed"
    content_only = {
        "type": "reasoning",
        "id": "rs_2",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "raw"}],
    }
    assert oai.parse_response(wire.response([content_only]), req(), "m").message.parts[0].text == (
        "raw"
    )


def test_prov18_stop_reasons_pure():
    def stop(resp):
        r = oai.parse_response(resp, req(), "gpt-5.4")
        return r.stop_reason, r.raw_stop_reason

    msg = [wire.message_item("x")]
    assert stop(wire.response(msg)) == (StopReason.END_TURN, "completed")
    assert stop(wire.response(msg, status="incomplete", incomplete="max_output_tokens")) == (
        StopReason.MAX_TOKENS,
        "incomplete:max_output_tokens",
    )
    assert stop(wire.response(msg, status="incomplete", incomplete="content_filter")) == (
        StopReason.OTHER,
        "incomplete:content_filter",
    )
    refusal = [wire.message_item("", refusal="I can't help with that.")]
    r = oai.parse_response(wire.response(refusal), req(), "gpt-5.4")
    assert r.stop_reason is StopReason.REFUSAL
    assert r.message.text == "I can't help with that."
    assert stop(wire.response(msg, status="in_progress")) == (StopReason.OTHER, "in_progress")
    calls = [wire.call_item("c", "f", {}), wire.message_item("x")]
    assert stop(wire.response(calls, status="incomplete", incomplete="max_output_tokens"))[0] is (
        StopReason.TOOL_USE
    )


@pytest.mark.parametrize(
    ("error", "message"),
    [
        ({"code": "server_error", "message": "it broke"}, "server_error: it broke"),
        ({"code": None, "message": "only message"}, "only message"),
        ({"code": "only_code", "message": None}, "only_code"),
        (None, "unknown error"),
    ],
)
def test_prov18_failed_response_messages(error, message):
    with pytest.raises(ProviderError) as ei:
        oai.parse_response(wire.response([], status="failed", error=error), req(), "gpt-5.4")
    assert str(ei.value) == f"OpenAI response failed: {message}"
    assert ei.value.provider == "openai" and ei.value.model == "gpt-5.4"


def test_prov18_failed_and_incomplete_over_the_wire(model, server):
    failed = wire.response(
        [], status="failed", error={"code": "rate_limit_exceeded", "message": "slow down"}
    )
    incomplete = wire.response(
        [wire.message_item("partial")], status="incomplete", incomplete="max_output_tokens"
    )
    server.queue(wire.Reply(body=failed), wire.sse(failed), wire.Reply(body=incomplete))
    server.queue(wire.sse(incomplete))
    with pytest.raises(
        ProviderError, match="^OpenAI response failed: rate_limit_exceeded: slow down$"
    ):
        model.complete(req())
    with pytest.raises(
        ProviderError, match="^OpenAI response failed: rate_limit_exceeded: slow down$"
    ):
        list(model.stream(req()))
    r = model.complete(req())
    assert r.stop_reason is StopReason.MAX_TOKENS
    assert r.raw_stop_reason == "incomplete:max_output_tokens"
    assert list(model.stream(req()))[-1].response == r


def test_prov18_non_json_tool_arguments(model, server):
    bad = wire.response([wire.call_item("c1", "add", "{not json")])
    server.queue(wire.Reply(body=bad), wire.sse(bad))
    tools = [ToolSpec(name="add", description="Add.", input_schema=ADD_SCHEMA)]
    for call in (
        lambda: model.complete(req(tools=tools)),
        lambda: list(model.stream(req(tools=tools))),
    ):
        with pytest.raises(ProviderError) as ei:
            call()
        assert str(ei.value).startswith(
            "OpenAI returned non-JSON arguments for function_call 'add': Expecting property name"
        )
        assert ei.value.provider == "openai"


def test_prov18_non_json_structured_text(model, server):
    server.queue(wire.Reply(body=text_reply("not json")))
    with pytest.raises(ProviderError) as ei:
        model.complete(req(output_schema=ADD_SCHEMA))
    assert str(ei.value).startswith(
        "OpenAI returned non-JSON text for a structured-output request: Expecting value"
    )


def test_prov19_usage_and_cost_of_a_priced_model(model, server):
    server.queue(wire.Reply(body=text_reply(use=wire.usage(1000, 200, cached=400, reasoning=50))))
    u = model.complete(req()).usage
    assert (u.input_tokens, u.output_tokens, u.cache_read_tokens) == (1000, 200, 400)
    assert (u.cache_creation_tokens, u.reasoning_tokens) == (0, 50)
    assert u.cost_usd == pytest.approx((600 * 2.5 + 200 * 15 + 400 * 0.25) / 1e6)
    assert u.cost_complete is True


def test_prov19_unpriced_model_has_no_cost(server):
    m = OpenAIModel("my-finetune", api_key=KEY, base_url=server.url, max_retries=0)
    server.queue(wire.Reply(body=text_reply(model="my-finetune")))
    u = m.complete(req()).usage
    assert u.input_tokens == 10 and u.cost_usd is None and u.cost_complete is False


def test_prov19_missing_usage():
    resp = dict(text_reply(), usage=None)
    assert oai.parse_response(resp, req(), "gpt-5.4").usage == Usage(
        cost_usd=None, cost_complete=False
    )


# -- agents over the wire (AGENT-22/23/25) ---------------------------------------


@tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@tool
def mul(a: int, b: int) -> str:
    """Multiply two integers."""
    return str(a * b)


def test_prov18_tool_round_trip_through_an_agent(model, server):
    @agent(model=model, tools=[add])
    def calc(q: str) -> str:
        """You calculate."""
        return q

    server.queue(
        wire.Reply(body=wire.response([wire.call_item("call_1", "add", {"a": 2, "b": 3})])),
        wire.Reply(body=text_reply("5")),
    )
    run = calc.run("2+3?")
    assert run.output == "5"
    first, second = server.bodies()
    assert first["instructions"] == "You calculate."
    assert first["tools"][0]["name"] == "add" and first["tools"][0]["strict"] is True
    assert second["input"][1:] == [
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "add",
            "arguments": '{"a": 2, "b": 3}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "5"},
    ]
    assert run.usage.cost_usd == pytest.approx(2 * (10 * 2.5 + 5 * 15) / 1e6)


def test_prov18_parallel_tool_calls(model, server):
    @agent(model=model, tools=[add, mul])
    def calc2(q: str) -> str:
        return q

    both = wire.response(
        [
            wire.call_item("c_add", "add", {"a": 2, "b": 3}),
            wire.call_item("c_mul", "mul", {"a": 2, "b": 3}),
        ]
    )
    server.queue(wire.Reply(body=both), wire.Reply(body=text_reply("5 and 6")))
    assert calc2("both") == "5 and 6"
    outputs = [i for i in server.bodies()[1]["input"] if i.get("type") == "function_call_output"]
    assert outputs == [
        {"type": "function_call_output", "call_id": "c_add", "output": "5"},
        {"type": "function_call_output", "call_id": "c_mul", "output": "6"},
    ]


class Fact(BaseModel):
    name: str
    year: int


class Loose(BaseModel):
    code: str = Field(max_length=4)


def test_prov16_structured_output_through_an_agent(model, server):
    @agent(model=model)
    def fact(q: str) -> Fact:
        return q

    @agent(model=model)
    def loose(q: str) -> Loose:
        return q

    server.queue(
        wire.Reply(body=text_reply('{"name": "Ada", "year": 1843}')),
        wire.Reply(body=text_reply('{"code": "AB"}')),
    )
    assert fact("who?") == Fact(name="Ada", year=1843)
    assert loose("code?") == Loose(code="AB")
    strict_fmt, loose_fmt = (b["text"]["format"] for b in server.bodies())
    assert strict_fmt["type"] == "json_schema" and strict_fmt["name"] == "response"
    assert strict_fmt["strict"] is True
    assert (
        loose_fmt["strict"] is False and loose_fmt["schema"]["properties"]["code"]["maxLength"] == 4
    )


def test_agent23_provider_errors_are_retried_and_fall_back(server):
    primary = OpenAIModel("gpt-5.4", api_key=KEY, base_url=server.url, max_retries=0)
    backup = OpenAIModel("gpt-5.4-mini", api_key=KEY, base_url=server.url, max_retries=0)

    @agent(model=primary, retries=1, fallback=backup)
    def resilient(q: str) -> str:
        return q

    server.queue(
        wire.error_reply(500, "first"),
        wire.error_reply(503, "second"),
        wire.Reply(body=text_reply("from backup", model="gpt-5.4-mini")),
    )
    run = resilient.run("hi")
    assert run.output == "from backup"
    assert [b["model"] for b in server.bodies()] == ["gpt-5.4", "gpt-5.4", "gpt-5.4-mini"]


# -- transport errors (PROV-12 rule applied to OpenAI, PROV-41) -------------------


@pytest.mark.parametrize("status", [400, 401, 404, 429, 500, 503])
def test_prov15_http_errors_become_provider_errors(model, server, status):
    server.queue(wire.error_reply(status, "nope", code="bad_thing"))
    with pytest.raises(ProviderError) as ei:
        model.complete(req())
    assert f"Error code: {status}" in str(ei.value) and "nope" in str(ei.value)
    assert (ei.value.provider, ei.value.model) == ("openai", "gpt-5.4")
    assert isinstance(ei.value.__cause__, openai.APIStatusError)
    assert len(server.requests) == 1  # max_retries=0


def test_prov15_http_errors_async_and_streaming(model, server):
    server.queue(wire.error_reply(500), wire.error_reply(500), wire.error_reply(500))
    with pytest.raises(ProviderError, match="Error code: 500"):
        asyncio.run(model.acomplete(req()))
    with pytest.raises(ProviderError, match="Error code: 500"):
        list(model.stream(req()))

    async def drain():
        return [e async for e in model.astream(req())]

    with pytest.raises(ProviderError, match="Error code: 500"):
        asyncio.run(drain())


def test_prov41_timeout_bounds_each_request(server):
    m = OpenAIModel("gpt-5.4", api_key=KEY, base_url=server.url, max_retries=0, timeout=0.2)
    server.queue(wire.Reply(body=text_reply(), delay=30), wire.Reply(body=text_reply(), delay=30))
    with pytest.raises(ProviderError) as ei:
        m.complete(req())
    assert str(ei.value) == "Request timed out."
    assert isinstance(ei.value.__cause__, openai.APITimeoutError)
    with pytest.raises(ProviderError, match="Request timed out."):
        asyncio.run(m.acomplete(req()))


def test_prov15_connection_failure(server):
    url = server.url
    server.close()
    m = OpenAIModel("gpt-5.4", api_key=KEY, base_url=url, max_retries=0)
    with pytest.raises(ProviderError) as ei:
        m.complete(req())
    assert str(ei.value) == "Connection error."
    with pytest.raises(ProviderError, match="Connection error."):
        list(m.stream(req()))


# -- streaming (PROV-8, PROV-18, AGENT-25, AGENT-93) ------------------------------


def test_prov8_stream_events_and_final_response_equal_complete(model, server):
    final = wire.response(
        [
            wire.reasoning_item("plan it"),
            wire.message_item("Sure thing"),
            wire.call_item("c1", "add", {"a": 1, "b": 2}),
        ],
        use=wire.usage(50, 30, cached=10, reasoning=12),
    )
    server.queue(wire.Reply(body=final), wire.sse(final))
    request = req(tools=[ToolSpec(name="add", description="Add.", input_schema=ADD_SCHEMA)])
    done = model.complete(request)
    events = list(model.stream(request))
    kinds = [e.kind for e in events]
    assert kinds == [
        "thinking_delta",
        "thinking_delta",
        "text_delta",
        "text_delta",
        "tool_call_started",
        "tool_args_delta",
        "tool_args_delta",
        "tool_call_finished",
        "response_done",
    ]
    assert "".join(e.text for e in events if e.kind == "thinking_delta") == "plan it"
    assert "".join(e.text for e in events if e.kind == "text_delta") == "Sure thing"
    args = [e for e in events if e.kind == "tool_args_delta"]
    assert "".join(e.text for e in args) == '{"a": 1, "b": 2}'
    assert {(e.tool_call_id, e.tool_name) for e in events[4:8]} == {("c1", "add")}
    assert events[-1].response == done
    assert server.bodies()[1]["stream"] is True


def test_prov8_structured_output_stream_equals_complete(model, server):
    final = text_reply('{"a": 4, "b": 5}')
    server.queue(wire.Reply(body=final), wire.sse(final))
    request = req(output_schema=ADD_SCHEMA)
    done = model.complete(request)
    events = list(model.stream(request))
    assert done.parsed == {"a": 4, "b": 5}
    assert events[-1].response == done
    assert server.bodies()[1]["text"] == oai.text_format(ADD_SCHEMA)


def test_prov8_async_stream_equals_complete(model, server):
    final = text_reply("streamed async")
    server.queue(wire.Reply(body=final), wire.sse(final))

    async def main():
        done = await model.acomplete(req())
        events = [e async for e in model.astream(req())]
        return done, events

    done, events = asyncio.run(main())
    assert [e.kind for e in events] == ["text_delta", "text_delta", "response_done"]
    assert events[-1].response == done


def test_agent25_agent_stream_emits_deltas(model, server):
    @agent(model=model)
    def talker(q: str) -> str:
        return q

    server.queue(wire.sse(text_reply("Hello world")))
    stream = talker.stream("hi")
    deltas = [e.text for e in stream if e.kind == "text_delta"]
    assert "".join(deltas) == "Hello world"
    assert stream.run.output == "Hello world"


def test_prov18_stream_ending_early_is_a_provider_error(model, server):
    final = text_reply("never finished")
    server.queue(wire.sse(final, end_after=3), wire.sse(final, end_after=3))
    with pytest.raises(ProviderError) as ei:
        list(model.stream(req()))
    assert str(ei.value) == (
        "OpenAI's response stream ended without a response.completed event -- the stream was "
        "closed or interrupted before finishing"
    )

    async def drain():
        return [e async for e in model.astream(req())]

    with pytest.raises(ProviderError, match="ended without a response.completed event"):
        asyncio.run(drain())


def test_prov18_stream_error_event_is_a_provider_error(model, server):
    events = wire.response_events(text_reply("partial"))[:3]
    error = {"type": "error", "sequence_number": 3, "code": "server_error", "message": "overloaded"}
    server.queue(wire.Reply(events=[*events, ("error", error)]))
    with pytest.raises(ProviderError) as ei:
        list(model.stream(req()))
    # Some 1.x SDKs (e.g. 1.67) drop stream-level error events; the stream then ends early.
    assert str(ei.value) in ("OpenAI response failed: server_error: overloaded", oai.STREAM_CUT)
    if int(openai.__version__.split(".")[0]) >= 2:
        assert str(ei.value) == "OpenAI response failed: server_error: overloaded"


def test_prov18_dropped_connection_mid_stream_is_a_provider_error(model, server):
    final = text_reply("cut short")
    server.queue(wire.sse(final, cut_after=4), wire.sse(final, cut_after=4))
    # Newer SDKs wrap the transport error in APIConnectionError, older ones let it escape.
    dropped = r"^(Connection error\.|OpenAI request failed: \w+: .+)$"
    with pytest.raises(ProviderError, match=dropped) as ei:
        list(model.stream(req()))
    assert ei.value.provider == "openai" and ei.value.model == "gpt-5.4"

    async def drain():
        return [e async for e in model.astream(req())]

    with pytest.raises(ProviderError, match=dropped):
        asyncio.run(drain())


def test_agent25_cut_stream_is_streamed_again_by_retries(model, server):
    @agent(model=model, retries=1)
    def retried(q: str) -> str:
        return q

    final = text_reply("second time lucky")
    server.queue(wire.sse(final, cut_after=4), wire.sse(final))
    stream = retried.stream("hi")
    deltas = [e.text for e in stream if e.kind == "text_delta"]
    assert stream.run.output == "second time lucky"
    assert len(server.requests) == 2
    assert "".join(deltas).endswith("second time lucky")
    assert all(b["stream"] is True for b in server.bodies())


def test_agent25_cut_stream_retried_async(model, server):
    @agent(model=model, retries=1)
    def aretried(q: str) -> str:
        return q

    final = text_reply("async again")
    server.queue(wire.sse(final, cut_after=4), wire.sse(final))

    async def main():
        stream = aretried.astream("hi")
        deltas = [e.text async for e in stream if e.kind == "text_delta"]
        return deltas, await stream.run()

    deltas, run = asyncio.run(main())
    assert run.output == "async again" and len(server.requests) == 2
    assert "".join(deltas).endswith("async again")


def test_agent93_closing_the_stream_closes_the_connection(model, server):
    server.queue(wire.sse(text_reply("a long answer"), hold_after=4))
    events = model.stream(req())
    first = next(e for e in events if e.kind == "text_delta")
    assert first.text
    events.close()
    assert server.client_gone.wait(30)


def test_agent93_aclose_closes_the_connection(model, server):
    server.queue(wire.sse(text_reply("a long answer"), hold_after=4))

    async def main():
        events = model.astream(req())
        async for e in events:
            if e.kind == "text_delta":
                break
        await events.aclose()

    asyncio.run(main())
    assert server.client_gone.wait(30)


# -- event loops ------------------------------------------------------------------


def test_prov15_successive_event_loops_send_each_request_once(model, server):
    @agent(model=model)
    def looped(q: str) -> str:
        return q

    server.repeat = wire.Reply(body=text_reply("again"))
    first = asyncio.run(looped.arun("one"))
    client_one = model._async_client
    second = asyncio.run(looped.arun("two"))
    assert first.output == second.output == "again"
    assert len(server.requests) == 2
    assert model._async_client is not client_one

    server.repeat = wire.sse(text_reply("streamed"))

    async def streamed():
        stream = looped.astream("three")
        return [e async for e in stream], await stream.run()

    for _ in range(2):
        assert asyncio.run(streamed())[1].output == "streamed"
    assert len(server.requests) == 4


# -- SDK drift: extra_body ---------------------------------------------------------


def test_prov15_sdk_drift_unknown_keywords_go_through_extra_body(model):
    class Responses:
        def __init__(self):
            self.calls = []

        def create(self, *, model, input, max_output_tokens, instructions=None, extra_body=None):
            self.calls.append(
                {
                    "model": model,
                    "input": input,
                    "max_output_tokens": max_output_tokens,
                    "instructions": instructions,
                    "extra_body": extra_body,
                }
            )
            return text_reply("drifted")

    class Client:
        responses = Responses()

    model._client = Client()
    r = model.complete(req(system="s", temperature=0.7, effort="low"))
    assert r.message.text == "drifted"
    (call,) = Client.responses.calls
    assert call["instructions"] == "s"
    assert call["extra_body"] == {"temperature": 0.7, "reasoning": {"effort": "low"}}


def test_prov15_sdk_drift_fit_kwargs_pure():
    def narrow(*, a, extra_body=None):
        return a

    def wide(*, a, **kw):
        return a

    def no_extra(*, a, b):
        return a

    assert common.fit_kwargs(narrow, {"a": 1, "b": 2}) == {"a": 1, "extra_body": {"b": 2}}
    assert common.fit_kwargs(narrow, {"a": 1}) == {"a": 1}
    assert common.fit_kwargs(wide, {"a": 1, "b": 2}) == {"a": 1, "b": 2}
    assert common.fit_kwargs(no_extra, {"a": 1, "b": 2}) == {"a": 1, "b": 2}
    sdk_create = openai.OpenAI(api_key="k").responses.create
    wanted = {"model": "m", "input": [], "max_output_tokens": 1, "temperature": 0.1}
    assert common.fit_kwargs(sdk_create, wanted) == wanted


# -- cross-process: pause in A, resume in B, the model is called once ---------------

ORDER_FLOW = """\
from composeai import agent, approve, flow


@agent(model="openai/gpt-5.4")
def drafter(topic: str) -> str:
    \"\"\"You write drafts.\"\"\"
    return f"Draft about {topic}"


@flow
def publish_flow(topic: str) -> dict:
    draft = drafter(topic)
    ok = approve("publish", {"draft": draft})
    return {"draft": draft, "ok": ok}
"""

START_ORDER = """
import ordermod
run = ordermod.publish_flow.run("owls")
emit(status=run.status, run_id=run.id)
"""

RESUME_ORDER = """
import os
import ordermod
from composeai import resume
run = resume(os.environ["RUN_ID"], answers={"publish": True})
emit(status=run.status, output=run.output)
"""


def test_prov19_cross_process_resume_never_rebills(tmp_path, server):
    import _proc

    sb = _proc.Sandbox(tmp_path)
    sb.write_module("ordermod", ORDER_FLOW, helper=False)
    env = {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": KEY}
    server.queue(
        wire.Reply(body=text_reply("An owl draft.", use=wire.usage(1000, 100, cached=200)))
    )
    a = sb.run(START_ORDER, **env).ok()
    assert a["status"] == "paused"
    b = sb.run(RESUME_ORDER, RUN_ID=a["run_id"], **env).ok()
    assert b == {"status": "completed", "output": {"draft": "An owl draft.", "ok": True}}
    assert len(server.requests) == 1
    assert server.requests[0].body["input"][0]["content"][0]["text"] == "Draft about owls"
    rows = sb.query(
        "SELECT name, cost_usd, cost_complete, input_tokens FROM spans WHERE kind='llm'"
    )
    expected = (800 * 2.5 + 100 * 15 + 200 * 0.25) / 1e6
    assert len(rows) == 1
    name, cost, complete, tokens = rows[0]
    assert (name, complete, tokens) == ("openai/gpt-5.4", 1, 1000)
    assert cost == pytest.approx(expected)


# -- live smoke test ----------------------------------------------------------------


@pytest.mark.skipif(
    os.environ.get("COMPOSE_LIVE_TESTS") != "1" or not os.environ.get("OPENAI_API_KEY"),
    reason="live test: set COMPOSE_LIVE_TESTS=1 and OPENAI_API_KEY",
)
def test_prov15_live_smoke():
    m = OpenAIModel(os.environ.get("COMPOSE_LIVE_OPENAI_MODEL", "gpt-5.4-nano"))
    r = m.complete(req("Reply with the single word: pong", max_tokens=200))
    assert r.stop_reason is StopReason.END_TURN and "pong" in r.message.text.lower()
    events = list(m.stream(req("Reply with the single word: pong", max_tokens=200)))
    assert events[-1].kind == "response_done"


@pytest.mark.parametrize("reasoning", [False, True], ids=["plain", "reasoning"])
def test_prov18_reply_read_from_the_raw_body_equals_the_typed_sdk_reply(server, reasoning):
    """PROV-16/18/19: the SDK's own client has its reply read from the JSON body (a reply with
    a reasoning item through the SDK's typed model, whose dump is the echo token); a client of
    another class (here a subclass) always goes through the typed reply. Both map alike, sync
    and async."""
    import openai

    class Sub(openai.OpenAI):
        pass

    class AsyncSub(openai.AsyncOpenAI):
        pass

    items = [wire.message_item("Sure thing"), wire.call_item("c1", "add", {"a": 1, "b": 2})]
    if reasoning:
        items.insert(0, wire.reasoning_item("plan it", encrypted="enc-1"))
    server.repeat = wire.Reply(body=wire.response(items, use=wire.usage(50, 30, cached=10)))
    raw_model = OpenAIModel("gpt-5.4", api_key=KEY, base_url=server.url, max_retries=0)
    typed_model = OpenAIModel("gpt-5.4", api_key=KEY, base_url=server.url, max_retries=0)
    typed_model._client = Sub(api_key=KEY, base_url=server.url, max_retries=0)
    raw = raw_model.complete(req())
    assert raw == typed_model.complete(req())
    assert [type(p).__name__ for p in raw.message.parts][-2:] == ["TextPart", "ToolCallPart"]
    assert raw.usage.cache_read_tokens == 10 and raw.usage.cost_usd is not None

    async def both():
        typed_model._async_client = AsyncSub(api_key=KEY, base_url=server.url, max_retries=0)
        return await raw_model.acomplete(req()), await typed_model.acomplete(req())

    assert asyncio.run(both()) == (raw, raw)
    assert len(server.requests) == 4


def test_prov16_a_patched_create_of_the_sdk_client_is_still_called(model, server):
    """PROV-16: a suite that patches ``responses.create`` on the adapter's own client gets
    its stand-in called (the raw-body read applies only to the SDK's own method)."""
    server.repeat = wire.Reply(body=text_reply("hi there"))
    assert model.complete(req()).message.text == "hi there"
    real = model._client.responses.create
    seen = []

    def patched(**kwargs):
        seen.append(kwargs["model"])
        return real(**kwargs)

    model._client.responses.create = patched
    assert model.complete(req()).message.text == "hi there"
    assert seen == ["gpt-5.4"] and len(server.requests) == 2
