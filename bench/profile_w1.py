"""cProfile of W1 (a flow of N trivial sequential @task steps): the top
Python-side costs per step. Not a workload -- prints a text report.

    python bench/profile_w1.py [--n 2000] [--top 25] [--sort tottime|cumtime]

Times are per journaled step (profiled total / N); cProfile itself inflates
them, so read them as shares, not absolutes. Rust work shows up as the
`_core` methods that call into it (e.g. `commit`, `reserve`).
"""

from __future__ import annotations

import cProfile
import pstats
import time

from _common import fresh_store, parser


def main() -> None:
    p = parser(__doc__.splitlines()[0], 2000)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--sort", choices=("tottime", "cumtime"), default="tottime")
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

    stats = pstats.Stats(profiler)
    total = stats.total_tt / n * 1e6
    print(f"W1 N={n}: {plain:.1f} us/step unprofiled, {total:.1f} us/step under cProfile")
    print(f"top {args.top} by {args.sort}, per step:")
    print(f"{'calls/step':>10} {'tottime us':>11} {'cumtime us':>11} {'share':>6}  function")
    rows = []
    for (filename, line, func), (cc, nc, tt, ct, _) in stats.stats.items():
        rows.append((nc / n, tt / n * 1e6, ct / n * 1e6, short(filename, line, func)))
    key = 1 if args.sort == "tottime" else 2
    rows.sort(key=lambda r: r[key], reverse=True)
    for calls, tt, ct, name in rows[: args.top]:
        print(f"{calls:>10.2f} {tt:>11.2f} {ct:>11.2f} {tt / total:>6.1%}  {name}")


def short(filename: str, line: int, func: str) -> str:
    if filename == "~":
        return func
    marker = "composeai/"
    if marker in filename:
        filename = filename[filename.index(marker) :]
    else:
        filename = filename.rsplit("/", 1)[-1]
    return f"{filename}:{line}({func})"


if __name__ == "__main__":
    main()
