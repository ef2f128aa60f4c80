"""A graph's nodes as the builder records them."""

from __future__ import annotations

import inspect
from typing import Any


def _is_agent(node: Any) -> bool:
    import sys

    agentfn = sys.modules.get("composeai.agentfn")
    return agentfn is not None and isinstance(node, agentfn.AgentFunction)


class _Node:
    __slots__ = ("fn", "is_agent", "is_async", "name", "takes_ctx")

    def __init__(self, name: str, fn: Any):
        self.name = name
        self.fn = fn
        self.is_agent = _is_agent(fn)
        self.is_async = False
        self.takes_ctx = False
        if not self.is_agent:
            self.is_async = inspect.iscoroutinefunction(fn) or (
                not inspect.isfunction(fn) and inspect.iscoroutinefunction(type(fn).__call__)
            )
            self.takes_ctx = _positional_count(fn) >= 2


def _positional_count(fn: Any) -> int:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 1
    count = 0
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            count += 1
        elif p.kind == p.VAR_POSITIONAL:
            return 2
    return count


def _check_name(what: str, name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a node name (str), got {type(name).__name__}")
    return name
