"""EXT-5 `await_until`: re-evaluated after every signal, journaled with its
evaluations so that a replay (also after a park) is deterministic."""

from __future__ import annotations

from datetime import timedelta

import pytest

import composeai as compose
from composeai import _engine, flow, task
from composeai.errors import ConfigError
from composeai.testing import fake_clock

SEEN: list = []


@task
def record(value):
    SEEN.append(value)
    return value


@pytest.fixture(autouse=True)
def _reset():
    SEEN.clear()


def quorum_flow():
    @flow
    def quorum(needed: int) -> list:
        votes: list = []

        def enough() -> bool:
            votes.extend(compose.receive_all("vote"))
            return len(votes) >= needed

        reached = compose.await_until(enough, timeout=timedelta(hours=1))
        summary = record(sorted(votes))
        compose.approve("publish")
        return [reached, summary]

    return quorum


def test_ext5_await_until_parks_until_signals_make_the_predicate_true(isolated_state):
    run = quorum_flow().run(3, wait=False)
    assert run.pending.id == "await_until#1"
    assert run.pending.kind == "signal"
    assert run.pending.payload["timeout_at"].endswith("+00:00")
    compose.signal(run.id, "vote", "a")
    (again,) = compose.wake_due()
    assert again.status == "paused", "one vote is not enough"
    compose.signal(run.id, "vote", "b")
    compose.signal(run.id, "vote", "c")
    (done,) = compose.wake_due()
    assert done.pending.id == "publish"
    journal = dict(_engine.get_store().journal(run.id))
    assert journal["await_until#1"] == '{"result":true,"evals":3}'
    replay = compose.resume(run.id, {"publish": True})
    assert replay.output == [True, ["a", "b", "c"]]
    assert SEEN == [["a", "b", "c"]], "the replay re-ran nothing"


def test_ext5_await_until_times_out_false_and_blocks_in_place(isolated_state):
    with fake_clock() as clock:
        run = quorum_flow().run(2, wait=False)
        compose.signal(run.id, "vote", "x")
        clock.advance(timedelta(hours=1))
        (done,) = compose.wake_due()
    assert done.pending.id == "publish"
    assert compose.resume(done.id, {"publish": True}).output == [False, ["x"]]

    @flow
    def instant() -> bool:
        return compose.await_until(lambda: True)

    assert instant.run().output is True
    with pytest.raises(ConfigError, match=r"await_until\(\) must be called inside a flow"):
        compose.await_until(lambda: True)
