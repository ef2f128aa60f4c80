"""Model protocol, registry, prices and FakeModel (PROV-1 … PROV-8, PROV-30/31, TEST-1 … TEST-5,
TEST-22, TEST-50)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys

import pytest

from composeai import _codec
from composeai.errors import ComposeError, ConfigError
from composeai.messages import (
    Message,
    StopReason,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    Usage,
)
from composeai.models import registry
from composeai.models.base import Model, ModelRequest, ModelResponse, RawStreamEvent, ToolSpec
from composeai.models.prices import (
    PRICES_AS_OF,
    ModelPrice,
    compute_cost,
    get_price,
    register_price,
    resolve_price,
)
from composeai.testing import (
    FakeModel,
    compute_full_hash,
    compute_message_hash,
    reset_registries,
)

KNOWN = "Known providers: anthropic, openai"


def _req(model: str = "FakeModel", text: str = "hi", **kw) -> ModelRequest:
    return ModelRequest(model=model, messages=[Message.user(text)], **kw)


def _resp(text: str = "done", **kw) -> ModelResponse:
    fields = {
        "message": Message.assistant(text),
        "stop_reason": StopReason.END_TURN,
        "raw_stop_reason": "end_turn",
        "usage": Usage(input_tokens=1, output_tokens=2, cost_usd=0.5),
        "model_id": "custom-id",
    }
    fields.update(kw)
    return ModelResponse(**fields)


@pytest.fixture
def clean_registry(monkeypatch):
    """Isolate register_provider() and the instance cache."""
    monkeypatch.setattr(registry, "_FACTORIES", {})
    monkeypatch.setattr(registry, "_CACHE", {})


# --------------------------------------------------------------------------- PROV-4 .. PROV-8


def _shape(cls) -> list[tuple[str, object]]:
    return [
        (f.name, f.default if f.default is not dataclasses.MISSING else "<required>")
        for f in dataclasses.fields(cls)
    ]


def test_prov5_toolspec_shape():
    assert _shape(ToolSpec) == [
        ("name", "<required>"),
        ("description", "<required>"),
        ("input_schema", "<required>"),
        ("strict", True),
        ("requires_approval", False),
    ]


def test_prov6_model_request_shape():
    assert _shape(ModelRequest) == [
        ("model", "<required>"),
        ("messages", "<required>"),
        ("system", None),
        ("tools", None),
        ("output_schema", None),
        ("max_tokens", 16000),
        ("temperature", None),
        ("provider", None),
        ("prompt_cache", False),
        ("thinking", None),
        ("effort", None),
        ("thinking_budget", None),
    ]


def test_prov7_model_response_shape():
    assert _shape(ModelResponse) == [
        ("message", "<required>"),
        ("stop_reason", "<required>"),
        ("raw_stop_reason", "<required>"),
        ("usage", "<required>"),
        ("model_id", "<required>"),
        ("parsed", None),
    ]


def test_prov8_raw_stream_event_shape():
    assert _shape(RawStreamEvent) == [
        ("kind", "<required>"),
        ("text", None),
        ("tool_call_id", None),
        ("tool_name", None),
        ("response", None),
    ]


@pytest.mark.parametrize(
    "value",
    [
        ToolSpec("t", "d", {"type": "object"}),
        _req(),
        _resp(),
        RawStreamEvent("text_delta", text="x"),
    ],
)
def test_prov5_to_8_frozen_and_slotted(value):
    assert hasattr(type(value), "__slots__")
    assert not hasattr(value, "__dict__")
    name = dataclasses.fields(value)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, name, "other")


def test_prov7_codec_round_trip_with_tag():
    resp = _resp(parsed={"a": [1, 2]})
    tree = _codec.encode(resp)
    assert tree["$kind"] == "dataclass"
    assert tree["$type"] == "composeai.models.base:ModelResponse"
    assert tree["value"]["stop_reason"] == "end_turn"
    assert tree["value"]["message"]["$type"] == "composeai.messages:Message"
    assert tree["value"]["usage"]["$type"] == "composeai.messages:Usage"
    back = _codec.loads(_codec.dumps(resp))
    assert back == resp
    assert back.stop_reason is StopReason.END_TURN
    assert isinstance(back.message, Message)


def test_prov6_request_and_stream_event_round_trip():
    req = _req(tools=[ToolSpec("a", "b", {"type": "object"}, requires_approval=True)], effort="low")
    assert _codec.tag_of(ModelRequest) == "composeai.models.base:ModelRequest"
    assert _codec.loads(_codec.dumps(req)) == req
    ev = RawStreamEvent("response_done", response=_resp())
    assert _codec.loads(_codec.dumps(ev)) == ev


def test_pkg6_response_decodes_in_fresh_process():
    text = _codec.dumps(_resp())
    code = (
        "import sys, composeai.models.base as b, composeai._codec as c\n"
        "r = c.loads(sys.stdin.read())\n"
        "assert isinstance(r, b.ModelResponse) and r.message.text == 'done', r\n"
    )
    subprocess.run([sys.executable, "-c", code], input=text, text=True, check=True)


def test_prov4_model_protocol():
    class WithComplete:
        def complete(self, request):
            return None

    class Disabled:
        complete = None

    assert isinstance(WithComplete(), Model)
    assert isinstance(FakeModel([]), Model)
    assert not isinstance(object(), Model)
    assert not isinstance(Disabled(), Model)


# --------------------------------------------------------------------------- PROV-1 .. PROV-3


def test_prov1_parse_model_string():
    assert registry.parse_model_string("anthropic/claude-haiku-4-5") == (
        "anthropic",
        "claude-haiku-4-5",
    )
    assert registry.parse_model_string("openai/org/model/v1") == ("openai", "org/model/v1")


@pytest.mark.parametrize("s", ["no-slash", "/model", "anthropic/", "/", ""])
def test_prov2_invalid_model_string(s, clean_registry):
    msg = f"Invalid model string '{s}': expected 'provider/model-id'. {KNOWN}"
    with pytest.raises(ConfigError) as ei:
        registry.parse_model_string(s)
    assert str(ei.value) == msg
    with pytest.raises(ConfigError) as ei:
        registry.resolve(s)
    assert str(ei.value) == msg


def test_prov2_unknown_provider(clean_registry):
    with pytest.raises(ConfigError) as ei:
        registry.resolve("mistral/large")
    assert str(ei.value) == f"Unknown provider 'mistral' in model string 'mistral/large'. {KNOWN}"


def test_prov2_known_providers_include_registered(clean_registry):
    registry.register_provider("zeta", lambda model_id: FakeModel([]))
    registry.register_provider("beta", lambda model_id: FakeModel([]))
    with pytest.raises(ConfigError) as ei:
        registry.resolve("x")
    assert str(ei.value).endswith("Known providers: anthropic, beta, openai, zeta")


@pytest.mark.parametrize("bad", [42, None, b"anthropic/x", ["openai/gpt-5.4"], object()])
def test_prov2_neither_string_nor_model(bad):
    with pytest.raises(ConfigError) as ei:
        registry.resolve(bad)
    assert str(ei.value) == (
        f"model must be a 'provider/model-id' string or a Model instance, got {type(bad)!r}"
    )


def test_prov2_object_with_none_complete_is_not_a_model():
    class Disabled:
        complete = None

    with pytest.raises(ConfigError, match="got <class "):
        registry.resolve(Disabled())


def test_prov1_model_instance_passes_through():
    fake = FakeModel(["x"])
    assert registry.resolve(fake) is fake


def test_prov1_register_provider_and_caching(clean_registry):
    made: list[str] = []

    def factory(model_id: str) -> FakeModel:
        made.append(model_id)
        return FakeModel([model_id])

    registry.register_provider("acme", factory)
    a = registry.resolve("acme/big/v2")
    assert made == ["big/v2"]
    assert registry.resolve("acme/big/v2") is a
    b = registry.resolve("acme/small")
    assert b is not a
    assert made == ["big/v2", "small"]
    assert a.complete(_req()).message.text == "big/v2"


def test_prov1_register_provider_overrides_builtin(clean_registry):
    registry.register_provider("anthropic", lambda model_id: FakeModel([f"fake {model_id}"]))
    model = registry.resolve("anthropic/claude-haiku-4-5")
    assert isinstance(model, FakeModel)
    assert model.complete(_req()).message.text == "fake claude-haiku-4-5"


def test_prov1_reregistering_drops_cached_instances(clean_registry):
    registry.register_provider("acme", lambda model_id: FakeModel(["one"]))
    first = registry.resolve("acme/m")
    registry.register_provider("acme", lambda model_id: FakeModel(["two"]))
    second = registry.resolve("acme/m")
    assert second is not first
    assert second.complete(_req()).message.text == "two"


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_prov2_builtin_without_adapter_module(provider, clean_registry, monkeypatch):
    import importlib

    real = importlib.import_module

    def fake_import(name, package=None):
        if name == f"composeai.models.{provider}":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", fake_import)
    with pytest.raises(ConfigError) as ei:
        registry.resolve(f"{provider}/some-model")
    assert str(ei.value) == (
        f"provider '{provider}' has no adapter in this build of composeai yet -- "
        "pass a Model instance (e.g. composeai.testing.FakeModel) or "
        f"register_provider('{provider}', factory)"
    )


def _install_fake_adapter(monkeypatch, provider, *, import_error=None, create_error=None):
    import importlib
    import types

    module = types.ModuleType(f"composeai.models.{provider}")
    calls: list[str] = []

    def create_model(model_id):
        calls.append(model_id)
        if create_error is not None:
            raise create_error
        return FakeModel([model_id])

    module.create_model = create_model
    real = importlib.import_module

    def fake_import(name, package=None):
        if name == module.__name__:
            if import_error is not None:
                raise import_error
            return module
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", fake_import)
    return calls


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_prov2_sdk_missing_at_adapter_import(provider, clean_registry, monkeypatch):
    err = ModuleNotFoundError(f"No module named '{provider}'", name=provider)
    _install_fake_adapter(monkeypatch, provider, import_error=err)
    with pytest.raises(ConfigError) as ei:
        registry.resolve(f"{provider}/m")
    assert str(ei.value) == f"Install the provider SDK: pip install 'composeai[{provider}]'"


def test_prov2_sdk_missing_at_create_model(clean_registry, monkeypatch):
    err = ModuleNotFoundError("No module named 'openai._client'", name="openai._client")
    _install_fake_adapter(monkeypatch, "openai", create_error=err)
    with pytest.raises(ConfigError) as ei:
        registry.resolve("openai/gpt-5.4")
    assert str(ei.value) == "Install the provider SDK: pip install 'composeai[openai]'"


def test_prov1_builtin_adapter_create_model_and_cache(clean_registry, monkeypatch):
    calls = _install_fake_adapter(monkeypatch, "anthropic")
    m = registry.resolve("anthropic/claude-sonnet-5")
    assert registry.resolve("anthropic/claude-sonnet-5") is m
    assert calls == ["claude-sonnet-5"]


def test_prov1_registry_import_is_cheap():
    code = (
        "import sys, composeai.models.registry\n"
        "assert 'pydantic' not in sys.modules\n"
        "assert 'composeai.models.base' not in sys.modules\n"
        "assert 'anthropic' not in sys.modules and 'openai' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_prov3_resolve_is_a_module_attribute(monkeypatch):
    fake = FakeModel([])
    monkeypatch.setattr(registry, "resolve", lambda model: fake)
    from composeai.models import registry as again

    assert again.resolve("anything/at-all") is fake


# --------------------------------------------------------------------------- PROV-30 / PROV-31


def test_prov30_model_price_shape():
    assert _shape(ModelPrice) == [
        ("input", "<required>"),
        ("output", "<required>"),
        ("cache_read", None),
        ("cache_write_5m", None),
        ("cache_write_1h", None),
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ModelPrice(1, 2).input = 3  # type: ignore[misc]
    assert PRICES_AS_OF == "2026-07-12"


def test_prov30_resolve_price_multipliers():
    p = resolve_price(ModelPrice(input=4.0, output=20.0))
    assert p == ModelPrice(
        input=4.0, output=20.0, cache_read=0.4, cache_write_5m=5.0, cache_write_1h=8.0
    )
    explicit = ModelPrice(
        input=4.0, output=20.0, cache_read=0.1, cache_write_5m=1, cache_write_1h=2
    )
    assert resolve_price(explicit) == explicit


def test_prov30_compute_cost():
    usage = Usage(input_tokens=1_000_000, output_tokens=500_000, cache_read_tokens=2_000_000)
    price = ModelPrice(input=2.0, output=10.0)
    # 1M*2 + 0.5M*10 + 2M*0.2 + 100k*2.5 + 10k*4
    expected = (2_000_000 + 5_000_000 + 400_000 + 250_000 + 40_000) / 1_000_000
    got = compute_cost(usage, price, cache_write_5m_tokens=100_000, cache_write_1h_tokens=10_000)
    assert got == pytest.approx(expected)
    assert compute_cost(Usage(), price) == 0.0
    assert isinstance(compute_cost(Usage(), price), float)


def test_prov30_register_price_last_writer_wins(monkeypatch):
    from composeai.models import prices

    monkeypatch.setattr(prices, "_PRICES", dict(prices._PRICES))
    assert get_price("acme", "m1") is None
    register_price("acme", "m1", ModelPrice(1, 2))
    register_price("acme", "m1", ModelPrice(3, 4))
    assert get_price("acme", "m1") == ModelPrice(3, 4)
    register_price("anthropic", "claude-haiku-4-5", ModelPrice(9, 9))
    assert get_price("anthropic", "claude-haiku-4-5") == ModelPrice(9, 9)


def test_prov30_model_price_codec_tag():
    price = ModelPrice(1.0, 2.0, cache_read=0.5)
    assert _codec.tag_of(ModelPrice) == "composeai.models.prices:ModelPrice"
    assert _codec.loads(_codec.dumps(price)) == price


ANTHROPIC_TABLE = {
    "claude-fable-5": (10, 50),
    "claude-opus-4-8": (5, 25),
    "claude-opus-4-7": (5, 25),
    "claude-opus-4-6": (5, 25),
    "claude-sonnet-5": (3, 15),
    "claude-sonnet-4-6": (3, 15),
    "claude-haiku-4-5": (1, 5),
}
OPENAI_TABLE = {
    "gpt-5.6-sol": (5, 30, 0.50),
    "gpt-5.6-terra": (2.5, 15, 0.25),
    "gpt-5.6-luna": (1, 6, 0.10),
    "gpt-5.5": (5, 30, 0.50),
    "gpt-5.5-pro": (30, 180, None),
    "gpt-5.4": (2.5, 15, 0.25),
    "gpt-5.4-mini": (0.75, 4.5, 0.075),
    "gpt-5.4-nano": (0.20, 1.25, 0.02),
    "gpt-5.4-pro": (30, 180, None),
    "gpt-5.3-codex": (1.75, 14, 0.175),
}


@pytest.mark.parametrize(("model", "io"), ANTHROPIC_TABLE.items())
def test_prov31_anthropic_table(model, io):
    assert get_price("anthropic", model) == ModelPrice(input=io[0], output=io[1])


@pytest.mark.parametrize(("model", "row"), OPENAI_TABLE.items())
def test_prov31_openai_table(model, row):
    assert get_price("openai", model) == ModelPrice(input=row[0], output=row[1], cache_read=row[2])


def test_prov31_lookup_uses_bare_id_and_never_guesses():
    assert get_price("anthropic", "anthropic/claude-haiku-4-5") is None
    assert get_price("openai", "claude-haiku-4-5") is None
    assert get_price("anthropic", "claude-unknown") is None


# --------------------------------------------------------------------------- TEST-1 .. TEST-4


def test_test1_attributes_and_script_copy():
    script = ["a", "b"]
    fake = FakeModel(script)
    assert fake.script == ["a", "b"]
    assert fake.script is not script
    assert fake.requests == []
    assert not hasattr(fake, "model_id")
    r1, r2 = _req(text="one"), _req(text="two")
    fake.complete(r1)
    fake.complete(r2)
    assert fake.requests == [r1, r2]
    assert script == ["a", "b"]  # the caller's list is untouched


def test_test2_text_item():
    resp = FakeModel(["hello there"]).complete(_req(model="my-model"))
    assert resp.message == Message.assistant("hello there")
    assert resp.stop_reason is StopReason.END_TURN
    assert resp.raw_stop_reason == "end_turn"
    assert resp.model_id == "my-model"
    assert resp.parsed is None


def test_test2_tool_calls_item():
    item = {
        "text": "Let me look.",
        "tool_calls": [
            {"name": "search", "arguments": {"q": "x"}, "id": "call_1"},
            {"name": "now"},
            {"name": "other", "arguments": {"n": 1}, "id": ""},
        ],
    }
    resp = FakeModel([item]).complete(_req())
    parts = resp.message.parts
    assert resp.message.role == "assistant"
    assert parts[0] == TextPart(text="Let me look.")
    assert parts[1] == ToolCallPart(id="call_1", name="search", arguments={"q": "x"})
    assert isinstance(parts[2], ToolCallPart) and parts[2].arguments == {}
    assert len(parts[2].id) == 26 and len(parts[3].id) == 26
    assert parts[2].id != parts[3].id
    assert parts[3].name == "other"
    assert resp.stop_reason is StopReason.TOOL_USE
    assert resp.raw_stop_reason == "tool_use"
    assert resp.model_id == "FakeModel"


def test_test2_tool_calls_without_text():
    for text in (None, ""):
        item = {"tool_calls": [{"name": "t", "id": "c"}]}
        if text is not None:
            item["text"] = text
        resp = FakeModel([item]).complete(_req())
        assert resp.message.parts == [ToolCallPart(id="c", name="t", arguments={})]


def test_test2_json_item():
    payload = {"title": "Ünïcode", "n": [1, 2]}
    resp = FakeModel([{"json": payload}]).complete(_req())
    assert resp.message.text == json.dumps(payload)
    assert resp.parsed == payload
    assert resp.stop_reason is StopReason.END_TURN
    assert resp.raw_stop_reason == "end_turn"


def test_test2_model_response_item_unchanged():
    custom = _resp()
    fake = FakeModel([custom], usage=Usage(input_tokens=99))
    assert fake.complete(_req(model="other")) is custom


def test_test2_callable_item():
    seen = []

    def reply(request):
        seen.append(request)
        return f"you said {request.messages[-1].text}"

    req = _req(text="ping")
    fake = FakeModel([reply, lambda r: {"json": {"ok": True}}, lambda r: _resp()])
    assert fake.complete(req).message.text == "you said ping"
    assert seen == [req]
    assert fake.complete(req).parsed == {"ok": True}
    assert fake.complete(req).model_id == "custom-id"


@pytest.mark.parametrize("item", [42, {"text": "no tool_calls key"}, {}, None, ["x"]])
def test_test2_unrecognized_item(item):
    fake = FakeModel([item])
    with pytest.raises(ComposeError) as ei:
        fake.complete(_req())
    assert type(ei.value) is ComposeError
    assert str(ei.value) == f"FakeModel: unrecognized script item {item!r}"


def test_test2_callable_returning_unrecognized():
    with pytest.raises(ComposeError, match=r"^FakeModel: unrecognized script item 3$"):
        FakeModel([lambda r: 3]).complete(_req())


def test_test3_default_usage_and_override():
    resp = FakeModel(["x", {"json": {}}, {"tool_calls": []}]).complete(_req())
    assert resp.usage == Usage(input_tokens=10, output_tokens=20, cost_complete=False)
    assert resp.usage.cost_usd is None
    usage = Usage(input_tokens=1, output_tokens=1, cost_usd=0.25)
    fake = FakeModel(["x", {"json": {}}, {"tool_calls": [{"name": "t"}]}], usage=usage)
    for _ in range(3):
        assert fake.complete(_req()).usage == usage


def test_test4_exhaustion_records_request():
    fake = FakeModel(["only"])
    fake.complete(_req())
    last = _req(text="again")
    with pytest.raises(ComposeError) as ei:
        fake.complete(last)
    assert type(ei.value) is ComposeError
    assert str(ei.value) == (
        "FakeModel script exhausted after 2 request(s): no more scripted responses left"
    )
    assert fake.requests[-1] is last
    with pytest.raises(ComposeError, match="exhausted after 3 request"):
        fake.complete(_req())
    with pytest.raises(ComposeError, match="exhausted after 1 request"):
        FakeModel([]).complete(_req())


def test_test1_one_item_per_call_across_surfaces():
    fake = FakeModel(["a", "b", "c", "d"])

    async def async_calls():
        r = await fake.acomplete(_req())
        events = [e async for e in fake.astream(_req())]
        return r, events

    assert fake.complete(_req()).message.text == "a"
    assert [e for e in fake.stream(_req())][-1].response.message.text == "b"
    r, events = asyncio.run(async_calls())
    assert r.message.text == "c"
    assert events[-1].response.message.text == "d"
    assert len(fake.requests) == 4
    with pytest.raises(ComposeError, match="exhausted after 5"):
        asyncio.run(fake.acomplete(_req()))


# --------------------------------------------------------------------------- TEST-5


def test_test5_stream_text():
    fake = FakeModel(["Hello,  big\nworld "])
    events = list(fake.stream(_req()))
    assert [(e.kind, e.text) for e in events[:-1]] == [
        ("text_delta", "Hello,"),
        ("text_delta", "  "),
        ("text_delta", "big"),
        ("text_delta", "\n"),
        ("text_delta", "world"),
        ("text_delta", " "),
    ]
    done = events[-1]
    assert done.kind == "response_done"
    assert done.response == FakeModel(["Hello,  big\nworld "]).complete(_req())
    assert [e.kind for e in events].count("response_done") == 1


def test_test5_stream_text_and_tool_calls():
    item = {
        "text": "On it",
        "tool_calls": [
            {"name": "search", "arguments": {"q": "ä"}, "id": "c1"},
            {"name": "now", "id": "c2"},
        ],
    }
    events = list(FakeModel([item]).stream(_req()))
    assert [(e.kind, e.text, e.tool_call_id, e.tool_name) for e in events[:-1]] == [
        ("text_delta", "On", None, None),
        ("text_delta", " ", None, None),
        ("text_delta", "it", None, None),
        ("tool_call_started", None, "c1", "search"),
        ("tool_args_delta", json.dumps({"q": "ä"}), "c1", "search"),
        ("tool_call_finished", None, "c1", "search"),
        ("tool_call_started", None, "c2", "now"),
        ("tool_args_delta", "{}", "c2", "now"),
        ("tool_call_finished", None, "c2", "now"),
    ]
    assert events[-1].kind == "response_done"
    assert events[-1].response.stop_reason is StopReason.TOOL_USE
    assert all(e.response is None for e in events[:-1])


def test_test5_stream_thinking_and_model_response():
    resp = ModelResponse(
        message=Message.assistant([ThinkingPart(text="hmm ok", provider_token="t")]),
        stop_reason=StopReason.END_TURN,
        raw_stop_reason="end_turn",
        usage=Usage(),
        model_id="m",
    )
    events = list(FakeModel([resp]).stream(_req()))
    assert [(e.kind, e.text) for e in events] == [
        ("thinking_delta", "hmm"),
        ("thinking_delta", " "),
        ("thinking_delta", "ok"),
        ("response_done", None),
    ]
    assert events[-1].response is resp


def test_test5_astream_matches_stream():
    item = {"text": "a b", "tool_calls": [{"name": "t", "id": "i", "arguments": {"k": 1}}]}

    async def collect():
        return [e async for e in FakeModel([item]).astream(_req())]

    assert asyncio.run(collect()) == list(FakeModel([item]).stream(_req()))


def test_test5_stream_exhaustion():
    fake = FakeModel([])
    with pytest.raises(ComposeError, match="exhausted after 1"):
        list(fake.stream(_req()))

    async def collect():
        return [e async for e in fake.astream(_req())]

    with pytest.raises(ComposeError, match="exhausted after 2"):
        asyncio.run(collect())


# --------------------------------------------------------------------------- TEST-22


def test_test22_message_hash_vectors():
    assert compute_message_hash("Sys.", [Message.user("hi")]) == (
        "a99533f064e68d7594b36aebe24619d678c021a9d4014cc0452fec3fbdcf844a"
    )
    assert compute_message_hash(None, []) == (
        "97590881022d69d2a04f17e8e5537edc1d4ac57cee1c95289a1efbb55540b8a4"
    )


def test_test22_full_hash_vectors():
    base = ModelRequest(
        model="claude-haiku-4-5",
        messages=[Message.user("hi")],
        system="Sys.",
        provider="anthropic",
    )
    assert compute_full_hash(base) == (
        "b496cc3911dadbb5003977540eefcaeaff4dde27008c2306586e26eb0ec281ad"
    )
    other = dataclasses.replace(
        base,
        messages=[Message.user("héllo")],
        system=None,
        provider=None,
        temperature=0.5,
        effort="low",
        tools=[
            ToolSpec("b", "d", {"type": "object"}),
            ToolSpec("a", "d", {"type": "object"}, requires_approval=True),
        ],
    )
    assert compute_full_hash(other) == (
        "a845cdddfe35c726c73a52a3363293c0a340e3d0cc6ad56aca0754a2a615efa7"
    )


def test_test22_prompt_cache_never_hashed_and_optional_keys():
    base = _req(model="m")
    assert compute_full_hash(dataclasses.replace(base, prompt_cache=True)) == compute_full_hash(
        base
    )
    assert compute_full_hash(dataclasses.replace(base, thinking=False)) != compute_full_hash(base)
    assert compute_full_hash(dataclasses.replace(base, thinking_budget=1024)) != (
        compute_full_hash(base)
    )
    # message hash ignores everything but system + messages
    assert compute_message_hash(base.system, base.messages) == compute_message_hash(
        None, [Message.user("hi")]
    )


# --------------------------------------------------------------------------- TEST-50


def test_test50_reset_registries_clears_flows_tasks_and_agents(monkeypatch):
    import types

    from composeai.flow import flow as flow_deco
    from composeai.flow import task

    flows = sys.modules["composeai.flow"]
    agentfn = types.ModuleType("composeai.agentfn")
    agentfn._AGENTS = {"writer": object()}
    monkeypatch.setitem(sys.modules, "composeai.agentfn", agentfn)

    @task
    def step_a(x: int) -> int:
        return x

    @flow_deco
    def pipeline_a(x: int) -> int:
        return step_a(x)

    assert flows._TASKS and flows._FLOWS
    reset_registries()
    assert not flows._TASKS and not flows._FLOWS
    assert agentfn._AGENTS == {}


def test_test50_reset_registries_without_agentfn(monkeypatch):
    monkeypatch.delitem(sys.modules, "composeai.agentfn", raising=False)
    reset_registries()
    assert "composeai.agentfn" not in sys.modules
