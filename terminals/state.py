"""One terminal's entry in the worker's table, the worker's event-time clock, and when a
terminal's published record (its features and daily buckets) changes.

The entry wraps `scorer.terminal_risk.TerminalRisk`, whose 38 daily buckets of (transactions,
confirmed frauds) are the 1-, 7- and 30-day windows with the handbook's delay: on day d, window w
covers days d - DELAY_DAYS - w + 1 … d - DELAY_DAYS, so the buckets from d - 37 to d are all any
window reads, and each bucket is tagged with its day (reused for a newer day without a clean-up
pass). One keyed value per terminal is a better fit than faust's windowed tables: the three
windows share the buckets, the delay is part of the arithmetic, and the scorer and training
already run the same code.

Around the buckets the entry keeps:
- `as_of_day`: the terminal's current day, the latest day of any of its transactions or of a
  label's report; the published features are those as of this day.
- `published`: what was last published (the day and the buckets), so a terminal is published
  again only when that changed. The record carries the buckets, and the scorer computes each
  transaction's features from them as of the transaction's own day, as training does. A day's
  transaction counts are first read by a window DELAY_DAYS later, so they are published when
  they must be, not when they happen: a counted label (the fresh-label windows read it at once)
  and a late transaction on a day some window reads now are published at once; other counts
  once the worker's clock is PUBLISH_WITHIN_DAYS past their day (`publication_due`, the
  worker's day close), a day before any window reads them. A terminal that sees a transaction
  every day is then published about once a week instead of every day (in the handbook's world,
  where a terminal sees about one a day, that was a record per transaction). A terminal with no
  count any window will read, now or later, is not published at all (the scorer's default for
  a terminal it does not know), and one that comes to that state again is published as a
  tombstone.
- `positions`: per input partition ("t3": transactions partition 3, "l0": labels partition 0),
  the offset of the last record counted. An input record read again (a replay after a crash or
  a rebalance, which re-sends it to the re-keyed topic) has an offset at or below it and is not
  counted twice. Offsets grow within a partition, and one partition's records of a terminal
  reach the table in that order. The positions live in the same table value (one changelog
  record) as the counts they describe, so a restart recovers both together.
- `labels`: the labelled transactions whose label said fraud at some point, within the buckets,
  each with its day and the outcome in force. A label of a transaction is counted once, whatever
  offset it comes at (a producer retry, a replayed labels topic, two systems reporting the same
  chargeback): the same outcome again changes nothing, the other outcome corrects it (fraud →
  legitimate takes the fraud back). The later label in the labels topic is in force; labels are
  keyed by card, so those of one transaction keep their order. Only frauds are remembered: a
  legitimate label of a transaction never reported as fraud changes no count.

The clock (`TerminalClock`, one per table partition) says what is stale and which terminals are
idle. It moves only with what every input has reached: the minimum, over every partition of the
transactions and labels topics, of the time the router has read it up to (a label's report
time), as the routers' marks say (`InputMarks`, terminals/order.py); an idle input (read to its
end) holds it back no longer, and once every input is idle it is the newest of them. The router
routes in that order, so an event is judged against the time every input had reached when it
was routed, as in a live run: a label counts by its report time against the transactions it
refers to, and is never stale because another input was read ahead. Never with an event's own
time: a clock moved by whichever input is read first (the small labels topic, read to its end
while a backlog of transactions is at its first days) made every older transaction stale.

Event time is bounded (`contracts/event_time.py`): a time past the wall clock plus the allowed
skew counts as the clock's day and never moves it (the router gives it no mark either), so one
record dated in the future cannot move a terminal's day (which would empty every window of it)
nor take a bucket for a day that will not come for years; a day older than every window as of
the clock's day changes nothing.

Serialized for the table's changelog as JSON: `{"as_of_day", "positions", "published", "risk",
"labels", "format_version"}` with `risk` the `TerminalRisk.to_bytes()` document, and the value's
format (`FORMAT`, contracts/record_format.py; absent from release 0.1.0's values: format 1). A
value of a newer format is refused (`from_bytes`): its entry is skipped, never read as this
release's.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt

from contracts.event_time import EventClock
from contracts.record_format import FIRST_FORMAT, FORMAT_FIELD, check_format
from contracts.terminal_risk import DELAY_DAYS, HORIZON_DAYS, RISK_WINDOWS_DAYS
from scorer.terminal_risk import TerminalRisk
from terminals.events import TRANSACTION, WORKERS, InputMarks, TerminalEvent

#: The table value's format (contracts/record_format.py).
FORMAT = 1
#: `as_of_day` of a terminal that has seen nothing yet.
NO_DAY = -1
#: An input's time before it has shown one (as terminals/order.py says it).
NO_TIME = -1
#: Counts not published at once are published once the worker's clock is this many days past
#: their day: a day before the first window reads them (`publication_due`).
PUBLISH_WITHIN_DAYS = DELAY_DAYS - 1
_LONGEST_WINDOW_DAYS = max(RISK_WINDOWS_DAYS)

#: What applying an event did (`Applied.result`, the worker's metric label).
COUNTED = "counted"  # a new transaction or label, counted
DUPLICATE = "duplicate"  # its input record was counted before (read again)
REPEATED = "repeated"  # a label with the outcome already in force for its transaction
CORRECTED = "corrected"  # a label that changed its transaction's outcome
STALE = "stale"  # a day older than every window as of the worker's newest day
RESULTS = (COUNTED, DUPLICATE, REPEATED, CORRECTED, STALE)


class Applied(NamedTuple):
    """What applying one event did."""

    #: One of RESULTS.
    result: str
    #: The entry changed (counts, day or positions): write it to the table.
    changed: bool
    #: The published record must change now (a label was counted, or a transaction on a day
    #: some window reads): see `take_publication`.
    publish: bool
    #: The event's time was past the clock's bound and counted at it.
    clamped: bool = False
    #: The day it counted on (a label's: its transaction's day), NO_DAY when it counted on none.
    day: int = NO_DAY


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

    def stale(self, day: int) -> bool:
        """Whether `day` is older than every window as of the watermark."""
        return self.watermark_day != NO_DAY and day < self.watermark_day - HORIZON_DAYS

    def idle_since(self, newest_day: int) -> bool:
        """Whether a terminal whose newest day is `newest_day` is idle: no window reads any of
        its days again, as of the watermark (its features are neutral from now on)."""
        return self.stale(newest_day)


_Ints = npt.NDArray[np.int64]


class Publication(NamedTuple):
    """What a round publishes of an entry (`TerminalState.take_publication`): its day and
    copies of its buckets (days [38], counts [38, 2]); no buckets: a tombstone."""

    as_of_day: int
    buckets: tuple[_Ints, _Ints] | None


class _Stored(msgspec.Struct, frozen=True):
    as_of_day: int
    positions: dict[str, int]
    risk: msgspec.Raw
    published: list[float] | None = None
    #: transaction_id → [day, fraud] (older values have no labels: nothing remembered).
    labels: dict[str, tuple[int, bool]] = {}
    #: Absent from release 0.1.0's values (format 1), whose decoder ignores it (a field it does
    #: not know), so it still reads what this release writes.
    format_version: int = FIRST_FORMAT


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(_Stored)
#: How the format's refusals name the value.
RECORD = "features-worker table"


class TerminalState:
    """One terminal's counts, current day, input positions and fraud labels: the table value."""

    __slots__ = ("as_of_day", "labels", "positions", "published", "risk")

    def __init__(self) -> None:
        self.risk = TerminalRisk()
        self.as_of_day = NO_DAY
        self.positions: dict[str, int] = {}
        self.published: list[float] | None = None
        self.labels: dict[str, tuple[int, bool]] = {}

    def apply(self, event: TerminalEvent, clock: TerminalClock) -> Applied:
        """Count one transaction or label of this terminal, once (see the module docstring).

        A transaction counts on its day; a fraud label adds a confirmed fraud on its
        transaction's day, a correction takes it back. The terminal's day advances to the
        transaction's day, or to the day a label was reported. `publish` is True when a label
        changed a count, or a transaction was counted on a day some window reads as of the
        current day; other changes wait for `publication_due`.
        """
        position = f"{event.source}{event.partition}"
        if event.offset <= self.positions.get(position, -1):
            return Applied(DUPLICATE, changed=False, publish=False)
        self.positions[position] = event.offset
        day, clamped = clock.day(event.event_time, self.as_of_day)
        if event.source == TRANSACTION:
            today = day
        else:
            today, late = clock.day(event.reported_at, self.as_of_day)
            clamped |= late
        if clock.stale(day):
            return Applied(STALE, changed=True, publish=False, clamped=clamped, day=day)
        if event.source == TRANSACTION:
            self.risk.add_transaction(day)
            result, counts_changed = COUNTED, True
        else:
            result, counts_changed, day = self._label(event, day)
        advanced = today > self.as_of_day
        if advanced:
            self.as_of_day = today
            self._forget_old_labels()
        newest_read = self.as_of_day - DELAY_DAYS
        in_window = newest_read - _LONGEST_WINDOW_DAYS < day <= newest_read
        publish = counts_changed and (in_window or event.source != TRANSACTION)
        return Applied(result, changed=True, publish=publish, clamped=clamped, day=day)

    def _label(self, event: TerminalEvent, day: int) -> tuple[str, bool, int]:
        """Apply a label: (result, whether a count changed, the day it counted on)."""
        known = self.labels.get(event.transaction_id)
        if known is None:
            if not event.fraud:
                return COUNTED, False, day  # legitimate: every transaction counts already
            self.risk.add_label(day, True)
            self.labels[event.transaction_id] = (day, True)
            return COUNTED, True, day
        known_day, known_fraud = known
        if known_fraud == event.fraud:
            return REPEATED, False, known_day
        if event.fraud:
            self.risk.add_label(known_day, True)
        else:
            self.risk.retract_label(known_day)
        self.labels[event.transaction_id] = (known_day, event.fraud)
        return CORRECTED, True, known_day

    def _forget_old_labels(self) -> None:
        """Labels of days no window reads any more cannot change a count: forget them."""
        oldest = self.as_of_day - HORIZON_DAYS
        old = [tx for tx, (day, _) in self.labels.items() if day < oldest]
        for transaction_id in old:
            del self.labels[transaction_id]

    @property
    def newest_day(self) -> int:
        """The newest day of any of its transactions, labels or reports (NO_DAY: none)."""
        return max(self.risk.newest_day(), self.as_of_day)

    def features(self) -> npt.NDArray[np.float32]:
        """TERMINAL_FEATURE_NAMES as of `as_of_day`."""
        return self.risk.features(max(self.as_of_day, 0))

    def take_publication(self) -> Publication | None:
        """What to publish now, which then counts as published: the day and the buckets when
        they differ from the last published ones; a tombstone (no buckets) when no count is
        left that a window will read, after having been published (such a terminal is never
        published as such); None when there is nothing to publish. The features go with the
        buckets (`terminals/publication.py`, a round's at once)."""
        days, counts = self.risk.buckets()
        current = self._publication(days, counts)
        if current is None:
            if self.published is None:
                return None
            self.published = None
            return Publication(self.as_of_day, None)
        if current == self.published:
            return None
        self.published = current
        return Publication(self.as_of_day, (days, counts))

    def publication_lost(self) -> None:
        """The broker did not acknowledge what `take_publication` gave: what the topic holds
        of this entry is unknown, so the next `take_publication` sends it again, as it is then
        (its record, or a tombstone when no count is left)."""
        self.published = []

    def unpublished(self) -> bool:
        """Whether the day or the buckets differ from what was last published (the worker
        publishes such a terminal once `publication_due`: `take_publication`)."""
        return self._publication(*self.risk.buckets()) != self.published

    def _publication(self, days: _Ints, counts: _Ints) -> list[float] | None:
        """What a publication now would say (the day and the buckets), or None when no count
        is left that a window will read."""
        if not counts[days >= self.as_of_day - HORIZON_DAYS].any():
            return None
        buckets = np.concatenate((days, counts.reshape(-1))).astype(np.float64).tolist()
        return [float(self.as_of_day), *buckets]

    def to_bytes(self) -> bytes:
        """The table value (JSON)."""
        stored = _Stored(
            self.as_of_day,
            self.positions,
            msgspec.Raw(self.risk.to_bytes()),
            self.published,
            self.labels,
            FORMAT,
        )
        return _encoder.encode(stored)

    @classmethod
    def from_bytes(cls, value: bytes) -> TerminalState:
        """The inverse of `to_bytes`; ValueError for anything it did not write, and for a
        value of a newer format than FORMAT (a newer release wrote it)."""
        try:
            stored = _decoder.decode(value)
        except msgspec.MsgspecError as exc:
            _check_format_of_unreadable(value)
            raise ValueError(f"not a terminal state: {exc}") from exc
        if stored.format_version != FORMAT:
            check_format(stored.format_version, RECORD, FORMAT, WORKERS)
        state = cls()
        state.risk = TerminalRisk.from_bytes(bytes(stored.risk))
        state.as_of_day = stored.as_of_day
        state.positions = dict(stored.positions)
        state.published = stored.published
        state.labels = dict(stored.labels)
        return state


def _check_format_of_unreadable(value: bytes) -> None:
    """A value this release cannot decode may be a newer format's: then the error names it."""
    try:
        raw = msgspec.json.decode(value)
    except msgspec.MsgspecError:
        return
    if isinstance(raw, dict) and FORMAT_FIELD in raw:
        check_format(raw[FORMAT_FIELD], RECORD, FORMAT, WORKERS)
