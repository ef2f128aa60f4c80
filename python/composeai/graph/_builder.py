"""`Graph`, the builder: nodes, edges, routes, joins,
`goto` targets and reducers, checked and compiled by the core.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import _core
from ..errors import ConfigError
from ._compiled import _GRAPHS, CompiledGraph
from ._nodes import _check_name, _is_agent, _Node
from ._storage import _storage
from ._values import END, GraphValidationError

# ---------------------------------------------------------------------------
# The builder (EXT-20)


class Graph:
    """A graph of nodes (functions or agents), checked by `compile()` and
    run by the core."""

    def __init__(self, reducers: Mapping[str, str] | None = None, *, name: str | None = None):
        if reducers is not None and not isinstance(reducers, Mapping):
            raise TypeError(
                f"reducers must be a mapping of state key to reducer name, got {reducers!r}"
            )
        self._reducers = {str(k): v for k, v in (reducers or {}).items()}
        self._name = name
        self._nodes: dict[str, _Node] = {}
        self._start: str | None = None
        self._edges: list[tuple[str, str]] = []
        self._routes: list[tuple[str, Callable, dict[str, str]]] = []
        self._joins: list[tuple[list[str], str]] = []
        self._gotos: list[tuple[str, list[str]]] = []

    def add_node(self, name: str, node: Any) -> Graph:
        """Adds a node: a function `(state)` / `(state, ctx)` or an agent."""
        _check_name("add_node() name", name)
        if not name or name == END:
            raise ValueError(f"invalid node name {name!r}")
        if name in self._nodes:
            raise ValueError(f"graph already has a node named {name!r} -- node names are unique")
        if not (callable(node) or _is_agent(node)) or isinstance(node, type):
            raise TypeError(
                f"node {name!r} must be a function or an AgentFunction, got {type(node).__name__}"
            )
        self._nodes[name] = _Node(name, node)
        return self

    def node(self, func: Callable | None = None, *, name: str | None = None) -> Any:
        """Decorator: `@graph.node` or `@graph.node(name=...)`; returns the
        function unchanged."""

        def decorate(f: Callable) -> Callable:
            self.add_node(name or getattr(f, "__name__", None) or repr(f), f)
            return f

        if func is not None:
            return decorate(func)
        return decorate

    def start(self, name: str) -> Graph:
        self._start = _check_name("start()", name)
        return self

    def edge(self, source: str, target: str) -> Graph:
        self._edges.append(
            (_check_name("edge() source", source), _check_name("edge() target", target))
        )
        return self

    def route(self, source: str, router: Callable[[dict], str], routes: Mapping[str, str]) -> Graph:
        _check_name("route() source", source)
        if not callable(router):
            raise TypeError(f"route() router for {source!r} must be a function state -> label")
        if inspect.iscoroutinefunction(router):
            raise TypeError(f"route() router for {source!r} must be a plain (not async) function")
        if not isinstance(routes, Mapping):
            raise TypeError(f"route() routes for {source!r} must map labels to node names")
        table = {}
        for label, target in routes.items():
            if not isinstance(label, str):
                raise TypeError(f"route() labels must be str, got {label!r}")
            table[label] = _check_name(f"route() target of label {label!r}", target)
        self._routes.append((source, router, table))
        return self

    def join(self, sources: Sequence[str], target: str) -> Graph:
        if isinstance(sources, str):
            raise TypeError("join() sources must be a list of node names, not a str")
        names = [_check_name("join() source", s) for s in sources]
        self._joins.append((names, _check_name("join() target", target)))
        return self

    def goto(self, source: str, targets: Sequence[str]) -> Graph:
        if isinstance(targets, str):
            targets = [targets]
        names = [_check_name("goto() target", t) for t in targets]
        self._gotos.append((_check_name("goto() source", source), names))
        return self

    def _spec(self, name: str) -> str:
        return json.dumps(
            {
                "name": name,
                "nodes": list(self._nodes),
                "start": self._start,
                "edges": self._edges,
                "routes": [[s, list(t.items())] for s, _, t in self._routes],
                "joins": self._joins,
                "gotos": self._gotos,
                "reducers": [[k, str(v)] for k, v in self._reducers.items()],
            }
        )

    def compile(
        self, storage: Any = None, *, audit: bool = False, replace: bool = False
    ) -> CompiledGraph:
        """Checks the whole graph in the core, reporting every issue at once, and registers it by name for `compose.resume()`."""
        name = self._name or self._start or ""
        native, issues_json = _core.graph_compile(self._spec(name))
        if native is None:
            issues = json.loads(issues_json)
            lines = "\n".join(f"- {i['message']}" for i in issues)
            raise GraphValidationError(
                f"graph {name!r} is invalid ({len(issues)} issue"
                f"{'s' if len(issues) != 1 else ''}):\n{lines}",
                code="invalid_workflow",
                issues=issues,
            )
        compiled = CompiledGraph(self, native, _storage(storage), audit)
        existing = _GRAPHS.get(name)
        if existing is not None and existing._builder is not self and not replace:
            raise ConfigError(
                f"a graph named {name!r} is already compiled in this process -- graph names "
                "route runs to their graph in any process; pass name=... to Graph() or "
                "compile(replace=True)"
            )
        _GRAPHS[name] = compiled
        return compiled
