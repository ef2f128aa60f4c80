"""Record/replay cassettes (testing.md TEST-20 … TEST-30)."""

from __future__ import annotations

import asyncio
import json

import pytest

import composeai as compose
from composeai.errors import ComposeError, ConfigError
from composeai.messages import Message, StopReason, Usage
from composeai.models import registry
from composeai.models.base import ModelRequest, ModelResponse
from composeai.testing import (
    FakeModel,
    RecordingModel,
    ReplayModel,
    compute_full_hash,
    compute_message_hash,
    record_cassette,
    replay_cassette,
)

NESTED = (
    "record_cassette()/replay_cassette() cannot be nested -- registry.resolve() is already "
    "intercepted by another active cassette context. Nesting isn't supported: a plain "
    "save/restore of registry.resolve means whichever context exits last would clobber the "
    "other's interception. Close the outer cassette context first, or record/replay "
    "everything through one shared context instead."
)


class CountingModel:
    """A model with a model id that counts its calls, to prove replay never calls it."""

    model_id = "counting-1"

    def __init__(self, replies: list[str]):
        self.replies = list(replies)
        self.calls = 0

    def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        return ModelResponse(
            message=Message.assistant(self.replies.pop(0)),
            stop_reason=StopReason.END_TURN,
            raw_stop_reason="end_turn",
            usage=Usage(input_tokens=3, output_tokens=4, cost_usd=0.5),
            model_id=self.model_id,
        )


def make_agent(model, name="summarizer"):
    @compose.agent(model=model, name=name, replace=True)
    def summarizer(text: str) -> str:
        """Summarize the text in one line."""
        return compose.prompt(f"Summarize: {text}")

    return summarizer


def test_test20_record_writes_version_2_file_with_one_entry_per_call(tmp_path):
    path = tmp_path / "nested" / "dir" / "c.json"
    model = CountingModel(["one", "two"])
    agent = make_agent(model)
    with record_cassette(path):
        assert agent("a") == "one"
        assert agent("b") == "two"
    assert registry.resolve(model) is model  # restored
    text = path.read_text()
    data = json.loads(text)
    assert text == json.dumps(data, indent=2)
    assert data["version"] == 2
    assert [e["request"]["messages"][0]["parts"][0]["text"] for e in data["entries"]] == [
        "Summarize: a",
        "Summarize: b",
    ]


def test_test20_file_written_even_when_block_raises(tmp_path):
    path = tmp_path / "c.json"
    agent = make_agent(CountingModel(["one"]))
    with pytest.raises(RuntimeError, match="boom"), record_cassette(path):
        agent("a")
        raise RuntimeError("boom")
    assert len(json.loads(path.read_text())["entries"]) == 1
    # A fresh context may start: the failed one released the interception.
    with record_cassette(tmp_path / "d.json"):
        pass


def test_test20_recording_model_exposes_stream_only_if_inner_has_it():
    entries: list = []
    plain = RecordingModel(CountingModel(["x"]), entries)
    assert getattr(plain, "stream", None) is None
    assert plain.model_id == "counting-1"
    streaming = RecordingModel(FakeModel(["hello world"]), entries)
    events = list(streaming.stream(ModelRequest(model="m", messages=[Message.user("hi")])))
    assert [e.kind for e in events][-1] == "response_done"
    assert len(entries) == 1
    assert entries[0]["response"]["value"]["message"]["value"]["parts"][0]["text"] == (
        "hello world"
    )


def test_test20_streamed_agent_call_is_recorded_once(tmp_path):
    path = tmp_path / "c.json"
    agent = make_agent(FakeModel(["streamed reply"]))
    with record_cassette(path):
        stream = agent.stream("t")
        deltas = [e for e in stream]
        assert stream.run.output == "streamed reply"
    assert deltas
    assert len(json.loads(path.read_text())["entries"]) == 1


def test_test20_content_recorded_in_full_even_with_trace_content_off(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPOSE_TRACE_CONTENT", "0")
    path = tmp_path / "c.json"
    with record_cassette(path):
        make_agent(CountingModel(["secret reply"]))("secret input")
    entry = json.loads(path.read_text())["entries"][0]
    assert entry["request"]["messages"][0]["parts"][0]["text"] == "Summarize: secret input"


def test_test21_entry_shape_and_hashes(tmp_path):
    path = tmp_path / "c.json"
    with record_cassette(path):
        make_agent(CountingModel(["one"]))("a")
    entry = json.loads(path.read_text())["entries"][0]
    assert set(entry) == {"full_hash", "message_hash", "request", "response"}
    request = entry["request"]
    assert set(request) == {"model", "system", "messages"}
    assert request["model"] == "counting-1"
    assert request["system"] == "Summarize the text in one line."
    messages = [Message.model_validate(m) for m in request["messages"]]
    assert entry["message_hash"] == compute_message_hash(request["system"], messages)
    response = entry["response"]
    assert response["$kind"] == "dataclass"
    assert response["$type"] == "composeai.models.base:ModelResponse"
    value = response["value"]
    assert value["message"]["$type"] == "composeai.messages:Message"
    assert value["usage"]["$type"] == "composeai.messages:Usage"
    assert len(value["usage"]["value"]) == 7
    assert value["stop_reason"] == "end_turn"
    assert value["model_id"] == "counting-1"
    assert value["parsed"] is None


def test_test23_replay_returns_recorded_responses_without_calling_the_model(tmp_path):
    path = tmp_path / "c.json"
    recorder = CountingModel(["one", "two"])
    with record_cassette(path):
        make_agent(recorder)("a")
        make_agent(recorder, name="other")("b")
    assert recorder.calls == 2

    live = CountingModel([])
    with replay_cassette(path) as shared:
        assert make_agent(live)("a") == "one"
        run = make_agent(live, name="other").run("b")
        assert registry.resolve("anything/at-all") is shared
        assert registry.resolve(live) is shared
    assert live.calls == 0
    assert run.output == "two"
    assert run.usage.cost_usd == 0.5  # the recorded usage, as the provider billed it


def test_test23_replay_never_constructs_a_provider(tmp_path):
    path = tmp_path / "c.json"
    with record_cassette(path):
        make_agent(CountingModel(["from the cassette"]))("a")

    def refuse(model_id):
        raise AssertionError("the real resolver must not be called during replay")

    compose_model = "refusing/model-x"
    registry.register_provider("refusing", refuse)
    try:
        # The request's model id differs, so this matches by message hash.
        with replay_cassette(path):
            assert make_agent(compose_model)("a") == "from the cassette"
    finally:
        registry._FACTORIES.pop("refusing", None)


def test_test23_version_mismatch_message(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"version": 1, "entries": []}))
    with pytest.raises(ConfigError) as info, replay_cassette(path):
        pass
    assert str(info.value) == (
        f"cassette {path} is version 1, expected 2 -- re-record it (e.g. `COMPOSE_RECORD=1` "
        "against the real provider, or `compose export` again from a persisted run) to pick up "
        "the current hash format"
    )
    path.write_text(json.dumps({"entries": []}))
    with pytest.raises(ConfigError, match="is version None, expected 2"), replay_cassette(path):
        pass


def test_test23_unreadable_cassettes_name_the_file(tmp_path):
    missing = tmp_path / "missing.json"
    with (
        pytest.raises(ConfigError, match="cannot read cassette .*missing.json"),
        replay_cassette(missing),
    ):
        pass
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    with (
        pytest.raises(ConfigError, match="garbage.json is not valid JSON"),
        replay_cassette(garbage),
    ):
        pass


def _entry(full_hash, message_hash, text):
    from composeai import _codec

    return {
        "full_hash": full_hash,
        "message_hash": message_hash,
        "request": {"model": "m", "system": None, "messages": []},
        "response": _codec.encode(
            ModelResponse(
                message=Message.assistant(text),
                stop_reason=StopReason.END_TURN,
                raw_stop_reason="end_turn",
                usage=Usage(),
                model_id="m",
            )
        ),
    }


def test_test24_full_hash_first_then_message_hash_each_entry_once():
    request = ModelRequest(model="m", messages=[Message.user("hi")], system="S")
    full = compute_full_hash(request)
    message = compute_message_hash("S", request.messages)
    replay = ReplayModel(
        [
            _entry(None, message, "by message"),
            _entry(full, message, "by full"),
        ]
    )
    assert replay.complete(request).message.text == "by full"
    assert replay.complete(request).message.text == "by message"
    with pytest.raises(ComposeError) as info:
        replay.complete(request)
    assert str(info.value) == (
        f"no cassette entry matches this request (model='m', full_hash='{full}', "
        f"message_hash='{message}') -- re-record the cassette (e.g. COMPOSE_RECORD=1) if the "
        "request legitimately changed"
    )


def test_test24_stream_synthesizes_deltas_and_async_twins():
    request = ModelRequest(model="m", messages=[Message.user("hi")])
    message = compute_message_hash(None, request.messages)
    replay = ReplayModel([_entry(None, message, "two words"), _entry(None, message, "again")])
    events = list(replay.stream(request))
    assert [(e.kind, e.text) for e in events[:-1]] == [
        ("text_delta", "two"),
        ("text_delta", " "),
        ("text_delta", "words"),
    ]
    assert events[-1].kind == "response_done"
    assert events[-1].response.message.text == "two words"
    assert asyncio.run(replay.acomplete(request)).message.text == "again"


def test_test25_nesting_refused_before_touching_resolve_or_file(tmp_path):
    outer = tmp_path / "outer.json"
    inner = tmp_path / "inner.json"
    with record_cassette(outer):
        wrapped = registry.resolve
        with pytest.raises(ConfigError) as info, record_cassette(inner):
            pass
        assert str(info.value) == NESTED
        # `inner` does not exist: refused before reading it.
        with pytest.raises(ConfigError, match="cannot be nested"), replay_cassette(inner):
            pass
        assert registry.resolve is wrapped
    assert not inner.exists()
    outer.write_text(json.dumps({"version": 2, "entries": []}))
    with (
        replay_cassette(outer),
        pytest.raises(ConfigError, match="cannot be nested"),
        record_cassette(inner),
    ):
        pass
    assert not inner.exists()


def test_test30_fixture_records_then_replays_then_passes_through(cassette, tmp_path, monkeypatch):
    path = tmp_path / "fixture.json"
    monkeypatch.setenv("COMPOSE_RECORD", "1")
    recorder = CountingModel(["recorded"])
    with cassette(path):
        assert make_agent(recorder)("a") == "recorded"
    assert recorder.calls == 1 and path.exists()

    monkeypatch.delenv("COMPOSE_RECORD")
    live = CountingModel([])
    with cassette(path):
        assert make_agent(live)("a") == "recorded"
    assert live.calls == 0

    passthrough = CountingModel(["live"])
    absent = tmp_path / "absent.json"
    with cassette(absent):
        assert registry.resolve(passthrough) is passthrough
        assert make_agent(passthrough)("a") == "live"
    assert not absent.exists()

    monkeypatch.setenv("COMPOSE_RECORD", "1")
    with cassette(path):  # COMPOSE_RECORD=1 always overwrites
        make_agent(CountingModel(["new"]))("b")
    assert json.loads(path.read_text())["entries"][0]["response"]["value"]["message"]["value"][
        "parts"
    ][0]["text"] == ("new")


def test_test30_exported_cassette_replays_by_message_hash(tmp_path, capsys):
    from composeai import cli

    agent = make_agent(CountingModel(["exported reply"]))
    run = agent.run("a")
    path = tmp_path / "export.json"
    assert cli.main(["export", run.id, "--cassette", str(path)]) == 0
    entries = json.loads(path.read_text())["entries"]
    assert entries[0]["full_hash"] is None
    live = CountingModel([])
    with replay_cassette(path):
        assert make_agent(live)("a") == "exported reply"
    assert live.calls == 0
