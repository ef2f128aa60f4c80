"""Process A: start the run; it pauses on the `publish` approval."""

import sys

from research_flow import research

run = research.run(sys.argv[1] if len(sys.argv) > 1 else "quantum computing")
print(f"status: {run.status}")
print(f"pending: {run.pending}")
print(f"run id: {run.id}")
