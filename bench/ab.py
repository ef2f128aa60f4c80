"""A/B: runs workload scripts against two source trees, interleaved, in
one session, so both sides see the same machine load.

    python bench/ab.py --base ../other-checkout/python [--rounds 5] w2_resume.py w5_agent.py ...
    python bench/ab.py --base ../other-checkout/python "COMPOSE_DURABILITY=batch w1_steps.py --n 5000"

Each round runs every script once per side (the side that goes first
alternates), with PYTHONPATH set to that side's `python/` directory (its
package and its `_core` build); leading `NAME=value` words of a script
set its environment. Prints, per numeric field, the best and the
spread of each side and the ratio of the bests (this tree / base).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

from _common import BENCH_DIR, REPO
from run import base_env, run_json


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the other tree's python/ directory")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("scripts", nargs="+", help="bench scripts, with `--opt=value` arguments")
    args = p.parse_args()
    sides = {"base": os.path.abspath(args.base), "this": os.path.join(REPO, "python")}
    results: dict[tuple[str, str], list[dict]] = {}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for script in args.scripts:
            words = script.split()
            settings = list(itertools.takewhile(lambda w: "=" in w, words))
            argv = words[len(settings) :]
            for side in order:
                env = base_env()
                env.update(w.split("=", 1) for w in settings)
                env["PYTHONPATH"] = sides[side]
                record = run_json(
                    [sys.executable, os.path.join(BENCH_DIR, argv[0]), *argv[1:]], env
                )
                results.setdefault((script, side), []).append(record)
    for script in args.scripts:
        print(f"== {script}  ({args.rounds} rounds, interleaved)")
        base, this = results[(script, "base")], results[(script, "this")]
        for field, value in base[0].items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or field == "n":
                continue
            b = [rec[field] for rec in base if rec.get(field) is not None]
            t = [rec[field] for rec in this if rec.get(field) is not None]
            if not b or not t:
                continue
            ratio = min(t) / min(b) if min(b) else float("nan")
            print(
                f"  {field:32} base {min(b):10.2f} [{min(b):.2f}-{max(b):.2f}]"
                f"  this {min(t):10.2f} [{min(t):.2f}-{max(t):.2f}]  this/base {ratio:5.2f}x"
            )


if __name__ == "__main__":
    main()
