"""The schedules page of the web UI: every schedule with its
pattern, zone, next and last fire (linking its last run), and its state."""

from __future__ import annotations

import os

from .. import _show
from .views import esc, layout, run_href


def _when(value) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def schedules_page(csrf: str) -> str:
    from ..schedules import list_schedules, unserved

    kind, target = _show._store_target()
    missing = kind == "sqlite" and not os.path.exists(target)
    found = [] if missing else list_schedules()
    orphans = unserved([s.flow for s in found]) if found else set()
    body = ["<h1>Schedules</h1>"]
    if not found:
        body.append("<p class='empty'>no schedules found</p>")
        return layout("Schedules", "".join(body), csrf=csrf)
    body.append(
        "<table><thead><tr><th>name</th><th>flow</th><th>cron</th><th>time zone</th>"
        "<th>catchup</th><th>next fire</th><th>last fire</th><th>state</th></tr></thead><tbody>"
    )
    for s in found:
        last = esc(_when(s.last_fire))
        if s.last_run_id:
            last = f"<a href='{esc(run_href(s.last_run_id))}'>{last}</a>"
        if s.paused:
            state = "paused"
        elif s.flow in orphans:
            state = f"no worker has imported flow {s.flow}"
        else:
            state = "active"
        body.append(
            f"<tr><td>{esc(s.name)}</td><td>{esc(s.flow)}</td><td><code>{esc(s.cron)}</code></td>"
            f"<td>{esc(s.timezone)}</td><td>{esc(s.catchup)}</td>"
            f"<td>{esc(_when(None if s.paused else s.next_fire))}</td><td>{last}</td>"
            f"<td>{esc(state)}</td></tr>"
        )
    body.append("</tbody></table>")
    return layout("Schedules", "".join(body), csrf=csrf)
