"""The life of a durable run outside its body, shared by flows, durable
waits, queues, agents, graphs and the worker: `resume()`,
continuing a due run, run handles and background starts, signals
and cancel requests.

Run kinds other than `flow` belong to features above this module: the agent
and graph modules register what resumes their runs in `OWNERS` when they are
imported, and `composeai.queues` how a queued start is made. A run of a kind
whose feature was never imported has no definition in this process either,
so the error is the one that feature would raise.
"""

from __future__ import annotations

import time

from . import _codec, _core, _drive, _engine
from ._values import Run
from .errors import ConfigError, ResumeMismatchError, SerializationError
from .tracing import Trace

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._interrupt import Interrupt

# `@flow`s by name; `composeai.flow` fills it.
_FLOWS: dict[str, Any] = {}


def flow_versions() -> list[tuple[str, str]]:
    """`(name, fingerprint)` of every `@flow` registered in this process: the
    code versions whose runs it continues."""
    return [(name, flow_obj.fingerprint) for name, flow_obj in _FLOWS.items()]


class GraphRuns:
    """What `composeai.graph` registers for graph runs: how one resumes,
    sync and async, how a run kept in a graph's own storage is found, and
    whether a graph of a name is compiled in this process."""

    __slots__ = ("aresume", "compiled", "find_run", "resume")

    def __init__(self, resume: Any, aresume: Any, find_run: Any, compiled: Any) -> None:
        self.resume = resume
        self.aresume = aresume
        self.find_run = find_run
        self.compiled = compiled


# What the features above register when imported: "agent" (the function
# resuming a standalone agent run), "graph" (`GraphRuns`), "queue" (the
# function making a queued start).
OWNERS: dict[str, Any] = {}

# The name registries of features above (compiled graphs, declared queues),
# cleared with the flows' by `flow.reset_registries` (TEST-50).
REGISTRIES: list[dict] = []


def completed_run(row: dict) -> Run[Any]:
    """The `Run` of a completed run's row."""
    output_json = row["output_json"]
    return Run(
        id=row["run_id"],
        status="completed",
        output=_codec.loads(output_json) if output_json is not None else None,
        usage=None,
        trace=Trace(trace_id=row["trace_id"] or ""),
        messages=[],
        pending=None,
    )


def agent_not_registered(name: str, module: str | None = None) -> ConfigError:
    return _engine.not_registered("agent", name, module, "calling resume()")


def graph_answer_key(interrupt_id: str, head: str) -> str:
    """The journal key (after `__interrupt__:`) of an answer to graph
    interrupt `node:<name>` given from outside a run, as the core writes it:
    the id repeats each time the node suspends, so the key names the
    checkpoint `head` the run is paused at (its thread's head for a run kept
    in a thread), and an answer reaches only the suspension it was given for."""
    return f"{interrupt_id}@{head}"


def journaled_graph_answers(store: Any, run_id: str) -> dict[str, Any]:
    """The answers journaled from outside for the suspension graph run
    `run_id` is paused at, by interrupt id (`node:<name>`)."""
    head = _core.graph_suspension_head(store, run_id)
    if head is None:
        return {}
    prefix, suffix = "__interrupt__:node:", f"@{head}"
    return {
        key[len("__interrupt__:") : -len(suffix)]: _codec.loads(value)
        for key, value in store.journal(run_id)
        if key.startswith(prefix) and key.endswith(suffix)
    }


def graph_not_compiled(name: str) -> str:
    return (
        f"graph {name!r} is not compiled in this process -- import the module that "
        "builds it (so its compile() runs) before calling resume()"
    )


def queue_not_declared(name: str) -> str:
    return (
        f"queue {name!r} is not declared in this process -- declare it with "
        f"composeai.Queue({name!r}, ...) before starting runs on it"
    )


def _resume_agent_run(
    row: dict, answers, budget, approver, tool_interceptor, context_manager, asynchronous: bool
):
    """A standalone agent run, continued by `composeai.agentfn`
    (registered once any `@agent` exists in this process)."""
    resume_standalone = OWNERS.get("agent")
    if resume_standalone is None:
        if row["status"] == "completed":
            return completed_run(row)
        raise agent_not_registered(row["name"], row.get("module"))
    return resume_standalone(
        row, answers, budget, approver, tool_interceptor, context_manager, asynchronous
    )


def _graph_owner(row: dict) -> Any:
    graph = OWNERS.get("graph")
    if graph is None:
        raise ConfigError(graph_not_compiled(row["name"]))
    return graph


def start_queued(
    flow_obj: Any,
    args: tuple,
    kwargs: dict,
    budget: Any,
    queue: Any,
    priority: Any,
    dedup_id: Any,
    run_id: Any = None,
):
    """`Flow.start(queue=…)`, made by `composeai.queues`: until it is
    imported no `Queue` exists, so `queue` can only name an undeclared one."""
    start = OWNERS.get("queue")
    if start is None:
        if isinstance(queue, str):
            raise ConfigError(queue_not_declared(queue))
        raise TypeError(f"queue must be a Queue or a queue name, got {type(queue).__name__}")
    return start(flow_obj, args, kwargs, budget, queue, priority, dedup_id, run_id)


_CALLBACKS_ON_FLOW = (
    "approver=, context_manager= and tool_interceptor= apply only to standalone agent runs, "
    "not @flow runs"
)


def _resolve_answers(answers: dict[str, Any], pending_ids: list[str]) -> list[tuple[str, str]]:
    """Maps answer keys to interrupt ids and encodes the answers."""
    pending = set(pending_ids)
    resolved: list[tuple[str, str]] = []
    for key, value in answers.items():
        if key in pending:
            full = key
        else:
            matches = sorted(p for p in pending_ids if p.startswith(f"tool:{key}:"))
            if len(matches) == 1:
                full = matches[0]
            elif len(matches) > 1:
                raise ConfigError(
                    f"answer key {key!r} is ambiguous -- it matches multiple pending interrupts "
                    f"{matches!r}; use the full interrupt id to disambiguate"
                )
            elif pending_ids and all(p.startswith("tool:") for p in pending_ids):
                raise ConfigError(
                    f"answer key {key!r} does not match any pending interrupt -- currently "
                    f"pending: {sorted(pending_ids)!r} (a tool-call answer can't be supplied ahead "
                    "of the tool actually being called, unlike a bare approve()/ask_human() id)"
                )
            else:
                full = key
        try:
            encoded = _codec.dumps(value)
        except SerializationError as exc:
            raise SerializationError(f"answer {key!r}: {exc}") from None
        resolved.append((full, encoded))
    return resolved


def _prepare_resume(
    store: Any,
    run_id: str,
    answers: dict[str, Any] | None,
    allow_code_change: bool,
    callbacks: tuple,
):
    """Plan (`_drive.plan_io`): `resume()`'s checks, in order, before anything
    is written. Returns the flow to run and the resolved answers, or a
    finished `Run`, or the row of an agent or graph run."""
    remote = store.kind != "sqlite"
    row = yield _drive.plan_io(remote, store.get_run, store.aget_run, run_id)
    graph = OWNERS.get("graph")
    if row is None and graph is not None:
        found = yield from graph.find_run(run_id)
        row = found[1] if found is not None else None
    if row is None:
        raise ConfigError(_engine.run_not_found(run_id))
    if row["kind"] in ("agent", "graph"):
        return None, None, row
    if any(c is not None for c in callbacks):
        raise ConfigError(_CALLBACKS_ON_FLOW)
    if row["status"] == "cancelled" and row["kind"] == "flow":
        raise ConfigError(f"run '{run_id}' was cancelled")
    if row["status"] == "failed" and _timed_out(row):
        raise ConfigError(
            f"run '{run_id}' passed its deadline and cannot be resumed -- start a new run "
            f"(the stored error: {_codec.loads(row['error_json'])['message']})"
        )
    flow_obj = _FLOWS.get(row["name"])
    if flow_obj is None or row["kind"] != "flow":
        raise _engine.not_registered("flow", row["name"], row.get("module"), "calling resume()")
    if row["status"] == "completed":
        return None, None, completed_run(row)
    if not allow_code_change and not flow_obj._has_fingerprint(row["fingerprint"]):
        raise ResumeMismatchError(
            f"the source of @flow '{flow_obj.name}' changed since run '{run_id}' was created "
            "(fingerprint mismatch) -- pass allow_code_change=True to resume anyway (the journal "
            "may no longer match the new code's call sequence)"
        )
    resolved = yield from _pending_answers(store, run_id, answers)
    return flow_obj, resolved, None


def _timed_out(row: dict) -> bool:
    """Whether a failed run was failed by its deadline."""
    error_json = row["error_json"]
    if not error_json or "FlowTimeoutError" not in error_json:
        return False
    error = _codec.loads(error_json)
    return isinstance(error, dict) and error.get("type") == "FlowTimeoutError"


def _pending_answers(store: Any, run_id: str, answers: dict[str, Any] | None):
    """Plan: the answers' keys matched against the run's pending interrupts; nothing is written."""
    if not answers:
        return []
    remote = store.kind != "sqlite"
    pending = yield _drive.plan_io(remote, store.pending, store.apending, run_id)
    return _resolve_answers(answers, [p[0] for p in pending])


def resolve_pending_answers(run_id: str, answers: dict[str, Any] | None) -> list:
    """The answers' keys matched against the run's pending interrupts;
    nothing is written."""
    return _drive.run_plan(_pending_answers(_engine.get_store(), run_id, answers))


async def aresolve_pending_answers(run_id: str, answers: dict[str, Any] | None) -> list:
    """`resolve_pending_answers`, the interrupts read off the loop on a server."""
    store = await _engine.aget_store()
    return await _drive.arun_plan(_pending_answers(store, run_id, answers))


def begin_resume(
    run_id: str, resolved: list, budget: Any, span_kind: str, name: str, recover: bool = False
):
    """Takes the lease, applies the budget override and the answers, decodes
    the stored arguments, and builds the budget meter seeded with earlier
    attempts' spend. Returns `(run, payload, meter)`.
    `recover`: a worker continuing a due run (the recovery attempt limit applies)."""
    # The answers are journaled with the claim (one commit on SQLite).
    attempt = _engine.get_store().resume(run_id, recover, resolved)
    try:
        if budget is not None:
            attempt.set_budget(_engine.budget_json(budget))
        payload = _codec.loads(attempt.args_json) if attempt.args_json else {}
        effective = budget
        if effective is None and attempt.budget_json:
            effective = _engine.budget_from_json(attempt.budget_json)
        meter = None
        if effective is not None:
            meter = _engine.budget_meter(effective, span_kind, name, attempt.prior_llm_usage())
    except BaseException as exc:
        attempt.settle("failed", None, _engine.error_json(exc))
        raise
    return _engine.RunState(attempt, name), payload, meter


async def abegin_resume(run_id: str, resolved: list, budget: Any, span_kind: str, name: str):
    """`begin_resume` for an async driver: the lease claim, the answers and
    a failure's settlement are awaited off the loop on a server-backed store."""
    attempt = await _drive.aresume_attempt(run_id)
    remote = attempt.remote
    try:
        if budget is not None:
            budget_json = _engine.budget_json(budget)
            if remote:
                await _engine.off_loop(attempt.aset_budget, budget_json)
            else:
                attempt.set_budget(budget_json)
        if resolved:
            if remote:
                await _engine.off_loop(attempt.arecord_answers, resolved)
            else:
                attempt.record_answers(resolved)
        payload = _codec.loads(attempt.args_json) if attempt.args_json else {}
        effective = budget
        if effective is None and attempt.budget_json:
            effective = _engine.budget_from_json(attempt.budget_json)
        meter = None
        if effective is not None:
            if remote:
                prior = await _engine.off_loop(attempt.aprior_llm_usage)
            else:
                prior = attempt.prior_llm_usage()
            meter = _engine.budget_meter(effective, span_kind, name, prior)
    except BaseException as exc:
        await _drive.asettle(attempt, "failed", None, _engine.error_json(exc))
        raise
    return _engine.RunState(attempt, name), payload, meter


def _begin_resume(
    flow_obj: Any, run_id: str, resolved, budget, wait: bool = True, recover: bool = False
):
    run, payload, meter = begin_resume(run_id, resolved, budget, "flow", flow_obj.name, recover)
    run.park = not wait
    return run, tuple(payload.get("args", ())), dict(payload.get("kwargs", {})), meter


class NotDue(Exception):
    """The run settled in another process after it was listed as due."""


# Statuses a due run can be continued from: parked, or running with a dead holder.
_CONTINUABLE = ("paused", "running")


def continue_due(run_id: str) -> Run[Any]:
    """Continues a run the worker found due, parking on its next wait.

    Unlike ``resume()``, a run that another process settled in the meantime
    (completed, failed or cancelled) is left exactly as it is: the status is
    checked again under the lease, so two workers never both continue it.
    """
    store = _engine.get_store()
    row = store.get_run(run_id)
    if row is None or row["status"] not in _CONTINUABLE:
        raise NotDue(run_id)
    if row["kind"] == "agent":
        # A standalone agent answered from outside (`compose answer`): its
        # owner takes the lease and reads the journaled answers (AGENT-54).
        return _resume_agent_run(row, None, None, None, None, None, False)  # type: ignore[no-any-return]
    if row["kind"] == "graph":
        # Answered from outside: the answers journaled for the suspension it
        # is paused on become the node resume values of an ordinary resume.
        answers = journaled_graph_answers(store, run_id)
        if row["status"] != "paused" or not answers:
            raise NotDue(run_id)
        return _graph_owner(row).resume(row, answers, None)  # type: ignore[no-any-return]
    if row["kind"] != "flow":
        raise NotDue(run_id)
    flow_obj, resolved, done = _drive.run_plan(
        _prepare_resume(store, run_id, None, False, (None, None, None))
    )
    if done is not None:
        raise NotDue(run_id)
    run, args, kwargs, meter = _begin_resume(
        flow_obj, run_id, resolved, None, wait=False, recover=True
    )
    attempt = run.attempt
    if attempt.status not in _CONTINUABLE:
        # Settled between the check above and the lease: give the lease back
        # with the row as it is.
        settled = store.get_run(run_id)
        attempt.settle(settled["status"], settled["output_json"], settled["error_json"])
        raise NotDue(run_id)
    return flow_obj._drive(run, args, kwargs, meter)


def resume(
    run_id: str,
    answers: dict[str, Any] | None = None,
    *,
    budget: Any = None,
    allow_code_change: bool = False,
    approver: Any = None,
    tool_interceptor: Any = None,
    context_manager: Any = None,
    wait: bool = True,
) -> Run[Any]:
    """Continues a durable run — paused, failed or crashed — in this process.

    Works from any process that has imported the code defining the run's
    flow, agent or graph. Journaled steps are replayed from the journal, not
    executed again; the run goes on from the first step without a record.

    Args:
        run_id: the run.
        answers: answers to pending interrupts, `{interrupt id: value}`; a
            gated tool's answer may use the tool's name as its key.
        budget: replaces the run's stored `Budget` from now on.
        allow_code_change: resume although the flow's source changed since
            the run was created (every call is still checked against the
            journal).
        approver: for a standalone agent run: decides its gated tool calls.
        tool_interceptor: for a standalone agent run.
        context_manager: for a standalone agent run.
        wait: `False` parks the run on its next durable wait instead of
            blocking in place.

    Returns:
        The `Run`, `completed`, `paused` again or `cancelled`.
    """
    _engine.check_sync_facade()
    if _engine.missing_store():
        raise ConfigError(_engine.run_not_found(run_id))
    flow_obj, resolved, done = _drive.run_plan(
        _prepare_resume(
            _engine.get_store(),
            run_id,
            answers,
            allow_code_change,
            (approver, tool_interceptor, context_manager),
        )
    )
    if isinstance(done, dict) and done["kind"] == "graph":
        return _graph_owner(done).resume(done, answers, budget)  # type: ignore[no-any-return]
    if isinstance(done, dict):
        return _resume_agent_run(
            done, answers, budget, approver, tool_interceptor, context_manager, False
        )
    if done is not None:
        return done
    run, args, kwargs, meter = _begin_resume(flow_obj, run_id, resolved, budget, wait)
    return flow_obj._drive(run, args, kwargs, meter)


# `signal()`'s `resume` parameter hides the function there.
_resume = resume


async def aresume(
    run_id: str,
    answers: dict[str, Any] | None = None,
    *,
    budget: Any = None,
    allow_code_change: bool = False,
    approver: Any = None,
    tool_interceptor: Any = None,
    context_manager: Any = None,
    wait: bool = True,
) -> Run[Any]:
    """Async twin of `resume`, on the caller's loop: every read and write of a
    server-backed store, and its first open, are awaited off the loop."""
    if _engine.missing_store():
        raise ConfigError(_engine.run_not_found(run_id))
    flow_obj, resolved, done = await _drive.arun_plan(
        _prepare_resume(
            await _engine.aget_store(),
            run_id,
            answers,
            allow_code_change,
            (approver, tool_interceptor, context_manager),
        )
    )
    if isinstance(done, dict) and done["kind"] == "graph":
        return await _graph_owner(done).aresume(done, answers, budget)  # type: ignore[no-any-return]
    if isinstance(done, dict):
        return await _resume_agent_run(
            done, answers, budget, approver, tool_interceptor, context_manager, True
        )
    if done is not None:
        return done
    run, payload, meter = await abegin_resume(run_id, resolved, budget, "flow", flow_obj.name)
    run.park = not wait
    args, kwargs = tuple(payload.get("args", ())), dict(payload.get("kwargs", {}))
    return await flow_obj._adrive(run, args, kwargs, meter)


# ---------------------------------------------------------------------------
# Signals and cancellation


def _check_name(name: Any, what: str) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{what}: the signal name must be a non-empty string, got {name!r}")


def _encode_signal(name: str, value: Any) -> str:
    _check_name(name, "signal()")
    try:
        return _codec.dumps(value)
    except SerializationError as exc:
        raise SerializationError(f"signal {name!r} value: {exc}") from None


def signal(run_id: str, name: str, value: Any = None, *, resume: bool = False) -> Run | None:
    """Delivers `value` under `name` to a run that has not finished
    (buffered until the body asks). With `resume=True`, a run parked on
    that name is continued here and its `Run` returned."""
    value_json = _encode_signal(name, value)
    store = _engine.get_store()
    _core.send_signal(store, run_id, name, value_json)
    if resume and _parked_on(store, run_id, name):
        return _resume(run_id, wait=False)
    return None


async def asignal(run_id: str, name: str, value: Any = None, *, resume: bool = False) -> Run | None:
    """Async twin of `signal`."""
    value_json = _encode_signal(name, value)
    store = _engine.get_store()
    _core.send_signal(store, run_id, name, value_json)
    if resume and _parked_on(store, run_id, name):
        return await aresume(run_id, wait=False)
    return None


def _parked_on(store: Any, run_id: str, name: str) -> bool:
    wait = _core.parked_wait(store, run_id)
    return wait is not None and wait[2] == name


def cancel(run_id: str, reason: str | None = None) -> None:
    """Cancels a run: a parked one at once, an executing one at its
    next durable boundary (in whatever process executes it)."""
    if reason is not None and not isinstance(reason, str):
        raise ConfigError(f"cancel(): reason must be a string, got {type(reason).__name__}")
    _core.request_cancel(_engine.get_store(), run_id, reason)


async def acancel(run_id: str, reason: str | None = None) -> None:
    """Async twin of `cancel`."""
    cancel(run_id, reason)


# ---------------------------------------------------------------------------
# Run handles (EXT-11)

# How often `RunHandle.result()` reads the store while it waits on a run
# executing elsewhere.
_RESULT_POLL = 0.02


class RunHandle:
    """A durable run addressed by its id, usable from any process.

    Returned by `flow_fn.start()` and `get_run()`. `status` and `pending` are
    read from the store; `signal()`, `cancel()` and `resume()` act on the
    run; `result(timeout=None)` waits for it to settle and returns its `Run`.
    """

    def __init__(self, run_id: str) -> None:
        self.id = run_id
        # Set when this process executes the run (`Flow.start`).
        self._done: Any = None
        self._outcome: tuple | None = None

    def __repr__(self) -> str:
        return f"<RunHandle {self.id}>"

    def _row(self) -> dict:
        row = _engine.get_store().get_run(self.id)
        if row is None:
            raise ConfigError(_engine.run_not_found(self.id))
        return row

    @property
    def status(self) -> str:
        """The run's status, read from the store."""
        return self._row()["status"]

    @property
    def pending(self) -> Any:
        """The run's first pending interrupt (`Interrupt`), or `None`."""
        rows = _engine.get_store().pending(self.id)
        if not rows:
            return None
        return _interrupt(rows[0])

    def signal(self, name: str, value: Any = None) -> None:
        signal(self.id, name, value)

    def cancel(self, reason: str | None = None) -> None:
        cancel(self.id, reason)

    def resume(self, answers: dict[str, Any] | None = None, **kw: Any) -> Run:
        return resume(self.id, answers, **kw)

    def result(self, timeout: float | None = None) -> Run:
        """Waits until the run completes, fails (re-raised), is cancelled, or
        parks on a human interrupt; `TimeoutError` after `timeout` seconds."""
        end = None if timeout is None else time.monotonic() + timeout
        if self._done is not None:
            if not self._done.wait(timeout):
                raise TimeoutError(f"run {self.id} did not finish within {timeout}s")
            # Set before `_done` is.
            assert self._outcome is not None
            ok, value = self._outcome
            if not self._moved_on(ok, value):
                if not ok:
                    raise value
                if value.status != "paused" or value.pending.kind not in ("timer", "signal"):
                    return value
        while True:
            run = self._settled()
            if run is not None:
                return run
            if end is not None and time.monotonic() >= end:
                raise TimeoutError(f"run {self.id} did not finish within {timeout}s")
            time.sleep(_RESULT_POLL)

    def _moved_on(self, ok: bool, value: Any) -> bool:
        """Whether the run went on after this process's drive of it ended (a
        resume or retry here or in another process), so that the outcome kept
        here is stale and the store's latest settled state is the answer."""
        row = self._row()
        if not ok:
            return row["status"] != "failed"
        if value.status != "paused":
            return False
        if row["status"] != "paused":
            return True
        pending = [p[0] for p in _engine.get_store().pending(self.id)]
        return value.pending.id not in pending

    def _settled(self) -> Run | None:
        row = self._row()
        status = row["status"]
        trace = Trace(trace_id=row["trace_id"] or "")
        if status == "completed":
            out = row["output_json"]
            return Run(
                id=self.id,
                status="completed",
                output=_codec.loads(out) if out is not None else None,
                trace=trace,
            )
        if status == "cancelled":
            return Run(id=self.id, status="cancelled", output=None, trace=trace)
        if status == "failed":
            raise _stored_error(self.id, row["error_json"])
        if status == "paused":
            rows = _engine.get_store().pending(self.id)
            human = [p for p in rows if p[1] not in ("timer", "signal")]
            if human:
                return Run(
                    id=self.id,
                    status="paused",
                    output=None,
                    trace=trace,
                    pending=_interrupt(human[0]),
                )
        return None


def _interrupt(row: tuple) -> Any:
    from ._interrupt import Interrupt

    interrupt_id, kind, question, payload_json = row
    payload = _codec.loads(payload_json) if payload_json is not None else None
    if kind == "graph":
        return pending_interrupt(interrupt_id[len("node:") :], payload)
    return Interrupt(id=interrupt_id, kind=kind, question=question, payload=payload)


# What a node suspended by `approve()`/`ask_human()` carries as its payload.
_ASKED_KEYS = frozenset(("id", "kind", "question", "payload"))


def _asked_id(payload: Any) -> str | None:
    """The interrupt id of a graph node suspended by `approve()`/`ask_human()`."""
    if (
        isinstance(payload, dict)
        and payload.keys() == _ASKED_KEYS
        and payload["kind"] in ("approval", "question")
        and isinstance(payload["id"], str)
    ):
        return payload["id"]
    return None


def pending_interrupt(node: str, payload: Any) -> Interrupt:
    """A suspended graph node as an `Interrupt`: id `node:<name>`; a
    node paused by `approve()`/`ask_human()` keeps that kind, question and payload."""
    from ._interrupt import Interrupt

    if _asked_id(payload) is not None:
        return Interrupt(
            id=f"node:{node}",
            kind=payload["kind"],
            question=payload["question"],
            payload=payload["payload"],
        )
    return Interrupt(id=f"node:{node}", kind="question", payload=payload)


def _stored_error(run_id: str, error_json: str | None) -> BaseException:
    """The error of a run that failed in another process: the same
    composeai error class when there is one, else a `ComposeError`."""
    from . import errors

    data = _codec.loads(error_json) if error_json else {}
    name = data.get("type", "Exception")
    message = data.get("message", "")
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.ComposeError):
        return cls(message)
    return errors.ComposeError(f"run {run_id} failed: {name}: {message}")


def get_run(run_id: str) -> RunHandle:
    """A handle on an existing run (any process)."""
    handle = RunHandle(run_id)
    handle._row()
    return handle


# ---------------------------------------------------------------------------
# Starts under a caller's run id (OPS-10)


def check_run_id(run_id: Any) -> str:
    """A caller's `run_id=` if it is a string (the core checks its characters
    and length), else `ConfigError`."""
    if not isinstance(run_id, str):
        raise ConfigError(
            f"run_id must be a string of 1 to 128 letters, digits and - _ . : @ /, got "
            f"{type(run_id).__name__}"
        )
    return run_id


def _paused_run(row: dict) -> Run[Any]:
    """The `Run` of a paused run's row: its first pending interrupt."""
    rows = _engine.get_store().pending(row["run_id"])
    return Run(
        id=row["run_id"],
        status="paused",
        output=None,
        trace=Trace(trace_id=row["trace_id"] or ""),
        pending=_interrupt(rows[0]) if rows else None,
    )


def _stored_outcome(row: dict) -> Run[Any] | None:
    """The `Run` a settled or paused row stands for (a failed one raises its
    error); `None` while the run is running or queued."""
    status = row["status"]
    if status == "completed":
        return completed_run(row)
    if status == "paused":
        return _paused_run(row)
    if status == "cancelled":
        return Run(
            id=row["run_id"],
            status="cancelled",
            output=None,
            trace=Trace(trace_id=row["trace_id"] or ""),
        )
    if status == "failed":
        raise _stored_error(row["run_id"], row["error_json"])
    return None


def existing_run(row: dict, live: bool, wait: bool) -> Run[Any]:
    """What `run(run_id=...)` returns when a run of the same flow and
    arguments already has the id: its stored outcome, executing nothing; the
    run continued here when its holder died; else (it executes elsewhere, or
    is queued) its outcome once it settles or parks, as `RunHandle.result`."""
    run_id = row["run_id"]
    done = _stored_outcome(row)
    if done is not None:
        return done
    if row["status"] == "running" and not live:
        try:
            return resume(run_id, wait=wait)
        except ConfigError:
            # Another process (or thread) took the run over first: its
            # outcome is the answer.
            pass
    return RunHandle(run_id).result()


async def aexisting_run(row: dict, live: bool, wait: bool) -> Run[Any]:
    """Async twin of `existing_run`: waiting on a run executing elsewhere
    happens on a worker thread, off the loop."""
    import asyncio

    run_id = row["run_id"]
    done = _stored_outcome(row)
    if done is not None:
        return done
    if row["status"] == "running" and not live:
        try:
            return await aresume(run_id, wait=wait)
        except ConfigError:
            pass
    handle = RunHandle(run_id)
    return await asyncio.get_running_loop().run_in_executor(None, handle.result)


def start_in_background(
    flow_obj: Any, args: tuple, kwargs: dict, budget: Any, wait: bool, run_id: Any = None
):
    """`Flow.start`: the run row is created durably here, then the run
    executes on a background thread of this process. With `run_id` held by
    a run of the same flow and arguments, that run's handle; it is continued
    on the background thread when its holder died."""
    import contextvars
    import threading

    if run_id is None:
        run, meter = flow_obj._start(args, kwargs, budget, wait)
        handle = RunHandle(run.run_id)
        drive = lambda: flow_obj._drive(run, args, kwargs, meter)
    else:
        run, meter, existing = flow_obj._start_keyed(args, kwargs, budget, wait, run_id)
        handle = RunHandle(check_run_id(run_id))
        if run is None:
            row, live = existing
            if row["status"] != "running" or live:
                return handle
            drive = lambda: existing_run(row, live, wait)
        else:
            drive = lambda: flow_obj._drive(run, args, kwargs, meter)
    handle._done = threading.Event()

    def target() -> None:
        try:
            handle._outcome = (True, drive())
        except BaseException as exc:  # noqa: BLE001 -- handed to result()
            handle._outcome = (False, exc)
        finally:
            handle._done.set()

    context = contextvars.Context()
    threading.Thread(
        target=lambda: context.run(target), name=f"composeai-run-{handle.id}", daemon=True
    ).start()
    return handle


# Reported under the public modules that export them (reprs, tracebacks, pickles).
RunHandle.__module__ = "composeai.durable"
NotDue.__module__ = "composeai.flow"
