"""The agent loop, written once as a generator that yields its I/O (model
calls, tool batches, user callbacks) to a driver, and the llm span it writes
for each model call.
"""

from __future__ import annotations

import json
import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from . import _codec, _core, _engine
from ._agent_call import _Call, _check_cancel, _current_bus
from ._agent_tools import _tool_batch
from ._engine import BUDGETS
from .errors import (
    AgentTimeoutError,
    BudgetExceededError,
    ComposeError,
    ConfigError,
    MaxTurnsExceededError,
    ModelRefusalError,
    ProviderError,
)
from .messages import Message, StopReason, TextPart, ToolCallPart, Usage
from .models.base import new_request

if TYPE_CHECKING:
    # `agentfn.AgentFunction`: that module sits above this one.
    AgentFunction = Any


REPAIR_PROMPT = (
    "Your previous reply did not match the required output schema. Error: {error}\n"
    "Reply again with ONLY a corrected JSON object matching the schema -- no markdown fences, "
    "no commentary."
)


def _shown_text(text: str, limit: int = 300) -> str:
    """A reply's text for an error message, quoted, cut at `limit` characters."""
    if len(text) > limit:
        return json.dumps(text[:limit]) + f" ... ({len(text)} characters)"
    return json.dumps(text)


def _extract(agent: AgentFunction, response: Any) -> Any:
    """The output of an END_TURN reply."""
    if agent._schema is None:
        return response.message.text
    payload = response.parsed
    if payload is None:
        try:
            payload = json.loads(response.message.text)
        except ValueError:
            raise ComposeError(
                f"@agent {agent.name!r}: model returned no structured payload (response.parsed "
                "was unset and the message text is not valid JSON); the model replied: "
                + _shown_text(response.message.text)
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
    """The agent loop. Yields I/O effects:
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
    budget check."""
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
    if call.provider_name is not None:
        span.attributes["provider"] = call.provider_name
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
