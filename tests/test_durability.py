"""Durability modes (issue 13): `step` (the default, FLOW-17: a step is durable before its value
is handed back) and `batch` (`COMPOSE_DURABILITY=batch` / `@flow(durability="batch")`: a
step's value is handed back at once and the store's writer group-commits it within 10 ms, in
journal order). Also: a finished flow run's `Run.trace` reads its task-step spans back from the
store (OBS-10, OBS-15, OBS-17 hold for it).

Crash safety in batch mode is checked with real `kill -9` at random moments: every step runs at
most twice, re-executions form a contiguous tail after the last durable step (no gaps in the
journal), the resumed run's output is right and `PRAGMA integrity_check` is `ok`; the steps
lost were the ones that finished within the last 10 ms before the kill.
"""

from __future__ import annotations

import pickle
import random
import signal
import sys
import time
from pathlib import Path

import pytest

import composeai as compose
from composeai import _engine
from composeai.errors import ConfigError
from composeai.tracing import Trace

try:
    import _proc
except ImportError:  # pragma: no cover - when tests/ is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _proc


def journal_of(run_id):
    return dict(_engine.get_store().journal(run_id))


# --------------------------------------------------------------------------- the option


def test_durability_argument_is_validated():
    with pytest.raises(ConfigError) as info:

        @compose.flow(durability="fast")
        def f():
            return 1

    message = str(info.value)
    assert "'fast'" in message and "'step'" in message and "'batch'" in message


def test_compose_durability_is_read_at_each_run_and_validated(monkeypatch):
    @compose.task
    def one():
        return 1

    @compose.flow
    def f():
        return one()

    monkeypatch.setenv("COMPOSE_DURABILITY", "sometimes")
    with pytest.raises(ConfigError) as info:
        f.run()
    message = str(info.value)
    assert "COMPOSE_DURABILITY" in message and "'sometimes'" in message
    assert "'step'" in message and "'batch'" in message
    monkeypatch.setenv("COMPOSE_DURABILITY", "batch")
    assert f.run().output == 1
    monkeypatch.delenv("COMPOSE_DURABILITY")
    assert f.run().output == 1


def test_decorator_argument_wins_over_the_environment(monkeypatch):
    @compose.task
    def one():
        return 1

    @compose.flow(durability="step")
    def f():
        return one()

    monkeypatch.setenv("COMPOSE_DURABILITY", "not-a-mode")
    # The decorator's own mode is used: the bad variable is never consulted.
    assert f.run().output == 1


@pytest.mark.parametrize("store_kind", ["sqlite", "postgresql"], indirect=True)
def test_batch_flow_pauses_resumes_and_replays_in_process(store_kind):
    calls = []

    @compose.task
    def inc(x):
        calls.append(x)
        return x + 1

    @compose.flow(durability="batch")
    def f(n):
        x = 0
        for _ in range(n):
            x = inc(x)
        answer = compose.ask_human("go", "continue?")
        return x, answer

    run = f.run(50)
    assert run.status == "paused"
    # The pause committed every pending step first (FLOW-17 holds at the pause).
    journal = journal_of(run.id)
    assert [journal[f"inc#{i}"] for i in range(1, 51)] == [str(i) for i in range(1, 51)]
    done = compose.resume(run.id, answers={"go": "yes"})
    assert done.status == "completed" and done.output == (50, "yes")
    assert calls == list(range(50)), "a batched step never runs again once durable"
    tasks = [s for s in done.trace.spans if s.kind == "task"]
    assert len(tasks) == 50 and all(s.replayed for s in tasks)


@pytest.mark.sqlite_file
def test_batched_steps_store_the_rows_a_step_durable_run_stores(monkeypatch):
    """Issue 13's batch mode: the journal and span rows a batched run leaves are the ones the
    same run in `step` durability leaves (ids and times aside), steps with and without
    captured content, several tasks and nested steps among them."""
    import sqlite3

    @compose.task
    def inc(x):
        return x + 1

    @compose.task(name="label")
    def label(x, tag="t"):
        return {"tag": tag, "x": [x, None, True]}

    @compose.task
    def outer(x):
        return inc(inc(x))

    def body(n):
        x = 0
        for i in range(n):
            x = inc(x)
            if i % 7 == 3:
                label(x, tag=f"s{i}")
        return outer(x)

    batched = compose.flow(durability="batch", name="rows_batch")(body)
    stepwise = compose.flow(durability="step", name="rows_step")(body)
    runs = [batched.run(300), stepwise.run(300)]
    monkeypatch.setenv("COMPOSE_TRACE_CONTENT", "0")
    runs += [batched.run(40), stepwise.run(40)]
    assert all(r.status == "completed" for r in runs)
    conn = sqlite3.connect(f"{_engine.state_dir()}/runs.db")
    rid = {run_id: r for run_id, r in conn.execute("SELECT run_id, rid FROM runs")}

    def rows(run):
        journal = conn.execute(
            "SELECT step_key, value_json FROM journal WHERE rid = ? ORDER BY step_key",
            (rid[run.id],),
        ).fetchall()
        spans = conn.execute(
            "SELECT s.kind, s.name, s.status, s.flags, s.step_key, s.attributes_json, "
            "s.input_json, s.output_json, s.ended_at IS NULL, s.rid IS NULL, "
            "p.name FROM spans s "
            "LEFT JOIN spans p ON p.span_id = s.parent AND p.tid = s.tid "
            "WHERE s.tid = ? ORDER BY s.sid",
            (-rid[run.id],),
        ).fetchall()
        # The flows' own names differ.
        (flow,) = conn.execute("SELECT name FROM runs WHERE rid = ?", (rid[run.id],)).fetchone()
        return journal, [tuple("<flow>" if v == flow else v for v in row) for row in spans]

    for batch_run, step_run in (runs[:2], runs[2:]):
        journal, spans = rows(batch_run)
        assert (journal, spans) == rows(step_run)
        assert len(journal) >= 40 and sum(1 for s in spans if s[0] == "task") >= 40
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()


# --------------------------------------------------------------------------- flush rules

_FLUSHY = """
import os
import signal

from composeai import ask_human, flow, receive, task


@task
def inc(x):
    side_effect("inc", x)
    return x + 1


@flow(durability="batch")
def to_pause(n):
    x = 0
    for _ in range(n):
        x = inc(x)
    return ask_human("go", "continue?"), x


@flow(durability="batch")
def to_complete(n):
    x = 0
    for _ in range(n):
        x = inc(x)
    return x


@flow(durability="batch")
def to_park(n):
    x = 0
    for _ in range(n):
        x = inc(x)
    return receive("go"), x


@flow(durability="batch")
def to_fail(n):
    x = 0
    for _ in range(n):
        x = inc(x)
    raise ValueError("boom")


def die():
    os.kill(os.getpid(), signal.SIGKILL)
"""

_N = 200


@pytest.mark.parametrize("store_kind", ["sqlite", "postgresql"], indirect=True)
@pytest.mark.parametrize(
    ("flow_name", "status", "park"),
    [
        ("to_pause", "paused", False),
        ("to_complete", "completed", False),
        ("to_park", "paused", True),
        ("to_fail", "failed", False),
    ],
)
def test_settling_commits_every_pending_step_first(tmp_path, flow_name, status, park, store_kind):
    """A pause, a completion, a parked wait (signal) and a failure each commit the pending batch
    before their own row: killed the instant the run returns, nothing is lost."""
    box = _proc.Sandbox(tmp_path)
    box.write_module("flushy", _FLUSHY)
    result = box.run(
        f"""
        import flushy
        try:
            run = flushy.{flow_name}.run({_N}, wait={not park})
            status = run.status
        except ValueError:
            status = "failed"
        flushy.die()
        """
    )
    assert result.killed, result.describe()
    (run_id,) = box.run_ids()
    assert box.run_row(run_id)["status"] == status
    journal = box.journal(run_id)
    assert {f"inc#{i}" for i in range(1, _N + 1)} <= set(journal)
    assert [journal[f"inc#{i}"] for i in range(1, _N + 1)] == [str(i) for i in range(1, _N + 1)]
    if status == "paused" and not park:
        assert [p[0] for p in box.pending(run_id)] == ["go"]


@pytest.mark.parametrize("store_kind", ["sqlite", "postgresql"], indirect=True)
def test_an_answer_and_the_steps_before_a_second_pause_survive_a_kill(tmp_path, store_kind):
    box = _proc.Sandbox(tmp_path)
    box.write_module(
        "answers",
        """
        import os
        import signal

        from composeai import ask_human, flow, task


        @task
        def inc(x):
            side_effect("inc", x)
            return x + 1


        @flow(durability="batch")
        def twice(n):
            x = 0
            for _ in range(n):
                x = inc(x)
            a = ask_human("a", "first?")
            for _ in range(n):
                x = inc(x)
            b = ask_human("b", "second?")
            return a, b, x
        """,
    )
    first = box.run(
        f"""
        import answers
        run = answers.twice.run({_N})
        emit(id=run.id, status=run.status)
        """
    ).ok()
    assert first["status"] == "paused"
    killed = box.run(
        f"""
        import os, signal
        import answers, composeai as compose
        run = compose.resume({first["id"]!r}, answers={{"a": "yes"}})
        assert run.status == "paused", run
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    assert killed.killed, killed.describe()
    journal = box.journal(first["id"])
    assert journal["__interrupt__:a"] == '"yes"'
    assert journal[f"inc#{2 * _N}"] == str(2 * _N)
    last = box.run(
        f"""
        import answers, composeai as compose
        run = compose.resume({first["id"]!r}, answers={{"b": "no"}})
        emit(status=run.status, output=run.output)
        """
    ).ok()
    assert last == {"status": "completed", "output": ["yes", "no", 2 * _N]}
    executions = [int(line[1]) for line in box.side_effects()]
    assert executions == list(range(2 * _N)), "no step ran twice"


# --------------------------------------------------------------------------- kill -9

_LONG = """
import time

from composeai import flow, task

MOD = 1_000_003


@task
def step(i, acc):
    side_effect("step", i)
    time.sleep(0.0005)
    return (acc * 31 + i) % MOD


@flow(durability="batch")
def long_flow(n):
    acc = 0
    for i in range(n):
        acc = step(i, acc)
    return acc
"""

_STEPS = 400


def _expected(n: int) -> int:
    acc = 0
    for i in range(n):
        acc = (acc * 31 + i) % 1_000_003
    return acc


def _prefix_len(journal: dict[str, str]) -> int:
    """The number of durable steps, asserting they are exactly step#1..step#d (no gaps)."""
    keys = {k for k in journal if k.startswith("step#")}
    d = len(keys)
    assert keys == {f"step#{i}" for i in range(1, d + 1)}, f"gap in the journal: {sorted(keys)}"
    return d


def _run_or_resume(module: str, start: str) -> str:
    """A child body that prints READY, then runs `module.start` or, given
    RUN_ID, resumes that run, and emits its status and output."""
    return f"""
        import os
        import sys
        import composeai as compose
        import {module}
        sys.stdout.write("READY\\n")
        sys.stdout.flush()
        run_id = os.environ.get("RUN_ID")
        run = compose.resume(run_id) if run_id else {module}.{start}
        emit(status=run.status, output=run.output)
        """


def _kill_after(box: _proc.Sandbox, body: str, delay: float) -> tuple[_proc.Result, float]:
    """Spawns `body` as process P0 and SIGKILLs it `delay` seconds after it
    is READY: its result and the wall-clock time of the kill."""
    proc = box.spawn(body, PROC="P0")
    assert _proc.read_line(proc).strip() == "READY"
    time.sleep(delay)
    killed_at = time.time()
    proc.send_signal(signal.SIGKILL)
    return _proc.finish(proc), killed_at


@pytest.mark.parametrize("store_kind", ["sqlite", "postgresql"], indirect=True)
@pytest.mark.parametrize("seed", range(6))
def test_kill9_in_batch_mode_reruns_only_a_tail_in_order(tmp_path, seed, store_kind):
    rng = random.Random(seed)
    box = _proc.Sandbox(tmp_path)
    box.write_module("longrun", _LONG)
    body = _run_or_resume("longrun", f"long_flow.run({_STEPS})")
    # Anywhere from before the run row exists to late in the run.
    killed, _ = _kill_after(box, body, rng.uniform(0.0, 0.5))
    run_ids = box.run_ids()
    durable = 0
    if run_ids:
        (run_id,) = run_ids
        durable = _prefix_len(box.journal(run_id))
        first = [int(line[1]) for line in box.side_effects() if line[-1] == "P0"]
        # P0 executed steps 0..m in order; what is durable is a prefix of that.
        assert first == list(range(len(first)))
        assert durable <= len(first) <= _STEPS
        if killed.killed:
            assert box.run_row(run_id)["status"] in ("running", "completed")
        env = {"PROC": "P1", "RUN_ID": run_id}
    else:
        env = {"PROC": "P1"}
    last = box.run(body, **env)
    assert last.ok() == {"status": "completed", "output": _expected(_STEPS)}, last.describe()
    lines = box.side_effects()
    p0 = [int(line[1]) for line in lines if line[-1] == "P0"]
    p1 = [int(line[1]) for line in lines if line[-1] == "P1"]
    if run_ids:
        # The resume re-executes exactly the steps after the last durable one, in order.
        assert p1 == list(range(durable, _STEPS))
        rerun = sorted(set(p0) & set(p1))
        assert rerun == list(range(durable, len(p0))), "re-executions are a contiguous tail"
    counts = {i: (p0 + p1).count(i) for i in range(_STEPS)}
    assert max(counts.values()) <= 2 and min(counts.values()) == 1
    (run_id,) = box.run_ids()
    assert _prefix_len(box.journal(run_id)) == _STEPS
    assert box.integrity_ok()


_TIMED = """
import time

from composeai import flow, task


@task
def step(i):
    time.sleep(0.005)
    side_effect("step", i, repr(time.time()))
    return i


@flow(durability="batch")
def timed_flow(n):
    return sum(step(i) for i in range(n))
"""

_TIMED_STEPS = 200
# The writer commits a queued row within 10 ms; the slack allows for a busy
# machine's scheduling. A writer that waited for a full background batch
# instead (32 of these 5 ms steps) would lose up to 160 ms.
_SLACK = 0.05


@pytest.mark.parametrize("store_kind", ["sqlite", "postgresql"], indirect=True)
@pytest.mark.parametrize("seed", range(3))
def test_kill9_in_batch_mode_reruns_only_steps_of_the_last_10_ms(tmp_path, seed, store_kind):
    """Every finished step a resume runs again had finished at most 10 ms
    (and the slack) before the kill: rows wait in memory that long, no longer."""
    rng = random.Random(seed)
    box = _proc.Sandbox(tmp_path)
    box.write_module("timedrun", _TIMED)
    body = _run_or_resume("timedrun", f"timed_flow.run({_TIMED_STEPS})")
    # Well inside the run (about 1.1 s), after its first steps.
    killed, killed_at = _kill_after(box, body, rng.uniform(0.3, 0.8))
    assert killed.killed
    (run_id,) = box.run_ids()
    durable = _prefix_len(box.journal(run_id))
    finished = {int(line[1]): float(line[2]) for line in box.side_effects() if line[-1] == "P0"}
    assert durable > 0 and len(finished) < _TIMED_STEPS, (durable, len(finished))
    last = box.run(body, PROC="P1", RUN_ID=run_id)
    assert last.ok() == {"status": "completed", "output": sum(range(_TIMED_STEPS))}
    p1 = [int(line[1]) for line in box.side_effects() if line[-1] == "P1"]
    assert p1 == list(range(durable, _TIMED_STEPS))
    # The steps that finished in the killed process and were not durable.
    lost = list(range(durable, len(finished)))
    assert sorted(finished) == list(range(len(finished)))
    if lost:
        age = killed_at - finished[lost[0]]
        assert age <= 0.010 + _SLACK, (
            f"step {lost[0]} finished {age * 1e3:.1f} ms before the kill and was not durable"
        )
    assert box.integrity_ok()


# --------------------------------------------------------------------------- Run.trace


def test_finished_run_trace_reads_its_step_spans_back_in_start_order():
    """OBS-10/OBS-15/OBS-17 on a flow run whose task-step spans were not kept in memory."""

    @compose.task
    def double(x):
        return {"v": x * 2}

    @compose.task
    def explode():
        raise RuntimeError("no")

    @compose.flow
    def f(n):
        out = [double(i) for i in range(n)]
        try:
            explode()
        except RuntimeError:
            pass
        return out

    run = f.run(3)
    spans = run.trace.spans
    assert [(s.kind, s.name, s.status) for s in spans] == [
        ("flow", "f", "ok"),
        ("task", "double", "ok"),
        ("task", "double", "ok"),
        ("task", "double", "ok"),
        ("task", "explode", "error"),
    ]
    root = spans[0]
    assert all(s.parent_span_id == root.span_id for s in spans[1:])
    assert [s.attributes for s in spans[1:4]] == [{"step_key": f"double#{i}"} for i in (1, 2, 3)]
    assert [s.input for s in spans[1:4]] == [{"args": [i], "kwargs": {}} for i in range(3)]
    assert [s.output for s in spans[1:4]] == [{"v": 0}, {"v": 2}, {"v": 4}]
    assert spans[4].error.type == "RuntimeError"
    assert all(s.trace_id == run.trace.trace_id for s in spans)
    assert [s.span_id for s in spans] == sorted(s.span_id for s in spans)
    assert run.trace.status == "ok" and run.trace.roots() == [root]
    assert len(run.trace.children_of(root.span_id)) == 4
    assert [d["name"] for d in run.trace.to_dict()["spans"]] == [s.name for s in spans]
    copy = pickle.loads(pickle.dumps(run))
    assert copy.trace == run.trace and copy == run


def test_resumed_run_trace_holds_this_attempts_replayed_spans_only():
    @compose.task
    def inc(x):
        return x + 1

    @compose.flow
    def f():
        x = inc(inc(0))
        compose.ask_human("go", "?")
        return inc(x)

    paused = f.run()
    assert [s.name for s in paused.trace.spans] == ["f", "inc", "inc", "go"]
    done = compose.resume(paused.id, answers={"go": 1})
    spans = done.trace.spans
    assert [(s.name, s.replayed) for s in spans] == [
        ("f", False),
        ("inc", True),
        ("inc", True),
        ("inc", False),
    ]
    assert [s.output for s in spans[1:]] == [1, 2, 3]
    # Traces built by hand keep their list as given.
    assert Trace("t", spans[:2]).spans == spans[:2]


@pytest.mark.parametrize("store_kind", ["postgresql"], indirect=True)
def test_batched_steps_are_fenced_on_the_owning_attempt_on_postgresql(store_kind):
    """STORE-11 under batch durability: once another owner holds the run, the group-commit
    stores none of this attempt's waiting steps and the attempt ends with the takeover error;
    the default mode keeps every span in memory on this store."""
    import os

    url = os.environ["COMPOSE_STORE"]

    @compose.task
    def inc(x):
        return x + 1

    def steal():
        _proc.pg_exec(url, "UPDATE runs SET lease_owner = 'elsewhere'")

    @compose.flow(durability="batch")
    def batched(n):
        x = 0
        for _ in range(n):
            x = inc(x)
        steal()
        for _ in range(n):
            x = inc(x)
        return x

    @compose.flow
    def stepwise():
        return inc(0)

    with pytest.raises(ConfigError, match="moved to another owner"):
        batched.run(5)
    run_id = _proc.pg_exec(url, "SELECT run_id FROM runs WHERE name = 'batched'").strip()
    journal = journal_of(run_id)
    assert not {f"inc#{i}" for i in range(6, 11)} & set(journal), sorted(journal)
    assert set(journal) <= {f"inc#{i}" for i in range(1, 6)}
    run = stepwise.run()
    assert run.output == 1 and [s.kind for s in run.trace.spans] == ["flow", "task"]


@pytest.mark.parametrize(
    "args",
    [[], [5, -3, 0], [True, False, None], ["abc", 'q"u\\o\n\t\x01'], ["é"], [1.5], [10**30], [[1]]],
)
def test_step_input_fast_path_writes_what_the_lenient_encoder_writes(args):
    """OBS-4/OBS-17: a step span's stored input is the lenient encoding, with or without the
    fast path for plain arguments."""
    from composeai import _codec

    value = {"args": args, "kwargs": {}}
    fast = _engine._plain_args_json(value)
    assert fast is None or fast == _codec.dumps_lenient(value)
    assert _engine._plain_args_json({"args": args, "kwargs": {"k": 1}}) is None
