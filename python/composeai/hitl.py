"""Human-in-the-loop: `approve()` and `ask_human()`."""

from __future__ import annotations

from . import _engine

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["ApprovalReply", "Interrupt", "approve", "ask_human"]  # noqa: F822 -- loaded lazily


def approve(id: str, payload: Any = None) -> bool:
    """The journaled answer to approval `id` as a bool; pauses the run when
    there is none yet."""
    return bool(_engine.interrupt(id, "approval", None, payload))


def ask_human(id: str, question: str, payload: Any = None) -> Any:
    """The journaled answer to question `id`; pauses the run when there is
    none yet."""
    return _engine.interrupt(id, "question", question, payload)


def __getattr__(name: str) -> Any:
    if name == "Interrupt":
        from ._interrupt import Interrupt

        return Interrupt
    if name == "ApprovalReply":
        from ._approval import ApprovalReply

        return ApprovalReply
    raise AttributeError(f"module 'composeai.hitl' has no attribute {name!r}")
