"""The model protocol and the request/response/stream value types (PROV-4 … PROV-8).

``ToolSpec``, ``ModelRequest`` and ``ModelResponse`` are registered with the value encoder
at import, so their type tags are ``composeai.models.base:<name>`` (PKG-6, AGENT-65).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
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
    """A tool as offered to the model (PROV-5)."""

    name: str
    description: str
    input_schema: dict
    strict: bool = True
    requires_approval: bool = False


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One model call (PROV-6). ``model`` is the bare model id; ``provider`` is metadata only."""

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
    """A model's reply (PROV-7). ``parsed`` is set only for structured output on ``END_TURN``."""

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


@dataclass(frozen=True, slots=True)
class RawStreamEvent:
    """One provider stream event (PROV-8).

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
    """Anything with ``complete(request) -> ModelResponse`` (PROV-4).

    Optional capabilities, discovered by attribute (``None`` counts as absent):
    ``stream(request) -> Iterator[RawStreamEvent]``, ``async acomplete(request)`` and
    ``astream(request) -> AsyncIterator[RawStreamEvent]``.
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
    came from ``provider`` and the token's model is ``model_id`` (AGENT-62): reasoning is
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
