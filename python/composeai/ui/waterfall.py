"""The run page's span timeline: one row per span, indented under its parent,
with a bar placed on the run's time axis, its duration, and the tokens and
cost of its model calls (a parent's own plus its descendants'). Rows are
`<details>`: opening one shows the span's payloads (and, on a step a run
can be forked at, the fork form). A parent's twisty collapses its subtree
(`/static/app.js`); without the script every row stays visible.

Bars are SVG rectangles positioned by attributes: the Content-Security-
Policy forbids inline style attributes.
"""

from __future__ import annotations

import time
from typing import Any

from .. import _show
from .html import esc, pretty

# Beyond this, deeper spans are drawn at this indentation.
_MAX_INDENT = 24


def seconds(value: float) -> str:
    """A duration for a person: milliseconds under a second, else seconds
    with one decimal under a minute, else `_show`'s minutes/hours."""
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 60:
        return f"{value:.1f}s"
    return _show._duration(value)


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


def _ordered(spans: list[tuple]) -> list[tuple[tuple, int, bool]]:
    """`(span, depth, has_children)` in depth-first order (iterative: a deep
    trace cannot exhaust the recursion limit)."""
    children: dict[str | None, list[tuple]] = {}
    ids = {s[0] for s in spans}
    for s in spans:
        children.setdefault(s[1] if s[1] in ids else None, []).append(s)
    out: list[tuple[tuple, int, bool]] = []
    stack: list[tuple[tuple, int]] = [(s, 0) for s in reversed(children.get(None, []))]
    while stack:
        span, depth = stack.pop()
        kids = children.get(span[0], [])
        out.append((span, depth, bool(kids)))
        stack.extend((k, depth + 1) for k in reversed(kids))
    return out


def _totals(ordered: list[tuple[tuple, int, bool]]) -> dict[str, tuple[int, float | None, bool]]:
    """Per span: tokens, cost and whether the cost is complete, over the span
    and its descendants (one pass from the deepest rows up: in reversed
    depth-first order a span's descendants all come before it)."""
    ids = {span[0] for span, _, _ in ordered}
    totals: dict[str, list[Any]] = {}
    for span, _depth, _kids in reversed(ordered):
        mine = totals.setdefault(span[0], [0, None, True])
        usage = span[9]
        if usage is not None:
            inp, out, _cr, _cc, _reasoning, cost, complete = usage
            mine[0] += inp + out
            if cost is not None:
                mine[1] = (mine[1] or 0.0) + cost
            mine[2] = mine[2] and complete and cost is not None
        if span[1] in ids:
            up = totals.setdefault(span[1], [0, None, True])
            up[0] += mine[0]
            if mine[1] is not None:
                up[1] = (up[1] or 0.0) + mine[1]
            up[2] = up[2] and mine[2]
    return {k: (v[0], v[1], v[2]) for k, v in totals.items()}


def waterfall(
    spans: list[tuple], *, fork_action: str | None, fork_keys: set[str], csrf: str
) -> str:
    """The timeline of `spans` (as `_core.span_view` gives them). With
    `fork_action`, a span recording a step in `fork_keys` offers "Fork at
    this step" (a POST carrying the CSRF token)."""
    if not spans:
        return "<p class='empty'>no spans stored for this run</p>"
    now = time.time()
    t0 = min(s[4] for s in spans)
    t1 = max((s[5] if s[5] is not None else now) for s in spans)
    total = max(t1 - t0, 1e-6)
    ordered = _ordered(spans)
    totals = _totals(ordered)
    out = [
        "<div class='waterfall' role='table' aria-label='spans'>",
        "<div class='wf-head' role='row'><span>span</span>",
        f"<span>timeline ({esc(seconds(total))})</span><span class='num'>duration</span>",
        "<span class='num'>tokens</span><span class='num'>cost</span></div>",
    ]
    for span, depth, has_kids in ordered:
        (span_id, parent, kind, name, start, end, status, replayed, error, usage, payloads) = span[
            :11
        ]
        step_key = span[11] if len(span) > 11 else None
        x = (start - t0) / total * 1000
        width = max(((end if end is not None else now) - start) / total * 1000, 2.0)
        dur = "running" if end is None else seconds(end - start)
        tokens, cost, complete = totals.get(span_id, (0, None, True))
        marks = []
        if replayed:
            marks.append("<span class='mark replayed'>replayed</span>")
        if status == "paused":
            marks.append("<span class='mark paused'>paused</span>")
        if status == "error":
            marks.append("<span class='mark error'>error</span>")
        pads = "<i class='pad'></i>" * min(depth, _MAX_INDENT)
        twisty = (
            "<button type='button' class='twisty' aria-expanded='true' "
            "aria-label='collapse or expand the children'>▾</button>"
            if has_kids
            else "<i class='twisty-gap'></i>"
        )
        glyph = _show._GLYPHS.get(kind, "•")
        out.append(
            f"<details class='wf-span status-{esc(status)}' data-span-id='{esc(span_id)}' "
            f"data-parent='{esc(parent or '')}' data-depth='{depth}'"
            f"{f' data-step-key={chr(39)}{esc(step_key)}{chr(39)}' if step_key else ''}>"
            f"<summary role='row'><span class='wf-name'>{pads}{twisty}"
            f"<span class='glyph'>{esc(glyph)}</span> <b>{esc(name)}</b> "
            f"<span class='kind'>{esc(kind)}</span> {' '.join(marks)}</span>"
            "<span class='wf-bar'><svg viewBox='0 0 1000 10' preserveAspectRatio='none' "
            f"aria-hidden='true'><rect class='k-{esc(kind)}' x='{x:.1f}' y='0' "
            f"width='{width:.1f}' height='10'></rect></svg></span>"
            f"<span class='num dur'>{esc(dur)}</span>"
            f"<span class='num'>{tokens if tokens else ''}</span>"
            f"<span class='num'>{esc(_show._cost(cost, complete) if cost is not None else '')}"
            "</span></summary>"
        )
        attributes_json, input_json, output_json = payloads
        body = ["<div class='wf-detail'><dl>"]
        if step_key:
            body.append(f"<dt>step</dt><dd><code>{esc(step_key)}</code></dd>")
        if usage is not None:
            body.append(f"<dt>usage</dt><dd><code>{esc(_usage_text(usage))}</code></dd>")
        if attributes_json:
            body.append(f"<dt>attributes</dt><dd><pre>{pretty(attributes_json)}</pre></dd>")
        if input_json is not None:
            body.append(f"<dt>input</dt><dd><pre class='input'>{pretty(input_json)}</pre></dd>")
        if output_json is not None:
            body.append(f"<dt>output</dt><dd><pre class='output'>{pretty(output_json)}</pre></dd>")
        if error[0] or error[1]:
            body.append(
                f"<dt>error</dt><dd><pre class='error'>{esc(error[0])}: {esc(error[1])}</pre></dd>"
            )
        body.append("</dl>")
        if fork_action is not None and step_key in fork_keys:
            body.append(
                f"<form method='post' action='{esc(fork_action)}' class='fork'>"
                f"<input type='hidden' name='csrf' value='{esc(csrf)}'>"
                f"<input type='hidden' name='at' value='{esc(step_key)}'>"
                "<button class='fork'>Fork at this step</button> <small>a new run replays the "
                "steps before this one from the journal and executes this one onwards</small>"
                "</form>"
            )
        body.append("</div></details>")
        out.append("".join(body))
    out.append("</div>")
    return "".join(out)
