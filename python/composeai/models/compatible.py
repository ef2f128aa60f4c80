"""OpenAI-compatible servers through the Chat Completions API.

The wire mapping is pure: ``request_kwargs`` (``ModelRequest`` → keyword arguments of
``client.chat.completions.create``), ``parse_completion`` (a chat completion, SDK object or
JSON dict → ``ModelResponse``) and ``recover_json`` (the lenient parse of prompt mode). The
SDK is imported on first call only.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

from composeai import _core
from composeai.errors import ConfigError, ProviderError
from composeai.messages import (
    ImagePart,
    Message,
    StopReason,
    TextPart,
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
from composeai.models.base import Model, ModelRequest, ModelResponse, RawStreamEvent
from composeai.models.prices import ModelPrice, register_price

__all__ = ["OpenAICompatibleModel", "openai_compatible"]

PROVIDER = "openai-compatible"
SCHEMA_MODES = ("native", "prompt", "auto")

PROMPT_INSTRUCTION = (
    "Respond ONLY with a single JSON object that conforms to this JSON Schema -- no markdown "
    "fences, no commentary:\n"
)
REASONING_ONLY = (
    "Model returned only reasoning tokens with empty content for a structured-output request "
    "-- the server likely does not enforce constrained decoding for this model; try "
    "openai_compatible(..., schema_mode='prompt') or raise max_tokens."
)
_FINISH = {
    "stop": StopReason.END_TURN,
    "length": StopReason.MAX_TOKENS,
    "tool_calls": StopReason.TOOL_USE,
    "content_filter": StopReason.REFUSAL,
}


# -- request ------------------------------------------------------------------


def _content_part(part: TextPart | ImagePart) -> dict:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    url = part.url if part.url is not None else f"data:{part.media_type};base64,{part.data}"
    return {"type": "image_url", "image_url": {"url": url}}


def _assistant(message: Message) -> dict:
    content = [_content_part(p) for p in message.parts if isinstance(p, (TextPart, ImagePart))]
    out: dict[str, Any] = {"role": "assistant", "content": content or None}
    calls = [
        {
            "id": p.id,
            "type": "function",
            "function": {"name": p.name, "arguments": dumps(p.arguments)},
        }
        for p in message.parts
        if isinstance(p, ToolCallPart)
    ]
    if calls:
        out["tool_calls"] = calls
    return out


def _user(message: Message, out: list[dict]) -> None:
    """A user message: content parts, and one ``tool`` message per result, in part order."""
    content: list[dict] = []
    for part in message.parts:
        if isinstance(part, (TextPart, ImagePart)):
            content.append(_content_part(part))
        elif isinstance(part, ToolResultPart):
            if content:
                out.append({"role": "user", "content": content})
                content = []
            text = f"ERROR: {part.content}" if part.is_error else part.content
            out.append({"role": "tool", "tool_call_id": part.tool_call_id, "content": text})
    if content:
        out.append({"role": "user", "content": content})


def wire_messages(request: ModelRequest) -> list[dict]:
    """Chat Completions ``messages``; thinking parts are dropped."""
    out: list[dict] = []
    if request.system is not None:
        out.append({"role": "system", "content": request.system})
    for message in request.messages:
        if message.role == "assistant":
            out.append(_assistant(message))
        else:
            _user(message, out)
    return out


def _add_instruction(messages: list[dict], schema: dict) -> None:
    part = {"type": "text", "text": PROMPT_INSTRUCTION + json.dumps(schema)}
    for message in reversed(messages):
        if message["role"] == "user" and isinstance(message.get("content"), list):
            message["content"].append(part)
            return
    messages.append({"role": "user", "content": [part]})


def request_kwargs(request: ModelRequest, model_id: str, mode: str) -> dict[str, Any]:
    """Keyword arguments of ``chat.completions.create`` in effective schema ``mode``
    (``"native"`` or ``"prompt"``) (the thinking and caching knobs send nothing)."""
    messages = wire_messages(request)
    kwargs: dict[str, Any] = {"model": model_id, "messages": messages}
    kwargs["max_tokens"] = request.max_tokens
    if request.temperature is not None:
        kwargs["temperature"] = request.temperature
    if request.tools:
        kwargs["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.input_schema,
                    "strict": bool(t.strict) and strict_flag(t.input_schema),
                },
            }
            for t in request.tools
        ]
    schema = request.output_schema
    if schema is not None:
        if mode == "native":
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": schema_name(schema),
                    "schema": schema,
                    "strict": strict_flag(schema),
                },
            }
        else:
            _add_instruction(messages, schema)
    return kwargs


# -- response -----------------------------------------------------------------


_FENCE = re.compile(r"^```[A-Za-z0-9_+.-]*[ \t]*\n?(.*?)\n?```$", re.DOTALL)


def _strip_fence(text: str) -> str | None:
    """The inside of one surrounding ``` fence (optional language tag), else ``None``."""
    match = _FENCE.match(text.strip())
    return match.group(1) if match else None


def _balanced_end(text: str, start: int) -> int:
    """Index of the ``}`` closing the ``{`` at ``start`` (strings and escapes respected),
    or -1."""
    depth = 0
    in_string = False
    escaped = False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def recover_json(text: str) -> dict | None:
    """Prompt mode's lenient parse: one surrounding code fence stripped, else the
    first balanced ``{...}`` substring, left to right, that parses to a dict."""
    inner = _strip_fence(text)
    if inner is not None:
        try:
            value = json.loads(inner)
        except ValueError:
            pass
        else:
            if isinstance(value, dict):
                return value
    start = text.find("{")
    while start >= 0:
        end = _balanced_end(text, start)
        if end >= 0:
            try:
                value = json.loads(text[start : end + 1])
            except ValueError:
                pass
            else:
                if isinstance(value, dict):
                    return value
        start = text.find("{", start + 1)
    return None


def _fail(message: str, model_id: str) -> ProviderError:
    return ProviderError(message, provider=PROVIDER, model=model_id)


def _arguments(name: Any, raw: Any, model_id: str) -> dict:
    raw = raw or ""
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
    raise _fail(f"Server returned non-JSON arguments for tool call '{name}': {err}", model_id)


def usage_of(usage: Any, model_id: str):
    """Usage and cost of a Chat Completions ``usage`` object."""
    if usage is None:
        return NO_USAGE
    prompt_details = get(usage, "prompt_tokens_details")
    return make_usage(
        PROVIDER,
        model_id,
        get(usage, "prompt_tokens") or 0,
        get(usage, "completion_tokens") or 0,
        get(prompt_details, "cached_tokens") or 0,
        get(get(usage, "completion_tokens_details"), "reasoning_tokens") or 0,
        get(prompt_details, "cache_write_tokens") or 0,
    )


class _NonJSON(Exception):
    """The generic non-JSON structured-output failure, which auto mode demotes on."""


def _parse(completion: Any, request: ModelRequest, model_id: str, mode: str) -> ModelResponse:
    choices = get(completion, "choices") or []
    choice = choices[0] if choices else None
    message = get(choice, "message")
    parts: list[Any] = []
    content = get(message, "content")
    if isinstance(content, str) and content:
        parts.append(_text_part(content))
    refusal = get(message, "refusal")
    if refusal:
        parts.append(_text_part(refusal))
    for call in get(message, "tool_calls") or []:
        function = get(call, "function")
        name = get(function, "name")
        parts.append(
            ToolCallPart(
                id=get(call, "id") or _core.ulid(),
                name=name,
                arguments=_arguments(name, get(function, "arguments"), model_id),
            )
        )
    finish = get(choice, "finish_reason")
    stop = StopReason.REFUSAL if refusal else _FINISH.get(finish, StopReason.OTHER)
    usage = usage_of(get(completion, "usage"), model_id)
    reply = _message_of("assistant", parts)
    parsed = None
    if request.output_schema is not None and stop is StopReason.END_TURN:
        text = reply.text
        try:
            parsed = json.loads(text)
        except ValueError as exc:
            if mode == "prompt":
                parsed = recover_json(text)
            if parsed is None:
                if usage.reasoning_tokens > 0 and not text.strip():
                    raise _fail(REASONING_ONLY, model_id) from None
                if mode != "prompt":
                    raise _NonJSON(
                        f"Server returned non-JSON content for a structured-output request: {exc}"
                    ) from None
    return ModelResponse(
        message=reply,
        stop_reason=stop,
        raw_stop_reason=finish,
        usage=usage,
        model_id=get(completion, "model") or model_id,
        parsed=parsed,
    )


def parse_completion(
    completion: Any, request: ModelRequest, model_id: str, mode: str
) -> ModelResponse:
    """A chat completion as a ``ModelResponse`` in effective schema ``mode``."""
    try:
        return _parse(completion, request, model_id, mode)
    except _NonJSON as exc:
        raise _fail(str(exc), model_id) from None


class _Accumulator:
    """Stream chunks → ``RawStreamEvent``s and the completion they add up to."""

    __slots__ = ("calls", "finish", "model", "refusal", "text", "usage")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.refusal: list[str] = []
        self.calls: dict[int, dict] = {}
        self.finish: Any = None
        self.usage: Any = None
        self.model: Any = None

    def feed(self, chunk: Any) -> list[RawStreamEvent]:
        out: list[RawStreamEvent] = []
        if get(chunk, "usage") is not None:
            self.usage = get(chunk, "usage")
        self.model = get(chunk, "model") or self.model
        for choice in get(chunk, "choices") or []:
            if (get(choice, "index") or 0) != 0:
                continue
            delta = get(choice, "delta")
            text = get(delta, "content")
            if text:
                self.text.append(text)
                out.append(RawStreamEvent("text_delta", text=text))
            refusal = get(delta, "refusal")
            if refusal:
                self.refusal.append(refusal)
                out.append(RawStreamEvent("text_delta", text=refusal))
            for call in get(delta, "tool_calls") or []:
                self._tool_delta(call, out)
            finish = get(choice, "finish_reason")
            if finish is not None and self.finish is None:
                self.finish = finish
                for slot in self.calls.values():
                    out.append(
                        RawStreamEvent(
                            "tool_call_finished", tool_call_id=slot["id"], tool_name=slot["name"]
                        )
                    )
        return out

    def _tool_delta(self, call: Any, out: list[RawStreamEvent]) -> None:
        index = get(call, "index") or 0
        function = get(call, "function")
        slot = self.calls.get(index)
        if slot is None:
            slot = self.calls[index] = {
                "id": get(call, "id") or _core.ulid(),
                "name": get(function, "name") or "",
                "arguments": "",
            }
            out.append(
                RawStreamEvent("tool_call_started", tool_call_id=slot["id"], tool_name=slot["name"])
            )
        fragment = get(function, "arguments")
        if fragment:
            slot["arguments"] += fragment
            out.append(
                RawStreamEvent(
                    "tool_args_delta",
                    text=fragment,
                    tool_call_id=slot["id"],
                    tool_name=slot["name"],
                )
            )

    def completion(self) -> dict:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.text) or None,
            "refusal": "".join(self.refusal) or None,
        }
        if self.calls:
            message["tool_calls"] = [
                {
                    "id": s["id"],
                    "type": "function",
                    "function": {"name": s["name"], "arguments": s["arguments"]},
                }
                for _, s in sorted(self.calls.items())
            ]
        return {
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish}],
            "usage": self.usage,
        }


# -- the model ----------------------------------------------------------------


class OpenAICompatibleModel(OpenAIClientBase):
    """A model behind an OpenAI-compatible Chat Completions server.

    ``schema_mode``: ``"native"`` (``response_format`` json_schema), ``"prompt"`` (the schema
    as an instruction, parsed leniently) or ``"auto"`` (native until the server's first
    non-JSON structured reply, then prompt for good)."""

    _provider = PROVIDER
    _display = "OpenAI-compatible server"

    def __init__(
        self,
        model_id: str,
        *,
        base_url: str,
        client: Any = None,
        api_key: str | None = None,
        max_retries: int = 2,
        timeout: float | None = None,
        schema_mode: str = "native",
    ) -> None:
        if schema_mode not in SCHEMA_MODES:
            raise ConfigError(
                f"schema_mode must be 'native', 'prompt', or 'auto', got '{schema_mode}'"
            )
        super().__init__(
            model_id,
            client=client,
            api_key=api_key,
            max_retries=max_retries,
            base_url=base_url,
            timeout=timeout,
        )
        self.base_url = base_url
        self.schema_mode = schema_mode
        self._mode = "prompt" if schema_mode == "prompt" else "native"

    def _api_key_value(self) -> str:
        # Local servers rarely check keys, but the SDK insists on one.
        return self._api_key or "unused"

    def _demote(self) -> bool:
        if self.schema_mode != "auto" or self._mode != "native":
            return False
        self._mode = "prompt"
        return True

    def complete(self, request: ModelRequest) -> ModelResponse:
        client = self._sync_client()
        mode = self._mode
        create = client.chat.completions.create
        raw = self._call_reply(client, create, request_kwargs(request, self.model_id, mode))
        try:
            return _parse(raw, request, self.model_id, mode)
        except _NonJSON as exc:
            if not self._demote():
                raise self._fail(str(exc)) from None
            first = usage_of(get(raw, "usage"), self.model_id)
        kwargs = request_kwargs(request, self.model_id, "prompt")
        response = parse_completion(
            self._call_reply(client, create, kwargs), request, self.model_id, "prompt"
        )
        return replace(response, usage=first + response.usage)

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        client = self._aclient()
        mode = self._mode
        create = client.chat.completions.create
        raw = await self._acall_reply(client, create, request_kwargs(request, self.model_id, mode))
        try:
            return _parse(raw, request, self.model_id, mode)
        except _NonJSON as exc:
            if not self._demote():
                raise self._fail(str(exc)) from None
            first = usage_of(get(raw, "usage"), self.model_id)
        kwargs = request_kwargs(request, self.model_id, "prompt")
        response = parse_completion(
            await self._acall_reply(client, create, kwargs), request, self.model_id, "prompt"
        )
        return replace(response, usage=first + response.usage)

    def _stream_kwargs(self, request: ModelRequest, mode: str) -> dict[str, Any]:
        kwargs = request_kwargs(request, self.model_id, mode)
        kwargs["stream"] = True
        kwargs["stream_options"] = {"include_usage": True}
        return kwargs

    def stream(self, request: ModelRequest) -> Iterator[RawStreamEvent]:
        client = self._sync_client()
        mode = self._mode
        chunks = self._call(client.chat.completions.create, self._stream_kwargs(request, mode))
        acc = _Accumulator()
        try:
            iterator = iter(chunks)
            while True:
                try:
                    chunk = self._next(iterator)
                except StopIteration:
                    break
                yield from acc.feed(chunk)
        finally:
            chunks.close()
        response = parse_completion(acc.completion(), request, self.model_id, mode)
        yield RawStreamEvent("response_done", response=response)

    async def astream(self, request: ModelRequest) -> AsyncIterator[RawStreamEvent]:
        client = self._aclient()
        mode = self._mode
        chunks = await self._acall(
            client.chat.completions.create, self._stream_kwargs(request, mode)
        )
        acc = _Accumulator()
        try:
            iterator = chunks.__aiter__()
            while True:
                try:
                    chunk = await self._anext(iterator)
                except StopAsyncIteration:
                    break
                for out in acc.feed(chunk):
                    yield out
        finally:
            await chunks.close()
        response = parse_completion(acc.completion(), request, self.model_id, mode)
        yield RawStreamEvent("response_done", response=response)


def openai_compatible(
    base_url: str,
    model: str,
    *,
    api_key: str | None = None,
    timeout: float | None = None,
    input_price: float | None = None,
    output_price: float | None = None,
    schema_mode: str = "native",
) -> Model:
    """A model on an OpenAI-compatible server (vLLM, Ollama, LM Studio, ...).

    Pass both prices (USD per million tokens) to have its calls costed."""
    if (input_price is None) != (output_price is None):
        raise ConfigError(
            "openai_compatible(): pass both input_price and output_price (USD per million "
            "tokens), or neither"
        )
    instance = OpenAICompatibleModel(
        model, base_url=base_url, api_key=api_key, timeout=timeout, schema_mode=schema_mode
    )
    if input_price is not None and output_price is not None:
        register_price(PROVIDER, model, ModelPrice(input=input_price, output=output_price))
    return instance
