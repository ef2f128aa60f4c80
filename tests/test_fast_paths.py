"""The engine's fast paths keep the documented behaviour: a replayed step is
one core call (FLOW-16, FLOW-19) whose span is built when the trace is first
read; short stored values are decoded in the core exactly as the codec
decodes them (OBS-60, OBS-61); an `async def` task body reached from sync
code runs on the calling thread (ASYNC-7, ASYNC-6); fingerprints (FLOW-9)
and request hashes (TEST-22) are SHA-256 computed in the core."""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import pickle
import sqlite3
import textwrap
import threading

import pytest

import composeai as compose
from composeai import _codec, _core, _engine
from composeai.events import EventBus, use_bus

MISS = object()

PLAIN_TEXTS = [
    "0",
    "-7",
    "123456789012345678",
    "-123456789012345678",
    "3.14159",
    "-0.0",
    "1e-07",
    "1E+300",
    "0.1",
    "5e-324",
    "true",
    "false",
    "null",
    '""',
    '"h\\u0101llo \\ud83d\\ude00 \\n\\t\\"q\\""',
    '"é ✓ 😀"',
    "[]",
    "{}",
    '[1, [2, [3, {"a": null}]], "x"]',
    '{"b": 1, "a": 2, "c": {"z": [true, false]}}',
    '{"a": 1, "a": 2}',
    " [1 , 2] ",
]

DECLINED_TEXTS = [
    "1234567890123456789",  # may exceed 64 bits
    "99999999999999999999999",
    "-0",
    "[-0]",
    "NaN",
    "[Infinity, -Infinity]",
    '{"$kind": "tuple", "value": [1, 2]}',
    '{"\\u0024kind": "tuple", "value": [1, 2]}',
    '"\\ud800"',  # a lone surrogate
    json.dumps("x" * 300),  # long text stays with the Python scanner
]


@pytest.mark.parametrize("text", PLAIN_TEXTS)
def test_obs61_core_fast_path_decodes_plain_json_exactly_like_json_loads(text):
    value = _core.loads_plain(text, MISS)
    assert value is not MISS
    expected = json.loads(text)
    assert value == expected
    assert type(value) is type(expected)
    assert json.dumps(value) == json.dumps(expected)  # same key order, same floats
    if isinstance(expected, float):
        assert math.copysign(1.0, value) == math.copysign(1.0, expected)
    assert _codec.loads(text) == expected


@pytest.mark.parametrize("text", DECLINED_TEXTS)
def test_obs61_core_fast_path_declines_what_only_the_codec_decodes(text):
    assert _core.loads_plain(text, MISS) is MISS


def test_obs61_declined_values_still_decode_through_the_codec():
    assert _codec.loads('{"$kind": "tuple", "value": [1, 2]}') == (1, 2)
    assert _codec.loads("-0") == 0 and type(_codec.loads("-0")) is int
    big = 10**40
    assert _codec.loads(str(big)) == big
    assert math.isnan(_codec.loads("NaN"))


def test_flow16_replayed_values_come_back_as_stored_including_tagged_and_large_ones():
    calls = []
    values = [7, "text", 1.5, None, [1, {"a": (1, 2)}], {"k": {1, 2}}, 10**30, "x" * 5000]

    @compose.task
    def make(i: int):
        calls.append(i)
        return values[i]

    @compose.flow
    def f() -> list:
        out = [make(i) for i in range(len(values))]
        if compose.approve("go"):
            return out
        return []

    first = f.run()
    assert first.status == "paused"
    assert calls == list(range(len(values)))
    done = compose.resume(first.id, answers={"go": True})
    assert calls == list(range(len(values)))  # replay never runs a journaled body
    assert done.output == values
    assert done.output[4][1]["a"] == (1, 2) and done.output[5]["k"] == {1, 2}


def test_flow16_replayed_spans_are_built_on_first_read_with_every_field():
    @compose.task
    def inc(x: int) -> int:
        return x + 1

    @compose.flow
    def f(n: int) -> int:
        x = 0
        for _ in range(n):
            x = inc(x)
        return x if compose.approve("go") else -1

    first = f.run(3)
    done = compose.resume(first.id, answers={"go": True})
    trace = done.trace
    # No replayed Span object exists before the first read: the replayed
    # steps are the core's records, or (read back from the store) not held.
    assert not any(type(s) is not tuple and s.replayed for s in trace._spans)
    restored = pickle.loads(pickle.dumps(trace))
    spans = trace.spans
    root = spans[0]
    replayed = [s for s in spans if s.replayed]
    assert [s.attributes for s in replayed] == [{"step_key": f"inc#{i}"} for i in (1, 2, 3)]
    for i, span in enumerate(replayed):
        assert span.trace_id == trace.trace_id and span.parent_span_id == root.span_id
        assert (span.kind, span.name, span.status) == ("task", "inc", "ok")
        assert span.started_at == span.ended_at and span.output == i + 1
        assert len(span.span_id) == 26
    assert all(type(s) is not tuple for s in trace._spans)
    assert restored == trace  # a pickled trace builds the same spans


@pytest.mark.sqlite_file
def test_obs5_replayed_spans_are_persisted_before_resume_returns():
    @compose.task
    def inc(x: int) -> int:
        return x + 1

    @compose.flow
    def f(n: int) -> int:
        x = 0
        for _ in range(n):
            x = inc(x)
        return x if compose.approve("go") else -1

    first = f.run(4)
    done = compose.resume(first.id, answers={"go": True})
    assert len([s for s in done.trace.spans if s.replayed]) == 4
    db = sqlite3.connect(_engine.get_store().path)
    (count,) = db.execute("SELECT count(*) FROM spans WHERE name = 'inc'").fetchone()
    db.close()
    assert count == 8  # four executed by the first attempt, four replayed


def test_flow16_replayed_steps_emit_their_span_events_on_a_bus():
    @compose.task
    def inc(x: int) -> int:
        return x + 1

    @compose.flow
    def f() -> int:
        x = inc(inc(0))
        return x if compose.approve("go") else -1

    first = f.run()
    bus = EventBus()
    sub = bus.subscribe()
    with use_bus(bus):
        done = compose.resume(first.id, answers={"go": True})
    sub.close()
    assert done.output == 2
    started = [e.span_id for e in sub if e.kind == "span_started" and e.name == "inc"]
    assert started == [s.span_id for s in done.trace.spans if s.replayed]
    assert len(started) == 2


def test_exp7_journaled_failure_is_raised_again_on_the_replay_fast_path():
    @compose.task
    def boom() -> int:
        raise ValueError("no")

    @compose.flow(journal_failures=True)
    def f() -> str:
        try:
            boom()
        except compose.durable.TaskFailed as exc:
            message = exc.message
        return message if compose.approve("go") else "-"

    first = f.run()
    assert compose.resume(first.id, answers={"go": True}).output == "no"


def test_async7_async_task_body_from_a_sync_flow_runs_on_the_calling_thread():
    threads = []

    @compose.task
    async def ainc(x: int) -> int:
        import asyncio

        await asyncio.sleep(0.001)  # a real suspension on the loop
        threads.append(threading.current_thread())
        return x + 1

    @compose.flow
    def f(n: int) -> int:
        x = 0
        for _ in range(n):
            x = ainc(x)
        return x

    assert f.run(3).output == 3
    assert threads == [threading.current_thread()] * 3
    assert ainc(5) == 6  # outside a flow too
    assert threads[-1] is threading.current_thread()


def test_async6_sync_facade_inside_a_body_on_the_threads_own_loop_raises():
    @compose.task
    def plain(x: int) -> int:
        return x

    @compose.task
    async def outer(x: int) -> str:
        try:
            plain(x)
        except RuntimeError as exc:
            return str(exc)
        return "no error"

    @compose.flow
    def f() -> str:
        return outer(1)

    assert f.run().output == "composeai runtime cannot be re-entered from its own loop thread"


def test_flow9_fingerprint_is_the_sha256_of_the_dedented_source():
    def body() -> int:
        return 1

    flow = compose.flow(body, name="fingerprinted")
    source = textwrap.dedent(inspect.getsource(body))
    assert flow.fingerprint == hashlib.sha256(source.encode("utf-8")).hexdigest()
    assert _core.sha256_hex("é") == hashlib.sha256("é".encode()).hexdigest()


def test_test22_message_hash_is_the_sha256_of_the_canonical_json():
    from composeai import testing
    from composeai.messages import Message

    payload = {"b": [1, "é"], "a": None}
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    assert testing._canonical_hash(payload) == hashlib.sha256(canonical.encode()).hexdigest()
    messages = [Message.user("hi")]
    digest = testing.compute_message_hash("sys", messages)
    assert len(digest) == 64 and digest != testing.compute_message_hash("other", messages)


def _same_model(a, b) -> None:
    """Equal as pydantic models, and in every observable piece of state."""
    assert a == b
    assert type(a) is type(b)
    assert a.model_fields_set == b.model_fields_set
    assert a.model_dump(exclude_unset=True) == b.model_dump(exclude_unset=True)
    assert a.model_dump_json() == b.model_dump_json()
    assert repr(a) == repr(b)
    assert pickle.loads(pickle.dumps(a)) == b
    assert _codec.dumps(a) == _codec.dumps(b)


@pytest.mark.parametrize("text", ["hi", "", "héllo \u2603", "x" * 10_000])
def test_agent60_text_messages_are_the_validated_messages(text):
    """AGENT-60/AGENT-7: `Message.user`/`assistant` of a str, built without
    re-validation, are exactly the validated `Message(role, [TextPart])`."""
    from composeai.messages import Message, TextPart

    for role, build in (("user", Message.user), ("assistant", Message.assistant)):
        made = build(text)
        _same_model(made, Message(role=role, parts=[TextPart(text=text)]))
        _same_model(made.parts[0], TextPart(text=text))
        assert made.text == text
        with pytest.raises(Exception, match="frozen"):
            made.role = "user"  # type: ignore[misc]


def test_agent60_messages_of_other_inputs_are_still_validated():
    """Anything that is not an exact `str` or an instance of a part class
    goes through pydantic validation, with its error."""
    import pydantic

    from composeai.messages import Message, TextPart, _message_of, _text_part

    class Sub(str):
        pass

    _same_model(Message.user(Sub("a")), Message(role="user", parts=[TextPart(text="a")]))
    with pytest.raises(pydantic.ValidationError):
        _text_part(7)
    with pytest.raises(pydantic.ValidationError):
        _message_of("assistant", [{"type": "nope"}])
    parts = [TextPart(text="a"), {"type": "text", "text": "b"}]
    _same_model(_message_of("assistant", parts), Message(role="assistant", parts=parts))


def test_prov6_prov7_requests_and_replies_built_by_the_agent_loop_are_the_dataclasses():
    """PROV-6/PROV-7: the request an agent sends and FakeModel's text reply, their
    slots set directly, are exactly the frozen dataclasses their constructors make."""
    import dataclasses

    from composeai.messages import Message, StopReason, Usage
    from composeai.models.base import ModelRequest, ModelResponse, new_request, new_response
    from composeai.testing import FakeModel

    model = FakeModel(["hi there"])

    @compose.agent(model=model, temperature=0.5, max_tokens=99)
    def greet(name: str) -> str:
        """Be brief."""
        return f"hello {name}"

    assert greet("bo") == "hi there"
    (sent,) = model.requests
    built = ModelRequest(
        model="FakeModel",
        messages=[Message.user("hello bo")],
        system="Be brief.",
        max_tokens=99,
        temperature=0.5,
        prompt_cache=True,
    )
    assert sent == built and repr(sent) == repr(built)
    assert sent == new_request(*(getattr(built, f.name) for f in dataclasses.fields(built)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        sent.model = "x"  # type: ignore[misc]

    usage = Usage(input_tokens=3)
    reply = new_response(Message.assistant("a"), StopReason.END_TURN, "end_turn", usage, "m")
    expected = ModelResponse(Message.assistant("a"), StopReason.END_TURN, "end_turn", usage, "m")
    assert reply == expected and repr(reply) == repr(expected) and reply.parsed is None
    # A reason given as its string is still converted, as the constructor does.
    assert new_response(Message.assistant("a"), "max_tokens", None, usage, "m").stop_reason is (
        StopReason.MAX_TOKENS
    )


def test_prov13_rates_are_resolved_per_price_object():
    """PROV-13/PROV-30: the cached rates follow the price object in use, so a
    newly registered price is priced by its own rates."""
    from composeai.models.prices import ModelPrice, _rates, resolved_rates

    a, b = ModelPrice(input=1.0, output=2.0), ModelPrice(input=3.0, output=4.0)
    assert resolved_rates(a) == _rates(a)
    assert resolved_rates(b) == _rates(b)
    assert resolved_rates(a) is resolved_rates(a)
