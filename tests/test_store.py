"""The store: schema version, migration of 0.11.0 stores, permissions, durability (OBS-1 … OBS-5)."""

import json
import os
import sqlite3
import stat
import time

import pytest

import composeai as compose
from composeai import _core, _engine
from composeai.errors import ConfigError, StoreError

LEGACY_SCHEMA = """
CREATE TABLE runs (run_id TEXT PRIMARY KEY, kind TEXT, name TEXT, status TEXT, created_at REAL,
  updated_at REAL, trace_id TEXT, fingerprint TEXT, args_json TEXT, output_json TEXT,
  error_json TEXT, budget_json TEXT);
CREATE TABLE journal (run_id TEXT, step_key TEXT, value_json TEXT, created_at REAL,
  PRIMARY KEY (run_id, step_key));
CREATE TABLE spans (span_id TEXT PRIMARY KEY, trace_id TEXT, run_id TEXT, parent_span_id TEXT,
  kind TEXT, name TEXT, started_at REAL, ended_at REAL, status TEXT, replayed INTEGER,
  attributes_json TEXT, usage_json TEXT, cost_usd REAL, error_json TEXT);
CREATE TABLE span_payloads (span_id TEXT PRIMARY KEY, input_json TEXT, output_json TEXT);
CREATE TABLE pending_interrupts (run_id TEXT, interrupt_id TEXT, kind TEXT, question TEXT,
  payload_json TEXT, created_at REAL, PRIMARY KEY (run_id, interrupt_id));
CREATE TABLE agent_state (run_id TEXT, scope_key TEXT, messages_json TEXT,
  partial_results_json TEXT, turn INTEGER, updated_at REAL, PRIMARY KEY (run_id, scope_key));
CREATE TABLE chats (chat_id TEXT PRIMARY KEY, agent_name TEXT, system TEXT, model TEXT,
  messages_json TEXT, created_at REAL, updated_at REAL);
CREATE VIRTUAL TABLE span_fts USING fts5(span_id UNINDEXED, name, content);
PRAGMA user_version = 1;
"""

RUN_ID = "01JZ3Q7YB0GQ2W8E5F4H3K2M1N"
TRACE_ID = "01JZ3Q7YB0TRACE0000000000A"


def make_legacy_store(directory, fingerprint):
    directory.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(directory / "runs.db")
    db.executescript(LEGACY_SCHEMA)
    db.execute(
        "INSERT INTO runs VALUES (?, 'flow', 'legacy_flow', 'paused', 1700000000.0, 1700000001.0,"
        " ?, ?, ?, NULL, NULL, ?)",
        (
            RUN_ID,
            TRACE_ID,
            fingerprint,
            '{"args": ["x"], "kwargs": {}}',
            '{"usd": 1.0, "tokens": null}',
        ),
    )
    db.execute(
        "INSERT INTO journal VALUES (?, 'fetch#1', '\"fetched x\"', 1700000000.5)", (RUN_ID,)
    )
    usage = {
        "$kind": "pydantic",
        "$type": "composeai.messages:Usage",
        "value": {"input_tokens": 10, "output_tokens": 5, "cost_usd": 0.002, "cost_complete": True},
    }
    spans = [
        (
            "01JZ3Q7YB1SPAN00000000000A",
            None,
            "flow",
            "legacy_flow",
            0.0,
            1.0,
            "paused",
            0,
            None,
            None,
        ),
        (
            "01JZ3Q7YB1SPAN00000000000B",
            "01JZ3Q7YB1SPAN00000000000A",
            "task",
            "fetch",
            0.1,
            0.2,
            "ok",
            0,
            '{"step_key": "fetch#1"}',
            None,
        ),
        (
            "01JZ3Q7YB1SPAN00000000000C",
            "01JZ3Q7YB1SPAN00000000000A",
            "llm",
            "openai/gpt-x",
            0.3,
            0.4,
            "ok",
            0,
            '{"model": "gpt-x"}',
            json.dumps(usage),
        ),
    ]
    for sid, parent, kind, name, start, end, status, replayed, attrs, usage_json in spans:
        db.execute(
            "INSERT INTO spans VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)",
            (
                sid,
                TRACE_ID,
                RUN_ID,
                parent,
                kind,
                name,
                1700000000 + start,
                1700000000 + end,
                status,
                replayed,
                attrs,
                usage_json,
                0.002 if kind == "llm" else None,
            ),
        )
        db.execute('INSERT INTO span_payloads VALUES (?, \'{"args": ["x"]}\', \'"out"\')', (sid,))
        db.execute("INSERT INTO span_fts VALUES (?, ?, 'x')", (sid, name))
    db.execute(
        "INSERT INTO pending_interrupts VALUES (?, 'publish', 'approval', NULL, '{\"d\": 1}', 1.0)",
        (RUN_ID,),
    )
    db.execute("INSERT INTO chats VALUES ('c1', 'bot', 'sys', 'openai/gpt-x', '[]', 1.0, 2.0)")
    db.commit()
    db.close()


def test_obs2_legacy_store_is_migrated_and_its_paused_run_resumes(isolated_state):
    calls = []

    @compose.task
    def fetch(topic: str) -> str:
        calls.append(topic)
        return f"fetched {topic}"

    @compose.flow
    def legacy_flow(topic: str) -> str:
        got = fetch(topic)
        if compose.approve("publish"):
            return f"published {got}"
        return "kept"

    make_legacy_store(isolated_state, legacy_flow.fingerprint)
    run = compose.resume(RUN_ID, answers={"publish": True})
    assert run.status == "completed" and run.output == "published fetched x"
    assert calls == []  # fetch#1 replayed from the migrated journal

    db = sqlite3.connect(isolated_state / "runs.db")
    assert db.execute("PRAGMA user_version").fetchone()[0] >= 2
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert not any(t.startswith("legacy_") for t in tables)
    status, budget = db.execute(
        "SELECT status, budget_json FROM runs WHERE run_id=?", (RUN_ID,)
    ).fetchone()
    assert status == "completed" and json.loads(budget) == {"usd": 1.0, "tokens": None}
    llm = db.execute(
        "SELECT input_tokens, output_tokens, cost_usd, attributes_json FROM spans WHERE kind='llm'"
    ).fetchone()
    assert llm == (10, 5, 0.002, '{"model":"gpt-x"}')
    assert db.execute("SELECT step_key FROM spans WHERE name='fetch' AND flags=0").fetchone() == (
        "fetch#1",
    )
    assert db.execute("SELECT chat_id, agent_name FROM chats").fetchall() == [("c1", "bot")]


def test_obs2_newer_or_foreign_stores_are_refused_untouched(isolated_state):
    isolated_state.mkdir(parents=True)
    path = isolated_state / "runs.db"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.commit()
    db.close()
    before = path.read_bytes()
    with pytest.raises(ConfigError) as info:
        _core.Store(str(path))
    assert str(path) in str(info.value) and "99" in str(info.value)
    assert path.read_bytes() == before

    path.unlink()
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE invoices (id INTEGER)")
    db.commit()
    db.close()
    with pytest.raises(StoreError) as info:
        _core.Store(str(path))
    assert "not a composeai store" in str(info.value) and str(path) in str(info.value)

    path.write_bytes(os.urandom(8192))
    with pytest.raises(StoreError) as info:
        _core.Store(str(path))
    assert str(path) in str(info.value) and "not a composeai store" in str(info.value)


def test_obs1_state_directory_and_database_are_private(isolated_state):
    @compose.flow
    def f() -> int:
        return 1

    f.run()
    assert stat.S_IMODE(os.stat(isolated_state).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(isolated_state / "runs.db").st_mode) == 0o600


def test_obs1_reset_default_rereads_compose_dir(tmp_path, monkeypatch):
    from composeai.runs import reset_default

    @compose.flow
    def f() -> int:
        return 1

    f.run()
    monkeypatch.setenv("COMPOSE_DIR", str(tmp_path / "other"))
    reset_default()
    f.run()
    assert (tmp_path / "other" / "runs.db").exists()


def test_obs5_output_of_journaled_steps_is_stored_once(isolated_state):
    @compose.task
    def big() -> str:
        return "x" * 5000

    @compose.flow
    def f() -> int:
        return len(big())

    f.run()
    db = sqlite3.connect(isolated_state / "runs.db")
    flags, output = db.execute("SELECT flags, output_json FROM spans WHERE name='big'").fetchone()
    assert flags & 2 and output is None
    assert len(db.execute("SELECT value_json FROM journal").fetchone()[0]) == 5002


def test_obs70_trace_content_off_keeps_journal_but_not_payloads(isolated_state, monkeypatch):
    monkeypatch.setenv("COMPOSE_TRACE_CONTENT", "0")

    @compose.task
    def t(x: int) -> int:
        return x + 1

    @compose.flow
    def f() -> int:
        return t(1)

    run = f.run()
    assert run.output == 2
    db = sqlite3.connect(isolated_state / "runs.db")
    assert db.execute("SELECT value_json FROM journal").fetchall() == [("2",)]
    assert db.execute(
        "SELECT count(*) FROM spans WHERE input_json IS NOT NULL OR output_json IS NOT NULL OR flags & 2"
    ).fetchone() == (0,)


def test_obs5_spans_are_visible_while_the_run_is_in_progress(isolated_state, capsys):
    """A finished step's span is in the store while its run is still running,
    so `compose trace` can watch it."""
    import threading

    from composeai.cli import main

    release = threading.Event()

    @compose.task
    def first() -> int:
        return 1

    @compose.task
    def blocked() -> int:
        release.wait(10)
        return 2

    @compose.flow
    def watched() -> int:
        return compose.map(lambda x: x, [first()])[0] + blocked()

    outcome = {}
    worker = threading.Thread(target=lambda: outcome.setdefault("run", watched.run()))
    worker.start()
    try:
        deadline = time.monotonic() + 10
        text = ""
        while time.monotonic() < deadline:
            capsys.readouterr()
            if main(["trace", "--last"]) == 0:
                text = capsys.readouterr().out
                if "• first" in text and "<lambda>[0]" in text:
                    break
            time.sleep(0.02)
        assert "• first" in text and "<lambda>[0]" in text, text
        assert "blocked" not in text
    finally:
        release.set()
        worker.join(10)
    assert outcome["run"].output == 3


def test_obs5_span_persistence_failures_warn_once_and_never_raise(monkeypatch):
    """The core records a failed span write; the engine turns it into one
    RuntimeWarning per process and the run itself is unaffected."""
    import warnings

    failures = iter(["composeai store 'x': disk I/O error", "again"])
    monkeypatch.setattr(_engine, "_warned_span_write", False)
    monkeypatch.setattr(_engine._core, "take_span_write_error", lambda: next(failures, None))

    @compose.flow
    def f() -> int:
        return 1

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert f.run().output == 1
        assert f.run().output == 1
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert messages == [
        "composeai could not persist trace spans: composeai store 'x': disk I/O error"
    ]
