"""OpenTelemetry export (issue 26): every span emitted through the user's
TracerProvider as it ends, checked with the SDK's in-memory exporter; and
`compose export RUN_ID --otlp URL` against a loopback OTLP/HTTP receiver.
Spans are the ones OBS-10 … OBS-17 describe; content follows OBS-70."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import _proc
import composeai as compose
from composeai import _otel, cli, task
from composeai.agentfn import agent
from composeai.graph import END, Graph
from composeai.messages import Usage
from composeai.models import registry
from composeai.models.anthropic import AnthropicModel
from composeai.models.compatible import OpenAICompatibleModel
from composeai.models.openai import OpenAIModel
from composeai.testing import FakeModel
from composeai.tools import tool

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def provider():
    """The process's global provider (OpenTelemetry allows one per process)."""
    sdk = TracerProvider()
    sdk.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(sdk)
    assert trace.get_tracer_provider() is sdk
    return sdk


@pytest.fixture
def exported(provider):
    """Export on for one test; yields the in-memory exporter's span list."""
    _EXPORTER.clear()
    compose.configure(otel=True)
    yield _EXPORTER.get_finished_spans
    _otel.configure(False)
    _otel._configured = False
    _EXPORTER.clear()


def by_composeai_id(spans) -> dict:
    return {s.attributes["composeai.span_id"]: s for s in spans}


def check_links(run, spans) -> None:
    """Every span of the run's trace was emitted once, in the run's trace,
    its parent the span of its composeai parent."""
    ours = by_composeai_id(spans)
    assert len(ours) == len(spans), "a span was emitted twice"
    stored = run.trace.spans
    assert set(ours) == {s.span_id for s in stored}
    trace_id = _otel._id128(run.trace.trace_id)
    for s in stored:
        o = ours[s.span_id]
        assert o.context.trace_id == trace_id
        assert o.context.span_id == _otel._span_id(s.span_id)
        if s.parent_span_id is None:
            assert o.parent is None
        else:
            assert o.parent.span_id == ours[s.parent_span_id].context.span_id
            assert o.parent.trace_id == trace_id


def test_otel_flow_task_and_map_item_spans_with_parent_links(exported):
    """Flow, task (the lean step path) and map item spans (OBS-11), each
    emitted once with its parent link and the run's trace id."""

    @task
    def inc(x: int) -> int:
        return x + 1

    @compose.flow
    def pipeline(n: int) -> int:
        total = inc(n) + inc(n + 1)
        return total + sum(compose.map(inc, [1, 2, 3]))

    run = pipeline.run(1)
    assert run.output == 5 + 9
    spans = exported()
    check_links(run, spans)
    kinds = sorted((s.attributes["composeai.kind"], s.name) for s in spans)
    # Each map item's span holds the step it journals.
    assert kinds == [
        ("aggregate", "map(inc)"),
        ("flow", "pipeline"),
        *[("task", "inc")] * 5,
        ("task", "inc[0]"),
        ("task", "inc[1]"),
        ("task", "inc[2]"),
    ]
    root = next(s for s in spans if s.name == "pipeline")
    assert root.attributes["composeai.run_id"] == run.id
    assert root.attributes["composeai.status"] == "ok"
    assert root.status.status_code == StatusCode.UNSET
    step = next(s for s in spans if s.attributes.get("composeai.step_key") == "inc#1")
    assert step.attributes["composeai.input"] == '{"args":[1],"kwargs":{}}'
    assert step.attributes["composeai.output"] == "2"
    # Emitted as each ended, with the span's own times.
    for s in spans:
        stored = next(t for t in run.trace.spans if t.span_id == s.attributes["composeai.span_id"])
        assert s.start_time == int(stored.started_at * 1e9)
        assert s.end_time == int(stored.ended_at * 1e9)


@pytest.mark.parametrize("durability", ["step", "batch"])
def test_otel_async_flow_and_batch_durability_emit_each_span_once(exported, durability):
    """The async driver and batch durability commit steps by other paths
    (awaited commits, group commits): every span is still emitted once."""
    import asyncio

    @task
    async def ainc(x: int) -> int:
        await asyncio.sleep(0)
        return x + 1

    @task
    def inc(x: int) -> int:
        return x + 1

    @compose.flow(durability=durability)
    async def chain(x: int) -> int:
        a = await ainc.arun(x)
        b = await ainc.arun(a)
        return await inc.arun(b) + sum(await compose.amap(ainc, [1, 2]))

    run = asyncio.run(chain.arun(1))
    assert run.output == 4 + 5
    plain = chain.run(1)
    assert plain.output == 9
    spans = exported()
    for r in (run, plain):
        ours = [s for s in spans if s.attributes["composeai.run_id"] == r.id]
        check_links(r, ours)
        assert sum(s.attributes["composeai.kind"] == "task" for s in ours) == 7


def test_otel_agent_llm_and_tool_spans_carry_genai_attributes(exported, monkeypatch):
    """Agent, llm and tool spans: the GenAI semantic conventions, usage on
    the llm span (OBS-17's keys), content while capture is on."""

    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        return f"found {q}"

    model = FakeModel(
        [{"tool_calls": [{"name": "lookup", "arguments": {"q": "x"}, "id": "c1"}]}, "done"],
        usage=Usage(input_tokens=11, output_tokens=7, cache_read_tokens=3),
    )
    monkeypatch.setattr(registry, "_FACTORIES", {})
    monkeypatch.setattr(registry, "_CACHE", {})
    registry.register_provider("acme", lambda model_id: model)

    @agent(model="acme/rocket-1", tools=[lookup])
    def helper(q: str) -> str:
        """Be brief."""
        return f"Answer {q}"

    run = helper.run("q")
    assert run.output == "done"
    spans = exported()
    check_links(run, spans)
    llm = [s for s in spans if s.attributes["composeai.kind"] == "llm"]
    assert len(llm) == 2
    for s in llm:
        a = s.attributes
        assert s.kind == SpanKind.CLIENT
        assert s.name == "chat rocket-1"
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.request.model"] == "rocket-1"
        assert a["gen_ai.provider.name"] == "acme"
        assert a["gen_ai.system"] == "acme"
        assert a["gen_ai.usage.input_tokens"] == 11
        assert a["gen_ai.usage.output_tokens"] == 7
        assert a["gen_ai.usage.cache_read.input_tokens"] == 3
        assert a["gen_ai.usage.cache_creation.input_tokens"] == 0
    first, second = sorted(llm, key=lambda s: s.start_time)
    assert json.loads(first.attributes["gen_ai.system_instructions"]) == [
        {"type": "text", "content": "Be brief."}
    ]
    assert json.loads(first.attributes["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "Answer q"}]}
    ]
    assert json.loads(first.attributes["gen_ai.output.messages"]) == [
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "c1", "name": "lookup", "arguments": {"q": "x"}}],
            "finish_reason": "tool_call",
        }
    ]
    assert json.loads(second.attributes["gen_ai.input.messages"])[-1] == {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": "c1", "response": "found x"}],
    }
    assert json.loads(second.attributes["gen_ai.output.messages"]) == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "done"}],
            "finish_reason": "stop",
        }
    ]
    (agent_span,) = [s for s in spans if s.attributes["composeai.kind"] == "agent"]
    assert agent_span.name == "invoke_agent helper"
    assert agent_span.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent_span.attributes["gen_ai.agent.name"] == "helper"
    (tool_span,) = [s for s in spans if s.attributes["composeai.kind"] == "tool"]
    assert tool_span.name == "execute_tool lookup"
    assert tool_span.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool_span.attributes["gen_ai.tool.name"] == "lookup"
    assert json.loads(tool_span.attributes["gen_ai.tool.call.arguments"]) == {"q": "x"}
    assert json.loads(tool_span.attributes["gen_ai.tool.call.result"]) == "found x"
    assert tool_span.parent.span_id == agent_span.context.span_id


def _scripted(adapter: type, reply: str, requests: list) -> type:
    """`adapter` answering from a script instead of its provider's API: the agent is given
    the adapter object itself, not a model string."""

    def complete(self, request):
        requests.append(request)
        return FakeModel([reply], usage=Usage(input_tokens=5, output_tokens=2)).complete(request)

    return type(f"Scripted{adapter.__name__}", (adapter,), {"complete": complete})


@pytest.mark.parametrize(
    ("adapter", "kwargs", "expected"),
    [
        (OpenAIModel, {"model_id": "gpt-5.4"}, "openai"),
        # The OpenAI API at another server is still "openai" (the conventions' best
        # knowledge of the client's API; the model name tells the system apart).
        (OpenAIModel, {"model_id": "gpt-5.4", "base_url": "http://127.0.0.1:9/v1"}, "openai"),
        (
            OpenAICompatibleModel,
            {"model_id": "local-llama", "base_url": "http://127.0.0.1:9/v1"},
            "openai",
        ),
        (AnthropicModel, {"model_id": "claude-sonnet-4-5"}, "anthropic"),
    ],
    ids=["openai", "openai-base-url", "openai-compatible", "anthropic"],
)
def test_otel_llm_span_of_a_model_object_names_its_provider(exported, adapter, kwargs, expected):
    """Issue 26: an agent given a model adapter object (not a `provider/model` string)
    exports LLM spans with `gen_ai.provider.name` and `gen_ai.system` of that adapter,
    while the request's own `provider` stays unset, so response-cache keys (TEST-40) are
    what they were."""
    requests: list = []
    kwargs = dict(kwargs)
    model = _scripted(adapter, "hi there", requests)(kwargs.pop("model_id"), **kwargs)

    @agent(model=model)
    def greeter(name: str) -> str:
        return f"Greet {name}"

    run = greeter.run("Ada")
    assert run.output == "hi there"
    (llm,) = [s for s in exported() if s.attributes["composeai.kind"] == "llm"]
    assert llm.attributes["gen_ai.provider.name"] == expected
    assert llm.attributes["gen_ai.system"] == expected
    assert llm.attributes["gen_ai.request.model"] == model.model_id
    assert llm.name == f"chat {model.model_id}"
    assert [r.provider for r in requests] == [None]


def test_cached_model_object_keeps_its_provider_name():
    """Issue 26: the response cache (`@agent(cache=True)`) wraps a model object without
    hiding its provider from the LLM spans."""
    from composeai.models._cache import CachingModel

    assert CachingModel(AnthropicModel("claude-sonnet-4-5")).provider_name == "anthropic"
    assert not hasattr(CachingModel(FakeModel(["x"])), "provider_name")


def test_otel_agent_inside_a_flow_links_under_the_flow(exported):
    """An agent step inside a flow: agent → llm nested under the flow span."""
    model = FakeModel(["hi"])

    @agent(model=model)
    def greeter(name: str) -> str:
        return f"Greet {name}"

    @compose.flow
    def hello(name: str) -> str:
        return greeter(name)

    run = hello.run("Ada")
    spans = exported()
    check_links(run, spans)
    names = {s.attributes["composeai.kind"]: s for s in spans}
    assert names["agent"].parent.span_id == names["flow"].context.span_id
    assert names["llm"].parent.span_id == names["agent"].context.span_id


def test_otel_obs70_content_only_while_trace_content_allows(exported, monkeypatch):
    """COMPOSE_TRACE_CONTENT=0: no inputs, outputs or messages on any span;
    usage, status and timing still are (OBS-70)."""
    monkeypatch.setenv("COMPOSE_TRACE_CONTENT", "0")

    @task
    def secret(x: str) -> str:
        return x.upper()

    @agent(model=FakeModel(["classified"]))
    def spy(x: str) -> str:
        return x

    @compose.flow
    def mission(x: str) -> str:
        return spy(secret(x))

    run = mission.run("plans")
    assert run.output == "classified"
    spans = exported()
    check_links(run, spans)
    content_keys = {
        "composeai.input",
        "composeai.output",
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
    }
    for s in spans:
        assert not content_keys & set(s.attributes), s.name
        assert not any("plans" in str(v) or "PLANS" in str(v) for v in s.attributes.values())
    (llm,) = [s for s in spans if s.attributes["composeai.kind"] == "llm"]
    assert llm.attributes["gen_ai.usage.output_tokens"] >= 0
    assert llm.attributes["gen_ai.operation.name"] == "chat"


def test_otel_graph_node_spans(exported):
    """Graph nodes (EXT-21) are spans under the graph run's root."""
    wf = Graph(reducers={"notes": "append"})

    @wf.node
    def research(state):
        return {"notes": [f"facts about {state['topic']}"]}

    @wf.node
    def write(state):
        return {"text": "; ".join(state["notes"])}

    wf.start("research").edge("research", "write").edge("write", END)
    result = wf.compile().run({"topic": "solar"})
    assert result.state["text"] == "facts about solar"
    spans = exported()
    nodes = {s.attributes["composeai.node"]: s for s in spans if "composeai.node" in s.attributes}
    assert set(nodes) == {"research", "write"}
    (root,) = [s for s in spans if s.parent is None]
    assert root.attributes["composeai.kind"] == "graph"
    assert root.attributes["composeai.run_id"] == result.run_id
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}
    for name, node in nodes.items():
        assert node.name == name
        assert node.parent.span_id == root.context.span_id


def test_otel_error_span_has_error_status_and_exception_event(exported):
    """OBS-12: an errored span is ERROR with the exception recorded."""

    @task
    def boom(x: int) -> int:
        raise ValueError(f"bad {x}")

    @compose.flow
    def fails(x: int) -> int:
        return boom(x)

    with pytest.raises(ValueError):
        fails.run(3)
    spans = exported()
    errored = [s for s in spans if s.attributes["composeai.status"] == "error"]
    assert {s.name for s in errored} == {"boom", "fails"}
    for s in errored:
        assert s.status.status_code == StatusCode.ERROR
        assert s.status.description == "ValueError: bad 3"
        assert s.attributes["error.type"] == "ValueError"
        (event,) = s.events
        assert event.name == "exception"
        assert event.attributes["exception.type"] == "ValueError"
        assert "Traceback" in event.attributes["exception.stacktrace"]


def test_otel_configure_false_stops_the_export(exported):
    @task
    def one() -> int:
        return 1

    @compose.flow
    def f() -> int:
        return one()

    f.run()
    assert exported()
    _EXPORTER.clear()
    compose.configure(otel=False)
    f.run()
    assert exported() == ()


def test_otel_a_failing_export_never_fails_the_run(exported, monkeypatch):
    """A span that cannot be emitted is a warning (once), never an error
    in the step (as span persistence, OBS-5)."""

    def broken(record):
        raise RuntimeError("collector on fire")

    monkeypatch.setattr(_otel, "_describe", broken)
    monkeypatch.setattr(_otel, "_warned", False)

    @task
    def one() -> int:
        return 1

    @compose.flow
    def f() -> int:
        return one() + one()

    with pytest.warns(RuntimeWarning, match="collector on fire") as warned:
        assert f.run().output == 2
    assert len(warned) == 1
    assert exported() == ()


def test_import_composeai_does_not_import_opentelemetry(tmp_path):
    """The SDK is imported only when the export starts; a run with the
    export off imports none of it."""
    code = (
        "import sys, composeai as c\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'at import'\n"
        "@c.task\n"
        "def t(x): return x\n"
        "@c.flow\n"
        "def f(x): return t(x)\n"
        "assert f.run(1).output == 1\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'after a run'\n"
        "assert 'composeai._otel' not in sys.modules\n"
        "print('clean')\n"
    )
    env = _proc.Sandbox(tmp_path).env()
    env.pop("COMPOSE_OTEL", None)
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "clean"


# -- in fresh processes: COMPOSE_OTEL, and the trace id across a resume ------------------

FLOW = """
import composeai as compose
from composeai import approve, task


@task
def draft(topic: str) -> str:
    return "draft about " + topic


@task
def publish(text: str) -> str:
    return "published " + text


@compose.flow
def story(topic: str) -> str:
    text = draft(topic)
    approve("go", payload={"text": text})
    return publish(text)
"""

SETUP = """
import json
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)


def dump():
    return [
        {
            "name": s.name,
            "trace_id": s.context.trace_id,
            "span_id": s.context.span_id,
            "parent": None if s.parent is None else s.parent.span_id,
            "composeai_span_id": s.attributes["composeai.span_id"],
            "replayed": s.attributes.get("composeai.replayed", False),
            "status": s.attributes["composeai.status"],
        }
        for s in exporter.get_finished_spans()
    ]
"""

START = (
    SETUP
    + """
import storyflow
run = storyflow.story.run("otel")
emit(status=run.status, run_id=run.id, trace_id=run.trace.trace_id, spans=dump())
"""
)

RESUME = (
    SETUP
    + """
import os
import storyflow
from composeai import resume
run = resume(os.environ["RUN_ID"], answers={"go": True})
emit(status=run.status, output=run.output, trace_id=run.trace.trace_id, spans=dump())
"""
)


def test_otel_trace_id_stable_across_a_resume_in_a_fresh_process(tmp_path):
    """COMPOSE_OTEL=1 starts the export without `configure`; the attempt
    that pauses and the one that resumes it (another process) emit spans of
    one OTel trace, the run's, with parent links inside each attempt."""
    sb = _proc.Sandbox(tmp_path)
    sb.write_module("storyflow", FLOW, helper=False)
    a = sb.run(START, COMPOSE_OTEL="1").ok()
    assert a["status"] == "paused"
    b = sb.run(RESUME, COMPOSE_OTEL="1", RUN_ID=a["run_id"]).ok()
    assert b["status"] == "completed"
    assert b["output"] == "published draft about otel"
    assert a["trace_id"] == b["trace_id"]
    expected = _otel._id128(a["trace_id"])
    first, second = a["spans"], b["spans"]
    assert {s["trace_id"] for s in first + second} == {expected}
    assert sorted((s["name"], s["status"]) for s in first) == [
        ("draft", "ok"),
        ("go", "paused"),
        ("story", "paused"),
    ]
    assert sorted((s["name"], s["replayed"]) for s in second) == [
        ("draft", True),
        ("publish", False),
        ("story", False),
    ]
    for spans in (first, second):
        (root,) = [s for s in spans if s["parent"] is None]
        assert all(s["parent"] == root["span_id"] for s in spans if s is not root)
        for s in spans:
            assert s["span_id"] == _otel._span_id(s["composeai_span_id"])


def test_compose_otel_unset_emits_nothing(tmp_path):
    sb = _proc.Sandbox(tmp_path)
    sb.write_module("storyflow", FLOW, helper=False)
    a = sb.run(START).ok()
    assert a["status"] == "paused"
    assert a["spans"] == []


# -- compose export RUN_ID --otlp URL -------------------------------------------------


class _Receiver:
    """A loopback OTLP/HTTP trace receiver: records each POST."""

    def __init__(self, status: int = 200):
        self.requests: list[tuple[str, dict, bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers["Content-Length"])
                body = self.rfile.read(length)
                receiver.requests.append((self.path, dict(self.headers), body))
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()
                reply = trace_service_pb2.ExportTraceServiceResponse()
                self.wfile.write(reply.SerializeToString())

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def compose_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def decode(body: bytes) -> list:
    request = trace_service_pb2.ExportTraceServiceRequest()
    request.ParseFromString(body)
    (resource_spans,) = request.resource_spans
    attrs = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
    assert attrs["service.name"] == "composeai"
    (scope_spans,) = resource_spans.scope_spans
    assert scope_spans.scope.name == "composeai"
    return list(scope_spans.spans)


def attributes(span) -> dict:
    out = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value"))
    return out


def test_compose_export_otlp_sends_the_stored_run(exported):
    """`compose export RUN_ID --otlp URL` POSTs the run's stored spans, one
    OTLP protobuf request to URL/v1/traces, with the ids and attributes the
    live export gave them."""

    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        return "found"

    model = FakeModel(
        [{"tool_calls": [{"name": "lookup", "arguments": {"q": "x"}, "id": "c1"}]}, "done"],
        usage=Usage(input_tokens=5, output_tokens=2),
    )

    @agent(model=model, tools=[lookup])
    def helper(q: str) -> str:
        return q

    @task
    def prep(x: str) -> str:
        return x + "!"

    @compose.flow
    def job(x: str) -> str:
        return helper(prep(x))

    run = job.run("hi")
    live = {s.context.span_id: s for s in exported()}
    with _Receiver() as rx:
        code, out, err = compose_cli("export", run.id[:10], "--otlp", rx.url)
    assert (code, err) == (0, "")
    assert out == f"exported {len(live)} spans of run {run.id} to {rx.url}/v1/traces\n"
    ((path, headers, body),) = rx.requests
    assert path == "/v1/traces"
    assert headers["Content-Type"] == "application/x-protobuf"
    spans = decode(body)
    assert len(spans) == len(live)
    trace_id = _otel._id128(run.trace.trace_id).to_bytes(16, "big")
    for s in spans:
        assert s.trace_id == trace_id
        twin = live[int.from_bytes(s.span_id, "big")]
        assert s.name == twin.name
        assert s.start_time_unix_nano == twin.start_time
        assert s.end_time_unix_nano == twin.end_time
        parent = int.from_bytes(s.parent_span_id, "big") if s.parent_span_id else None
        assert parent == (twin.parent.span_id if twin.parent else None)
    llm = [s for s in spans if attributes(s)["composeai.kind"] == "llm"]
    assert len(llm) == 2
    for s in llm:
        a = attributes(s)
        assert s.kind == s.SPAN_KIND_CLIENT
        assert a["gen_ai.operation.name"] == "chat"
        assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (5, 2)
        assert json.loads(a["gen_ai.input.messages"])[0]["role"] == "user"
        assert a["composeai.run_id"] == run.id


def test_compose_export_otlp_keeps_a_url_path_and_reports_errors(exported):
    @task
    def one() -> int:
        return 1

    @compose.flow
    def f() -> int:
        return one()

    run = f.run()
    with _Receiver() as rx:
        code, out, _ = compose_cli("export", run.id, "--otlp", rx.url + "/custom/traces")
    assert code == 0
    assert [p for p, _, _ in rx.requests] == ["/custom/traces"]
    assert len(decode(rx.requests[0][2])) == 2

    with _Receiver(status=503) as rx:
        code, out, err = compose_cli("export", run.id, "--otlp", rx.url)
    assert (code, out) == (1, "")
    assert err.startswith(f"compose: OTLP endpoint {rx.url}/v1/traces refused the spans: HTTP 503")

    closed = _Receiver()
    url = closed.url
    closed.server.server_close()
    code, out, err = compose_cli("export", run.id, "--otlp", url)
    assert (code, out) == (1, "")
    assert err.startswith(f"compose: cannot send spans to OTLP endpoint {url}/v1/traces: ")

    code, _, err = compose_cli("export", "nope", "--otlp", url)
    assert code == 1 and err.startswith("compose: no run found with id 'nope' -- searched the ")


def test_compose_export_otlp_sends_no_content_while_trace_content_is_off(exported, monkeypatch):
    """OBS-70 holds for the stored export too: content captured earlier is
    not sent while COMPOSE_TRACE_CONTENT=0."""

    @task
    def shout(x: str) -> str:
        return x.upper()

    @compose.flow
    def f(x: str) -> str:
        return shout(x)

    run = f.run("quiet")
    monkeypatch.setenv("COMPOSE_TRACE_CONTENT", "0")
    with _Receiver() as rx:
        code, _, _ = compose_cli("export", run.id, "--otlp", rx.url)
    assert code == 0
    spans = decode(rx.requests[0][2])
    assert len(spans) == 2
    for s in spans:
        a = attributes(s)
        assert "composeai.input" not in a and "composeai.output" not in a
        assert a["composeai.status"] == "ok"


def test_compose_export_needs_cassette_or_otlp():
    with pytest.raises(SystemExit) as exc, contextlib.redirect_stderr(io.StringIO()) as err:
        cli.main(["export", "x"])
    assert exc.value.code == 2
    assert "one of the arguments --cassette --otlp is required" in err.getvalue()
