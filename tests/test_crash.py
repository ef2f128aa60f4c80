"""Crash safety with real `kill -9` (FLOW-17, FLOW-19, FLOW-20, OBS-2, FLOW-18).

A campaign runs many scenarios. Each scenario executes one durable run of `crashy` (30
sequential tasks, a `map` of a task over 5 items, `now()`, `random()`, a task consuming both,
and an `approve` gate) in a fresh state dir, as a chain of child processes P0, P1, ...: each
child starts the run (no run row yet) or resumes it (with the gate's answer once the run is
paused). The driver SIGKILLs a child after a seeded random delay drawn uniformly over the
child's expected remaining work (timed once per campaign on an uninterrupted scenario, see
`Timing`), up to a seeded per-scenario kill budget, and stops when a child returns `completed`.
Kills thus land anywhere: before the store exists, inside schema creation, between a task's
side effect and its journal commit, inside `map` workers, around `now`/`random`, while the
answer is recorded, during settlement and during interpreter exit.

Every task body appends one line `name, arg, input, <process label>` to a side-effect log (one
`write` on an O_APPEND descriptor: a line is whole or absent) and returns its value together
with its process label, so the journal records which process's execution was committed.

Invariants checked for each scenario (all must hold for any kill timing):

* every child but the last was SIGKILLed or returned `paused`; the last returned `completed`
  with the right output (deterministic given the inputs, plus the journaled `now`/`random`);
* `PRAGMA integrity_check` is `ok`; exactly one run row, `completed`, whose `output_json` is
  that output; the journal holds exactly the expected keys with the expected values;
* at-most-once for committed steps. For a task step K let `c(K)` be the process whose value
  the journal holds (first write wins) and `E(K)` the processes whose log has a line for K:
  - `c(K)` is in `E(K)` (the committed value came from an execution that happened);
  - no process appears twice in `E(K)` (a step never re-runs within a process);
  - no process later than `c(K)` is in `E(K)`: once a step's journal write has landed, every
    later attempt replays it. (This is sound: processes run strictly one after another and
    each is reaped before the next starts; a commit returns only after the transaction
    committed, so any later process's journal snapshot, FLOW-19, contains it.);
  - every process in `E(K)` other than `c(K)` was SIGKILLed: an execution whose value was not
    journaled is only possible when the process died between the body's side effect and the
    journal commit (FLOW-20). Hence K ran at most 1 + (number of kills) times;
  - commits respect data flow: `c(step#i) <= c(step#i+1)`, `c(step#30) <= c(map item)`,
    `c(map item) <= c(stamp#1)` in process order (a step's input comes from a committed
    value, so no step can be committed by an earlier process than the steps it consumed);
  - every execution (committed or not) saw the journaled inputs: the `acc` each `step` got is
    the previous step's value, and every `stamp` execution got the journaled `random#1` and
    `now#1` values (a lost first-write-wins race returns the winner's value, FLOW-17).
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
import signal
import sqlite3
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

try:
    import _proc
except ImportError:  # pragma: no cover - when tests/ is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _proc

N_STEPS = 30
N_ITEMS = 5
MOD = 1_000_003

_TASKS = """\
import time

from composeai import amap, anow, approve, arandom, flow, map, now, random, task

N_STEPS = 30
N_ITEMS = 5
MOD = 1_000_003


@task
def step(i: int, acc: int) -> dict:
    side_effect("step", i, acc)
    time.sleep(0.001 * (1 + i % 3))
    return {"v": (acc * 31 + i * 7 + 1) % MOD, "proc": PROC}


@task
def square(item) -> dict:
    k, x = item
    side_effect("square", k, x)
    time.sleep(0.002)
    return {"v": (x * x + k) % MOD, "proc": PROC}


@task
def stamp(x, t) -> dict:
    side_effect("stamp", repr(x), t.isoformat())
    time.sleep(0.001)
    return {"x": x, "t": t.isoformat(), "proc": PROC}
"""

FLOWS = {
    "sync": _TASKS
    + """

@flow
def crashy(seed: int) -> dict:
    acc = seed
    for i in range(N_STEPS):
        acc = step(i, acc)["v"]
    squares = [r["v"] for r in map(square, [(k, acc + k) for k in range(N_ITEMS)])]
    t = now()
    x = random()
    s = stamp(x, t)
    published = approve("publish", {"acc": acc})
    return {
        "acc": acc,
        "squares": squares,
        "t": t.isoformat(),
        "x": x,
        "stamp": [s["x"], s["t"]],
        "published": published,
    }
""",
    "async": _TASKS
    + """

@flow
async def crashy(seed: int) -> dict:
    acc = seed
    for i in range(N_STEPS):
        acc = (await step.arun(i, acc))["v"]
    squares = [r["v"] for r in await amap(square, [(k, acc + k) for k in range(N_ITEMS)])]
    t = await anow()
    x = await arandom()
    s = await stamp.arun(x, t)
    published = approve("publish", {"acc": acc})
    return {
        "acc": acc,
        "squares": squares,
        "t": t.isoformat(),
        "x": x,
        "stamp": [s["x"], s["t"]],
        "published": published,
    }
""",
}

CHILD = """
import os
import {module} as m
from composeai import resume
mode = os.environ["MODE"]
if os.environ.get("PREIMPORT"):
    # Calibration: a paused Run imports pydantic for its Interrupt; do it before timing starts.
    from composeai import Interrupt
print("READY", flush=True)
if mode == "start":
    run = m.crashy.run(int(os.environ["SEED"]))
elif mode == "resume":
    run = resume(os.environ["RUN_ID"])
else:
    run = resume(os.environ["RUN_ID"], answers={{"publish": True}})
emit(
    status=run.status,
    run_id=run.id,
    output=run.output,
    pending=None if run.pending is None else run.pending.id,
)
"""

STEP_KEYS = [f"step#{i + 1}" for i in range(N_STEPS)]
ITEM_KEYS = [f"map#1[{k}]/square#1" for k in range(N_ITEMS)]
TASK_KEYS = set(STEP_KEYS) | set(ITEM_KEYS) | {"stamp#1"}
ALL_KEYS = TASK_KEYS | {"now#1", "random#1", "__interrupt__:publish"}

# Kill delays: uniform over [0, window], the window estimated from uninterrupted calibration
# scenarios (`Timing`, all times from the child's READY line, i.e. with imports done). While
# steps remain it is `t_start * (rows still missing / rows of a paused run) + t_answer`, so a
# fresh start or an early resume is killed anywhere in its ~30-step run up to the pause; once
# only the answer remains it is `t_end`, so that child (record the answer, replay 38 steps,
# settle, exit) is killed anywhere in its few milliseconds. The end phase has its own small
# kill budget so that the per-scenario budget is not mostly spent there.
PAUSED_ROWS = len(ALL_KEYS) - 1
MAX_KILLS_PER_SCENARIO = 8
MAX_END_KILLS_PER_SCENARIO = 2
CALIBRATION_RUNS = 3
MAX_PROCS_PER_SCENARIO = 60
# Default suite, on each store: 4 campaigns x 60 = 240 kills. Slow: 2 x 1000.
KILLS_PER_CAMPAIGN = 60
SLOW_KILLS_PER_CAMPAIGN = 1000


@dataclass
class Expected:
    chain: list[int]  # chain[i] = value of step#(i+1)
    squares: list[int]

    @property
    def acc(self) -> int:
        return self.chain[-1]


def expected(seed: int) -> Expected:
    acc, chain = seed, []
    for i in range(N_STEPS):
        acc = (acc * 31 + i * 7 + 1) % MOD
        chain.append(acc)
    squares = [((acc + k) * (acc + k) + k) % MOD for k in range(N_ITEMS)]
    return Expected(chain, squares)


@dataclass
class Timing:
    start: float  # READY -> RESULT of a start process, which runs up to the gate
    answer: float  # READY -> RESULT of the answering process
    end: float  # READY -> exit of the answering process

    def window(self, rows: int) -> float:
        if rows >= PAUSED_ROWS:
            return self.end
        return self.start * (PAUSED_ROWS - max(rows, 0)) / PAUSED_ROWS + self.answer


@dataclass
class Proc:
    label: str
    mode: str
    result: _proc.Result
    rows: int  # journal rows after the process ended (-1: no run row yet)
    seconds: tuple[float, float] | None  # READY -> (RESULT, exit), measured when not killing


def journal_rows(box: _proc.Sandbox) -> int:
    ids = box.run_ids()
    return len(box.journal(ids[0])) if ids else -1


def drive(
    box: _proc.Sandbox,
    module: str,
    seed: int,
    rng: random.Random,
    timing: Timing | None,
    max_kills: int = 0,
    max_end_kills: int = 0,
) -> list[Proc]:
    """Runs one scenario to completion, killing up to `max_kills` children while steps remain
    and up to `max_end_kills` once only the answer remains (none when `timing` is None: then
    it measures)."""
    procs: list[Proc] = []
    kills = {False: 0, True: 0}  # by "only the answer remains"
    body = CHILD.format(module=module)
    while True:
        assert len(procs) < MAX_PROCS_PER_SCENARIO, [(p.mode, p.result.returncode) for p in procs]
        ids = box.run_ids()
        assert len(ids) <= 1, ids
        if not ids:
            mode, run_id, rows = "start", "", 0
        else:
            run_id = ids[0]
            mode = "answer" if box.run_row(run_id)["status"] == "paused" else "resume"
            rows = len(box.journal(run_id))
        label = f"p{len(procs)}"
        # Drawn for every child, so the draws do not depend on earlier outcomes.
        fraction = rng.random()
        child = box.spawn(
            body,
            MODE=mode,
            RUN_ID=run_id,
            SEED=str(seed),
            PROC=label,
            PREIMPORT="1" if timing is None else "",
        )
        ready = _proc.read_line(child)
        if ready != "READY\n":
            raise AssertionError(_proc.finish(child, prefix=ready).describe())
        ready_at = time.monotonic()
        seconds = None
        if timing is None:
            line = _proc.read_line(child)
            to_result = time.monotonic() - ready_at
            result = _proc.finish(child, prefix=ready + line)
            seconds = (to_result, time.monotonic() - ready_at)
        else:
            end = rows >= PAUSED_ROWS
            if kills[end] < (max_end_kills if end else max_kills):
                time.sleep(fraction * timing.window(rows))
                if child.poll() is None:
                    child.send_signal(signal.SIGKILL)
            result = _proc.finish(child, prefix=ready)
        procs.append(Proc(label, mode, result, journal_rows(box), seconds))
        if result.killed:
            kills[rows >= PAUSED_ROWS] += 1
            continue
        data = result.ok()
        if data["status"] == "completed":
            return procs
        assert (data["status"], data["pending"]) == ("paused", "publish"), data


def check_scenario(box: _proc.Sandbox, procs: list[Proc], seed: int) -> None:
    """The invariants in the module docstring."""
    final = procs[-1].result.ok()
    assert final["status"] == "completed", final
    for p in procs[:-1]:
        assert p.result.killed or p.result.ok()["status"] == "paused", p.result.describe()
    want = expected(seed)
    out = final["output"]
    assert out["acc"] == want.acc
    assert out["squares"] == want.squares
    assert out["published"] is True
    assert out["stamp"] == [out["x"], out["t"]]

    assert box.integrity_ok()
    (run_id,) = box.run_ids()
    assert final["run_id"] == run_id
    row = box.run_row(run_id)
    assert (row["status"], row["error_json"]) == ("completed", None)
    assert json.loads(row["output_json"]) == out

    journal = {k: json.loads(v) for k, v in box.journal(run_id).items()}
    assert set(journal) == ALL_KEYS, sorted(set(journal) ^ ALL_KEYS)
    for key, value in zip(STEP_KEYS, want.chain):
        assert journal[key]["v"] == value, key
    for key, value in zip(ITEM_KEYS, want.squares):
        assert journal[key]["v"] == value, key
    assert journal["random#1"] == out["x"]
    assert journal["now#1"] == {"$kind": "datetime", "value": out["t"]}
    assert [journal["stamp#1"]["x"], journal["stamp#1"]["t"]] == [out["x"], out["t"]]
    assert journal["__interrupt__:publish"] is True

    order = {p.label: n for n, p in enumerate(procs)}
    killed = {p.label for p in procs if p.result.killed}
    executions: dict[str, list[str]] = defaultdict(list)
    for line in box.side_effects():
        assert len(line) == 4, line
        name, arg, seen, label = line
        assert label in order, line
        if name == "step":
            i = int(arg)
            key = STEP_KEYS[i]
            assert int(seen) == (want.chain[i - 1] if i else seed), f"{key} got input {line}"
        elif name == "square":
            k = int(arg)
            key = ITEM_KEYS[k]
            assert int(seen) == want.acc + k, f"{key} got input {line}"
        else:
            assert name == "stamp", line
            key = "stamp#1"
            assert (float(arg), seen) == (out["x"], out["t"]), f"stamp got {line}"
        executions[key].append(label)
    assert set(executions) == TASK_KEYS, f"never executed: {sorted(TASK_KEYS - set(executions))}"

    committer = {key: journal[key]["proc"] for key in TASK_KEYS}
    for key in sorted(TASK_KEYS):
        ran_in = executions[key]
        c = committer[key]
        where = f"{key}: executed in {ran_in}, committed by {c}, killed {sorted(killed)}"
        assert c in ran_in, where
        assert len(ran_in) == len(set(ran_in)), "re-ran within one process: " + where
        assert all(order[p] <= order[c] for p in ran_in), "re-ran after its commit: " + where
        assert all(p in killed for p in ran_in if p != c), "uncommitted, not killed: " + where
        assert len(ran_in) <= 1 + len(killed), where
    for a, b in itertools.pairwise(STEP_KEYS):
        assert order[committer[a]] <= order[committer[b]], (a, b, committer)
    for key in ITEM_KEYS:
        assert order[committer[STEP_KEYS[-1]]] <= order[committer[key]], (key, committer)
        assert order[committer[key]] <= order[committer["stamp#1"]], (key, committer)


@dataclass
class Campaign:
    kills: int = 0
    scenarios: int = 0
    processes: int = 0
    seconds: float = 0.0
    timing: Timing | None = None
    rows_at_kill: Counter = field(default_factory=Counter)  # -1: no run row yet

    def line(self, variant: str) -> str:
        t = self.timing
        return (
            f"[crash {variant}] {self.kills} kills, {self.scenarios} scenarios, "
            f"{self.processes} processes, {self.seconds:.1f}s (uninterrupted: start "
            f"{t.start * 1000:.0f}ms, answer {t.answer * 1000:.0f}ms (exit {t.end * 1000:.0f}ms)); "
            f"journal rows after "
            f"each kill: {sorted(self.rows_at_kill.items())}"
        )


def campaign(root: Path, variant: str, seed: int, target_kills: int) -> Campaign:
    started = time.monotonic()
    rng = random.Random(seed)
    base = _proc.Sandbox(root)
    module = f"crashy_{variant}"
    base.write_module(module, FLOWS[variant])
    report = Campaign()

    # Calibration: uninterrupted scenarios (also checking the zero-kill case); the fastest
    # times count, as the first processes run against cold caches.
    timings = []
    for n in range(CALIBRATION_RUNS):
        box = base.child(f"calibration{n}")
        procs = drive(box, module, seed + n, rng, None)
        check_scenario(box, procs, seed + n)
        assert [p.mode for p in procs] == ["start", "answer"]
        timings.append((procs[0].seconds[0], procs[1].seconds[0], procs[1].seconds[1]))
        report.processes += len(procs)
    report.timing = Timing(*(min(column) for column in zip(*timings)))

    max_scenarios = target_kills * 4
    while report.kills < target_kills:
        assert report.scenarios < max_scenarios, report.line(variant)
        box = base.child(f"s{report.scenarios}")
        flow_seed = rng.randrange(1, MOD)
        max_kills = rng.randint(1, MAX_KILLS_PER_SCENARIO)
        max_end_kills = rng.randint(0, MAX_END_KILLS_PER_SCENARIO)
        procs = drive(box, module, flow_seed, rng, report.timing, max_kills, max_end_kills)
        check_scenario(box, procs, flow_seed)
        for p in procs:
            if p.result.killed:
                report.kills += 1
                report.rows_at_kill[p.rows] += 1
        report.processes += len(procs)
        report.scenarios += 1
        shutil.rmtree(box.state.parent)
    report.seconds = time.monotonic() - started
    return report


@pytest.mark.parametrize(
    ("variant", "seed"), [("sync", 101), ("async", 202), ("sync", 303), ("async", 404)]
)
def test_kill9_at_random_points_then_resume(tmp_path, variant, seed, store_kind):
    # The same campaigns on both stores (STORE-2).
    report = campaign(tmp_path, variant, seed, KILLS_PER_CAMPAIGN)
    print(report.line(variant))
    assert report.kills >= KILLS_PER_CAMPAIGN


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "seed"), [("sync", 9001), ("async", 9002)])
def test_kill9_sweep_slow(tmp_path, variant, seed, store_kind):
    report = campaign(tmp_path, variant, seed, SLOW_KILLS_PER_CAMPAIGN)
    print(report.line(variant))
    assert report.kills >= SLOW_KILLS_PER_CAMPAIGN


# ---------------------------------------------------------------------------
# Stores that are not ours (OBS-2)

TINY = """\
from composeai import flow, task


@task
def double(x: int) -> int:
    side_effect("double", x)
    return 2 * x


@flow
def tiny(x: int) -> int:
    return double(x) + 1
"""

RUN_TINY = """
import tiny
run = tiny.tiny.run(20)
emit(status=run.status, output=run.output)
"""


def _sqlite_file(path: Path, statements: list[str]) -> None:
    conn = sqlite3.connect(path)
    try:
        for sql in statements:
            conn.execute(sql)
        conn.commit()
    finally:
        conn.close()


def _random_bytes(path: Path) -> None:
    path.write_bytes(random.Random(1234).randbytes(16384))


def _foreign_schema(path: Path) -> None:
    _sqlite_file(
        path,
        [
            "CREATE TABLE inventory(id INTEGER PRIMARY KEY, item TEXT NOT NULL, qty INTEGER)",
            "INSERT INTO inventory(item, qty) VALUES('bolts', 12), ('nuts', 40)",
        ],
    )


def _future_version(path: Path) -> None:
    _sqlite_file(
        path,
        [
            "CREATE TABLE runs(run_id TEXT PRIMARY KEY, status TEXT)",
            "INSERT INTO runs VALUES('01FUTURE', 'completed')",
            "PRAGMA user_version = 99",
        ],
    )


def _legacy_version_without_its_tables(path: Path) -> None:
    _sqlite_file(path, ["CREATE TABLE runs(run_id TEXT PRIMARY KEY)", "PRAGMA user_version = 1"])


@pytest.mark.parametrize(
    ("make", "must_mention", "error_type"),
    [
        (_random_bytes, ["not a composeai store"], "StoreError"),
        (_foreign_schema, ["not a composeai store"], "StoreError"),
        (_future_version, ["99"], "ConfigError"),
        (_legacy_version_without_its_tables, ["not a composeai store"], "StoreError"),
    ],
    ids=["random-bytes", "foreign-schema", "user-version-99", "user-version-1-not-ours"],
)
@pytest.mark.sqlite_file
def test_a_store_that_is_not_ours_is_refused_untouched(tmp_path, make, must_mention, error_type):
    box = _proc.Sandbox(tmp_path)
    box.write_module("tiny", TINY)
    box.state.mkdir(mode=0o700)
    make(box.db_path)
    before = box.db_path.read_bytes()
    files_before = sorted(p.name for p in box.state.iterdir())

    for attempt in range(2):  # refusing must be repeatable: nothing was half-changed
        err = box.run(RUN_TINY, PROC=f"p{attempt}").error()
        assert (err["error_type"], err["error_module"]) == (error_type, "composeai.errors"), err
        assert str(box.db_path) in err["message"], err["message"]
        for text in must_mention:
            assert text in err["message"], err["message"]

    assert box.db_path.read_bytes() == before, "the foreign file was modified"
    assert sorted(p.name for p in box.state.iterdir()) == files_before
    assert box.side_effects() == [], "nothing may run against a store we cannot use"


# ---------------------------------------------------------------------------
# A step value that cannot be encoded (FLOW-18)

FRAGILE = """\
from composeai import flow, task


def make(x):
    return object()


@task
def first(x: int) -> int:
    side_effect("first", x)
    return x + 1


@task
def second(x: int) -> int:
    side_effect("second", x)
    return x * 2


@task
def bad(x: int):
    side_effect("bad", x)
    return make(x)


@flow
def fragile(x: int) -> dict:
    a = first(x)
    b = second(a)
    c = bad(b)
    return {"a": a, "b": b, "c": c}
"""

FRAGILE_START = """
import fragile
run = fragile.fragile.run(5)
emit(status=run.status, output=run.output)
"""

FRAGILE_RESUME = """
import os
import fragile
from composeai import resume
run = resume(os.environ["RUN_ID"])
emit(status=run.status, output=run.output)
"""


def test_unencodable_step_value_fails_the_run_and_keeps_earlier_steps(tmp_path):
    box = _proc.Sandbox(tmp_path)
    box.write_module("fragile", FRAGILE)

    err = box.run(FRAGILE_START, PROC="A").error()
    assert (err["error_type"], err["error_module"]) == ("SerializationError", "composeai.errors")
    assert err["message"].startswith("step 'bad#1': "), err["message"]
    (run_id,) = box.run_ids()
    row = box.run_row(run_id)
    assert row["status"] == "failed"
    assert json.loads(row["error_json"]) == {
        "type": "SerializationError",
        "message": err["message"],
    }
    assert row["output_json"] is None
    journal = box.journal(run_id)
    assert {k: json.loads(v) for k, v in journal.items()} == {"first#1": 6, "second#1": 12}
    assert box.integrity_ok()

    # Same code, another process: the journaled steps replay, the bad one fails the same way.
    again = box.run(FRAGILE_RESUME, RUN_ID=run_id, PROC="B").error()
    assert (again["error_type"], again["message"]) == ("SerializationError", err["message"])
    assert box.run_row(run_id)["status"] == "failed"
    assert box.journal(run_id) == journal
    assert box.side_effects() == [
        ("first", "5", "A"),
        ("second", "6", "A"),
        ("bad", "12", "A"),
        ("bad", "12", "B"),
    ]

    # Fix the task (the flow's own source, hence its fingerprint, is unchanged) and resume.
    path = tmp_path / "fragile.py"
    path.write_text(path.read_text().replace("return object()", 'return {"ok": x}'))
    done = box.run(FRAGILE_RESUME, RUN_ID=run_id, PROC="C").ok()
    assert done == {"status": "completed", "output": {"a": 6, "b": 12, "c": {"ok": 12}}}
    assert [e for e in box.side_effects() if e[0] != "bad"] == [
        ("first", "5", "A"),
        ("second", "6", "A"),
    ]
    assert box.side_effects()[-1] == ("bad", "12", "C")
    assert box.run_row(run_id)["status"] == "completed"
