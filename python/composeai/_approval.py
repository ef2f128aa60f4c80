"""The `ApprovalReply` model, kept apart so that importing
`composeai.hitl` does not import pydantic."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from . import _codec


class ApprovalReply(BaseModel):
    """An approver's decision on an approval-gated tool call; `message` is the
    denied call's result text and is ignored when `allow=True`."""

    model_config = ConfigDict(frozen=True)

    allow: bool
    message: str | None = None


ApprovalReply.__module__ = "composeai.hitl"
_codec.register_serializable(ApprovalReply)
