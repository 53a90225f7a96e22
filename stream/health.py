"""The HTTP endpoints of a replica: `/metrics` (Prometheus), `/healthz` (alive) and `/readyz`
(ready to take traffic). Served from a daemon thread so a slow scrape never stalls the stream."""

from __future__ import annotations

import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger(__name__)

#: The stream loop runs at least every poll timeout; silence this long means it is stuck.
STALL_AFTER_S = 30.0


class HealthState:
    """What the endpoints report; the stream loop updates it."""

    def __init__(self) -> None:
        self._ready = False
        self._reason = "starting"
        self._last_beat = time.monotonic()

    def beat(self) -> None:
        """Called by the stream loop on every pass."""
        self._last_beat = time.monotonic()

    def set_ready(self, ready: bool, reason: str = "") -> None:
        self._ready, self._reason = ready, reason

    def alive(self) -> tuple[bool, str]:
        stalled_s = time.monotonic() - self._last_beat
        if stalled_s > STALL_AFTER_S:
            return False, f"stream loop silent for {stalled_s:.0f}s"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        alive, why = self.alive()
        if not alive:
            return False, why
        return self._ready, ("ok" if self._ready else self._reason)


class HealthServer:
    """Serves the endpoints on host:port until `close()`."""

    def __init__(self, host: str, port: int, state: HealthState) -> None:
        handler = _handler_for(state)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="health-http", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()
        log.info("serving /metrics /healthz /readyz on port=%s", self.port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler_for(state: HealthState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/readyz"):
                ok, why = state.alive() if path == "/healthz" else state.ready()
                self._send(200 if ok else 503, (why + "\n").encode(), "text/plain; charset=utf-8")
            else:
                self._send(404, b"not found\n", "text/plain; charset=utf-8")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Scrapes are frequent; keep them out of the service log."""

    return Handler
