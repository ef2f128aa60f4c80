"""What one agent call carries: the model and output schema
worked out at decoration time, the per-call state (`_Call`), the call's
overrides and its budget meters.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import _codec, _engine
from ._cancel import current_cancel_token
from ._engine import BUDGETS, Frame, RunState
from .errors import ConfigError
from .events import _BUS
from .messages import Message, ToolResultPart
from .models import registry as _registry

if TYPE_CHECKING:
    # `agentfn.AgentFunction`: that module sits above this one.
    AgentFunction = Any


# `events.current_bus`, called without a Python frame of its own.
_current_bus = _BUS.get


# ---------------------------------------------------------------------------
# Decoration-time analysis


def _signature_types(fn: Callable) -> tuple[Any, Any]:
    """Input = first parameter's annotation, output = return
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
    """The sealed JSON schema sent on every turn, and whether the
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
    """`(label, bare id, provider)` of a model string or instance."""
    if isinstance(model, str):
        from .models.registry import parse_model_string

        provider, model_id = parse_model_string(model)
        return model, model_id, provider
    label = getattr(model, "model_id", None) or type(model).__name__
    return label, label, None


def _provider_name(model: Any, provider: str | None) -> str | None:
    """The provider an `llm` span names (OpenTelemetry's `gen_ai.provider.name`): a
    model string's prefix, else what a model instance reports as `provider_name`.
    The request's own `provider` stays `None` for an instance, so the response
    cache's keys do not change with it."""
    if provider is not None:
        return provider
    name = getattr(model, "provider_name", None)
    return name if isinstance(name, str) and name else None


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
            name = self.agent.name
            raise ConfigError(
                f"@agent '{name}' has no model -- give it one: @agent(model=...) with a "
                "'provider/model-id' string (e.g. 'anthropic/claude-sonnet-4-5') or a Model "
                f"instance (e.g. composeai.testing.FakeModel([...]) in tests), or pass model= "
                f"to the call: {name}.run(..., model=...)"
            )
        self.model = self._resolve(spec)
        self.label, self.model_id, self.provider = _model_label(spec)
        self.provider_name = _provider_name(self.model, self.provider)

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
        self.provider_name = _provider_name(self.model, self.provider)
        self.fallback_active = True
        self.frame.span.attributes["fallback_used"] = self.label
        return True

    def snapshot_row(self) -> tuple:
        partial = _codec.dumps(self.partial) if self.partial else None
        return (self.snapshot_scope, _codec.dumps(self.messages), partial, self.turn)


def _check_cancel() -> None:
    token = current_cancel_token()
    if token is not None and token.cancelled:
        raise _engine._Cancelled()


def _overrides(budget, system, model, approver, tool_interceptor, context_manager) -> dict:
    return {
        "budget": budget,
        "system": system,
        "model": model,
        "approver": approver,
        "tool_interceptor": tool_interceptor,
        "context_manager": context_manager,
    }


def _push_budget(meter: Any):
    if meter is None:
        return None
    return BUDGETS.set(BUDGETS.get() + (meter,))


def _pop_budget(token: Any) -> None:
    if token is not None:
        BUDGETS.reset(token)
