"""OTel: the added cost per span of the OpenTelemetry export (issue 26).

In one process, alternating rounds of W1 (a flow of N trivial steps, N+1
spans) and W5 (N standalone FakeModel agent calls, 2 spans each) with the
export off and on (`composeai.configure(otel=...)`). The export goes through
an SDK `TracerProvider` with a `SimpleSpanProcessor` whose exporter drops
the spans, so the figure is composeai's conversion plus the SDK's own span
handling, not any network. Reports the best round of each side and the added
microseconds per span: (on - off) / spans.
"""

from __future__ import annotations

import time

from _common import emit, fresh_store, parser


def main() -> None:
    p = parser(__doc__.splitlines()[0], 2000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    n = args.n
    fresh_store("otel")

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Drop(SpanExporter):
        def __init__(self) -> None:
            self.spans = 0

        def export(self, spans):
            self.spans += len(spans)
            return SpanExportResult.SUCCESS

    exporter = Drop()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    import composeai as compose
    from composeai.testing import FakeModel

    inc = compose.task(lambda x: x + 1)
    agent_calls = max(1, n // 10)
    model = FakeModel(["hello"] * (2 * args.rounds * (agent_calls + 1) + 1))

    @compose.flow
    def steps(n):
        x = 0
        for _ in range(n):
            x = inc(x)
        return x

    @compose.agent(model=model)
    def greeter(name: str) -> str:
        """Greet the user."""
        return f"Say hello to {name}."

    def w1() -> float:
        t0 = time.perf_counter()
        assert steps.run(n).output == n
        return time.perf_counter() - t0

    def w5() -> float:
        t0 = time.perf_counter()
        for i in range(agent_calls):
            assert greeter(f"user {i}") == "hello"
        return time.perf_counter() - t0

    steps.run(0)
    greeter("warm-up")
    best: dict[tuple[str, bool], float] = {}
    for r in range(args.rounds):
        for on in (r % 2 == 0, r % 2 != 0):
            compose.configure(otel=on)
            for name, workload in (("w1", w1), ("w5", w5)):
                before = exporter.spans
                elapsed = workload()
                assert (exporter.spans > before) == on
                key = (name, on)
                best[key] = min(best.get(key, float("inf")), elapsed)
    compose.configure(otel=False)

    w1_spans = n + 1
    w5_spans = 2 * agent_calls
    emit(
        {
            "workload": "OTel",
            "n": n,
            "w5_calls": agent_calls,
            "w1_us_per_step_off": round(best[("w1", False)] / n * 1e6, 2),
            "w1_us_per_step_on": round(best[("w1", True)] / n * 1e6, 2),
            "w1_added_us_per_span": round(
                (best[("w1", True)] - best[("w1", False)]) / w1_spans * 1e6, 2
            ),
            "w5_us_per_call_off": round(best[("w5", False)] / agent_calls * 1e6, 1),
            "w5_us_per_call_on": round(best[("w5", True)] / agent_calls * 1e6, 1),
            "w5_added_us_per_span": round(
                (best[("w5", True)] - best[("w5", False)]) / w5_spans * 1e6, 2
            ),
        }
    )


if __name__ == "__main__":
    main()
