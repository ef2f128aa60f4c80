"""W1: a flow of N trivial sequential @task steps.

Reports microseconds per journaled step (wall time of `flow.run()` / N) and,
for reference, microseconds per call of the same loop with the undecorated
function. The store is opened by a 0-step warm-up run first (its time is
reported separately as `warmup_ms`), so `us_per_step` is the steady state.
Honours COMPOSE_SYNC (the store reads it when it opens).
"""

from __future__ import annotations

import time

from _common import emit, fresh_store, parser, sync_mode


def main() -> None:
    args = parser(__doc__.splitlines()[0], 2000).parse_args()
    n = args.n
    fresh_store("w1")

    import composeai as compose

    def plain_inc(x):
        return x + 1

    inc = compose.task(plain_inc)

    @compose.flow
    def warmup():
        return 0

    @compose.flow
    def steps(n):
        x = 0
        for _ in range(n):
            x = inc(x)
        return x

    def undecorated(n):
        x = 0
        for _ in range(n):
            x = plain_inc(x)
        return x

    t0 = time.perf_counter()
    warmup.run()
    warmup_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    run = steps.run(n)
    elapsed = time.perf_counter() - t0
    assert run.status == "completed" and run.output == n, run

    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        assert undecorated(n) == n
        best = min(best, time.perf_counter() - t0)

    emit(
        {
            "workload": "W1",
            "n": n,
            "sync": sync_mode(),
            "us_per_step": round(elapsed / n * 1e6, 2),
            "us_per_call_undecorated": round(best / n * 1e6, 4),
            "run_ms": round(elapsed * 1e3, 2),
            "warmup_ms": round(warmup_s * 1e3, 2),
        }
    )


if __name__ == "__main__":
    main()
