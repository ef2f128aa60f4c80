"""S1: schedule fire lateness on PostgreSQL with three `compose worker`s (OPS-11).

Starts its own throwaway PostgreSQL cluster (fsync on). A `* * * * *` schedule
is declared, then three `compose worker` processes serve it for `--ticks`
ticks. To get many ticks in a short run, every process's engine clock follows
one shared timeline `--scale` times faster than real time (a minute tick
every 60 / scale seconds), set from one real-time origin through the testing
clock hook; the workers wake for a tick on their own timers, as in production.

Lateness of a tick is measured in real time: the wall time at which its run's
row was created minus the real time the tick stands for (origin + (tick -
engine origin) / scale). Each process sets its engine clock to the tick when
the tick's real time comes, so the lateness is the worker's own: waking,
reading the store, creating the run. Also checked: every tick has exactly one run.
Prints one JSON line: p50/p99/max lateness in ms (target p99 <= 1,000 ms).
"""

from __future__ import annotations

import argparse
import calendar
import os
import signal
import subprocess
import sys
import time

from _common import REPO, emit, temp_dir

sys.path.insert(0, os.path.join(REPO, "tests"))

import itertools

import _pg
import _proc

FLOWS = """
import math, os, threading, time

import composeai as compose
from composeai import _core

_ORIGIN = float(os.environ["CLOCK_ORIGIN"])
_FAKE = float(os.environ["CLOCK_FAKE"])
_SCALE = float(os.environ["CLOCK_SCALE"])


def _now():
    return _FAKE + (time.time() - _ORIGIN) * _SCALE


def _follow():
    # The engine clock is set as each engine minute begins (a worker wakes on
    # the set, as on its timer); between ticks it stands still.
    while True:
        tick = math.floor(_now() / 60.0 + 1.0) * 60.0
        time.sleep(max(0.0, _ORIGIN + (tick - _FAKE) / _SCALE - time.time()))
        _core.clock_set_fake(tick)


_core.clock_set_fake(_now())
threading.Thread(target=_follow, daemon=True).start()


@compose.flow
def tick() -> str:
    return "ok"
"""


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=30)
    parser.add_argument("--scale", type=float, default=60.0)
    args = parser.parse_args()
    bindir = _pg.find_bindir()
    if bindir is None:
        emit({"workload": "S1", "skipped": "PostgreSQL is not installed"})
        return
    root = temp_dir("s1")
    with open(os.path.join(root, "ticking.py"), "w") as f:
        f.write(FLOWS)
    cluster = _pg.Cluster(bindir, durable=True).start()
    try:
        url = cluster.url("s1")
        origin = time.time()
        fake = 1_900_000_000.0  # a whole minute: ticks fall on engine minutes
        env = dict(os.environ)
        env.update(
            COMPOSE_STORE=url,
            COMPOSE_DIR=os.path.join(root, "state"),
            PYTHONPATH=os.pathsep.join([root, env.get("PYTHONPATH", "")]),
            CLOCK_ORIGIN=repr(origin),
            CLOCK_FAKE=repr(fake),
            CLOCK_SCALE=repr(args.scale),
        )
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import ticking, composeai as c; c.schedule(ticking.tick, '* * * * *')",
            ],
            env=env,
            check=True,
            cwd=root,
        )
        workers = [
            subprocess.Popen(
                [sys.executable, "-m", "composeai.cli", "worker", "--import", "ticking"],
                env=env,
                cwd=root,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for _ in range(3)
        ]
        time.sleep(args.ticks * 60.0 / args.scale + 1.0)
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(timeout=60)
        rows = _proc._pg_read(
            url,
            "SELECT run_id, created_at FROM runs WHERE run_id LIKE 'sched:tick:%' ORDER BY run_id",
            (),
            None,
        )
    finally:
        cluster.stop()
    late = []
    ticks = set()
    for run_id, created_at in rows:
        stamp = run_id[len("sched:tick:") :]
        tick = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))
        ticks.add(tick)
        real_tick = origin + (tick - fake) / args.scale
        late.append((float(created_at) - real_tick) * 1000.0)
    steps = sorted(ticks)
    gaps = sum(1 for a, b in itertools.pairwise(steps) if b - a != 60.0)
    emit(
        {
            "workload": "S1",
            "workers": 3,
            "ticks": len(rows),
            "one_run_per_tick": len(ticks) == len(rows) and gaps == 0,
            "lateness_p50_ms": round(_percentile(late, 0.5), 1) if late else None,
            "lateness_p99_ms": round(_percentile(late, 0.99), 1) if late else None,
            "lateness_max_ms": round(max(late), 1) if late else None,
        }
    )


if __name__ == "__main__":
    main()
