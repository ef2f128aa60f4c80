"""An async flow paused in one process and resumed with `aresume` in another (ASYNC-2,
FLOW-40/42): real subprocesses sharing one state directory."""

from __future__ import annotations

import json

from _proc import Sandbox

FLOW_MODULE = """
import asyncio

import composeai as compose


@compose.task
async def fetch(x: int) -> dict:
    await asyncio.sleep(0)
    side_effect("fetch", x)
    return {"x": x, "pair": (x, x + 1)}


@compose.task
def publish(draft: dict) -> str:
    side_effect("publish", draft["x"])
    return f"published {draft['x']}"


@compose.flow
async def release(x: int) -> dict:
    draft = await fetch.arun(x)
    stamp = await compose.arandom()
    if not compose.approve("ship", payload=draft):
        return {"status": "rejected"}
    note = compose.ask_human("note", "Release note?")
    result = await publish.arun(draft)
    return {"result": result, "note": note, "stamp": stamp, "pair": list(draft["pair"])}
"""


def test_async_flow_paused_in_one_process_resumes_with_aresume_in_another(tmp_path):
    box = Sandbox(tmp_path)
    box.write_module("release_flow", FLOW_MODULE)

    first = box.run(
        """
        import asyncio
        from release_flow import release

        run = asyncio.run(release.arun(7))
        emit(run_id=run.id, status=run.status, pending=run.pending.id,
             payload=run.pending.payload)
        """,
        PROC="A",
    ).ok()
    assert first["status"] == "paused"
    assert first["pending"] == "ship"
    assert first["payload"] == {"x": 7, "pair": [7, 8]}
    run_id = first["run_id"]
    assert box.run_row(run_id)["status"] == "paused"
    assert box.side_effects() == [("fetch", "7", "A")]
    journal = box.journal(run_id)
    assert set(journal) == {"fetch#1", "random#1"}
    stamp = json.loads(journal["random#1"])
    assert [p[0] for p in box.pending(run_id)] == ["ship"]

    # second attempt, fresh process: answers one gate, pauses at the next
    second = box.run(
        f"""
        import asyncio
        import composeai as compose
        import release_flow  # registers the flow

        run = asyncio.run(compose.aresume({run_id!r}, answers={{"ship": True}}))
        emit(status=run.status, pending=run.pending.id, kind=run.pending.kind)
        """,
        PROC="B",
    ).ok()
    assert second == {"status": "paused", "pending": "note", "kind": "question"}
    assert box.side_effects() == [("fetch", "7", "A")]

    third = box.run(
        f"""
        import asyncio
        import composeai as compose
        import release_flow

        run = asyncio.run(compose.aresume({run_id!r}, answers={{"note": "v1.0"}}))
        emit(status=run.status, id=run.id, output=run.output)
        """,
        PROC="C",
    ).ok()
    assert third["status"] == "completed"
    assert third["id"] == run_id
    assert third["output"] == {
        "result": "published 7",
        "note": "v1.0",
        "stamp": stamp,
        "pair": [7, 8],
    }
    # earlier steps never re-ran: fetch once in A, publish once in C
    assert box.side_effects() == [("fetch", "7", "A"), ("publish", "7", "C")]
    row = box.run_row(run_id)
    assert row["status"] == "completed"
    assert row["kind"] == "flow"
    assert json.loads(row["output_json"])["result"] == "published 7"
    assert set(box.journal(run_id)) == {
        "fetch#1",
        "random#1",
        "__interrupt__:ship",
        "__interrupt__:note",
        "publish#1",
    }
    assert box.pending(run_id) == []

    # resuming the completed run in yet another process returns the stored output, runs nothing
    fourth = box.run(
        f"""
        import asyncio
        import composeai as compose
        import release_flow

        run = asyncio.run(compose.aresume({run_id!r}))
        emit(status=run.status, output=run.output)
        """,
        PROC="D",
    ).ok()
    assert fourth["status"] == "completed"
    assert fourth["output"]["result"] == "published 7"
    assert len(box.side_effects()) == 2


def test_async_flow_resumed_by_sync_resume_in_another_process(tmp_path):
    """The same durable run can be continued through the other surface (sync `resume`)."""
    box = Sandbox(tmp_path)
    box.write_module("release_flow", FLOW_MODULE)
    first = box.run(
        """
        import asyncio
        from release_flow import release

        run = asyncio.run(release.arun(1))
        emit(run_id=run.id, status=run.status)
        """,
        PROC="A",
    ).ok()
    assert first["status"] == "paused"
    done = box.run(
        f"""
        import composeai as compose
        import release_flow

        run = compose.resume({first["run_id"]!r}, answers={{"ship": True, "note": "n"}})
        emit(status=run.status, output=run.output)
        """,
        PROC="B",
    ).ok()
    assert done["status"] == "completed"
    assert done["output"]["result"] == "published 1"
    assert done["output"]["note"] == "n"
    assert box.side_effects() == [("fetch", "1", "A"), ("publish", "1", "B")]
