"""G1/G2: graph workflows with a thread, next to LangGraph with its SQLite checkpointer.

* G1: microseconds per node step of a 3-node linear graph run on a thread
  (`thread.run()` repeated; each run is 3 node steps, each checkpointed), the
  fastest of 10 alternating rounds on each side;
* G2: store bytes per step of a thread whose state holds a growing message list
  (200 messages to start, one appended per run), after 100 and after 1,000 steps.

The LangGraph half runs in its own virtualenv (created on first use under
bench/.venv-langgraph with `langgraph` and `langgraph-checkpoint-sqlite`), as a
subprocess of this script, on the same machine in the same invocation. Both sides
use SQLite in WAL mode with synchronous=NORMAL. `--no-langgraph` skips it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from _common import BENCH_DIR, emit, parser, temp_dir

LG_VENV = os.path.join(BENCH_DIR, ".venv-langgraph")
# G1 is timed in this many rounds on each side, alternating; the fastest
# round of each side counts (a slow round measures the neighbours).
ROUNDS = 10

LANGGRAPH_SCRIPT = r"""
import json, operator, os, sqlite3, sys, time
from typing import Annotated, TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

mode, n, directory = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def connect(name):
    conn = sqlite3.connect(os.path.join(directory, name), check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def size(conn, name):
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    path = os.path.join(directory, name)
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


class Linear(TypedDict):
    x: int


b = StateGraph(Linear)
b.add_node("a", lambda s: {"x": s["x"] + 1})
b.add_node("b", lambda s: {"x": s["x"] + 1})
b.add_node("c", lambda s: {"x": s["x"] + 1})
b.add_edge(START, "a")
b.add_edge("a", "b")
b.add_edge("b", "c")
b.add_edge("c", END)
if mode == "g1":
    conn = connect("g1.db")
    app = b.compile(checkpointer=SqliteSaver(conn))
    cfg = {"configurable": {"thread_id": "t"}}
    for _ in range(20):
        app.invoke({"x": 0}, cfg)
    t0 = time.perf_counter()
    for _ in range(n):
        app.invoke({"x": 0}, cfg)
    print(json.dumps({"g1_us_per_node_step": (time.perf_counter() - t0) / (n * 3) * 1e6}))
    sys.exit(0)


class Chat(TypedDict):
    messages: Annotated[list, operator.add]


c = StateGraph(Chat)
c.add_node(
    "say", lambda s: {"messages": [{"role": "user", "text": f"message {len(s['messages'])}"}]}
)
c.add_edge(START, "say")
c.add_edge("say", END)
conn2 = connect("g2.db")
chat = c.compile(checkpointer=SqliteSaver(conn2))
cfg = {"configurable": {"thread_id": "long"}}
chat.invoke({"messages": [{"role": "user", "text": "x" * 80} for _ in range(200)]}, cfg)
base = size(conn2, "g2.db")
per_step = {}
for i in range(1, n + 1):
    chat.invoke({"messages": []}, cfg)
    if i in (100, n):
        per_step[i] = (size(conn2, "g2.db") - base) / i
print(json.dumps({"g2_bytes_per_step": per_step}))
"""


def _langgraph_python() -> str:
    python = os.path.join(LG_VENV, "bin", "python")
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", LG_VENV], check=True)
    probe = subprocess.run(
        [python, "-c", "import langgraph.checkpoint.sqlite"], capture_output=True, check=False
    )
    if probe.returncode != 0:
        subprocess.run(
            [python, "-m", "pip", "install", "-q", "langgraph", "langgraph-checkpoint-sqlite"],
            check=True,
            stdout=sys.stderr,
        )
    return python


def langgraph(python: str, mode: str, n: int) -> dict:
    out = subprocess.run(
        [python, "-c", LANGGRAPH_SCRIPT, mode, str(n), temp_dir("g-langgraph")],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def langgraph_version(python: str) -> str:
    return subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('langgraph'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def composeai_g1():
    """A thread of the 3-node graph; returns `round(n)` -> us per node step."""
    from composeai.graph import END, Graph

    directory = temp_dir("g-composeai")
    linear = Graph(name="linear")
    linear.add_node("a", lambda s: {"x": s["x"] + 1})
    linear.add_node("b", lambda s: {"x": s["x"] + 1})
    linear.add_node("c", lambda s: {"x": s["x"] + 1})
    linear.start("a").edge("a", "b").edge("b", "c").edge("c", END)
    thread = linear.compile(f"sqlite:///{directory}/g1/runs.db").thread("t")
    for _ in range(20):
        thread.run({"x": 0})

    def round_(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            thread.run({"x": 0})
        return (time.perf_counter() - t0) / (n * 3) * 1e6

    return round_


MEASURE = """
import os, sqlite3, sys
db = os.path.join(sys.argv[1], "runs.db")
conn = sqlite3.connect(db)
conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
conn.close()
print(sum(os.path.getsize(p) for p in (db, db + "-wal") if os.path.exists(p)))
"""


def store_bytes(directory: str) -> int:
    """The store's size after folding its WAL in, measured by another process."""
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, directory], capture_output=True, text=True, check=True
    )
    return int(out.stdout)


def composeai_g2(n_bytes: int) -> dict:
    from composeai.graph import END, Graph

    directory = temp_dir("g-composeai")

    chat = Graph(reducers={"messages": "append"}, name="chat")
    chat.add_node(
        "say", lambda s: {"messages": [{"role": "user", "text": f"message {len(s['messages'])}"}]}
    )
    chat.start("say").edge("say", END)
    g2_dir = os.path.join(directory, "g2")
    long = chat.compile(f"sqlite:///{g2_dir}/runs.db").thread("long")
    long.run({"messages": [{"role": "user", "text": "x" * 80} for _ in range(200)]})
    long.graph._store().flush()
    base = store_bytes(g2_dir)
    per_step = {}
    for i in range(1, n_bytes + 1):
        long.run()
        if i in (100, n_bytes):
            long.graph._store().flush()
            per_step[i] = (store_bytes(g2_dir) - base) / i
    assert len(long.state()["messages"]) == 200 + n_bytes + 1
    return per_step


def main() -> None:
    p = parser(__doc__.splitlines()[0], 2000)
    p.add_argument("--steps", type=int, default=1000, help="G2 thread steps (default 1000)")
    p.add_argument("--no-langgraph", action="store_true", help="skip the LangGraph side")
    args = p.parse_args()
    python = None if args.no_langgraph else _langgraph_python()
    ours_round = composeai_g1()
    ours, theirs = [], []
    per_round = max(1, args.n // ROUNDS)
    # Rounds alternate between the two sides so that both see the same
    # neighbours on this shared machine.
    for _ in range(ROUNDS):
        ours.append(ours_round(per_round))
        if python is not None:
            theirs.append(langgraph(python, "g1", per_round)["g1_us_per_node_step"])
    g2 = composeai_g2(args.steps)
    result = {
        "workload": "G",
        "g1_runs": per_round * ROUNDS,
        "g1_us_per_node_step": round(min(ours), 1),
        "g2_steps": args.steps,
        "g2_bytes_per_step": {str(k): round(v, 1) for k, v in g2.items()},
    }
    if python is not None:
        lg2 = langgraph(python, "g2", args.steps)["g2_bytes_per_step"]
        result["langgraph_version"] = langgraph_version(python)
        result["langgraph_g1_us_per_node_step"] = round(min(theirs), 1)
        result["g1_speedup"] = round(min(theirs) / min(ours), 1)
        result["langgraph_g2_bytes_per_step"] = {k: round(v, 1) for k, v in lg2.items()}
    emit(result)


if __name__ == "__main__":
    main()
