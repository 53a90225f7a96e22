"""The supervisor's watch over its children's `/healthz` (`stream/startup/supervisor.py`).

A pod's liveness probe can ask one port, the first process's; the others serve their own
`/healthz` on the ports after it. So the supervisor asks every child itself: a child whose
`/healthz` fails `FAILURES_BEFORE_KILL` checks in a row, after its start-up grace, is killed,
and the supervisor restarts it as it restarts a child that died. A hung child (its stream loop
silent past `plumbing.health.STALL_AFTER_S`, or the whole process frozen) is thereby treated
like a dead one, whichever process it is.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

#: How often each child's /healthz is asked.
CHECK_INTERVAL_S = 10.0
#: A check that gets no answer this fast fails.
CHECK_TIMEOUT_S = 5.0
#: Failed checks in a row that get a child killed (the chart's liveness probe: 3, 10 s apart).
FAILURES_BEFORE_KILL = 3
#: How long a child may take to start (model, tables, group join) before its checks count: the
#: chart's startup probe allows 24 checks 5 s apart.
STARTUP_GRACE_S = 120.0


def healthz_ok(host: str, port: int) -> bool:
    """Whether GET /healthz on host:port answers 200 within CHECK_TIMEOUT_S."""
    url = f"http://{_connectable(host)}:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=CHECK_TIMEOUT_S) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def _connectable(host: str) -> str:
    """Where to reach a server bound to `host`: a wildcard address is reached on loopback."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


@dataclass
class _Child:
    started_at: float
    next_check_at: float
    failures: int = 0


@dataclass
class ChildHealth:
    """Which children to kill for failing their checks: `due(now)` asks the children whose
    check is due, through `check(index) -> bool`, and returns those to kill."""

    check: Callable[[int], bool]
    interval_s: float = CHECK_INTERVAL_S
    grace_s: float = STARTUP_GRACE_S
    failures_before_kill: int = FAILURES_BEFORE_KILL
    _children: dict[int, _Child] = field(default_factory=dict)

    def started(self, index: int, now: float) -> None:
        """Child `index` was (re)started at `now`: its grace begins, its failures are reset."""
        self._children[index] = _Child(now, now + self.interval_s)

    def gone(self, index: int) -> None:
        """Child `index` exited: no checks until it is started again."""
        self._children.pop(index, None)

    def due(self, now: float) -> list[tuple[int, str]]:
        """Check the children whose turn it is; (index, why) for each to kill."""
        doomed = []
        for index, child in self._children.items():
            if now < child.next_check_at:
                continue
            child.next_check_at = now + self.interval_s
            if self.check(index):
                child.failures = 0
                continue
            if now - child.started_at < self.grace_s:
                continue  # still starting: its endpoint may not be up yet
            child.failures += 1
            if child.failures >= self.failures_before_kill:
                doomed.append((index, f"/healthz failed {child.failures} checks in a row"))
        return doomed
