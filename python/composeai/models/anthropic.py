"""The Anthropic Messages API adapter.

The wire mapping is a set of pure functions over plain values (``request_to_kwargs``,
``parse_response``, ``usage_from_wire``, ``StreamAccumulator``); ``AnthropicModel`` only moves
those values through the official SDK. The SDK is imported at the first call, never at import
or construction, and its clients are built then too and kept on the instance as
``_client`` / ``_async_client`` so a test suite can swap them out.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import threading
import weakref
from typing import Any

from composeai.errors import ComposeError, ConfigError, ProviderError
from composeai.messages import (
    ImagePart,
    Message,
    StopReason,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
    Usage,
    _message_of,
    _text_part,
)
from composeai.models.base import ModelRequest, ModelResponse, RawStreamEvent, own_echo
from composeai.models.prices import get_price, resolved_rates

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

__all__ = [
    "AnthropicModel",
    "StreamAccumulator",
    "create_model",
    "fit_kwargs",
    "parse_response",
    "request_to_kwargs",
    "usage_from_wire",
]

PROVIDER = "anthropic"
MAX_CONTINUATIONS = 5
_EPHEMERAL = {"type": "ephemeral"}
_STOPS = {
    "end_turn": StopReason.END_TURN,
    "tool_use": StopReason.TOOL_USE,
    "max_tokens": StopReason.MAX_TOKENS,
    "refusal": StopReason.REFUSAL,
}
_MISSING_KEY = (
    "Missing Anthropic API key: set the ANTHROPIC_API_KEY environment variable, or pass "
    "api_key=... / client=... to AnthropicModel."
)
# The SDK refuses a non-streaming call it expects to outlast its default timeout, before
# sending anything; such a call is then made as a stream and collected.
_STREAMING_REQUIRED = "Streaming is required"


# ---------------------------------------------------------------------------
# Request mapping (PROV-11, PROV-40)


def request_to_kwargs(request: ModelRequest, model_id: str) -> dict[str, Any]:
    """The keyword arguments of ``messages.create`` for ``request``. ``model_id``
    is the adapter's: it names the model on the wire and decides which thinking is echoed."""
    messages = [_message_to_wire(i, m, model_id) for i, m in enumerate(request.messages)]
    kwargs: dict[str, Any] = {
        "model": model_id,
        "max_tokens": request.max_tokens,
        "messages": messages,
    }
    cache = request.prompt_cache
    if request.system:
        if cache:
            kwargs["system"] = [
                {"type": "text", "text": request.system, "cache_control": dict(_EPHEMERAL)}
            ]
        else:
            kwargs["system"] = request.system
    if cache and len(messages) > 1 and messages[-1]["content"]:
        content = messages[-1]["content"]
        content[-1] = {**content[-1], "cache_control": dict(_EPHEMERAL)}
    if request.temperature is not None:
        kwargs["temperature"] = request.temperature
    if request.tools:
        kwargs["tools"] = [
            {
                "name": t.name,
                "description": t.description,
                "input_schema": t.input_schema,
                "strict": t.strict,
            }
            for t in request.tools
        ]
    output_config: dict[str, Any] = {}
    if request.output_schema is not None:
        output_config["format"] = {"type": "json_schema", "schema": request.output_schema}
    if request.effort is not None:
        output_config["effort"] = request.effort
    if output_config:
        kwargs["output_config"] = output_config
    if request.thinking is False:
        kwargs["thinking"] = {"type": "disabled"}
    elif request.thinking_budget is not None:
        kwargs["thinking"] = {
            "type": "enabled",
            "budget_tokens": request.thinking_budget,
            "display": "summarized",
        }
        kwargs.pop("temperature", None)
    elif request.thinking is True:
        kwargs["thinking"] = {"type": "adaptive", "display": "summarized"}
    return kwargs


def _message_to_wire(index: int, message: Message, model_id: str) -> dict[str, Any]:
    parts = message.parts
    results = sum(1 for p in parts if isinstance(p, ToolResultPart))
    if results and results != len(parts):
        raise ComposeError(
            f"Anthropic messages[{index}] ({message.role}) mixes tool_result parts with other "
            "content: a tool-results message must hold only ToolResultPart parts (a caller bug)"
        )
    content = []
    for part in parts:
        block = _part_to_block(part, model_id)
        if block is not None:
            content.append(block)
    return {"role": message.role, "content": content}


def _part_to_block(part: Any, model_id: str) -> dict[str, Any] | None:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ToolCallPart):
        return {"type": "tool_use", "id": part.id, "name": part.name, "input": part.arguments}
    if isinstance(part, ToolResultPart):
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": part.tool_call_id,
            "content": part.content,
        }
        if part.is_error:
            block["is_error"] = True
        return block
    if isinstance(part, ImagePart):
        if part.data is not None:
            source: dict[str, Any] = {
                "type": "base64",
                "media_type": part.media_type,
                "data": part.data,
            }
        else:
            source = {"type": "url", "url": part.url}
        return {"type": "image", "source": source}
    if isinstance(part, ThinkingPart):
        return _echoed_thinking(part, model_id)
    raise ComposeError(f"Anthropic adapter: unsupported message part {part!r}")


def _echoed_thinking(part: ThinkingPart, model_id: str) -> dict[str, Any] | None:
    """The original thinking block, only for the model that produced it."""
    block = own_echo(part, PROVIDER, model_id, "block")
    return None if block is None else _strip_none(block)


def _strip_none(block: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if v is not None}


def continuation_kwargs(
    kwargs: dict[str, Any], replies: list[dict[str, Any]], model_id: str
) -> dict[str, Any]:
    """The request continuing after ``replies`` ended in ``pause_turn``: the
    original request plus one assistant message holding every block returned so far."""
    if len(replies) > MAX_CONTINUATIONS:
        raise ProviderError(
            f"Anthropic paused {len(replies)} times in a row for model '{model_id}' "
            f"(exceeded the {MAX_CONTINUATIONS}-continuation limit)",
            provider=PROVIDER,
            model=model_id,
        )
    blocks = [_strip_none(b) for reply in replies for b in (reply.get("content") or ())]
    return {**kwargs, "messages": [*kwargs["messages"], {"role": "assistant", "content": blocks}]}


# SDK drift: a field the installed SDK's ``create`` no longer (or not yet) names as a keyword
# still reaches the wire through ``extra_body``. Signatures are inspected once per function.
_ACCEPTED: dict[Any, frozenset[str] | None] = {}
_PASSTHROUGH = frozenset({"model", "max_tokens", "messages", "stream"})


def _accepted_keywords(create: Any) -> frozenset[str] | None:
    fn = getattr(create, "__func__", create)
    try:
        return _ACCEPTED[fn]
    except KeyError:
        pass
    except TypeError:  # an unhashable stand-in: inspect it every time
        return _inspect_keywords(create)
    names = _inspect_keywords(create)
    _ACCEPTED[fn] = names
    return names


def _inspect_keywords(create: Any) -> frozenset[str] | None:
    try:
        params = inspect.signature(create).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None  # takes anything
    return frozenset(p.name for p in params)


def fit_kwargs(create: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with every field ``create`` does not accept moved into ``extra_body``."""
    accepted = _accepted_keywords(create)
    if accepted is None:
        return kwargs
    moved = {k: v for k, v in kwargs.items() if k not in accepted and k not in _PASSTHROUGH}
    if not moved:
        return kwargs
    fitted = {k: v for k, v in kwargs.items() if k not in moved}
    fitted["extra_body"] = {**(kwargs.get("extra_body") or {}), **moved}
    return fitted


# ---------------------------------------------------------------------------
# Response mapping (PROV-12, PROV-13)


def map_stop_reason(raw: str | None) -> StopReason:
    return _STOPS.get(raw, StopReason.OTHER)  # type: ignore[arg-type]


def usage_from_wire(usage: dict[str, Any] | None, model_id: str) -> Usage:
    """``Usage`` of one reply, priced when ``model_id`` has a price."""
    u = usage or {}
    details = u.get("output_tokens_details") or {}
    input_tokens = u.get("input_tokens") or 0
    output_tokens = u.get("output_tokens") or 0
    cache_read = u.get("cache_read_input_tokens") or 0
    cache_creation = u.get("cache_creation_input_tokens") or 0
    price = get_price(PROVIDER, model_id)
    if price is None:
        cost, complete = None, False
    else:
        split = u.get("cache_creation")
        if split:
            write_5m = split.get("ephemeral_5m_input_tokens") or 0
            write_1h = split.get("ephemeral_1h_input_tokens") or 0
        else:
            write_5m, write_1h = cache_creation, 0
        p = resolved_rates(price)
        # compute_cost's formula (PROV-30), on a price resolved once rather than per call.
        cost = (
            input_tokens * p.input
            + output_tokens * p.output
            + cache_read * p.cache_read
            + write_5m * p.cache_write_5m
            + write_1h * p.cache_write_1h
        ) / 1_000_000
        complete = True
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_read_tokens=cache_read,
        cache_creation_tokens=cache_creation,
        reasoning_tokens=details.get("thinking_tokens") or 0,
        cost_usd=cost,
        cost_complete=complete,
    )


def _blocks_to_parts(blocks: list[dict[str, Any]], model_id: str) -> list[Any]:
    parts: list[Any] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            parts.append(_text_part(block.get("text") or ""))
        elif kind == "tool_use":
            arguments = block.get("input")
            if not isinstance(arguments, dict):
                raise ProviderError(
                    f"Anthropic returned non-object input for tool_use '{block.get('name')}': "
                    f"{arguments!r}",
                    provider=PROVIDER,
                    model=model_id,
                )
            parts.append(ToolCallPart(id=block["id"], name=block["name"], arguments=arguments))
        elif kind == "thinking":
            token = json.dumps({"block": _strip_none(block), "model": model_id}, sort_keys=True)
            parts.append(
                ThinkingPart(
                    text=block.get("thinking") or "", provider=PROVIDER, provider_token=token
                )
            )
    return parts


def parse_response(
    replies: list[dict[str, Any]] | dict[str, Any], model_id: str, *, structured: bool = False
) -> ModelResponse:
    """One ``ModelResponse`` from the wire replies of a call: one reply, or several when
    ``pause_turn`` continuations happened (parts and usage accumulate; the last stop
    counts). ``structured``: an output schema was requested."""
    if isinstance(replies, dict):
        replies = [replies]
    parts: list[Any] = []
    usage: Usage | None = None
    for reply in replies:
        parts.extend(_blocks_to_parts(reply.get("content") or [], model_id))
        spent = usage_from_wire(reply.get("usage"), model_id)
        usage = spent if usage is None else usage + spent
    raw = replies[-1].get("stop_reason") if replies else None
    stop = map_stop_reason(raw)
    message = _message_of("assistant", parts)
    parsed = None
    if structured and stop is StopReason.END_TURN:
        try:
            parsed = json.loads(message.text)
        except ValueError as exc:
            raise ProviderError(
                f"Anthropic returned non-JSON text for a structured-output request: {exc}",
                provider=PROVIDER,
                model=model_id,
            ) from None
    return ModelResponse(
        message=message,
        stop_reason=stop,
        raw_stop_reason=raw,
        usage=usage if usage is not None else Usage(),
        model_id=model_id,
        parsed=parsed,
    )


def _plain(obj: Any) -> Any:
    """A wire value as plain dicts/lists. SDK replies are pydantic models; replies built
    by hand (a stub client in a test: ``SimpleNamespace`` objects, configured mocks) are
    read through their public attributes."""
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if hasattr(type(obj), "model_fields"):
        # The SDK builds replies without validation; an off-schema value is ours to judge.
        return obj.model_dump(warnings=False)
    fields = getattr(obj, "__dict__", None)
    if fields is not None:
        return {
            k: _plain(v) for k, v in fields.items() if not k.startswith("_") and k != "method_calls"
        }
    raise ProviderError(
        f"Anthropic SDK returned an unexpected value {type(obj)!r}", provider=PROVIDER
    )


def _raw_create(client: Any, create: Any, own_class: type[Any]) -> Any:
    """``messages.with_raw_response.create`` when ``client`` is the SDK's own client class and
    ``create`` its own method: the reply is then read from its JSON body, skipping the typed
    model the SDK would build only for ``_plain`` to turn it back into dicts. ``None`` for
    anything else (an injected stub, a patched method), which is called as given."""
    fn = getattr(create, "__func__", None)
    if type(client) is not own_class or not getattr(fn, "__module__", "").startswith("anthropic."):
        return None
    return client.messages.with_raw_response.create


def _raw_reply(raw: Any) -> dict[str, Any]:
    """The wire reply of a raw SDK response; a body that is not a JSON object is left to the
    SDK's own parsing, as a plain call would."""
    data = _raw_json(raw)
    return _plain(raw.parse()) if data is None else data


async def _araw_reply(raw: Any) -> dict[str, Any]:
    data = _raw_json(raw)
    if data is not None:
        return data
    parsed = raw.parse()  # a coroutine on SDKs whose async raw responses parse lazily
    return _plain(await parsed if inspect.isawaitable(parsed) else parsed)


def _raw_json(raw: Any) -> dict[str, Any] | None:
    try:
        data = raw.http_response.json()
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


# ---------------------------------------------------------------------------
# Streaming (PROV-14)


class StreamAccumulator:
    """Folds one Messages API event stream into the reply ``create()`` would have returned,
    mapping each event to at most one ``RawStreamEvent``. Events may be SDK objects or the
    plain dicts of the wire format."""

    __slots__ = ("_args", "_blocks", "_message", "_stopped", "model_id")

    def __init__(self, model_id: str):
        self.model_id = model_id
        self._message: dict[str, Any] | None = None
        self._blocks: dict[int, dict[str, Any]] = {}
        self._args: dict[int, list[str]] = {}
        self._stopped = False

    def feed(self, event: Any) -> RawStreamEvent | None:
        kind = _field(event, "type")
        if kind == "content_block_delta":
            index = _field(event, "index")
            block = self._blocks[index]
            delta = _field(event, "delta")
            dkind = _field(delta, "type")
            if dkind == "text_delta":
                text = _field(delta, "text")
                block["text"] = (block.get("text") or "") + text
                return RawStreamEvent("text_delta", text=text)
            if dkind == "thinking_delta":
                text = _field(delta, "thinking")
                block["thinking"] = (block.get("thinking") or "") + text
                return RawStreamEvent("thinking_delta", text=text)
            if dkind == "input_json_delta":
                fragment = _field(delta, "partial_json") or ""
                self._args[index].append(fragment)
                return RawStreamEvent(
                    "tool_args_delta",
                    text=fragment,
                    tool_call_id=block.get("id"),
                    tool_name=block.get("name"),
                )
            if dkind == "signature_delta":
                block["signature"] = _field(delta, "signature")
            elif dkind == "citations_delta":
                block["citations"] = [*(block.get("citations") or ()), _plain(delta)["citation"]]
            return None
        if kind == "content_block_start":
            index = _field(event, "index")
            block = dict(_plain(_field(event, "content_block")))
            self._blocks[index] = block
            if block.get("type") == "tool_use":
                self._args[index] = []
                return RawStreamEvent(
                    "tool_call_started", tool_call_id=block.get("id"), tool_name=block.get("name")
                )
            return None
        if kind == "content_block_stop":
            index = _field(event, "index")
            block = self._blocks[index]
            fragments = self._args.pop(index, None)
            if fragments is None:
                return None
            text = "".join(fragments)
            if text:
                try:
                    block["input"] = json.loads(text)
                except ValueError as exc:
                    raise ProviderError(
                        f"Anthropic returned non-JSON arguments for tool_use "
                        f"'{block.get('name')}': {exc}",
                        provider=PROVIDER,
                        model=self.model_id,
                    ) from None
            elif block.get("input") is None:
                block["input"] = {}
            return RawStreamEvent(
                "tool_call_finished", tool_call_id=block.get("id"), tool_name=block.get("name")
            )
        if kind == "message_start":
            message = dict(_plain(_field(event, "message")))
            message["usage"] = dict(message.get("usage") or {})
            self._message = message
            return None
        if kind == "message_delta":
            message = self._started()
            delta = _plain(_field(event, "delta")) or {}
            for key in ("stop_reason", "stop_sequence"):
                if key in delta:
                    message[key] = delta[key]
            usage = _plain(_field(event, "usage")) or {}
            message["usage"].update((k, v) for k, v in usage.items() if v is not None)
            return None
        if kind == "message_stop":
            self._stopped = True
        return None

    def _started(self) -> dict[str, Any]:
        if self._message is None:
            raise ProviderError(
                "Anthropic's response stream sent events before message_start",
                provider=PROVIDER,
                model=self.model_id,
            )
        return self._message

    def finish(self) -> dict[str, Any]:
        """The accumulated reply; a stream that ended before ``message_stop`` fails."""
        if not self._stopped or self._message is None:
            raise ProviderError(
                "Anthropic's response stream ended without a message_stop event -- the stream "
                "was closed or interrupted before finishing",
                provider=PROVIDER,
                model=self.model_id,
            )
        message = self._message
        message["content"] = [self._blocks[i] for i in sorted(self._blocks)]
        return message


# ---------------------------------------------------------------------------
# The SDK


class _Sdk:
    __slots__ = ("errors", "module")

    def __init__(self, module: Any):
        self.module = module
        errors: list[type[BaseException]] = [module.AnthropicError]
        # Transport failures the SDK lets through unwrapped (a connection dropped mid-stream):
        # those of whichever httpx distribution the installed SDK is built on.
        for name in ("httpx2", "httpx"):
            http = sys.modules.get(name)
            if http is None:
                continue
            for attr in ("HTTPError", "StreamError"):
                cls = getattr(http, attr, None)
                if isinstance(cls, type) and issubclass(cls, BaseException):
                    errors.append(cls)
        self.errors = tuple(errors)


_SDK: _Sdk | None = None


def _load_sdk() -> _Sdk:
    global _SDK
    try:
        import anthropic
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] == "anthropic":
            raise ConfigError(
                f"Install the provider SDK: pip install 'composeai[{PROVIDER}]'"
            ) from exc
        raise
    sdk = _SDK
    if sdk is None or sdk.module is not anthropic:
        sdk = _SDK = _Sdk(anthropic)
    return sdk


def _sdk_error(sdk: _Sdk, exc: BaseException, model_id: str) -> ProviderError:
    module = sdk.module
    if isinstance(exc, module.APIStatusError):
        message = _status_message(exc)
    elif isinstance(exc, module.APIConnectionError) and not isinstance(exc, module.APITimeoutError):
        # SDK 2.16+ wraps a dropped connection that older releases let through unwrapped:
        # one wording for both, naming the transport failure.
        message = f"Anthropic request failed: {type(exc).__name__}: {exc}"
    elif isinstance(exc, module.APIError):
        message = str(exc)
    else:
        message = f"Anthropic request failed: {type(exc).__name__}: {exc}"
    return ProviderError(message, provider=PROVIDER, model=model_id)


def _status_message(exc: Any) -> str:
    """`Error code: <status> - <detail>` whatever the SDK release words its status errors as
    (2.16+ says `<status> <message> (request_id: …)`)."""
    text = str(exc)
    if text.startswith("Error code:"):
        return text
    status = exc.status_code
    detail = text.removeprefix(f"{status} ")
    return f"Error code: {status} - {detail}"


# ---------------------------------------------------------------------------
# The model


class AnthropicModel:
    """A ``Model`` over the Anthropic Messages API.

    ``provider_name`` is what ``llm`` spans name as OpenTelemetry's ``gen_ai.provider.name``.

    ``client=`` injects a ready SDK client (sync only: ``acomplete``/``astream`` are then
    ``None``). Otherwise the clients are built at the first call, with ``api_key`` (else
    ``ANTHROPIC_API_KEY``), ``max_retries``, ``base_url`` and ``timeout`` passed only when not
    ``None`` so the SDK's own defaults and environment variables apply.
    """

    provider_name = PROVIDER

    def __init__(
        self,
        model_id: str,
        *,
        client: Any = None,
        api_key: str | None = None,
        max_retries: int = 2,
        base_url: str | None = None,
        timeout: float | None = None,
    ):
        if not isinstance(model_id, str) or not model_id:
            raise ConfigError(f"AnthropicModel needs a non-empty model id string, got {model_id!r}")
        self.model_id = model_id
        self.api_key = api_key
        self.max_retries = max_retries
        self.base_url = base_url
        self.timeout = timeout
        self._client = client
        self._async_client: Any = None
        # Async clients this instance built -> (weakly) the event loop each was built on: an
        # SDK async client works only on the loop it first ran on.
        self._own_async: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        if client is not None:
            # An injected client is sync-only: the async twins count as absent (PROV-4). mypy
            # cannot type an instance attribute that shadows a method of the same class.
            self.acomplete = None  # type: ignore[method-assign, assignment]
            self.astream = None  # type: ignore[method-assign, assignment]

    def __repr__(self) -> str:
        return f"AnthropicModel({self.model_id!r})"

    # -- clients ---------------------------------------------------------------

    def _client_options(self) -> dict[str, Any]:
        if not (self.api_key or os.environ.get("ANTHROPIC_API_KEY")):
            raise ConfigError(_MISSING_KEY)
        options: dict[str, Any] = {}
        for name in ("api_key", "max_retries", "base_url", "timeout"):
            value = getattr(self, name)
            if value is not None:
                options[name] = value
        return options

    def _sync_client(self, sdk: _Sdk) -> Any:
        client = self._client
        if client is None:
            with self._lock:
                client = self._client
                if client is None:
                    client = self._client = sdk.module.Anthropic(**self._client_options())
        return client

    def _loop_client(self, sdk: _Sdk) -> Any:
        from asyncio import get_running_loop

        loop = get_running_loop()
        client = self._async_client
        if client is not None:
            try:
                home = self._own_async.get(client)
            except TypeError:  # not weak-referenceable, so not one of ours
                return client
            if home is None or home() is loop:
                return client  # assigned from outside (used as given), or this loop's own
        client = sdk.module.AsyncAnthropic(**self._client_options())
        self._own_async[client] = weakref.ref(loop)
        self._async_client = client
        return client

    # -- calls -----------------------------------------------------------------

    def complete(self, request: ModelRequest) -> ModelResponse:
        sdk = _load_sdk()
        client = self._sync_client(sdk)
        create = client.messages.create
        raw_create = _raw_create(client, create, sdk.module.Anthropic)
        base = request_to_kwargs(request, self.model_id)
        kwargs = base
        replies: list[dict[str, Any]] = []
        try:
            while True:
                if raw_create is None:
                    reply = _plain(create(**fit_kwargs(create, kwargs)))
                else:
                    reply = _raw_reply(raw_create(**fit_kwargs(create, kwargs)))
                replies.append(reply)
                if reply.get("stop_reason") != "pause_turn":
                    break
                kwargs = continuation_kwargs(base, replies, self.model_id)
        except sdk.errors as exc:
            raise _sdk_error(sdk, exc, self.model_id) from exc
        except ValueError as exc:
            if replies or _STREAMING_REQUIRED not in str(exc):
                raise
            return _last_response(self.stream(request))
        return parse_response(replies, self.model_id, structured=request.output_schema is not None)

    def stream(self, request: ModelRequest) -> Iterator[RawStreamEvent]:
        sdk = _load_sdk()
        create = self._sync_client(sdk).messages.create
        base = request_to_kwargs(request, self.model_id)
        kwargs = base
        replies: list[dict[str, Any]] = []
        try:
            while True:
                acc = StreamAccumulator(self.model_id)
                events = create(**fit_kwargs(create, {**kwargs, "stream": True}))
                try:
                    for event in events:
                        out = acc.feed(event)
                        if out is not None:
                            yield out
                finally:
                    # Also on close() of this generator: aborts the HTTP request (AGENT-93).
                    close = getattr(events, "close", None)
                    if close is not None:
                        close()
                reply = acc.finish()
                replies.append(reply)
                if reply.get("stop_reason") != "pause_turn":
                    break
                kwargs = continuation_kwargs(base, replies, self.model_id)
        except sdk.errors as exc:
            raise _sdk_error(sdk, exc, self.model_id) from exc
        yield RawStreamEvent(
            "response_done",
            response=parse_response(
                replies, self.model_id, structured=request.output_schema is not None
            ),
        )

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        sdk = _load_sdk()
        client = self._loop_client(sdk)
        create = client.messages.create
        raw_create = _raw_create(client, create, sdk.module.AsyncAnthropic)
        base = request_to_kwargs(request, self.model_id)
        kwargs = base
        replies: list[dict[str, Any]] = []
        try:
            while True:
                if raw_create is None:
                    reply = _plain(await create(**fit_kwargs(create, kwargs)))
                else:
                    reply = await _araw_reply(await raw_create(**fit_kwargs(create, kwargs)))
                replies.append(reply)
                if reply.get("stop_reason") != "pause_turn":
                    break
                kwargs = continuation_kwargs(base, replies, self.model_id)
        except sdk.errors as exc:
            raise _sdk_error(sdk, exc, self.model_id) from exc
        except ValueError as exc:
            if replies or _STREAMING_REQUIRED not in str(exc):
                raise
            return await _alast_response(self.astream(request))
        return parse_response(replies, self.model_id, structured=request.output_schema is not None)

    async def astream(self, request: ModelRequest) -> AsyncIterator[RawStreamEvent]:
        sdk = _load_sdk()
        create = self._loop_client(sdk).messages.create
        base = request_to_kwargs(request, self.model_id)
        kwargs = base
        replies: list[dict[str, Any]] = []
        try:
            while True:
                acc = StreamAccumulator(self.model_id)
                events = await create(**fit_kwargs(create, {**kwargs, "stream": True}))
                try:
                    async for event in events:
                        out = acc.feed(event)
                        if out is not None:
                            yield out
                finally:
                    close = getattr(events, "close", None)
                    if close is not None:
                        await close()
                reply = acc.finish()
                replies.append(reply)
                if reply.get("stop_reason") != "pause_turn":
                    break
                kwargs = continuation_kwargs(base, replies, self.model_id)
        except sdk.errors as exc:
            raise _sdk_error(sdk, exc, self.model_id) from exc
        yield RawStreamEvent(
            "response_done",
            response=parse_response(
                replies, self.model_id, structured=request.output_schema is not None
            ),
        )


def _last_response(events: Iterator[RawStreamEvent]) -> ModelResponse:
    # The adapter's streams end in exactly one response_done, or raise.
    last = None
    for last in events:
        pass
    return last.response  # type: ignore[union-attr, return-value]


async def _alast_response(events: AsyncIterator[RawStreamEvent]) -> ModelResponse:
    last = None
    async for last in events:
        pass
    return last.response  # type: ignore[union-attr, return-value]


def create_model(model_id: str) -> AnthropicModel:
    """The registry's factory for ``'anthropic/<model_id>'``."""
    return AnthropicModel(model_id)
