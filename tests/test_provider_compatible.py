"""OpenAI-compatible servers through Chat Completions (providers.md PROV-20 … PROV-26; agents.md
AGENT-12/13, AGENT-23/25, AGENT-93).

The REAL ``openai`` SDK talks HTTP to a loopback server (tests/_openai_wire.py) speaking Chat
Completions JSON and SSE chunks; assertions are on the JSON the SDK sent. The pure mapping
functions (request, response, lenient JSON recovery) are also tested directly.
"""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

openai = pytest.importorskip("openai")

from pydantic import BaseModel

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
from composeai.models import compatible as compat
from composeai.models.base import ModelRequest, ToolSpec
from composeai.models.compatible import OpenAICompatibleModel, openai_compatible
from composeai.models.prices import ModelPrice, get_price

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
INSTRUCTION = (
    "Respond ONLY with a single JSON object that conforms to this JSON Schema -- no markdown "
    "fences, no commentary:\n" + json.dumps(SCHEMA)
)
NON_JSON = "Server returned non-JSON content for a structured-output request: "


@pytest.fixture
def server():
    s = wire.WireServer()
    yield s
    s.close()


def make(server, mode="native", **kw):
    return OpenAICompatibleModel(
        "local-model", base_url=server.url, max_retries=0, schema_mode=mode, **kw
    )


@pytest.fixture
def model(server):
    return make(server)


def req(text="hi", **kw) -> ModelRequest:
    return ModelRequest(model="local-model", messages=[Message.user(text)], **kw)


def reply(content="Hello!", **kw) -> wire.Reply:
    return wire.Reply(body=wire.completion(content, **kw))


# -- construction (PROV-20, PROV-21) ------------------------------------------------


def test_prov20_top_level_export_is_lazy_and_shared():
    assert composeai.openai_compatible is openai_compatible
    assert "openai_compatible" in composeai.__all__
    assert composeai.__all__ == sorted(composeai.__all__)


def test_prov20_returns_a_compatible_model():
    m = openai_compatible("http://127.0.0.1:9/v1", "qwen3", api_key="k", timeout=4.0)
    assert isinstance(m, OpenAICompatibleModel)
    assert (m.model_id, m.base_url, m.schema_mode) == ("qwen3", "http://127.0.0.1:9/v1", "native")
    assert (m._api_key, m._timeout, m._max_retries) == ("k", 4.0, 2)
    assert openai_compatible("http://h/v1", "q", schema_mode="auto").schema_mode == "auto"


@pytest.mark.parametrize(("inp", "out"), [(1.0, None), (None, 2.0)])
def test_prov20_unpaired_prices(inp, out):
    with pytest.raises(ConfigError) as ei:
        openai_compatible("http://h/v1", "m", input_price=inp, output_price=out)
    assert str(ei.value) == (
        "openai_compatible(): pass both input_price and output_price (USD per million tokens), "
        "or neither"
    )


def test_prov20_prices_registered_and_used_for_cost(server):
    m = openai_compatible(server.url, "priced-model", input_price=1.0, output_price=4.0)
    assert get_price("openai-compatible", "priced-model") == ModelPrice(input=1.0, output=4.0)
    m._max_retries = 0
    server.queue(reply(use=wire.chat_usage(1000, 100, cached=300, reasoning=7, cache_write=50)))
    u = m.complete(req()).usage
    assert (u.input_tokens, u.output_tokens, u.cache_read_tokens) == (1000, 100, 300)
    assert (u.cache_creation_tokens, u.reasoning_tokens) == (50, 7)
    assert u.cost_usd == pytest.approx((700 * 1.0 + 100 * 4.0 + 300 * 0.1) / 1e6)
    assert u.cost_complete is True


def test_prov26_unpriced_model_has_no_cost(model, server):
    server.queue(reply())
    u = model.complete(req()).usage
    assert u.input_tokens == 10 and u.cost_usd is None and u.cost_complete is False


@pytest.mark.parametrize("mode", ["strict", "", "Native"])
def test_prov21_invalid_schema_mode(mode):
    with pytest.raises(ConfigError) as ei:
        OpenAICompatibleModel("m", base_url="http://h/v1", schema_mode=mode)
    assert str(ei.value) == f"schema_mode must be 'native', 'prompt', or 'auto', got '{mode}'"
    with pytest.raises(ConfigError, match="schema_mode must be"):
        openai_compatible("http://h/v1", "m", schema_mode=mode)


def test_prov20_key_placeholder_and_no_environment_key(server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    server.queue(reply(), reply())
    openai_compatible(server.url, "m").complete(req())
    openai_compatible(server.url, "m", api_key="sk-given").complete(req())
    auth = [r.headers["authorization"] for r in server.requests]
    assert auth == ["Bearer unused", "Bearer sk-given"]
    assert server.requests[0].path == "/v1/chat/completions"


def test_prov21_missing_sdk_is_a_config_error_at_call(monkeypatch):
    from composeai.models import _openai_common as common

    monkeypatch.setattr(common, "_SDK", None)
    monkeypatch.setitem(sys.modules, "openai", None)
    m = openai_compatible("http://127.0.0.1:9/v1", "m")
    with pytest.raises(ConfigError) as ei:
        m.complete(req())
    assert str(ei.value) == "Install the provider SDK: pip install 'composeai[openai]'"


def test_prov21_clients_lazy_and_injected_client_sync_only(server):
    m = make(server)
    assert m._client is None and m._async_client is None
    server.repeat = reply()
    m.complete(req())
    assert isinstance(m._client, openai.OpenAI) and m._async_client is None
    asyncio.run(m.acomplete(req()))
    assert isinstance(m._async_client, openai.AsyncOpenAI)
    injected = OpenAICompatibleModel(
        "m", base_url="ignored", client=openai.OpenAI(api_key="x", base_url=server.url)
    )
    assert injected.acomplete is None and injected.astream is None
    assert injected.complete(req()).message.text == "Hello!"


# -- request mapping (PROV-22) ------------------------------------------------------


def test_prov22_request_kwargs_full_mapping():
    messages = [
        Message.user(
            [
                TextPart(text="see"),
                ImagePart(media_type="image/png", data="AAAA"),
                ImagePart(media_type="image/png", url="https://x/p.png"),
            ]
        ),
        Message.assistant(
            [
                ThinkingPart(text="secret", provider="openai-compatible"),
                ToolCallPart(id="t1", name="lookup", arguments={"q": "x"}),
            ]
        ),
        Message(
            role="user",
            parts=[
                ToolResultPart(tool_call_id="t1", content="found"),
                ToolResultPart(tool_call_id="t2", content="boom", is_error=True),
            ],
        ),
        Message.assistant([TextPart(text="ok"), ToolCallPart(id="t3", name="f", arguments={})]),
    ]
    tools = [
        ToolSpec(name="lookup", description="Find.", input_schema=SCHEMA),
        ToolSpec(name="loose", description="L.", input_schema={"type": "object", "default": {}}),
    ]
    request = ModelRequest(
        model="local-model",
        messages=messages,
        system="sys",
        tools=tools,
        output_schema=SCHEMA,
        max_tokens=77,
        temperature=0.3,
        prompt_cache=True,
        thinking=True,
        effort="high",
        thinking_budget=5,
    )
    expected_messages = [
        {"role": "system", "content": "sys"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "see"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "image_url", "image_url": {"url": "https://x/p.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"q": "x"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "found"},
        {"role": "tool", "tool_call_id": "t2", "content": "ERROR: boom"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "ok"}],
            "tool_calls": [
                {"id": "t3", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
    ]
    expected_tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Find.",
                "parameters": SCHEMA,
                "strict": True,
            },
        },
        {
            "type": "function",
            "function": {
                "name": "loose",
                "description": "L.",
                "parameters": {"type": "object", "default": {}},
                "strict": False,
            },
        },
    ]
    assert compat.request_kwargs(request, "local-model", "native") == {
        "model": "local-model",
        "messages": expected_messages,
        "max_tokens": 77,
        "temperature": 0.3,
        "tools": expected_tools,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "response", "schema": SCHEMA, "strict": True},
        },
    }
    # prompt mode: no response_format; the instruction joins the last user message with list
    # content (here the first one: the later user message became tool messages)
    prompt = compat.request_kwargs(request, "local-model", "prompt")
    assert "response_format" not in prompt
    assert prompt["messages"][1]["content"][-1] == {"type": "text", "text": INSTRUCTION}
    assert prompt["messages"][2:] == expected_messages[2:]


def test_prov22_prompt_instruction_added_as_a_new_user_message_when_needed():
    request = ModelRequest(
        model="m", messages=[Message.assistant("just an assistant turn")], output_schema=SCHEMA
    )
    messages = compat.request_kwargs(request, "m", "prompt")["messages"]
    assert messages[-1] == {"role": "user", "content": [{"type": "text", "text": INSTRUCTION}]}
    plain = compat.request_kwargs(req("q", output_schema=SCHEMA), "m", "prompt")["messages"]
    assert plain == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "q"}, {"type": "text", "text": INSTRUCTION}],
        }
    ]


def test_prov22_defaults_send_nothing_extra(model, server):
    server.queue(reply())
    model.complete(req())
    assert server.requests[0].body == {
        "model": "local-model",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "max_tokens": 16000,
    }


# -- responses (PROV-23, PROV-24) ---------------------------------------------------


@pytest.mark.parametrize(
    ("finish", "stop"),
    [
        ("stop", StopReason.END_TURN),
        ("length", StopReason.MAX_TOKENS),
        ("tool_calls", StopReason.TOOL_USE),
        ("content_filter", StopReason.REFUSAL),
        ("function_call", StopReason.OTHER),
        (None, StopReason.OTHER),
    ],
)
def test_prov23_finish_reasons(finish, stop):
    r = compat.parse_completion(wire.completion("x", finish=finish), req(), "m", "native")
    assert r.stop_reason is stop and r.raw_stop_reason == finish


def test_prov23_refusal_forces_refusal():
    done = wire.completion(None, refusal="Not allowed.", finish="stop")
    r = compat.parse_completion(done, req(), "m", "native")
    assert r.stop_reason is StopReason.REFUSAL and r.message.text == "Not allowed."


def test_prov23_bad_tool_arguments(model, server):
    server.queue(
        reply(None, tool_calls=[wire.chat_call("t1", "lookup", "{oops")], finish="tool_calls")
    )
    with pytest.raises(ProviderError) as ei:
        model.complete(req())
    assert str(ei.value).startswith(
        "Server returned non-JSON arguments for tool call 'lookup': Expecting property name"
    )
    assert (ei.value.provider, ei.value.model) == ("openai-compatible", "local-model")


def test_prov26_missing_usage_is_unknown_cost():
    r = compat.parse_completion(wire.completion("x", no_usage=True), req(), "m", "native")
    assert r.usage == Usage(cost_usd=None, cost_complete=False)


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return f"result for {q}"


@tool
def shout(q: str) -> str:
    """Shout."""
    return q.upper()


def test_prov23_tool_round_trip_and_parallel_calls_through_an_agent(model, server):
    @agent(model=model, tools=[lookup, shout])
    def researcher(q: str) -> str:
        """You research."""
        return q

    calls = [
        wire.chat_call("t1", "lookup", {"q": "owls"}),
        wire.chat_call("t2", "shout", {"q": "hi"}),
    ]
    server.queue(reply(None, tool_calls=calls, finish="tool_calls"), reply("Owls are birds."))
    assert researcher("owls?") == "Owls are birds."
    second = server.bodies()[1]["messages"]
    assert second[0] == {"role": "system", "content": "You research."}
    assert second[2]["tool_calls"] == calls and second[2]["content"] is None
    assert second[3:] == [
        {"role": "tool", "tool_call_id": "t1", "content": "result for owls"},
        {"role": "tool", "tool_call_id": "t2", "content": "HI"},
    ]


class City(BaseModel):
    city: str


def test_prov24_native_structured_output(server):
    m = make(server)

    @agent(model=m)
    def where(q: str) -> City:
        return q

    server.queue(reply('{"city": "Oslo"}'), reply("Oslo, I think"))
    assert where("capital of Norway?") == City(city="Oslo")
    fmt = server.bodies()[0]["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    with pytest.raises(ProviderError) as ei:
        m.complete(req(output_schema=SCHEMA))
    assert str(ei.value).startswith(NON_JSON + "Expecting value")


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ('{"city": "Rome"}', {"city": "Rome"}),
        ('```json\n{"city": "Rome"}\n```', {"city": "Rome"}),
        ('```\n{"city": "Rome"}\n```', {"city": "Rome"}),
        ('Sure! Here it is: {"city": "Rome"} -- hope it helps', {"city": "Rome"}),
        ('note {not json} then {"city": "a}b\\"{"} end', {"city": 'a}b"{'}),
        ('[1, 2] {"city": {"nested": true}}', {"city": {"nested": True}}),
        ("no json here", None),
        ("{unbalanced", None),
    ],
)
def test_prov24_lenient_recovery_pure(text, parsed):
    done = wire.completion(text)
    assert compat.parse_completion(done, req(output_schema=SCHEMA), "m", "prompt").parsed == parsed


def test_prov24_recover_json_first_dict_left_to_right():
    assert compat.recover_json('{"a": 1} {"b": 2}') == {"a": 1}
    assert compat.recover_json('"{" {"b": 2}') == {"b": 2}
    assert compat.recover_json("```json\n[1]\n```") is None  # the fence holds no dict
    assert compat.recover_json('```json\n[1]\n``` then {"x": 1}') == {"x": 1}
    assert compat.recover_json("") is None


def test_prov24_prompt_mode_over_the_wire_and_repair(server):
    m = make(server, "prompt")

    @agent(model=m, max_repairs=1)
    def where2(q: str) -> City:
        return q

    server.queue(reply("I am not sure."), reply('Here: ```json\n{"city": "Bergen"}\n```'))
    run = where2.run("rainy city?")
    assert run.output == City(city="Bergen")
    first, second = server.bodies()
    assert "response_format" not in first
    assert first["messages"][-1]["content"][-1]["text"].startswith(
        "Respond ONLY with a single JSON object"
    )
    assert "did not match the required output schema" in json.dumps(second["messages"])


@pytest.mark.parametrize("mode", ["native", "prompt", "auto"])
def test_prov24_reasoning_only_diagnostic(server, mode):
    m = make(server, mode)
    server.queue(reply("  ", use=wire.chat_usage(10, 500, reasoning=500)))
    with pytest.raises(ProviderError) as ei:
        m.complete(req(output_schema=SCHEMA))
    assert str(ei.value) == (
        "Model returned only reasoning tokens with empty content for a structured-output request "
        "-- the server likely does not enforce constrained decoding for this model; try "
        "openai_compatible(..., schema_mode='prompt') or raise max_tokens."
    )
    assert len(server.requests) == 1  # never demotes, never retries
    assert m._mode == ("prompt" if mode == "prompt" else "native")


# -- auto mode (PROV-25) --------------------------------------------------------------


def test_prov25_auto_demotes_once_and_for_good(server):
    m = make(server, "auto")
    server.queue(
        reply("The city is Paris", use=wire.chat_usage(10, 4)),
        reply('{"city": "Paris"}', use=wire.chat_usage(30, 6)),
        reply('{"city": "Lyon"}'),
    )
    r = m.complete(req(output_schema=SCHEMA))
    assert r.parsed == {"city": "Paris"}
    assert (r.usage.input_tokens, r.usage.output_tokens) == (40, 10)
    first, second = server.bodies()
    assert "response_format" in first and "response_format" not in second
    assert second["messages"][-1]["content"][-1] == {"type": "text", "text": INSTRUCTION}
    assert m.schema_mode == "auto"
    # permanent: the next call goes straight to prompt mode, one request
    assert m.complete(req(output_schema=SCHEMA)).parsed == {"city": "Lyon"}
    assert len(server.requests) == 3
    assert "response_format" not in server.bodies()[2]


def test_prov25_auto_demotion_async_sums_priced_usage(server):
    m = openai_compatible(
        server.url, "auto-priced", schema_mode="auto", input_price=2, output_price=8
    )
    m._max_retries = 0
    server.queue(
        reply("nope", use=wire.chat_usage(100, 10)),
        reply('{"city": "Nice"}', use=wire.chat_usage(100, 10)),
    )
    r = asyncio.run(m.acomplete(req(output_schema=SCHEMA)))
    assert r.parsed == {"city": "Nice"}
    assert r.usage.cost_usd == pytest.approx(2 * (100 * 2 + 10 * 8) / 1e6)
    assert len(server.requests) == 2


def test_prov25_transport_errors_and_prompt_failures_never_demote(server):
    m = make(server, "auto")
    server.queue(wire.error_reply(500), reply("still no json"), reply("again no json"))
    with pytest.raises(ProviderError, match="Error code: 500"):
        m.complete(req(output_schema=SCHEMA))
    assert m._mode == "native"
    # demotes, and the prompt-mode retry's unparsable text is left to the agent (parsed=None)
    r = m.complete(req(output_schema=SCHEMA))
    assert r.parsed is None and m._mode == "prompt"
    assert len(server.requests) == 3


def test_prov25_streaming_follows_the_mode_and_never_demotes(server):
    m = make(server, "auto")
    server.queue(wire.chat_sse(wire.completion("not json")))
    with pytest.raises(ProviderError, match=NON_JSON):
        list(m.stream(req(output_schema=SCHEMA)))
    assert m._mode == "native" and len(server.requests) == 1


# -- streaming (PROV-26, PROV-8, AGENT-25, AGENT-93) ----------------------------------


def test_prov26_stream_events_usage_and_equality(model, server):
    done = wire.completion(
        "Let me check",
        tool_calls=[
            wire.chat_call("t1", "lookup", {"q": "owls"}),
            wire.chat_call("t2", "shout", {"q": "x"}),
        ],
        finish="tool_calls",
        use=wire.chat_usage(20, 8, cached=5),
    )
    server.queue(wire.Reply(body=done), wire.chat_sse(done))
    expected = model.complete(req())
    events = list(model.stream(req()))
    kinds = [e.kind for e in events]
    assert kinds == [
        "text_delta",
        "text_delta",
        "tool_call_started",
        "tool_args_delta",
        "tool_args_delta",
        "tool_call_started",
        "tool_args_delta",
        "tool_args_delta",
        "tool_call_finished",
        "tool_call_finished",
        "response_done",
    ]
    finished = [(e.tool_call_id, e.tool_name) for e in events if e.kind == "tool_call_finished"]
    assert finished == [("t1", "lookup"), ("t2", "shout")]
    assert events[-1].response == expected
    body = server.bodies()[1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_prov26_stream_without_usage_chunk(model, server):
    server.queue(wire.chat_sse(wire.completion("hi there"), with_usage=False))
    r = list(model.stream(req()))[-1].response
    assert r.message.text == "hi there"
    assert r.usage == Usage(cost_usd=None, cost_complete=False)


def test_prov26_async_stream_equals_complete(model, server):
    done = wire.completion("async hello")
    server.queue(wire.Reply(body=done), wire.chat_sse(done))

    async def main():
        expected = await model.acomplete(req())
        return expected, [e async for e in model.astream(req())]

    expected, events = asyncio.run(main())
    assert [e.kind for e in events] == ["text_delta", "text_delta", "response_done"]
    assert events[-1].response == expected


def test_prov21_errors_are_provider_errors(model, server):
    server.queue(wire.error_reply(404, "no such model"), wire.error_reply(503))
    with pytest.raises(ProviderError) as ei:
        model.complete(req())
    assert "Error code: 404" in str(ei.value)
    assert (ei.value.provider, ei.value.model) == ("openai-compatible", "local-model")
    with pytest.raises(ProviderError, match="Error code: 503"):
        asyncio.run(model.acomplete(req()))
    assert len(server.requests) == 2


def test_prov41_timeout(server):
    m = make(server, timeout=0.2)
    server.queue(wire.Reply(body=wire.completion("late"), delay=30))
    with pytest.raises(ProviderError, match="^Request timed out.$"):
        m.complete(req())


def test_agent25_cut_stream_is_a_provider_error_and_retried(model, server):
    done = wire.completion("complete answer")
    server.queue(wire.chat_sse(done, cut_after=2))
    with pytest.raises(ProviderError) as ei:
        list(model.stream(req()))
    assert ei.value.provider == "openai-compatible"

    @agent(model=model, retries=1)
    def again(q: str) -> str:
        return q

    server.queue(wire.chat_sse(done, cut_after=2), wire.chat_sse(done))
    stream = again.stream("hi")
    list(stream)
    assert stream.run.output == "complete answer"
    assert len(server.requests) == 3


def test_agent93_closing_the_stream_closes_the_connection(model, server):
    server.queue(wire.chat_sse(wire.completion("a long long answer"), hold_after=2))
    events = model.stream(req())
    assert next(e for e in events if e.kind == "text_delta").text
    events.close()
    assert server.client_gone.wait(30)


def test_agent93_aclose_closes_the_connection(model, server):
    server.queue(wire.chat_sse(wire.completion("a long long answer"), hold_after=2))

    async def main():
        events = model.astream(req())
        async for e in events:
            if e.kind == "text_delta":
                break
        await events.aclose()

    asyncio.run(main())
    assert server.client_gone.wait(30)


def test_prov21_successive_event_loops_send_each_request_once(model, server):
    @agent(model=model)
    def twice(q: str) -> str:
        return q

    server.repeat = reply("fine")
    assert asyncio.run(twice.arun("a")).output == "fine"
    assert asyncio.run(twice.arun("b")).output == "fine"
    assert len(server.requests) == 2


def test_prov21_sdk_drift_unknown_keywords_go_through_extra_body(model):
    calls = []

    class Completions:
        def create(self, *, model, messages, extra_body=None):
            calls.append({"model": model, "messages": messages, "extra_body": extra_body})
            return wire.completion("drifted")

    class Chat:
        completions = Completions()

    class Client:
        chat = Chat()

    model._client = Client()
    assert model.complete(req(temperature=0.5)).message.text == "drifted"
    assert calls[0]["extra_body"] == {"max_tokens": 16000, "temperature": 0.5}


def test_prov23_reply_read_from_the_raw_body_equals_the_typed_sdk_reply(server):
    """PROV-23/24: the SDK's own client has its completion read from the JSON body, a client
    of another class (a subclass) through the SDK's typed reply; both map alike, sync and
    async, including the lenient JSON recovery of prompt mode."""
    import openai

    class Sub(openai.OpenAI):
        pass

    class AsyncSub(openai.AsyncOpenAI):
        pass

    calls = [wire.chat_call("c1", "add", {"a": 1})]
    server.repeat = reply("Sure", tool_calls=calls, finish="tool_calls")
    raw_model, typed_model = make(server), make(server)
    typed_model._client = Sub(api_key="k", base_url=server.url, max_retries=0)
    raw = raw_model.complete(req())
    assert raw == typed_model.complete(req())
    assert [type(p).__name__ for p in raw.message.parts] == ["TextPart", "ToolCallPart"]

    async def both():
        typed_model._async_client = AsyncSub(api_key="k", base_url=server.url, max_retries=0)
        return await raw_model.acomplete(req()), await typed_model.acomplete(req())

    assert asyncio.run(both()) == (raw, raw)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    server.repeat = reply('Here: ```json\n{"n": 3}\n```')
    prompt_raw, prompt_typed = make(server, mode="prompt"), make(server, mode="prompt")
    prompt_typed._client = Sub(api_key="k", base_url=server.url, max_retries=0)
    parsed = prompt_raw.complete(req(output_schema=schema))
    assert parsed == prompt_typed.complete(req(output_schema=schema))
    assert parsed.parsed == {"n": 3}
    assert len(server.requests) == 6
