"""Checked upgrades of runs in flight to the imported code, and the
code versions of unsettled runs.

A run's code version is its flow's fingerprint; a worker continues only
the runs of the code it imported. An upgrade replays a run's journal
against the imported code exactly as `composeai.testing.replay` does (a
replay-only attempt: no step, model or tool executes, nothing is written),
and only when that replay meets no divergence does the core re-stamp the
run to the new fingerprint, in one transaction fenced on the run being
exactly what the replay read.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _core, _engine, _replay
from ._lifecycle import flow_versions
from .errors import ComposeError, ConfigError, NondeterminismError
from .flow import _FLOWS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_UNSETTLED = ("queued", "running", "paused")
_RAISED = "replaying it under the imported code raised"
_DIVERGED = "NondeterminismError"


@dataclass(frozen=True)
class UpgradeReport:
    """What an upgrade did with one run.

    `outcome`: `"upgraded"` (re-stamped to the imported code; with
    `dry_run`, it would have been), `"diverged"` (left untouched: at journal
    key `key` the run recorded `recorded` and the imported code calls
    `called`) or `"skipped"` (left untouched for `reason`). `status`: the
    run's status after the upgrade (a run failed by a divergence returns to
    `paused`), else as found."""

    run_id: str
    flow: str
    outcome: str
    from_fingerprint: str | None = None
    to_fingerprint: str | None = None
    status: str | None = None
    key: str | None = None
    recorded: str | None = None
    called: str | None = None
    reason: str | None = None
    dry_run: bool = False

    def line(self) -> str:
        """The report as `compose upgrade` prints it."""
        if self.outcome == "upgraded":
            text = "upgraded"
            if self.dry_run:
                text += " (dry run: nothing written)"
            text += f"  {_short(self.from_fingerprint)} -> {_short(self.to_fingerprint)}"
        elif self.outcome == "diverged":
            text = f"diverged at {self.key}: recorded {self.recorded}, called {self.called}"
        else:
            text = f"skipped: {self.reason}"
        return f"{self.run_id}  {self.flow}  {text}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "flow": self.flow,
            "outcome": self.outcome,
            "from_fingerprint": self.from_fingerprint,
            "to_fingerprint": self.to_fingerprint,
            "status": self.status,
            "key": self.key,
            "recorded": self.recorded,
            "called": self.called,
            "reason": self.reason,
            "dry_run": self.dry_run,
        }


def _short(fingerprint: str | None) -> str:
    return fingerprint[:12] if fingerprint else "(none)"


def lasting(report: UpgradeReport) -> bool:
    """Whether the run was not upgraded for a reason that stays while its
    code and the imported code stay (it diverged, or its replay raised),
    rather than for a race with another process."""
    return report.outcome == "diverged" or (report.reason or "").startswith(_RAISED)


def current_versions() -> list[tuple[str, str]]:
    """`(flow name, fingerprint)` of every flow imported in this process."""
    return sorted(flow_versions())


def _not_imported(name: str) -> str:
    return (
        f"flow {name!r} is not imported here -- pass --import with the module that defines it "
        "(the new code)"
    )


def _error_type(error_json: str | None) -> str | None:
    if not error_json:
        return None
    import json

    try:
        found = json.loads(error_json)
    except ValueError:
        return None
    return found.get("type") if isinstance(found, dict) else None


def upgrade_one(store: Any, run_id: str, *, dry_run: bool = False) -> UpgradeReport:
    """Checks run `run_id` against the imported code of its flow and
    re-stamps it when its journal replays without divergence."""
    row = store.get_run(run_id)
    if row is None:
        return UpgradeReport(run_id, "?", "skipped", reason="no such run")
    name, status = row["name"], row["status"]
    stored = row["fingerprint"]

    def skipped(reason: str) -> UpgradeReport:
        return UpgradeReport(run_id, name, "skipped", stored, None, status, reason=reason)

    if row["kind"] != "flow":
        return skipped(f"a {row['kind']} run -- upgrades apply to @flow runs")
    flow_obj = _FLOWS.get(name)
    if flow_obj is None:
        return skipped(_not_imported(name))
    target = flow_obj.fingerprint
    failed_by_divergence = status == "failed" and _error_type(row["error_json"]) == _DIVERGED
    if status not in _UNSETTLED and not failed_by_divergence:
        return skipped(f"{status}: nothing to upgrade")
    if stored == target and not failed_by_divergence:
        return skipped(f"already on the imported code ({_short(target)})")
    if status == "queued":
        # Nothing journaled yet: any code can start it.
        seen_status, seen_fp, rows = status, stored, 0
    else:
        attempt = store.replay_attempt(run_id)
        seen_status, seen_fp, rows = attempt.status, attempt.fingerprint, attempt.journal_rows
        try:
            report = _replay.replay_attempt(store, attempt)
        except NondeterminismError as e:
            return UpgradeReport(
                run_id,
                name,
                "diverged",
                stored,
                target,
                status,
                key=e.key,
                recorded=e.recorded,
                called=e.called,
            )
        if report.error is not None:
            return skipped(f"{_RAISED} {report.error}")
    if dry_run:
        return UpgradeReport(run_id, name, "upgraded", seen_fp, target, status, dry_run=True)
    outcome, detail = _core.upgrade_run(store, run_id, seen_fp, target, seen_status, rows)
    if outcome == "upgraded":
        return UpgradeReport(run_id, name, "upgraded", seen_fp, target, detail)
    if outcome == "already":
        return skipped(
            f"already upgraded to the imported code ({_short(target)}) by another process"
        )
    return skipped(detail)


def upgrade(
    run_ids: list[str] | None = None, *, flow: str | None = None, dry_run: bool = False
) -> list[UpgradeReport]:
    """Upgrades runs to the code imported in this process: `run_ids`, or
    else every run of an imported flow (of `flow` only, when given) that is
    not settled and was started on other code, or failed by
    `NondeterminismError`. Each run's journal is replayed against the
    imported code first, executing nothing; a run that replays without
    divergence is re-stamped to the imported code (nothing is written with
    `dry_run`), one that diverges is left untouched and reported."""
    return upgrade_runs(run_ids, flow=flow, dry_run=dry_run)


def upgrade_runs(
    run_ids: list[str] | None = None,
    *,
    flow: str | None = None,
    dry_run: bool = False,
    since: float | None = None,
) -> list[UpgradeReport]:
    """`upgrade`, of the runs created at or after `since` (Unix seconds)
    when no `run_ids` are given (`compose upgrade --since`)."""
    _engine.check_sync_facade()
    if isinstance(run_ids, str):
        raise TypeError("run_ids must be a list of run ids, not a string")
    if flow is not None and flow not in _FLOWS:
        raise ConfigError(_not_imported(flow))
    store = _engine.get_store()
    if run_ids is None:
        versions = current_versions()
        if flow is not None:
            versions = [(n, f) for n, f in versions if n == flow]
        ids = [c[0] for c in _core.upgrade_candidates(store, versions, since)]
    else:
        ids = [getattr(r, "id", r) for r in run_ids]
    reports = []
    for run_id in ids:
        try:
            report = upgrade_one(store, run_id, dry_run=dry_run)
        except ComposeError as e:
            # A run whose stored data cannot be read here (an unregistered
            # type, ...) is reported and the others are still upgraded.
            report = UpgradeReport(run_id, "?", "skipped", reason=f"{type(e).__name__}: {e}")
        if flow is not None and run_ids is not None and report.flow not in (flow, "?"):
            report = UpgradeReport(
                run_id,
                report.flow,
                "skipped",
                reason=f"a run of flow {report.flow!r}, not {flow!r}",
            )
        reports.append(report)
    return reports


def code_versions() -> list[dict[str, Any]]:
    """Per flow and code version, the runs not settled yet (queued,
    running, paused or parked), newest version first; the version of the
    code imported here is marked `current` (listed even with no runs)."""
    current = dict(current_versions())
    rows = _core.code_versions(_engine.get_store())
    out: list[dict[str, Any]] = []
    seen = set()
    for name, fingerprint, queued, running, paused, newest in rows:
        seen.add((name, fingerprint))
        out.append(
            {
                "flow": name,
                "fingerprint": fingerprint,
                "version": _short(fingerprint),
                "unsettled": queued + running + paused,
                "queued": queued,
                "running": running,
                "paused": paused,
                "newest_start": newest,
                "current": current.get(name) == fingerprint,
            }
        )
    for name, fingerprint in current.items():
        if (name, fingerprint) not in seen:
            out.append(
                {
                    "flow": name,
                    "fingerprint": fingerprint,
                    "version": _short(fingerprint),
                    "unsettled": 0,
                    "queued": 0,
                    "running": 0,
                    "paused": 0,
                    "newest_start": None,
                    "current": True,
                }
            )
    out.sort(key=lambda r: (r["flow"], not r["current"], -(r["newest_start"] or 0.0)))
    return out
