"""W3 (async): `await compose.amap(task, items)` over N items inside an
`async def` flow run with `await flow.arun()` on the caller's loop, each item
a trivial @task step. Reports microseconds per item after a warm-up run."""

from __future__ import annotations

import asyncio
import time

from _common import emit, fresh_store, parser, sync_mode


def main() -> None:
    args = parser(__doc__.splitlines()[0], 1000).parse_args()
    n = args.n
    fresh_store("w3a")

    import composeai as compose

    @compose.task
    def inc(x):
        return x + 1

    @compose.task
    async def ainc(x):
        return x + 1

    @compose.flow
    async def fan(n, use_async):
        return await compose.amap(ainc if use_async else inc, range(n))

    async def measure(use_async: bool) -> float:
        await fan.arun(0, use_async)
        t0 = time.perf_counter()
        run = await fan.arun(n, use_async)
        elapsed = time.perf_counter() - t0
        assert run.status == "completed" and run.output == list(range(1, n + 1)), run.status
        return elapsed

    async_elapsed = asyncio.run(measure(True))
    sync_elapsed = asyncio.run(measure(False))

    emit(
        {
            "workload": "W3-amap",
            "n": n,
            "sync": sync_mode(),
            "us_per_item": round(async_elapsed / n * 1e6, 2),
            "us_per_item_sync_task": round(sync_elapsed / n * 1e6, 2),
        }
    )


if __name__ == "__main__":
    main()
