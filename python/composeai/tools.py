"""`@tool` and `Tool`.

A `Tool` wraps either a local function (``fn`` + a pydantic ``param_model`` built from its
signature) or a remote executor (MCP, ``executor=``). The agent loop drives it through
:meth:`Tool.execute` / :meth:`Tool.aexecute`; the per-call span, the ``timeout=`` race and the
conversion of failures into ``is_error`` results belong to the loop, so
both methods here simply propagate validation errors and body exceptions.

Importing this module imports pydantic (tools are agent-side).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, Generic, Protocol, cast, overload

from typing_extensions import ParamSpec, TypeVar

from . import _codec
from .errors import ConfigError
from .models.base import ToolSpec

__all__ = ["Tool", "seal_schema", "tool"]

P = ParamSpec("P", default=...)
R = TypeVar("R", default=Any)

_REMOTE_CALL = (
    "tool '{name}' is not a local function (it executes on a remote server); "
    "use it via @agent(tools=[...]) instead of calling it"
)
_NO_DOCSTRING = (
    "@tool function '{fn}' has no docstring: tools need a description because the model "
    "relies on it to decide when (and how) to call them. Add a docstring, or pass "
    "description=... explicitly to @tool."
)
_VARIADIC = (
    "@tool function '{fn}' must not use *args/**kwargs: tool parameters must be explicit, "
    "typed keyword arguments so a JSON Schema can be generated for them."
)
_UNKNOWN_ARGS = (
    "@tool function '{fn}': docstring Args: section describes parameter(s) {names}, which "
    "don't match any real parameter (actual parameters: {params}) -- fix the typo, or update "
    "the docstring after a rename."
)


# --------------------------------------------------------------------------- docstrings

# An argument line inside the Args: section: indented `<identifier> : <desc>` (AGENT-31).
_ARG_LINE = re.compile(r"^([ \t]+)([^\W\d]\w*)\s*:\s*(.*)$")


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into ``(description, {arg name: arg description})``.

    The docstring is cleaned with :func:`inspect.cleandoc`. The first line whose stripped text
    is exactly ``Args:`` opens the argument section; the description is everything before it
    (right-stripped), or the whole cleaned docstring (stripped) when there is no such line.
    In the section, blank lines are skipped and the first zero-indent line (``Returns:`` ...)
    ends it. A line ``<indent><identifier>: <desc>`` whose indent is at most the current
    argument's indent (any indent for the first argument) starts an argument; every other line
    is appended to the current argument's text with one space (and ignored before the first
    argument).
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).split("\n")
    start = next((i for i, line in enumerate(lines) if line.strip() == "Args:"), None)
    if start is None:
        return "\n".join(lines).strip(), {}
    description = "\n".join(lines[:start]).rstrip()
    args: dict[str, str] = {}
    current: str | None = None
    current_indent = 0
    for line in lines[start + 1 :]:
        text = line.strip()
        if not text:
            continue
        if line[0] not in " \t":
            break
        m = _ARG_LINE.match(line)
        if m is not None and (current is None or len(m.group(1)) <= current_indent):
            current = m.group(2)
            current_indent = len(m.group(1))
            args[current] = m.group(3).strip()
        elif current is not None:
            args[current] = f"{args[current]} {text}".strip()
    return description, args


# --------------------------------------------------------------------------- schemas

# Keywords whose value maps names to subschemas (no schema keywords at that level).
_NAME_MAPS = frozenset(
    ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
)
# Keywords whose value is data (instances), never a schema: left untouched.
_DATA_KEYWORDS = frozenset(("default", "examples", "example", "const", "enum"))


def _seal(node: Any) -> Any:
    if isinstance(node, list):
        return [_seal(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _DATA_KEYWORDS:
            out[key] = value
        elif key in _NAME_MAPS and isinstance(value, dict):
            out[key] = {name: _seal(sub) for name, sub in value.items()}
        else:
            out[key] = _seal(value)
    if out.get("type") == "object" and not isinstance(out.get("additionalProperties"), dict):
        out.pop("additionalProperties", None)
        out["additionalProperties"] = False
    return out


def seal_schema(schema: dict) -> dict:
    """Seal a JSON Schema; returns a new dict, ``schema`` is not modified.

    Recursively drops every ``title`` whose value is a string, and gives every
    ``"type": "object"`` schema ``additionalProperties: false`` unless it already holds a
    dict-valued ``additionalProperties`` (open mappings keep theirs). A non-dict
    ``additionalProperties`` (``true``/``false``) is replaced and moves to the end. Property
    names (``properties``, ``$defs`` ...) are never treated as keywords, and data values
    (``default``, ``examples``, ``const``, ``enum``) are copied unchanged.
    """
    return _seal(schema)


def _model_name(tool_name: str) -> str:
    """``count_words`` → ``CountWordsParams``."""
    words = re.split(r"[\W_]+", tool_name)
    return "".join(word.capitalize() for word in words if word) + "Params"


def _type_hints(fn: Callable[..., Any], include_extras: bool) -> dict[str, Any]:
    """``typing.get_type_hints``; falling back to the raw signature annotations."""
    import typing

    try:
        hints = typing.get_type_hints(fn, include_extras=include_extras)
    except Exception:  # noqa: BLE001 -- unresolvable names: use the raw annotations
        hints = None
    if hints is not None:
        return hints
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return {}
    hints = {
        name: p.annotation
        for name, p in sig.parameters.items()
        if p.annotation is not inspect.Parameter.empty
    }
    if sig.return_annotation is not inspect.Signature.empty:
        hints["return"] = sig.return_annotation
    return hints


def _needs_alias(name: str, reserved: frozenset[str]) -> bool:
    return name.startswith("_") or name in reserved


def _build_param_model(
    fn: Callable[..., Any], model_name: str, params: list[inspect.Parameter]
) -> type:
    from pydantic import BaseModel, ConfigDict, Field, create_model

    hints = _type_hints(fn, include_extras=True)
    reserved = frozenset(dir(BaseModel))
    taken = {p.name for p in params}
    fields: dict[str, Any] = {}
    for i, p in enumerate(params):
        annotation = hints.get(p.name, Any)
        default = ... if p.default is inspect.Parameter.empty else p.default
        if _needs_alias(p.name, reserved):
            # Not a legal pydantic field name: store it under a private name, aliased to the
            # parameter's own name (what the schema shows and the model must send).
            field_name = f"param_{i}"
            while field_name in taken or field_name in reserved:
                field_name += "_"
            taken.add(field_name)
            fields[field_name] = (annotation, Field(default, alias=p.name))
        else:
            fields[p.name] = (annotation, default)
    return create_model(
        model_name,
        __config__=ConfigDict(extra="forbid", protected_namespaces=()),
        __module__=getattr(fn, "__module__", None) or __name__,
        **fields,
    )


def _input_schema(param_model: Any, arg_docs: dict[str, str]) -> dict:
    schema = param_model.model_json_schema()
    properties = schema.get("properties")
    if isinstance(properties, dict):
        for name, text in arg_docs.items():
            prop = properties.get(name)
            if text and isinstance(prop, dict):
                prop["description"] = text
    return seal_schema(schema)


# --------------------------------------------------------------------------- Tool


def _render(value: Any) -> str:
    """A tool result as model-facing text."""
    if isinstance(value, str):
        return value if type(value) is str else str.__str__(value)
    return json.dumps(_codec.encode(value))


class Tool(Generic[P, R]):
    """A function (or remote operation, such as an MCP tool) the model can call.

    Made by `@tool` or `mcp_tools()`. `spec` is what the model is sent
    (`name`, description, `input_schema`); `execute(arguments)` and
    `aexecute(arguments)` validate the arguments and return the result text.
    """

    fn: Callable[..., Any] | None
    spec: ToolSpec
    timeout: float | None
    input_type: Any
    output_type: Any

    def __init__(
        self,
        fn: Callable[..., Any] | None = None,
        spec: ToolSpec | None = None,
        param_model: type | None = None,
        *,
        timeout: float | None = None,
        executor: Callable[[dict[str, Any]], str | Awaitable[str]] | None = None,
        retry: Any = None,
    ) -> None:
        if spec is None:
            raise ConfigError("Tool requires a spec")
        if (fn is None) == (executor is None):
            raise ConfigError(
                "Tool requires exactly one execution path: fn+param_model (local @tool) "
                "or executor= (remote, e.g. MCP)"
            )
        if fn is not None and param_model is None:
            raise ConfigError("Tool with fn= also requires param_model=")
        self.fn = fn
        self.spec = spec
        self.param_model = param_model
        self.executor = executor
        self.timeout = timeout
        # A `RetryPolicy` for the body (EXT-9); None: one attempt.
        self.retry = retry
        self.__name__ = spec.name
        if fn is not None:
            self._is_async = inspect.iscoroutinefunction(fn)
            self.__doc__ = getattr(fn, "__doc__", None)
            self.__qualname__ = getattr(fn, "__qualname__", spec.name)
            self.__module__ = getattr(fn, "__module__", None) or __name__
            self.__wrapped__ = fn
            self.input_type, self.output_type = _stage_types(fn)
            self._positional, self._defaulted = _call_shape(fn)
        else:
            self._is_async = inspect.iscoroutinefunction(executor)
            self.__doc__ = spec.description
            self.__qualname__ = spec.name
            self.input_type = Any
            self.output_type = str
            self._positional = self._defaulted = frozenset()

    # ---- introspection

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def input_schema(self) -> dict:
        return self.spec.input_schema

    @property
    def is_async(self) -> bool:
        return self._is_async

    def __repr__(self) -> str:
        return f"<Tool {self.spec.name!r}>"

    # ---- direct call (no validation)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if self.fn is None:
            raise ConfigError(_REMOTE_CALL.format(name=self.spec.name))
        return self.fn(*args, **kwargs)

    # ---- execution by the agent loop

    def _bind(self, arguments: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        """Validate ``arguments`` (lax, unknown keys rejected) into call arguments."""
        model = self.param_model.model_validate(arguments)  # type: ignore[union-attr]
        fields_set = model.model_fields_set
        fields = type(model).model_fields
        args: list[Any] = []
        keep = 0  # positional arguments up to the last one that must be passed
        kwargs: dict[str, Any] = {}
        for field_name, info in fields.items():
            param = info.alias or field_name
            # Not sent and the function has its own default: let the function apply it.
            needed = field_name in fields_set or param not in self._defaulted
            if param in self._positional:
                args.append(getattr(model, field_name))
                if needed:
                    keep = len(args)
            elif needed:
                kwargs[param] = getattr(model, field_name)
        return tuple(args[:keep]), kwargs

    def execute(self, arguments: dict[str, Any]) -> str:
        """Run the tool with model-supplied ``arguments``; returns the result text.

        Validation errors and exceptions from the body propagate. An ``async def`` body runs
        on the background loop.
        """
        if self.fn is None:
            # `__init__` sets `executor` when there is no `fn`; an async one returns an awaitable.
            if self._is_async:
                from . import _runtime

                aexecutor = cast("Callable[[dict[str, Any]], Awaitable[str]]", self.executor)
                return _render(_runtime.run_sync(lambda: aexecutor(arguments)))
            executor = cast("Callable[[dict[str, Any]], str]", self.executor)
            return _render(executor(arguments))
        args, kwargs = self._bind(arguments)
        fn = self.fn
        if self._is_async:
            from . import _runtime

            def body():
                return _runtime.run_sync(lambda: fn(*args, **kwargs))

        else:

            def body():
                return fn(*args, **kwargs)

        if self.retry is not None:
            return _render(_with_policy(self.retry, body))
        return _render(body())

    async def aexecute(self, arguments: dict[str, Any]) -> str:
        """Await an ``async`` tool with model-supplied ``arguments``."""
        if not self._is_async:
            raise ConfigError(
                f"tool '{self.spec.name}' is not async (its body is a plain function); "
                "call execute() instead of aexecute()"
            )
        if self.fn is None:
            # `__init__` sets `executor` when there is no `fn`; this one is async.
            aexecutor = cast("Callable[[dict[str, Any]], Awaitable[str]]", self.executor)
            return _render(await aexecutor(arguments))
        args, kwargs = self._bind(arguments)
        if self.retry is None:
            return _render(await self.fn(*args, **kwargs))
        import asyncio

        attempt = 1
        while True:
            try:
                return _render(await self.fn(*args, **kwargs))
            except Exception as exc:
                if attempt >= self.retry.max_attempts or not self.retry.retries(exc):
                    raise
                attempt += 1
                await asyncio.sleep(_record_retry(exc, self.retry.delay(attempt)))


def _with_policy(policy: Any, body: Callable[[], Any]) -> Any:
    """Runs a tool body as its `RetryPolicy` says."""
    import time

    attempt = 1
    while True:
        try:
            return body()
        except Exception as exc:
            if attempt >= policy.max_attempts or not policy.retries(exc):
                raise
            attempt += 1
            time.sleep(_record_retry(exc, policy.delay(attempt)))


def _record_retry(exc: Exception, delay: float) -> float:
    """Notes a failed attempt in the `retries` attribute of the tool span
    being executed, if any; returns `delay`."""
    from ._engine import FRAME

    frame = FRAME.get()
    span = frame.span if frame is not None else None
    if span is not None and span.kind == "tool":
        span.attributes.setdefault("retries", []).append(
            {"type": type(exc).__name__, "message": str(exc), "delay": delay}
        )
    return delay


def _stage_types(fn: Callable[..., Any]) -> tuple[Any, Any]:
    """``(input_type, output_type)``: first positional parameter's annotation and the return
    annotation, each ``Any`` when absent."""
    hints = _type_hints(fn, include_extras=False)
    input_type: Any = Any
    params: Iterable[inspect.Parameter]
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        params = ()
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            input_type = hints.get(p.name, Any)
            break
    return input_type, hints.get("return", Any)


def _call_shape(fn: Callable[..., Any]) -> tuple[frozenset[str], frozenset[str]]:
    """``(positional-only parameter names, names of parameters with a default)``."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return frozenset(), frozenset()
    return (
        frozenset(p.name for p in params if p.kind is p.POSITIONAL_ONLY),
        frozenset(p.name for p in params if p.default is not p.empty),
    )


# --------------------------------------------------------------------------- @tool


def _make_tool(
    fn: Callable[..., Any],
    name: str | None,
    description: str | None,
    requires_approval: bool,
    timeout: float | None,
    retry: Any = None,
) -> Tool:
    fn_name = getattr(fn, "__name__", repr(fn))
    if retry is not None:
        from ._retry import resolve

        retry = resolve(f"@tool {fn_name!r}", 0, retry)
    doc = getattr(fn, "__doc__", None)
    if description is None and (doc is None or not doc.strip()):
        raise ConfigError(_NO_DOCSTRING.format(fn=fn_name))
    params = list(inspect.signature(fn).parameters.values())
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        raise ConfigError(_VARIADIC.format(fn=fn_name))
    doc_description, arg_docs = _parse_docstring(doc)
    param_names = {p.name for p in params}
    unknown = sorted(set(arg_docs) - param_names)
    if unknown:
        raise ConfigError(
            _UNKNOWN_ARGS.format(fn=fn_name, names=unknown, params=sorted(param_names))
        )
    tool_name = fn_name if name is None else name
    param_model = _build_param_model(fn, _model_name(tool_name), params)
    spec = ToolSpec(
        name=tool_name,
        description=doc_description if description is None else description,
        input_schema=_input_schema(param_model, arg_docs),
        strict=True,
        requires_approval=requires_approval,
    )
    _codec.register_annotation_types(fn)
    return Tool(fn, spec, param_model, timeout=timeout, retry=retry)


@overload
def tool(fn: Callable[P, Coroutine[Any, Any, R]], /) -> Tool[P, R]: ...
@overload
def tool(fn: Callable[P, R], /) -> Tool[P, R]: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    requires_approval: bool = False,
    timeout: float | None = None,
    retry: Any = None,
) -> _ToolDecorator: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    requires_approval: bool = False,
    timeout: float | None = None,
    retry: Any = None,
) -> Any:
    """Exposes a function to the model as a tool.

    The model sees the tool's name, its description (the docstring up to an
    `Args:` section) and a JSON Schema of its typed parameters, each described
    by its `Args:` entry. The result is a `Tool`, still callable as the
    function. A tool without a docstring or with `*args`/`**kwargs` is a
    `ConfigError`.

    Args:
        name: the name the model calls (default: the function's name).
        description: the description, instead of the docstring's.
        requires_approval: pause the run before each call until a person (or
            an `approver=`) answers the interrupt `tool:<name>:<call id>`;
            a denial sends the model `"denied by user"`.
        timeout: seconds per call; a timeout is the call's (error) result.
        retry: a `RetryPolicy` re-running a failing body.
    """
    if fn is not None:
        return _make_tool(fn, name, description, requires_approval, timeout, retry)

    def decorate(f: Callable[..., Any]) -> Tool:
        return _make_tool(f, name, description, requires_approval, timeout, retry)

    return decorate


class _ToolDecorator(Protocol):
    """Static type of ``tool(...)`` with options."""

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> Tool[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Tool[P, R]: ...
    def __call__(self, fn: Callable[..., Any], /) -> Any: ...
