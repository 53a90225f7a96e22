"""How far the state's clocks trust a record's event time (docs/contracts.md, "Event time and
state").

Every clock the state keeps is event time: a card's windows decay and its idle cards are evicted
by it, a terminal's risk is counted by its days. Such a clock moves with the newest event time
seen, so one record dated in the far future (a valid one may say 9999-12-31) would make every
card and terminal look idle and wipe them. A record dated past this host's wall clock plus an
allowed skew (`max_clock_skew_ms`) therefore never moves a state clock: the owner of the clock
counts it as of the clock's current time instead (its stream's newest trusted event time), so a
stream replayed from last year is not moved to today by one bad record either. The skew is
history time, like the windows it protects, so a compressed-time demo (`time_scale` > 1, where
the windows shrink as well) divides it by the scale.

Pure: the wall clock is a parameter, so tests move it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

#: How far ahead of the host's clock an event time is still taken as it is: the clocks of the
#: payment systems and of this host may differ by a few seconds to minutes (NTP outages, a VM
#: resumed), never by more without being broken. The same slack as a label's `reported_at`.
DEFAULT_MAX_CLOCK_SKEW_MS = 300_000


class EpochMs(int):
    """An instant already in epoch milliseconds (read from an Avro timestamp): an input
    mapping's time_format, which says how to read numbers and text, does not apply to it."""


def wall_clock_ms() -> int:
    """The host's clock, epoch ms."""
    return time.time_ns() // 1_000_000


class EventClock:
    """The latest event time a record may move a state clock to, now."""

    def __init__(
        self,
        max_skew_ms: float = DEFAULT_MAX_CLOCK_SKEW_MS,
        time_scale: float = 1.0,
        wall_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        if not max_skew_ms >= 0:
            raise ValueError(f"max_skew_ms must be >= 0, got {max_skew_ms!r}")
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale!r}")
        self._skew_ms = int(max_skew_ms / time_scale)
        self._wall_ms = wall_ms

    def bound_ms(self) -> int:
        """The wall clock plus the allowed skew (in event time)."""
        return self._wall_ms() + self._skew_ms

    def beyond(self, event_time: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Which event times are past `bound_ms` (not to be trusted as they are)."""
        beyond: npt.NDArray[np.bool_] = event_time > self.bound_ms()
        return beyond
