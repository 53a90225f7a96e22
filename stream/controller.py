"""Adaptive batch cap: additive increase, multiplicative decrease toward a latency SLO.

The controller of Clipper (Crankshaw et al., NSDI 2017) applied to micro-batches: while the p99
latency of recent batches (first record in → decisions produced) stays under the SLO and work is
piling up (batches close full, or consumer lag grows), the cap grows by a fixed step; when the
SLO is missed it is cut by a factor. Bigger batches amortise the per-call cost under load;
smaller ones keep latency in bounds when a batch costs more than the SLO allows.
"""

from __future__ import annotations

from collections import deque

import numpy as np

#: Records added to the cap per step: coarse enough to reach a useful size within seconds.
ADDITIVE_STEP = 16
#: Factor applied to the cap when the SLO is missed.
DECREASE_FACTOR = 0.75
#: Recent batches whose p99 is compared with the SLO.
WINDOW_BATCHES = 20
#: Batches needed before the cap may grow again after a change.
MIN_EVIDENCE_BATCHES = 5


class BatchSizeController:
    """Chooses the batch cap from observed batch latencies."""

    def __init__(self, slo_ms: float, min_size: int, max_size: int, initial: int | None = None):
        if slo_ms <= 0:
            raise ValueError(f"slo_ms must be > 0, got {slo_ms}")
        if not 1 <= min_size <= max_size:
            raise ValueError(f"need 1 <= min_size <= max_size, got {min_size} and {max_size}")
        self.slo_s = slo_ms / 1000.0
        self.min_size = min_size
        self.max_size = max_size
        self.cap = min(max(initial if initial is not None else min_size, min_size), max_size)
        self._latencies: deque[float] = deque(maxlen=WINDOW_BATCHES)
        self._last_lag: int | None = None

    def observe(self, latency_s: float, closed_full: bool, lag_records: int | None) -> int | None:
        """Take one batch's latency; return the new cap when it changes, else None."""
        self._latencies.append(latency_s)
        lag_rising = (
            lag_records is not None and self._last_lag is not None and lag_records > self._last_lag
        )
        if lag_records is not None:
            self._last_lag = lag_records
        if latency_s > self.slo_s:
            return self._change(max(self.min_size, int(self.cap * DECREASE_FACTOR)))
        if len(self._latencies) < MIN_EVIDENCE_BATCHES or not (closed_full or lag_rising):
            return None
        if float(np.percentile(self._latencies, 99)) < self.slo_s:
            return self._change(min(self.max_size, self.cap + ADDITIVE_STEP))
        return None

    def _change(self, cap: int) -> int | None:
        if cap == self.cap:
            return None
        self.cap = cap
        self._latencies.clear()
        return cap
