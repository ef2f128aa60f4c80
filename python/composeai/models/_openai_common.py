"""What the OpenAI and OpenAI-compatible adapters share.

The SDK is imported on first call, never at import or construction. Clients are built lazily
and kept on the instance as ``_client`` / ``_async_client`` (test suites patch those). An
async client belongs to the event loop it was built on, so a model used from a later loop
gets a fresh one. Every failure raised by the SDK or its HTTP stack surfaces as
``ProviderError``, so ``retries=`` / ``fallback=`` act on it.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
import threading
from typing import Any

from composeai.errors import ComposeError, ConfigError, ProviderError
from composeai.messages import Usage
from composeai.models.prices import get_price, resolved_rates

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from composeai.models.base import ModelRequest, ModelResponse, RawStreamEvent

_SDK: Any = None


def sdk() -> Any:
    """The ``openai`` package, imported on first use."""
    global _SDK
    if _SDK is None:
        try:
            import openai
        except ModuleNotFoundError as exc:
            if exc.name == "openai" or (exc.name or "").startswith("openai."):
                raise ConfigError(
                    "Install the provider SDK: pip install 'composeai[openai]'"
                ) from exc
            raise
        _SDK = openai
    return _SDK


def get(obj: Any, key: str) -> Any:
    """``obj[key]`` for a dict, ``obj.key`` for an SDK object; ``None`` when absent.

    The wire mappers read SDK objects and plain JSON dicts alike, so tests can feed them
    either and streamed responses can be reassembled as dicts."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, key, None)


def _raw_method(client: Any, method: Any, own_class: type) -> Any:
    """The ``with_raw_response`` twin of ``method`` when ``client`` is the SDK's own client
    class and ``method`` its own: the reply is then read from its JSON body (the mappers read
    dicts and SDK objects alike), skipping the typed model the SDK would build. ``None`` for
    anything else (an injected stub, a patched method), which is called as given."""
    fn = getattr(method, "__func__", None)
    if type(client) is not own_class or not getattr(fn, "__module__", "").startswith("openai."):
        return None
    assert fn is not None  # a missing `__func__` has no module: returned above
    return getattr(method.__self__.with_raw_response, fn.__name__, None)


def _raw_json(raw: Any, typed: Any) -> dict[str, Any] | None:
    """A raw SDK response's body when it is a JSON object that ``typed`` does not claim
    (anything else is left to the SDK's own parsing, as a plain call would)."""
    try:
        data = raw.http_response.json()
    except ValueError:
        return None
    if not isinstance(data, dict) or (typed is not None and typed(data)):
        return None
    return data


# -- strict flag (PROV-17) ---------------------------------------------------

_UNSUPPORTED = frozenset(
    [
        "minLength",
        "maxLength",
        "pattern",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "patternProperties",
        "unevaluatedProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "unevaluatedItems",
        "contains",
        "minContains",
        "maxContains",
        "minItems",
        "maxItems",
        "uniqueItems",
    ]
)
_FORMATS = frozenset(
    ["date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"]
)
# Keywords whose value is a map of names to subschemas, or a subschema / list of them.
_NAMED_SUBSCHEMAS = ("properties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMAS = ("items", "additionalItems", "not", "if", "then", "else")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")


def strict_flag(schema: Any) -> bool:
    """Whether ``schema`` fits strict structured decoding. Never mutates it.

    Walks the schema by keyword, so a property *named* ``default`` or ``pattern`` is a
    name, not a keyword, and data values (``enum``, ``const``, ``examples``) are not
    searched."""
    if not isinstance(schema, dict):
        return True
    if "default" in schema:
        return False
    if isinstance(schema.get("additionalProperties"), dict):
        return False
    if not _UNSUPPORTED.isdisjoint(schema):
        return False
    fmt = schema.get("format")
    if fmt is not None and fmt not in _FORMATS:
        return False
    props = schema.get("properties")
    if isinstance(props, dict) and props:
        required = schema.get("required") or []
        if set(required) != set(props):
            return False
    for key in _NAMED_SUBSCHEMAS:
        named = schema.get(key)
        if isinstance(named, dict) and not all(strict_flag(s) for s in named.values()):
            return False
    for key in _SUBSCHEMAS:
        sub = schema.get(key)
        if isinstance(sub, dict) and not strict_flag(sub):
            return False
    for key in _SUBSCHEMA_LISTS:
        subs = schema.get(key)
        if isinstance(subs, list) and not all(strict_flag(s) for s in subs):
            return False
    return True


_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def schema_name(schema: dict) -> str:
    """The schema's ``title`` when it is a valid format name, else ``"response"``."""
    title = schema.get("title")
    if isinstance(title, str) and _NAME.match(title):
        return title
    return "response"


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# -- usage and cost (PROV-19, PROV-26) ---------------------------------------


def make_usage(
    provider: str,
    model_id: str,
    input_tokens: int,
    output_tokens: int,
    cached: int,
    reasoning: int,
    cache_creation: int = 0,
) -> Usage:
    """Tokens and cost; ``input_tokens`` includes the cached ones, which cost the cache-read
    price instead of the input price. Unpriced models have no cost."""
    price = get_price(provider, model_id)
    cost = None
    if price is not None:
        p = resolved_rates(price)
        cost = (
            (input_tokens - cached) * p.input + output_tokens * p.output + cached * p.cache_read
        ) / 1_000_000
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_read_tokens=cached,
        cache_creation_tokens=cache_creation,
        reasoning_tokens=reasoning,
        cost_usd=cost,
        cost_complete=price is not None,
    )


NO_USAGE = Usage(cost_usd=None, cost_complete=False)


# -- SDK drift: fields the SDK method no longer names go through extra_body ----

_ACCEPTED: dict[Any, frozenset[str] | None] = {}


def _accepted(method: Any) -> frozenset[str] | None:
    """The keyword names ``method`` takes (``None``: it takes any). Cached per function."""
    key = getattr(method, "__func__", method)
    try:
        return _ACCEPTED[key]
    except (KeyError, TypeError):
        pass
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        names = None
    else:
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            names = None
        else:
            names = frozenset(p.name for p in params)
    try:
        _ACCEPTED[key] = names
    except TypeError:
        pass
    return names


def fit_kwargs(method: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` for ``method``: any field it does not accept as a keyword moves into
    ``extra_body`` so it still reaches the wire (decided before the call, never by catching
    a ``TypeError`` after a billed request)."""
    accepted = _accepted(method)
    if accepted is None or "extra_body" not in accepted:
        return kwargs
    if all(k in accepted for k in kwargs):
        return kwargs
    fitted: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for k, v in kwargs.items():
        if k in accepted:
            fitted[k] = v
        else:
            extra[k] = v
    fitted["extra_body"] = {**extra, **(kwargs.get("extra_body") or {})}
    return fitted


# -- clients, loops and errors -----------------------------------------------


class OpenAIClientBase:
    """Lazy sync/async SDK clients with the key check and error wrapping.

    Subclasses set ``_provider`` (error and price label) and ``_display`` (message prefix)
    and implement ``_api_key_value()``."""

    _provider = "openai"
    _display = "OpenAI"
    # What `llm` spans name as `gen_ai.provider.name`. OpenTelemetry's GenAI conventions
    # name the client's API flavour, by the instrumentation's best knowledge: a server
    # reached through the OpenAI API (another base_url, a compatible server) is still
    # "openai", the request's model and server address telling the actual system apart.
    provider_name = "openai"
    # Subclasses define the async twins; None when absent (PROV-4).
    acomplete: Callable[[ModelRequest], Awaitable[ModelResponse]] | None
    astream: Callable[[ModelRequest], AsyncIterator[RawStreamEvent]] | None

    def __init__(
        self,
        model_id: str,
        *,
        client: Any,
        api_key: str | None,
        max_retries: int | None,
        base_url: str | None,
        timeout: float | None,
    ) -> None:
        self.model_id = model_id
        self._api_key = api_key
        self._max_retries = max_retries
        self._base_url = base_url
        self._timeout = timeout
        self._client = client
        self._async_client: Any = None
        # The async client this instance built and the loop it belongs to; a client the user
        # assigned to ``_async_client`` is used as given.
        self._built_async: Any = None
        self._async_loop: Any = None
        self._lock = threading.Lock()
        if client is not None:
            # An injected client is sync-only: the async twins count as absent (PROV-4).
            self.acomplete = None
            self.astream = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model_id!r})"

    def _api_key_value(self) -> str | None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _client_kwargs(self) -> dict[str, Any]:
        kwargs = {
            "api_key": self._api_key_value(),
            "max_retries": self._max_retries,
            "base_url": self._base_url,
            "timeout": self._timeout,
        }
        return {k: v for k, v in kwargs.items() if v is not None}

    def _sync_client(self) -> Any:
        openai = sdk()
        client = self._client
        if client is None:
            with self._lock:
                client = self._client
                if client is None:
                    client = self._client = openai.OpenAI(**self._client_kwargs())
        return client

    def _aclient(self) -> Any:
        import asyncio

        openai = sdk()
        loop = asyncio.get_running_loop()
        client = self._async_client
        if client is not None and (client is not self._built_async or self._async_loop is loop):
            return client
        # Built here, or built on another (usually closed) loop: its connection pool
        # belongs to that loop, so requests through it would fail and be retried.
        client = openai.AsyncOpenAI(**self._client_kwargs())
        self._async_client = self._built_async = client
        self._async_loop = loop
        return client

    def _error(self, exc: BaseException) -> ProviderError:
        """``exc`` (from the SDK or its HTTP stack) as a ``ProviderError``."""
        openai = sys.modules.get("openai")
        if openai is not None and isinstance(exc, openai.APIError):
            message = str(exc)
        else:
            message = f"{self._display} request failed: {type(exc).__name__}: {exc}"
        return ProviderError(message, provider=self._provider, model=self.model_id)

    def _fail(self, message: str) -> ProviderError:
        return ProviderError(message, provider=self._provider, model=self.model_id)

    def _call(self, method: Any, kwargs: dict[str, Any]) -> Any:
        try:
            return method(**fit_kwargs(method, kwargs))
        except ComposeError:
            raise
        except Exception as exc:
            raise self._error(exc) from exc

    def _call_reply(
        self, client: Any, method: Any, kwargs: dict[str, Any], typed: Any = None
    ) -> Any:
        """``_call`` of a non-streaming ``create`` whose reply the mappers read: through the
        SDK's raw response when ``method`` is the SDK client's own (see ``_raw_method``); a
        body for which ``typed(body)`` holds is read through the SDK's typed model still."""
        raw_method = _raw_method(client, method, sdk().OpenAI)
        if raw_method is None:
            return self._call(method, kwargs)
        try:
            raw = raw_method(**fit_kwargs(method, kwargs))
            data = _raw_json(raw, typed)
            return raw.parse() if data is None else data
        except ComposeError:
            raise
        except Exception as exc:
            raise self._error(exc) from exc

    async def _acall_reply(
        self, client: Any, method: Any, kwargs: dict[str, Any], typed: Any = None
    ) -> Any:
        raw_method = _raw_method(client, method, sdk().AsyncOpenAI)
        if raw_method is None:
            return await self._acall(method, kwargs)
        try:
            raw = await raw_method(**fit_kwargs(method, kwargs))
            data = _raw_json(raw, typed)
            if data is not None:
                return data
            parsed = raw.parse()  # a coroutine on SDKs whose async raw responses parse lazily
            return await parsed if inspect.isawaitable(parsed) else parsed
        except ComposeError:
            raise
        except Exception as exc:
            raise self._error(exc) from exc

    async def _acall(self, method: Any, kwargs: dict[str, Any]) -> Any:
        try:
            return await method(**fit_kwargs(method, kwargs))
        except ComposeError:
            raise
        except Exception as exc:
            raise self._error(exc) from exc

    def _next(self, iterator: Any) -> Any:
        """The next item of an SDK stream; ``StopIteration`` passes through."""
        try:
            return next(iterator)
        except (StopIteration, ComposeError):
            raise
        except Exception as exc:
            raise self._error(exc) from exc

    async def _anext(self, iterator: Any) -> Any:
        try:
            return await iterator.__anext__()
        except (StopAsyncIteration, ComposeError):
            raise
        except Exception as exc:
            raise self._error(exc) from exc
