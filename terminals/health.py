"""What the features worker's `/healthz` and `/readyz` say (served by `plumbing/health.py`).

Two loops make the worker's progress: the router's thread (librdkafka, `terminals/router.py`)
and faust's event loop, where the table agent applies the re-keyed events. Liveness is
progress-based, so a worker that stopped counting is restarted instead of freezing every
terminal's risk:
- a loop that has not reported for `STALL_AFTER_S` is stuck (the event loop blocked, the
  router's thread inside a call that does not return); a router that stopped for good is dead;
- the table agent is stalled when re-keyed events wait in a partition it owns (the partition's
  high watermark is past what it applied) and it applied none of them for `STALL_AFTER_S`.
Readiness is liveness, plus the table recovered from its changelog, the router's outputs
acknowledged (not being retried), and the worker not catching up: its router within
FRAUD_FEATURES_READY_MAX_LAG input records of the inputs' ends (and its lag known: it has been
given its partitions and fetched them), its table within as many transactions of the internal
topic's end. A worker started on a backlog is not ready until it has counted it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: A loop silent this long, or a table agent idle this long with events waiting, is stuck.
STALL_AFTER_S = 30.0


class WorkerHealth:
    """The worker's probe: updated by the router's thread and faust's event loop."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, max_lag: int | None = None
    ) -> None:
        """`max_lag`: FRAUD_FEATURES_READY_MAX_LAG (None: the lag does not decide readiness)."""
        self._clock = clock
        self._max_lag = max_lag
        #: Input records not routed yet (None: not known yet), and transactions not counted.
        self._router_lag: int | None = None
        self._table_lag: int | None = None
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

    def router_lag(self, records: int | None) -> None:
        """The input records its router has not routed yet (None: not known yet)."""
        self._router_lag = records

    # -- faust's event loop ----------------------------------------------------------------

    def loop_beat(self) -> None:
        self._loop_beat = self._clock()

    def recovered(self, done: bool) -> None:
        """Whether the table is recovered from its changelog (False again on a rebalance)."""
        self._recovered = done

    def table_lag(self, transactions: int | None) -> None:
        """At most how many routed transactions its table agent has not applied yet (None:
        not known yet)."""
        self._table_lag = transactions

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
        return self._caught_up()

    def _caught_up(self) -> tuple[bool, str]:
        bound = self._max_lag
        if bound is None:
            return True, "ok"
        routing = self._router_lag
        if routing is None:
            return False, "input lag not known yet (partitions not assigned or not fetched)"
        if routing > bound:
            return False, f"catching up: {routing:,} input records not routed (bound {bound:,})"
        if self._table_lag is None:
            return False, "table lag not known yet (no internal record applied)"
        if self._table_lag > bound:
            return False, (
                f"catching up: up to {self._table_lag:,} routed transactions not counted "
                f"(bound {bound:,})"
            )
        return True, "ok"
