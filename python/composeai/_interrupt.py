"""The `Interrupt` model, kept apart so that importing
`composeai.hitl` does not import pydantic."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from . import _codec


class Interrupt(BaseModel):
    """A pause waiting for a human answer, or (kinds `timer`, `signal`) a
    run parked on a durable wait."""

    model_config = ConfigDict(frozen=True)

    id: str
    kind: Literal["approval", "question", "timer", "signal"]
    question: str | None = None
    payload: Any = None


Interrupt.__module__ = "composeai.hitl"
_codec.register_serializable(Interrupt)
