"""`@tool`, `Tool`, `seal_schema`, `BeforeTool`, `ToolInterceptor`, `ApprovalReply`
(AGENT-30 … AGENT-35, AGENT-43, AGENT-46)."""

import asyncio
import enum
import json
from typing import Annotated, Any

import pydantic
import pytest
from pydantic import BaseModel, Field

from composeai import _codec
from composeai.errors import ConfigError
from composeai.messages import ToolCallPart, ToolResultPart
from composeai.models.base import ToolSpec
from composeai.tools import Tool, seal_schema, tool

# --------------------------------------------------------------------------- AGENT-30


def test_bare_decorator_returns_directly_callable_tool():
    @tool
    def add(a: int, b: int = 1) -> int:
        """Add two numbers."""
        return a + b

    assert isinstance(add, Tool)
    assert add(2, 3) == 5
    assert add(2) == 3
    # direct calls skip validation
    assert add("x", "y") == "xy"
    assert add.name == "add"
    assert add.__name__ == "add"
    assert add.__doc__ == "Add two numbers."
    assert add.fn(1, 1) == 2
    assert add.timeout is None
    assert add.is_async is False
    assert repr(add) == "<Tool 'add'>"


def test_decorator_with_options():
    @tool(name="renamed", description="Explicit.", requires_approval=True, timeout=2.5)
    def original(x: str) -> str:
        """Docstring text."""
        return x

    assert original.name == "renamed"
    assert original.__name__ == "renamed"
    assert original.timeout == 2.5
    assert original.spec == ToolSpec(
        name="renamed",
        description="Explicit.",
        input_schema={
            "properties": {"x": {"type": "string"}},
            "required": ["x"],
            "type": "object",
            "additionalProperties": False,
        },
        strict=True,
        requires_approval=True,
    )
    assert original.param_model.__name__ == "RenamedParams"


def test_async_body_is_detected():
    @tool
    async def fetch(url: str) -> str:
        """Fetch a URL."""
        return url.upper()

    assert fetch.is_async is True
    assert asyncio.run(fetch("a")) == "A"


# --------------------------------------------------------------------------- AGENT-31


def test_docstring_without_args_section_is_the_whole_description():
    @tool
    def f(x: int) -> int:
        """
        First line.

        Second paragraph.
        """
        return x

    assert f.spec.description == "First line.\n\nSecond paragraph."
    assert "description" not in f.input_schema["properties"]["x"]


def test_docstring_args_section_multiline_and_returns_terminator():
    @tool
    def search(query: str, limit: int = 5) -> list:
        """Search the index.

        More detail here.

        Args:
            query: The text to
                look for, verbatim.

            limit: Maximum number
              of hits.
        Returns:
            indented: not an argument
        """
        return []

    assert search.spec.description == "Search the index.\n\nMore detail here."
    props = search.input_schema["properties"]
    assert props["query"]["description"] == "The text to look for, verbatim."
    assert props["limit"]["description"] == "Maximum number of hits."


def test_docstring_indentation_rules():
    @tool
    def f(a: int, b: int, c: int = 0) -> int:
        """Do things.
        Args:
            a: alpha
                note: deeper lines are continuation text
            b: beta
          c: shallower still starts an argument
        """
        return a

    props = f.input_schema["properties"]
    assert props["a"]["description"] == "alpha note: deeper lines are continuation text"
    assert props["b"]["description"] == "beta"
    assert props["c"]["description"] == "shallower still starts an argument"
    assert f.spec.description == "Do things."


def test_docstring_first_argument_may_have_any_indent_and_prose_before_is_ignored():
    @tool
    def f(x: int, y: int) -> int:
        """Summary.

        Args:
                x: deep first argument
                y: same indent
        """
        return x

    props = f.input_schema["properties"]
    assert props["x"]["description"] == "deep first argument"
    assert props["y"]["description"] == "same indent"


def test_docstring_args_line_must_be_exact():
    @tool
    def f(x: int) -> int:
        """Summary.

        Args: x is described inline, so this is no Args section.
        """
        return x

    assert (
        f.spec.description == "Summary.\n\nArgs: x is described inline, so this is no Args section."
    )
    assert "description" not in f.input_schema["properties"]["x"]


def test_docstring_empty_argument_description_and_continuation():
    @tool
    def f(x: int, y: int) -> int:
        """Summary.

        Args:
            x:
                described on the next line
            y:
        """
        return x

    props = f.input_schema["properties"]
    assert props["x"]["description"] == "described on the next line"
    assert "description" not in props["y"]  # empty descriptions are not set


def test_typed_google_style_entries_are_not_arguments():
    # `x (int): ...` does not match `<identifier>: <desc>`: it is continuation text.
    @tool
    def f(x: int, y: int) -> int:
        """Summary.

        Args:
            x: first
            y (int): second
        """
        return x

    props = f.input_schema["properties"]
    assert props["x"]["description"] == "first y (int): second"
    assert "description" not in props["y"]


def test_explicit_description_replaces_docstring_but_args_still_parsed():
    @tool(description="Custom.")
    def f(x: int) -> int:
        """Ignored summary.

        Args:
            x: the x
        """
        return x

    assert f.spec.description == "Custom."
    assert f.input_schema["properties"]["x"]["description"] == "the x"


def test_description_without_docstring():
    @tool(description="No docstring needed.")
    def f(x: int) -> int:
        return x

    assert f.spec.description == "No docstring needed."
    assert f.__doc__ is None


# --------------------------------------------------------------------------- AGENT-32


def test_error_no_docstring():
    def nodoc(x: int) -> int:
        return x

    with pytest.raises(ConfigError) as ei:
        tool(nodoc)
    assert str(ei.value) == (
        "@tool function 'nodoc' has no docstring: tools need a description because the model "
        "relies on it to decide when (and how) to call them. Add a docstring, or pass "
        "description=... explicitly to @tool."
    )


def test_error_blank_docstring():
    with pytest.raises(ConfigError, match="has no docstring"):

        @tool(name="other")
        def blank(x: int) -> int:
            """ """  # noqa: D419
            return x


@pytest.mark.parametrize("variadic", ["args", "kwargs"])
def test_error_variadic(variadic):
    if variadic == "args":

        def fn(a: int, *rest: int) -> int:
            """Doc."""
            return a

    else:

        def fn(a: int, **rest: int) -> int:
            """Doc."""
            return a

    with pytest.raises(ConfigError) as ei:
        tool(fn)
    assert str(ei.value) == (
        "@tool function 'fn' must not use *args/**kwargs: tool parameters must be explicit, "
        "typed keyword arguments so a JSON Schema can be generated for them."
    )


def test_error_unknown_args_entries():
    def typo(query: str, limit: int = 3) -> str:
        """Search.

        Args:
            querry: misspelt
            zeta: gone
            limit: fine
        """
        return query

    with pytest.raises(ConfigError) as ei:
        tool(typo)
    assert str(ei.value) == (
        "@tool function 'typo': docstring Args: section describes parameter(s) "
        "['querry', 'zeta'], which don't match any real parameter (actual parameters: "
        "['limit', 'query']) -- fix the typo, or update the docstring after a rename."
    )


# --------------------------------------------------------------------------- AGENT-33


def test_agent33_example_schema_exactly():
    @tool
    def add(a: int, b: int = 1) -> int:
        """Add.

        Args:
            a: The first number.
            b: The second number.
        """
        return a + b

    expected = {
        "properties": {
            "a": {"type": "integer", "description": "The first number."},
            "b": {"default": 1, "type": "integer", "description": "The second number."},
        },
        "required": ["a"],
        "type": "object",
        "additionalProperties": False,
    }
    assert add.input_schema == expected
    # same key order too (what the provider receives)
    assert json.dumps(add.input_schema) == json.dumps(expected)
    assert add.spec.input_schema is add.input_schema
    assert add.spec.strict is True
    assert add.spec.requires_approval is False


def test_param_model_naming():
    @tool
    def count_words(text: str) -> int:
        """Count words."""
        return len(text.split())

    assert count_words.param_model.__name__ == "CountWordsParams"

    @tool(name="web-search.v2")
    def ws(q: str) -> str:
        """Search."""
        return q

    assert ws.param_model.__name__ == "WebSearchV2Params"

    @tool(name="getURL")
    def get_url(u: str) -> str:
        """Get."""
        return u

    assert get_url.param_model.__name__ == "GeturlParams"  # str.capitalize() lowercases


def test_schema_unannotated_parameter_is_any_and_required_lists_no_defaults():
    @tool
    def f(a, b: str = "x", c: float | None = None) -> None:
        """Doc."""

    schema = f.input_schema
    assert schema["required"] == ["a"]
    assert schema["properties"]["a"] == {}
    assert schema["properties"]["b"] == {"default": "x", "type": "string"}
    assert schema["properties"]["c"] == {
        "anyOf": [{"type": "number"}, {"type": "null"}],
        "default": None,
    }


class Address(BaseModel):
    """A postal address."""

    street: str
    title: str = "home"


class Person(BaseModel):
    name: str
    address: Address
    tags: dict[str, int] = {}


def test_schema_nested_models_sealed_via_defs():
    @tool
    def save_person(person: Person, extra: dict[str, Any] | None = None) -> str:
        """Save a person.

        Args:
            person: Who to save.
        """
        return person.name

    schema = save_person.input_schema
    assert schema == {
        "$defs": {
            "Address": {
                "description": "A postal address.",
                "properties": {
                    "street": {"type": "string"},
                    "title": {"default": "home", "type": "string"},
                },
                "required": ["street"],
                "type": "object",
                "additionalProperties": False,
            },
            "Person": {
                "properties": {
                    "name": {"type": "string"},
                    "address": {"$ref": "#/$defs/Address"},
                    "tags": {
                        "additionalProperties": {"type": "integer"},
                        "default": {},
                        "type": "object",
                    },
                },
                "required": ["name", "address"],
                "type": "object",
                "additionalProperties": False,
            },
        },
        "properties": {
            "person": {"$ref": "#/$defs/Person", "description": "Who to save."},
            "extra": {
                "anyOf": [{"type": "object", "additionalProperties": False}, {"type": "null"}],
                "default": None,
            },
        },
        "required": ["person"],
        "type": "object",
        "additionalProperties": False,
    }


def test_seal_schema_rules():
    original = {
        "title": "Root",
        "type": "object",
        "properties": {
            # a property *named* title (dict-valued) survives; its string title goes
            "title": {"title": "Title", "type": "string"},
            "open": {"type": "object", "additionalProperties": {"type": "string"}},
            "loose": {"type": "object", "additionalProperties": True, "title": "Loose"},
            "items": {"type": "array", "items": {"type": "object", "properties": {}}},
            "choice": {"anyOf": [{"type": "object"}, {"type": "integer", "title": "N"}]},
        },
    }
    snapshot = json.dumps(original)
    sealed = seal_schema(original)
    assert json.dumps(original) == snapshot  # input untouched
    assert sealed == {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "open": {"type": "object", "additionalProperties": {"type": "string"}},
            "loose": {"type": "object", "additionalProperties": False},
            "items": {
                "type": "array",
                "items": {"type": "object", "properties": {}, "additionalProperties": False},
            },
            "choice": {
                "anyOf": [{"type": "object", "additionalProperties": False}, {"type": "integer"}]
            },
        },
        "additionalProperties": False,
    }
    # additionalProperties goes last when added or replaced; dict-valued ones keep their place
    assert list(sealed["properties"]["loose"]) == ["type", "additionalProperties"]
    assert list(sealed) == ["type", "properties", "additionalProperties"]


def test_seal_schema_keeps_non_string_titles_and_data_values():
    sealed = seal_schema(
        {
            "type": "object",
            "properties": {"title": {"type": "string"}},
            "required": ["title"],
            "default": {"title": "kept", "type": "object"},
            "$defs": {"title": {"type": "object", "title": "Drop"}},
        }
    )
    assert sealed == {
        "type": "object",
        "properties": {"title": {"type": "string"}},
        "required": ["title"],
        "default": {"title": "kept", "type": "object"},
        "$defs": {"title": {"type": "object", "additionalProperties": False}},
        "additionalProperties": False,
    }


def test_annotated_field_constraints_and_odd_parameter_names():
    @tool
    def odd(
        json: Annotated[int, Field(ge=0)] = 1,
        model_dump: int = 2,
        _private: str = "p",
    ) -> dict:
        """Odd names.

        Args:
            json: shadows a BaseModel attribute
            _private: leading underscore
        """
        return {"json": json, "model_dump": model_dump, "_private": _private}

    props = odd.input_schema["properties"]
    assert list(props) == ["json", "model_dump", "_private"]
    assert props["json"] == {
        "default": 1,
        "minimum": 0,
        "type": "integer",
        "description": "shadows a BaseModel attribute",
    }
    assert props["_private"]["description"] == "leading underscore"
    out = json.loads(odd.execute({"json": "4", "model_dump": 5, "_private": "q"}))
    assert out == {"json": 4, "model_dump": 5, "_private": "q"}
    with pytest.raises(pydantic.ValidationError):
        odd.execute({"json": -1})


def test_decoration_registers_annotation_types():
    class Inner(BaseModel):
        v: int

    class Outer(BaseModel):
        inner: Inner

    class Color(enum.Enum):
        RED = 1

    def body(o: Outer, c: Color = Color.RED) -> Outer:
        """Doc."""
        return o

    for cls in (Outer, Inner, Color):
        _codec._REGISTRY.pop(_codec.tag_of(cls), None)
    tool(body)
    for cls in (Outer, Inner, Color):
        assert _codec._REGISTRY[_codec.tag_of(cls)] is cls


# --------------------------------------------------------------------------- AGENT-34


def test_input_and_output_types():
    @tool
    def a(x: int, y: str) -> list[int]:
        """Doc."""
        return [x]

    assert a.input_type is int
    assert a.output_type == list[int]

    @tool
    def b(x, y: str):
        """Doc."""

    assert b.input_type is Any
    assert b.output_type is Any

    @tool
    def c(*, k: int) -> str:
        """Keyword-only: no positional parameter."""
        return str(k)

    assert c.input_type is Any
    assert c.output_type is str

    @tool
    def d() -> None:
        """No parameters."""

    assert d.input_type is Any
    assert d.output_type is type(None)
    assert d.input_schema == {"properties": {}, "type": "object", "additionalProperties": False}

    @tool
    def e(x: Annotated[int, Field(ge=0)]) -> Annotated[str, "meta"]:
        """Annotated types are stripped for input/output types."""
        return str(x)

    assert e.input_type is int
    assert e.output_type is str


def test_unresolvable_annotations_fall_back_to_raw_annotations():
    def f(x: "int", y: "str") -> "NotDefinedAnywhere":  # noqa: F821
        """Doc."""
        return x

    t = tool(f)
    assert t.output_type == "NotDefinedAnywhere"
    assert t.input_type == "int"
    assert t.execute({"x": "2", "y": "s"}) == "2"


def test_tool_constructor_errors():
    spec = ToolSpec(name="t", description="d", input_schema={})

    def fn(x: int) -> int:
        return x

    with pytest.raises(ConfigError) as ei:
        Tool(fn)
    assert str(ei.value) == "Tool requires a spec"
    with pytest.raises(ConfigError) as ei:
        Tool(spec=spec)
    assert str(ei.value) == (
        "Tool requires exactly one execution path: fn+param_model (local @tool) "
        "or executor= (remote, e.g. MCP)"
    )
    with pytest.raises(ConfigError) as ei:
        Tool(fn, spec, executor=lambda args: "x")
    assert "exactly one execution path" in str(ei.value)
    with pytest.raises(ConfigError) as ei:
        Tool(fn, spec)
    assert str(ei.value) == "Tool with fn= also requires param_model="


def test_tool_constructed_directly_with_fn_and_param_model():
    class Params(BaseModel):
        x: int

    def double(x: int) -> int:
        return 2 * x

    t = Tool(double, ToolSpec("double", "Double it.", {"type": "object"}), Params, timeout=3)
    assert t.name == "double"
    assert t.timeout == 3
    assert t.input_type is int
    assert t.output_type is int
    assert t.execute({"x": "21"}) == "42"
    assert t(4) == 8


def test_remote_tool():
    calls = []

    def executor(arguments):
        calls.append(arguments)
        return "remote says hi"

    spec = ToolSpec(
        name="mcp_echo", description="Echo.", input_schema={"type": "object"}, strict=False
    )
    t = Tool(spec=spec, executor=executor)
    assert t.fn is None
    assert t.is_async is False
    assert t.input_type is Any
    assert t.output_type is str
    assert t.name == "mcp_echo"
    assert t.__name__ == "mcp_echo"
    assert t.input_schema == {"type": "object"}
    assert t.execute({"anything": [1]}) == "remote says hi"
    assert calls == [{"anything": [1]}]
    with pytest.raises(ConfigError) as ei:
        t("x")
    assert str(ei.value) == (
        "tool 'mcp_echo' is not a local function (it executes on a remote server); "
        "use it via @agent(tools=[...]) instead of calling it"
    )
    with pytest.raises(ConfigError, match="mcp_echo"):
        asyncio.run(t.aexecute({}))


def test_remote_async_executor():
    async def executor(arguments):
        await asyncio.sleep(0)
        return f"got {sorted(arguments)}"

    t = Tool(spec=ToolSpec("r", "R.", {}), executor=executor)
    assert t.is_async is True
    assert asyncio.run(t.aexecute({"b": 1, "a": 2})) == "got ['a', 'b']"
    assert t.execute({"c": 3}) == "got ['c']"


# --------------------------------------------------------------------------- AGENT-35


def test_execute_validates_lax_and_rejects_unknown_keys():
    seen = []

    @tool
    def scale(value: int, factor: float = 2.0, label: str = "x") -> str:
        """Scale a value."""
        seen.append((value, factor, label))
        return f"{label}={value * factor}"

    assert scale.execute({"value": "3"}) == "x=6.0"  # lax: "3" -> 3
    assert seen[-1] == (3, 2.0, "x")
    assert type(seen[-1][0]) is int
    assert scale.execute({"value": 4.0, "factor": "0.5", "label": "y"}) == "y=2.0"
    assert type(seen[-1][0]) is int and seen[-1][1] == 0.5

    with pytest.raises(pydantic.ValidationError) as ei:
        scale.execute({"value": 1, "bogus": True})
    assert ei.value.errors()[0]["type"] == "extra_forbidden"
    with pytest.raises(pydantic.ValidationError) as ei:
        scale.execute({})
    assert ei.value.errors()[0]["type"] == "missing"
    with pytest.raises(pydantic.ValidationError):
        scale.execute({"value": "three"})
    with pytest.raises(pydantic.ValidationError):
        scale.execute({"value": 1.5})  # a fractional float is not an int, even lax


def test_execute_body_exception_propagates():
    @tool
    def boom(x: int) -> str:
        """Fails."""
        raise ValueError(f"bad {x}")

    with pytest.raises(ValueError, match="bad 1"):
        boom.execute({"x": 1})


class Summary(BaseModel):
    title: str
    count: int


class Mood(str, enum.Enum):
    HAPPY = "happy"


def test_execute_result_rendering():
    @tool
    def give(kind: str) -> Any:
        """Returns various things."""
        return {
            "str": "plain text",
            "dict": {"a": 1, "b": [1, 2], "ü": None},
            "model": Summary(title="t", count=2),
            "none": None,
            "int": 7,
            "tuple": (1, "x"),
            "enum": Mood.HAPPY,
        }[kind]

    assert give.execute({"kind": "str"}) == "plain text"
    assert give.execute({"kind": "dict"}) == '{"a": 1, "b": [1, 2], "\\u00fc": null}'
    assert json.loads(give.execute({"kind": "model"})) == {
        "$kind": "pydantic",
        "$type": _codec.tag_of(Summary),
        "value": {"title": "t", "count": 2},
    }
    assert give.execute({"kind": "model"}) == json.dumps(_codec.encode(Summary(title="t", count=2)))
    assert give.execute({"kind": "none"}) == "null"
    assert give.execute({"kind": "int"}) == "7"
    assert give.execute({"kind": "tuple"}) == '{"$kind": "tuple", "value": [1, "x"]}'
    rendered = give.execute({"kind": "enum"})  # a str subclass: returned as its text
    assert rendered == "happy" and type(rendered) is str


def test_execute_unencodable_result_raises():
    @tool
    def weird() -> object:
        """Returns an object."""
        return object()

    with pytest.raises(_codec.SerializationError):
        weird.execute({})


def test_execute_passes_models_as_instances_and_keeps_function_defaults():
    sentinel = ["function default"]
    received = {}

    @tool
    def store(
        person: Person, note=sentinel, /, flag: bool = False, *, tags: list | None = None
    ) -> str:
        """Store."""
        received.update(person=person, note=note, flag=flag, tags=tags)
        return "ok"

    assert store.input_type is Person
    assert (
        store.execute({"person": {"name": "Ann", "address": {"street": "Main"}}, "flag": "yes"})
        == "ok"
    )
    assert isinstance(received["person"], Person)
    assert isinstance(received["person"].address, Address)
    assert received["note"] is sentinel  # positional-only default passed through
    assert received["flag"] is True
    assert received["tags"] is None


def test_aexecute_async_tool():
    @tool
    async def slow_echo(text: str, times: int = 1) -> list[str]:
        """Echo asynchronously."""
        await asyncio.sleep(0)
        return [text] * times

    assert asyncio.run(slow_echo.aexecute({"text": "hi", "times": "2"})) == '["hi", "hi"]'
    # execute() drives an async body on the background loop
    assert slow_echo.execute({"text": "yo"}) == '["yo"]'
    with pytest.raises(pydantic.ValidationError):
        asyncio.run(slow_echo.aexecute({"text": "hi", "nope": 1}))


def test_aexecute_on_sync_tool_names_the_tool():
    @tool
    def plain_sync_tool(x: int) -> int:
        """Sync."""
        return x

    with pytest.raises(ConfigError, match="plain_sync_tool"):
        asyncio.run(plain_sync_tool.aexecute({"x": 1}))


# --------------------------------------------------------------------------- AGENT-43 / AGENT-46


def test_before_tool_model():
    from composeai.interception import BeforeTool

    b = BeforeTool()
    assert (b.action, b.arguments, b.message) == ("proceed", None, None)
    deny = BeforeTool(action="deny", message="no")
    assert deny.action == "deny"
    with pytest.raises(pydantic.ValidationError):
        BeforeTool(action="maybe")
    with pytest.raises(pydantic.ValidationError):
        deny.message = "changed"  # frozen
    assert BeforeTool(arguments={"q": 1}).arguments == {"q": 1}


def test_approval_reply_model():
    from composeai._approval import ApprovalReply

    r = ApprovalReply(allow=False, message="too risky")
    assert (r.allow, r.message) == (False, "too risky")
    assert ApprovalReply(allow=True).message is None
    with pytest.raises(pydantic.ValidationError):
        ApprovalReply()
    with pytest.raises(pydantic.ValidationError):
        r.allow = True  # frozen
    assert ApprovalReply.__module__ == "composeai.hitl"
    assert _codec.tag_of(ApprovalReply) == "composeai.hitl:ApprovalReply"
    assert _codec.loads(_codec.dumps(r)) == r


def test_tool_interceptor_is_runtime_checkable():
    from composeai.interception import BeforeTool, ToolInterceptor

    class Guard:
        def before(self, call):
            if call.name == "rm":
                return BeforeTool(action="deny", message="not allowed")
            return None

        def after(self, call, result):
            return ToolResultPart(tool_call_id=result.tool_call_id, content=result.content.upper())

    class OnlyBefore:
        def before(self, call):
            return None

    guard = Guard()
    assert isinstance(guard, ToolInterceptor)
    assert not isinstance(OnlyBefore(), ToolInterceptor)
    call = ToolCallPart(id="c1", name="rm", arguments={})
    assert guard.before(call).message == "not allowed"
    out = guard.after(call, ToolResultPart(tool_call_id="c1", content="done"))
    assert out.content == "DONE"
