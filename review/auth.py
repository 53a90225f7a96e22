"""Who is asking: passwords (argon2id, argon2-cffi), session cookies with their CSRF token,
HTTP Basic for the JSON API, and a limit on failed logins.

- A session token is 32 random bytes; the database keeps only its SHA-256, so a copy of the
  database opens no session. Each session has its own CSRF token, which every state-changing
  request made with the cookie must repeat in `X-CSRF-Token` (or the form's `csrf` field).
- A request with `Authorization: Basic` carries its own credentials, so it needs no CSRF token
  (a browser never adds them to a cross-site request by itself).
- After `MAX_FAILURES` failed attempts within `FAILURE_WINDOW_S`, a name, and a client address,
  is refused for the rest of the window (HTTP 429), before any password is checked: guessing is
  slow, and argon2's cost cannot be turned against the console.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from review.cases import CaseStore, Role, User

SESSION_S = 12 * 3_600
MAX_FAILURES = 5
FAILURE_WINDOW_S = 300.0
#: Names and addresses whose failures are remembered at most (the oldest are forgotten).
MAX_TRACKED = 10_000
#: A password shorter than this is refused by `add-user`.
MIN_PASSWORD_CHARS = 12
MAX_PASSWORD_CHARS = 1_024

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


class Throttle:
    """Failed attempts per key (a name, an address) in a sliding window."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()
        self._clock = clock

    def retry_after_s(self, *keys: str) -> float:
        """0 when every key may try now; else how long until the first of them may."""
        now = self._clock()
        wait = 0.0
        with self._lock:
            for key in keys:
                failures = self._failures.get(key)
                while failures and failures[0] <= now - FAILURE_WINDOW_S:
                    failures.popleft()
                if failures and len(failures) >= MAX_FAILURES:
                    wait = max(wait, failures[0] + FAILURE_WINDOW_S - now)
        return wait

    def failed(self, *keys: str) -> None:
        now = self._clock()
        with self._lock:
            for key in keys:
                failures = self._failures.pop(key, None) or deque(maxlen=MAX_FAILURES)
                failures.append(now)
                self._failures[key] = failures
            while len(self._failures) > MAX_TRACKED:
                self._failures.popitem(last=False)


class Authenticator:
    """Checks credentials against the store and keeps sessions in it."""

    def __init__(self, store: CaseStore, throttle: Throttle | None = None) -> None:
        self._store = store
        self.throttle = throttle or Throttle()

    def check_password(self, name: str, password: str) -> User | None:
        """The user when the password is right; None otherwise (same cost either way)."""
        if len(password) > MAX_PASSWORD_CHARS or len(name) > 200:
            return None
        stored = self._store.password_hash(name)
        hashed, role = stored if stored is not None else (_DUMMY_HASH, "analyst")
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
