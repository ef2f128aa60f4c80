"""Runtime stand-ins for the few `typing` constructs the modules that
`import composeai` loads need at run time (`typing` costs a fresh process
more than a millisecond, and imports `re` and `contextlib`). Type checkers
see `typing` itself: those modules import these names only when not
`TYPE_CHECKING`.

`Generic[...]` as a base gives a class `Generic`'s `__slots__ = ()` and
runtime subscription (`Run[int]` is a `types.GenericAlias`, as `list[int]`
is); a type variable is a named marker; `overload` keeps the last
definition, as `typing.overload`'s callers see it.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import GenericAlias
else:
    # `types.GenericAlias`, without importing `types`.
    GenericAlias = type(list[int])


class Generic:
    __slots__ = ()

    def __class_getitem__(cls, params: object) -> object:
        if cls is Generic:
            return Generic
        return GenericAlias(cls, params)


class TypeVar:
    __slots__ = ("__name__",)

    def __init__(self, name: str):
        self.__name__ = name

    def __repr__(self) -> str:
        return "~" + self.__name__


ParamSpec = TypeVar


def overload(fn: object) -> object:
    return fn
