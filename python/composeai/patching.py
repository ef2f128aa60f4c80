"""Changing a flow's code under runs in flight: `patched` and `deprecate_patch`.

A run that waits for days outlives deploys. Put the changed part of a flow body behind
`patched` so that runs started on the old code keep taking the old branch on replay while
runs started on the new code take the new one::

    if compose.patched("v2-summary"):
        summary = summarize_v2(doc)
    else:
        summary = summarize(doc)

Once no run started without the patch remains, replace the `if` by
`compose.deprecate_patch("v2-summary")` followed by the new branch alone; once no run
journaled the patch's marker either, remove that line too.

How a call finds its position: `patched` is a journaled call of its scope (the flow body,
a nested flow's body, a `map` item or an `aggregate` branch) like a task or `now()`, so
it is placed at the scope's next call position, counted in the order the body makes its
calls. Replay compares that position with the journal: the patch's marker there means
the run took the new branch (True); another call journaled there means the run was
started without the patch (False). In both False cases (and for `deprecate_patch`) the
call takes no position and journals nothing, so the calls after it keep the positions
the journal has for them. Where the journal of that scope ends before the call, the run
decides: one started on the flow's current source (its stored fingerprint is the
imported flow's, and it was never upgraded to it) journals the marker there and takes
the new branch; any other takes the old one.
"""

from __future__ import annotations

from . import _engine
from ._lifecycle import _FLOWS
from .errors import ConfigError

__all__ = ["deprecate_patch", "patched"]


def patched(patch_id: str) -> bool:
    """Whether the running flow body takes the branch of patch `patch_id`.

    True in a run started on code with the patch: the first time the body
    reaches the call, a marker is journaled at the call's position, and
    every replay of that position answers True again. False in a run that
    was started on code without the patch: where its journal holds another
    call at this position, or ends before it; nothing is journaled then,
    and later calls replay at the positions they were journaled at. Never
    a divergence. Works in sync and async flow bodies (no await needed);
    outside a durable run it returns True. The same `patch_id` may be used
    more than once in a scope: each call has its own position.

    Raises `ConfigError` when `patch_id` is not a non-empty string.
    """
    return _patch(patch_id, "patched", deprecate=False)


def deprecate_patch(patch_id: str) -> None:
    """Marks the stage of patch `patch_id` where no run started without it
    remains: the body keeps only the new branch. A run that journaled the
    patch's marker at this position replays it here; a run without it
    (started after the patch was deprecated) journals nothing. Never a
    divergence; sync and async bodies alike.

    Raises `ConfigError` when `patch_id` is not a non-empty string.
    """
    _patch(patch_id, "deprecate_patch", deprecate=True)


def _patch(patch_id: object, what: str, *, deprecate: bool) -> bool:
    if not isinstance(patch_id, str) or not patch_id:
        raise ConfigError(
            f"compose.{what}() takes a non-empty string patch id, got {patch_id!r} -- "
            f'name the change, e.g. compose.{what}("v2-summary")'
        )
    frame = _engine.FRAME.get()
    if frame is None or frame.run is None:
        return True
    run = frame.run
    attempt = run.attempt
    flow_obj = _FLOWS.get(run.name) if run.kind == "flow" else None
    fingerprint = attempt.fingerprint
    same_code = flow_obj is None or (
        fingerprint is not None and flow_obj._has_fingerprint(fingerprint)
    )
    return attempt.patched(frame.scope, patch_id, same_code, deprecate, frame.fence)  # type: ignore[no-any-return]
