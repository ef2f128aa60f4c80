"""WAL pages per commit: what each commit of a workload writes, by table and index.

Every commit appends each page it changed to the WAL as a whole frame (the
store's page size: 2 KiB for a new store), so pages per commit is the store's
write amplification. This script keeps the WAL from restarting while it
measures (a read transaction is held open on the store by this process's own
`sqlite3`, which is the engine's SQLite library: see README), runs a
workload, then reads the WAL's frame headers and names each page's B-tree
with the `dbstat` table. Workloads:

* `g1`: `thread.run()` of bench/g_graph.py's 3-node linear graph;
* `w1`: one journaled `@task` step of bench/w1_steps.py's flow;
* `w5`: one standalone FakeModel text agent call of bench/w5_agent.py (in
  the store `w1` opened: a process opens one store).

Prints one JSON line: per workload, commits and frames per unit (a graph run,
a step) and the pages per unit by B-tree name.
"""

from __future__ import annotations

import collections
import os
import sqlite3
import struct

from _common import emit, parser, temp_dir

WAL_HEADER, FRAME_HEADER = 32, 24


def wal_commits(db: str) -> list[list[int]]:
    """The page numbers of each commit in `db`'s WAL, oldest first."""
    with open(db + "-wal", "rb") as f:
        header = f.read(WAL_HEADER)
        page_size = struct.unpack(">I", header[8:12])[0]
        salts = header[16:24]
        commits, pages = [], []
        while True:
            frame = f.read(FRAME_HEADER)
            if len(frame) < FRAME_HEADER or frame[8:16] != salts:
                break
            f.seek(page_size, os.SEEK_CUR)
            pgno, commit_size = struct.unpack(">II", frame[:8])
            pages.append(pgno)
            if commit_size:
                commits.append(pages)
                pages = []
    return commits


def measure(db: str, units: int, work) -> dict:
    """Runs `work()` `units` times with the WAL held, and sums what it wrote."""
    hold = sqlite3.connect(db, isolation_level=None)
    hold.execute("BEGIN")
    hold.execute("SELECT count(*) FROM sqlite_master").fetchone()
    # The WAL may have started over without shrinking: skip its valid commits.
    before = len(wal_commits(db))
    for _ in range(units):
        work()
    commits = wal_commits(db)[before:]
    hold.execute("COMMIT")
    dbstat = sqlite3.connect(db).execute("SELECT name, pageno FROM dbstat")
    names = {pgno: name for name, pgno in dbstat}
    by_name = collections.Counter(names.get(p, "(free or new)") for c in commits for p in c)
    frames = sum(len(c) for c in commits)
    return {
        "units": units,
        "commits_per_unit": round(len(commits) / units, 2),
        "frames_per_unit": round(frames / units, 2),
        "frames_per_commit": round(frames / max(1, len(commits)), 2),
        "pages_per_unit_by_btree": {
            k: round(v / units, 2) for k, v in sorted(by_name.items(), key=lambda kv: -kv[1])
        },
    }


def g1(units: int) -> dict:
    from composeai.graph import END, Graph

    directory = temp_dir("wal-g1")
    linear = Graph(name="linear")
    for name in "abc":
        linear.add_node(name, lambda s: {"x": s["x"] + 1})
    linear.start("a").edge("a", "b").edge("b", "c").edge("c", END)
    db = os.path.join(directory, "runs.db")
    app = linear.compile(f"sqlite:///{db}")
    thread = app.thread("t")
    for _ in range(20):
        thread.run({"x": 0})
    app._store().flush()
    return measure(db, units, lambda: thread.run({"x": 0}))


def w1(units: int) -> dict:
    directory = temp_dir("wal-w1")
    os.environ["COMPOSE_DIR"] = directory
    import composeai as compose
    from composeai import _engine

    @compose.task
    def inc(x):
        return x + 1

    @compose.flow
    def steps(n):
        x = 0
        for _ in range(n):
            x = inc(x)
        return x

    steps.run(1)
    db = os.path.join(directory, "runs.db")
    # One run: the claim and the settlement are spread over its steps.
    result = measure(db, 1, lambda: steps.run(units))
    _engine.get_store().flush()
    result["units"] = units
    for key in ("commits_per_unit", "frames_per_unit"):
        result[key] = round(result[key] / units, 2)
    result["pages_per_unit_by_btree"] = {
        k: round(v / units, 3) for k, v in result["pages_per_unit_by_btree"].items()
    }
    return result


def w5(units: int) -> dict:
    from composeai import _engine, agent
    from composeai.testing import FakeModel

    model = FakeModel(["hello"] * (units + 20))

    @agent(model=model)
    def greeter(name: str) -> str:
        """Greet the user."""
        return f"Say hello to {name}."

    for i in range(20):
        greeter.run(f"warm-up {i}")
    _engine.get_store().flush()
    db = os.path.join(os.environ["COMPOSE_DIR"], "runs.db")
    calls = iter(range(units))
    return measure(db, units, lambda: greeter.run(f"user {next(calls)}"))


def main() -> None:
    args = parser(__doc__.splitlines()[0], 200).parse_args()
    emit(
        {
            "workload": "wal_pages",
            "g1": g1(args.n),
            "w1": w1(args.n * 5),
            "w5": w5(args.n),
        }
    )


if __name__ == "__main__":
    main()
