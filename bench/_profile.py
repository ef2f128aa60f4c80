"""The report shared by the profile scripts (`profile_w1.py`, `profile_w2.py`):
cProfile's per-function costs divided by the number of steps."""

from __future__ import annotations

import argparse
import cProfile
import pstats


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--sort", choices=("tottime", "cumtime"), default="tottime")


def report(profiler: cProfile.Profile, n: int, top: int, sort: str, unit: str) -> float:
    """Prints the `top` functions by `sort`, per `unit` (one of `n`);
    returns the profiled total per unit in microseconds."""
    stats = pstats.Stats(profiler)
    total = stats.total_tt / n * 1e6
    print(f"top {top} by {sort}, per {unit}:")
    print(f"{'calls/step':>10} {'tottime us':>11} {'cumtime us':>11} {'share':>6}  function")
    rows = []
    for (filename, line, func), (_cc, nc, tt, ct, _) in stats.stats.items():
        rows.append((nc / n, tt / n * 1e6, ct / n * 1e6, short(filename, line, func)))
    key = 1 if sort == "tottime" else 2
    rows.sort(key=lambda r: r[key], reverse=True)
    for calls, tt, ct, name in rows[:top]:
        print(f"{calls:>10.2f} {tt:>11.2f} {ct:>11.2f} {tt / total:>6.1%}  {name}")
    return total


def short(filename: str, line: int, func: str) -> str:
    if filename == "~":
        return func
    marker = "composeai/"
    if marker in filename:
        filename = filename[filename.index(marker) :]
    else:
        filename = filename.rsplit("/", 1)[-1]
    return f"{filename}:{line}({func})"
