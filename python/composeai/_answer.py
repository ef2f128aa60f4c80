"""Answering a pending interrupt from outside the run: `compose answer` and
the web UI's Approve / Deny / JSON answer form share this module.

An answer is journaled under `__interrupt__:<id>` first-write-wins, and its
pending row deleted, exactly as `resume(answers=...)` records it,
but without executing the run: the core does it in one transaction
(`answer_interrupts`) and, when that leaves a parked flow or standalone
agent run waiting for nothing, makes the run due so a `compose worker`
continues it. With `resume=True` the run continues in this process through
`resume()` instead.

A graph node's interrupt id (`node:<name>`) repeats each time the node
suspends, so a graph answer is journaled under the id and the checkpoint
the run is paused at (its thread's head for a run kept in a thread), read
in the transaction that journals it: it answers that suspension only, and
is refused when the run moved on from the suspension the caller saw. The
run is due once every node it is paused on is answered; the worker then
hands the answers to the graph's ordinary resume (a thread's resume for a
run kept in a thread, so its checkpoint history goes on there). Any graph
resume reads the answers journaled for the suspension it resumes inside its
claim of the run, and they win over its own (first write wins); the answers
it brings for the other nodes are journaled under the same keys, so a later
answer to that suspension from here is refused as already answered.

Nothing here decodes a stored value into objects: pending payloads and
stored answers are read as plain JSON.
"""

from __future__ import annotations

import json
from typing import Any

from . import _codec, _core, _engine, _lifecycle
from ._show import _db_path
from .errors import ComposeError, ConfigError, SerializationError

__all__ = [
    "AlreadyAnswered",
    "Answered",
    "Pending",
    "Superseded",
    "answer",
    "graph_head",
    "pending",
    "resolve",
]


class AlreadyAnswered(ComposeError):
    """A second answer to an interrupt: refused, the first one stands."""

    def __init__(self, run_id: str, interrupt_id: str, stored: Any) -> None:
        super().__init__(
            f"interrupt '{interrupt_id}' of run '{run_id}' was already answered (first write "
            f"wins): the stored answer is {json.dumps(stored)} -- nothing was changed"
        )
        self.run_id = run_id
        self.interrupt_id = interrupt_id
        self.stored = stored


class StoredNotContinued(ComposeError):
    """`answer(..., resume=True)` stored the answer but could not continue
    the run in this process (its flow or agent is not registered here)."""

    def __init__(self, run_id: str, interrupt_id: str, module: str | None, cause: str) -> None:
        imp = f"--import {module}" if module else "--import <module>"
        super().__init__(
            f"the answer to interrupt '{interrupt_id}' of run '{run_id}' is stored, but the run "
            f"could not continue in this process: {cause} -- run the same command again with "
            f"{imp} to continue it here, or let `compose worker {imp}` continue it"
        )
        self.run_id = run_id
        self.interrupt_id = interrupt_id


class Superseded(ComposeError):
    """An answer to a graph suspension the run has moved on from: refused,
    nothing stored (the node may ask something else now)."""

    def __init__(self, run_id: str, interrupt_id: str, seen: str | None, head: str | None):
        where = (
            f"it is paused at checkpoint {head} now"
            if head is not None
            else "it is being continued right now"
        )
        asked = f" at checkpoint {seen}" if seen is not None else ""
        super().__init__(
            f"interrupt '{interrupt_id}' of run '{run_id}' was asked{asked}, but the run has moved "
            f"on since ({where}) -- nothing was stored; look at what it waits on again "
            f"(compose answer {run_id} --list)"
        )
        self.run_id = run_id
        self.interrupt_id = interrupt_id
        self.seen = seen
        self.head = head


class Pending:
    """One pending interrupt of a run, its payload as plain JSON."""

    __slots__ = ("id", "kind", "payload", "question")

    def __init__(self, row: tuple) -> None:
        self.id, self.kind, self.question, payload_json = row
        self.payload = _plain(payload_json)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "question": self.question,
            "payload": self.payload,
        }


class Answered:
    """What `answer` did: the run, the full interrupt id, the value stored,
    whether the run is now due for a worker, and the run's outcome when it
    continued in this process (`resume=True`)."""

    __slots__ = ("due", "interrupt_id", "kind", "outcome", "run_id", "value")

    def __init__(
        self, run_id: str, kind: str, interrupt_id: str, value: Any, due: bool, outcome: Any
    ) -> None:
        self.run_id = run_id
        self.kind = kind
        self.interrupt_id = interrupt_id
        self.value = value
        self.due = due
        self.outcome = outcome

    @property
    def status(self) -> str | None:
        """The run's status after it continued here, if it did."""
        if self.outcome is None:
            return None
        suspended = getattr(self.outcome, "suspended", None)
        if suspended is not None:
            return "paused" if suspended else "completed"
        return self.outcome.status


def _plain(value_json: str | None) -> Any:
    """A stored value as plain JSON (type tags left as they are)."""
    if value_json is None:
        return None
    try:
        return json.loads(value_json)
    except ValueError:
        return value_json


def resolve(run_id: str) -> dict:
    """The run row for a full id or unique prefix, or a
    `ComposeError` naming it."""
    outcome, value = _core.resolve_run(_db_path(), run_id)
    if outcome == "ambiguous":
        raise ComposeError(
            f"run id prefix '{run_id}' is ambiguous -- it matches {len(value)} runs: "
            f"{', '.join(value)} -- use a longer prefix or the full id"
        )
    if outcome != "found":
        raise ComposeError(_engine.run_not_found(run_id, "id"))
    return value


def pending(run_id: str) -> list[Pending]:
    """The run's pending interrupts, ordered by id."""
    return [Pending(row) for row in _engine.get_store().pending(run_id)]


def _answered_key(journal: list[tuple[str, str]], key: str) -> tuple[str, Any] | None:
    """An earlier answer to `key` (or its tool shorthand) in the journal."""
    exact = f"__interrupt__:{key}"
    shorthand = f"__interrupt__:tool:{key}:"
    found = [(k, v) for k, v in journal if k == exact or k.startswith(shorthand)]
    if len(found) != 1:
        return None
    return found[0][0][len("__interrupt__:") :], _plain(found[0][1])


def _full_id(run_id: str, key: str, ids: list[str]) -> str | None:
    """`resume()`'s answer-key lookup, restricted to pending interrupts: the id itself, or
    the one `tool:<key>:...` id; `None` when none is pending."""
    if key in ids:
        return key
    matches = sorted(i for i in ids if i.startswith(f"tool:{key}:"))
    if len(matches) > 1:
        raise ComposeError(
            f"answer key {key!r} is ambiguous -- it matches multiple pending interrupts "
            f"{matches!r}; use the full interrupt id to disambiguate"
        )
    return matches[0] if matches else None


def graph_head(run_id: str) -> str | None:
    """The checkpoint graph run `run_id` is suspended at: what its pending
    interrupts were asked at, and what `answer(..., at=)` takes."""
    return _core.graph_suspension_head(_engine.get_store(), run_id)


def _same_again(row: dict, stored: Any, value: Any) -> bool:
    """Whether an answer with `resume` repeats the one stored for a run still
    paused (a first try stored it but could not continue the run here): then
    the run continues instead of the answer being refused."""
    return (
        row["kind"] != "graph"
        and row["status"] == "paused"
        and stored == _plain(_codec.dumps(value))
    )


def _continue(row: dict, interrupt_id: str) -> Any:
    """`resume()` of an answered run; a run this process cannot continue is
    reported as answered but not continued."""
    try:
        return _lifecycle.resume(row["run_id"])
    except ConfigError as exc:
        if not getattr(exc, "not_registered", False):
            raise
        raise StoredNotContinued(row["run_id"], interrupt_id, row.get("module"), str(exc)) from None


def answer(
    run_id: str,
    interrupt_id: str,
    value: Any,
    *,
    resume: bool = False,
    at: str | None = None,
) -> Answered:
    """Answers pending interrupt `interrupt_id` (or its tool shorthand) of run
    `run_id` (or a unique prefix) with `value`.

    Refused, with nothing stored: an unknown run, an interrupt that is not
    pending (`AlreadyAnswered` when it was answered before), a value the
    codec cannot encode, and for a graph run an interrupt whose suspension
    the run has moved on from (`Superseded`): the one at checkpoint `at`
    (what a page showing the interrupt saw, `graph_head`), else the one it
    is paused at as this call begins. With `resume`, the run continues here
    through `resume()` (its flow, agent or graph must be importable in this
    process).
    """
    row = resolve(run_id)
    run_id = row["run_id"]
    store = _engine.get_store()
    graph = row["kind"] == "graph"
    if graph and at is None:
        # Read before the pending rows: an interrupt listed below then
        # belongs to this suspension or a later one, which the core refuses.
        at = _core.graph_suspension_head(store, run_id)
    waiting = pending(run_id)
    full = _full_id(run_id, interrupt_id, [p.id for p in waiting])
    if full is None:
        key = _lifecycle.graph_answer_key(interrupt_id, at) if graph and at else interrupt_id
        earlier = _answered_key(store.journal(run_id), key)
        if earlier is not None and resume and _same_again(row, earlier[1], value):
            outcome = _continue(row, earlier[0])
            return Answered(run_id, row["kind"], earlier[0], earlier[1], False, outcome)
        if earlier is not None:
            raise AlreadyAnswered(run_id, interrupt_id if graph else earlier[0], earlier[1])
        shown = ", ".join(repr(p.id) for p in waiting) or "none"
        raise ComposeError(
            f"run '{run_id}' has no pending interrupt '{interrupt_id}' -- pending: {shown}"
        )
    try:
        encoded = _codec.dumps(value)
    except SerializationError as exc:
        raise SerializationError(f"answer '{full}': {exc}") from None
    if graph and resume:
        # The resume takes answers given earlier from outside for this
        # suspension itself, inside its claim.
        graph_outcome = _lifecycle.resume(run_id, answers={full: value})
        # An answer journaled from outside just before the claim wins (first
        # write wins): say which value the node got.
        stored = dict(store.journal(run_id)).get(f"__interrupt__:{full}@{at}")
        used = _plain(stored) if stored is not None else value
        return Answered(run_id, row["kind"], full, used, False, graph_outcome)
    outcome, found = _core.answer_interrupts(
        store, run_id, [(full, encoded)], at if graph else None
    )
    if outcome == "no_run":
        raise ComposeError(_engine.run_not_found(run_id, "id"))
    if outcome == "superseded":
        raise Superseded(run_id, full, at, found)
    if outcome == "not_pending":
        raise ComposeError(
            f"interrupt '{full}' of run '{run_id}' is no longer pending -- nothing was stored"
        )
    (answered_id, stored, now_json), *_ = found[0]
    if not stored and resume and _same_again(row, _plain(now_json), value):
        outcome = _continue(row, answered_id)
        return Answered(run_id, row["kind"], answered_id, _plain(now_json), False, outcome)
    if not stored:
        # Another answer won the race since the pending row was read.
        raise AlreadyAnswered(run_id, answered_id, _plain(now_json))
    done: Any = None
    if resume:
        done = _continue(row, answered_id)
    return Answered(run_id, row["kind"], full, value, found[1] and not resume, done)
