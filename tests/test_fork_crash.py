"""Issue 27: a fork killed with `kill -9` while it still borrows its source's
journal borrows the rest when it is resumed in another process: no step the
source journaled before the fork key executes again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

MODULE = """\
import os

import composeai as compose

LOG = os.environ["FORK_LOG"]


def note(name):
    with open(LOG, "a") as f:
        f.write(name + "\\n")


@compose.task
def a():
    note("a")
    return 1


@compose.task
def b():
    note("b")
    if os.environ.get("FAIL_B"):
        raise ValueError("b fails")
    if os.environ.get("KILL_B"):
        os.kill(os.getpid(), 9)
    return 2


@compose.task
def c():
    note("c")
    return 3


@compose.task
def d():
    note("d")
    return 4


@compose.flow
def chain():
    out = [a()]
    try:
        out.append(b())
    except ValueError:
        out.append(None)
    out.append(c())
    out.append(d())
    return out
"""


def _python(tmp_path: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {
        **os.environ,
        "COMPOSE_DIR": str(tmp_path / "state"),
        "FORK_LOG": str(tmp_path / "log"),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        **env,
    }
    environ.pop("COMPOSE_STORE", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _last_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_issue27_fork_killed_while_borrowing_borrows_the_rest_on_resume(tmp_path):
    (tmp_path / "chainmod.py").write_text(MODULE)
    # The source run: `b` failed (and was caught), so its journal holds a, c, d.
    source = _last_line(
        _python(
            tmp_path,
            """
            import chainmod
            run = chainmod.chain.run()
            assert run.status == "completed" and run.output == [1, None, 3, 4], run
            print(run.id)
            """,
            FAIL_B="1",
        )
    )
    # The fork at d#1 borrows a#1, executes b (not journaled in the source) and is
    # killed there, before it borrowed c#1.
    killed = _python(
        tmp_path,
        f"""
        import composeai as compose, chainmod
        compose.fork({source!r}, at="d#1")
        """,
        KILL_B="1",
    )
    assert killed.returncode == -9, killed.stderr
    resumed = _last_line(
        _python(
            tmp_path,
            f"""
            import json
            import composeai as compose, chainmod
            import os, sqlite3
            db = sqlite3.connect(os.path.join(os.environ["COMPOSE_DIR"], "runs.db"))
            (fork_id,) = db.execute(
                "SELECT run_id FROM runs WHERE run_id != ? AND kind = 'flow'", ({source!r},)
            ).fetchone()
            db.close()
            run = compose.resume(fork_id)
            print(json.dumps([fork_id, run.status, run.output]))
            """,
        )
    )
    fork_id, status, output = json.loads(resumed)
    assert fork_id != source
    assert (status, output) == ("completed", [1, 2, 3, 4])
    log = (tmp_path / "log").read_text().split()
    # Source: a b c d; killed fork: b; resumed fork: b d. `a` and `c` ran once, in
    # the source; the resumed fork borrowed `c#1` instead of executing it.
    assert log == ["a", "b", "c", "d", "b", "b", "d"]
