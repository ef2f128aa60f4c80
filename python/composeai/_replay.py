"""Replay safety beyond resume: re-running a stored flow run's
body against its journal without executing anything (`replay`, the check a
team runs in CI before deploying a code change), and a new run that reuses
an old one's journal up to a step (`fork`, the flows' time travel).

The core does both: a replay-only attempt reads the run's journal, writes
nothing and ends where the journal ends; a fork's first attempt borrows its
source's journaled steps, journaling each as its own, until it reserves the
step it forks at.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _codec, _core, _drive, _engine
from ._engine import RunState, _Pause
from ._values import Run
from .errors import ConfigError, _ReplayEnd
from .flow import _FLOWS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


@dataclass(frozen=True)
class ReplayReport:
    """What `replay` found: the body made every journaled call it reached.

    `steps`: journaled steps replayed. `stopped_at`: None when the body ran
    to its end (`status` then tells how: completed, or failed with `error`);
    else the interrupt id the run is paused at (an agent's gated tool call
    included: the agent's step is not replayed into), or the key of the
    first step the journal does not hold (where a crashed or failed run
    stopped)."""

    run_id: str
    flow: str
    status: str
    steps: int
    stopped_at: str | None
    error: str | None = None


def _store(store: str | None) -> Any:
    if store is None:
        return _engine.get_store()
    kind, target = _core.store_target(store, _engine._default_sqlite())
    return _core.Store(target if kind == "sqlite" else store)


def _flow_of(row: dict, what: str) -> Any:
    if row["kind"] != "flow":
        raise ConfigError(
            f"run '{row['run_id']}' is a {row['kind']} run -- {what} applies to @flow runs"
        )
    flow_obj = _FLOWS.get(row["name"])
    if flow_obj is None:
        raise _engine.not_registered("flow", row["name"], row.get("module"), what)
    return flow_obj


def _arguments(args_json: str | None) -> tuple[tuple, dict]:
    payload = _codec.loads(args_json) if args_json else {}
    return tuple(payload.get("args", ())), dict(payload.get("kwargs", {}))


def _run_body(flow_obj: Any, run: RunState, args: tuple, kwargs: dict) -> Any:
    """The body under the run's root span, driven as a run is (its
    settlement goes through the attempt, which for a replay writes nothing)."""
    run.journal_failures = flow_obj.journal_failures
    root = flow_obj._root(run, args, kwargs)
    call = lambda: flow_obj.fn(*args, **kwargs)
    if flow_obj._is_async:
        from . import _runtime

        return _runtime.run_sync(lambda: _drive.drive_async(run, call, root))
    return _drive.drive_sync(run, call, root)


def replay(run: str | Run, *, store: str | None = None) -> ReplayReport:
    """Re-runs a stored flow run's body against its journal without
    executing any step or model and without writing anything; raises
    `NondeterminismError` where the body's calls no longer match the
    journal (whatever the flow's `on_divergence` and fingerprint)."""
    run_id = run.id if isinstance(run, Run) else run
    source = _store(store)
    attempt = source.replay_attempt(run_id)
    row = {"run_id": attempt.run_id, "kind": attempt.kind, "name": attempt.name}
    if attempt.name not in _FLOWS:
        # For the message: the module recorded with the run.
        row["module"] = (source.get_run(run_id) or {}).get("module")
    flow_obj = _flow_of(row, "replay()")
    args, kwargs = _arguments(attempt.args_json)
    state = RunState(attempt, flow_obj.name)
    stopped_at = error = None
    try:
        outcome = _run_body(flow_obj, state, args, kwargs)
    except _ReplayEnd as end:
        stopped_at = end.key
        if attempt.status == "paused":
            # Paused inside an agent step (an approval-gated tool call): the
            # journal ends at the agent's step, and the run waits on its tool.
            tools = sorted(p[0] for p in source.pending(attempt.run_id) if p[0].startswith("tool:"))
            if tools:
                stopped_at = tools[0]
    except Exception as exc:  # the body's own failure, reported
        if attempt.divergence() is not None:
            raise
        error = f"{type(exc).__name__}: {exc}"
    else:
        _, _, pause = outcome
        if isinstance(pause, _Pause):
            stopped_at = pause.interrupt_id
    return ReplayReport(
        run_id=attempt.run_id,
        flow=flow_obj.name,
        status=attempt.status,
        steps=attempt.replayed_steps,
        stopped_at=stopped_at,
        error=error,
    )


def fork(run_id: str, at: str) -> Run[Any]:
    """A new run of the same flow and arguments whose journal is `run_id`'s
    up to (not including) the step `at`, in body order; `at` and everything
    after it execute here. The old run is left as it is."""
    if _engine.missing_store():
        raise ConfigError(_engine.run_not_found(run_id))
    store = _engine.get_store()
    row = store.get_run(run_id)
    if row is None:
        raise ConfigError(_engine.run_not_found(run_id))
    flow_obj = _flow_of(row, "fork()")
    journal = dict(store.journal(run_id))
    if at not in journal or at.startswith("__"):
        steps = sorted(k for k in journal if not k.startswith("__"))
        raise ConfigError(
            f"run {run_id!r} has no journaled step {at!r} to fork at -- its steps: "
            f"{', '.join(steps) if steps else '(none)'}"
        )
    if any(part.startswith("tool:") for part in at.split("/")[:-1]):
        raise ConfigError(
            f"cannot fork run {run_id!r} at {at!r}: it is a step of an agent's tool call, which "
            "replays with its agent -- fork at the agent's own step instead"
        )
    args, kwargs = _arguments(row["args_json"])
    attempt = store.start_run(
        "flow",
        flow_obj.name,
        flow_obj.fingerprint,
        row["args_json"],
        row["budget_json"],
        module=flow_obj._module,
    )
    attempt.fork_from(run_id, at)
    run = RunState(attempt, flow_obj.name)
    meter = None
    if row["budget_json"]:
        budget = _engine.budget_from_json(row["budget_json"])
        meter = _engine.budget_meter(budget, "flow", flow_obj.name)
    return flow_obj._drive(run, args, kwargs, meter)  # type: ignore[no-any-return]
