"""W2: resuming a flow of N steps paused at `approve("go")`.

* in-process: run once (pauses after N steps), then time
  `resume(run_id, answers={"go": True})` in the same process -- microseconds
  per replayed step (resume wall time / N);
* fresh process: a subprocess imports the flow module (a real file in the
  temp dir, put on sys.path) and resumes another paused run of it -- the
  whole-process wall time (median of --repeat runs), with its own
  import/resume split. The paused runs are made by a process that has
  exited, and no other process has the store open while they resume, as
  when a run is continued later from a new process;
* `import composeai` alone in a fresh interpreter (median of --repeat runs),
  next to a bare `python -c pass` for the interpreter's own start-up.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

from _common import emit, fresh_store, parser

FLOW_MODULE = """\
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
"""

PAUSE_SCRIPT = """\
import sys
sys.path.insert(0, sys.argv[1])
import bench_w2_flow
for _ in range(int(sys.argv[3])):
    run = bench_w2_flow.gated.run(int(sys.argv[2]))
    assert run.status == "paused", run
    print(run.id)
"""

RESUME_SCRIPT = """\
import sys, time
t0 = time.perf_counter()
import composeai
t1 = time.perf_counter()
sys.path.insert(0, sys.argv[1])
import bench_w2_flow
t2 = time.perf_counter()
run = composeai.resume(sys.argv[2], answers={"go": True})
t3 = time.perf_counter()
assert run.status == "completed" and run.output == int(sys.argv[3]), run
print(f"{(t1 - t0) * 1e3:.3f} {(t2 - t1) * 1e3:.3f} {(t3 - t2) * 1e3:.3f}")
"""

IMPORT_SCRIPT = (
    "import time; t0 = time.perf_counter(); import composeai; "
    "print(f'{(time.perf_counter() - t0) * 1e3:.3f}')"
)


def timed_process(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{argv!r} failed:\n{proc.stderr}")
    return wall * 1e3, proc.stdout.strip()


def main() -> None:
    p = parser(__doc__.splitlines()[0], 1000)
    p.add_argument("--repeat", type=int, default=5, help="fresh-process repetitions (default 5)")
    args = p.parse_args()
    n, repeat = args.n, args.repeat
    directory = fresh_store("w2")
    with open(os.path.join(directory, "bench_w2_flow.py"), "w") as f:
        f.write(FLOW_MODULE)
    script = os.path.join(directory, "resume_w2.py")
    with open(script, "w") as f:
        f.write(RESUME_SCRIPT)
    pause_script = os.path.join(directory, "pause_w2.py")
    with open(pause_script, "w") as f:
        f.write(PAUSE_SCRIPT)

    env = dict(os.environ)
    # Paused runs for the fresh processes to resume, one each, made by a
    # process that has exited; this one opens the store only afterwards.
    _, out = timed_process([sys.executable, pause_script, directory, str(n), str(repeat)], env)
    fresh_ids = out.split()
    walls, splits = [], []
    for run_id in fresh_ids:
        wall, out = timed_process([sys.executable, script, directory, run_id, str(n)], env)
        walls.append(wall)
        splits.append([float(v) for v in out.split()])

    sys.path.insert(0, directory)

    import bench_w2_flow

    import composeai as compose

    t0 = time.perf_counter()
    first = bench_w2_flow.gated.run(n)
    first_run_s = time.perf_counter() - t0
    assert first.status == "paused" and first.pending.id == "go", first

    # In-process resumes: the first pays one-time costs (lazy imports of the
    # resume path); the figure is the best of `repeat` (steady state).
    in_process = [first.id]
    for _ in range(repeat - 1):
        in_process.append(bench_w2_flow.gated.run(n).id)
    timings = []
    for run_id in in_process:
        t0 = time.perf_counter()
        resumed = compose.resume(run_id, answers={"go": True})
        timings.append(time.perf_counter() - t0)
        assert resumed.status == "completed" and resumed.output == n, resumed
    resume_s = min(timings)
    first_resume_s = timings[0]

    imports, bare = [], []
    for _ in range(repeat):
        _, out = timed_process([sys.executable, "-c", IMPORT_SCRIPT], env)
        imports.append(float(out))
        wall, _ = timed_process([sys.executable, "-c", "pass"], env)
        bare.append(wall)

    def med(values: list[float]) -> float:
        return round(statistics.median(values), 2)

    emit(
        {
            "workload": "W2",
            "n": n,
            "us_per_replayed_step": round(resume_s / n * 1e6, 2),
            "resume_ms_in_process": round(resume_s * 1e3, 2),
            "first_resume_ms_in_process": round(first_resume_s * 1e3, 2),
            "first_run_ms": round(first_run_s * 1e3, 2),
            "fresh_process_ms": med(walls),
            "fresh_process_ms_min": round(min(walls), 2),
            "fresh_import_composeai_ms": med([s[0] for s in splits]),
            "fresh_import_flow_module_ms": med([s[1] for s in splits]),
            "fresh_resume_call_ms": med([s[2] for s in splits]),
            "import_composeai_ms": med(imports),
            "bare_interpreter_ms": med(bare),
            "repeat": repeat,
        }
    )


if __name__ == "__main__":
    main()
