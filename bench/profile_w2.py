"""cProfile of W2's in-process replay (a flow of N trivial @task steps,
paused at `approve("go")`, resumed in the same process): the top Python-side
costs per replayed step. Not a workload -- prints a text report.

    python bench/profile_w2.py [--n 2000] [--top 25] [--sort tottime|cumtime]

Times are per replayed step (profiled total / N); cProfile inflates them, so
read them as shares. Rust work shows up as the `_core` methods calling into it;
a replayed task call is made in the core, so it is the flow body's own time.
"""

from __future__ import annotations

import cProfile
import pstats
import time

from _common import fresh_store, parser
from _profile import add_options, report


def main() -> None:
    p = parser(__doc__.splitlines()[0], 2000)
    add_options(p)
    args = p.parse_args()
    n = args.n
    fresh_store("profile-w2")

    import composeai as compose

    @compose.task
    def inc(x):
        return x + 1

    @compose.flow
    def gated(n):
        x = 0
        for _ in range(n):
            x = inc(x)
        if compose.approve("go"):
            return x
        return -1

    warm = gated.run(10)
    compose.resume(warm.id, answers={"go": True})
    first, second = gated.run(n), gated.run(n)

    t0 = time.perf_counter()
    assert compose.resume(first.id, answers={"go": True}).output == n
    plain = (time.perf_counter() - t0) / n * 1e6

    profiler = cProfile.Profile()
    profiler.enable()
    compose.resume(second.id, answers={"go": True})
    profiler.disable()

    total = pstats.Stats(profiler).total_tt / n * 1e6
    print(f"W2 N={n}: {plain:.2f} us/replayed step unprofiled, {total:.2f} under cProfile")
    report(profiler, n, args.top, args.sort, "replayed step")


if __name__ == "__main__":
    main()
