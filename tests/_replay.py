"""Helpers shared by the replay-safety, replayer and fork tests (issue 27).

A test writes its flows as real module files under its tmp_path and imports them the way a
new deploy would: `Deploy.load()` forgets every registered flow, task and agent (a fresh
process knows none) and then imports the new source, so the same flow name can come back with
a changed body. Task bodies record each execution with `side_effect(...)` (the `_proc` helper:
one line per execution in `<tmp_path>/side_effects.log`), which counts executions across
deploys and across processes.
"""

from __future__ import annotations

import importlib
import linecache
import os
import sqlite3
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import _proc
from composeai import _engine, agentfn
from composeai.flow import reset_registries

STORES = ["sqlite", "postgresql"]


class Deploy:
    """One test's flow modules, imported in this process, and its store."""

    def __init__(self, root: Path, monkeypatch: Any) -> None:
        self.box = _proc.Sandbox(root)
        self.root = Path(root)
        self._names: list[str] = []
        monkeypatch.setenv("SIDE_LOG", str(self.box.log))
        monkeypatch.syspath_prepend(str(self.root))
        # A rewritten module must be compiled from its new source, never from a cached .pyc
        # whose size and mtime happen to match.
        monkeypatch.setattr(sys, "dont_write_bytecode", True)

    def load(self, name: str, source: str) -> Any:
        """Deploys `source` as module `name`: clears the registries, writes, imports."""
        reset_registries()
        # Agents are registered apart from tasks and flows; the store fixture restores them.
        agentfn._AGENTS.clear()
        self.box.write_module(name, source)
        sys.modules.pop(name, None)
        linecache.clearcache()
        importlib.invalidate_caches()
        module = importlib.import_module(name)
        if name not in self._names:
            self._names.append(name)
        return module

    def close(self) -> None:
        for name in self._names:
            sys.modules.pop(name, None)

    # -- observations -------------------------------------------------------

    def executions(self, name: str | None = None) -> list[tuple[str, ...]]:
        """Side-effect lines (without the process label), optionally of one task only."""
        lines = [line[:-1] for line in self.box.side_effects()]
        return [ln for ln in lines if name is None or ln[0] == name]

    def journal(self, run_id: str) -> dict[str, str]:
        return dict(_engine.get_store().journal(run_id))

    def run_row(self, run_id: str) -> dict[str, Any]:
        row = _engine.get_store().get_run(run_id)
        assert row is not None, run_id
        return dict(row)

    def span_count(self, run_id: str) -> int:
        _engine.get_store().flush()
        rows = self.box.query(
            "SELECT count(*) AS n FROM spans s JOIN runs r ON r.rid = s.rid WHERE r.run_id = ?",
            (run_id,),
        )
        return rows[0][0]

    def state(self, run_id: str) -> tuple:
        """Everything durable about one run, to show that a call wrote nothing."""
        return (
            self.run_row(run_id),
            self.journal(run_id),
            _engine.get_store().pending(run_id),
            self.span_count(run_id),
        )

    def run_ids(self) -> list[str]:
        return self.box.run_ids()


def raw_sql(sql: str) -> None:
    """Edits the test's store behind the engine's back (an old journal, a stale row)."""
    url = os.environ.get("COMPOSE_STORE")
    if url:
        _proc.pg_exec(url, sql)
        return
    with closing(sqlite3.connect(_engine.get_store().path, timeout=30)) as conn, conn:
        conn.execute(sql)
