"""The OpenAI adapter: the Responses API.

The wire mapping is pure: ``request_kwargs`` turns a ``ModelRequest`` into the keyword
arguments of ``client.responses.create`` / ``client.responses.stream``, ``parse_response``
turns a Responses API response (SDK object or its JSON as a dict) into a ``ModelResponse``,
and ``StreamMapper`` turns stream events into ``RawStreamEvent``s. The SDK is imported on
first call only.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

from composeai import _core
from composeai.errors import ConfigError, ProviderError
from composeai.messages import (
    ImagePart,
    Message,
    StopReason,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
    _message_of,
    _text_part,
)
from composeai.models._openai_common import (
    NO_USAGE,
    OpenAIClientBase,
    dumps,
    get,
    make_usage,
    schema_name,
    strict_flag,
)
from composeai.models.base import (
    ModelRequest,
    ModelResponse,
    RawStreamEvent,
    ToolSpec,
    own_echo,
)

__all__ = ["OpenAIModel", "create_model"]

PROVIDER = "openai"

MISSING_KEY = (
    "Missing OpenAI API key: set the OPENAI_API_KEY environment variable, or pass "
    "api_key=... / client=... to OpenAIModel."
)
STREAM_CUT = (
    "OpenAI's response stream ended without a response.completed event -- the stream was "
    "closed or interrupted before finishing"
)
_TERMINAL = frozenset(("response.completed", "response.incomplete", "response.failed"))


# -- request ------------------------------------------------------------------


def _image_url(part: ImagePart) -> str:
    if part.url is not None:
        return part.url
    return f"data:{part.media_type};base64,{part.data}"


def _reasoning_item(part: ThinkingPart, model_id: str) -> dict | None:
    """The reasoning item to echo, only to the model that produced it."""
    item = own_echo(part, PROVIDER, model_id, "item")
    if item is None:
        return None
    return {k: v for k, v in item.items() if v is not None and k != "encrypted_content"}


def input_items(messages: list[Message], model_id: str) -> list[dict]:
    """Responses API ``input`` items for a conversation, in part order."""
    items: list[dict] = []
    for message in messages:
        content: list[dict] = []
        for part in message.parts:
            if isinstance(part, TextPart):
                content.append({"type": "input_text", "text": part.text})
                continue
            if isinstance(part, ImagePart):
                content.append(
                    {"type": "input_image", "image_url": _image_url(part), "detail": "auto"}
                )
                continue
            if content:
                items.append({"role": message.role, "content": content})
                content = []
            if isinstance(part, ToolCallPart):
                items.append(
                    {
                        "type": "function_call",
                        "call_id": part.id,
                        "name": part.name,
                        "arguments": dumps(part.arguments),
                    }
                )
            elif isinstance(part, ToolResultPart):
                output = f"ERROR: {part.content}" if part.is_error else part.content
                items.append(
                    {"type": "function_call_output", "call_id": part.tool_call_id, "output": output}
                )
            elif isinstance(part, ThinkingPart):
                item = _reasoning_item(part, model_id)
                if item is not None:
                    items.append(item)
        if content:
            items.append({"role": message.role, "content": content})
    return items


def tool_param(tool: ToolSpec) -> dict:
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.input_schema,
        "strict": bool(tool.strict) and strict_flag(tool.input_schema),
    }


def text_format(schema: dict) -> dict:
    """``text`` for a structured-output request."""
    return {
        "format": {
            "type": "json_schema",
            "name": schema_name(schema),
            "schema": schema,
            "strict": strict_flag(schema),
        }
    }


def request_kwargs(request: ModelRequest, model_id: str) -> dict[str, Any]:
    """Keyword arguments of ``responses.create`` for ``request``.

    ``thinking``, ``thinking_budget`` and ``prompt_cache`` send nothing: caching is automatic
    and reasoning is steered by ``effort`` only."""
    kwargs: dict[str, Any] = {
        "model": model_id,
        "input": input_items(request.messages, model_id),
        "max_output_tokens": request.max_tokens,
    }
    if request.system is not None:
        kwargs["instructions"] = request.system
    if request.temperature is not None:
        kwargs["temperature"] = request.temperature
    if request.tools:
        kwargs["tools"] = [tool_param(t) for t in request.tools]
    if request.output_schema is not None:
        kwargs["text"] = text_format(request.output_schema)
    if request.effort is not None:
        kwargs["reasoning"] = {"effort": request.effort}
    return kwargs


# -- response -----------------------------------------------------------------


def failure_message(error: Any) -> str:
    code = get(error, "code")
    message = get(error, "message")
    if code and message:
        detail = f"{code}: {message}"
    else:
        detail = message or code or "unknown error"
    return f"OpenAI response failed: {detail}"


def _fail(message: str, model_id: str) -> ProviderError:
    return ProviderError(message, provider=PROVIDER, model=model_id)


def _arguments(item: Any, model_id: str) -> dict:
    raw = get(item, "arguments") or ""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        err = str(exc)
    else:
        if isinstance(value, dict):
            return value
        err = f"expected a JSON object, got {type(value).__name__}"
    raise _fail(
        f"OpenAI returned non-JSON arguments for function_call '{get(item, 'name')}': {err}",
        model_id,
    )


def _to_plain(item: Any) -> dict:
    if isinstance(item, dict):
        return dict(item)
    dump = getattr(item, "model_dump", None)
    if dump is not None:
        return dump(mode="json", exclude_none=True)
    return dict(vars(item))


def _reasons(response: dict) -> bool:
    """Whether a raw reply holds a reasoning item: its echo token is the SDK object's dump
    (field order included), so such a reply is read through the SDK's typed model."""
    return any(get(item, "type") == "reasoning" for item in response.get("output") or ())


def _thinking(item: Any, model_id: str) -> ThinkingPart:
    texts = [get(s, "text") or "" for s in get(item, "summary") or []]
    if not any(texts):
        texts = [get(c, "text") or "" for c in get(item, "content") or []]
    plain = {k: v for k, v in _to_plain(item).items() if v is not None and k != "encrypted_content"}
    token = dumps({"item": plain, "model": model_id})
    return ThinkingPart(
        text="\n\n".join(t for t in texts if t), provider=PROVIDER, provider_token=token
    )


def usage_of(usage: Any, model_id: str):
    """Usage and cost of a Responses API ``usage`` object."""
    if usage is None:
        return NO_USAGE
    return make_usage(
        PROVIDER,
        model_id,
        get(usage, "input_tokens") or 0,
        get(usage, "output_tokens") or 0,
        get(get(usage, "input_tokens_details"), "cached_tokens") or 0,
        get(get(usage, "output_tokens_details"), "reasoning_tokens") or 0,
    )


def parse_response(response: Any, request: ModelRequest, model_id: str) -> ModelResponse:
    """A Responses API response as a ``ModelResponse``."""
    status = get(response, "status")
    if status == "failed":
        raise _fail(failure_message(get(response, "error")), model_id)
    parts: list[Any] = []
    refused = False
    called = False
    for item in get(response, "output") or []:
        kind = get(item, "type")
        if kind == "message":
            for block in get(item, "content") or []:
                block_type = get(block, "type")
                if block_type == "output_text":
                    parts.append(_text_part(get(block, "text") or ""))
                elif block_type == "refusal":
                    parts.append(_text_part(get(block, "refusal") or ""))
                    refused = True
        elif kind == "function_call":
            called = True
            parts.append(
                ToolCallPart(
                    id=get(item, "call_id") or get(item, "id") or _core.ulid(),
                    name=get(item, "name"),
                    arguments=_arguments(item, model_id),
                )
            )
        elif kind == "reasoning":
            parts.append(_thinking(item, model_id))
    reason = get(get(response, "incomplete_details"), "reason")
    if status == "incomplete":
        raw = f"incomplete:{reason}" if reason else "incomplete"
    else:
        raw = status
    if called:
        stop = StopReason.TOOL_USE
    elif status == "incomplete" and reason == "max_output_tokens":
        stop = StopReason.MAX_TOKENS
    elif refused:
        stop = StopReason.REFUSAL
    elif status == "completed":
        stop = StopReason.END_TURN
    else:
        stop = StopReason.OTHER
    message = _message_of("assistant", parts)
    parsed = None
    if request.output_schema is not None and stop is StopReason.END_TURN:
        try:
            parsed = json.loads(message.text)
        except ValueError as exc:
            raise _fail(
                f"OpenAI returned non-JSON text for a structured-output request: {exc}", model_id
            ) from None
    return ModelResponse(
        message=message,
        stop_reason=stop,
        raw_stop_reason=raw,
        usage=usage_of(get(response, "usage"), model_id),
        model_id=get(response, "model") or model_id,
        parsed=parsed,
    )


# -- streaming ----------------------------------------------------------------


class StreamMapper:
    """Responses API stream events → ``RawStreamEvent``s.

    ``feed(event)`` returns the events to yield; after a terminal event
    (completed/incomplete/failed) ``response`` holds exactly what ``parse_response`` makes of
    it, or the failure is raised."""

    __slots__ = ("calls", "model_id", "request", "response")

    def __init__(self, request: ModelRequest, model_id: str) -> None:
        self.request = request
        self.model_id = model_id
        self.calls: dict[Any, tuple[str, str]] = {}
        self.response: ModelResponse | None = None

    def feed(self, event: Any) -> list[RawStreamEvent]:
        kind = get(event, "type")
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            return [RawStreamEvent("text_delta", text=get(event, "delta"))]
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            return [RawStreamEvent("thinking_delta", text=get(event, "delta"))]
        if kind == "response.function_call_arguments.delta":
            call_id, name = self.calls.get(get(event, "item_id"), (None, None))
            return [
                RawStreamEvent(
                    "tool_args_delta",
                    text=get(event, "delta"),
                    tool_call_id=call_id,
                    tool_name=name,
                )
            ]
        if kind == "response.output_item.added":
            item = get(event, "item")
            if get(item, "type") == "function_call":
                call_id = get(item, "call_id") or get(item, "id")
                name = get(item, "name")
                self.calls[get(item, "id")] = (call_id, name)
                return [RawStreamEvent("tool_call_started", tool_call_id=call_id, tool_name=name)]
            return []
        if kind == "response.output_item.done":
            item = get(event, "item")
            if get(item, "type") == "function_call":
                # Checked here, before the SDK's stream helper parses strict arguments.
                _arguments(item, self.model_id)
                call_id = get(item, "call_id") or get(item, "id")
                return [
                    RawStreamEvent(
                        "tool_call_finished", tool_call_id=call_id, tool_name=get(item, "name")
                    )
                ]
            return []
        if kind in _TERMINAL:
            self.response = parse_response(get(event, "response"), self.request, self.model_id)
        elif kind == "error":
            # A stream-level error event carries the failure that a failed response would.
            raise _fail(failure_message(event), self.model_id)
        return []

    def done(self) -> RawStreamEvent:
        if self.response is None:
            raise _fail(STREAM_CUT, self.model_id)
        return RawStreamEvent("response_done", response=self.response)


# -- the model ----------------------------------------------------------------


class OpenAIModel(OpenAIClientBase):
    """A model behind OpenAI's Responses API.

    ``OpenAIModel(model_id, *, client=None, api_key=None, max_retries=2, base_url=None,
    timeout=None)``. The key (``api_key`` or ``OPENAI_API_KEY``) is checked at the first
    call; ``base_url`` unset keeps the SDK's own default (``OPENAI_BASE_URL``)."""

    _provider = PROVIDER
    _display = "OpenAI"

    def __init__(
        self,
        model_id: str,
        *,
        client: Any = None,
        api_key: str | None = None,
        max_retries: int = 2,
        base_url: str | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__(
            model_id,
            client=client,
            api_key=api_key,
            max_retries=max_retries,
            base_url=base_url,
            timeout=timeout,
        )

    def _api_key_value(self) -> str | None:
        if not (self._api_key or os.environ.get("OPENAI_API_KEY")):
            raise ConfigError(MISSING_KEY)
        return self._api_key

    def complete(self, request: ModelRequest) -> ModelResponse:
        client = self._sync_client()
        raw = self._call_reply(
            client, client.responses.create, request_kwargs(request, self.model_id), _reasons
        )
        return parse_response(raw, request, self.model_id)

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        client = self._aclient()
        raw = await self._acall_reply(
            client, client.responses.create, request_kwargs(request, self.model_id), _reasons
        )
        return parse_response(raw, request, self.model_id)

    def stream(self, request: ModelRequest) -> Iterator[RawStreamEvent]:
        client = self._sync_client()
        kwargs = request_kwargs(request, self.model_id)
        mapper = StreamMapper(request, self.model_id)
        manager = self._call(client.responses.stream, kwargs)
        events = self._call(manager.__enter__, {})
        try:
            iterator = iter(events)
            while mapper.response is None:
                try:
                    event = self._next(iterator)
                except StopIteration:
                    break
                yield from mapper.feed(event)
        finally:
            manager.__exit__(None, None, None)
        yield mapper.done()

    async def astream(self, request: ModelRequest) -> AsyncIterator[RawStreamEvent]:
        client = self._aclient()
        kwargs = request_kwargs(request, self.model_id)
        mapper = StreamMapper(request, self.model_id)
        manager = self._call(client.responses.stream, kwargs)
        events = await self._acall(manager.__aenter__, {})
        try:
            iterator = events.__aiter__()
            while mapper.response is None:
                try:
                    event = await self._anext(iterator)
                except StopAsyncIteration:
                    break
                for out in mapper.feed(event):
                    yield out
        finally:
            await manager.__aexit__(None, None, None)
        yield mapper.done()


def create_model(model_id: str) -> OpenAIModel:
    """``'openai/<model_id>'`` resolves to ``OpenAIModel(model_id)``."""
    return OpenAIModel(model_id)
