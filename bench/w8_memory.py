"""W8: peak RSS growth per step of a W1 run and of its resume.

Runs `phase` (run or resume) of a flow of N trivial @task steps in this
process and reports the growth of the process's peak RSS (ru_maxrss) over
the warmed-up baseline, in total and per step. `--phase resume` first runs
the flow in a child process that stops at its last step (the run is left
paused), then resumes it here, replaying every step.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys

from _common import emit, fresh_store, parser


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


FLOW = """
import composeai as compose

def plain_inc(x):
    return x + 1

inc = compose.task(plain_inc)

@compose.flow
def steps(n, pause):
    x = 0
    for _ in range(n):
        x = inc(x)
    if pause:
        compose.ask_human("done", "done?")
    return x

@compose.flow
def warmup():
    return inc(0)
"""


def main() -> None:
    p = parser(__doc__.splitlines()[0], 10_000)
    p.add_argument("--phase", choices=("run", "resume"), default="run")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    n = args.n
    if args.child:
        ns: dict = {}
        exec(FLOW, ns)  # noqa: S102 -- the workload's own source
        run = ns["steps"].run(n, True)
        sys.stdout.write(run.id + "\n")
        return
    directory = fresh_store("w8")
    ns = {}
    exec(FLOW, ns)  # noqa: S102
    import composeai as compose

    ns["warmup"].run()
    if args.phase == "run":
        base = peak_rss_bytes()
        run = ns["steps"].run(n, False)
        grown = peak_rss_bytes() - base
        assert run.status == "completed" and run.output == n, run
    else:
        env = dict(os.environ, COMPOSE_DIR=directory)
        child = subprocess.run(
            [sys.executable, __file__, "--n", str(n), "--child"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        run_id = child.stdout.strip().splitlines()[-1]
        base = peak_rss_bytes()
        run = compose.resume(run_id, answers={"done": "yes"})
        grown = peak_rss_bytes() - base
        assert run.status == "completed" and run.output == n, run
    emit(
        {
            "workload": "W8",
            "phase": args.phase,
            "n": n,
            "peak_rss_growth_mb": round(grown / 1e6, 2),
            "bytes_per_step": round(grown / n, 1),
        }
    )


if __name__ == "__main__":
    main()
