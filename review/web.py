"""The console over HTTP: the page (`static/`), the JSON API it uses, and the probes.

    GET  /                                   the queue (the login page without a session)
    GET  /login, POST /login, POST /logout   a session cookie (HttpOnly, SameSite=Strict)
    GET  /api/cases?status=open|closed       the queue by expected loss, or the closed cases
    GET  /api/cases/{transaction_id}         one case, its card's timeline and its audit lines
    POST /api/cases/{transaction_id}/verdict {"fraud": true|false, "note": "..."}
    GET  /metrics, /healthz, /readyz         as every other process (no credentials)

Every /api request needs a session (and, to change anything, its CSRF token) or HTTP Basic
credentials; without them it gets 401. What is shown is attacker-controlled text (merchant
names, reasons, notes): the page sets it with `textContent` only, and the Content-Security-Policy
allows no inline script, so a script tag in a merchant name stays text.
"""

from __future__ import annotations

import base64
import binascii
import html
import json
import logging
import urllib.parse
from collections.abc import Callable
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler
from importlib import resources
from typing import Any

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from contracts.transaction import MAX_ID_CHARS
from plumbing.health import BackgroundHTTPServer
from review.auth import Authenticator, Throttled, client_key, same_token
from review.cases import CaseStore, User
from review.metrics import ReviewMetrics
from review.verdicts import CaseNotFound, LabelNotDelivered, ReversalRefused, VerdictDesk

log = logging.getLogger(__name__)

COOKIE = "fraud_review_session"
#: The longest request body taken (a verdict with its note, a login form).
MAX_BODY_BYTES = 16_384
MAX_NOTE_CHARS = 2_000
#: Connections served at once: a browser opens up to six, Prometheus and the probes three.
MAX_CONNECTIONS = 32
CONNECTION_TIMEOUT_S = 30.0
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
_STATIC = {
    "/static/console.js": ("console.js", "text/javascript; charset=utf-8"),
    "/static/console.css": ("console.css", "text/css; charset=utf-8"),
}


class _Verdict(msgspec.Struct, forbid_unknown_fields=True):
    fraud: bool
    note: str = ""


_decode_verdict = msgspec.json.Decoder(_Verdict).decode


class Console:
    """What the handler serves: the store, who is asking, the verdicts, and the probes."""

    def __init__(
        self,
        store: CaseStore,
        auth: Authenticator,
        desk: VerdictDesk,
        metrics: ReviewMetrics,
        alive: Callable[[], tuple[bool, str]],
        ready: Callable[[], tuple[bool, str]],
        secure_cookies: bool,
        forwarded_for: bool,
    ) -> None:
        self.store, self.auth, self.desk, self.metrics = store, auth, desk, metrics
        #: What /healthz and /readyz answer: (ok, why).
        self.alive, self.ready = alive, ready
        self.secure_cookies = secure_cookies
        #: Whether a proxy's X-Forwarded-For names the client (FRAUD_REVIEW_FORWARDED_FOR).
        self.forwarded_for = forwarded_for


def console_server(host: str, port: int, console: Console) -> BackgroundHTTPServer:
    """A server of `console` on host:port (started by its `start()`); OSError when the address
    cannot be bound."""
    return BackgroundHTTPServer(
        host, port, _handler_for(console), MAX_CONNECTIONS, name="review-http"
    )


def _asset(name: str) -> bytes:
    return resources.files("review").joinpath("static", name).read_bytes()


class _Refused(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.headers = status, headers or {}


def _handler_for(console: Console) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = CONNECTION_TIMEOUT_S
        server_version = "fraud-review"
        sys_version = ""

        def do_GET(self) -> None:
            self._serve(self._get)

        def do_POST(self) -> None:
            self._serve(self._post)

        def _serve(self, route: Callable[[str], None]) -> None:
            path = urllib.parse.urlsplit(self.path).path
            try:
                route(path)
            except _Refused as refused:
                self._json(refused.status, {"error": str(refused)}, refused.headers)
            except Exception:
                log.exception("request %s %s failed", self.command, path)
                self._json(500, {"error": "internal error; see the console's log"})

        # Routes

        def _get(self, path: str) -> None:
            if path == "/metrics":
                self._send(200, generate_latest(console.metrics.registry), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/readyz"):
                ok, why = console.ready() if path == "/readyz" else console.alive()
                self._send(200 if ok else 503, (why + "\n").encode(), "text/plain; charset=utf-8")
            elif path in _STATIC:
                name, kind = _STATIC[path]
                self._send(200, _asset(name), kind)
            elif path == "/login":
                self._page("login.html", {"error": ""})
            elif path == "/":
                session = self._session()
                if session is None:
                    self._redirect("/login")
                else:
                    user, csrf = session
                    self._page("index.html", {"user": user.name, "role": user.role, "csrf": csrf})
            elif path == "/api/cases":
                self._user(changing=False)
                query = self._query()
                limit = _int(query.get("limit", "200"), "limit")
                status = query.get("status", "open")
                if status == "open":
                    cases = console.store.list_cases("open", limit)
                elif status == "closed":
                    cases = console.store.list_cases("closed", limit)
                else:
                    raise _Refused(400, "status must be open or closed")
                self._json(200, {"cases": cases})
            elif path.startswith("/api/cases/"):
                self._user(changing=False)
                transaction_id = _transaction_id(path.removeprefix("/api/cases/"))
                case = console.store.case(transaction_id)
                if case is None:
                    raise _Refused(404, f"no case for transaction {transaction_id!r}")
                case["audit"] = console.store.audit(transaction_id)
                self._json(200, case)
            else:
                raise _Refused(404, "not found")

        def _post(self, path: str) -> None:
            self._same_origin()
            if path == "/login":
                self._login()
            elif path == "/logout":
                form = self._form()
                session = self._session()
                if session is None or not same_token(form.get("csrf", ""), session[1]):
                    raise _Refused(403, "missing or wrong csrf field (reload the page)")
                console.auth.end_session(self._cookie())
                self._redirect("/login", clear_cookie=True)
            elif path.startswith("/api/cases/") and path.endswith("/verdict"):
                user = self._user(changing=True)
                # A JSON body only: a form another site posts (with credentials the browser
                # remembered) is text/plain or urlencoded, and JSON would need a CORS preflight
                # this console never answers.
                kind = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
                if kind != "application/json":
                    raise _Refused(415, "a verdict is sent as Content-Type: application/json")
                transaction_id = _transaction_id(
                    path.removeprefix("/api/cases/").removesuffix("/verdict")
                )
                try:
                    verdict = _decode_verdict(self._body())
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    raise _Refused(
                        400, f'a verdict is {{"fraud": true|false, "note": "..."}}: {exc}'
                    ) from None
                if len(verdict.note) > MAX_NOTE_CHARS:
                    raise _Refused(400, f"a note has at most {MAX_NOTE_CHARS} characters")
                try:
                    result = console.desk.record(transaction_id, verdict.fraud, verdict.note, user)
                except CaseNotFound as exc:
                    raise _Refused(404, str(exc)) from None
                except ReversalRefused as exc:
                    raise _Refused(403, str(exc)) from None
                except LabelNotDelivered as exc:
                    raise _Refused(503, str(exc)) from None
                self._json(200, {"result": result, "case": console.store.case(transaction_id)})
            else:
                raise _Refused(404, "not found")

        # Who is asking

        def _login(self) -> None:
            form = self._form()
            name, password = form.get("name", ""), form.get("password", "")
            try:
                user = console.auth.login(name, password, self._client())
            except Throttled as exc:
                console.metrics.failed_logins.labels("throttled").inc()
                self._page(
                    "login.html",
                    {"error": "Too many failed logins; try again later."},
                    429,
                    {"Retry-After": str(int(exc.retry_after_s) + 1)},
                )
                return
            if user is None:
                console.metrics.failed_logins.labels("wrong").inc()
                self._page("login.html", {"error": "Wrong name or password."}, 401)
                return
            token, _csrf = console.auth.start_session(user)
            self._redirect("/", cookie=token)

        def _user(self, changing: bool) -> User:
            """The user of a session (with its CSRF token when `changing`) or of Basic
            credentials; 401 without either, 403 without the CSRF token, 429 when throttled."""
            header = self.headers.get("Authorization", "")
            if header.startswith("Basic "):
                return self._basic_user(header.removeprefix("Basic "))
            session = self._session()
            if session is None:
                raise _Refused(401, "log in, or send HTTP Basic credentials", self._challenge())
            user, csrf = session
            if changing and not same_token(self.headers.get("X-CSRF-Token", ""), csrf):
                raise _Refused(403, "missing or wrong X-CSRF-Token (reload the page)")
            return user

        def _basic_user(self, encoded: str) -> User:
            try:
                name, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise _Refused(401, "malformed Basic credentials") from None
            try:
                user = console.auth.login(name, password, self._client())
            except Throttled as exc:
                console.metrics.failed_logins.labels("throttled").inc()
                retry = {"Retry-After": str(int(exc.retry_after_s) + 1)}
                raise _Refused(429, "too many failed logins", retry) from None
            if user is None:
                console.metrics.failed_logins.labels("wrong").inc()
                raise _Refused(401, "wrong name or password", self._challenge())
            return user

        def _client(self) -> str:
            """The failed-login key of the client: behind a proxy (FRAUD_REVIEW_FORWARDED_FOR),
            the address the proxy added last to X-Forwarded-For (earlier ones are the
            client's to forge); else the connection's."""
            address = self.client_address[0]
            if console.forwarded_for:
                forwarded = self.headers.get("X-Forwarded-For", "")
                address = forwarded.rsplit(",", 1)[-1].strip() or address
            return client_key(address)

        def _same_origin(self) -> None:
            """Refuse a POST a browser sends from another site (login and logout included):
            its Sec-Fetch-Site says so, or its Origin names another host."""
            if self.headers.get("Sec-Fetch-Site", "") == "cross-site":
                raise _Refused(403, "cross-site request refused")
            origin = self.headers.get("Origin")
            if origin and origin != "null":
                host = urllib.parse.urlsplit(origin).netloc
                if host != self.headers.get("Host", ""):
                    raise _Refused(403, f"request from another origin refused ({origin[:100]})")

        def _challenge(self) -> dict[str, str]:
            """The Basic challenge, for API clients only: a browser (which says so in
            Sec-Fetch-Mode) would answer it with its own password dialog over the page."""
            if self.headers.get("Sec-Fetch-Mode"):
                return {}
            return {"WWW-Authenticate": 'Basic realm="fraud-review", charset="UTF-8"'}

        def _session(self) -> tuple[User, str] | None:
            return console.auth.session(self._cookie())

        def _secure(self) -> bool:
            return console.secure_cookies or self.headers.get("X-Forwarded-Proto", "") == "https"

        def _cookie_name(self) -> str:
            # __Host-: a browser takes it only over HTTPS, for this host and path /, so no
            # subdomain can plant or overwrite it.
            return f"__Host-{COOKIE}" if self._secure() else COOKIE

        def _cookie(self) -> str:
            try:
                cookies = SimpleCookie(self.headers.get("Cookie", ""))
            except CookieError:
                return ""
            morsel = cookies.get(self._cookie_name())
            return "" if morsel is None else morsel.value

        # Reading

        def _query(self) -> dict[str, str]:
            query = urllib.parse.urlsplit(self.path).query
            try:
                return dict(urllib.parse.parse_qsl(query, max_num_fields=10))
            except ValueError:
                raise _Refused(400, "at most 10 query parameters") from None

        def _body(self) -> bytes:
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                raise _Refused(411, "a request body needs its Content-Length") from None
            if not 0 <= length <= MAX_BODY_BYTES:
                raise _Refused(413, f"a request body has at most {MAX_BODY_BYTES} bytes")
            return self.rfile.read(length)

        def _form(self) -> dict[str, str]:
            try:
                text = self._body().decode()
                return dict(urllib.parse.parse_qsl(text, max_num_fields=10))
            except (UnicodeDecodeError, ValueError):
                raise _Refused(400, "malformed form") from None

        # Writing

        def _page(
            self,
            name: str,
            values: dict[str, str],
            status: int = 200,
            headers: dict[str, str] | None = None,
        ) -> None:
            text = _asset(name).decode()
            for key, value in values.items():
                text = text.replace("{{" + key + "}}", html.escape(value, quote=True))
            self._send(status, text.encode(), "text/html; charset=utf-8", headers)

        def _redirect(self, to: str, cookie: str | None = None, clear_cookie: bool = False) -> None:
            headers = {"Location": to}
            name = self._cookie_name()
            attributes = "; Path=/; HttpOnly; SameSite=Strict" + (
                "; Secure" if self._secure() else ""
            )
            if cookie is not None:
                headers["Set-Cookie"] = f"{name}={cookie}{attributes}"
            elif clear_cookie:
                headers["Set-Cookie"] = f"{name}={attributes}; Max-Age=0"
            self._send(303, b"", "text/plain", headers)

        def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body, allow_nan=False).encode()
            self._send(status, data, "application/json", headers)

        def _send(
            self, status: int, body: bytes, kind: str, headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for key, value in {**_SECURITY_HEADERS, **(headers or {})}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Requests are not logged one by one (the page polls); failures are."""

    return Handler


def _transaction_id(segment: str) -> str:
    """The transaction id of a path segment as sent: a literal `/` ends the segment (no such
    route), an encoded one (%2F) is part of the id."""
    if "/" in segment:
        raise _Refused(404, "not found")
    transaction_id = urllib.parse.unquote(segment)
    if not 1 <= len(transaction_id) <= MAX_ID_CHARS:
        raise _Refused(404, "no such case")
    return transaction_id


def _int(text: str, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise _Refused(400, f"{name} must be a whole number") from None
    if value < 1:
        raise _Refused(400, f"{name} must be at least 1")
    return value
