"""Streaming agent and flow runs: events, `RunStream`, `AsyncRunStream`, cancellation
(agents.md AGENT-25, AGENT-82, AGENT-90 … AGENT-93; flows.md FLOW-10)."""

import asyncio
import contextvars
import json
import threading
import time

import pytest

import composeai as compose
from composeai import _engine
from composeai.agentfn import agent
from composeai.errors import BudgetExceededError, ComposeError
from composeai.events import Event
from composeai.messages import Message, StopReason, TextPart, ThinkingPart, Usage
from composeai.models.base import ModelResponse, RawStreamEvent
from composeai.runs import AsyncRunStream, Run, RunStream
from composeai.testing import FakeModel, reset_registries
from composeai.tools import tool

WAIT = 10.0  # generous bound for cross-thread hand-offs; never an assertion on speed


@pytest.fixture(autouse=True)
def clean_agent_registry():
    reset_registries()
    yield
    reset_registries()


def calls(*specs: tuple) -> dict:
    return {"tool_calls": [{"name": n, "arguments": a, "id": i} for n, a, i in specs]}


def kinds(events: list[Event]) -> list[str]:
    return [e.kind for e in events]


def of_kind(events: list[Event], kind: str) -> list[Event]:
    return [e for e in events if e.kind == kind]


def drain(stream, limit: float = WAIT) -> list[Event]:
    """Collects every event; fails instead of hanging if the stream never ends."""
    out: list[Event] = []
    deadline = time.monotonic() + limit
    for event in stream:
        out.append(event)
        assert time.monotonic() < deadline, "stream did not finish in time"
    return out


def blocking(gate: threading.Event, reply):
    """A FakeModel script item that blocks the model call until `gate` is set."""

    def item(request):
        assert gate.wait(WAIT), "gate never opened"
        return reply

    return item


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


# --------------------------------------------------------------------------- AGENT-82, AGENT-91


def test_agent82_agent_stream_events():
    model = FakeModel([calls(("add", {"a": 1, "b": 2}, "c1")), "Hello  big\nworld"])

    @agent(model=model, tools=[add])
    def talker(x: str) -> str:
        return x

    stream = talker.stream("q")
    assert isinstance(stream, RunStream)
    events = drain(stream)
    run = stream.run
    assert isinstance(run, Run) and run.status == "completed" and run.output == "Hello  big\nworld"
    spans_by_id = {s.span_id: s for s in run.trace.spans}
    root = run.trace.spans[0]

    # span_started / span_finished: one pair per span, with kind (and status)
    started = of_kind(events, "span_started")
    finished = of_kind(events, "span_finished")
    assert [e.span_id for e in started] == [s.span_id for s in run.trace.spans]
    assert sorted(e.span_id for e in finished) == sorted(spans_by_id)
    for e in started:
        span = spans_by_id[e.span_id]
        assert e.data == {"kind": span.kind} and e.name == span.name
        assert e.trace_id == run.trace.trace_id
    for e in finished:
        span = spans_by_id[e.span_id]
        assert e.data == {"kind": span.kind, "status": "ok"} and e.name == span.name
    assert [spans_by_id[e.span_id].kind for e in started] == ["agent", "llm", "tool", "llm"]

    # text deltas (TEST-5 synthesis) concatenate to the reply; ids of the llm span
    deltas = of_kind(events, "text_delta")
    assert "".join(e.text for e in deltas) == "Hello  big\nworld"
    assert [e.text for e in deltas] == ["Hello", "  ", "big", "\n", "world"]
    last_llm = [s for s in run.trace.spans if s.kind == "llm"][-1]
    for e in deltas:
        assert e.name == "FakeModel" and e.data is None
        assert e.span_id == last_llm.span_id and e.trace_id == run.trace.trace_id

    # tool-call events
    first_llm = next(s for s in run.trace.spans if s.kind == "llm")
    tool_events = [e for e in events if e.kind.startswith("tool_")]
    assert kinds(tool_events) == ["tool_call_started", "tool_args_delta", "tool_call_finished"]
    for e in tool_events:
        assert e.name == "add" and e.data == {"id": "c1"}
        assert e.span_id == first_llm.span_id
    assert tool_events[1].text == json.dumps({"a": 1, "b": 2})
    assert tool_events[0].text is None and tool_events[2].text is None

    # exactly one run_finished, last
    (done,) = of_kind(events, "run_finished")
    assert events[-1] is done
    assert done.data == {"status": "completed"}
    assert done.name is None and done.span_id == root.span_id
    assert done.trace_id == run.trace.trace_id

    # a drained stream iterates empty; close() is idempotent
    assert list(stream) == []
    stream.close()
    stream.close()
    assert stream.run is run


def test_agent82_thinking_deltas():
    reply = ModelResponse(
        message=Message(
            role="assistant", parts=[ThinkingPart(text="let me think"), TextPart(text="ok")]
        ),
        stop_reason=StopReason.END_TURN,
        raw_stop_reason="end_turn",
        usage=Usage(),
        model_id="FakeModel",
    )

    @agent(model=FakeModel([reply]))
    def thinker(x: str) -> str:
        return x

    stream = thinker.stream("q")
    events = drain(stream)
    thinking = of_kind(events, "thinking_delta")
    assert "".join(e.text for e in thinking) == "let me think"
    assert all(e.name == "FakeModel" and e.data is None for e in thinking)
    assert "".join(e.text for e in of_kind(events, "text_delta")) == "ok"
    assert stream.run.output == "ok"


def test_agent91_failing_run_reraises_the_same_exception_from_iteration_and_run():
    @agent(model=FakeModel([]))
    def broken(x: str) -> str:
        return x

    stream = broken.stream("q")
    events: list[Event] = []
    with pytest.raises(ComposeError) as info:
        for event in stream:
            events.append(event)  # noqa: PERF402 -- the loop itself must raise
    assert str(info.value) == (
        "FakeModel script exhausted after 1 request(s): no more scripted responses left"
    )
    (done,) = of_kind(events, "run_finished")
    assert done.data == {"status": "failed", "error": "ComposeError"}
    with pytest.raises(ComposeError) as again:
        _ = stream.run
    assert again.value is info.value
    assert list(stream) == []  # a second iteration after the drain returns at once


def test_agent91_paused_run_through_a_stream():
    @tool(requires_approval=True)
    def send_email(to: str) -> str:
        """Send."""
        return "sent"

    @agent(model=FakeModel([calls(("send_email", {"to": "x"}, "c1"))]), tools=[send_email])
    def mailer(x: str) -> str:
        return x

    stream = mailer.stream("q")
    events = drain(stream)
    run = stream.run
    assert run.status == "paused" and run.pending.id == "tool:send_email:c1"
    (done,) = of_kind(events, "run_finished")
    assert done.data == {"status": "paused"}
    statuses = {(e.data["kind"], e.data["status"]) for e in of_kind(events, "span_finished")}
    assert ("pause", "paused") in statuses and ("agent", "paused") in statuses


def test_agent91_close_unsubscribes_but_the_run_continues():
    gate = threading.Event()
    model = FakeModel([blocking(gate, "finished anyway")])

    @agent(model=model)
    def slow(x: str) -> str:
        return x

    stream = slow.stream("q")
    stream.close()
    gate.set()
    run = stream.run
    assert run.status == "completed" and run.output == "finished anyway"
    # Only what was delivered before close() remains; nothing after it arrives.
    assert of_kind(list(stream), "run_finished") == []


def test_agent90_stream_thread_inherits_the_callers_context():
    var: contextvars.ContextVar[str] = contextvars.ContextVar("test_var", default="unset")
    seen: list = []

    @tool
    def peek() -> str:
        """Peek."""
        seen.append((var.get(), threading.current_thread() is threading.main_thread()))
        return "ok"

    @agent(model=FakeModel([calls(("peek", {}, "c1")), "done"]), tools=[peek])
    def peeker(x: str) -> str:
        return x

    token = var.set("from caller")
    try:
        stream = peeker.stream("q")
    finally:
        var.reset(token)
    assert stream.run.output == "done"
    assert seen == [("from caller", False)]


def test_agent25_stream_without_response_done_is_an_error():
    class NoDone:
        def complete(self, request):
            raise AssertionError("streaming calls prefer stream()")

        def stream(self, request):
            yield RawStreamEvent("text_delta", text="partial")

    @agent(model=NoDone())
    def truncated(x: str) -> str:
        return x

    stream = truncated.stream("q")
    with pytest.raises(ComposeError) as info:
        drain(stream)
    assert str(info.value) == (
        "Model.stream() for 'NoDone' ended without yielding a response_done event -- adapters "
        "must always yield exactly one, as their final event"
    )


def test_agent25_streaming_prefers_stream_and_plain_runs_use_complete():
    used: list = []
    inner = FakeModel(["via stream", "via complete"])

    class Both:
        def complete(self, request):
            used.append("complete")
            return inner.complete(request)

        def stream(self, request):
            used.append("stream")
            return inner.stream(request)

    @agent(model=Both())
    def either(x: str) -> str:
        return x

    assert either.stream("q").run.output == "via stream"
    assert either.run("q").output == "via complete"
    assert used == ["stream", "complete"]


def test_agent25_model_without_stream_still_works_under_a_stream():
    inner = FakeModel(["plain"])

    class CompleteOnly:
        def complete(self, request):
            return inner.complete(request)

    @agent(model=CompleteOnly())
    def plain(x: str) -> str:
        return x

    stream = plain.stream("q")
    events = drain(stream)
    assert stream.run.output == "plain"
    assert of_kind(events, "text_delta") == []
    assert of_kind(events, "run_finished")[0].data == {"status": "completed"}


# --------------------------------------------------------------------------- AGENT-93: cancel


def assert_cancelled_run(run: Run) -> None:
    assert run.status == "cancelled"
    assert run.output is None and run.messages == [] and run.pending is None
    assert run.usage == Usage()


def test_agent93_cancel_from_a_tool_body():
    ready = threading.Event()
    holder: dict = {}
    ran: list = []

    @tool
    def stopper() -> str:
        """Stops the run."""
        assert ready.wait(WAIT)
        holder["stream"].cancel()
        holder["stream"].cancel()  # idempotent
        ran.append(1)
        return "tool finished anyway"

    model = FakeModel([calls(("stopper", {}, "c1")), "never reached"])

    @agent(model=model, tools=[stopper])
    def cancellable(x: str) -> str:
        return x

    stream = cancellable.stream("q")
    holder["stream"] = stream
    ready.set()
    events = drain(stream)
    run = stream.run
    assert_cancelled_run(run)
    assert ran == [1]  # the running tool finished
    assert len(model.requests) == 1  # no further turn
    run_id = run.id
    row = _engine.get_store().get_run(run_id)
    assert row is not None and row["kind"] == "agent"
    assert row["status"] == "cancelled"
    (done,) = of_kind(events, "run_finished")
    assert done.data == {"status": "cancelled"}
    assert events[-1] is done
    agent_finished = [e for e in of_kind(events, "span_finished") if e.data["kind"] == "agent"]
    assert len(agent_finished) == 1


def test_agent93_cancelled_spans_have_status_cancelled_without_error_info():
    ready = threading.Event()
    holder: dict = {}

    @tool
    def stopper() -> str:
        """Stops the run."""
        assert ready.wait(WAIT)
        holder["stream"].cancel()
        return "ok"

    @agent(model=FakeModel([calls(("stopper", {}, "c1")), "never"]), tools=[stopper])
    def cancellable(x: str) -> str:
        return x

    stream = cancellable.stream("q")
    holder["stream"] = stream
    ready.set()
    events = drain(stream)
    run = stream.run
    assert run.status == "cancelled"
    agent_finished = [e for e in of_kind(events, "span_finished") if e.data["kind"] == "agent"]
    assert [e.data["status"] for e in agent_finished] == ["cancelled"]
    root = run.trace.spans[0]
    assert root.status == "cancelled" and root.error is None


def test_agent93_cancel_from_the_consumer_thread_during_a_model_call():
    gate = threading.Event()
    model = FakeModel([blocking(gate, "a long answer that is never shown"), "unused"])

    @agent(model=model)
    def chatty(x: str) -> str:
        return x

    stream = chatty.stream("q")
    events: list[Event] = []
    try:
        for event in stream:
            events.append(event)
            if event.kind == "span_started" and event.data == {"kind": "llm"}:
                stream.cancel()
                gate.set()
    finally:
        gate.set()
    run = stream.run
    assert_cancelled_run(run)
    assert of_kind(events, "text_delta") == []  # checked between provider stream events
    assert of_kind(events, "run_finished")[0].data == {"status": "cancelled"}
    assert _engine.get_store().get_run(run.id)["status"] == "cancelled"
    assert len(model.requests) == 1


def test_agent93_llm_span_cancelled_mid_stream_has_status_cancelled():
    gate = threading.Event()

    @agent(model=FakeModel([blocking(gate, "never shown")]))
    def chatty(x: str) -> str:
        return x

    stream = chatty.stream("q")
    events: list[Event] = []
    try:
        for event in stream:
            events.append(event)
            if event.kind == "span_started" and event.data == {"kind": "llm"}:
                stream.cancel()
                gate.set()
    finally:
        gate.set()
    assert stream.run.status == "cancelled"
    llm_finished = [e for e in of_kind(events, "span_finished") if e.data["kind"] == "llm"]
    assert [e.data["status"] for e in llm_finished] == ["cancelled"]
    (llm,) = [s for s in stream.run.trace.spans if s.kind == "llm"]
    assert llm.status == "cancelled" and llm.error is None


def test_agent93_cancel_refuses_a_new_tool_batch():
    gate = threading.Event()
    ran: list = []

    @tool
    def side_effect() -> str:
        """Side effect."""
        ran.append(1)
        return "done"

    inner = FakeModel([blocking(gate, calls(("side_effect", {}, "c1"))), "unused"])

    class CompleteOnly:  # no stream(): nothing is checked until the batch starts
        def complete(self, request):
            return inner.complete(request)

    @agent(model=CompleteOnly(), tools=[side_effect])
    def worker(x: str) -> str:
        return x

    stream = worker.stream("q")
    try:
        for event in stream:
            if event.kind == "span_started" and event.data == {"kind": "llm"}:
                stream.cancel()
                gate.set()
    finally:
        gate.set()
    assert_cancelled_run(stream.run)
    assert ran == []


def test_agent93_cancel_after_completion_changes_nothing():
    @agent(model=FakeModel(["done"]))
    def quick(x: str) -> str:
        return x

    stream = quick.stream("q")
    run = stream.run
    stream.cancel()
    stream.cancel()
    assert stream.run is run and run.status == "completed"
    assert _engine.get_store().get_run(run.id)["status"] == "completed"


# --------------------------------------------------------------------------- flow streams


def test_flow10_flow_stream_events_and_run():
    model = FakeModel(["drafted text"])

    @agent(model=model)
    def writer(x: str) -> str:
        return x

    @compose.task
    def shout(x: str) -> str:
        return x.upper()

    @compose.flow
    def publish(topic: str) -> str:
        return shout(writer(topic))

    stream = publish.stream("owls")
    events = drain(stream)
    run = stream.run
    assert run.status == "completed" and run.output == "DRAFTED TEXT"
    started = [(e.data["kind"], e.name) for e in of_kind(events, "span_started")]
    assert started == [
        ("flow", "publish"),
        ("agent", "writer"),
        ("llm", "FakeModel"),
        ("task", "shout"),
    ]
    assert "".join(e.text for e in of_kind(events, "text_delta")) == "drafted text"
    (done,) = of_kind(events, "run_finished")
    assert done.data == {"status": "completed"} and events[-1] is done
    assert done.span_id == run.trace.spans[0].span_id


def test_flow10_flow_stream_accepts_a_budget_and_reraises_failures():
    @agent(model=FakeModel(["x"]))
    def writer(x: str) -> str:
        return x

    @compose.flow
    def f() -> str:
        return writer("q")

    stream = f.stream(budget=compose.Budget(tokens=1))
    events: list[Event] = []
    with pytest.raises(BudgetExceededError) as info:
        for e in stream:
            events.append(e)  # noqa: PERF402 -- the loop itself must raise
    with pytest.raises(BudgetExceededError) as again:
        _ = stream.run
    assert again.value is info.value
    assert of_kind(events, "run_finished")[0].data == {
        "status": "failed",
        "error": "BudgetExceededError",
    }


def test_flow_stream_cancel_stops_the_flow_at_the_next_step():
    gate = threading.Event()
    ran: list = []

    @compose.task
    def first() -> str:
        assert gate.wait(WAIT)
        ran.append("first")
        return "one"

    @compose.task
    def second() -> str:
        ran.append("second")
        return "two"

    @compose.flow
    def two_steps() -> list:
        return [first(), second()]

    stream = two_steps.stream()
    events: list[Event] = []
    try:
        for event in stream:
            events.append(event)
            if event.kind == "span_started" and event.name == "first":
                stream.cancel()
                gate.set()
    finally:
        gate.set()
    run = stream.run
    assert run.status == "cancelled"
    assert run.output is None and run.pending is None
    assert ran == ["first"]
    assert of_kind(events, "run_finished")[0].data == {"status": "cancelled"}
    row = _engine.get_store().get_run(run.id)
    assert row["status"] not in ("running", "completed")


def test_flow_stream_cancel_stops_an_agent_step_inside_the_flow():
    ready = threading.Event()
    holder: dict = {}

    @tool
    def stopper() -> str:
        """Stops."""
        assert ready.wait(WAIT)
        holder["stream"].cancel()
        return "ok"

    model = FakeModel([calls(("stopper", {}, "c1")), "unreached"])

    @agent(model=model, tools=[stopper])
    def helper(x: str) -> str:
        return x

    after: list = []

    @compose.task
    def later() -> str:
        after.append(1)
        return "x"

    @compose.flow
    def f() -> str:
        helper("q")
        return later()

    stream = f.stream()
    holder["stream"] = stream
    ready.set()
    drain(stream)
    assert stream.run.status == "cancelled"
    assert len(model.requests) == 1 and after == []


# --------------------------------------------------------------------------- AGENT-92: astream


def test_agent92_astream_async_for_and_await_run():
    model = FakeModel([calls(("add", {"a": 2, "b": 2}, "c1")), "four it is"])

    @agent(model=model, tools=[add])
    def acounter(x: str) -> str:
        return x

    async def main():
        stream = acounter.astream("q")
        assert isinstance(stream, AsyncRunStream)
        events = []
        async for event in stream:
            events.append(event)
        return events, await stream.run()

    events, run = asyncio.run(asyncio.wait_for(main(), WAIT))
    assert run.status == "completed" and run.output == "four it is"
    assert "".join(e.text for e in of_kind(events, "text_delta")) == "four it is"
    (done,) = of_kind(events, "run_finished")
    assert done.data == {"status": "completed"} and events[-1] is done
    assert [e.data for e in events if e.kind.startswith("tool_call_")] == [
        {"id": "c1"},
        {"id": "c1"},
    ]


def test_agent92_astream_failure_reraises():
    @agent(model=FakeModel([]))
    def abroken(x: str) -> str:
        return x

    async def main():
        stream = abroken.astream("q")
        events = []
        with pytest.raises(ComposeError) as info:
            async for event in stream:
                events.append(event)
        with pytest.raises(ComposeError) as again:
            await stream.run()
        assert again.value is info.value
        return events

    events = asyncio.run(asyncio.wait_for(main(), WAIT))
    assert of_kind(events, "run_finished")[0].data == {"status": "failed", "error": "ComposeError"}


def test_agent92_astream_run_without_iterating():
    @agent(model=FakeModel(["quiet"]))
    def aquiet(x: str) -> str:
        return x

    async def main():
        stream = aquiet.astream("q")
        return await stream.run()

    run = asyncio.run(asyncio.wait_for(main(), WAIT))
    assert run.output == "quiet"


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


def test_agent93_cancel_between_provider_stream_events_closes_the_stream():
    gate = threading.Event()
    closed: list = []

    class Slow:
        def complete(self, request):
            raise AssertionError("streaming calls prefer stream()")

        def stream(self, request):
            try:
                yield RawStreamEvent("text_delta", text="first")
                assert gate.wait(WAIT)
                yield RawStreamEvent("text_delta", text=" second")
                yield done_event("first second")
            finally:
                closed.append(1)

    @agent(model=Slow())
    def slow_talker(x: str) -> str:
        return x

    stream = slow_talker.stream("q")
    events: list[Event] = []
    try:
        for event in stream:
            events.append(event)
            if event.kind == "text_delta":
                stream.cancel()
                gate.set()
    finally:
        gate.set()
    assert_cancelled_run(stream.run)
    assert [e.text for e in of_kind(events, "text_delta")] == ["first"]
    assert closed == [1]


def test_agent93_cancel_before_the_first_turn():
    gate = threading.Event()
    model = FakeModel(["never"])

    @agent(model=model)
    def waits_in_body(x: str) -> str:
        assert gate.wait(WAIT)
        return x

    stream = waits_in_body.stream("q")
    try:
        for event in stream:
            if event.kind == "span_started" and event.data == {"kind": "agent"}:
                stream.cancel()
                gate.set()
    finally:
        gate.set()
    assert_cancelled_run(stream.run)
    assert model.requests == []


def test_agent25_mid_stream_failure_restreams_from_the_start_with_retries():
    from composeai.errors import ProviderError

    attempts: list = []

    class Flaky:
        def complete(self, request):
            raise AssertionError("streaming calls prefer stream()")

        def stream(self, request):
            attempts.append(1)
            yield RawStreamEvent("text_delta", text="par")
            if len(attempts) == 1:
                raise ProviderError("connection reset")
            yield RawStreamEvent("text_delta", text="tial")
            yield done_event("partial")

    @agent(model=Flaky(), retries=1)
    def restreamer(x: str) -> str:
        return x

    stream = restreamer.stream("q")
    events = drain(stream)
    run = stream.run
    assert run.output == "partial"
    assert [e.text for e in of_kind(events, "text_delta")] == ["par", "par", "tial"]
    (llm,) = [s for s in run.trace.spans if s.kind == "llm"]
    assert llm.attributes["retries"] == [{"type": "ProviderError", "message": "connection reset"}]


def test_agent82_run_finished_only_for_the_root_span():
    inner_model = FakeModel(["inner"])

    @agent(model=inner_model)
    def helper(x: str) -> str:
        return x

    @tool
    def delegate(q: str) -> str:
        """Delegate."""
        return helper(q)

    @agent(model=FakeModel([calls(("delegate", {"q": "s"}, "c1")), "outer"]), tools=[delegate])
    def boss(x: str) -> str:
        return x

    stream = boss.stream("q")
    events = drain(stream)
    assert stream.run.output == "outer"
    (done,) = of_kind(events, "run_finished")
    assert done.span_id == stream.run.trace.spans[0].span_id
    agent_starts = [e.name for e in of_kind(events, "span_started") if e.data["kind"] == "agent"]
    assert agent_starts == ["boss", "helper"]


def test_flow_stream_cancel_marks_the_unwound_spans_cancelled():
    gate = threading.Event()

    @compose.task
    def first() -> str:
        assert gate.wait(WAIT)
        return "one"

    @compose.task
    def second() -> str:
        return "two"

    @compose.flow
    def two_steps() -> list:
        return [first(), second()]

    stream = two_steps.stream()
    events: list[Event] = []
    try:
        for event in stream:
            events.append(event)
            if event.kind == "span_started" and event.name == "first":
                stream.cancel()
                gate.set()
    finally:
        gate.set()
    run = stream.run
    assert run.status == "cancelled"
    flow_finished = [e for e in of_kind(events, "span_finished") if e.data["kind"] == "flow"]
    assert [e.data["status"] for e in flow_finished] == ["cancelled"]
    root = run.trace.spans[0]
    assert root.status == "cancelled" and root.error is None
