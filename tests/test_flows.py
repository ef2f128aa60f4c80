"""Durable flows, tasks, journal keys and replay (flows.md FLOW-1 … FLOW-25, FLOW-50 … FLOW-61)."""

import asyncio
import hashlib
import inspect
import sqlite3
import textwrap
import threading
import time
from datetime import datetime, timezone

import pytest
from pydantic import BaseModel

import composeai as compose
from composeai import _core, _engine
from composeai.errors import ConfigError, SerializationError, TaskTimeoutError
from composeai.flow import Flow, Task


def journal_of(run_id):
    return dict(_engine.get_store().journal(run_id))


def run_row(run_id):
    return _engine.get_store().get_run(run_id)


class Point(BaseModel):
    x: int
    y: int


# --- @task ------------------------------------------------------------------


def test_flow1_task_bare_and_parenthesized():
    @compose.task
    def a(x: int) -> int:
        return x + 1

    @compose.task(retries=1, name="bee")
    def b(x: int) -> int:
        return x * 2

    assert isinstance(a, Task) and isinstance(b, Task)
    assert a.name == "a" and b.name == "bee"
    assert a(1) == 2 and b(2) == 4


def test_flow1_async_task_called_from_sync_code_is_driven_to_completion():
    @compose.task
    async def slow_double(x: int) -> int:
        await asyncio.sleep(0)
        return x * 2

    assert slow_double(21) == 42

    @compose.flow
    def uses_async(x: int) -> int:
        return slow_double(x) + 1

    run = uses_async.run(5)
    assert run.output == 11
    assert journal_of(run.id)["slow_double#1"] == "10"


def test_flow2_retries_record_each_failure_and_reraise_the_last_unchanged():
    attempts = []
    last = {}

    @compose.task(retries=2)
    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise ValueError(f"boom {len(attempts)}")
        return "ok"

    @compose.flow
    def f() -> str:
        return flaky()

    run = f.run()
    assert run.output == "ok" and len(attempts) == 3
    span = next(s for s in run.trace.spans if s.name == "flaky")
    assert span.attributes["retries"] == [
        {"type": "ValueError", "message": "boom 1"},
        {"type": "ValueError", "message": "boom 2"},
    ]

    @compose.task(retries=1)
    def always_fails():
        exc = KeyError("nope")
        last.setdefault("excs", []).append(exc)
        raise exc

    with pytest.raises(KeyError) as info:
        always_fails()
    assert info.value is last["excs"][-1] and len(last["excs"]) == 2


def test_flow3_timeout_message_and_no_retry():
    calls = []

    @compose.task(timeout=0.05, retries=3)
    def sleepy() -> int:
        calls.append(1)
        time.sleep(0.5)
        return 1

    with pytest.raises(TaskTimeoutError) as info:
        sleepy()
    assert str(info.value) == (
        "@task 'sleepy' exceeded timeout=0.05s -- the abandoned thread keeps running in the "
        "background as a daemon; its eventual result is discarded, and it loses journal write "
        "access immediately (its pure side effects, if any, still run to completion -- there is "
        "no safe way to stop that)"
    )
    assert len(calls) == 1


def test_flow3_async_timeout_is_cooperative():
    cancelled = []

    @compose.task(timeout=0.05)
    async def stuck() -> int:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return 1

    with pytest.raises(TaskTimeoutError) as info:
        stuck()
    assert str(info.value) == "@task 'stuck' exceeded timeout=0.05s (cancelled cooperatively)"
    assert cancelled == [True]


def test_flow61_abandoned_thread_loses_journal_access():
    release = threading.Event()
    zombie_done = threading.Event()
    zombie_outcome = []

    @compose.task
    def record(x: int) -> int:
        return x

    @compose.task(timeout=0.05)
    def hangs() -> int:
        release.wait(5)
        try:
            record(99)
            zombie_outcome.append("wrote")
        except BaseException as exc:  # the revocation signal unwinds the zombie
            zombie_outcome.append(type(exc).__name__)
            raise
        finally:
            zombie_done.set()
        return 1

    @compose.flow
    def f() -> str:
        try:
            hangs()
        except TaskTimeoutError:
            pass
        return "moved on"

    run = f.run()
    assert run.output == "moved on"
    release.set()
    assert zombie_done.wait(5)
    assert zombie_outcome == ["_Revoked"]
    assert not any(k.startswith("hangs#1/record") for k in journal_of(run.id))


def test_flow4_duplicate_task_names_and_replace():
    @compose.task
    def dup() -> int:
        return 1

    with pytest.raises(ConfigError) as info:

        @compose.task(name="dup")
        def other() -> int:
            return 2

    assert str(info.value) == (
        "@task name 'dup' is already registered -- task names must be unique per process (they "
        "key the durable journal's per-step counter); pass an explicit name=... to disambiguate"
    )

    @compose.task(name="dup", replace=True)
    def rebound() -> int:
        return 3

    assert rebound() == 3


@pytest.mark.sqlite_file
def test_flow6_task_outside_flow_persists_a_root_span_without_a_run():
    @compose.task
    def alone(x: int) -> int:
        return x + 1

    assert alone(1) == 2
    db = sqlite3.connect(_engine.get_store().path)
    rows = db.execute("SELECT kind, name, rid, status FROM spans").fetchall()
    assert rows == [("task", "alone", None, "ok")]
    assert db.execute("SELECT count(*) FROM runs").fetchone() == (0,)


def test_flow7_task_arun_and_no_run_method():
    @compose.task
    def inc(x: int) -> int:
        return x + 1

    assert asyncio.run(inc.arun(1)) == 2
    assert not hasattr(inc, "run")


# --- @flow ------------------------------------------------------------------


def test_flow8_flow_object_and_duplicate_names():
    @compose.flow
    def named(x: int) -> int:
        return x

    assert isinstance(named, Flow) and named.name == "named"
    with pytest.raises(ConfigError) as info:

        @compose.flow(name="named")
        def again(x: int) -> int:
            return x

    assert str(info.value) == (
        "@flow name 'named' is already registered -- flow names must be unique per process; "
        "pass an explicit name=... to disambiguate"
    )


def test_flow9_fingerprint_is_sha256_of_dedented_source():
    def body(x: int) -> int:
        return x

    f = compose.flow(body)
    expected = hashlib.sha256(textwrap.dedent(inspect.getsource(body)).encode()).hexdigest()
    assert f.fingerprint == expected

    g = compose.flow(name="nosrc")(eval("lambda: 1"))
    assert g.fingerprint.startswith("nosource:")


def test_flow10_sugar_returns_output_and_none_on_pause():
    @compose.flow
    def simple(x: int) -> int:
        return x * 3

    @compose.flow
    def gated() -> str:
        compose.approve("go")
        return "done"

    assert simple(2) == 6
    assert gated() is None


def test_flow10_run_inside_a_flow_starts_an_independent_run():
    @compose.flow
    def inner(x: int) -> int:
        return x + 1

    seen = {}

    @compose.flow
    def outer() -> int:
        r = inner.run(1)
        seen["id"] = r.id
        return r.output

    run = outer.run()
    assert run.output == 2
    assert run_row(seen["id"])["status"] == "completed"
    assert seen["id"] != run.id


@pytest.mark.sqlite_file
def test_flow11_unencodable_args_create_nothing():
    @compose.flow
    def takes(x) -> int:
        return 1

    with pytest.raises(SerializationError):
        takes.run(object())
    db = sqlite3.connect(_engine.get_store().path)
    assert db.execute("SELECT count(*) FROM runs").fetchone() == (0,)


def test_flow12_completed_row_and_run_shape():
    @compose.flow
    def f(x: int) -> int:
        return x + 1

    run = f.run(1)
    assert (run.status, run.output, run.pending, run.messages) == ("completed", 2, None, [])
    row = run_row(run.id)
    assert row["status"] == "completed" and row["output_json"] == "2"
    assert row["kind"] == "flow" and row["name"] == "f" and row["fingerprint"] == f.fingerprint
    assert row["args_json"] == '{"args":[1],"kwargs":{}}'
    assert len(run.id) == 26 and len(row["trace_id"]) == 26
    assert run.trace.trace_id == row["trace_id"]
    from composeai.messages import Usage

    assert run.usage == Usage()


@pytest.mark.sqlite_file
def test_flow12_failure_marks_row_and_propagates_the_same_exception():
    boom = RuntimeError("kaput")

    @compose.flow
    def f() -> int:
        raise boom

    with pytest.raises(RuntimeError) as info:
        f.run()
    assert info.value is boom
    db = sqlite3.connect(_engine.get_store().path)
    (status, error_json) = db.execute("SELECT status, error_json FROM runs").fetchone()
    assert status == "failed"
    assert error_json == '{"type":"RuntimeError","message":"kaput"}'


# --- The journal ------------------------------------------------------------


def test_flow14_keys_count_per_name_in_call_order():
    @compose.task
    def fetch(x: int) -> int:
        return x

    @compose.task
    def other(x: int) -> int:
        return x

    @compose.flow
    def f() -> int:
        return fetch(1) + other(2) + fetch(3)

    run = f.run()
    assert journal_of(run.id) == {"fetch#1": "1", "other#1": "2", "fetch#2": "3"}


def test_flow15_scopes_for_map_and_nested_flows():
    @compose.task
    def t(x: int) -> int:
        return x * 10

    @compose.flow
    def sub(x: int) -> int:
        return t(x) + 1

    @compose.flow
    def f() -> list:
        a = compose.map(t, [1, 2])
        b = sub(5)
        c = compose.map(t, [3])
        return [a, b, c]

    run = f.run()
    assert run.output == [[10, 20], 51, [30]]
    assert journal_of(run.id) == {
        "map#1[0]/t#1": "10",
        "map#1[1]/t#1": "20",
        "sub#1/t#1": "50",
        "sub#1": "51",
        "map#2[0]/t#1": "30",
    }


def test_flow16_replay_skips_bodies_and_marks_spans():
    calls = []

    @compose.task
    def work(x: int) -> int:
        calls.append(x)
        return x + 100

    @compose.flow
    def f() -> int:
        v = work(1)
        compose.approve("go")
        return v

    first = f.run()
    assert first.status == "paused" and calls == [1]
    second = compose.resume(first.id, answers={"go": True})
    assert second.status == "completed" and second.output == 101 and calls == [1]
    span = next(s for s in second.trace.spans if s.name == "work")
    assert span.replayed and span.attributes == {"step_key": "work#1"} and span.output == 101
    assert second.trace.trace_id == first.trace.trace_id


def test_flow17_caller_gets_the_value_decoded_from_the_store():
    @compose.task
    def pair() -> tuple:
        return (1, 2)

    @compose.task
    def point() -> Point:
        return Point(x=1, y=2)

    seen = {}

    @compose.flow
    def f() -> int:
        p = point()
        seen["pair"] = pair()
        seen["point"] = p
        return p.x

    f.run()
    assert seen["pair"] == (1, 2) and isinstance(seen["pair"], tuple)
    assert seen["point"] == Point(x=1, y=2)


@pytest.mark.sqlite_file
def test_flow18_unencodable_step_value_names_the_key_and_keeps_earlier_steps():
    @compose.task
    def good() -> int:
        return 7

    @compose.task
    def bad():
        return object()

    @compose.flow
    def f() -> int:
        good()
        bad()
        return 1

    with pytest.raises(SerializationError) as info:
        f.run()
    assert str(info.value).startswith("step 'bad#1': ")
    db = sqlite3.connect(_engine.get_store().path)
    assert db.execute("SELECT status FROM runs").fetchone() == ("failed",)
    assert db.execute("SELECT step_key, value_json FROM journal").fetchall() == [("good#1", "7")]


# --- now() / random() -------------------------------------------------------


def test_flow22_now_and_random_are_journaled_and_replayed():
    @compose.flow
    def f() -> list:
        t1 = compose.now()
        r1 = compose.random()
        t2 = compose.now()
        compose.approve("go")
        return [t1, r1, t2]

    first = f.run()
    journal = journal_of(first.id)
    assert set(journal) == {"now#1", "random#1", "now#2"}
    time.sleep(0.01)
    second = compose.resume(first.id, answers={"go": True})
    t1, r1, _ = second.output
    assert t1.tzinfo is not None and 0 <= r1 < 1
    from composeai import _codec

    assert t1 == _codec.loads(journal["now#1"]) and r1 == _codec.loads(journal["random#1"])


def test_flow22_outside_a_flow_now_and_random_are_plain():
    before = datetime.now(timezone.utc)
    assert before <= compose.now() <= datetime.now(timezone.utc)
    assert 0 <= compose.random() < 1


def test_flow24_async_twins_share_counters():
    """A body converted from sync to async replays the other's now/random records."""

    @compose.flow(name="clock")
    def sync_body() -> list:
        values = [compose.now(), compose.random(), compose.now()]
        compose.approve("go")
        return values

    first = sync_body.run()
    journal = journal_of(first.id)
    assert set(journal) == {"now#1", "random#1", "now#2"}

    @compose.flow(name="clock", replace=True)
    async def async_body() -> list:
        values = [await compose.anow(), await compose.arandom(), await compose.anow()]
        compose.approve("go")
        return values

    done = asyncio.run(compose.aresume(first.id, answers={"go": True}, allow_code_change=True))
    from composeai import _codec

    assert done.output == [_codec.loads(journal[k]) for k in ("now#1", "random#1", "now#2")]


# --- Nested flows -------------------------------------------------------------


@pytest.mark.sqlite_file
def test_flow50_nested_flow_is_one_step_replayed_without_running_its_body():
    calls = []

    @compose.flow
    def inner(x: int) -> int:
        calls.append(x)
        return x * 2

    @compose.flow
    def outer(x: int) -> int:
        d = inner(x)
        compose.approve("go")
        return d + 1

    first = outer.run(5)
    assert calls == [5]
    second = compose.resume(first.id, answers={"go": True})
    assert second.output == 11 and calls == [5]
    span = next(s for s in second.trace.spans if s.name == "inner")
    assert span.kind == "flow" and span.replayed and span.attributes["step_key"] == "inner#1"
    db = sqlite3.connect(_engine.get_store().path)
    assert db.execute("SELECT count(*) FROM runs").fetchone() == (1,)


def test_flow50_nested_arun_returns_a_completed_run_with_a_fresh_id():
    @compose.flow
    async def inner(x: int) -> int:
        return x + 1

    @compose.flow
    async def outer() -> str:
        r = await inner.arun(1)
        return f"{r.status}:{r.output}:{len(r.id)}"

    run = asyncio.run(outer.arun())
    assert run.output == "completed:2:26"


def test_flow51_pause_inside_nested_flow_reaches_the_outer_run():
    @compose.flow
    def inner() -> str:
        return "yes" if compose.approve("inner-gate") else "no"

    @compose.flow
    def outer() -> str:
        return inner()

    first = outer.run()
    assert first.status == "paused" and first.pending.id == "inner-gate"
    assert "inner#1" not in journal_of(first.id)
    second = compose.resume(first.id, answers={"inner-gate": True})
    assert second.output == "yes"


def test_flow52_budget_on_nested_flow_is_refused():
    @compose.flow
    async def inner() -> int:
        return 1

    @compose.flow
    async def outer() -> int:
        return (await inner.arun(budget=compose.Budget(usd=1.0))).output

    with pytest.raises(ConfigError) as info:
        asyncio.run(outer.arun())
    assert str(info.value) == (
        "@flow 'inner': budget= is not supported on a nested flow call (the enclosing run's "
        "budget governs); set it on the outer run"
    )


# --- Ctrl-C -------------------------------------------------------------------


@pytest.mark.sqlite_file
def test_flow60_ctrl_c_marks_the_run_failed_cancelled_and_reraises():
    @compose.task
    def interrupted() -> int:
        raise KeyboardInterrupt

    @compose.flow
    def f() -> int:
        return interrupted()

    with pytest.raises(KeyboardInterrupt):
        f.run()
    db = sqlite3.connect(_engine.get_store().path)
    status, error_json = db.execute("SELECT status, error_json FROM runs").fetchone()
    assert status == "failed" and '"message":"cancelled"' in error_json


# --- Spans are persisted when the run returns ------------------------------------


@pytest.mark.sqlite_file
def test_obs5_every_span_is_persisted_when_run_returns():
    @compose.task
    def t(x: int) -> int:
        return x

    @compose.flow
    def f() -> int:
        return sum(compose.map(t, [1, 2, 3]))

    run = f.run()
    db = sqlite3.connect(_engine.get_store().path)
    (count,) = db.execute("SELECT count(*) FROM spans").fetchone()
    assert count == len(run.trace.spans) == 1 + 1 + 3 + 3


def test_pkg7_ids_are_ulids():
    alphabet = set("0123456789ABCDEFGHJKMNPQRSTVWXYZ")
    ids = [_core.ulid() for _ in range(100)]
    assert all(len(i) == 26 and set(i) <= alphabet for i in ids)
    assert ids == sorted(ids)
