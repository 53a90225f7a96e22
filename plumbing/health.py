"""The HTTP endpoints of a replica (the scorer's and the features worker's): `/metrics`
(Prometheus), `/healthz` (alive) and `/readyz` (ready to take traffic). Served from a daemon
thread so a slow scrape never stalls the stream. What the two probes answer comes from a
`Probe`: `HealthState` for the scorer's one stream loop (`terminals/health.py` for the worker)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from plumbing.errors import ConfigurationError

log = logging.getLogger(__name__)

#: The stream loop runs at least every poll timeout; silence this long means it is stuck.
STALL_AFTER_S = 30.0
#: A loop silent this long is inside a blocking Kafka call (a transaction commit while the broker
#: is away): not ready, whatever it last said, though not yet stuck.
READY_SILENCE_S = 5.0
#: Connections served at once. Prometheus and two probes need three; more are refused with a
#: 503 at once, so a flood of connections cannot start a thread each.
MAX_CONNECTIONS = 8
#: A client that sends nothing for this long is dropped (a slow reader holds no thread long).
CONNECTION_TIMEOUT_S = 10.0


class Probe(Protocol):
    """What `/healthz` and `/readyz` answer: (ok, why)."""

    def alive(self) -> tuple[bool, str]: ...

    def ready(self) -> tuple[bool, str]: ...


class HealthState:
    """What the endpoints report; the stream loop updates it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._ready = False
        self._reason = "starting"
        self._clock = clock
        self._last_beat = clock()
        #: Asked at every probe; a reason makes the replica not alive.
        self._checks: list[Callable[[], str | None]] = []

    def watch(self, check: Callable[[], str | None]) -> None:
        """Ask `check()` at every probe from now on: a reason (not None) makes the replica not
        alive, e.g. a thread it cannot do without has ended."""
        self._checks.append(check)

    def beat(self) -> None:
        """Called by the stream loop on every pass."""
        self._last_beat = self._clock()

    def set_ready(self, ready: bool, reason: str = "") -> None:
        self._ready, self._reason = ready, reason

    def alive(self) -> tuple[bool, str]:
        stalled_s = self._clock() - self._last_beat
        if stalled_s > STALL_AFTER_S:
            return False, f"stream loop silent for {stalled_s:.0f}s"
        for check in self._checks:
            why = check()
            if why is not None:
                return False, why
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        alive, why = self.alive()
        if not alive:
            return False, why
        silent_s = self._clock() - self._last_beat
        if self._ready and silent_s > READY_SILENCE_S:
            return False, f"stream loop busy for {silent_s:.0f}s"
        return self._ready, ("ok" if self._ready else self._reason)


class BoundedHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server that serves at most `max_connections` connections at once; the
    next are answered 503 at once (the review console's server too)."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.sendall(_BUSY)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 5\r\nConnection: close\r\n\r\nbusy\n"
)


class BackgroundHTTPServer:
    """Serves `handler` on host:port from a daemon thread until `close()`, at most
    `max_connections` connections at once (`BoundedHTTPServer`). Binding happens at
    construction: an address in use raises OSError there."""

    def __init__(
        self,
        host: str,
        port: int,
        handler: type[BaseHTTPRequestHandler],
        max_connections: int = MAX_CONNECTIONS,
        name: str = "health-http",
    ) -> None:
        self._server = BoundedHTTPServer((host, port), handler, max_connections)
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class HealthServer(BackgroundHTTPServer):
    """Serves the endpoints on host:port until `close()`."""

    def __init__(
        self, host: str, port: int, state: Probe, registry: CollectorRegistry = REGISTRY
    ) -> None:
        super().__init__(host, port, _handler_for(state, registry))

    def start(self) -> None:
        super().start()
        log.info("serving /metrics /healthz /readyz on port=%s", self.port)


def serve(host: str, port: int, probe: Probe, registry: CollectorRegistry) -> HealthServer | None:
    """Start serving the endpoints on host:port (None when the port is 0: disabled); a port
    that cannot be bound is a ConfigurationError naming the setting to change."""
    if not port:
        return None
    try:
        server = HealthServer(host, port, probe, registry)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot serve metrics on {host}:{port}: {exc}; "
            "choose another --metrics-port, or 0 to disable"
        ) from exc
    server.start()
    return server


def _handler_for(state: Probe, registry: CollectorRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = CONNECTION_TIMEOUT_S

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
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
