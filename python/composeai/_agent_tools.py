"""Tool batches of an agent turn: approval gates,
interceptors, and each tool executed on the sync or async path.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from . import _codec, _engine
from ._agent_call import _Call, _check_cancel
from ._engine import FRAME, Frame
from .errors import (
    ConfigError,
)
from .messages import Message, ToolCallPart, ToolResultPart

if TYPE_CHECKING:
    # `agentfn.AgentFunction`: that module sits above this one.
    AgentFunction = Any


# ---------------------------------------------------------------------------
# Tool batches (AGENT-40 … AGENT-46)


class _ToolJob:
    """One tool call to execute: its tool (None if unknown) and arguments."""

    __slots__ = ("arguments", "call", "tool")

    def __init__(self, call: ToolCallPart, tool: Any, arguments: dict):
        self.call = call
        self.tool = tool
        self.arguments = arguments


def _tool_batch(call: _Call, calls: list[ToolCallPart]) -> Generator[tuple, Any, None]:
    _check_cancel()
    if call.run is not None:
        # Tools are user code that may run long or hand out the run id: the
        # run row is stored before they start (a queued insert, AGENT-52).
        call.run.attempt.store_row()
    agent = call.agent
    results: dict[str, ToolResultPart] = dict(call.partial)
    arguments: dict[str, dict] = {c.id: c.arguments for c in calls}
    denied: set[str] = set()
    if call.interceptor is not None:
        for c in calls:
            if c.id in results:
                continue
            decision = call.interceptor.before(c)
            if decision is None or decision.action == "proceed":
                if decision is not None and decision.arguments is not None:
                    arguments[c.id] = decision.arguments
                continue
            content = decision.message or "blocked by tool interceptor"
            results[c.id] = _denied(call, c, content)
            denied.add(c.id)
    live = [c for c in calls if c.id not in results and not _gated(agent, c)]
    pauses: list[Any] = []
    if live:
        jobs = [_ToolJob(c, agent._tool_map.get(c.name), arguments[c.id]) for c in live]
        outcomes = yield ("tools", call, jobs)
        for job, outcome in zip(jobs, outcomes):
            if isinstance(outcome, _engine._Pause):
                pauses.append(outcome)
            else:
                results[job.call.id] = outcome
    for c in calls:
        if c.id in results or not _gated(agent, c):
            continue
        outcome, was_denied = yield from _gated_call(call, c, arguments[c.id])
        if was_denied:
            denied.add(c.id)
        if isinstance(outcome, _engine._Pause):
            pauses.append(outcome)
        elif outcome is not None:
            results[c.id] = outcome
    if call.interceptor is not None:
        for c in calls:
            if c.id in results and c.id not in denied and c.id not in call.partial:
                replaced = call.interceptor.after(c, results[c.id])
                if replaced is not None:
                    results[c.id] = replaced
    if pauses:
        call.partial = {k: v for k, v in results.items() if k in arguments}
        first = pauses[0]
        if call.durable:
            extra = [p for p in pauses[1:]]
            first.attach(extra, call.snapshot_row(), call.run)
        raise first
    call.partial = {}
    call.messages.append(Message(role="user", parts=[results[c.id] for c in calls]))
    if call.durable:
        assert call.run is not None  # `durable` says so
        call.run.attempt.save_agent_state(call.snapshot_row(), call.frame.fence)


def _gated(agent: AgentFunction, c: ToolCallPart) -> bool:
    tool = agent._tool_map.get(c.name)
    return tool is not None and tool.spec.requires_approval


def _denied(call: _Call, c: ToolCallPart, content: str) -> ToolResultPart:
    """A refused call: an error result and a `tool` span with status ok."""
    span = _engine.open_span(call.frame.span, call.frame.trace, "tool", c.name)
    if _engine._capture():
        span.input = c.arguments
    _engine.close_span(call.run, span, content)
    return ToolResultPart(tool_call_id=c.id, content=content, is_error=True)


def _gated_call(call: _Call, c: ToolCallPart, arguments: dict) -> Generator[tuple, Any, Any]:
    """Look up the journaled answer, ask the approver, or pause.
    Returns `(result or pause, denied)`."""
    interrupt_id = f"tool:{c.name}:{c.id}"
    run = call.run
    frame = call.frame
    if run is None:
        raise ConfigError(_engine.NO_RUN_FOR_INTERRUPT)
    key = "__interrupt__:" + interrupt_id
    hit = run.attempt.lookup(key, frame.fence)
    answer: Any = None
    message = None
    if hit is not None:
        answer = _codec.loads(hit)
    else:
        payload = {"tool": c.name, "arguments": arguments}
        if call.approver is not None:
            from ._interrupt import Interrupt

            interrupt = Interrupt(id=interrupt_id, kind="approval", question=None, payload=payload)
            reply = yield ("callback", call.approver, (interrupt,))
            from ._approval import ApprovalReply

            if isinstance(reply, ApprovalReply):
                answer, message = reply.allow, reply.message
            else:
                answer = bool(reply)
            run.attempt.commit(key, _codec.dumps(bool(answer)), None, frame.fence)
        else:
            span = _engine.open_span(frame.span, frame.trace, "pause", interrupt_id)
            span.ended_at = span.started_at
            span.status = "paused"
            _engine.persist_span(run, span)
            return _engine._Pause(interrupt_id, "approval", None, payload), False
    if answer:
        job = _ToolJob(c, call.agent._tool_map.get(c.name), arguments)
        outcomes = yield ("tools", call, [job])
        return outcomes[0], False
    return _denied(call, c, message or "denied by user"), True


# ---------------------------------------------------------------------------
# Executing one tool (sync and async)


def _tool_frame(call: _Call, c: ToolCallPart) -> Frame:
    scope = f"{call.tool_scope}/tool:{c.id}" if call.tool_scope else f"tool:{c.id}"
    return Frame(call.run, scope, call.frame.span, call.frame.fence, call.frame.trace)


def _unknown_tool(call: _Call, job: _ToolJob) -> ToolResultPart:
    span = _engine.open_span(call.frame.span, call.frame.trace, "tool", job.call.name)
    if _engine._capture():
        span.input = job.arguments
    exc = _UnknownToolError(
        f"the model called tool {job.call.name!r} but this agent has no such tool"
    )
    _engine.fail_span(call.run, span, exc)
    return ToolResultPart(tool_call_id=job.call.id, content="unknown tool", is_error=True)


class _UnknownToolError(Exception):
    pass


_UnknownToolError.__name__ = "UnknownToolError"
_UnknownToolError.__qualname__ = "UnknownToolError"
# As a traceback names it, unchanged since it lived in `agentfn`.
_UnknownToolError.__module__ = "composeai.agentfn"


def _tool_outcome(call: _Call, job: _ToolJob, span, result: Any, exc: BaseException | None):
    if exc is None:
        _engine.close_span(call.run, span, result)
        return ToolResultPart(tool_call_id=job.call.id, content=result)
    if isinstance(exc, _engine._Pause):
        _engine.fail_span(call.run, span, exc)
        return exc
    if isinstance(exc, Exception):
        _engine.fail_span(call.run, span, exc)
        return ToolResultPart(
            tool_call_id=job.call.id, content=f"{type(exc).__name__}: {exc}", is_error=True
        )
    _engine.fail_span(call.run, span, exc)
    raise exc


def _run_tool_sync(call: _Call, job: _ToolJob) -> Any:
    """Executes one tool call in its `tool` span under scope `tool:<id>`;
    returns its result part or the pause it raised."""
    if job.tool is None:
        return _unknown_tool(call, job)
    frame = _tool_frame(call, job.call)
    span = _engine.open_span(frame.span, frame.trace, "tool", job.tool.name)
    if _engine._capture():
        span.input = job.arguments
    inner = Frame(frame.run, frame.scope, span, frame.fence, frame.trace)
    token = FRAME.set(inner)
    try:
        result = _execute_tool_sync(job, inner)
    except BaseException as exc:  # noqa: BLE001 -- becomes a result, a pause, or re-raised
        return _tool_outcome(call, job, span, None, exc)
    finally:
        FRAME.reset(token)
    return _tool_outcome(call, job, span, result, None)


def _execute_tool_sync(job: _ToolJob, frame: Frame) -> str:
    tool = job.tool
    if tool.timeout is None:
        if tool.is_async:
            from . import _runtime

            return _runtime.run_sync(lambda: tool.aexecute(job.arguments))
        return tool.execute(job.arguments)
    if tool.is_async:
        from . import _runtime

        return _runtime.run_sync(lambda: _aexecute_with_timeout(job))
    thread_frame = Frame(
        frame.run, frame.scope, frame.span, _engine.child_fence(frame), frame.trace
    )
    return _engine.run_on_thread(
        lambda: tool.execute(job.arguments),
        thread_frame,
        tool.timeout,
        lambda: _engine.task_timeout_error("@tool", tool.name, tool.timeout, False),
        f"composeai-tool-{tool.name}",
    )


async def _aexecute_with_timeout(job: _ToolJob) -> str:
    import asyncio

    tool = job.tool
    try:
        return await asyncio.wait_for(tool.aexecute(job.arguments), tool.timeout)
    except asyncio.TimeoutError:
        raise _engine.task_timeout_error("@tool", tool.name, tool.timeout, True) from None


async def _run_tool_async(call: _Call, job: _ToolJob) -> Any:
    if job.tool is None:
        return _unknown_tool(call, job)
    frame = _tool_frame(call, job.call)
    span = _engine.open_span(frame.span, frame.trace, "tool", job.tool.name)
    if _engine._capture():
        span.input = job.arguments
    inner = Frame(frame.run, frame.scope, span, frame.fence, frame.trace)
    token = FRAME.set(inner)
    tool = job.tool
    try:
        if tool.is_async:
            if tool.timeout is None:
                result = await tool.aexecute(job.arguments)
            else:
                result = await _aexecute_with_timeout(job)
        else:
            thread_frame = Frame(
                inner.run, inner.scope, inner.span, _engine.child_fence(inner), inner.trace
            )
            result = await _engine.run_on_thread_async(
                lambda: tool.execute(job.arguments),
                thread_frame,
                tool.timeout,
                lambda: _engine.task_timeout_error("@tool", tool.name, tool.timeout, False),
                f"composeai-tool-{tool.name}",
            )
    except BaseException as exc:  # noqa: BLE001 -- becomes a result, a pause, or re-raised
        return _tool_outcome(call, job, span, None, exc)
    finally:
        FRAME.reset(token)
    return _tool_outcome(call, job, span, result, None)
