"""A research flow (see docs/getting-started.md): fetch sources, summarize them in
parallel, let an `editor` agent draft, and publish only after a human
approves. Offline by default: the editor runs on a scripted FakeModel unless
a provider key is set and its SDK is installed -- ANTHROPIC_API_KEY with
`pip install 'composeai[anthropic]'`, or OPENAI_API_KEY with
`pip install 'composeai[openai]'`."""

import importlib.util
import os

import composeai as compose
from composeai.testing import FakeModel


def _draft_reply(request) -> str:
    """The scripted editor: a short draft from the summaries it was given."""
    prompt = request.messages[-1].text
    return "Draft: " + prompt.split("from: ", 1)[-1]


def editor_model():
    if os.environ.get("ANTHROPIC_API_KEY") and importlib.util.find_spec("anthropic"):
        return "anthropic/claude-sonnet-5"
    if os.environ.get("OPENAI_API_KEY") and importlib.util.find_spec("openai"):
        return "openai/gpt-5.4"
    return FakeModel([_draft_reply] * 8)


@compose.task
def fetch_sources(topic: str) -> list[str]:
    return [f"https://example.com/{topic.replace(' ', '-')}/{n}" for n in range(1, 4)]


@compose.task
def summarize(source: str) -> str:
    return f"summary of {source}"


@compose.agent(model=editor_model())
def editor(summaries: list[str]) -> str:
    """Turn source summaries into a short draft."""
    return compose.prompt(f"Draft a short paragraph from: {'; '.join(summaries)}")


@compose.task
def publish(text: str) -> str:
    return f"published: {text}"


@compose.flow
def research(topic: str) -> str:
    sources = fetch_sources(topic)
    summaries = compose.map(summarize, sources)
    text = editor(summaries)
    if compose.approve("publish", payload={"draft": text}):
        return publish(text)
    return f"kept as draft: {text}"
