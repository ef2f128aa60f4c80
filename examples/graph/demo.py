"""Runs the triage graph until the review suspends it, answers the review in
a fresh process, and prints the thread's history and the run's trace -- each
step in its own Python process."""

import os
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
env = dict(os.environ)
env.setdefault("COMPOSE_DIR", os.path.join(tempfile.mkdtemp(prefix="composeai-graph-"), ".compose"))
env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")


def step(title: str, *argv: str) -> str:
    print(f"$ {title}")
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
    print(out.rstrip() + "\n")
    return out


cli = (sys.executable, "-m", "composeai.cli")
step("python start.py T-1001", sys.executable, os.path.join(here, "start.py"), "T-1001")
step("compose threads", *cli, "threads")
finished = step(
    "python finish.py T-1001 approve", sys.executable, os.path.join(here, "finish.py"), "T-1001"
)
run_id = finished.strip().splitlines()[-1].split()[-1]
step("compose thread history T-1001", *cli, "thread", "history", "T-1001")
step(f"compose trace {run_id}", *cli, "trace", run_id)
