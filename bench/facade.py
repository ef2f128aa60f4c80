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

    record = {
        "workload": "facade",
        "n": n,
        "sync": sync_mode(),
        "us_per_call_sync_body": round(timings[False], 2),
        "us_per_call_async_body": round(timings[True], 2),
        "us_facade_overhead": round(timings[True] - timings[False], 2),
    }
    # The bridge alone, without the step around it (same trivial coroutine),
    # interleaved: the background-loop hop against the calling thread's loop.
    from composeai import _engine, _runtime

    async def one():
        return 1

    bridges = {"background_loop": lambda: _runtime.run_sync(one)}
    if hasattr(_runtime, "run_here"):
        bridges["own_loop"] = lambda: _runtime.run_here(one, _engine.ASYNC_DRIVER)
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, drive in bridges.items():
            t0 = time.perf_counter()
            for _ in range(n):
                drive()
            per_call = (time.perf_counter() - t0) / n * 1e6
            best[name] = min(best.get(name, per_call), per_call)
    for name, value in best.items():
        record[f"us_bridge_{name}"] = round(value, 2)
    emit(record)


if __name__ == "__main__":
    main()
