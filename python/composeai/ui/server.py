"""The `compose ui` HTTP server (standard library `ThreadingHTTPServer`).

Safe by default:
- it binds to a loopback address; any other `--host` is refused unless
  `--allow-remote` is given together with a `COMPOSE_UI_TOKEN`;
- with a token set, every request must carry it (`Authorization: Bearer`,
  or the cookie set after one visit with `?token=`); compared in constant
  time;
- on a loopback bind the `Host` header must name a loopback host, so a page
  on another site cannot reach the server through DNS rebinding;
- an answer or action is a POST carrying this server's random CSRF token,
  from a same-origin page (`Origin`, or `Referer` when there is no
  `Origin`; behind a reverse proxy, `COMPOSE_UI_ORIGIN` names the public
  origin its pages are served at);
- every page is sent with a Content-Security-Policy that allows no inline
  script, on top of every stored value being escaped.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import secrets
import sys
import traceback
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from ..errors import ComposeError
from . import assets, views

_LOOPBACK_NAMES = ("localhost",)
_COOKIE = "compose_ui_token"
_MAX_BODY = 1 << 20

_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def is_loopback(host: str) -> bool:
    name = host.strip("[]").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host_name(host_header: str) -> str:
    """The host part of a `Host` header (`name:port`, `[v6]:port`)."""
    if host_header.startswith("["):
        return host_header[1 : host_header.find("]")] if "]" in host_header else host_header
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


class UIServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        *,
        token: str | None,
        loopback: bool,
        public_origin: tuple[str, str] | None = None,
    ) -> None:
        self.token = token
        self.loopback = loopback
        # `(scheme, host[:port])` a reverse proxy serves the UI at, whose
        # pages may post (COMPOSE_UI_ORIGIN).
        self.public_origin = public_origin
        # Per server: a page from an earlier server cannot post to this one.
        self.csrf = secrets.token_urlsafe(32)
        if ":" in address[0]:
            self.address_family = __import__("socket").AF_INET6
        super().__init__(address, Handler)


class Handler(BaseHTTPRequestHandler):
    server: UIServer
    server_version = "compose-ui"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"compose ui: {self.address_string()} {format % args}\n")

    # -- responses -------------------------------------------------------------

    def _send(
        self,
        status: int,
        body: str | bytes,
        content_type: str = "text/html; charset=utf-8",
        headers: dict[str, str] | None = None,
    ) -> None:
        data = body.encode("utf-8") if isinstance(body, str) else body
        self.send_response(status)
        for name, value in {**_HEADERS, **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _text(self, status: int, text: str) -> None:
        self._send(status, text + "\n", "text/plain; charset=utf-8")

    def _error(self, status: int, title: str, message: str, *, authorized: bool = True) -> None:
        """A styled error page; one answered before the request was
        authorized carries no CSRF token."""
        csrf = self.server.csrf if authorized else ""
        self._send(status, views.error_page(status, title, message, csrf=csrf))

    def _redirect(self, location: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(HTTPStatus.SEE_OTHER)
        for name, value in {**_HEADERS, **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    # -- checks ----------------------------------------------------------------

    def _host_ok(self) -> bool:
        if not self.server.loopback:
            return True
        host = self.headers.get("Host")
        return host is not None and is_loopback(_host_name(host))

    def _presented_token(self, query: dict[str, list[str]]) -> tuple[str | None, bool]:
        """The token the request carries, and whether it came in the URL."""
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return auth[len("Bearer ") :].strip(), False
        for part in self.headers.get("Cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == _COOKIE:
                return unquote(value), False
        if "token" in query:
            return query["token"][0], True
        return None, False

    def _authorized(self, query: dict[str, list[str]]) -> bool | None:
        """True when the request may proceed; None when it was answered
        (refused, or redirected to drop a token from the URL)."""
        if not self._host_ok():
            self._error(403, "Forbidden", "unexpected Host header", authorized=False)
            return None
        token = self.server.token
        if token is None:
            return True
        given, in_url = self._presented_token(query)
        if given is None or not hmac.compare_digest(given.encode(), token.encode()):
            self._error(
                401,
                "Token required",
                "this compose ui requires its token (COMPOSE_UI_TOKEN): send "
                "'Authorization: Bearer <token>' or open the page once with ?token=<token>",
                authorized=False,
            )
            return None
        if in_url and self.command == "GET":
            # Moves the token from the address bar into a cookie.
            path = urlsplit(self.path).path
            rest = {k: v for k, v in query.items() if k != "token"}
            qs = "&".join(f"{quote(k)}={quote(v[0])}" for k, v in rest.items())
            cookie = f"{_COOKIE}={quote(token)}; HttpOnly; SameSite=Strict; Path=/"
            self._redirect(path + (f"?{qs}" if qs else ""), {"Set-Cookie": cookie})
            return None
        return True

    def _same_origin(self) -> bool:
        host = self.headers.get("Host", "")
        allowed = {("http", host)}
        if self.server.public_origin is not None:
            allowed.add(self.server.public_origin)
        origin = self.headers.get("Origin")
        if origin is not None:
            parts = urlsplit(origin)
            return (parts.scheme, parts.netloc) in allowed
        referer = self.headers.get("Referer")
        if referer is not None:
            parts = urlsplit(referer)
            return (parts.scheme, parts.netloc) in allowed
        # A browser sends one of them with a form post; other clients must
        # still carry the CSRF token.
        return True

    # -- routing ---------------------------------------------------------------

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        if not self._authorized(query):
            return
        params = {k: v[0] for k, v in query.items()}
        path = parts.path
        csrf = self.server.csrf
        try:
            self._get(path, params, csrf)
        except ComposeError as exc:
            self._send(400, views.error_page(400, "Error", str(exc), csrf=csrf))
        except Exception:  # noqa: BLE001 -- one broken page must not stop the server
            traceback.print_exc()
            self._error(500, "Internal error", "the page failed: see the server's log")

    def _get(self, path: str, params: dict[str, str], csrf: str) -> None:
        page = GET_PAGES.get(path)
        if page is not None:
            self._send(200, page(params, csrf))
        elif path.startswith("/run/"):
            run_id = unquote(path[len("/run/") :])
            status, body = views.run_page(run_id, csrf, message=_flash(params))
            self._send(status, body)
        elif path.startswith("/api/run/") and path.endswith("/state"):
            run_id = unquote(path[len("/api/run/") : -len("/state")])
            state = views.run_state(run_id)
            if state is None:
                self._send(404, json.dumps({"error": "not found"}), "application/json")
            else:
                self._send(200, json.dumps(state), "application/json")
        elif path.startswith("/thread/"):
            status, body = views.thread_page(unquote(path[len("/thread/") :]), csrf)
            self._send(status, body)
        elif path == "/static/style.css":
            self._send(200, assets.STYLE, "text/css; charset=utf-8")
        elif path == "/static/app.js":
            self._send(200, assets.SCRIPT, "text/javascript; charset=utf-8")
        else:
            self._error(404, "Not found", f"there is no page at {path}")

    def do_POST(self) -> None:
        parts = urlsplit(self.path)
        if not self._authorized(parse_qs(parts.query)):
            return
        path = parts.path
        run_id, _, action = path[len("/run/") :].rpartition("/")
        handler = POST_ACTIONS.get(action) if path.startswith("/run/") and run_id else None
        if handler is None:
            self._error(404, "Not found", f"there is no action at {path}")
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > _MAX_BODY:
            self._text(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "413: request too large")
            return
        ctype = self.headers.get("Content-Type", "").split(";")[0].strip()
        if ctype != "application/x-www-form-urlencoded":
            self._text(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "415: expected a form post")
            return
        form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode("utf-8")).items()}
        given = self.headers.get("X-CSRF-Token") or form.get("csrf", "")
        if not self._same_origin() or not hmac.compare_digest(
            given.encode(), self.server.csrf.encode()
        ):
            self._error(403, "Forbidden", "missing or wrong CSRF token, or a cross-origin post")
            return
        try:
            handler(self, unquote(run_id), form)
        except Exception:  # noqa: BLE001 -- one failed action must not stop the server
            traceback.print_exc()
            self._error(500, "Internal error", "the action failed: see the server's log")

    def _refused(self, run_id: str, exc: BaseException, status: int = 400) -> None:
        """The run page again with the refusal shown, else an error page."""
        csrf = self.server.csrf
        try:
            _, page = views.run_page(run_id, csrf, error=str(exc))
        except ComposeError:
            page = views.error_page(status, "Error", str(exc), csrf=csrf)
        self._send(status, page)

    def _answer(self, run_id: str, form: dict[str, str]) -> None:
        """The form's answer through the same code as `compose answer`."""
        from .. import _answer

        interrupt_id = form.get("interrupt_id", "")
        action = form.get("action", "")
        try:
            if action == "approve":
                value: Any = True
            elif action == "deny":
                value = False
            elif action == "json":
                try:
                    value = json.loads(form.get("value", ""))
                except ValueError as exc:
                    raise ComposeError(f"the answer is not valid JSON: {exc}") from None
            else:
                raise ComposeError(f"unknown answer action {action!r}")
            done = _answer.answer(run_id, interrupt_id, value, at=form.get("at") or None)
        except ComposeError as exc:
            refused = (_answer.AlreadyAnswered, _answer.Superseded)
            self._refused(run_id, exc, 409 if isinstance(exc, refused) else 400)
            return
        answered = quote(done.interrupt_id, safe="")
        if form.get("next") == "inbox":
            self._redirect(f"/inbox?answered={answered}&run={quote(done.run_id, safe='')}")
            return
        self._redirect(views.run_href(done.run_id) + "?answered=" + answered)

    def _cancel(self, run_id: str, form: dict[str, str]) -> None:
        """Cancels the run as `compose cancel` does: a parked or orphaned run
        now, a running one at its next step boundary."""
        from .. import _core, _engine

        try:
            outcome = _core.request_cancel(_engine.get_store(), run_id, "cancelled from compose ui")
        except ComposeError as exc:
            self._refused(run_id, exc)
            return
        self._redirect(views.run_href(run_id) + "?cancel=" + quote(outcome, safe=""))

    def _fork(self, run_id: str, form: dict[str, str]) -> None:
        """`compose fork RUN --at KEY`, executed in this process: the new run
        replays the steps before `at` and executes from there (it needs the
        flow's module: `compose ui --import MODULE`)."""
        from .. import _replay

        at = form.get("at", "")
        try:
            run = _replay.fork(run_id, at=at)
        except ComposeError as exc:
            self._refused(run_id, exc)
            return
        self._redirect(views.run_href(run.id) + "?forked=" + quote(run_id, safe=""))

    def _replay(self, run_id: str, form: dict[str, str]) -> None:
        """`compose replay RUN`: the body re-run against the journal, nothing
        executed or written; the outcome is shown on the run page."""
        from .. import _replay
        from ..errors import NondeterminismError

        csrf = self.server.csrf
        try:
            report = _replay.replay(run_id)
        except NondeterminismError as exc:
            text = f"replay check: diverged at '{exc.key}': recorded {exc.recorded}; called {exc.called}"
            _, page = views.run_page(run_id, csrf, error=text)
            self._send(200, page)
            return
        except ComposeError as exc:
            self._refused(run_id, exc)
            return
        if report.stopped_at is not None:
            end = f", stopped at '{report.stopped_at}'"
        elif report.error is not None:
            end = f", the body raised {report.error}"
        else:
            end = ""
        text = f"replay check: ok -- {report.steps} steps replayed{end}, no divergence"
        _, page = views.run_page(run_id, csrf, message=text)
        self._send(200, page)


# GET pages taking `(params, csrf)`, by exact path; the run, thread and API
# routes take a path argument and are matched in `Handler._get`.
GET_PAGES: dict[str, Callable[[dict[str, str], str], str]] = {
    "/": views.runs_page,
    "/inbox": lambda params, csrf: views.inbox_page(csrf, message=_flash(params)),
    "/workers": lambda params, csrf: views.workers_page(csrf),
    "/costs": views.costs_page,
    "/threads": lambda params, csrf: views.threads_page(csrf),
    "/queues": lambda params, csrf: views.queues_page(csrf),
}

# POST actions on a run (`/run/<id>/<action>`), each behind the CSRF and
# same-origin checks of `Handler.do_POST`.
POST_ACTIONS: dict[str, Callable[[Handler, str, dict[str, str]], None]] = {
    "answer": Handler._answer,
    "cancel": Handler._cancel,
    "fork": Handler._fork,
    "replay": Handler._replay,
}

_CANCELLED = {
    "cancelled": "run cancelled",
    "requested": "cancel requested -- the process executing the run stops at its next step",
    "already": "the run had already finished; nothing to cancel",
}


def _flash(params: dict[str, str]) -> str:
    """The message a redirect after an action carries (fixed texts around
    the ids it names; the page escapes it)."""
    if params.get("answered"):
        where = f" of run {params['run']}" if params.get("run") else ""
        return (
            f"answer to '{params['answered']}'{where} stored -- a compose worker continues the run"
        )
    if params.get("cancel"):
        return _CANCELLED.get(params["cancel"], "")
    if params.get("forked"):
        return f"forked from run {params['forked']}"
    return ""


def make_server(host: str, port: int, *, allow_remote: bool = False) -> UIServer:
    """The server, bound and ready (`serve_forever` runs it). Refuses a
    non-loopback host without `allow_remote` and a token."""
    token = os.environ.get("COMPOSE_UI_TOKEN") or None
    loopback = is_loopback(host)
    if not loopback:
        if not allow_remote:
            raise ComposeError(
                f"refusing to serve on non-loopback host '{host}': pass --allow-remote and set "
                "COMPOSE_UI_TOKEN (every request must then carry the token)"
            )
        if token is None or len(token) < 16:
            raise ComposeError(
                "--allow-remote needs COMPOSE_UI_TOKEN set to a secret of at least 16 characters"
            )
    return UIServer((host, port), token=token, loopback=loopback, public_origin=_public_origin())


def _public_origin() -> tuple[str, str] | None:
    """`COMPOSE_UI_ORIGIN` (e.g. `https://compose.example.com`): the origin a
    reverse proxy serves the UI at, so that its pages' forms are same-origin."""
    value = os.environ.get("COMPOSE_UI_ORIGIN") or None
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
        raise ComposeError(
            f"COMPOSE_UI_ORIGIN must be a scheme and host like 'https://compose.example.com', "
            f"got {value!r}"
        )
    return parts.scheme, parts.netloc


def serve(host: str, port: int, *, allow_remote: bool = False) -> int:
    """`compose ui`: serves until interrupted."""
    server = make_server(host, port, allow_remote=allow_remote)
    shown = f"[{host}]" if ":" in host else host
    print(f"compose ui: serving http://{shown}:{server.server_address[1]}/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
