"""Graph builder, decorator, registration and compile-time validation (EXT-20, EXT-26)."""

from __future__ import annotations

import pytest

from composeai.errors import ConfigError
from composeai.graph import END, Graph, GraphError, GraphValidationError


def noop(state):
    return None


def test_ext20_builder_methods_chain_and_the_decorator_returns_the_function():
    g = Graph(name="chain")

    @g.node
    def a(state):
        return {"x": 1}

    @g.node(name="second")
    def b(state):
        return None

    assert a({}) == {"x": 1}
    assert b.__name__ == "b"
    assert g.start("a") is g
    assert g.edge("a", "second") is g
    assert g.edge("second", END) is g
    assert g.route("a", lambda s: "x", {"x": END}) is g
    assert g.join(["a"], "second") is g
    assert g.goto("a", [END]) is g
    assert END == "__end__"
    assert g.compile().name == "chain"


def test_ext20_duplicate_name_is_value_error_and_other_types_type_error():
    g = Graph()
    g.add_node("a", noop)
    with pytest.raises(ValueError, match="'a'"):
        g.add_node("a", noop)
    with pytest.raises(TypeError, match="'b'"):
        g.add_node("b", 42)
    with pytest.raises(TypeError):
        g.add_node("c", dict)


def test_ext20_the_default_name_is_the_start_node_and_a_second_graph_needs_replace():
    one = Graph().add_node("hello", noop).start("hello").edge("hello", END)
    assert one.compile().name == "hello"
    assert one.compile().name == "hello", "recompiling the same builder is fine"
    other = Graph().add_node("hello", lambda s: {"y": 1}).start("hello").edge("hello", END)
    with pytest.raises(ConfigError, match="already compiled"):
        other.compile()
    assert other.compile(replace=True).run().state == {"y": 1}


def test_ext20_the_fingerprint_follows_the_structure():
    def build(reducers=None, extra=False):
        g = Graph(reducers, name="fp")
        g.add_node("a", noop).add_node("b", noop).start("a").edge("a", "b").edge("b", END)
        if extra:
            g.edge("a", END)
        return g.compile(replace=True).fingerprint

    assert build() == build()
    assert build() != build({"k": "append"})
    assert build() != build(extra=True)


def test_ext26_every_issue_is_reported_at_once():
    g = Graph(reducers={"notes": "concat"}, name="broken")
    g.add_node("a", noop).add_node("b", noop).add_node("lonely", noop).add_node("stuck", noop)
    g.start("a").edge("a", "b").edge("b", "ghost").goto("a", ["nowhere"])
    g.route("b", lambda s: "x", {"x": "phantom"})
    g.join(["a", "missing"], "b")
    g.edge("lonely", END)
    with pytest.raises(GraphValidationError) as info:
        g.compile()
    err = info.value
    assert isinstance(err, ConfigError) and isinstance(err, GraphError)
    assert err.code == "invalid_workflow"
    found = {(i["code"], i.get("node")) for i in err.issues}
    assert {
        ("unknown_node", "ghost"),
        ("unknown_node", "nowhere"),
        ("unknown_node", "phantom"),
        ("unknown_node", "missing"),
        ("unknown_reducer", None),
        ("dead_end", "stuck"),
        ("unreachable", "lonely"),
        ("unreachable", "stuck"),
    } <= found, found
    lines = str(err).splitlines()
    assert len(lines) == len(err.issues) + 1
    assert all(set(i) <= {"code", "message", "node"} for i in err.issues)
    assert err.details["issues"] == err.issues


def test_ext26_missing_and_unknown_start():
    g = Graph().add_node("a", noop).edge("a", END)
    with pytest.raises(GraphValidationError) as info:
        g.compile()
    assert [i["code"] for i in info.value.issues] == ["no_start"]
    g.start("zzz")
    with pytest.raises(GraphValidationError) as info:
        g.compile()
    assert info.value.issues[0]["code"] == "unknown_start"
    assert info.value.issues[0]["node"] == "zzz"


def test_ext26_routes_joins_and_goto_are_ways_forward():
    g = Graph(name="forward")
    for n in ("a", "b", "c", "d", "e"):
        g.add_node(n, noop)
    g.start("a").route("a", lambda s: "x", {"x": "b", "y": "c"})
    g.join(["b", "c"], "d").goto("d", ["e", END]).edge("e", END)
    assert g.compile().fingerprint


def test_ext20_route_rejects_async_routers_and_non_string_labels():
    g = Graph().add_node("a", noop)

    async def router(state):
        return "x"

    with pytest.raises(TypeError, match="not async"):
        g.route("a", router, {"x": END})
    with pytest.raises(TypeError):
        g.route("a", lambda s: "x", {1: END})
