"""Store selection and the PostgreSQL store (stores.md STORE-1 … STORE-3, STORE-11).

Tests taking `store_kind` run on SQLite and on a throwaway PostgreSQL cluster
(see conftest.py); the others start PostgreSQL only where they need it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

import composeai as compose
from composeai import _core, _engine
from composeai.errors import ConfigError


def compose_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "composeai.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def psql(cluster, sql: str) -> str:
    binary = os.path.join(cluster.bindir, "psql")
    if not os.path.exists(binary):
        binary = shutil.which("psql") or "psql"
    out = subprocess.run(
        [binary, "-qAt", cluster.url().split("?")[0], "-c", sql],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_store_1_unknown_url_is_a_config_error_without_the_password(monkeypatch):
    monkeypatch.setenv("COMPOSE_STORE", "mysql://app:hunter2@db/runs")

    @compose.flow
    def f() -> int:
        return 1

    with pytest.raises(ConfigError) as e:
        f()
    assert "COMPOSE_STORE" in str(e.value) and "postgresql://" in str(e.value)
    assert "hunter2" not in str(e.value) and "app:***@db" in str(e.value)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:pw@h:port/db",
        "postgresql://u:pw@h/db?sslmode=maybe",
        "postgresql://u:pw@h/db?schema=bad-name",
        "postgresql://u:pw@h/db?pool_size=0",
        "postgresql://u:pw@h/db?color=red",
        "sqlite://",
    ],
)
def test_store_1_bad_options_name_compose_store(url):
    with pytest.raises(ConfigError, match="COMPOSE_STORE") as e:
        _core.store_target(url, "")
    assert ":pw@" not in str(e.value)


def test_store_1_forms_resolve(tmp_path):
    assert _core.store_target("", "/d/runs.db") == ("sqlite", "/d/runs.db")
    assert _core.store_target("sqlite:///abs/x.db", "") == ("sqlite", "/abs/x.db")
    assert _core.store_target("sqlite://rel/x.db", "") == ("sqlite", "rel/x.db")
    kind, shown = _core.store_target("postgres://bob:s3cret@h:5433/db?application_name=w1", "")
    assert (kind, shown) == ("postgresql", "postgres://bob:***@h:5433/db?application_name=w1")


def test_store_1_sqlite_url_is_used(tmp_path, monkeypatch):
    db = tmp_path / "elsewhere" / "mine.db"
    monkeypatch.setenv("COMPOSE_STORE", f"sqlite://{db}")

    @compose.flow
    def f() -> int:
        return 7

    assert f() == 7
    assert db.exists()
    assert not (tmp_path / "state" / "runs.db").exists()


def test_store_1_configure_before_first_use_and_not_twice(tmp_path):
    db = tmp_path / "configured.db"
    compose.configure(store=f"sqlite://{db}")
    compose.configure(store=f"sqlite://{db}")

    @compose.flow
    def f() -> int:
        return 3

    assert f() == 3
    assert db.exists()
    with pytest.raises(ConfigError, match="already"):
        compose.configure(store="postgresql://u:topsecret@h/db")
    with pytest.raises(ConfigError) as e:
        compose.configure(store="redis://h")
    assert "COMPOSE_STORE" in str(e.value)


def test_store_2_compose_path_prints_the_redacted_url():
    out = compose_cli("path", env={"COMPOSE_STORE": "postgresql://bob:hunter2@db.example:5432/app"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "postgresql://bob:***@db.example:5432/app"


def test_store_2_flow_steps_journal_and_replay(store_kind):
    """STORE-2, STORE-30: the same flow on each store: steps journaled once,
    a resumed run replays them without executing the bodies."""
    calls = []

    @compose.task
    def double(x: int) -> int:
        calls.append(x)
        return 2 * x

    @compose.flow
    def pipeline(n: int) -> list[int]:
        return [double(i) for i in range(n)]

    handle = pipeline.run(4)
    assert handle.output == [0, 2, 4, 6]
    assert calls == [0, 1, 2, 3]
    journal = dict(_engine.get_store().journal(handle.id))
    assert len([k for k in journal if "double" in k]) == 4
    assert _engine.get_store().kind == store_kind


def test_store_2_a_paused_run_resumes_in_a_new_process(store_kind, tmp_path):
    """The run row, journal and pending interrupt live in the store, so
    another process resumes the run."""
    (tmp_path / "pflow.py").write_text(
        "import composeai as compose\n"
        "@compose.task\n"
        "def shout(s: str) -> str:\n"
        "    return s.upper()\n"
        "@compose.flow\n"
        "def greet(name: str) -> str:\n"
        "    a = shout(name)\n"
        "    b = compose.approve('ok')\n"
        "    return f'{a}:{b}'\n"
    )
    env = {"PYTHONPATH": str(tmp_path)}
    code = "import pflow; h = pflow.greet.run('ann'); print(h.status, h.id)"
    first = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **env},
        timeout=120,
    )
    assert first.returncode == 0, first.stderr
    status, run_id = first.stdout.split()
    assert status == "paused"
    code = (
        "import pflow, composeai as compose\n"
        f"r = compose.resume({run_id!r}, answers={{'ok': True}})\n"
        "print(r.status, r.output)"
    )
    second = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **env},
        timeout=120,
    )
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == ["completed", "ANN:True"]


@pytest.fixture
def pg_url(pg_cluster, request):
    name = "m" + "".join(c for c in request.node.name if c.isalnum())[-40:].lower()
    return pg_cluster.url(name)


def _latest(dry_run_output: str) -> int:
    return int(re.search(r"would migrate to version (\d+)", dry_run_output).group(1))


def test_store_3_compose_migrate_dry_run_then_apply(pg_url):
    env = {"COMPOSE_STORE": pg_url}
    dry = compose_cli("migrate", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    latest = _latest(dry.stdout)
    assert latest >= 2
    assert "schema version 0, would migrate to version" in dry.stdout
    applied = compose_cli("migrate", env=env)
    assert f"migrated schema version 0 -> {latest}" in applied.stdout, applied.stderr
    again = compose_cli("migrate", env=env)
    assert f"schema version {latest}, up to date" in again.stdout, again.stderr


def test_store_3_a_version_1_schema_is_upgraded_in_place(pg_cluster, pg_url):
    """Schema version 2 (durable and graph tables) is a versioned step: a
    database left at version 1 gets the new tables, its runs kept."""
    env = {"COMPOSE_STORE": pg_url}
    assert compose_cli("migrate", env=env).returncode == 0
    schema = pg_url.split("schema=")[1].split("&")[0]
    for table in (
        "timers",
        "signals",
        "waits",
        "graph_threads",
        "graph_checkpoints",
        "graph_audit",
    ):
        psql(pg_cluster, f"DROP TABLE {schema}.{table}")
    psql(pg_cluster, f"UPDATE {schema}.schema_version SET version = 1")
    dry = compose_cli("migrate", "--dry-run", env=env)
    assert "schema version 1, would migrate to version" in dry.stdout, dry.stderr
    applied = compose_cli("migrate", env=env)
    assert "migrated schema version 1 -> " in applied.stdout, applied.stderr
    count = psql(
        pg_cluster,
        f"SELECT count(*) FROM pg_tables WHERE schemaname = '{schema}' "
        "AND tablename IN ('timers', 'signals', 'waits', 'graph_threads', "
        "'graph_checkpoints', 'graph_audit')",
    )
    assert count == "6"


def test_store_3_eight_processes_migrate_an_empty_database_once(pg_url):
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "composeai.cli", "migrate"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "COMPOSE_STORE": pg_url},
        )
        for _ in range(8)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    migrated = [o for o, _ in outs if "migrated schema version 0 -> " in o]
    assert len(migrated) == 1, outs
    assert sum("up to date" in o for o, _ in outs) == 7


def test_store_3_a_newer_schema_is_refused(pg_cluster, pg_url, monkeypatch):
    assert compose_cli("migrate", env={"COMPOSE_STORE": pg_url}).returncode == 0
    schema = pg_url.split("schema=")[1].split("&")[0]
    psql(pg_cluster, f"UPDATE {schema}.schema_version SET version = 99")
    monkeypatch.setenv("COMPOSE_STORE", pg_url)

    @compose.flow
    def f() -> int:
        return 1

    with pytest.raises(ConfigError, match="schema version 99, newer than this composeai"):
        f()
    assert psql(pg_cluster, f"SELECT count(*) FROM {schema}.runs") == "0"


def test_store_11_writes_after_a_takeover_are_rejected(pg_cluster, pg_url, monkeypatch):
    """A step committed after another owner took the lease stores nothing
    and stops the attempt with a ConfigError."""
    monkeypatch.setenv("COMPOSE_STORE", pg_url)
    schema = pg_url.split("schema=")[1].split("&")[0]

    @compose.task
    def one() -> int:
        return 1

    @compose.task
    def taken_over() -> int:
        psql(pg_cluster, f"UPDATE {schema}.runs SET lease_owner = 'elsewhere:1:1:x'")
        return 2

    @compose.flow
    def f() -> int:
        return one() + taken_over()

    with pytest.raises(ConfigError, match="moved to another owner"):
        f()
    keys = psql(pg_cluster, f"SELECT step_key FROM {schema}.journal ORDER BY step_key")
    assert "one" in keys and "taken_over" not in keys
    assert psql(pg_cluster, f"SELECT status FROM {schema}.runs") == "running"


def test_store_30_a_step_that_lost_the_first_write_race_returns_the_stored_value(
    pg_cluster, pg_url, monkeypatch
):
    """FLOW-17 on PostgreSQL: when the step's journal row was written first
    (here by another session while the body ran), the one-statement commit
    hands back the stored value, not the body's; a step that wins keeps its
    own."""
    monkeypatch.setenv("COMPOSE_STORE", pg_url)
    schema = pg_url.split("schema=")[1].split("&")[0]

    @compose.task
    def raced() -> int:
        keys = psql(pg_cluster, f"SELECT step_key FROM {schema}.journal")
        assert keys == "", keys
        psql(
            pg_cluster,
            f"INSERT INTO {schema}.journal(rid, step_key, value_json) "
            f"SELECT rid, 'raced#1', '41' FROM {schema}.runs",
        )
        return 1

    @compose.task
    def own(x: int) -> int:
        return x + 1

    @compose.flow
    def f() -> list:
        x = raced()
        return [x, own(x)]

    assert f() == [41, 42]
    rows = psql(pg_cluster, f"SELECT step_key, value_json FROM {schema}.journal ORDER BY 1")
    assert rows.splitlines() == ["own#1|42", "raced#1|41"]


def test_store_30_a_step_whose_idle_connection_the_server_ended_commits_once(
    pg_cluster, pg_url, monkeypatch
):
    """A blocking step commits on a pooled connection its own thread drives;
    when the server ended that connection while it was idle (a restart, an
    idle timeout), the step is committed on a new one, exactly once."""
    monkeypatch.setenv("COMPOSE_STORE", pg_url)
    schema = pg_url.split("schema=")[1].split("&")[0]
    # Only this test's connections: an earlier test's store may still hold
    # an idle connection that last committed a step.
    started = psql(pg_cluster, "SELECT now()")

    @compose.task
    def one() -> int:
        return 1

    @compose.task
    def cut() -> int:
        ended = psql(
            pg_cluster,
            "SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity "
            "WHERE state = 'idle' AND query LIKE 'WITH f AS (SELECT rid, run_id FROM runs%' "
            f"AND backend_start >= '{started}'",
        )
        assert ended == "1", ended
        return 2

    @compose.task
    def three(x: int) -> int:
        return x + 1

    @compose.flow
    def f() -> int:
        return three(one() + cut())

    assert f() == 4
    rows = psql(pg_cluster, f"SELECT step_key, value_json FROM {schema}.journal ORDER BY 1")
    assert rows.splitlines() == ["cut#1|2", "one#1|1", "three#1|4"]
    assert psql(pg_cluster, f"SELECT status FROM {schema}.runs") == "completed"


def test_store_30_more_threads_stepping_at_once_than_pool_size_all_commit(
    pg_cluster, pg_url, monkeypatch
):
    """Threads committing steps at once beyond `pool_size` share the pool
    instead of opening more connections; every step is journaled once."""
    import threading

    monkeypatch.setenv("COMPOSE_STORE", pg_url + "&pool_size=1")
    schema = pg_url.split("schema=")[1].split("&")[0]

    @compose.task
    def inc(x: int) -> int:
        return x + 1

    @compose.flow
    def count(n: int) -> int:
        x = 0
        for _ in range(n):
            x = inc(x)
        return x

    outputs: list[int] = []
    threads = [threading.Thread(target=lambda: outputs.append(count(25))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outputs == [25] * 4
    assert psql(pg_cluster, f"SELECT count(*) FROM {schema}.journal") == "100"
    assert psql(pg_cluster, f"SELECT count(DISTINCT status) FROM {schema}.runs") == "1"


def test_store_11_durable_waits_and_graph_steps_after_a_takeover_store_nothing(
    pg_cluster, pg_url, monkeypatch
):
    """A sleep's journal row and timer, and a graph step's checkpoint, are
    fenced like steps: after a takeover they are rejected and nothing of
    them is stored."""
    from composeai.graph import END, Graph

    monkeypatch.setenv("COMPOSE_STORE", pg_url)
    schema = pg_url.split("schema=")[1].split("&")[0]

    def take_over() -> None:
        psql(pg_cluster, f"UPDATE {schema}.runs SET lease_owner = 'elsewhere:1:1:x'")

    @compose.task
    def grab() -> int:
        take_over()
        return 1

    @compose.flow
    def sleeper() -> int:
        grab()
        compose.sleep(30)
        return 2

    with pytest.raises(ConfigError, match="moved to another owner"):
        sleeper()
    assert psql(pg_cluster, f"SELECT count(*) FROM {schema}.timers") == "0"
    keys = psql(pg_cluster, f"SELECT step_key FROM {schema}.journal")
    assert "sleep" not in keys

    psql(pg_cluster, f"DELETE FROM {schema}.runs")
    wf = Graph(name="fenced")
    wf.add_node("first", lambda state: (take_over(), {"n": 1})[1])
    wf.add_node("second", lambda state: {"n": 2})
    wf.start("first").edge("first", "second").edge("second", END)
    with pytest.raises(ConfigError, match="moved to another owner"):
        wf.compile().run({})
    assert psql(pg_cluster, f"SELECT count(*) FROM {schema}.graph_checkpoints") == "0"


def test_store_2_durable_waits_and_graphs_run_on_postgresql(pg_url, monkeypatch):
    """Durable sleeps, signals and graph runs (with threads in an explicit
    PostgreSQL Storage) use the PostgreSQL tables of schema version 2."""
    from composeai.graph import END, Graph, Storage

    monkeypatch.setenv("COMPOSE_STORE", pg_url)

    @compose.flow
    def napper() -> int:
        compose.sleep(0.01)
        return 1

    assert napper() == 1

    wf = Graph()
    wf.add_node("only", lambda state: {"done": True})
    wf.start("only").edge("only", END)
    assert wf.compile().run({"x": 1}).state == {"x": 1, "done": True}
    tg = Graph(name="pg-threads")
    tg.add_node("only", lambda state: {"n": state.get("n", 0) + 1})
    tg.start("only").edge("only", END)
    threads = tg.compile(Storage(pg_url))
    assert threads.thread("t1").run().state["n"] == 1
    assert threads.thread("t1").run().state["n"] == 2
    assert len(threads.thread("t1").history()) >= 2


class CutAfterCommit:
    """A TCP proxy to the cluster. The first client request carrying `marker` reaches the
    server, which runs (and, outside a transaction, commits) every statement of it; then
    the proxy closes that connection without passing the answers back: the server
    committed, the client never heard (as when a server dies between the two)."""

    def __init__(self, port: int, marker: bytes) -> None:
        import socket
        import threading

        self.upstream = port
        self.marker = marker
        self.cut = 0
        self._armed = True
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            state = {"doomed": False, "syncs": 0, "ready": 0}
            threading.Thread(target=self._up, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, state), daemon=True).start()

    @staticmethod
    def _messages(buf: bytearray, typed: bool):
        """Complete protocol messages at the head of `buf`, removed from it."""
        while True:
            head = 1 if typed else 0
            if len(buf) < head + 4:
                return
            size = int.from_bytes(buf[head : head + 4], "big")
            if len(buf) < head + size:
                return
            msg = bytes(buf[: head + size])
            del buf[: head + size]
            yield msg

    def _up(self, client, server, state) -> None:
        buf, started = bytearray(), False
        while data := self._recv(client):
            buf += data
            out = b""
            # The startup message is the only one without a type byte.
            for msg in self._messages(buf, typed=started):
                started = True
                with self._lock:
                    if self._armed and self.marker in msg:
                        self._armed, state["doomed"] = False, True
                    if state["doomed"] and msg[:1] == b"S":
                        state["syncs"] += 1
                out += msg
            try:
                server.sendall(out)
            except OSError:
                return

    def _down(self, server, client, state) -> None:
        import socket

        buf = bytearray()
        while data := self._recv(server):
            buf += data
            out = b""
            for msg in self._messages(buf, typed=True):
                with self._lock:
                    doomed = state["doomed"]
                    if doomed and msg[:1] == b"Z":
                        state["ready"] += 1
                    done = doomed and state["ready"] >= state["syncs"] > 0
                if not doomed:
                    out += msg
                elif done:
                    self.cut += 1
                    for s in (client, server):
                        # shutdown, not only close: the other pump is blocked in recv.
                        s.shutdown(socket.SHUT_RDWR)
                        s.close()
                    return
            try:
                client.sendall(out)
            except OSError:
                return

    @staticmethod
    def _recv(sock) -> bytes:
        try:
            return sock.recv(65536)
        except OSError:
            return b""

    def close(self) -> None:
        self._listener.close()


def test_store_30_a_retried_step_whose_reply_was_lost_writes_its_rows_once(
    pg_cluster, pg_url, monkeypatch
):
    """STORE-30 / STORE-11: the server commits a driven step (its journal row, its span row
    and the spans queued before it) and the connection ends before the answer arrives. The
    step is retried once on a new connection; the retry finds its rows stored and writes
    none of them again."""
    marker = "lost-reply-7c1e"
    proxy = CutAfterCommit(pg_cluster.port, marker.encode())
    url = pg_url.replace(f":{pg_cluster.port}/", f":{proxy.port}/")
    monkeypatch.setenv("COMPOSE_STORE", url)
    schema = pg_url.split("schema=")[1].split("&")[0]

    @compose.task
    def one() -> int:
        return 1

    @compose.task
    def double(x: int) -> int:
        return 2 * x

    @compose.task
    def lost() -> str:
        return marker

    @compose.flow
    def f() -> int:
        x = one()
        # The aggregate's own span is queued when it ends and rides with the next step.
        y = compose.aggregate(d=double)(x)["d"]
        return len(lost()) + y

    try:
        assert f() == len(marker) + 2
    finally:
        proxy.close()
    assert proxy.cut == 1, "the step's connection was not cut after the server committed"
    journal = psql(pg_cluster, f"SELECT step_key FROM {schema}.journal ORDER BY 1")
    assert journal.splitlines() == ["aggregate#1/d/double#1", "lost#1", "one#1"]
    assert psql(pg_cluster, f"SELECT count(*) FROM {schema}.spans WHERE step_key = 'lost#1'") == "1"
    twice = psql(
        pg_cluster,
        f"SELECT count(*) FROM (SELECT span_id FROM {schema}.spans "
        "GROUP BY span_id HAVING count(*) > 1) d",
    )
    assert twice == "0"
