"""STORE-40..44: store outages and faults cost time, never runs.

PostgreSQL faults are injected into a cluster of this module's own (so that
stopping or freezing it touches no other test): a fast restart, a stop/start
of 3 s, terminated backends and SIGSTOP of every server process (a frozen
server), under a running flow and under a `compose worker`. SQLite faults use
real file systems: a small tmpfs that fills up, and a read-only bind mount
(both need `mount`, so root; elsewhere those tests are skipped, saying why).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import _pg
import _proc
import composeai as compose
from composeai import _engine
from composeai.errors import ComposeError, StoreError, StoreUnavailableError


@pytest.fixture(scope="module")
def cluster():
    bindir = _pg.find_bindir()
    if bindir is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL (initdb, pg_ctl) is required under CI")
        pytest.skip("PostgreSQL (initdb, pg_ctl) is not installed")
    c = _pg.Cluster(bindir).start()
    yield c
    c.thaw()
    c.stop()


_schemas = iter(range(1_000_000))


@pytest.fixture
def pg_url(cluster, monkeypatch):
    """This test's schema on the module's cluster, as the store in use; the
    URL carries a password (the test server trusts any) to check it is never
    shown."""
    url = cluster.url(f"outage{os.getpid()}_{next(_schemas)}").replace(
        "composeai@", "composeai:s3cret@"
    )
    monkeypatch.setenv("COMPOSE_STORE", url)
    monkeypatch.setenv("COMPOSE_STORE_TIMEOUT", "2")
    _engine.reset_store()
    yield url
    cluster.thaw()
    _engine.reset_store()


def later(seconds: float, action) -> threading.Thread:
    t = threading.Thread(target=lambda: (time.sleep(seconds), action()), daemon=True)
    t.start()
    return t


def test_store_42_store_errors_are_compose_errors_and_unavailable_is_a_store_error():
    assert issubclass(StoreError, ComposeError)
    assert issubclass(StoreUnavailableError, StoreError)
    assert not issubclass(StoreError, compose.errors.ConfigError)


def test_store_40_a_flow_rides_out_a_stopped_server_a_restart_and_terminated_backends(
    cluster, pg_url
):
    """The server is stopped for 3 s after step 2's body, restarted after
    step 4's, and every other backend terminated after step 6's: each step's
    commit waits for the server and the run completes with every body run
    exactly once."""
    ran: list[int] = []

    @compose.task
    def step(i: int) -> int:
        ran.append(i)
        if i == 2:
            cluster.halt()
            later(3.0, cluster.resume)
        elif i == 4:
            cluster.restart()
        elif i == 6:
            _pg_sql(
                cluster,
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'",
            )
        return i

    @compose.flow
    def steps(n: int) -> int:
        return sum(step(i) for i in range(n))

    run = steps.run(9)
    assert (run.status, run.output) == ("completed", sum(range(9)))
    assert ran == list(range(9))
    journal = _pg_sql(cluster, f"SELECT count(*) FROM {_schema(pg_url)}.journal")
    assert journal == "9"


def test_store_41_a_frozen_server_is_an_outage_not_a_hang_and_the_run_continues(
    cluster, pg_url, monkeypatch
):
    """SIGSTOP of every server process under a running flow: each try gives
    up after COMPOSE_STORE_TIMEOUT, and once the server is resumed the run
    completes, no step run twice."""
    monkeypatch.setenv("COMPOSE_STORE_TIMEOUT", "1")
    _engine.reset_store()
    ran: list[int] = []

    @compose.task
    def step(i: int) -> int:
        ran.append(i)
        if i == 1:
            cluster.freeze()
            later(3.5, cluster.thaw)
        return i

    @compose.flow
    def steps(n: int) -> int:
        return sum(step(i) for i in range(n))

    run = steps.run(4)
    assert (run.status, run.output) == ("completed", 6)
    assert ran == [0, 1, 2, 3]


def test_store_40_past_the_outage_limit_the_run_raises_and_stays_resumable(
    cluster, pg_url, monkeypatch
):
    """With COMPOSE_STORE_OUTAGE_SECONDS=2 a frozen server makes the step's
    commit raise StoreUnavailableError (naming the store, password hidden);
    the run is left `running`, never `failed`, and resume() completes it
    re-running at most the step in flight."""
    monkeypatch.setenv("COMPOSE_STORE_TIMEOUT", "1")
    monkeypatch.setenv("COMPOSE_STORE_OUTAGE_SECONDS", "2")
    _engine.reset_store()
    ran: list[int] = []

    @compose.task
    def step(i: int) -> int:
        ran.append(i)
        if i == 1 and ran.count(1) == 1:
            cluster.freeze()
        return i

    @compose.flow
    def steps(n: int) -> int:
        return sum(step(i) for i in range(n))

    with pytest.raises(StoreUnavailableError) as info:
        steps(3)
    message = str(info.value)
    assert "cannot reach the server" in message and "COMPOSE_STORE_OUTAGE_SECONDS" in message
    assert "s3cret" not in message and "***" in message
    cluster.thaw()
    rows = _pg_sql(cluster, f"SELECT run_id, status FROM {_schema(pg_url)}.runs").split("|")
    run_id, status = rows[0], rows[1]
    assert status == "running"
    run = compose.resume(run_id)
    assert (run.status, run.output) == ("completed", 3)
    # The frozen backend may still commit the abandoned statement once it is
    # thawed: then the step is found journaled and not run again.
    assert ran in ([0, 1, 2], [0, 1, 1, 2])


def test_store_41_the_cli_on_a_frozen_server_exits_1_with_one_line_naming_the_store(
    cluster, pg_url, tmp_path
):
    cluster.freeze()
    try:
        out = subprocess.run(
            [sys.executable, "-m", "composeai.cli", "runs", "--json"],
            env={**os.environ, "COMPOSE_STORE_TIMEOUT": "1"},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        cluster.thaw()
    assert out.returncode == 1, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "cannot reach the server" in lines[0] and "postgresql://composeai:***@" in lines[0]
    assert "s3cret" not in out.stderr + out.stdout


WORKER_FLOWS = """\
import composeai as compose
from composeai import flow, task


@task
def work(label: str, i: int) -> int:
    side_effect("work", label, i)
    return i + 1


@flow
def napper(label: str, seconds: float) -> int:
    a = work(label, 1)
    compose.sleep(seconds)
    return work(label, a)
"""


def test_store_40_a_worker_stays_up_through_a_stopped_server_logs_it_once_and_continues(
    cluster, pg_url, tmp_path
):
    """A run's timer falls due while the server is stopped for 3 s: the
    worker logs one line when the store becomes unreachable and one when it
    is back, then continues the run; SIGTERM stops it with exit 0."""
    box = _proc.Sandbox(tmp_path, store=pg_url)
    box.write_module("oflows", WORKER_FLOWS)
    parked = box.run(
        """
        import oflows
        run = oflows.napper.run("w", 2.0, wait=False)
        emit(id=run.id, status=run.status)
        """
    ).ok()
    assert parked["status"] == "paused", parked
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "composeai.cli",
            "worker",
            "--interval",
            "0.2",
            "--import",
            "oflows",
        ],
        env=box.env(COMPOSE_STORE_TIMEOUT="2"),
        cwd=str(box.root),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(0.5)
        cluster.halt()
        time.sleep(3.0)
        assert worker.poll() is None, "the worker exited during the outage"
        cluster.resume()
        _proc.wait_until(
            lambda: box.run_row(parked["id"])["status"] == "completed", what="the parked run"
        )
    finally:
        if cluster_is_down(cluster):
            cluster.resume()
        worker.send_signal(signal.SIGTERM)
        result = _proc.finish(worker, timeout=60)
    assert result.returncode == 0, result.describe()
    log = result.stdout.splitlines()
    down = [line for line in log if "store unreachable" in line]
    back = [line for line in log if "store reachable again" in line]
    assert len(down) == 1 and len(back) == 1, result.stdout
    assert "s3cret" not in result.stdout + result.stderr
    assert log.index(down[0]) < log.index(back[0])
    assert [e[:-1] for e in box.side_effects()] == [("work", "w", "1"), ("work", "w", "2")]


SHUTDOWN_FLOWS = """\
import os
import time

import composeai as compose
from composeai import flow, task


@task
def work(label: str, i: int) -> int:
    side_effect("work", label, i)
    return i + 1


@task
def slow(label: str) -> int:
    side_effect("slow", label)
    time.sleep(float(os.environ.get("SLOW", "0")))
    return 1


@flow
def sluggish(label: str) -> int:
    compose.sleep(0.3)
    work(label, 1)
    slow(label)
    return work(label, 2)
"""


def test_store_44_sigterm_releases_the_lease_and_another_worker_continues_at_once(tmp_path):
    """Worker A executes a run's slow step; on SIGTERM it waits `--grace`,
    releases the lease and exits 0; worker B continues the run at once (no
    wait for the lease to expire), re-running only the step in flight."""
    box = _proc.Sandbox(tmp_path, store="")
    box.write_module("sflows", SHUTDOWN_FLOWS)
    run_id = box.run(
        """
        import sflows
        run = sflows.sluggish.run("s", wait=False)
        emit(id=run.id)
        """
    ).ok()["id"]
    args = [sys.executable, "-m", "composeai.cli", "worker", "--interval", "0.2"]
    a = subprocess.Popen(
        [*args, "--grace", "0.5", "--import", "sflows"],
        env=box.env(SLOW="120", COMPOSE_LEASE_SECONDS="600"),
        cwd=str(box.root),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _proc.wait_until(lambda: ("slow", "s") in [e[:2] for e in box.side_effects()], what="slow")
    a.send_signal(signal.SIGTERM)
    first = _proc.finish(a, timeout=60)
    assert first.returncode == 0, first.describe()
    assert f"stopped  {run_id} left resumable" in first.stdout
    b = subprocess.Popen(
        [*args, "--import", "sflows"],
        env=box.env(SLOW="0", COMPOSE_LEASE_SECONDS="600"),
        cwd=str(box.root),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # A lease of 600 s: only a released one lets B in within the wait.
        _proc.wait_until(lambda: box.run_row(run_id)["status"] == "completed", what="worker B")
    finally:
        b.send_signal(signal.SIGTERM)
        second = _proc.finish(b, timeout=60)
    assert second.returncode == 0, second.describe()
    effects = [e[:-1] for e in box.side_effects()]
    assert effects == [("work", "s", "1"), ("slow", "s"), ("slow", "s"), ("work", "s", "2")]


# -- SQLite on real file systems (STORE-42, STORE-43) ---------------------------


def _can_mount() -> str | None:
    """Why mounting is impossible here, or None."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return "needs root and mount(8) to create a small tmpfs / read-only bind mount"
    return None


@pytest.fixture
def mounted(tmp_path):
    """Mount points under tmp_path, unmounted afterwards."""
    why = _can_mount()
    if why:
        pytest.skip(why)
    points: list[Path] = []

    def mount(*args: str, target: Path) -> Path:
        target.mkdir(parents=True, exist_ok=True)
        out = subprocess.run(
            ["mount", *args, str(target)], capture_output=True, text=True, check=False
        )
        if out.returncode != 0:
            pytest.skip(f"mount is not permitted here: {out.stderr.strip()}")
        points.append(target)
        return target

    yield mount
    for p in reversed(points):
        subprocess.run(["umount", "-l", str(p)], capture_output=True, check=False)


def test_store_42_sqlite_disk_full_leaves_the_run_resumable(mounted, tmp_path, monkeypatch):
    """A step that cannot be journaled because the disk is full raises
    StoreError "the disk is full"; the run stays `running` (not failed), and
    once space is freed resume() completes it re-running only that step."""
    disk = mounted("-t", "tmpfs", "-o", "size=1m", "tmpfs", target=tmp_path / "disk")
    monkeypatch.setenv("COMPOSE_DIR", str(disk / "state"))
    _engine.reset_store()
    ran: list[int] = []

    @compose.task
    def big(i: int) -> str:
        ran.append(i)
        return str(i) * 150_000

    @compose.flow
    def fill(n: int) -> int:
        return sum(len(big(i)) for i in range(n))

    with pytest.raises(StoreError, match="the disk is full") as info:
        fill(12)
    assert not isinstance(info.value, StoreUnavailableError)
    failed_at = ran[-1]
    assert failed_at < 11
    rid = _only_run_id(disk / "state" / "runs.db")
    assert compose.get_run(rid).status == "running"
    subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
    done = compose.resume(rid)
    assert done.status == "completed"
    assert ran == [*range(failed_at + 1), failed_at, *range(failed_at + 1, 12)]


def _only_run_id(db: Path) -> str:
    import sqlite3

    uri = db.as_uri() + "?mode=ro"
    with sqlite3.connect(uri, uri=True) as c:
        (rid,) = c.execute("SELECT run_id FROM runs").fetchone()
    return rid


def test_store_43_a_read_only_store_can_be_read_and_refuses_writes(mounted, tmp_path):
    """The store is made in one process, then seen through a read-only bind
    mount: `compose runs`, `trace`, `costs` and get_run() work; starting a
    run raises StoreError "the store is read-only" and changes nothing."""
    box = _proc.Sandbox(tmp_path, store="")
    box.write_module("rflows", WORKER_FLOWS)
    made = box.run(
        """
        import composeai, rflows

        @composeai.flow
        def hello(x: int) -> int:
            return rflows.work("r", x)

        run = hello.run(1)
        emit(id=run.id, status=run.status)
        """
    ).ok()
    assert made["status"] == "completed"
    ro = tmp_path / "ro"
    mounted("--bind", str(box.state), target=ro)
    subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], check=True)
    before = sorted((p.name, p.read_bytes()) for p in box.state.iterdir())
    env = box.env(COMPOSE_DIR=str(ro))
    for cmd in (["runs", "--json"], ["trace", made["id"]], ["costs"]):
        out = subprocess.run(
            [sys.executable, "-m", "composeai.cli", *cmd],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 0, (cmd, out.stderr)
        if cmd[0] == "runs":
            assert [r["run_id"] for r in json.loads(out.stdout)] == [made["id"]]
    got = box.run(
        f"""
        import composeai, rflows

        @composeai.flow
        def again(x: int) -> int:
            return rflows.work("r2", x)

        status = composeai.get_run({made["id"]!r}).status
        try:
            again.run(2)
            emit(status=status, refused=None)
        except Exception as exc:
            emit(status=status, refused=type(exc).__name__, message=str(exc))
        """,
        COMPOSE_DIR=str(ro),
    ).ok()
    assert (got["status"], got["refused"]) == ("completed", "StoreError"), got
    assert "the store is read-only" in got["message"]
    assert sorted((p.name, p.read_bytes()) for p in box.state.iterdir()) == before


# -- helpers --------------------------------------------------------------------


def _schema(url: str) -> str:
    return url.split("schema=")[1].split("&")[0]


def _pg_sql(cluster: _pg.Cluster, sql: str) -> str:
    psql = os.path.join(cluster.bindir, "psql")
    out = subprocess.run(
        [psql, "-h", "127.0.0.1", "-p", str(cluster.port), "-U", cluster.user, "-d", "postgres"]
        + ["-XAtc", sql],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.strip()


def cluster_is_down(cluster: _pg.Cluster) -> bool:
    return not os.path.exists(os.path.join(cluster.data, "postmaster.pid"))
