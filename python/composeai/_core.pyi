"""Type stubs for `composeai._core`, the Rust extension (src/py/*.rs)."""

from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeAlias, final

__all__ = [
    "Attempt",
    "BudgetMeter",
    "Fence",
    "Store",
    "Wait",
    "answer_interrupts",
    "astream_read",
    "attempt_append_stream",
    "attempt_publish",
    "begin_await",
    "begin_receive",
    "begin_sleep",
    "check_cancel",
    "clock_advance",
    "clock_is_fake",
    "clock_iso",
    "clock_now",
    "clock_poke",
    "clock_set_fake",
    "compact_store",
    "diff_view",
    "due_runs",
    "event_wait",
    "export_view",
    "list_runs",
    "llm_costs",
    "loads_plain",
    "next_wake",
    "parked_wait",
    "parked_waits",
    "prune_runs",
    "query_runs",
    "receive_all",
    "register_decoder",
    "register_errors",
    "release_leases",
    "render_mermaid",
    "render_tree",
    "request_cancel",
    "resolve_run",
    "run_events",
    "search_runs",
    "send_signal",
    "set_module",
    "span_view",
    "sqlite_library",
    "stream_read",
    "take_span_write_error",
    "trace_status",
    "trace_view",
    "ulid",
    "wait_for_work",
]

# `(input_tokens, output_tokens, cache_read_tokens, cache_creation_tokens, reasoning_tokens,
# cost_usd, cost_complete)`.
_UsageTuple: TypeAlias = tuple[int, int, int, int, int, float | None, bool]

# A span record (spans.rs): `(span_id, parent_span_id, kind, name, started_at, ended_at, status,
# replayed, step_key, attributes_json, usage, error_json, input_json, output_json)`.
_SpanRecord: TypeAlias = tuple[
    str,
    str | None,
    str,
    str,
    float,
    float | None,
    str,
    bool,
    str | None,
    str | None,
    _UsageTuple | None,
    str | None,
    str | None,
    str | None,
]

# A span to render (trace.rs): `(span_id, parent_span_id, kind, name, started_at, ended_at,
# status, replayed, error_type, error_message, usage)`.
_RenderSpan: TypeAlias = tuple[
    str,
    str | None,
    str,
    str,
    float,
    float | None,
    str,
    bool,
    str | None,
    str | None,
    _UsageTuple | None,
]

# A pending interrupt: `(interrupt_id, kind, question, payload_json)`.
_PendingTuple: TypeAlias = tuple[str, str, str | None, str | None]

# An agent snapshot: `(scope_key, messages_json, partial_results_json, turn)`.
_AgentStateTuple: TypeAlias = tuple[str, str, str | None, int]

# A `runs` row as a dict: `run_id`, `kind`, `name`, `status` (str); `created_at`, `updated_at`
# (float); `trace_id`, `fingerprint`, `args_json`, `output_json`, `error_json`, `budget_json`
# (str | None). `query_runs` rows add `tokens` (int), `cost_usd` (float | None) and
# `cost_complete` (bool).
_RunRow: TypeAlias = dict[str, Any]

@final
class Fence:
    """Made by `Attempt.root_fence()` / `Fence.child()`; no public constructor."""

    def child(self) -> Fence: ...
    def revoke(self) -> None: ...
    @property
    def revoked(self) -> bool: ...

class TaskCall:
    """Base of `composeai.Task`: its call runs the task's step in the core;
    the subclass sets `_step = (fn, name, lean, is_async)`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

@final
class StepFrame:
    """The frame a lean `@task` body runs under (`_engine.Frame`'s
    attributes); `span` is built on first read."""

    @property
    def run(self) -> Any: ...
    @property
    def scope(self) -> str: ...
    @property
    def fence(self) -> Fence | None: ...
    @property
    def trace(self) -> Any: ...
    @property
    def defer(self) -> bool: ...
    @property
    def span(self) -> Any: ...
    @property
    def span_id(self) -> str: ...
    @property
    def parent_span_id(self) -> str | None: ...
    @property
    def name(self) -> str: ...
    @property
    def started_at(self) -> float: ...
    @property
    def args(self) -> tuple[Any, ...]: ...
    @property
    def kwargs(self) -> dict[str, Any]: ...
    @property
    def capture(self) -> bool: ...
    @property
    def span_built(self) -> bool: ...

def register_task_path(hooks: dict[str, Any]) -> None: ...

@final
class Attempt:
    """Made by `Store.start_run()` / `Store.resume()`; no public constructor."""

    @property
    def run_id(self) -> str: ...
    @property
    def trace_id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def fingerprint(self) -> str | None: ...
    @property
    def args_json(self) -> str | None: ...
    @property
    def budget_json(self) -> str | None: ...
    @property
    def output_json(self) -> str | None: ...
    def root_fence(self) -> Fence: ...
    def reserve(
        self,
        scope: str,
        name: str,
        fence: Fence | None = None,
        kind: str | None = None,
        digest: int | None = None,
    ) -> tuple[str, str | None]:
        """Allocates the next key for `name` in `scope`; returns `(key, value_json or None)`.
        With `kind`, a journaled call of the body checked against its identity (issue 27)."""
    def set_divergence(self, mode: str) -> None:
        """How a divergence from the journal is met: "raise" or "warn"."""
    def check_complete(self) -> None:
        """Raises `NondeterminismError` when the finished body skipped journaled calls."""
    def divergence(self) -> BaseException | None:
        """The `NondeterminismError` that ended this attempt's journal access, if any."""
    def fork_from(self, source: str, at: str) -> None:
        """Makes this (first) attempt a fork of run `source`, executing from `at` on."""
    @property
    def replay_only(self) -> bool: ...
    @property
    def replayed_steps(self) -> int: ...
    def next_key(self, scope: str, name: str, fence: Fence | None = None) -> str: ...
    def open_scope(self, scope: str, kind: str, digest: int, fence: Fence | None = None) -> str: ...
    def patched(
        self,
        scope: str,
        patch_id: str,
        same_code: bool,
        deprecate: bool = False,
        fence: Fence | None = None,
    ) -> bool: ...
    def lookup(self, key: str, fence: Fence | None = None) -> str | None: ...
    def commit(
        self,
        key: str,
        value_json: str,
        span: _SpanRecord | None = None,
        fence: Fence | None = None,
    ) -> str:
        """Journals `value_json` under `key` durably; returns the stored value (first write
        wins)."""
    @property
    def remote(self) -> bool:
        """Whether commits wait on a server (the async driver then uses `acommit`)."""
    def acommit(
        self,
        key: str,
        value_json: str,
        span: _SpanRecord | None,
        fence: Fence | None,
        future: Any,
    ) -> None:
        """`commit` that resolves `future` (an asyncio future of the running loop) with the
        stored value from the core's runtime."""
    def commit_deferred(
        self,
        key: str,
        value_json: str,
        span: _SpanRecord | None = None,
        fence: Fence | None = None,
    ) -> str:
        """Like `commit`, durable soon rather than before returning (see `sync`)."""
    def span_mark(self) -> int | None:
        """Where this attempt's spans begin in the store (None: spans are not read back)."""
    def set_batch(self) -> None:
        """Batch durability: unfenced steps are group-committed in the background."""
    def sync(self) -> None: ...
    def aflush(self, future: Any) -> None:
        """`sync` off the event loop: resolves `future` with None."""
    def replayed(
        self,
        span_id: str,
        parent_span_id: str | None,
        kind: str,
        name: str,
        at: float,
        step_key: str,
        with_output: bool,
    ) -> None: ...
    def save_agent_state(self, state: _AgentStateTuple, fence: Fence | None = None) -> None: ...
    def load_agent_state(self, scope_key: str) -> tuple[str, str | None, int] | None: ...
    def prior_llm_usage(self, step_key: str | None = None) -> tuple[int, float]: ...
    def aprior_llm_usage(self, future: Any) -> None:
        """`prior_llm_usage()` off the event loop: resolves `future` with the pair."""
    def store_row(self) -> None: ...
    def span(self, span: _SpanRecord) -> None: ...
    def set_budget(self, budget_json: str) -> None: ...
    def aset_budget(self, future: Any, budget_json: str) -> None:
        """`set_budget` off the event loop: resolves `future` with None."""
    def record_answers(self, answers: Sequence[tuple[str, str]]) -> None: ...
    def pending(self) -> list[_PendingTuple]: ...
    def discard(self) -> None: ...
    def settle(
        self,
        status: str,
        output_json: str | None = None,
        error_json: str | None = None,
        pending: Sequence[_PendingTuple] = ...,
        agent_states: Sequence[_AgentStateTuple] = ...,
    ) -> None: ...
    def asettle(
        self,
        future: Any,
        status: str,
        output_json: str | None = None,
        error_json: str | None = None,
        pending: Sequence[_PendingTuple] = ...,
        agent_states: Sequence[_AgentStateTuple] = ...,
    ) -> None:
        """`settle` off the event loop: resolves `future` with None once durable."""
    def arecord_answers(self, future: Any, answers: Sequence[tuple[str, str]]) -> None:
        """`record_answers` off the event loop: resolves `future` with None."""

def store_target(spec: str, default_sqlite: str) -> tuple[str, str]: ...
def migrate_store(
    spec: str, default_sqlite: str, dry_run: bool = False
) -> tuple[int, int, int]: ...

class Store:
    def __init__(self, path: str) -> None: ...
    @property
    def path(self) -> str: ...
    @property
    def kind(self) -> str: ...
    def start_run(
        self,
        kind: str,
        name: str,
        fingerprint: str | None = None,
        args_json: str | None = None,
        budget_json: str | None = None,
        run_id: str | None = None,
        trace_id: str | None = None,
        queued: bool = False,
        module: str | None = None,
    ) -> Attempt: ...
    def resume(
        self, run_id: str, recover: bool = False, answers: list[tuple[str, str]] = ...
    ) -> Attempt: ...
    def astart_run(
        self,
        future: Any,
        kind: str,
        name: str,
        fingerprint: str | None = None,
        args_json: str | None = None,
        budget_json: str | None = None,
        run_id: str | None = None,
        trace_id: str | None = None,
        module: str | None = None,
    ) -> None:
        """`start_run` off the event loop: resolves `future` with the attempt."""
    def aresume(self, future: Any, run_id: str, recover: bool = False) -> None:
        """`resume` off the event loop: resolves `future` with the attempt."""
    def get_run(self, run_id: str) -> _RunRow | None: ...
    def replay_attempt(self, run_id: str) -> Attempt:
        """A replay-only attempt (`composeai.testing.replay`): no lease, nothing written."""
    def aget_run(self, future: Any, run_id: str) -> None:
        """`get_run` off the event loop: resolves `future` with the row."""
    def pending(self, run_id: str) -> list[_PendingTuple]: ...
    def apending(self, future: Any, run_id: str) -> None:
        """`pending` off the event loop: resolves `future` with the list."""
    def journal(self, run_id: str) -> list[tuple[str, str]]: ...
    def queue_span(self, trace_id: str, span: _SpanRecord) -> None: ...
    def save_chat(
        self,
        chat_id: str,
        agent_name: str,
        system: str | None,
        model: str | None,
        messages_json: str,
        created_at: float,
    ) -> None: ...
    def load_chat(self, chat_id: str) -> dict[str, Any] | None: ...
    def step_spans(
        self, run_id: str, mark: int
    ) -> list[
        tuple[
            str,
            str | None,
            str,
            float,
            float | None,
            bool,
            str | None,
            str | None,
            str | None,
            str | None,
        ]
    ]:
        """The run's `ok` task-step spans stored after `mark`, in write order."""
    def flush(self) -> None: ...
    def close(self) -> None: ...

@final
class BudgetMeter:
    def __init__(
        self,
        usd: float | None,
        tokens: int | None,
        usd_text: str,
        tokens_text: str,
        span_kind: str,
        span_name: str,
        baseline_tokens: int = 0,
        baseline_usd: float = 0.0,
    ) -> None: ...
    def charge(self, tokens: int, usd: float | None = None) -> str | None:
        """Adds a model call's usage; returns the exceeded message, or `None`."""
    @property
    def spent(self) -> tuple[int, float]: ...

def ulid() -> str: ...
def sha256_hex(text: str) -> str: ...
def step_digest(text: str) -> int: ...
def take_span_write_error() -> str | None: ...

# The span tap (src/py/span_tap.rs): called with one 16-tuple per finished span.
def set_span_tap(callback: Callable[[tuple[Any, ...]], None] | None) -> None: ...

# `(origin, file, version)` of the SQLite the engine calls; origin "sqlite3 module" (the one
# Python's `sqlite3` loaded) or "library" (loaded by name).
def sqlite_library() -> tuple[str, str, str]: ...
def register_errors(
    config: type[BaseException],
    serialization: type[BaseException],
    revoked: type[BaseException],
    cancelled: type[BaseException] | None = None,
) -> None: ...
def register_decoder(loads: Callable[[str], Any]) -> None: ...
def loads_plain(text: str, default: object, limited: bool = True) -> Any:
    """The decoded value, or `default` when the core's fast path declines the text."""

def render_tree(trace_id: str, spans: Sequence[_RenderSpan], color: bool) -> str: ...
def render_mermaid(spans: Sequence[_RenderSpan]) -> str: ...
def trace_status(
    spans: Sequence[_RenderSpan],
) -> Literal["error", "cancelled", "paused", "running", "ok"]: ...
def query_runs(
    db_path: str,
    status: str | None = None,
    kind: str | None = None,
    since: float | None = None,
    limit: int = 10,
    before: tuple[float, str] | None = None,
) -> list[_RunRow] | None: ...
def resolve_run(
    db_path: str, run_id: str | None = None
) -> tuple[Literal["no_store", "not_found", "ambiguous", "found"], Any]:
    """`("no_store" | "not_found", None)`, `("ambiguous", [ids])` or `("found", run dict)`."""

def trace_view(
    db_path: str,
    run_id: str | None = None,
    fmt: str = "tree",
    color: bool = False,
) -> tuple[Literal["no_store", "not_found", "ambiguous", "found"], Any]:
    """Like `resolve_run`; the `"found"` value is `{run_id, status, trace_id, text, pending}`."""

def search_runs(
    db_path: str,
    query: str,
    status: str | None = None,
    kind: str | None = None,
    since: float | None = None,
    limit: int = 10,
    before: tuple[float, str] | None = None,
) -> tuple[Literal["no_store", "ok", "unavailable", "bad_query"], Any]: ...

# `compose answer` (src/py/answer.rs): answers `(interrupt_id, value_json)`; `at` the
# checkpoint a graph interrupt was seen at. `("answered", ([(interrupt_id, stored,
# value_json)], due))`, `("no_run", None)`, `("superseded", head | None)` or
# `("not_pending", interrupt_id)`.
def answer_interrupts(
    store: Store, run_id: str, answers: list[tuple[str, str]], at: str | None = None
) -> tuple[str, Any]: ...

# The checkpoint a graph run is suspended at (its thread's head for a run kept in a thread).
def graph_suspension_head(store: Store, run_id: str) -> str | None: ...

# `(key, calls, tokens, cost_usd, incomplete)`.
_CostTuple: TypeAlias = tuple[str, int, int, float | None, bool]

def llm_costs(
    db_path: str, by: Literal["model", "name", "day"] = "model", since: float | None = None
) -> tuple[list[_CostTuple], _CostTuple] | None: ...
def diff_view(
    db_path: str, run_id: str
) -> tuple[Literal["no_store", "not_found", "ambiguous", "found"], Any]: ...
def export_view(
    db_path: str, run_id: str
) -> tuple[Literal["no_store", "not_found", "ambiguous", "found"], Any]: ...
def otel_view(
    db_path: str, run_id: str
) -> tuple[Literal["no_store", "not_found", "ambiguous", "found"], Any]: ...
def span_view(
    db_path: str, run_id: str
) -> tuple[Literal["no_store", "not_found", "ambiguous", "found"], Any]: ...

# Durable primitives (src/py/durable.rs, EXT-1 … EXT-12).

# `(interrupt_id, kind, payload_json)`.
_ParkTuple: TypeAlias = tuple[str, str, str | None]

@final
class Wait:
    """A reached durable wait of an attempt."""

    @property
    def key(self) -> str: ...
    @property
    def journaled(self) -> bool: ...
    def watermark(self, k: int) -> int: ...
    def resolve(
        self, mode_name: Literal["block", "poll", "park"], after: int | None = None
    ) -> tuple[Literal["ready", "block", "park"], str | None, float | None, _ParkTuple | None]: ...
    def park(self) -> _ParkTuple: ...

def begin_sleep(
    attempt: Attempt, scope: str, seconds: float, fence: Fence | None = None
) -> Wait: ...
def begin_receive(
    attempt: Attempt,
    scope: str,
    name: str,
    timeout: float | None,
    default_json: str,
    fence: Fence | None = None,
) -> Wait: ...
def receive_all(attempt: Attempt, scope: str, name: str, fence: Fence | None = None) -> str: ...
def begin_await(
    attempt: Attempt, scope: str, timeout: float | None, fence: Fence | None = None
) -> Wait: ...
def check_cancel(attempt: Attempt, force: bool = True) -> None: ...
def set_module(attempt: Attempt, module: str | None = None) -> None: ...
def send_signal(store: Store, run_id: str, name: str, value_json: str) -> int: ...
def request_cancel(
    store: Store, run_id: str, reason: str | None = None
) -> Literal["cancelled", "requested", "already"]: ...
def due_runs(
    store: Store, now: float | None = None, limit: int = 1000
) -> list[tuple[str, str, str, Literal["timer", "signal", "recovered"], str | None]]: ...
def next_wake(store: Store, after: float) -> float | None: ...
def parked_wait(store: Store, run_id: str) -> tuple[str, float | None, str | None] | None: ...
def parked_waits(
    db_path: str, run_ids: list[str]
) -> dict[str, tuple[str, float | None, str | None]]: ...
def wait_for_work(store: Store, until: float | None, max_seconds: float) -> bool: ...
def release_leases(store: Store) -> int: ...

# Queues (STORE-20 ... STORE-23)
def queue_enqueue(
    store: Store,
    kind: str,
    name: str,
    queue: str,
    fingerprint: str | None = None,
    args_json: str | None = None,
    budget_json: str | None = None,
    priority: int = 0,
    dedup_id: str | None = None,
    module: str | None = None,
) -> str: ...
def queue_claim(
    store: Store,
    queue: str,
    room: int,
    flows: list[str],
    concurrency: int | None = None,
    rate_limit: tuple[int, float] | None = None,
    priority: bool = False,
) -> list[tuple[str, str, str]]: ...
def queue_next_slot(
    store: Store, queue: str, rate_limit: tuple[int, float] | None
) -> float | None: ...
def queue_stats(store: Store) -> list[tuple[str, int, int, int, float | None]]: ...
def lease_holders(store: Store) -> list[tuple[str, int, float]]:
    """`(owner, runs held, latest lease expiry)` per process holding leases."""

def clock_now() -> float: ...
def clock_is_fake() -> bool: ...
def clock_set_fake(at: float | None = None) -> None: ...
def clock_advance(seconds: float) -> None: ...
def clock_iso(t: float) -> str: ...
def clock_poke() -> None: ...

# -- graph workflows (EXT-20 … EXT-33; src/py/graph.rs) -------------------------

@final
class GraphDef:
    @property
    def fingerprint(self) -> str: ...
    @property
    def name(self) -> str: ...

# `(node, scope, step, resume_json, attempt, done_json)`.
_ExecTuple: TypeAlias = tuple[str, str, int, str | None, int, str | None]
# `(span_id, parent_span_id, started_at, ended_at)` of a node span the core queues.
_NodeSpan: TypeAlias = tuple[str, str | None, float, float]
# `(node, kind, update_json, goto_targets, payload_json, span)`.
_OutcomeTuple: TypeAlias = tuple[
    str, str, str | None, list[str] | None, str | None, _NodeSpan | None
]

@final
class GraphRun:
    def ready(self) -> list[_ExecTuple]: ...
    def answered_outside(self) -> list[str]: ...
    def answer(self, values: list[tuple[str, str]]) -> None: ...
    def aanswer(self, future: Any, values: list[tuple[str, str]]) -> None:
        """`answer` off the event loop: resolves `future` with None."""
    def step(
        self, outcomes: list[_OutcomeTuple]
    ) -> tuple[str, list[str], str | None, list[_ExecTuple]]: ...
    def astep(self, future: Any, outcomes: list[_OutcomeTuple]) -> None:
        """`step` off the event loop: resolves `future` with its tuple."""
    def route(self, labels: list[tuple[str, str]]) -> tuple[str, list[_ExecTuple]]: ...
    def aroute(self, future: Any, labels: list[tuple[str, str]]) -> None:
        """`route` off the event loop: resolves `future` with its tuple."""
    def idle_status(self) -> str: ...
    def commit(self, output_json: str | None = None) -> None: ...
    def acommit(self, future: Any, output_json: str | None = None) -> None:
        """`commit` off the event loop: resolves `future` with None."""
    def release(self, status: str) -> None: ...
    def arelease(self, future: Any, status: str) -> None:
        """`release` off the event loop: resolves `future` with None."""
    def state_json(self) -> str: ...
    def progress_json(self) -> str: ...
    def pending(self) -> list[tuple[str, str]]: ...
    @property
    def head(self) -> str | None: ...
    @property
    def version(self) -> int: ...
    @property
    def steps(self) -> int: ...

def graph_compile(spec_json: str) -> tuple[GraphDef | None, str]: ...
def graph_open(
    graph: GraphDef,
    attempt: Attempt,
    thread_id: str | None,
    input_json: str | None,
    fresh: bool,
    max_steps: int,
    deadline: float | None = None,
) -> GraphRun: ...
def graph_aopen(
    future: Any,
    graph: GraphDef,
    attempt: Attempt,
    thread_id: str | None,
    input_json: str | None,
    fresh: bool,
    max_steps: int,
    deadline: float | None = None,
) -> None:
    """`graph_open` off the event loop: resolves `future` with the GraphRun."""

def graph_from_snapshot(
    graph: GraphDef,
    attempt: Attempt,
    state_json: str,
    progress_json: str,
    max_steps: int,
    deadline: float | None = None,
) -> GraphRun: ...
def graph_check_resume(progress_json: str, names: list[str]) -> None: ...
def graph_run_head(store: Store, run_id: str) -> str | None: ...
def graph_arun_head(future: Any, store: Store, run_id: str) -> None:
    """`graph_run_head` off the event loop: resolves `future` with the id."""

def graph_answered_nodes(store: Store, run_id: str) -> list[str]: ...
def graph_aanswered_nodes(future: Any, store: Store, run_id: str) -> None:
    """`graph_answered_nodes` off the event loop: resolves `future` with the list."""

def thread_start(
    store: Store,
    graph: GraphDef,
    thread_id: str,
    args_json: str,
    budget_json: str | None,
    run_id: str,
    input_json: str,
    max_steps: int,
    deadline: float | None = None,
) -> tuple[Attempt, GraphRun]: ...
def thread_astart(
    future: Any,
    store: Store,
    graph: GraphDef,
    thread_id: str,
    args_json: str,
    budget_json: str | None,
    run_id: str,
    input_json: str,
    max_steps: int,
    deadline: float | None = None,
) -> None:
    """`thread_start` off the event loop: resolves `future` with its pair."""

def thread_aclaim(
    future: Any,
    store: Store,
    thread_id: str,
    graph: str,
    fingerprint: str,
    mode: Literal["run", "resume", "retry"],
    run_id: str | None = None,
) -> None:
    """`thread_claim` off the event loop: resolves `future` with its JSON."""

def thread_arelease(future: Any, store: Store, thread_id: str, status: str) -> None:
    """`thread_release` off the event loop: resolves `future` with None."""

def thread_ainfo(future: Any, store: Store, thread_id: str) -> None:
    """`thread_info` off the event loop: resolves `future` with its JSON."""

def thread_acheck_resume(future: Any, store: Store, thread_id: str, names: list[str]) -> None:
    """`thread_check_resume` off the event loop: resolves `future` with None."""

def thread_aaudit_add(
    future: Any,
    store: Store,
    thread_id: str,
    actor: str | None,
    action: str,
    checkpoint_id: str | None = None,
) -> None:
    """`thread_audit_add` off the event loop: resolves `future` with None."""

def thread_claim(
    store: Store,
    thread_id: str,
    graph: str,
    fingerprint: str,
    mode: Literal["run", "resume", "retry"],
    run_id: str | None = None,
) -> str: ...
def thread_release(store: Store, thread_id: str, status: str) -> None: ...
def thread_info(store: Store, thread_id: str) -> str: ...
def thread_state(store: Store, thread_id: str) -> tuple[str, str] | None: ...
def thread_history(store: Store, thread_id: str, limit: int) -> str: ...
def thread_history_any(store: Store, thread_id: str, limit: int) -> str: ...
def thread_rewind(
    store: Store, thread_id: str, graph: str, fingerprint: str, checkpoint_id: str
) -> str: ...
def thread_rewind_any(store: Store, thread_id: str, checkpoint_id: str) -> str: ...
def thread_fork(
    store: Store,
    thread_id: str,
    graph: str,
    fingerprint: str,
    checkpoint_id: str,
    new_thread_id: str,
) -> str: ...
def thread_delete(store: Store, thread_id: str, graph: str, fingerprint: str) -> bool: ...
def thread_prune(store: Store, before_ms: int) -> list[str]: ...
def thread_list(store: Store, graph: str | None = None) -> str: ...
def thread_audit_add(
    store: Store,
    thread_id: str,
    actor: str | None,
    action: str,
    checkpoint_id: str | None = None,
) -> None: ...
def thread_audit(store: Store, thread_id: str, limit: int) -> str: ...
def thread_check_resume(store: Store, thread_id: str, names: list[str]) -> None: ...

# Reading runs from outside and retention (OPS-20 … OPS-23).
def attempt_publish(
    attempt: Attempt,
    key: str,
    value_json: str,
    what: str,
    name: str,
    item_json: str,
    fence: Fence | None = None,
) -> str: ...
def attempt_append_stream(attempt: Attempt, name: str, values: list[str]) -> None: ...
def event_wait(store: Store, run_id: str, key: str, wait: float) -> tuple[str, str | None]: ...
def run_events(store: Store, run_id: str) -> list[tuple[str, str]]: ...
def stream_read(
    store: Store, run_id: str, key: str, after: int, limit: int, wait: float
) -> tuple[list[tuple[int, str]], bool]: ...
def astream_read(
    store: Store,
    future: Any,
    run_id: str,
    key: str,
    after: int,
    limit: int,
    wait: float,
) -> None: ...
def list_runs(
    store: Store,
    status: list[str],
    kind: list[str],
    name: str | None,
    since: float | None,
    until: float | None,
    query: str | None,
    limit: int,
    before: str | None,
) -> list[dict[str, Any]]: ...
def prune_runs(
    store: Store,
    older_than: float,
    statuses: list[str],
    name: str | None,
    kind: str | None,
    dry_run: bool,
    batch: int,
) -> int: ...
def compact_store(store: Store) -> tuple[int, int] | None: ...
