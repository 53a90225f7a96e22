"""Who is asking: passwords (argon2id, argon2-cffi), session cookies with their CSRF token,
HTTP Basic for the JSON API, and a limit on failed logins.

- A session token is 32 random bytes; the database keeps only its SHA-256, so a copy of the
  database opens no session. Each session has its own CSRF token, which every state-changing
  request made with the cookie must repeat in `X-CSRF-Token` (or the form's `csrf` field).
- A request with `Authorization: Basic` carries its own credentials, so it needs no CSRF token
  (a browser never adds them to a cross-site request by itself).
- After `MAX_FAILURES` failed attempts within `FAILURE_WINDOW_S`, a name, and a client address
  (an IPv6 client's /64), is refused for the rest of the window (HTTP 429), before any password
  is checked: guessing is slow, and argon2's cost cannot be turned against the console (at most
  `MAX_CONCURRENT_CHECKS` hashes are checked at once).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from contracts.transaction import MAX_ID_CHARS
from review.cases import CaseStore, Role, User

SESSION_S = 12 * 3_600
MAX_FAILURES = 5
FAILURE_WINDOW_S = 300.0
#: Names and addresses whose failures are remembered at most (the oldest are forgotten).
MAX_TRACKED = 10_000
#: A password shorter than this is refused by `add-user`.
MIN_PASSWORD_CHARS = 12
MAX_PASSWORD_CHARS = 1_024
#: A user name is a label's `reviewer`, which the label contract bounds.
MAX_NAME_CHARS = MAX_ID_CHARS
MAX_CONCURRENT_CHECKS = 4

_hasher = PasswordHasher()
#: Checked when the name is unknown, so an unknown name costs as long as a wrong password.
_DUMMY_HASH = _hasher.hash(secrets.token_urlsafe(16))


def hash_password(password: str) -> str:
    """The argon2id hash stored for `password`; ValueError when it is too short or too long."""
    if not MIN_PASSWORD_CHARS <= len(password) <= MAX_PASSWORD_CHARS:
        raise ValueError(
            f"a password needs {MIN_PASSWORD_CHARS} to {MAX_PASSWORD_CHARS} characters"
        )
    return _hasher.hash(password)


class Throttled(Exception):
    """Too many failed logins for this name or address: try again in `retry_after_s`."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"too many failed logins; try again in {retry_after_s:.0f} s")
        self.retry_after_s = retry_after_s


class Throttle:
    """Failed attempts per key (a name, an address) in a sliding window. An attempt counts as a
    failure from the moment it starts (`begin`) until it succeeds, so attempts made at once
    cannot all pass the limit before the first failure is recorded."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()
        self._clock = clock

    def begin(self, *keys: str) -> None:
        """Start an attempt for `keys`. Raises Throttled when one of them is at the limit."""
        now = self._clock()
        with self._lock:
            wait = 0.0
            for key in keys:
                failures = self._failures.get(key)
                while failures and failures[0] <= now - FAILURE_WINDOW_S:
                    failures.popleft()
                if failures and len(failures) >= MAX_FAILURES:
                    wait = max(wait, failures[0] + FAILURE_WINDOW_S - now)
            if wait > 0:
                raise Throttled(wait)
            for key in keys:
                failures = self._failures.pop(key, None) or deque(maxlen=MAX_FAILURES)
                failures.append(now)
                self._failures[key] = failures
            while len(self._failures) > MAX_TRACKED:
                self._failures.popitem(last=False)

    def succeeded(self, *keys: str) -> None:
        """The attempt begun for `keys` succeeded: it is not a failure."""
        with self._lock:
            for key in keys:
                failures = self._failures.get(key)
                if failures:
                    failures.pop()


def client_key(address: str) -> str:
    """The failed-login key of a client address: an IPv6 client is its /64 (one host can hold
    a whole /64), an IPv4 client its address."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return f"address:{address[:64]}"
    if ip.version == 6:
        return f"address:{ipaddress.ip_network(f'{ip}/64', strict=False)}"
    return f"address:{ip}"


class Authenticator:
    """Checks credentials against the store and keeps sessions in it."""

    def __init__(self, store: CaseStore, throttle: Throttle | None = None) -> None:
        self._store = store
        self.throttle = throttle or Throttle()
        #: argon2 takes 64 MiB a check: at most this many at once, whatever the connections.
        self._checks = threading.BoundedSemaphore(MAX_CONCURRENT_CHECKS)

    def login(self, name: str, password: str, client: str) -> User | None:
        """The user when the password is right, None when not (same cost either way).

        Raises Throttled when the name or the client (`client_key`) failed too often."""
        keys = (f"name:{name[:MAX_NAME_CHARS]}", client)
        self.throttle.begin(*keys)
        user = self._check_password(name, password)
        if user is not None:
            self.throttle.succeeded(*keys)
        return user

    def _check_password(self, name: str, password: str) -> User | None:
        if len(password) > MAX_PASSWORD_CHARS or len(name) > MAX_NAME_CHARS:
            return None
        stored = self._store.password_hash(name)
        hashed, role = stored if stored is not None else (_DUMMY_HASH, "analyst")
        with self._checks:
            try:
                _hasher.verify(hashed, password)
            except (VerificationError, InvalidHashError):
                return None
        return User(name, role) if stored is not None else None

    def start_session(self, user: User) -> tuple[str, str]:
        """A new session for `user`: (the cookie's token, its CSRF token)."""
        token, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        expires_at = int((time.time() + SESSION_S) * 1000)
        self._store.add_session(_digest(token), user.name, csrf, expires_at)
        return token, csrf

    def session(self, token: str) -> tuple[User, str] | None:
        """The user and CSRF token of a session cookie; None when unknown or expired."""
        return self._store.session(_digest(token)) if token else None

    def end_session(self, token: str) -> None:
        self._store.end_session(_digest(token))


def same_token(given: str, expected: str) -> bool:
    """Compare two tokens in constant time."""
    return hmac.compare_digest(given.encode(), expected.encode())


def role_of(text: str) -> Role:
    if text == "lead":
        return "lead"
    if text == "analyst":
        return "analyst"
    raise ValueError(f"unknown role {text!r}: analyst or lead")


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
