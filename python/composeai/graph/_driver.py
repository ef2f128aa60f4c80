"""Running a graph: one attempt's steps, each node called (concurrently, on
the same thread machinery as `map`) under its own span and journal scope,
the updates encoded for the core, which merges them and writes the step.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from .. import _codec, _core, _drive, _engine
from .. import events as _events
from .._engine import FRAME, Frame
from .._lifecycle import _asked_id
from ..errors import BudgetExceededError, SerializationError
from ..tracing import Span
from ._agents import run_agent_node
from ._nodes import _Node
from ._storage import _anow, _io, _now
from ._values import (
    GraphError,
    GraphInterrupt,
    GraphLimitError,
    GraphResult,
    NodeContext,
    _Goto,
    _Suspend,
)

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

    def __init__(self, compiled: Any, attempt: Any, gr: Any, thread_id: str | None):
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
            from .. import _runtime

            return _runtime.run_here(lambda: self._arun_step(root, ready), _engine.ASYNC_DRIVER)
        results: list[Any] = [None] * count
        failures: list[BaseException | None] = [None] * count

        def run_item(index: int) -> None:
            try:
                results[index] = self._run_node(root, ready[index], False)
            except BaseException as exc:  # noqa: BLE001 -- raised in node order below
                failures[index] = exc

        from ..combinators import _Fanout

        _Fanout(count, count, run_item).run()
        self.attempt.sync()
        for failure in failures:
            if failure is not None:
                raise failure
        return results

    async def _arun_step(self, root, ready: list[_Step]) -> list:
        """Runs a step's nodes on the running loop: async nodes awaited there
        (concurrently when several are ready), sync and agent nodes
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
            yield from _settling(_drive._settle_error(self.run, root, exc))

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
    payload is the interrupt as a dict (the fields of `Interrupt`)."""
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
