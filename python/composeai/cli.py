"""The `compose` command line: inspect the local run store.

Kept light on purpose: besides the standard library it needs only the
compiled core, `composeai.errors` and `composeai._show` (the helpers it
shares with the web UI), plus `composeai._codec` for `--import` and the
message types for `export`, so `compose runs` starts fast. The core
does the database work (`query_runs`, `search_runs`, `trace_view`,
`diff_view`, `llm_costs`, `export_view`); this module parses arguments and
formats what needs Python semantics (`repr`, `format`, `json.dumps`).

Stored values are never decoded except by `export`, which must rebuild
`Message` objects: it decodes through the type registry only, so a
type tag naming an unregistered class (`os:system`, ...) is refused, never
imported. Everything else reads stored JSON as plain JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from .messages import Usage

from . import _core
from ._show import (
    _GLYPHS,
    _KINDS,
    _STATUSES,
    _age,
    _ambiguous,
    _bucket_cost,
    _cost,
    _db_path,
    _duration,
    _graph_store,
    _parked,
    _parse_since,
    _state_dir,
    _store_target,
)
from ._version import __version__
from .errors import ComposeError

__all__ = ["main"]


def _parse_limit(value: str, parser: argparse.ArgumentParser) -> int:
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if limit <= 0:
        parser.error(f"--limit must be a positive integer, got '{value}'")
    return limit


def _import_modules(modules: list[str]) -> None:
    """Import each `--import` module and register its types."""
    if not modules:
        return
    # The console script does not put the working directory on sys.path;
    # `--import myapp.flows` should find the project it is run from.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    from ._codec import register_module_types

    for name in modules:
        try:
            register_module_types(importlib.import_module(name))
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 -- any failure is reported (OBS-37)
            raise ComposeError(f"--import {name}: {e}") from None


_FTS_MISSING = (
    "compose: full-text search unavailable (FTS5 not compiled into this sqlite3 build) "
    "-- ignoring -q"
)


def _cmd_prune(args: argparse.Namespace) -> int:
    """`compose runs --prune --older-than X`: deletes settled runs older than X."""
    from datetime import datetime

    from .retention import compact, delete_runs

    if args.older_than is None:
        args.parser.error("--prune needs --older-than (for example --older-than 30d)")
    if args.status not in (None, "completed", "failed", "cancelled"):
        args.parser.error(
            f"--prune deletes settled runs only: --status must be completed, failed or cancelled, "
            f"got '{args.status}'"
        )
    try:
        cutoff = datetime.fromtimestamp(_parse_since(args.older_than))
    except ComposeError:
        raise ComposeError(
            f"invalid --older-than value '{args.older_than}': expected '<N>d', '<N>h', "
            "or 'YYYY-MM-DD'"
        ) from None
    status = args.status or ("completed", "failed", "cancelled")
    count = delete_runs(
        older_than=cutoff, status=status, name=args.name, kind=args.kind, dry_run=args.dry_run
    )
    noun = "run" if count == 1 else "runs"
    print(f"would delete {count} {noun}" if args.dry_run else f"deleted {count} {noun}")
    if args.vacuum and not args.dry_run:
        sizes = compact()
        if sizes is None:
            print("vacuum: the server reclaims the space itself (autovacuum)")
        else:
            before, after = sizes
            print(f"vacuum: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
    return 0


def _cmd_runs(args: argparse.Namespace) -> int:
    if args.prune:
        return _cmd_prune(args)
    if args.older_than is not None or args.dry_run or args.vacuum:
        args.parser.error("--older-than, --dry-run and --vacuum go with --prune")
    limit = _parse_limit(args.limit, args.parser)
    since = _parse_since(args.since) if args.since is not None else None
    _import_modules(args.imports)
    if args.query is None:
        rows = _core.query_runs(_db_path(), args.status, args.kind, since, limit) or []
    else:
        outcome, value = _core.search_runs(
            _db_path(), args.query, args.status, args.kind, since, limit
        )
        if outcome == "bad_query":
            raise ComposeError(f"invalid -q/--query syntax '{args.query}': {value}")
        if outcome == "unavailable":
            print(_FTS_MISSING, file=sys.stderr)
        rows = value or []
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no runs found")
        return 0
    now = time.time()
    parked = _parked(rows)
    header = f"{'RUN ID':<26}  {'KIND':<9} {'NAME':<20} {'STATUS':<10} {'AGE':<9} {'COST':>10}"
    lines = [f"{header} {'TOKENS':>12}"]
    for r in rows:
        age = _age(r["created_at"], now)
        cost = _cost(r["cost_usd"], r["cost_complete"])
        lines.append(
            f"{r['run_id']:<26}  {r['kind']:<9} {r['name']:<20} {r['status']:<10} "
            f"{age:<9} {cost:>10} {r['tokens']:>8} tok{parked.get(r['run_id'], '')}"
        )
    print("\n".join(lines))
    return 0


def _not_found(run_id: str) -> ComposeError:
    from . import _engine

    return ComposeError(_engine.run_not_found(run_id, "id"))


def _color() -> bool:
    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):
        tty = False
    return tty and "NO_COLOR" not in os.environ


def _payload(payload_json: str | None) -> object:
    if payload_json is None:
        return None
    try:
        return json.loads(payload_json)
    except ValueError:
        return payload_json


def _resume_lines(module: str | None) -> list[str]:
    """The hint's first lines: the import that registers the run's flow (its
    module is recorded with the run), then resume's."""
    first = [f"    import {module}"] if module else []
    return [*first, "    from composeai import resume"]


def _parked_banner(run_id: str, pending: list[tuple], module: str | None = None) -> str:
    """A run parked on a durable timer or signal."""
    lines = ["", f"⏸  run {run_id} is parked on {len(pending)} durable wait(s):"]
    for interrupt_id, kind, _question, payload_json in pending:
        payload = _payload(payload_json)
        payload = payload if isinstance(payload, dict) else {}
        if kind == "timer":
            lines.append(f"  - id={interrupt_id!r} kind='timer' wakes at {payload.get('wake_at')}")
        else:
            lines.append(
                f"  - id={interrupt_id!r} kind='signal' waits for signal {payload.get('name')!r}"
            )
    lines += [
        "",
        "A running `compose worker` (with --import for its flow) continues it when due; or:",
        *_resume_lines(module),
        f"    resume({run_id!r})",
    ]
    if any(p[1] == "signal" for p in pending):
        lines.append(f"    # signal it: compose signal {run_id} NAME --json VALUE")
    return "\n".join(lines)


def _paused_banner(run_id: str, pending: list[tuple], module: str | None = None) -> str:
    if pending and all(p[1] in ("timer", "signal") for p in pending):
        return _parked_banner(run_id, pending, module)
    lines = ["", f"⏸  run {run_id} is paused with {len(pending)} pending interrupt(s):"]
    answers: dict[str, object] = {}
    for interrupt_id, kind, question, payload_json in pending:
        lines.append(f"  - id={interrupt_id!r} kind={kind!r} question={question!r}")
        lines.append(f"    payload={_payload(payload_json)!r}")
        answers[interrupt_id] = True if kind == "approval" else "<answer>"
    lines += [
        "",
        "To resume:",
        *_resume_lines(module),
        f"    resume({run_id!r}, answers={answers!r})",
    ]
    if module and len(pending) == 1:
        first = pending[0][0]
        value = "--yes" if pending[0][1] == "approval" else "--json VALUE"
        lines.append(
            f"    # or: compose answer {run_id} {first} {value} --resume --import {module}"
        )
    return "\n".join(lines)


def _cmd_trace(args: argparse.Namespace) -> int:
    if args.run_id is None and not args.last:
        print("compose trace: provide a run id or --last", file=sys.stderr)
        return 1
    _import_modules(args.imports)
    run_id = None if args.last else args.run_id
    outcome, value = _core.trace_view(_db_path(), run_id, args.format, _color())
    if outcome in ("no_store", "not_found"):
        if run_id is None:
            raise ComposeError("no runs found")
        raise _not_found(run_id)
    if outcome == "ambiguous":
        raise _ambiguous(args.run_id, value)
    print(value["text"])
    # Mermaid output is meant to be piped into a renderer: the hint goes to
    # stderr, so stdout stays a valid diagram.
    hint = sys.stderr if args.format == "mermaid" else sys.stdout
    for upgrade in value.get("upgrades", ()):
        # OPS-3: each re-stamp of the run to new code, in order.
        u = json.loads(upgrade)
        print(
            f"upgraded  {str(u.get('from') or '(none)')[:12]} -> {str(u.get('to'))[:12]}"
            f"  at {_iso(u['at'])}",
            file=hint,
        )
    if value["events"]:
        # The latest value of each event the run published.
        print("\nevents:", file=hint)
        for key, value_json in value["events"]:
            print(f"  {key} = {value_json}", file=hint)
    if value["status"] == "paused" and not value["pending"]:
        # Answered (`compose answer`), not continued yet.
        print(
            f"\n⏸  run {value['run_id']} is answered and due: `compose worker` continues it",
            file=hint,
        )
    elif value["status"] == "paused":
        found, row = _core.resolve_run(_db_path(), value["run_id"])
        module = row.get("module") if found == "found" else None
        print(_paused_banner(value["run_id"], value["pending"], module), file=hint)
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    """Continues due runs until SIGINT/SIGTERM (or one pass, --once)."""
    if args.concurrency < 1:
        args.parser.error(f"--concurrency must be a positive integer, got {args.concurrency}")
    if args.interval <= 0:
        args.parser.error(f"--interval must be a positive number, got {args.interval}")
    if args.grace < 0:
        args.parser.error(f"--grace must be 0 or more seconds, got {args.grace}")
    retention = None
    if args.retention is not None:
        from .retention import parse_age

        try:
            retention = parse_age(args.retention, "--retention")
        except ComposeError as e:
            args.parser.error(str(e))
    _import_modules(args.imports)
    from .worker import run_worker

    return run_worker(
        [],
        once=args.once,
        interval=args.interval,
        concurrency=args.concurrency,
        queues=tuple(args.queues),
        grace=args.grace,
        upgrade=args.upgrade,
        retention=retention,
    )


def _cmd_queues(args: argparse.Namespace) -> int:
    """Per queue, queued, running, completed in the last hour and
    the age of the oldest queued run."""
    from . import _engine

    kind, target = _store_target()
    missing = kind == "sqlite" and not Path(target).exists()
    rows = [] if missing else _core.queue_stats(_engine.get_store())
    now = time.time()
    if args.json:
        out = [
            {
                "queue": name,
                "queued": queued,
                "running": running,
                "completed_last_hour": done,
                "oldest_queued_age_s": None if oldest is None else round(now - oldest, 3),
            }
            for name, queued, running, done, oldest in rows
        ]
        print(json.dumps(out, indent=2))
        return 0
    if not rows:
        print("no queues found")
        return 0
    width = max(5, *(len(r[0]) for r in rows))
    lines = [f"{'QUEUE':<{width}}  {'QUEUED':>7} {'RUNNING':>8} {'DONE 1H':>8}  OLDEST QUEUED"]
    for name, queued, running, done, oldest in rows:
        age = "-" if oldest is None else _duration(now - oldest)
        lines.append(f"{name:<{width}}  {queued:>7} {running:>8} {done:>8}  {age}")
    print("\n".join(lines))
    return 0


def _cmd_signal(args: argparse.Namespace) -> int:
    """`compose signal RUN_ID NAME [--json VALUE]`."""
    value = None
    if args.json is not None:
        try:
            value = json.loads(args.json)
        except ValueError as e:
            raise ComposeError(f"--json value is not valid JSON: {e}") from None
    _import_modules(args.imports)
    from . import durable

    durable.signal(args.run_id, args.name, value)
    print(f"signal {args.name!r} sent to run {args.run_id}")
    return 0


def _cmd_answer(args: argparse.Namespace) -> int:
    """`compose answer RUN_ID INTERRUPT_ID [--json VALUE | --yes | --no] [--resume]`
    and `compose answer RUN_ID --list`."""
    from . import _answer

    _import_modules(args.imports)
    if args.list:
        run = _answer.resolve(args.run_id)
        if args.json_list:
            print(json.dumps([p.as_dict() for p in _answer.pending(run["run_id"])], indent=2))
            return 0
        found = _answer.pending(run["run_id"])
        if not found:
            print(f"run {run['run_id']} ({run['status']}) has no pending interrupts")
        for p in found:
            print(f"{p.id}  kind={p.kind}  question={json.dumps(p.question)}")
            print(f"    payload={json.dumps(p.payload)}")
        return 0
    if args.interrupt_id is None:
        args.parser.error("INTERRUPT_ID is required (or --list)")
    if args.value is None:
        args.parser.error("give the answer: --json VALUE, --yes or --no")
    value = args.value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ComposeError(f"--json value is not valid JSON: {e}") from None
    done = _answer.answer(args.run_id, args.interrupt_id, value, resume=args.resume)
    print(
        f"answered interrupt {done.interrupt_id!r} of run {done.run_id}: {json.dumps(done.value)}"
    )
    if done.outcome is not None:
        print(f"run {done.run_id} continued here: {done.status}")
    elif done.due:
        print(
            "the run is due: a running `compose worker` (with --import for its flow, agent or "
            "graph) continues it"
        )
    elif left := _answer.pending(done.run_id):
        print(f"the run still waits on: {', '.join(p.id for p in left)}")
    else:
        print(
            f"continue it with: compose answer {done.run_id} --resume, or resume({done.run_id!r})"
        )
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    """`compose replay RUN_ID... [--since X] [--import M]`: re-runs stored
    flow runs' bodies against their journals, executing nothing, and says
    which diverge. Exit 1 when any diverged or was skipped."""
    from . import _answer, _replay
    from .errors import NondeterminismError

    _import_modules(args.imports)
    if args.run_ids:
        run_ids = [_answer.resolve(r)["run_id"] for r in args.run_ids]
    elif args.since is not None:
        since = _parse_since(args.since)
        rows = _core.query_runs(_db_path(), None, "flow", since, 2**62) or []
        run_ids = [r["run_id"] for r in reversed(rows)]
    else:
        args.parser.error("give RUN_ID... or --since X")
    counts = {"ok": 0, "diverged": 0, "skipped": 0}
    for run_id in run_ids:
        try:
            report = _replay.replay(run_id)
        except NondeterminismError as e:
            counts["diverged"] += 1
            print(f"diverged  {run_id}  at '{e.key}': recorded {e.recorded}; called {e.called}")
            continue
        except ComposeError as e:
            counts["skipped"] += 1
            print(f"skipped   {run_id}  {e}")
            continue
        counts["ok"] += 1
        if report.stopped_at is not None:
            end = f", stopped at '{report.stopped_at}'"
        elif report.error is not None:
            end = f", the body raised {report.error}"
        else:
            end = ""
        print(f"ok        {run_id}  {report.flow}: {report.steps} steps replayed{end}")
    print(
        f"replayed {len(run_ids)} runs: {counts['ok']} ok, {counts['diverged']} diverged, "
        f"{counts['skipped']} skipped"
    )
    return 1 if counts["diverged"] or counts["skipped"] else 0


def _iso(t: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cmd_versions(args: argparse.Namespace) -> int:
    """`compose versions [--import M] [--json]`: per flow and code
    version, the runs not settled yet; the version of the imported code is
    marked `current`."""
    _import_modules(args.imports)
    from . import _upgrade

    rows = _upgrade.code_versions()
    if args.json:
        out = [
            {**r, "newest_start": None if r["newest_start"] is None else _iso(r["newest_start"])}
            for r in rows
        ]
        print(json.dumps(out, indent=2))
        return 0
    if not rows:
        print("no unsettled flow runs (pass --import to show the imported code's version)")
        return 0
    width = max(4, *(len(r["flow"]) for r in rows))
    lines = [f"{'FLOW':<{width}}  {'VERSION':<12}  {'UNSETTLED':>9}  NEWEST START"]
    for r in rows:
        newest = "-" if r["newest_start"] is None else _iso(r["newest_start"])
        mark = "  current" if r["current"] else ""
        lines.append(
            f"{r['flow']:<{width}}  {r['version']:<12}  {r['unsettled']:>9}  {newest:<20}{mark}"
        )
    print("\n".join(lines))
    return 0


def _cmd_upgrade(args: argparse.Namespace) -> int:
    """`compose upgrade [RUN_ID...] [--flow NAME] [--since X] --import M
    [--dry-run] [--json]`: replays each run against the imported
    code and re-stamps the ones that do not diverge. Exit 1 when any
    diverged."""
    if not args.imports:
        args.parser.error("--import MODULE is required: the module defining the new code")
    _import_modules(args.imports)
    from . import _answer, _upgrade

    since = _parse_since(args.since) if args.since is not None else None
    run_ids = None
    if args.run_ids:
        run_ids = [_answer.resolve(r)["run_id"] for r in args.run_ids]
    reports = _upgrade.upgrade_runs(run_ids, flow=args.flow, dry_run=args.dry_run, since=since)
    counts = {"upgraded": 0, "diverged": 0, "skipped": 0}
    for r in reports:
        counts[r.outcome] += 1
    if args.json:
        print(json.dumps([r.as_dict() for r in reports], indent=2))
    else:
        for r in reports:
            print(r.line())
        verb = "would be upgraded (dry run: nothing written)" if args.dry_run else "upgraded"
        print(
            f"{len(reports)} runs: {counts['upgraded']} {verb}, {counts['diverged']} diverged, "
            f"{counts['skipped']} skipped"
        )
    return 1 if counts["diverged"] else 0


def _cmd_fork(args: argparse.Namespace) -> int:
    """`compose fork RUN_ID --at KEY [--import M]`: a new run reusing the
    journal of RUN_ID up to KEY, executed here."""
    from . import _answer, _replay

    _import_modules(args.imports)
    run_id = _answer.resolve(args.run_id)["run_id"]
    run = _replay.fork(run_id, at=args.at)
    print(f"forked run {run_id} at '{args.at}' as run {run.id}: {run.status}")
    if run.pending is not None:
        print(f"it waits on interrupt {run.pending.id!r}")
    return 0 if run.status in ("completed", "paused") else 1


def _cmd_ui(args: argparse.Namespace) -> int:
    """`compose ui`: the local web app over the store."""
    _import_modules(args.imports)
    from .ui.server import serve

    return serve(args.host, args.port, allow_remote=args.allow_remote)


def _cmd_cancel(args: argparse.Namespace) -> int:
    """`compose cancel RUN_ID [--reason TEXT]`."""
    from . import _engine

    outcome = _core.request_cancel(_engine.get_store(), args.run_id, args.reason)
    if outcome == "requested":
        print(f"cancel requested for run {args.run_id} (it stops at its next step)")
    elif outcome == "already":
        print(f"run {args.run_id} was already cancelled")
    else:
        print(f"run {args.run_id} cancelled")
    return 0


# ---------------------------------------------------------------------------
# Schedules (OPS-11)


def _iso_datetime(when: Any) -> str:
    return "-" if when is None else when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _cmd_schedules(args: argparse.Namespace) -> int:
    """`compose schedules [--json]`: every schedule with its next and
    last fire, and whether any live worker imported its flow."""
    from .schedules import list_schedules, unserved

    kind, target = _store_target()
    missing = kind == "sqlite" and not Path(target).exists()
    found = [] if missing else list_schedules()
    orphans = unserved([s.flow for s in found]) if found else set()

    def state(s: Any) -> str:
        if s.paused:
            return "paused"
        if s.flow in orphans:
            return f"no worker has imported flow {s.flow}"
        return "active"

    if args.json:
        out = [
            {
                "name": s.name,
                "flow": s.flow,
                "cron": s.cron,
                "timezone": s.timezone,
                "catchup": s.catchup,
                "queue": s.queue,
                "paused": s.paused,
                "next_fire": None if s.next_fire is None else s.next_fire.isoformat(),
                "last_fire": None if s.last_fire is None else s.last_fire.isoformat(),
                "last_run_id": s.last_run_id,
                "state": state(s),
            }
            for s in found
        ]
        print(json.dumps(out, indent=2))
        return 0
    if not found:
        print("no schedules found")
        return 0
    cols = [
        ("NAME", [s.name for s in found]),
        ("FLOW", [s.flow for s in found]),
        ("CRON", [s.cron for s in found]),
        ("TIMEZONE", [s.timezone for s in found]),
        ("NEXT FIRE", [_iso_datetime(s.next_fire) for s in found]),
        ("LAST FIRE", [_iso_datetime(s.last_fire) for s in found]),
    ]
    widths = [max(len(h), *(len(v) for v in values)) for h, values in cols]
    lines = ["  ".join(f"{h:<{w}}" for (h, _), w in zip(cols, widths)) + "  STATE"]
    for i, s in enumerate(found):
        cells = "  ".join(f"{values[i]:<{w}}" for (_, values), w in zip(cols, widths))
        lines.append(f"{cells}  {state(s)}")
    print("\n".join(lines))
    return 0


def _cmd_schedule(args: argparse.Namespace) -> int:
    """`compose schedule pause|resume|delete|trigger NAME`."""
    from .schedules import get_schedule

    _import_modules(args.imports)
    sched = get_schedule(args.name)
    if args.action == "pause":
        sched.pause()
        print(f"schedule {sched.name} paused")
    elif args.action == "resume":
        sched.resume()
        print(f"schedule {sched.name} resumed: next fire {_iso_datetime(sched.next_fire)}")
    elif args.action == "delete":
        sched.delete()
        print(f"schedule {sched.name} deleted")
    else:
        handle = sched.trigger()
        if sched.queue is not None:
            print(f"run {handle.id} enqueued on queue {sched.queue}")
            return 0
        run = handle.result()
        print(f"run {handle.id} {run.status}")
    return 0


def _cmd_path(args: argparse.Namespace) -> int:
    kind, target = _store_target()
    print(str(_state_dir()) if kind == "sqlite" and not _store_spec() else target)
    return 0


def _store_spec() -> str:
    from . import _engine

    return _engine.store_spec()


def _cmd_migrate(args: argparse.Namespace) -> int:
    """Applies (or with --dry-run reports) the store's schema version."""
    found, now, latest = _core.migrate_store(
        _store_spec(), str(_state_dir() / "runs.db"), args.dry_run
    )
    shown = _store_target()[1]
    if args.dry_run:
        todo = "up to date" if found == latest else f"would migrate to version {latest}"
        print(f"{shown}: schema version {found}, {todo}")
    elif found == now:
        print(f"{shown}: schema version {now}, up to date")
    else:
        print(f"{shown}: migrated schema version {found} -> {now}")
    return 0


# -- diff (OBS-33) --------------------------------------------------------------


class _Span:
    """A stored span as `diff` needs it."""

    __slots__ = (
        "cost",
        "end",
        "kind",
        "name",
        "output_json",
        "parent",
        "span_id",
        "start",
        "tokens",
    )

    def __init__(self, row: tuple) -> None:
        self.span_id, self.parent, self.kind, self.name, self.start, self.end = row[:6]
        usage, self.output_json = row[6], row[7]
        if usage is None:
            self.tokens, self.cost = 0, None
        else:
            self.tokens, self.cost = usage[0] + usage[1], usage[5]

    @property
    def duration_ms(self) -> float:
        return 0.0 if self.end is None else (self.end - self.start) * 1000.0


def _add_cost(acc: float | None, cost: float | None) -> float | None:
    """The cost part of `Usage.__add__`."""
    if acc is None and cost is None:
        return None
    return (acc or 0) + (cost or 0)


def _sum_usage(spans: list[_Span]) -> tuple[int, float | None]:
    """Tokens (input + output) and cost of `spans` summed like `Usage()` + ...

    (a span without usage adds nothing).
    """
    tokens, cost = 0, None
    for s in spans:
        tokens += s.tokens
        cost = _add_cost(cost, s.cost)
    return tokens, cost


class _Tree:
    """The structure `Trace` gives a list of spans: roots (no parent, or a
    parent not in the trace) and children, both in list order, walked
    depth-first once so that every subtree is a slice of the walk."""

    def __init__(self, spans: list[_Span]) -> None:
        self.spans = spans
        ids = {s.span_id for s in spans}
        self.roots = [s for s in spans if s.parent is None or s.parent not in ids]
        children: dict[str, list[_Span]] = {}
        for s in spans:
            if s.parent is not None and s.parent in ids:
                children.setdefault(s.parent, []).append(s)
        # Pre-order walk (each span once, so a corrupt cycle cannot loop) with
        # each span's path: `"<kind>:<name>#<i>"` from the root down, `i`
        # counting same-kind-and-name siblings (roots are siblings).
        self.walk: list[_Span] = []
        self.paths: dict[tuple[str, ...], _Span] = {}
        self._pos: dict[int, int] = {}
        self._size: list[int] = []
        parents: list[int] = []
        seen: set[int] = set()
        root_counts: dict[tuple[str, str], int] = {}
        # Indices are counted in sibling order, when the siblings are pushed.
        stack = [(r, -1, self._child_path((), r, root_counts)) for r in self.roots]
        stack.reverse()
        while stack:
            s, parent, path = stack.pop()
            if id(s) in seen:
                continue
            seen.add(id(s))
            pos = len(self.walk)
            self._pos[id(s)] = pos
            self.walk.append(s)
            self._size.append(1)
            parents.append(parent)
            self.paths.setdefault(path, s)
            counts: dict[tuple[str, str], int] = {}
            kids = [
                (k, pos, self._child_path(path, k, counts))
                for k in children.get(s.span_id, ())
                if id(k) not in seen
            ]
            stack.extend(reversed(kids))
        for pos in range(len(self.walk) - 1, -1, -1):
            if parents[pos] >= 0:
                self._size[parents[pos]] += self._size[pos]

    @staticmethod
    def _child_path(prefix: tuple[str, ...], s: _Span, counts: dict) -> tuple[str, ...]:
        i = counts.get((s.kind, s.name), 0)
        counts[(s.kind, s.name)] = i + 1
        return (*prefix, f"{s.kind}:{s.name}#{i}")

    def usage(self, span: _Span) -> tuple[int, float | None]:
        """Own usage for `llm` spans, the subtree's rollup otherwise (summed in
        pre-order, like `Trace.rollup_usage`)."""
        if span.kind == "llm":
            return _sum_usage([span])
        pos = self._pos[id(span)]
        return _sum_usage(self.walk[pos : pos + self._size[pos]])


def _signed_cost(a: float | None, b: float | None) -> str:
    if a is None and b is None:
        return "n/a"
    d = (b or 0) - (a or 0)
    return f"{'+' if d >= 0 else ''}${d:.4f}"


def _output_hash(output_json: str | None) -> str:
    """SHA-256 of `json.dumps(encoded output, sort_keys=True, default=str)`;
    the encoded output is the stored JSON tree, never decoded into types."""
    tree: object = None
    if output_json is not None:
        try:
            tree = json.loads(output_json)
        except ValueError:
            tree = output_json
    text = json.dumps(tree, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _load_run(loader: Callable[[str, str], tuple[str, Any]], run_id: str) -> dict:
    """Resolves `run_id` through a core `*_view` function. Without a
    store: `no runs found` (the caller may report it as not found)."""
    outcome, value = loader(_db_path(), run_id)
    if outcome == "no_store":
        raise _NoStore("no runs found")
    if outcome == "not_found":
        raise _not_found(run_id)
    if outcome == "ambiguous":
        raise _ambiguous(run_id, value)
    return value


class _NoStore(ComposeError):
    """There is no `runs.db` yet."""


def _cmd_diff(args: argparse.Namespace) -> int:
    _import_modules(args.imports)
    a = _load_run(_core.diff_view, args.run_a)
    b = _load_run(_core.diff_view, args.run_b)
    ta = _Tree([_Span(row) for row in a["spans"]])
    tb = _Tree([_Span(row) for row in b["spans"]])
    tok_a, cost_a = _sum_usage(ta.spans)
    tok_b, cost_b = _sum_usage(tb.spans)
    dur_a = sum(r.duration_ms for r in ta.roots)
    dur_b = sum(r.duration_ms for r in tb.roots)
    lines = [
        f"diff {a['run_id'][:12]} -> {b['run_id'][:12]}",
        f"  Δcost: {_signed_cost(cost_a, cost_b)}",
        f"  Δtokens: {tok_b - tok_a:+d}",
        f"  Δduration: {dur_b - dur_a:+.0f}ms",
        "",
    ]
    pa, pb = ta.paths, tb.paths
    for path in sorted(pa.keys() | pb.keys()):
        indent = "  " * (len(path) - 1)
        sa, sb = pa.get(path), pb.get(path)
        s = sa if sa is not None else sb
        assert s is not None
        label = f"{_GLYPHS.get(s.kind, '·')} {s.name}"
        if sa is None:
            lines.append(f"{indent}+ {label}")
        elif sb is None:
            lines.append(f"{indent}- {label}")
        else:
            ua, ub = ta.usage(sa), tb.usage(sb)
            line = (
                f"{indent}  {label}  Δcost={_signed_cost(ua[1], ub[1])} "
                f"Δtokens={ub[0] - ua[0]:+d} Δdur={sb.duration_ms - sa.duration_ms:+.0f}ms"
            )
            if _output_hash(sa.output_json) != _output_hash(sb.output_json):
                line += "  (output changed)"
            lines.append(line)
    print("\n".join(lines))
    return 0


# -- costs (OBS-34) -------------------------------------------------------------


def _cmd_costs(args: argparse.Namespace) -> int:
    since = _parse_since(args.since) if args.since is not None else None
    found = _core.llm_costs(_db_path(), args.by, since)
    lines = [f"costs by {args.by}"]
    if not found or not found[0]:
        lines.append("no llm spans found")
    else:
        buckets, total = found
        for key, calls, tokens, cost, incomplete in [*buckets, total]:
            lines.append(
                f"  {key:<24} calls={calls:<6} tokens={tokens:<10} "
                f"cost={_bucket_cost(cost, incomplete)}"
            )
    print("\n".join(lines))
    return 0


# -- export (OBS-35) ------------------------------------------------------------

_CONTENT_OFF_WARNING = (
    "compose: warning -- {k} of {n} exported entries came from spans persisted with content "
    "capture disabled (COMPOSE_TRACE_CONTENT=0): their cassette entries have no "
    "system/messages (system=None, messages=[]) and can only ever replay-match on that "
    "equally-empty message_hash -- re-capture this run with COMPOSE_TRACE_CONTENT unset/1 for "
    "a realistic cassette"
)


def _model_attribute(attributes_json: str | None) -> str | None:
    """The `model` attribute from the stored attributes JSON (plain JSON)."""
    if attributes_json is None:
        return None
    try:
        attrs = json.loads(attributes_json)
    except ValueError:
        return None
    if isinstance(attrs, dict) and attrs.get("$kind") == "dict":
        attrs = attrs.get("value")
    if not isinstance(attrs, dict):
        return None
    model = attrs.get("model")
    return model if isinstance(model, str) else None


def _cmd_export(args: argparse.Namespace) -> int:
    _import_modules(args.imports)
    if args.otlp is not None:
        try:
            found = _load_run(_core.otel_view, args.run_id)
        except _NoStore:
            raise _not_found(args.run_id) from None
        from ._otel import send_run

        print(send_run(found, args.otlp))
        return 0
    try:
        found = _load_run(_core.export_view, args.run_id)
    except _NoStore:
        raise _not_found(args.run_id) from None
    # Deferred: pydantic and the message types are needed only here. The
    # message types register themselves for decoding at import (AGENT-65).
    from . import _codec
    from .messages import Message, StopReason, ToolCallPart
    from .models.base import ModelResponse
    from .testing import compute_message_hash

    def unexpected(span_id: str, what: str, value: object) -> ComposeError:
        return ComposeError(
            f"llm span {span_id} of run {found['run_id']} has an unexpected stored {what} "
            f"({type(value).__name__}) -- cannot export it"
        )

    entries = []
    without_content = 0
    for span_id, name, attributes_json, input_json, output_json, usage in found["spans"]:
        model = _model_attribute(attributes_json) or name
        system: str | None = None
        messages: list[Message] = []
        if input_json is None:
            without_content += 1
        else:
            request = _codec.loads(input_json)
            if not isinstance(request, dict):
                raise unexpected(span_id, "input", request)
            stored_system, stored_messages = request.get("system"), request.get("messages")
            if not (stored_system is None or isinstance(stored_system, str)) or not (
                isinstance(stored_messages, list)
                and all(isinstance(m, Message) for m in stored_messages)
            ):
                raise unexpected(span_id, "input", request)
            system, messages = stored_system, stored_messages
        message = None if output_json is None else _codec.loads(output_json)
        if message is None:
            message = Message(role="assistant", parts=[])
        elif not isinstance(message, Message):
            raise unexpected(span_id, "output", message)
        stop = (
            StopReason.TOOL_USE
            if any(isinstance(p, ToolCallPart) for p in message.parts)
            else StopReason.END_TURN
        )
        response = ModelResponse(
            message=message,
            stop_reason=stop,
            raw_stop_reason=stop.value,
            usage=_usage(usage),
            model_id=model,
            parsed=None,
        )
        entries.append(
            {
                "full_hash": None,
                "message_hash": compute_message_hash(system, messages),
                "request": {
                    "model": model,
                    "system": system,
                    "messages": [m.model_dump(mode="json") for m in messages],
                },
                "response": _codec.encode(response),
            }
        )
    text = json.dumps({"version": 2, "entries": entries}, indent=2)
    path = Path(args.cassette)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise ComposeError(f"cannot write cassette {args.cassette}: {e}") from None
    print(f"wrote {len(entries)} entries to {args.cassette}")
    if without_content:
        print(_CONTENT_OFF_WARNING.format(k=without_content, n=len(entries)), file=sys.stderr)
    return 0


def _usage(t: tuple | None) -> Usage:
    """A span's usage columns as `Usage` (`Usage()` when it has none)."""
    from .messages import Usage

    if t is None:
        return Usage()
    return Usage(
        input_tokens=t[0],
        output_tokens=t[1],
        cache_read_tokens=t[2],
        cache_creation_tokens=t[3],
        reasoning_tokens=t[4],
        cost_usd=t[5],
        cost_complete=t[6],
    )


# -- threads (EXT-33) ----------------------------------------------------------


def _cmd_threads(args: argparse.Namespace) -> int:
    if args.older_than is not None and not args.prune:
        raise ComposeError("--older-than is only used with --prune")
    store = _graph_store()
    if args.prune:
        if args.older_than is None:
            raise ComposeError("--prune needs --older-than <N>d, <N>h or YYYY-MM-DD")
        cutoff = _parse_since(args.older_than)
        pruned = _core.thread_prune(store, int(cutoff * 1000)) if store is not None else []
        if args.json:
            print(json.dumps(pruned, indent=2))
        else:
            print(f"pruned {len(pruned)} thread{'' if len(pruned) == 1 else 's'}")
        return 0
    rows = json.loads(_core.thread_list(store, args.graph)) if store is not None else []
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no threads found")
        return 0
    now = time.time()
    lines = []
    for r in rows:
        age = _age(r["updated_at_ms"] / 1000, now)
        lines.append(
            f"{r['thread_id']:<26}  {r['graph']:<20} {r['status']:<11} "
            f"v{r['version']:<5} {age:<9} {r['head'] or '-'}"
        )
    print("\n".join(lines))
    return 0


def _cmd_thread_history(args: argparse.Namespace) -> int:
    limit = _parse_limit(args.limit, args.parser)
    store = _graph_store()
    if store is None:
        raise ComposeError(f"no thread '{args.thread_id}' in this storage")
    rows = json.loads(_core.thread_history_any(store, args.thread_id, limit))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    now = time.time()
    lines = []
    for r in rows:
        age = _age(r["created_at_ms"] / 1000, now)
        lines.append(
            f"{r['id']:<26}  {r['source']:<7} {r['status']:<10} v{r['version']:<5} "
            f"step {r['step']:<4} {age:<9} run {r['run_id'] or '-'}"
        )
    print("\n".join(lines))
    return 0


def _cmd_thread_rewind(args: argparse.Namespace) -> int:
    store = _graph_store()
    if store is None:
        raise ComposeError(f"no thread '{args.thread_id}' in this storage")
    entry = json.loads(_core.thread_rewind_any(store, args.thread_id, args.checkpoint_id))
    print(
        f"thread '{args.thread_id}' rewound to checkpoint '{args.checkpoint_id}': new head "
        f"{entry['id']} (version {entry['version']})"
    )
    return 0


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compose",
        description="Inspect and drive composeai runs in the configured store "
        "($COMPOSE_STORE, else $COMPOSE_DIR/runs.db).",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"compose (composeai) {__version__}",
        help="print the installed composeai version and exit",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def add_import(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--import",
            dest="imports",
            action="append",
            default=[],
            metavar="MODULE",
            help="import MODULE first and register its types (repeatable)",
        )

    runs = sub.add_parser("runs", help="list recent runs")
    runs.add_argument("-n", "--limit", default="10", metavar="N", help="rows to show (10)")
    runs.add_argument("--json", action="store_true", help="print rows as JSON")
    runs.add_argument("--status", choices=_STATUSES, help="only runs with this status")
    runs.add_argument("--kind", choices=_KINDS, help="only runs of this kind")
    runs.add_argument("--since", metavar="X", help="<N>d, <N>h or YYYY-MM-DD")
    runs.add_argument(
        "-q", "--query", metavar="Q", help="full-text search of span names and payloads (FTS5)"
    )
    runs.add_argument(
        "--prune", action="store_true", help="delete settled runs last updated before --older-than"
    )
    runs.add_argument("--older-than", metavar="X", help="with --prune: <N>d, <N>h or YYYY-MM-DD")
    runs.add_argument("--name", metavar="N", help="with --prune: only runs of flow or agent N")
    runs.add_argument("--dry-run", action="store_true", help="with --prune: only count")
    runs.add_argument(
        "--vacuum", action="store_true", help="with --prune: return freed space to the disk"
    )
    add_import(runs)
    runs.set_defaults(func=_cmd_runs, parser=runs)

    trace = sub.add_parser("trace", help="show the span tree of a run")
    trace.add_argument("run_id", nargs="?", metavar="RUN_ID", help="run id or unique prefix")
    trace.add_argument("--last", action="store_true", help="the newest run")
    trace.add_argument(
        "--format",
        choices=("tree", "mermaid"),
        default="tree",
        help="a text tree (tree, the default) or a Mermaid flowchart (mermaid)",
    )
    add_import(trace)
    trace.set_defaults(func=_cmd_trace, parser=trace)

    diff = sub.add_parser("diff", help="compare the span trees of two runs")
    diff.add_argument("run_a", metavar="RUN_A", help="run id or unique prefix")
    diff.add_argument("run_b", metavar="RUN_B", help="run id or unique prefix")
    add_import(diff)
    diff.set_defaults(func=_cmd_diff, parser=diff)

    costs = sub.add_parser("costs", help="model calls, tokens and cost by model, name or day")
    costs.add_argument(
        "--by",
        choices=("model", "name", "day"),
        default="model",
        help="group by model (the default), run name or day",
    )
    costs.add_argument("--since", metavar="X", help="<N>d, <N>h or YYYY-MM-DD")
    costs.set_defaults(func=_cmd_costs, parser=costs)

    export = sub.add_parser(
        "export", help="write a run's model calls as a replay cassette, or send its spans (OTLP)"
    )
    export.add_argument("run_id", metavar="RUN_ID", help="run id or unique prefix")
    target = export.add_mutually_exclusive_group(required=True)
    target.add_argument("--cassette", metavar="PATH", help="file to write")
    target.add_argument(
        "--otlp",
        metavar="URL",
        help="POST the run's spans to this OTLP/HTTP endpoint (path /v1/traces if none)",
    )
    add_import(export)
    export.set_defaults(func=_cmd_export, parser=export)

    worker = sub.add_parser("worker", help="continue due durable runs (timers, signals, crashes)")
    worker.add_argument("--once", action="store_true", help="one pass over what is due, then exit")
    worker.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="longest sleep between looks at the store (1.0)",
    )
    worker.add_argument(
        "--concurrency", type=int, default=4, metavar="N", help="runs executed at once (4)"
    )
    worker.add_argument(
        "--grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, how long executing runs may take to settle before their "
        "leases are released for another worker (10)",
    )
    worker.add_argument(
        "--queue",
        dest="queues",
        action="append",
        default=[],
        metavar="NAME",
        help="also execute queued runs of queue NAME, declared by an --import (repeatable)",
    )
    worker.add_argument(
        "--upgrade",
        action="store_true",
        help="take over runs started on other code whose journal replays cleanly on this code",
    )
    worker.add_argument(
        "--retention",
        metavar="AGE",
        help="prune settled runs last updated over AGE ago (30d, 12h), once an hour",
    )
    add_import(worker)
    worker.set_defaults(func=_cmd_worker, parser=worker)

    queues = sub.add_parser("queues", help="queued and running runs per queue")
    queues.add_argument("--json", action="store_true", help="print rows as JSON")
    queues.set_defaults(func=_cmd_queues, parser=queues)

    sig = sub.add_parser("signal", help="send a signal to a run")
    sig.add_argument("run_id", metavar="RUN_ID", help="the run to signal")
    sig.add_argument("name", metavar="NAME", help="the signal's name, as the flow receives it")
    sig.add_argument("--json", metavar="VALUE", help="the signal's value, as JSON")
    add_import(sig)
    sig.set_defaults(func=_cmd_signal, parser=sig)

    ans = sub.add_parser("answer", help="answer a pending interrupt of a run")
    ans.add_argument("run_id", metavar="RUN_ID", help="run id or unique prefix")
    ans.add_argument(
        "interrupt_id",
        nargs="?",
        metavar="INTERRUPT_ID",
        help="the pending interrupt to answer (see --list)",
    )
    given = ans.add_mutually_exclusive_group()
    given.add_argument("--json", dest="value", metavar="VALUE", help="the answer, as JSON")
    given.add_argument("--yes", dest="value", action="store_const", const=True, help="answer true")
    given.add_argument("--no", dest="value", action="store_const", const=False, help="answer false")
    given.add_argument("--list", action="store_true", help="list the run's pending interrupts")
    ans.add_argument(
        "--resume", action="store_true", help="continue the run in this process (needs --import)"
    )
    ans.add_argument(
        "--json-list", action="store_true", help="with --list: print the interrupts as JSON"
    )
    add_import(ans)
    ans.set_defaults(func=_cmd_answer, parser=ans)

    rep = sub.add_parser(
        "replay", help="re-run stored flow runs against their journals; report divergence"
    )
    rep.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="run ids or unique prefixes")
    rep.add_argument("--since", metavar="X", help="flow runs created since: <N>d, <N>h or a date")
    add_import(rep)
    rep.set_defaults(func=_cmd_replay, parser=rep)

    ver = sub.add_parser("versions", help="unsettled flow runs per code version")
    ver.add_argument("--json", action="store_true", help="print rows as JSON")
    add_import(ver)
    ver.set_defaults(func=_cmd_versions, parser=ver)

    upg = sub.add_parser(
        "upgrade", help="move runs started on old code to the imported code, where they replay"
    )
    upg.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="run ids or unique prefixes")
    upg.add_argument("--flow", metavar="NAME", help="only runs of this flow")
    upg.add_argument("--since", metavar="X", help="runs created since: <N>d, <N>h or a date")
    upg.add_argument("--dry-run", action="store_true", help="check only; write nothing")
    upg.add_argument("--json", action="store_true", help="print the reports as JSON")
    add_import(upg)
    upg.set_defaults(func=_cmd_upgrade, parser=upg)

    frk = sub.add_parser("fork", help="a new run reusing a run's journal up to a step")
    frk.add_argument("run_id", metavar="RUN_ID", help="run id or unique prefix")
    frk.add_argument("--at", required=True, metavar="KEY", help="the journal key to execute from")
    add_import(frk)
    frk.set_defaults(func=_cmd_fork, parser=frk)

    ui = sub.add_parser("ui", help="serve the local web UI over the store")
    ui.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    ui.add_argument("--port", type=int, default=8765, help="port (8765)")
    ui.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a non-loopback --host; every request must carry COMPOSE_UI_TOKEN",
    )
    add_import(ui)
    ui.set_defaults(func=_cmd_ui, parser=ui)

    cancel = sub.add_parser("cancel", help="cancel a run")
    cancel.add_argument("run_id", metavar="RUN_ID", help="the run to cancel")
    cancel.add_argument("--reason", metavar="TEXT", help="why, stored with the cancel request")
    cancel.set_defaults(func=_cmd_cancel, parser=cancel)
    threads = sub.add_parser("threads", help="list graph threads, or prune old ones")
    threads.add_argument("--graph", metavar="NAME", help="only threads of this graph")
    threads.add_argument("--json", action="store_true", help="print rows as JSON")
    threads.add_argument("--prune", action="store_true", help="delete threads not updated since")
    threads.add_argument("--older-than", metavar="X", help="with --prune: <N>d, <N>h or YYYY-MM-DD")
    threads.set_defaults(func=_cmd_threads, parser=threads)

    thread = sub.add_parser("thread", help="one graph thread: history, rewind")
    thread_sub = thread.add_subparsers(dest="thread_command", metavar="COMMAND")
    thread_sub.required = True
    history = thread_sub.add_parser("history", help="a thread's checkpoints, newest first")
    history.add_argument("thread_id", metavar="THREAD_ID", help="the graph thread")
    history.add_argument("-n", "--limit", default="20", metavar="N", help="rows to show (20)")
    history.add_argument("--json", action="store_true", help="print rows as JSON")
    history.set_defaults(func=_cmd_thread_history, parser=history)
    rewind = thread_sub.add_parser("rewind", help="copy a checkpoint as the thread's new head")
    rewind.add_argument("thread_id", metavar="THREAD_ID", help="the graph thread")
    rewind.add_argument(
        "checkpoint_id", metavar="CHECKPOINT_ID", help="the checkpoint to copy (see history)"
    )
    rewind.set_defaults(func=_cmd_thread_rewind, parser=rewind)

    schedules = sub.add_parser("schedules", help="list schedules with their next and last fire")
    schedules.add_argument("--json", action="store_true", help="print rows as JSON")
    schedules.set_defaults(func=_cmd_schedules, parser=schedules)

    sched = sub.add_parser("schedule", help="pause, resume, delete or trigger a schedule")
    sched.add_argument(
        "action",
        choices=("pause", "resume", "delete", "trigger"),
        help="pause or resume its ticks, delete it, or start one run now (trigger)",
    )
    sched.add_argument("name", metavar="NAME", help="the schedule's name")
    add_import(sched)
    sched.set_defaults(func=_cmd_schedule, parser=sched)

    path = sub.add_parser("path", help="print the state directory (or the store URL)")
    path.set_defaults(func=_cmd_path, parser=path)

    migrate = sub.add_parser("migrate", help="create or upgrade the store's schema")
    migrate.add_argument("--dry-run", action="store_true", help="only report the version")
    migrate.set_defaults(func=_cmd_migrate, parser=migrate)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the `compose` CLI; returns the exit status (usage errors exit 2)."""
    args = _build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ComposeError as e:
        print(f"compose: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
