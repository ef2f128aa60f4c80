"""OBS store: builds (or reuses) a large composeai store for the CLI benchmarks.

Default size: 10,000 runs and 1,000,000 spans (~100 per run). Writing that
through the engine would take minutes, so the store is built in two steps:

1. **template** (a child process, the real engine): one small run of every
   shape through the public API -- a flow with tasks, a `map`, agents on
   priced, unpriced and instance models (llm spans with usage, tool spans,
   agent state), a paused flow per interrupt kind, a failed flow, standalone
   agent runs, a `pipe` and an `aggregate` run, and a span outside any run.
2. **synthesis** (this process, stdlib `sqlite3` only; it never opens a
   composeai store): the tables and indexes are created from the template's
   own `sqlite_master` SQL (so the schema is the engine's, byte for byte,
   with its `user_version`), then seeded synthetic rows of those same shapes
   are bulk-inserted (span ids as 16-byte ULID blobs, `flags`, usage
   columns, a run's spans under its `-rid` and `traces` rows for the spans
   outside any run, `journal`, `agent_state`, `pending_interrupts`), in
   the engine's order (a run's spans as they finish: children first). Every
   synthetic row's *shape* (kind, status, flags, which columns are NULL, the
   keys of its attribute/error JSON, the form of its payloads) is checked
   against the template's rows, so a schema or format change in the engine
   fails the build instead of silently benchmarking a stale layout.

The result is cached under `$COMPOSE_BENCH_TMP` (default: the system temp
dir) in `composeai-bench-obs-<key>/`, `key` a hash of the parameters, the
generator version and the template's schema; a later call with the same
parameters reuses it. Deterministic for given parameters (`--seed`); the
timeline is fixed (`--end`, Unix seconds), not "now".

    python bench/obs_store.py [--runs 10000] [--spans 1000000] [--rebuild]

prints one JSON line: the store directory, its counts, the ids of a
~100-span run and of the newest run, and the build time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import emit

GENERATOR_VERSION = 1
DEFAULT_END = 1_767_225_600.0  # 2026-01-01T00:00:00Z: a fixed timeline, reproducible


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def base_env() -> dict[str, str]:
    """The environment of child processes: no inherited store, and bytecode
    written and used as an installed package would."""
    env = dict(os.environ)
    for name in ("COMPOSE_DIR", "COMPOSE_TRACE_CONTENT", "COMPOSE_SYNC", "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    return env


# --------------------------------------------------------------------------- template (engine)

TEMPLATE = r'''
import composeai as compose
from composeai.messages import Usage
from composeai.models.registry import register_provider
from composeai.testing import FakeModel

USAGE = {
    "anthropic": Usage(input_tokens=812, output_tokens=96, cache_read_tokens=512,
                       cost_usd=0.0013, cost_complete=True),
    "openai": Usage(input_tokens=640, output_tokens=120, cost_usd=0.0002, cost_complete=True),
    "ollama": None,  # FakeModel's default usage: unpriced (cost_usd None, incomplete)
}


def reply(request):
    last = request.messages[-1]
    answered = any(getattr(p, "type", "") == "tool_result" for p in last.parts)
    if request.tools and not answered:
        return {"tool_calls": [{"name": "lookup", "arguments": {"q": "ticket 42"}}],
                "text": "Let me check."}
    return "The ticket is resolved; the customer was notified."


for provider, usage in USAGE.items():
    register_provider(provider, lambda mid, u=usage: FakeModel([reply] * 100, usage=u))


@compose.tool
def lookup(q: str) -> str:
    """Look up a ticket."""
    return f"record for {q!r}: resolved"


@compose.agent(model="anthropic/claude-haiku-4-5")
def summarizer(text: str) -> str:
    """You summarize support tickets."""
    return f"Summarize: {text}"


@compose.agent(model="openai/gpt-4o-mini", tools=[lookup])
def researcher(text: str) -> str:
    """You research tickets with tools."""
    return f"Research: {text}"


@compose.agent(model="ollama/llama3")
def drafter(text: str) -> str:
    return f"Draft: {text}"


@compose.agent(model=FakeModel([reply] * 10))
def classifier(text: str) -> str:
    return f"Classify: {text}"


@compose.task
def fetch(n):
    return {"n": n, "body": "ticket body text " * 4}


@compose.task
def tag(x):
    return {"item": x, "tag": "billing"}


@compose.task
def explode(x):
    raise ValueError(f"upstream returned 503 for {x}\nretry later")


@compose.flow
def pipeline(n):
    doc = fetch(n)
    tags = compose.map(tag, range(3))
    return [doc, tags, summarizer("a"), researcher("b"), drafter("c"), classifier("d")]


@compose.flow
def gated(n):
    fetch(n)
    return 1 if compose.approve("publish", payload={"draft": "text", "n": n}) else 0


@compose.flow
def asking(n):
    fetch(n)
    return compose.ask_human("reason", "Why was this escalated?", payload={"n": n})


@compose.flow
def failing(n):
    fetch(n)
    explode(n)


assert pipeline.run(1).status == "completed"
assert gated.run(2).status == "paused"
assert asking.run(3).status == "paused"
try:
    failing.run(4)
except ValueError:
    pass
assert summarizer.run("standalone").status == "completed"
assert researcher.run("standalone").status == "completed"
assert compose.pipe(fetch, tag).run(5).status == "completed"
assert compose.aggregate(a=fetch, b=tag).run(6).status == "completed"
fetch(7)  # outside any run: a span with no run
'''


def build_template(directory: str) -> str:
    """Runs TEMPLATE through the engine in a child process; returns runs.db."""
    env = base_env()
    env["COMPOSE_DIR"] = directory
    proc = subprocess.run(
        [sys.executable, "-c", TEMPLATE], env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"template run failed:\n{proc.stderr}")
    return os.path.join(directory, "runs.db")


def read_template(db: str) -> dict[str, Any]:
    """Schema SQL, pragmas and row shapes of the template store (opened after
    the engine process that wrote it has exited)."""
    conn = sqlite3.connect(db)
    try:
        conn.row_factory = sqlite3.Row
        schema = [
            (r["type"], r["name"], r["sql"])
            for r in conn.execute(
                "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid"
            )
        ]
        out = {
            "schema": schema,
            "user_version": conn.execute("PRAGMA user_version").fetchone()[0],
            "page_size": conn.execute("PRAGMA page_size").fetchone()[0],
            "span_columns": [r[1] for r in conn.execute("PRAGMA table_info(spans)")],
            "run_columns": [r[1] for r in conn.execute("PRAGMA table_info(runs)")],
            "span_shapes": {span_shape(dict(r)) for r in conn.execute("SELECT * FROM spans")},
            "run_shapes": {run_shape(dict(r)) for r in conn.execute("SELECT * FROM runs")},
            "pending_shapes": {
                pending_shape(dict(r)) for r in conn.execute("SELECT * FROM pending_interrupts")
            },
        }
    finally:
        conn.close()
    return out


# --------------------------------------------------------------------------- shapes


def _payload_form(text: str | None) -> str:
    if text is None:
        return "null"
    value = json.loads(text)
    if isinstance(value, dict):
        if "$kind" in value:
            return f"{value['$kind']}:{value.get('$type')}"
        if set(value) == {"args", "kwargs"}:
            return "call"
        if set(value) == {"system", "messages"}:
            return "llm-request"
    return "value"


def _keys(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(json.loads(text))


def span_shape(r: dict[str, Any]) -> tuple:
    """What must match between a synthetic span row and an engine-written one."""
    nulls = tuple(sorted(k for k, v in r.items() if v is None))
    return (
        r["kind"],
        r["status"],
        r["flags"],
        type(r["span_id"]).__name__,
        nulls,
        _keys(r["attributes_json"]),
        _keys(r["error_json"]),
        _payload_form(r["input_json"]) if r["kind"] in ("llm", "agent", "flow") else None,
        _payload_form(r["output_json"]),
    )


def run_shape(r: dict[str, Any]) -> tuple:
    nulls = tuple(sorted(k for k, v in r.items() if v is None))
    return (r["kind"], r["status"], nulls, _keys(r["error_json"]), _payload_form(r["args_json"]))


def pending_shape(r: dict[str, Any]) -> tuple:
    nulls = tuple(sorted(k for k, v in r.items() if v is None))
    return (r["kind"], nulls)


# --------------------------------------------------------------------------- ids

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def ulid_int(t: float, rng: random.Random) -> int:
    return (int(t * 1000) << 80) | rng.getrandbits(80)


def ulid_text(value: int) -> str:
    chars = []
    for _ in range(26):
        chars.append(CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def ulid_blob(t: float, rng: random.Random) -> bytes:
    return ulid_int(t, rng).to_bytes(16, "big")


def dumps(value: Any) -> str:
    """The engine's compact JSON."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# --------------------------------------------------------------------------- catalogue

# (label, attributes, $ per input token, $ per output token); None = unpriced.
MODELS = {
    "haiku": (
        "anthropic/claude-haiku-4-5",
        {"model": "claude-haiku-4-5", "provider": "anthropic"},
        1e-6,
        5e-6,
    ),
    "sonnet": (
        "anthropic/claude-sonnet-4-5",
        {"model": "claude-sonnet-4-5", "provider": "anthropic"},
        3e-6,
        15e-6,
    ),
    "mini": ("openai/gpt-4o-mini", {"model": "gpt-4o-mini", "provider": "openai"}, 0.15e-6, 0.6e-6),
    "gpt41": ("openai/gpt-4.1", {"model": "gpt-4.1", "provider": "openai"}, 2e-6, 8e-6),
    "llama": ("ollama/llama3", {"model": "llama3", "provider": "ollama"}, None, None),
    "fake": ("FakeModel", {"model": "FakeModel"}, None, None),
}

# name: (model, tools, system prompt or None)
AGENTS = {
    "summarizer": ("haiku", (), "You summarize support tickets."),
    "classifier": ("haiku", (), "Classify the ticket into one of the queues."),
    "researcher": ("mini", ("lookup", "search_docs"), "You research tickets with tools."),
    "planner": ("sonnet", ("lookup", "fetch_url"), "Plan the next steps."),
    "reviewer": ("sonnet", ("search_docs",), "Review the draft critically."),
    "writer": ("gpt41", (), "Write the customer-facing reply."),
    "extractor": ("mini", (), "Extract the fields as JSON."),
    "drafter": ("llama", (), None),
    "triager": ("fake", ("lookup",), None),
}
AGENT_NAMES = sorted(AGENTS)

FLOW_NAMES = [
    "nightly_digest",
    "triage_ticket",
    "support_reply",
    "invoice_review",
    "lead_enrichment",
    "doc_ingest",
    "release_notes",
    "incident_summary",
    "churn_check",
    "contract_review",
    "weekly_report",
    "faq_refresh",
    "email_campaign",
    "code_review",
    "data_cleanup",
    "translation_batch",
    "meeting_notes",
    "survey_analysis",
    "pricing_audit",
    "onboarding",
]
TASK_NAMES = [
    "fetch",
    "load_ticket",
    "parse",
    "normalize",
    "enrich",
    "score",
    "dedupe",
    "render",
    "publish",
    "notify",
    "store_result",
    "validate",
    "chunk",
    "embed",
    "rank",
]
WORDS = [
    *[
        "the",
        "customer",
        "ticket",
        "order",
        "invoice",
        "refund",
        "account",
        "billing",
        "shipping",
        "delay",
        "issue",
    ],
    *[
        "resolved",
        "pending",
        "escalate",
        "agent",
        "reply",
        "summary",
        "status",
        "update",
        "request",
        "error",
        "system",
    ],
    *[
        "service",
        "data",
        "report",
        "review",
        "draft",
        "final",
        "priority",
        "urgent",
        "support",
        "team",
        "product",
    ],
    *[
        "feature",
        "release",
        "note",
        "change",
        "log",
        "user",
        "email",
        "message",
        "thread",
        "context",
        "detail",
    ],
]


class Gen:
    """Seeded generator of one run's rows at a time."""

    def __init__(self, seed: int, end: float, days: float, n_runs: int) -> None:
        self.rng = random.Random(seed)
        self.start = end - days * 86400
        self.step = days * 86400 / n_runs
        corpus_rng = random.Random(seed + 1)
        self.corpus = " ".join(corpus_rng.choice(WORDS) for _ in range(60_000))
        self.flow_tasks = {
            name: random.Random(f"{seed}:{name}").sample(TASK_NAMES, 6) for name in FLOW_NAMES
        }
        self.sid = 0
        self.tid = 0
        # Per-run output buffers (filled by the builders).
        self.spans: list[tuple] = []
        self.journal: list[tuple] = []
        self.states: list[tuple] = []

    # ----------------------------------------------------------------- helpers

    def text(self, lo: int, hi: int) -> str:
        n = self.rng.randint(lo, hi)
        o = self.rng.randrange(0, len(self.corpus) - n)
        return self.corpus[o : o + n].strip()

    def span(
        self,
        tid: int,
        rid: int | None,
        sid_bytes: bytes,
        parent: bytes | None,
        kind: str,
        name: str,
        start: float,
        end: float,
        status: str,
        flags: int,
        step_key: str | None,
        attributes: str | None = None,
        error: str | None = None,
        usage: tuple | None = None,
        input_json: str | None = None,
        output_json: str | None = None,
    ) -> None:
        self.sid += 1
        u = usage or (None, None, None, None, None, None, None)
        self.spans.append(
            (
                self.sid,
                tid,
                rid,
                sid_bytes,
                parent,
                kind,
                name,
                start,
                end,
                status,
                flags,
                step_key,
                attributes,
                error,
                *u,
                input_json,
                output_json,
            )
        )

    def journaled(self, rid: int, key: str, value_json: str) -> None:
        self.journal.append((rid, key, value_json))

    @staticmethod
    def message(role: str, parts: list[dict]) -> dict:
        return {
            "$kind": "pydantic",
            "$type": "composeai.messages:Message",
            "value": {"role": role, "parts": parts},
        }

    def stacktrace(self, etype: str, message: str, frames: int) -> str:
        lines = ["Traceback (most recent call last):"]
        for i in range(frames):
            lines.append(f'  File "/srv/app/pipelines/step_{i}.py", line {10 + 7 * i}, in run')
            lines.append(f"    result = client.call(payload, attempt={i})")
        lines.append(f"{etype}: {message}")
        return "\n".join(lines) + "\n"

    # ----------------------------------------------------------------- building blocks

    def task_step(self, tid, rid, parent, t, name, key, args) -> tuple[float, Any]:
        """A journaled task call: one span (flags=2, output in the journal)."""
        start = t + self.rng.uniform(0.00002, 0.0002)
        end = start + self.rng.uniform(0.0005, 0.05)
        output = {"n": args[0], "body": self.text(20, 160)}
        self.span(
            tid,
            rid,
            ulid_blob(start, self.rng),
            parent,
            "task",
            name,
            start,
            end,
            "ok",
            2,
            key,
            input_json=dumps({"args": args, "kwargs": {}}),
        )
        self.journaled(rid, key, dumps(output))
        return end, output

    def map_step(self, tid, rid, parent, t, name, k, m) -> tuple[float, Any]:
        """`map(name, range(k))`: an aggregate span over k item spans, each
        wrapping the journaled task span."""
        start = t + self.rng.uniform(0.00002, 0.0002)
        agg_id = ulid_blob(start, self.rng)
        outputs = []
        cursor = start
        for i in range(k):
            w_start = cursor + self.rng.uniform(0.00001, 0.0001)
            w_id = ulid_blob(w_start, self.rng)
            i_start = w_start + self.rng.uniform(0.00001, 0.00005)
            i_end = i_start + self.rng.uniform(0.0002, 0.02)
            w_end = i_end + self.rng.uniform(0.00001, 0.0001)
            out = {"item": i, "tag": self.rng.choice(WORDS)}
            key = f"map#{m}[{i}]/{name}#1"
            self.span(
                tid,
                rid,
                ulid_blob(i_start, self.rng),
                w_id,
                "task",
                name,
                i_start,
                i_end,
                "ok",
                2,
                key,
                input_json=dumps({"args": [i], "kwargs": {}}),
            )
            self.journaled(rid, key, dumps(out))
            self.span(
                tid,
                rid,
                w_id,
                agg_id,
                "task",
                f"{name}[{i}]",
                w_start,
                w_end,
                "ok",
                0,
                None,
                input_json=dumps(i),
                output_json=dumps(out),
            )
            outputs.append(out)
            cursor = w_end
        end = cursor + self.rng.uniform(0.00005, 0.0005)
        self.span(
            tid,
            rid,
            agg_id,
            parent,
            "aggregate",
            f"map({name})",
            start,
            end,
            "ok",
            0,
            None,
            output_json=dumps(outputs),
        )
        return end, outputs

    def agent_step(self, tid, rid, parent, t, name, key, turns) -> tuple[float, Any]:
        """An agent call: its span, `turns` llm spans and a tool span between
        consecutive ones. `key` None: the run's root agent (not journaled)."""
        model, tools, system = AGENTS[name]
        label, attrs, p_in, p_out = MODELS[model]
        attributes = dumps(attrs)
        start = t + self.rng.uniform(0.00002, 0.0002)
        agent_id = ulid_blob(start, self.rng)
        prompt = f"{name.capitalize()}: {self.text(100, 800)}"
        args = {"args": [prompt], "kwargs": {}}
        messages = [self.message("user", [{"type": "text", "text": prompt}])]
        cursor = start + self.rng.uniform(0.0002, 0.002)
        final = ""
        for turn in range(turns):
            l_start = cursor + self.rng.uniform(0.00005, 0.0005)
            l_end = l_start + self.rng.uniform(0.4, 6.0)
            request = dumps({"system": system, "messages": messages})
            last = turn == turns - 1
            if last:
                final = self.text(80, 700)
                parts = [{"type": "text", "text": final}]
            else:
                call_id = ulid_text(ulid_int(l_end, self.rng))
                tool = self.rng.choice(tools)
                arguments = {"q": self.text(10, 60)}
                parts = [
                    {"type": "text", "text": self.text(10, 80)},
                    {"type": "tool_call", "id": call_id, "name": tool, "arguments": arguments},
                ]
            reply = self.message("assistant", parts)
            in_tok = len(request) // 4 + self.rng.randint(0, 40)
            out_tok = len(dumps(parts)) // 4 + self.rng.randint(0, 20)
            cache_read = (in_tok // 2) if model in ("haiku", "sonnet") and turn else 0
            reasoning = self.rng.randint(0, 300) if model == "sonnet" else 0
            if p_in is None:
                cost, complete = None, 0
            else:
                cost, complete = round(in_tok * p_in + out_tok * p_out, 10), 1
            self.span(
                tid,
                rid,
                ulid_blob(l_start, self.rng),
                agent_id,
                "llm",
                label,
                l_start,
                l_end,
                "ok",
                0,
                None,
                attributes=attributes,
                usage=(in_tok, out_tok, cache_read, 0, reasoning, cost, complete),
                input_json=request,
                output_json=dumps(reply),
            )
            messages.append(reply)
            cursor = l_end
            if not last:
                t_start = cursor + self.rng.uniform(0.0001, 0.001)
                t_end = t_start + self.rng.uniform(0.01, 0.3)
                result = self.text(40, 400)
                self.span(
                    tid,
                    rid,
                    ulid_blob(t_start, self.rng),
                    agent_id,
                    "tool",
                    tool,
                    t_start,
                    t_end,
                    "ok",
                    0,
                    None,
                    input_json=dumps(arguments),
                    output_json=dumps(result),
                )
                messages.append(
                    self.message(
                        "user",
                        [
                            {
                                "type": "tool_result",
                                "tool_call_id": call_id,
                                "content": result,
                                "is_error": False,
                            }
                        ],
                    )
                )
                cursor = t_end
        end = cursor + self.rng.uniform(0.0002, 0.002)
        if key is None:
            self.span(
                tid,
                rid,
                agent_id,
                parent,
                "agent",
                name,
                start,
                end,
                "ok",
                0,
                None,
                input_json=dumps(args),
                output_json=dumps(final),
            )
        else:
            self.span(
                tid,
                rid,
                agent_id,
                parent,
                "agent",
                name,
                start,
                end,
                "ok",
                2,
                key,
                input_json=dumps(args),
            )
            self.journaled(rid, key, dumps(final))
        if turns > 1:
            self.states.append((rid, key or "", dumps(messages[:-1]), None, turns - 1, cursor))
        return end, final

    # ----------------------------------------------------------------- runs

    def new_trace(self, rid: int | None, created: float) -> tuple[int, str, str]:
        """`(tid, run id, trace id)`: a run's own trace is stored under -rid,
        with no `traces` row; a trace outside any run gets the next row."""
        if rid is None:
            self.tid += 1
            tid = self.tid
        else:
            tid = -rid
        value = ulid_int(created, self.rng)
        return tid, ulid_text(value), ulid_text(value + 1)

    def flow_plan(self, target: int, ending: str) -> tuple[int, int, list[tuple[str, int]]]:
        """(journaled tasks, map items, [(agent, llm turns)]) totalling `target` spans."""
        agents = []
        for _ in range(self.rng.randint(3, 8)):
            name = self.rng.choice(AGENT_NAMES)
            turns = self.rng.randint(2, 6) if AGENTS[name][1] else 1
            agents.append((name, turns))
        n_tasks = self.rng.randint(2, 6)
        fixed = 1 + (ending != "completed") + 1  # root, ending span, the map's aggregate
        agent_spans = sum(1 + t + (t - 1) for _, t in agents)
        rest = target - fixed - n_tasks - agent_spans
        if rest < 2:
            raise ValueError(f"flow target {target} too small")
        n_tasks += rest % 2
        return n_tasks, rest // 2, agents

    def flow_run(self, rid: int, created: float, target: int, ending: str) -> dict:
        name = self.rng.choice(FLOW_NAMES)
        tasks = self.flow_tasks[name]
        n_tasks, k, agents = self.flow_plan(target, ending)
        tid, run_id, trace_id = self.new_trace(rid, created)
        arg = self.rng.randint(1, 10_000)
        args = {"args": [arg], "kwargs": {}}
        root_start = created + self.rng.uniform(0.00005, 0.0003)
        root_id = ulid_blob(root_start, self.rng)
        t = root_start
        counts: dict[str, int] = {}

        def key(step: str) -> str:
            counts[step] = counts.get(step, 0) + 1
            return f"{step}#{counts[step]}"

        outputs: list[Any] = []
        # Steps in order: a task, the map, then agents and the remaining tasks interleaved.
        steps: list[tuple] = [("task", tasks[0]), ("map", tasks[1])]
        middle = [("task", tasks[2 + i % 4]) for i in range(n_tasks - 1)]
        middle += [("agent", a) for a in agents]
        self.rng.shuffle(middle)
        steps += middle
        for step in steps:
            if step[0] == "task":
                t, out = self.task_step(tid, rid, root_id, t, step[1], key(step[1]), [arg])
            elif step[0] == "map":
                t, out = self.map_step(tid, rid, root_id, t, step[1], k, 1)
            else:
                agent, turns = step[1]
                t, out = self.agent_step(tid, rid, root_id, t, agent, key(agent), turns)
            outputs.append(out)
        pending = []
        error = None
        if ending == "paused":
            p_t = t + self.rng.uniform(0.00002, 0.0002)
            if self.rng.random() < 0.5:
                iid, ikind, question = "publish", "approval", None
                payload = {"draft": self.text(40, 300), "n": arg}
            else:
                iid, ikind, question = "reason", "question", "Why was this escalated?"
                payload = {"n": arg}
            self.span(
                tid,
                rid,
                ulid_blob(p_t, self.rng),
                root_id,
                "pause",
                iid,
                p_t,
                p_t,
                "paused",
                0,
                None,
                input_json=dumps(payload),
            )
            t = p_t
            pending.append([rid, iid, ikind, question, dumps(payload)])
        elif ending == "failed":
            etype = self.rng.choice(["ValueError", "TimeoutError", "KeyError"])
            message = f"upstream returned 503 for {arg}\nretry later"
            f_start = t + self.rng.uniform(0.00002, 0.0002)
            f_end = f_start + self.rng.uniform(0.001, 0.5)
            step_name = tasks[5]
            self.span(
                tid,
                rid,
                ulid_blob(f_start, self.rng),
                root_id,
                "task",
                step_name,
                f_start,
                f_end,
                "error",
                0,
                key(step_name),
                error=dumps(
                    {
                        "type": etype,
                        "message": message,
                        "stacktrace": self.stacktrace(etype, message, 5),
                    }
                ),
                input_json=dumps({"args": [arg], "kwargs": {}}),
            )
            t = f_end
            error = (etype, message)
        root_end = t + self.rng.uniform(0.0001, 0.001)
        status = {"completed": "ok", "paused": "paused", "failed": "error"}[ending]
        root_error = None
        if error:
            root_error = dumps(
                {
                    "type": error[0],
                    "message": error[1],
                    "stacktrace": self.stacktrace(error[0], error[1], 9),
                }
            )
        output = dumps(outputs) if ending == "completed" else None
        self.span(
            tid,
            rid,
            root_id,
            None,
            "flow",
            name,
            root_start,
            root_end,
            status,
            0,
            None,
            error=root_error,
            input_json=dumps(args),
            output_json=output,
        )
        updated = root_end + self.rng.uniform(0.00005, 0.0003)
        for p in pending:
            p.append(updated)
        fingerprint = hashlib.sha256(f"{name}:{GENERATOR_VERSION}".encode()).hexdigest()
        return {
            "run": (
                rid,
                run_id,
                "flow",
                name,
                ending,
                created,
                updated,
                trace_id,
                fingerprint,
                dumps(args),
                output,
                dumps({"type": error[0], "message": error[1]}) if error else None,
                None,
                None,
                None,
            ),
            "pending": [tuple(p) for p in pending],
        }

    def agent_run(self, rid: int, created: float, turns: int, name: str) -> dict:
        tid, run_id, trace_id = self.new_trace(rid, created)
        _, final = self.agent_step(tid, rid, None, created, name, None, turns)
        root = self.spans[-1]
        updated = root[8] + self.rng.uniform(0.00005, 0.0003)
        return {
            "run": (
                rid,
                run_id,
                "agent",
                name,
                "completed",
                created,
                updated,
                trace_id,
                None,
                root[-2],
                dumps(final),
                None,
                None,
                None,
                None,
            ),
            "pending": [],
        }

    def combinator_run(self, rid: int, created: float, kind: str, n: int) -> dict:
        """A `pipe` of n tasks or an `aggregate` of n branches, run on its own."""
        tid, run_id, trace_id = self.new_trace(rid, created)
        names = self.rng.sample(TASK_NAMES, n)
        branches = [chr(ord("a") + i) for i in range(n)]
        root_in = self.rng.randint(1, 1000)
        value: Any = root_in
        root_start = created + self.rng.uniform(0.00005, 0.0003)
        root_id = ulid_blob(root_start, self.rng)
        cursor = root_start
        outputs = {}
        for i, task in enumerate(names):
            w_start = cursor + self.rng.uniform(0.00001, 0.0001)
            w_id = ulid_blob(w_start, self.rng)
            i_start = w_start + self.rng.uniform(0.00001, 0.00005)
            i_end = i_start + self.rng.uniform(0.0002, 0.02)
            w_end = i_end + self.rng.uniform(0.00001, 0.0001)
            arg = value if kind == "pipe" else root_in
            out = {"n": i, "body": self.text(20, 120)}
            key = f"{task}#1" if kind == "pipe" else f"aggregate#1/{branches[i]}/{task}#1"
            self.span(
                tid,
                rid,
                ulid_blob(i_start, self.rng),
                w_id,
                "task",
                task,
                i_start,
                i_end,
                "ok",
                2,
                key,
                input_json=dumps({"args": [arg], "kwargs": {}}),
            )
            self.journaled(rid, key, dumps(out))
            self.span(
                tid,
                rid,
                w_id,
                root_id,
                "task",
                task,
                w_start,
                w_end,
                "ok",
                0,
                None,
                input_json=dumps(arg),
                output_json=dumps(out),
            )
            outputs[branches[i]] = out
            if kind == "pipe":
                value = out
            cursor = w_end
        root_end = cursor + self.rng.uniform(0.00005, 0.0005)
        if kind == "pipe":
            name, output = f"pipe({' → '.join(names)})", value
        else:
            name, output = f"aggregate({', '.join(branches)})", outputs
        self.span(
            tid,
            rid,
            root_id,
            None,
            kind,
            name,
            root_start,
            root_end,
            "ok",
            0,
            None,
            input_json=dumps(root_in),
            output_json=dumps(output),
        )
        updated = root_end + self.rng.uniform(0.00005, 0.0003)
        return {
            "run": (
                rid,
                run_id,
                kind,
                name,
                "completed",
                created,
                updated,
                trace_id,
                None,
                None,
                dumps(output),
                None,
                None,
                None,
                None,
            ),
            "pending": [],
        }

    def orphan(self, t: float) -> tuple[int, str]:
        """A task called outside any run: one span, its own trace, no run."""
        tid, _, trace_id = self.new_trace(None, t)
        task = self.rng.choice(TASK_NAMES)
        arg = self.rng.randint(1, 1000)
        end = t + self.rng.uniform(0.0005, 0.05)
        self.span(
            tid,
            None,
            ulid_blob(t, self.rng),
            None,
            "task",
            task,
            t,
            end,
            "ok",
            0,
            None,
            input_json=dumps({"args": [arg], "kwargs": {}}),
            output_json=dumps({"n": arg, "body": self.text(20, 120)}),
        )
        return tid, trace_id


# --------------------------------------------------------------------------- plan


def plan_runs(rng: random.Random, n_runs: int, n_spans: int, n_orphans: int) -> list[tuple]:
    """[(kind, ending_or_name, size)] per run, sizes totalling n_spans - n_orphans."""
    plan: list[list] = []
    for _ in range(n_runs):
        r = rng.random()
        if r < 0.005:
            plan.append(["flow", "paused", 0])
        elif r < 0.025:
            plan.append(["flow", "failed", 0])
        elif r < 0.105:
            name = rng.choice(AGENT_NAMES)
            turns = rng.randint(1, 4) if AGENTS[name][1] else 1
            plan.append(["agent", name, turns])
        elif r < 0.13:
            plan.append(["pipe", None, rng.randint(2, 3)])
        elif r < 0.155:
            plan.append(["aggregate", None, rng.randint(2, 4)])
        else:
            plan.append(["flow", "completed", 0])
    # The newest run is a completed flow (for `compose trace --last`).
    plan[-1] = ["flow", "completed", 0]
    fixed = 0
    for kind, _, size in plan:
        if kind == "agent":
            fixed += 1 + size + (size - 1)
        elif kind in ("pipe", "aggregate"):
            fixed += 1 + 2 * size
    flows = [p for p in plan if p[0] == "flow"]
    budget = n_spans - n_orphans - fixed
    mean = budget / len(flows)
    if mean < 40:
        raise SystemExit(f"--spans {n_spans} is too few for --runs {n_runs} (~{mean:.0f}/flow)")
    for p in flows:
        p[2] = round(mean * rng.uniform(0.8, 1.2))
    diff = budget - sum(p[2] for p in flows)
    i = 0
    while diff:
        step = 1 if diff > 0 else -1
        flows[i % len(flows)][2] += step
        diff -= step
        i += 1
    # The newest run: exactly 100 spans (borrowing from the one before).
    last = flows[-1]
    delta = last[2] - 100
    last[2] -= delta
    flows[-2][2] += delta
    return [tuple(p) for p in plan]


# --------------------------------------------------------------------------- build

SPAN_INSERT = (
    "INSERT INTO spans(sid, tid, rid, span_id, parent, kind, name, started_at, ended_at, "
    "status, flags, step_key, attributes_json, error_json, input_tokens, output_tokens, "
    "cache_read_tokens, cache_creation_tokens, reasoning_tokens, cost_usd, cost_complete, "
    "input_json, output_json) VALUES(" + ",".join("?" * 23) + ")"
)
RUN_INSERT = (
    "INSERT INTO runs(rid, run_id, kind, name, status, created_at, updated_at, trace_id, "
    "fingerprint, args_json, output_json, error_json, budget_json, lease_owner, lease_until) "
    "VALUES(" + ",".join("?" * 15) + ")"
)
SPAN_COLUMNS = SPAN_INSERT.split("(", 2)[1].split(")")[0].replace(" ", "").split(",")
RUN_COLUMNS = RUN_INSERT.split("(", 2)[1].split(")")[0].replace(" ", "").split(",")


def synthesize(db: str, tpl: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    if sorted(SPAN_COLUMNS) != sorted(tpl["span_columns"]):
        raise RuntimeError(f"spans columns changed: {tpl['span_columns']}")
    if sorted(RUN_COLUMNS) != sorted(tpl["run_columns"]):
        raise RuntimeError(f"runs columns changed: {tpl['run_columns']}")
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(f"PRAGMA page_size={tpl['page_size']}")
    conn.execute("PRAGMA journal_mode=OFF")
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("PRAGMA cache_size=-262144")
    conn.execute("BEGIN")
    for kind, _, sql in tpl["schema"]:
        if kind == "table":
            conn.execute(sql)

    n_orphans = max(1, args.runs // 100)
    gen = Gen(args.seed, args.end, args.days, args.runs)
    plan = plan_runs(random.Random(args.seed + 2), args.runs, args.spans, n_orphans)
    orphan_every = args.runs // n_orphans
    runs, traces, pending = [], [], []
    target: tuple[int, str] | None = None  # (distance from the middle, run id)
    sizes: dict[str, int] = {}
    counts = {"runs": 0, "spans": 0, "journal": 0, "agent_state": 0}
    shape_errors: set[tuple] = set()
    checked = 0

    def flush() -> None:
        conn.executemany(SPAN_INSERT, gen.spans)
        conn.executemany(RUN_INSERT, runs)
        conn.executemany("INSERT INTO traces(tid, trace_id) VALUES(?, ?)", traces)
        conn.executemany(
            "INSERT INTO journal(rid, step_key, value_json) VALUES(?,?,?)", gen.journal
        )
        conn.executemany(
            "INSERT INTO agent_state(rid, scope_key, messages_json, partial_results_json, turn, "
            "updated_at) VALUES(?,?,?,?,?,?)",
            gen.states,
        )
        conn.executemany(
            "INSERT INTO pending_interrupts(rid, interrupt_id, kind, question, payload_json, "
            "created_at) VALUES(?,?,?,?,?,?)",
            pending,
        )
        counts["spans"] += len(gen.spans)
        counts["runs"] += len(runs)
        counts["journal"] += len(gen.journal)
        counts["agent_state"] += len(gen.states)
        for buf in (gen.spans, runs, traces, gen.journal, gen.states, pending):
            buf.clear()

    def check(first_span: int, run_row: tuple | None, pend: list[tuple]) -> None:
        nonlocal checked
        for row in gen.spans[first_span:]:
            shape = span_shape(dict(zip(SPAN_COLUMNS, row)))
            if shape not in tpl["span_shapes"]:
                shape_errors.add(("span", shape))
        if run_row is not None:
            shape = run_shape(dict(zip(RUN_COLUMNS, run_row)))
            if shape not in tpl["run_shapes"]:
                shape_errors.add(("run", shape))
        for p in pend:
            cols = ["rid", "interrupt_id", "kind", "question", "payload_json", "created_at"]
            shape = pending_shape(dict(zip(cols, p)))
            if shape not in tpl["pending_shapes"]:
                shape_errors.add(("pending", shape))
        checked += 1

    seen_kinds: set[tuple] = set()
    middle = args.runs // 2
    for i, (kind, what, size) in enumerate(plan):
        rid = i + 1
        created = gen.start + i * gen.step + gen.rng.uniform(0, gen.step * 0.5)
        if i % orphan_every == orphan_every // 2:
            first = len(gen.spans)
            traces.append(gen.orphan(created - gen.step * 0.25))
            check(first, None, [])
        first = len(gen.spans)
        if kind == "flow":
            out = gen.flow_run(rid, created, size, what)
        elif kind == "agent":
            out = gen.agent_run(rid, created, size, what)
        else:
            out = gen.combinator_run(rid, created, kind, size)
        runs.append(out["run"])
        pending.extend(out["pending"])
        n = len(gen.spans) - first
        run_id = out["run"][1]
        if kind == "flow" and what == "completed" and n == 100:
            cand = (abs(i - middle), run_id)
            if target is None or cand < target:
                target = cand
        sizes[run_id] = n
        # Check the shape of every run kind's first few rows, and a sample after.
        signature = (kind, what if kind == "flow" else None)
        if signature not in seen_kinds or i % 50 == 0:
            seen_kinds.add(signature)
            check(first, out["run"], out["pending"])
        if len(gen.spans) >= 20_000:
            flush()
    flush()
    if shape_errors:
        lines = "\n".join(f"  {k}: {s}" for k, s in sorted(shape_errors, key=str))
        raise RuntimeError(f"synthetic rows the engine never writes:\n{lines}")
    log(f"obs store: {checked} runs' rows checked against the engine's shapes")
    conn.execute("COMMIT")
    for kind, _, sql in tpl["schema"]:
        if kind == "index":
            conn.execute(sql)
    conn.execute(f"PRAGMA user_version={tpl['user_version']}")
    llm = conn.execute("SELECT count(*) FROM spans WHERE kind = 'llm'").fetchone()[0]
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    conn.close()
    if mode != "wal":
        raise RuntimeError(f"could not set WAL mode ({mode})")
    last_id = runs_last_id(db)
    if target is None:
        raise RuntimeError("no completed flow run of exactly 100 spans")
    return {
        **counts,
        "llm_spans": llm,
        "paused_runs": sum(1 for p in plan if p[1] == "paused"),
        "failed_runs": sum(1 for p in plan if p[1] == "failed"),
        "orphan_spans": n_orphans,
        "target_run_id": target[1],
        "target_run_spans": sizes[target[1]],
        "last_run_id": last_id,
        "last_run_spans": sizes[last_id],
    }


def runs_last_id(db: str) -> str:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(
            "SELECT run_id FROM runs ORDER BY created_at DESC, rid DESC LIMIT 1"
        ).fetchone()[0]
    finally:
        conn.close()


# --------------------------------------------------------------------------- cache


def cache_root() -> str:
    return os.environ.get("COMPOSE_BENCH_TMP") or tempfile.gettempdir()


def ensure_store(
    runs: int = 10_000,
    spans: int = 1_000_000,
    seed: int = 1,
    days: float = 90.0,
    end: float = DEFAULT_END,
    rebuild: bool = False,
) -> dict[str, Any]:
    """The directory (COMPOSE_DIR) of a built store and its metadata; builds
    it unless a cached one with the same key exists. Never opens the store
    with composeai in this process."""
    args = argparse.Namespace(runs=runs, spans=spans, seed=seed, days=days, end=end)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="composeai-bench-obs-template-") as tdir:
        tpl = read_template(build_template(tdir))
    template_s = time.perf_counter() - t0
    params = {"runs": runs, "spans": spans, "seed": seed, "days": days, "end": end}
    material = json.dumps(
        [GENERATOR_VERSION, params, tpl["schema"], tpl["user_version"], tpl["page_size"]],
        sort_keys=True,
    )
    key = hashlib.sha256(material.encode()).hexdigest()[:16]
    final = os.path.join(cache_root(), f"composeai-bench-obs-{key}")
    meta_path = os.path.join(final, "meta.json")
    if os.path.exists(meta_path) and not rebuild:
        with open(meta_path) as f:
            meta = json.load(f)
        meta["dir"] = final  # the directory may have been moved
        meta["cached"] = True
        return meta
    if os.path.exists(final):
        shutil.rmtree(final)
    work = f"{final}.building-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work, mode=0o700)
    try:
        log(f"obs store: building {runs} runs / {spans} spans in {final} ...")
        t1 = time.perf_counter()
        stats = synthesize(os.path.join(work, "runs.db"), tpl, args)
        build_s = time.perf_counter() - t1
        db_bytes = os.path.getsize(os.path.join(work, "runs.db"))
        meta = {
            "dir": final,
            "key": key,
            "params": params,
            **stats,
            "db_bytes": db_bytes,
            "template_s": round(template_s, 2),
            "build_s": round(build_s, 2),
            "generator_version": GENERATOR_VERSION,
        }
        with open(os.path.join(work, "meta.json"), "w") as f:
            json.dump(meta, f, indent=2)
        os.rename(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    log(f"obs store: built in {build_s:.1f}s ({db_bytes / 1e6:.0f} MB)")
    meta["cached"] = False
    return meta


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--spans", type=int, default=1_000_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--days", type=float, default=90.0, help="timeline length (days)")
    p.add_argument("--end", type=float, default=DEFAULT_END, help="newest run time (Unix s)")
    p.add_argument("--rebuild", action="store_true", help="ignore a cached store")
    a = p.parse_args()
    emit(ensure_store(a.runs, a.spans, a.seed, a.days, a.end, a.rebuild))


if __name__ == "__main__":
    main()
