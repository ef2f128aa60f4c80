"""`@agent`: LLM loops as typed functions (AGENT-1 … AGENT-56).

The loop is written once, as a generator that yields its I/O (model calls,
tool batches, user callbacks) to a driver; the sync driver performs them on
the calling thread, the async driver awaits them on the caller's loop. So
both surfaces run the same logic.
"""

from __future__ import annotations

import functools
import inspect
import json
import threading
import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from . import _codec, _core, _engine
from ._cancel import current_cancel_token
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
    AgentTimeoutError,
    BudgetExceededError,
    ComposeError,
    ConfigError,
    MaxTurnsExceededError,
    ModelRefusalError,
    ProviderError,
    SerializationError,
)
from .events import _BUS
from .messages import Message, StopReason, TextPart, ToolCallPart, ToolResultPart, Usage
from .models import registry as _registry
from .models.base import ModelRequest, new_request
from .runs import Run
from .tracing import Span
from .tracing import _capture_content as _capture

__all__ = ["AgentFunction", "agent", "prompt"]

# `events.current_bus`, called without a Python frame of its own.
_current_bus = _BUS.get

if TYPE_CHECKING:
    from collections.abc import Coroutine
    from typing import Protocol

    import typing_extensions

    from ._streams import AsyncRunStream, RunStream
    from .combinators import Pipeline, Stage
    from .runs import Budget

    # Bare `AgentFunction` means `AgentFunction[..., Any]` (COMP-46).
    P = typing_extensions.ParamSpec("P", default=...)
    R = typing_extensions.TypeVar("R", default=Any)
    _X = TypeVar("_X")
    _Y = TypeVar("_Y")
    _Z = TypeVar("_Z")
    _W = TypeVar("_W")

    class _AgentDecorator(Protocol):
        """Static type of `agent(...)` with options."""

        @overload
        def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> AgentFunction[P, R]: ...
        @overload
        def __call__(self, fn: Callable[P, R], /) -> AgentFunction[P, R]: ...
else:
    P = ParamSpec("P")
    R = TypeVar("R")

_AGENTS: dict[str, AgentFunction] = {}

REPAIR_PROMPT = (
    "Your previous reply did not match the required output schema. Error: {error}\n"
    "Reply again with ONLY a corrected JSON object matching the schema -- no markdown fences, "
    "no commentary."
)


def prompt(text_or_messages: Any) -> Any:
    """Returns its argument unchanged; typed `Any` so a structured-output
    agent's body can return its prompt (AGENT-8)."""
    return text_or_messages


# ---------------------------------------------------------------------------
# Decoration-time analysis


def _signature_types(fn: Callable) -> tuple[Any, Any]:
    """AGENT-6: input = first parameter's annotation, output = return
    annotation (`str` when absent)."""
    import typing

    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 -- unresolvable hints fall back to raw annotations
        hints = dict(getattr(fn, "__annotations__", {}))
    params = list(inspect.signature(fn).parameters.values())
    input_type = hints.get(params[0].name, Any) if params else Any
    output_type = hints.get("return", str)
    return input_type, output_type


def _output_schema(output_type: Any) -> tuple[dict | None, bool]:
    """AGENT-11: the sealed JSON schema sent on every turn, and whether the
    payload is wrapped under `result`."""
    if output_type is str:
        return None, False
    from pydantic import TypeAdapter

    from .tools import seal_schema

    schema = seal_schema(TypeAdapter(output_type).json_schema())
    defs = schema.pop("$defs", None)
    wrapped = schema.get("type") != "object"
    if wrapped:
        schema = {
            "type": "object",
            "properties": {"result": schema},
            "required": ["result"],
            "additionalProperties": False,
        }
    if defs:
        schema["$defs"] = defs
    return schema, wrapped


def _model_label(model: Any) -> tuple[str, str, str | None]:
    """`(label, bare id, provider)` of a model string or instance (AGENT-22)."""
    if isinstance(model, str):
        from .models.registry import parse_model_string

        provider, model_id = parse_model_string(model)
        return model, model_id, provider
    label = getattr(model, "model_id", None) or type(model).__name__
    return label, label, None


def _has(obj: Any, name: str) -> bool:
    return getattr(obj, name, None) is not None


# ---------------------------------------------------------------------------
# Per-call state


class _Call:
    """Everything one agent call needs: the agent, its overrides, where it
    runs, and the loop's progress."""

    def __init__(self, agent: AgentFunction, overrides: dict, frame: Frame, tool_scope: str):
        self.agent = agent
        self.system = overrides["system"] if overrides["system"] is not None else agent.system
        self.model_spec = overrides["model"] if overrides["model"] is not None else agent.model
        self.approver = overrides["approver"]
        self.interceptor = overrides["tool_interceptor"]
        self.context_manager = overrides["context_manager"]
        # A chat's history plus its new user message (CHAT-3): used instead
        # of the body when no snapshot exists (AGENT-20).
        self.seed: list[Message] | None = overrides.get("seed")
        self.frame = frame  # the agent span's frame
        self.tool_scope = tool_scope
        self.snapshot_scope: str | None = None
        # False for a run this call just created: it has no snapshot to load.
        self.restorable = True
        self.messages: list[Message] = []
        self.turn = 0
        self.partial: dict[str, ToolResultPart] = {}
        self.fallback_active = False
        self.model: Any = None
        self.started = time.monotonic()
        self.last_input_tokens = 0

    @property
    def run(self) -> RunState | None:
        return self.frame.run

    @property
    def durable(self) -> bool:
        return self.frame.run is not None and self.snapshot_scope is not None

    def resolve_model(self) -> None:
        spec = self.model_spec
        if spec is None:
            from .models.registry import resolve

            resolve(None)  # type: ignore[arg-type]  # deliberately: raises the PROV-2 type error
        self.model = self._resolve(spec)
        self.label, self.model_id, self.provider = _model_label(spec)

    def _resolve(self, spec: Any) -> Any:
        model = _registry.resolve(spec)
        if self.agent.cache:
            from .models._cache import CachingModel

            model = CachingModel(model)
        return model

    def use_fallback(self) -> bool:
        fallback = self.agent.fallback
        if fallback is None or self.fallback_active:
            return False
        self.model = self._resolve(fallback)
        self.label, self.model_id, self.provider = _model_label(fallback)
        self.fallback_active = True
        self.frame.span.attributes["fallback_used"] = self.label
        return True

    def snapshot_row(self) -> tuple:
        partial = _codec.dumps(self.partial) if self.partial else None
        return (self.snapshot_scope, _codec.dumps(self.messages), partial, self.turn)


# ---------------------------------------------------------------------------
# The loop


def _check_cancel() -> None:
    token = current_cancel_token()
    if token is not None and token.cancelled:
        raise _engine._Cancelled()


def _extract(agent: AgentFunction, response: Any) -> Any:
    """AGENT-10/12: the output of an END_TURN reply."""
    if agent._schema is None:
        return response.message.text
    payload = response.parsed
    if payload is None:
        try:
            payload = json.loads(response.message.text)
        except ValueError:
            raise ComposeError(
                f"@agent {agent.name!r}: model returned no structured payload (response.parsed "
                "was unset and the message text is not valid JSON)"
            ) from None
    if agent._wrapped:
        if not isinstance(payload, dict) or "result" not in payload:
            raise ComposeError(
                f"@agent {agent.name!r}: model returned no structured payload (expected a JSON "
                "object with a 'result' key)"
            )
        payload = payload["result"]
    from pydantic import TypeAdapter, ValidationError

    try:
        return TypeAdapter(agent.output_type).validate_python(payload)
    except ValidationError as exc:
        raise ComposeError(
            f"@agent {agent.name!r}: model output failed validation for "
            f"{agent.output_type!r}: {exc}"
        ) from None


def _loop(call: _Call, first: Any = None) -> Generator[tuple, Any, Any]:
    """The agent loop (AGENT-20 … AGENT-24). Yields I/O effects:
    `("model", request)`, `("tools", batch)`, `("callback", fn, args)`.
    `first`: the reply of a first turn already made (see `_direct_turn`)."""
    agent = call.agent
    repairs = 0
    if first is None and call.messages and _pending_calls(call.messages[-1]):
        yield from _tool_batch(call, _pending_calls(call.messages[-1]))
    while True:
        if first is not None:
            response, first = first, None
        else:
            response = yield from _next_turn(call)
        stop = response.stop_reason
        if stop == StopReason.TOOL_USE:
            calls = _pending_calls(response.message)
            if not calls:
                raise ComposeError(
                    f"@agent {agent.name!r}: the model returned stop_reason=TOOL_USE but the "
                    "response contained no tool call parts (a provider/adapter bug) -- refusing "
                    "to append an empty tool-results message"
                )
            yield from _tool_batch(call, calls)
            continue
        if stop == StopReason.MAX_TOKENS:
            message = (
                f"@agent {agent.name!r} hit max_tokens={agent.max_tokens} before finishing its "
                "response; raise max_tokens to give it more room"
            )
            reasoning = response.usage.reasoning_tokens
            if reasoning:
                message += (
                    f" (it spent {reasoning} tokens on internal reasoning before any visible "
                    "output -- reasoning models can need a much larger max_tokens)"
                )
            raise ComposeError(message)
        if stop == StopReason.REFUSAL:
            raise ModelRefusalError(
                f"@agent {agent.name!r}: the model refused to respond",
                raw=response.raw_stop_reason,
            )
        if stop == StopReason.END_TURN:
            try:
                return _extract(agent, response)
            except ComposeError as exc:
                if repairs >= agent.max_repairs:
                    raise
                repairs += 1
                call.frame.span.attributes.setdefault("repairs", []).append(str(exc))
                call.messages.append(Message.user(REPAIR_PROMPT.format(error=exc)))
                continue
        raise ComposeError(
            f"@agent {agent.name!r}: unhandled stop_reason {stop!r} "
            f"(raw={response.raw_stop_reason!r})"
        )


def _next_turn(call: _Call) -> Generator[tuple, Any, Any]:
    """The checks at a turn's start, then the turn's model call; the reply
    is appended to the conversation."""
    agent = call.agent
    _check_cancel()
    call.turn += 1
    if agent.max_turns is not None and call.turn > agent.max_turns:
        raise MaxTurnsExceededError(
            f"@agent {agent.name!r} exceeded max_turns={agent.max_turns} (it kept calling "
            "tools/turns without finishing; raise max_turns if this agent legitimately needs "
            "more)"
        )
    if agent.timeout is not None and time.monotonic() - call.started > agent.timeout:
        raise AgentTimeoutError(
            f"@agent {agent.name!r} exceeded timeout={agent.timeout}s (checked at turn "
            "boundaries only; an in-flight model call is never interrupted)"
        )
    if call.context_manager is not None:
        managed = yield (
            "callback",
            call.context_manager,
            (list(call.messages), call.last_input_tokens),
        )
        if not isinstance(managed, list) or not all(isinstance(m, Message) for m in managed):
            raise ConfigError("context_manager must return list[Message]")
        call.messages = list(managed)
    response = yield from _llm_call(call)
    call.messages.append(response.message)
    return response


def _pending_calls(message: Message) -> list[ToolCallPart]:
    if message.role != "assistant":
        return []
    return [p for p in message.parts if isinstance(p, ToolCallPart)]


def _llm_call(call: _Call) -> Generator[tuple, Any, Any]:
    """One model call in an `llm` span, with retries, fallback and the
    budget check (AGENT-22, AGENT-23, BUDGET-4)."""
    agent = call.agent
    if call.run is not None:
        # An LLM turn is a durable boundary for cancel requests (EXT-10).
        _core.check_cancel(call.run.attempt, False)
    while True:
        span, request, input_json = _open_llm(call)
        attempts = 0
        while True:
            try:
                response = yield ("model", call, request, span)
                _check_reply(response)
                break
            except ProviderError as exc:
                failure, again = _record_failure(agent, span, exc, attempts)
                if again:
                    attempts += 1
                    if failure.get("delay"):
                        yield ("callback", time.sleep, (failure["delay"],))
                    continue
                _engine.fail_span(call.run, span, exc)
                if call.use_fallback():
                    break
                raise
            except BaseException as exc:
                _engine.fail_span(call.run, span, exc)
                raise
        if span.status == "error":
            continue  # retry the turn once against the fallback
        _llm_done(call, span, response, input_json)
        return response


def _direct_turn(call: _Call) -> Any:
    """The first turn of a call made on the calling thread, without the
    loop's effect machinery: the checks of `_next_turn`, then `_llm_call`
    for an agent with no retries, no fallback, no timeout and no turn limit
    below 1, whose model answers `complete`. The reply is appended to the
    conversation."""
    _check_cancel()
    call.turn += 1
    run = call.frame.run
    if run is not None:
        _core.check_cancel(run.attempt, False)
    span, request, input_json = _open_llm(call)
    try:
        response = call.model.complete(request)
        _check_reply(response)
    except ProviderError as exc:
        _record_failure(call.agent, span, exc, 0)
        _engine.fail_span(call.run, span, exc)
        raise
    except BaseException as exc:
        _engine.fail_span(call.run, span, exc)
        raise
    _llm_done(call, span, response, input_json)
    call.messages.append(response.message)
    return response


def _open_llm(call: _Call) -> tuple:
    """A model call's `llm` span, its request, and its stored input."""
    agent = call.agent
    span = _engine.open_span(call.frame.span, call.frame.trace, "llm", call.label)
    span.attributes["model"] = call.model_id
    if call.provider is not None:
        span.attributes["provider"] = call.provider
    request = new_request(
        call.model_id,
        list(call.messages),
        call.system,
        agent._tool_specs,
        agent._schema,
        agent.max_tokens,
        agent.temperature,
        call.provider,
        agent.prompt_cache,
        agent.thinking,
        agent.effort,
        agent.thinking_budget,
    )
    input_json = None
    if _engine._capture():
        span.input = {"system": call.system, "messages": list(call.messages)}
        input_json = _llm_input_json(call.system, span.input["messages"])
    return span, request, input_json


def _check_reply(response: Any) -> None:
    if response.stop_reason == StopReason.ERROR:
        raise ProviderError(f"model returned stop_reason=ERROR (raw={response.raw_stop_reason!r})")


def _record_failure(agent: AgentFunction, span, exc: ProviderError, attempts: int) -> tuple:
    """Records a failed model call on its span; `(failure, whether to call again)`."""
    failure: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    policy = agent.retry
    if policy is None:
        again = attempts < agent.retries
    else:
        again = attempts + 1 < policy.max_attempts and policy.retries(exc)
        failure["delay"] = policy.delay(attempts + 2) if again else 0.0
    span.attributes.setdefault("retries", []).append(failure)
    return failure, again


def _llm_done(call: _Call, span, response: Any, input_json: str | None) -> None:
    """A model call that replied: usage, the budget check, the span closed."""
    span.usage = response.usage
    if getattr(call.model, "last_was_hit", False):
        span.attributes["cached"] = True
    call.last_input_tokens = response.usage.input_tokens
    try:
        _charge_budgets(response.usage)
    except BudgetExceededError as exc:
        span.output = response.message if _engine._capture() else None
        _engine.fail_span(call.run, span, exc)
        raise
    _close_llm_span(call, span, response.message, input_json)


# ---------------------------------------------------------------------------
# The llm span's row, written without the general encoder where the text is
# known to be the same (byte for byte what `_engine.span_row` would write)


_encode_str = json.encoder.encode_basestring
_MESSAGE_HEAD = '{"$kind":"pydantic","$type":"composeai.messages:Message","value":{"role":"'


def _message_json(message: Any) -> str | None:
    """`_codec.dumps_lenient(message)` of a message of text parts (the usual
    reply and prompt); None for any other value."""
    if type(message) is not Message:
        return None
    texts = []
    for part in message.parts:
        if type(part) is not TextPart:
            return None
        texts.append('{"type":"text","text":' + _encode_str(part.text) + "}")
    text = _MESSAGE_HEAD + message.role + '","parts":[' + ",".join(texts) + "]}}"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: the codec escapes it
            return None
    return text


def _llm_input_json(system: str | None, messages: list) -> str:
    """The llm span's input `{"system": ..., "messages": [...]}` as stored."""
    parts = []
    for m in messages:
        text = _message_json(m)
        if text is None:
            return _codec.dumps_lenient({"system": system, "messages": messages})
        parts.append(text)
    return '{"system":' + _system_json(system) + ',"messages":[' + ",".join(parts) + "]}"


# An agent's system prompt is the same string call after call: its JSON is kept.
_SYSTEM_JSON: dict[str, str] = {}


def _system_json(system: str | None) -> str:
    if system is None:
        return "null"
    if type(system) is not str:
        return _codec.dumps_lenient(system)
    return _kept_json(_SYSTEM_JSON, system, system)


# Attribute sets an agent writes on every llm span ({"model": ..., "provider": ...}).
_ATTRIBUTES_JSON: dict[tuple, str] = {}


def _attributes_json(attributes: dict) -> str | None:
    if not attributes:
        return None
    if len(attributes) <= 2:
        key = tuple(attributes.items())
        for _, value in key:
            if type(value) is not str:
                return _codec.dumps_lenient(attributes)
        return _kept_json(_ATTRIBUTES_JSON, key, attributes)
    return _codec.dumps_lenient(attributes)


def _kept_json(kept: dict, key: Any, value: Any) -> str:
    """`_codec.dumps_lenient(value)`, kept in `kept` under `key` (at most 256 kept)."""
    text = kept.get(key)
    if text is None:
        if len(kept) >= 256:
            kept.clear()
        text = kept[key] = _codec.dumps_lenient(value)
    return text


def _close_llm_span(call: _Call, span, message: Message, input_json: str | None) -> None:
    """`_engine.close_span` of a durable run's llm span, its row built here."""
    run = call.frame.run
    if run is None or _current_bus() is not None:
        _engine.close_span(run, span, message)
        return
    span.ended_at = time.time()
    span.status = "ok"
    output_json = None
    if _engine._capture():
        span.output = message
        output_json = _message_json(message) or _codec.dumps_lenient(message)
    else:
        input_json = None
    usage = span.usage
    # The row `_engine.span_row` builds (the layout src/py/spans.rs reads).
    run.attempt.span(
        (
            span.span_id,
            span.parent_span_id,
            "llm",
            span.name,
            span.started_at,
            span.ended_at,
            "ok",
            False,
            None,
            _attributes_json(span.attributes),
            None
            if usage is None
            else (
                usage.input_tokens,
                usage.output_tokens,
                usage.cache_read_tokens,
                usage.cache_creation_tokens,
                usage.reasoning_tokens,
                usage.cost_usd,
                usage.cost_complete,
            ),
            None,
            input_json,
            output_json,
        )
    )


def _charge_budgets(usage: Usage) -> None:
    meters = BUDGETS.get()
    if not meters:
        return
    tokens = usage.input_tokens + usage.output_tokens
    exceeded = None
    for meter in meters:
        message = meter.charge(tokens, usage.cost_usd)
        if message is not None and exceeded is None:
            exceeded = message
    if exceeded is not None:
        raise BudgetExceededError(exceeded)


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
    """A refused call: an error result and a `tool` span with status ok (AGENT-44)."""
    span = _engine.open_span(call.frame.span, call.frame.trace, "tool", c.name)
    if _engine._capture():
        span.input = c.arguments
    _engine.close_span(call.run, span, content)
    return ToolResultPart(tool_call_id=c.id, content=content, is_error=True)


def _gated_call(call: _Call, c: ToolCallPart, arguments: dict) -> Generator[tuple, Any, Any]:
    """AGENT-41: look up the journaled answer, ask the approver, or pause.
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


# ---------------------------------------------------------------------------
# Drivers


def _invoke_model_sync(call: _Call, request: ModelRequest, span) -> Any:
    model = call.model
    if _current_bus() is not None:
        if _has(model, "stream"):
            return _consume_stream(call, model.stream(request), span)
        if _has(model, "astream"):
            from . import _runtime

            return _runtime.run_sync(lambda: _aconsume_stream(call, model.astream(request), span))
    if not _has(model, "complete") and _has(model, "acomplete"):
        from . import _runtime

        return _runtime.run_sync(lambda: model.acomplete(request))
    return model.complete(request)


def _emit_stream_event(call: _Call, event: Any, span) -> None:
    from .events import Event, emit

    kind = event.kind
    if kind in ("text_delta", "thinking_delta"):
        emit(
            Event(
                kind, trace_id=span.trace_id, span_id=span.span_id, name=call.label, text=event.text
            )
        )
    elif kind in ("tool_call_started", "tool_args_delta", "tool_call_finished"):
        emit(
            Event(
                kind,
                trace_id=span.trace_id,
                span_id=span.span_id,
                name=event.tool_name,
                text=event.text if kind == "tool_args_delta" else None,
                data={"id": event.tool_call_id},
            )
        )


def _stream_missing_done(call: _Call) -> ComposeError:
    return ComposeError(
        f"Model.stream() for '{call.label}' ended without yielding a response_done event -- "
        "adapters must always yield exactly one, as their final event"
    )


def _consume_stream(call: _Call, events, span) -> Any:
    response = None
    try:
        for event in events:
            _check_cancel()
            if event.kind == "response_done":
                response = event.response
                break
            _emit_stream_event(call, event, span)
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()
    if response is None:
        raise _stream_missing_done(call)
    return response


def _run_batch_sync(call: _Call, jobs: list[_ToolJob]) -> list[Any]:
    """Runs a tool batch concurrently, one thread per call beyond the first
    (a tool may block or call other agents, so no shared pool: ASYNC-7)."""
    if len(jobs) == 1:
        return [_run_tool_sync(call, jobs[0])]
    from contextvars import copy_context

    outcomes: list[Any] = [None] * len(jobs)
    errors: list[BaseException | None] = [None] * len(jobs)

    def work(i: int) -> None:
        try:
            outcomes[i] = _run_tool_sync(call, jobs[i])
        except BaseException as exc:  # noqa: BLE001 -- re-raised by the waiting side
            errors[i] = exc

    threads = []
    for i in range(1, len(jobs)):
        ctx = copy_context()
        t = threading.Thread(target=ctx.run, args=(work, i), name="composeai-tool", daemon=True)
        t.start()
        threads.append(t)
    work(0)
    for t in threads:
        t.join()
    for err in errors:
        if err is not None:
            raise err
    return outcomes


def _perform_sync(effect: tuple) -> Any:
    kind = effect[0]
    if kind == "model":
        _, call, request, span = effect
        return _invoke_model_sync(call, request, span)
    if kind == "tools":
        _, call, jobs = effect
        return _run_batch_sync(call, jobs)
    _, fn, args = effect
    return fn(*args)


def _drive_sync(gen: Generator) -> Any:
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = gen.send(value) if error is None else gen.throw(error)
        except StopIteration as stop:
            return stop.value
        value, error = None, None
        try:
            value = _perform_sync(effect)
        except BaseException as exc:  # noqa: BLE001 -- thrown back into the loop
            error = exc


async def _invoke_model_async(call: _Call, request: ModelRequest, span) -> Any:
    model = call.model
    streaming = _current_bus() is not None
    if streaming and _has(model, "astream"):
        return await _aconsume_stream(call, model.astream(request), span)
    if streaming and _has(model, "stream"):
        return await _off_loop(lambda: _consume_stream(call, model.stream(request), span))
    if _has(model, "acomplete"):
        return await model.acomplete(request)
    return await _off_loop(lambda: model.complete(request))


async def _aconsume_stream(call: _Call, events, span) -> Any:
    """The async twin of `_consume_stream`: a cancel seen between events
    stops here, and the model's stream is closed before anything else runs."""
    response = None
    try:
        async for event in events:
            _check_cancel()
            if event.kind == "response_done":
                response = event.response
                break
            _emit_stream_event(call, event, span)
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
    if response is None:
        raise _stream_missing_done(call)
    return response


async def _off_loop(fn: Callable[[], Any]) -> Any:
    """Runs a sync call (model, callback) on a thread of its own, with a
    fence of its own so that abandoning it revokes nothing else."""
    frame = FRAME.get()
    if frame is not None:
        frame = Frame(frame.run, frame.scope, frame.span, _engine.child_fence(frame), frame.trace)
    return await _engine.run_on_thread_async(
        fn, frame, None, lambda: RuntimeError("unreachable"), "composeai-offloop"
    )


async def _perform_async(effect: tuple) -> Any:
    kind = effect[0]
    if kind == "model":
        _, call, request, span = effect
        return await _invoke_model_async(call, request, span)
    if kind == "tools":
        import asyncio

        _, call, jobs = effect
        return list(await asyncio.gather(*(_run_tool_async(call, job) for job in jobs)))
    _, fn, args = effect
    return await _off_loop(lambda: fn(*args))


async def _drive_async(gen: Generator) -> Any:
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = gen.send(value) if error is None else gen.throw(error)
        except StopIteration as stop:
            return stop.value
        value, error = None, None
        try:
            value = await _perform_async(effect)
        except BaseException as exc:  # noqa: BLE001 -- thrown back into the loop
            error = exc


# ---------------------------------------------------------------------------
# Starting the loop: seed, body, snapshot


def _seed_from_body(agent: AgentFunction, result: Any) -> list[Message]:
    if isinstance(result, str):
        return [Message.user(result)]
    if isinstance(result, list) and all(isinstance(m, Message) for m in result):
        return list(result)
    raise ConfigError(
        f"@agent function {agent.name!r} must return a str (the user prompt) or a "
        f"list[Message] (the full conversation) from its body, got {type(result)!r}"
    )


def _restore(call: _Call) -> bool:
    """Loads the call's snapshot, if any (AGENT-53)."""
    if not call.restorable or not call.durable:
        return False
    assert call.run is not None  # `durable` says so
    row = call.run.attempt.load_agent_state(call.snapshot_scope)
    if row is None:
        return False
    messages_json, partial_json, turn = row
    call.messages = list(_codec.loads(messages_json))
    call.partial = dict(_codec.loads(partial_json)) if partial_json else {}
    call.turn = turn
    return True


def _restore_or_seed(call: _Call) -> bool:
    """AGENT-20: the conversation from a snapshot, else from a chat's seed;
    False when the body must provide it."""
    if _restore(call):
        return True
    if call.seed is not None:
        call.messages = list(call.seed)
        return True
    return False


def _agent_loop_sync(call: _Call, args: tuple, kwargs: dict) -> Any:
    driver = _engine.driven_synchronously()
    try:
        return _agent_loop_sync_body(call, args, kwargs)
    finally:
        _engine.ASYNC_DRIVER.reset(driver)


def _agent_loop_sync_body(call: _Call, args: tuple, kwargs: dict) -> Any:
    agent = call.agent
    call.resolve_model()
    if not _restore_or_seed(call):
        if agent._is_async:
            from . import _runtime

            body = _runtime.run_sync(lambda: agent.fn(*args, **kwargs))
        else:
            body = agent.fn(*args, **kwargs)
            if type(body) is not str and inspect.iscoroutine(body):
                from . import _runtime

                body = _runtime.run_sync(lambda: body)
        call.messages = [Message.user(body)] if type(body) is str else _seed_from_body(agent, body)
    # `_direct_turn` makes the first turn when nothing could make the loop
    # call the model again or act before the call.
    if (
        call.turn == 0
        and agent.retries == 0
        and agent.retry is None
        and agent.fallback is None
        and agent.timeout is None
        and (agent.max_turns is None or agent.max_turns >= 1)
        and call.context_manager is None
        and _current_bus() is None
        and _has(call.model, "complete")
        and not (call.messages and _pending_calls(call.messages[-1]))
    ):
        response = _direct_turn(call)
        if response.stop_reason == StopReason.END_TURN and agent._schema is None:
            return response.message.text
        return _drive_sync(_loop(call, response))
    return _drive_sync(_loop(call))


async def _agent_loop_async(call: _Call, args: tuple, kwargs: dict) -> Any:
    driver = _engine.driven_by_running_loop()
    try:
        return await _agent_loop_async_body(call, args, kwargs)
    finally:
        _engine.ASYNC_DRIVER.reset(driver)


async def _agent_loop_async_body(call: _Call, args: tuple, kwargs: dict) -> Any:
    call.resolve_model()
    if not _restore_or_seed(call):
        agent = call.agent
        body = agent.fn(*args, **kwargs)
        if inspect.iscoroutine(body):
            body = await body
        call.messages = _seed_from_body(agent, body)
    return await _drive_async(_loop(call))


# ---------------------------------------------------------------------------
# AgentFunction


def _overrides(budget, system, model, approver, tool_interceptor, context_manager) -> dict:
    return {
        "budget": budget,
        "system": system,
        "model": model,
        "approver": approver,
        "tool_interceptor": tool_interceptor,
        "context_manager": context_manager,
    }


class AgentFunction(Generic[P, R]):
    """An LLM loop behind a typed function (AGENT-1)."""

    def __init__(self, fn: Callable[..., Any], **options: Any):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name: str = options["name"]
        self.model = options["model"]
        self.tools = tuple(options["tools"])
        self.temperature = options["temperature"]
        self.max_tokens = options["max_tokens"]
        self.max_turns = options["max_turns"]
        self.retries = options["retries"]
        # A `RetryPolicy` for provider calls (EXT-9); None: `retries`.
        self.retry = options.get("retry")
        self.max_repairs = options["max_repairs"]
        self.timeout = options["timeout"]
        self.prompt_cache = options["prompt_cache"]
        self.thinking = options["thinking"]
        self.effort = options["effort"]
        self.thinking_budget = options["thinking_budget"]
        self.fallback = options["fallback"]
        self.cache = options["cache"]
        doc = fn.__doc__
        self.system = inspect.cleandoc(doc) if doc and doc.strip() else None
        self.input_type, self.output_type = _signature_types(fn)
        self._is_async = inspect.iscoroutinefunction(fn)
        self._schema, self._wrapped = _output_schema(self.output_type)
        self._tool_map = {t.name: t for t in self.tools}
        self._tool_specs = [t.spec for t in self.tools] or None

    def __repr__(self) -> str:
        return f"<AgentFunction {self.name!r}>"

    # `>>` type-checks only for agents callable with one positional argument (COMP-43).
    def __rshift__(self: Stage[_X, _Y], other: Stage[_Y, _Z]) -> Pipeline[_X, _Z]:
        from .combinators import chain

        return chain(self, other)

    def __rrshift__(self: Stage[_X, _Y], other: Stage[_W, _X]) -> Pipeline[_W, _Y]:
        from .combinators import chain

        return chain(other, self)

    # -- routing (AGENT-50) ------------------------------------------------

    # Direct calls are checked against the body's parameters (COMP-40); a call passing an
    # override keyword (AGENT-48) matches one of the looser variants instead.
    @overload
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...
    @overload
    def __call__(self, *args: Any, budget: Budget | None, **kwargs: Any) -> R: ...
    @overload
    def __call__(self, *args: Any, system: str | None, **kwargs: Any) -> R: ...
    @overload
    def __call__(self, *args: Any, model: Any, **kwargs: Any) -> R: ...
    @overload
    def __call__(self, *args: Any, approver: Any, **kwargs: Any) -> R: ...
    @overload
    def __call__(self, *args: Any, tool_interceptor: Any, **kwargs: Any) -> R: ...
    @overload
    def __call__(self, *args: Any, context_manager: Any, **kwargs: Any) -> R: ...
    def __call__(
        self,
        *args: Any,
        budget: Any = None,
        # Any: the first overload passes the body's own keywords, whatever their types.
        system: Any = None,
        model: Any = None,
        approver: Any = None,
        tool_interceptor: Any = None,
        context_manager: Any = None,
        **kwargs: Any,
    ) -> R:
        opts = _overrides(budget, system, model, approver, tool_interceptor, context_manager)
        return self._run_sync(args, kwargs, opts, want_run=False)

    def run(
        self,
        *args: Any,
        budget: Any = None,
        system: str | None = None,
        model: Any = None,
        approver: Any = None,
        tool_interceptor: Any = None,
        context_manager: Any = None,
        **kwargs: Any,
    ) -> Run[R]:
        opts = _overrides(budget, system, model, approver, tool_interceptor, context_manager)
        return self._run_sync(args, kwargs, opts, want_run=True)

    async def arun(
        self,
        *args: Any,
        budget: Any = None,
        system: str | None = None,
        model: Any = None,
        approver: Any = None,
        tool_interceptor: Any = None,
        context_manager: Any = None,
        **kwargs: Any,
    ) -> Run[R]:
        opts = _overrides(budget, system, model, approver, tool_interceptor, context_manager)
        return await self._run_async(args, kwargs, opts)

    def stream(self, *args: Any, **kwargs: Any) -> RunStream[R]:
        from ._streams import RunStream

        return RunStream.start(lambda: self.run(*args, **kwargs), cancellable=True)

    def astream(self, *args: Any, **kwargs: Any) -> AsyncRunStream[R]:
        from ._streams import AsyncRunStream

        return AsyncRunStream.start(lambda: self.arun(*args, **kwargs))

    def _run_sync(self, args: tuple, kwargs: dict, opts: dict, want_run: bool) -> Any:
        _engine.check_sync_facade()
        frame = FRAME.get()
        if frame is not None and frame.run is not None and frame.run.kind in ("flow", "graph"):
            result = self._flow_step(frame, args, kwargs, opts)
        elif frame is None or frame.span is None:
            if _plain_standalone(self, opts):
                result = _standalone_plain(self, args, kwargs, opts)
            else:
                result = _standalone_sync(self, args, kwargs, opts)
        else:
            result = self._nested_sync(frame, args, kwargs, opts)
        return result if want_run else result.output

    async def _run_async(self, args: tuple, kwargs: dict, opts: dict) -> Run[R]:
        frame = FRAME.get()
        if frame is not None and frame.run is not None and frame.run.kind in ("flow", "graph"):
            return await self._aflow_step(frame, args, kwargs, opts)
        if frame is None or frame.span is None:
            return await _standalone_async(self, args, kwargs, opts)
        return await self._nested_async(frame, args, kwargs, opts)

    # -- in a flow (AGENT-51) ---------------------------------------------

    def _step_budget(self, frame: Frame, key: str, opts: dict):
        budget = opts["budget"]
        if budget is None:
            return None
        assert frame.run is not None  # a step of a flow's run
        baseline = frame.run.attempt.prior_llm_usage(key)
        return _engine.budget_meter(budget, "agent", self.name, baseline)

    def _flow_step(self, frame: Frame, args: tuple, kwargs: dict, opts: dict) -> Run[R]:
        holder: dict[str, Any] = {}

        def execute(inner: Frame, a: tuple, k: dict) -> Any:
            call = _Call(self, opts, inner, frame.scope)
            call.snapshot_scope = inner.scope
            holder["call"] = call
            meter = self._step_budget(frame, inner.scope, opts)
            token = _push_budget(meter)
            try:
                return _agent_loop_sync(call, a, k)
            finally:
                _pop_budget(token)

        output = _engine.journaled_step(frame, "agent", self.name, execute, args, kwargs)
        return self._step_run(frame, holder, output)

    async def _aflow_step(self, frame: Frame, args: tuple, kwargs: dict, opts: dict) -> Run[R]:
        holder: dict[str, Any] = {}

        async def execute(inner: Frame, a: tuple, k: dict) -> Any:
            call = _Call(self, opts, inner, frame.scope)
            call.snapshot_scope = inner.scope
            holder["call"] = call
            meter = self._step_budget(frame, inner.scope, opts)
            token = _push_budget(meter)
            try:
                return await _agent_loop_async(call, a, k)
            finally:
                _pop_budget(token)

        output = await _engine.ajournaled_step(frame, "agent", self.name, execute, args, kwargs)
        return self._step_run(frame, holder, output)

    def _step_run(self, frame: Frame, holder: dict, output: Any) -> Run[R]:
        call = holder.get("call")
        if call is None:  # replayed (FLOW-16)
            return Run(
                id=_core.ulid(),
                status="completed",
                output=output,
                usage=None,
                trace=frame.trace,
                messages=[],
            )
        return Run(
            id=_core.ulid(),
            status="completed",
            output=output,
            usage=_engine.subtree_usage(frame.trace, call.frame.span),
            trace=frame.trace,
            messages=list(call.messages),
        )

    # -- nested plain run (no row) -----------------------------------------

    def _nested_open(self, frame: Frame, args: tuple, kwargs: dict, opts: dict) -> _Call:
        span = _engine.open_span(frame.span, frame.trace, "agent", self.name)
        if _engine._capture():
            span.input = {"args": list(args), "kwargs": kwargs}
        inner = Frame(frame.run, frame.scope, span, frame.fence, frame.trace)
        call = _Call(self, opts, inner, frame.scope)
        if frame.run is not None:
            # Inside a durable run (e.g. a tool body, which re-runs from its
            # start on resume) the k-th call of this agent in this scope
            # keeps its snapshot under a deterministic key.
            call.snapshot_scope = frame.run.attempt.next_key(frame.scope, self.name, frame.fence)
        return call

    def _nested_done(self, call: _Call, output: Any) -> Run[R]:
        _engine.close_span(call.run, call.frame.span, output)
        return Run(
            id=_core.ulid(),
            status="completed",
            output=output,
            usage=_engine.subtree_usage(call.frame.trace, call.frame.span),
            trace=call.frame.trace,
            messages=list(call.messages),
        )

    def _nested_sync(self, frame: Frame, args: tuple, kwargs: dict, opts: dict) -> Run[R]:
        call = self._nested_open(frame, args, kwargs, opts)
        token = FRAME.set(call.frame)
        budget_token = _push_budget(_engine.budget_meter(opts["budget"], "agent", self.name))
        try:
            output = _agent_loop_sync(call, args, kwargs)
        except BaseException as exc:
            _engine.fail_span(call.run, call.frame.span, exc)
            raise
        finally:
            _pop_budget(budget_token)
            FRAME.reset(token)
        return self._nested_done(call, output)

    async def _nested_async(self, frame: Frame, args: tuple, kwargs: dict, opts: dict) -> Run[R]:
        call = self._nested_open(frame, args, kwargs, opts)
        token = FRAME.set(call.frame)
        budget_token = _push_budget(_engine.budget_meter(opts["budget"], "agent", self.name))
        try:
            output = await _agent_loop_async(call, args, kwargs)
        except BaseException as exc:
            _engine.fail_span(call.run, call.frame.span, exc)
            raise
        finally:
            _pop_budget(budget_token)
            FRAME.reset(token)
        return self._nested_done(call, output)


def _push_budget(meter: Any):
    if meter is None:
        return None
    return BUDGETS.set(BUDGETS.get() + (meter,))


def _pop_budget(token: Any) -> None:
    if token is not None:
        BUDGETS.reset(token)


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
        "agent", agent.name, None, args_json, budget_json, queued=True
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
    one straight line: the same rows, spans, events and `Run` (AGENT-52,
    OBS-5), without the settlement plan's machinery, the budget scopes and
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
    # `_engine.settle_completed(..., lenient=True)`, written out.
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
        usage = _engine.subtree_usage(trace, root)
    return Run(
        id=run.run_id,
        status="completed",
        output=output,
        usage=_engine.rollup_usage(trace) if usage is None else usage,
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
        outcome = await _engine.asettle_interrupted(
            run, call.frame.span, exc, cancelled_status="cancelled"
        )
        return _engine.make_run_result(run, outcome)
    finally:
        _pop_budget(budget_token)
        FRAME.reset(token)
    outcome = await _engine.asettle_completed(run, call.frame.span, output, lenient=True)
    return _standalone_result(call, outcome)


async def _astandalone_start(agent: AgentFunction, args: tuple, kwargs: dict, opts: dict):
    """`_standalone_start` for an async caller: a server-backed store creates
    the row off the loop (SQLite queues it without I/O)."""
    if (await _engine.aget_store()).kind == "sqlite":
        return _standalone_start(agent, args, kwargs, opts)
    budget = opts["budget"]
    attempt = await _engine.astart_run(
        "agent",
        agent.name,
        None,
        _standalone_payload(args, kwargs, opts),
        None if budget is None else _engine.budget_json(budget),
    )
    meter = None if budget is None else _engine.budget_meter(budget, "agent", agent.name)
    return _engine.RunState(attempt, agent.name), meter


def _standalone_result(call: _Call, outcome: tuple) -> Run:
    run, root = call.run, call.frame.span
    assert run is not None  # a standalone call's frame has its run
    return _engine.make_run_result(
        run, outcome, _engine.subtree_usage(run.trace, root), list(call.messages)
    )


def _settle_standalone_ok(call: _Call, output: Any) -> Run:
    assert call.run is not None  # a standalone call's frame has its run
    outcome = _engine.settle_completed(call.run, call.frame.span, output, lenient=True)
    return _standalone_result(call, outcome)


def _settle_standalone_error(call: _Call, exc: BaseException) -> Run:
    run = call.run
    assert run is not None  # a standalone call's frame has its run
    outcome = _engine.settle_interrupted(run, call.frame.span, exc, cancelled_status="cancelled")
    return _engine.make_run_result(run, outcome)


def run_seeded(agent: AgentFunction, seed: list[Message], opts: dict) -> Run:
    """A standalone durable run whose conversation is `seed`; the agent body
    is not called (CHAT-3)."""
    _engine.check_sync_facade()
    return _standalone_sync(agent, (), {}, {**opts, "seed": seed})


def resume_standalone(
    row: dict, answers, budget, approver, tool_interceptor, context_manager, asynchronous: bool
):
    """AGENT-54: continue a paused or crashed standalone agent run."""
    run_id = row["run_id"]
    if row["status"] == "completed":
        return completed_run(row)
    agent = _AGENTS.get(row["name"])
    if agent is None:
        raise ConfigError(agent_not_registered(row["name"]))

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


# ---------------------------------------------------------------------------
# @agent


@overload
def agent(fn: Callable[P, Coroutine[Any, Any, R]], /) -> AgentFunction[P, R]: ...
@overload
def agent(fn: Callable[P, R], /) -> AgentFunction[P, R]: ...
@overload
def agent(
    *,
    model: Any = None,
    tools: Any = (),
    temperature: float | None = None,
    max_tokens: int = 16000,
    max_turns: int | None = 10,
    retries: int = 0,
    max_repairs: int = 0,
    timeout: float | None = None,
    prompt_cache: bool = True,
    thinking: bool | None = None,
    effort: str | None = None,
    thinking_budget: int | None = None,
    fallback: Any = None,
    cache: bool = False,
    name: str | None = None,
    replace: bool = False,
    retry: Any = None,
) -> _AgentDecorator: ...
def agent(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    model: Any = None,
    tools: Any = (),
    temperature: float | None = None,
    max_tokens: int = 16000,
    max_turns: int | None = 10,
    retries: int = 0,
    max_repairs: int = 0,
    timeout: float | None = None,
    prompt_cache: bool = True,
    thinking: bool | None = None,
    effort: str | None = None,
    thinking_budget: int | None = None,
    fallback: Any = None,
    cache: bool = False,
    name: str | None = None,
    replace: bool = False,
    retry: Any = None,
):
    """Declares an LLM agent, bare or with keyword options (AGENT-1 … AGENT-4);
    `retry=RetryPolicy(...)` governs provider-call retries (EXT-9)."""

    def decorate(f: Callable[..., Any]) -> AgentFunction:
        agent_name = name or f.__name__
        policy = None
        if retry is not None:
            from ._retry import resolve

            policy = resolve(f"@agent {agent_name!r}", retries, retry)
        if agent_name in _AGENTS and not replace:
            raise ConfigError(
                f"@agent name {agent_name!r} is already registered -- agent names must be unique "
                "per process (needed so resume() can route a paused agent run back to its "
                "definition); pass name=... or replace=True, or rename the function"
            )
        obj = AgentFunction(
            f,
            model=model,
            tools=tools,
            temperature=temperature,
            max_tokens=max_tokens,
            max_turns=max_turns,
            retries=retries,
            max_repairs=max_repairs,
            timeout=timeout,
            prompt_cache=prompt_cache,
            thinking=thinking,
            effort=effort,
            thinking_budget=thinking_budget,
            fallback=fallback,
            cache=cache,
            name=agent_name,
            retry=policy,
        )
        _AGENTS[agent_name] = obj
        _codec.register_annotation_types(f)
        return obj

    if fn is not None:
        return decorate(fn)
    return decorate


def run_conversation_step(agent: AgentFunction, messages: list) -> tuple[Any, list]:
    """Runs `agent` on `messages` (instead of its body's prompt) as a
    journaled step of the current durable run: a graph's agent node
    (EXT-22). Returns the output and the whole transcript."""
    frame = FRAME.get()
    assert frame is not None  # a graph's agent node runs as a step of its run
    opts = _overrides(None, None, None, None, None, None)

    def execute(inner: Frame, a: tuple, k: dict) -> Any:
        call = _Call(agent, opts, inner, frame.scope)
        call.snapshot_scope = inner.scope
        driver = _engine.driven_synchronously()
        try:
            call.resolve_model()
            if not _restore(call):
                call.messages = list(messages)
            output = _drive_sync(_loop(call))
        finally:
            _engine.ASYNC_DRIVER.reset(driver)
        return {"output": output, "messages": list(call.messages)}

    value = _engine.journaled_step(frame, "agent", agent.name, execute, (), {})
    return value["output"], list(value["messages"])


# `compose.resume()` of a standalone agent run is routed here (AGENT-54).
OWNERS["agent"] = resume_standalone
