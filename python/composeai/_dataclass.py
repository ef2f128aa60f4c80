"""Dataclasses whose `dataclasses` metadata is built on first use.

`import dataclasses` also imports `inspect`, `ast`, `dis`, `tokenize` and
`re`: most of a fresh process's `import composeai`. The few dataclasses that
module must define (`Run`, `Budget`, `Span`, `ErrorInfo`, `Event`) spell out
the methods `@dataclass` would generate, and carry `fields` below: the first
look at `__dataclass_fields__` or `__dataclass_params__` (by
`dataclasses.fields`, `asdict`, `replace`, `is_dataclass`, pydantic, the
codec) applies the real `dataclasses.dataclass` to a twin of the class and
keeps its metadata, so those see exactly what `@dataclass` would have made.
tests/test_startup.py checks each class against its decorated twin.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class _Factory:
    """The default of a `default_factory` field in a written-out `__init__`
    (shown as `@dataclass` shows it)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<factory>"


FACTORY: Any = _Factory()


class _Metadata:
    """`__dataclass_fields__` / `__dataclass_params__` until first read."""

    def __init__(self, params: dict[str, Any], defaults: dict[str, Any], factories: dict[str, Any]):
        self.params = params
        self.defaults = defaults
        self.factories = factories

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, cls: type) -> Any:
        bind_annotation_names(cls)
        t = twin(cls, self.params, self.defaults, self.factories)
        fields, params = t.__dataclass_fields__, t.__dataclass_params__  # type: ignore[attr-defined]
        type.__setattr__(cls, "__dataclass_fields__", fields)
        type.__setattr__(cls, "__dataclass_params__", params)
        return fields if self.name == "__dataclass_fields__" else params


def bind_annotation_names(cls: type) -> None:
    """Binds, in `cls`'s module, the `typing` names its annotations use and
    the module imports only for type checkers (`Any`, `Literal`, type
    variables, lazily built aliases), so that `typing.get_type_hints` and
    pydantic, which look at the dataclass first, can resolve them."""
    import sys
    import typing

    from . import _typing

    module = sys.modules[cls.__module__]
    namespace = vars(module)
    namespace.setdefault("Any", typing.Any)
    namespace.setdefault("Literal", typing.Literal)
    for name, value in list(namespace.items()):
        if type(value) is _typing.TypeVar:
            namespace[name] = typing.TypeVar(value.__name__)
    for name in getattr(cls, "_lazy_annotation_names", ()):
        getattr(module, name)


def twin(
    cls: type, params: dict[str, Any], defaults: dict[str, Any], factories: dict[str, Any]
) -> type:
    """`cls`'s fields, defaults and factories, decorated by `@dataclass`."""
    import dataclasses

    ns: dict[str, Any] = {
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        "__annotations__": dict(cls.__annotations__),
    }
    for name in cls.__annotations__:
        if name in factories:
            ns[name] = dataclasses.field(default_factory=factories[name])
        elif name in defaults:
            ns[name] = defaults[name]
        elif name in cls.__dict__:
            ns[name] = cls.__dict__[name]
    return dataclasses.dataclass(**params)(type(cls.__name__, (), ns))


def metadata(
    params: dict[str, Any],
    defaults: dict[str, Any] | None = None,
    factories: dict[str, Any] | None = None,
) -> Any:
    """A class attribute for `__dataclass_fields__`, and another for
    `__dataclass_params__`: `@dataclass`'s arguments, the fields' plain
    defaults and their default factories."""
    return _Metadata(params, defaults or {}, factories or {})


def frozen_error(action: str, name: str) -> Exception:
    import dataclasses

    return dataclasses.FrozenInstanceError(f"cannot {action} field {name!r}")
