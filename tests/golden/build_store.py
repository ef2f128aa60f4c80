"""Builds the store behind the CLI golden tests (tests/test_cli_golden.py) from REAL runs.

Run as a script in a fresh process with `COMPOSE_DIR` set; prints a JSON object mapping each
scenario label to `[run_id, trace_id]` (both `null` for work outside any run). Everything the
golden files show is deterministic except ids, times and durations, which the tests normalise.
"""

from __future__ import annotations

import json
import os
import sys

from composeai import aggregate, approve, ask_human, flow, map, pipe, resume, task
from composeai.agentfn import agent
from composeai.messages import Message, ToolResultPart, Usage
from composeai.models import registry
from composeai.models.base import ModelRequest
from composeai.testing import FakeModel
from composeai.tools import tool

PRICED = Usage(input_tokens=1200, output_tokens=300, cost_usd=0.0027, cost_complete=True)
CHEAP = Usage(input_tokens=200, output_tokens=50, cost_usd=0.0004, cost_complete=True)
UNPRICED = Usage(input_tokens=40, output_tokens=10, cost_complete=False)


def _last(request: ModelRequest) -> Message:
    return request.messages[-1]


def classify(request: ModelRequest) -> object:
    """First turn: look the ticket up; second turn: answer from the tool result."""
    last = _last(request)
    results = [p for p in last.parts if isinstance(p, ToolResultPart)]
    if results:
        return "urgent" if "fire" in results[0].content else "routine"
    return {
        "tool_calls": [
            {"name": "lookup_ticket", "arguments": {"ticket_id": "T-1"}, "id": "call_1"}
        ],
        "text": "Let me look that up.",
    }


def summarize(request: ModelRequest) -> object:
    return f"Summary of {len(_last(request).text.split())} words."


# `fake/<id>` resolves to a scripted model: the llm spans are named `fake/<id>` and carry the
# bare id as their `model` attribute, like a real provider's.
def _factory(model_id: str) -> FakeModel:
    if model_id == "claude-haiku-4-5":
        return FakeModel([classify] * 100, usage=PRICED)
    if model_id == "gpt-4o-mini":
        return FakeModel([summarize] * 100, usage=CHEAP)
    return FakeModel([summarize] * 100)  # unpriced (TEST-3 default usage)


registry.register_provider("fake", _factory)


@tool
def lookup_ticket(ticket_id: str) -> str:
    """Look a support ticket up."""
    return f"ticket {ticket_id}: the printer is on fire"


@agent(model="fake/claude-haiku-4-5", tools=[lookup_ticket])
def classifier(text: str) -> str:
    """You classify support tickets."""
    return f"Classify: {text}"


@agent(model="fake/gpt-4o-mini")
def summarizer(text: str) -> str:
    """You summarize."""
    return text


@agent(model="fake/llama3")
def local_summarizer(text: str) -> str:
    """You summarize, locally."""
    return text


@task
def clean(text: str) -> str:
    return " ".join(text.lower().split())


@task
def tag(word: str) -> str:
    return f"#{word}"


@task
def explode(text: str) -> str:
    raise ValueError(f"cannot handle {text!r}\nsecond line of the message")


@flow
def enrich(text: str) -> dict:
    return {"words": len(text.split()), "summary": summarizer(text)}


@flow
def triage(text: str) -> dict:
    cleaned = clean(text)
    label = classifier(cleaned)
    tags = map(tag, cleaned.split()[:3], max_workers=1)
    return {"label": label, "tags": tags, **enrich(cleaned)}


@flow
def publish(draft: str) -> str:
    body = clean(draft)
    if not approve("publish", {"draft": body, "length": len(body)}):
        return "rejected"
    title = ask_human("title", "Which title?")
    return f"{title}: {local_summarizer(body)}"


@flow
def fragile(text: str) -> str:
    local_summarizer(clean(text))
    return explode(text)


@task
def outside(text: str) -> str:
    """Called outside any flow: its spans (and its agent's) belong to no run."""
    return local_summarizer(text)


def shout(text: str) -> str:
    return text.upper()


def count(text: str) -> int:
    return len(text)


def main() -> None:
    from composeai import _core, _engine

    runs: dict[str, object] = {}

    def record(label: str, run_id: str) -> None:
        row = _engine.get_store().get_run(run_id)
        runs[label] = [run_id, row["trace_id"]]

    def newest() -> str:
        path = os.environ.get("COMPOSE_STORE") or os.path.join(os.environ["COMPOSE_DIR"], "runs.db")
        return _core.query_runs(path, limit=1)[0]["run_id"]

    record("triage_a", triage.run("Printer on FIRE").id)
    record("triage_b", triage.run("The printer is on fire again").id)

    record("publish_paused", publish.run("Hello   World").id)

    first = publish.run("Big news today")
    resume(first.id, answers={"publish": True})
    resume(first.id, answers={"title": "Extra"})
    record("publish_resumed", first.id)

    try:
        fragile.run("boom")
    except ValueError:
        pass
    record("fragile", newest())

    record("summarizer", summarizer.run("a standalone agent call").id)
    record("pipe", pipe(shout, count).run("piped text").id)
    record("aggregate", aggregate(loud=shout, size=count).run("both").id)

    os.environ["COMPOSE_TRACE_CONTENT"] = "0"
    try:
        record("private", classifier.run("Printer on fire, privately").id)
    finally:
        del os.environ["COMPOSE_TRACE_CONTENT"]

    outside("no run owns this call")
    json.dump(runs, sys.stdout)


if __name__ == "__main__":
    main()
