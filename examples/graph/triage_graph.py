"""A support-ticket triage graph: classify the ticket, route it to a desk,
research it along two parallel branches, join them, draft a reply with an
agent, let a person review the draft (the run suspends), then send it.

Offline: the drafting agent runs on a scripted FakeModel. Everything is kept
in the composeai store ($COMPOSE_DIR), one thread per ticket, so the review can
be answered from another process.
"""

from composeai import agent, prompt, task
from composeai.graph import END, Graph, suspend
from composeai.testing import FakeModel


def _reply(request) -> str:
    facts = request.messages[-1].text.split("Facts: ", 1)[-1]
    return f"Hello, thanks for reaching out. {facts} -- The support team"


@agent(model=FakeModel([_reply] * 16))
def writer(ticket: str, facts: str) -> str:
    """You write short, friendly support replies."""
    return prompt(f"Ticket: {ticket}\nFacts: {facts}")


@task
def search_kb(category: str) -> str:
    return f"KB: the {category} FAQ covers this case."


@task
def account_history(customer: str) -> str:
    return f"History: {customer} has 2 earlier tickets, both solved."


@task
def send_email(to: str, body: str) -> str:
    return f"sent to {to} ({len(body)} chars)"


triage = Graph(reducers={"facts": "append"}, name="ticket-triage")


@triage.node
def classify(state):
    text = state["ticket"].lower()
    return {"category": "billing" if "refund" in text or "invoice" in text else "technical"}


@triage.node
def billing_desk(state):
    return {"desk": "billing"}


@triage.node
def tech_desk(state):
    return {"desk": "technical"}


@triage.node
def kb_research(state):
    return {"facts": [search_kb(state["category"])]}


@triage.node
def history_research(state):
    return {"facts": [account_history(state["customer"])]}


@triage.node
def draft(state):
    notes = " ".join(state["facts"])
    if state.get("feedback"):
        notes += f" Reviewer: {state['feedback']}"
    return {"draft": writer(state["ticket"], notes)}


@triage.node
def review(state, ctx):
    if ctx.resume is None:
        return suspend({"question": "Send this reply?", "draft": state["draft"]})
    if ctx.resume == "approve":
        return {"approved": True}
    return {"approved": False, "feedback": str(ctx.resume)}


@triage.node
def send(state):
    return {"sent": send_email(state["customer"], state["draft"])}


triage.start("classify")
triage.route(
    "classify", lambda s: s["category"], {"billing": "billing_desk", "technical": "tech_desk"}
)
for desk in ("billing_desk", "tech_desk"):
    triage.edge(desk, "kb_research").edge(desk, "history_research")
triage.join(["kb_research", "history_research"], "draft")
triage.edge("draft", "review")
triage.route(
    "review", lambda s: "send" if s["approved"] else "redraft", {"send": "send", "redraft": "draft"}
)
triage.edge("send", END)

app = triage.compile()
