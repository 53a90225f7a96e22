"""The supervisor's watch over its children's /healthz: a child is killed only after failing
FAILURES_BEFORE_KILL checks in a row past its start-up grace, and a restart begins anew."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from stream.startup.child_health import ChildHealth, healthz_ok
from tests.support.network import free_port


def watch(answers: dict[int, bool]) -> ChildHealth:
    return ChildHealth(lambda index: answers[index], interval_s=10, grace_s=60)


def test_a_child_failing_its_checks_past_its_grace_is_killed_after_three_in_a_row() -> None:
    answers = {0: True, 1: False}
    health = watch(answers)
    health.started(0, 0.0)
    health.started(1, 0.0)
    killed = [health.due(float(t)) for t in range(0, 100, 10)]
    assert killed[:6] == [[]] * 6, "failures inside the grace (60 s) do not count"
    assert killed[6:8] == [[], []] and killed[8] == [(1, "/healthz failed 3 checks in a row")]


def test_a_success_resets_the_count() -> None:
    answers = {0: False}
    health = watch(answers)
    health.started(0, -100.0)
    assert health.due(0.0) == [] and health.due(10.0) == []
    answers[0] = True
    assert health.due(20.0) == []
    answers[0] = False
    assert health.due(30.0) == [] and health.due(40.0) == []
    assert health.due(50.0) == [(0, "/healthz failed 3 checks in a row")]


def test_checks_wait_for_their_interval_and_stop_while_a_child_is_gone() -> None:
    asked: list[int] = []

    def check(child: int) -> bool:
        asked.append(child)
        return True

    health = ChildHealth(check, interval_s=10, grace_s=0)
    health.started(0, 0.0)
    health.due(5.0)
    assert asked == []
    health.due(10.0)
    assert asked == [0]
    health.gone(0)
    health.due(30.0)
    assert asked == [0]
    health.started(0, 30.0)
    health.due(40.0)
    assert asked == [0, 0]


class _Healthz(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[int, type[_Healthz]]]:
    handler = type("Handler", (_Healthz,), {})
    port = free_port()
    httpd = ThreadingHTTPServer(("0.0.0.0", port), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield port, handler
    httpd.shutdown()
    httpd.server_close()


def test_healthz_is_asked_on_loopback_for_a_wildcard_bind(server) -> None:
    port, handler = server
    assert healthz_ok("0.0.0.0", port) and healthz_ok("127.0.0.1", port)
    handler.status = 503
    assert not healthz_ok("0.0.0.0", port)
    assert not healthz_ok("127.0.0.1", free_port()), "nothing listening fails"
