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
  once the worker's clock is PUBLISH_WITHIN_DAYS past their day (terminals/unpublished.py, the
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

The clock (`TerminalClock`, terminals/table_clock.py, one per table partition) says what is
stale and which terminals are idle. It moves only with what every input has reached: the
minimum, over every partition of the transactions and labels topics, of the time the router has
read it up to (a label's report time), as the routers' marks say (`InputMarks`,
terminals/order.py); an idle input (read to its end) holds it back no longer, and once every
input is idle it is the newest of them. The router routes in that order, so an event is judged
against the time every input had reached when it was routed, as in a live run: a label counts by
its report time against the transactions it refers to, and is never stale because another input
was read ahead. Never with an event's own time: a clock moved by whichever input is read first
(the small labels topic, read to its end while a backlog of transactions is at its first days)
made every older transaction stale.

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

from collections import Counter
from typing import NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt

from contracts.record_format import FIRST_FORMAT, FORMAT_FIELD, check_format
from contracts.terminal_risk import DELAY_DAYS, HORIZON_DAYS, RISK_WINDOWS_DAYS
from scorer.terminal_risk import TerminalRisk
from terminals.events import TRANSACTION, WORKERS, TerminalEvent, TransactionRun
from terminals.table_clock import NO_DAY, TerminalClock

#: The table value's format (contracts/record_format.py).
FORMAT = 1
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


class RunApplied(NamedTuple):
    """What applying a run of transactions did (`TerminalState.apply_run`): its transactions by
    result, and what `Applied` says of one, over all of them."""

    counted: int = 0
    duplicate: int = 0
    stale: int = 0
    #: Of those counted or stale: their time was past the clock's bound.
    clamped: int = 0
    changed: bool = False
    publish: bool = False
    #: The oldest day a transaction of it counted on (stale ones too), NO_DAY when none.
    oldest_day: int = NO_DAY


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

    def apply_run(self, run: TransactionRun, clock: TerminalClock) -> RunApplied:
        """Count a run of this terminal's transactions (the combiner, terminals/events.py): the
        same counts, day, positions, results and `publish` as `apply` on each of them in their
        order, counted a day at a time. A transaction at or below the terminal's position in
        its input partition was counted before (a batch routed again) and is skipped."""
        positions = self.positions
        reached: dict[int, int] = {}  # per input partition of the run, the offset counted to
        times: list[int] = []
        for partition, offset, time_ms in zip(
            run.partitions, run.offsets, run.event_times, strict=True
        ):
            counted_to = reached.get(partition)
            if counted_to is None:
                counted_to = positions.get(f"{TRANSACTION}{partition}", -1)
            if offset > counted_to:
                reached[partition] = offset
                times.append(time_ms)
        duplicate = len(run.offsets) - len(times)
        if not times:
            return RunApplied(duplicate=duplicate)
        if max(times) > clock.bound_ms():  # rare: `apply` counts such a time on another day
            return self._apply_each(run, clock)
        for partition, offset in reached.items():
            positions[f"{TRANSACTION}{partition}"] = offset
        day_ms, as_of = clock.day_ms, self.as_of_day
        days = [time_ms // day_ms for time_ms in times]
        oldest = min(days)
        watermark = clock.watermark_day
        stale_below = watermark - HORIZON_DAYS if watermark != NO_DAY else NO_DAY
        counted = [day for day in days if day >= stale_below] if oldest < stale_below else days
        if not counted:
            return RunApplied(0, duplicate, len(days), 0, True, False, oldest)
        first, newest = min(counted), max(counted)
        # Published at once only if one is late (on a day a window reads), as `apply` judges
        # each: none can be unless one is DELAY_DAYS behind the newest day.
        publish = first <= max(as_of, newest) - DELAY_DAYS and self._late(counted)
        if first == newest:  # the common case: one day
            self.risk.add_transaction(first, len(counted))
        else:
            for day, count in Counter(counted).items():
                self.risk.add_transaction(day, count)
        if newest > as_of:
            self.as_of_day = newest
            self._forget_old_labels()
        stale = len(days) - len(counted)
        return RunApplied(len(counted), duplicate, stale, 0, True, publish, oldest)

    def _late(self, days: list[int]) -> bool:
        """Whether one of `days`, counted in their order from the current day on, lands on a
        day some window reads (as `apply`'s `publish` says of a transaction)."""
        as_of = self.as_of_day
        for day in days:
            if day > as_of:
                as_of = day  # on its terminal's newest day: no window reads it yet
            elif as_of - DELAY_DAYS - _LONGEST_WINDOW_DAYS < day <= as_of - DELAY_DAYS:
                return True
        return False

    def _apply_each(self, run: TransactionRun, clock: TerminalClock) -> RunApplied:
        """`apply_run` one transaction at a time."""
        results = dict.fromkeys(RESULTS, 0)
        clamped, changed, publish, oldest = 0, False, False, NO_DAY
        for partition, offset, time_ms in zip(
            run.partitions, run.offsets, run.event_times, strict=True
        ):
            applied = self.apply(TerminalEvent(TRANSACTION, partition, offset, time_ms), clock)
            results[applied.result] += 1
            clamped += applied.clamped
            changed |= applied.changed
            publish |= applied.publish
            if applied.day != NO_DAY and (oldest == NO_DAY or applied.day < oldest):
                oldest = applied.day
        return RunApplied(
            results[COUNTED], results[DUPLICATE], results[STALE], clamped, changed, publish, oldest
        )

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
