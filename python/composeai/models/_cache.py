"""The response cache of `@agent(cache=True)` and the request
hashes it and the cassettes key on. `composeai.testing` exports
them; they live with the models so that agents, below the test helpers,
can wrap a model in the cache."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .. import _codec, _core, _engine
from ..messages import Usage
from .base import ModelRequest, ModelResponse

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..messages import Message


def _canonical_hash(payload: Any) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return _core.sha256_hex(text)


def compute_message_hash(system: str | None, messages: Sequence[Message]) -> str:
    """SHA-256 (hex) of the system prompt and messages only."""
    return _canonical_hash(
        {"system": system, "messages": [m.model_dump(mode="json") for m in messages]}
    )


def compute_full_hash(request: ModelRequest) -> str:
    """SHA-256 (hex) of everything in ``request`` that affects the reply.

    ``prompt_cache`` is never hashed; ``thinking``/``effort``/``thinking_budget`` only when set.
    """
    tools = request.tools
    payload: dict[str, Any] = {
        "provider": request.provider,
        "model": request.model,
        "system": request.system,
        "messages": [m.model_dump(mode="json") for m in request.messages],
        "tools": None
        if tools is None
        else [
            {
                "name": t.name,
                "description": t.description,
                "input_schema": t.input_schema,
                "strict": t.strict,
                "requires_approval": t.requires_approval,
            }
            for t in sorted(tools, key=lambda t: t.name)
        ],
        "output_schema": request.output_schema,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
    }
    for key in ("thinking", "effort", "thinking_budget"):
        value = getattr(request, key)
        if value is not None:
            payload[key] = value
    return _canonical_hash(payload)


class CachingModel:
    """Wraps a model with an on-disk response cache keyed by the request's
    full hash: a hit is returned with `Usage()`, never re-billed."""

    def __init__(self, inner: Any, cache_dir: str | None = None):
        import contextvars
        import os

        self.inner = inner
        self.cache_dir = cache_dir or os.path.join(_engine.state_dir(), "cache")
        self._hit: contextvars.ContextVar[bool] = contextvars.ContextVar(
            "composeai.cache_hit", default=False
        )
        if getattr(inner, "acomplete", None) is not None:
            self.acomplete = self._acomplete
        if getattr(inner, "stream", None) is not None:
            self.stream = inner.stream
        if getattr(inner, "astream", None) is not None:
            self.astream = inner.astream
        model_id = getattr(inner, "model_id", None)
        if model_id:
            self.model_id = model_id
        provider_name = getattr(inner, "provider_name", None)
        if provider_name:
            self.provider_name = provider_name

    @property
    def last_was_hit(self) -> bool:
        """Whether this thread's or task's latest call was served from the cache."""
        return self._hit.get()

    def _path(self, request: ModelRequest) -> str:
        import os

        return os.path.join(self.cache_dir, f"{compute_full_hash(request)}.json")

    def _lookup(self, path: str) -> ModelResponse | None:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return None
        cached = _codec.loads(text)
        self._hit.set(True)
        return ModelResponse(
            message=cached.message,
            stop_reason=cached.stop_reason,
            raw_stop_reason=cached.raw_stop_reason,
            usage=Usage(),
            model_id=cached.model_id,
            parsed=cached.parsed,
        )

    def _store(self, path: str, response: ModelResponse) -> None:
        import os
        import tempfile

        os.makedirs(self.cache_dir, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.cache_dir, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(_codec.encode(response)))
        os.replace(tmp, path)

    def complete(self, request: ModelRequest) -> ModelResponse:
        path = self._path(request)
        cached = self._lookup(path)
        if cached is not None:
            return cached
        self._hit.set(False)
        response = self.inner.complete(request)
        self._store(path, response)
        return response

    async def _acomplete(self, request: ModelRequest) -> ModelResponse:
        path = self._path(request)
        cached = self._lookup(path)
        if cached is not None:
            return cached
        self._hit.set(False)
        response = await self.inner.acomplete(request)
        self._store(path, response)
        return response


CachingModel.__module__ = "composeai.testing"
