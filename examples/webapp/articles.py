"""The flow the web app starts on a worker: an agent drafts an article (its
tokens streamed to the run's "tokens" stream), a human approves it, and
the run publishes its progress as the "progress" event.

Offline by default: the agent's model is a scripted stand-in that drafts
from the prompt. Set `ARTICLES_MODEL` (for example
`anthropic:claude-sonnet-4-5`) to draft with a real model.
"""

from __future__ import annotations

import os

import composeai as compose
from composeai import agent, flow
from composeai.testing import FakeModel

ARTICLES = compose.Queue("articles", concurrency=4)


def _offline_draft(request) -> str:
    topic = request.messages[-1].text.removeprefix("Write a short article about ")
    return (
        f"{topic.capitalize()} in three sentences. First, what {topic} is and why it matters. "
        f"Second, where {topic} is heading next. Third, what a reader can do about it today."
    )


MODEL = os.environ.get("ARTICLES_MODEL") or FakeModel([_offline_draft] * 100_000)


@agent(model=MODEL, stream_to="tokens")
def writer(topic: str) -> str:
    """You write short, plain articles."""
    return f"Write a short article about {topic}"


@flow
def article(topic: str) -> dict:
    compose.set_event("progress", {"stage": "drafting"})
    draft = writer(topic)
    compose.set_event("progress", {"stage": "awaiting approval", "words": len(draft.split())})
    published = compose.approve("publish", {"draft": draft})
    compose.set_event("progress", {"stage": "published" if published else "rejected"})
    return {"topic": topic, "draft": draft, "published": published}
