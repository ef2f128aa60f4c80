"""Sync facade overhead: N calls, inside a flow, of a task whose body is
`async def` (driven on the calling thread's own event loop) versus
the same task with a sync body. Reports microseconds per call of each and the
difference."""

from __future__ import annotations

import time

from _common import emit, fresh_store, parser, sync_mode


def main() -> None:
    p = parser(__doc__.splitlines()[0], 2000)
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    args = p.parse_args()
    n = args.n
    fresh_store("facade")

    import composeai as compose

    @compose.task
    def inc(x):
        return x + 1

    @compose.task
    async def ainc(x):
        return x + 1

    @compose.flow
    def loop(n, use_async):
        step = ainc if use_async else inc
        x = 0
        for _ in range(n):
            x = step(x)
        return x

    loop.run(1, True)  # makes the thread's event loop and opens the store
    # Alternating rounds, best of each: the two bodies see the same load.
    timings: dict[bool, float] = {}
    for _ in range(args.rounds):
        for use_async in (False, True):
            t0 = time.perf_counter()
            assert loop.run(n, use_async).output == n
            per_call = (time.perf_counter() - t0) / n * 1e6
            timings[use_async] = min(timings.get(use_async, per_call), per_call)

    emit(
        {
            "workload": "facade",
            "n": n,
            "sync": sync_mode(),
            "us_per_call_sync_body": round(timings[False], 2),
            "us_per_call_async_body": round(timings[True], 2),
            "us_facade_overhead": round(timings[True] - timings[False], 2),
        }
    )


if __name__ == "__main__":
    main()
