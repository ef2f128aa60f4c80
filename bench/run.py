"""Runs every benchmark workload and prints a summary table.

    python bench/run.py            # table
    python bench/run.py --json     # every row as a JSON list

Each workload runs as its own subprocess with its own fresh temporary
COMPOSE_DIR; the Python extension is assumed to be a release build
(`maturin develop --release`). The storage floor is the Rust example
`bench/floor.rs` (`cargo run --release --example floor`), built first into
bench/target (a separate CARGO_TARGET_DIR, so it never invalidates the
extension build's cache in ./target).

Timings of repeated measurements are the best (minimum) of --repeat runs:
this 2-core machine is shared, and contention only ever adds time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from _common import BENCH_DIR, REPO, temp_dir


def log(message: str) -> None:
    sys.stderr.write(f"[bench] {message}\n")
    sys.stderr.flush()


def run_json(argv: list[str], env: dict[str, str], cwd: str = REPO) -> dict[str, Any]:
    """Runs a workload and parses its one JSON line."""
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr}")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if len(lines) != 1:
        raise RuntimeError(
            f"{' '.join(argv)} printed {len(lines)} lines, expected 1:\n{proc.stdout}"
        )
    return json.loads(lines[0])


# Fields that are not timings: kept from the first record, never minimised.
NOT_TIMINGS = {"n", "repeat", "max_workers", "threads_used_200_items", "schema_version"}


def best_record(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Field-wise minimum of repeated timings (other fields from the first);
    the spread of the headline figure is kept as `<field>_all`."""
    out = dict(records[0])
    for key, value in records[0].items():
        if key in NOT_TIMINGS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        values = [r[key] for r in records if r.get(key) is not None]
        out[key] = min(values)
        if len(records) > 1:
            out[f"{key}_all"] = values
    out["repeats"] = len(records)
    return out


def base_env(sync: str = "normal") -> dict[str, str]:
    env = dict(os.environ)
    env.pop("COMPOSE_DIR", None)  # each workload makes its own
    env.pop("COMPOSE_TRACE_CONTENT", None)
    # Measure imports as an installed package runs them: from bytecode.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if sync == "full":
        env["COMPOSE_SYNC"] = "full"
    else:
        env.pop("COMPOSE_SYNC", None)
    return env


def workload(
    script: str, n: int, repeat: int = 1, sync: str = "normal", extra=(), env: dict | None = None
) -> dict:
    argv = [sys.executable, os.path.join(BENCH_DIR, script), "--n", str(n), *extra]
    label = f"{script} --n {n} {' '.join(extra)}".rstrip()
    label += " (COMPOSE_SYNC=full)" if sync == "full" else ""
    label += "".join(f" ({k}={v})" for k, v in (env or {}).items())
    records = []
    for i in range(repeat):
        t0 = time.perf_counter()
        records.append(run_json(argv, {**base_env(sync), **(env or {})}))
        log(f"{label} [{i + 1}/{repeat}] {time.perf_counter() - t0:.1f}s")
    return best_record(records)


FLOOR_TARGET = os.path.join(BENCH_DIR, "target")


def cargo_env() -> dict[str, str]:
    env = base_env()
    env["CARGO_TARGET_DIR"] = FLOOR_TARGET
    return env


def build_floor() -> None:
    log(f"building the floor example (CARGO_TARGET_DIR={FLOOR_TARGET}; ~1 min the first time)")
    proc = subprocess.run(
        ["cargo", "build", "-q", "--release", "--example", "floor"],
        cwd=REPO,
        env=cargo_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"cargo build of the floor example failed:\n{proc.stderr}")


def floor(n: int, repeat: int, full: bool) -> dict:
    records = []
    for i in range(repeat):
        directory = temp_dir("floor")
        argv = ["cargo", "run", "-q", "--release", "--example", "floor", "--", str(n), directory]
        if full:
            argv.append("full")
        t0 = time.perf_counter()
        records.append(run_json(argv, cargo_env()))
        log(f"floor {n} [{i + 1}/{repeat}] {time.perf_counter() - t0:.1f}s")
    return best_record(records)


def row(
    workload_: str,
    metric: str,
    value: float,
    unit: str,
    target: str = "",
    ratio: float | None = None,
    ratio_of: str = "",
    ok: bool | None = None,
    source: dict | None = None,
) -> dict[str, Any]:
    return {
        "workload": workload_,
        "metric": metric,
        "value": value,
        "unit": unit,
        "target": target,
        "ratio": None if ratio is None else round(ratio, 2),
        "ratio_of": ratio_of,
        "ok": ok,
        "source": source,
    }


def collect(args: argparse.Namespace) -> list[dict[str, Any]]:
    r = args.repeat
    # fsync latency varies far more run to run than CPU time: more repeats.
    r_full = max(r, 5)
    if not args.no_build:
        build_floor()
    fl = floor(args.n_floor, r_full, full=True)
    w1 = workload("w1_steps.py", args.n_w1, r)
    w1_big = workload("w1_steps.py", args.n_w1_big, max(1, r - 1))
    w1_full = workload("w1_steps.py", args.n_w1, r_full, sync="full")
    w1_batch = workload("w1_steps.py", args.n_w1, r, env={"COMPOSE_DURABILITY": "batch"})
    w8 = {
        (phase, n): workload("w8_memory.py", n, 1, extra=("--phase", phase))
        for n in (10_000, args.n_w1_big)
        for phase in ("run", "resume")
    }
    w2 = workload("w2_resume.py", args.n_w2, r)
    w3 = workload("w3_map.py", args.n_w3, r)
    w3_one = workload("w3_map.py", args.n_w3, r, extra=("--max-workers", "1"))
    w3_async = workload("w3_amap.py", args.n_w3, r)
    facade = workload("facade.py", args.n_w1, r)
    w4 = workload("w4_runs.py", args.n_w4, r)
    w5 = workload("w5_agent.py", args.n_w5, r)
    w6 = workload("w6_state.py", args.n_w6, 1)
    codec = workload("codec_fast_path.py", 20000, r)

    f_norm, f_full = fl["us_per_commit_normal"], fl["us_per_commit_full"]
    step, step_big = w1["us_per_step"], w1_big["us_per_step"]
    step_full = w1_full["us_per_step"]
    scale = step_big / step
    replay = w2["us_per_replayed_step"]
    fresh, imp = w2["fresh_process_ms"], w2["import_composeai_ms"]
    item, item_one = w3["us_per_item"], w3_one["us_per_item"]
    # A W4 run commits 5 transactions: run row, 3 steps, settlement.
    w4_floor_us = 5 * f_norm
    n1 = w1["n"]
    return [
        row(
            "W1",
            f"journaled step, N={n1}",
            step,
            "us/step",
            f"<= floor+20 ({f_norm + 20:.1f})",
            step / f_norm,
            "W1 / floor",
            step <= f_norm + 20,
            w1,
        ),
        row(
            "floor",
            f"journal+span commit, N={fl['n']}, NORMAL",
            f_norm,
            "us/commit",
            "",
            None,
            "",
            None,
            fl,
        ),
        row(
            "W1 - floor",
            "engine + Python overhead per step",
            round(step - f_norm, 2),
            "us/step",
            "",
            (step - f_norm) / step,
            "share of W1",
            None,
            None,
        ),
        row(
            "W1",
            f"undecorated call, N={n1}",
            w1["us_per_call_undecorated"],
            "us/call",
            "",
            None,
            "",
            None,
            None,
        ),
        row(
            "W1",
            f"journaled step, N={w1_big['n']}",
            step_big,
            "us/step",
            f"<= 1.5x N={n1}",
            scale,
            f"N={w1_big['n']} / N={n1}",
            scale <= 1.5,
            w1_big,
        ),
        row(
            "W1-batch",
            f"journaled step, N={w1_batch['n']}, COMPOSE_DURABILITY=batch",
            w1_batch["us_per_step"],
            "us/step",
            "<= 6",
            w1_batch["us_per_step"] / step,
            "W1-batch / W1",
            w1_batch["us_per_step"] <= 6,
            w1_batch,
        ),
        row(
            "W1-full",
            f"journaled step, N={w1_full['n']}, COMPOSE_SYNC=full",
            step_full,
            "us/step",
            "<= 1.2x floor-full",
            step_full / f_full,
            "W1-full / floor-full",
            step_full <= 1.2 * f_full,
            w1_full,
        ),
        row(
            "floor-full",
            f"journal+span commit, N={fl['n']}, FULL",
            f_full,
            "us/commit",
            "",
            None,
            "",
            None,
            None,
        ),
        row(
            "W1-full - floor-full",
            "overhead per step",
            round(step_full - f_full, 2),
            "us/step",
            "",
            None,
            "",
            None,
            None,
        ),
        row(
            "W2",
            f"replayed step (in-process resume), N={w2['n']}",
            replay,
            "us/step",
            "<= 2.5",
            replay / step,
            "replay / W1 step",
            replay <= 2.5,
            w2,
        ),
        row(
            "W2",
            f"fresh-process resume, N={w2['n']} (paused by a process that exited)",
            fresh,
            "ms",
            "<= 35",
            fresh / 35,
            "value / target",
            fresh <= 35,
            None,
        ),
        row(
            "W2",
            "import composeai (fresh interpreter)",
            imp,
            "ms",
            "<= 60",
            imp / 60,
            "value / target",
            imp <= 60,
            None,
        ),
        row(
            "W3",
            f"map item, N={w3['n']}",
            item,
            "us/item",
            "<= 70",
            item / f_norm,
            "W3 / floor",
            item <= 70,
            w3,
        ),
        row(
            "W3",
            f"map item, N={w3_one['n']}, max_workers=1",
            item_one,
            "us/item",
            "",
            item_one / f_norm,
            "W3 / floor",
            None,
            w3_one,
        ),
        row(
            "W3-amap",
            f"amap item (async @task) in an async flow, N={w3_async['n']}",
            w3_async["us_per_item"],
            "us/item",
            "<= 70",
            w3_async["us_per_item"] / f_norm,
            "W3-amap / floor",
            w3_async["us_per_item"] <= 70,
            w3_async,
        ),
        row(
            "W3-amap",
            f"amap item (sync @task) in an async flow, N={w3_async['n']}",
            w3_async["us_per_item_sync_task"],
            "us/item",
            "<= 70",
            w3_async["us_per_item_sync_task"] / f_norm,
            "W3-amap / floor",
            w3_async["us_per_item_sync_task"] <= 70,
            None,
        ),
        row(
            "facade",
            "sync call of an async-bodied task in a flow: async body - sync body "
            f"({facade['us_per_call_async_body']:.1f} - {facade['us_per_call_sync_body']:.1f})",
            facade["us_facade_overhead"],
            "us/call",
            "<= 40",
            facade["us_facade_overhead"] / 40,
            "value / target",
            facade["us_facade_overhead"] <= 40,
            facade,
        ),
        row(
            "W4",
            f"3-step run, N={w4['n']}",
            w4["ms_per_run"],
            "ms/run",
            "<= 1",
            w4["us_per_run"] / w4_floor_us,
            "W4 / (5 x floor)",
            w4["ms_per_run"] <= 1,
            w4,
        ),
        row(
            "W5",
            f"FakeModel agent call outside a flow, N={w5['n']}",
            w5["ms_per_call"],
            "ms/call",
            "<= 0.08",
            w5["ms_per_call"] / 0.08,
            "value / target",
            w5["ms_per_call"] <= 0.08,
            w5,
        ),
        row(
            "W5 floor",
            f"one agent call's commit (run row + 2 spans), N={fl['n']}, NORMAL",
            fl["us_per_agent_call_commit"],
            "us/commit",
            "",
            fl["us_per_agent_call_commit"] / (w5["ms_per_call"] * 1e3),
            "share of W5",
            None,
            None,
        ),
        row(
            "W6",
            f"state, N={w6['n']}",
            w6["bytes_per_step"],
            "bytes/step",
            "<= 300",
            None,
            "",
            w6["bytes_per_step"] <= 300,
            w6,
        ),
        *(
            row(
                "W8",
                f"peak RSS growth of the {phase}, N={n} (fresh process)",
                rec["bytes_per_step"],
                "bytes/step",
                "<= 30 MB in all" if n >= 100_000 else "",
                rec["peak_rss_growth_mb"],
                "MB in all",
                rec["peak_rss_growth_mb"] <= 30 if n >= 100_000 else None,
                rec,
            )
            for (phase, n), rec in w8.items()
        ),
        *codec_rows(codec),
    ]


def codec_rows(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The codec's decode, per value shape: serde_json + pythonize in the core
    against the Python codec's C-accelerated scan (and which one `loads` uses)."""
    out = []
    for key, python in rec.items():
        if not key.startswith("ns_python_") or key.endswith("_all"):
            continue
        shape = key[len("ns_python_") :]
        core = rec[f"ns_core_{shape}"]
        used = "core" if rec[f"core_path_{shape}"] else "Python"
        out.append(
            row(
                "codec",
                f"decode {shape}: core {core:.0f} ns vs Python {python:.0f} ns (loads uses {used})",
                core,
                "ns",
                "",
                core / python,
                "core / Python",
                None,
                None,
            )
        )
    return out


def adapter_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """W7: what composeai adds to a real SDK call, per adapter, against a
    loopback server speaking the provider's wire format."""
    anth = workload("w7_anthropic.py", args.n_w7, 1)
    oai = workload("w7_openai.py", args.n_w7, 1)
    out = []
    for label, value, source in (
        (
            f"Anthropic adapter (anthropic {anth['anthropic_sdk']})",
            anth["overhead_ms_per_call"],
            anth,
        ),
        ("OpenAI adapter (Responses API)", oai["openai_overhead_ms_per_call"], oai),
        (
            "OpenAI-compatible adapter (Chat Completions)",
            oai["compatible_overhead_ms_per_call"],
            oai,
        ),
    ):
        out.append(
            row(
                "W7",
                f"agent call minus bare SDK call, {label}",
                value,
                "ms/call",
                "<= 0.3",
                value / 0.3,
                "value / target",
                value <= 0.3,
                source,
            )
        )
    out.append(
        row(
            "W7",
            "of which the adapter's wire mapping (model.complete minus bare SDK), Anthropic",
            anth["adapter_overhead_ms_per_call"],
            "ms/call",
            "",
            None,
            "",
            None,
            None,
        )
    )
    return out


def durable_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """D1-D4: the durable primitives under `compose worker` (d_durable.py)."""
    d = workload("d_durable.py", args.n_d1, 1)
    d1, d2, d3, d4 = d["D1"], d["D2"], d["D3"], d["D4"]
    return [
        row(
            "D1",
            f"timer lateness under the worker, p50 of {d1['timers']} (p99 {d1['lateness_p99_ms']} ms)",
            d1["lateness_p50_ms"],
            "ms",
            "p99 <= 150",
            d1["lateness_p99_ms"] / 150,
            "p99 / target",
            d1["lateness_p99_ms"] <= 150,
            d1,
        ),
        row(
            "D2",
            f"signal commit to blocked run continuing, p50 (p99 {d2['latency_p99_ms']} ms)",
            d2["latency_p50_ms"],
            "ms",
            "<= 120",
            d2["latency_p50_ms"] / 120,
            "value / target",
            d2["latency_p50_ms"] <= 120,
            d2,
        ),
        row(
            "D3",
            f"worker RSS over {d3['parked_runs']:,} parked runs ({d3['worker_threads']} threads)",
            d3["worker_rss_mb"],
            "MB",
            "<= 50",
            d3["worker_rss_mb"] / 50,
            "value / target",
            d3["worker_rss_mb"] <= 50 and d3["worker_threads"] < 16,
            d3,
        ),
        row(
            "D4",
            f"3-step runs continued per second, one worker (concurrency 4: "
            f"{d['D4_concurrency_4']['runs_per_s']:,.0f}/s)",
            d4["runs_per_s"],
            "runs/s",
            ">= 1000",
            d4["runs_per_s"] / 1000,
            "value / target",
            d4["runs_per_s"] >= 1000,
            d,
        ),
    ]


def graph_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """G1/G2: graph threads, side by side with LangGraph's SQLite checkpointer
    in the same run (g_graph.py; its venv is made on first use)."""
    g = workload("g_graph.py", args.n_g1, 1, extra=() if args.peers else ("--no-langgraph",))
    g2 = g["g2_bytes_per_step"]
    small, big = g2["100"], g2[str(g["g2_steps"])]
    lg_g1 = g.get("langgraph_g1_us_per_node_step")
    lg_g2 = g.get("langgraph_g2_bytes_per_step")
    speedup = g.get("g1_speedup")
    g1_metric = "node step of a 3-node linear graph on a thread"
    if lg_g1 is not None:
        g1_metric += f" (LangGraph {g['langgraph_version']}: {lg_g1:,.0f} us, {speedup}x)"
    g2_metric = f"store bytes per step, growing 200-message list, {g['g2_steps']} steps"
    if lg_g2 is not None:
        g2_metric += f" (LangGraph: {lg_g2[str(g['g2_steps'])]:,.0f} B)"
    return [
        row(
            "G1",
            g1_metric,
            g["g1_us_per_node_step"],
            "us/step",
            ">= 20x LangGraph",
            speedup,
            "LangGraph / G1",
            None if speedup is None else speedup >= 20,
            g,
        ),
        row(
            "G2",
            g2_metric + f" (100 steps: {small:,.0f} B)",
            big,
            "bytes/step",
            "1000 / 100 <= 2",
            big / small,
            "1000 steps / 100 steps",
            big / small <= 2,
            g,
        ),
    ]


def postgres_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """P0-P3 on a PostgreSQL cluster started by the workloads themselves
    (p_postgres.py, p3_queue.py), with DBOS beside P1 and P3; skipped
    without PostgreSQL."""
    sys.path.insert(0, os.path.join(REPO, "tests"))
    import _pg

    if _pg.find_bindir() is None:
        log("PostgreSQL (initdb, pg_ctl) is not installed: P0-P3 skipped")
        return []
    t0 = time.perf_counter()
    pg = run_json([sys.executable, os.path.join(BENCH_DIR, "p_postgres.py")], base_env())
    log(f"p_postgres.py {time.perf_counter() - t0:.1f}s")
    t0 = time.perf_counter()
    argv = [sys.executable, os.path.join(BENCH_DIR, "p3_queue.py")]
    p3 = run_json(argv + ([] if args.peers else ["--no-dbos"]), base_env())
    log(f"p3_queue.py {time.perf_counter() - t0:.1f}s")
    p0, p1 = pg["p0_us_per_commit"], pg["p1_us_per_step"]
    dbos = p3.get("dbos_steps_per_s")
    ratio = p3.get("p3_over_dbos")
    p3_metric = f"{p3['flows']} flows x {p3['steps']} steps, {p3['workers']} workers, one queue"
    if dbos is not None:
        p3_metric += f" (DBOS: {dbos:,} steps/s, {ratio}x)"
    return [
        row("P0", "journal+span commit, one round trip (Rust)", p0, "us", "", None, "", None, pg),
        row(
            "P1",
            f"journaled step on PostgreSQL (DBOS: {pg['dbos_w1_us_per_step']:,.0f} us)",
            p1,
            "us/step",
            "<= 1.3x P0",
            p1 / p0,
            "P1 / P0",
            p1 / p0 <= 1.3,
            pg,
        ),
        row(
            "P1-batch",
            "journaled step on PostgreSQL, COMPOSE_DURABILITY=batch",
            pg["p1_batch_us_per_step"],
            "us/step",
            "",
            pg["p1_batch_us_per_step"] / p0,
            "P1-batch / P0",
            None,
            pg,
        ),
        row(
            "P2", "3-step run on PostgreSQL", pg["p2_ms_per_run"], "ms/run", "", None, "", None, pg
        ),
        row(
            "P3",
            p3_metric,
            p3["p3_steps_per_s"],
            "steps/s",
            ">= 5x DBOS",
            ratio,
            "P3 / DBOS",
            None if ratio is None else ratio >= 5,
            p3,
        ),
    ]


def obs_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """OBS-CLI (obs_cli.py): whole `compose` processes against a large store
    (built once by obs_store.py and cached; see README)."""
    argv = [
        sys.executable,
        os.path.join(BENCH_DIR, "obs_cli.py"),
        "--runs",
        str(args.obs_runs),
        "--spans",
        str(args.obs_spans),
        "--repeat",
        str(max(5, args.repeat)),
    ]
    t0 = time.perf_counter()
    rec = run_json(argv, base_env())
    log(f"obs_cli.py {time.perf_counter() - t0:.1f}s")
    build = rec["store_build_s"]
    store = f"{rec['store_runs']:,} runs / {rec['store_spans']:,} spans, {rec['store_mb']:.0f} MB"
    out = [
        row(
            "OBS-store",
            f"build {store}" + (" (cached)" if rec["store_cached"] else ""),
            build,
            "s",
            "< 120",
            build / 120,
            "value / target",
            build < 120,
            rec,
        ),
        row("OBS-CLI", "python -c pass", rec["python_ms"], "ms", "", None, "", None, None),
        row(
            "OBS-CLI",
            "import composeai.cli (in-process)",
            rec["import_cli_ms"],
            "ms",
            "",
            None,
            "",
            None,
            None,
        ),
    ]
    for name, d in rec["commands"].items():
        value = rec[f"{name}_ms"]
        target = d["target_ms"]
        command = " ".join(d["argv"][:2] + ["<id>"] if name == "trace_id" else d["argv"])
        if d.get("error"):
            metric = f"{command} -- FAILED (exit {d['rc']}): {d['error'][:70]}"
        else:
            cold = rec.get(f"{name}_cold_ms")
            metric = f"{command}, whole process (main() {rec[f'{name}_main_ms']:.1f} ms" + (
                f"; cold cache {cold:.0f} ms)" if cold is not None else ")"
            )
        out.append(
            row(
                "OBS-CLI",
                metric,
                value,
                "ms",
                f"< {target}",
                None if value is None else value / target,
                "value / target",
                value is not None and value < target,
                None,
            )
        )
    return out


def outside_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """O1-O4 (o_outside.py): list_runs on a large store, stream writes, token
    delay to a reader in another process, prune rate and store size."""
    argv = [
        sys.executable,
        os.path.join(BENCH_DIR, "o_outside.py"),
        "--runs",
        str(args.outside_runs),
    ]
    t0 = time.perf_counter()
    rec = run_json(argv, base_env())
    log(f"o_outside.py {time.perf_counter() - t0:.1f}s")
    listed = rec["o1_list_runs_all_ms"]
    mb = 1e6
    vacuumed = rec["o4_bytes_after_vacuum"]
    return [
        row(
            "O1",
            f"list_runs(limit=100), {rec['o1_runs']:,} runs",
            listed,
            "ms",
            "<= 10",
            listed / 10,
            "value / target",
            listed <= 10,
            rec,
        ),
        row(
            "O1",
            "list_runs(status='failed', limit=100)",
            rec["o1_list_runs_failed_ms"],
            "ms",
        ),
        row(
            "O2",
            "write_stream, per value",
            rec["o2_us_per_stream_value"],
            "us",
            "",
            rec["o2_us_per_stream_value"] / rec["o2_us_per_w1_step"],
            "value / W1 step",
        ),
        row(
            "O3",
            "model delta -> reader in another process, p50",
            rec["o3_token_delay_p50_ms"],
            "ms",
        ),
        row(
            "O3",
            "model delta -> reader in another process, p99",
            rec["o3_token_delay_p99_ms"],
            "ms",
        ),
        row(
            "O4",
            f"delete_runs, {rec['o4_runs']:,} 3-step runs",
            rec["o4_prune_runs_per_s"],
            "runs/s",
        ),
        row(
            "O4",
            f"store MB before / after prune / after vacuum: {rec['o4_bytes_before'] / mb:.1f} / "
            f"{rec['o4_bytes_after_prune'] / mb:.1f} / "
            + ("-" if vacuumed is None else f"{vacuumed / mb:.1f}"),
            rec["o4_bytes_after_prune"] / mb,
            "MB",
        ),
    ]


def pg_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """P4 on a PostgreSQL cluster the bench starts (p_postgres.py; the whole
    P0-P2 series with DBOS beside it: `python bench/p_postgres.py`)."""
    argv = [sys.executable, os.path.join(BENCH_DIR, "p_postgres.py"), "--p4-only"]
    p = run_json([*argv, "--repeat", str(max(args.repeat, 3))], base_env())
    ms = p["p4_ms_after_expiry"]
    return [
        row(
            "P4",
            f"takeover: a killed holder's lease expiry to its run's next step on another "
            f"worker, median of {len(p['p4_ms_all'])} (lease {p['p4_lease_seconds']:g} s, "
            f"from {p['p4_from']})",
            ms,
            "ms",
            "<= 1000",
            ms / 1000,
            "value / target",
            ms <= 1000,
            p,
        )
    ]


def fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.4f}" if abs(value) < 1 else f"{value:,.2f}"
    return str(value)


def print_table(rows: list[dict[str, Any]]) -> None:
    headers = ["workload", "metric", "value", "unit", "target", "ratio", "ratio of", "status"]
    cells = []
    for r in rows:
        status = "" if r["ok"] is None else ("ok" if r["ok"] else "MISS")
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        cells.append(
            [
                r["workload"],
                r["metric"],
                fmt(r["value"]),
                r["unit"],
                r["target"],
                ratio,
                r["ratio_of"],
                status,
            ]
        )
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    right = {2, 5}

    def line(values: list[str]) -> str:
        return "  ".join(
            v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths))
        ).rstrip()

    print(line(headers))
    print(line(["-" * w for w in widths]))
    for c in cells:
        print(line(c))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print every row as a JSON list")
    p.add_argument("--repeat", type=int, default=3, help="repeats (best of) of short workloads")
    p.add_argument("--no-build", action="store_true", help="skip building the floor example")
    p.add_argument("--n-floor", type=int, default=2000)
    p.add_argument("--n-w1", type=int, default=2000)
    p.add_argument("--n-w1-big", type=int, default=100_000)
    p.add_argument("--n-w2", type=int, default=1000)
    p.add_argument("--n-w3", type=int, default=1000)
    p.add_argument("--n-w4", type=int, default=200)
    p.add_argument("--n-w5", type=int, default=500)
    p.add_argument("--n-w6", type=int, default=2000)
    p.add_argument("--n-w7", type=int, default=500)
    p.add_argument("--n-d1", type=int, default=200)
    p.add_argument("--n-g1", type=int, default=2000)
    p.add_argument(
        "--no-peers",
        dest="peers",
        action="store_false",
        help="skip the side-by-side peers (LangGraph), whose venvs are installed on first use",
    )
    p.add_argument("--pg", action="store_true", help="also P4 on a PostgreSQL cluster started here")
    p.add_argument("--obs", action="store_true", help="also OBS-CLI: the CLI against a large store")
    p.add_argument("--obs-only", action="store_true", help="only the OBS-CLI rows")
    p.add_argument("--obs-runs", type=int, default=10_000)
    p.add_argument(
        "--outside", action="store_true", help="also O1-O4: list_runs, streams, retention"
    )
    p.add_argument("--outside-runs", type=int, default=1_000_000)
    p.add_argument("--obs-spans", type=int, default=1_000_000)
    args = p.parse_args()
    t0 = time.perf_counter()
    load_before = os.getloadavg()[0]
    if load_before > 0.8:
        log(f"warning: load average {load_before:.2f} before starting -- numbers will be noisy")
    rows = (
        []
        if args.obs_only
        else collect(args)
        + adapter_rows(args)
        + durable_rows(args)
        + graph_rows(args)
        + postgres_rows(args)
    )
    if args.pg:
        rows += pg_rows(args)
    if args.obs or args.obs_only:
        rows += obs_rows(args)
    if args.outside:
        rows += outside_rows(args)
    log(
        f"total {time.perf_counter() - t0:.1f}s; load average {load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after"
    )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_table(rows)


if __name__ == "__main__":
    main()
