"""Tests of the value encoder/decoder (OBS-60 .. OBS-63, FLOW-5, OBS-4 lenient payloads)."""

from __future__ import annotations

import datetime as dt
import enum
import json
import math
import subprocess
import sys
import textwrap
import types
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Annotated, NamedTuple

import pytest
from pydantic import BaseModel

from composeai import _codec
from composeai._codec import (
    decode,
    dumps,
    dumps_lenient,
    encode,
    loads,
    register_annotation_types,
    register_module_types,
    register_serializable,
    tag_of,
)
from composeai.errors import SerializationError

# --------------------------------------------------------------------------- test types


class Color(enum.Enum):
    RED = "r"
    GREEN = "g"


class StopReason(str, enum.Enum):
    END_TURN = "end_turn"
    MAX_TOKENS = "max_tokens"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Perm(enum.Flag):
    READ = 1
    WRITE = 2
    EXEC = 4


class Point(BaseModel):
    x: int
    y: int


class Shape(BaseModel):
    name: str
    points: list[Point]
    color: Color
    created: dt.datetime | None = None


@dataclass
class Box:
    label: str
    size: tuple[int, int]
    inner: Point | None = None
    tags: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Frozen:
    a: int


@dataclass
class WithInitFalse:
    a: int
    b: int = field(init=False, default=0)


class Pair(NamedTuple):
    left: int
    right: int


class Leaf(BaseModel):
    v: int


@dataclass
class Node:
    level: Level
    leaves: list[Leaf]


class Holder(BaseModel):
    nodes: list[Node] | None = None
    by_name: dict[str, Perm] = {}


class AnnotatedOnly(BaseModel):
    z: int


@pytest.fixture
def fresh_registry(monkeypatch):
    """An empty registry, as in a fresh process that has not imported anything yet."""
    monkeypatch.setattr(_codec, "_REGISTRY", {})
    return _codec


def round_trip(value):
    text = dumps(value)
    json.loads(text)  # always valid JSON
    return loads(text)


# --------------------------------------------------------------------------- OBS-60 forms


@pytest.mark.parametrize("value", [None, True, False, 0, -7, 2**70, 1.5, "", "héllo ✓"])
def test_obs60_scalars_stored_as_is(value):
    assert encode(value) is value
    assert dumps(value) == json.dumps(value, ensure_ascii=False)
    out = round_trip(value)
    assert out == value and type(out) is type(value)


def test_obs60_non_finite_floats_allowed():
    assert dumps(float("nan")) == "NaN"
    assert dumps([float("inf"), float("-inf")]) == "[Infinity,-Infinity]"
    assert math.isnan(round_trip(float("nan")))
    assert round_trip({"a": float("inf")}) == {"a": float("inf")}


def test_obs60_plain_list_and_dict_untagged():
    value = {"args": [1, "x", None, [True, {"k": 2.5}]], "kwargs": {}}
    assert encode(value) == value
    assert dumps(value) == '{"args":[1,"x",null,[true,{"k":2.5}]],"kwargs":{}}'
    assert round_trip(value) == value


def test_obs60_str_enum_stored_as_plain_string():
    assert encode(StopReason.END_TURN) == "end_turn"
    assert type(encode(StopReason.END_TURN)) is str
    assert dumps({"stop": StopReason.MAX_TOKENS}) == '{"stop":"max_tokens"}'
    out = round_trip([StopReason.END_TURN])
    assert out == ["end_turn"] and type(out[0]) is str


def test_obs60_str_enum_dict_key_becomes_plain_string():
    assert dumps({StopReason.END_TURN: 1}) == '{"end_turn":1}'


def test_obs60_enum_round_trip():
    tree = encode(Color.GREEN)
    assert tree == {"$kind": "enum", "$type": tag_of(Color), "value": "GREEN"}
    assert round_trip(Color.GREEN) is Color.GREEN


def test_obs60_int_enum_is_tagged_not_plain():
    assert encode(Level.HIGH) == {"$kind": "enum", "$type": tag_of(Level), "value": "HIGH"}
    assert round_trip([Level.LOW]) == [Level.LOW]
    assert type(round_trip(Level.LOW)) is Level


def test_obs60_flag_composite_round_trip():
    value = Perm.READ | Perm.EXEC
    assert round_trip(value) == value
    assert round_trip(Perm(0)) == Perm(0)
    assert round_trip(Perm.WRITE) is Perm.WRITE


def test_obs60_pydantic_round_trip():
    p = Point(x=1, y=2)
    assert encode(p) == {"$kind": "pydantic", "$type": tag_of(Point), "value": {"x": 1, "y": 2}}
    assert tag_of(Point) == f"{Point.__module__}:Point"
    out = round_trip(p)
    assert type(out) is Point and out == p


def test_obs60_pydantic_nested_model_round_trip():
    s = Shape(
        name="tri",
        points=[Point(x=0, y=0), Point(x=1, y=1)],
        color=Color.RED,
        created=dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc),
    )
    out = round_trip({"shape": s, "n": 1})
    assert out == {"shape": s, "n": 1}
    assert type(out["shape"].points[0]) is Point


def test_obs60_dataclass_round_trip():
    b = Box(label="b", size=(2, 3), inner=Point(x=1, y=1), tags=["t"])
    tree = encode(b)
    assert tree["$kind"] == "dataclass" and tree["$type"] == tag_of(Box)
    assert tree["value"]["size"] == {"$kind": "tuple", "value": [2, 3]}
    out = round_trip(b)
    assert out == b and type(out.size) is tuple and type(out.inner) is Point
    assert round_trip(Frozen(a=3)) == Frozen(a=3)


def test_obs60_datetime_date_time_with_tz_round_trip():
    tz = dt.timezone(dt.timedelta(hours=5, minutes=30))
    values = [
        dt.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=tz),
        dt.datetime(2024, 1, 2, 3, 4, 5),
        dt.date(2024, 2, 29),
        dt.time(23, 59, 1, 5, tzinfo=dt.timezone.utc),
        dt.time(1, 2),
    ]
    assert encode(values[0]) == {"$kind": "datetime", "value": values[0].isoformat()}
    assert encode(values[2]) == {"$kind": "date", "value": "2024-02-29"}
    assert encode(values[3]) == {"$kind": "time", "value": "23:59:01.000005+00:00"}
    out = round_trip(values)
    assert out == values
    assert [type(v) for v in out] == [type(v) for v in values]
    assert out[0].utcoffset() == dt.timedelta(hours=5, minutes=30)
    assert out[3].tzinfo is not None


def test_obs60_tuple_set_frozenset_round_trip():
    assert encode((1, "a")) == {"$kind": "tuple", "value": [1, "a"]}
    assert encode({3, 1, 2}) == {"$kind": "set", "value": [1, 2, 3]}  # sorted: deterministic
    assert encode(frozenset({"b", "a"})) == {"$kind": "frozenset", "value": ["a", "b"]}
    value = [(1, (2, 3)), {(1, 2), (3, 4)}, frozenset({1}), set(), ()]
    out = round_trip(value)
    assert out == value
    assert [type(v) for v in out] == [tuple, set, frozenset, set, tuple]


def test_obs60_unorderable_set_still_encodes():
    out = round_trip({1, "a", None})
    assert out == {1, "a", None}


def test_obs60_dict_containing_kind_is_wrapped():
    value = {"$kind": "pydantic", "$type": "os:system", "value": 1}
    tree = encode(value)
    assert tree == {"$kind": "dict", "value": value}
    assert round_trip(value) == value
    nested = {"outer": [{"$kind": 5, "t": (1,)}]}
    assert round_trip(nested) == nested


def test_obs60_nested_everything_round_trip():
    value = {
        "models": [Point(x=1, y=2), Shape(name="s", points=[], color=Color.GREEN)],
        "dc": Box(label="x", size=(1, 1)),
        "when": dt.date(2020, 1, 1),
        "sets": {"s": {1, 2}, "f": frozenset({(1, 2)})},
        "enum": [Color.RED, StopReason.END_TURN, Level.HIGH],
        "tagged": {"$kind": "tuple", "value": "not a tag"},
        "ü": "ß",
    }
    out = round_trip(value)
    assert out == {**value, "enum": [Color.RED, "end_turn", Level.HIGH]}


def test_obs60_list_and_dict_subclasses_encode_as_plain():
    value = OrderedDict([("b", 1), ("a", [2])])
    assert dumps(value) == '{"b":1,"a":[2]}'
    assert round_trip(value) == {"b": 1, "a": [2]}


def test_obs60_non_ascii_written_literally_and_lone_surrogate_escaped():
    assert dumps({"k": "é✓"}) == '{"k":"é✓"}'
    text = dumps(["\ud800x"])
    text.encode("utf-8")  # always UTF-8 encodable
    assert loads(text) == ["\ud800x"]
    assert loads(dumps("\udfff")) == "\udfff"


# --------------------------------------------------------------------------- OBS-60 errors


def test_obs60_error_unencodable_object_at_root():
    with pytest.raises(SerializationError) as ei:
        dumps(object())
    assert str(ei.value) == "<root>: <class 'object'> is not JSON-serializable"
    with pytest.raises(SerializationError) as ei:
        encode(object())
    assert str(ei.value) == "<root>: <class 'object'> is not JSON-serializable"


def test_obs60_error_path_names_nested_location():
    with pytest.raises(SerializationError) as ei:
        dumps({"a": {"b": [1, 2, object()]}})
    assert str(ei.value) == "a.b[2]: <class 'object'> is not JSON-serializable"
    with pytest.raises(SerializationError) as ei:
        dumps([1, [0, {"x": (1, b"raw")}]])
    assert str(ei.value) == "[1][1].x[1]: <class 'bytes'> is not JSON-serializable"


def test_obs60_error_path_with_custom_root():
    with pytest.raises(SerializationError) as ei:
        dumps({"args": [object()]}, path="input")
    assert str(ei.value) == "input.args[0]: <class 'object'> is not JSON-serializable"
    with pytest.raises(SerializationError) as ei:
        encode(1j, path="output")
    assert str(ei.value) == "output: <class 'complex'> is not JSON-serializable"


def test_obs60_error_path_through_dataclass_field():
    with pytest.raises(SerializationError) as ei:
        dumps({"box": Box(label="x", size=(1, object()))})
    assert str(ei.value) == "box.size[1]: <class 'object'> is not JSON-serializable"


def test_obs60_error_dict_keys_must_be_str():
    with pytest.raises(SerializationError) as ei:
        dumps({1: "a"})
    assert str(ei.value) == "<root>: dict keys must be str, got 1"
    with pytest.raises(SerializationError) as ei:
        dumps({"a": {"b": {(1, 2): 0}}})
    assert str(ei.value) == "a.b: dict keys must be str, got (1, 2)"
    with pytest.raises(SerializationError) as ei:
        encode([{None: 1}])
    assert str(ei.value) == "[0]: dict keys must be str, got None"


def test_obs60_namedtuple_refused():
    with pytest.raises(SerializationError) as ei:
        dumps({"p": Pair(1, 2)})
    assert str(ei.value) == f"p: {Pair!r} is not JSON-serializable"


def test_obs60_dataclass_with_init_false_field_refused():
    with pytest.raises(SerializationError) as ei:
        dumps([WithInitFalse(a=1)])
    assert str(ei.value) == (
        f"[0]: dataclass {WithInitFalse!r} field 'b' has init=False, so it cannot be decoded"
    )


def test_obs60_dataclass_class_object_is_not_an_instance():
    with pytest.raises(SerializationError) as ei:
        dumps(Box)
    assert str(ei.value) == "<root>: <class 'type'> is not JSON-serializable"


def test_obs60_reference_cycle_is_an_error():
    cyc: list = []
    cyc.append(cyc)
    with pytest.raises(SerializationError, match="reference cycle"):
        dumps(cyc)


# --------------------------------------------------------------------------- OBS-61 decoding


def _unregistered_message(tag: str) -> str:
    module = tag.split(":")[0]
    return (
        f"Cannot decode unregistered type '{tag}': import the module that defines it "
        f"(e.g. `import {module}`) or call register_serializable(...) before decoding this "
        "data. Types are never imported automatically, by design (security)."
    )


@pytest.mark.parametrize("kind", ["pydantic", "dataclass", "enum"])
@pytest.mark.parametrize("tag", ["os:system", "subprocess:Popen", "no_such_mod.sub:Thing.Inner"])
def test_obs61_unregistered_type_exact_message(kind, tag):
    text = json.dumps({"$kind": kind, "$type": tag, "value": {}})
    with pytest.raises(SerializationError) as ei:
        loads(text)
    assert str(ei.value) == _unregistered_message(tag)
    with pytest.raises(SerializationError) as ei:
        decode([{"ok": 1}, json.loads(text)])
    assert str(ei.value) == _unregistered_message(tag)


def test_obs61_decoding_never_imports(tmp_path, monkeypatch):
    mod_name = f"codec_probe_{uuid.uuid4().hex}"
    marker = tmp_path / "imported.txt"
    (tmp_path / f"{mod_name}.py").write_text(
        textwrap.dedent(
            f"""
            import pathlib
            pathlib.Path({str(marker)!r}).write_text("imported")

            from pydantic import BaseModel

            class Thing(BaseModel):
                a: int = 0
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    subprocess_loaded = "subprocess" in sys.modules
    trees = [
        {"$kind": "pydantic", "$type": f"{mod_name}:Thing", "value": {"a": 1}},
        {"$kind": "dataclass", "$type": f"{mod_name}:Thing", "value": {}},
        {"$kind": "enum", "$type": f"{mod_name}:Thing", "value": "A"},
        {"$kind": "pydantic", "$type": "os:system", "value": "echo pwned"},
        {"$kind": "pydantic", "$type": "subprocess:Popen", "value": ["true"]},
    ]
    for tree in trees:
        with pytest.raises(SerializationError, match="unregistered type"):
            loads(json.dumps({"x": [tree]}))
        with pytest.raises(SerializationError, match="unregistered type"):
            decode(tree)
    assert not marker.exists()
    assert mod_name not in sys.modules
    assert ("subprocess" in sys.modules) == subprocess_loaded
    # Control: the probe really does have an import side effect.
    __import__(mod_name)
    assert marker.exists()
    del sys.modules[mod_name]


@pytest.mark.parametrize(
    ("tree", "shown"),
    [
        ({"$kind": "bogus", "value": 1}, "'bogus'"),
        ({"$kind": 5}, "5"),
        ({"$kind": None, "value": []}, "None"),
        ({"$kind": ["list"]}, "['list']"),
    ],
)
def test_obs61_unknown_kind_message(tree, shown):
    with pytest.raises(SerializationError) as ei:
        decode(tree)
    assert str(ei.value) == f"Unknown '$kind' tag: {shown}"
    with pytest.raises(SerializationError) as ei:
        loads(json.dumps([tree]))
    assert str(ei.value) == f"Unknown '$kind' tag: {shown}"


@pytest.mark.parametrize(
    ("tree", "kind"),
    [
        ({"$kind": "tuple", "value": 5}, "tuple"),
        ({"$kind": "tuple"}, "tuple"),
        ({"$kind": "set", "value": [[1]]}, "set"),
        ({"$kind": "frozenset", "value": {"a": 1}}, "frozenset"),
        ({"$kind": "dict", "value": [1]}, "dict"),
        ({"$kind": "datetime", "value": "not a date"}, "datetime"),
        ({"$kind": "date", "value": 20240101}, "date"),
        ({"$kind": "time", "value": "25:99"}, "time"),
        ({"$kind": "enum", "value": "RED"}, "enum"),
        ({"$kind": "pydantic", "$type": 3, "value": {}}, "pydantic"),
        ({"$kind": "dataclass", "$type": None, "value": {}}, "dataclass"),
    ],
)
def test_obs61_malformed_tagged_value_is_corrupted_row(tree, kind):
    with pytest.raises(SerializationError) as ei:
        decode(tree)
    assert str(ei.value).startswith(f"corrupted journal/state row (kind={kind!r}): ")


def test_obs61_malformed_registered_values_are_corrupted_rows():
    register_serializable(Color)
    register_serializable(Point)
    register_serializable(Box)
    cases = [
        ({"$kind": "enum", "$type": tag_of(Color), "value": "PURPLE"}, "enum"),
        ({"$kind": "enum", "$type": tag_of(Color), "value": 1}, "enum"),
        ({"$kind": "pydantic", "$type": tag_of(Point), "value": {"x": "nope"}}, "pydantic"),
        ({"$kind": "pydantic", "$type": tag_of(Point)}, "pydantic"),
        ({"$kind": "dataclass", "$type": tag_of(Box), "value": {"zzz": 1}}, "dataclass"),
        ({"$kind": "dataclass", "$type": tag_of(Box), "value": [1]}, "dataclass"),
        ({"$kind": "pydantic", "$type": tag_of(Color), "value": {}}, "pydantic"),  # wrong kind
        ({"$kind": "enum", "$type": tag_of(Point), "value": "x"}, "enum"),
    ]
    for tree, kind in cases:
        with pytest.raises(SerializationError) as ei:
            decode(tree)
        assert str(ei.value).startswith(f"corrupted journal/state row (kind={kind!r}): "), tree


@pytest.mark.parametrize("text", ["", "{", "[1,]", "123abc", "nul", '{"a":1} x'])
def test_obs61_invalid_json_text_is_corrupted_row(text):
    with pytest.raises(SerializationError) as ei:
        loads(text)
    assert str(ei.value).startswith("corrupted journal/state row (kind=None): ")


def test_obs61_loads_accepts_surrounding_whitespace_and_escaped_tags():
    assert loads("  [1, 2]\n") == [1, 2]
    # An escaped "$kind" key is still a tag (the fast path must not skip it).
    assert loads('{"\\u0024kind": "tuple", "value": [1]}') == (1,)


def test_obs61_encoding_registers_the_class(fresh_registry):
    text = dumps([Point(x=1, y=2), Color.RED, Frozen(a=1)])
    assert set(fresh_registry._REGISTRY) == {tag_of(Point), tag_of(Color), tag_of(Frozen)}
    assert loads(text) == [Point(x=1, y=2), Color.RED, Frozen(a=1)]


def test_obs61_fresh_process_needs_registration(fresh_registry):
    text = dumps(Point(x=3, y=4))
    fresh_registry._REGISTRY.clear()  # as if read back by another process
    with pytest.raises(SerializationError, match="unregistered type"):
        loads(text)
    register_serializable(Point)
    assert loads(text) == Point(x=3, y=4)


# --------------------------------------------------------------------------- OBS-62 / OBS-63


def test_obs62_register_serializable_is_a_decorator(fresh_registry):
    @register_serializable
    class Local(enum.Enum):
        A = 1

    assert Local.__name__ == "Local"
    tag = f"{__name__}:test_obs62_register_serializable_is_a_decorator.<locals>.Local"
    assert tag_of(Local) == tag
    assert fresh_registry._REGISTRY[tag] is Local
    assert decode({"$kind": "enum", "$type": tag, "value": "A"}) is Local.A


def test_obs62_register_module_types_scans_module(fresh_registry):
    other = types.ModuleType("codec_fake_models")
    other.Point = Point
    app = types.ModuleType("codec_fake_app")
    app.Point = Point  # re-exported: registers under its defining module
    app.Holder = Holder  # fields: list[Node] | None, dict[str, Perm]; Node -> Level, Leaf
    app.BaseModel = BaseModel
    app.enum = enum
    app.json = json
    app.helper = lambda: None
    app.number = 3
    register_module_types(app)
    reg = fresh_registry._REGISTRY
    assert reg[tag_of(Point)] is Point
    assert tag_of(Point) == f"{__name__}:Point"
    assert "codec_fake_app:Point" not in reg
    for cls in (Holder, Node, Leaf, Level, Perm):
        assert reg[tag_of(cls)] is cls
    assert tag_of(BaseModel) not in reg
    value = Holder(nodes=[Node(level=Level.HIGH, leaves=[Leaf(v=1)])], by_name={"p": Perm.READ})
    text = dumps(Node(level=Level.LOW, leaves=[Leaf(v=2)]))
    reg.clear()
    register_module_types(app)
    assert loads(dumps(value)) == value
    assert loads(text) == Node(level=Level.LOW, leaves=[Leaf(v=2)])


def test_obs62_register_module_types_imports_nothing(fresh_registry):
    class LazyModule(types.ModuleType):
        def __getattr__(self, name):  # a PEP 562 lazy module would import here
            raise AssertionError(f"probed {name}")

    app = types.ModuleType("codec_fake_app2")
    app.lazy = LazyModule("lazy")
    app.Color = Color
    before = set(sys.modules)
    register_module_types(app)
    assert set(sys.modules) == before
    assert fresh_registry._REGISTRY == {tag_of(Color): Color}


def test_flow5_register_annotation_types_generic_params(fresh_registry):
    def step(
        items: list[Point] | None,
        opts: dict[str, Color] | None = None,
        extra: Annotated[AnnotatedOnly, "meta"] | None = None,
    ) -> tuple[Box, ...]:
        return ()

    register_annotation_types(step)
    reg = fresh_registry._REGISTRY
    for cls in (Point, Color, AnnotatedOnly, Box):
        assert reg[tag_of(cls)] is cls


def test_flow5_register_annotation_types_recurses_into_fields(fresh_registry):
    def step(h: Holder) -> None:
        return None

    register_annotation_types(step)
    for cls in (Holder, Node, Leaf, Level, Perm):
        assert fresh_registry._REGISTRY[tag_of(cls)] is cls


def test_flow5_register_annotation_types_never_raises_on_unresolvable(fresh_registry):
    def step(a: NoSuchType, b: list[Point]) -> Missing:  # noqa: F821
        return None

    register_annotation_types(step)  # string annotations (PEP 563), one unresolvable
    assert fresh_registry._REGISTRY == {tag_of(Point): Point}
    register_annotation_types(lambda x: x)
    register_annotation_types(print)
    register_annotation_types(42)


def test_flow5_register_annotation_types_plain_annotations(fresh_registry):
    def step(a: str, b: int, c: float = 1.0) -> None:
        return None

    register_annotation_types(step)
    assert fresh_registry._REGISTRY == {}


# --------------------------------------------------------------------------- OBS-4 lenient


def test_obs4_dumps_lenient_repr_fallback():
    obj = object()
    text = dumps_lenient({"a": obj, "b": [1, (2, Pair(1, 2))], 3: "x"})
    assert json.loads(text) == {
        "a": repr(obj),
        "b": [1, {"$kind": "tuple", "value": [2, repr(Pair(1, 2))]}],
        "3": "x",
    }


def test_obs4_dumps_lenient_matches_dumps_when_encodable():
    value = {"p": Point(x=1, y=2), "t": (1, 2), "$kind": "x"}
    assert dumps_lenient(value) == dumps(value)
    assert dumps_lenient("é") == dumps("é")
    assert dumps_lenient(WithInitFalse(a=1)) == json.dumps(repr(WithInitFalse(a=1)))


def test_obs4_dumps_lenient_never_raises():
    class BadRepr:
        def __repr__(self):
            raise RuntimeError("boom")

    cyc: list = []
    cyc.append(cyc)
    assert json.loads(dumps_lenient(cyc)) == "[[...]]"
    assert "unrepresentable" in dumps_lenient([BadRepr()])
    assert isinstance(dumps_lenient(BadRepr()), str)


# --------------------------------------------------------------------------- import cost


def test_codec_import_is_cheap():
    code = textwrap.dedent(
        """
        import sys, types
        pkg = types.ModuleType("composeai")
        pkg.__path__ = [sys.argv[1]]
        sys.modules["composeai"] = pkg
        import composeai._codec as c
        c.loads(c.dumps({"a": (1, {2})}))
        heavy = [m for m in ("pydantic", "typing", "dataclasses", "inspect", "datetime")
                 if m in sys.modules]
        print(heavy)
        """
    )
    pkg_dir = str(__import__("pathlib").Path(_codec.__file__).parent)
    out = subprocess.run(
        [sys.executable, "-c", code, pkg_dir], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
