"""Waiting for something another thread or process does."""

from __future__ import annotations

import time
from collections.abc import Callable

#: Short enough for in-process replicas (their threads move in microseconds), long enough not
#: to busy-poll a child process's HTTP endpoint.
POLL_INTERVAL_S = 0.01


def wait_until(
    condition: Callable[[], object],
    timeout_s: float = 10.0,
    what: str = "the condition",
    *,
    interval_s: float = POLL_INTERVAL_S,
) -> None:
    """Return once `condition()` is true; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)
