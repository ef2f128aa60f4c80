"""The web UI's pages: server-rendered HTML over the CLI's core queries.

Every stored value (names, ids, payloads, errors, answers) reaches the page
through `esc` or `pretty`, so markup inside stored data is shown as text;
the pages carry no inline script (the Content-Security-Policy forbids it).
Stored JSON is read as plain JSON, never decoded into objects.
"""

from __future__ import annotations

import json
import time
from urllib.parse import quote, urlencode

from .. import _core, _show
from ..errors import ComposeError
from .html import esc, pretty
from .waterfall import seconds, waterfall

PAGE_SIZES = (10, 25, 50, 100, 200)


def run_href(run_id: str) -> str:
    return "/run/" + quote(run_id, safe="")


# The navigation bar: (path, label). A new page adds its entry here and its
# route in `server.GET_PAGES`.
NAV: list[tuple[str, str]] = [
    ("/", "Runs"),
    ("/inbox", "Inbox"),
    ("/workers", "Workers"),
    ("/costs", "Costs"),
    ("/threads", "Threads"),
    ("/queues", "Queues"),
]


def layout(title: str, body: str, *, csrf: str, extra_attrs: str = "") -> str:
    """A page: navigation, then `body`. `csrf` is empty on pages served
    before the request was authorized (error pages), so they never carry it."""
    links = "".join(f"<a href='{esc(path)}'>{esc(label)}</a>" for path, label in NAV)
    meta = f"<meta name='csrf-token' content='{esc(csrf)}'>" if csrf else ""
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{esc(title)} · compose ui</title>{meta}"
        "<link rel='stylesheet' href='/static/style.css'>"
        "<script src='/static/app.js' defer></script></head>"
        f"<body{extra_attrs}><nav><a class='brand' href='/'>compose ui</a>{links}</nav><main>"
        f"{body}</main></body></html>"
    )


def error_page(status: int, title: str, message: str, *, csrf: str = "") -> str:
    """A styled error page (404, 403, 401, 500 ...)."""
    return layout(
        f"{status} {title}",
        f"<section class='error-page'><p class='code'>{status}</p><h1>{esc(title)}</h1>"
        f"<p class='flash err' role='alert'>{esc(message)}</p>"
        "<p><a href='/'>« back to the runs</a></p></section>",
        csrf=csrf,
    )


def _options(values: tuple, chosen: str | None, blank: str | None) -> str:
    out = [] if blank is None else [f"<option value=''>{esc(blank)}</option>"]
    for v in values:
        sel = " selected" if str(v) == chosen else ""
        out.append(f"<option value='{esc(v)}'{sel}>{esc(v)}</option>")
    return "".join(out)


def _duration(row: dict, now: float) -> str:
    """How long the run has taken: until now while it runs, is queued or
    waits paused (a paused run is not over), else until it settled."""
    open_ended = row["status"] in ("running", "queued", "paused")
    end = now if open_ended else row["updated_at"]
    text = seconds(max(0.0, (end or now) - row["created_at"]))
    return f"{text} so far" if row["status"] == "paused" else text


def _parse_before(value: str | None) -> tuple[float, str] | None:
    if not value:
        return None
    at, _, run_id = value.partition(":")
    try:
        return float(at), run_id
    except ValueError:
        raise ComposeError(f"invalid page position {value!r}") from None


def runs_page(params: dict[str, str], csrf: str) -> str:
    """The runs list: filters (status, kind, since, full-text `q`) and keyset
    pages, so only one page of runs is read however many are stored."""
    status = params.get("status") or None
    kind = params.get("kind") or None
    if status is not None and status not in _show._STATUSES:
        raise ComposeError(f"unknown status {status!r}")
    if kind is not None and kind not in _show._KINDS:
        raise ComposeError(f"unknown kind {kind!r}")
    since_text = params.get("since") or ""
    since = _show._parse_since(since_text) if since_text else None
    query = params.get("q") or ""
    try:
        limit = int(params.get("limit") or 50)
    except ValueError:
        limit = 50
    limit = min(max(limit, 1), 500)
    before = _parse_before(params.get("before"))
    note = ""
    db = _show._db_path()
    if query:
        outcome, value = _core.search_runs(db, query, status, kind, since, limit + 1, before)
        if outcome == "bad_query":
            raise ComposeError(f"invalid search syntax {query!r}: {value}")
        if outcome == "unavailable":
            note = "<p class='note'>full-text search is unavailable here; the filter is ignored</p>"
        rows = value or []
    else:
        rows = _core.query_runs(db, status, kind, since, limit + 1, before) or []
    more = len(rows) > limit
    rows = rows[:limit]
    parked = _show._parked(rows) if rows else {}
    now = time.time()
    filters = (
        "<form class='filters' method='get' action='/'>"
        f"<label>status <select name='status'>{_options(_show._STATUSES, status, 'any')}"
        "</select></label>"
        f"<label>kind <select name='kind'>{_options(_show._KINDS, kind, 'any')}</select></label>"
        f"<label>since <input name='since' size='10' placeholder='7d, 12h, 2026-01-31' "
        f"value='{esc(since_text)}'></label>"
        f"<label>search <input name='q' size='18' placeholder='full text' value='{esc(query)}'>"
        "</label>"
        f"<label>per page <select name='limit'>{_options(PAGE_SIZES, str(limit), None)}"
        "</select></label><button type='submit'>Filter</button></form>"
    )
    body = [f"<h1>Runs</h1>{filters}{note}"]
    if not rows:
        body.append("<p class='empty'>no runs found</p>")
    else:
        body.append(
            "<table class='runs'><thead><tr><th>run</th><th>kind</th><th>name</th>"
            "<th>status</th><th>created</th><th>duration</th><th class='num'>cost</th>"
            "<th class='num'>tokens</th></tr></thead><tbody>"
        )
        for r in rows:
            waiting = parked.get(r["run_id"], "").strip()
            body.append(
                f"<tr class='run' data-run-id='{esc(r['run_id'])}'>"
                f"<td><a href='{esc(run_href(r['run_id']))}'>{esc(r['run_id'])}</a></td>"
                f"<td>{esc(r['kind'])}</td><td>{esc(r['name'])}</td>"
                f"<td><span class='status {esc(r['status'])}'>{esc(r['status'])}</span>"
                f"{f' <small>{esc(waiting)}</small>' if waiting else ''}</td>"
                f"<td>{esc(_show._age(r['created_at'], now))}</td>"
                f"<td>{esc(_duration(r, now))}</td>"
                f"<td class='num'>{esc(_show._cost(r['cost_usd'], r['cost_complete']))}</td>"
                f"<td class='num'>{esc(r['tokens'])}</td></tr>"
            )
        body.append("</tbody></table>")
    keep = {k: v for k, v in params.items() if k in ("status", "kind", "since", "q", "limit") and v}
    links = []
    if before is not None:
        links.append(f"<a href='/?{esc(urlencode(keep))}'>« newest</a>")
    if more:
        last = rows[-1]
        nxt = dict(keep, before=f"{last['created_at']!r}:{last['run_id']}")
        links.append(f"<a class='older' href='/?{esc(urlencode(nxt))}'>older »</a>")
    if links:
        body.append(f"<p class='pager'>{' '.join(links)}</p>")
    return layout("Runs", "".join(body), csrf=csrf)


def _answer_forms(
    run_id: str, kind: str, pending: list, csrf: str, *, back: str = "", heading: bool = True
) -> str:
    """The answer forms of a run's pending interrupts (Approve / Deny / a JSON
    answer); `back="inbox"` returns to the inbox once answered."""
    from .._answer import Pending, graph_head

    if not pending:
        return ""
    action = esc(run_href(run_id) + "/answer")
    hidden = f"<input type='hidden' name='csrf' value='{esc(csrf)}'>"
    if back:
        hidden += f"<input type='hidden' name='next' value='{esc(back)}'>"
    if kind == "graph":
        # The suspension shown here: an answer posted after the run moved on
        # from it is refused, not given to the node's next question.
        head = graph_head(run_id)
        if head is not None:
            hidden += f"<input type='hidden' name='at' value='{esc(head)}'>"
    out = ["<section class='pending'>" + ("<h2>Pending interrupts</h2>" if heading else "")]
    for row in pending:
        p = Pending(row)
        if p.kind in ("timer", "signal"):
            out.append(
                f"<div class='interrupt parked'><b>{esc(p.id)}</b> <i>{esc(p.kind)}</i> "
                f"<pre>{esc(json.dumps(p.payload, indent=2))}</pre>"
                "<p>continued by <code>compose worker</code> when due</p></div>"
            )
            continue
        ident = f"<input type='hidden' name='interrupt_id' value='{esc(p.id)}'>"
        question = f"<p class='question'>{esc(p.question)}</p>" if p.question else ""
        out.append(
            f"<div class='interrupt' data-interrupt-id='{esc(p.id)}'>"
            f"<p><b>{esc(p.id)}</b> <i>{esc(p.kind)}</i></p>{question}"
            f"<pre class='payload'>{esc(json.dumps(p.payload, indent=2, ensure_ascii=False))}</pre>"
            f"<form method='post' action='{action}' class='buttons'>{hidden}{ident}"
            "<button class='approve' name='action' value='approve'>Approve</button>"
            "<button class='deny' name='action' value='deny'>Deny</button></form>"
            f"<form method='post' action='{action}' class='json'>{hidden}{ident}"
            "<input type='hidden' name='action' value='json'>"
            "<label>answer (JSON) <textarea name='value' rows='2' cols='40'>"
            "</textarea></label><button class='send'>Send answer</button></form></div>"
        )
    out.append("</section>")
    return "".join(out)


def _actions(row: dict, csrf: str) -> str:
    """The run's actions: cancel (while it can still stop), replay check (a
    flow run's body against its journal; nothing executes or is written)."""
    base = run_href(row["run_id"])
    hidden = f"<input type='hidden' name='csrf' value='{esc(csrf)}'>"
    out = []
    if row["status"] in ("running", "paused", "queued"):
        out.append(
            f"<form method='post' action='{esc(base + '/cancel')}' class='cancel' "
            f"data-confirm='Cancel run {esc(row['run_id'])}?'>{hidden}"
            "<button class='cancel danger'>Cancel run</button></form>"
        )
    if row["kind"] == "flow":
        out.append(
            f"<form method='post' action='{esc(base + '/replay')}' class='replay'>{hidden}"
            "<button class='replay'>Replay check</button></form>"
        )
    if not out:
        return ""
    return "<div class='actions'>" + "".join(out) + "</div>"


def run_page(run_id: str, csrf: str, *, message: str = "", error: str = "") -> tuple[int, str]:
    db = _show._db_path()
    outcome, view = _core.trace_view(db, run_id, "tree", False)
    if outcome == "ambiguous":
        raise ComposeError(_show._ambiguous(run_id, view).args[0])
    if outcome != "found":
        return 404, error_page(404, "Run not found", f"no run found with id '{run_id}'", csrf=csrf)
    run_id = view["run_id"]
    _, row = _core.resolve_run(db, run_id)
    _, spans_view = _core.span_view(db, run_id)
    spans = spans_view["spans"] if spans_view else []
    from .. import _engine

    journal = _engine.get_store().journal(run_id) if row else []
    keys = [k for k, _ in journal]
    # Internal entries (answers, fork origin, waits) are not steps.
    steps = [k for k in keys if not k.startswith("__")]
    now = time.time()
    state = f"{row['status']}:{row['updated_at']!r}:{len(spans)}:{len(view['pending'])}"
    meta = [
        (
            f"<tr><th>status</th><td><span id='run-status' class='status {esc(row['status'])}'>"
            f"{esc(row['status'])}</span></td></tr>"
        ),
        f"<tr><th>kind</th><td>{esc(row['kind'])}</td></tr>",
        f"<tr><th>name</th><td>{esc(row['name'])}</td></tr>",
    ]
    if row.get("module"):
        meta.append(f"<tr><th>module</th><td><code>{esc(row['module'])}</code></td></tr>")
    origin = _fork_origin(dict(journal).get("__fork__"))
    if origin is not None:
        meta.append(
            f"<tr><th>forked from</th><td><a href='{esc(run_href(origin[0]))}'>"
            f"<code>{esc(origin[0])}</code></a> at <code>{esc(origin[1])}</code></td></tr>"
        )
    meta += [
        f"<tr><th>created</th><td>{esc(_show._age(row['created_at'], now))}</td></tr>",
        f"<tr><th>duration</th><td>{esc(_duration(row, now))}</td></tr>",
        f"<tr><th>trace</th><td><code>{esc(row['trace_id'])}</code></td></tr>",
    ]
    body = [
        f"<h1>Run <code>{esc(run_id)}</code></h1>",
        f"<p class='flash ok' role='status'>{esc(message)}</p>" if message else "",
        f"<p class='flash err' role='alert'>{esc(error)}</p>" if error else "",
        "<table class='meta'>",
        *meta,
        "</table>",
        _actions(row, csrf),
        _answer_forms(run_id, row["kind"], view["pending"], csrf),
    ]
    if row["output_json"] is not None:
        body.append(f"<h2>Output</h2><pre class='run-output'>{pretty(row['output_json'])}</pre>")
    if row["error_json"] is not None:
        body.append(f"<h2>Error</h2><pre class='run-error'>{pretty(row['error_json'])}</pre>")
    if view["events"]:
        # The latest value of each event the run published (OPS-21).
        events = "".join(
            f"<tr><th><code>{esc(key)}</code></th><td><pre>{pretty(value_json)}</pre></td></tr>"
            for key, value_json in view["events"]
        )
        body.append(f"<h2>Events</h2><table class='events'>{events}</table>")
    fork_action = run_href(run_id) + "/fork" if row["kind"] == "flow" else None
    body.append("<h2>Timeline</h2>")
    body.append(waterfall(spans, fork_action=fork_action, fork_keys=set(steps), csrf=csrf))
    body.append(
        f"<details class='text-trace'><summary>Text trace</summary>"
        f"<pre class='tree'>{esc(view['text'])}</pre></details>"
    )
    items = "".join(f"<li><code>{esc(k)}</code></li>" for k in steps)
    internal = len(keys) - len(steps)
    note = (
        f"<p class='note'>{internal} internal entr{'y' if internal == 1 else 'ies'} "
        "(answers, waits, fork origin) not shown</p>"
        if internal
        else ""
    )
    body.append(
        f"<h2>Journaled steps</h2><ul class='journal'>{items or '<li>none</li>'}</ul>{note}"
    )
    attrs = (
        f" data-run-id='{esc(run_id)}' data-run-url='{esc(run_href(run_id))}'"
        f" data-state='{esc(state)}'"
    )
    return 200, layout(f"Run {run_id}", "".join(body), csrf=csrf, extra_attrs=attrs)


def _fork_origin(value_json: str | None) -> tuple[str, str] | None:
    """`(run_id, at)` of a forked run's origin entry."""
    if value_json is None:
        return None
    try:
        value = json.loads(value_json)
        return str(value["run_id"]), str(value["at"])
    except (ValueError, KeyError, TypeError):
        return None


def run_state(run_id: str) -> dict | None:
    """What the run page's poller compares to see that the run moved on."""
    db = _show._db_path()
    outcome, row = _core.resolve_run(db, run_id)
    if outcome != "found":
        return None
    _, spans_view = _core.span_view(db, row["run_id"])
    from .. import _engine

    pending = _engine.get_store().pending(row["run_id"])
    spans = len(spans_view["spans"]) if spans_view else 0
    return {
        "run_id": row["run_id"],
        "status": row["status"],
        "state": f"{row['status']}:{row['updated_at']!r}:{spans}:{len(pending)}",
    }


def costs_page(params: dict[str, str], csrf: str) -> str:
    by = params.get("by") or "day"
    if by not in ("model", "name", "day"):
        raise ComposeError(f"unknown grouping {by!r}")
    since_text = params.get("since") or ""
    since = _show._parse_since(since_text) if since_text else None
    found = _core.llm_costs(_show._db_path(), by, since)  # type: ignore[arg-type]
    tabs = " ".join(
        f"<a class='{'on' if b == by else ''}' href='/costs?{esc(urlencode({'by': b}))}'>{b}</a>"
        for b in ("model", "name", "day")
    )
    body = [f"<h1>Costs by {esc(by)}</h1><p class='tabs'>{tabs}</p>"]
    if not found or not found[0]:
        body.append("<p class='empty'>no llm spans found</p>")
        return layout("Costs", "".join(body), csrf=csrf)
    buckets, total = found
    # Bars by cost when any call was priced, else by tokens.
    priced = any(b[3] for b in buckets)
    top = max((b[3] or 0) if priced else b[2] for b in buckets) or 1
    width, bar_h = 640, 22
    svg = [
        (
            f"<svg class='chart' role='img' aria-label='costs by {esc(by)}' width='{width + 260}' "
            f"height='{bar_h * len(buckets) + 10}' xmlns='http://www.w3.org/2000/svg'>"
        )
    ]
    for i, (key, calls, tokens, cost, incomplete) in enumerate(buckets):
        amount = (cost or 0) if priced else tokens
        w = max(1, int(width * amount / top))
        y = i * bar_h + 4
        label = _show._bucket_cost(cost, incomplete) if priced else f"{tokens} tok"
        svg.append(
            f"<text x='0' y='{y + 15}' class='label'>{esc(str(key)[:28])}</text>"
            f"<rect x='200' y='{y}' width='{w}' height='{bar_h - 6}' class='bar'></rect>"
            f"<text x='{205 + w}' y='{y + 15}' class='value'>{esc(label)}</text>"
        )
    svg.append("</svg>")
    body.append("".join(svg))
    body.append(
        "<table class='costs'><thead><tr><th>"
        f"{esc(by)}</th><th class='num'>calls</th><th class='num'>tokens</th>"
        "<th class='num'>cost</th></tr></thead><tbody>"
    )
    for key, calls, tokens, cost, incomplete in [*buckets, total]:
        body.append(
            f"<tr><td>{esc(key)}</td><td class='num'>{calls}</td><td class='num'>{tokens}</td>"
            f"<td class='num'>{esc(_show._bucket_cost(cost, incomplete))}</td></tr>"
        )
    body.append("</tbody></table>")
    return layout("Costs", "".join(body), csrf=csrf)


def threads_page(csrf: str) -> str:
    store = _show._graph_store()
    rows = json.loads(_core.thread_list(store, None)) if store is not None else []
    now = time.time()
    body = ["<h1>Graph threads</h1>"]
    if not rows:
        body.append("<p class='empty'>no threads found</p>")
    else:
        body.append(
            "<table><thead><tr><th>thread</th><th>graph</th><th>status</th><th>version</th>"
            "<th>updated</th><th>head</th></tr></thead><tbody>"
        )
        for r in rows:
            href = "/thread/" + quote(r["thread_id"], safe="")
            body.append(
                f"<tr><td><a href='{esc(href)}'>{esc(r['thread_id'])}</a></td>"
                f"<td>{esc(r['graph'])}</td><td>{esc(r['status'])}</td>"
                f"<td>v{esc(r['version'])}</td>"
                f"<td>{esc(_show._age(r['updated_at_ms'] / 1000, now))}</td>"
                f"<td><code>{esc(r['head'] or '-')}</code></td></tr>"
            )
        body.append("</tbody></table>")
    return layout("Threads", "".join(body), csrf=csrf)


def thread_page(thread_id: str, csrf: str) -> tuple[int, str]:
    store = _show._graph_store()
    try:
        rows = json.loads(_core.thread_history_any(store, thread_id, 200)) if store else None
    except ComposeError:
        rows = None
    if rows is None:
        return 404, layout(
            "Not found", f"<h1>Not found</h1><p>no thread '{esc(thread_id)}'</p>", csrf=csrf
        )
    now = time.time()
    body = [
        f"<h1>Thread <code>{esc(thread_id)}</code></h1><h2>Checkpoints (newest first)</h2>",
        (
            "<table><thead><tr><th>checkpoint</th><th>source</th><th>status</th><th>version</th>"
            "<th>step</th><th>created</th><th>run</th></tr></thead><tbody>"
        ),
    ]
    for r in rows:
        run = r.get("run_id")
        run_cell = f"<a href='{esc(run_href(run))}'>{esc(run)}</a>" if run else "-"
        body.append(
            f"<tr><td><code>{esc(r['id'])}</code></td><td>{esc(r['source'])}</td>"
            f"<td>{esc(r['status'])}</td><td>v{esc(r['version'])}</td><td>{esc(r['step'])}</td>"
            f"<td>{esc(_show._age(r['created_at_ms'] / 1000, now))}</td><td>{run_cell}</td></tr>"
        )
    body.append("</tbody></table>")
    return 200, layout(f"Thread {thread_id}", "".join(body), csrf=csrf)


def queues_page(csrf: str) -> str:
    from .. import _engine

    kind, target = _show._store_target()
    import os

    missing = kind == "sqlite" and not os.path.exists(target)
    rows = [] if missing else _core.queue_stats(_engine.get_store())
    now = time.time()
    body = ["<h1>Queues</h1>"]
    if not rows:
        body.append("<p class='empty'>no queues found</p>")
    else:
        body.append(
            "<table><thead><tr><th>queue</th><th class='num'>queued</th>"
            "<th class='num'>running</th><th class='num'>done 1h</th>"
            "<th>oldest queued</th></tr></thead><tbody>"
        )
        for name, queued, running, done, oldest in rows:
            age = "-" if oldest is None else _show._duration(now - oldest)
            body.append(
                f"<tr><td>{esc(name)}</td><td class='num'>{queued}</td>"
                f"<td class='num'>{running}</td><td class='num'>{done}</td>"
                f"<td>{esc(age)}</td></tr>"
            )
        body.append("</tbody></table>")
    return layout("Queues", "".join(body), csrf=csrf)


# -- the inbox: runs waiting for a person ---------------------------------------

INBOX_LIMIT = 200


def inbox_page(csrf: str, *, message: str = "") -> str:
    """Paused runs with a question or an approval pending (not those parked on
    a timer or a signal), oldest waiting first, each answerable here."""
    from .. import _engine
    from .._answer import Pending

    db = _show._db_path()
    rows = _core.query_runs(db, "paused", None, None, INBOX_LIMIT + 1, None) or []
    more = len(rows) > INBOX_LIMIT
    store = None if _engine.missing_store() else _engine.get_store()
    now = time.time()
    waiting = []
    for row in rows[:INBOX_LIMIT]:
        pending = store.pending(row["run_id"]) if store is not None else []
        asks = [p for p in pending if Pending(p).kind not in ("timer", "signal")]
        if asks:
            waiting.append((row, asks))
    waiting.reverse()
    body = [
        (
            "<h1>Inbox <small class='count'>"
            f"{len(waiting)} run{'' if len(waiting) == 1 else 's'} waiting for a person</small></h1>"
        ),
        f"<p class='flash ok'>{esc(message)}</p>" if message else "",
    ]
    if not waiting:
        body.append("<p class='empty'>nothing is waiting for an answer</p>")
    for row, asks in waiting:
        run_id = row["run_id"]
        body.append(
            f"<article class='inbox-item' data-run-id='{esc(run_id)}'><header>"
            f"<a href='{esc(run_href(run_id))}'><code>{esc(run_id)}</code></a> "
            f"<b>{esc(row['name'])}</b> <span class='kind'>{esc(row['kind'])}</span> "
            f"<span class='age'>waiting {esc(seconds(max(0.0, now - row['updated_at'])))}"
            "</span></header>"
            f"{_answer_forms(run_id, row['kind'], asks, csrf, back='inbox', heading=False)}"
            "</article>"
        )
    if more:
        body.append(
            f"<p class='note'>only the {INBOX_LIMIT} most recently paused runs are read: "
            "answer some, or find older ones on the runs page (status paused)</p>"
        )
    return layout("Inbox", "".join(body), csrf=csrf)


# -- workers: liveness from their leases ---------------------------------------


def _owner_parts(owner: str) -> tuple[str, str]:
    """`(host, pid)` of a lease owner id (`host:pid:start:ulid`)."""
    parts = owner.split(":")
    if len(parts) >= 4:
        return ":".join(parts[:-3]), parts[-3]
    return owner, "?"


def workers_page(csrf: str) -> str:
    """Every process holding a run's lease, with its last heartbeat (a lease
    is renewed every few seconds while its holder lives; a lease that ran
    out means its holder stopped)."""
    from .. import _engine

    lease = _lease_seconds()
    holders = [] if _engine.missing_store() else _core.lease_holders(_engine.get_store())
    now = time.time()
    body = [
        "<h1>Workers</h1>",
        (
            "<p class='note'>A process appears here while it holds a run's lease: a "
            "<code>compose worker</code> continuing runs, or any process executing one. Its "
            f"heartbeat renews the lease ({lease:g}s); an expired lease means the process stopped, "
            "and its runs are taken over by the next worker pass.</p>"
        ),
    ]
    if not holders:
        body.append("<p class='empty'>no process holds a lease right now</p>")
        return layout("Workers", "".join(body), csrf=csrf)
    body.append(
        "<table class='workers'><thead><tr><th>host</th><th>pid</th><th>state</th>"
        "<th>last heartbeat</th><th class='num'>runs held</th><th>owner id</th></tr>"
        "</thead><tbody>"
    )
    for owner, runs, until in holders:
        host, pid = _owner_parts(owner)
        alive = until > now
        beat = max(0.0, now - (until - lease))
        state = "alive" if alive else "lease expired"
        body.append(
            f"<tr class='worker {'alive' if alive else 'stale'}'><td>{esc(host)}</td>"
            f"<td>{esc(pid)}</td><td><span class='status {'completed' if alive else 'failed'}'>"
            f"{esc(state)}</span></td><td>{esc(seconds(beat))} ago</td>"
            f"<td class='num'>{runs}</td><td><code>{esc(owner)}</code></td></tr>"
        )
    body.append("</tbody></table>")
    return layout("Workers", "".join(body), csrf=csrf)


def _lease_seconds() -> float:
    import os

    try:
        value = float(os.environ.get("COMPOSE_LEASE_SECONDS") or 30.0)
    except ValueError:
        return 30.0
    return value if value > 0 else 30.0
