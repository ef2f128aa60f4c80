"""W5: N calls of a FakeModel text agent outside any flow, back to back in
one process. Each call is a standalone durable agent run (its row, its llm
span, its trace persisted). Reports milliseconds per call (the mean: total
time / N) after a warm-up call has opened the store, the median call too
(robust to the preemptions of a busy machine), and checks the traces are in
the store."""

from __future__ import annotations

import sqlite3
import time
from statistics import median

from _common import emit, fresh_store, parser, sync_mode


def main() -> None:
    args = parser(__doc__.splitlines()[0], 500).parse_args()
    n = args.n
    directory = fresh_store("w5")

    from composeai import agent
    from composeai.testing import FakeModel

    model = FakeModel(["hello"] * (n + 1))

    @agent(model=model)
    def greeter(name: str) -> str:
        """Greet the user."""
        return f"Say hello to {name}."

    assert greeter("warm-up") == "hello"
    clock = time.perf_counter
    calls = []
    t0 = clock()
    for i in range(n):
        c0 = clock()
        run = greeter.run(f"user {i}")
        calls.append(clock() - c0)
        assert run.status == "completed" and run.output == "hello"
    elapsed = clock() - t0

    db = sqlite3.connect(f"{directory}/runs.db")
    runs = db.execute("SELECT count(*) FROM runs WHERE kind = 'agent'").fetchone()[0]
    llm_spans = db.execute("SELECT count(*) FROM spans WHERE kind = 'llm'").fetchone()[0]
    db.close()
    assert runs == n + 1 and llm_spans == n + 1, (runs, llm_spans)

    emit(
        {
            "workload": "W5",
            "n": n,
            "sync": sync_mode(),
            "ms_per_call": round(elapsed / n * 1e3, 4),
            "us_per_call": round(elapsed / n * 1e6, 1),
            "median_us_per_call": round(median(calls) * 1e6, 1),
            "total_ms": round(elapsed * 1e3, 2),
        }
    )


if __name__ == "__main__":
    main()
