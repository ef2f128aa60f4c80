"""The web UI's pages: server-rendered HTML over the CLI's core queries.

Every stored value (names, ids, payloads, errors, answers) reaches the page
through `esc` or `pretty`, so markup inside stored data is shown as text;
the pages carry no inline script (the Content-Security-Policy forbids it).
Stored JSON is read as plain JSON, never decoded into objects.
"""

from __future__ import annotations

import html
import json
import time
from typing import Any
from urllib.parse import quote, urlencode

from .. import _core, _show
from ..errors import ComposeError

PAGE_SIZES = (10, 25, 50, 100, 200)


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def pretty(value_json: str | None) -> str:
    """Stored JSON, indented, escaped for a `<pre>`."""
    if value_json is None:
        return ""
    try:
        text = json.dumps(json.loads(value_json), indent=2, ensure_ascii=False)
    except ValueError:
        text = value_json
    return esc(text)


def run_href(run_id: str) -> str:
    return "/run/" + quote(run_id, safe="")


def layout(title: str, body: str, *, csrf: str, extra_attrs: str = "") -> str:
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{esc(title)} · compose ui</title>"
        f"<meta name='csrf-token' content='{esc(csrf)}'>"
        "<link rel='stylesheet' href='/static/style.css'>"
        "<script src='/static/app.js' defer></script></head>"
        f"<body{extra_attrs}><nav><a class='brand' href='/'>compose ui</a>"
        "<a href='/'>Runs</a><a href='/costs'>Costs</a><a href='/threads'>Threads</a>"
        "<a href='/queues'>Queues</a></nav><main>"
        f"{body}</main></body></html>"
    )


def _options(values: tuple, chosen: str | None, blank: str | None) -> str:
    out = [] if blank is None else [f"<option value=''>{esc(blank)}</option>"]
    for v in values:
        sel = " selected" if str(v) == chosen else ""
        out.append(f"<option value='{esc(v)}'{sel}>{esc(v)}</option>")
    return "".join(out)


def _duration(row: dict, now: float) -> str:
    end = now if row["status"] in ("running", "queued") else row["updated_at"]
    return _show._duration(max(0.0, (end or now) - row["created_at"]))


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


def _usage_text(usage: tuple | None) -> str:
    if usage is None:
        return ""
    inp, out, cache_r, cache_c, reasoning, cost, complete = usage
    parts = [f"in={inp}", f"out={out}"]
    if cache_r or cache_c:
        parts.append(f"cache_read={cache_r} cache_write={cache_c}")
    if reasoning:
        parts.append(f"reasoning={reasoning}")
    parts.append(f"cost={_show._cost(cost, complete)}")
    return " ".join(parts)


def _span_html(spans: list[tuple]) -> str:
    """Each span, indented under its parent, with its payloads."""
    children: dict[str | None, list[tuple]] = {}
    ids = {s[0] for s in spans}
    for s in spans:
        parent = s[1] if s[1] in ids else None
        children.setdefault(parent, []).append(s)
    out: list[str] = []
    # Iterative, so a deep trace cannot exhaust the recursion limit; `None`
    # closes the innermost open span.
    stack: list[tuple | None] = list(reversed(children.get(None, [])))
    while stack:
        item = stack.pop()
        if item is None:
            out.append("</div></details>")
            continue
        (span_id, _parent, kind, name, start, end, status, replayed, error, usage, payloads) = item
        attributes_json, input_json, output_json = payloads
        marks = []
        if replayed:
            marks.append("<span class='mark replayed'>replayed</span>")
        if status == "paused":
            marks.append("<span class='mark paused'>paused</span>")
        if status == "error":
            marks.append("<span class='mark error'>error</span>")
        dur = "running" if end is None else f"{(end - start) * 1000:.0f}ms"
        glyph = _show._GLYPHS.get(kind, "•")
        parts = [
            (
                f"<details class='span' data-span-id='{esc(span_id)}'><summary>{esc(glyph)} "
                f"<b>{esc(name)}</b> <span class='kind'>{esc(kind)}</span> "
                f"<span class='dur'>[{esc(dur)}]</span> {' '.join(marks)}</summary><dl>"
            )
        ]
        if usage is not None:
            parts.append(f"<dt>usage</dt><dd><code>{esc(_usage_text(usage))}</code></dd>")
        if attributes_json:
            parts.append(f"<dt>attributes</dt><dd><pre>{pretty(attributes_json)}</pre></dd>")
        if input_json is not None:
            parts.append(f"<dt>input</dt><dd><pre class='input'>{pretty(input_json)}</pre></dd>")
        if output_json is not None:
            parts.append(f"<dt>output</dt><dd><pre class='output'>{pretty(output_json)}</pre></dd>")
        if error[0] or error[1]:
            parts.append(
                f"<dt>error</dt><dd><pre class='error'>{esc(error[0])}: {esc(error[1])}</pre></dd>"
            )
        parts.append("</dl><div class='children'>")
        out.append("".join(parts))
        stack.append(None)
        stack.extend(reversed(children.get(span_id, [])))
    return "".join(out)


def _answer_forms(run_id: str, kind: str, pending: list, csrf: str) -> str:
    from .._answer import Pending, graph_head

    if not pending:
        return ""
    action = esc(run_href(run_id) + "/answer")
    hidden = f"<input type='hidden' name='csrf' value='{esc(csrf)}'>"
    if kind == "graph":
        # The suspension shown here: an answer posted after the run moved on
        # from it is refused, not given to the node's next question.
        head = graph_head(run_id)
        if head is not None:
            hidden += f"<input type='hidden' name='at' value='{esc(head)}'>"
    out = ["<section class='pending'><h2>Pending interrupts</h2>"]
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


def _code_version(row: dict) -> str:
    """The table row of a flow run's code version (its fingerprint) and
    whether the code imported in this process matches it."""
    fingerprint = row.get("fingerprint")
    if row["kind"] != "flow" or not fingerprint:
        return ""
    from .._lifecycle import _FLOWS

    flow_obj = _FLOWS.get(row["name"])
    if flow_obj is None:
        match, note = "unknown", "flow not imported here (compose ui --import MODULE)"
    elif flow_obj.fingerprint == fingerprint:
        match, note = "yes", "matches the imported code"
    else:
        match = "no"
        note = (
            f"the imported code is {flow_obj.fingerprint[:12]}: workers of that code leave this "
            "run alone; compose upgrade --import MODULE checks it and moves it"
        )
    return (
        f"<tr><th>code version</th><td><code id='run-version' data-matches='{match}'>"
        f"{esc(fingerprint[:12])}</code> {esc(note)}</td></tr>"
    )


def run_page(run_id: str, csrf: str, *, message: str = "", error: str = "") -> tuple[int, str]:
    db = _show._db_path()
    outcome, view = _core.trace_view(db, run_id, "tree", False)
    if outcome == "ambiguous":
        raise ComposeError(_show._ambiguous(run_id, view).args[0])
    if outcome != "found":
        return 404, layout(
            "Not found", f"<h1>Not found</h1><p>no run found with id '{esc(run_id)}'</p>", csrf=csrf
        )
    run_id = view["run_id"]
    _, row = _core.resolve_run(db, run_id)
    _, spans_view = _core.span_view(db, run_id)
    spans = spans_view["spans"] if spans_view else []
    from .. import _engine

    journal_keys = [k for k, _ in _engine.get_store().journal(run_id)] if row else []
    now = time.time()
    state = f"{row['status']}:{row['updated_at']!r}:{len(spans)}:{len(view['pending'])}"
    body = [
        f"<h1>Run <code>{esc(run_id)}</code></h1>",
        f"<p class='flash ok'>{esc(message)}</p>" if message else "",
        f"<p class='flash err' role='alert'>{esc(error)}</p>" if error else "",
        "<table class='meta'>",
        (
            f"<tr><th>status</th><td><span id='run-status' class='status {esc(row['status'])}'>"
            f"{esc(row['status'])}</span></td></tr>"
        ),
        f"<tr><th>kind</th><td>{esc(row['kind'])}</td></tr>",
        f"<tr><th>name</th><td>{esc(row['name'])}</td></tr>",
        f"<tr><th>created</th><td>{esc(_show._age(row['created_at'], now))}</td></tr>",
        f"<tr><th>duration</th><td>{esc(_duration(row, now))}</td></tr>",
        f"<tr><th>trace</th><td><code>{esc(row['trace_id'])}</code></td></tr>",
        _code_version(row),
        "</table>",
        _answer_forms(run_id, row["kind"], view["pending"], csrf),
    ]
    if row["output_json"] is not None:
        body.append(f"<h2>Output</h2><pre class='run-output'>{pretty(row['output_json'])}</pre>")
    if row["error_json"] is not None:
        body.append(f"<h2>Error</h2><pre class='run-error'>{pretty(row['error_json'])}</pre>")
    body.append(f"<h2>Trace</h2><pre class='tree'>{esc(view['text'])}</pre>")
    body.append(f"<h2>Spans</h2><div class='spans'>{_span_html(spans)}</div>")
    keys = "".join(f"<li><code>{esc(k)}</code></li>" for k in journal_keys)
    body.append(f"<h2>Journal keys</h2><ul class='journal'>{keys or '<li>none</li>'}</ul>")
    attrs = (
        f" data-run-id='{esc(run_id)}' data-run-url='{esc(run_href(run_id))}'"
        f" data-state='{esc(state)}'"
    )
    return 200, layout(f"Run {run_id}", "".join(body), csrf=csrf, extra_attrs=attrs)


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
