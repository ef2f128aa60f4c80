"""Issue 31: the replay check is exact.

A resumed body that no longer makes a journaled call is stopped before it executes or journals
any call the journal does not hold: at the latest at the first new call, and for `map`, `amap`
and `aggregate` at the call itself when its items or branches differ from the journaled ones.
Then `NondeterminismError`, nothing journaled, and the original code completes the run (FLOW-21).

Equal arguments are the same arguments: dicts built in another insertion order (a dict built from
a set follows `PYTHONHASHSEED`), also nested in lists, and keyword arguments in another order.
"""

from __future__ import annotations

import asyncio
import json
import textwrap

import pytest

import _proc
import composeai as compose
from _replay import STORES, Deploy
from composeai import _engine

pytestmark = pytest.mark.parametrize("store_kind", STORES, indirect=True)


@pytest.fixture
def deploy(tmp_path, monkeypatch):
    d = Deploy(tmp_path, monkeypatch)
    yield d
    d.close()


TASKS = """\
import asyncio

import composeai as compose
from composeai.testing import FakeModel


@compose.task
def fetch(n: int) -> int:
    side_effect("fetch", n)
    return n * 10


@compose.task
async def afetch(n: int) -> int:
    side_effect("afetch", n)
    await asyncio.sleep(0)
    return n * 10


@compose.task
def upper(s: str) -> str:
    side_effect("upper", s)
    return s.upper()


@compose.task
def shout(s: str) -> str:
    side_effect("shout", s)
    return s + "!"


@compose.task
def publish(x: object) -> str:
    side_effect("publish")
    return "published"


@compose.task
async def apublish(x: object) -> str:
    side_effect("apublish")
    return "published"


@compose.flow(name="sub")
def sub(n: int) -> int:
    total = sum(SUB_MAP)
    compose.approve("inner")
    return total


@compose.tool(requires_approval=True)
def send(to: str) -> str:
    \"\"\"Send it.\"\"\"
    side_effect("send", to)
    return f"sent to {to}"


@compose.tool
def lookup(q: str) -> str:
    \"\"\"Look a word up.\"\"\"
    return "found " + upper(q)


def reply(request):
    \"\"\"Looks up, then sends (approval-gated), then answers: by what the agent saw.\"\"\"
    seen = repr(request.messages)
    if "sent to" in seen:
        return "mailed"
    if "found " in seen:
        return {"tool_calls": [{"name": "send", "arguments": {"to": "ann"}, "id": "c1"}]}
    return {"tool_calls": [{"name": "lookup", "arguments": {"q": "w"}, "id": "c0"}]}


MODEL = FakeModel([reply] * 10)


@compose.agent(model=MODEL, tools=[lookup, send], name="mailer")
def mailer(topic: str) -> str:
    return f"mail about {topic}"


WRITER = FakeModel([lambda request: "a line"] * 20)


@compose.agent(model=WRITER, name="writer")
def writer(topic: str) -> str:
    return f"write about {topic}"
"""


def module(body: str, *, is_async: bool = False, sub_map: str = "compose.map(fetch, [1, 2])"):
    """The task module plus flow `pipeline` with `body` (statements)."""
    head = "async def" if is_async else "def"
    return (
        TASKS.replace("SUB_MAP", sub_map)
        + f'\n\n@compose.flow(name="pipeline")\n{head} pipeline() -> object:\n'
        + textwrap.indent(textwrap.dedent(body).strip(), "    ")
        + "\n"
    )


def start(deploy, source: str, is_async: bool):
    mod = deploy.load("exact_mod", source)
    if is_async:
        return asyncio.run(mod.pipeline.arun())
    return mod.pipeline.run()


def resume(run_id: str, answers: dict, is_async: bool, **kw):
    if is_async:

        async def main():
            return await compose.aresume(run_id, answers=answers, **kw)

        return asyncio.run(main())
    return compose.resume(run_id, answers=answers, **kw)


GATE = 'compose.approve("go")'

# (id, body before, body after, answers, async, the key the error names)
SHAPES = [
    pytest.param(
        f"v = compose.map(fetch, [1, 2, 3])\n{GATE}\nreturn publish(v)",
        f"v = compose.map(fetch, [1, 2])\n{GATE}\nreturn publish(v)",
        {"go": True},
        False,
        "map#1[2]/fetch#1",
        id="map-fewer-items",
    ),
    pytest.param(
        f"v = compose.map(fetch, [1, 2, 3])\n{GATE}\nreturn publish(v)",
        f"v = compose.map(fetch, [1, 2, 3, 4])\n{GATE}\nreturn publish(v)",
        {"go": True},
        False,
        "map#1",
        id="map-more-items",
    ),
    pytest.param(
        f"v = compose.map(fetch, [1, 2, 3])\n{GATE}\nreturn publish(v)",
        f"{GATE}\nreturn publish([])",
        {"go": True},
        False,
        "map#1[0]/fetch#1",
        id="map-removed",
    ),
    pytest.param(
        f"v = compose.map(fetch, [1, 2])\nw = fetch(5)\n{GATE}\nreturn publish(w)",
        f"w = fetch(5)\n{GATE}\nreturn publish(w)",
        {"go": True},
        False,
        "map#1[0]/fetch#1",
        id="map-removed-before-a-step",
    ),
    pytest.param(
        f'v = compose.aggregate(u=upper, s=shout)("hey")\n{GATE}\nreturn publish(v)',
        f'v = compose.aggregate(u=upper)("hey")\n{GATE}\nreturn publish(v)',
        {"go": True},
        False,
        "aggregate#1/",
        id="aggregate-branch-removed",
    ),
    pytest.param(
        f'v = compose.aggregate(u=upper, s=shout)("hey")\n{GATE}\nreturn publish(v)',
        f"{GATE}\nreturn publish(None)",
        {"go": True},
        False,
        "aggregate#1/",
        id="aggregate-removed",
    ),
    pytest.param(
        "v = sub(1)\nreturn publish(v)",
        "return publish(0)",
        {"inner": True},
        False,
        "sub#1/map#1[0]/fetch#1",
        id="nested-flow-paused-inside-removed",
    ),
    pytest.param(
        "v = sub(1)\nreturn publish(v)",
        "v = sub(2)\nreturn publish(v)",
        {"inner": True},
        False,
        "sub#1/map#1[0]/fetch#1",
        id="nested-flow-paused-inside-other-arguments",
    ),
    pytest.param(
        f'v = compose.map(writer, ["a", "b", "c"])\n{GATE}\nreturn publish(v)',
        f'v = compose.map(writer, ["a", "b"])\n{GATE}\nreturn publish(v)',
        {"go": True},
        False,
        "map#1[2]/writer#1",
        id="agent-steps-of-fewer-items",
    ),
    pytest.param(
        f'v = writer("owl")\nv = compose.map(writer, ["a", "b"])\n{GATE}\nreturn publish(v)',
        f'v = writer("owl")\n{GATE}\nreturn publish(v)',
        {"go": True},
        False,
        "map#1[0]/writer#1",
        id="agent-steps-of-a-removed-map",
    ),
    pytest.param(
        f"v = await compose.amap(afetch, [1, 2, 3])\n{GATE}\nreturn await apublish.arun(v)",
        f"v = await compose.amap(afetch, [1, 2])\n{GATE}\nreturn await apublish.arun(v)",
        {"go": True},
        True,
        "map#1[2]/afetch#1",
        id="async-amap-fewer-items",
    ),
    pytest.param(
        f"v = await compose.amap(afetch, [1, 2, 3])\n{GATE}\nreturn await apublish.arun(v)",
        f"{GATE}\nreturn await apublish.arun([])",
        {"go": True},
        True,
        "map#1[0]/afetch#1",
        id="async-amap-removed",
    ),
    pytest.param(
        f'v = (await compose.aggregate(u=upper, s=shout).arun("hey")).output\n{GATE}\n'
        "return await apublish.arun(v)",
        f'v = (await compose.aggregate(s=shout).arun("hey")).output\n{GATE}\n'
        "return await apublish.arun(v)",
        {"go": True},
        True,
        "aggregate#1/",
        id="async-aggregate-branch-removed",
    ),
]


@pytest.mark.parametrize(("before", "after", "answers", "is_async", "key"), SHAPES)
def test_issue31_divergence_stops_the_body_before_any_new_call(
    deploy, before, after, answers, is_async, key
):
    """Issue 31 (FLOW-21): a body that skips journaled calls (a `map` over other items, a
    removed `map`, `aggregate` branch, a nested flow or agent paused inside, then removed) raises
    `NondeterminismError` before any call the journal does not hold executes (counted by side
    effects) or is journaled; the run is failed by it and stays resumable: the original module
    completes it without executing any journaled step again."""
    run = start(deploy, module(before, is_async=is_async), is_async)
    assert run.status == "paused"
    journal = deploy.journal(run.id)
    executed = deploy.executions()
    deploy.load("exact_mod", module(after, is_async=is_async))
    with pytest.raises(compose.NondeterminismError) as info:
        resume(run.id, answers, is_async, allow_code_change=True)
    assert info.value.run_id == run.id
    assert info.value.key.startswith(key), (info.value.key, info.value.recorded)
    assert info.value.key in journal or info.value.key == key
    assert info.value.recorded != info.value.called
    assert deploy.executions() == executed, "a new call executed before the divergence"
    answered = {
        k: v for k, v in deploy.journal(run.id).items() if not k.startswith("__interrupt__")
    }
    assert answered == {k: v for k, v in journal.items() if not k.startswith("__interrupt__")}
    row = deploy.run_row(run.id)
    assert row["status"] == "failed"
    assert json.loads(row["error_json"])["type"] == "NondeterminismError"

    deploy.load("exact_mod", module(before, is_async=is_async))
    done = resume(run.id, answers, is_async)
    assert done.status == "completed", done
    publishes = [e for e in deploy.executions() if e[0] in ("publish", "apublish")]
    assert len(publishes) == 1
    assert sorted(deploy.executions()) == sorted(executed + publishes + sent(deploy))


def sent(deploy) -> list:
    """The approved tool's one execution, once the agent shape resumed under its own code."""
    return [e for e in deploy.executions() if e[0] == "send"]


def test_issue31_nested_map_over_fewer_items_stops_at_the_map(deploy):
    """Issue 31 with FLOW-15 scopes: a `map` inside a nested flow paused inside it, now over
    fewer items, raises at the map naming the first journaled step of the dropped item."""
    run = start(
        deploy,
        module("v = sub(1)\nreturn publish(v)", sub_map="compose.map(fetch, [1, 2, 3])"),
        False,
    )
    assert run.status == "paused"
    executed = deploy.executions()
    deploy.load(
        "exact_mod", module("v = sub(1)\nreturn publish(v)", sub_map="compose.map(fetch, [1, 2])")
    )
    with pytest.raises(compose.NondeterminismError) as info:
        resume(run.id, {"inner": True}, False, allow_code_change=True)
    assert info.value.key == "sub#1/map#1[2]/fetch#1"
    assert "3 items" in info.value.recorded and "2 items" in info.value.called
    assert deploy.executions() == executed


def test_issue31_unchanged_bodies_paused_inside_scopes_replay(deploy):
    """Issue 31 guard: an unchanged body paused inside a nested flow (after its `map`) and
    inside an agent's approval-gated tool resumes without divergence, in a fresh deploy of the
    same code, and executes each step once."""
    body = 'v = sub(1)\nw = mailer(upper("owl"))\nreturn publish([v, w])'
    run = start(deploy, module(body), False)
    assert run.pending.id == "inner"
    deploy.load("exact_mod", module(body))
    run = compose.resume(run.id, answers={"inner": True})
    assert run.status == "paused" and run.pending.id.startswith("tool:send")
    deploy.load("exact_mod", module(body))
    done = compose.resume(run.id, answers={"send": True})
    assert (done.status, done.output) == ("completed", "published")
    counts: dict = {}
    for e in deploy.executions():
        counts[e] = counts.get(e, 0) + 1
    assert set(counts.values()) == {1}, counts


# -- equal dicts in another order ------------------------------------------------------------


def test_issue31_step_digest_agrees_with_equality():
    """Issue 31: the hash a step identity keeps of its arguments is the same for arguments
    that are equal by `==`: dicts in another insertion order (also nested in lists and dicts),
    keyword arguments in another order, sets of sets; unequal arguments hash apart."""
    digest = _engine.step_digest
    a = {"x": 1, "y": [{"p": 1, "q": {"m": 1, "n": 2}}], "z": None}
    b = {"z": None, "y": [{"q": {"n": 2, "m": 1}, "p": 1}], "x": 1}
    assert a == b
    assert digest((a,), {}) == digest((b,), {})
    assert digest(([a, a],), {}) == digest(([b, b],), {})
    assert digest((), {"k": a, "j": 2}) == digest((), {"j": 2, "k": b})
    nested = frozenset([frozenset([1, 2]), frozenset([3]), frozenset([2, 4])])
    reordered = frozenset(reversed(list(nested)))
    assert digest((nested,), {}) == digest((reordered,), {})
    assert digest((a,), {}) != digest(({**a, "x": 2},), {})
    assert digest(([1, 2],), {}) != digest(([2, 1],), {})
    assert digest((), {"k": 1, "j": 2}) != digest((), {"k": 2, "j": 1})


HASHED = """\
import composeai as compose


@compose.task
def count_tags(tags: dict) -> int:
    side_effect("count_tags")
    return len(tags)


@compose.task
def count_rows(rows: list) -> int:
    side_effect("count_rows")
    return sum(len(r) for r in rows)


@compose.task
def fields(**kw) -> int:
    side_effect("fields")
    return len(kw)


@compose.flow(name="tagging")
def tagging() -> list:
    names = {"ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen"}
    tags = {n: len(n) for n in names}
    rows = [{n: {"len": len(n), "up": n.upper()} for n in names}, {"k": tags}]
    out = [count_tags(tags), count_rows(rows), fields(**tags), count_tags(tags=dict(tags))]
    compose.approve("go")
    return out
"""


@pytest.mark.parametrize(("seed_a", "seed_b"), [("1", "2"), ("3", "4"), ("5", "6")])
def test_issue31_dict_arguments_replay_under_another_hash_seed(tmp_path, seed_a, seed_b):
    """Issue 31: an unchanged body whose task arguments are dicts built from a set (so their
    insertion order follows `PYTHONHASHSEED`), dicts nested in lists, and keyword arguments
    built in that order, resumed in a fresh process under another seed, replays without
    divergence and executes no journaled step again."""
    box = _proc.Sandbox(tmp_path)
    box.write_module("tagging_mod", HASHED)
    started = box.run(
        "import tagging_mod\nrun = tagging_mod.tagging.run()\nemit(id=run.id, status=run.status)",
        PYTHONHASHSEED=seed_a,
    ).ok()
    assert started["status"] == "paused"
    done = box.run(
        """
        import os
        import tagging_mod
        from composeai import resume
        run = resume(os.environ["RUN_ID"], answers={"go": True})
        emit(status=run.status, output=run.output)
        """,
        RUN_ID=started["id"],
        PYTHONHASHSEED=seed_b,
    ).ok()
    assert (done["status"], done["output"]) == ("completed", [8, 9, 8, 8])
    assert [ln[0] for ln in box.side_effects()] == [
        "count_tags",
        "count_rows",
        "fields",
        "count_tags",
    ]
