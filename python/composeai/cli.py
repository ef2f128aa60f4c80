"""The `compose` command line: inspect the local run store (OBS-30 … OBS-37).

Kept light on purpose: it imports only the standard library, the compiled
core and `composeai.errors`, so `compose runs` starts fast. The core does the
database work (`query_runs`, `resolve_run`, `trace_view`); this module parses
arguments and formats what needs Python semantics (`repr`, `format`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
import time
from pathlib import Path

from . import _core
from .errors import ComposeError

__all__ = ["main"]

_STATUSES = ("completed", "failed", "paused", "running", "cancelled")
_KINDS = ("agent", "flow", "pipe", "aggregate")

_SINCE_RELATIVE = re.compile(r"([0-9]+)([dh])")
_SINCE_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")


def _state_dir() -> Path:
    return Path(os.environ.get("COMPOSE_DIR") or "./.compose")


def _db_path() -> str:
    return str(_state_dir() / "runs.db")


def _parse_since(value: str) -> float:
    """`<N>d`, `<N>h` (before now) or `YYYY-MM-DD` (local midnight) as Unix seconds."""
    m = _SINCE_RELATIVE.fullmatch(value)
    if m:
        seconds = 86400 if m.group(2) == "d" else 3600
        return time.time() - int(m.group(1)) * seconds
    m = _SINCE_DATE.fullmatch(value)
    if m:
        from datetime import datetime

        try:
            return datetime(int(m.group(1)), int(m.group(2)), int(m.group(3))).timestamp()
        except (ValueError, OverflowError, OSError):
            pass
    raise ComposeError(f"invalid --since value '{value}': expected '<N>d', '<N>h', or 'YYYY-MM-DD'")


def _parse_limit(value: str, parser: argparse.ArgumentParser) -> int:
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if limit <= 0:
        parser.error(f"--limit must be a positive integer, got '{value}'")
    return limit


def _import_modules(modules: list[str]) -> None:
    """OBS-37: import each `--import` module and register its types."""
    if not modules:
        return
    # The console script does not put the working directory on sys.path;
    # `--import myapp.flows` should find the project it is run from.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    for name in modules:
        try:
            module = importlib.import_module(name)
            register = getattr(sys.modules.get("composeai"), "register_module_types", None)
            if register is not None:
                register(module)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 -- any failure is reported (OBS-37)
            raise ComposeError(f"--import {name}: {e}") from None


def _age(created_at: float, now: float) -> str:
    s = max(0, int(now - created_at))
    if s < 60:
        return f"{s}s ago"
    if s < 3600:
        return f"{s // 60}m ago"
    if s < 86400:
        return f"{s // 3600}h ago"
    return f"{s // 86400}d ago"


def _cost(cost_usd: float | None, complete: bool) -> str:
    if cost_usd is None:
        return "-"
    return f"{'' if complete else '≥'}${cost_usd:.4f}"


def _cmd_runs(args: argparse.Namespace) -> int:
    limit = _parse_limit(args.limit, args.parser)
    since = _parse_since(args.since) if args.since is not None else None
    _import_modules(args.imports)
    rows = _core.query_runs(_db_path(), args.status, args.kind, since, limit) or []
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no runs found")
        return 0
    now = time.time()
    lines = []
    for r in rows:
        age = _age(r["created_at"], now)
        cost = _cost(r["cost_usd"], r["cost_complete"])
        lines.append(
            f"{r['run_id']:<26}  {r['kind']:<9} {r['name']:<20} {r['status']:<10} "
            f"{age:<9} {cost:>10} {r['tokens']:>8} tok"
        )
    print("\n".join(lines))
    return 0


def _not_found(run_id: str) -> int:
    print(f"compose: no run found with id '{run_id}'", file=sys.stderr)
    return 1


def _ambiguous(prefix: str, ids: list[str]) -> ComposeError:
    return ComposeError(
        f"run id prefix '{prefix}' is ambiguous -- it matches {len(ids)} runs: "
        f"{', '.join(ids)} -- use a longer prefix or the full id"
    )


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


def _paused_banner(run_id: str, pending: list[tuple]) -> str:
    lines = ["", f"⏸  run {run_id} is paused with {len(pending)} pending interrupt(s):"]
    answers: dict[str, object] = {}
    for interrupt_id, kind, question, payload_json in pending:
        lines.append(f"  - id={interrupt_id!r} kind={kind!r} question={question!r}")
        lines.append(f"    payload={_payload(payload_json)!r}")
        answers[interrupt_id] = True if kind == "approval" else "<answer>"
    lines += [
        "",
        "To resume:",
        "    from composeai import resume",
        f"    resume({run_id!r}, answers={answers!r})",
    ]
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
            print("compose: no runs found", file=sys.stderr)
            return 1
        return _not_found(run_id)
    if outcome == "ambiguous":
        raise _ambiguous(run_id, value)
    print(value["text"])
    if value["status"] == "paused":
        print(_paused_banner(value["run_id"], value["pending"]))
    return 0


def _cmd_path(args: argparse.Namespace) -> int:
    print(str(_state_dir()))
    return 0


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compose", description="Inspect composeai runs stored in $COMPOSE_DIR/runs.db."
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
    runs.add_argument("--status", choices=_STATUSES)
    runs.add_argument("--kind", choices=_KINDS)
    runs.add_argument("--since", metavar="X", help="<N>d, <N>h or YYYY-MM-DD")
    add_import(runs)
    runs.set_defaults(func=_cmd_runs, parser=runs)

    trace = sub.add_parser("trace", help="show the span tree of a run")
    trace.add_argument("run_id", nargs="?", metavar="RUN_ID", help="run id or unique prefix")
    trace.add_argument("--last", action="store_true", help="the newest run")
    trace.add_argument("--format", choices=("tree", "mermaid"), default="tree")
    add_import(trace)
    trace.set_defaults(func=_cmd_trace, parser=trace)

    path = sub.add_parser("path", help="print the state directory")
    path.set_defaults(func=_cmd_path, parser=path)
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
