"""Spans and traces (OBS-10 … OBS-25)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Span", "Trace", "ErrorInfo", "render_trace", "render_trace_mermaid"]


@dataclass(slots=True)
class ErrorInfo:
    type: str
    message: str
    stacktrace: str = ""


def _capture_content() -> bool:
    return os.environ.get("COMPOSE_TRACE_CONTENT") != "0"


@dataclass(kw_only=True, slots=True)
class Span:
    trace_id: str
    span_id: str
    parent_span_id: str | None = None
    kind: str
    name: str
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    status: str = "running"
    error: ErrorInfo | None = None
    input: Any = None
    output: Any = None
    usage: Any = None
    attributes: dict[str, Any] = field(default_factory=dict)
    replayed: bool = False

    @property
    def duration_ms(self) -> float | None:
        if self.ended_at is None:
            return None
        return (self.ended_at - self.started_at) * 1000.0

    def set_input(self, value: Any) -> None:
        if _capture_content():
            self.input = value

    def set_output(self, value: Any) -> None:
        if _capture_content():
            self.output = value


class Trace:
    def __init__(self, trace_id: str, spans: list[Span] | None = None):
        self.trace_id = trace_id
        self.spans: list[Span] = list(spans) if spans else []

    def add(self, span: Span) -> None:
        self.spans.append(span)
