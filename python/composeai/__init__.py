"""composeai: durable, journaled AI-agent workflows with a Rust engine.

Importing the package stays cheap: names whose modules need pydantic are
loaded on first access.
"""

from __future__ import annotations

# `chat` is bound after its submodule loads (an import of the submodule
# would otherwise rebind the package attribute to the module); the module
# needs nothing that is not loaded already.
from .chat import Chat, chat, load_chat
from .flow import anow, arandom, aresume, flow, now, random, resume, task
from .hitl import approve, ask_human
from .runs import Budget, Run

TYPE_CHECKING = False
if TYPE_CHECKING:  # the lazily loaded names of `_LAZY`, for type checkers (PKG-4)
    from typing import Any

    from ._approval import ApprovalReply
    from ._codec import register_module_types, register_serializable
    from ._interrupt import Interrupt
    from .agentfn import agent, prompt
    from .combinators import MapResult, aggregate, amap, map, pipe
    from .interception import BeforeTool, ToolInterceptor
    from .mcp import mcp_tools
    from .models.compatible import openai_compatible
    from .models.prices import ModelPrice, register_price
    from .tools import tool

from ._version import __version__ as __version__

__all__ = [
    "ApprovalReply",
    "BeforeTool",
    "Budget",
    "Chat",
    "Interrupt",
    "MapResult",
    "ModelPrice",
    "Run",
    "ToolInterceptor",
    "agent",
    "aggregate",
    "amap",
    "anow",
    "approve",
    "arandom",
    "aresume",
    "ask_human",
    "chat",
    "flow",
    "load_chat",
    "map",
    "mcp_tools",
    "now",
    "openai_compatible",
    "pipe",
    "prompt",
    "random",
    "register_module_types",
    "register_price",
    "register_serializable",
    "resume",
    "task",
    "tool",
]

_LAZY = {
    "ApprovalReply": ("._approval", "ApprovalReply"),
    "BeforeTool": (".interception", "BeforeTool"),
    "ToolInterceptor": (".interception", "ToolInterceptor"),
    "ModelPrice": (".models.prices", "ModelPrice"),
    "openai_compatible": (".models.compatible", "openai_compatible"),
    "register_price": (".models.prices", "register_price"),
    "agent": (".agentfn", "agent"),
    "prompt": (".agentfn", "prompt"),
    "tool": (".tools", "tool"),
    "mcp_tools": (".mcp", "mcp_tools"),
    "Interrupt": ("._interrupt", "Interrupt"),
    "register_serializable": ("._codec", "register_serializable"),
    "register_module_types": ("._codec", "register_module_types"),
    # The combinators (and the stage typing they check with) load on first use.
    "MapResult": (".combinators", "MapResult"),
    "aggregate": (".combinators", "aggregate"),
    "amap": (".combinators", "amap"),
    "map": (".combinators", "map"),
    "pipe": (".combinators", "pipe"),
}

# The durable primitives (EXT-0.2) are attributes, not listed in `__all__`.
_LAZY.update(
    {
        name: (".durable", name)
        for name in (
            "sleep",
            "asleep",
            "signal",
            "asignal",
            "receive",
            "areceive",
            "receive_all",
            "cancel",
            "acancel",
            "wake_due",
            "get_run",
            "RunHandle",
            "TaskFailed",
            "start",
            "gather",
            "StepHandle",
            "await_until",
        )
    }
)
_LAZY["RetryPolicy"] = ("._retry", "RetryPolicy")
# Replay safety (issue 27): attributes, like the durable primitives.
_LAZY["NondeterminismError"] = (".errors", "NondeterminismError")
_LAZY["NondeterminismWarning"] = (".errors", "NondeterminismWarning")
_LAZY["fork"] = ("._replay", "fork")
_LAZY["Queue"] = (".queues", "Queue")
# Store selection (STORE-1) is an attribute too.
_LAZY["configure"] = ("._engine", "configure")
# Patching flow code under runs in flight (OPS-2): attributes too.
_LAZY["patched"] = (".patching", "patched")
_LAZY["deprecate_patch"] = (".patching", "deprecate_patch")
# Reading runs from outside and retention (OPS-20 … OPS-23): attributes too.
_LAZY["list_runs"] = (".listing", "list_runs")
_LAZY["RunInfo"] = (".listing", "RunInfo")
_LAZY["delete_runs"] = (".retention", "delete_runs")
_LAZY.update(
    {
        name: (".published", name)
        for name in (
            "set_event",
            "get_event",
            "get_events",
            "write_stream",
            "close_stream",
            "read_stream",
            "aread_stream",
        )
    }
)


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'composeai' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(target[0], __name__), target[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_LAZY))
