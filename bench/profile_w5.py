"""cProfile of W5 (N standalone FakeModel text agent calls): the top
Python-side costs per call. Not a workload -- prints a text report.

    python bench/profile_w5.py [--n 2000] [--top 25] [--sort tottime|cumtime]

Times are per agent call (profiled total / N); cProfile itself inflates
them, so read them as shares, not absolutes. The settle commit shows up as
the `_core` method that makes it.
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

    from composeai import agent
    from composeai.testing import FakeModel

    model = FakeModel(["hello"] * (2 * n + 1))

    @agent(model=model)
    def greeter(name: str) -> str:
        """Greet the user."""
        return f"Say hello to {name}."

    greeter("warm-up")

    t0 = time.perf_counter()
    for i in range(n):
        greeter.run(f"user {i}")
    plain = (time.perf_counter() - t0) / n * 1e6

    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(n):
        greeter.run(f"user {i}")
    profiler.disable()

    total = pstats.Stats(profiler).total_tt / n * 1e6
    print(f"W5 N={n}: {plain:.1f} us/call unprofiled, {total:.1f} us/call under cProfile")
    report(profiler, n, args.top, args.sort, "call")


if __name__ == "__main__":
    main()
