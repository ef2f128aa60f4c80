"""OBS-CLI: whole `compose` CLI processes against a large store.

Builds (or reuses, see obs_store.py) a store of 10,000 runs / 1,000,000
spans, then times complete processes of `python -m composeai.cli ...` with
`COMPOSE_DIR` pointing at it: `runs`, `runs --json`, `trace <id>` (a
100-span run), `trace --last`, `costs`, `costs --by name`, `costs --by day`.
Each command is run once untimed (writes bytecode, warms the OS cache), then
`--repeat` times round-robin; the median wall time is reported in ms.
Targets: `runs` and `trace` < 200 ms, `costs` < 1 s, for the whole process.

With `--cold-repeat N` (default 3; 0 disables) each command is also run
N times right after evicting the store file from the OS page cache
(`posix_fadvise(DONTNEED)` on runs.db only; nothing else on the machine is
touched): `<cmd>_cold_ms`, the median -- the first command after a reboot
or on a store larger than memory.

For context it also reports a bare `python -c pass`, `import composeai.cli`
(in-process, and as a whole process), and per command the time of
`composeai.cli.main([...])` alone inside an already-started interpreter
(`<cmd>_main_ms`), which splits process time into start-up + import vs.
the command's own work. A command that fails (e.g. not implemented yet) is
reported with its exit status and first stderr line, and no timing.

Child processes run without PYTHONDONTWRITEBYTECODE, as an installed
package runs (from bytecode). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import emit
from obs_store import DEFAULT_END, base_env, ensure_store, log

RUNS_TARGET_MS = 200
COSTS_TARGET_MS = 1000

# Runs `main(argv)` inside the interpreter, stdout discarded, and prints the
# split (ms): import of composeai.cli, then main().
MAIN_SCRIPT = """\
import json, os, sys, time
t0 = time.perf_counter()
import composeai.cli as cli
t1 = time.perf_counter()
real = sys.stdout
sys.stdout = open(os.devnull, "w")
rc = cli.main(json.loads(sys.argv[1]))
sys.stdout.flush()
t2 = time.perf_counter()
sys.stdout = real
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "main_ms": (t2 - t1) * 1e3, "rc": rc}))
"""
IMPORT_SCRIPT = (
    "import time; t0 = time.perf_counter(); import composeai.cli; "
    "print((time.perf_counter() - t0) * 1e3)"
)


def commands(meta: dict[str, Any]) -> list[tuple[str, list[str], int]]:
    return [
        ("runs", ["runs"], RUNS_TARGET_MS),
        ("runs_json", ["runs", "--json"], RUNS_TARGET_MS),
        ("trace_id", ["trace", meta["target_run_id"]], RUNS_TARGET_MS),
        ("trace_last", ["trace", "--last"], RUNS_TARGET_MS),
        ("costs", ["costs"], COSTS_TARGET_MS),
        ("costs_name", ["costs", "--by", "name"], COSTS_TARGET_MS),
        ("costs_day", ["costs", "--by", "day"], COSTS_TARGET_MS),
    ]


def check_output(name: str, argv: list[str], stdout: str, meta: dict[str, Any]) -> str | None:
    """Why the output is not what the command should print, or None."""
    lines = stdout.splitlines()
    if name == "runs" and len(lines) != 10:
        return f"expected 10 rows, got {len(lines)}"
    if name == "runs_json" and not stdout.lstrip().startswith("["):
        return "not a JSON list"
    if name == "trace_id" and len(lines) != meta["target_run_spans"] + 1:
        return f"expected {meta['target_run_spans'] + 1} lines, got {len(lines)}"
    if name == "trace_last" and len(lines) < meta["last_run_spans"] + 1:
        return f"expected >= {meta['last_run_spans'] + 1} lines, got {len(lines)}"
    if name.startswith("costs") and (not lines or not lines[0].startswith("costs by")):
        return f"unexpected first line {lines[:1]}"
    if name.startswith("costs") and not any(line.lstrip().startswith("TOTAL") for line in lines):
        return "no TOTAL line"
    return None


def timed(
    argv: list[str], env: dict[str, str], cwd: str
) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    return (time.perf_counter() - t0) * 1e3, proc


def evict(directory: str) -> None:
    """Drops runs.db's pages from the OS page cache (clean pages only)."""
    fd = os.open(os.path.join(directory, "runs.db"), os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def median(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--spans", type=int, default=1_000_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--end", type=float, default=DEFAULT_END)
    p.add_argument("--repeat", type=int, default=5, help="timed runs per command (median)")
    p.add_argument("--cold-repeat", type=int, default=3, help="cold-cache runs per command")
    p.add_argument("--rebuild", action="store_true", help="rebuild the store even if cached")
    args = p.parse_args()

    meta = ensure_store(args.runs, args.spans, args.seed, end=args.end, rebuild=args.rebuild)
    env = base_env()
    env["COMPOSE_DIR"] = meta["dir"]
    cwd = tempfile.gettempdir()
    py = sys.executable
    cmds = commands(meta)

    # Untimed warm-up: bytecode for every module the CLI imports, OS page cache.
    for _, argv, _ in cmds:
        timed([py, "-m", "composeai.cli", *argv], env, cwd)
    timed([py, "-c", "pass"], env, cwd)

    times: dict[str, list[float]] = {name: [] for name, _, _ in cmds}
    results: dict[str, dict[str, Any]] = {}
    bare: list[float] = []
    imp_process: list[float] = []
    imp_inside: list[float] = []
    for _ in range(args.repeat):
        bare.append(timed([py, "-c", "pass"], env, cwd)[0])
        ms, proc = timed([py, "-c", IMPORT_SCRIPT], env, cwd)
        imp_process.append(ms)
        imp_inside.append(float(proc.stdout.strip() or "nan"))
        for name, argv, _ in cmds:
            ms, proc = timed([py, "-m", "composeai.cli", *argv], env, cwd)
            if proc.returncode != 0:
                err = (proc.stderr.strip().splitlines() or [""])[-1]
                results[name] = {"rc": proc.returncode, "error": err[:300]}
                continue
            problem = check_output(name, argv, proc.stdout, meta)
            if problem:
                results[name] = {"rc": 0, "error": f"bad output: {problem}"}
                continue
            times[name].append(ms)
            results.setdefault(name, {"rc": 0, "lines": len(proc.stdout.splitlines())})

    # Cold OS cache for the store file (the interpreter and package stay warm).
    cold: dict[str, list[float]] = {name: [] for name, _, _ in cmds}
    if hasattr(os, "posix_fadvise"):
        for _ in range(args.cold_repeat):
            for name, argv, _ in cmds:
                if results.get(name, {}).get("error"):
                    continue
                evict(meta["dir"])
                ms, proc = timed([py, "-m", "composeai.cli", *argv], env, cwd)
                if proc.returncode == 0:
                    cold[name].append(ms)

    # main() alone, inside a started interpreter (the same store, same env).
    main_ms: dict[str, list[float]] = {name: [] for name, _, _ in cmds}
    for _ in range(max(1, args.repeat // 2 + 1)):
        for name, argv, _ in cmds:
            if results.get(name, {}).get("error"):
                continue
            proc = subprocess.run(
                [py, "-c", MAIN_SCRIPT, json.dumps(argv)],
                env=env,
                cwd=cwd,
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode == 0 and proc.stdout.strip():
                main_ms[name].append(json.loads(proc.stdout.strip().splitlines()[-1])["main_ms"])

    record: dict[str, Any] = {
        "workload": "OBS-CLI",
        "store_runs": meta["runs"],
        "store_spans": meta["spans"],
        "store_llm_spans": meta["llm_spans"],
        "store_mb": round(meta["db_bytes"] / 1e6, 1),
        "store_build_s": meta["build_s"],
        "store_cached": meta["cached"],
        "store_dir": meta["dir"],
        "repeat": args.repeat,
        "python_ms": median(bare),
        "import_cli_ms": median(imp_inside),
        "import_cli_process_ms": median(imp_process),
        "load_avg": round(os.getloadavg()[0], 2),
    }
    detail: dict[str, Any] = {}
    for name, argv, target in cmds:
        info = results.get(name, {})
        ok_times = times[name]
        value = median(ok_times) if ok_times and not info.get("error") else None
        record[f"{name}_ms"] = value
        record[f"{name}_main_ms"] = median(main_ms[name]) if main_ms[name] else None
        record[f"{name}_cold_ms"] = median(cold[name]) if cold[name] else None
        detail[name] = {
            "argv": ["compose", *argv],
            "target_ms": target,
            "ok": None if value is None else value < target,
            "all_ms": [round(t, 2) for t in ok_times],
            "cold_all_ms": [round(t, 2) for t in cold[name]],
            **info,
        }
    record["commands"] = detail
    for name, d in detail.items():
        shown = (
            "FAILED " + d["error"]
            if d.get("error")
            else f"{record[name + '_ms']} ms (cold cache {record[name + '_cold_ms']} ms)"
        )
        log(f"obs cli: {' '.join(d['argv'])}: {shown}")
    emit(record)


if __name__ == "__main__":
    main()
