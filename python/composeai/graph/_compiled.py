"""`CompiledGraph`: runs, resumes and snapshots of a checked graph,
and `GraphThread`, one durable history of it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Literal

from .. import _codec, _core, _engine
from .._engine import FRAME
from .._lifecycle import (
    OWNERS,
    REGISTRIES,
    GraphRuns,
    _asked_id,
    graph_not_compiled,
    pending_interrupt,
)
from .._values import Run
from ..errors import ConfigError
from ..tracing import Trace
from ._driver import (
    _args_json,
    _check_max_steps,
    _deadline_at,
    _decode,
    _Driver,
    _encode_values,
    _input_json,
    _pause,
)
from ._storage import Storage, _anow, _io, _now, _remote
from ._values import GraphError, GraphInterrupt, GraphResult, GraphValidationError, ThreadBusyError

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


_GRAPHS: dict[str, CompiledGraph] = {}


def reset_registry() -> None:
    """Forgets every compiled graph name (`flow.reset_registries` does too)."""
    _GRAPHS.clear()


class CompiledGraph:
    """A checked graph, ready to run."""

    def __init__(self, builder: Any, native: Any, storage: Storage, audit: bool):
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
        """Runs once from the start node with `input` as the state."""
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
        suspended node runs again with `ctx.resume == values[node]`.

        A node already answered from outside the run for this suspension
        (`compose answer`, the web UI) resumes with that answer, which wins
        over `values` (first write wins) and may be left out of them."""
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

        def check(names: list[str]):
            _core.graph_check_resume(progress_json, names)
            yield from ()

        yield from _check_answers(check, [n for n, _ in encoded], store, run_id if same else None)
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
        """A durable run history in the graph's storage; lazy."""
        if not isinstance(thread_id, str) or not thread_id:
            raise ValueError(f"thread_id must be a non-empty str, got {thread_id!r}")
        return GraphThread(self, thread_id, actor)

    def _continue_run(self, row: dict, answers: Mapping[str, Any] | None, budget: Any):
        """Plan: `compose.resume(run_id, answers=...)` of one of this graph's runs:
        answers are keyed by node (`node:<name>` or the bare name) or by the
        id a node's `approve()`/`ask_human()` paused on. Nodes answered from
        outside the run (`compose answer`) for the suspension it resumes
        take those answers instead, read inside the claim (first write
        wins), so with no `answers` a run answered from outside goes on
        with them, as a worker would continue it."""
        if row["fingerprint"] != self.fingerprint:
            raise GraphError(
                f"run {row['run_id']!r} was made by graph {self.name!r} with another structure",
                code="workflow_mismatch",
                details={"run_id": row["run_id"], "graph": self.name},
            )
        args = _codec.loads(row["args_json"]) if row["args_json"] else {}
        values = yield from self._answer_values(row["run_id"], answers)
        store = self._store()
        thread_id = args.get("thread")
        if thread_id is not None:
            thread = self.thread(thread_id)
            if values or (yield from _answered_outside(store, row["run_id"])):
                return (yield from thread._begin_continue("resume", values, 64, None, budget))
            return (yield from thread._begin_continue("retry", None, 64, None, budget))
        if row["status"] == "completed":
            raise ConfigError(f"graph run {row['run_id']!r} already completed")
        attempt = yield _io(_remote(store), store.resume, store.aresume, row["run_id"])
        input_json = json.dumps(args.get("input", {}))
        gr = yield from self._open(attempt, None, input_json, False, 64, None)
        remote = attempt.remote
        try:
            if values or gr.answered_outside():
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


def _answered_outside(store: Any, run_id: str):
    """Plan: the suspended nodes of graph run `run_id` answered from outside
    (`compose answer`, the web UI) for the suspension it is paused at."""
    return (
        yield _io(
            _remote(store), _core.graph_answered_nodes, _core.graph_aanswered_nodes, store, run_id
        )
    )


def _check_answers(check: Callable[[list[str]], Any], names: list[str], store: Any, run_id: Any):
    """Plan: `check(names)`, the plan refusing resume values that do not name
    exactly the suspended nodes, before anything is claimed. When `names`
    fall short, the nodes answered from outside run `run_id` (if given) for
    its suspension count too: the run's answer takes theirs inside the claim
    (`GraphRun.answer`), and until the claim more can only be added."""
    try:
        yield from check(names)
    except GraphValidationError as exc:
        if exc.code != "resume_invalid" or run_id is None:
            raise
        outside = yield from _answered_outside(store, run_id)
        if not outside:
            raise
        yield from check(sorted({*names, *outside}))


async def _off_loop(call: Callable[[], Any]) -> Any:
    """Awaits a sync graph call run on a thread of its own."""
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
        raise ConfigError(graph_not_compiled(row["name"]))
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
    """`compose.resume()` returns a `Run` for every run kind, so code
    answering paused runs need not know their kind; `GraphResult` stays the
    answer of `CompiledGraph.resume()` and threads."""
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


# `compose.resume()` of a graph run, and of a run in a graph's own storage.
OWNERS["graph"] = GraphRuns(
    resume_graph_run, aresume_graph_run, find_run, lambda name: name in _GRAPHS
)
REGISTRIES.append(_GRAPHS)


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
        """Plan: appends to the audit trail for an operation that
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
        replacing stored ones."""
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

            def check(names: list[str]):
                yield _io(
                    remote,
                    _core.thread_check_resume,
                    _core.thread_acheck_resume,
                    store,
                    self.thread_id,
                    names,
                )

            run_id = info.get("run_id") if info else None
            yield from _check_answers(check, [n for n, _ in encoded], store, run_id)
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
        """Answers the suspended nodes and continues the run. A node
        already answered from outside the run for this suspension (`compose
        answer`, the web UI) resumes with that answer, which wins over
        `values` (first write wins) and may be left out of them."""
        _engine.check_sync_facade()
        return _now(self._begin_continue("resume", values, max_steps, deadline, budget)).drive()

    def retry(
        self, *, max_steps: int = 64, deadline: float | None = None, budget: Any = None
    ) -> GraphResult:
        """Continues a failed or interrupted run from its last checkpoint;
        saved nodes do not run again."""
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
        """The audit trail of this thread, newest first."""
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
