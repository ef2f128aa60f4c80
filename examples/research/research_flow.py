"""The research flow from the flows guide, offline: fetch sources, summarize
them in parallel, draft, and publish only after a human approves."""

import composeai as compose


@compose.task
def fetch_sources(topic: str) -> list[str]:
    return [f"https://example.com/{topic.replace(' ', '-')}/{n}" for n in range(1, 4)]


@compose.task
def summarize(source: str) -> str:
    return f"summary of {source}"


@compose.task
def draft(summaries: list[str]) -> str:
    return "Draft: " + "; ".join(summaries)


@compose.task
def publish(text: str) -> str:
    return f"published: {text}"


@compose.flow
def research(topic: str) -> str:
    sources = fetch_sources(topic)
    summaries = compose.map(summarize, sources)
    text = draft(summaries)
    if compose.approve("publish", payload={"draft": text}):
        return publish(text)
    return f"kept as draft: {text}"
