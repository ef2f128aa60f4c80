"""Graph workflows: nodes, edges, routes, joins, `goto`, reducers, suspend
and resume, threads with history.

The Rust core validates the graph, schedules every step, merges updates
through the reducers and writes the checkpoints; this package calls the node
functions (concurrently, on the same thread machinery as `map`) and converts
values. A graph run is a durable run like a flow's: a `runs` row of kind
`graph`, a span per node, budgets, `compose.resume()`.

Bottom to top: `_values` (errors, results, `suspend`/`goto`), `_storage`,
`_nodes`, `_agents` (agent nodes), `_driver` (one attempt's steps),
`_compiled` (`CompiledGraph`, `GraphThread`, resume), `_builder` (`Graph`).
"""

from __future__ import annotations

# The dataclasses below report this module; their annotations resolve here.
from typing import Any  # noqa: F401

from .._lifecycle import pending_interrupt  # noqa: F401 -- importable as before
from ._builder import Graph
from ._compiled import CompiledGraph, GraphThread, reset_registry  # noqa: F401 -- as before
from ._driver import _input_json, _plain_update_json  # noqa: F401 -- importable as before
from ._storage import Storage
from ._values import (  # `_error_from_core`: the core maps a graph error code through it
    END,
    GraphError,
    GraphInterrupt,
    GraphLimitError,
    GraphResult,
    GraphStorageError,
    GraphValidationError,
    NodeContext,
    ThreadBusyError,
    ThreadSuspendedError,
    _error_from_core,  # noqa: F401
    goto,
    suspend,
)

__all__ = [
    "END",
    "CompiledGraph",
    "Graph",
    "GraphError",
    "GraphInterrupt",
    "GraphLimitError",
    "GraphResult",
    "GraphStorageError",
    "GraphThread",
    "GraphValidationError",
    "NodeContext",
    "Storage",
    "ThreadBusyError",
    "ThreadSuspendedError",
    "goto",
    "suspend",
]

# Type tags, reprs and pickles name the module the spec names (PKG-6).
for _cls in (
    CompiledGraph,
    Graph,
    GraphError,
    GraphInterrupt,
    GraphLimitError,
    GraphResult,
    GraphStorageError,
    GraphThread,
    GraphValidationError,
    NodeContext,
    Storage,
    ThreadBusyError,
    ThreadSuspendedError,
):
    _cls.__module__ = __name__
del _cls
