"""Type machinery of composition stages.

Pure and engine-independent: what a stage accepts and returns, what it is called, whether two
adjacent stages fit, and the runtime validator guarding a stage's input boundary.

Decisions beyond the spec's letter:

- ``Annotated[T, ...]``: :func:`stage_types` resolves like an agent's types (``typing.get_type_hints``
  without extras), so annotations read from a signature come back stripped. Types that still
  carry ``Annotated`` (duck-typed ``input_type`` attributes, raw fallback annotations) are
  compared as ``T`` by :func:`compatible`, while :func:`build_validator` hands the whole
  ``Annotated`` type to pydantic so its metadata constraints apply.
- Unresolved annotations (a ``str`` or ``typing.ForwardRef``, e.g. a name
  ``typing.get_type_hints`` could not resolve) are compatible with anything at ``pipe()`` time and
  skip runtime validation, as do types whose pydantic adapter cannot be completed because of an
  undefined forward reference inside them (``list["Missing"]``).
- A bare typing alias without arguments (``typing.List``) counts as its origin class (``list``),
  and the stage compatibility rule compares generics argument by argument, so the ``typing`` and the
  builtin spelling of one type are equal (``typing.Dict[str, int]`` is ``dict[str, int]``).
- ``<pydantic error text>`` in a ``StageTypeError`` is ``str()`` of the pydantic
  ``ValidationError``, verbatim: its title line, one entry per failing location with the message,
  error type and offending input, and pydantic's documentation link.
- Pydantic's strict mode accepts a ``dict`` for a model but never for a dataclass, while the coercion table
  instantiates both. A dataclass type therefore takes a ``dict`` by validating each ``__init__``
  argument with the same strict machinery (recursively, so a field typed as another dataclass also
  takes a ``dict``) and calling the class; unknown keys are ignored, as pydantic does for
  dataclasses. Failures are reported as one pydantic ``ValidationError`` with per-field locations.
- Where isinstance semantics apply (a type pydantic cannot schema, a ``@runtime_checkable``
  protocol), a mismatch is reported as a pydantic ``is_instance_of`` ``ValidationError``, so every
  ``StageTypeError`` reads the same way.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

from .errors import CompositionTypeError, ConfigError, StageTypeError

__all__ = [
    "aggregate_input_type",
    "build_validator",
    "check_pipe",
    "compatible",
    "stage_name",
    "stage_types",
    "type_name",
]

_PROTOCOL_HINT = (
    " -- a Protocol boundary must be decorated @runtime_checkable (so it can be validated by"
    " isinstance); add typing.runtime_checkable, or annotate the parameter Any to opt out of"
    " runtime validation"
)

_EMPTY = inspect.Parameter.empty
_NONE_TYPE = type(None)
_UNION_ORIGINS: tuple[Any, ...] = (typing.Union, types.UnionType)


# --------------------------------------------------------------------------- stage types (COMP-1)


def stage_types(stage: Any) -> tuple[Any, Any]:
    """``(input_type, output_type)`` of a stage."""
    if hasattr(stage, "input_type") and hasattr(stage, "output_type"):
        # AgentFunction, Pipeline, Aggregate, Tool.
        return stage.input_type, stage.output_type
    fn = getattr(stage, "fn", None)
    if callable(fn):  # a Task wraps its function in `.fn`
        stage = fn
    return _callable_types(stage)


def _callable_types(fn: Any) -> tuple[Any, Any]:
    """First positional(-or-keyword) parameter's annotation and the return annotation, each
    ``Any`` when missing or when the signature can't be inspected; resolved as an agent's types are."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return Any, Any
    hints = _resolved_hints(fn)
    input_type: Any = Any
    for param in sig.parameters.values():
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            input_type = hints.get(param.name, _raw(param.annotation))
            break
    if inspect.isclass(fn):  # the signature is __init__'s, whose `-> None` is not the call's
        return input_type, Any
    return input_type, hints.get("return", _raw(sig.return_annotation))


def _resolved_hints(fn: Any) -> dict[str, Any]:
    """``typing.get_type_hints`` of the function whose parameters ``inspect.signature`` reports;
    empty when that fails (the caller then uses the raw signature annotations)."""
    target = _hints_target(fn)
    if target is None:
        return {}
    try:
        return typing.get_type_hints(target)
    except Exception:  # noqa: BLE001 -- unresolvable names: raw annotations (AGENT-6)
        return {}


def _hints_target(fn: Any) -> Any:
    if isinstance(fn, functools.partial):
        return _hints_target(fn.func)
    if inspect.isclass(fn):
        init = getattr(fn, "__init__", None)
        return init if inspect.isfunction(init) else None
    if inspect.isfunction(fn) or inspect.ismethod(fn):
        return fn
    call = inspect.getattr_static(type(fn), "__call__", None)
    return call if inspect.isfunction(call) else None


def _raw(annotation: Any) -> Any:
    if annotation is _EMPTY:
        return Any
    if annotation is None:
        return _NONE_TYPE
    return annotation


# --------------------------------------------------------------------------- names (COMP-2, COMP-3)


def stage_name(stage: Any) -> str:
    """``AgentFunction.name`` / a pipeline's or aggregate's own name / a non-empty ``str``
    attribute ``name`` (``Tool``, ``Task``); else ``__name__``; else ``repr(stage)``."""
    try:
        name = getattr(stage, "name", None)
    except Exception:  # noqa: BLE001 -- a raising property is no name
        name = None
    if isinstance(name, str) and name:
        return name
    try:
        dunder = getattr(stage, "__name__", None)
    except Exception:  # noqa: BLE001
        dunder = None
    if isinstance(dunder, str):
        return dunder
    return repr(stage)


def type_name(t: Any) -> str:
    """``Any`` → ``Any``, a class → its ``__name__``, else ``str(t)``."""
    if t is Any:
        return "Any"
    if _is_plain_class(t):
        return t.__name__
    return str(t)


# --------------------------------------------------------------------------- compatibility (COMP-4)


def compatible(out_t: Any, in_t: Any) -> bool:
    """Can a stage returning ``out_t`` feed a stage expecting ``in_t``?"""
    o = _normalize(out_t)
    i = _normalize(in_t)
    # 1. Any / object (and unresolved annotations, which can't be judged).
    if _is_wildcard(o) or _is_wildcard(i):
        return True
    # 2. Equality: the only rule for two parameterized generics.
    if _same(o, i):
        return True
    # 3. A bare class against a parameterized generic of that origin, either direction.
    if _bare_of(o, i) or _bare_of(i, o):
        return True
    # 4. A union output: every member must fit.
    if _is_union(o):
        return all(compatible(member, i) for member in typing.get_args(o))
    # 5. A union input: some member must accept.
    if _is_union(i):
        return any(compatible(o, member) for member in typing.get_args(i))
    # 6. Two plain classes.
    if _is_plain_class(o) and _is_plain_class(i):
        try:
            return issubclass(o, i)
        except TypeError:
            return False
    # 7.
    return False


def _normalize(t: Any) -> Any:
    while True:
        if t is None:
            return _NONE_TYPE
        if t is _EMPTY:
            return Any
        origin = typing.get_origin(t)
        if origin is typing.Annotated:
            t = typing.get_args(t)[0]
            continue
        # A bare typing alias (typing.List, typing.Dict, ...) means its origin class.
        if isinstance(origin, type) and not _args(t) and not isinstance(t, type):
            return origin
        return t


def _args(t: Any) -> tuple:
    try:
        return typing.get_args(t)
    except Exception:  # noqa: BLE001
        return ()


def _is_wildcard(t: Any) -> bool:
    return t is Any or t is object or _is_unresolved(t)


def _is_unresolved(t: Any) -> bool:
    return isinstance(t, (str, typing.ForwardRef))


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 -- an exotic __eq__ is no match
        return False


def _same(a: Any, b: Any) -> bool:
    """``a == b``, also across spellings of one generic (``typing.Dict[str, int]`` is
    ``dict[str, int]``), argument by argument."""
    if _equal(a, b):
        return True
    if isinstance(a, list) and isinstance(b, list):  # Callable parameter lists
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    origin = typing.get_origin(a)
    if origin is None or origin is not typing.get_origin(b):
        return False
    if origin in _UNION_ORIGINS or origin is typing.Literal:  # their own == is exact
        return False
    a_args, b_args = _args(a), _args(b)
    return len(a_args) == len(b_args) and all(
        _same(_normalize(x), _normalize(y)) for x, y in zip(a_args, b_args)
    )


def _bare_of(bare: Any, generic: Any) -> bool:
    return (
        _is_plain_class(bare)
        and typing.get_origin(generic) is bare
        and not _is_union(generic)
        and bool(_args(generic))
    )


def _is_union(t: Any) -> bool:
    return typing.get_origin(t) in _UNION_ORIGINS


def _is_plain_class(t: Any) -> bool:
    """A class object, not a parameterized generic (``list[int]`` is a ``type`` on 3.10)."""
    return isinstance(t, type) and typing.get_origin(t) is None and not _args(t)


# --------------------------------------------------------------------------- pipe / aggregate


def check_pipe(stages: Sequence[Any]) -> None:
    """At least two stages, every adjacent pair compatible."""
    stages = list(stages)
    if len(stages) < 2:
        raise CompositionTypeError(f"pipe() requires at least 2 stages, got {len(stages)}")
    for index in range(len(stages) - 1):
        left, right = stages[index], stages[index + 1]
        out_t = stage_types(left)[1]
        in_t = stage_types(right)[0]
        if not compatible(out_t, in_t):
            raise CompositionTypeError(
                f"pipe(): stage {index + 1} ({stage_name(left)}) returns {type_name(out_t)} "
                f"but stage {index + 2} ({stage_name(right)}) expects {type_name(in_t)}"
            )


def aggregate_input_type(branch_types: Sequence[Any]) -> Any:
    """The branches' common input type if all are equal (``==``), else ``Any``."""
    branch_types = list(branch_types)
    if not branch_types:
        return Any
    first = branch_types[0]
    if all(_equal(first, t) for t in branch_types[1:]):
        return first
    return Any


# --------------------------------------------------------------------------- validators (COMP-30…32)


class _Unbuildable(Exception):
    """No runtime validator can be built for a type."""

    def __init__(self, error: str, hint: str = ""):
        super().__init__(error)
        self.error = error
        self.hint = hint


def build_validator(stage: Any, input_type: Any = None) -> Callable[[Any, str], Any] | None:
    """The validator of ``stage``'s input boundary, built eagerly.

    ``input_type`` defaults to the stage's own input type (:func:`stage_types`; ``None`` means
    "derive it" -- a ``None`` annotation resolves to ``NoneType``). Returns ``None`` when
    validation is skipped (``Any``, missing, unresolved string annotation); otherwise
    ``validate(value, boundary)`` returning the validated value or raising ``StageTypeError``.
    An unbuildable type raises ``ConfigError`` here.
    """
    declared = stage_types(stage)[0] if input_type is None else input_type
    name = stage_name(stage)
    try:
        check = _compile(declared)
    except _Unbuildable as exc:
        raise ConfigError(
            f"stage '{name}' declares input type {type_name(declared)}, which composeai cannot "
            f"build a runtime validator for: {exc.error}{exc.hint}"
        ) from None
    if check is None:
        return None
    from pydantic import ValidationError

    shown = type_name(declared)

    def validate(value: Any, boundary: str) -> Any:
        try:
            return check(value)
        except ValidationError as exc:
            raise StageTypeError(
                f"{boundary}: stage '{name}' expected {shown} but got an incompatible value "
                f"-- {exc}"
            ) from None

    return validate


_Check = Callable[[Any], Any]

# (type, arbitrary_types_allowed) -> pydantic TypeAdapter. Types that can't be hashed are not
# cached.
_ADAPTERS: dict[tuple[Any, bool], Any] = {}


def _compile(t: Any) -> _Check | None:
    """A strict check of values against ``t`` (raising pydantic ``ValidationError``), ``None``
    when validation is skipped, or ``_Unbuildable``."""
    if t is Any or t is _EMPTY or _is_unresolved(t):
        return None
    from pydantic.errors import PydanticUndefinedAnnotation

    if t is None:
        t = _NONE_TYPE
    if _is_plain_class(t) and getattr(t, "_is_protocol", False):
        probe = _isinstance_error(t)
        if probe is not None:
            raise _Unbuildable(probe, _PROTOCOL_HINT)
        return _isinstance_check(t)
    try:
        adapter = _adapter(t, arbitrary=False)
    except _Incomplete:
        return None
    except PydanticUndefinedAnnotation:
        return None
    except Exception as first:  # noqa: BLE001 -- pydantic can't schema it: isinstance semantics
        if _is_dataclass_class(t) or _is_typeddict(t):
            # These carry their own pydantic config: the arbitrary-types fallback
            # does not apply to their fields, so there is no validator (COMP-31).
            raise _Unbuildable(_schema_error_text(first)) from None
        try:
            adapter = _adapter(t, arbitrary=True)
        except Exception:  # noqa: BLE001
            if _is_plain_class(t) and _isinstance_error(t) is None:
                return _isinstance_check(t)
            raise _Unbuildable(_schema_error_text(first)) from None
    base = _normalize(t)
    if base is t and _is_dataclass_class(t):
        return _DataclassCheck(t, adapter)
    keep_instances = _is_plain_class(base) and _isinstance_error(base) is None
    check = functools.partial(_strict_check, adapter, base if keep_instances else None)
    if base is t and _is_union(t):
        members = [m for m in typing.get_args(t) if _is_dataclass_class(m)]
        if members:
            return _UnionDataclassCheck(
                check, [_DataclassCheck(m, _adapter(m, False)) for m in members]
            )
    return check


def _is_dataclass_class(t: Any) -> bool:
    return _is_plain_class(t) and dataclasses.is_dataclass(t)


def _is_typeddict(t: Any) -> bool:
    return _is_plain_class(t) and typing.is_typeddict(t)


class _Incomplete(Exception):
    """A TypeAdapter that can't be completed (an undefined forward reference inside)."""


def _adapter(t: Any, arbitrary: bool) -> Any:
    from pydantic import ConfigDict, TypeAdapter

    try:
        key = (t, arbitrary)
        cached = _ADAPTERS.get(key)
    except TypeError:  # unhashable type: no caching
        key = None
        cached = None
    if cached is not None:
        return cached
    if arbitrary:
        adapter = TypeAdapter(t, config=ConfigDict(arbitrary_types_allowed=True))
    else:
        adapter = TypeAdapter(t)
    if not getattr(adapter, "pydantic_complete", True):
        raise _Incomplete
    if key is not None:
        _ADAPTERS[key] = adapter
    return adapter


def _strict_check(adapter: Any, keep: type | None, value: Any) -> Any:
    """Strict pydantic validation; an instance of the declared class (or a subclass) passes as
    the same object even where pydantic would hand back a copy."""
    result = adapter.validate_python(value, strict=True)
    if keep is not None and result is not value and isinstance(value, keep):
        return value
    return result


def _isinstance_error(cls: type) -> str | None:
    """The ``TypeError`` text ``isinstance`` raises against ``cls``, or ``None`` if it works."""
    try:
        isinstance(None, cls)
    except TypeError as exc:
        return str(exc)
    return None


def _isinstance_check(cls: type) -> _Check:
    def check(value: Any) -> Any:
        if isinstance(value, cls):
            return value
        raise _validation_error(
            type_name(cls),
            [
                {
                    "type": "is_instance_of",
                    "loc": (),
                    "input": value,
                    "ctx": {"class": type_name(cls)},
                }
            ],
        )

    return check


def _validation_error(title: str, line_errors: list[dict[str, Any]]) -> Exception:
    from pydantic import ValidationError

    return ValidationError.from_exception_data(title, line_errors)  # type: ignore[arg-type]


def _schema_error_text(exc: BaseException) -> str:
    """Pydantic's own explanation, without its documentation trailer."""
    text = getattr(exc, "message", None)
    if not isinstance(text, str) or not text:
        text = str(exc)
    return text.split("\n\n")[0].strip() or type(exc).__name__


class _DataclassCheck:
    """A dataclass boundary: instances go through strict pydantic validation (same object back);
    a ``dict`` instantiates the class from strictly validated ``__init__`` arguments."""

    def __init__(self, cls: type, adapter: Any):
        self.cls = cls
        self.adapter = adapter
        self.title = type_name(cls)
        self._fields: list[tuple[str, _Check | None, bool]] | None = None

    def __call__(self, value: Any) -> Any:
        if isinstance(value, dict):
            return self._from_dict(value)
        return _strict_check(self.adapter, self.cls, value)

    def _from_dict(self, data: dict) -> Any:
        from pydantic import ValidationError

        kwargs: dict[str, Any] = {}
        errors: list[dict[str, Any]] = []
        for name, check, required in self._init_fields():
            if name not in data:
                if required:
                    errors.append({"type": "missing", "loc": (name,), "input": data})
                continue
            value = data[name]
            if check is None:
                kwargs[name] = value
                continue
            try:
                kwargs[name] = check(value)
            except ValidationError as exc:
                errors.extend(_relocated(exc, name))
        if errors:
            raise _validation_error(self.title, errors)
        return self.cls(**kwargs)

    def _init_fields(self) -> list[tuple[str, _Check | None, bool]]:
        # Built on first use: a recursive dataclass refers to itself.
        if self._fields is None:
            try:
                hints = typing.get_type_hints(self.cls)
            except Exception:  # noqa: BLE001 -- unresolvable: raw annotations
                hints = {}
            fields = []
            for param in inspect.signature(self.cls).parameters.values():
                if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                    continue
                annotation = hints.get(param.name, _raw(param.annotation))
                if isinstance(annotation, dataclasses.InitVar):
                    annotation = annotation.type
                try:
                    check = _compile(annotation)
                except _Unbuildable:
                    check = None  # pydantic accepted the class itself; leave the field be
                fields.append((param.name, check, param.default is param.empty))
            self._fields = fields
        return self._fields


class _UnionDataclassCheck:
    """A union with dataclass members: strict pydantic first; a ``dict`` it rejects is then
    offered to each dataclass member in declaration order (``Inner | None`` takes a ``dict``).
    With a single dataclass member, a dict it rejects reports that member's field errors."""

    def __init__(self, check: _Check, members: list[_DataclassCheck]):
        self.check = check
        self.members = members

    def __call__(self, value: Any) -> Any:
        from pydantic import ValidationError

        try:
            return self.check(value)
        except ValidationError:
            if not isinstance(value, dict):
                raise
            member_error = None
            for member in self.members:
                try:
                    return member(value)
                except ValidationError as exc:
                    member_error = exc
            if len(self.members) == 1:
                # The dict was meant for the one dataclass: its field errors say why it failed
                # (its one try raised, or it would have returned).
                assert member_error is not None
                raise member_error from None
            raise


def _relocated(exc: Any, name: str) -> list[dict[str, Any]]:
    from pydantic_core import PydanticCustomError

    return [
        {
            "type": PydanticCustomError(error["type"], error["msg"]),
            "loc": (name, *error["loc"]),
            "input": error["input"],
        }
        for error in exc.errors(include_url=False)
    ]
