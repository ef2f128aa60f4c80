"""cProfile of W1 (a flow of N trivial sequential @task steps): the top
Python-side costs per step. Not a workload -- prints a text report.

    python bench/profile_w1.py [--n 2000] [--top 25] [--sort tottime|cumtime]

Times are per journaled step (profiled total / N); cProfile itself inflates
them, so read them as shares, not absolutes. Rust work shows up as the
`_core` methods that call into it (e.g. `settle`); a task call is made in
the core (`_core.TaskCall`), so its cost is the flow body's own time, and
only the Python it calls back (the body, the codec) is listed.
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
    fresh_store("profile")

    import composeai as compose

    @compose.task
    def inc(x):
        return x + 1

    @compose.flow
    def steps(n):
        x = 0
        for _ in range(n):
            x = inc(x)
        return x

    compose.flow(lambda: 0, name="warmup").run()

    t0 = time.perf_counter()
    steps.run(n)
    plain = (time.perf_counter() - t0) / n * 1e6

    profiler = cProfile.Profile()
    profiler.enable()
    steps.run(n)
    profiler.disable()

    total = pstats.Stats(profiler).total_tt / n * 1e6
    print(f"W1 N={n}: {plain:.1f} us/step unprofiled, {total:.1f} us/step under cProfile")
    report(profiler, n, args.top, args.sort, "step")


if __name__ == "__main__":
    main()
