"""Persistent chats (chats.md CHAT-1 … CHAT-8)."""

from __future__ import annotations

import textwrap

import pytest

import composeai as compose
from _proc import Sandbox
from composeai import _engine
from composeai.agentfn import agent
from composeai.chat import Chat, ChatStream, chat, load_chat
from composeai.errors import ConfigError
from composeai.hitl import ApprovalReply
from composeai.interception import BeforeTool
from composeai.messages import Message, ToolCallPart, ToolResultPart
from composeai.runs import Budget
from composeai.testing import FakeModel, reset_registries
from composeai.tools import tool


@pytest.fixture(autouse=True)
def clean_agent_registry():
    reset_registries()
    yield
    reset_registries()


def calls(*specs: tuple) -> dict:
    return {"tool_calls": [{"name": n, "arguments": a, "id": i} for n, a, i in specs]}


def chat_row(state_dir, chat_id: str):
    """The `chats` row, read through the core."""
    return _engine.get_store().load_chat(chat_id)


def texts(messages: list[Message]) -> list[tuple[str, str]]:
    return [(m.role, m.text) for m in messages]


def test_chat1_new_chat_has_fresh_id_empty_history_and_stores_nothing(isolated_state):
    @agent(model=FakeModel([]))
    def helper(x: str) -> str:
        """Be helpful."""
        return x

    a, b = chat(helper), chat(helper)
    assert isinstance(a, Chat)
    assert len(a.id) == 26 and a.id != b.id
    assert a.messages == [] and a.pending is None
    assert not (isolated_state / "runs.db").exists() or chat_row(isolated_state, a.id) is None


def test_chat1_chat_requires_an_agent_function():
    with pytest.raises(ConfigError, match="chat\\(\\) requires an @agent function"):
        chat(lambda x: x)


def test_chat2_messages_is_a_copy_without_system_prompt():
    @agent(model=FakeModel(["hi there"]))
    def helper(x: str) -> str:
        """System prompt."""
        return x

    c = chat(helper)
    c.send("hello")
    msgs = c.messages
    assert texts(msgs) == [("user", "hello"), ("assistant", "hi there")]
    msgs.append(Message.user("mutated"))
    assert len(c.messages) == 2


def test_chat3_send_is_a_standalone_agent_run_and_the_body_is_not_called(isolated_state):
    body_calls: list = []
    model = FakeModel(["first reply", "second reply"])

    @agent(model=model)
    def helper(x: str) -> str:
        """Be helpful."""
        body_calls.append(x)
        return "never used"

    c = chat(helper)
    run1 = c.send("one")
    assert run1.status == "completed" and run1.output == "first reply"
    run2 = c.send("two")
    assert run2.output == "second reply"
    assert body_calls == []
    assert texts(model.requests[1].messages) == [
        ("user", "one"),
        ("assistant", "first reply"),
        ("user", "two"),
    ]
    assert model.requests[1].system == "Be helpful."
    row = _engine.get_store().get_run(run2.id)
    assert row["kind"] == "agent" and row["name"] == "helper" and row["status"] == "completed"
    assert [s.kind for s in run2.trace.spans][:2] == ["agent", "llm"]
    assert run2.usage.input_tokens > 0


def test_chat3_overrides_and_budget_pass_through():
    model = FakeModel(["ok"])
    other = FakeModel(["from override"])

    @agent(model=model)
    def helper(x: str) -> str:
        """Docstring prompt."""
        return x

    c = chat(helper, system="Override prompt.", model=other)
    run = c.send("hi", budget=Budget(usd=5.0))
    assert run.output == "from override"
    assert model.requests == []
    assert other.requests[0].system == "Override prompt."
    row = _engine.get_store().get_run(run.id)
    assert '"usd"' in row["budget_json"]


def test_chat4_completed_send_upserts_the_chat_row(isolated_state):
    @agent(model=FakeModel(["a1", "a2"]))
    def helper(x: str) -> str:
        return x

    c = chat(helper, system="S", model=FakeModel(["x1", "x2"]))
    c.send("q1")
    first = chat_row(isolated_state, c.id)
    assert first["agent_name"] == "helper" and first["system"] == "S"
    assert first["model"] is None  # a Model instance is not stored
    c.send("q2")
    second = chat_row(isolated_state, c.id)
    assert second["created_at"] == first["created_at"]
    assert second["updated_at"] >= first["updated_at"]
    from composeai import _codec

    assert texts(_codec.loads(second["messages_json"])) == [
        ("user", "q1"),
        ("assistant", "x1"),
        ("user", "q2"),
        ("assistant", "x2"),
    ]


def test_chat4_history_is_the_runs_messages_so_compaction_persists(isolated_state):
    def compact(messages, _tokens):
        return messages[-1:]

    @agent(model=FakeModel(["r1", "r2"]))
    def helper(x: str) -> str:
        return x

    c = chat(helper, context_manager=compact)
    c.send("one")
    assert texts(c.messages) == [("user", "one"), ("assistant", "r1")]
    c.send("two")
    assert texts(c.messages) == [("user", "two"), ("assistant", "r2")]
    from composeai import _codec

    stored = _codec.loads(chat_row(isolated_state, c.id)["messages_json"])
    assert texts(stored) == [("user", "two"), ("assistant", "r2")]


def test_chat4_paused_send_sets_pending_and_keeps_history(isolated_state):
    @tool(requires_approval=True)
    def delete(path: str) -> str:
        """Delete a file."""
        return f"deleted {path}"

    @agent(
        model=FakeModel(["hello", calls(("delete", {"path": "a"}, "c1")), "done"]), tools=[delete]
    )
    def helper(x: str) -> str:
        return x

    c = chat(helper)
    c.send("hi")
    before = c.messages
    run = c.send("delete a")
    assert run.status == "paused"
    assert c.pending is not None and c.pending.id == "tool:delete:c1"
    assert c.messages == before
    from composeai import _codec

    assert len(_codec.loads(chat_row(isolated_state, c.id)["messages_json"])) == 2
    done = c.resume({"delete": True})
    assert done.status == "completed" and done.output == "done"
    assert c.pending is None
    assert texts(c.messages)[-1] == ("assistant", "done")
    assert len(_codec.loads(chat_row(isolated_state, c.id)["messages_json"])) == 6


def test_chat5_resume_with_nothing_paused_raises():
    @agent(model=FakeModel(["x"]))
    def helper(x: str) -> str:
        return x

    c = chat(helper)
    with pytest.raises(ConfigError) as info:
        c.resume()
    assert str(info.value) == "nothing to resume: this chat has no paused send"
    c.send("q")
    with pytest.raises(ConfigError, match="nothing to resume"):
        c.resume({"x": True})


def test_chat5_resume_uses_the_chats_own_callbacks_and_full_ids():
    seen: list = []

    @tool(requires_approval=True)
    def risky(n: int) -> str:
        """Risky."""
        return f"risky {n}"

    class Interceptor:
        def before(self, call: ToolCallPart):
            seen.append(("before", call.name))
            return BeforeTool(arguments={"n": 7})

        def after(self, call: ToolCallPart, result: ToolResultPart):
            seen.append(("after", result.content))

    def compact(messages, tokens):
        seen.append(("compact", len(messages)))
        return messages

    model = FakeModel([calls(("risky", {"n": 1}, "c1")), "finished"])

    @agent(model=model, tools=[risky])
    def helper(x: str) -> str:
        return x

    c = chat(helper, tool_interceptor=Interceptor(), context_manager=compact)
    assert c.send("go").status == "paused"
    seen.clear()
    run = c.resume({"tool:risky:c1": True})
    assert run.status == "completed"
    assert ("before", "risky") in seen and ("after", "risky 7") in seen
    assert any(k == "compact" for k, _ in seen)
    results = [p for m in c.messages for p in m.parts if isinstance(p, ToolResultPart)]
    assert results[0].content == "risky 7"


def test_chat5_approver_keeps_working_after_a_paused_send():
    asked: list = []

    @tool
    def confirm() -> str:
        """Ask the human first."""
        return "human says " + ("yes" if compose.approve("go-ahead") else "no")

    @tool(requires_approval=True)
    def risky(n: int) -> str:
        """Risky."""
        return f"risky {n}"

    script = [calls(("confirm", {}, "c1")), calls(("risky", {"n": 2}, "c2")), "end"]

    @agent(model=FakeModel(script), tools=[confirm, risky])
    def helper(x: str) -> str:
        return x

    def approver(interrupt):
        asked.append(interrupt.id)
        return True

    c = chat(helper, approver=approver)
    run = c.send("go")
    assert run.status == "paused" and c.pending.id == "go-ahead"
    assert c.resume({"go-ahead": True}).status == "completed"
    assert asked == ["tool:risky:c2"]
    results = [p.content for m in c.messages for p in m.parts if isinstance(p, ToolResultPart)]
    assert results == ["human says yes", "risky 2"]


def test_chat6_stream_yields_events_and_folds_once(isolated_state):
    @agent(model=FakeModel(["streamed reply"]))
    def helper(x: str) -> str:
        return x

    c = chat(helper)
    stream = c.stream("hi")
    assert isinstance(stream, ChatStream)
    events = list(stream)
    assert events[-1].kind == "run_finished" and events[-1].data == {"status": "completed"}
    assert any(e.kind == "text_delta" for e in events)
    assert texts(c.messages) == [("user", "hi"), ("assistant", "streamed reply")]
    run = stream.run
    assert run.output == "streamed reply"
    assert len(c.messages) == 2  # folded once
    assert chat_row(isolated_state, c.id) is not None


def test_chat6_stream_run_property_folds_without_iterating():
    @agent(model=FakeModel(["r"]))
    def helper(x: str) -> str:
        return x

    c = chat(helper)
    stream = c.stream("q")
    stream.close()
    assert stream.run.status == "completed"
    assert texts(c.messages) == [("user", "q"), ("assistant", "r")]


def test_chat6_stream_cancel_delegates_to_run_stream():
    import threading

    gate = threading.Event()

    def slow(request):
        assert gate.wait(10)
        return "never"

    @agent(model=FakeModel([slow]))
    def helper(x: str) -> str:
        return x

    c = chat(helper)
    stream = c.stream("q")
    try:
        for event in stream:
            if event.kind == "span_started" and event.data == {"kind": "llm"}:
                stream.cancel()
                gate.set()
    finally:
        gate.set()
    run = stream.run
    assert run.status == "cancelled"
    assert c.messages == [] and c.pending is None
    assert _engine.get_store().get_run(run.id)["status"] == "cancelled"


def test_chat7_load_chat_restores_and_continues(isolated_state):
    model = FakeModel(["a1", "a2"])

    @agent(model=model)
    def helper(x: str) -> str:
        return x

    c = chat(helper, system="Custom", model="fake/none")
    c.model = model  # a string model is what gets stored; run against the fake
    c.send("q1")
    created = chat_row(isolated_state, c.id)["created_at"]
    loaded = load_chat(c.id)
    assert loaded.id == c.id and loaded.messages == c.messages
    assert loaded.system == "Custom" and loaded.created_at == created
    assert loaded._approver is None and loaded._interceptor is None
    loaded.model = model
    loaded.send("q2")
    assert texts(model.requests[1].messages)[:2] == [("user", "q1"), ("assistant", "a1")]
    assert model.requests[1].system == "Custom"


def test_chat7_stored_model_is_the_string_override(isolated_state):
    from composeai.models import registry

    fake = FakeModel(["hi"])
    registry.register_provider("chatfake", lambda model_id: fake)

    @agent(model="chatfake/base")
    def helper(x: str) -> str:
        return x

    c = chat(helper, model="chatfake/override")
    c.send("q")
    assert chat_row(isolated_state, c.id)["model"] == "chatfake/override"
    assert load_chat(c.id).model == "chatfake/override"


def test_chat7_load_chat_errors():
    with pytest.raises(ConfigError) as info:
        load_chat("01NOPE")
    assert str(info.value) == "no chat found with chat_id '01NOPE'"

    @agent(model=FakeModel(["x"]), name="vanishing")
    def helper(x: str) -> str:
        return x

    c = chat(helper)
    c.send("q")
    reset_registries()
    with pytest.raises(ConfigError) as info:
        load_chat(c.id)
    assert str(info.value) == (
        f"chat '{c.id}' belongs to agent 'vanishing', which is not registered in this process "
        "-- import the module that defines it first"
    )


def test_chat8_live_denial_message_reaches_the_model_resumed_false_is_denied_by_user():
    @tool(requires_approval=True)
    def risky() -> str:
        """Risky."""
        return "ran"

    live_model = FakeModel([calls(("risky", {}, "c1")), "ok"])

    @agent(model=live_model, tools=[risky], name="live")
    def live(x: str) -> str:
        return x

    c = chat(live, approver=lambda i: ApprovalReply(allow=False, message="not today"))
    c.send("go")
    result = live_model.requests[1].messages[-1].parts[0]
    assert result.is_error and result.content == "not today"

    later_model = FakeModel([calls(("risky", {}, "c2")), "ok"])

    @agent(model=later_model, tools=[risky], name="later")
    def later(x: str) -> str:
        return x

    c2 = chat(later)
    assert c2.send("go").status == "paused"
    c2.resume({"risky": False})
    result = later_model.requests[1].messages[-1].parts[0]
    assert result.is_error and result.content == "denied by user"


def test_chat_exports():
    assert compose.Chat is Chat and compose.chat is chat and compose.load_chat is load_chat


# --------------------------------------------------------------------------- cross-process

CHAT_MODULE = textwrap.dedent(
    """
    from composeai import agent
    from composeai.testing import FakeModel

    def reply(request):
        return "seen %d messages" % len(request.messages)

    @agent(model=FakeModel([reply] * 10))
    def companion(x: str) -> str:
        \"\"\"A companion.\"\"\"
        return x
    """
)


def test_chat7_chat_started_in_one_process_continues_in_another(tmp_path):
    box = Sandbox(tmp_path)
    box.write_module("chatmod", CHAT_MODULE)
    first = box.run(
        """
        import chatmod
        from composeai import chat
        c = chat(chatmod.companion, system="Be kind.")
        run = c.send("hello")
        emit(chat_id=c.id, output=run.output)
        """
    ).ok()
    assert first["output"] == "seen 1 messages"
    second = box.run(
        f"""
        import chatmod
        from composeai import load_chat
        c = load_chat({first["chat_id"]!r})
        run = c.send("again")
        emit(output=run.output, roles=[m.role for m in c.messages],
             texts=[m.text for m in c.messages])
        """
    ).ok()
    assert second["output"] == "seen 3 messages"
    assert second["roles"] == ["user", "assistant", "user", "assistant"]
    assert second["texts"][:3] == ["hello", "seen 1 messages", "again"]
    third = box.run(
        f"""
        from composeai import load_chat
        try:
            load_chat({first["chat_id"]!r})
        except Exception as exc:
            emit(error=str(exc))
        """
    ).ok()
    assert "belongs to agent 'companion', which is not registered" in third["error"]


@pytest.mark.sqlite_file
def test_chat7_chat_saved_by_0_11_0_is_migrated_and_continues(isolated_state):
    import json
    import sqlite3
    from contextlib import closing

    from test_store import LEGACY_SCHEMA

    def message(role: str, text: str) -> dict:
        value = {"role": role, "parts": [{"type": "text", "text": text}]}
        return {"$kind": "pydantic", "$type": "composeai.messages:Message", "value": value}

    history = [message("user", "old question"), message("assistant", "old answer")]
    isolated_state.mkdir(parents=True)
    with closing(sqlite3.connect(isolated_state / "runs.db")) as db:
        db.executescript(LEGACY_SCHEMA)
        db.execute(
            "INSERT INTO chats VALUES ('01LEGACYCHAT00000000000000', 'old_agent', 'Legacy.', "
            "'fake/legacy', ?, 1700000000.0, 1700000001.0)",
            (json.dumps(history),),
        )
        db.commit()
    model = FakeModel(["new answer"])

    @agent(model=model, name="old_agent")
    def old_agent(x: str) -> str:
        return x

    c = load_chat("01LEGACYCHAT00000000000000")
    assert texts(c.messages) == [("user", "old question"), ("assistant", "old answer")]
    assert c.system == "Legacy." and c.model == "fake/legacy"
    assert c.created_at == 1700000000.0
    c.model = model  # the stored model string names no provider here
    c.send("new question")
    assert texts(model.requests[0].messages) == [
        ("user", "old question"),
        ("assistant", "old answer"),
        ("user", "new question"),
    ]
    assert chat_row(isolated_state, c.id)["created_at"] == 1700000000.0
