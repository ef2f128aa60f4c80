"""Stage types, names, compatibility and boundary validators (COMP-1 … COMP-4, COMP-20,
COMP-30 … COMP-32): the pure type machinery in `composeai._stages`."""

# The legacy spellings (Optional, Union, typing.Dict, ...) are what these tests exercise.
# ruff: noqa: UP006, UP007, UP045

import dataclasses
import functools
import typing
from typing import Annotated, Any, Optional, Protocol, Union, runtime_checkable

import pydantic
import pytest
from pydantic import BaseModel, Field

import composeai as compose
from composeai import _stages
from composeai._stages import (
    aggregate_input_type,
    build_validator,
    check_pipe,
    compatible,
    stage_name,
    stage_types,
    type_name,
)
from composeai.errors import ComposeError, CompositionTypeError, ConfigError, StageTypeError

PROTOCOL_HINT = (
    " -- a Protocol boundary must be decorated @runtime_checkable (so it can be validated by"
    " isinstance); add typing.runtime_checkable, or annotate the parameter Any to opt out of"
    " runtime validation"
)


class Facts(BaseModel):
    name: str


class MoreFacts(Facts):
    extra: int = 0


@dataclasses.dataclass
class Point:
    x: int
    y: float = 0.0


@dataclasses.dataclass
class Labelled:
    label: str
    point: Point
    maybe: Optional[Point] = None
    tags: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Node:
    value: int
    next: "Node | None" = None


@dataclasses.dataclass
class Point3(Point):
    z: int = 0


class Animal:
    pass


class Dog(Animal):
    pass


class Plain:
    """No pydantic support at all."""


class Greeter(Protocol):
    def greet(self) -> str: ...


@runtime_checkable
class RuntimeGreeter(Protocol):
    def greet(self) -> str: ...


class Hello:
    def greet(self) -> str:
        return "hello"


class Duck:
    """Quacks like an AgentFunction/Pipeline/Aggregate/Tool."""

    def __init__(self, input_type, output_type, name="duck"):
        self.input_type = input_type
        self.output_type = output_type
        self.name = name

    def __call__(self, x):
        return x


def extract(text: str) -> Facts:
    return Facts(name=text)


def shout(text: str) -> str:
    return text.upper()


def unannotated(x):
    return x


def validator_for(input_type, name="stage"):
    return build_validator(Duck(input_type, Any, name=name))


# --------------------------------------------------------------------------- COMP-1


def test_comp1_plain_function_types_are_first_positional_and_return_annotations():
    def f(x: int, y: str = "", *, z: bytes = b"") -> list[str]:
        return []

    assert stage_types(f) == (int, list[str])
    assert stage_types(extract) == (str, Facts)


def test_comp1_missing_annotations_and_lambdas_are_any():
    assert stage_types(unannotated) == (Any, Any)
    assert stage_types(lambda x: x) == (Any, Any)

    def no_params() -> int:
        return 1

    def keyword_only(*, x: int) -> int:
        return x

    assert stage_types(no_params) == (Any, int)
    assert stage_types(keyword_only) == (Any, int)


def test_comp1_uninspectable_signature_is_any():
    class Opaque:
        __signature__ = "not a signature"

        def __call__(self, x):
            return x

    assert stage_types(Opaque()) == (Any, Any)


def test_comp1_positional_only_and_callable_objects_and_partials():
    def pos_only(x: float, /) -> int:
        return int(x)

    class Callable_:
        def __call__(self, value: Facts) -> str:
            return value.name

    def two(a: str, b: int) -> bytes:
        return b""

    assert stage_types(pos_only) == (float, int)
    assert stage_types(Callable_()) == (Facts, str)
    assert stage_types(functools.partial(two, "a")) == (int, bytes)


def test_comp1_classes_as_stages_take_their_init_parameter():
    assert stage_types(Point) == (int, Any)
    assert stage_types(Facts) == (Any, Any)  # keyword-only fields
    assert stage_types(int) == (Any, Any)


def test_comp1_none_annotation_resolves_to_nonetype():
    def f(x: None) -> None:
        return None

    assert stage_types(f) == (type(None), type(None))


def test_comp1_task_objects_expose_their_functions_types():
    @compose.task
    def summarize(doc: Facts) -> str:
        return doc.name

    @compose.task
    def untyped(x):
        return x

    assert stage_types(summarize) == (Facts, str)
    assert stage_types(untyped) == (Any, Any)


def test_comp1_objects_with_input_and_output_type_are_used_as_is():
    duck = Duck(list[int], dict[str, Any])
    assert stage_types(duck) == (list[int], dict[str, Any])


def test_comp1_agent_function_and_tool_types():
    @compose.agent(model="fake")
    def writer(topic: Facts) -> str:
        return topic.name

    @compose.tool
    def count(text: str) -> int:
        """Counts characters."""
        return len(text)

    assert stage_types(writer) == (Facts, str)
    assert stage_types(count) == (str, int)


def test_comp1_annotations_resolve_like_agent6_and_unresolvable_stay_strings():
    def resolvable(x: "Facts") -> "list[Facts]":
        return [x]

    def unresolvable(x: "Missing") -> "AlsoMissing":  # noqa: F821
        return x

    assert stage_types(resolvable) == (Facts, list[Facts])
    assert stage_types(unresolvable) == ("Missing", "AlsoMissing")


def test_comp1_annotated_is_stripped_like_agent6():
    def f(x: Annotated[int, "meta"]) -> Annotated[str, "meta"]:
        return str(x)

    assert stage_types(f) == (int, str)


# --------------------------------------------------------------------------- COMP-2


def test_comp2_stage_names():
    @compose.task
    def my_task(x):
        return x

    @compose.task(name="renamed")
    def other(x):
        return x

    @compose.tool
    def my_tool(text: str) -> str:
        """Echoes."""
        return text

    @compose.agent(model="fake")
    def my_agent(x: str) -> str:
        return x

    class Nameless:
        def __call__(self, x):
            return x

        def __repr__(self):
            return "<Nameless>"

    class EmptyName(Nameless):
        name = ""

    class NonStrName(Nameless):
        name = 3

    assert stage_name(my_agent) == "my_agent"
    assert stage_name(my_task) == "my_task"
    assert stage_name(other) == "renamed"
    assert stage_name(my_tool) == "my_tool"
    assert stage_name(Duck(Any, Any, name="pipe(a → b)")) == "pipe(a → b)"
    assert stage_name(shout) == "shout"
    assert stage_name(lambda x: x) == "<lambda>"
    assert stage_name(Nameless()) == "<Nameless>"
    assert stage_name(EmptyName()) == "<Nameless>"
    assert stage_name(NonStrName()) == "<Nameless>"
    assert stage_name(functools.partial(shout)).startswith("functools.partial(")


# --------------------------------------------------------------------------- COMP-3


def test_comp3_type_names():
    assert type_name(Any) == "Any"
    assert type_name(Facts) == "Facts"
    assert type_name(int) == "int"
    assert type_name(type(None)) == "NoneType"
    assert type_name(list[str]) == "list[str]"
    assert type_name(dict[str, Any]) == "dict[str, typing.Any]"
    assert type_name(Optional[str]) == "typing.Optional[str]"
    assert type_name(str | None) == "str | None"
    assert type_name("Missing") == "Missing"


def test_comp3_too_few_stages():
    for stages in ([], [shout]):
        with pytest.raises(CompositionTypeError) as info:
            check_pipe(stages)
        assert str(info.value) == f"pipe() requires at least 2 stages, got {len(stages)}"


def test_comp3_mismatch_message_exact():
    with pytest.raises(CompositionTypeError) as info:
        check_pipe([extract, shout])
    assert str(info.value) == (
        "pipe(): stage 1 (extract) returns Facts but stage 2 (shout) expects str"
    )


def test_comp3_positions_are_one_based_and_generic_names_use_str():
    def numbers(x: str) -> list[int]:
        return [1]

    def words(x: list[str]) -> str:
        return ""

    with pytest.raises(CompositionTypeError) as info:
        check_pipe([shout, shout, numbers, words])
    assert str(info.value) == (
        "pipe(): stage 3 (numbers) returns list[int] but stage 4 (words) expects list[str]"
    )
    with pytest.raises(CompositionTypeError) as info:
        check_pipe([Duck(Any, Optional[int], name="maybe"), Duck(int, Any, name="num")])
    assert str(info.value) == (
        "pipe(): stage 1 (maybe) returns typing.Optional[int] but stage 2 (num) expects int"
    )


def test_comp3_compatible_pipes_pass():
    def takes_facts(f: Facts) -> str:
        return f.name

    assert check_pipe([shout, extract, takes_facts]) is None
    assert check_pipe([lambda x: x, shout, unannotated, extract]) is None


def test_comp3_errors_are_type_errors():
    with pytest.raises(TypeError):
        check_pipe([extract, shout])
    assert issubclass(CompositionTypeError, ComposeError)


# --------------------------------------------------------------------------- COMP-4


def test_comp4_rule1_any_and_object():
    assert compatible(Any, int)
    assert compatible(int, Any)
    assert compatible(object, Facts)
    assert compatible(list[int], object)
    assert compatible(Optional[str], Any)


def test_comp4_rule2_equality_is_the_only_rule_for_two_generics():
    assert compatible(list[str], list[str])
    assert compatible(dict[str, int], typing.Dict[str, int])
    assert not compatible(list[str], list[int])
    assert not compatible(list[bool], list[int])
    assert not compatible(dict[str, Any], dict[str, int])
    assert compatible(list[typing.List[int]], typing.List[list[int]])
    assert compatible(typing.Callable[[int], str], typing.Callable[[int], str])
    assert not compatible(typing.Callable[[int], str], typing.Callable[[str], str])
    assert not compatible(typing.Literal[1], typing.Literal[True])
    assert not compatible(list[typing.Literal[1]], list[typing.Literal[True]])


def test_comp4_rule3_bare_class_vs_parameterized_generic_either_direction():
    assert compatible(dict, dict[str, Any])
    assert compatible(dict[str, Any], dict)
    assert compatible(list, list[int])
    assert compatible(list[int], list)
    assert compatible(typing.List, list[int])
    assert compatible(typing.Dict[str, int], dict)
    assert not compatible(list, dict[str, Any])
    assert not compatible(tuple[int, ...], list)


def test_comp4_rule4_union_output_needs_every_member():
    assert not compatible(Optional[str], str)  # None isn't a str
    assert not compatible(str | None, str)
    assert compatible(Union[bool, int], int)
    assert compatible(Dog | Animal, Animal)
    assert not compatible(int | str, int)
    assert compatible(int | str, int | str | bytes)


def test_comp4_rule5_union_input_needs_some_member():
    assert compatible(str, Optional[str])
    assert compatible(str, str | None)
    assert compatible(type(None), Optional[str])
    assert compatible(Dog, Union[int, Animal])
    assert not compatible(bytes, Optional[str])


def test_comp4_rule6_plain_classes_use_issubclass():
    assert compatible(Dog, Animal)
    assert not compatible(Animal, Dog)
    assert compatible(MoreFacts, Facts)
    assert not compatible(Facts, MoreFacts)
    assert compatible(bool, int)
    assert not compatible(int, float)
    assert not compatible(int, str)


def test_comp4_rule6_type_error_counts_as_incompatible():
    class Meta(type):
        def __subclasscheck__(cls, sub):
            raise TypeError("no")

    class Weird(metaclass=Meta):
        pass

    assert not compatible(int, Weird)


def test_comp4_rule7_everything_else_is_incompatible():
    assert not compatible(typing.Literal["a"], str)
    assert not compatible(str, typing.Literal["a"])
    assert not compatible(list[int], tuple)
    assert not compatible(typing.Sequence[str], list[str])


def test_comp4_annotated_compares_as_its_type():
    assert compatible(Annotated[int, "meta"], int)
    assert compatible(str, Annotated[str, Field(min_length=1)])
    assert not compatible(Annotated[str, "meta"], int)


def test_comp4_unresolved_string_annotations_are_compatible():
    assert compatible("Missing", int)
    assert compatible(int, "Missing")
    assert compatible(typing.ForwardRef("Missing"), str)

    def forward(x: "Missing") -> str:  # noqa: F821
        return x

    assert check_pipe([extract, forward, shout]) is None


# --------------------------------------------------------------------------- COMP-20


def test_comp20_aggregate_input_type():
    assert aggregate_input_type([str, str, str]) is str
    assert aggregate_input_type([list[int], list[int]]) == list[int]
    assert aggregate_input_type([str, int]) is Any
    assert aggregate_input_type([Facts, MoreFacts]) is Any
    assert aggregate_input_type([str, Any]) is Any
    assert aggregate_input_type([Facts]) is Facts
    assert aggregate_input_type([]) is Any
    types_of = [stage_types(s)[0] for s in (shout, extract)]
    assert aggregate_input_type(types_of) is str


# --------------------------------------------------------------------------- COMP-30


def test_comp30_any_missing_and_unresolved_skip_validation():
    def forward(x: "Missing") -> str:  # noqa: F821
        return x

    assert build_validator(unannotated) is None
    assert build_validator(lambda x: x) is None
    assert build_validator(forward) is None
    assert validator_for(Any) is None
    assert validator_for(typing.ForwardRef("Missing")) is None
    assert validator_for(list["Missing"]) is None  # noqa: F821


def test_comp30_input_type_argument_overrides_the_stage():
    validate = build_validator(unannotated, int)
    assert validate(3, "pipeline input") == 3
    with pytest.raises(StageTypeError) as info:
        validate("3", "pipeline input")
    assert str(info.value).startswith(
        "pipeline input: stage 'unannotated' expected int but got an incompatible value -- "
    )


def test_comp30_failure_message_embeds_the_pydantic_error_text():
    validate = build_validator(shout)
    with pytest.raises(StageTypeError) as info:
        validate(3, "stage handoff")
    try:
        pydantic.TypeAdapter(str).validate_python(3, strict=True)
    except pydantic.ValidationError as exc:
        pydantic_text = str(exc)
    assert str(info.value) == (
        "stage handoff: stage 'shout' expected str but got an incompatible value -- "
        + pydantic_text
    )
    assert isinstance(info.value, TypeError)
    assert info.value.__cause__ is None


def test_comp30_boundaries_and_generic_type_names_in_messages():
    validate = validator_for(list[int], name="nums")
    assert validate([1, 2], "map item 0") == [1, 2]
    with pytest.raises(StageTypeError) as info:
        validate([1, "2"], "aggregate branch 'nums'")
    message = str(info.value)
    assert message.startswith(
        "aggregate branch 'nums': stage 'nums' expected list[int] but got an incompatible value"
        " -- 1 validation error for list[int]\n"
    )
    assert "[type=int_type, input_value='2', input_type=str]" in message


def test_comp30_task_stages_validate_against_their_functions_annotation():
    @compose.task
    def double(x: int) -> int:
        return 2 * x

    validate = build_validator(double)
    assert validate(2, "pipeline input") == 2
    with pytest.raises(StageTypeError) as info:
        validate("2", "pipeline input")
    assert "stage 'double' expected int" in str(info.value)


def test_comp30_a_type_pydantic_cannot_schema_validates_by_isinstance():
    with pytest.raises(pydantic.PydanticSchemaGenerationError):
        pydantic.TypeAdapter(Plain)
    validate = validator_for(Plain, name="plain")
    obj = Plain()
    assert validate(obj, "pipeline input") is obj
    with pytest.raises(StageTypeError) as info:
        validate({"not": "plain"}, "pipeline input")
    assert str(info.value).startswith(
        "pipeline input: stage 'plain' expected Plain but got an incompatible value -- "
    )
    assert "Input should be an instance of Plain" in str(info.value)


def test_comp30_unschemable_types_nested_in_generics_use_isinstance_too():
    validate = validator_for(list[Plain])
    items = [Plain(), Plain()]
    result = validate(items, "pipeline input")
    assert [a is b for a, b in zip(result, items)] == [True, True]
    with pytest.raises(StageTypeError):
        validate([Plain(), 1], "pipeline input")


def test_comp30_annotated_constraints_apply():
    validate = validator_for(Annotated[int, Field(gt=0)], name="positive")
    assert validate(1, "pipeline input") == 1
    with pytest.raises(StageTypeError) as info:
        validate(0, "pipeline input")
    assert "greater than 0" in str(info.value)


def test_comp30_unions_and_optional():
    validate = validator_for(Optional[int])
    assert validate(None, "b") is None
    assert validate(4, "b") == 4
    with pytest.raises(StageTypeError):
        validate("4", "b")


# --------------------------------------------------------------------------- COMP-31


def test_comp31_non_runtime_checkable_protocol_is_a_config_error_with_the_hint():
    def greet(g: Greeter) -> str:
        return g.greet()

    with pytest.raises(ConfigError) as info:
        build_validator(greet)
    try:
        isinstance(Hello(), Greeter)
    except TypeError as exc:
        isinstance_error = str(exc)
    assert str(info.value) == (
        "stage 'greet' declares input type Greeter, which composeai cannot build a runtime "
        f"validator for: {isinstance_error}{PROTOCOL_HINT}"
    )


def test_comp31_runtime_checkable_protocol_validates_by_isinstance():
    def greet(g: RuntimeGreeter) -> str:
        return g.greet()

    validate = build_validator(greet)
    hello = Hello()
    assert validate(hello, "pipeline input") is hello
    with pytest.raises(StageTypeError) as info:
        validate(Plain(), "pipeline input")
    assert str(info.value).startswith(
        "pipeline input: stage 'greet' expected RuntimeGreeter but got an incompatible value -- "
    )


def test_comp31_other_unbuildable_types_have_no_hint():
    class Unbuildable:
        @classmethod
        def __get_pydantic_core_schema__(cls, source, handler):
            raise pydantic.PydanticSchemaGenerationError("no schema for this one")

    class Meta(type):
        def __instancecheck__(cls, obj):
            raise TypeError("no isinstance either")

    class Hopeless(Unbuildable, metaclass=Meta):
        pass

    with pytest.raises(ConfigError) as info:
        validator_for(Hopeless, name="hopeless")
    assert str(info.value) == (
        "stage 'hopeless' declares input type Hopeless, which composeai cannot build a runtime "
        "validator for: no schema for this one"
    )

    with pytest.raises(ConfigError) as info:
        validator_for(list[Greeter], name="many")
    message = str(info.value)
    assert message.startswith(
        "stage 'many' declares input type list[test_stage_types.Greeter], which composeai "
        "cannot build a runtime validator for: "
    )
    assert "runtime_checkable" not in message


# --------------------------------------------------------------------------- COMP-32


def test_comp32_dict_instantiates_a_pydantic_model():
    validate = validator_for(Facts)
    result = validate({"name": "x"}, "pipeline input")
    assert type(result) is Facts and result.name == "x"
    with pytest.raises(StageTypeError):
        validate({"name": 1}, "pipeline input")  # fields are strict too
    with pytest.raises(StageTypeError):
        validate({}, "pipeline input")


def test_comp32_dict_instantiates_a_dataclass():
    validate = validator_for(Point, name="point")
    result = validate({"x": 1}, "pipeline input")
    assert result == Point(x=1, y=0.0) and type(result) is Point
    assert validate({"x": 1, "y": 2}, "pipeline input") == Point(x=1, y=2.0)
    assert validate({"x": 1, "unknown": "ignored"}, "pipeline input") == Point(x=1)


def test_comp32_dataclass_from_dict_is_strict_and_recursive():
    validate = validator_for(Labelled, name="labelled")
    result = validate(
        {"label": "a", "point": {"x": 1}, "maybe": {"x": 2, "y": 3}}, "pipeline input"
    )
    assert result == Labelled(label="a", point=Point(x=1), maybe=Point(x=2, y=3.0))
    point = Point(x=5)
    assert validate({"label": "b", "point": point}, "pipeline input").point is point

    with pytest.raises(StageTypeError) as info:
        validate({"label": 1, "point": {"x": "1"}}, "stage handoff")
    message = str(info.value)
    assert message.startswith(
        "stage handoff: stage 'labelled' expected Labelled but got an incompatible value -- "
        "2 validation errors for Labelled\n"
    )
    assert "label\n  Input should be a valid string" in message
    assert "point.x\n  Input should be a valid integer" in message

    with pytest.raises(StageTypeError) as info:
        validate({"label": "a"}, "stage handoff")
    assert "point\n  Field required [type=missing" in str(info.value)

    with pytest.raises(StageTypeError) as info:
        validate({"label": "a", "point": {"x": 1}, "maybe": {"x": 1.5}}, "stage handoff")
    assert "maybe.x\n  Input should be a valid integer" in str(info.value)


def test_comp32_recursive_dataclass_from_nested_dicts():
    validate = validator_for(Node)
    assert validate({"value": 1, "next": {"value": 2}}, "b") == Node(1, Node(2))
    with pytest.raises(StageTypeError) as info:
        validate({"value": 1, "next": {"value": "2"}}, "b")
    assert "next.value\n  Input should be a valid integer" in str(info.value)


def test_comp32_pydantic_dataclass_from_dict():
    @pydantic.dataclasses.dataclass
    class Row:
        id: int

    validate = validator_for(Row)
    assert validate({"id": 1}, "b") == Row(id=1)
    with pytest.raises(StageTypeError):
        validate({"id": "1"}, "b")


def test_comp32_instances_and_subclass_instances_pass_as_the_same_object():
    facts, more = Facts(name="a"), MoreFacts(name="b", extra=1)
    validate = validator_for(Facts)
    assert validate(facts, "b") is facts
    assert validate(more, "b") is more

    point, point3 = Point(x=1), Point3(x=1, z=2)
    validate = validator_for(Point)
    assert validate(point, "b") is point
    assert validate(point3, "b") is point3

    dog = Dog()
    assert validator_for(Animal)(dog, "b") is dog

    for cls, value in [
        (list, [1, 2]),
        (dict, {"a": 1}),
        (set, {1}),
        (str, "text"),
        (int, 7),
        (dict, typing.OrderedDict(a=1)),
    ]:
        validate = validator_for(cls)
        assert validate(value, "b") is value, cls


def test_comp32_int_widens_to_float():
    validate = validator_for(float)
    result = validate(3, "b")
    assert result == 3.0 and type(result) is float
    assert validate(2.5, "b") == 2.5


@pytest.mark.parametrize(
    ("declared", "value"),
    [
        (int, "3"),  # str -> int
        (int, 3.0),  # float -> int
        (int, True),  # bool -> int
        (float, True),  # bool -> float
        (bool, 1),  # int -> bool
        (str, 3),
        (Facts, Facts),
        (Point, [1]),
    ],
)
def test_comp32_strict_rejections(declared, value):
    validate = validator_for(declared, name="s")
    with pytest.raises(StageTypeError) as info:
        validate(value, "pipeline input")
    assert str(info.value).startswith(
        f"pipeline input: stage 's' expected {type_name(declared)} but got an incompatible value"
        " -- "
    )


def test_comp32_any_and_unannotated_are_untouched():
    assert validator_for(Any) is None
    assert build_validator(unannotated) is None
    assert build_validator(lambda x: x) is None


# --------------------------------------------------------------------------- construction


def test_validators_are_built_eagerly_and_adapters_are_cached():
    class Fresh(BaseModel):
        n: int

    validate = validator_for(Fresh)
    assert (Fresh, False) in _stages._ADAPTERS
    cached = _stages._ADAPTERS[(Fresh, False)]
    validator_for(Fresh)
    assert _stages._ADAPTERS[(Fresh, False)] is cached
    assert validate({"n": 1}, "b") == Fresh(n=1)


def test_unhashable_types_are_validated_without_caching():
    class Unhashable:
        __hash__ = None

        def __eq__(self, other):
            return self is other

    unhashable_meta = Annotated[int, Unhashable()]
    with pytest.raises(TypeError):
        hash(unhashable_meta)
    validate = validator_for(unhashable_meta)
    assert validate(1, "b") == 1
    with pytest.raises(StageTypeError):
        validate("1", "b")


def test_pydantic_is_imported_lazily():
    assert not any(
        name == "pydantic" or getattr(value, "__module__", "").startswith("pydantic")
        for name, value in vars(_stages).items()
    )
