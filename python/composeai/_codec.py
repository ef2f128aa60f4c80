"""The value encoder/decoder and its type registry.

Every journaled step, run argument, pending interrupt, cassette and cache entry goes
through :func:`dumps` / :func:`loads`, so this module is on the engine's hot path and is
written for speed on the common cases (scalars and small lists/dicts of scalars):

* exact-type checks instead of ``isinstance`` chains for JSON-native values;
* a JSON encoder/scanner built once from :mod:`json`'s C accelerators instead of going
  through ``json.dumps``/``json.loads`` (which rebuild an encoder on every call);
* ``loads`` skips the decode walk entirely when the text cannot contain a ``$kind`` tag;
* error paths (``a.b[2]``) are reconstructed only when an error is actually raised.

Import cost is kept to ``sys`` and json's C accelerator ``_json`` (the ``json`` package
imports ``re``, which imports ``enum``: several milliseconds of a fresh process); ``json``
itself is imported only where the accelerator is missing and on error paths. pydantic is
never imported here: a value can only be a pydantic model if ``pydantic`` is already in
``sys.modules``; enum values likewise only exist once ``enum`` is. The ``datetime``,
``dataclasses`` and ``typing`` modules are also only consulted lazily.

Encoding rules and the decisions taken where the spec leaves room:

* ``None``/``bool``/``int``/``float``/``str`` are stored as is. Subclasses of ``str`` --
  including ``str``-mixin enums such as ``StopReason`` -- are stored as their plain string
  (so they decode as plain ``str``). Other enums, *including* ``IntEnum``/``IntFlag``, are
  tagged ``{"$kind": "enum", ...}``: only ``str``-subclass enums lose their type. Non-enum
  subclasses of ``int``/``float`` are stored as the plain number.
* ``NaN`` and ``±inf`` are allowed and written as ``NaN``/``Infinity``/``-Infinity`` (the
  same default as :func:`json.dumps`); :func:`loads` reads them back.
* ``list`` and ``dict`` subclasses (``OrderedDict``, ``defaultdict`` ...) are encoded as
  plain lists/dicts. Exact ``tuple`` is tagged; every ``tuple`` subclass (NamedTuples,
  struct sequences ...) is refused. ``set``/``frozenset`` (and subclasses) are tagged;
  their elements are written in sorted order when they are mutually orderable, so the
  output is deterministic across processes (cache keys), else in iteration order.
* Dict keys must be ``str`` (a ``str``-enum key becomes its plain string).
* Composite ``Flag`` values without a single member name are written as ``"A|B"`` (and
  ``""`` for the empty flag) and decoded by OR-ing the named members.
* Tagged values carry extra keys without complaint; a missing ``value`` is "corrupted".
* ``datetime``/``time`` keep their UTC offset (``isoformat``); a ``zoneinfo`` zone name is
  not preserved, only the offset. Subclasses of ``datetime``/``date``/``time`` decode as
  the base class.
* Error paths: the root is ``<root>`` (or the ``path`` argument); a key under the root is
  ``key``, an index under the root is ``[i]``; deeper levels are ``key.sub[2]``. When a
  custom ``path`` is passed, children are ``path.key`` / ``path[i]``.
* :func:`dumps` guarantees UTF-8-encodable output: non-ASCII characters are written
  literally (readable and full-text searchable), except when the value contains lone
  surrogates, in which case the whole text is written with ``\\uXXXX`` escapes.
"""

from __future__ import annotations

import sys

from composeai import _core
from composeai.errors import SerializationError

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at runtime (import cost)
    from collections.abc import Callable
    from enum import Enum
    from typing import Any, TypeGuard

    # json's C accelerators, or None without them. The scanner reads its settings
    # off any object with a `JSONDecoder`'s attributes (its stub asks for a scanner).
    _c_make_encoder: Callable[..., Callable[[Any, int], Any]] | None
    _c_make_scanner: Callable[[Any], Callable[[str, int], tuple[Any, int]]] | None

try:
    from _json import encode_basestring as _encode_str
    from _json import encode_basestring_ascii as _encode_str_ascii
    from _json import make_encoder as _c_make_encoder
    from _json import make_scanner as _c_make_scanner
except ImportError:  # no C accelerator: the json package's Python parts
    from json.encoder import encode_basestring as _encode_str
    from json.encoder import encode_basestring_ascii as _encode_str_ascii

    _c_make_encoder = _c_make_scanner = None

__all__ = [
    "decode",
    "dumps",
    "dumps_lenient",
    "encode",
    "loads",
    "register_annotation_types",
    "register_module_types",
    "register_serializable",
    "tag_of",
]

_ROOT = "<root>"
_KIND = "$kind"
_NoneType = type(None)
# Values returned unchanged by the encoder (exact types only).
_PRIMS = frozenset((str, int, float, bool, _NoneType))
# Containers the decoder must descend into.
_JSON_CONTAINERS = frozenset((dict, list))


def _is_enum(v: Any) -> bool:
    # An enum value (or class) exists only once `enum` is loaded.
    mod = sys.modules.get("enum")
    return mod is not None and isinstance(v, mod.Enum)


def _is_enum_class(cls: type) -> TypeGuard[type[Enum]]:
    mod = sys.modules.get("enum")
    return mod is not None and issubclass(cls, mod.Enum)


# tag -> class. Filled by encoding, register_serializable and the register_* scanners.
_REGISTRY: dict[str, type] = {}
# class -> tag (cache of tag_of).
_TAGS: dict[type, str] = {}
# dataclass -> tuple of field names, or the name (str) of an init=False field.
_DC_FIELDS: dict[type, tuple[str, ...] | str] = {}
# pydantic model class -> tag, for classes the encoders have met (skips the type tests).
_MODEL_TAGS: dict[type, str] = {}


# --------------------------------------------------------------------------- registry


def tag_of(cls: type) -> str:
    """The type tag of ``cls``: ``"<module>:<qualname>"``."""
    tag = _TAGS.get(cls)
    if tag is None:
        tag = f"{cls.__module__}:{cls.__qualname__}"
        _TAGS[cls] = tag
    return tag


def register_serializable(cls: type) -> type:
    """Register ``cls`` for decoding under :func:`tag_of` ``(cls)``; returns ``cls``.

    Usable as a class decorator. Re-registering a tag rebinds it to the newest class.
    """
    if not isinstance(cls, type):
        raise TypeError(f"register_serializable() expects a class, got {cls!r}")
    _REGISTRY[tag_of(cls)] = cls
    return cls


def _pydantic_base() -> type | None:
    mod = sys.modules.get("pydantic")
    if mod is None:
        return None
    return getattr(mod, "BaseModel", None)


def _is_model_class(cls: type) -> bool:
    base = _pydantic_base()
    return base is not None and cls is not base and issubclass(cls, base)


def _is_persistable_class(obj: type) -> bool:
    """A pydantic model, dataclass or (non-empty) enum class."""
    if _is_enum_class(obj):
        return len(obj.__members__) > 0
    return hasattr(obj, "__dataclass_fields__") or _is_model_class(obj)


def _resolve_hints(obj: Any, raw: dict[str, Any], globalns: dict[str, Any] | None) -> list[Any]:
    """``typing.get_type_hints(obj)`` values, or failing that every resolvable entry of ``raw``.

    Unresolvable (forward-reference) strings are skipped; evaluating annotation strings is
    exactly what ``get_type_hints`` does, and it imports nothing.
    """
    import typing

    try:
        hints = typing.get_type_hints(obj, include_extras=True)
    except Exception:  # noqa: BLE001 -- any resolution failure: fall back entry by entry
        hints = None
    if hints is not None:
        return list(hints.values())
    out = []
    for a in raw.values():
        if isinstance(a, str):
            if globalns is None:
                continue
            try:
                a = eval(a, globalns)  # what typing.get_type_hints does
            except Exception:  # noqa: BLE001, S112 -- unresolvable forward reference
                continue
        out.append(a)
    return out


def _field_types(cls: type) -> list[Any]:
    """Annotations of the fields of a model/dataclass."""
    if _is_model_class(cls):
        return [info.annotation for info in getattr(cls, "model_fields", {}).values()]
    fields = getattr(cls, "__dataclass_fields__", None)
    if not fields:
        return []
    module = sys.modules.get(cls.__module__)
    globalns = vars(module) if module is not None else None
    return _resolve_hints(cls, {name: f.type for name, f in fields.items()}, globalns)


# Modules whose objects are typing constructs (list[X], X | None, Annotated[...], Union ...).
_TYPING_MODULES = frozenset(("typing", "types", "typing_extensions"))


def _walk_type(tp: Any, seen: set[int]) -> None:
    """Register every persistable class reachable from the annotation ``tp``. Never raises."""
    try:
        _walk_type_inner(tp, seen)
    except Exception:  # noqa: BLE001 -- registration is best effort on arbitrary objects
        return


def _walk_type_inner(tp: Any, seen: set[int]) -> None:
    key = id(tp)
    if key in seen:
        return
    seen.add(key)
    if _is_enum(tp):  # a Literal[Color.RED] argument
        _walk_type(type(tp), seen)
        return
    if type(tp).__module__ in _TYPING_MODULES:
        # Generic aliases expose __origin__ (Annotated's is the annotated type) and __args__.
        # Only typing objects are probed, so no foreign __getattr__ (lazy modules) runs.
        origin = getattr(tp, "__origin__", None)
        if origin is not None:
            _walk_type(origin, seen)
        args = getattr(tp, "__args__", None)
        if isinstance(args, tuple):
            for a in args:
                _walk_type(a, seen)
        return
    if not isinstance(tp, type) or not _is_persistable_class(tp):
        return
    register_serializable(tp)
    if not _is_enum_class(tp):
        # Not cached across calls: a model's forward references may resolve later.
        for ft in _field_types(tp):
            _walk_type(ft, seen)


def register_module_types(module: Any) -> None:
    """Register every pydantic model, dataclass and enum found in ``vars(module)``.

    Recurses into field types and generic arguments. Re-exported types register under
    their own defining module's tag. Nothing is imported.
    """
    seen: set[int] = set()
    for obj in list(vars(module).values()):
        _walk_type(obj, seen)


# Annotations that cannot reach a persistable type (checked before resolving hints).
_PLAIN_ANNOTATIONS = frozenset(
    (str, int, float, bool, bytes, _NoneType, object, None)
    + ("str", "int", "float", "bool", "bytes", "None", "object", "Any")
)


def _is_plain_annotation(a: Any) -> bool:
    t = type(a)
    return (t is type or t is str or a is None) and a in _PLAIN_ANNOTATIONS


def register_annotation_types(fn: Any) -> None:
    """Register the persistable types reachable from ``fn``'s annotations.

    Resolves annotations with ``typing.get_type_hints(include_extras=True)``; if that fails
    (e.g. an unresolvable forward reference), each annotation is resolved on its own and
    the unresolvable ones are skipped. Never raises.
    """
    try:
        raw = getattr(fn, "__annotations__", None)
        if not raw or not isinstance(raw, dict):
            return
        if all(_is_plain_annotation(a) for a in raw.values()):
            return  # fast path: only builtin scalar annotations, nothing to register
        globalns = getattr(fn, "__globals__", None)
        if not isinstance(globalns, dict):
            module = sys.modules.get(getattr(fn, "__module__", None) or "")
            globalns = vars(module) if module is not None else None
        values = _resolve_hints(fn, raw, globalns)
    except Exception:  # noqa: BLE001 -- decoration must never fail because of this
        return
    seen: set[int] = set()
    for a in values:
        _walk_type(a, seen)


# --------------------------------------------------------------------------- encoding


class _Fail(Exception):
    """Internal encode failure; ``segs`` collects path segments innermost-first."""

    __slots__ = ("msg", "segs")

    def __init__(self, msg: str):
        super().__init__(msg)
        self.msg = msg
        self.segs: list[str | int] = []


def _format_path(path: str, segs: list[str | int]) -> str:
    if not segs:
        return path
    parts: list[str] = [] if path == _ROOT else [path]
    for seg in reversed(segs):
        if type(seg) is int:
            parts.append(f"[{seg}]")
        elif parts:
            parts.append(f".{seg}")
        else:
            # A key, so a str (a failed `type(seg) is int` narrows nothing).
            parts.append(seg)  # type: ignore[arg-type]
    return "".join(parts)


def _not_serializable(v: Any) -> _Fail:
    return _Fail(f"{type(v)!r} is not JSON-serializable")


def _key(k: Any) -> str:
    if isinstance(k, str):
        return str.__str__(k)
    raise _Fail(f"dict keys must be str, got {k!r}")


def _enc(v: Any) -> Any:
    """Strict encoder. Raises :class:`_Fail` (converted to SerializationError by callers)."""
    t = type(v)
    if t is list:
        try:
            return [x if type(x) in _PRIMS else _enc(x) for x in v]
        except _Fail:
            _relocate_seq(v, _enc)
            raise
    if t is dict:
        return _enc_dict(v)
    if t in _PRIMS:
        return v
    return _enc_other(v, _enc)


def _relocate_seq(v: Any, rec: Any) -> None:
    """Re-walk a sequence whose encoding failed, to attach the failing index."""
    for i, x in enumerate(v):
        if type(x) in _PRIMS:
            continue
        try:
            rec(x)
        except _Fail as e:
            e.segs.append(i)
            raise


def _enc_dict(v: dict) -> Any:
    try:
        out = {
            (k if type(k) is str else _key(k)): (x if type(x) in _PRIMS else _enc(x))
            for k, x in v.items()
        }
    except _Fail:
        for k, x in v.items():
            if type(k) is not str:
                _key(k)
            if type(x) in _PRIMS:
                continue
            try:
                _enc(x)
            except _Fail as e:
                e.segs.append(k if type(k) is str else _key(k))
                raise
        raise
    if _KIND in v:
        return {_KIND: "dict", "value": out}
    return out


def _enc_seq(v: Any, rec: Any) -> list:
    try:
        return [x if type(x) in _PRIMS else rec(x) for x in v]
    except _Fail:
        _relocate_seq(v, rec)
        raise


def _set_items(v: Any) -> list:
    try:
        return sorted(v)
    except Exception:  # noqa: BLE001 -- unorderable elements: order by their encoding
        return _by_encoding(v)


def _by_encoding(v: Any) -> list:
    """A set's elements ordered by their encoded text: iteration order
    depends on the process's hash seed, and a set's text (and the hash of a
    step's arguments) must be the same in every process."""
    try:
        return sorted(v, key=dumps)
    except Exception:  # noqa: BLE001 -- an unencodable element fails the encoding later
        return list(v)


def _enum_name(v: Any) -> str:
    cls = type(v)
    name = v._name_
    if name is not None and name in cls.__members__:
        return name
    if isinstance(v, sys.modules["enum"].Flag):
        value = v._value_
        parts = []
        acc = 0
        for m_name, m in cls.__members__.items():
            mv = m._value_
            if isinstance(mv, int) and mv and mv & (mv - 1) == 0 and value & mv == mv:
                parts.append(m_name)
                acc |= mv
        if acc == value:
            return "|".join(parts)
    raise _Fail(f"{cls!r} member {v!r} has no name and cannot be encoded")


def _dataclass_fields(cls: type) -> tuple[str, ...] | str:
    got = _DC_FIELDS.get(cls)
    if got is None:
        import dataclasses

        names = []
        got = None
        for f in dataclasses.fields(cls):
            if not f.init:
                got = f.name
                break
            names.append(f.name)
        if got is None:
            got = tuple(names)
        _DC_FIELDS[cls] = got
    return got


def _enc_other(v: Any, rec: Any) -> Any:
    """Everything that is not an exact JSON-native type. ``rec`` encodes children."""
    t = type(v)
    tag = _MODEL_TAGS.get(t)
    if tag is not None:
        return _enc_model(v, t, tag)
    if isinstance(v, str):
        return str.__str__(v)  # str subclasses, incl. str-mixin enums: plain string
    if _is_enum(v):
        tag = _TAGS.get(t) or tag_of(t)
        _REGISTRY[tag] = t
        return {_KIND: "enum", "$type": tag, "value": _enum_name(v)}
    if t is tuple:
        return {_KIND: "tuple", "value": _enc_seq(v, rec)}
    if isinstance(v, frozenset):
        return {_KIND: "frozenset", "value": _enc_seq(_set_items(v), rec)}
    if isinstance(v, set):
        return {_KIND: "set", "value": _enc_seq(_set_items(v), rec)}
    if isinstance(v, tuple):
        raise _not_serializable(v)  # NamedTuples and other tuple subclasses
    if isinstance(v, bool):  # pragma: no cover - bool cannot be subclassed
        return bool(v)
    if isinstance(v, int):
        return int.__int__(v)
    if isinstance(v, float):
        return float.__float__(v)
    if isinstance(v, list):
        return _enc_seq(v, rec)
    if isinstance(v, dict):
        if rec is _enc:
            return _enc_dict(v)
        return _lenient_dict(v)
    base = _pydantic_base()
    if base is not None and isinstance(v, base):
        tag = _TAGS.get(t) or tag_of(t)
        _MODEL_TAGS[t] = tag
        return _enc_model(v, t, tag)
    if hasattr(t, "__dataclass_fields__"):
        names = _dataclass_fields(t)
        if type(names) is str:
            raise _Fail(f"dataclass {t!r} field {names!r} has init=False, so it cannot be decoded")
        out = {}
        for name in names:
            x = getattr(v, name)
            if type(x) in _PRIMS:
                out[name] = x
                continue
            try:
                out[name] = rec(x)
            except _Fail as e:
                e.segs.append(name)
                raise
        tag = _TAGS.get(t) or tag_of(t)
        _REGISTRY[tag] = t
        return {_KIND: "dataclass", "$type": tag, "value": out}
    dt = sys.modules.get("datetime")
    if dt is not None:
        if isinstance(v, dt.datetime):
            return {_KIND: "datetime", "value": v.isoformat()}
        if isinstance(v, dt.date):
            return {_KIND: "date", "value": v.isoformat()}
        if isinstance(v, dt.time):
            return {_KIND: "time", "value": v.isoformat()}
    raise _not_serializable(v)


def _enc_model(v: Any, t: type, tag: str) -> Any:
    try:
        dumped = v.model_dump(mode="json")
    except Exception as exc:
        raise _Fail(f"{t!r} is not JSON-serializable: {exc}") from exc
    _REGISTRY[tag] = t
    return {_KIND: "pydantic", "$type": tag, "value": dumped}


def _serialization_error(path: str, fail: _Fail) -> SerializationError:
    return SerializationError(f"{_format_path(path, fail.segs)}: {fail.msg}")


def encode(value: Any, path: str = _ROOT) -> Any:
    """Encode ``value`` into a JSON-safe tree. Registers encoded classes."""
    if type(value) in _PRIMS:
        return value
    try:
        return _enc(value)
    except _Fail as fail:
        raise _serialization_error(path, fail) from fail.__cause__
    except RecursionError:
        raise SerializationError(
            f"{path}: value is nested too deeply or contains a reference cycle"
        ) from None


# ---- lenient encoding (trace payloads / attributes, OBS-4)


def _safe_repr(v: Any) -> str:
    try:
        return repr(v)
    except Exception:  # noqa: BLE001 -- a broken __repr__ must not break tracing
        try:
            return f"<unrepresentable {type(v)!r}>"
        except Exception:  # noqa: BLE001
            return "<unrepresentable>"


def _lenient_key(k: Any) -> str:
    if isinstance(k, str):
        return str.__str__(k)
    return _safe_repr(k)


def _lenient_dict(v: dict) -> Any:
    out = {
        (k if type(k) is str else _lenient_key(k)): (x if type(x) in _PRIMS else _lenient(x))
        for k, x in v.items()
    }
    if _KIND in out:
        return {_KIND: "dict", "value": out}
    return out


def _lenient(v: Any) -> Any:
    t = type(v)
    if t is list:
        return [x if type(x) in _PRIMS else _lenient(x) for x in v]
    if t is dict:
        return _lenient_dict(v)
    if t in _PRIMS:
        return v
    try:
        return _enc_other(v, _lenient)
    except RecursionError:
        raise
    except Exception:  # noqa: BLE001 -- lenient: anything unencodable becomes its repr
        return _safe_repr(v)


# --------------------------------------------------------------------------- JSON text


def _no_default(o: Any) -> Any:  # the encoded tree only holds JSON-native values
    raise TypeError(f"{type(o)!r} is not JSON-serializable")


def _make_dumper(ensure_ascii: bool) -> Any:
    """A compact ``tree -> str`` JSON writer, built once.

    Uses json's C encoder directly (``json.dumps`` rebuilds it on every call, ~3x slower
    for small values); falls back to a ``JSONEncoder`` if the accelerator is missing or
    behaves unexpectedly.
    """
    escape = _encode_str_ascii if ensure_ascii else _encode_str
    c_make_encoder = _c_make_encoder
    if c_make_encoder is not None:
        try:
            c_enc = c_make_encoder(None, _no_default, escape, None, ":", ",", False, False, True)
            probe = "".join(c_enc({"a": [1, 1.5, None, True, "\u00e9"]}, 0))
        except (TypeError, ValueError):
            probe = None
        if probe == '{"a":[1,1.5,null,true,' + escape("\u00e9") + "]}":
            join = "".join

            def dump_tree(tree: Any) -> str:
                return join(c_enc(tree, 0))

            return dump_tree
    import json

    encoder = json.JSONEncoder(
        separators=(",", ":"), ensure_ascii=ensure_ascii, check_circular=False, default=_no_default
    )
    return encoder.encode


_dump_tree = _make_dumper(False)
_dump_tree_ascii = _make_dumper(True)
_NAN = float("nan")
_INF = float("inf")


class _ScanContext:
    """The settings json's C scanner reads from a `JSONDecoder`: `json.loads`'s
    defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": -_INF, "Infinity": _INF, "NaN": _NAN}.__getitem__


def _make_scanner() -> Any:
    if _c_make_scanner is not None:
        return _c_make_scanner(_ScanContext())
    import json.decoder
    import json.scanner

    # The stub asks for a scanner; what is read is a `JSONDecoder`'s settings.
    return json.scanner.make_scanner(json.decoder.JSONDecoder())  # type: ignore[arg-type]


_scan_once = _make_scanner()
_loads_plain = _core.loads_plain
_MISS = object()
_FAST_MAX = 256  # the core's limit (src/py/codec.rs)
_int_repr = int.__repr__
_float_repr = float.__repr__


def _float_text(v: float) -> str:
    if v != v:  # noqa: PLR0124 -- NaN
        return "NaN"
    if v == _INF:
        return "Infinity"
    if v == -_INF:
        return "-Infinity"
    return _float_repr(v)


def _utf8_safe(text: str, tree: Any) -> str:
    """Return ``text`` if it is UTF-8-encodable, else the ASCII-escaped dump of ``tree``."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _dump_tree_ascii(tree)
    return text


def dumps(value: Any, path: str = _ROOT) -> str:
    """Encode ``value`` and return compact JSON text."""
    t = type(value)
    if t is str:
        return _utf8_safe(_encode_str(value), value)
    if t is int:
        try:
            return _int_repr(value)
        except ValueError as exc:  # more digits than sys.get_int_max_str_digits()
            raise SerializationError(f"{path}: {exc}") from None
    if t is bool:
        return "true" if value else "false"
    if value is None:
        return "null"
    if t is float:
        return _float_text(value)
    try:
        tree = _enc(value)
    except _Fail as fail:
        raise _serialization_error(path, fail) from fail.__cause__
    except RecursionError:
        raise SerializationError(
            f"{path}: value is nested too deeply or contains a reference cycle"
        ) from None
    try:
        text = _dump_tree(tree)
    except (ValueError, TypeError, RecursionError) as exc:
        raise SerializationError(f"{path}: {exc}") from None
    return _utf8_safe(text, tree)


def _make_sorted_dumper() -> Any:
    """`_dump_tree` with every object's keys in sorted order."""
    if _c_make_encoder is not None:
        c_enc = _c_make_encoder(None, _no_default, _encode_str, None, ":", ",", True, False, True)

        def dump_tree(tree: Any) -> str:
            return "".join(c_enc(tree, 0))

        return dump_tree
    import json

    encoder = json.JSONEncoder(
        separators=(",", ":"),
        ensure_ascii=False,
        check_circular=False,
        sort_keys=True,
        default=_no_default,
    )
    return encoder.encode


_dump_sorted = _make_sorted_dumper()
_SET_KINDS = ("set", "frozenset")


def _canonical_sets(tree: Any) -> Any:
    """`tree` with the elements of every encoded set in the order of their
    canonical text (sets of sets are only partially ordered by `sorted`)."""
    if type(tree) is list:
        return [_canonical_sets(x) for x in tree]
    if type(tree) is not dict:
        return tree
    out = {k: _canonical_sets(x) for k, x in tree.items()}
    if out.get(_KIND) in _SET_KINDS and type(out.get("value")) is list:
        out["value"] = sorted(out["value"], key=_dump_sorted)
    return out


def canonical_dumps(value: Any) -> str:
    """A text of `value` that two equal values share whatever their dict
    insertion order or set iteration order (the hash of a step's arguments
    compares them): :func:`dumps`'s encoding with object keys
    sorted. Raises `SerializationError` like :func:`dumps`."""
    try:
        tree = _enc(value)
    except _Fail as fail:
        raise _serialization_error(_ROOT, fail) from fail.__cause__
    except RecursionError:
        raise SerializationError(
            f"{_ROOT}: value is nested too deeply or contains a reference cycle"
        ) from None
    try:
        text = _dump_sorted(tree)
        if '"set"' in text or '"frozenset"' in text:
            text = _dump_sorted(_canonical_sets(tree))
    except (ValueError, TypeError, RecursionError) as exc:
        raise SerializationError(f"{_ROOT}: {exc}") from None
    if not text.isascii():
        # Lone surrogates have no UTF-8 form: escaped, each to its own text.
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def dumps_lenient(value: Any) -> str:
    """Like :func:`dumps`, but unencodable sub-values become their ``repr()``.

    Never raises.
    """
    try:
        if type(value) in _PRIMS:
            return dumps(value)
        tree = _lenient(value)
        return _utf8_safe(_dump_tree(tree), tree)
    except Exception:  # noqa: BLE001 -- never raises (OBS-4)
        try:
            tree = _safe_repr(value)
            return _dump_tree_ascii(tree)
        except Exception:  # noqa: BLE001
            return '"<unrepresentable>"'


# --------------------------------------------------------------------------- decoding


def _corrupt(kind: Any, detail: str) -> SerializationError:
    return SerializationError(f"corrupted journal/state row (kind={kind!r}): {detail}")


def _unregistered(tag: str) -> SerializationError:
    module = tag.split(":")[0]
    return SerializationError(
        f"Cannot decode unregistered type '{tag}': import the module that defines it "
        f"(e.g. `import {module}`) or call register_serializable(...) before decoding this "
        "data. Types are never imported automatically, by design (security)."
    )


def _dec(v: Any) -> Any:
    t = type(v)
    if t is dict:
        if _KIND in v:
            return _dec_tagged(v)
        return {k: (x if type(x) not in _JSON_CONTAINERS else _dec(x)) for k, x in v.items()}
    if t is list:
        return [x if type(x) not in _JSON_CONTAINERS else _dec(x) for x in v]
    return v


def _dec_list(v: list) -> list:
    return [x if type(x) not in _JSON_CONTAINERS else _dec(x) for x in v]


def _value(d: dict, kind: str, want: type) -> Any:
    try:
        value = d["value"]
    except KeyError:
        raise _corrupt(kind, "missing 'value'") from None
    if not isinstance(value, want):
        raise _corrupt(kind, f"'value' must be a {want.__name__}, got {type(value).__name__}")
    return value


def _registered(d: dict, kind: str) -> tuple[str, type]:
    tag = d.get("$type")
    if type(tag) is not str:
        raise _corrupt(kind, f"missing or invalid '$type': {tag!r}")
    cls = _REGISTRY.get(tag)
    if cls is None:
        raise _unregistered(tag)
    return tag, cls


def _dec_pydantic(d: dict) -> Any:
    tag, cls = _registered(d, "pydantic")
    if "value" not in d:
        raise _corrupt("pydantic", "missing 'value'")
    validate = getattr(cls, "model_validate", None)
    if validate is None or not _is_model_class(cls):
        raise _corrupt("pydantic", f"registered type '{tag}' is not a pydantic model")
    try:
        return validate(d["value"])
    except Exception as exc:
        raise _corrupt("pydantic", f"'{tag}' failed validation: {exc}") from exc


def _dec_enum(d: dict) -> Any:
    tag, cls = _registered(d, "enum")
    name = _value(d, "enum", str)
    if not (isinstance(cls, type) and _is_enum_class(cls)):
        raise _corrupt("enum", f"registered type '{tag}' is not an enum")
    try:
        return cls.__members__[name]
    except KeyError:
        pass
    if issubclass(cls, sys.modules["enum"].Flag):
        parts = name.split("|") if name else []
        if all(part in cls.__members__ for part in parts):
            # A `Flag`, typed only as an `Enum`: the check above reads `enum` off `sys.modules`.
            result: Any = cls(0)
            for part in parts:
                result |= cls.__members__[part]
            return result
    raise _corrupt("enum", f"'{tag}' has no member {name!r}")


def _dec_dataclass(d: dict) -> Any:
    tag, cls = _registered(d, "dataclass")
    value = _value(d, "dataclass", dict)
    if not hasattr(cls, "__dataclass_fields__"):
        raise _corrupt("dataclass", f"registered type '{tag}' is not a dataclass")
    kwargs = {k: (x if type(x) not in _JSON_CONTAINERS else _dec(x)) for k, x in value.items()}
    try:
        return cls(**kwargs)
    except Exception as exc:
        raise _corrupt("dataclass", f"cannot construct '{tag}': {exc}") from exc


def _dec_temporal(kind: str) -> Any:
    def dec(d: dict) -> Any:
        text = _value(d, kind, str)
        import datetime

        try:
            return getattr(datetime, kind).fromisoformat(text)
        except ValueError as exc:
            raise _corrupt(kind, str(exc)) from None

    return dec


def _dec_collection(kind: str, build: type) -> Any:
    def dec(d: dict) -> Any:
        items = _dec_list(_value(d, kind, list))
        try:
            return build(items)
        except TypeError as exc:
            raise _corrupt(kind, str(exc)) from None

    return dec


def _dec_dict(d: dict) -> Any:
    value = _value(d, "dict", dict)
    return {k: (x if type(x) not in _JSON_CONTAINERS else _dec(x)) for k, x in value.items()}


_KIND_DECODERS = {
    "pydantic": _dec_pydantic,
    "enum": _dec_enum,
    "dataclass": _dec_dataclass,
    "datetime": _dec_temporal("datetime"),
    "date": _dec_temporal("date"),
    "time": _dec_temporal("time"),
    "tuple": _dec_collection("tuple", tuple),
    "set": _dec_collection("set", set),
    "frozenset": _dec_collection("frozenset", frozenset),
    "dict": _dec_dict,
}


def _dec_tagged(d: dict) -> Any:
    kind = d[_KIND]
    fn = _KIND_DECODERS.get(kind) if type(kind) is str else None
    if fn is None:
        raise SerializationError(f"Unknown '$kind' tag: {kind!r}")
    return fn(d)


def decode(tree: Any) -> Any:
    """Inverse of :func:`encode`. Tagged types resolve via the registry only."""
    t = type(tree)
    if t is not dict and t is not list:
        return tree
    try:
        return _dec(tree)
    except RecursionError:
        raise _corrupt(None, "value is nested too deeply") from None


def loads(text: str | bytes) -> Any:
    """Parse JSON text written by :func:`dumps` and :func:`decode` it."""
    if type(text) is str:
        if len(text) <= _FAST_MAX:
            # Short scalars and arrays are converted in the core.
            obj = _loads_plain(text, _MISS)
            if obj is not _MISS:
                return obj
        try:
            obj, end = _scan_once(text, 0)
        except (StopIteration, ValueError, RecursionError):
            obj, end = None, -1
        if end != len(text):
            obj = _parse_slow(text)
    else:
        obj = _parse_slow(text)
    t = type(obj)
    if t is not dict and t is not list:
        return obj
    # A "$kind" key can only appear literally or with \u00XX escapes of its characters.
    if type(text) is str and _KIND not in text and "\\u00" not in text:
        return obj
    try:
        return _dec(obj)
    except RecursionError:
        raise _corrupt(None, "value is nested too deeply") from None


def _parse_slow(text: Any) -> Any:
    import json

    try:
        return json.loads(text)
    except (ValueError, TypeError, RecursionError) as exc:
        raise _corrupt(None, str(exc) or type(exc).__name__) from None
