"""Process A: a ticket arrives; the graph runs until the review suspends."""

import sys

from triage_graph import app

ticket_id = sys.argv[1] if len(sys.argv) > 1 else "T-1001"
result = app.thread(ticket_id, actor="intake").run(
    {"ticket": "I was charged twice, please refund my invoice.", "customer": "ana@example.com"}
)
print(f"suspended: {result.suspended} after {result.steps} steps")
for interrupt in result.interrupts:
    print(f"waiting: {interrupt.node}: {interrupt.payload['question']}")
    print(f"draft: {interrupt.payload['draft']}")
print(f"thread: {ticket_id}")
