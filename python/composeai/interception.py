"""Tool-call interception: `BeforeTool` and `ToolInterceptor`."""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from .messages import ToolCallPart, ToolResultPart

__all__ = ["BeforeTool", "ToolInterceptor"]


class BeforeTool(BaseModel):
    """The verdict of `ToolInterceptor.before` on one tool call.

    `action="proceed"` runs the call (with `arguments` replacing the call's arguments when
    given); `action="deny"` skips the approver and the execution, and the call's result is
    `message` (default `"blocked by tool interceptor"`) with `is_error=True`.
    """

    model_config = ConfigDict(frozen=True)

    action: Literal["proceed", "deny"] = "proceed"
    arguments: dict[str, Any] | None = None
    message: str | None = None


@runtime_checkable
class ToolInterceptor(Protocol):
    """Hooks around every live tool execution of an agent run."""

    def before(self, call: ToolCallPart) -> BeforeTool | None:
        """Called before the call runs; `None` means proceed unchanged."""
        ...

    def after(self, call: ToolCallPart, result: ToolResultPart) -> ToolResultPart | None:
        """Called after a live execution; a non-`None` return replaces the result."""
        ...
