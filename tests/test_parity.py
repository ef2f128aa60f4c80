"""Behaviours that must match 0.11.0 (issue 9): AGENT-81 subscriptions and the ambient bus,
AGENT-93 cancellation of nested streams and in-flight provider streams, thread hygiene
(ASYNC-5/7), OBS-10 `Span` defaults, pickling of `Run`/`Trace`/`Span`, COMP-20 `Aggregate`,
COMP-1/COMP-5 nested pipelines, COMP-31 unbuildable validators, and the top-level exports."""

from __future__ import annotations

import asyncio
import base64
import pickle
import threading
import time
from dataclasses import dataclass

import pytest
from typing_extensions import TypedDict

import composeai as compose
from _proc import Sandbox
from composeai import _engine, _threads
from composeai.agentfn import agent
from composeai.combinators import Aggregate, Pipeline
from composeai.errors import ConfigError
from composeai.events import Event, EventBus, current_bus, emit, use_bus
from composeai.flow import flow, task
from composeai.messages import Message, StopReason, Usage
from composeai.models.base import ModelResponse, RawStreamEvent
from composeai.runs import Run
from composeai.testing import FakeModel, reset_registries
from composeai.tools import tool
from composeai.tracing import ErrorInfo, Span, Trace

WAIT = 10.0  # bounds cross-thread hand-offs; never an assertion on speed


@pytest.fixture(autouse=True)
def clean_agent_registry():
    reset_registries()
    yield
    reset_registries()


def calls(*specs: tuple) -> dict:
    return {"tool_calls": [{"name": n, "arguments": a, "id": i} for n, a, i in specs]}


def done_event(text: str) -> RawStreamEvent:
    return RawStreamEvent(
        "response_done",
        response=ModelResponse(
            message=Message.assistant(text),
            stop_reason=StopReason.END_TURN,
            raw_stop_reason="end_turn",
            usage=Usage(input_tokens=1, output_tokens=1),
            model_id="m",
        ),
    )


# --------------------------------------------------------------------------- AGENT-81


def test_agent81_sync_subscription_close_keeps_delivered_events():
    bus = EventBus()
    sub = bus.subscribe()
    bus.emit(Event("text_delta", text="1"))
    bus.emit(Event("text_delta", text="2"))
    sub.close()
    bus.emit(Event("text_delta", text="after close"))
    assert [e.text for e in sub] == ["1", "2"]
    assert list(sub) == []


def test_agent81_async_subscription_close_keeps_delivered_events():
    async def main():
        bus = EventBus()
        sub = bus.asubscribe()
        bus.emit(Event("text_delta", text="1"))
        sub.close()
        bus.emit(Event("text_delta", text="after close"))
        return [e.text async for e in sub]

    assert asyncio.run(asyncio.wait_for(main(), WAIT)) == ["1"]


def test_agent81_ambient_use_bus_and_emit_deliver_within_the_block():
    bus = EventBus()
    sub = bus.subscribe()
    emit(Event("text_delta", text="no bus yet"))  # a no-op
    with use_bus(bus):
        assert current_bus() is bus
        emit(Event("text_delta", text="inside"))
    emit(Event("text_delta", text="outside"))
    bus.close()
    assert [e.text for e in sub] == ["inside"]


def test_agent81_async_subscription_consumes_events_emitted_from_other_threads_in_order():
    async def main():
        bus = EventBus()
        sub = bus.asubscribe()

        def produce(tag: str) -> None:
            for i in range(200):
                bus.emit(Event("text_delta", text=f"{tag}{i}"))

        threads = [threading.Thread(target=produce, args=(t,)) for t in "ab"]
        for t in threads:
            t.start()

        def finish() -> None:
            for t in threads:
                t.join()
            bus.close()

        closer = threading.Thread(target=finish)
        closer.start()
        got = [e.text async for e in sub]
        closer.join()
        return got

    got = asyncio.run(asyncio.wait_for(main(), WAIT))
    for tag in "ab":
        assert [t for t in got if t.startswith(tag)] == [f"{tag}{i}" for i in range(200)]
    assert len(got) == 400


# --------------------------------------------------------------------------- AGENT-93


def test_agent93_cancelling_an_agent_stream_nested_in_a_flow_body():
    gate = threading.Event()

    def slow(request):
        assert gate.wait(WAIT)
        return "never shown"

    @agent(model=FakeModel([slow]))
    def helper(x: str) -> str:
        return x

    seen: dict = {}

    @flow
    def outer(x: str) -> str:
        stream = helper.stream(x)
        kinds = []
        try:
            for event in stream:
                kinds.append(event.kind)
                if event.kind == "span_started" and event.data == {"kind": "llm"}:
                    stream.cancel()
                    gate.set()
        except BaseException as exc:  # noqa: BLE001 -- recorded: nothing may reach user code
            seen["raised"] = exc
        finally:
            gate.set()
        seen["run"] = stream.run
        seen["kinds"] = kinds
        return "flow finished"

    result = outer.run("q")
    assert result.status == "completed" and result.output == "flow finished"
    assert "raised" not in seen
    run = seen["run"]
    assert isinstance(run, Run) and run.status == "cancelled"
    assert run.output is None and run.messages == [] and run.pending is None
    assert run.usage == Usage()
    assert "run_finished" not in seen["kinds"]  # the flow is the root, and it goes on
    agent_span = next(s for s in result.trace.spans if s.kind == "agent")
    assert agent_span.status == "cancelled" and agent_span.error is None


def test_agent93_reading_run_of_a_nested_cancelled_stream_without_draining():
    gate = threading.Event()

    def slow(request):
        assert gate.wait(WAIT)
        return "never"

    @agent(model=FakeModel([slow]))
    def helper(x: str) -> str:
        return x

    @flow
    def outer(x: str) -> str:
        stream = helper.stream(x)
        stream.cancel()
        gate.set()
        return stream.run.status

    assert outer.run("q").output == "cancelled"


class _SyncStreaming:
    """A model whose sync stream blocks between events; generators are kept referenced so
    only an explicit close() can run their cleanup."""

    def __init__(self, gate: threading.Event):
        self.gate = gate
        self.closed: list[str] = []
        self.streams: list = []

    def complete(self, request):
        raise AssertionError("a streaming call uses stream()")

    def stream(self, request):
        def events():
            try:
                yield RawStreamEvent("text_delta", text="first")
                assert self.gate.wait(WAIT)
                yield RawStreamEvent("text_delta", text=" second")
                yield done_event("first second")
            finally:
                self.closed.append("close")

        gen = events()
        self.streams.append(gen)
        return gen


class _AsyncStreaming:
    """A model with only `astream`; the loop must drive it and aclose() it."""

    def __init__(self, gate: threading.Event):
        self.gate = gate
        self.closed: list[str] = []
        self.streams: list = []

    def complete(self, request):
        raise AssertionError("a streaming call uses astream()")

    def astream(self, request):
        async def events():
            try:
                yield RawStreamEvent("text_delta", text="first")
                while not self.gate.is_set():
                    await asyncio.sleep(0.005)
                yield RawStreamEvent("text_delta", text=" second")
                yield done_event("first second")
            finally:
                self.closed.append("aclose")

        gen = events()
        self.streams.append(gen)
        return gen


@pytest.mark.parametrize("model_cls", [_SyncStreaming, _AsyncStreaming])
def test_agent93_cancel_during_an_in_flight_provider_stream_closes_it(model_cls):
    gate = threading.Event()
    model = model_cls(gate)

    @agent(model=model)
    def talker(x: str) -> str:
        return x

    stream = talker.stream("q")
    texts = []
    try:
        for event in stream:
            if event.kind == "text_delta":
                texts.append(event.text)
                stream.cancel()
                gate.set()
    finally:
        gate.set()
    run = stream.run
    assert run.status == "cancelled" and run.output is None
    assert texts == ["first"]  # stopped at the next stream event
    assert model.closed == [model.closed[0]] and len(model.streams) == 1  # closed, once
    assert _engine.get_store().get_run(run.id)["status"] == "cancelled"
    llm = next(s for s in run.trace.spans if s.kind == "llm")
    assert llm.status == "cancelled"


def test_agent93_astream_only_model_streams_deltas_under_a_sync_stream():
    gate = threading.Event()
    gate.set()
    model = _AsyncStreaming(gate)

    @agent(model=model)
    def talker(x: str) -> str:
        return x

    stream = talker.stream("q")
    texts = [e.text for e in stream if e.kind == "text_delta"]
    assert texts == ["first", " second"]
    assert stream.run.output == "first second"
    assert model.closed == ["aclose"]


# --------------------------------------------------------------------------- threads


ALLOWED_LONG_LIVED = {"composeai-runtime", "composeai-writer", "composeai-mcp"}


def composeai_threads() -> list[str]:
    return sorted(
        t.name
        for t in threading.enumerate()
        if t.name.startswith("composeai") and t.name not in ALLOWED_LONG_LIVED
    )


def test_async7_no_per_call_thread_outlives_its_work():
    assert _threads.IDLE_SECONDS <= 1.0  # an idle worker exits within about a second

    release = threading.Event()

    def blocking(i: int) -> int:
        assert release.wait(WAIT)
        return i

    @task
    def sync_step(x: int) -> int:
        return x + 1

    @flow
    async def async_flow(x: int) -> int:
        return await sync_step.arun(x)

    @tool
    def first() -> str:
        """First tool."""
        return "1"

    @tool
    def second() -> str:
        """Second tool."""
        return "2"

    script = [calls(("first", {}, "a"), ("second", {}, "b")), "done"]

    @agent(model=FakeModel(script), tools=[first, second])
    def tooled(x: str) -> str:
        return x

    releaser = threading.Timer(0.05, release.set)
    releaser.start()
    assert compose.map(blocking, list(range(8))) == list(range(8))
    assert asyncio.run(compose.amap(sync_step, [1, 2, 3])) == [2, 3, 4]
    assert asyncio.run(async_flow.arun(1)).output == 2
    assert compose.aggregate(a=lambda x: x, b=lambda x: x * 2)(3) == {"a": 3, "b": 6}
    assert tooled.run("go").output == "done"
    releaser.join()

    deadline = time.monotonic() + WAIT
    while composeai_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert composeai_threads() == []


# --------------------------------------------------------------------------- OBS-10, pickle


def test_obs10_span_constructible_with_defaults():
    before = time.time()
    span = Span(trace_id="T", kind="task", name="step", started_at=before)
    assert len(span.span_id) == 26 and span.span_id.isalnum()
    assert Span(trace_id="T", kind="task", name="other").span_id != span.span_id
    assert span.parent_span_id is None and span.ended_at is None
    assert span.status == "running" and span.error is None
    assert span.input is None and span.output is None and span.usage is None
    assert span.attributes == {} and span.replayed is False
    assert span.duration_ms is None
    assert Span(trace_id="T", kind="task", name="x").started_at >= before


def test_run_trace_and_span_survive_pickle_round_trips():
    @tool(requires_approval=True)
    def gated() -> str:
        """Gated."""
        return "ok"

    @agent(model=FakeModel(["hello", calls(("gated", {}, "c1"))]), tools=[gated])
    def helper(x: str) -> str:
        return x

    completed = helper.run("q")
    paused = helper.run("again")
    assert paused.status == "paused"
    for obj in (completed, paused, completed.trace):
        copy = pickle.loads(pickle.dumps(obj))
        assert copy == obj and copy is not obj
    assert pickle.loads(pickle.dumps(completed)).usage == completed.usage
    span = Span(
        trace_id="T",
        kind="llm",
        name="m",
        error=ErrorInfo(type="E", message="m", stacktrace="tb"),
        usage=Usage(input_tokens=3),
        attributes={"k": [1, 2]},
    )
    assert pickle.loads(pickle.dumps(span)) == span
    assert pickle.loads(pickle.dumps(Trace("T", [span]))) == Trace("T", [span])


def test_run_pickled_in_one_process_equals_the_original_in_another(tmp_path):
    box = Sandbox(tmp_path)
    box.write_module(
        "pickled_agent",
        """
        from composeai import agent
        from composeai.testing import FakeModel

        @agent(model=FakeModel(["reply"]))
        def helper(x: str) -> str:
            return x
        """,
    )
    data = box.run(
        """
        import base64, pickle
        import pickled_agent
        run = pickled_agent.helper.run("q")
        emit(blob=base64.b64encode(pickle.dumps(run)).decode(), run_id=run.id)
        """
    ).ok()
    run = pickle.loads(base64.b64decode(data["blob"]))
    assert isinstance(run, Run) and run.id == data["run_id"]
    assert run.output == "reply" and run.messages[-1].text == "reply"
    assert [s.kind for s in run.trace.spans] == ["agent", "llm"]
    assert pickle.loads(pickle.dumps(run)) == run


# --------------------------------------------------------------------------- COMP


def test_comp20_aggregate_constructs_directly_with_no_timeout_by_default():
    agg = Aggregate({"a": lambda x: x, "b": lambda x: -x})
    assert agg.timeout_per_branch is None
    assert agg.name == "aggregate(a, b)"
    assert agg(2) == {"a": 2, "b": -2}


def test_comp1_comp5_pipe_keeps_an_inner_pipeline_as_one_nested_stage():
    def inc(x: int) -> int:
        return x + 1

    def dbl(x: int) -> int:
        return x * 2

    def neg(x: int) -> int:
        return -x

    inner = compose.pipe(inc, dbl)
    outer = compose.pipe(inner, neg)
    assert outer.stages == (inner, neg)
    assert outer.name == "pipe(pipe(inc → dbl) → neg)"
    assert (inner >> neg).stages == (inc, dbl, neg)  # only `>>` flattens
    run = outer.run(3)
    assert run.output == -8
    spans = run.trace.spans
    root = spans[0]
    assert (root.kind, root.name) == ("pipe", outer.name)
    nested = [s for s in spans if s.kind == "pipe" and s.parent_span_id == root.span_id]
    assert [s.name for s in nested] == ["pipe(inc → dbl)"]
    inner_children = [s.name for s in spans if s.parent_span_id == nested[0].span_id]
    assert inner_children == ["inc", "dbl"]
    assert [s.name for s in spans if s.parent_span_id == root.span_id] == [
        "pipe(inc → dbl)",
        "neg",
    ]
    assert isinstance(outer, Pipeline)


class _Opaque:
    """Not a pydantic type."""


@dataclass
class _Box:
    item: _Opaque


def test_comp31_unbuildable_input_type_fails_at_construction():
    def takes_box(x: _Box) -> str:
        return "x"

    def gives_box(x: str) -> _Box:
        return _Box(_Opaque())

    prefix = (
        "stage 'takes_box' declares input type _Box, which composeai cannot build a runtime "
        "validator for: "
    )
    with pytest.raises(ConfigError) as info:
        compose.pipe(gives_box, takes_box)
    assert str(info.value).startswith(prefix)
    with pytest.raises(ConfigError) as info:
        compose.aggregate(a=takes_box)
    assert str(info.value).startswith(prefix)
    with pytest.raises(ConfigError):
        compose.map(takes_box, [])


class _Record(TypedDict):
    item: _Opaque


def test_comp31_typeddict_with_an_unschemable_field_fails_at_construction():
    def takes_record(x: _Record) -> str:
        return "x"

    with pytest.raises(ConfigError, match="stage 'takes_record' declares input type _Record"):
        compose.pipe(lambda x: x, takes_record)


def test_comp30_plain_unschemable_class_still_validates_by_isinstance():
    def takes_opaque(x: _Opaque) -> str:
        return "ok"

    assert compose.pipe(lambda x: x, takes_opaque)(_Opaque()) == "ok"


# --------------------------------------------------------------------------- exports

SPEC_ALL = [
    "ApprovalReply",
    "BeforeTool",
    "Budget",
    "Chat",
    "Interrupt",
    "MapResult",
    "ModelPrice",
    "Run",
    "ToolInterceptor",
    "agent",
    "aggregate",
    "amap",
    "anow",
    "approve",
    "arandom",
    "aresume",
    "ask_human",
    "chat",
    "flow",
    "load_chat",
    "map",
    "mcp_tools",
    "now",
    "openai_compatible",
    "pipe",
    "prompt",
    "random",
    "register_module_types",
    "register_price",
    "register_serializable",
    "resume",
    "task",
    "tool",
]


def test_top_level_all_is_exactly_the_spec_list():
    assert len(SPEC_ALL) == 33
    assert compose.__all__ == SPEC_ALL
    for name in SPEC_ALL:
        assert getattr(compose, name) is not None


# --------------------------------------------------------------------------- store


def test_obs1_in_process_sqlite3_readers_see_every_commit_which_survives_kill_9(tmp_path):
    """Python's sqlite3 in the process (the engine's own SQLite library) reads the store while
    runs go on: every commit reaches the file readers open, and survives a crash."""
    box = Sandbox(tmp_path)
    box.write_module(
        "sqlite_reader",
        """
        import os, sqlite3
        from contextlib import closing
        from composeai import agent
        from composeai.testing import FakeModel

        @agent(model=FakeModel(["a", "b", "c"]))
        def helper(x: str) -> str:
            return x

        def count():
            path = os.path.join(os.environ["COMPOSE_DIR"], "runs.db")
            with closing(sqlite3.connect(path)) as conn:
                return conn.execute("SELECT count(*) FROM runs").fetchone()[0]
        """,
    )
    result = box.run(
        """
        import os, signal, sys
        import sqlite_reader as m
        seen = []
        for _ in range(3):
            m.helper.run("q")
            seen.append(m.count())
        print("RESULT " + __import__("json").dumps({"seen": seen}), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    assert result.data == {"seen": [1, 2, 3]}
    assert result.returncode == -9
    assert box.query("SELECT count(*) FROM runs WHERE status = 'completed'") == [(3,)]
