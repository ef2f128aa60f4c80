"""EXT-7: `@flow(journal_failures=True)` journals a step's failure and raises
`TaskFailed`; a body that catches it replays deterministically."""

from __future__ import annotations

import pytest

import composeai as compose
from composeai import _engine, flow, task
from composeai.durable import TaskFailed
from composeai.errors import ComposeError

CALLS: list[str] = []


@pytest.fixture(autouse=True)
def _reset():
    CALLS.clear()


@task
def flaky(x: int) -> int:
    CALLS.append(f"flaky:{x}")
    raise ValueError(f"no luck with {x}")


@task
def fallback(x: int) -> int:
    CALLS.append(f"fallback:{x}")
    return -x


def test_ext7_a_caught_task_failure_is_journaled_and_replayed_without_rerunning(
    isolated_state,
):
    seen: list = []

    @flow(journal_failures=True)
    def careful(x: int) -> int:
        try:
            return flaky(x)
        except TaskFailed as exc:
            seen.append((exc.step_key, exc.error_type, exc.message, type(exc.__cause__)))
            value = fallback(x)
        compose.approve("done")
        return value

    first = careful.run(3)
    assert first.status == "paused"
    assert seen == [("flaky#1", "ValueError", "no luck with 3", ValueError)]
    assert isinstance(TaskFailed("k", "T", "m"), ComposeError)
    journal = dict(_engine.get_store().journal(first.id))
    assert journal["flaky#1"] == '{"$failed":{"type":"ValueError","message":"no luck with 3"}}'
    done = compose.resume(first.id, {"done": True})
    assert done.output == -3
    assert CALLS == ["flaky:3", "fallback:3"], "the failed step did not re-run on replay"
    assert seen[1][:3] == ("flaky#1", "ValueError", "no luck with 3")
    assert seen[1][3] is type(None), "on replay there is no original exception (__cause__)"


def test_ext7_default_keeps_the_original_exception_and_journals_nothing(isolated_state):
    @flow
    def plain(x: int) -> int:
        return flaky(x)

    with pytest.raises(ValueError, match="no luck with 1"):
        plain.run(1)
    with pytest.raises(ValueError):
        plain.run(2)
    assert CALLS == ["flaky:1", "flaky:2"]
