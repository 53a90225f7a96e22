"""The entries whose counts were not published at once (terminals/state.py): each is published
once the worker's clock is PUBLISH_WITHIN_DAYS past the oldest day such a change counted on, a
day before the first window reads it (the worker's day close, terminals/entity_table.py).
"""

from __future__ import annotations

import heapq

from contracts.terminal_risk import DELAY_DAYS
from terminals.table_clock import NO_DAY

#: Counts not published at once are published once the worker's clock is this many days past
#: their day: a day before the first window reads them (`publication_due`).
PUBLISH_WITHIN_DAYS = DELAY_DAYS - 1


def publication_due(day: int, watermark_day: int) -> bool:
    """Whether counts of `day` that were not published at once must be now: the worker's clock
    is PUBLISH_WITHIN_DAYS past it (the first window reads them DELAY_DAYS after it)."""
    return watermark_day != NO_DAY and watermark_day >= day + PUBLISH_WITHIN_DAYS


class Unpublished:
    """The entries whose changes were not published at once, each with the oldest day such a
    change counted on: published once `publication_due` for that day (the worker's day close,
    terminals/entity_table.py). Kept by day too, so that a day close, at every internal record,
    looks only at the days due, not at every entry waiting."""

    def __init__(self) -> None:
        self._days: dict[str, int] = {}
        self._by_day: dict[int, set[str]] = {}
        #: The days to look at, oldest first, each once (a day emptied stays until it is due).
        self._heap: list[int] = []
        self._queued: set[int] = set()

    def note(self, key: str, day: int) -> None:
        """`key` changed on `day`, not published."""
        known = self._days.get(key)
        if known is not None and known <= day:
            return
        if known is not None:
            self._leave(key, known)
        self._days[key] = day
        self._by_day.setdefault(day, set()).add(key)
        if day not in self._queued:
            self._queued.add(day)
            heapq.heappush(self._heap, day)

    def discard(self, key: str) -> None:
        """`key` is published, or forgotten."""
        day = self._days.pop(key, None)
        if day is not None:
            self._leave(key, day)

    def take_due(self, watermark_day: int) -> list[str]:
        """The keys whose publication is due as of `watermark_day`, no longer held; in order of
        their day."""
        due: list[str] = []
        while self._heap and publication_due(self._heap[0], watermark_day):
            day = heapq.heappop(self._heap)
            self._queued.discard(day)
            keys = self._by_day.pop(day, set())
            for key in sorted(keys):
                del self._days[key]
            due.extend(sorted(keys))
        return due

    def _leave(self, key: str, day: int) -> None:
        keys = self._by_day[day]
        keys.discard(key)
        if not keys:
            del self._by_day[day]

    def __contains__(self, key: object) -> bool:
        return key in self._days
