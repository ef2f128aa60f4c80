"""The `compose` CLI (OBS-30 … OBS-37) against stores written through the core's store API.

Golden outputs over a store built by real runs are in `test_cli_golden.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

import _proc
from composeai import _core
from composeai.cli import main

RID_E = "01JZ3Q8M2C4VDX9R7T5N6B1A0E"
RID_F = "01JZ3Q8M2C4VDX9R7T5N6B1A0F"
RID_N = "01JZ3Q7YB0GQ2W8E5F4H3K2M1N"

# The header row of `compose runs`' table, aligned with its columns.
RUNS_HEADER = (
    "RUN ID                      KIND      NAME                 STATUS     AGE       "
    "      COST       TOKENS\n"
)


def runs_rows(out: str) -> str:
    """The rows of `compose runs`' table, after its header."""
    assert out.startswith(RUNS_HEADER), out
    return out[len(RUNS_HEADER) :]


@pytest.fixture
def state(tmp_path, monkeypatch):
    d = tmp_path / "state"
    monkeypatch.setenv("COMPOSE_DIR", str(d))
    monkeypatch.delenv("NO_COLOR", raising=False)
    return d


def _nf(run_id: str) -> str:
    """The CLI's not-found message, naming the store it searched."""
    from composeai import _engine

    return f"compose: {_engine.run_not_found(run_id, 'id')}\n"


def open_store(state):
    """The test's store: its SQLite file, or the PostgreSQL store the store
    fixture configured (STORE-2)."""
    return _core.Store(os.environ.get("COMPOSE_STORE") or str(state / "runs.db"))


@pytest.fixture
def store(state):
    return open_store(state)


def raw_sql(store, sql: str, params: tuple = ()) -> None:
    """Edits the store behind the engine's back, in a child process on SQLite
    (the stdlib `sqlite3` and the core's bundled SQLite must not share a file
    within one process), with `psql` on PostgreSQL."""
    if store.kind == "postgresql":
        parts = sql.split("?")
        text = parts[0] + "".join(_proc._sql_literal(p) + r for p, r in zip(params, parts[1:]))
        _proc.pg_exec(os.environ["COMPOSE_STORE"], text)
        return
    subprocess.run(
        [sys.executable, "-c", _RAW_SQL, store.path, sql, json.dumps(params)],
        check=True,
        timeout=60,
    )


_RAW_SQL = """
import json, sqlite3, sys
con = sqlite3.connect(sys.argv[1])
with con:
    con.execute(sys.argv[2], json.loads(sys.argv[3]))
con.close()
"""


def usage(inp, out, cost=None, complete=True):
    return (inp, out, 0, 0, 0, cost, complete)


def span(
    name,
    kind="task",
    *,
    sid=None,
    parent=None,
    start=1000.0,
    end=1001.0,
    status="ok",
    replayed=False,
    usage=None,
    error=None,
    attrs=None,
    inp=None,
    out=None,
    step_key=None,
):
    return (
        sid or _core.ulid(),
        parent,
        kind,
        name,
        start,
        end,
        status,
        replayed,
        step_key,
        None if attrs is None else json.dumps(attrs),
        usage,
        None if error is None else json.dumps(error),
        inp,
        out,
    )


_SET_CREATED = """
import json, sqlite3, sys
con = sqlite3.connect(sys.argv[1])
with con:
    for run_id, t in json.loads(sys.argv[2]).items():
        con.execute("UPDATE runs SET created_at = ? WHERE run_id = ?", (t, run_id))
con.close()
"""


def set_created(store, times):
    """Backdates runs. On SQLite done in a child process: the stdlib `sqlite3`
    and the core's bundled SQLite must not share a database file within one
    process (POSIX locks are per process, so one library's close drops the
    other's)."""
    if store.kind == "postgresql":
        for run_id, t in times.items():
            raw_sql(store, "UPDATE runs SET created_at = ? WHERE run_id = ?", (t, run_id))
        return
    subprocess.run(
        [sys.executable, "-c", _SET_CREATED, store.path, json.dumps(times)],
        check=True,
        timeout=60,
    )


def make_run(
    store,
    run_id,
    *,
    kind="flow",
    name="f",
    status="completed",
    created_at=None,
    spans=(),
    pending=(),
):
    attempt = store.start_run(kind, name, run_id=run_id, trace_id="T" + run_id)
    for s in spans:
        attempt.span(s)
    attempt.settle(status, None, None, list(pending))
    if created_at is not None:
        set_created(store, {run_id: created_at})
    return attempt


def run_cli(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# -- no store / empty store -------------------------------------------------


def test_no_store_is_not_created(state, capsys):
    assert run_cli(capsys, "runs") == (0, "no runs found\n", "")
    assert run_cli(capsys, "runs", "--json") == (0, "[]\n", "")
    assert run_cli(capsys, "runs", "--status", "paused", "--since", "2d") == (
        0,
        "no runs found\n",
        "",
    )
    assert run_cli(capsys, "trace", "--last") == (1, "", "compose: no runs found\n")
    assert run_cli(capsys, "trace", "01ABC") == (
        1,
        "",
        _nf("01ABC"),
    )
    assert not state.exists()


def test_empty_store(store, capsys):
    assert run_cli(capsys, "runs") == (0, "no runs found\n", "")
    assert run_cli(capsys, "runs", "--json") == (0, "[]\n", "")
    assert run_cli(capsys, "trace", "--last") == (1, "", "compose: no runs found\n")
    assert run_cli(capsys, "trace", "X") == (1, "", _nf("X"))


@pytest.mark.sqlite_file
def test_unreadable_store_is_a_compose_error(state, capsys):
    state.mkdir()
    (state / "runs.db").write_bytes(b"this is not a sqlite database, not at all" * 100)
    rc, out, err = run_cli(capsys, "runs")
    assert rc == 1 and out == ""
    assert err.startswith("compose: ") and str(state / "runs.db") in err


# -- runs --------------------------------------------------------------------


def test_runs_table_format_example(store, capsys):
    now = time.time()
    make_run(
        store,
        RID_E,
        kind="flow",
        name="nightly_digest",
        created_at=now - 3 * 3600 - 5,
        spans=[
            span("m", "llm", usage=usage(3000, 1000, 0.03)),
            span("m", "llm", usage=usage(1000, 120, 0.0112)),
            span("work", "task"),
        ],
    )
    make_run(
        store,
        RID_N,
        kind="agent",
        name="summarizer",
        status="paused",
        created_at=now - 12 * 60 - 5,
        spans=[
            span("m", "llm", usage=usage(1000, 100, 0.0041)),
            span("m", "llm", usage=usage(70, 10, None, False)),
        ],
    )
    # An llm span in the first run's trace that belongs to no run.
    store.queue_span("T" + RID_E, span("stray", "llm", usage=usage(500, 500, 1.0)))
    store.flush()
    rc, out, err = run_cli(capsys, "runs")
    assert (rc, err) == (0, "")
    assert out == RUNS_HEADER + (
        "01JZ3Q7YB0GQ2W8E5F4H3K2M1N  agent     summarizer           paused     12m ago  "
        "   ≥$0.0041     1180 tok\n"
        "01JZ3Q8M2C4VDX9R7T5N6B1A0E  flow      nightly_digest       completed  3h ago   "
        "    $0.0412     5120 tok\n"
    )


def test_runs_ages_costs_and_long_values(store, capsys):
    now = time.time()
    make_run(store, "R-secs", created_at=now - 5)
    make_run(store, "R-mins", created_at=now - 125)
    make_run(store, "R-hours", created_at=now - 5 * 3600 - 1)
    make_run(store, "R-days", created_at=now - 2 * 86400 - 10)
    long_name = "a_really_long_flow_name_that_overflows"
    make_run(
        store,
        "R-long",
        kind="aggregate",
        name=long_name,
        created_at=now - 40 * 86400,
        spans=[span("m", "llm", usage=usage(12_345_678, 1, 12345.678912, True))],
    )
    rc, out, _ = run_cli(capsys, "runs")
    assert rc == 0
    lines = runs_rows(out).splitlines()
    assert [ln.split()[0] for ln in lines] == ["R-secs", "R-mins", "R-hours", "R-days", "R-long"]
    assert [ln[70:79] for ln in lines[:4]] == ["5s ago   ", "2m ago   ", "5h ago   ", "2d ago   "]
    # Values wider than their column are not truncated.
    assert lines[4] == (
        f"{'R-long':<26}  aggregate {long_name} completed  40d ago   $12345.6789 12345679 tok"
    )
    # No llm span: cost `-`, 0 tokens.
    assert lines[0].endswith(f"{'-':>10} {0:>8} tok")


def test_runs_json(store, capsys):
    make_run(
        store,
        RID_E,
        name="digest",
        created_at=1_700_000_000.5,
        spans=[
            span("m", "llm", usage=usage(10, 5, 0.25)),
            span("m", "llm", usage=usage(1, 2, None, False)),
        ],
    )
    rc, out, _ = run_cli(capsys, "runs", "--json")
    assert rc == 0
    rows = json.loads(out)
    assert out == json.dumps(rows, indent=2) + "\n"
    assert list(rows[0]) == [
        "run_id",
        "kind",
        "name",
        "status",
        "created_at",
        "updated_at",
        "trace_id",
        "fingerprint",
        "args_json",
        "output_json",
        "error_json",
        "budget_json",
        "module",
        "tokens",
        "cost_usd",
        "cost_complete",
    ]
    row = rows[0]
    assert row["run_id"] == RID_E and row["name"] == "digest" and row["kind"] == "flow"
    assert row["status"] == "completed" and row["trace_id"] == "T" + RID_E
    assert row["created_at"] == 1_700_000_000.5
    assert (row["tokens"], row["cost_usd"], row["cost_complete"]) == (18, 0.25, False)


def test_runs_filters(store, capsys):
    now = time.time()
    make_run(store, "A", kind="flow", status="completed", created_at=now - 3 * 86400)
    make_run(store, "B", kind="agent", status="failed", created_at=now - 30 * 3600)
    make_run(store, "C", kind="pipe", status="paused", created_at=now - 2 * 3600)
    make_run(store, "D", kind="aggregate", status="cancelled", created_at=now - 60)
    make_run(store, "E", kind="flow", status="running", created_at=now - 10)

    def ids(*argv):
        rc, out, err = run_cli(capsys, "runs", "--json", *argv)
        assert (rc, err) == (0, "")
        return [r["run_id"] for r in json.loads(out)]

    assert ids() == ["E", "D", "C", "B", "A"]
    assert ids("--status", "failed") == ["B"]
    assert ids("--status", "running") == ["E"]
    # OBS-31: 0.11.0 could not select cancelled rows; we can.
    assert ids("--status", "cancelled") == ["D"]
    assert ids("--kind", "flow") == ["E", "A"]
    assert ids("--kind", "flow", "--status", "completed") == ["A"]
    assert ids("-n", "2") == ["E", "D"]
    assert ids("--limit", "1") == ["E"]
    assert ids("--since", "1d") == ["E", "D", "C"]
    assert ids("--since", "3h") == ["E", "D", "C"]
    assert ids("--since", "1h") == ["E", "D"]
    assert ids("--since", "0h") == []
    rc, out, _ = run_cli(capsys, "runs", "--kind", "pipe", "--status", "completed")
    assert (rc, out) == (0, "no runs found\n")


def test_runs_since_date_is_local_midnight(store, capsys):
    midnight = datetime(2024, 3, 10).timestamp()
    make_run(store, "before", created_at=midnight - 1)
    make_run(store, "at", created_at=midnight)
    make_run(store, "after", created_at=midnight + 3600)
    rc, out, _ = run_cli(capsys, "runs", "--json", "--since", "2024-03-10")
    assert rc == 0
    assert [r["run_id"] for r in json.loads(out)] == ["after", "at"]


@pytest.mark.parametrize("value", ["3", "d", "-2d", "2w", "1.5h", "2024-3-10", "2024-13-01", "x"])
def test_runs_invalid_since_even_without_store(state, capsys, value):
    rc, out, err = run_cli(capsys, "runs", f"--since={value}")
    assert (rc, out) == (1, "")
    assert err == (
        f"compose: invalid --since value '{value}': expected '<N>d', '<N>h', or 'YYYY-MM-DD'\n"
    )
    assert not state.exists()


@pytest.mark.parametrize("value", ["0", "-3", "abc", "2.5"])
def test_runs_invalid_limit_is_a_usage_error(state, capsys, value):
    with pytest.raises(SystemExit) as exc:
        main(["runs", "--limit", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: compose runs")
    assert err.endswith(f"error: --limit must be a positive integer, got '{value}'\n")


@pytest.mark.parametrize(
    "argv",
    [
        ["runs", "--status", "ok"],
        ["runs", "--kind", "task"],
        ["runs", "-q"],
        [],
        ["bogus"],
        ["trace", "--format", "dot", "X"],
        ["diff", "A"],
        ["diff"],
        ["costs", "--by", "run"],
        ["costs", "--import", "os"],
        ["export", "A"],
        ["export", "--cassette", "x.json"],
        ["path", "extra"],
    ],
)
def test_argument_errors_exit_2(state, capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "usage: compose" in capsys.readouterr().err


# -- trace -------------------------------------------------------------------


def traced_run(store, run_id, *, status="completed", created_at=None, pending=()):
    root = _core.ulid()
    spans = [
        span("nightly", "flow", sid=root, start=1000.0, end=1001.2, status=status),
        span(
            "anthropic/claude-haiku-4-5",
            "llm",
            parent=root,
            start=1000.1,
            end=1000.5,
            usage=usage(1000, 500, 0.0027),
        ),
        span("lookup", "tool", parent=root, start=1000.5, end=1000.55),
    ]
    # Stored in reverse: the CLI orders by start time.
    return make_run(
        store,
        run_id,
        status=status,
        created_at=created_at,
        spans=spans[::-1],
        pending=pending,
    )


TREE = (
    "trace T{rid} — ok — [$0.0027 · 1.5k tok · 1.2s]\n"
    "└─ ▶ nightly [$0.0027 · 1.5k tok · 1.2s]\n"
    "   ├─ ▸ anthropic/claude-haiku-4-5 [$0.0027 · 1.5k tok · 400ms]\n"
    "   └─ ⚙ lookup [50ms]\n"
)


def test_trace_by_full_id_and_prefix(store, capsys):
    traced_run(store, RID_E)
    traced_run(store, RID_N)
    assert run_cli(capsys, "trace", RID_E) == (0, TREE.format(rid=RID_E), "")
    assert run_cli(capsys, "trace", "01JZ3Q8") == (0, TREE.format(rid=RID_E), "")
    assert run_cli(capsys, "trace", "01JZ3Q7Y", "--format", "tree") == (
        0,
        TREE.format(rid=RID_N),
        "",
    )


def test_trace_prefix_is_exact_and_ambiguity_is_reported(store, capsys):
    traced_run(store, RID_F)
    traced_run(store, RID_E)
    traced_run(store, "01JZ3Q8M2C")
    # The exact id wins even though it prefixes two others.
    assert run_cli(capsys, "trace", "01JZ3Q8M2C")[0:2] == (0, TREE.format(rid="01JZ3Q8M2C"))
    rc, out, err = run_cli(capsys, "trace", "01JZ3Q8M2C4")
    assert (rc, out) == (1, "")
    assert err == (
        f"compose: run id prefix '01JZ3Q8M2C4' is ambiguous -- it matches 2 runs: "
        f"{RID_E}, {RID_F} -- use a longer prefix or the full id\n"
    )
    for bad in ("01jz3q8", "01JZ3Q8_", "01JZ%", "_1JZ"):
        assert run_cli(capsys, "trace", bad) == (
            1,
            "",
            _nf(bad),
        )


def test_trace_last_and_mermaid(store, capsys):
    now = time.time()
    traced_run(store, RID_N, created_at=now - 10)
    traced_run(store, RID_E, created_at=now - 100)
    assert run_cli(capsys, "trace", "--last") == (0, TREE.format(rid=RID_N), "")
    rc, out, _ = run_cli(capsys, "trace", "--last", "--format", "mermaid")
    assert rc == 0
    assert out == (
        "flowchart TD\n"
        's0["nightly [flow]"]\n'
        's1["anthropic/claude-haiku-4-5 [llm]"]\n'
        's2["lookup [tool]"]\n'
        "s0 --> s1\n"
        "s0 --> s2\n"
    )


def test_trace_without_id_or_last(store, capsys):
    traced_run(store, RID_E)
    assert run_cli(capsys, "trace") == (1, "", "compose trace: provide a run id or --last\n")


def test_trace_paused_banner(store, capsys):
    traced_run(
        store,
        RID_N,
        status="paused",
        pending=[
            ("title", "question", "Which title?", json.dumps(None)),
            ("publish", "approval", "Publish it?", json.dumps({"draft": "x", "n": [1, 2.5]})),
        ],
    )
    rc, out, err = run_cli(capsys, "trace", RID_N)
    assert (rc, err) == (0, "")
    tree, banner = out.split("\n\n", 1)
    assert tree.startswith(f"trace T{RID_N} — paused")
    assert "▶ nightly [$0.0027 · 1.5k tok · 1.2s] ⏸ paused" in tree
    assert banner == (
        f"⏸  run {RID_N} is paused with 2 pending interrupt(s):\n"
        "  - id='publish' kind='approval' question='Publish it?'\n"
        "    payload={'draft': 'x', 'n': [1, 2.5]}\n"
        "  - id='title' kind='question' question='Which title?'\n"
        "    payload=None\n"
        "\n"
        "To resume:\n"
        "    from composeai import resume\n"
        f"    resume('{RID_N}', answers={{'publish': True, 'title': '<answer>'}})\n"
    )


def test_trace_colour_follows_tty_and_no_color(store, capsys, monkeypatch):
    root = _core.ulid()
    make_run(
        store,
        RID_E,
        status="failed",
        spans=[
            span("f", "flow", sid=root, status="error", error={"type": "E", "message": "m"}),
            span(
                "t",
                parent=root,
                status="error",
                error={"type": "ValueError", "message": "bad\nmore", "stacktrace": ""},
            ),
        ],
    )
    _, plain, _ = run_cli(capsys, "trace", RID_E)
    assert "\x1b[" not in plain
    assert "└─ • t [1.0s] ✗ ValueError: bad\n" in plain
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    _, coloured, _ = run_cli(capsys, "trace", RID_E)
    assert "\x1b[31m ✗ ValueError: bad\x1b[0m" in coloured
    monkeypatch.setenv("NO_COLOR", "")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    assert run_cli(capsys, "trace", RID_E)[1] == plain


# -- --import ----------------------------------------------------------------


def test_import_modules(store, capsys, tmp_path, monkeypatch):
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "cli_good_mod.py").write_text(
        "import dataclasses, os\n"
        "os.environ['CLI_GOOD_MOD'] = 'yes'\n"
        "@dataclasses.dataclass\n"
        "class CliPoint:\n"
        "    x: int\n"
    )
    (mods / "cli_bad_mod.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(mods))
    monkeypatch.delenv("CLI_GOOD_MOD", raising=False)
    # Imported afresh on each store's run of this test.
    for name in ("cli_good_mod", "cli_bad_mod"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    traced_run(store, RID_E)
    rc, out, _ = run_cli(capsys, "runs", "--import", "cli_good_mod")
    assert rc == 0 and runs_rows(out).startswith(RID_E)
    assert os.environ["CLI_GOOD_MOD"] == "yes"
    # Its types are registered for decoding (OBS-61).
    from composeai import _codec

    assert _codec._REGISTRY.get("cli_good_mod:CliPoint") is sys.modules["cli_good_mod"].CliPoint
    assert run_cli(capsys, "trace", RID_E, "--import", "cli_good_mod")[0] == 0
    assert run_cli(capsys, "runs", "--import", "cli_good_mod", "--import", "cli_bad_mod") == (
        1,
        "",
        "compose: --import cli_bad_mod: boom at import\n",
    )
    assert run_cli(capsys, "trace", "--last", "--import", "no_such_mod_xyz") == (
        1,
        "",
        "compose: --import no_such_mod_xyz: No module named 'no_such_mod_xyz'\n",
    )


# -- path --------------------------------------------------------------------


@pytest.mark.sqlite_file
def test_path(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("COMPOSE_DIR", str(tmp_path / "somewhere"))
    assert run_cli(capsys, "path") == (0, f"{tmp_path / 'somewhere'}\n", "")
    monkeypatch.setenv("COMPOSE_DIR", "")
    assert run_cli(capsys, "path") == (0, ".compose\n", "")
    monkeypatch.delenv("COMPOSE_DIR")
    assert run_cli(capsys, "path") == (0, ".compose\n", "")
    monkeypatch.setenv("COMPOSE_DIR", "rel/dir/")
    assert run_cli(capsys, "path") == (0, "rel/dir\n", "")


@pytest.mark.sqlite_file
def test_default_dir_is_relative_to_cwd(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("COMPOSE_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    st = _core.Store(str(Path(".compose") / "runs.db"))
    make_run(st, RID_E, name="here")
    rc, out, _ = run_cli(capsys, "runs")
    assert rc == 0 and runs_rows(out).startswith(RID_E)


# -- a real process ----------------------------------------------------------


def test_python_dash_m_subprocess(store, state, tmp_path):
    traced_run(store, RID_E, created_at=time.time() - 30)
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env["COMPOSE_DIR"] = str(state)
    proc = subprocess.run(
        [sys.executable, "-m", "composeai.cli", "runs"],
        check=False,
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert runs_rows(proc.stdout).startswith(
        f"{RID_E}  flow      f                    completed  3"
    )
    assert proc.stdout.endswith("s ago      $0.0027     1500 tok\n")
    proc = subprocess.run(
        [sys.executable, "-m", "composeai.cli", "trace", "nope"],
        check=False,
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.startswith("compose: no run found with id 'nope' -- searched the ")


# -- runs -q (OBS-31) ------------------------------------------------------------


def searchable_runs(store):
    now = time.time()
    make_run(
        store,
        "R-zebra",
        name="zoo",
        created_at=now - 30,
        spans=[
            span("fetch_page", inp=json.dumps({"url": "https://zebra.example"})),
            span("summarize", out=json.dumps("stripes everywhere")),
        ],
    )
    make_run(
        store,
        "R-giraffe",
        kind="agent",
        name="safari",
        created_at=now - 20,
        spans=[span("look", inp=json.dumps("long neck giraffe"), out=json.dumps("tall"))],
    )
    # Content capture off: no payload, so only the name is searchable.
    make_run(store, "R-quiet", name="quiet", created_at=now - 10, spans=[span("hush")])


def test_runs_query_matches_span_names_and_payloads(store, capsys):
    searchable_runs(store)

    def ids(*argv):
        rc, out, err = run_cli(capsys, "runs", "--json", *argv)
        assert (rc, err) == (0, "")
        return [r["run_id"] for r in json.loads(out)]

    assert ids("-q", "zebra") == ["R-zebra"]
    assert ids("--query", "stripes") == ["R-zebra"]
    assert ids("-q", "giraffe OR zebra") == ["R-giraffe", "R-zebra"]
    assert ids("-q", "name:fetch_page") == ["R-zebra"]
    assert ids("-q", "hush") == ["R-quiet"]
    assert ids("-q", "tall", "--kind", "flow") == []
    assert ids("-q", "tall", "--kind", "agent") == ["R-giraffe"]
    assert ids("-q", "giraffe OR zebra", "-n", "1") == ["R-giraffe"]
    assert ids("-q", "nothing") == []
    rc, out, _ = run_cli(capsys, "runs", "-q", "zebra")
    assert rc == 0 and runs_rows(out).startswith("R-zebra ") and out.count("\n") == 2
    assert run_cli(capsys, "runs", "-q", "nothing") == (0, "no runs found\n", "")
    # Spans written later are indexed by the next search.
    make_run(store, "R-late", name="late", spans=[span("zebra_crossing")])
    assert ids("-q", "zebra_crossing") == ["R-late"]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("zebra AND", 'fts5: syntax error near ""'),
        ("nosuch:zebra", "no such column: nosuch"),
        ('"unterminated', "unterminated string"),
        ("", 'fts5: syntax error near ""'),
    ],
)
def test_runs_query_syntax_errors(store, capsys, query, message):
    searchable_runs(store)
    expected = (1, "", f"compose: invalid -q/--query syntax '{query}': {message}\n")
    assert run_cli(capsys, "runs", "-q", query) == expected
    # Reported even when no run passes the other filters.
    assert run_cli(capsys, "runs", "-q", query, "--status", "failed") == expected


def test_runs_query_without_a_store(state, capsys):
    assert run_cli(capsys, "runs", "-q", "zebra") == (0, "no runs found\n", "")
    assert run_cli(capsys, "runs", "-q", "zebra AND", "--json") == (0, "[]\n", "")
    assert not state.exists()


def test_runs_query_without_fts5_warns_and_does_not_filter(store, capsys, monkeypatch):
    searchable_runs(store)
    calls = []

    def no_fts5(db_path, query, status=None, kind=None, since=None, limit=10):
        calls.append(query)
        return "unavailable", _core.query_runs(db_path, status, kind, since, limit)

    monkeypatch.setattr(_core, "search_runs", no_fts5)
    rc, out, err = run_cli(capsys, "runs", "--json", "-q", "zebra")
    assert rc == 0 and calls == ["zebra"]
    assert [r["run_id"] for r in json.loads(out)] == ["R-quiet", "R-giraffe", "R-zebra"]
    assert err == (
        "compose: full-text search unavailable (FTS5 not compiled into this sqlite3 build) "
        "-- ignoring -q\n"
    )


@pytest.mark.sqlite_file
def test_runs_query_index_lives_in_derived_tables(store, state, capsys):
    searchable_runs(store)
    assert run_cli(capsys, "runs", "-q", "zebra")[0] == 0
    script = (
        "import sqlite3, sys\n"
        "con = sqlite3.connect(sys.argv[1])\n"
        'print(sorted(r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE name '
        "LIKE 'span_fts%' AND type = 'table' AND name IN ('span_fts', 'span_fts_state')\")))\n"
        "print(con.execute('PRAGMA user_version').fetchone()[0])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, store.path],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.split("\n")[:2] == ["['span_fts', 'span_fts_state']", "13"]
    # The engine keeps working with the derived tables present.
    make_run(store, "R-after", spans=[span("after")])
    assert store.get_run("R-after")["status"] == "completed"


# -- diff (OBS-33) --------------------------------------------------------------


def diff_runs(store):
    ra, rb, rb2 = _core.ulid(), _core.ulid(), _core.ulid()
    wa, wb = _core.ulid(), _core.ulid()
    make_run(
        store,
        RID_E,
        name="pipeline",
        spans=[
            span("pipeline", "flow", sid=ra, start=1000.0, end=1002.0, out='{"n": 1}'),
            span("fetch", parent=ra, start=1000.0, end=1000.5, out='"a"'),
            span("writer", "agent", sid=wa, parent=ra, start=1000.5, end=1001.5),
            span("m", "llm", parent=wa, start=1000.6, end=1001.0, usage=usage(100, 50, 0.002)),
            span("m", "llm", parent=wa, start=1001.0, end=1001.4, usage=usage(10, 5, None, False)),
            span("fetch", parent=ra, start=1001.5, end=1001.6, out='"x"'),
            span("only_a", "tool", parent=ra, start=1001.6, end=1001.7),
        ],
    )
    make_run(
        store,
        RID_N,
        name="pipeline",
        spans=[
            span("pipeline", "flow", sid=rb, start=2000.0, end=2003.0, out='{"n":1}'),
            span("fetch", parent=rb, start=2000.0, end=2000.4, out='"a"'),
            span("writer", "agent", sid=wb, parent=rb, start=2000.5, end=2001.0),
            span("m", "llm", parent=wb, start=2000.6, end=2001.0, usage=usage(80, 40, 0.001)),
            span("fetch", parent=rb, start=2001.5, end=2001.6, out='"y"'),
            span("only_b", "tool", parent=rb, start=2001.6, end=2001.7),
            # A second attempt's root: roots are siblings too.
            span("pipeline", "flow", sid=rb2, start=2004.0, end=2004.5),
        ],
    )


DIFF = """\
diff 01JZ3Q8M2C4V -> 01JZ3Q7YB0GQ
  Δcost: $-0.0010
  Δtokens: -45
  Δduration: +1500ms

  ▶ pipeline  Δcost=$-0.0010 Δtokens=-45 Δdur=+1000ms
    ◆ writer  Δcost=$-0.0010 Δtokens=-45 Δdur=-500ms
      ▸ m  Δcost=$-0.0010 Δtokens=-30 Δdur=+0ms
    - ▸ m
    • fetch  Δcost=n/a Δtokens=+0 Δdur=-100ms
    • fetch  Δcost=n/a Δtokens=+0 Δdur=-0ms  (output changed)
  - ⚙ only_a
  + ⚙ only_b
+ ▶ pipeline
"""


def test_diff(store, capsys):
    diff_runs(store)
    assert run_cli(capsys, "diff", RID_E, RID_N) == (0, DIFF, "")
    # Prefixes resolve (OBS-30); the header shows the resolved ids.
    assert run_cli(capsys, "diff", "01JZ3Q8", "01JZ3Q7")[1] == DIFF
    rc, out, _ = run_cli(capsys, "diff", RID_N, RID_E)
    assert rc == 0
    assert out.splitlines()[:4] == [
        "diff 01JZ3Q7YB0GQ -> 01JZ3Q8M2C4V",
        "  Δcost: +$0.0010",
        "  Δtokens: +45",
        "  Δduration: -1500ms",
    ]
    assert "- ▶ pipeline" in out.splitlines()
    assert "  + ⚙ only_a" in out.splitlines()
    # A run against itself: nothing changed.
    rc, out, _ = run_cli(capsys, "diff", RID_E, RID_E)
    assert out.splitlines()[1:4] == ["  Δcost: +$0.0000", "  Δtokens: +0", "  Δduration: +0ms"]
    assert "changed" not in out


def test_diff_costs_and_runs_without_spans(store, capsys):
    make_run(store, "R-empty-1")
    make_run(store, "R-empty-2")
    assert run_cli(capsys, "diff", "R-empty-1", "R-empty-2") == (
        0,
        "diff R-empty-1 -> R-empty-2\n  Δcost: n/a\n  Δtokens: +0\n  Δduration: +0ms\n\n",
        "",
    )
    make_run(store, "R-priced", spans=[span("m", "llm", usage=usage(1, 1, 0.5))])
    _, out, _ = run_cli(capsys, "diff", "R-empty-1", "R-priced")
    assert out.splitlines()[1:3] == ["  Δcost: +$0.5000", "  Δtokens: +2"]
    assert out.splitlines()[-1] == "+ ▸ m"


def test_diff_errors(store, capsys):
    diff_runs(store)
    assert run_cli(capsys, "diff", RID_E, "nope") == (
        1,
        "",
        _nf("nope"),
    )
    assert run_cli(capsys, "diff", "nope", RID_E) == (
        1,
        "",
        _nf("nope"),
    )
    make_run(store, RID_F)
    assert run_cli(capsys, "diff", "01JZ3Q8M2C4", RID_N) == (
        1,
        "",
        (
            f"compose: run id prefix '01JZ3Q8M2C4' is ambiguous -- it matches 2 runs: {RID_E}, "
            f"{RID_F} -- use a longer prefix or the full id\n"
        ),
    )


def test_diff_without_store(state, capsys):
    assert run_cli(capsys, "diff", "A", "B") == (1, "", "compose: no runs found\n")
    assert not state.exists()


# -- costs (OBS-34) -------------------------------------------------------------

HAIKU = {"model": "claude-haiku-4-5", "provider": "anthropic"}
LLAMA = {"model": "llama3", "provider": "ollama"}


def costs_runs(store, t0=1_700_000_000.0):
    make_run(
        store,
        "R-digest",
        name="digest",
        spans=[
            span("anthropic/claude-haiku-4-5", "llm", attrs=HAIKU, start=t0,
                 usage=usage(1000, 400, 0.003)),
            span("anthropic/claude-haiku-4-5", "llm", attrs=HAIKU, start=t0 + 1,
                 usage=usage(1500, 310, 0.0035)),
            span("ollama/llama3", "llm", attrs=LLAMA, start=t0 + 2,
                 usage=usage(500, 100, None, False)),
            span("work", "task", start=t0),
        ],
    )  # fmt: skip
    make_run(
        store,
        "R-agent",
        kind="agent",
        name="helper",
        spans=[
            span("anthropic/claude-haiku-4-5", "llm", attrs=HAIKU, start=t0 + 86400,
                 usage=usage(800, 200, 0.0024)),
            span("ollama/llama3", "llm", attrs=LLAMA, start=t0 + 86400,
                 usage=usage(250, 50, None, False)),
        ],
    )  # fmt: skip


COSTS_BY_MODEL = """\
costs by model
  claude-haiku-4-5         calls=3      tokens=4210       cost=$0.0089
  llama3                   calls=2      tokens=900        cost=-
  TOTAL                    calls=5      tokens=5110       cost=≥$0.0089
"""


def test_costs_by_model_example(store, capsys):
    costs_runs(store)
    assert run_cli(capsys, "costs") == (0, COSTS_BY_MODEL, "")
    assert run_cli(capsys, "costs", "--by", "model") == (0, COSTS_BY_MODEL, "")


def test_costs_by_name_and_day(store, capsys):
    t0 = 1_700_000_000.0
    costs_runs(store, t0)
    # Outside any run.
    store.queue_span("T-free", span("FakeModel", "llm", start=t0, usage=usage(10, 20)))
    store.flush()
    store.queue_span("T-free", span("FakeModel", "llm", start=t0, usage=usage(1, 1, 0.25)))
    store.flush()
    rc, out, _ = run_cli(capsys, "costs", "--by", "name")
    assert rc == 0
    assert out == (
        "costs by name\n"
        "  (none)                   calls=2      tokens=32         cost=$0.2500\n"
        "  digest                   calls=3      tokens=3810       cost=≥$0.0065\n"
        "  helper                   calls=2      tokens=1300       cost=≥$0.0024\n"
        "  TOTAL                    calls=7      tokens=5142       cost=≥$0.2589\n"
    )
    d0 = datetime.fromtimestamp(t0).date().isoformat()
    d1 = datetime.fromtimestamp(t0 + 86400).date().isoformat()
    rc, out, _ = run_cli(capsys, "costs", "--by", "day")
    assert out == (
        "costs by day\n"
        f"  {d0}               calls=5      tokens=3842       cost=≥$0.2565\n"
        f"  {d1}               calls=2      tokens=1300       cost=≥$0.0024\n"
        "  TOTAL                    calls=7      tokens=5142       cost=≥$0.2589\n"
    )


def test_costs_name_of_a_deleted_run_is_unknown(store, capsys):
    attempt = make_run(store, "R-doomed", name="doomed")
    # The run row goes away but a span still names it (rid of a deleted run).
    trace_id = attempt.trace_id
    del attempt
    make_run(store, "R-kept", name="kept", spans=[span("m", "llm", usage=usage(1, 2, 0.5))])
    raw_sql(store, "UPDATE spans SET rid = 999999 WHERE kind = 'llm'")
    assert trace_id
    _, out, _ = run_cli(capsys, "costs", "--by", "name")
    assert (
        out.splitlines()[1]
        == "  (unknown)                calls=1      tokens=3          cost=$0.5000"
    )


def test_costs_since_and_cost_formats(store, capsys):
    now = time.time()
    make_run(
        store,
        "R",
        spans=[
            span("old", "llm", start=now - 3 * 86400, usage=usage(1, 1, 1.0)),
            span("partly", "llm", start=now - 60, usage=usage(1, 1, 0.12345, False)),
            span("priced", "llm", start=now - 30, usage=usage(7, 0, 12345.6789)),
            span("free", "llm", start=now - 10, usage=usage(0, 0, None, True)),
        ],
    )
    rc, out, _ = run_cli(capsys, "costs", "--since", "1d")
    assert rc == 0
    assert out == (
        "costs by model\n"
        # No cost but a complete one (a cache hit's `Usage()`): nothing to add.
        "  free                     calls=1      tokens=0          cost=-\n"
        "  partly                   calls=1      tokens=2          cost=≥$0.1235\n"
        "  priced                   calls=1      tokens=7          cost=$12345.6789\n"
        "  TOTAL                    calls=3      tokens=9          cost=≥$12345.8023\n"
    )
    assert run_cli(capsys, "costs", "--since", "0h") == (
        0,
        "costs by model\nno llm spans found\n",
        "",
    )


def test_costs_without_llm_spans_or_store(state, capsys):
    for by in ("model", "name", "day"):
        assert run_cli(capsys, "costs", "--by", by) == (
            0,
            f"costs by {by}\nno llm spans found\n",
            "",
        )
    assert not state.exists()
    st = open_store(state)
    make_run(st, "R", spans=[span("t", "task")])
    assert run_cli(capsys, "costs") == (0, "costs by model\nno llm spans found\n", "")


@pytest.mark.parametrize("value", ["3", "2w", "2024-02-30", "yesterday"])
def test_costs_invalid_since(state, capsys, value):
    assert run_cli(capsys, "costs", "--since", value) == (
        1,
        "",
        f"compose: invalid --since value '{value}': expected '<N>d', '<N>h', or 'YYYY-MM-DD'\n",
    )
    assert not state.exists()


# -- export (OBS-35) -------------------------------------------------------------


def llm_input(system, messages):
    from composeai import _codec

    return _codec.dumps({"system": system, "messages": messages})


def export_run(store):
    from composeai import _codec
    from composeai.messages import Message, TextPart, ToolCallPart

    user = Message.user("hi")
    call = Message.assistant([TextPart(text="Let me check."), ToolCallPart(id="c1", name="lookup",
                             arguments={"q": "héllo"})])  # fmt: skip
    root = _core.ulid()
    a, b = sorted(_core.ulid() for _ in range(2))
    make_run(
        store,
        RID_E,
        kind="agent",
        name="helper",
        spans=[
            span("helper", "agent", sid=root, start=1000.0, end=1003.0),
            # Same start: ordered by span id.
            span("anthropic/claude-haiku-4-5", "llm", sid=b, parent=root, start=1001.0,
                 attrs=HAIKU, usage=(1200, 300, 5, 6, 7, 0.0027, True),
                 inp=llm_input("Sys.", [user, call]), out=_codec.dumps(Message.assistant("done"))),
            span("anthropic/claude-haiku-4-5", "llm", sid=a, parent=root, start=1001.0,
                 attrs=HAIKU, usage=usage(10, 20, None, False),
                 inp=llm_input("Sys.", [user]), out=_codec.dumps(call)),
            # No model attribute, no output, no usage (a failed call).
            span("FakeModel", "llm", parent=root, start=1000.5, status="error",
                 inp=llm_input(None, [user])),
            span("lookup", "tool", parent=root, start=1001.5),
        ],
    )  # fmt: skip
    # An llm span of the same trace that belongs to no run is not exported.
    store.queue_span("T" + RID_E, span("stray", "llm", inp=llm_input("x", []), start=999.0))
    store.flush()
    return user, call


def test_export(store, capsys, tmp_path):
    from composeai import _codec
    from composeai.messages import Message, StopReason, Usage
    from composeai.models.base import ModelResponse
    from composeai.testing import compute_message_hash

    user, call = export_run(store)
    path = tmp_path / "new" / "dirs" / "cassette.json"
    rc, out, err = run_cli(capsys, "export", "01JZ3Q8", "--cassette", str(path))
    assert (rc, out, err) == (0, f"wrote 3 entries to {path}\n", "")
    text = path.read_text(encoding="utf-8")
    data = json.loads(text)
    assert text == json.dumps(data, indent=2)
    assert list(data) == ["version", "entries"] and data["version"] == 2
    e0, e1, e2 = data["entries"]
    for e in data["entries"]:
        assert list(e) == ["full_hash", "message_hash", "request", "response"]
        assert e["full_hash"] is None
        assert list(e["request"]) == ["model", "system", "messages"]
    # Failed call: span name as model, empty assistant reply, Usage().
    assert e0["request"] == {
        "model": "FakeModel",
        "system": None,
        "messages": [user.model_dump(mode="json")],
    }
    assert e0["message_hash"] == compute_message_hash(None, [user])
    r0 = _codec.decode(e0["response"])
    assert r0 == ModelResponse(
        message=Message(role="assistant", parts=[]),
        stop_reason=StopReason.END_TURN,
        raw_stop_reason="end_turn",
        usage=Usage(),
        model_id="FakeModel",
        parsed=None,
    )
    # TEST-22 vector: compute_message_hash("Sys.", [Message.user("hi")]).
    assert e1["message_hash"] == "a99533f064e68d7594b36aebe24619d678c021a9d4014cc0452fec3fbdcf844a"
    assert e1["request"]["model"] == "claude-haiku-4-5"
    assert e1["response"]["$type"] == "composeai.models.base:ModelResponse"
    assert e1["response"]["value"]["stop_reason"] == "tool_use"
    assert e1["response"]["value"]["raw_stop_reason"] == "tool_use"
    assert _codec.decode(e1["response"]) == ModelResponse(
        message=call,
        stop_reason=StopReason.TOOL_USE,
        raw_stop_reason="tool_use",
        usage=Usage(input_tokens=10, output_tokens=20, cost_complete=False),
        model_id="claude-haiku-4-5",
    )
    assert e2["message_hash"] == compute_message_hash("Sys.", [user, call])
    assert e2["request"]["messages"] == [user.model_dump(mode="json"), call.model_dump(mode="json")]
    assert _codec.decode(e2["response"]) == ModelResponse(
        message=Message.assistant("done"),
        stop_reason=StopReason.END_TURN,
        raw_stop_reason="end_turn",
        usage=Usage(
            input_tokens=1200,
            output_tokens=300,
            cache_read_tokens=5,
            cache_creation_tokens=6,
            reasoning_tokens=7,
            cost_usd=0.0027,
        ),
        model_id="claude-haiku-4-5",
    )
    # Non-ASCII is escaped (json.dumps defaults); re-exporting overwrites.
    assert "h\\u00e9llo" in text
    assert run_cli(capsys, "export", RID_E, "--cassette", str(path))[0] == 0
    assert path.read_text(encoding="utf-8") == text


def test_export_warns_about_content_free_spans(store, capsys, tmp_path):
    root = _core.ulid()
    make_run(
        store,
        RID_E,
        kind="agent",
        spans=[
            span("a", "agent", sid=root),
            span("m", "llm", parent=root, start=1000.1, attrs=HAIKU, usage=usage(1, 2)),
            span("m", "llm", parent=root, start=1000.2, attrs=HAIKU, usage=usage(1, 2)),
            span("m", "llm", parent=root, start=1000.3, inp=llm_input("S", [])),
        ],
    )
    path = tmp_path / "c.json"
    rc, out, err = run_cli(capsys, "export", RID_E, "--cassette", str(path))
    assert (rc, out) == (0, f"wrote 3 entries to {path}\n")
    assert err == (
        "compose: warning -- 2 of 3 exported entries came from spans persisted with content "
        "capture disabled (COMPOSE_TRACE_CONTENT=0): their cassette entries have no "
        "system/messages (system=None, messages=[]) and can only ever replay-match on that "
        "equally-empty message_hash -- re-capture this run with COMPOSE_TRACE_CONTENT unset/1 "
        "for a realistic cassette\n"
    )
    entries = json.loads(path.read_text())["entries"]
    assert [e["message_hash"] for e in entries[:2]] == [
        "97590881022d69d2a04f17e8e5537edc1d4ac57cee1c95289a1efbb55540b8a4"
    ] * 2
    assert entries[0]["request"] == {"model": "claude-haiku-4-5", "system": None, "messages": []}


def test_export_of_a_run_without_llm_spans(store, capsys, tmp_path):
    make_run(store, RID_E, spans=[span("t")])
    path = tmp_path / "c.json"
    assert run_cli(capsys, "export", RID_E, "--cassette", str(path)) == (
        0,
        f"wrote 0 entries to {path}\n",
        "",
    )
    assert path.read_text() == '{\n  "version": 2,\n  "entries": []\n}'


def test_export_errors(state, capsys, tmp_path):
    path = tmp_path / "c.json"
    # No store: the not-found message.
    assert run_cli(capsys, "export", RID_E, "--cassette", str(path)) == (
        1,
        "",
        _nf(RID_E),
    )
    assert not state.exists()
    st = open_store(state)
    make_run(st, RID_E)
    make_run(st, RID_F)
    assert run_cli(capsys, "export", "nope", "--cassette", str(path)) == (
        1,
        "",
        _nf("nope"),
    )
    rc, _, err = run_cli(capsys, "export", "01JZ", "--cassette", str(path))
    assert rc == 1 and err.startswith("compose: run id prefix '01JZ' is ambiguous -- it matches 2")
    # Malformed stored payloads are refused, not guessed at.
    make_run(st, "R-odd", spans=[span("m", "llm", inp=json.dumps([1, 2]))])
    rc, _, err = run_cli(capsys, "export", "R-odd", "--cassette", str(path))
    assert rc == 1
    assert err.startswith("compose: llm span ") and "unexpected stored input (list)" in err
    make_run(st, "R-odd2", spans=[span("m", "llm", inp=llm_input(None, []), out='"text"')])
    rc, _, err = run_cli(capsys, "export", "R-odd2", "--cassette", str(path))
    assert rc == 1 and "unexpected stored output (str)" in err
    make_run(st, "R-odd3", spans=[span("m", "llm", inp="{not json")])
    rc, _, err = run_cli(capsys, "export", "R-odd3", "--cassette", str(path))
    assert rc == 1 and err.startswith("compose: corrupted journal/state row")
    assert not path.exists()
    # An unwritable destination.
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc, _, err = run_cli(capsys, "export", RID_E, "--cassette", str(blocker / "c.json"))
    assert rc == 1 and err.startswith(f"compose: cannot write cassette {blocker / 'c.json'}: ")


def test_export_decodes_user_types_registered_with_import(store, capsys, tmp_path, monkeypatch):
    """Export decodes through the registry: a tagged value of a user type decodes only after
    `--import` registered it, and an unknown tag is refused with the OBS-61 text."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "cli_export_types.py").write_text(
        "from pydantic import BaseModel\nclass Note(BaseModel):\n    text: str\n"
    )
    monkeypatch.syspath_prepend(str(mods))
    tag = "cli_export_types:Note"
    # Unregistered afresh on each store's run of this test.
    from composeai import _codec

    monkeypatch.delitem(sys.modules, "cli_export_types", raising=False)
    monkeypatch.delitem(_codec._REGISTRY, tag, raising=False)
    note = {"$kind": "pydantic", "$type": tag, "value": {"text": "n"}}
    inp = json.dumps({"system": "S", "messages": [], "note": note})
    make_run(store, RID_E, kind="agent", spans=[span("m", "llm", inp=inp)])
    path = tmp_path / "c.json"
    rc, out, err = run_cli(capsys, "export", RID_E, "--cassette", str(path))
    assert (rc, out) == (1, "")
    assert err == (
        f"compose: Cannot decode unregistered type '{tag}': import the module that defines it "
        "(e.g. `import cli_export_types`) or call register_serializable(...) before decoding "
        "this data. Types are never imported automatically, by design (security).\n"
    )
    assert "cli_export_types" not in sys.modules
    rc, out, err = run_cli(
        capsys, "export", RID_E, "--cassette", str(path), "--import", "cli_export_types"
    )
    assert (rc, out, err) == (0, f"wrote 1 entries to {path}\n", "")


# -- --import on every decoding command (OBS-37) ----------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["runs"],
        ["trace", RID_E],
        ["trace", "--last"],
        ["diff", RID_E, RID_E],
        ["export", RID_E, "--cassette", "unused.json"],
    ],
)
def test_import_failure_on_every_command(store, capsys, tmp_path, monkeypatch, argv):
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "cli_ok_mod.py").write_text("import enum\nclass Colour(enum.Enum):\n    RED = 1\n")
    (mods / "cli_syntax_mod.py").write_text("def broken(:\n")
    monkeypatch.syspath_prepend(str(mods))
    monkeypatch.chdir(tmp_path)
    traced_run(store, RID_E)
    assert run_cli(capsys, *argv, "--import", "cli_ok_mod")[0] == 0
    (tmp_path / "unused.json").unlink(missing_ok=True)
    from composeai import _codec

    assert _codec._REGISTRY["cli_ok_mod:Colour"] is sys.modules["cli_ok_mod"].Colour
    rc, out, err = run_cli(capsys, *argv, "--import", "cli_ok_mod", "--import", "cli_gone_xyz")
    assert (rc, out) == (1, "")
    assert err == "compose: --import cli_gone_xyz: No module named 'cli_gone_xyz'\n"
    rc, out, err = run_cli(capsys, *argv, "--import", "cli_syntax_mod")
    assert (rc, out) == (1, "")
    assert err.startswith("compose: --import cli_syntax_mod: ")
    assert not (tmp_path / "unused.json").exists()


# -- hostile stores: type tags are never imported -----------------------------------

_EVIL_STORE = r"""
import json, sys
from composeai import _core

path = sys.argv[1]


def tag(name, kind="pydantic"):
    value = "RED" if kind == "enum" else {"args": ["touch pwned"], "shell": True}
    return {"$kind": kind, "$type": name, "value": value}


def evil():
    return [
        tag("os:system"),
        tag("subprocess:Popen", "dataclass"),
        tag("cli_evil_marker:Payload", "enum"),
        {"nested": {"deeper": [tag("cli_evil_marker:Other")]}},
    ]


EVIL = json.dumps(evil())
EVIL_INPUT = json.dumps({"system": "pwned", "messages": [tag("os:system")]})
BENIGN_INPUT = json.dumps({"system": None, "messages": []})


def span(name, kind, sid, parent, start, *, inp=None, out=None, usage=None, step_key=None):
    return (sid, parent, kind, name, start, start + 0.5, "ok", False, step_key, None, usage,
            None, inp, out)


st = _core.Store(path)
runs = [("EVIL-A", "paused", EVIL_INPUT), ("EVIL-B", "completed", EVIL_INPUT),
        ("EVIL-C", "completed", BENIGN_INPUT)]
for i, (run_id, status, llm_input) in enumerate(runs):
    a = st.start_run("flow", "evil", run_id=run_id, trace_id="T-" + run_id,
                     args_json=json.dumps({"args": evil(), "kwargs": {"k": tag("os:system")}}))
    root, agent = _core.ulid(), _core.ulid()
    # A journaled step whose span output is stored by reference to the journal.
    a.commit("step#1", EVIL, span("step", "task", _core.ulid(), root, 1000.1, inp=EVIL,
                                  out=EVIL, step_key="step#1"))
    a.span(span("m", "llm", _core.ulid(), agent, 1000.3 + i, inp=llm_input,
                out=json.dumps(tag("subprocess:Popen", "dataclass")),
                usage=(1, 2, 0, 0, 0, 0.5, True)))
    a.span(span("agent", "agent", agent, root, 1000.2, inp=EVIL, out=EVIL))
    a.span(span("evil", "flow", root, None, 1000.0, inp=EVIL, out=EVIL if i else None))
    pending = [("approve_it", "approval", "Run it?", EVIL)] if status == "paused" else []
    a.settle(status, EVIL, None, pending)
"""

_EVIL_SQL = r"""
import json, sqlite3, sys

tag = {"$kind": "dataclass", "$type": "cli_evil_marker:Boom", "value": {}}
con = sqlite3.connect(sys.argv[1])
with con:
    con.execute("UPDATE runs SET error_json = ?, budget_json = ? WHERE run_id = 'EVIL-B'",
                (json.dumps(tag), json.dumps(tag)))
    con.execute("UPDATE spans SET attributes_json = ?, error_json = ? WHERE kind = 'llm'",
                (json.dumps({"model": tag, "provider": tag}),
                 json.dumps({"type": tag, "message": tag})))
    con.execute("INSERT INTO agent_state(rid, scope_key, messages_json, turn) "
                "SELECT rid, 'agent#1', ?, 1 FROM runs", (json.dumps([tag]),))
    con.execute("INSERT INTO journal(rid, step_key, value_json) SELECT rid, 'raw#1', ? FROM runs",
                (json.dumps(tag),))
con.close()
"""

_HOSTILE_COMMANDS = [
    ["runs"],
    ["runs", "--json"],
    ["runs", "-q", "pwned"],
    ["runs", "-q", "system"],
    ["trace", "EVIL-A"],
    ["trace", "EVIL-B", "--format", "mermaid"],
    ["trace", "--last"],
    ["diff", "EVIL-A", "EVIL-B"],
    ["diff", "EVIL-B", "EVIL-C"],
    ["costs"],
    ["costs", "--by", "name"],
    ["export", "EVIL-A", "--cassette", "{tmp}/a.json"],
    ["export", "EVIL-C", "--cassette", "{tmp}/c.json"],
]


@pytest.fixture
def hostile(state, tmp_path, monkeypatch):
    """A store whose payloads, journal values, interrupt payloads, run rows and agent state
    carry type tags naming `os:system`, `subprocess:Popen` and a module on `sys.path` whose
    import writes a marker file. Written through the store API plus raw SQL, both in child
    processes."""
    mods = tmp_path / "mods"
    mods.mkdir()
    marker = tmp_path / "IMPORTED"
    (mods / "cli_evil_marker.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\n"
        "import enum\nclass Payload(enum.Enum):\n    RED = 1\n"
    )
    monkeypatch.syspath_prepend(str(mods))
    monkeypatch.chdir(mods)  # even the working directory holds the module
    state.mkdir()
    db = str(state / "runs.db")
    for script in (_EVIL_STORE, _EVIL_SQL):
        subprocess.run([sys.executable, "-c", script, db], check=True, timeout=60)
    return mods, marker


def _check_refusal(argv, rc, out, err):
    assert rc in (0, 1), (argv, rc, err)
    if rc == 1:
        assert out == ""
        assert err.startswith("compose: ") and err.count("\n") == 1, err
    else:
        assert not err.startswith("compose: ") or "warning" in err, err


@pytest.mark.sqlite_file
def test_hostile_store_renders_or_refuses_without_importing(hostile, capsys, tmp_path):
    _, marker = hostile
    outputs = {}
    for argv in _HOSTILE_COMMANDS:
        argv = [a.format(tmp=tmp_path) for a in argv]
        rc, out, err = run_cli(capsys, *argv)
        _check_refusal(argv, rc, out, err)
        outputs[" ".join(argv[:2])] = (rc, out, err)
        assert not marker.exists(), argv
        assert "cli_evil_marker" not in sys.modules, argv
    # What renders, renders as plain JSON.
    rc, out, _ = outputs["runs --json"]
    rows = json.loads(out)
    assert {r["run_id"] for r in rows} == {"EVIL-A", "EVIL-B", "EVIL-C"}
    evil_a = next(r for r in rows if r["run_id"] == "EVIL-A")
    assert "cli_evil_marker:Payload" in evil_a["output_json"]
    assert "os:system" in evil_a["args_json"]
    assert outputs["runs -q"][0] == 0
    rc, out, _ = outputs["trace EVIL-A"]
    assert rc == 0
    assert "payload=[{'$kind': 'pydantic', '$type': 'os:system'" in out
    assert "resume('EVIL-A', answers={'approve_it': True})" in out
    rc, out, _ = outputs["diff EVIL-A"]
    assert rc == 0 and "(output changed)" in out
    # Export must decode messages: the unregistered tags are refused (OBS-61).
    rc, _, err = outputs["export EVIL-A"]
    assert rc == 1
    assert err.startswith(
        "compose: Cannot decode unregistered type 'os:system': import the module that defines "
        "it (e.g. `import os`)"
    )
    rc, _, err = outputs["export EVIL-C"]
    assert rc == 1
    assert err.startswith("compose: Cannot decode unregistered type 'subprocess:Popen'")
    assert not (tmp_path / "a.json").exists() and not (tmp_path / "c.json").exists()


_IN_CHILD = r"""
import json, sys
before = set(sys.modules)
from composeai.cli import main
rc = main(sys.argv[2:])
watched = ("subprocess", "cli_evil_marker")
loaded = [m for m in watched if m in sys.modules and m not in before]
with open(sys.argv[1], "w") as f:
    json.dump({"rc": rc, "loaded": loaded}, f)
"""


@pytest.mark.sqlite_file
def test_hostile_store_in_fresh_processes(hostile, state, tmp_path):
    mods, marker = hostile
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env["COMPOSE_DIR"] = str(state)
    env["PYTHONPATH"] = os.pathsep.join([str(mods), env.get("PYTHONPATH", "")])
    report = tmp_path / "report.json"
    for argv in _HOSTILE_COMMANDS:
        argv = [a.format(tmp=tmp_path) for a in argv]
        proc = subprocess.run(
            [sys.executable, "-c", _IN_CHILD, str(report), *argv],
            check=False,
            capture_output=True,
            text=True,
            encoding="utf-8",
            env=env,
            cwd=mods,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        got = json.loads(report.read_text())
        _check_refusal(argv, got["rc"], proc.stdout, proc.stderr)
        assert got["loaded"] == [], argv
        assert not marker.exists(), argv


# -- export of a real agent run -----------------------------------------------------


def test_export_matches_what_the_model_saw(state, capsys, tmp_path):
    from composeai.agentfn import agent
    from composeai.messages import Usage
    from composeai.models.base import ModelResponse
    from composeai.testing import FakeModel, compute_message_hash
    from composeai.tools import tool

    @tool
    def lookup(q: str) -> str:
        """Looks q up."""
        return f"found {q}"

    priced = Usage(input_tokens=3, output_tokens=4, cost_usd=0.01, cost_complete=True)
    model = FakeModel(
        [{"tool_calls": [{"name": "lookup", "arguments": {"q": "ü"}, "id": "c1"}]}, "done"],
        usage=priced,
    )

    @agent(model=model, tools=[lookup])
    def helper(text: str) -> str:
        """Sys."""
        return text

    run = helper.run("hi")
    path = tmp_path / "c.json"
    assert run_cli(capsys, "export", run.id, "--cassette", str(path)) == (
        0,
        f"wrote 2 entries to {path}\n",
        "",
    )
    entries = json.loads(path.read_text())["entries"]
    assert [e["message_hash"] for e in entries] == [
        compute_message_hash(r.system, r.messages) for r in model.requests
    ]
    assert [e["request"]["messages"] for e in entries] == [
        [m.model_dump(mode="json") for m in r.messages] for r in model.requests
    ]
    from composeai import _codec

    first, second = (_codec.decode(e["response"]) for e in entries)
    assert isinstance(first, ModelResponse) and first.usage == priced
    assert first.stop_reason == "tool_use" and first.model_id == "FakeModel"
    assert first.message == model.requests[1].messages[1]
    assert second.message.text == "done" and second.stop_reason == "end_turn"


# -- `costs` speed (OBS-34: aggregated in SQL/Rust) ------------------------------------

_MANY_SPANS = r"""
import json, sqlite3, sys
path, n = sys.argv[1], int(sys.argv[2])
con = sqlite3.connect(path)
(rid,) = con.execute("SELECT rid FROM runs").fetchone()
tid = -rid  # the run's own trace, as the engine stores it
attrs = [json.dumps({"model": m, "provider": "p"}) for m in ("a", "b", "c", "d")] + [None]
payload = json.dumps({"system": "s", "messages": ["x" * 300]})
rows = ((tid, rid, i.to_bytes(16, "big"), "llm", "m", 1.7e9 + i, 1.7e9 + i + 1, "ok", 0,
         attrs[i % 5], 100, 20, 0.001 if i % 3 else None, 1 if i % 3 else 0, payload, payload)
        for i in range(n))
with con:
    con.executemany(
        "INSERT INTO spans(tid, rid, span_id, kind, name, started_at, ended_at, status, flags, "
        "attributes_json, input_tokens, output_tokens, cost_usd, cost_complete, input_json, "
        "output_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
con.close()
"""


@pytest.mark.slow
@pytest.mark.sqlite_file
def test_costs_over_a_million_spans_takes_under_a_second(store, state):
    make_run(store, "R", name="big")
    n = 1_000_000
    subprocess.run([sys.executable, "-c", _MANY_SPANS, store.path, str(n)], check=True, timeout=600)
    env = {**os.environ, "COMPOSE_DIR": str(state)}
    for by in ("model", "name", "day"):
        for _ in range(2):  # the first run may warm the page cache
            t0 = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "composeai.cli", "costs", "--by", by],
                check=True,
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
            )
            elapsed = time.perf_counter() - t0
        assert f"TOTAL                    calls={n} " in proc.stdout
        assert elapsed < 1.0, (by, elapsed)


# -- CLI polish: --version, option help, Mermaid kept valid -------------------------------


def test_version_prints_the_installed_version(capsys):
    """`compose --version` prints the package version and exits 0."""
    import composeai

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"compose (composeai) {composeai.__version__}\n"


def _walk(parser, path=("compose",)):
    import argparse

    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, (*path, name))


def test_every_argument_of_every_command_has_help():
    """Each option and positional argument of every (sub)command says what it
    does in `--help`, and each command has a one-line description."""
    import argparse

    from composeai.cli import _build_parser

    missing = []
    walked = list(_walk(_build_parser()))
    assert len(walked) >= 20  # every command and `thread`'s sub-commands
    for path, parser in walked:
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                missing += [
                    f"{' '.join(path)} {c.dest}" for c in action._choices_actions if not c.help
                ]
                continue
            if not action.help:
                missing.append(f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


def test_mermaid_of_a_paused_run_is_only_the_diagram(store, capsys):
    """`--format mermaid` writes a valid Mermaid flowchart to stdout and
    nothing after it; the resume hint of a paused run goes to stderr."""
    traced_run(
        store,
        RID_N,
        status="paused",
        pending=[("publish", "approval", "Publish it?", json.dumps(None))],
    )
    rc, out, err = run_cli(capsys, "trace", RID_N, "--format", "mermaid")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == "flowchart TD"
    assert all(line.startswith("s") for line in lines[1:]), out
    assert "resume(" not in out and f"resume('{RID_N}'" in err


def test_runs_table_has_a_header_row(store, capsys):
    """The text table of `compose runs` starts with a header naming its
    columns, aligned with the rows; `--json` is unchanged (a list of rows)."""
    make_run(store, RID_E, name="nightly", created_at=time.time() - 30)
    rc, out, _ = run_cli(capsys, "runs")
    header, row = out.splitlines()
    assert rc == 0 and header + "\n" == RUNS_HEADER
    assert header.split() == ["RUN", "ID", "KIND", "NAME", "STATUS", "AGE", "COST", "TOKENS"]
    assert header.index("KIND") == row.index("flow")
    assert header.index("NAME") == row.index("nightly")
    assert len(header) == len(row)
    rc, out, _ = run_cli(capsys, "runs", "--json")
    assert [r["run_id"] for r in json.loads(out)] == [RID_E]
