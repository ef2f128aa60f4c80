"""Leases, heartbeats, fencing and recovery across real processes
(STORE-10, STORE-11, STORE-12), on PostgreSQL and on SQLite.

Machines are simulated by processes with short leases
(`COMPOSE_LEASE_SECONDS`); where a test needs processes on different hosts,
each runs in its own UTS namespace (`unshare -u`) under its own host name,
so that only the lease's expiry can free a killed holder's run. Every wait
is a generous polling deadline; nothing asserts how long anything took.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

import _proc

FLOWS = """\
import os
import time

import composeai as compose
from composeai import flow, task


@task
def step(label: str, i: int) -> int:
    side_effect("step", label, i)
    return i


@task
def slow(label: str) -> str:
    side_effect("slow-start", label)
    time.sleep(float(os.environ.get("SLOW", "0")))
    side_effect("slow-end", label)
    return "slow"


@flow
def chain(label: str) -> list:
    return [step(label, 1), slow(label), step(label, 2)]


@flow
def napper(label: str) -> int:
    step(label, 1)
    compose.sleep(float(os.environ.get("NAP", "0")))
    return step(label, 2)
"""

LEASE = "1"


class Backend:
    """One store as the children see it, and reads of its tables."""

    def __init__(self, kind: str, box: _proc.Sandbox, cluster=None, schema: str = ""):
        self.kind = kind
        self.box = box
        self.cluster = cluster
        self.schema = schema

    def env(self) -> dict[str, str]:
        env = {"COMPOSE_LEASE_SECONDS": LEASE}
        if self.kind == "postgresql":
            env["COMPOSE_STORE"] = self.cluster.url(self.schema)
        return env

    def rows(self, sql: str) -> list[tuple]:
        """Rows of `sql` over the store's tables (unqualified names)."""
        if self.kind == "sqlite":
            if not self.box.db_path.exists():
                return []
            try:
                return [tuple(str(v) for v in r) for r in self.box.query(sql)]
            except sqlite3.OperationalError:
                return []  # the schema is not created yet
        binary = os.path.join(self.cluster.bindir, "psql")
        out = subprocess.run(
            [binary, "-qAt", "-F", "\t", self.cluster.url().split("?")[0]],
            input=f"SET search_path = {self.schema};\n{sql};\n",
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0 or "ERROR" in out.stderr:
            return []
        return [tuple(line.split("\t")) for line in out.stdout.splitlines() if line]

    def run_row(self) -> tuple | None:
        found = self.rows("SELECT run_id, status, error_json FROM runs")
        assert len(found) <= 1, found
        return found[0] if found else None

    def status(self) -> str | None:
        row = self.run_row()
        return row[1] if row else None

    def journal_keys(self) -> list[str]:
        return sorted(r[0] for r in self.rows("SELECT step_key FROM journal"))

    def executed_spans(self) -> list[str]:
        """Step keys of the spans of steps that ran (not replayed) and stored a value."""
        # Flag 1 marks a replayed span.
        return sorted(
            r[0]
            for r in self.rows(
                "SELECT step_key FROM spans WHERE step_key IS NOT NULL "
                "AND status = 'ok' AND (flags & 1) = 0"
            )
        )

    def lease_expired(self) -> bool:
        rows = self.rows("SELECT lease_until FROM runs WHERE lease_owner IS NOT NULL")
        return bool(rows) and all(float(r[0]) < time.time() for r in rows)


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request, tmp_path):
    box = _proc.Sandbox(tmp_path)
    box.write_module("lflows", FLOWS)
    if request.param == "sqlite":
        return Backend("sqlite", box)
    cluster = request.getfixturevalue("pg_cluster")
    schema = "l" + "".join(c for c in request.node.name if c.isalnum())[-40:].lower()
    return Backend("postgresql", box, cluster, schema)


def on_host(host: str | None, argv: list[str]) -> list[str]:
    """`argv` run on simulated machine `host` (its own UTS namespace)."""
    if host is None:
        return argv
    return ["unshare", "-u", "sh", "-c", 'hostname "$0" && exec "$@"', host, *argv]


def can_simulate_hosts() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(on_host("probe", ["true"]), capture_output=True, check=False)
    return probe.returncode == 0


def spawn(b: Backend, argv: list[str], host: str | None = None, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        on_host(host, argv),
        env=b.box.env(**b.env(), **env),
        cwd=str(b.box.root),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def starter(b: Backend, label: str, host: str | None = None, **env: str) -> subprocess.Popen:
    """A process that runs `chain(label)` itself."""
    body = _proc.script(
        f"""
        import lflows
        run = lflows.chain.run({label!r})
        emit(status=run.status, output=run.output)
        """
    )
    return spawn(b, [sys.executable, "-c", body], host, **env)


def worker(b: Backend, host: str | None = None, *args: str, **env: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "composeai.cli", "worker", "--interval", "0.2"]
    return spawn(b, [*argv, "--import", "lflows", *args], host, **env)


def seen(b: Backend, kind: str, proc: str) -> bool:
    return any(e[0] == kind and e[-1] == proc for e in b.box.side_effects())


def by(b: Backend, kind: str) -> list[str]:
    return [e[-1] for e in b.box.side_effects() if e[0] == kind]


def kill9(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)


def stop(proc: subprocess.Popen) -> _proc.Result:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return _proc.finish(proc, timeout=60)


def crashed_run(b: Backend) -> str:
    """Starts `chain` in process S, kills it -9 inside its slow step and
    returns the run id: a `running` run whose holder is dead."""
    s = starter(b, "x", SLOW="600", PROC="S")
    _proc.wait_until(lambda: seen(b, "slow-start", "S"), what="S inside its slow step")
    kill9(s)
    row = b.run_row()
    assert row is not None and row[1] == "running", row
    return row[0]


def assert_each_step_stored_once(b: Backend) -> None:
    keys = b.journal_keys()
    assert len(keys) == 3 and len(set(keys)) == 3, keys
    # One span per step that ran and was stored: nothing written twice.
    assert b.executed_spans() == keys, (b.executed_spans(), keys)


def test_store_10_a_heartbeat_keeps_a_live_lease_that_outlasts_its_length(backend):
    """STORE-10: a step three times longer than the lease, while a worker
    on the same host watches the run: the heartbeat keeps the lease live,
    so the worker never takes it over and the starter completes it."""
    b = backend
    w = worker(b, None, PROC="W", SLOW="0")
    s = starter(b, "x", SLOW="3", PROC="S")
    done = _proc.finish(s).ok()
    assert done == {"status": "completed", "output": [1, "slow", 2]}
    log = stop(w).stdout
    assert "started" not in log, log
    assert by(b, "slow-start") == ["S"] and by(b, "slow-end") == ["S"]
    assert b.status() == "completed"
    assert_each_step_stored_once(b)


def test_store_10_the_lease_is_renewed_while_the_attempt_blocks_on_a_timer(tmp_path):
    """STORE-10: a run blocked in place on `compose.sleep` three times longer
    than its lease keeps it: a worker watching never takes the run over.
    (Durable sleeps run on the SQLite store.)"""
    box = _proc.Sandbox(tmp_path)
    box.write_module("lflows", FLOWS)
    b = Backend("sqlite", box)
    w = worker(b, None, PROC="W")
    body = """
        import lflows
        run = lflows.napper.run("x")
        emit(status=run.status, output=run.output)
        """
    done = box.run(body, **b.env(), NAP="3", PROC="S").ok()
    assert done == {"status": "completed", "output": 2}
    log = stop(w).stdout
    assert "started" not in log, log
    assert by(b, "step") == ["S", "S"]


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_store_12_a_worker_killed_on_another_machine_is_continued_after_its_lease_expires(
    backend,
):
    """STORE-10/12: processes on three simulated machines. S dies -9 in its
    slow step; worker A (machine-a) continues the run once S's lease
    expired and is itself killed -9 there; worker B (machine-b) continues it
    after A's lease expired and completes it from the journal. (PostgreSQL
    only: a SQLite store is not shared between machines.)"""
    if not can_simulate_hosts():
        pytest.skip("simulating other machines needs `unshare -u` (root, util-linux)")
    b = backend
    s = starter(b, "x", host="machine-s", SLOW="600", PROC="S")
    _proc.wait_until(lambda: seen(b, "slow-start", "S"), what="S inside its slow step")
    kill9(s)
    a = worker(b, "machine-a", SLOW="600", PROC="A")
    _proc.wait_until(lambda: seen(b, "slow-start", "A"), what="A continuing the run")
    kill9(a)
    w = worker(b, "machine-b", SLOW="0", PROC="B")
    _proc.wait_until(lambda: b.status() == "completed", what="B completing the run")
    log = stop(w).stdout
    assert "reason=recovered" in log and "outcome=completed" in log, log
    assert by(b, "step") == ["S", "B"]
    assert by(b, "slow-start") == ["S", "A", "B"] and by(b, "slow-end") == ["B"]
    assert_each_step_stored_once(b)


def test_store_11_a_frozen_worker_that_wakes_after_a_takeover_writes_nothing(backend):
    """STORE-11: worker A is SIGSTOPped inside a step past its lease; worker
    B takes the run over and completes it; A, continued, finishes its step
    but stores nothing (no journal row, span or settlement) and its attempt
    stops with the ConfigError naming the run."""
    b = backend
    run_id = crashed_run(b)
    a = worker(b, None, SLOW="2", PROC="A")
    _proc.wait_until(lambda: seen(b, "slow-start", "A"), what="A inside the slow step")
    a.send_signal(signal.SIGSTOP)
    try:
        _proc.wait_until(b.lease_expired, what="A's lease to expire")
        w = worker(b, None, SLOW="0", PROC="B")
        _proc.wait_until(lambda: b.status() == "completed", what="B completing the run")
        stop(w)
        before = (b.journal_keys(), b.executed_spans(), b.run_row())
    finally:
        a.send_signal(signal.SIGCONT)
    _proc.wait_until(lambda: seen(b, "slow-end", "A"), what="A finishing its step")
    lines: list[str] = []

    def refused() -> bool:
        lines.append(_proc.read_line(a))
        return "moved to another owner" in lines[-1]

    _proc.wait_until(refused, what="A's attempt to stop")
    stop(a)
    assert f"ConfigError: run '{run_id}' moved to another owner" in lines[-1], lines
    assert (b.journal_keys(), b.executed_spans(), b.run_row()) == before
    assert b.status() == "completed"
    assert_each_step_stored_once(b)


def test_store_12_recovery_limit_fails_the_run_then_a_manual_resume_completes_it(backend):
    """STORE-12: with COMPOSE_MAX_RECOVERY_ATTEMPTS=1, the first worker
    recovery is killed too; the next worker marks the run failed with
    "recovery attempts exhausted" without running it; a resume by hand
    completes it from the journal."""
    b = backend
    run_id = crashed_run(b)
    limit = {"COMPOSE_MAX_RECOVERY_ATTEMPTS": "1"}
    a = worker(b, None, SLOW="600", PROC="A", **limit)
    _proc.wait_until(lambda: seen(b, "slow-start", "A"), what="A continuing the run")
    kill9(a)
    last = _proc.finish(worker(b, None, "--once", SLOW="0", PROC="C", **limit))
    assert "recovery attempts exhausted" in last.stdout, last.describe()
    assert not seen(b, "slow-start", "C")
    row = b.run_row()
    assert row[1] == "failed", row
    assert json.loads(row[2])["message"] == "recovery attempts exhausted"
    resumed = b.box.run(
        f"""
        import composeai as compose
        import lflows
        run = compose.resume({run_id!r})
        emit(status=run.status, output=run.output)
        """,
        **b.env(),
        SLOW="0",
        PROC="M",
        **limit,
    ).ok()
    assert resumed == {"status": "completed", "output": [1, "slow", 2]}
    assert by(b, "step") == ["S", "M"]
    assert_each_step_stored_once(b)


def test_store_10_a_bad_lease_setting_is_a_config_error_naming_it(backend):
    """STORE-10: COMPOSE_LEASE_SECONDS is read when a run starts; a bad
    value is a ConfigError naming the variable."""
    out = backend.box.run(
        """
        import lflows
        lflows.chain("x")
        """,
        **{**backend.env(), "COMPOSE_LEASE_SECONDS": "soon"},
    ).error()
    assert out["error_type"] == "ConfigError"
    assert "COMPOSE_LEASE_SECONDS" in out["message"] and "'soon'" in out["message"]


def test_store_10_owner_ids_carry_host_pid_start_time_and_a_nonce(backend):
    """STORE-10: the lease owner of a running attempt is
    `host:pid:start-time:nonce`."""
    b = backend
    s = starter(b, "x", SLOW="600", PROC="S")
    _proc.wait_until(lambda: seen(b, "slow-start", "S"), what="S inside its slow step")
    owner = b.rows("SELECT lease_owner FROM runs")[0][0]
    kill9(s)
    host, pid, start, nonce = owner.split(":")
    assert host == os.uname().nodename and pid == str(s.pid)
    assert int(start) > 0 and len(nonce) >= 16
