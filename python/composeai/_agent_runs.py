"""Standalone durable agent runs: starting, settling
and resuming an `@agent` called outside any flow.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from . import _codec, _core, _drive, _engine
from ._agent_call import _Call, _current_bus, _overrides, _pop_budget, _push_budget
from ._agent_drive import _agent_loop_async, _agent_loop_sync, _agent_loop_sync_body
from ._engine import ASYNC_DRIVER as _ASYNC_DRIVER
from ._engine import BUDGETS, FRAME, Frame, RunState
from ._lifecycle import (
    OWNERS,
    abegin_resume,
    agent_not_registered,
    aresolve_pending_answers,
    begin_resume,
    completed_run,
    resolve_pending_answers,
)
from .errors import (
    SerializationError,
)
from .messages import Message
from .runs import Run
from .tracing import Span
from .tracing import _capture_content as _capture

if TYPE_CHECKING:
    # `agentfn.AgentFunction`: that module sits above this one.
    AgentFunction = Any


_AGENTS: dict[str, AgentFunction] = {}


# ---------------------------------------------------------------------------
# Standalone durable runs (AGENT-52 … AGENT-54)


def _standalone_payload(args: tuple, kwargs: dict, opts: dict) -> str:
    payload: dict[str, Any] = {"args": list(args), "kwargs": kwargs}
    if opts["system"] is None and not isinstance(opts["model"], str) and opts.get("seed") is None:
        plain = _engine._plain_args_json(payload)
        if plain is not None:
            return plain
    if opts["system"] is not None:
        payload["system"] = opts["system"]
    if isinstance(opts["model"], str):
        payload["model"] = opts["model"]
    if opts.get("seed") is not None:
        payload["messages"] = opts["seed"]
    return _codec.dumps(payload)


def _standalone_start(agent: AgentFunction, args: tuple, kwargs: dict, opts: dict):
    args_json = _standalone_payload(args, kwargs, opts)
    budget = opts["budget"]
    budget_json = None if budget is None else _engine.budget_json(budget)
    # The row is inserted with the settlement (or by the store's writer
    # within milliseconds): a short call commits once (AGENT-52).
    attempt = _engine.get_store().start_run(
        "agent",
        agent.name,
        None,
        args_json,
        budget_json,
        queued=True,
        module=_engine.importable_module(agent.fn),
    )
    meter = None if budget is None else _engine.budget_meter(budget, "agent", agent.name)
    return _engine.RunState(attempt, agent.name), meter


def _standalone_frame(
    agent: AgentFunction, run: RunState, args: tuple, kwargs: dict, opts: dict, fresh: bool
):
    root = _engine.open_span(None, run.trace, "agent", agent.name)
    if _engine._capture():
        root.input = {"args": list(args), "kwargs": kwargs}
    frame = Frame(run, "", root, None, run.trace)
    call = _Call(agent, opts, frame, "")
    call.snapshot_scope = ""
    call.restorable = not fresh
    return call


def _standalone_sync(
    agent: AgentFunction, args: tuple, kwargs: dict, opts: dict, run=None, meter=None
):
    fresh = run is None
    if fresh:
        run, meter = _standalone_start(agent, args, kwargs, opts)
    call = _standalone_frame(agent, run, args, kwargs, opts, fresh)
    token = FRAME.set(call.frame)
    budget_token = _push_budget(meter)
    try:
        output = _agent_loop_sync(call, args, kwargs)
    except BaseException as exc:  # noqa: BLE001 -- settled, then re-raised or returned
        return _settle_standalone_error(call, exc)
    finally:
        _pop_budget(budget_token)
        FRAME.reset(token)
    return _settle_standalone_ok(call, output)


def _plain_standalone(agent: AgentFunction, opts: dict) -> bool:
    """Whether a fresh standalone call can be made by `_standalone_plain`: no
    budget (its own or around it), context manager or chat seed, a sync body,
    and no event bus. Read at call time: options may change after decoration."""
    return (
        opts["budget"] is None
        and opts["context_manager"] is None
        and opts.get("seed") is None
        and not agent._is_async
        and not BUDGETS.get()
        and _current_bus() is None
    )


def _standalone_plain(agent: AgentFunction, args: tuple, kwargs: dict, opts: dict) -> Run:
    """`_standalone_sync` of a fresh run that `_plain_standalone` admits, in
    one straight line: the same rows, spans, events and `Run`, without the settlement plan's machinery, the budget scopes and
    the snapshot lookup a fresh run cannot need."""
    name = agent.name
    # The text of `{"args": [...], "kwargs": {...}}` when the payload is
    # only that (no system or model override) and plain: the row's
    # `args_json` and the root span's stored input both.
    args_text = None
    if opts["system"] is None and not isinstance(opts["model"], str):
        args_text = _engine._args_text(args, kwargs)
    attempt = _engine.get_store().start_run(
        "agent",
        name,
        None,
        args_text or _standalone_payload(args, kwargs, opts),
        None,
        queued=True,
    )
    run = RunState(attempt, name)
    trace = run.trace
    root = Span(
        trace_id=run.trace_id,
        span_id=_core.ulid(),
        parent_span_id=None,
        kind="agent",
        name=name,
        started_at=time.time(),
    )
    trace._spans.append(root)
    if _capture():
        root.input = {"args": list(args), "kwargs": kwargs}
    frame = Frame(run, "", root, None, trace)
    call = _Call(agent, opts, frame, "")
    call.snapshot_scope = ""
    call.restorable = False
    token = FRAME.set(frame)
    driver = _ASYNC_DRIVER.set(None)
    try:
        output = _agent_loop_sync_body(call, args, kwargs)
    except BaseException as exc:  # noqa: BLE001 -- settled, then re-raised or returned
        return _settle_standalone_error(call, exc)
    finally:
        _ASYNC_DRIVER.reset(driver)
        FRAME.reset(token)
    # `_drive.settle_completed(..., lenient=True)`, written out.
    try:
        output_json = _codec.dumps(output)
    except SerializationError:
        output_json = None
    root.ended_at = time.time()
    root.status = "ok"
    capture = _capture()
    if capture:
        attempt.span(_engine.span_row(root, output_json, args_text))
    else:
        attempt.span(_engine.span_row(root))
    if capture:
        root.output = output
    attempt.settle("completed", output_json, None)
    _engine._check_span_writes()
    _engine.emit_run_finished(root, "completed")
    spans = trace._spans
    if len(spans) == 2 and spans[1].parent_span_id == root.span_id and spans[1].kind == "llm":
        # The one model call's span: what `subtree_usage` sums.
        usage = spans[1].usage
    else:
        usage = _drive.subtree_usage(trace, root)
    return Run(
        id=run.run_id,
        status="completed",
        output=output,
        usage=_drive.rollup_usage(trace) if usage is None else usage,
        trace=trace,
        messages=list(call.messages),
        pending=None,
    )


async def _standalone_async(
    agent: AgentFunction, args: tuple, kwargs: dict, opts: dict, run=None, meter=None
):
    fresh = run is None
    if fresh:
        run, meter = await _astandalone_start(agent, args, kwargs, opts)
    call = _standalone_frame(agent, run, args, kwargs, opts, fresh)
    token = FRAME.set(call.frame)
    budget_token = _push_budget(meter)
    try:
        output = await _agent_loop_async(call, args, kwargs)
    except BaseException as exc:  # noqa: BLE001 -- settled, then re-raised or returned
        outcome = await _drive.asettle_interrupted(
            run, call.frame.span, exc, cancelled_status="cancelled"
        )
        return _drive.make_run_result(run, outcome)
    finally:
        _pop_budget(budget_token)
        FRAME.reset(token)
    outcome = await _drive.asettle_completed(run, call.frame.span, output, lenient=True)
    return _standalone_result(call, outcome)


async def _astandalone_start(agent: AgentFunction, args: tuple, kwargs: dict, opts: dict):
    """`_standalone_start` for an async caller: a server-backed store creates
    the row off the loop (SQLite queues it without I/O)."""
    if (await _engine.aget_store()).kind == "sqlite":
        return _standalone_start(agent, args, kwargs, opts)
    budget = opts["budget"]
    attempt = await _drive.astart_run(
        "agent",
        agent.name,
        None,
        _standalone_payload(args, kwargs, opts),
        None if budget is None else _engine.budget_json(budget),
        module=_engine.importable_module(agent.fn),
    )
    meter = None if budget is None else _engine.budget_meter(budget, "agent", agent.name)
    return _engine.RunState(attempt, agent.name), meter


def _standalone_result(call: _Call, outcome: tuple) -> Run:
    run, root = call.run, call.frame.span
    assert run is not None  # a standalone call's frame has its run
    return _drive.make_run_result(
        run, outcome, _drive.subtree_usage(run.trace, root), list(call.messages)
    )


def _settle_standalone_ok(call: _Call, output: Any) -> Run:
    assert call.run is not None  # a standalone call's frame has its run
    outcome = _drive.settle_completed(call.run, call.frame.span, output, lenient=True)
    return _standalone_result(call, outcome)


def _settle_standalone_error(call: _Call, exc: BaseException) -> Run:
    run = call.run
    assert run is not None  # a standalone call's frame has its run
    outcome = _drive.settle_interrupted(run, call.frame.span, exc, cancelled_status="cancelled")
    return _drive.make_run_result(run, outcome)


def run_seeded(agent: AgentFunction, seed: list[Message], opts: dict) -> Run:
    """A standalone durable run whose conversation is `seed`; the agent body
    is not called."""
    _engine.check_sync_facade()
    return _standalone_sync(agent, (), {}, {**opts, "seed": seed})


def resume_standalone(
    row: dict, answers, budget, approver, tool_interceptor, context_manager, asynchronous: bool
):
    """Continue a paused or crashed standalone agent run."""
    run_id = row["run_id"]
    if row["status"] == "completed":
        return completed_run(row)
    agent = _AGENTS.get(row["name"])
    if agent is None:
        raise agent_not_registered(row["name"], row.get("module"))

    hooks = (approver, tool_interceptor, context_manager)
    if asynchronous:
        return _aresume_standalone(agent, run_id, answers, budget, hooks)
    resolved = resolve_pending_answers(run_id, answers)
    run, payload, meter = begin_resume(run_id, resolved, budget, "agent", agent.name)
    args, kwargs, opts = _resumed_call(payload, budget, hooks)
    return _standalone_sync(agent, args, kwargs, opts, run, meter)


async def _aresume_standalone(
    agent: AgentFunction, run_id: str, answers: Any, budget: Any, hooks: tuple
) -> Run:
    resolved = await aresolve_pending_answers(run_id, answers)
    run, payload, meter = await abegin_resume(run_id, resolved, budget, "agent", agent.name)
    args, kwargs, opts = _resumed_call(payload, budget, hooks)
    return await _standalone_async(agent, args, kwargs, opts, run, meter)


def _resumed_call(payload: dict, budget: Any, hooks: tuple) -> tuple:
    """`(args, kwargs, opts)` of a resumed standalone run's stored call."""
    opts = _overrides(budget, payload.get("system"), payload.get("model"), *hooks)
    if payload.get("messages") is not None:
        opts["seed"] = list(payload["messages"])
    return tuple(payload.get("args", ())), dict(payload.get("kwargs", {})), opts


# `compose.resume()` of a standalone agent run is routed here (AGENT-54).
OWNERS["agent"] = resume_standalone
