"""Graph workflows: nodes, edges, routes, joins, `goto`, reducers, suspend
and resume, threads with history (EXT-20 … EXT-33).

The Rust core validates the graph, schedules every step, merges updates
through the reducers and writes the checkpoints; this module calls the node
functions (concurrently, on the same thread machinery as `map`) and converts
values. A graph run is a durable run like a flow's: a `runs` row of kind
`graph`, a span per node, budgets, `compose.resume()`.
"""

from __future__ import annotations

import atexit
import inspect
import json
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from . import _codec, _core, _engine
from . import events as _events
from ._engine import FRAME, Frame
from .errors import BudgetExceededError, ComposeError, ConfigError, SerializationError
from .tracing import Span

if TYPE_CHECKING:
    from ._interrupt import Interrupt
    from .runs import Run

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

END = "__end__"

# ---------------------------------------------------------------------------
# Errors (EXT-31: every graph error carries `.code` and `.details`)


class GraphError(ComposeError):
    """A graph run or thread operation failed; `.code` says how."""

    def __init__(self, message: str = "", *, code: str = "graph_error", details: Any = None):
        super().__init__(message)
        self.code = code
        self.details: dict = dict(details or {})

    def __reduce__(self):
        return (_rebuild, (type(self), str(self), self.code, self.details))


def _rebuild(cls, message, code, details):
    return cls(message, code=code, details=details)


class GraphValidationError(ConfigError, GraphError):
    """The graph, a snapshot or resume values do not fit (EXT-26, EXT-29)."""

    def __init__(
        self,
        message: str = "",
        *,
        code: str = "invalid_workflow",
        issues: list[dict] | None = None,
        details: Any = None,
    ):
        GraphError.__init__(self, message, code=code, details=details)
        self.issues: list[dict] = list(issues or [])
        if issues is not None:
            self.details.setdefault("issues", self.issues)

    def __reduce__(self):
        return (_rebuild, (type(self), str(self), self.code, self.details))


class GraphLimitError(GraphError):
    """`max_steps` or `deadline` was reached (EXT-27)."""


class GraphStorageError(GraphError):
    """A thread's storage has no such checkpoint or thread (EXT-30)."""


class ThreadSuspendedError(GraphError):
    """`run()` on a thread whose nodes wait for `resume()` (EXT-31)."""


class ThreadBusyError(GraphError):
    """Another caller holds the thread (EXT-31)."""


_ERROR_CLASSES: dict[str, type[GraphError]] = {
    "resume_invalid": GraphValidationError,
    "invalid_workflow": GraphValidationError,
    "step_limit_exceeded": GraphLimitError,
    "deadline_exceeded": GraphLimitError,
    "checkpoint_not_found": GraphStorageError,
    "checkpoint_corrupt": GraphStorageError,
    "thread_not_found": GraphStorageError,
    "thread_exists": GraphStorageError,
    "thread_suspended": ThreadSuspendedError,
    "thread_busy": ThreadBusyError,
}


def _error_from_core(code: str, message: str, details_json: str) -> GraphError:
    """The exception for a core graph error (called by the bindings)."""
    cls = _ERROR_CLASSES.get(code, GraphError)
    return cls(message, code=code, details=json.loads(details_json or "{}"))


# ---------------------------------------------------------------------------
# Values


@dataclass(frozen=True)
class GraphInterrupt:
    """A suspended node and what it asked (EXT-28)."""

    node: str
    payload: Any


@dataclass(frozen=True)
class NodeContext:
    """What a node knows about its execution (EXT-28)."""

    run_id: str
    step: int
    node: str
    attempt: int
    resume: Any = None


@dataclass
class GraphResult:
    """What a graph run produced (EXT-28)."""

    state: dict
    steps: int
    suspended: bool
    interrupts: list[GraphInterrupt]
    run_id: str
    snapshot: dict | None = field(default=None, repr=False)
    checkpoint_id: str = ""
    version: int = 0


class _Suspend:
    __slots__ = ("payload", "update")

    def __init__(self, payload: Any, update: dict | None):
        self.payload = payload
        self.update = update


class _Goto:
    __slots__ = ("targets", "update")

    def __init__(self, targets: list[str], update: dict | None):
        self.targets = targets
        self.update = update


def suspend(payload: Any, update: dict | None = None) -> Any:
    """Return this from a node to pause the run until someone answers (EXT-29)."""
    if update is not None and not isinstance(update, dict):
        raise TypeError(f"suspend(update=...) takes a dict, got {type(update).__name__}")
    return _Suspend(payload, update)


def goto(targets: str | Sequence[str], update: dict | None = None) -> Any:
    """Return this from a node to choose its next nodes among those declared
    with `Graph.goto` (EXT-25)."""
    if isinstance(targets, str):
        names = [targets]
    else:
        names = list(targets)
        if not all(isinstance(t, str) for t in names):
            raise TypeError("goto() targets must be node names (str)")
    if update is not None and not isinstance(update, dict):
        raise TypeError(f"goto(update=...) takes a dict, got {type(update).__name__}")
    return _Goto(names, update)


# ---------------------------------------------------------------------------
# Storage (EXT-30)


class Storage:
    """Where threads (and the graph's runs) are kept: `None` = the composeai
    store, `":memory:"` = this process only, or a store URL as for `COMPOSE_STORE`.
    `on_busy="wait"` makes a second caller wait for a busy thread."""

    def __init__(self, url: str | None = None, *, on_busy: str = "raise"):
        if on_busy not in ("raise", "wait"):
            raise ValueError(f"on_busy must be 'raise' or 'wait', got {on_busy!r}")
        if url is not None and not isinstance(url, str):
            raise TypeError(f"storage url must be a str, got {type(url).__name__}")
        # The store's own parser (STORE-1), so a graph accepts every form
        # COMPOSE_STORE does: (kind, SQLite path or redacted server URL).
        self._target: tuple[str, str] | None = None
        if url is not None and url != ":memory:":
            try:
                self._target = _core.store_target(url, "")
            except ConfigError as exc:
                raise ConfigError(
                    f"graph storage is not a store URL -- use None, ':memory:' or a store URL: {exc}"
                ) from None
            if not self._target[1]:
                raise ConfigError(
                    "graph storage is not a store URL -- use None, ':memory:' or a store URL "
                    "(sqlite:///abs/path.db, sqlite://relative/path.db, postgresql://...)"
                )
        self.url = url
        self.on_busy = on_busy
        self._store: Any = None
        self._lock = threading.Lock()
        _STORAGES.add(self)

    def __repr__(self) -> str:
        return f"Storage({self.url!r}, on_busy={self.on_busy!r})"

    def store(self):
        if self.url is None:
            return _engine.get_store()
        if self._store is not None:
            return self._store
        with self._lock:
            if self._store is None:
                if self.url == ":memory:":
                    self._store = _memory_store()
                elif self._is_postgres():
                    self._store = _core.Store(self.url)
                else:
                    assert self._target is not None
                    self._store = _core.Store(self._target[1])
            return self._store

    def _is_postgres(self) -> bool:
        return self._target is not None and self._target[0] == "postgresql"

    def _open_io(self):
        """Plan: `store()`, a server's first open made by the plan's driver."""
        if self._store is None and self._is_postgres():
            opened = yield _io(True, _core.Store, _core.Store.aopen, self.url)
            with self._lock:
                if self._store is None:
                    self._store = opened
        return self.store()

    async def aopen(self):
        """`store()` for an async caller: a server's first open (connection and
        schema check) is awaited off the loop (ASYNC-1)."""
        if self.url is None:
            return await _engine.aget_store()
        return await _anow(self._open_io())


def _flush_all() -> None:
    """A settled graph run's spans are written with its settlement (OBS-5);
    spans of a run that has not settled ride with later commits or the
    background writer, and whatever is still queued at exit is written then."""
    stores = [_engine._store, *(s._store for s in list(_STORAGES))]
    for store in stores:
        if store is not None:
            try:
                store.flush()
            except Exception:  # noqa: BLE001, S110 -- exiting; span writes warn once elsewhere
                pass


_STORAGES: weakref.WeakSet[Storage] = weakref.WeakSet()
atexit.register(_flush_all)


def _memory_store():
    """A store private to this process, removed when it exits."""
    import os
    import shutil
    import tempfile

    directory = tempfile.mkdtemp(prefix="composeai-graph-")
    atexit.register(shutil.rmtree, directory, True)
    return _core.Store(os.path.join(directory, "runs.db"))


def _storage(storage: Any) -> Storage:
    if isinstance(storage, Storage):
        return storage
    return Storage(storage)


# ---------------------------------------------------------------------------
# The builder (EXT-20)


def _is_agent(node: Any) -> bool:
    import sys

    agentfn = sys.modules.get("composeai.agentfn")
    return agentfn is not None and isinstance(node, agentfn.AgentFunction)


class _Node:
    __slots__ = ("fn", "is_agent", "is_async", "name", "takes_ctx")

    def __init__(self, name: str, fn: Any):
        self.name = name
        self.fn = fn
        self.is_agent = _is_agent(fn)
        self.is_async = False
        self.takes_ctx = False
        if not self.is_agent:
            self.is_async = inspect.iscoroutinefunction(fn) or (
                not inspect.isfunction(fn) and inspect.iscoroutinefunction(type(fn).__call__)
            )
            self.takes_ctx = _positional_count(fn) >= 2


def _positional_count(fn: Any) -> int:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 1
    count = 0
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            count += 1
        elif p.kind == p.VAR_POSITIONAL:
            return 2
    return count


def _check_name(what: str, name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a node name (str), got {type(name).__name__}")
    return name


class Graph:
    """A graph of nodes (functions or agents), checked by `compile()` and
    run by the core (EXT-20)."""

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
        """Checks the whole graph in the core, reporting every issue at once
        (EXT-26), and registers it by name for `compose.resume()`."""
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


_GRAPHS: dict[str, CompiledGraph] = {}


def reset_registry() -> None:
    """Forgets every compiled graph name (with `flow.reset_registries`)."""
    _GRAPHS.clear()


# ---------------------------------------------------------------------------
# Running


_encode_ascii = _codec._encode_str
_int_text = int.__repr__
# Ints beyond this go through the codec (which knows the digit limit).
_BIG_INT = 10**18


def _plain_update_json(update: dict) -> str | None:
    """The codec's text of an update whose keys are ASCII strings and whose
    values are ints, bools, None or ASCII strings (the common case, written
    without the general encoder); None for any other update."""
    parts = []
    for key, value in update.items():
        if type(key) is not str or not key.isascii():
            return None
        t = type(value)
        if t is int:
            if not -_BIG_INT < value < _BIG_INT:
                return None
            text = _int_text(value)
        elif t is str and value.isascii():
            text = _encode_ascii(value)
        elif value is None:
            text = "null"
        elif t is bool:
            text = "true" if value else "false"
        else:
            return None
        parts.append(f"{_encode_ascii(key)}:{text}")
    return "{" + ",".join(parts) + "}"


def _encode_update(node: str, update: Any) -> str:
    """JSON of an update dict; a value that cannot be stored names the node
    and the key (nothing of the step is stored)."""
    if type(update) is dict:
        plain = _plain_update_json(update)
        if plain is not None:
            return plain
    if not isinstance(update, dict):
        raise GraphError(
            f"node {node!r} returned {type(update).__name__} -- a node returns a dict update, "
            "None, suspend(...) or goto(...)",
            code="node_failed",
            details={"node": node, "type": type(update).__name__},
        )
    try:
        return _codec.dumps(update)
    except SerializationError:
        for key, value in update.items():
            if not isinstance(key, str):
                raise SerializationError(f"node {node!r}: state key {key!r} is not a str") from None
            try:
                _codec.dumps(value)
            except SerializationError as exc:
                raise SerializationError(
                    f"node {node!r}: state key {key!r} cannot be stored: {exc}"
                ) from None
        raise


def _apply_delta(state: dict, ops: list) -> None:
    """Applies the core's merged delta (positional reducer operations)."""
    for op in ops:
        kind, key = op[0], op[1]
        if kind == "set":
            state[key] = op[2]
        elif kind == "extend":
            state.setdefault(key, []).extend(op[2])
        elif kind == "put":
            state[key][op[2]] = op[3]
        else:
            del state[key][op[2]]


def _decode(text: str) -> Any:
    return _codec.loads(text)


# A graph's store calls are plans (see `_engine.plan_io`).
_io = _engine.plan_io
_now = _engine.run_plan
_anow = _engine.arun_plan


def _remote(store: Any) -> bool:
    return store.kind != "sqlite"


def _settling(plan):
    """An `_engine` settlement plan (yielding `(run, settle arguments)`) as
    graph store calls."""
    try:
        run, args = next(plan)
        while True:
            attempt = run.attempt
            try:
                yield _io(attempt.remote, attempt.settle, attempt.asettle, *args)
            except BaseException as exc:  # noqa: BLE001 -- handed to the plan
                run, args = plan.throw(exc)
            else:
                run, args = plan.send(None)
    except StopIteration as stop:
        return stop.value


def _sleep_then(future: Any, delay: float) -> None:
    """`time.sleep(delay)` for an async driver: resolves `future` after it."""

    def wake() -> None:
        if not future.done():
            future.set_result(None)

    future.get_loop().call_later(delay, wake)


def _pause(delay: float) -> tuple:
    """A plan's wait before trying a busy thread again; the async driver
    never sleeps on the loop."""
    return (time.sleep, _sleep_then, (delay,))


class _Step:
    """One ready node of the current step."""

    __slots__ = ("attempt", "done", "node", "resume", "scope", "step")

    def __init__(self, t: tuple):
        self.node, self.scope, self.step, resume_json, self.attempt, self.done = t
        self.resume = None if resume_json is None else _decode(resume_json)


class _Driver:
    """Drives one attempt of a graph run through the core's step machine."""

    def __init__(self, compiled: CompiledGraph, attempt: Any, gr: Any, thread_id: str | None):
        self.compiled = compiled
        self.attempt = attempt
        self.gr = gr
        self.thread_id = thread_id
        self.run = _engine.RunState(attempt, compiled.name)
        self.remote = attempt.remote

    def drive(self, budget: Any) -> GraphResult:
        prior = _now(self._prior_usage(budget))
        root, tokens = self._enter(budget, prior, _engine.driven_synchronously)
        try:
            return _now(self._finish(root, self._loop(root)))
        except BaseException as exc:
            if not self.settled:
                _now(self._fail(root, exc))
            raise
        finally:
            self._exit(tokens)

    async def adrive(self, budget: Any) -> GraphResult:
        """`drive` on the caller's running loop: async nodes are awaited
        there, in the caller's context, and cancelled with its task."""
        prior = await _anow(self._prior_usage(budget))
        root, tokens = self._enter(budget, prior, _engine.driven_by_running_loop)
        try:
            return await _anow(self._finish(root, await self._aloop(root)))
        except BaseException as exc:
            if not self.settled:
                await _anow(self._fail(root, exc))
            raise
        finally:
            self._exit(tokens)

    def _finish(self, root, status: str):
        """Plan: the settlement of a run whose loop stopped with `status`."""
        if status in ("step_limit", "deadline"):
            raise self._limit_error(status)
        return (yield from self._settle(root, status))

    def _prior_usage(self, budget: Any):
        """Plan: the usage earlier attempts of the run spent, which a budget
        counts (None without a budget)."""
        if budget is None:
            return None
        attempt = self.attempt
        return (yield _io(self.remote, attempt.prior_llm_usage, attempt.aprior_llm_usage))

    def _enter(self, budget: Any, prior: Any, drive_mode: Callable[[], Any]) -> tuple:
        """Opens the root span and sets the run's frame, budget meter (`prior`:
        the usage it starts from) and driver (`drive_mode`); returns the root
        and the tokens `_exit` resets."""
        run = self.run
        name = self.compiled.name
        root = _engine.open_span(None, run.trace, "graph", name)
        if self.thread_id is not None:
            root.attributes["thread_id"] = self.thread_id
        meter = None
        if budget is not None:
            meter = _engine.budget_meter(budget, "graph", name, prior)
        budgets = _engine.BUDGETS.set((meter,)) if meter is not None else None
        frame = Frame(run, "", root, None, run.trace)
        # Without an event bus and with content captured (the defaults), node
        # spans are built and persisted directly.
        self.lean_spans = _events.current_bus() is None and _engine._capture()
        return root, (FRAME.set(frame), drive_mode(), budgets)

    def _exit(self, tokens: tuple) -> None:
        frame, driver, budgets = tokens
        _engine.ASYNC_DRIVER.reset(driver)
        FRAME.reset(frame)
        if budgets is not None:
            _engine.BUDGETS.reset(budgets)

    settled = False
    lean_spans = False

    def _loop(self, root) -> str:
        self.state = _decode(self.gr.state_json())
        ready = self.gr.ready()
        while ready:
            status, ready = _now(self._advance(self._run_step(root, [_Step(t) for t in ready])))
            if status != "running":
                # A stopped run's last checkpoint is written with its
                # settlement, in one transaction.
                return status
        return self.gr.idle_status()

    async def _aloop(self, root) -> str:
        """`_loop` with each step's nodes awaited on the running loop."""
        self.state = _decode(self.gr.state_json())
        ready = self.gr.ready()
        while ready:
            outcomes = await self._arun_step(root, [_Step(t) for t in ready])
            status, ready = await _anow(self._advance(outcomes))
            if status != "running":
                return status
        return self.gr.idle_status()

    def _advance(self, outcomes: list):
        """Plan: hands a step's outcomes to the core (which commits the
        step's checkpoint) and applies its merged update and routes:
        `(status, next ready nodes)`."""
        gr = self.gr
        delta_json, routers, status, ready = yield _io(self.remote, gr.step, gr.astep, outcomes)
        _apply_delta(self.state, _decode(delta_json))
        if routers:
            labels = [(n, self._route(n)) for n in routers]
            status, ready = yield _io(self.remote, gr.route, gr.aroute, labels)
        return status, ready

    def _route(self, node: str) -> str:
        router = self.compiled._routers[node]
        try:
            label = router(dict(self.state))
        except Exception as exc:
            raise GraphError(
                f"the router of {node!r} raised {type(exc).__name__}: {exc}",
                code="node_failed",
                details={"node": node, "router": True},
            ) from exc
        if not isinstance(label, str):
            raise GraphError(
                f"the router of {node!r} returned {type(label).__name__} {label!r} -- a router "
                "returns one of its route labels (str)",
                code="route_unknown_label",
                details={"node": node, "label": repr(label)},
            )
        return label

    def _run_step(self, root, ready: list[_Step]) -> list:
        count = len(ready)
        if count == 1:
            # A lone node runs on the calling thread, with no hand-off.
            return [self._run_node(root, ready[0], True)]
        nodes = self.compiled._builder._nodes
        if any(nodes[s.node].is_async for s in ready):
            # Async nodes ready together run concurrently on this thread's
            # own loop (ASYNC-7), the sync ones beside them on threads.
            from . import _runtime

            return _runtime.run_here(lambda: self._arun_step(root, ready), _engine.ASYNC_DRIVER)
        results: list[Any] = [None] * count
        failures: list[BaseException | None] = [None] * count

        def run_item(index: int) -> None:
            try:
                results[index] = self._run_node(root, ready[index], False)
            except BaseException as exc:  # noqa: BLE001 -- raised in node order below
                failures[index] = exc

        from .combinators import _Fanout

        _Fanout(count, count, run_item).run()
        self.attempt.sync()
        for failure in failures:
            if failure is not None:
                raise failure
        return results

    async def _arun_step(self, root, ready: list[_Step]) -> list:
        """Runs a step's nodes on the running loop: async nodes awaited there
        (concurrently when several are ready, EXT-24), sync and agent nodes
        each on a thread of its own so the loop never blocks."""
        if len(ready) == 1:
            return [await self._arun_node(root, ready[0], True)]
        import asyncio

        outcomes = await asyncio.gather(
            *(self._arun_node(root, step, False) for step in ready), return_exceptions=True
        )
        attempt = self.attempt
        if attempt.remote:
            await _engine.off_loop(attempt.aflush)
        else:
            attempt.sync()
        for outcome in outcomes:
            # As in a sync step: every node settles, the first failure in
            # node order is raised.
            if isinstance(outcome, BaseException):
                raise outcome
        return outcomes

    def _run_node(self, root, step: _Step, single: bool) -> tuple:
        """Runs one node; returns its outcome for `GraphRun.step`, with the
        node's span for the core to queue when spans are lean."""
        node = self.compiled._builder._nodes[step.node]
        if step.done is not None:
            return self._replayed(root, step)
        span = self._node_span(root, step)
        token = FRAME.set(Frame(self.run, step.scope, span, None, self.run.trace))
        try:
            outcome = self._outcome(step.node, self._call(node, step))
        except BaseException as exc:
            _engine.fail_span(self.run, span, exc)
            raise
        finally:
            FRAME.reset(token)
        return self._node_done(span, node, step, outcome, single)

    async def _arun_node(self, root, step: _Step, single: bool) -> tuple:
        node = self.compiled._builder._nodes[step.node]
        if step.done is not None:
            return self._replayed(root, step)
        if not node.is_async:
            return await _engine.run_on_thread_async(
                lambda: self._run_node(root, step, single),
                FRAME.get(),
                None,
                lambda: RuntimeError("unreachable"),
                "composeai-graph-node",
            )
        span = self._node_span(root, step)
        token = FRAME.set(Frame(self.run, step.scope, span, None, self.run.trace))
        try:
            outcome = self._outcome(step.node, await self._acall(node, step))
        except BaseException as exc:
            _engine.fail_span(self.run, span, exc)
            raise
        finally:
            FRAME.reset(token)
        return self._node_done(span, node, step, outcome, single)

    def _replayed(self, root, step: _Step) -> tuple:
        """The outcome of a node whose update was journaled: not run again."""
        run = self.run
        span = _engine.open_span(root, run.trace, "task", step.node)
        span.attributes.update(
            {
                "step": step.step,
                "node": step.node,
                "attempt": step.attempt,
                "step_key": step.scope,
            }
        )
        span.replayed = True
        record = json.loads(step.done)
        span.ended_at = span.started_at
        span.status = "ok"
        _engine.persist_span(run, span)
        kind = "goto" if record.get("g") is not None else "update"
        update = record.get("u")
        return (
            step.node,
            kind,
            None if update is None else json.dumps(update),
            record.get("g"),
            None,
            None,
        )

    def _node_span(self, root, step: _Step) -> Any:
        run = self.run
        attributes = {"step": step.step, "node": step.node, "attempt": step.attempt}
        lean = self.lean_spans
        if lean:
            span = Span(
                trace_id=run.trace_id,
                span_id=_core.ulid(),
                parent_span_id=root.span_id,
                kind="task",
                name=step.node,
                started_at=time.time(),
                attributes=attributes,
            )
            run.trace.spans.append(span)
        else:
            span = _engine.open_span(root, run.trace, "task", step.node)
            span.attributes = attributes
        return span

    def _node_done(self, span, node: _Node, step: _Step, outcome: tuple, single: bool) -> tuple:
        name, kind, update_json, targets, payload_json = outcome
        # A lone node's update is recorded by its step's checkpoint; in a
        # step of several, each finished update is journaled at once so that
        # a crash re-runs only the unfinished ones.
        if kind != "suspend" and not single:
            u = update_json if update_json is not None else "null"
            g = json.dumps(targets) if targets is not None else "null"
            self.attempt.commit_deferred(step.scope, f'{{"u":{u},"g":{g}}}', None, None)
        span.attributes["step_key"] = step.scope
        span.ended_at = time.time()
        span.status = "ok"
        if self.lean_spans:
            # The core queues the span with the step (output: the update
            # as encoded).
            node_span = (span.span_id, span.parent_span_id, span.started_at, span.ended_at)
            return (name, kind, update_json, targets, payload_json, node_span)
        output = None if update_json is None else _decode(update_json)
        _engine.close_span(self.run, span, output)
        return (name, kind, update_json, targets, payload_json, None)

    def _call(self, node: _Node, step: _Step) -> Any:
        try:
            if node.is_agent:
                from ._graph_agent import run_agent_node

                reducer = self.compiled._builder._reducers.get("messages", "replace")
                return run_agent_node(node.fn, dict(self.state), step.resume, reducer != "replace")
            if step.attempt > 1:
                _now(self._answer_asked(step))
            args = self._args(node, step)
            return _engine.call_body(node.fn, node.is_async, args, {})
        except _engine._Pause as pause:
            return _human_suspend(pause)
        except (BudgetExceededError, GraphError):
            raise
        except Exception as exc:
            raise _node_failed(step, exc) from exc

    async def _acall(self, node: _Node, step: _Step) -> Any:
        try:
            if step.attempt > 1:
                await _anow(self._answer_asked(step))
            return await node.fn(*self._args(node, step))
        except _engine._Pause as pause:
            return _human_suspend(pause)
        except (BudgetExceededError, GraphError):
            raise
        except Exception as exc:
            raise _node_failed(step, exc) from exc

    def _args(self, node: _Node, step: _Step) -> tuple:
        """A function node's arguments."""
        state = dict(self.state)
        if not node.takes_ctx:
            return (state,)
        ctx = NodeContext(
            run_id=self.run.run_id,
            step=step.step,
            node=step.node,
            attempt=step.attempt,
            resume=step.resume,
        )
        return (state, ctx)

    _asked: dict | None = None

    def _answer_asked(self, step: _Step):
        """Plan: a node resumed after `approve()` or `ask_human()` paused it
        finds its answer journaled before it runs again."""
        asked = self._asked
        if asked is None:
            asked = self._asked = {
                node: interrupt_id
                for node, payload in self.gr.pending()
                if (interrupt_id := _asked_id(_decode(payload))) is not None
            }
        interrupt_id = asked.get(step.node)
        if interrupt_id is not None:
            # First write wins, so a retry of the resumed node records nothing new.
            attempt = self.attempt
            answers = [(interrupt_id, _codec.dumps(step.resume))]
            yield _io(self.remote, attempt.record_answers, attempt.arecord_answers, answers)

    def _outcome(self, node: str, value: Any) -> tuple:
        if value is None:
            return (node, "update", None, None, None)
        if isinstance(value, _Suspend):
            try:
                payload_json = _codec.dumps(value.payload)
            except SerializationError as exc:
                raise SerializationError(f"node {node!r}: suspend payload: {exc}") from None
            update = None if value.update is None else _encode_update(node, value.update)
            return (node, "suspend", update, None, payload_json)
        if isinstance(value, _Goto):
            update = None if value.update is None else _encode_update(node, value.update)
            return (node, "goto", update, value.targets, None)
        return (node, "update", _encode_update(node, value), None, None)

    def _fail(self, root, exc: BaseException):
        """Plan: releases the thread and settles the run failed."""
        self.settled = True
        try:
            if self.thread_id is not None:
                gr = self.gr
                yield _io(self.remote, gr.release, gr.arelease, "failed")
        finally:
            yield from _settling(_engine._settle_error(self.run, root, exc))

    def _limit_error(self, status: str) -> GraphLimitError:
        gr = self.gr
        code = "step_limit_exceeded" if status == "step_limit" else "deadline_exceeded"
        what = "max_steps" if status == "step_limit" else "its deadline"
        return GraphLimitError(
            f"graph {self.compiled.name!r} reached {what} after {gr.steps} steps "
            f"(run {self.run.run_id}) -- its last checkpoint is kept; retry() continues it",
            code=code,
            details={"steps": gr.steps, "run_id": self.run.run_id},
        )

    def _settle(self, root, status: str):
        """Plan: writes the last checkpoint and settles the run in one
        transaction; returns the GraphResult."""
        gr = self.gr
        run = self.run
        steps = gr.steps
        thread_id = self.thread_id
        thread_json = None if thread_id is None else _codec.dumps(thread_id)
        # `{"steps", "status", "thread_id"?}` as the codec writes it.
        output_json = (
            f'{{"steps":{steps},"status":"{status}"'
            + ("" if thread_json is None else f',"thread_id":{thread_json}')
            + "}"
        )
        root.ended_at = time.time()
        root.status = "paused" if status == "suspended" else "ok"
        if self.lean_spans:
            attributes = root.attributes
            if not attributes:
                attributes_json = None
            elif thread_json is not None and attributes == {"thread_id": thread_id}:
                attributes_json = f'{{"thread_id":{thread_json}}}'
            else:
                attributes_json = _codec.dumps_lenient(attributes)
            self.attempt.span(
                (
                    root.span_id,
                    None,
                    "graph",
                    root.name,
                    root.started_at,
                    root.ended_at,
                    root.status,
                    False,
                    None,
                    attributes_json,
                    None,
                    None,
                    None,
                    output_json,
                )
            )
        else:
            _engine.persist_span(run, root, output_json)
        yield _io(self.remote, gr.commit, gr.acommit, output_json)
        self.settled = True
        _engine.emit_run_finished(root, "paused" if status == "suspended" else "completed")
        _engine._check_span_writes()
        interrupts = []
        snapshot = None
        if status == "suspended":
            interrupts = [GraphInterrupt(node, _decode(p)) for node, p in gr.pending()]
            snapshot = {
                "graph": self.compiled.name,
                "fingerprint": self.compiled.fingerprint,
                "run_id": run.run_id,
                "checkpoint_id": gr.head,
                "state": json.loads(gr.state_json()),
                "progress": json.loads(gr.progress_json()),
            }
        threaded = thread_id is not None
        return GraphResult(
            state=self.state,
            steps=steps,
            suspended=status == "suspended",
            interrupts=interrupts,
            run_id=run.run_id,
            snapshot=snapshot,
            checkpoint_id=(gr.head or "") if threaded else "",
            version=gr.version if threaded else 0,
        )


def _node_failed(step: _Step, exc: Exception) -> GraphError:
    return GraphError(
        f"node {step.node!r} failed: {type(exc).__name__}: {exc}",
        code="node_failed",
        details={"node": step.node, "step": step.step},
    )


def _human_suspend(pause: Any) -> _Suspend:
    """`approve()`/`ask_human()` without an answer suspends its node; the
    payload is the interrupt as a dict (FLOW-33's fields)."""
    frame = FRAME.get()
    if frame is not None and frame.run is not None:
        # A paused agent's state, as an agent node keeps it (AGENT-40).
        for snapshot in pause.snapshots:
            frame.run.attempt.save_agent_state(snapshot, frame.fence)
    payload = {
        "id": pause.interrupt_id,
        "kind": pause.kind,
        "question": pause.question,
        "payload": pause.payload,
    }
    return _Suspend(payload, None)


_ASKED_KEYS = frozenset(("id", "kind", "question", "payload"))


def _asked_id(payload: Any) -> str | None:
    """The interrupt id of a node suspended by `approve()`/`ask_human()`."""
    if (
        isinstance(payload, dict)
        and payload.keys() == _ASKED_KEYS
        and payload["kind"] in ("approval", "question")
        and isinstance(payload["id"], str)
    ):
        return payload["id"]
    return None


def _check_max_steps(max_steps: Any) -> int:
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be a positive int, got {max_steps!r}")
    return max_steps


def _deadline_at(deadline: Any) -> float | None:
    if deadline is None:
        return None
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or deadline <= 0:
        raise ValueError(f"deadline must be a positive number of seconds, got {deadline!r}")
    return time.time() + float(deadline)


def _input_json(input: Any) -> str:
    if input is None:
        return "{}"
    if type(input) is dict:
        plain = _plain_update_json(input)
        if plain is not None:
            return plain
    if not isinstance(input, Mapping):
        raise TypeError(f"graph input must be a dict of state values, got {type(input).__name__}")
    for key in input:
        if not isinstance(key, str):
            raise SerializationError(f"graph input: state key {key!r} is not a str")
    try:
        return _codec.dumps(dict(input))
    except SerializationError:
        for key, value in input.items():
            try:
                _codec.dumps(value)
            except SerializationError as exc:
                raise SerializationError(
                    f"graph input: state key {key!r} cannot be stored: {exc}"
                ) from None
        raise


def _args_json(input_json: str, thread_id: str | None) -> str:
    return f'{{"input":{input_json},"thread":{json.dumps(thread_id)}}}'


def _encode_values(values: Any) -> list[tuple[str, str]]:
    if not isinstance(values, Mapping):
        raise TypeError(
            f"resume values must be a dict of node name to value, got {type(values).__name__}"
        )
    out = []
    for node, value in values.items():
        try:
            out.append((str(node), _codec.dumps(value)))
        except SerializationError as exc:
            raise SerializationError(f"resume value for node {node!r}: {exc}") from None
    return out


_RESUMABLE = ("paused", "failed", "running")


class _Attempt:
    """A graph attempt ready to drive, synchronously or on the caller's
    loop, and what follows it (a thread's audit entry)."""

    __slots__ = ("after", "budget", "driver")

    def __init__(self, driver: _Driver, budget: Any, after: Callable[[], Any] | None = None):
        self.driver = driver
        self.budget = budget
        # Makes the plan of what follows the run.
        self.after = after

    def drive(self) -> GraphResult:
        try:
            return self.driver.drive(self.budget)
        finally:
            if self.after is not None:
                _now(self.after())

    async def adrive(self) -> GraphResult:
        try:
            return await self.driver.adrive(self.budget)
        finally:
            if self.after is not None:
                await _anow(self.after())


class CompiledGraph:
    """A checked graph, ready to run (EXT-27)."""

    def __init__(self, builder: Graph, native: Any, storage: Storage, audit: bool):
        self._builder = builder
        self._native = native
        self._storage = storage
        self._audit = audit
        self._routers = {s: r for s, r, _ in builder._routes}
        self.name: str = native.name
        self.fingerprint: str = native.fingerprint

    def __repr__(self) -> str:
        return f"<CompiledGraph {self.name!r}>"

    def _store(self):
        return self._storage.store()

    def _budget(self, budget: Any, attempt: Any) -> Any:
        if budget is not None:
            return budget
        if attempt.budget_json:
            return _engine.budget_from_json(attempt.budget_json)
        return None

    def _start(
        self, input_json: str, thread_id: str | None, budget: Any, run_id: str | None = None
    ):
        """Plan: creates the run; returns its attempt."""
        store = self._store()
        return (
            yield _io(
                _remote(store),
                store.start_run,
                store.astart_run,
                "graph",
                self.name,
                self.fingerprint,
                _args_json(input_json, thread_id),
                _engine.budget_json(budget),
                run_id,
            )
        )

    def run(
        self,
        input: Mapping[str, Any] | None = None,
        *,
        max_steps: int = 64,
        deadline: float | None = None,
        budget: Any = None,
    ) -> GraphResult:
        """Runs once from the start node with `input` as the state (EXT-27)."""
        _engine.check_sync_facade()
        return _now(self._begin_run(input, max_steps, deadline, budget)).drive()

    async def arun(
        self,
        input: Mapping[str, Any] | None = None,
        *,
        max_steps: int = 64,
        deadline: float | None = None,
        budget: Any = None,
    ) -> GraphResult:
        """Async twin of `run`, on the caller's loop: async nodes are awaited
        there, sync nodes run on threads of their own."""
        await self._storage.aopen()
        begun = await _anow(self._begin_run(input, max_steps, deadline, budget))
        return await begun.adrive()

    def _begin_run(self, input: Any, max_steps: Any, deadline: Any, budget: Any):
        """Plan: the new run's `_Attempt`."""
        max_steps = _check_max_steps(max_steps)
        until = _deadline_at(deadline)
        input_json = _input_json(input)
        attempt = yield from self._start(input_json, None, budget)
        gr = yield from self._open(attempt, None, input_json, True, max_steps, until)
        return _Attempt(_Driver(self, attempt, gr, None), budget)

    def _open(self, attempt, thread_id, input_json, fresh, max_steps, until):
        """Plan: opens the graph run at its head; a run that cannot be
        opened is settled failed."""
        remote = attempt.remote
        try:
            return (
                yield _io(
                    remote,
                    _core.graph_open,
                    _core.graph_aopen,
                    self._native,
                    attempt,
                    thread_id,
                    input_json,
                    fresh,
                    max_steps,
                    until,
                )
            )
        except BaseException as exc:
            yield _io(
                remote, attempt.settle, attempt.asettle, "failed", None, _engine.error_json(exc)
            )
            raise

    def resume(
        self,
        snapshot: Mapping[str, Any],
        values: Mapping[str, Any],
        *,
        max_steps: int = 64,
        deadline: float | None = None,
        budget: Any = None,
    ) -> GraphResult:
        """Continues a thread-less suspended run from its snapshot: each
        suspended node runs again with `ctx.resume == values[node]` (EXT-29)."""
        _engine.check_sync_facade()
        return _now(self._begin_resume(snapshot, values, max_steps, deadline, budget)).drive()

    async def aresume(
        self,
        snapshot: Mapping[str, Any],
        values: Mapping[str, Any],
        *,
        max_steps: int = 64,
        deadline: float | None = None,
        budget: Any = None,
    ) -> GraphResult:
        """Async twin of `resume`, on the caller's loop."""
        await self._storage.aopen()
        begun = await _anow(self._begin_resume(snapshot, values, max_steps, deadline, budget))
        return await begun.adrive()

    def _begin_resume(self, snapshot: Any, values: Any, max_steps: Any, deadline: Any, budget: Any):
        """Plan: the `_Attempt` continuing a snapshot."""
        max_steps = _check_max_steps(max_steps)
        until = _deadline_at(deadline)
        if (
            not isinstance(snapshot, Mapping)
            or "progress" not in snapshot
            or "state" not in snapshot
        ):
            raise GraphValidationError(
                "resume() takes the snapshot of a suspended GraphResult (result.snapshot)",
                code="resume_invalid",
            )
        if snapshot.get("fingerprint") != self.fingerprint or snapshot.get("graph") != self.name:
            raise GraphValidationError(
                f"the snapshot was made by graph {snapshot.get('graph')!r} with another structure, "
                f"not by graph {self.name!r}",
                code="workflow_mismatch",
                details={"graph": snapshot.get("graph"), "expected": self.name},
            )
        progress_json = json.dumps(snapshot["progress"])
        encoded = _encode_values(values)
        _core.graph_check_resume(progress_json, [n for n, _ in encoded])
        store = self._store()
        remote = _remote(store)
        run_id = snapshot.get("run_id")
        row = None
        if isinstance(run_id, str):
            row = yield _io(remote, store.get_run, store.aget_run, run_id)
        same = row is not None and row["kind"] == "graph" and row["status"] in _RESUMABLE
        if same:
            head = yield _io(remote, _core.graph_run_head, _core.graph_arun_head, store, run_id)
            same = head == snapshot.get("checkpoint_id")
        if same:
            attempt = yield _io(remote, store.resume, store.aresume, run_id)
            gr = yield from self._open(attempt, None, None, False, max_steps, until)
        else:
            attempt = yield from self._start("{}", None, budget)
            gr = _core.graph_from_snapshot(
                self._native,
                attempt,
                json.dumps(snapshot["state"]),
                progress_json,
                max_steps,
                until,
            )
        remote = attempt.remote
        try:
            yield _io(remote, gr.answer, gr.aanswer, encoded)
            if budget is not None:
                budget_json = _engine.budget_json(budget)
                yield _io(remote, attempt.set_budget, attempt.aset_budget, budget_json)
        except BaseException:
            yield _io(remote, attempt.settle, attempt.asettle, "paused", None, None)
            raise
        return _Attempt(_Driver(self, attempt, gr, None), self._budget(budget, attempt))

    def thread(self, thread_id: str, actor: str | None = None) -> GraphThread:
        """A durable run history in the graph's storage; lazy (EXT-30)."""
        if not isinstance(thread_id, str) or not thread_id:
            raise ValueError(f"thread_id must be a non-empty str, got {thread_id!r}")
        return GraphThread(self, thread_id, actor)

    def _continue_run(self, row: dict, answers: Mapping[str, Any] | None, budget: Any):
        """Plan: `compose.resume(run_id, answers=...)` of one of this graph's runs:
        answers are keyed by node (`node:<name>` or the bare name) or by the
        id a node's `approve()`/`ask_human()` paused on."""
        if row["fingerprint"] != self.fingerprint:
            raise GraphError(
                f"run {row['run_id']!r} was made by graph {self.name!r} with another structure",
                code="workflow_mismatch",
                details={"run_id": row["run_id"], "graph": self.name},
            )
        args = _codec.loads(row["args_json"]) if row["args_json"] else {}
        values = yield from self._answer_values(row["run_id"], answers)
        thread_id = args.get("thread")
        if thread_id is not None:
            thread = self.thread(thread_id)
            if values:
                return (yield from thread._begin_continue("resume", values, 64, None, budget))
            return (yield from thread._begin_continue("retry", None, 64, None, budget))
        if row["status"] == "completed":
            raise ConfigError(f"graph run {row['run_id']!r} already completed")
        store = self._store()
        attempt = yield _io(_remote(store), store.resume, store.aresume, row["run_id"])
        input_json = json.dumps(args.get("input", {}))
        gr = yield from self._open(attempt, None, input_json, False, 64, None)
        remote = attempt.remote
        try:
            if values:
                yield _io(remote, gr.answer, gr.aanswer, _encode_values(values))
            if budget is not None:
                budget_json = _engine.budget_json(budget)
                yield _io(remote, attempt.set_budget, attempt.aset_budget, budget_json)
        except BaseException:
            status = row["status"] if row["status"] != "running" else "failed"
            yield _io(remote, attempt.settle, attempt.asettle, status, None, None)
            raise
        return _Attempt(_Driver(self, attempt, gr, None), self._budget(budget, attempt))

    def _answer_values(self, run_id: str, answers: Mapping[str, Any] | None):
        """Plan: `compose.resume()` answers as resume values by node name."""
        store = self._store()
        pending = yield _io(_remote(store), store.pending, store.apending, run_id)
        asked = {}
        for interrupt_id, _, _, payload_json in pending:
            if interrupt_id.startswith("node:") and payload_json is not None:
                ask = _asked_id(_decode(payload_json))
                if ask is not None:
                    asked[ask] = interrupt_id[len("node:") :]
        values = {}
        for key, value in (answers or {}).items():
            if isinstance(key, str) and key.startswith("node:"):
                node = key[len("node:") :]
            elif key in asked and key not in self._builder._nodes:
                node = asked[key]
            else:
                node = key
            values[node] = value
        return values


async def _off_loop(call: Callable[[], Any]) -> Any:
    """Awaits a sync graph call run on a thread of its own (ASYNC-7)."""
    # Outside a flow there is no frame and the thread runs with none.
    return await _engine.run_on_thread_async(
        call,
        FRAME.get(),
        None,
        lambda: RuntimeError("unreachable"),
        "composeai-graph",
    )


def _compiled_for(row: dict) -> CompiledGraph:
    compiled = _GRAPHS.get(row["name"])
    if compiled is None:
        raise ConfigError(
            f"graph {row['name']!r} is not compiled in this process -- import the module that "
            "builds it (so its compile() runs) before calling resume()"
        )
    return compiled


def resume_graph_run(row: dict, answers: Mapping[str, Any] | None, budget: Any) -> Run:
    """`compose.resume()` of a graph run: routed to its graph by name."""
    result = _now(_compiled_for(row)._continue_run(row, answers, budget)).drive()
    return _as_run(row, result)


async def aresume_graph_run(row: dict, answers: Mapping[str, Any] | None, budget: Any) -> Run:
    """`compose.aresume()` of a graph run, on the caller's loop."""
    compiled = _compiled_for(row)
    await compiled._storage.aopen()
    begun = await _anow(compiled._continue_run(row, answers, budget))
    return _as_run(row, await begun.adrive())


def _as_run(row: dict, result: GraphResult) -> Run:
    """`compose.resume()` returns a `Run` for every run kind (FLOW-40), so code
    answering paused runs need not know their kind; `GraphResult` stays the
    answer of `CompiledGraph.resume()` and threads."""
    from .runs import Run
    from .tracing import Trace

    trace = Trace(trace_id=row["trace_id"] or "")
    if result.suspended:
        first = result.interrupts[0]
        return Run(
            id=result.run_id,
            status="paused",
            output=None,
            trace=trace,
            pending=pending_interrupt(first.node, first.payload),
        )
    return Run(id=result.run_id, status="completed", output=result.state, trace=trace)


def pending_interrupt(node: str, payload: Any) -> Interrupt:
    """A suspended node as an `Interrupt` (EXT-29): id `node:<name>`; a node
    paused by `approve()`/`ask_human()` keeps that kind, question and payload."""
    from .hitl import Interrupt

    if _asked_id(payload) is not None:
        return Interrupt(
            id=f"node:{node}",
            kind=payload["kind"],
            question=payload["question"],
            payload=payload["payload"],
        )
    return Interrupt(id=f"node:{node}", kind="question", payload=payload)


def find_run(run_id: str):
    """Plan: a run in the store of a compiled graph's storage (not the default
    store), as `(store, row)`, or None."""
    for compiled in list(_GRAPHS.values()):
        if compiled._storage.url is None:
            continue
        store = yield from compiled._storage._open_io()
        row = yield _io(_remote(store), store.get_run, store.aget_run, run_id)
        if row is not None:
            return store, row
    return None


# ---------------------------------------------------------------------------
# Threads (EXT-30 … EXT-32)


class GraphThread:
    """One durable run history of a graph, kept in its storage."""

    def __init__(self, graph: CompiledGraph, thread_id: str, actor: str | None):
        self.graph = graph
        self.thread_id = thread_id
        self.actor = actor

    def __repr__(self) -> str:
        return f"<GraphThread {self.thread_id!r} of {self.graph.name!r}>"

    def _store(self):
        return self.graph._store()

    def _audit(self, action: str, checkpoint_id: str | None = None, store: Any = None) -> None:
        _now(self._audit_io(action, checkpoint_id, store))

    def _audit_io(self, action: str, checkpoint_id: str | None = None, store: Any = None):
        """Plan: appends to the audit trail (EXT-32) for an operation that
        acts on the thread: run, resume, retry, rewind, fork (and the forked
        thread's start) and delete. Reads (state, interrupts, history,
        audit) act on nothing and are not recorded."""
        if self.graph._audit:
            store = store or self._store()
            if checkpoint_id is None:
                info = yield from self._info_io(store)
                checkpoint_id = info["head"] if info else None
            yield _io(
                _remote(store),
                _core.thread_audit_add,
                _core.thread_aaudit_add,
                store,
                self.thread_id,
                self.actor,
                action,
                checkpoint_id,
            )

    def _info(self, store: Any) -> dict | None:
        return _now(self._info_io(store))

    def _info_io(self, store: Any):
        """Plan: the thread's row, refused when another graph made it."""
        info = json.loads(
            (
                yield _io(
                    _remote(store), _core.thread_info, _core.thread_ainfo, store, self.thread_id
                )
            )
        )
        if info is not None and (
            info["graph"] != self.graph.name or info["fingerprint"] != self.graph.fingerprint
        ):
            raise GraphError(
                f"thread {self.thread_id!r} cannot be used by graph {self.graph.name!r}: it was "
                f"made by graph {info['graph']!r}"
                + (" with another structure" if info["graph"] == self.graph.name else ""),
                code="workflow_mismatch",
                details={
                    "thread_id": self.thread_id,
                    "graph": info["graph"],
                    "expected": self.graph.name,
                },
            )
        return info

    def _claim(self, store, mode: Literal["run", "resume", "retry"], run_id: str | None):
        """Plan: claims the thread; returns its row before the claim."""
        g = self.graph
        wait = g._storage.on_busy == "wait"
        delay = 0.005
        while True:
            try:
                before = yield _io(
                    _remote(store),
                    _core.thread_claim,
                    _core.thread_aclaim,
                    store,
                    self.thread_id,
                    g.name,
                    g.fingerprint,
                    mode,
                    run_id,
                )
                return json.loads(before)
            except ThreadBusyError:
                if not wait:
                    raise
                yield _pause(delay)
                delay = min(delay * 2, 0.2)

    def _start(self, store, input_json: str, budget: Any, max_steps: int, until: float | None):
        """Plan: claims the thread, creates its new run and opens it, in the
        core: `(attempt, graph run)`."""
        g = self.graph
        wait = g._storage.on_busy == "wait"
        delay = 0.005
        while True:
            try:
                return (
                    yield _io(
                        _remote(store),
                        _core.thread_start,
                        _core.thread_astart,
                        store,
                        g._native,
                        self.thread_id,
                        _args_json(input_json, self.thread_id),
                        _engine.budget_json(budget),
                        _core.ulid(),
                        input_json,
                        max_steps,
                        until,
                    )
                )
            except ThreadBusyError:
                if not wait:
                    raise
                yield _pause(delay)
                delay = min(delay * 2, 0.2)

    def run(
        self,
        input: Mapping[str, Any] | None = None,
        *,
        max_steps: int = 64,
        deadline: float | None = None,
        budget: Any = None,
    ) -> GraphResult:
        """Runs from the start node on the stored state, `input` keys
        replacing stored ones (EXT-30)."""
        _engine.check_sync_facade()
        return _now(self._begin_run(input, max_steps, deadline, budget)).drive()

    async def arun(
        self,
        input: Mapping[str, Any] | None = None,
        *,
        max_steps: int = 64,
        deadline: float | None = None,
        budget: Any = None,
    ) -> GraphResult:
        """Async twin of `run`, on the caller's loop."""
        await self.graph._storage.aopen()
        begun = await _anow(self._begin_run(input, max_steps, deadline, budget))
        return await begun.adrive()

    def _begin_run(self, input: Any, max_steps: Any, deadline: Any, budget: Any):
        """Plan: the `_Attempt` of the thread's new run."""
        g = self.graph
        max_steps = _check_max_steps(max_steps)
        until = _deadline_at(deadline)
        input_json = _input_json(input)
        store = self._store()
        attempt, gr = yield from self._start(store, input_json, budget, max_steps, until)
        return _Attempt(
            _Driver(g, attempt, gr, self.thread_id),
            budget,
            lambda: self._audit_io("run", store=store),
        )

    def _begin_continue(
        self,
        mode: Literal["resume", "retry"],
        values: Mapping[str, Any] | None,
        max_steps: int,
        deadline: Any,
        budget: Any,
    ):
        """Plan: the `_Attempt` continuing the thread's run (`resume` with
        answers, or `retry`)."""
        g = self.graph
        max_steps = _check_max_steps(max_steps)
        until = _deadline_at(deadline)
        store = self._store()
        remote = _remote(store)
        encoded = None
        info = yield from self._info_io(store)
        if mode == "resume":
            encoded = _encode_values(values)
            names = [n for n, _ in encoded]
            yield _io(
                remote,
                _core.thread_check_resume,
                _core.thread_acheck_resume,
                store,
                self.thread_id,
                names,
            )
        row = None
        if info and info.get("run_id"):
            row = yield _io(remote, store.get_run, store.aget_run, info["run_id"])
        reused = row if row is not None and row["status"] in _RESUMABLE else None
        new_run_id = None if reused is not None else _core.ulid()
        before = yield from self._claim(store, mode, new_run_id)
        prior = "failed" if before["status"] in ("running", "interrupted") else before["status"]
        try:
            input_json = "{}"
            if reused is not None:
                attempt = yield _io(remote, store.resume, store.aresume, reused["run_id"])
                args = _codec.loads(attempt.args_json) if attempt.args_json else {}
                input_json = json.dumps(args.get("input", {}))
            else:
                attempt = yield from g._start("{}", self.thread_id, budget, new_run_id)
            gr = yield from g._open(attempt, self.thread_id, input_json, False, max_steps, until)
            if encoded is not None:
                yield _io(remote, gr.answer, gr.aanswer, encoded)
            if budget is not None:
                budget_json = _engine.budget_json(budget)
                yield _io(remote, attempt.set_budget, attempt.aset_budget, budget_json)
        except BaseException:
            yield _io(
                remote, _core.thread_release, _core.thread_arelease, store, self.thread_id, prior
            )
            raise
        return _Attempt(
            _Driver(g, attempt, gr, self.thread_id),
            g._budget(budget, attempt),
            lambda: self._audit_io(mode, store=store),
        )

    def resume(
        self,
        values: Mapping[str, Any],
        *,
        max_steps: int = 64,
        deadline: float | None = None,
        budget: Any = None,
    ) -> GraphResult:
        """Answers the suspended nodes and continues the run (EXT-30)."""
        _engine.check_sync_facade()
        return _now(self._begin_continue("resume", values, max_steps, deadline, budget)).drive()

    def retry(
        self, *, max_steps: int = 64, deadline: float | None = None, budget: Any = None
    ) -> GraphResult:
        """Continues a failed or interrupted run from its last checkpoint;
        saved nodes do not run again (EXT-30)."""
        _engine.check_sync_facade()
        return _now(self._begin_continue("retry", None, max_steps, deadline, budget)).drive()

    def state(self) -> dict:
        """The thread's current state (empty for a new thread)."""
        store = self._store()
        self._info(store)
        found = _core.thread_state(store, self.thread_id)
        return {} if found is None else _decode(found[0])

    def interrupts(self) -> list[GraphInterrupt]:
        """What the suspended nodes asked (empty unless suspended)."""
        store = self._store()
        info = self._info(store)
        if info is None or info["status"] != "suspended":
            return []
        found = _core.thread_state(store, self.thread_id)
        if found is None:
            return []
        progress = json.loads(found[1])
        return [GraphInterrupt(p["node"], _codec.decode(p["payload"])) for p in progress["pending"]]

    def history(self, limit: int = 20) -> list[dict]:
        """The thread's checkpoints, newest first."""
        store = self._store()
        self._info(store)
        return json.loads(_core.thread_history(store, self.thread_id, int(limit)))

    def rewind(self, checkpoint_id: str) -> dict:
        """Copies a checkpoint as the new head (history kept)."""
        g = self.graph
        store = self._store()
        entry = json.loads(
            _core.thread_rewind(store, self.thread_id, g.name, g.fingerprint, checkpoint_id)
        )
        self._audit("rewind", entry["id"], store)
        return entry

    def fork(self, checkpoint_id: str, new_thread_id: str) -> GraphThread:
        """Starts a new thread from a checkpoint of this one."""
        g = self.graph
        if not isinstance(new_thread_id, str) or not new_thread_id:
            raise ValueError(f"new_thread_id must be a non-empty str, got {new_thread_id!r}")
        store = self._store()
        entry = json.loads(
            _core.thread_fork(
                store, self.thread_id, g.name, g.fingerprint, checkpoint_id, new_thread_id
            )
        )
        self._audit("fork", entry["id"], store)
        forked = GraphThread(g, new_thread_id, self.actor)
        forked._audit("forked", entry["id"], store)
        return forked

    def delete(self) -> bool:
        """Deletes the thread and its checkpoints; True if it existed."""
        g = self.graph
        store = self._store()
        existed = _core.thread_delete(store, self.thread_id, g.name, g.fingerprint)
        if existed:
            self._audit("delete", "", store)
        return existed

    def audit(self, limit: int = 50) -> list[dict]:
        """The audit trail of this thread, newest first (EXT-32)."""
        return json.loads(_core.thread_audit(self._store(), self.thread_id, int(limit)))

    async def aresume(
        self,
        values: Mapping[str, Any],
        *,
        max_steps: int = 64,
        deadline: float | None = None,
        budget: Any = None,
    ) -> GraphResult:
        """Async twin of `resume`, on the caller's loop."""
        await self.graph._storage.aopen()
        begun = await _anow(self._begin_continue("resume", values, max_steps, deadline, budget))
        return await begun.adrive()

    async def aretry(
        self, *, max_steps: int = 64, deadline: float | None = None, budget: Any = None
    ) -> GraphResult:
        """Async twin of `retry`, on the caller's loop."""
        await self.graph._storage.aopen()
        begun = await _anow(self._begin_continue("retry", None, max_steps, deadline, budget))
        return await begun.adrive()

    async def astate(self) -> dict:
        return await _off_loop(self.state)

    async def ainterrupts(self) -> list[GraphInterrupt]:
        return await _off_loop(self.interrupts)

    async def ahistory(self, limit: int = 20) -> list[dict]:
        return await _off_loop(lambda: self.history(limit))

    async def arewind(self, checkpoint_id: str) -> dict:
        return await _off_loop(lambda: self.rewind(checkpoint_id))

    async def afork(self, checkpoint_id: str, new_thread_id: str) -> GraphThread:
        return await _off_loop(lambda: self.fork(checkpoint_id, new_thread_id))

    async def adelete(self) -> bool:
        return await _off_loop(self.delete)

    async def aaudit(self, limit: int = 50) -> list[dict]:
        return await _off_loop(lambda: self.audit(limit))
