"""`compose answer RUN_ID INTERRUPT_ID [--json VALUE | --yes | --no] [--resume]` and
`compose answer RUN_ID --list` (issue 26), on both stores: the answer is journaled
first-write-wins exactly like `resume(answers=...)` (FLOW-43), the parked run becomes due
for `compose worker` (EXT-2), and a refused answer stores nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import composeai as compose
from composeai import _answer, _core, _engine, approve, ask_human, flow, task
from composeai.cli import main
from composeai.errors import ComposeError, SerializationError
from composeai.testing import FakeModel

pytestmark = pytest.mark.parametrize("store_kind", ["sqlite", "postgresql"], indirect=True)

EFFECTS: list[str] = []


def _define():
    EFFECTS.clear()

    @task
    def draft(topic: str) -> str:
        EFFECTS.append(topic)
        return f"draft about {topic}"

    @flow
    def publish(topic: str) -> str:
        text = draft(topic)
        if approve("publish", payload={"draft": text}):
            return "published: " + text
        return "rejected"

    @flow
    def interview() -> str:
        return "name=" + str(ask_human("name", "What is your name?"))

    return publish, interview


def _journal_answer(run_id: str, interrupt_id: str):
    for key, value in _engine.get_store().journal(run_id):
        if key == f"__interrupt__:{interrupt_id}":
            return json.loads(value)
    return None


def test_answer_journals_and_the_worker_continues_the_run_issue26(capsys):
    """FLOW-43/EXT-2: `compose answer --yes` journals the answer without running the
    flow; the run is listed as due and `wake_due` (the worker's pass) completes it."""
    publish, _ = _define()
    run = publish.run("cats")
    assert run.status == "paused"
    capsys.readouterr()

    assert main(["answer", run.id, "publish", "--yes"]) == 0
    out = capsys.readouterr().out
    assert f"answered interrupt 'publish' of run {run.id}: true" in out
    assert "compose worker" in out
    assert _journal_answer(run.id, "publish") is True
    assert _engine.get_store().pending(run.id) == []
    # Not executed here: the row is still paused, and no task ran again.
    assert _engine.get_store().get_run(run.id)["status"] == "paused"
    assert EFFECTS == ["cats"]

    assert main(["runs"]) == 0
    assert "answered, due" in capsys.readouterr().out
    assert main(["trace", run.id]) == 0
    assert "is answered and due: `compose worker` continues it" in capsys.readouterr().out

    done = compose.wake_due()
    assert [(r.id, r.status, r.output) for r in done] == [
        (run.id, "completed", "published: draft about cats")
    ]
    assert EFFECTS == ["cats"]  # the task was replayed, not re-run
    assert compose.wake_due() == []


def test_second_answer_is_refused_first_write_wins_issue26(capsys):
    """FLOW-43: a later different answer is ignored; the CLI says so and exits 1."""
    publish, _ = _define()
    run = publish.run("dogs")
    assert main(["answer", run.id, "publish", "--no"]) == 0
    capsys.readouterr()
    assert main(["answer", run.id, "publish", "--yes"]) == 1
    err = capsys.readouterr().err
    assert "already answered (first write wins)" in err
    assert "the stored answer is false" in err
    assert _journal_answer(run.id, "publish") is False
    [done] = compose.wake_due()
    assert (done.status, done.output) == ("completed", "rejected")
    # Also refused once the run completed.
    assert main(["answer", run.id, "publish", "--yes"]) == 1
    assert "already answered" in capsys.readouterr().err


def test_json_answer_and_list_issue26(capsys):
    """`--list` shows the pending interrupts; `--json` answers an ask_human question."""
    _, interview = _define()
    run = interview.run()
    assert run.status == "paused"
    capsys.readouterr()
    assert main(["answer", run.id, "--list"]) == 0
    out = capsys.readouterr().out
    assert 'name  kind=question  question="What is your name?"' in out
    assert main(["answer", run.id, "--list", "--json-list"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed == [
        {"id": "name", "kind": "question", "question": "What is your name?", "payload": None}
    ]
    assert main(["answer", run.id[:20], "name", "--json", '{"first": "Ada"}']) == 0
    [done] = compose.wake_due()
    assert done.output == "name={'first': 'Ada'}"


def test_resume_flag_continues_in_this_process_issue26(capsys):
    """`--resume` continues the run here through `resume()`."""
    publish, _ = _define()
    run = publish.run("owls")
    assert main(["answer", run.id, "publish", "--yes", "--resume"]) == 0
    out = capsys.readouterr().out
    assert f"run {run.id} continued here: completed" in out
    row = _engine.get_store().get_run(run.id)
    assert row["status"] == "completed"
    assert json.loads(row["output_json"]) == "published: draft about owls"
    assert compose.wake_due() == []


def _nothing_stored(run_id: str) -> None:
    assert [p[0] for p in _engine.get_store().pending(run_id)] == ["publish"]
    assert _journal_answer(run_id, "publish") is None
    assert compose.wake_due() == []


def test_refusals_name_the_problem_and_store_nothing_issue26(capsys):
    """Unknown run, unknown interrupt, invalid JSON, unencodable value: a clear error
    naming it, exit 1, nothing stored."""
    publish, _ = _define()
    run = publish.run("bats")
    capsys.readouterr()
    assert main(["answer", "01NOSUCHRUN0000000000000000", "publish", "--yes"]) == 1
    assert "no run found with id '01NOSUCHRUN0000000000000000'" in capsys.readouterr().err
    assert main(["answer", run.id, "publsh", "--yes"]) == 1
    assert (
        f"run '{run.id}' has no pending interrupt 'publsh' -- pending: 'publish'"
        in capsys.readouterr().err
    )
    assert main(["answer", run.id, "publish", "--json", "{nope"]) == 1
    assert "--json value is not valid JSON" in capsys.readouterr().err
    with pytest.raises(SerializationError, match="answer 'publish'"):
        _answer.answer(run.id, "publish", object())
    with pytest.raises(SystemExit):
        main(["answer", run.id, "publish"])
    _nothing_stored(run.id)


def test_answer_through_a_worker_in_another_process_issue26(tmp_path, monkeypatch):
    """EXT-2: the answered run is continued by `compose worker --once` in another process."""
    (tmp_path / "answer_flows.py").write_text(
        "from composeai import approve, flow\n\n\n"
        "@flow\n"
        "def gate(x: int) -> int:\n"
        "    return x * 2 if approve('go') else -1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import answer_flows

    run = answer_flows.gate.run(21)
    assert run.status == "paused"
    done = _answer.answer(run.id, "go", True)
    assert done.due
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-m", "composeai.cli", "worker", "--once", "--import", "answer_flows"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "outcome=completed" in out.stdout
    # The worker logs why it continues the run: the answer, not a timer.
    assert f"started  {run.id} flow=gate reason=answered" in out.stdout, out.stdout
    row = _engine.get_store().get_run(run.id)
    assert (row["status"], json.loads(row["output_json"])) == ("completed", 42)
    sys.modules.pop("answer_flows", None)


def test_a_tool_shorthand_and_ambiguity_follow_resume_issue26():
    """FLOW-43's tool shorthand: a key resolves to the one pending `tool:<key>:` id."""
    assert _answer._full_id("r", "send", ["tool:send:c1"]) == "tool:send:c1"
    assert _answer._full_id("r", "publish", ["publish"]) == "publish"
    assert _answer._full_id("r", "other", ["publish"]) is None
    with pytest.raises(ComposeError, match="ambiguous"):
        _answer._full_id("r", "send", ["tool:send:c1", "tool:send:c2"])


def test_agent_gated_tool_by_shorthand_with_resume_issue26(capsys):
    """A standalone agent's approval-gated tool call is answered by the tool's name (the
    shorthand `resume()` accepts); `--resume` continues the agent here and the tool runs."""
    sent: list[str] = []

    @compose.tool(requires_approval=True)
    def send_email(to: str) -> str:
        """Send an email."""
        sent.append(to)
        return f"sent to {to}"

    call = {"tool_calls": [{"name": "send_email", "arguments": {"to": "bob"}, "id": "c1"}]}

    @compose.agent(model=FakeModel([call, "Email sent."]), tools=[send_email])
    def mailer(request: str) -> str:
        """You send emails."""
        return request

    run = mailer.run("email bob")
    assert (run.status, run.pending.id) == ("paused", "tool:send_email:c1")
    capsys.readouterr()
    assert main(["answer", run.id, "send_email", "--yes", "--resume"]) == 0
    out = capsys.readouterr().out
    assert f"answered interrupt 'tool:send_email:c1' of run {run.id}: true" in out
    assert f"run {run.id} continued here: completed" in out
    assert sent == ["bob"]
    assert main(["answer", run.id, "send_email", "--no"]) == 1
    assert "already answered" in capsys.readouterr().err


def test_answered_agent_is_continued_by_the_worker_pass_issue26(capsys):
    """EXT-2/AGENT-54: answering a standalone agent's gated tool call without `--resume`
    only journals the answer; the run is due, and the worker's pass (`wake_due`) continues
    it through `resume()`: the tool runs once, with the journaled approval."""
    sent: list[str] = []

    @compose.tool(requires_approval=True)
    def notify(to: str) -> str:
        """Notify someone."""
        sent.append(to)
        return f"notified {to}"

    call = {"tool_calls": [{"name": "notify", "arguments": {"to": "ann"}, "id": "c1"}]}

    @compose.agent(model=FakeModel([call, "Done."]), tools=[notify])
    def notifier(request: str) -> str:
        """You notify people."""
        return request

    run = notifier.run("notify ann")
    assert (run.status, run.pending.id) == ("paused", "tool:notify:c1")
    capsys.readouterr()
    assert main(["answer", run.id, "notify", "--yes"]) == 0
    assert "the run is due" in capsys.readouterr().out
    assert _engine.get_store().get_run(run.id)["status"] == "paused"
    assert sent == []
    assert main(["runs"]) == 0
    assert "answered, due" in capsys.readouterr().out

    [done] = compose.wake_due()
    assert (done.id, done.status) == (run.id, "completed")
    assert sent == ["ann"]
    assert compose.wake_due() == []


AGENT_MODULE = '''from composeai import agent, tool
from composeai.testing import FakeModel

CALL = {"tool_calls": [{"name": "page", "arguments": {"who": "ops"}, "id": "c1"}]}


@tool(requires_approval=True)
def page(who: str) -> str:
    """Page someone."""
    return f"paged {who}"


def reply(request):
    # The first request holds only the user's message.
    return CALL if len(request.messages) == 1 else "Paged."


@agent(model=FakeModel([reply, reply]), tools=[page])
def pager(request: str) -> str:
    """You page people."""
    return request
'''


def test_worker_skips_an_unregistered_agent_then_continues_it_issue26(tmp_path, monkeypatch):
    """EXT-2: a due agent run whose agent is not imported in the worker is skipped with a
    warning (never failed); `compose worker --once --import MODULE` then completes it."""
    (tmp_path / "answer_agents.py").write_text(AGENT_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import answer_agents

    run = answer_agents.pager.run("page ops")
    assert run.status == "paused"
    assert _answer.answer(run.id, "page", True).due
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    worker = [sys.executable, "-m", "composeai.cli", "worker", "--once"]
    bare = subprocess.run(worker, env=env, capture_output=True, text=True, timeout=120, check=True)
    assert f"run {run.id}: agent 'pager' is not registered in this process" in bare.stderr
    assert _engine.get_store().get_run(run.id)["status"] == "paused"

    out = subprocess.run(
        [*worker, "--import", "answer_agents"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert f"finished {run.id} agent=pager outcome=completed" in out.stdout
    row = _engine.get_store().get_run(run.id)
    assert (row["status"], json.loads(row["output_json"])) == ("completed", "Paged.")
    sys.modules.pop("answer_agents", None)


def test_graph_run_is_answered_through_resume_issue26(capsys):
    """A graph node's suspend is answered by `node:<name>`; with `--resume` the run
    continues in this process."""
    from composeai.graph import END, Graph, suspend

    def review(state, ctx):
        if ctx.resume is None:
            return suspend({"question": "Send?"})
        return {"approved": ctx.resume == "yes"}

    wf = Graph()
    wf.add_node("review", review)
    wf.start("review").edge("review", END)
    paused = wf.compile().run({"text": "hi"})
    assert paused.suspended
    capsys.readouterr()
    assert main(["answer", paused.run_id, "node:review", "--json", '"yes"', "--resume"]) == 0
    assert f"run {paused.run_id} continued here: completed" in capsys.readouterr().out
    assert _engine.get_store().get_run(paused.run_id)["status"] == "completed"


def _graph_answers(run_id: str) -> dict:
    prefix = "__interrupt__:node:"
    return {
        k: json.loads(v) for k, v in _engine.get_store().journal(run_id) if k.startswith(prefix)
    }


def test_graph_answer_without_resume_is_continued_by_the_worker_issue26(capsys):
    """Issue 26/EXT-2: `compose answer` journals a graph node's answer without running
    anything; the worker's pass (`wake_due`) completes the run, the node seeing the answer
    as `ctx.resume`; a second answer to that suspension is refused and stores nothing."""
    from composeai.graph import END, Graph, suspend

    seen: list = []

    def review(state, ctx):
        seen.append(ctx.resume)
        if ctx.resume is None:
            return suspend({"question": "Send?"})
        return {"approved": ctx.resume == "yes"}

    wf = Graph()
    wf.add_node("review", review)
    wf.start("review").edge("review", END)
    paused = wf.compile().run({"text": "hi"})
    assert paused.suspended
    capsys.readouterr()

    assert main(["answer", paused.run_id, "node:review", "--json", '"yes"']) == 0
    assert "compose worker" in capsys.readouterr().out
    store = _engine.get_store()
    assert store.get_run(paused.run_id)["status"] == "paused"
    assert store.pending(paused.run_id) == []
    assert seen == [None]

    assert main(["answer", paused.run_id, "node:review", "--json", '"no"']) == 1
    assert "already answered" in capsys.readouterr().err
    assert list(_graph_answers(paused.run_id).values()) == ["yes"]

    done = compose.wake_due()
    assert [(r.id, r.status, r.output["approved"]) for r in done] == [
        (paused.run_id, "completed", True)
    ]
    assert seen == [None, "yes"]
    assert store.get_run(paused.run_id)["status"] == "completed"
    assert compose.wake_due() == []


def test_graph_node_suspending_twice_is_answered_twice_issue26():
    """Issue 26: a node's interrupt id repeats each time it suspends; each answer given
    from outside reaches only the suspension it was given for."""
    from composeai.graph import END, Graph, suspend

    def review(state, ctx):
        if ctx.resume is None:
            return suspend({"round": len(state.get("answers", []))})
        return {"answers": [*state.get("answers", []), ctx.resume]}

    wf = Graph()
    wf.add_node("review", review)
    wf.start("review").route(
        "review",
        lambda s: "again" if len(s["answers"]) < 2 else "done",
        {"again": "review", "done": END},
    )
    run_id = wf.compile().run({}).run_id
    store = _engine.get_store()

    first = _answer.answer(run_id, "node:review", "one")
    assert first.due
    [again] = compose.wake_due()
    assert (again.id, again.status) == (run_id, "paused")
    assert [p[0] for p in store.pending(run_id)] == ["node:review"]

    # The new suspension is a fresh interrupt: answerable, and not answered by "one".
    second = _answer.answer(run_id, "node:review", "two")
    assert second.due
    with pytest.raises(_answer.AlreadyAnswered):
        _answer.answer(run_id, "node:review", "three")
    [done] = compose.wake_due()
    assert (done.status, done.output["answers"]) == ("completed", ["one", "two"])
    assert sorted(_graph_answers(run_id).values()) == ["one", "two"]


def test_graph_with_two_suspended_nodes_is_due_once_both_are_answered_issue26():
    """Issue 26: a graph paused on two parallel nodes takes their answers together; one
    answer is stored and the run stays paused, the second makes it due."""
    from composeai.graph import END, Graph, suspend

    def asker(key):
        def node(state, ctx):
            if ctx.resume is None:
                return suspend({"ask": key})
            return {key: ctx.resume}

        return node

    wf = Graph()
    wf.add_node("begin", lambda state: {})
    wf.add_node("a", asker("a"))
    wf.add_node("b", asker("b"))
    wf.add_node("after", lambda state: {})
    wf.start("begin").edge("begin", "a").edge("begin", "b").join(["a", "b"], "after")
    wf.edge("after", END)
    run_id = wf.compile().run({}).run_id
    store = _engine.get_store()
    assert sorted(p[0] for p in store.pending(run_id)) == ["node:a", "node:b"]

    assert not _answer.answer(run_id, "node:a", 1).due
    assert compose.wake_due() == []
    assert store.get_run(run_id)["status"] == "paused"
    assert [p[0] for p in store.pending(run_id)] == ["node:b"]

    assert _answer.answer(run_id, "node:b", 2).due
    [done] = compose.wake_due()
    assert (done.status, done.output["a"], done.output["b"]) == ("completed", 1, 2)


GRAPH_MODULE = """
import os

from composeai.graph import END, Graph, suspend


def review(state, ctx):
    if ctx.resume is None:
        return suspend({"question": "Send?"})
    # What the node saw, for the test in the parent process.
    with open(os.environ["ANSWER_SEEN"], "a") as seen:
        seen.write(ctx.resume)
    return {"sent": ctx.resume}


wf = Graph(name="answer_review")
wf.add_node("review", review)
wf.start("review").edge("review", END)
review_graph = wf.compile()
"""


def test_worker_skips_an_uncompiled_graph_then_continues_it_issue26(tmp_path, monkeypatch):
    """EXT-2: a graph run made due by `compose answer` is skipped with a warning naming
    `--import` by a worker that has not compiled the graph (never failed);
    `compose worker --once --import MODULE` then completes it."""
    (tmp_path / "answer_graphs.py").write_text(GRAPH_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import answer_graphs

    paused = answer_graphs.review_graph.run({})
    assert paused.suspended
    assert _answer.answer(paused.run_id, "node:review", "ok").due
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    env["ANSWER_SEEN"] = str(tmp_path / "seen.txt")
    worker = [sys.executable, "-m", "composeai.cli", "worker", "--once"]
    bare = subprocess.run(worker, env=env, capture_output=True, text=True, timeout=120, check=True)
    assert f"run {paused.run_id}: graph 'answer_review' is not compiled" in bare.stderr
    assert "--import" in bare.stderr
    assert _engine.get_store().get_run(paused.run_id)["status"] == "paused"

    out = subprocess.run(
        [*worker, "--import", "answer_graphs"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert f"finished {paused.run_id} graph=answer_review outcome=completed" in out.stdout
    assert _engine.get_store().get_run(paused.run_id)["status"] == "completed"
    assert (tmp_path / "seen.txt").read_text() == "ok"
    sys.modules.pop("answer_graphs", None)


THREAD_MODULE = """
from composeai.graph import END, Graph, suspend


def review(state, ctx):
    if ctx.resume is None:
        return suspend({"question": "Send " + state["text"] + "?"})
    return {"verdict": ctx.resume}


def send(state):
    return {"sent": state["verdict"] == "yes"}


wf = Graph(name="answer_thread_review")
wf.add_node("review", review)
wf.add_node("send", send)
wf.start("review").edge("review", "send").edge("send", END)
review_graph = wf.compile(audit=True)
"""


def _history_shape(thread) -> list:
    """A thread's checkpoint history without ids and times."""
    return [(e["version"], e["source"], e["status"], e["step"]) for e in thread.history(50)]


def test_thread_bound_graph_run_answered_without_resume_is_continued_by_a_worker_issue26(
    tmp_path, monkeypatch, capsys
):
    """Issue 26: a graph run kept in a thread is answered like any other graph run: the
    answer is journaled first-write-wins (a second one is refused), the run becomes due, and
    `compose worker --once` in another process continues it through the thread's ordinary
    resume, so the thread's state and checkpoint history are what `thread.resume()` makes."""
    (tmp_path / "answer_thread_graphs.py").write_text(THREAD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import answer_thread_graphs

    graph = answer_thread_graphs.review_graph
    answered, resumed = graph.thread("t-answered"), graph.thread("t-resumed")
    paused = answered.run({"text": "hi"})
    assert paused.suspended and resumed.run({"text": "hi"}).suspended
    head = answered.history(1)[0]["id"]
    assert _answer.graph_head(paused.run_id) == head
    capsys.readouterr()

    assert main(["answer", paused.run_id, "node:review", "--json", '"yes"']) == 0
    assert "the run is due: a running `compose worker`" in capsys.readouterr().out
    store = _engine.get_store()
    assert store.pending(paused.run_id) == []
    assert _graph_answers(paused.run_id) == {f"__interrupt__:node:review@{head}": "yes"}
    assert main(["answer", paused.run_id, "node:review", "--json", '"no"']) == 1
    assert "already answered" in capsys.readouterr().err
    assert _graph_answers(paused.run_id) == {f"__interrupt__:node:review@{head}": "yes"}
    assert store.get_run(paused.run_id)["status"] == "paused"

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "composeai.cli",
            "worker",
            "--once",
            "--import",
            "answer_thread_graphs",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert f"finished {paused.run_id} graph=answer_thread_review outcome=completed" in out.stdout, (
        out.stdout + out.stderr
    )
    assert store.get_run(paused.run_id)["status"] == "completed"

    # The same answer given through the thread's resume in this process, for comparison.
    assert not resumed.resume({"review": "yes"}).suspended
    assert answered.state() == resumed.state() == {"text": "hi", "verdict": "yes", "sent": True}
    assert _history_shape(answered) == _history_shape(resumed)
    # The checkpoints after the answer go on from the suspension, in the thread, for the
    # run that was answered.
    history = answered.history(50)
    after = history[: [e["id"] for e in history].index(head)]
    assert after and after[-1]["parent_id"] == head
    assert all(e["run_id"] == paused.run_id for e in history)
    assert [e["action"] for e in answered.audit()] == [e["action"] for e in resumed.audit()]
    assert answered.interrupts() == []
    sys.modules.pop("answer_thread_graphs", None)


def test_thread_bound_graph_run_with_resume_flag_continues_here_issue26(capsys):
    """Issue 26: `--resume` continues a graph run kept in a thread in this process,
    through the thread's resume."""
    from composeai.graph import END, Graph, suspend

    def review(state, ctx):
        if ctx.resume is None:
            return suspend({"question": "Send?"})
        return {"verdict": ctx.resume}

    wf = Graph(name="thread_review")
    wf.add_node("review", review)
    wf.start("review").edge("review", END)
    thread = wf.compile().thread("t-answer")
    paused = thread.run({})
    assert paused.suspended
    capsys.readouterr()
    assert main(["answer", paused.run_id, "node:review", "--json", '"yes"', "--resume"]) == 0
    assert f"run {paused.run_id} continued here: completed" in capsys.readouterr().out
    assert thread.state() == {"verdict": "yes"}


def _twice_review_graph(gate=None):
    """A graph whose node asks twice; `gate(answer)` runs when the node is resumed."""
    from composeai.graph import END, Graph, suspend

    def review(state, ctx):
        if ctx.resume is None:
            return suspend({"round": len(state.get("answers", []))})
        if gate is not None:
            gate(ctx.resume)
        return {"answers": [*state.get("answers", []), ctx.resume]}

    wf = Graph()
    wf.add_node("review", review)
    wf.start("review").route(
        "review",
        lambda s: "again" if len(s["answers"]) < 2 else "done",
        {"again": "review", "done": END},
    )
    return wf.compile()


def test_graph_answer_racing_a_resume_is_refused_not_keyed_to_a_gone_suspension_issue26(
    monkeypatch,
):
    """Issue 26: the checkpoint a graph answer is keyed by is read in the transaction that
    journals it. A resume that moves the run on between what the answer was given for (the
    pending interrupts it read) and the answer itself makes the answer refused, naming the
    run and the interrupt, with nothing stored: it is neither keyed to the gone suspension
    (which would strand the run) nor handed to the node's next question, which may ask
    something else."""
    run_id = _twice_review_graph().run({}).run_id
    store = _engine.get_store()
    seen = _answer.graph_head(run_id)
    listed = _answer.pending

    def listing_then_a_resume_elsewhere(rid):
        rows = listed(rid)
        assert compose.resume(run_id, answers={"node:review": "one"}).status == "paused"
        return rows

    monkeypatch.setattr(_answer, "pending", listing_then_a_resume_elsewhere)
    with pytest.raises(_answer.Superseded) as refused:
        _answer.answer(run_id, "node:review", "two")
    monkeypatch.setattr(_answer, "pending", listed)
    head = _answer.graph_head(run_id)
    assert head != seen
    assert (refused.value.run_id, refused.value.interrupt_id) == (run_id, "node:review")
    assert (refused.value.seen, refused.value.head) == (seen, head)
    message = str(refused.value)
    assert f"interrupt 'node:review' of run '{run_id}'" in message
    assert f"paused at checkpoint {head} now" in message and "nothing was stored" in message
    # Only the resume's own answer, journaled for the suspension it answered.
    resumed = {f"__interrupt__:node:review@{seen}": "one"}
    assert _graph_answers(run_id) == resumed
    assert [p[0] for p in store.pending(run_id)] == ["node:review"]
    assert compose.wake_due() == []

    # Given for the suspension a caller saw (`at`), the same holds without any race.
    with pytest.raises(_answer.Superseded):
        _answer.answer(run_id, "node:review", "two", at=seen)
    assert _graph_answers(run_id) == resumed

    assert _answer.answer(run_id, "node:review", "two", at=head).due
    [done] = compose.wake_due()
    assert (done.status, done.output["answers"]) == ("completed", ["one", "two"])


def test_graph_answer_while_a_resume_holds_the_run_is_refused_issue26():
    """Issue 26: while an attempt is continuing a graph run (it holds the run's lease, the
    node resumed but no new checkpoint yet), an answer reaching the store transaction is
    refused and stores nothing: the suspension it was given for is being answered already."""
    import threading

    entered, release = threading.Event(), threading.Event()

    def gate(answer):
        if answer == "one":
            entered.set()
            assert release.wait(60)

    run_id = _twice_review_graph(gate).run({}).run_id
    store = _engine.get_store()
    seen = _answer.graph_head(run_id)
    outcome: list = []
    resumer = threading.Thread(
        target=lambda: outcome.append(compose.resume(run_id, answers={"node:review": "one"}))
    )
    resumer.start()
    try:
        assert entered.wait(60)
        found = _core.answer_interrupts(store, run_id, [("node:review", '"two"')], seen)
        assert found == ("superseded", None)
        # Only the resume's own answer, journaled for the suspension it answers.
        assert _graph_answers(run_id) == {f"__interrupt__:node:review@{seen}": "one"}
    finally:
        release.set()
        resumer.join(60)
    assert outcome[0].status == "paused"
    assert [p[0] for p in store.pending(run_id)] == ["node:review"]
    assert _answer.graph_head(run_id) != seen


# ---------------------------------------------------------------------------
# A graph resume honours answers journaled from outside (FLOW-43 first write wins)


def _asking_graph(seen: list, gate=None):
    """A graph whose node asks once and records every `ctx.resume` it sees;
    `gate(answer)` runs when the node is resumed."""
    from composeai.graph import END, Graph, suspend

    def review(state, ctx):
        seen.append(ctx.resume)
        if ctx.resume is None:
            return suspend({"question": "Send?"})
        if gate is not None:
            gate(ctx.resume)
        return {"verdict": ctx.resume}

    wf = Graph(name="outside_review")
    wf.add_node("review", review)
    wf.start("review").edge("review", END)
    return wf.compile()


def _two_asker_graph():
    from composeai.graph import END, Graph, suspend

    def asker(key):
        def node(state, ctx):
            if ctx.resume is None:
                return suspend({"ask": key})
            return {key: ctx.resume}

        return node

    wf = Graph(name="outside_two")
    wf.add_node("begin", lambda state: {})
    wf.add_node("a", asker("a"))
    wf.add_node("b", asker("b"))
    wf.add_node("after", lambda state: {})
    wf.start("begin").edge("begin", "a").edge("begin", "b").join(["a", "b"], "after")
    wf.edge("after", END)
    return wf.compile()


def test_graph_outside_answer_wins_over_a_resume_with_another_value_flow43_issue26():
    """FLOW-43/issue 26: a graph suspension answered from outside (`compose answer`) and
    then resumed from Python with a different value goes on with the outside answer, first
    write wins: `compose.resume()`, a thread's `resume()` and `CompiledGraph.resume()` of the
    snapshot alike; the node sees the stored value as `ctx.resume` and it stays the only
    answer journaled for that suspension."""
    seen: list = []
    graph = _asking_graph(seen)

    run_id = graph.run({}).run_id
    head = _answer.graph_head(run_id)
    assert _answer.answer(run_id, "node:review", "yes").due
    done = compose.resume(run_id, answers={"node:review": "no"})
    assert (done.status, done.output["verdict"]) == ("completed", "yes")
    assert seen == [None, "yes"]
    assert _graph_answers(run_id) == {f"__interrupt__:node:review@{head}": "yes"}
    assert compose.wake_due() == []

    seen.clear()
    thread = graph.thread("t-outside")
    paused = thread.run({})
    head = _answer.graph_head(paused.run_id)
    assert _answer.answer(paused.run_id, "node:review", "yes").due
    assert thread.resume({"review": "no"}).state == {"verdict": "yes"}
    assert seen == [None, "yes"]
    assert _graph_answers(paused.run_id) == {f"__interrupt__:node:review@{head}": "yes"}

    seen.clear()
    paused = graph.run({})
    assert _answer.answer(paused.run_id, "node:review", "yes").due
    assert graph.resume(paused.snapshot, {"review": "no"}).state == {"verdict": "yes"}
    assert seen == [None, "yes"]
    assert _engine.get_store().get_run(paused.run_id)["status"] == "completed"


def test_graph_outside_answer_then_resume_without_answers_continues_with_it_issue26():
    """Issue 26: a resume given no answers (or only some) takes the ones journaled from
    outside for the suspension, as the worker would: `compose.resume(run_id)`, its async
    twin, a thread run by `compose.resume()` or `thread.resume({})` (sync and async), a
    snapshot resume, and a run paused on two nodes answered one from outside and one by
    `resume(answers=...)`."""
    import asyncio

    seen: list = []
    graph = _asking_graph(seen)
    for cont in (
        lambda run_id: compose.resume(run_id),
        lambda run_id: asyncio.run(compose.aresume(run_id)),
    ):
        run_id = graph.run({}).run_id
        _answer.answer(run_id, "node:review", "ok")
        done = cont(run_id)
        assert (done.status, done.output["verdict"]) == ("completed", "ok")

    for n, cont in enumerate(
        (
            lambda thread, run_id: compose.resume(run_id),
            lambda thread, run_id: thread.resume({}),
            lambda thread, run_id: asyncio.run(thread.aresume({})),
        )
    ):
        thread = graph.thread(f"t-bare-{n}")
        run_id = thread.run({}).run_id
        _answer.answer(run_id, "node:review", "ok")
        cont(thread, run_id)
        assert thread.state() == {"verdict": "ok"}
        assert thread.interrupts() == []

    paused = graph.run({})
    _answer.answer(paused.run_id, "node:review", "ok")
    assert graph.resume(paused.snapshot, {}).state == {"verdict": "ok"}
    assert compose.wake_due() == []

    two = _two_asker_graph()
    run_id = two.run({}).run_id
    assert not _answer.answer(run_id, "node:a", 1).due
    done = compose.resume(run_id, answers={"node:b": 2, "node:a": 9})
    assert (done.status, done.output["a"], done.output["b"]) == ("completed", 1, 2)

    # With nothing answered from outside, resume() without answers still refuses a thread
    # and leaves a thread-less run paused, as before.
    from composeai.graph import GraphValidationError

    thread = graph.thread("t-unanswered")
    thread.run({})
    with pytest.raises(GraphValidationError) as refused:
        thread.resume({})
    assert refused.value.code == "resume_invalid"
    run_id = graph.run({}).run_id
    assert compose.resume(run_id).status == "paused"


def test_late_outside_answer_after_a_graph_resume_is_refused_as_already_answered_issue26(
    capsys,
):
    """FLOW-43/issue 26: `resume(answers=...)` of a graph run journals its answer for the
    suspension it resumes; a `compose answer` for that suspension arriving later (while the
    resumed node runs, or once the run completed, given the checkpoint it saw) is refused as
    already answered, naming the stored answer, and stores nothing."""
    import threading

    entered, release = threading.Event(), threading.Event()

    def gate(answer):
        entered.set()
        assert release.wait(60)

    seen: list = []
    run_id = _asking_graph(seen, gate).run({}).run_id
    head = _answer.graph_head(run_id)
    outcome: list = []
    resumer = threading.Thread(
        target=lambda: outcome.append(compose.resume(run_id, answers={"node:review": "one"}))
    )
    resumer.start()
    try:
        assert entered.wait(60)
        with pytest.raises(_answer.AlreadyAnswered) as refused:
            _answer.answer(run_id, "node:review", "two")
        assert refused.value.stored == "one"
        capsys.readouterr()
        assert main(["answer", run_id, "node:review", "--json", '"two"']) == 1
        err = capsys.readouterr().err
        assert "already answered (first write wins)" in err and 'stored answer is "one"' in err
    finally:
        release.set()
        resumer.join(60)
    assert (outcome[0].status, outcome[0].output["verdict"]) == ("completed", "one")
    with pytest.raises(_answer.AlreadyAnswered):
        _answer.answer(run_id, "node:review", "two", at=head)
    assert _graph_answers(run_id) == {f"__interrupt__:node:review@{head}": "one"}
    assert seen == [None, "one"]


def test_outside_answer_committed_between_a_resumes_read_and_its_claim_wins_issue26(
    monkeypatch,
):
    """Issue 26: an outside answer that commits after a graph resume read the run's pending
    interrupts but before it claimed the run is the one the node gets: the resume takes
    the journaled answers inside its claim. Deterministic: the answer is given at that exact
    point of `compose.resume()` and of a thread's `resume()`."""
    from composeai.graph import CompiledGraph, GraphThread

    seen: list = []
    graph = _asking_graph(seen)
    run_id = graph.run({}).run_id
    read_pending = CompiledGraph._answer_values

    def read_then_answered_elsewhere(self, rid, answers):
        values = yield from read_pending(self, rid, answers)
        assert values == {"review": "no"}
        assert _answer.answer(rid, "node:review", "yes").due
        return values

    monkeypatch.setattr(CompiledGraph, "_answer_values", read_then_answered_elsewhere)
    done = compose.resume(run_id, answers={"node:review": "no"})
    monkeypatch.setattr(CompiledGraph, "_answer_values", read_pending)
    assert (done.status, done.output["verdict"]) == ("completed", "yes")
    assert seen == [None, "yes"]
    assert compose.wake_due() == []

    seen.clear()
    thread = graph.thread("t-race")
    paused = thread.run({})
    claim = GraphThread._claim

    def answered_elsewhere_then_claim(self, store, mode, new_run_id):
        assert _answer.answer(paused.run_id, "node:review", "yes").due
        return (yield from claim(self, store, mode, new_run_id))

    monkeypatch.setattr(GraphThread, "_claim", answered_elsewhere_then_claim)
    assert thread.resume({"review": "no"}).state == {"verdict": "yes"}
    assert seen == [None, "yes"]
    assert compose.wake_due() == []
