"""The UI's stylesheet and its one script, served from `/static/` (the
Content-Security-Policy allows scripts and styles from the server only)."""

STYLE = """\
:root { --fg: #1d2330; --muted: #66707f; --line: #dde2ea; --bg: #f7f8fb; --accent: #3559c7; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
       color: var(--fg); background: var(--bg); }
nav { display: flex; gap: 1.2em; align-items: center; padding: .7em 1.5em;
      background: #1d2330; }
nav a { color: #cfd6e4; text-decoration: none; }
nav a.brand { color: #fff; font-weight: 600; margin-right: 1em; }
main { padding: 1em 1.5em 3em; max-width: 1200px; }
h1 { font-size: 1.4em; margin: .4em 0 .6em; }
h2 { font-size: 1.1em; margin: 1.4em 0 .5em; }
a { color: var(--accent); }
table { border-collapse: collapse; background: #fff; border: 1px solid var(--line); }
th, td { padding: .35em .7em; border-bottom: 1px solid var(--line); text-align: left;
         white-space: nowrap; }
th { font-weight: 600; color: var(--muted); background: #fbfcfd; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
table.runs td:first-child { font-family: ui-monospace, monospace; font-size: 12.5px; }
table.meta th { width: 8em; }
.filters { display: flex; flex-wrap: wrap; gap: .8em; align-items: end; margin-bottom: 1em; }
.filters label { display: flex; flex-direction: column; font-size: 12px; color: var(--muted); }
input, select, textarea, button { font: inherit; }
button { padding: .3em .9em; border: 1px solid var(--line); border-radius: 4px;
         background: #fff; cursor: pointer; }
button.approve { background: #1f8a4c; color: #fff; border-color: #1f8a4c; }
button.deny { background: #c0392b; color: #fff; border-color: #c0392b; }
.status { padding: .05em .5em; border-radius: 9px; font-size: 12.5px; background: #e8ebf0; }
.status.completed { background: #dff3e6; color: #1f6b3e; }
.status.failed { background: #fbe3e0; color: #9b2a1f; }
.status.paused { background: #fff1d6; color: #8a5a00; }
.status.running { background: #e1e9fb; color: #2a4aa8; }
.status.cancelled, .status.queued { background: #eceef2; color: #555; }
pre { background: #fff; border: 1px solid var(--line); padding: .6em .8em; overflow-x: auto;
      font: 12.5px/1.4 ui-monospace, "DejaVu Sans Mono", monospace; margin: .3em 0; }
.pending .interrupt { background: #fffaf0; border: 1px solid #f0d9a8; border-radius: 6px;
                      padding: .6em 1em; margin-bottom: .8em; max-width: 760px; }
.pending form { display: inline-flex; gap: .5em; align-items: end; margin: .3em 1em .3em 0; }
.flash { padding: .5em .8em; border-radius: 4px; max-width: 760px; }
.flash.ok { background: #dff3e6; }
.flash.err { background: #fbe3e0; color: #7d1f14; font-weight: 600; }
details.span { background: #fff; border-left: 3px solid var(--line); margin: .25em 0;
               padding: .2em .6em; }
details.span summary { cursor: pointer; }
details.span .children { margin-left: 1.2em; }
details.span dl { margin: .3em 0; }
details.span dt { color: var(--muted); font-size: 12px; }
details.span dd { margin: 0 0 .3em; }
.kind, .dur { color: var(--muted); font-size: 12px; }
.mark { font-size: 11.5px; padding: 0 .4em; border-radius: 8px; }
.mark.replayed { background: #e8ebf0; }
.mark.paused { background: #fff1d6; }
.mark.error { background: #fbe3e0; }
.pager a { margin-right: 1.5em; }
.tabs a { margin-right: 1em; }
.tabs a.on { font-weight: 700; text-decoration: none; color: var(--fg); }
svg.chart { background: #fff; border: 1px solid var(--line); display: block; margin: .6em 0; }
svg.chart .bar { fill: var(--accent); }
svg.chart text { font: 12px system-ui, sans-serif; fill: var(--fg); }
.empty, .note { color: var(--muted); }
nav a:hover { color: #fff; }
.actions { display: flex; gap: .6em; margin: .8em 0; }
.actions form { margin: 0; }
button.danger { background: #fff; color: #b03222; border-color: #e3b1aa; }
button.danger:hover { background: #fbe3e0; }
button.fork { background: var(--accent); color: #fff; border-color: var(--accent); }
.count { font-size: 13px; font-weight: 400; color: var(--muted); margin-left: .4em; }
.inbox-item { background: #fff; border: 1px solid var(--line); border-radius: 6px;
              padding: .6em 1em; margin: 0 0 .8em; max-width: 900px; }
.inbox-item header { display: flex; gap: .7em; align-items: baseline; margin-bottom: .4em; }
.inbox-item .age { margin-left: auto; color: var(--muted); font-size: 12.5px; }
.inbox-item .pending .interrupt { margin: .3em 0; }
.error-page { max-width: 640px; margin-top: 2em; }
.error-page .code { font-size: 56px; font-weight: 700; color: #c9cfda; margin: 0; }
.error-page h1 { margin-top: 0; }
tr.worker.stale td { color: var(--muted); }
.waterfall { background: #fff; border: 1px solid var(--line); border-radius: 4px;
             font-size: 13px; max-width: 1200px; }
.wf-head, .wf-span > summary { display: grid; align-items: center; gap: .6em;
  grid-template-columns: minmax(240px, 32%) 1fr 70px 70px 80px; padding: .15em .6em; }
.wf-head { color: var(--muted); font-size: 12px; font-weight: 600;
           border-bottom: 1px solid var(--line); background: #fbfcfd; }
.wf-span > summary { cursor: pointer; list-style: none; border-bottom: 1px solid #eef1f5; }
.wf-span > summary::-webkit-details-marker { display: none; }
.wf-span > summary:hover { background: #f3f6fc; }
.wf-span[open] > summary { background: #eef2fb; }
.wf-span.hidden-by-parent { display: none; }
.wf-name { white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.wf-name .pad { display: inline-block; width: 14px; }
.twisty, .twisty-gap { display: inline-block; width: 16px; padding: 0; border: 0;
                       background: none; color: var(--muted); font-size: 11px; cursor: pointer; }
.wf-bar svg { width: 100%; height: 10px; display: block; background: #f4f6fa; }
.wf-bar rect { fill: #8fa6e3; }
.wf-bar rect.k-flow { fill: #3559c7; }
.wf-bar rect.k-llm { fill: #9b59b6; }
.wf-bar rect.k-agent { fill: #2e86ab; }
.wf-bar rect.k-tool { fill: #e08e0b; }
.wf-bar rect.k-pause { fill: #f0b429; }
.wf-span.status-error .wf-bar rect { fill: #c0392b; }
.wf-detail { padding: .3em 1em .6em 2.2em; background: #fafbfd; border-bottom: 1px solid var(--line); }
.wf-detail dl { margin: .2em 0; }
.wf-detail dt { color: var(--muted); font-size: 12px; }
.wf-detail dd { margin: 0 0 .3em; }
.wf-detail form.fork { margin: .4em 0 .2em; }
.num.dur { color: var(--muted); }
details.text-trace { margin: .8em 0; }
details.text-trace summary { cursor: pointer; color: var(--muted); }
"""

# Collapsible span subtrees (a span's descendants follow it in the timeline,
# deeper than it); a confirmation before a form marked data-confirm posts;
# live updates: a run page polls its run's state and reloads (as a GET of the
# run's own address) once the run moved on.
SCRIPT = """\
(function () {
  "use strict";
  function depth(el) { return parseInt(el.dataset.depth || "0", 10); }
  function setSubtree(row, open) {
    var d = depth(row), el = row.nextElementSibling, skipBelow = null;
    while (el && el.classList.contains("wf-span") && depth(el) > d) {
      var ed = depth(el);
      if (skipBelow !== null && ed > skipBelow) { el = el.nextElementSibling; continue; }
      skipBelow = null;
      el.classList.toggle("hidden-by-parent", !open);
      var t = el.querySelector(":scope > summary .twisty");
      if (open && t && t.getAttribute("aria-expanded") === "false") { skipBelow = ed; }
      el = el.nextElementSibling;
    }
  }
  document.querySelectorAll(".wf-span > summary .twisty").forEach(function (btn) {
    btn.addEventListener("click", function (ev) {
      ev.preventDefault();
      ev.stopPropagation();
      var open = btn.getAttribute("aria-expanded") !== "true";
      btn.setAttribute("aria-expanded", open ? "true" : "false");
      btn.textContent = open ? "\u25be" : "\u25b8";
      setSubtree(btn.closest(".wf-span"), open);
    });
  });
  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (ev) {
      if (!window.confirm(form.dataset.confirm)) { ev.preventDefault(); }
    });
  });
  var body = document.body;
  var runId = body.dataset.runId;
  if (!runId) { return; }
  var url = body.dataset.runUrl;
  var state = body.dataset.state;
  function poll() {
    fetch("/api/run/" + encodeURIComponent(runId) + "/state", {credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (s) {
        if (s && s.state !== state) { window.location.replace(url); return; }
        window.setTimeout(poll, 1000);
      })
      .catch(function () { window.setTimeout(poll, 3000); });
  }
  window.setTimeout(poll, 1000);
})();
"""
