"""A small web service over composeai runs (Starlette + uvicorn).

It starts the `article` flow on a worker (`compose worker --queue articles
--import articles`), lists the runs, shows each run's progress event,
streams the agent's tokens to the browser with server-sent events read
from the run's durable stream, and answers the run's approval. The web
process never executes the agent: it reads what the worker publishes.

    pip install 'composeai[examples]'
    cd examples/webapp
    compose worker --queue articles --import articles &
    uvicorn app:app --port 8000

Starting is idempotent: the browser sends a request id, which becomes
the run's id (`run_id=`), so a retried request returns the run the first
one started, whether it is still queued, running, paused or finished.
"""

from __future__ import annotations

import html
import json
from collections.abc import AsyncIterator

from articles import ARTICLES, article
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import composeai as compose
from composeai.errors import ConfigError


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def start(request: Request) -> Response:
    """POST /runs {"topic", "request_id"}: queues an article run."""
    body = await request.json()
    topic, request_id = body.get("topic"), body.get("request_id")
    if not isinstance(topic, str) or not topic.strip():
        return _error(400, "topic must be a non-empty string")
    if not isinstance(request_id, str) or not request_id:
        return _error(400, "request_id must be a non-empty string")
    run_id = f"article:{request_id}"
    # Only for the response's `created` flag: the start itself is idempotent.
    existed = await run_in_threadpool(_exists, run_id)
    try:
        handle = await run_in_threadpool(
            lambda: article.start(topic.strip(), queue=ARTICLES, run_id=run_id)
        )
    except ConfigError as exc:
        # A request id outside the allowed alphabet, or reused for another topic.
        return _error(409 if existed else 400, str(exc))
    if existed:
        return JSONResponse({"run_id": handle.id, "created": False})
    return JSONResponse({"run_id": handle.id, "created": True}, status_code=201)


async def runs(request: Request) -> Response:
    """GET /runs[?before=<id>]: the newest article runs."""
    before = request.query_params.get("before")
    page = await run_in_threadpool(
        lambda: compose.list_runs(name="article", limit=20, before=before)
    )
    return JSONResponse(
        [
            {
                "id": r.id,
                "status": r.status,
                "created_at": r.created_at.isoformat(),
                "pending": r.pending,
                "error": r.error_message,
            }
            for r in page
        ]
    )


def _exists(run_id: str) -> bool:
    try:
        compose.get_events(run_id)
    except ConfigError:
        return False
    return True


async def progress(request: Request) -> Response:
    """GET /runs/{id}/progress[?wait=<seconds>]: the run's status and its
    latest progress event, waiting up to `wait` seconds for the first."""
    run_id = request.path_params["run_id"]
    if not await run_in_threadpool(_exists, run_id):
        return _error(404, f"no run {run_id}")
    wait = min(float(request.query_params.get("wait", "0")), 30.0)
    value = await run_in_threadpool(lambda: compose.get_event(run_id, "progress", timeout=wait))
    status = await run_in_threadpool(lambda: compose.get_run(run_id).status)
    return JSONResponse({"status": status, "progress": value})


async def tokens(request: Request) -> Response:
    """GET /runs/{id}/tokens: the agent's tokens as server-sent events, one
    `token` event per value, then `end`. A reconnecting browser sends
    `Last-Event-ID` and gets only what it has not seen."""
    run_id = request.path_params["run_id"]
    if not await run_in_threadpool(_exists, run_id):
        return _error(404, f"no run {run_id}")
    seen = int(request.headers.get("last-event-id", "0") or 0)

    async def events() -> AsyncIterator[str]:
        n = 0
        async for token in compose.aread_stream(run_id, "tokens"):
            n += 1
            if n > seen:
                yield f"event: token\nid: {n}\ndata: {json.dumps(token)}\n\n"
        yield "event: end\ndata: {}\n\n"

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


async def approval(request: Request) -> Response:
    """POST /runs/{id}/approval {"approved": bool}: answers the run's
    `publish` approval; the run then finishes here."""
    run_id = request.path_params["run_id"]
    body = await request.json()
    approved = body.get("approved")
    if not isinstance(approved, bool):
        return _error(400, "approved must be true or false")
    status = await run_in_threadpool(lambda: compose.get_run(run_id).status)
    if status != "paused":
        return _error(409, f"run {run_id} is {status}, not waiting for approval")
    done = await run_in_threadpool(lambda: compose.resume(run_id, {"publish": approved}))
    return JSONResponse({"status": done.status, "output": done.output})


async def home(request: Request) -> Response:
    return HTMLResponse(_PAGE.replace("__TITLE__", html.escape("Articles")))


_PAGE = """<!doctype html>
<meta charset="utf-8"><title>__TITLE__</title>
<h1>__TITLE__</h1>
<form id="start"><input name="topic" placeholder="topic" required> <button>Write</button></form>
<pre id="draft"></pre><p id="stage"></p>
<p id="decide" hidden><button data-ok="1">Publish</button> <button data-ok="">Reject</button></p>
<h2>Runs</h2><ul id="runs"></ul>
<script>
let current = null;
async function listRuns() {
  const runs = await (await fetch("/runs")).json();
  document.getElementById("runs").innerHTML = runs.map(r =>
    `<li>${r.id} ${r.status} ${r.pending.join(",")}</li>`).join("");
}
async function follow(id) {
  current = id;
  document.getElementById("draft").textContent = "";
  const source = new EventSource(`/runs/${id}/tokens`);
  source.addEventListener("token", e => {
    document.getElementById("draft").textContent += JSON.parse(e.data);
  });
  source.addEventListener("end", () => source.close());
  while (current === id) {
    const p = await (await fetch(`/runs/${id}/progress?wait=5`)).json();
    const stage = p.progress ? p.progress.stage : "";
    document.getElementById("stage").textContent = `${p.status}: ${stage}`;
    document.getElementById("decide").hidden = p.status !== "paused";
    listRuns();
    if (["completed", "failed", "cancelled"].includes(p.status)) break;
    await new Promise(done => setTimeout(done, 1000));
  }
}
document.getElementById("start").onsubmit = async e => {
  e.preventDefault();
  const topic = new FormData(e.target).get("topic");
  const r = await fetch("/runs", {method: "POST", body: JSON.stringify(
    {topic, request_id: crypto.randomUUID()})});
  follow((await r.json()).run_id);
};
document.querySelectorAll("#decide button").forEach(b => b.onclick = () =>
  fetch(`/runs/${current}/approval`, {method: "POST",
    body: JSON.stringify({approved: !!b.dataset.ok})}));
listRuns();
</script>
"""

app = Starlette(
    routes=[
        Route("/", home),
        Route("/runs", start, methods=["POST"]),
        Route("/runs", runs),
        Route("/runs/{run_id}/progress", progress),
        Route("/runs/{run_id}/tokens", tokens),
        Route("/runs/{run_id}/approval", approval, methods=["POST"]),
    ]
)
