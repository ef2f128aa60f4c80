"""EXT-9 `RetryPolicy` on `@task` and EXT-8 `@flow(retry=...)`: the engine
re-attempts a failed run itself (same run id, journaled steps replay),
waiting each backoff durably."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

import composeai as compose
from composeai import RetryPolicy, _engine, flow, task
from composeai.errors import ConfigError, TaskTimeoutError
from composeai.testing import fake_clock

CALLS: list[str] = []


@pytest.fixture(autouse=True)
def _reset():
    CALLS.clear()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_attempts": -1}, "max_attempts"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"initial_backoff": -1.0}, "initial_backoff"),
        ({"backoff_factor": -2}, "backoff_factor"),
        ({"max_backoff": -0.5}, "max_backoff"),
        ({"jitter": 1.5}, "jitter"),
        ({"retry_on": ValueError}, "retry_on"),
    ],
)
def test_ext9_nonsensical_policies_are_config_errors(kwargs, field):
    with pytest.raises(ConfigError, match=f"RetryPolicy: {field}"):
        RetryPolicy(**kwargs)


def test_ext9_policy_delays_and_decorator_checks():
    policy = RetryPolicy(initial_backoff=1.0, backoff_factor=3.0, max_backoff=5.0)
    assert [policy.delay(k) for k in (2, 3, 4)] == [1.0, 3.0, 5.0]
    jittered = RetryPolicy(initial_backoff=10.0, jitter=0.1)
    assert all(9.0 <= jittered.delay(2) <= 11.0 for _ in range(50))
    assert RetryPolicy.NONE.max_attempts == 1
    assert not policy.retries(TaskTimeoutError("t"))
    with pytest.raises(ConfigError, match="either retries= or retry="):
        task(retries=2, retry=RetryPolicy())(lambda: None)
    with pytest.raises(ConfigError, match="retry= must be a RetryPolicy"):
        flow(retry=3)(lambda: None)


def test_ext9_a_task_retries_per_its_policy_and_records_delays(isolated_state):
    attempts = {"n": 0}

    @task(retry=RetryPolicy(max_attempts=3, initial_backoff=0.01, non_retryable=(KeyError,)))
    def shaky() -> str:
        attempts["n"] += 1
        if attempts["n"] < 3:
            raise ValueError(f"try {attempts['n']}")
        return "ok"

    @flow
    def uses() -> str:
        return shaky()

    run = uses.run()
    assert run.output == "ok"
    (span,) = [s for s in run.trace.spans if s.name == "shaky"]
    assert span.attributes["retries"] == [
        {"type": "ValueError", "message": "try 1", "delay": 0.01},
        {"type": "ValueError", "message": "try 2", "delay": 0.02},
    ]

    @task(retry=RetryPolicy(max_attempts=5, initial_backoff=0, non_retryable=(KeyError,)))
    def fatal() -> None:
        CALLS.append("fatal")
        raise KeyError("k")

    @flow
    def dies() -> None:
        fatal()

    with pytest.raises(KeyError):
        dies.run()
    assert CALLS == ["fatal"], "a non-retryable error is not retried"


def test_ext8_a_flow_retries_the_run_itself_after_a_durable_backoff(isolated_state):
    @task
    def once(x: int) -> int:
        CALLS.append(f"once:{x}")
        return x

    failures = {"left": 2}

    @flow(retry=RetryPolicy(max_attempts=3, initial_backoff=3600.0))
    def sturdy(x: int) -> int:
        value = once(x)
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("transient")
        return value * 2

    with fake_clock() as clock:
        parked = sturdy.run(21, wait=False)
        assert parked.status == "paused"
        assert parked.pending.id == "timer:__retry__#1/sleep#1"
        assert compose.wake_due() == [], "the backoff has not passed"
        clock.advance(timedelta(hours=1))
        (again,) = compose.wake_due()
        assert again.pending.id == "timer:__retry__#2/sleep#1"
        clock.advance(timedelta(hours=2))
        (done,) = compose.wake_due()
    assert (done.id, done.output) == (parked.id, 42)
    assert CALLS == ["once:21"], "journaled steps replay across the run's attempts"
    journal = dict(_engine.get_store().journal(parked.id))
    assert journal["__retry__#1"] == '{"type":"RuntimeError","message":"transient"}'


def test_ext8_a_blocking_run_retries_in_place_and_fails_when_attempts_run_out(isolated_state):
    @flow(retry=RetryPolicy(max_attempts=2, initial_backoff=0.01))
    def hopeless() -> None:
        CALLS.append("try")
        raise RuntimeError("always")

    with pytest.raises(RuntimeError, match="always"):
        hopeless.run()
    assert CALLS == ["try", "try"]

    attempts = {"n": 0}

    @flow(retry=RetryPolicy(max_attempts=3, initial_backoff=0.01))
    async def asturdy() -> str:
        attempts["n"] += 1
        if attempts["n"] < 2:
            raise ValueError("once")
        return "fine"

    assert asyncio.run(asturdy.arun()).output == "fine"
    assert asturdy.run().output == "fine"


def test_ext9_agents_and_tools_accept_a_retry_policy(isolated_state):
    from composeai import agent, tool
    from composeai.errors import ProviderError
    from composeai.testing import FakeModel

    def overloaded(_request):
        raise ProviderError("overloaded")

    model = FakeModel([overloaded, overloaded, "fine"])

    @agent(model=model, retry=RetryPolicy(max_attempts=3, initial_backoff=0.001))
    def retrying_helper(q: str) -> str:
        """Answer."""
        return q

    run = retrying_helper.run("hi")
    assert run.output == "fine"
    (llm,) = [s for s in run.trace.spans if s.kind == "llm"]
    assert [r["delay"] for r in llm.attributes["retries"]] == [0.001, 0.002]
    with pytest.raises(ConfigError, match="either retries= or retry="):
        agent(model=model, retries=1, retry=RetryPolicy())(lambda q: q)

    tries = {"n": 0}

    @tool(retry=RetryPolicy(max_attempts=2, initial_backoff=0))
    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: the key.
        """
        tries["n"] += 1
        if tries["n"] == 1:
            raise OSError("flaky disk")
        return key.upper()

    assert lookup.execute({"key": "k"}) == "K"
    assert tries["n"] == 2

    @agent(
        model=FakeModel([{"tool_calls": [{"name": "lookup", "arguments": {"key": "z"}}]}, "ok"]),
        tools=[lookup],
    )
    def looker(q: str) -> str:
        """Look."""
        return q

    tries["n"] = 0
    run = looker.run("go")
    assert run.output == "ok"
    (tool_span,) = [s for s in run.trace.spans if s.kind == "tool"]
    assert tool_span.attributes["retries"] == [
        {"type": "OSError", "message": "flaky disk", "delay": 0.0}
    ]
    with pytest.raises(ConfigError, match="retry= must be a RetryPolicy"):
        tool(retry={"max_attempts": 2})(lambda key: key)
