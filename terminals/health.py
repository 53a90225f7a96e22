"""What the features worker's `/healthz` and `/readyz` say (served by `contracts/health.py`).

Two loops make the worker's progress: the router's thread (librdkafka, `terminals/router.py`)
and faust's event loop, where the table agent applies the re-keyed events. Liveness is
progress-based, so a worker that stopped counting is restarted instead of freezing every
terminal's risk:
- a loop that has not reported for `STALL_AFTER_S` is stuck (the event loop blocked, the
  router's thread inside a call that does not return); a router that stopped for good is dead;
- the table agent is stalled when re-keyed events wait in a partition it owns (the partition's
  high watermark is past what it applied) and it applied none of them for `STALL_AFTER_S`.
Readiness is liveness, plus the table recovered from its changelog and the router's outputs
acknowledged (not being retried).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: A loop silent this long, or a table agent idle this long with events waiting, is stuck.
STALL_AFTER_S = 30.0


class WorkerHealth:
    """The worker's probe: updated by the router's thread and faust's event loop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        now = clock()
        self._router_beat = now
        self._loop_beat = now
        self._router_failure: str | None = None
        self._delivering = True
        self._recovered = False
        #: Since when events wait in an owned partition without the agent applying any.
        self._waiting_since: float | None = None
        self._lock = threading.Lock()

    # -- the router's thread -------------------------------------------------------------

    def router_beat(self) -> None:
        self._router_beat = self._clock()

    def router_delivering(self, delivering: bool) -> None:
        """False while the router's outputs are being sent again."""
        self._delivering = delivering

    def router_failed(self, why: str) -> None:
        self._router_failure = why

    # -- faust's event loop ----------------------------------------------------------------

    def loop_beat(self) -> None:
        self._loop_beat = self._clock()

    def recovered(self, done: bool) -> None:
        """Whether the table is recovered from its changelog (False again on a rebalance)."""
        self._recovered = done

    def agent_progress(self, waiting: bool, progressed: bool) -> None:
        """Once a second: whether events wait for the table agent, and whether it applied
        any since the last call."""
        with self._lock:
            if not waiting or progressed:
                self._waiting_since = None
            elif self._waiting_since is None:
                self._waiting_since = self._clock()

    @property
    def stalled(self) -> bool:
        """Whether the table agent has been idle with events waiting for `STALL_AFTER_S`."""
        since = self._waiting_since
        return since is not None and self._clock() - since > STALL_AFTER_S

    # -- the probes -------------------------------------------------------------------------

    def alive(self) -> tuple[bool, str]:
        now = self._clock()
        if self._router_failure is not None:
            return False, f"router stopped: {self._router_failure}"
        for name, beat in (("router", self._router_beat), ("event loop", self._loop_beat)):
            if now - beat > STALL_AFTER_S:
                return False, f"{name} silent for {now - beat:.0f}s"
        if self.stalled:
            return False, f"table agent applied nothing for {STALL_AFTER_S:.0f}s+ while events wait"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        alive, why = self.alive()
        if not alive:
            return False, why
        if not self._recovered:
            return False, "recovering the table from its changelog"
        if not self._delivering:
            return False, "routed records not acknowledged, retrying"
        return True, "ok"
