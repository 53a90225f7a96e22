"""The metrics and health endpoints: what they answer, and that a flood of connections cannot
make the replica start a thread per connection."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from plumbing.errors import ConfigurationError
from plumbing.health import MAX_CONNECTIONS, HealthServer, HealthState, serve
from stream.metrics import ServiceMetrics


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def test_readiness_follows_the_state_and_liveness_stays_up() -> None:
    state = HealthState()
    metrics = ServiceMetrics(CollectorRegistry())
    metrics.set_in_flight(7, 700)
    server = HealthServer("127.0.0.1", 0, state, metrics.registry)
    server.start()
    try:
        assert get(server.port, "/readyz") == (503, "starting\n")
        state.set_ready(True)
        assert get(server.port, "/readyz") == (200, "ok\n")
        assert get(server.port, "/healthz")[0] == 200
        assert "fraud_in_flight_records 7.0" in get(server.port, "/metrics")[1]
    finally:
        server.close()


def test_a_loop_silent_for_seconds_is_unready_then_dead() -> None:
    # Found by the fault suite (broker restarted, exactly-once): the loop blocked inside a
    # transaction call while /readyz kept its last answer, 200.
    now = [100.0]
    state = HealthState(clock=lambda: now[0])
    state.set_ready(True)
    assert state.ready() == (True, "ok")
    now[0] += 6.0
    assert state.ready() == (False, "stream loop busy for 6s")
    assert state.alive() == (True, "ok")
    now[0] += 30.0
    assert state.ready() == (False, "stream loop silent for 36s")
    state.beat()
    assert state.ready() == (True, "ok")


def test_idle_connections_beyond_the_bound_get_no_thread_and_scrapes_still_work() -> None:
    # Finding 8 of the review: ThreadingHTTPServer started one thread per connection, without
    # limit; idle sockets held them open.
    server = HealthServer("127.0.0.1", 0, HealthState())
    server.start()
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(60)]
    try:
        time.sleep(0.5)
        assert threading.active_count() - before <= MAX_CONNECTIONS
        for sock in idle[: MAX_CONNECTIONS + 5]:
            sock.close()
        time.sleep(0.3)
        assert get(server.port, "/healthz")[0] == 200
    finally:
        for sock in idle:
            sock.close()
        server.close()


def test_serve_is_off_on_port_0_and_names_the_setting_when_the_port_is_taken() -> None:
    assert serve("127.0.0.1", 0, HealthState(), CollectorRegistry()) is None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ConfigurationError, match="--metrics-port, or 0 to disable"):
            serve("127.0.0.1", taken.getsockname()[1], HealthState(), CollectorRegistry())
