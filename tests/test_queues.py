"""STORE-20 … STORE-23: queues, `compose worker --queue`, wake-ups and
`compose queues`, on both stores. Limits are checked from what the store
recorded (claim and settle times, worker logs), never from timing."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import urllib.parse

import pytest

import _proc
import composeai as compose
from composeai import _core, _engine
from composeai.cli import main as cli
from composeai.errors import ConfigError

FLOWS = """\
import os
import time

import composeai as compose
from composeai import flow, task

limited = compose.Queue("limited", concurrency=2)
ranked = compose.Queue("ranked", priority=True)
fifo = compose.Queue("fifo")
paced = compose.Queue("paced", rate_limit=(2, 0.6))
single = compose.Queue("single", worker_concurrency=1)


@task
def hold(label: str) -> str:
    side_effect("enter", label)
    time.sleep(float(os.environ.get("HOLD", "0.05")))
    side_effect("exit", label)
    return label


@flow
def job(label: str) -> str:
    return hold(label)
"""


@pytest.fixture
def box(tmp_path):
    sandbox = _proc.Sandbox(tmp_path)
    sandbox.write_module("qflows", FLOWS)
    return sandbox


def worker(box: _proc.Sandbox, *args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "composeai.cli", "worker", "--import", "qflows", *args],
        env=box.env(**env),
        cwd=str(box.root),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop(proc: subprocess.Popen) -> _proc.Result:
    proc.send_signal(signal.SIGTERM)
    return _proc.finish(proc, timeout=60)


def enqueue(box: _proc.Sandbox, calls: list[str]) -> list[str]:
    """Enqueues in a fresh process; returns the run ids in call order."""
    body = "import qflows\nids = []\n"
    body += "".join(f"ids.append({c}.id)\n" for c in calls)
    body += "emit(ids=ids)\n"
    return box.run(body).ok()["ids"]


def statuses(ids: list[str]) -> list[str]:
    store = _engine.get_store()
    return [store.get_run(i)["status"] for i in ids]


def store_rows(sql: str) -> list[tuple]:
    """Rows of `sql` read straight from the configured store (`{s}.` names
    the schema on PostgreSQL, nothing on SQLite)."""
    url = os.environ.get("COMPOSE_STORE", "")
    if not url:
        path = os.path.join(os.environ["COMPOSE_DIR"], "runs.db")
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            return db.execute(sql.replace("{s}.", "")).fetchall()
    parts = urllib.parse.urlsplit(url)
    schema = urllib.parse.parse_qs(parts.query)["schema"][0]
    import _pg

    psql = os.path.join(_pg.find_bindir() or "", "psql")
    dsn = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
    out = subprocess.run(
        [psql, "-qAt", "-F", "\t", dsn, "-c", sql.replace("{s}.", f"{schema}.")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [tuple(line.split("\t")) for line in out.splitlines() if line]


def intervals(queue: str) -> list[tuple[float, float, str]]:
    """(claimed at, settled at, run id) of the queue's finished runs, by claim."""
    rows = store_rows(
        "SELECT q.started_at, r.updated_at, r.run_id FROM {s}.queue_runs q "
        "JOIN {s}.runs r ON r.rid = q.rid "
        f"WHERE q.queue = '{queue}' AND r.status = 'completed' ORDER BY q.started_at"
    )
    return [(float(a), float(b), c) for a, b, c in rows]


def most_at_once(spans: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    now = best = 0
    for _, delta in events:
        now += delta
        best = max(best, now)
    return best


def test_store_20_queue_declaration_limits_and_errors():
    """STORE-20: the registry keeps one declaration per name; bad limits
    and a redeclaration with other limits are `ConfigError`s."""
    q = compose.Queue("mail", concurrency=3, rate_limit=(10, 60))
    assert (q.concurrency, q.worker_concurrency, q.priority, q.rate_limit) == (
        3,
        None,
        False,
        (10, 60.0),
    )
    compose.Queue("mail", concurrency=3, rate_limit=(10, 60))
    with pytest.raises(ConfigError, match="queue 'mail' is already declared with concurrency=3"):
        compose.Queue("mail", concurrency=4)
    for bad in (
        {"concurrency": 0},
        {"worker_concurrency": -1},
        {"rate_limit": (0, 1)},
        {"rate_limit": (1, 0)},
        {"rate_limit": [1, 1]},
        {"priority": 1},
    ):
        with pytest.raises(ConfigError):
            compose.Queue("bad", **bad)
    with pytest.raises(ConfigError, match="non-empty string"):
        compose.Queue("")


def test_store_20_start_on_a_queue_creates_a_queued_run_and_dedup_refuses_a_second(store_kind):
    """STORE-20: `Flow.start(queue=…)` and `Queue.enqueue` return at once
    with a `queued` run; a dedup id held by a queued run is refused naming
    it; `compose queues` counts it (STORE-23)."""
    q = compose.Queue("inbox")
    ran = []

    @compose.flow
    def note(text: str) -> str:
        ran.append(text)
        return text.upper()

    first = note.start("a", queue="inbox", dedup_id="order-1")
    second = q.enqueue(note, "b", priority=5)
    assert first.status == "queued" and second.status == "queued" and ran == []
    with pytest.raises(ConfigError) as info:
        note.start("c", queue=q, dedup_id="order-1")
    assert first.id in str(info.value) and "dedup_id 'order-1'" in str(info.value)
    with pytest.raises(ConfigError, match="not declared"):
        note.start("d", queue="nowhere")
    with pytest.raises(ConfigError, match="pass queue="):
        note.start("e", dedup_id="x")
    assert _core.queue_stats(_engine.get_store())[0][:4] == ("inbox", 2, 0, 0)

    from composeai.worker import Worker

    Worker(queues=(q,), out=open(os.devnull, "w")).once()  # noqa: SIM115
    assert first.result(30).output == "A" and second.result(30).output == "B"
    assert sorted(ran) == ["a", "b"]
    # Finished: the id is free again.
    third = note.start("f", queue=q, dedup_id="order-1")
    assert third.status == "queued"


def test_store_23_compose_queues_and_runs_status_queued(capsys, store_kind):
    """STORE-23: `compose runs --status queued` lists queued runs;
    `compose queues` prints queued, running, done in the last hour and the
    oldest queued age per queue."""
    compose.Queue("alpha")
    compose.Queue("beta")

    @compose.flow
    def idle() -> int:
        return 1

    a = idle.start(queue="alpha")
    idle.start(queue="beta")
    idle.start(queue="beta")
    if store_kind == "sqlite":
        # `compose runs` reads PostgreSQL through the CLI's query layer.
        assert cli(["runs", "--status", "queued", "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert len(listed) == 3 and {r["status"] for r in listed} == {"queued"}
        assert a.id in {r["run_id"] for r in listed}
    assert cli(["queues"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["QUEUE", "QUEUED", "RUNNING", "DONE", "1H", "OLDEST", "QUEUED"]
    assert lines[1].split()[:4] == ["alpha", "1", "0", "0"]
    assert lines[2].split()[:4] == ["beta", "2", "0", "0"]
    assert cli(["queues", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["queue"] for d in data] == ["alpha", "beta"]
    assert data[1]["queued"] == 2 and data[1]["oldest_queued_age_s"] >= 0


def test_store_21_many_workers_never_exceed_the_queue_concurrency(box, store_kind):
    """STORE-21: three worker processes drain one queue with
    `concurrency=2`: every run completes once and, by the store's claim and
    settle times, never more than two executed at once."""
    ids = enqueue(box, [f"qflows.job.start('r{i}', queue='limited')" for i in range(12)])
    procs = [worker(box, "--queue", "limited", "--concurrency", "3") for _ in range(3)]
    try:
        _proc.wait_until(
            lambda: statuses(ids) == ["completed"] * 12, what="the queue to be drained"
        )
    finally:
        results = [stop(p) for p in procs]
    assert all(r.returncode == 0 for r in results), [r.describe() for r in results]
    spans = intervals("limited")
    assert len(spans) == 12
    assert most_at_once([(a, b) for a, b, _ in spans]) <= 2
    enters = [e[1] for e in box.side_effects() if e[0] == "enter"]
    assert sorted(enters) == sorted(f"r{i}" for i in range(12)), "each run executed once"


def test_store_21_priority_then_fifo_and_a_fifo_queue_ignores_priority(box, store_kind):
    """STORE-21: `priority=True` claims lower values first, then in enqueue
    order; a queue without it claims in enqueue order only."""
    prios = [5, 1, 3, 1, 0]
    ranked = enqueue(
        box,
        [f"qflows.job.start('p{i}', queue='ranked', priority={p})" for i, p in enumerate(prios)],
    )
    fifo = enqueue(
        box, [f"qflows.job.start('f{i}', queue='fifo', priority={p})" for i, p in enumerate(prios)]
    )
    proc = worker(box, "--queue", "ranked", "--queue", "fifo", "--concurrency", "1")
    try:
        _proc.wait_until(lambda: set(statuses(ranked + fifo)) == {"completed"}, what="the queues")
    finally:
        result = stop(proc)
    assert result.returncode == 0, result.describe()
    order = [ranked.index(run_id) for _, _, run_id in intervals("ranked")]
    assert order == [4, 1, 3, 2, 0]
    assert [run_id for _, _, run_id in intervals("fifo")] == fifo


def test_store_21_rate_limit_holds_across_workers(box, store_kind):
    """STORE-21: `rate_limit=(2, 0.6)` across two workers: no window of
    0.6 s holds more than two claims."""
    ids = enqueue(box, [f"qflows.job.start('t{i}', queue='paced')" for i in range(6)])
    procs = [worker(box, "--queue", "paced", "--concurrency", "4", HOLD="0") for _ in range(2)]
    try:
        _proc.wait_until(lambda: statuses(ids) == ["completed"] * 6, what="the paced queue")
    finally:
        results = [stop(p) for p in procs]
    assert all(r.returncode == 0 for r in results), [r.describe() for r in results]
    starts = [a for a, _, _ in intervals("paced")]
    assert len(starts) == 6
    for i in range(len(starts) - 2):
        assert starts[i + 2] - starts[i] >= 0.6 - 1e-6, starts


def test_store_21_worker_concurrency_bounds_each_worker(box, store_kind):
    """STORE-21: `worker_concurrency=1`: each worker's log never shows two
    runs of the queue in flight, though it has threads to spare."""
    ids = enqueue(box, [f"qflows.job.start('w{i}', queue='single')" for i in range(6)])
    procs = [worker(box, "--queue", "single", "--concurrency", "4") for _ in range(2)]
    try:
        _proc.wait_until(lambda: statuses(ids) == ["completed"] * 6, what="the queue")
    finally:
        results = [stop(p) for p in procs]
    for r in results:
        assert r.returncode == 0, r.describe()
        now = best = 0
        for line in r.stdout.splitlines():
            if " started  " in line and "reason=queue:single" in line:
                now += 1
            elif " finished " in line:
                now -= 1
            best = max(best, now)
        assert best <= 1, r.stdout


def test_store_22_a_waiting_worker_is_woken_by_a_new_queued_run(box, store_kind):
    """STORE-22: a worker idle with a long interval (it would not look
    again on its own for a minute) starts a run enqueued by another process:
    woken by LISTEN/NOTIFY on PostgreSQL, by its store poll on SQLite."""
    proc = worker(box, "--queue", "fifo", "--interval", "60")
    try:
        line = _proc.read_line(proc)
        assert "worker ready" in line, line
        [run_id] = enqueue(box, ["qflows.job.start('late', queue='fifo')"])
        _proc.wait_until(lambda: statuses([run_id]) == ["completed"], what="the woken worker")
    finally:
        result = stop(proc)
    assert result.returncode == 0, result.describe()
    assert f"started  {run_id} flow=job reason=queue:fifo" in result.stdout


def test_store_21_a_worker_claims_only_runs_of_flows_it_imported(box, store_kind):
    """STORE-21: a worker without the run's flow leaves it queued for one
    that has it."""
    box.write_module("qonly", 'import composeai as compose\n\ncompose.Queue("fifo")\n')
    [run_id] = enqueue(box, ["qflows.job.start('kept', queue='fifo')"])
    bare = subprocess.run(
        [sys.executable, "-m", "composeai.cli", "worker", "--import", "qonly"]
        + ["--queue", "fifo", "--once"],
        env=box.env(),
        cwd=str(box.root),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bare.returncode == 0, bare.stderr
    assert statuses([run_id]) == ["queued"]
    proc = worker(box, "--queue", "fifo", "--once")
    result = _proc.finish(proc, timeout=120)
    assert result.returncode == 0, result.describe()
    assert statuses([run_id]) == ["completed"]


def test_store_21_an_undeclared_queue_is_refused_by_the_worker(box):
    """STORE-21: `--queue` names a queue some `--import` declares."""
    proc = worker(box, "--queue", "missing", "--once")
    result = _proc.finish(proc, timeout=60)
    assert result.returncode == 1
    assert "queue 'missing' is not declared in this process" in result.stderr


def test_store_20_a_cancelled_queued_run_is_never_claimed(store_kind):
    """A queued run cancelled before a worker claims it stays cancelled
    and leaves the queue."""
    if store_kind == "postgresql":
        pytest.skip("cancel requests reach PostgreSQL with the durable tables")
    q = compose.Queue("later")

    @compose.flow
    def never() -> int:
        raise AssertionError("a cancelled queued run must not execute")

    handle = never.start(queue=q)
    compose.cancel(handle.id, "not needed")
    assert handle.status == "cancelled"
    assert _core.queue_claim(_engine.get_store(), "later", 5, ["never"]) == []
    assert _core.queue_stats(_engine.get_store()) == []
