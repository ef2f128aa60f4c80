"""Spans, traces and their rendering (OBS-10 … OBS-25)."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from composeai.messages import Usage
from composeai.tracing import (
    ErrorInfo,
    Span,
    Trace,
    render_trace,
    render_trace_mermaid,
)

T0 = 1_700_000_000.0

EXAMPLE = """\
trace 01TRACEEXAMPLE — paused — [≥$0.0027 · 1.5k tok · 1.2s]
└─ ▶ triage [≥$0.0027 · 1.5k tok · 1.2s] ⏸ paused
   ├─ ◆ classifier [≥$0.0027 · 1.5k tok · 900ms]
   │  ├─ ▸ anthropic/claude-haiku-4-5 [$0.0027 · 1.5k tok · 400ms]
   │  ├─ ⚙ lookup_ticket [50ms]
   │  └─ ▸ anthropic/claude-haiku-4-5 [40 tok · 450ms] ✗ ProviderError: overloaded
   ├─ ⇉ map(tag) [100ms]
   │  └─ • tag[0] [50ms] (replayed)
   └─ ⏸ escalate [0ms] ⏸ paused"""


def span(
    span_id: str,
    parent: str | None,
    kind: str,
    name: str,
    start_ms: float = 0.0,
    end_ms: float | None = 0.0,
    *,
    trace_id: str = "T",
    status: str = "ok",
    **kw,
) -> Span:
    return Span(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent,
        kind=kind,
        name=name,
        started_at=T0 + start_ms / 1000,
        ended_at=None if end_ms is None else T0 + end_ms / 1000,
        status=status,
        **kw,
    )


def example_trace() -> Trace:
    tid = "01TRACEEXAMPLE"
    model = "anthropic/claude-haiku-4-5"
    spans = [
        span("f", None, "flow", "triage", 0, 1200, trace_id=tid, status="paused"),
        span("a", "f", "agent", "classifier", 0, 900, trace_id=tid),
        span(
            "l1",
            "a",
            "llm",
            model,
            0,
            400,
            trace_id=tid,
            usage=Usage(input_tokens=1200, output_tokens=260, cost_usd=0.0027),
            attributes={"provider": "anthropic", "model": "claude-haiku-4-5"},
        ),
        span("t", "a", "tool", "lookup_ticket", 400, 450, trace_id=tid),
        span(
            "l2",
            "a",
            "llm",
            model,
            450,
            900,
            trace_id=tid,
            status="error",
            error=ErrorInfo("ProviderError", "overloaded\nplease retry", "Traceback ..."),
            usage=Usage(input_tokens=40, cost_usd=None, cost_complete=False),
        ),
        span("g", "f", "aggregate", "map(tag)", 900, 1000, trace_id=tid),
        span("x", "g", "task", "tag[0]", 900, 950, trace_id=tid, replayed=True),
        span("p", "f", "pause", "escalate", 1000, 1000, trace_id=tid, status="paused"),
    ]
    return Trace(tid, spans)


# -- OBS-20 … OBS-24 tree ----------------------------------------------------


def test_obs24_example_tree():
    trace = example_trace()
    assert render_trace(trace, color=False) == EXAMPLE


def test_obs23_example_tree_colour():
    out = render_trace(example_trace(), color=True)
    expected = (
        EXAMPLE.replace(
            " ✗ ProviderError: overloaded", "\x1b[31m ✗ ProviderError: overloaded\x1b[0m"
        )
        .replace(" ⏸ paused", "\x1b[33m ⏸ paused\x1b[0m")
        .replace(" (replayed)", "\x1b[2m (replayed)\x1b[0m")
    )
    assert out == expected
    assert out.splitlines()[0] == EXAMPLE.splitlines()[0]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_obs23_color_none_follows_tty_and_no_color(monkeypatch):
    trace = example_trace()
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr(sys, "stdout", _Tty())
    assert "\x1b[" in render_trace(trace)
    monkeypatch.setenv("NO_COLOR", "")  # present, even if empty, disables colour
    assert render_trace(trace) == EXAMPLE
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert render_trace(trace) == EXAMPLE


def test_obs23_cancelled_and_error_decorations():
    s = span(
        "a",
        None,
        "task",
        "t",
        0,
        1,
        status="error",
        error=ErrorInfo("ValueError", "", ""),
        replayed=True,
    )
    assert render_trace(Trace("T", [s]), color=False) == (
        "trace T — error — [1ms]\n└─ • t [1ms] ✗ ValueError:  (replayed)"
    )
    c = span("b", None, "tool", "t", 0, 2, status="cancelled")
    assert render_trace(Trace("T", [c]), color=True) == (
        "trace T — cancelled — [2ms]\n└─ ⚙ t [2ms]\x1b[33m ⊘ cancelled\x1b[0m"
    )


def test_obs21_running_root_has_no_duration():
    trace = Trace(
        "T",
        [
            span("r", None, "pipe", "pipe(a → b)", 0, None, status="running"),
            span("a", "r", "task", "a", 0, 12),
        ],
    )
    assert render_trace(trace, color=False) == (
        "trace T — running\n└─ → pipe(a → b)\n   └─ • a [12ms]"
    )
    assert render_trace(Trace("E"), color=False) == "trace E — ok"


def test_obs22_header_shows_the_resumed_runs_current_status():
    """Both attempts' roots are shown; the header tells the latest attempt's
    status (0.11.0 kept the worst one, a defect the spec asks us to fix)."""
    trace = Trace(
        "T",
        [
            span("r1", None, "flow", "f", 0, 100, status="paused"),
            span("p", "r1", "pause", "ask", 50, 100, status="paused"),
            span("r2", None, "flow", "f", 5000, 5250),
            span("k", "r2", "task", "k", 5000, 5100, replayed=True),
        ],
    )
    assert trace.status == "paused"
    assert render_trace(trace, color=False) == (
        "trace T — ok — [5.2s]\n"
        "├─ ▶ f [100ms] ⏸ paused\n"
        "│  └─ ⏸ ask [50ms] ⏸ paused\n"
        "└─ ▶ f [250ms]\n"
        "   └─ • k [100ms] (replayed)"
    )


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0ms"),
        (0.0005, "0ms"),  # round(0.5) == 0
        (0.0015, "2ms"),
        (0.0025, "2ms"),  # banker's rounding
        (0.0035, "4ms"),
        (0.9994, "999ms"),
        (0.9995, "1000ms"),  # still below 1000 ms before rounding
        (1.0, "1.0s"),
        (1.15, "1.1s"),  # 1.15 is 1.1499999…
        (1.25, "1.2s"),  # exact tie, to even
        (1.35, "1.4s"),
        (61.0, "61.0s"),
    ],
)
def test_obs22_duration_formatting(seconds, text):
    s = Span(
        trace_id="T",
        span_id="a",
        kind="task",
        name="t",
        started_at=0.0,
        ended_at=seconds,
        status="ok",
    )
    assert render_trace(Trace("T", [s]), color=False) == f"trace T — ok — [{text}]\n└─ • t [{text}]"


@pytest.mark.parametrize(
    ("usage", "text"),
    [
        (Usage(), ""),
        (Usage(cost_usd=0.0), "$0.0000"),
        (Usage(cost_usd=0.00005), "$0.0001"),
        (Usage(cost_usd=0.00025, cost_complete=False), "≥$0.0003"),
        (Usage(cost_usd=0.12345), "$0.1235"),
        (Usage(input_tokens=999), "999 tok"),
        (Usage(input_tokens=500, output_tokens=500), "1.0k tok"),
        (Usage(input_tokens=1250), "1.2k tok"),
        (Usage(input_tokens=999_999), "1000.0k tok"),
        (Usage(input_tokens=2_250_000), "2.2M tok"),
        (Usage(cache_read_tokens=5000), ""),  # only input + output count
        (Usage(input_tokens=3, cost_usd=None, cost_complete=False), "3 tok"),
    ],
)
def test_obs22_usage_segments(usage, text):
    s = Span(
        trace_id="T", span_id="a", kind="llm", name="m", started_at=0.0, usage=usage
    )  # unfinished: no duration segment
    line = render_trace(Trace("T", [s]), color=False).splitlines()[1]
    assert line == ("└─ ▸ m" + (f" [{text}]" if text else ""))


def test_obs22_python_formatting_agrees():
    # The Rust renderer must agree with Python's format()/round() on ties.
    for ms in (0.5, 1.5, 2.5, 3.5, 4.5, 998.5, 999.5):
        s = Span(
            trace_id="T", span_id="a", kind="task", name="t", started_at=0.0, ended_at=ms / 1000
        )
        expected = f"{round((ms / 1000 - 0.0) * 1000)}ms"
        assert render_trace(Trace("T", [s]), color=False).endswith(f"[{expected}]")
    for cost in (0.00005, 0.00015, 0.00025, 0.00035, 1.00005, 0.0027):
        s = Span(trace_id="T", span_id="a", kind="llm", name="m", usage=Usage(cost_usd=cost))
        assert render_trace(Trace("T", [s]), color=False).endswith(f"[${cost:.4f}]")


# -- OBS-25 mermaid ----------------------------------------------------------


MERMAID = """\
flowchart TD
s0["triage [flow]"]
s1["classifier [agent]"]
s2["anthropic/claude-haiku-4-5 [llm]"]
s3["lookup_ticket [tool]"]
s4["anthropic/claude-haiku-4-5 [llm]"]
s5["map(tag) [aggregate]"]
s6["tag[0] [task]"]
s7["escalate [pause]"]
s0 --> s1
s1 --> s2
s1 --> s3
s1 --> s4
s0 --> s5
s5 --> s6
s0 --> s7"""


def test_obs25_mermaid_example():
    assert render_trace_mermaid(example_trace()) == MERMAID


def test_obs25_mermaid_escaping():
    s = span("a", None, "task", 'say "#1"')
    assert (
        render_trace_mermaid(Trace("T", [s])) == 'flowchart TD\ns0["say #quot;#35;1#quot; [task]"]'
    )
    # `#` is escaped first, so the `#` of `#quot;` is not escaped again.
    s = span("a", None, "task", '"')
    assert render_trace_mermaid(Trace("T", [s])).endswith('s0["#quot; [task]"]')
    assert render_trace_mermaid(Trace("T")) == "flowchart TD"


# -- OBS-15 / OBS-16 Trace ---------------------------------------------------


def test_obs15_roots_and_children():
    trace = example_trace()
    assert [s.span_id for s in trace.roots()] == ["f"]
    assert [s.span_id for s in trace.children_of("a")] == ["l1", "t", "l2"]
    assert trace.children_of("nope") == []
    orphan = span("o", "missing", "task", "orphan")
    trace.add(orphan)
    assert [s.span_id for s in trace.roots()] == ["f", "o"]


def test_obs15_rollup_and_total_usage():
    trace = example_trace()
    by_id = {s.span_id: s for s in trace.spans}
    agent = trace.rollup_usage(by_id["a"])
    assert isinstance(agent, Usage)
    assert (agent.input_tokens, agent.output_tokens) == (1240, 260)
    assert agent.cost_usd == pytest.approx(0.0027)
    assert agent.cost_complete is False
    assert trace.rollup_usage(by_id["l1"]) == by_id["l1"].usage
    assert trace.rollup_usage(by_id["t"]) == Usage()
    assert trace.total_usage() == trace.rollup_usage(by_id["f"])
    assert Trace("E").total_usage() == Usage()


def test_obs16_status_precedence():
    def status(root: str, child: str) -> str:
        return Trace(
            "T",
            [span("r", None, "flow", "f", status=root), span("c", "r", "task", "t", status=child)],
        ).status

    assert status("ok", "ok") == "ok"
    assert status("running", "ok") == "running"
    assert status("ok", "running") == "ok"  # only roots count for running
    assert status("ok", "error") == "ok"  # only roots count for error
    assert status("running", "paused") == "paused"
    assert status("ok", "cancelled") == "cancelled"
    assert status("paused", "cancelled") == "cancelled"
    assert status("error", "cancelled") == "error"
    assert Trace("E").status == "ok"
    assert example_trace().status == "paused"


def test_obs15_print(monkeypatch):
    trace = example_trace()
    buf = io.StringIO()
    trace.print(file=buf)
    assert buf.getvalue() == EXAMPLE + "\n"
    buf = io.StringIO()
    trace.print(file=buf, color=True)
    assert buf.getvalue() == render_trace(trace, color=True) + "\n"
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    trace.print(color=False)
    assert out.getvalue() == EXAMPLE + "\n"


# -- OBS-17 to_dict ----------------------------------------------------------

SPAN_KEYS = [
    "span_id",
    "trace_id",
    "parent_span_id",
    "kind",
    "name",
    "started_at",
    "ended_at",
    "status",
    "error",
    "replayed",
    "input",
    "output",
    "attributes",
    "cost_usd",
]


def test_obs17_to_dict_shape():
    trace = example_trace()
    d = trace.to_dict()
    assert list(d) == ["trace_id", "spans"]
    assert d["trace_id"] == "01TRACEEXAMPLE"
    assert [s["span_id"] for s in d["spans"]] == [s.span_id for s in trace.spans]
    for s in d["spans"]:
        assert list(s) == SPAN_KEYS
    llm1, llm2 = d["spans"][2], d["spans"][4]
    assert llm1["cost_usd"] == 0.0027
    assert llm1["attributes"] == {
        "provider": "anthropic",
        "model": "claude-haiku-4-5",
        "gen_ai.usage.input_tokens": 1200,
        "gen_ai.usage.output_tokens": 260,
        "gen_ai.usage.cache_read.input_tokens": 0,
        "gen_ai.usage.cache_creation.input_tokens": 0,
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "claude-haiku-4-5",
    }
    assert llm2["error"] == {
        "type": "ProviderError",
        "message": "overloaded\nplease retry",
        "stacktrace": "Traceback ...",
    }
    assert llm2["cost_usd"] is None
    assert "gen_ai.provider.name" not in llm2["attributes"]
    root = d["spans"][0]
    assert root["error"] is None and root["cost_usd"] is None and root["attributes"] == {}
    assert root["started_at"] == trace.spans[0].started_at
    assert d["spans"][6]["replayed"] is True
    assert json.loads(trace.to_json()) == d
    assert trace.to_json(indent=2) == json.dumps(d, indent=2)


def test_obs17_string_truncation():
    trace = Trace("T")
    long = "a" * 4096 + "b" * 1000 + "c" * 4096
    trace.add(span("a", None, "task", "t", input=long, output="x" * 8192))
    s = trace.to_dict()["spans"][0]
    assert s["input"] == "a" * 4096 + "…[1000 chars truncated]…" + "c" * 4096
    assert s["output"] == "x" * 8192  # exactly 8192 is kept
    assert s["_truncated"] is True
    trace = Trace("T", [span("a", None, "task", "t", input="short", output=None)])
    s = trace.to_dict()["spans"][0]
    assert (s["input"], s["output"]) == ("short", None)
    assert "_truncated" not in s


def test_obs17_nested_payload_truncation_and_repr_fallback():
    pytest.importorskip("composeai._codec")

    class Opaque:
        def __repr__(self) -> str:
            return "<opaque>"

    big = "z" * 9000
    trace = Trace(
        "T",
        [
            span(
                "a",
                None,
                "task",
                "t",
                input={"text": big, "items": [1, big]},
                output=Opaque(),
                attributes={"step_key": "t#1", "retries": [{"type": "E", "message": "m"}]},
            )
        ],
    )
    s = trace.to_dict()["spans"][0]
    cut = "z" * 4096 + "…[808 chars truncated]…" + "z" * 4096
    assert s["input"] == {"text": cut, "items": [1, cut]}
    assert s["output"] == "<opaque>"
    assert s["attributes"] == {"step_key": "t#1", "retries": [{"type": "E", "message": "m"}]}
    assert s["_truncated"] is True
    json.loads(trace.to_json())


def test_obs10_import_does_not_load_pydantic():
    code = "import sys, composeai.tracing; print('pydantic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
