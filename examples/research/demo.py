"""Runs the research flow until it pauses, resumes it in a fresh process,
and prints its trace -- each step in its own Python process."""

import os
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
env = dict(os.environ)
env.setdefault("COMPOSE_DIR", os.path.join(tempfile.mkdtemp(prefix="composeai-demo-"), ".compose"))
env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")


def step(title: str, *argv: str) -> str:
    print(f"$ {title}")
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
    print(out.rstrip() + "\n")
    return out


started = step("python start.py", sys.executable, os.path.join(here, "start.py"))
run_id = started.strip().splitlines()[-1].split()[-1]
step("compose trace --last (paused)", sys.executable, "-m", "composeai.cli", "trace", "--last")
step(f"python finish.py {run_id}", sys.executable, os.path.join(here, "finish.py"), run_id)
step(f"compose trace {run_id}", sys.executable, "-m", "composeai.cli", "trace", run_id)
