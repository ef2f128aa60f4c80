"""OpenTelemetry export of composeai's spans (`pip install 'composeai[otel]'`).

Live: `composeai.configure(otel=True)` or `COMPOSE_OTEL=1` sets the core's
span tap, which hands every span over as it ends (flows, tasks, map items,
agents, llm calls, tools, graph nodes, replayed steps) on the thread that
ended it. Each becomes one span of the global `TracerProvider`'s tracer, with
its own start and end times. The ids are derived, not drawn: the OTel trace
id is the 128 bits of the run's trace id (a ULID, the same in every attempt of
a run), a span id is the low 64 bits of the span's ULID, so a parent that ends
after its children, or in another attempt, still links. With the tap unset
(the default) nothing here runs and OpenTelemetry is never imported.

Stored: `compose export RUN_ID --otlp URL` reads a run's stored spans and
POSTs them, as one OTLP/HTTP protobuf `ExportTraceServiceRequest`, to URL.

Both describe a span the same way (`_describe`): GenAI semantic-convention
attributes on `llm`, `agent` and `tool` spans; `composeai.*` for the rest;
content (inputs, outputs, messages) only while `COMPOSE_TRACE_CONTENT` is
not `0`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading

from . import _core
from .errors import ComposeError, ConfigError
from .tracing import _capture_content

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_INSTALL_HINT = "pip install 'composeai[otel]'"

# -- switching the export on and off -------------------------------------------

# Whether the tap is set, and whether `configure(otel=...)` decided it (then
# `COMPOSE_OTEL` is no longer read).
_enabled = False
_configured = False
_lock = threading.Lock()


def configure(enabled: bool) -> None:
    """`composeai.configure(otel=...)`: starts or stops the export."""
    global _configured
    with _lock:
        _configured = True
        _set(bool(enabled))


def from_env() -> None:
    """`COMPOSE_OTEL` (read when the store opens): `1`, `true`, `yes` or `on`
    starts the export, anything else stops it, unless `configure(otel=...)`
    decided. A missing OpenTelemetry package is a warning here, not an error
    in the run that opened the store."""
    value = os.environ.get("COMPOSE_OTEL", "").strip().lower()
    with _lock:
        if _configured:
            return
        try:
            _set(value in ("1", "true", "yes", "on"))
        except ConfigError as exc:
            import warnings

            warnings.warn(str(exc), RuntimeWarning, 2)


def _set(enabled: bool) -> None:
    global _enabled
    if enabled == _enabled:
        return
    if enabled:
        _core.set_span_tap(_Emitter().emit)
    else:
        _core.set_span_tap(None)
    _enabled = enabled


# -- ids -------------------------------------------------------------------------

_ULID = re.compile("[0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{25}")
# Crockford's base-32 digits onto the ones `int(..., 32)` reads.
_CROCKFORD = str.maketrans(
    "0123456789ABCDEFGHJKMNPQRSTVWXYZabcdefghjkmnpqrstvwxyz",
    "0123456789abcdefghijklmnopqrstuvabcdefghijklmnopqrstuv",
)
_MASK64 = (1 << 64) - 1


def _id128(text: str) -> int:
    """The 128 bits of a ULID; any other id (0.11.0 stores kept ids of other
    shapes) is hashed. Never 0, which OpenTelemetry reads as no id."""
    if _ULID.fullmatch(text):
        value = int(text.translate(_CROCKFORD), 32)
        if value:
            return value
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=16).digest(), "big") or 1


def _span_id(text: str) -> int:
    """A span's 64-bit OTel id: the low 64 bits of its ULID, where the
    random part lies (monotonic ULIDs of one millisecond still differ)."""
    return _id128(text) & _MASK64 or _id128(text + "#") & _MASK64 or 1


_TRACE_IDS: dict[str, int] = {}


def _trace_id(text: str) -> int:
    """`_id128` of a trace id, remembered: every span of a run asks again."""
    value = _TRACE_IDS.get(text)
    if value is None:
        if len(_TRACE_IDS) >= 1024:
            _TRACE_IDS.clear()
        value = _TRACE_IDS[text] = _id128(text)
    return value


# -- what a span says --------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A stored JSON tree without the codec's type tags, read as
    plain JSON: nothing is imported or decoded."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        if "$kind" in value and "value" in value:
            return _plain(value["value"])
        return {k: _plain(v) for k, v in value.items()}
    return value


def _loads(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return _plain(json.loads(text))
    except ValueError:
        return text


def _attribute(value: Any) -> Any:
    """An OTel attribute value: scalars as they are, anything else as JSON."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return "null" if value is None else value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _semconv_part(part: Any) -> dict[str, Any]:
    """A message part as the GenAI conventions write it."""
    if not isinstance(part, dict):
        return {"type": "text", "content": str(part)}
    kind = part.get("type")
    if kind == "text":
        return {"type": "text", "content": part.get("text", "")}
    if kind == "tool_call":
        return {
            "type": "tool_call",
            "id": part.get("id"),
            "name": part.get("name"),
            "arguments": part.get("arguments"),
        }
    if kind == "tool_result":
        return {
            "type": "tool_call_response",
            "id": part.get("tool_call_id"),
            "response": part.get("content"),
        }
    if kind == "thinking":
        return {"type": "reasoning", "content": part.get("text", "")}
    if kind == "image":
        if part.get("url"):
            return {
                "type": "uri",
                "modality": "image",
                "mime_type": part.get("media_type"),
                "uri": part["url"],
            }
        return {
            "type": "blob",
            "modality": "image",
            "mime_type": part.get("media_type"),
            "content": part.get("data"),
        }
    return dict(part)


def _semconv_message(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict):
        return {"role": "user", "parts": [_semconv_part(message)]}
    parts = message.get("parts") or []
    role = message.get("role", "user")
    if parts and all(isinstance(p, dict) and p.get("type") == "tool_result" for p in parts):
        role = "tool"
    return {"role": role, "parts": [_semconv_part(p) for p in parts]}


def _llm_content(attributes: dict[str, Any], input_json: str | None, output_json: str | None):
    request = _loads(input_json)
    if isinstance(request, dict):
        system = request.get("system")
        if system:
            attributes["gen_ai.system_instructions"] = _attribute(
                [{"type": "text", "content": system}]
            )
        messages = request.get("messages")
        if isinstance(messages, list):
            attributes["gen_ai.input.messages"] = _attribute(
                [_semconv_message(m) for m in messages]
            )
    reply = _loads(output_json)
    if isinstance(reply, dict):
        message = _semconv_message(reply)
        calls = any(p.get("type") == "tool_call" for p in message["parts"])
        message["finish_reason"] = "tool_call" if calls else "stop"
        attributes["gen_ai.output.messages"] = _attribute([message])


def _describe(record: tuple) -> tuple[str, bool, dict[str, Any], Any]:
    """`(name, is_client, attributes, error)` of a span as the core hands it
    over (the 16-tuple of src/py/span_tap.rs); `error` is None or `(type,
    message, stacktrace)`."""
    (
        trace_id,
        run_id,
        span_id,
        _parent,
        kind,
        name,
        _started,
        _ended,
        status,
        replayed,
        step_key,
        attributes_json,
        usage,
        error_json,
        input_json,
        output_json,
    ) = record
    attributes: dict[str, Any] = {
        "composeai.kind": kind,
        "composeai.status": status,
        "composeai.trace_id": trace_id,
        "composeai.span_id": span_id,
    }
    if run_id is not None:
        attributes["composeai.run_id"] = run_id
    if step_key is not None:
        attributes["composeai.step_key"] = step_key
    if replayed:
        attributes["composeai.replayed"] = True
    stored = _loads(attributes_json) if attributes_json is not None else None
    extra: dict[str, Any] = stored if isinstance(stored, dict) else {}
    client = False
    otel_name = name
    if kind == "llm":
        client = True
        model = extra.pop("model", None) or name
        provider = extra.pop("provider", None)
        attributes["gen_ai.operation.name"] = "chat"
        attributes["gen_ai.request.model"] = _attribute(model)
        if provider is not None:
            attributes["gen_ai.provider.name"] = _attribute(provider)
            attributes["gen_ai.system"] = _attribute(provider)
        otel_name = f"chat {model}"
    elif kind == "agent":
        attributes["gen_ai.operation.name"] = "invoke_agent"
        attributes["gen_ai.agent.name"] = name
        otel_name = f"invoke_agent {name}"
    elif kind == "tool":
        attributes["gen_ai.operation.name"] = "execute_tool"
        attributes["gen_ai.tool.name"] = name
        otel_name = f"execute_tool {name}"
    for key, value in extra.items():
        attributes["composeai." + str(key)] = _attribute(value)
    if usage is not None:
        tokens_in, tokens_out, cache_read, cache_creation, reasoning, cost, complete = usage
        attributes["gen_ai.usage.input_tokens"] = tokens_in
        attributes["gen_ai.usage.output_tokens"] = tokens_out
        attributes["gen_ai.usage.cache_read.input_tokens"] = cache_read
        attributes["gen_ai.usage.cache_creation.input_tokens"] = cache_creation
        if reasoning:
            attributes["composeai.usage.reasoning_tokens"] = reasoning
        if cost is not None:
            attributes["composeai.cost_usd"] = cost
            attributes["composeai.cost_complete"] = bool(complete)
    if _capture_content():
        if kind == "llm":
            _llm_content(attributes, input_json, output_json)
        elif kind == "tool":
            if input_json is not None:
                attributes["gen_ai.tool.call.arguments"] = input_json
            if output_json is not None:
                attributes["gen_ai.tool.call.result"] = output_json
        else:
            if input_json is not None:
                attributes["composeai.input"] = input_json
            if output_json is not None:
                attributes["composeai.output"] = output_json
    error = None
    if status == "error":
        info = _loads(error_json)
        if not isinstance(info, dict):
            info = {}
        error = (
            str(info.get("type") or "Error"),
            str(info.get("message") or ""),
            str(info.get("stacktrace") or ""),
        )
        attributes["error.type"] = error[0]
    return otel_name, client, attributes, error


def _nanos(seconds: float | None, default: float) -> int:
    return int((default if seconds is None else seconds) * 1e9)


# -- live: through the user's TracerProvider --------------------------------------


class _PresetIds:
    """The id generator of composeai's tracer: the ids of the span being
    emitted on this thread when set (they are derived, see the module
    docstring), else the provider's own generator."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.next = threading.local()

    def generate_span_id(self) -> int:
        preset = getattr(self.next, "span_id", 0)
        if preset:
            self.next.span_id = 0
            return preset
        return self._inner.generate_span_id()

    def generate_trace_id(self) -> int:
        preset = getattr(self.next, "trace_id", 0)
        if preset:
            self.next.trace_id = 0
            return preset
        return self._inner.generate_trace_id()

    def is_trace_id_random(self) -> bool:
        # A ULID's first 48 bits are its time.
        return False


_warned = False


def _warn_once(exc: BaseException) -> None:
    global _warned
    if not _warned:
        _warned = True
        import warnings

        warnings.warn(
            f"composeai could not emit a span to OpenTelemetry: {type(exc).__name__}: {exc}",
            RuntimeWarning,
            2,
        )


class _Emitter:
    """Turns each span the core hands over into an OpenTelemetry span."""

    def __init__(self) -> None:
        try:
            from opentelemetry import context, trace
            from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
            from opentelemetry.trace.status import Status, StatusCode
        except ImportError as exc:
            raise ConfigError(
                f"OpenTelemetry export needs the OpenTelemetry SDK ({exc}): {_INSTALL_HINT}"
            ) from None
        self._trace = trace
        self._Context = context.Context
        self._NonRecordingSpan = NonRecordingSpan
        self._SpanContext = SpanContext
        self._sampled = TraceFlags(TraceFlags.SAMPLED)
        self._kinds = (SpanKind.INTERNAL, SpanKind.CLIENT)
        self._error = StatusCode.ERROR
        self._Status = Status
        self._proxy = trace.ProxyTracerProvider
        self._provider: Any = None
        self._tracer: Any = None
        self._ids: _PresetIds | None = None

    def _tracer_of(self, provider: Any) -> Any:
        """composeai's tracer of `provider`, its id generator ours."""
        from ._version import __version__

        tracer = provider.get_tracer("composeai", __version__)
        ids = getattr(tracer, "id_generator", None)
        if ids is not None and not isinstance(ids, _PresetIds):
            ids = _PresetIds(ids)
            tracer.id_generator = ids
        self._ids = ids
        return tracer

    def emit(self, record: tuple) -> None:
        try:
            self._emit(record)
        except Exception as exc:  # noqa: BLE001 -- export never fails the step (OBS-5)
            _warn_once(exc)

    def _emit(self, record: tuple) -> None:
        provider = self._trace.get_tracer_provider()
        if isinstance(provider, self._proxy):
            # No provider configured (yet): OpenTelemetry would drop the span.
            return
        if provider is not self._provider:
            self._tracer = self._tracer_of(provider)
            self._provider = provider
        name, client, attributes, error = _describe(record)
        trace_id = _trace_id(record[0])
        parent = record[3]
        if parent is None:
            ctx = self._Context()
        else:
            ctx = self._trace.set_span_in_context(
                self._NonRecordingSpan(
                    self._SpanContext(trace_id, _span_id(parent), False, self._sampled)
                ),
                self._Context(),
            )
        started = record[6]
        ended = _nanos(record[7], started)
        ids = self._ids
        if ids is not None:
            ids.next.trace_id = trace_id
            ids.next.span_id = _span_id(record[2])
        try:
            span = self._tracer.start_span(
                name,
                context=ctx,
                kind=self._kinds[client],
                attributes=attributes,
                start_time=_nanos(started, started),
            )
        finally:
            if ids is not None:
                ids.next.trace_id = ids.next.span_id = 0
        if error is not None:
            span.set_status(self._Status(self._error, f"{error[0]}: {error[1]}"))
            span.add_event(
                "exception",
                {
                    "exception.type": error[0],
                    "exception.message": error[1],
                    "exception.stacktrace": error[2],
                },
                timestamp=ended,
            )
        span.end(end_time=ended)


# -- stored: `compose export RUN_ID --otlp URL` -------------------------------------


def _any_value(pb: Any, value: Any) -> Any:
    if isinstance(value, bool):
        return pb.AnyValue(bool_value=value)
    if isinstance(value, int):
        return pb.AnyValue(int_value=value)
    if isinstance(value, float):
        return pb.AnyValue(double_value=value)
    return pb.AnyValue(string_value=str(value))


def _key_values(pb: Any, attributes: dict[str, Any]) -> list[Any]:
    return [pb.KeyValue(key=k, value=_any_value(pb, v)) for k, v in attributes.items()]


def export_request(found: dict) -> bytes:
    """The OTLP `ExportTraceServiceRequest` (serialized protobuf) of a run's
    stored spans, as `_core.otel_view` reads them."""
    try:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
        from opentelemetry.proto.common.v1 import common_pb2
        from opentelemetry.proto.resource.v1 import resource_pb2
        from opentelemetry.proto.trace.v1 import trace_pb2
    except ImportError as exc:
        raise ComposeError(
            f"--otlp needs the OpenTelemetry protobuf package ({exc}): {_INSTALL_HINT}"
        ) from None
    from ._version import __version__

    spans = []
    for record in found["spans"]:
        started = record[6]
        ended = _nanos(record[7], started)
        name, client, attributes, error = _describe(record)
        span = trace_pb2.Span(
            trace_id=_trace_id(record[0]).to_bytes(16, "big"),
            span_id=_span_id(record[2]).to_bytes(8, "big"),
            name=name,
            kind=(trace_pb2.Span.SPAN_KIND_CLIENT if client else trace_pb2.Span.SPAN_KIND_INTERNAL),
            start_time_unix_nano=_nanos(started, started),
            end_time_unix_nano=ended,
            attributes=_key_values(common_pb2, attributes),
        )
        if record[3] is not None:
            span.parent_span_id = _span_id(record[3]).to_bytes(8, "big")
        if error is not None:
            span.status.code = trace_pb2.Status.STATUS_CODE_ERROR
            span.status.message = f"{error[0]}: {error[1]}"
            span.events.append(
                trace_pb2.Span.Event(
                    time_unix_nano=ended,
                    name="exception",
                    attributes=_key_values(
                        common_pb2,
                        {"exception.type": error[0], "exception.message": error[1]},
                    ),
                )
            )
        spans.append(span)
    service = os.environ.get("OTEL_SERVICE_NAME") or "composeai"
    request = trace_service_pb2.ExportTraceServiceRequest(
        resource_spans=[
            trace_pb2.ResourceSpans(
                resource=resource_pb2.Resource(
                    attributes=_key_values(common_pb2, {"service.name": service})
                ),
                scope_spans=[
                    trace_pb2.ScopeSpans(
                        scope=common_pb2.InstrumentationScope(
                            name="composeai", version=__version__
                        ),
                        spans=spans,
                    )
                ],
            )
        ]
    )
    return request.SerializeToString()


def _endpoint(url: str) -> str:
    """URL as given, or with `/v1/traces` when it names no path."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ComposeError(f"--otlp {url}: expected an http:// or https:// URL")
    if parts.path in ("", "/"):
        return parts._replace(path="/v1/traces").geturl()
    return url


def _headers() -> dict[str, str]:
    """`OTEL_EXPORTER_OTLP_TRACES_HEADERS` (else `OTEL_EXPORTER_OTLP_HEADERS`):
    comma-separated `key=value` pairs, URL-encoded, as the OTLP exporters read them."""
    from urllib.parse import unquote

    raw = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
    if raw is None:
        raw = os.environ.get("OTEL_EXPORTER_OTLP_HEADERS", "")
    headers = {"Content-Type": "application/x-protobuf"}
    for item in raw.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            headers[unquote(key.strip())] = unquote(value.strip())
    return headers


def send_run(found: dict, url: str, timeout: float = 10.0) -> str:
    """POSTs the run's spans to the OTLP/HTTP endpoint `url`; returns the
    line to print. A connection failure or an error status is a
    `ComposeError` naming the endpoint."""
    import urllib.error
    import urllib.request

    endpoint = _endpoint(url)
    body = export_request(found)
    request = urllib.request.Request(endpoint, data=body, headers=_headers(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read(200).decode("utf-8", "replace").strip()
        raise ComposeError(
            f"OTLP endpoint {endpoint} refused the spans: HTTP {exc.code} {exc.reason}"
            + (f" -- {detail}" if detail else "")
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ComposeError(f"cannot send spans to OTLP endpoint {endpoint}: {reason}") from None
    n = len(found["spans"])
    return f"exported {n} span{'s' if n != 1 else ''} of run {found['run_id']} to {endpoint}"
