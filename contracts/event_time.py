"""How far the state's clocks trust a record's event time (docs/contracts.md, "Event time and
state").

Every clock the state keeps is event time: a card's windows decay and its idle cards are evicted
by it, a terminal's risk is counted by its days. Such a clock moves with the newest event time
seen, so one record dated in the far future (a valid one may say 9999-12-31) would make every
card and terminal look idle and wipe them. A record may therefore move a state clock no further
than this host's wall clock plus an allowed skew (`max_clock_skew_ms`): beyond that, its event
time counts as that bound. The skew is history time, like the windows it protects, so a
compressed-time demo (`time_scale` > 1, where the windows shrink as well) divides it by the
scale.

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

    def clamp(self, event_time: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], int]:
        """The event times as the state counts them (none past `bound_ms`), and how many were
        past it."""
        bound = self.bound_ms()
        future = int(np.count_nonzero(event_time > bound))
        if not future:
            return event_time, 0
        return np.minimum(event_time, bound), future
