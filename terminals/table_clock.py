"""One table partition's event-time clock (`TerminalClock`): it says what is stale and which
terminals are idle, and moves only with what every input has reached (terminals/state.py's
docstring says why).
"""

from __future__ import annotations

from contracts.event_time import EventClock
from contracts.terminal_risk import HORIZON_DAYS
from terminals.events import InputMarks

#: A day not known yet: a clock or a terminal (`as_of_day`) that has seen nothing.
NO_DAY = -1
#: An input's time before it has shown one (as terminals/order.py says it).
NO_TIME = -1


class TerminalClock:
    """One table partition's event-time clock in days: its day (the watermark) says what is
    stale and which terminals are idle. It moves only with the routers' marks (`follow`): the
    minimum over every input partition of the time it has been read up to (see the module
    docstring), and never back."""

    def __init__(self, day_ms: int, clock: EventClock | None = None) -> None:
        if day_ms < 1:
            raise ValueError(f"day_ms must be >= 1, got {day_ms}")
        self.day_ms = day_ms
        self._clock = clock or EventClock()
        self.watermark_day = NO_DAY
        #: The watermark itself (epoch ms; NO_TIME until every input has been heard of): every
        #: event at or before it has been applied (the worker's progress, `WorkerProgress`).
        self.watermark_ms = NO_TIME
        #: Per input partition ("t3", "l0"): the newest time the marks said, and whether idle.
        self._reached: dict[str, tuple[int, bool]] = {}
        #: The input partitions every mark must be known of ("t0"…, "l0"…).
        self._inputs: list[str] = []
        self._partitions = (0, 0)

    def day(self, event_time_ms: int, known_day: int = NO_DAY) -> tuple[int, bool]:
        """The day an event time counts on, and whether it was past the bound: then the
        watermark's day; else its own day. While the watermark knows no day (a worker just
        started), a time past the bound counts on `known_day` (its terminal's day), and only
        when that is unknown too on the bound's day: one future record read first after a
        restart must not move a terminal to today while the stream replays last year."""
        bound = self._clock.bound_ms()
        if event_time_ms > bound:
            watermark = self.watermark_day
            if watermark != NO_DAY:
                return watermark, True
            return (bound // self.day_ms if known_day == NO_DAY else known_day), True
        return event_time_ms // self.day_ms, False

    def follow(self, marks: InputMarks) -> None:
        """Take a router's marks (sent with an internal record, after its events): the
        watermark moves to the oldest time over the inputs that are not idle (every one idle:
        the newest), once every input partition has been heard of; never back, and never past
        the bound."""
        if marks.partitions != self._partitions:
            self._partitions = transactions, labels = marks.partitions
            self._inputs = [f"t{p}" for p in range(transactions)]
            self._inputs += [f"l{p}" for p in range(labels)]
        reached, bound = self._reached, self._clock.bound_ms()
        for key, (time_ms, idle) in marks.reached.items():
            known = reached.get(key)
            time_ms = NO_TIME if time_ms > bound else time_ms  # another host's clock ahead
            reached[key] = (time_ms if known is None else max(time_ms, known[0]), idle)
        oldest: int | None = None
        newest = NO_TIME
        for key in self._inputs:
            mark = reached.get(key)
            if mark is None:
                return  # an input no router has spoken of yet
            time_ms, idle = mark
            if not idle and (oldest is None or time_ms < oldest):
                oldest = time_ms
            newest = max(newest, time_ms)
        watermark_ms = newest if oldest is None else oldest
        if watermark_ms >= 0:
            self.watermark_ms = max(self.watermark_ms, watermark_ms)
            self.advance(watermark_ms // self.day_ms)

    def advance(self, day: int) -> None:
        self.watermark_day = max(self.watermark_day, day)

    def advance_to(self, time_ms: int) -> None:
        """Move the watermark to the day of `time_ms` (a stream's own time, in order), unless it
        is past the bound."""
        if time_ms <= self._clock.bound_ms():
            self.advance(time_ms // self.day_ms)

    def bound_ms(self) -> int:
        """The newest event time taken as it is (the wall clock plus the allowed skew)."""
        return self._clock.bound_ms()

    def stale(self, day: int) -> bool:
        """Whether `day` is older than every window as of the watermark."""
        return self.watermark_day != NO_DAY and day < self.watermark_day - HORIZON_DAYS

    def idle_since(self, newest_day: int) -> bool:
        """Whether a terminal whose newest day is `newest_day` is idle: no window reads any of
        its days again, as of the watermark (its features are neutral from now on)."""
        return self.stale(newest_day)
