"""A `fraud-review serve` process on the real broker, with its own topics, database, users and
port, and an HTTP client for its API (Basic credentials, or a session like the page's)."""

from __future__ import annotations

import base64
import http.client
import json
import re
import subprocess
import sys
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plumbing.metrics_text import by_key
from tests.integration.conftest import BOOTSTRAP, REPO
from tests.support.network import free_port

ANALYST, LEAD = ("ana", "analyst password 1"), ("lee", "lead password 12")


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return Response(
            response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        )
    finally:
        connection.close()


def basic(user: tuple[str, str]) -> dict[str, str]:
    token = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@dataclass
class ReviewConsole:
    """One console process; `start()` again after `stop()` is a restart on the same state."""

    decisions: str
    transactions: str
    labels: str
    #: A SQLite file, or a postgresql:// URL.
    db: Path | str
    log_path: Path
    extra: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    group: str = field(default_factory=lambda: f"fraud-review-{uuid.uuid4().hex[:8]}")
    process: subprocess.Popen[bytes] | None = None
    bootstrap: str = BOOTSTRAP

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "review", *args]

    def settings(self) -> list[str]:
        return [
            "--bootstrap-servers", self.bootstrap,
            "--db", str(self.db),
            "--output-topic", self.decisions,
            "--input-topic", self.transactions,
            "--labels-topic", self.labels,
            "--group-id", self.group,
            "--port", str(self.port),
            *self.extra,
        ]  # fmt: skip

    def add_user(self, name: str, password: str, role: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.command("add-user", name, "--password-stdin", "--role", role), "--db",
             str(self.db)],
            input=password + "\n", capture_output=True, text=True, cwd=REPO, timeout=60,
            check=False,
        )  # fmt: skip

    def start(self) -> ReviewConsole:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command("serve", *self.settings()),
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"console exited:\n{self.log()}"
            try:
                if self.get("/readyz").status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"console not ready in 60 s:\n{self.log()}")

    def stop(self) -> int:
        assert self.process is not None
        self.process.terminate()
        return self.process.wait(timeout=30)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str, headers: dict[str, str] | None = None) -> Response:
        return request(self.port, "GET", path, headers=headers)

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> Response:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return request(
            self.port, "POST", path, data, {"Content-Type": "application/json", **(headers or {})}
        )

    def cases(self, status: str = "open", user: tuple[str, str] = ANALYST) -> list[dict[str, Any]]:
        response = self.get(f"/api/cases?status={status}", basic(user))
        assert response.status == 200, response.body
        return list(response.json()["cases"])

    def case(self, transaction_id: str, user: tuple[str, str] = ANALYST) -> Response:
        return self.get(f"/api/cases/{urllib.parse.quote(transaction_id, safe='')}", basic(user))

    def verdict(
        self, transaction_id: str, fraud: bool, note: str = "", user: tuple[str, str] = ANALYST
    ) -> Response:
        path = f"/api/cases/{urllib.parse.quote(transaction_id, safe='')}/verdict"
        return self.post(path, {"fraud": fraud, "note": note}, basic(user))

    def wait_for_cases(
        self, count: int, timeout_s: float = 30.0, user: tuple[str, str] = ANALYST
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while True:
            cases = self.cases(user=user)
            if len(cases) >= count or time.monotonic() > deadline:
                return cases
            time.sleep(0.2)

    def login(self, user: tuple[str, str]) -> tuple[str, str]:
        """Log in as the page does: (the session cookie, the page's CSRF token)."""
        form = urllib.parse.urlencode({"name": user[0], "password": user[1]}).encode()
        response = request(
            self.port, "POST", "/login", form, {"Content-Type": "application/x-www-form-urlencoded"}
        )
        assert response.status == 303, response.body
        cookie = response.headers["set-cookie"].split(";", 1)[0]
        page = self.get("/", {"Cookie": cookie})
        assert page.status == 200
        match = re.search(rb'name="csrf-token" content="([^"]+)"', page.body)
        assert match is not None
        return cookie, match.group(1).decode()

    def metric(self, name: str) -> float:
        """The value of one sample, named as its line names it (`name{labels}`)."""
        values = by_key(self.get("/metrics").body.decode())
        assert name in values, f"metric {name} not exposed"
        return values[name]
