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
"""

# Live updates: a run page polls its run's state and reloads (as a GET of the
# run's own address) once the run moved on.
SCRIPT = """\
(function () {
  "use strict";
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
