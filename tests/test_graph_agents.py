"""Agent nodes (EXT-22): the conversation comes from `state["messages"]`, the transcript
goes back, and an approval-gated tool pause suspends the graph."""

from __future__ import annotations

from composeai import agent, tool
from composeai.graph import END, Graph
from composeai.messages import Message
from composeai.testing import FakeModel


def test_ext22_an_agent_node_reads_and_writes_the_conversation():
    model = FakeModel(["hi there", "still here"])

    @agent(model=model)
    def helper(x: str) -> str:
        """Be brief."""
        return x

    wf = Graph(name="chat")
    wf.add_node("helper", helper).start("helper").edge("helper", END)
    app = wf.compile()
    first = app.run({"messages": "hello"})
    transcript = first.state["messages"]
    assert [m.role for m in transcript] == ["user", "assistant"]
    assert transcript[0].text == "hello" and transcript[1].text == "hi there"
    second = app.run({"messages": [*transcript, Message.user("again?")]})
    assert [m.text for m in second.state["messages"]] == [
        "hello",
        "hi there",
        "again?",
        "still here",
    ]
    assert model.requests[1].messages[-1].text == "again?"


def test_ext22_the_transcript_replaces_a_list_reduced_conversation():
    @agent(model=FakeModel(["ok"]))
    def appender(x: str) -> str:
        return x

    wf = Graph(reducers={"messages": "append"}, name="appended")
    wf.add_node("helper", appender).start("helper").edge("helper", END)
    result = wf.compile().run({"messages": [Message.user("q")]})
    assert [m.text for m in result.state["messages"]] == ["q", "ok"]


def test_ext22_an_approval_gated_tool_suspends_the_graph_and_resumes_with_answers():
    sent: list = []

    @tool(requires_approval=True)
    def send_email(to: str) -> str:
        """Send an email."""
        sent.append(to)
        return "sent"

    model = FakeModel(
        [
            {"tool_calls": [{"name": "send_email", "arguments": {"to": "a@b"}, "id": "c1"}]},
            "done: mailed",
        ]
    )

    @agent(model=model, tools=[send_email])
    def mailer(x: str) -> str:
        return x

    wf = Graph(name="mail")
    wf.add_node("mailer", mailer).start("mailer").edge("mailer", END)
    app = wf.compile()
    paused = app.run({"messages": "mail a@b"})
    assert paused.suspended and sent == []
    (interrupt,) = paused.interrupts
    assert interrupt.node == "mailer"
    assert interrupt.payload["kind"] == "agent_approval"
    (request,) = interrupt.payload["requests"]
    assert request["id"] == "tool:send_email:c1" and request["kind"] == "approval"
    done = app.resume(paused.snapshot, {"mailer": {"tool:send_email:c1": True}})
    assert sent == ["a@b"]
    assert done.state["messages"][-1].text == "done: mailed"
    assert len(model.requests) == 2, "the first model call replayed from the agent snapshot"


def test_ext22_agent_nodes_run_under_arun_on_a_thread_of_their_own():
    import asyncio
    import threading

    seen = []

    @tool
    def where() -> str:
        """Where the agent runs."""
        seen.append(threading.current_thread())
        return "here"

    model = FakeModel([{"tool_calls": [{"name": "where", "arguments": {}, "id": "w1"}]}, "ok"])

    @agent(model=model, tools=[where])
    def locator(x: str) -> str:
        return x

    wf = Graph(name="aio-agent")
    wf.add_node("locator", locator).start("locator").edge("locator", END)
    app = wf.compile()

    async def main():
        return await app.arun({"messages": "where?"}), threading.current_thread()

    result, caller = asyncio.run(main())
    assert result.state["messages"][-1].text == "ok"
    assert seen and seen[0] is not caller, "the agent did not block the caller's loop"


def test_ext21_a_gated_tool_of_an_agent_called_in_a_function_node_suspends_the_node():
    sent: list = []

    @tool(requires_approval=True)
    def send_email(to: str) -> str:
        """Send an email."""
        sent.append(to)
        return "sent"

    model = FakeModel(
        [
            {"tool_calls": [{"name": "send_email", "arguments": {"to": "a@b"}, "id": "c1"}]},
            "mailed",
        ]
    )

    @agent(model=model, tools=[send_email])
    def mailer(x: str) -> str:
        return x

    def notify(state):
        return {"reply": mailer(state["to"])}

    wf = Graph(name="notify").add_node("notify", notify)
    app = wf.start("notify").edge("notify", END).compile()
    paused = app.run({"to": "a@b"})
    (interrupt,) = paused.interrupts
    assert interrupt.node == "notify" and sent == []
    assert interrupt.payload["id"] == "tool:send_email:c1"
    assert interrupt.payload["payload"] == {"tool": "send_email", "arguments": {"to": "a@b"}}
    done = app.resume(paused.snapshot, {"notify": True})
    assert done.state["reply"] == "mailed" and sent == ["a@b"]
    assert len(model.requests) == 2, "the first model call replayed from the agent snapshot"
