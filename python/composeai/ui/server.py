"""The `compose ui` HTTP server (standard library `ThreadingHTTPServer`).

Safe by default:
- it binds to a loopback address; any other `--host` is refused unless
  `--allow-remote` is given together with a `COMPOSE_UI_TOKEN`;
- with a token set, every request must carry it (`Authorization: Bearer`,
  or the cookie set after one visit with `?token=`); compared in constant
  time;
- on a loopback bind the `Host` header must name a loopback host, so a page
  on another site cannot reach the server through DNS rebinding;
- an answer is a POST carrying this server's random CSRF token, from a
  same-origin page (`Origin`, or `Referer` when there is no `Origin`);
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

    def __init__(self, address: tuple[str, int], *, token: str | None, loopback: bool) -> None:
        self.token = token
        self.loopback = loopback
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
            self._text(HTTPStatus.FORBIDDEN, "403: unexpected Host header")
            return None
        token = self.server.token
        if token is None:
            return True
        given, in_url = self._presented_token(query)
        if given is None or not hmac.compare_digest(given.encode(), token.encode()):
            self._text(
                HTTPStatus.UNAUTHORIZED,
                "401: this compose ui requires its token (COMPOSE_UI_TOKEN): send "
                "'Authorization: Bearer <token>' or open the page once with ?token=<token>",
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
        origin = self.headers.get("Origin")
        if origin is not None:
            parts = urlsplit(origin)
            return parts.scheme == "http" and parts.netloc == host
        referer = self.headers.get("Referer")
        if referer is not None:
            parts = urlsplit(referer)
            return parts.scheme == "http" and parts.netloc == host
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
            if path == "/":
                self._send(200, views.runs_page(params, csrf))
            elif path.startswith("/run/"):
                run_id = unquote(path[len("/run/") :])
                answered = params.get("answered")
                message = (
                    f"answer to '{answered}' stored -- a compose worker continues the run"
                    if answered
                    else ""
                )
                status, page = views.run_page(run_id, csrf, message=message)
                self._send(status, page)
            elif path.startswith("/api/run/") and path.endswith("/state"):
                run_id = unquote(path[len("/api/run/") : -len("/state")])
                state = views.run_state(run_id)
                if state is None:
                    self._send(404, json.dumps({"error": "not found"}), "application/json")
                else:
                    self._send(200, json.dumps(state), "application/json")
            elif path == "/costs":
                self._send(200, views.costs_page(params, csrf))
            elif path == "/threads":
                self._send(200, views.threads_page(csrf))
            elif path.startswith("/thread/"):
                status, page = views.thread_page(unquote(path[len("/thread/") :]), csrf)
                self._send(status, page)
            elif path == "/queues":
                self._send(200, views.queues_page(csrf))
            elif path == "/schedules":
                from .schedules import schedules_page

                self._send(200, schedules_page(csrf))
            elif path == "/static/style.css":
                self._send(200, assets.STYLE, "text/css; charset=utf-8")
            elif path == "/static/app.js":
                self._send(200, assets.SCRIPT, "text/javascript; charset=utf-8")
            else:
                self._text(HTTPStatus.NOT_FOUND, "404: not found")
        except ComposeError as exc:
            self._send(400, views.layout("Error", _error_body(exc), csrf=csrf))
        except Exception:  # noqa: BLE001 -- one broken page must not stop the server
            traceback.print_exc()
            self._text(HTTPStatus.INTERNAL_SERVER_ERROR, "500: internal error (see the server log)")

    def do_POST(self) -> None:
        parts = urlsplit(self.path)
        if not self._authorized(parse_qs(parts.query)):
            return
        path = parts.path
        if not (path.startswith("/run/") and path.endswith("/answer")):
            self._text(HTTPStatus.NOT_FOUND, "404: not found")
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
            self._text(HTTPStatus.FORBIDDEN, "403: missing or wrong CSRF token, or cross-origin")
            return
        run_id = unquote(path[len("/run/") : -len("/answer")])
        self._answer(run_id, form)

    def _answer(self, run_id: str, form: dict[str, str]) -> None:
        """The form's answer through the same code as `compose answer`."""
        from .. import _answer

        csrf = self.server.csrf
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
            status = 409 if isinstance(exc, refused) else 400
            try:
                _, page = views.run_page(run_id, csrf, error=str(exc))
            except ComposeError:
                page = views.layout("Error", _error_body(exc), csrf=csrf)
            self._send(status, page)
            return
        target = views.run_href(done.run_id) + "?answered=" + quote(done.interrupt_id, safe="")
        self._redirect(target)


def _error_body(exc: BaseException) -> str:
    return f"<h1>Error</h1><p class='flash err' role='alert'>{views.esc(exc)}</p>"


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
    return UIServer((host, port), token=token, loopback=loopback)


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
