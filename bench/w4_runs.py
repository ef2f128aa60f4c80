"""W4: N separate runs of a 3-step flow, back to back in one process.
Reports milliseconds per run (total wall time / N) after a warm-up run has
opened the store."""

from __future__ import annotations

import time

from _common import emit, fresh_store, parser, sync_mode


def main() -> None:
    args = parser(__doc__.splitlines()[0], 200).parse_args()
    n = args.n
    fresh_store("w4")

    import composeai as compose

    @compose.task
    def inc(x):
        return x + 1

    @compose.flow
    def three(x):
        return inc(inc(inc(x)))

    assert three.run(0).output == 3  # warm-up: opens the store
    t0 = time.perf_counter()
    for i in range(n):
        run = three.run(i)
        assert run.status == "completed" and run.output == i + 3
    elapsed = time.perf_counter() - t0

    emit(
        {
            "workload": "W4",
            "n": n,
            "sync": sync_mode(),
            "ms_per_run": round(elapsed / n * 1e3, 4),
            "us_per_run": round(elapsed / n * 1e6, 1),
            "total_ms": round(elapsed * 1e3, 2),
        }
    )


if __name__ == "__main__":
    main()
