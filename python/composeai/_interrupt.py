"""The `Interrupt` model, kept apart so that importing
`composeai.hitl` does not import pydantic."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from . import _codec


class Interrupt(BaseModel):
    """What a paused run waits on: a person's answer, or (kinds `timer` and
    `signal`) the end of a durable wait. `Run.pending` holds it.

    Attributes:
        id: the interrupt's id: the key of its answer in
            `resume(run_id, answers={id: ...})`; `tool:<tool>:<call id>` for
            a gated tool call.
        kind: `"approval"` (yes or no), `"question"` (any JSON answer),
            `"timer"` or `"signal"`.
        question: the text of an `ask_human()` question.
        payload: what the person needs to decide (a gated tool call's
            `{"tool": ..., "arguments": ...}`), or the wait's wake time or
            signal name.
    """

    model_config = ConfigDict(frozen=True)

    id: str
    kind: Literal["approval", "question", "timer", "signal"]
    question: str | None = None
    payload: Any = None


Interrupt.__module__ = "composeai.hitl"
_codec.register_serializable(Interrupt)
