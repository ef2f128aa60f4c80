"""W3: `compose.map(task, items)` over N items inside a flow, each item a
trivial @task step. Reports microseconds per item (wall time of `flow.run()`
/ N) after a 0-step warm-up run has opened the store. `--max-workers`
passes through to `map` (default: map's own default)."""

from __future__ import annotations

import threading
import time

from _common import emit, fresh_store, parser, sync_mode


def main() -> None:
    p = parser(__doc__.splitlines()[0], 1000)
    p.add_argument("--max-workers", type=int, default=None)
    args = p.parse_args()
    n, max_workers = args.n, args.max_workers
    fresh_store("w3")

    import composeai as compose

    @compose.task
    def inc(x):
        return x + 1

    @compose.flow
    def warmup():
        return 0

    threads = set()

    @compose.task
    def probe(x):
        threads.add(threading.get_ident())
        return x + 1

    @compose.flow
    def fan(n):
        return compose.map(inc, range(n), max_workers=max_workers)

    @compose.flow
    def fan_probe(n):
        return compose.map(probe, range(n), max_workers=max_workers)

    warmup.run()
    t0 = time.perf_counter()
    run = fan.run(n)
    elapsed = time.perf_counter() - t0
    assert run.status == "completed" and run.output == list(range(1, n + 1)), run.status

    # A second, untimed map only to count the worker threads map used.
    fan_probe.run(min(n, 200))

    emit(
        {
            "workload": "W3",
            "n": n,
            "sync": sync_mode(),
            "us_per_item": round(elapsed / n * 1e6, 2),
            "run_ms": round(elapsed * 1e3, 2),
            "max_workers": max_workers,
            "threads_used_200_items": len(threads),
        }
    )


if __name__ == "__main__":
    main()
