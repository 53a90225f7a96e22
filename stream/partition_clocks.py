"""Each owned partition's event-time clock: its watermark, the newest event time its records
applied, which no single record can move past the wall clock plus the allowed skew
(`contracts/event_time.py`). The card state (`stream/owned_card_history.py`) reads every batch's
records at the times their clocks allow, and evicts idle cards as of them.

Key design decisions:
- Event time, bounded: a record dated past the bound never moves its partition's watermark,
  and counts in its card's history as of that watermark (it is counted, so a future date cannot
  hide a spree from the windows; on a partition whose clock knows no time yet it changes no
  state); a record older than the longest window as of the watermark changes no state (its
  features read the state as it is). Idle cards are evicted as of the partition's watermark,
  never as of one batch's newest record. A restored partition's watermark is the newest event
  time its cards applied, so what was stale before a rebalance is stale after it.
- A partition has a clock exactly while the card state owns it (restored, not yet let go).
- No lock of its own: the card state calls it under its lock.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from contracts.event_time import EventClock


class BatchTimes(NamedTuple):
    """A batch's event times, as its cards count them."""

    #: The batch's partitions, each once.
    partitions: list[int]
    #: Each record's event time: a future one as of its partition's watermark.
    event_time: npt.NDArray[np.int64]
    #: Whether each record changes its card's state.
    applies: npt.NDArray[np.bool_]
    #: Records dated past the bound, and records older than the longest window.
    future: int
    stale: int


class PartitionClocks:
    """The event-time watermark, and the last eviction, of every partition owned."""

    def __init__(
        self, clock: EventClock, longest_window_ms: float, evict_interval_s: float
    ) -> None:
        """`longest_window_ms`: the longest history window (older records are stale);
        `evict_interval_s`: how often each partition looks for idle cards."""
        self._clock = clock
        self._longest_ms = longest_window_ms
        self._evict_interval_s = evict_interval_s
        #: Each owned partition's event-time watermark (-1: none yet) and when its idle cards
        #: were last evicted.
        self._watermark: dict[int, int] = {}
        self._last_eviction: dict[int, float] = {}

    def bounded(self, newest: int) -> int:
        """`newest`, no later than the clock's bound."""
        return min(newest, self._clock.bound_ms())

    def start(self, partition: int, newest: int) -> None:
        """A partition now owned. Its clock resumes at the newest event time its cards applied,
        so a record older than the longest window is as stale after a restore as before;
        bounded like any clock, against states an older version wrote from a future-dated
        record."""
        self._watermark[partition] = self.bounded(newest)
        self._last_eviction[partition] = time.monotonic()

    def stop(self, partition: int) -> int | None:
        """A partition no longer owned; its watermark, if it was."""
        self._last_eviction.pop(partition, None)
        return self._watermark.pop(partition, None)

    def __contains__(self, partition: int) -> bool:
        return partition in self._watermark

    def owned(self) -> list[int]:
        """The partitions with a clock."""
        return sorted(self._watermark)

    def watermark(self, partition: int) -> int:
        return self._watermark[partition]

    def advance(
        self, partitions: npt.NDArray[np.int64], event_time: npt.NDArray[np.int64]
    ) -> BatchTimes:
        """Move the clocks of a batch's partitions (each record's in `partitions`) by its event
        times, and say at what time each record counts, and whether it changes its card."""
        beyond = self._clock.beyond(event_time)
        future = int(np.count_nonzero(beyond))
        present, which = np.unique(partitions, return_inverse=True)
        newest = np.full(len(present), -1, np.int64)
        np.maximum.at(newest, which[~beyond], event_time[~beyond])
        watermarks = np.empty(len(present), np.int64)
        for i, partition in enumerate(present.tolist()):
            watermarks[i] = self._watermark[partition] = max(
                self._watermark[partition], int(newest[i])
            )
        if future:
            # Counted as of its partition's clock. While the clock knows no time yet (a new
            # partition) there is none to count it at: it changes no state, so no made-up time
            # becomes the clock a restore resumes from.
            event_time = event_time.copy()
            event_time[beyond] = watermarks[which[beyond]]
        applies = (event_time >= watermarks[which] - self._longest_ms) & (event_time >= 0)
        stale = int(np.count_nonzero(~applies & ~beyond))
        return BatchTimes(present.tolist(), event_time, applies, future, stale)

    def due_for_eviction(self, partitions: Iterable[int]) -> list[int]:
        """Those of `partitions` whose time to look for idle cards has come (from now on, not
        again until `evict_interval_s` passes)."""
        now = time.monotonic()
        due = [p for p in partitions if now - self._last_eviction[p] >= self._evict_interval_s]
        for partition in due:
            self._last_eviction[partition] = now
        return due
