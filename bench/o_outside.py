"""O1-O4: reading runs from outside and retention (OPS-20 … OPS-23).

O1 `list_runs(limit=100)` on a store of `--runs` runs (default 1,000,000;
the rows bulk-inserted beside one engine-written run, whose columns they
copy), median ms of 20, without and with a status filter (target <= 10 ms
on SQLite). O2 µs per `write_stream` value in a flow (N values), next to
W1's µs per step in the same process. O3 the delay from a model's text
delta to a reader in another process (`@agent(stream_to=...)`, a model
emitting a delta every 5 ms), p50/p99 ms. O4 `delete_runs` over N real
3-step runs: runs/s, and the store's bytes before, after, and after
`compact()`.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import subprocess
import sys
import time

from _common import emit, fresh_store, parser

READER = """
import json, sys, time
import composeai as compose
run_id = sys.argv[1]
delays = []
for sent in compose.read_stream(run_id, "tokens", timeout=60):
    delays.append(time.time() - float(sent))
print(json.dumps(delays))
"""


def _bytes(path: str) -> int:
    return sum(os.path.getsize(path + s) for s in ("", "-wal") if os.path.exists(path + s))


def o1(compose, store_path: str, runs: int) -> dict:
    @compose.flow
    def listed(x: int) -> int:
        return x

    listed.run(0)
    compose.list_runs(limit=1)
    compose._engine.get_store().flush()
    with sqlite3.connect(store_path) as c:
        cols = [r[1] for r in c.execute("PRAGMA table_info(runs)") if r[1] != "rid"]
        template = dict(zip(cols, c.execute(f"SELECT {', '.join(cols)} FROM runs").fetchone()))
        base = template["created_at"] - runs
        statuses = ("completed", "completed", "completed", "failed", "paused")

        def rows():
            for i in range(runs):
                row = dict(template)
                row["run_id"] = f"BULK{i:022d}"
                row["created_at"] = row["updated_at"] = base + i
                row["status"] = statuses[i % len(statuses)]
                row["lease_owner"] = row["lease_until"] = None
                yield tuple(row[k] for k in cols)

        c.executemany(
            f"INSERT INTO runs({', '.join(cols)}) VALUES({', '.join('?' * len(cols))})", rows()
        )
    timings = {}
    for label, kwargs in (("all", {}), ("failed", {"status": "failed"})):
        samples = []
        for _ in range(20):
            t0 = time.perf_counter()
            page = compose.list_runs(limit=100, **kwargs)
            samples.append(time.perf_counter() - t0)
            assert len(page) == 100
        timings[f"o1_list_runs_{label}_ms"] = round(statistics.median(samples) * 1e3, 3)
    return {"o1_runs": runs + 1, **timings}


def o2(compose, n: int) -> dict:
    @compose.task
    def inc(x: int) -> int:
        return x + 1

    @compose.flow
    def steps(n: int) -> None:
        for i in range(n):
            inc(i)

    @compose.flow
    def writes(n: int) -> None:
        for i in range(n):
            compose.write_stream("values", i)

    steps.run(1)
    writes.run(1)
    best_step = best_write = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        steps.run(n)
        best_step = min(best_step, time.perf_counter() - t0)
        t0 = time.perf_counter()
        writes.run(n)
        best_write = min(best_write, time.perf_counter() - t0)
    return {
        "o2_us_per_stream_value": round(best_write / n * 1e6, 2),
        "o2_us_per_w1_step": round(best_step / n * 1e6, 2),
    }


def o3(compose, deltas: int) -> dict:
    from composeai.models.base import RawStreamEvent
    from composeai.testing import FakeModel

    class Ticking(FakeModel):
        """Streams `deltas` text deltas, 5 ms apart, each the time it was sent."""

        def stream(self, request):
            response = self._respond(request)
            for _ in range(deltas):
                time.sleep(0.005)
                yield RawStreamEvent("text_delta", text=repr(time.time()))
            yield RawStreamEvent("response_done", response=response)

    @compose.agent(model=Ticking(["done"]), stream_to="tokens")
    def ticker(x: str) -> str:
        return x

    @compose.flow
    def ticks() -> str:
        return ticker("go")

    handle = ticks.start()
    reader = subprocess.run(
        [sys.executable, "-c", READER, handle.id],
        capture_output=True,
        text=True,
        env=os.environ,
        timeout=300,
        check=True,
    )
    handle.result()
    delays = sorted(float(d) for d in __import__("json").loads(reader.stdout))
    # A reader started after the first deltas reads them late: only those
    # written after its first read count.
    live = delays[len(delays) // 4 :]
    return {
        "o3_token_delay_p50_ms": round(statistics.median(live) * 1e3, 2),
        "o3_token_delay_p99_ms": round(live[int(len(live) * 0.99) - 1] * 1e3, 2),
        "o3_deltas": len(delays),
    }


def o4(compose, store_path: str, n: int) -> dict:
    from datetime import timedelta

    from composeai.retention import compact

    @compose.task
    def step(x: int) -> int:
        return x + 1

    @compose.flow
    def pruned(x: int) -> int:
        compose.set_event("x", x)
        return step(step(step(x)))

    for i in range(n):
        pruned.run(i)
    compose._engine.get_store().flush()
    before = _bytes(store_path)
    t0 = time.perf_counter()
    deleted = compose.delete_runs(older_than=timedelta(0), name="pruned")
    elapsed = time.perf_counter() - t0
    assert deleted == n, deleted
    after = _bytes(store_path)
    sizes = compact()
    return {
        "o4_runs": n,
        "o4_prune_runs_per_s": round(n / elapsed),
        "o4_bytes_before": before,
        "o4_bytes_after_prune": after,
        "o4_bytes_after_vacuum": sizes[1] if sizes else None,
    }


def main() -> None:
    p = parser(__doc__.splitlines()[0], 2000)
    p.add_argument("--runs", type=int, default=1_000_000, help="O1's store size")
    p.add_argument("--prune", type=int, default=5000, help="O4's run count")
    p.add_argument("--deltas", type=int, default=400, help="O3's text deltas")
    args = p.parse_args()
    state = fresh_store("o")
    import composeai as compose

    store_path = os.path.join(state, "runs.db")
    out = {"workload": "O"}
    out.update(o2(compose, args.n))
    out.update(o3(compose, args.deltas))
    out.update(o4(compose, store_path, args.prune))
    out.update(o1(compose, store_path, args.runs))
    emit(out)


if __name__ == "__main__":
    main()
