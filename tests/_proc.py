"""Helpers shared by the real-subprocess tests (test_cross_process.py, test_crash.py).

Each test gets a `Sandbox` rooted in its tmp_path: flow modules are written there as real
files, every child process runs `sys.executable` with `COMPOSE_DIR=<root>/state` and the root
on `PYTHONPATH`, and task bodies record their side effects by appending one line per execution
to `<root>/side_effects.log` (one `os.write` of an O_APPEND descriptor, so a line is either
whole or absent even when the process is SIGKILLed).

A child script is a body of Python statements wrapped in a harness that defines
`emit(**fields)` (prints one `RESULT {json}` line) and reports any escaping exception the same
way (`error_type`, `error_module`, `message`, `traceback`).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULT_PREFIX = "RESULT "
# Generous: these bound waits on a loaded machine, they never assert speed.
TIMEOUT = 120.0

_HARNESS = """\
import json as _json
import sys as _sys
import traceback as _traceback


def emit(**fields):
    _sys.stdout.write("RESULT " + _json.dumps(fields, default=str) + "\\n")
    _sys.stdout.flush()


try:
__BODY__
except BaseException as _exc:
    emit(
        error_type=type(_exc).__name__,
        error_module=type(_exc).__module__,
        message=str(_exc),
        traceback=_traceback.format_exc(),
    )
"""

# Source for flow modules: `side_effect(*fields)` appends one tab-separated line ending in the
# process label (env PROC, default the pid) to the side-effect log.
SIDE_EFFECT_HELPER = '''\
import os as _os

_LOG = _os.environ["SIDE_LOG"]
PROC = _os.environ.get("PROC") or str(_os.getpid())


def side_effect(*fields):
    """Appends one line for one execution of a task body (open, append, close)."""
    line = "\\t".join(str(f) for f in (*fields, PROC)) + "\\n"
    fd = _os.open(_LOG, _os.O_WRONLY | _os.O_APPEND | _os.O_CREAT, 0o600)
    try:
        _os.write(fd, line.encode())
    finally:
        _os.close(fd)
'''


def script(body: str) -> str:
    """Wraps statements (any indentation) in the reporting harness."""
    return _HARNESS.replace("__BODY__", textwrap.indent(textwrap.dedent(body).strip(), "    "))


@dataclass
class Result:
    """A finished child: exit code, output, and its parsed `RESULT` line (if any)."""

    returncode: int
    stdout: str
    stderr: str
    data: dict[str, Any] | None = field(default=None)

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    def describe(self) -> str:
        return (
            f"exit {self.returncode}\n--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"
        )

    def ok(self) -> dict[str, Any]:
        """The result fields of a child that ran to the end without an exception."""
        assert self.data is not None, self.describe()
        assert "error_type" not in self.data, self.data.get("traceback") or self.describe()
        assert self.returncode == 0, self.describe()
        return self.data

    def error(self) -> dict[str, Any]:
        """The reported exception of a child whose script raised."""
        assert self.data is not None, self.describe()
        assert "error_type" in self.data, f"expected an exception, got {self.data}"
        return self.data


def parse_result(stdout: str) -> dict[str, Any] | None:
    lines = [ln for ln in stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if not lines:
        return None
    return json.loads(lines[-1][len(RESULT_PREFIX) :])


def finish(proc: subprocess.Popen, timeout: float = TIMEOUT, prefix: str = "") -> Result:
    """Waits for (and reaps) a spawned child; kills it if it outlives `timeout`."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"child did not finish within {timeout}s\n{prefix}{out}\n{err}")
    out = prefix + out
    return Result(proc.returncode, out, err, parse_result(out))


def read_line(proc: subprocess.Popen, timeout: float = TIMEOUT) -> str:
    """The child's next stdout line ('' at EOF), waiting at most `timeout` seconds.

    Reads the pipe's descriptor byte by byte, never through the buffered file object, so
    nothing after the line is swallowed before `finish()` (communicate reads the raw fd)."""
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            proc.kill()
            proc.wait()
            raise AssertionError(f"no complete line from child within {timeout}s: {data!r}")
        byte = os.read(fd, 1)
        if not byte:
            break
        data += byte
    return data.decode()


def wait_until(predicate: Callable[[], Any], timeout: float = TIMEOUT, what: str = "") -> Any:
    """Polls `predicate` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.01)


def _read(target: str, sql: str, params: tuple, row_factory: Any) -> list:
    with closing(sqlite3.connect(target, uri=target.startswith("file:"), timeout=30)) as conn:
        if row_factory is not None:
            conn.row_factory = row_factory
        return conn.execute(sql, params).fetchall()


def _sql_literal(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, bytes):
        return f"'\\x{v.hex()}'::bytea"
    return "'" + str(v).replace("'", "''") + "'"


class _PsqlReader:
    """One `psql` session reading a PostgreSQL store: a query is one line in, one JSON line
    out, so a test that observes the store after every child pays one round trip per read
    rather than a `psql` process."""

    def __init__(self, url: str) -> None:
        import _pg

        self.url = url
        base, _, query = url.partition("?")
        options = dict(kv.split("=", 1) for kv in query.split("&") if "=" in kv)
        bindir = _pg.find_bindir() or ""
        psql = os.path.join(bindir, "psql") if bindir else shutil.which("psql") or "psql"
        env = {**os.environ, "PGOPTIONS": f"-c search_path={options.get('schema', 'composeai')}"}
        self.proc = subprocess.Popen(
            [psql, "-qAtX", "-v", "ON_ERROR_STOP=1", base],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def read(self, text: str) -> list:
        # Raw newlines in the document are whitespace between tokens (JSON escapes them in
        # strings): dropping them keeps the answer on one line.
        self.proc.stdin.write(
            "BEGIN READ ONLY;\nSELECT replace(coalesce(json_agg(row_to_json(t)), '[]'::json)"
            f"::text, E'\\n', ' ') FROM ({text}) t;\nCOMMIT;\n"
        )
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=TIMEOUT)
            raise RuntimeError(f"psql: {self.proc.stderr.read().strip()} (query: {text})")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=TIMEOUT)


# The session of the store read last: each test has a schema of its own, and one session at a
# time keeps the cluster's connections free.
_READER: list[_PsqlReader] = []


def _pg_read(url: str, sql: str, params: tuple, row_factory: Any) -> list:
    """Runs one SELECT on a PostgreSQL store through a read-only `psql` session: `?`
    placeholders are inlined as literals; rows come back typed through JSON (so result
    columns need distinct names)."""
    parts = sql.split("?")
    assert len(parts) == len(params) + 1, (sql, params)
    text = parts[0] + "".join(_sql_literal(p) + rest for p, rest in zip(params, parts[1:]))
    if _READER and (_READER[0].url != url or _READER[0].proc.poll() is not None):
        _READER.pop().close()
    if not _READER:
        _READER.append(_PsqlReader(url))
    try:
        rows = _READER[0].read(text)
    except RuntimeError:
        _READER.pop()
        raise
    if row_factory is not None:
        return rows
    return [tuple(r.values()) for r in rows]


class Sandbox:
    """One test's directory: modules, state dir, side-effect log. On a
    PostgreSQL store (`COMPOSE_STORE` set by the store fixture) children get
    that URL and observations read the database."""

    def __init__(
        self,
        root: Path,
        state: Path | None = None,
        log: Path | None = None,
        store: str | None = None,
    ):
        self.root = Path(root)
        self.state = state or self.root / "state"
        self.log = log or self.root / "side_effects.log"
        self.db_path = self.state / "runs.db"
        self.store = store if store is not None else os.environ.get("COMPOSE_STORE") or None

    def child(self, name: str) -> Sandbox:
        """A fresh state dir and log under this root (and, on PostgreSQL, a
        fresh schema), sharing its modules."""
        sub = self.root / name
        sub.mkdir()
        store = None
        if self.store:
            store = self.store.replace("schema=", f"schema={name.lower()}_", 1)
        return Sandbox(self.root, sub / "state", sub / "side_effects.log", store or "")

    # -- children ---------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("COMPOSE_TRACE_CONTENT", None)
        env["COMPOSE_DIR"] = str(self.state)
        env["SIDE_LOG"] = str(self.log)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(self.root), env.get("PYTHONPATH", "")) if p
        )
        if self.store:
            env["COMPOSE_STORE"] = self.store
        else:
            env.pop("COMPOSE_STORE", None)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra)
        return env

    def write_module(self, name: str, source: str, *, helper: bool = True) -> Path:
        path = self.root / f"{name}.py"
        text = textwrap.dedent(source)
        if helper:
            text = SIDE_EFFECT_HELPER + "\n\n" + text
        path.write_text(text)
        return path

    def spawn(self, body: str, **env: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", script(body)],
            env=self.env(**env),
            cwd=str(self.root),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run(self, body: str, timeout: float = TIMEOUT, **env: str) -> Result:
        return finish(self.spawn(body, **env), timeout)

    # -- observations -----------------------------------------------------

    def side_effects(self) -> list[tuple[str, ...]]:
        """Every complete line of the side-effect log, split on tabs."""
        if not self.log.exists():
            return []
        text = self.log.read_text()
        lines = text.split("\n")
        # A torn last line (no newline) cannot happen with one write(); keep it visible.
        return [tuple(ln.split("\t")) for ln in lines if ln]

    def query(self, sql: str, params: tuple = (), *, row_factory: Any = None) -> list:
        """Reads the store without ever writing to it.

        A read-only connection normally suffices (it never checkpoints or deletes the WAL).
        After a kill, though, the file can need recovery first (a hot rollback journal left by
        a process killed while switching a new file to WAL), which a read-only connection
        refuses. Then the files are copied aside and the copy is read, so the recovery itself
        is still left to the engine's next open of the real store."""
        if self.store:
            return _pg_read(self.store, sql, params, row_factory)
        uri = self.db_path.as_uri() + "?mode=ro"
        try:
            return _read(uri, sql, params, row_factory)
        except sqlite3.OperationalError as exc:
            if not getattr(exc, "sqlite_errorname", "").startswith("SQLITE_READONLY"):
                raise
        with tempfile.TemporaryDirectory() as scratch:
            for suffix in ("", "-journal", "-wal"):
                src = Path(str(self.db_path) + suffix)
                if src.exists():
                    shutil.copyfile(src, Path(scratch) / ("runs.db" + suffix))
            return _read(str(Path(scratch) / "runs.db"), sql, params, row_factory)

    def integrity_ok(self) -> bool:
        """SQLite's `integrity_check`; on PostgreSQL (which checks its own
        pages) no journal, span or interrupt row outlives its run."""
        if not self.store:
            return self.query("PRAGMA integrity_check") == [("ok",)]
        orphans = self.query(
            "SELECT (SELECT count(*) FROM journal j WHERE NOT EXISTS "
            "(SELECT 1 FROM runs r WHERE r.rid = j.rid)) + "
            "(SELECT count(*) FROM spans s WHERE s.rid IS NOT NULL AND NOT EXISTS "
            "(SELECT 1 FROM runs r WHERE r.rid = s.rid)) + "
            "(SELECT count(*) FROM pending_interrupts p WHERE NOT EXISTS "
            "(SELECT 1 FROM runs r WHERE r.rid = p.rid)) AS orphans"
        )
        return orphans == [(0,)]

    def has_table(self, name: str) -> bool:
        """The store exists and has table `name` (a killed first open may not)."""
        if self.store:
            return bool(self.query("SELECT 1 WHERE to_regclass(?) IS NOT NULL", (name,)))
        return self.db_path.exists() and bool(
            self.query("SELECT name FROM sqlite_master WHERE name = ?", (name,))
        )

    def run_ids(self) -> list[str]:
        if self.store:
            if not self.query("SELECT 1 WHERE to_regclass('runs') IS NOT NULL"):
                return []
            return [r[0] for r in self.query("SELECT run_id FROM runs ORDER BY created_at")]
        if not self.db_path.exists():
            return []
        if not self.query("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'runs'"):
            return []  # created, but the process died before the schema committed
        return [r[0] for r in self.query("SELECT run_id FROM runs ORDER BY created_at")]

    def run_row(self, run_id: str) -> dict[str, Any]:
        rows = self.query("SELECT * FROM runs WHERE run_id = ?", (run_id,), row_factory=sqlite3.Row)
        assert rows, f"no runs row for {run_id}"
        return dict(rows[0])

    def journal(self, run_id: str) -> dict[str, str]:
        """step_key -> value_json of one run."""
        rows = self.query(
            "SELECT j.step_key, j.value_json FROM journal j JOIN runs r ON r.rid = j.rid "
            "WHERE r.run_id = ?",
            (run_id,),
        )
        return dict(rows)

    def pending(self, run_id: str) -> list[tuple]:
        return self.query(
            "SELECT p.interrupt_id, p.kind, p.question, p.payload_json FROM pending_interrupts p "
            "JOIN runs r ON r.rid = p.rid WHERE r.run_id = ? ORDER BY p.interrupt_id",
            (run_id,),
        )

    def snapshot(self, run_id: str) -> tuple:
        """Everything durable about one run, to prove a refused call wrote nothing."""
        return (self.run_row(run_id), self.journal(run_id), self.pending(run_id))


class _Rows:
    def __init__(self, rows: list) -> None:
        self.rows = rows

    def fetchall(self) -> list:
        return self.rows

    def fetchone(self) -> Any:
        return self.rows[0] if self.rows else None

    def __iter__(self):
        return iter(self.rows)


class StoreReader:
    """A read-only view of a test's store (its SQLite file under `state`, or
    the PostgreSQL store in `COMPOSE_STORE`) with the `sqlite3` calls tests use."""

    def __init__(self, state: Path) -> None:
        self.box = Sandbox(Path(state).parent, Path(state))

    def execute(self, sql: str, params: tuple = ()) -> _Rows:
        return _Rows(self.box.query(sql, tuple(params)))

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def store_db(state: Path) -> StoreReader:
    return StoreReader(state)


def pg_exec(url: str, sql: str) -> str:
    """Runs statements on a PostgreSQL store with `psql` (a test's raw edit)."""
    import _pg

    base, _, query = url.partition("?")
    options = dict(kv.split("=", 1) for kv in query.split("&") if "=" in kv)
    bindir = _pg.find_bindir() or ""
    psql = os.path.join(bindir, "psql") if bindir else shutil.which("psql") or "psql"
    env = {**os.environ, "PGOPTIONS": f"-c search_path={options.get('schema', 'composeai')}"}
    out = subprocess.run(
        [psql, "-qAtX", "-v", "ON_ERROR_STOP=1", base, "-c", sql],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"psql: {out.stderr.strip()} (sql: {sql})")
    return out.stdout
