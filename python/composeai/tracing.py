"""Spans and traces."""

from __future__ import annotations

import os
import reprlib
import sys
import time

from . import _dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["ErrorInfo", "Span", "Trace", "render_trace", "render_trace_mermaid"]


class ErrorInfo:
    """The error a span ended with: its exception `type`, `message` and
    `stacktrace` (empty for spans read back from the store)."""

    # `@dataclass(slots=True)`, written out; see `_dataclass`.
    __slots__ = ("type", "message", "stacktrace")  # noqa: RUF023 -- the fields' order
    type: str
    message: str
    stacktrace: str

    __dataclass_fields__ = _dataclass.metadata({"slots": True}, {"stacktrace": ""})
    __dataclass_params__ = _dataclass.metadata({"slots": True}, {"stacktrace": ""})
    __match_args__ = ("type", "message", "stacktrace")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, type: str, message: str, stacktrace: str = "") -> None:
        self.type = type
        self.message = message
        self.stacktrace = stacktrace

    @reprlib.recursive_repr()
    def __repr__(self) -> str:
        return (
            f"{self.__class__.__qualname__}(type={self.type!r}, message={self.message!r}, "
            f"stacktrace={self.stacktrace!r})"
        )

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return (self.type, self.message, self.stacktrace) == (
                other.type,  # type: ignore[attr-defined]
                other.message,  # type: ignore[attr-defined]
                other.stacktrace,  # type: ignore[attr-defined]
            )
        return NotImplemented


# OBS-70 reads the switch on every capture; on CPython's POSIX build the
# environment's raw mapping answers that without re-encoding the key.
_ENV_DATA = getattr(os.environ, "_data", None)
try:
    _CONTENT_KEY = os.environ.encodekey("COMPOSE_TRACE_CONTENT")  # type: ignore[attr-defined]
    _OFF = os.environ.encodevalue("0")  # type: ignore[attr-defined]
except AttributeError:
    _ENV_DATA = None


def _capture_content() -> bool:
    if _ENV_DATA is not None:
        return _ENV_DATA.get(_CONTENT_KEY) != _OFF
    return os.environ.get("COMPOSE_TRACE_CONTENT") != "0"


def _new_span_id() -> str:
    from . import _core

    return _core.ulid()


_SPAN_FIELDS = (
    "trace_id",
    "span_id",
    "parent_span_id",
    "kind",
    "name",
    "started_at",
    "ended_at",
    "status",
    "error",
    "input",
    "output",
    "usage",
    "attributes",
    "replayed",
)
_SPAN_DEFAULTS = {
    "parent_span_id": None,
    "ended_at": None,
    "status": "running",
    "error": None,
    "input": None,
    "output": None,
    "usage": None,
    "replayed": False,
}
_SPAN_FACTORIES = {"span_id": _new_span_id, "started_at": time.time, "attributes": dict}
_SPAN_PARAMS = {"kw_only": True, "slots": True}


class Span:
    """One timed operation of a trace; `span_id` defaults to a
    fresh ULID."""

    # `@dataclass(kw_only=True, slots=True)`, written out; see `_dataclass`.
    __slots__ = _SPAN_FIELDS
    trace_id: str
    span_id: str
    parent_span_id: str | None
    kind: str
    name: str
    started_at: float
    ended_at: float | None
    status: str
    error: ErrorInfo | None
    input: Any
    output: Any
    usage: Any
    attributes: dict[str, Any]
    replayed: bool

    __dataclass_fields__ = _dataclass.metadata(_SPAN_PARAMS, _SPAN_DEFAULTS, _SPAN_FACTORIES)
    __dataclass_params__ = _dataclass.metadata(_SPAN_PARAMS, _SPAN_DEFAULTS, _SPAN_FACTORIES)
    __match_args__ = ()
    __hash__ = None  # type: ignore[assignment]

    def __init__(
        self,
        *,
        trace_id: str,
        span_id: str = _dataclass.FACTORY,
        parent_span_id: str | None = None,
        kind: str,
        name: str,
        started_at: float = _dataclass.FACTORY,
        ended_at: float | None = None,
        status: str = "running",
        error: ErrorInfo | None = None,
        input: Any = None,
        output: Any = None,
        usage: Any = None,
        attributes: dict[str, Any] = _dataclass.FACTORY,
        replayed: bool = False,
    ) -> None:
        self.trace_id = trace_id
        self.span_id = _new_span_id() if span_id is _dataclass.FACTORY else span_id
        self.parent_span_id = parent_span_id
        self.kind = kind
        self.name = name
        self.started_at = time.time() if started_at is _dataclass.FACTORY else started_at
        self.ended_at = ended_at
        self.status = status
        self.error = error
        self.input = input
        self.output = output
        self.usage = usage
        self.attributes = {} if attributes is _dataclass.FACTORY else attributes
        self.replayed = replayed

    @reprlib.recursive_repr()
    def __repr__(self) -> str:
        return (
            f"{self.__class__.__qualname__}(trace_id={self.trace_id!r}, "
            f"span_id={self.span_id!r}, parent_span_id={self.parent_span_id!r}, "
            f"kind={self.kind!r}, name={self.name!r}, started_at={self.started_at!r}, "
            f"ended_at={self.ended_at!r}, status={self.status!r}, error={self.error!r}, "
            f"input={self.input!r}, output={self.output!r}, usage={self.usage!r}, "
            f"attributes={self.attributes!r}, replayed={self.replayed!r})"
        )

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return tuple(getattr(self, f) for f in _SPAN_FIELDS) == tuple(
                getattr(other, f) for f in _SPAN_FIELDS
            )
        return NotImplemented

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


def replayed_span(trace_id: str, record: tuple) -> Span:
    """The span of a replayed step from its `Attempt.replay` record."""
    value, span_id, parent, kind, name, at, key, capture = record
    return Span(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent,
        kind=kind,
        name=name,
        started_at=at,
        ended_at=at,
        status="ok",
        output=value if capture else None,
        attributes={"step_key": key},
        replayed=True,
    )


class Trace:
    """The spans of one trace, in the order they were added (start order)."""

    def __init__(self, trace_id: str, spans: list[Span] | None = None):
        self.trace_id = trace_id
        self._spans: list[Any] = list(spans) if spans else []
        # Replayed steps are kept as the core's records until the spans are
        # first read (a replay then builds no objects nobody looks at); this
        # is the index of the first such record, or -1.
        self._unbuilt = -1
        # A finished flow run's trace reads the spans it did not keep in
        # memory from the store, on first access.
        self._load: Any = None

    @property
    def spans(self) -> list[Span]:
        if self._unbuilt >= 0:
            self._build()
        load = self._load
        if load is not None:
            self._load = None
            self._spans = load(self._spans)
        return self._spans

    @spans.setter
    def spans(self, spans: list[Span]) -> None:
        self._spans = spans
        self._unbuilt = -1
        self._load = None

    def __getstate__(self) -> dict[str, Any]:
        return {"trace_id": self.trace_id, "_spans": self.spans, "_unbuilt": -1, "_load": None}

    def _add_replayed(self, record: tuple) -> None:
        """A replayed step's span as `Attempt.replay` describes it: `(value,
        span_id, parent_span_id, kind, name, at, step_key, capture)`."""
        if self._unbuilt < 0:
            self._unbuilt = len(self._spans)
        self._spans.append(record)

    def _build(self) -> None:
        spans = self._spans
        trace_id = self.trace_id
        for i in range(self._unbuilt, len(spans)):
            record = spans[i]
            if type(record) is tuple:
                spans[i] = replayed_span(trace_id, record)
        self._unbuilt = -1

    def __repr__(self) -> str:
        return f"Trace(trace_id={self.trace_id!r}, spans=<{len(self.spans)} spans>)"

    # Equal by content, so a trace sent between processes compares equal;
    # mutable, so unhashable.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        return self.trace_id == other.trace_id and self.spans == other.spans

    __hash__ = None  # type: ignore[assignment]

    def add(self, span: Span) -> None:
        self._spans.append(span)

    # -- structure ---------------------------------------------------------

    def roots(self) -> list[Span]:
        """Spans with no parent, or whose parent is not in this trace."""
        ids = {s.span_id for s in self.spans}
        return [s for s in self.spans if s.parent_span_id is None or s.parent_span_id not in ids]

    def children_of(self, span_id: str) -> list[Span]:
        return [s for s in self.spans if s.parent_span_id == span_id]

    def _subtree(self, span: Span) -> list[Span]:
        """`span` and its descendants, depth-first pre-order (each span once)."""
        children: dict[str, list[Span]] = {}
        for s in self.spans:
            if s.parent_span_id is not None:
                children.setdefault(s.parent_span_id, []).append(s)
        out: list[Span] = []
        seen: set[int] = set()
        stack = [span]
        while stack:
            s = stack.pop()
            if id(s) in seen:
                continue
            seen.add(id(s))
            out.append(s)
            stack.extend(reversed(children.get(s.span_id, ())))
        return out

    # -- usage -------------------------------------------------------------

    def rollup_usage(self, span: Span) -> Any:
        """Sum of `usage` over `span`'s subtree, itself included (a `Usage`)."""
        return _sum_usage(self._subtree(span))

    def total_usage(self) -> Any:
        """Sum of `usage` over every span of the trace (a `Usage`)."""
        return _sum_usage(self.spans)

    # -- status ------------------------------------------------------------

    @property
    def status(self) -> str:
        """Error > cancelled > paused > running > ok."""
        roots = self.roots()
        if any(s.status == "error" for s in roots):
            return "error"
        if any(s.status == "cancelled" for s in self.spans):
            return "cancelled"
        if any(s.status == "paused" for s in self.spans):
            return "paused"
        if any(s.status == "running" for s in roots):
            return "running"
        return "ok"

    # -- output ------------------------------------------------------------

    def print(self, *, file: Any = None, color: bool | None = None) -> None:
        """Writes the tree view and a newline to `file` (stdout by default).

        With `color=None`, colour is used iff the target stream is a TTY and
        `NO_COLOR` is not set.
        """
        out = sys.stdout if file is None else file
        if color is None:
            color = _want_color(out)
        out.write(render_trace(self, color=color) + "\n")

    def to_dict(self) -> dict[str, Any]:
        return {"trace_id": self.trace_id, "spans": [_span_dict(s) for s in self.spans]}

    def to_json(self, indent: int | None = None) -> str:
        import json

        return json.dumps(self.to_dict(), indent=indent)


def _sum_usage(spans: list[Span]) -> Any:
    from composeai.messages import Usage

    total = Usage()
    for s in spans:
        if s.usage is not None:
            total = total + s.usage
    return total


# ---------------------------------------------------------------------------
# to_dict (OBS-17)

_MAX_STR = 8192
_KEEP = 4096


def _encode(value: Any) -> Any:
    """The JSON tree of `value` as the lenient encoder writes it."""
    if value is None or type(value) in (bool, int, str):
        return value
    import json

    from composeai import _codec

    return json.loads(_codec.dumps_lenient(value))


def _truncate(value: Any) -> tuple[Any, bool]:
    """Cuts every string longer than 8192 chars to its first and last 4096."""
    if isinstance(value, str):
        if len(value) > _MAX_STR:
            cut = len(value) - _MAX_STR
            return f"{value[:_KEEP]}…[{cut} chars truncated]…{value[-_KEEP:]}", True
        return value, False
    if isinstance(value, list):
        out_list = []
        cut_any = False
        for item in value:
            item, cut = _truncate(item)
            out_list.append(item)
            cut_any = cut_any or cut
        return out_list, cut_any
    if isinstance(value, dict):
        out_dict = {}
        cut_any = False
        for k, item in value.items():
            item, cut = _truncate(item)
            out_dict[k] = item
            cut_any = cut_any or cut
        return out_dict, cut_any
    return value, False


def _span_dict(span: Span) -> dict[str, Any]:
    inp, cut_in = _truncate(_encode(span.input))
    outp, cut_out = _truncate(_encode(span.output))
    attributes = {str(k): _encode(v) for k, v in span.attributes.items()}
    usage = span.usage
    cost_usd = None
    if usage is not None:
        attributes["gen_ai.usage.input_tokens"] = usage.input_tokens
        attributes["gen_ai.usage.output_tokens"] = usage.output_tokens
        attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cache_read_tokens
        attributes["gen_ai.usage.cache_creation.input_tokens"] = usage.cache_creation_tokens
        if "provider" in span.attributes:
            attributes["gen_ai.provider.name"] = attributes["provider"]
        if "model" in span.attributes:
            attributes["gen_ai.request.model"] = attributes["model"]
        cost_usd = usage.cost_usd
    err = span.error
    d: dict[str, Any] = {
        "span_id": span.span_id,
        "trace_id": span.trace_id,
        "parent_span_id": span.parent_span_id,
        "kind": span.kind,
        "name": span.name,
        "started_at": span.started_at,
        "ended_at": span.ended_at,
        "status": span.status,
        "error": (
            None
            if err is None
            else {"type": err.type, "message": err.message, "stacktrace": err.stacktrace}
        ),
        "replayed": span.replayed,
        "input": inp,
        "output": outp,
        "attributes": attributes,
        "cost_usd": cost_usd,
    }
    if cut_in or cut_out:
        d["_truncated"] = True
    return d


# ---------------------------------------------------------------------------
# Rendering (OBS-20 … OBS-25), done by the Rust core


def _want_color(stream: Any) -> bool:
    if "NO_COLOR" in os.environ:
        return False
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _usage_tuple(usage: Any) -> tuple[Any, ...] | None:
    if usage is None:
        return None
    return (
        int(usage.input_tokens),
        int(usage.output_tokens),
        int(usage.cache_read_tokens),
        int(usage.cache_creation_tokens),
        int(usage.reasoning_tokens),
        None if usage.cost_usd is None else float(usage.cost_usd),
        bool(usage.cost_complete),
    )


def _render_tuples(trace: Trace) -> list[tuple[Any, ...]]:
    out = []
    for s in trace.spans:
        err = s.error
        out.append(
            (
                str(s.span_id),
                s.parent_span_id,
                str(s.kind),
                str(s.name),
                float(s.started_at),
                None if s.ended_at is None else float(s.ended_at),
                str(s.status),
                bool(s.replayed),
                None if err is None else str(err.type),
                None if err is None else str(err.message),
                _usage_tuple(s.usage),
            )
        )
    return out


def render_trace(trace: Trace, *, color: bool | None = None) -> str:
    """The tree view of `trace` (no trailing newline).

    `color=None` → colour iff stdout is a TTY and `NO_COLOR` is not set.
    """
    from composeai import _core

    if color is None:
        color = _want_color(sys.stdout)
    return _core.render_tree(trace.trace_id, _render_tuples(trace), bool(color))


def render_trace_mermaid(trace: Trace) -> str:
    """A Mermaid `flowchart TD` of `trace` (no trailing newline)."""
    from composeai import _core

    return _core.render_mermaid(_render_tuples(trace))
