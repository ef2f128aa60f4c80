"""Golden outputs of every `compose` command over a store built by REAL runs.

`tests/golden/build_store.py` runs flows with tasks, a map, a nested flow and agents on
`FakeModel` (priced and unpriced usage, a tool call), a paused run, a paused-then-resumed run
(replayed steps), a failed run, a standalone agent, a pipe, an aggregate, an agent run with
`COMPOSE_TRACE_CONTENT=0` and work outside any run. It runs in a child process; so does the
touch-up below, which only moves times (SQLite's stdlib binding must not share the file with
the core's connections in one process):

* `runs.created_at` is set relative to now, so ages are stable;
* each trace is shifted whole (durations unchanged) to start at local noon of a fixed day, so
  `costs --by day` and `--since` are stable.

What still varies between builds is normalised before comparing: run and trace ids become
`<label>` placeholders (padded to the id's 26 characters where columns depend on it),
durations become `<t>` and signed duration deltas `<±ms>`.

Set `COMPOSE_UPDATE_GOLDEN=1` to rewrite the files under `tests/golden/` instead of comparing.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from composeai import _codec
from composeai.cli import main
from composeai.messages import Message
from composeai.testing import compute_message_hash

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("COMPOSE_UPDATE_GOLDEN") == "1"

# Age of each run (created_at = now - hours), newest first in `compose runs`.
AGES_H = {
    "triage_a": 50.5,
    "triage_b": 26.5,
    "publish_paused": 8.5,
    "publish_resumed": 7.5,
    "fragile": 6.5,
    "summarizer": 5.5,
    "pipe": 4.5,
    "aggregate": 3.5,
    "private": 0.5,
}
# Day (of March 2025) at whose local noon each run's trace starts; work outside any run: 9.
DAYS = {
    "triage_a": 1,
    "triage_b": 2,
    "publish_paused": 3,
    "publish_resumed": 3,
    "fragile": 4,
    "summarizer": 5,
    "pipe": 5,
    "aggregate": 6,
    "private": 7,
}
OTHER_DAY = 9

_TOUCH_UP = r"""
import json, sqlite3, sys
created, starts, other = json.loads(sys.argv[2])
con = sqlite3.connect(sys.argv[1])
with con:
    for run_id, t in created.items():
        con.execute("UPDATE runs SET created_at = ?, updated_at = ? WHERE run_id = ?",
                    (t, t, run_id))
    # A run's own trace is stored under -rid, any other under its traces row.
    tids = {}
    for tid, trace_id in con.execute(
            "SELECT -rid, trace_id FROM runs UNION ALL SELECT tid, trace_id FROM traces"):
        tids.setdefault(trace_id, []).append(tid)
    for trace_id, group in tids.items():
        target = starts.get(trace_id, other)
        among = "tid IN (" + ",".join("?" * len(group)) + ")"
        first = con.execute(f"SELECT MIN(started_at) FROM spans WHERE {among}",
                            group).fetchone()[0]
        if first is not None:
            con.execute(f"UPDATE spans SET started_at = started_at + ?, "
                        f"ended_at = ended_at + ? WHERE {among}",
                        (target - first, target - first, *group))
con.close()
"""


def _noon(day: int) -> float:
    return datetime(2025, 3, day, 12).timestamp()


def _touch_up_postgresql(url: str, created: dict, starts: dict, other: float) -> None:
    """`_TOUCH_UP` on a PostgreSQL store."""
    import _proc

    lit = _proc._sql_literal
    sql = [
        f"UPDATE runs SET created_at = {lit(t)}, updated_at = {lit(t)} WHERE run_id = {lit(r)};"
        for r, t in created.items()
    ]
    targets = ", ".join(f"({lit(k)}, {lit(v)}::FLOAT8)" for k, v in starts.items())
    sql.append(
        "UPDATE spans s SET started_at = s.started_at + d.delta, "
        "ended_at = s.ended_at + d.delta FROM (SELECT x.trace_id, "
        f"COALESCE(t.target, {lit(other)}::FLOAT8) - MIN(x.started_at) AS delta FROM spans x "
        f"LEFT JOIN (VALUES {targets}) AS t(trace_id, target) ON t.trace_id = x.trace_id "
        "GROUP BY x.trace_id, t.target) d WHERE s.trace_id = d.trace_id;"
    )
    _proc.pg_exec(url, " ".join(sql))


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def built(tmp_path_factory, request):
    """`(state_dir, store URL or None, {label: (run_id, trace_id)})` of the
    golden store, on each store (STORE-2: the same output to the character)."""
    root = tmp_path_factory.mktemp("golden")
    state = root / "state"
    env = {k: v for k, v in os.environ.items() if k not in ("COMPOSE_TRACE_CONTENT", "NO_COLOR")}
    env["COMPOSE_DIR"] = str(state)
    url = None
    env.pop("COMPOSE_STORE", None)
    if request.param == "postgresql":
        url = request.getfixturevalue("pg_cluster").url(f"golden{os.getpid()}")
        env["COMPOSE_STORE"] = url
    proc = subprocess.run(
        [sys.executable, str(GOLDEN / "build_store.py")],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    runs = {label: tuple(ids) for label, ids in json.loads(proc.stdout).items()}
    assert set(runs) == set(AGES_H) == set(DAYS)
    now = time.time()
    created = {runs[k][0]: now - h * 3600 for k, h in AGES_H.items()}
    starts = {runs[k][1]: _noon(d) for k, d in DAYS.items()}
    if url:
        _touch_up_postgresql(url, created, starts, _noon(OTHER_DAY))
        return state, url, runs
    subprocess.run(
        [
            sys.executable,
            "-c",
            _TOUCH_UP,
            str(state / "runs.db"),
            json.dumps([created, starts, _noon(OTHER_DAY)]),
        ],
        check=True,
        timeout=60,
    )
    return state, url, runs


@pytest.fixture
def cli(built, monkeypatch, capsys, tmp_path):
    """Runs `compose` in this process against the golden store; returns a function
    `(argv template) -> normalised transcript`."""
    state, url, runs = built
    monkeypatch.setenv("COMPOSE_DIR", str(state))
    if url:
        monkeypatch.setenv("COMPOSE_STORE", url)
    else:
        monkeypatch.delenv("COMPOSE_STORE", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)

    def run(template: str) -> str:
        argv = shlex.split(template.format(**{k: v[0] for k, v in runs.items()}, tmp=tmp_path))
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse usage errors
            rc = e.code
        out, err = capsys.readouterr()
        text = f"$ compose {template}\n{out}"
        if err:
            text += f"[stderr]\n{err}"
        text += f"[exit {rc}]\n"
        return normalise(text, runs)

    return run


_DURATION = re.compile(r"\b\d+(?:ms|\.\ds)(?=\])")
# Which store a not-found message searched differs between the stores.
_SEARCHED = re.compile(r"(no run found with id '[^']*') -- searched the [^\n]*")
_DELTA_MS = re.compile(r"(Δdur=|Δduration: )[+-]\d+ms")


def normalise(text: str, runs: dict[str, tuple[str, str]]) -> str:
    for label, (run_id, trace_id) in runs.items():
        text = text.replace(run_id, f"<{label}>".ljust(len(run_id), "_"))
        text = text.replace(trace_id, f"<trace:{label}>")
    text = _DURATION.sub("<t>", text)
    text = _SEARCHED.sub(r"\1 -- searched <store>", text)
    return _DELTA_MS.sub(r"\1<±ms>", text)


def check(name: str, text: str) -> None:
    path = GOLDEN / (name if "." in name else f"{name}.txt")
    if UPDATE:
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"missing golden file {path} (run with COMPOSE_UPDATE_GOLDEN=1)"
    assert text == path.read_text(encoding="utf-8"), f"golden mismatch: {path}"


def transcript(cli, *commands: str) -> str:
    return "\n".join(cli(c) for c in commands)


# ---------------------------------------------------------------------------


def test_runs(cli):
    check(
        "runs",
        transcript(
            cli,
            "runs",
            "runs -n 3",
            "runs --status paused",
            "runs --status failed",
            "runs --kind agent",
            "runs --kind pipe --status completed",
            "runs --since 6h",
            "runs --since 2d",
            "runs --since 2999-01-01",
        ),
    )


def test_runs_json(cli, built):
    _, _, runs = built
    text = cli("runs --json -n 20")
    body = text.split("\n", 1)[1].rsplit("[exit 0]\n", 1)[0]
    rows = json.loads(body)
    assert body == json.dumps(rows, indent=2) + "\n"
    # Times are the touched-up ones; show them as offsets in hours.
    for r in rows:
        label = next(k for k, v in runs.items() if f"<{k}>" in r["run_id"])
        assert r["created_at"] == pytest.approx(time.time() - AGES_H[label] * 3600, abs=600)
        r["created_at"] = r["updated_at"] = f"<now - {AGES_H[label]}h>"
    check("runs_json", text.split("\n", 1)[0] + "\n" + json.dumps(rows, indent=2) + "\n")


def test_runs_query(cli):
    check(
        "runs_query",
        transcript(
            cli,
            "runs -q fire",
            "runs -q lookup_ticket",
            "runs -q name:clean --kind flow -n 2",
            "runs -q privately",
            "runs -q summary --kind agent",
            'runs -q "fire AND"',
            "runs -q nosuch:fire",
        ),
    )


def test_trace(cli):
    check(
        "trace",
        transcript(
            cli,
            "trace {triage_a}",
            "trace {publish_paused}",
            "trace {publish_resumed}",
            "trace {fragile}",
            "trace {summarizer}",
            "trace {pipe}",
            "trace {private}",
            "trace --last",
        ),
    )


def test_trace_mermaid(cli):
    check(
        "trace_mermaid",
        transcript(
            cli, "trace {triage_a} --format mermaid", "trace {publish_resumed} --format mermaid"
        ),
    )


def test_diff(cli, built):
    _, _, runs = built
    text = transcript(
        cli,
        "diff {triage_a} {triage_b}",
        "diff {publish_paused} {publish_resumed}",
        "diff {summarizer} {private}",
    )
    # The header shows the first 12 characters of each id; ids made in the same millisecond
    # share them, so they are replaced positionally.
    pairs = [
        ("triage_a", "triage_b"),
        ("publish_paused", "publish_resumed"),
        ("summarizer", "private"),
    ]
    for a, b in pairs:
        header = f"diff {runs[a][0][:12]} -> {runs[b][0][:12]}\n"
        assert header in text
        text = text.replace(header, f"diff <{a}[:12]> -> <{b}[:12]>\n", 1)
    check("diff", text)


def test_costs(cli):
    check(
        "costs",
        transcript(
            cli,
            "costs",
            "costs --by model",
            "costs --by name",
            "costs --by day",
            "costs --since 2025-03-05",
            "costs --by day --since 2025-03-05",
            "costs --by name --since 2999-01-01",
        ),
    )


def test_export(cli, built, tmp_path):
    check(
        "export",
        transcript(
            cli,
            "export {triage_a} --cassette {tmp}/nested/dir/triage.json",
            "export {private} --cassette {tmp}/private.json",
            "export {pipe} --cassette {tmp}/pipe.json",
            "export {publish_resumed} --cassette {tmp}/publish.json",
        ).replace(str(tmp_path), "<tmp>"),
    )
    cassette = (tmp_path / "nested" / "dir" / "triage.json").read_text(encoding="utf-8")
    check("export_triage_a.json", cassette + "\n")
    check("export_private.json", (tmp_path / "private.json").read_text(encoding="utf-8") + "\n")
    # Every entry's hash is TEST-22's over the request it carries; responses decode.
    for name in ("nested/dir/triage.json", "private.json", "publish.json"):
        data = json.loads((tmp_path / name).read_text(encoding="utf-8"))
        for e in data["entries"]:
            req = e["request"]
            messages = [Message.model_validate(m) for m in req["messages"]]
            assert e["message_hash"] == compute_message_hash(req["system"], messages)
            response = _codec.decode(e["response"])
            assert response.model_id == req["model"]


def test_errors(cli):
    check(
        "errors",
        transcript(
            cli,
            "trace",
            "trace nope",
            "trace 0",
            "diff {triage_a} nope",
            "export nope --cassette {tmp}/x.json",
            "runs --since 3w",
            "costs --since yesterday",
            "runs --import no_such_module_xyz",
            "trace --last --import no_such_module_xyz",
            "diff {triage_a} {triage_b} --import no_such_module_xyz",
            "export {triage_a} --cassette {tmp}/x.json --import no_such_module_xyz",
        ),
    )
