"""The `compose` CLI (OBS-30 … OBS-32, OBS-36, OBS-37) against real stores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from composeai import _core
from composeai.cli import main

RID_E = "01JZ3Q8M2C4VDX9R7T5N6B1A0E"
RID_F = "01JZ3Q8M2C4VDX9R7T5N6B1A0F"
RID_N = "01JZ3Q7YB0GQ2W8E5F4H3K2M1N"


@pytest.fixture
def state(tmp_path, monkeypatch):
    d = tmp_path / "state"
    monkeypatch.setenv("COMPOSE_DIR", str(d))
    monkeypatch.delenv("NO_COLOR", raising=False)
    return d


@pytest.fixture
def store(state):
    return _core.Store(str(state / "runs.db"))


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
        None,
        None,
        usage,
        None if error is None else json.dumps(error),
        None,
        None,
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
    """Backdates runs. Done in a child process: the stdlib `sqlite3` and the
    core's bundled SQLite must not share a database file within one process
    (POSIX locks are per process, so one library's close drops the other's)."""
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
        "compose: no run found with id '01ABC'\n",
    )
    assert not state.exists()


def test_empty_store(store, capsys):
    assert run_cli(capsys, "runs") == (0, "no runs found\n", "")
    assert run_cli(capsys, "runs", "--json") == (0, "[]\n", "")
    assert run_cli(capsys, "trace", "--last") == (1, "", "compose: no runs found\n")
    assert run_cli(capsys, "trace", "X") == (1, "", "compose: no run found with id 'X'\n")


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
    assert out == (
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
    lines = out.splitlines()
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
    [["runs", "--status", "ok"], ["runs", "--kind", "task"], [], ["bogus"]],
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
            f"compose: no run found with id '{bad}'\n",
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
    traced_run(store, RID_E)
    rc, out, _ = run_cli(capsys, "runs", "--import", "cli_good_mod")
    assert rc == 0 and out.startswith(RID_E)
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


def test_path(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("COMPOSE_DIR", str(tmp_path / "somewhere"))
    assert run_cli(capsys, "path") == (0, f"{tmp_path / 'somewhere'}\n", "")
    monkeypatch.setenv("COMPOSE_DIR", "")
    assert run_cli(capsys, "path") == (0, ".compose\n", "")
    monkeypatch.delenv("COMPOSE_DIR")
    assert run_cli(capsys, "path") == (0, ".compose\n", "")
    monkeypatch.setenv("COMPOSE_DIR", "rel/dir/")
    assert run_cli(capsys, "path") == (0, "rel/dir\n", "")


def test_default_dir_is_relative_to_cwd(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("COMPOSE_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    st = _core.Store(str(Path(".compose") / "runs.db"))
    make_run(st, RID_E, name="here")
    rc, out, _ = run_cli(capsys, "runs")
    assert rc == 0 and out.startswith(RID_E)


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
    assert proc.stdout.startswith(f"{RID_E}  flow      f                    completed  3")
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
    assert proc.stderr == "compose: no run found with id 'nope'\n"
