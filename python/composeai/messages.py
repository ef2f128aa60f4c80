"""Conversation message types and token usage."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from . import _codec

__all__ = [
    "ContentPart",
    "ImagePart",
    "Message",
    "StopReason",
    "TextPart",
    "ThinkingPart",
    "ToolCallPart",
    "ToolResultPart",
    "Usage",
]

_FROZEN = ConfigDict(frozen=True)
_M = TypeVar("_M", bound=BaseModel)


class TextPart(BaseModel):
    """Text in a message."""

    model_config = _FROZEN
    type: Literal["text"] = "text"
    text: str


class ImagePart(BaseModel):
    """An image in a message: base64 `data` or a `url` (exactly one), of `media_type`."""

    model_config = _FROZEN
    type: Literal["image"] = "image"
    media_type: str
    data: str | None = None
    url: str | None = None

    @model_validator(mode="after")
    def _exactly_one_source(self) -> ImagePart:
        if (self.data is None) == (self.url is None):
            raise ValueError("ImagePart requires exactly one of `data` or `url`, not both/neither")
        return self


class ToolCallPart(BaseModel):
    """The model asking for a tool call: the tool's `name`, its `arguments`, and the
    call's `id` that the result refers to."""

    model_config = _FROZEN
    type: Literal["tool_call"] = "tool_call"
    id: str
    name: str
    arguments: dict[str, Any]


class ToolResultPart(BaseModel):
    """The result of the tool call `tool_call_id` sent back to the model; `is_error`
    marks a failure, a denial or a blocked call."""

    model_config = _FROZEN
    type: Literal["tool_result"] = "tool_result"
    tool_call_id: str
    content: str
    is_error: bool = False


class ThinkingPart(BaseModel):
    """The model's reasoning, with the provider's opaque token that lets it be sent
    back on the next turn."""

    model_config = _FROZEN
    type: Literal["thinking"] = "thinking"
    text: str = ""
    provider_token: str | None = None
    provider: str | None = None


ContentPart = Annotated[
    TextPart | ImagePart | ToolCallPart | ToolResultPart | ThinkingPart,
    Field(discriminator="type"),
]
"""Any part of a message, told apart by its `type` field."""


def _parts(text_or_parts: str | list[Any]) -> list[Any]:
    if isinstance(text_or_parts, str):
        return [TextPart(text=text_or_parts)]
    return list(text_or_parts)


class Message(BaseModel):
    """One message of a conversation: its `role` and its `parts`.

    `Message.user(text)` and `Message.assistant(text)` make a text message;
    `text` joins the message's text parts.
    """

    model_config = _FROZEN
    role: Literal["user", "assistant"]
    parts: list[ContentPart]

    @classmethod
    def user(cls, text_or_parts: str | list[Any]) -> Message:
        if cls is Message and type(text_or_parts) is str:
            return _text_message("user", text_or_parts)
        return cls(role="user", parts=_parts(text_or_parts))

    @classmethod
    def assistant(cls, text_or_parts: str | list[Any]) -> Message:
        if cls is Message and type(text_or_parts) is str:
            return _text_message("assistant", text_or_parts)
        return cls(role="assistant", parts=_parts(text_or_parts))

    @property
    def text(self) -> str:
        parts = self.parts
        if len(parts) == 1 and type(parts[0]) is TextPart:  # a plain text reply
            return parts[0].text
        return "".join(p.text for p in parts if isinstance(p, TextPart))


def _text_part(text: Any) -> TextPart:
    """`TextPart(text=text)` for a `str` text, built as `model_construct`
    builds (nothing here can fail validation), without its per-field loop:
    the same fields, fields-set and state. Any other value is validated."""
    if type(text) is not str:
        return TextPart(text=text)
    return _built(TextPart, {"type": "text", "text": text}, {"text"})


def _message_of(role: Literal["user", "assistant"], parts: list[Any]) -> Message:
    """`Message(role=role, parts=parts)` for a valid role and parts that are
    all instances of the part classes themselves: validation would keep
    each part as it is (instances are not revalidated), so it is skipped."""
    for part in parts:
        if type(part) not in _PART_TYPES:
            return Message(role=role, parts=parts)
    return _built(Message, {"role": role, "parts": list(parts)}, {"role", "parts"})


def _text_message(role: Literal["user", "assistant"], text: str) -> Message:
    """`_message_of(role, [_text_part(text)])` of a `str` text, without the
    checks its one new part cannot fail."""
    part = _built(TextPart, {"type": "text", "text": text}, {"text"})
    return _built(Message, {"role": role, "parts": [part]}, {"role", "parts"})


def _built(cls: type[_M], values: dict[str, Any], fields_set: set[str]) -> _M:
    """A `cls` holding `values` in the state `model_construct` leaves it in."""
    obj = _new(cls)
    _set_dict(obj, values)
    _set_fields_set(obj, fields_set)
    _set_extra(obj, None)
    _set_private(obj, None)
    return obj


_new = object.__new__
# The setters of `BaseModel`'s four slots, called directly: about half the
# cost of `object.__setattr__`, which looks each one up by name.
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__
_PART_TYPES = frozenset((TextPart, ImagePart, ToolCallPart, ToolResultPart, ThinkingPart))


class StopReason(str, Enum):
    """Why the model stopped: it finished, ran out of tokens, asked for tools,
    refused, failed, or another reason (`raw_stop_reason` has the provider's)."""

    END_TURN = "end_turn"
    MAX_TOKENS = "max_tokens"
    TOOL_USE = "tool_use"
    REFUSAL = "refusal"
    ERROR = "error"
    OTHER = "other"


class Usage(BaseModel):
    """Tokens and cost of one or more model calls. `Usage()` means nothing yet."""

    model_config = _FROZEN
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_creation_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float | None = None
    cost_complete: bool = True

    def __add__(self, other: object) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        if self.cost_usd is None and other.cost_usd is None:
            cost = None
        else:
            cost = (self.cost_usd or 0) + (other.cost_usd or 0)
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_creation_tokens=self.cache_creation_tokens + other.cache_creation_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            cost_usd=cost,
            cost_complete=self.cost_complete and other.cost_complete,
        )


# AGENT-65: journals and snapshots holding these decode in any process that
# imported composeai.messages.
for _cls in (
    TextPart,
    ImagePart,
    ToolCallPart,
    ToolResultPart,
    ThinkingPart,
    Message,
    Usage,
    StopReason,
):
    _codec.register_serializable(_cls)
del _cls
