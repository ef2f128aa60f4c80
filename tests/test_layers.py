"""The package's import layers (issue 25; docs/architecture.md, "Python layers").

Every import of a `composeai` module counts: top-level, inside a function, under
`TYPE_CHECKING`, absolute or relative. A module may import modules of its own
group or of a group listed before it; the import graph has no cycle.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "composeai"

# Bottom to top. A name ending in "." stands for a package and every module in it.
GROUPS: list[tuple[str, tuple[str, ...]]] = [
    # Foundations: no value type, no engine.
    (
        "base",
        (
            "errors",
            "_core",
            "_typing",
            "_dataclass",
            "_source",
            "_runtime",
            "_threads",
            "_retry",
            "_cancel",
            "_codec",
            "_version",
        ),
    ),
    # Value types: results, spans, events, messages, interrupts.
    (
        "values",
        (
            "_values",
            "events",
            "messages",
            "tracing",
            "_interrupt",
            "_approval",
            "interception",
            # OpenTelemetry export: spans in, the engine loads it lazily.
            "_otel",
        ),
    ),
    # The engine: frames, steps, replay, pauses, waits, streams.
    ("engine", ("_stages", "_engine", "_drive", "_waits", "_streams", "runs")),
    # What the command line and the web UI show of the store.
    ("show", ("_show",)),
    # Features, each importing only the engine and the features before it.
    ("models", ("models.",)),
    ("lifecycle", ("_lifecycle",)),
    # Patching flow code under runs in flight (OPS-2): asks the engine and the flow registry.
    ("patching", ("patching",)),
    # Answers journaled from outside a run, continued through `resume`.
    ("answers", ("_answer",)),
    ("flows", ("flow",)),
    # Replaying and forking stored flow runs (issue 27).
    ("replay", ("_replay",)),
    ("hitl", ("hitl",)),
    ("tools", ("tools",)),
    ("composition", ("combinators",)),
    (
        "agents",
        ("_agent_call", "_agent_tools", "_agent_loop", "_agent_drive", "_agent_runs", "agentfn"),
    ),
    ("chat", ("chat",)),
    ("durable", ("durable",)),
    ("queues", ("queues",)),
    ("graph", ("graph.",)),
    ("mcp", ("mcp",)),
    # Reading runs from outside and retention (OPS-20 … OPS-23).
    ("outside", ("listing", "published", "retention")),
    # Entry points.
    ("entry", ("testing", "worker", "ui.", "cli", "")),
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    found["_core"] = PACKAGE / "_core.pyi"  # the extension module
    return found


MODULES = _modules()


def _group_of(module: str) -> int:
    for rank, (_, members) in enumerate(GROUPS):
        for member in members:
            if member.endswith("."):
                if module == member[:-1] or module.startswith(member):
                    return rank
            elif module == member:
                return rank
    raise AssertionError(f"composeai.{module} is in no layer of tests/test_layers.py")


def _resolve(name: str) -> str:
    """The module (relative to the package) an imported dotted name loads."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(module: str, path: Path) -> list[tuple[str, int]]:
    """`(imported module, line)` for every import of a package module."""
    if path.suffix == ".pyi":
        return []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                parent = ".".join(["composeai", *base])
            else:
                parent = ""
            source = ".".join(p for p in (parent, node.module or "") if p)
            names = [
                f"{source}.{a.name}" if _resolve_abs(f"{source}.{a.name}") else source
                for a in node.names
            ]
        for name in names:
            if name != "composeai" and not name.startswith("composeai."):
                continue
            target = _resolve(name.removeprefix("composeai").removeprefix("."))
            if target != module:
                found.append((target, node.lineno))
    return found


def _resolve_abs(name: str) -> bool:
    return name.removeprefix("composeai").removeprefix(".") in MODULES


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _label(module: str) -> str:
    return f"composeai.{module}" if module else "composeai"


def test_every_module_has_a_layer():
    for module in MODULES:
        _group_of(module)


def test_no_module_imports_a_higher_layer():
    """A lower layer never imports a higher one, even inside a function."""
    upward = []
    for module, imports in GRAPH.items():
        rank = _group_of(module)
        for target, line in imports:
            if _group_of(target) > rank:
                upward.append(
                    f"{MODULES[module].relative_to(PACKAGE.parent)}:{line}: {_label(module)} "
                    f"({GROUPS[rank][0]}) imports {_label(target)} "
                    f"({GROUPS[_group_of(target)][0]})"
                )
    assert not upward, "imports from a lower layer up to a higher one:\n" + "\n".join(upward)


def _cycle() -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        stack.append(module)
        for target, _ in GRAPH[module]:
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        stack.pop()
        state[module] = 2
        return None

    for module in sorted(MODULES):
        if module not in state:
            found = visit(module)
            if found:
                return found
    return None


def test_the_import_graph_has_no_cycle():
    cycle = _cycle()
    if cycle is not None:
        steps = []
        for a, b in itertools.pairwise(cycle):
            line = next(line for target, line in GRAPH[a] if target == b)
            steps.append(f"{MODULES[a].relative_to(PACKAGE.parent)}:{line}: imports {_label(b)}")
        pytest.fail("import cycle:\n" + "\n".join(steps))


def test_the_checker_sees_function_level_and_relative_imports(tmp_path):
    """The checker itself: an import inside a function, relative or absolute,
    and one under TYPE_CHECKING are all edges."""
    source = (
        "TYPE_CHECKING = False\n"
        "if TYPE_CHECKING:\n"
        "    from .flow import Flow\n"
        "def f():\n"
        "    from . import durable\n"
        "    import composeai.graph\n"
        "    from composeai.models import base\n"
    )
    path = tmp_path / "probe.py"
    path.write_text(source)
    targets = {t for t, _ in _imports("_engine", path)}
    assert targets == {"flow", "durable", "graph", "models.base"}


# --------------------------------------------------------------------------- features not imported

# A graph and an agent in modules of their own: a child that does not import them
# has neither `composeai.graph` nor `composeai.agentfn` loaded.
FEATURES = """\
import composeai as compose
from composeai.graph import END, Graph, suspend
from composeai.testing import FakeModel


def review(state):
    return suspend({"question": "ship?"})


wf = Graph(name="layered")
wf.add_node("review", review)
wf.start("review").edge("review", END)
app = wf.compile()


@compose.agent(model=FakeModel(["done"]))
def helper(topic: str) -> str:
    return f"about {topic}"
"""


@pytest.fixture
def box(tmp_path):
    import _proc

    sandbox = _proc.Sandbox(tmp_path)
    sandbox.write_module("layered", FEATURES, helper=False)
    return sandbox


def test_flow40_resume_routes_by_kind_without_importing_the_feature(box):
    """FLOW-40, AGENT-54, EXT-29: `compose.resume()` in a process that never imported
    the graph or agent modules raises what they would (the definition is not in the
    process), returns a completed agent run's `Run`, and imports neither."""
    first = box.run(
        """
        import layered
        g = layered.app.run({})
        a = layered.helper.run("x")
        emit(graph=g.run_id, suspended=g.suspended, agent=a.id, output=a.output)
        """
    ).ok()
    assert first["suspended"] and first["output"] == "done"
    fresh = box.run(
        f"""
        import sys
        import composeai as compose
        from composeai.errors import ConfigError

        try:
            compose.resume({first["graph"]!r})
        except ConfigError as exc:
            graph_error = str(exc)
        done = compose.resume({first["agent"]!r})
        emit(
            graph_error=graph_error,
            agent=[done.status, done.output],
            loaded=[m for m in ("composeai.graph", "composeai.agentfn") if m in sys.modules],
        )
        """
    ).ok()
    assert fresh["graph_error"].startswith("graph 'layered' is not compiled in this process")
    assert fresh["agent"] == ["completed", "done"]
    assert fresh["loaded"] == []
    again = box.run(
        f"""
        import composeai as compose
        import layered

        r = compose.resume({first["graph"]!r}, answers={{"node:review": "yes"}})
        emit(status=r.status, run_id=r.id, pending=r.pending.id)
        """
    ).ok()
    assert again == {"status": "paused", "run_id": first["graph"], "pending": "node:review"}


def test_store20_a_queue_start_before_any_queue_is_declared(box):
    """STORE-20: `Flow.start(queue=...)` in a process that never imported
    `composeai.queues` names an undeclared queue (or is not a queue at all)."""
    out = box.run(
        """
        import sys
        import composeai as compose
        from composeai.errors import ConfigError


        @compose.flow
        def job():
            return 1


        try:
            job.start(queue="nightly")
        except ConfigError as exc:
            named = str(exc)
        try:
            job.start(queue=3)
        except TypeError as exc:
            other = str(exc)
        emit(named=named, other=other, loaded="composeai.queues" in sys.modules)
        """
    ).ok()
    assert out["named"].startswith("queue 'nightly' is not declared in this process")
    assert out["other"] == "queue must be a Queue or a queue name, got int"
    assert out["loaded"] is False
