"""The model protocol and the request/response/stream value types.

``ToolSpec``, ``ModelRequest`` and ``ModelResponse`` are registered with the value encoder
at import, so their type tags are ``composeai.models.base:<name>``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, Protocol, runtime_checkable

from composeai import _codec
from composeai.messages import (
    ImagePart,
    Message,
    StopReason,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
    Usage,
)

__all__ = ["Model", "ModelRequest", "ModelResponse", "RawStreamEvent", "ToolSpec"]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as offered to the model."""

    name: str
    description: str
    input_schema: dict
    strict: bool = True
    requires_approval: bool = False


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One model call. ``model`` is the bare model id; ``provider`` is metadata only."""

    model: str
    messages: list[Message]
    system: str | None = None
    tools: list[ToolSpec] | None = None
    output_schema: dict | None = None
    max_tokens: int = 16000
    temperature: float | None = None
    provider: str | None = None
    prompt_cache: bool = False
    thinking: bool | None = None
    effort: str | None = None
    thinking_budget: int | None = None


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """A model's reply. ``parsed`` is set only for structured output on ``END_TURN``."""

    message: Message
    stop_reason: StopReason
    raw_stop_reason: str | None
    usage: Usage
    model_id: str
    parsed: dict | None = None

    def __post_init__(self) -> None:
        # The encoder stores ``StopReason`` as its plain string (OBS-60); restore the enum
        # member on decode so ``response.stop_reason is StopReason.END_TURN`` holds.
        reason = self.stop_reason
        if type(reason) is str:
            try:
                object.__setattr__(self, "stop_reason", StopReason(reason))
            except ValueError:
                pass


def _slot_setters(cls: type) -> tuple:
    """The setters of a slotted dataclass's fields, in field order."""
    return tuple(cls.__dict__[f.name].__set__ for f in fields(cls))


(
    _rq_model,
    _rq_messages,
    _rq_system,
    _rq_tools,
    _rq_output_schema,
    _rq_max_tokens,
    _rq_temperature,
    _rq_provider,
    _rq_prompt_cache,
    _rq_thinking,
    _rq_effort,
    _rq_thinking_budget,
) = _slot_setters(ModelRequest)
_rs_message, _rs_stop_reason, _rs_raw_stop_reason, _rs_usage, _rs_model_id, _rs_parsed = (
    _slot_setters(ModelResponse)
)
_new = object.__new__


def new_request(
    model: str,
    messages: list[Message],
    system: str | None,
    tools: list[ToolSpec] | None,
    output_schema: dict | None,
    max_tokens: int,
    temperature: float | None,
    provider: str | None,
    prompt_cache: bool,
    thinking: bool | None,
    effort: str | None,
    thinking_budget: int | None,
) -> ModelRequest:
    """``ModelRequest(...)`` with every field given, its slots set directly
    (a frozen dataclass's ``__init__`` goes through ``object.__setattr__``
    once per field, twice the cost): the agent loop builds one per model call."""
    request = _new(ModelRequest)
    _rq_model(request, model)
    _rq_messages(request, messages)
    _rq_system(request, system)
    _rq_tools(request, tools)
    _rq_output_schema(request, output_schema)
    _rq_max_tokens(request, max_tokens)
    _rq_temperature(request, temperature)
    _rq_provider(request, provider)
    _rq_prompt_cache(request, prompt_cache)
    _rq_thinking(request, thinking)
    _rq_effort(request, effort)
    _rq_thinking_budget(request, thinking_budget)
    return request


def new_response(
    message: Message,
    stop_reason: StopReason,
    raw_stop_reason: str | None,
    usage: Usage,
    model_id: str,
    parsed: dict | None = None,
) -> ModelResponse:
    """``ModelResponse(...)`` for a ``StopReason`` member (nothing for
    ``__post_init__`` to convert), its slots set directly as in ``new_request``."""
    if type(stop_reason) is not StopReason:
        return ModelResponse(message, stop_reason, raw_stop_reason, usage, model_id, parsed)
    response = _new(ModelResponse)
    _rs_message(response, message)
    _rs_stop_reason(response, stop_reason)
    _rs_raw_stop_reason(response, raw_stop_reason)
    _rs_usage(response, usage)
    _rs_model_id(response, model_id)
    _rs_parsed(response, parsed)
    return response


@dataclass(frozen=True, slots=True)
class RawStreamEvent:
    """One provider stream event.

    ``kind`` is one of ``text_delta``, ``thinking_delta``, ``tool_call_started``,
    ``tool_args_delta``, ``tool_call_finished``, ``response_done``. ``text`` is the delta (or
    the raw JSON fragment of tool arguments); ``response`` is set only on ``response_done``.
    """

    kind: str
    text: str | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    response: ModelResponse | None = None


@runtime_checkable
class Model(Protocol):
    """Anything with ``complete(request) -> ModelResponse``.

    Optional capabilities, discovered by attribute (``None`` counts as absent):
    ``stream(request) -> Iterator[RawStreamEvent]``, ``async acomplete(request)`` and
    ``astream(request) -> AsyncIterator[RawStreamEvent]``. Optional labels: ``model_id``
    and ``provider_name`` (the ``llm`` span's provider, OpenTelemetry's
    ``gen_ai.provider.name``, for a model given as an instance rather than a string).
    """

    def complete(self, request: ModelRequest) -> ModelResponse: ...


def _register(*classes: Any) -> None:
    for cls in classes:
        _codec.register_serializable(cls)


# The response's nested values must decode in a fresh process too (cassettes, cache files).
_register(
    ToolSpec,
    ModelRequest,
    ModelResponse,
    RawStreamEvent,
    Message,
    Usage,
    TextPart,
    ImagePart,
    ToolCallPart,
    ToolResultPart,
    ThinkingPart,
)


def own_echo(part: ThinkingPart, provider: str, model_id: str, field: str) -> dict | None:
    """The provider payload under ``field`` of a thinking part's token, only when the part
    came from ``provider`` and the token's model is ``model_id``: reasoning is
    echoed back only to the model that produced it."""
    if part.provider != provider or not part.provider_token:
        return None
    try:
        token = json.loads(part.provider_token)
    except ValueError:
        return None
    if not isinstance(token, dict) or token.get("model") != model_id:
        return None
    payload = token.get(field)
    return payload if isinstance(payload, dict) else None
