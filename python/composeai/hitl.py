"""Human-in-the-loop: `approve()` and `ask_human()`."""

from __future__ import annotations

from . import _engine

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["ApprovalReply", "Interrupt", "approve", "ask_human"]  # noqa: F822 -- loaded lazily


def approve(id: str, payload: Any = None) -> bool:
    """Asks a person for a yes or no; returns the answer.

    The first time a run reaches it, the run pauses (its status becomes
    `paused`, `Run.pending` holds the question) until it is answered with
    `resume(run_id, answers={id: True})`, `compose answer` or the web UI.
    The answer is journaled, so later replays return it at once.

    Args:
        id: names the question; the same id always reads the same answer.
        payload: what the person needs to decide, stored with the question.
    """
    return bool(_engine.interrupt(id, "approval", None, payload))


def ask_human(id: str, question: str, payload: Any = None) -> Any:
    """Asks a person a question; returns their answer (any JSON value).

    Pauses the run like `approve()` until question `id` is answered; the
    answer is journaled.

    Args:
        id: names the question; the same id always reads the same answer.
        question: the text shown to the person.
        payload: context stored with the question.
    """
    return _engine.interrupt(id, "question", question, payload)


def __getattr__(name: str) -> Any:
    if name == "Interrupt":
        from ._interrupt import Interrupt

        return Interrupt
    if name == "ApprovalReply":
        from ._approval import ApprovalReply

        return ApprovalReply
    raise AttributeError(f"module 'composeai.hitl' has no attribute {name!r}")
