"""Process B: a fresh interpreter answers the review and the thread continues."""

import sys

from triage_graph import app

thread = app.thread(sys.argv[1], actor="reviewer-7")
print(f"pending: {[i.node for i in thread.interrupts()]}")
result = thread.resume({"review": sys.argv[2] if len(sys.argv) > 2 else "approve"})
print(f"suspended: {result.suspended}")
print(f"sent: {result.state.get('sent')}")
print(f"run id: {result.run_id}")
