"""One terminal's entry in the worker's table, and when its published risk changes.

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
- `published`: the features last published, so a terminal whose features did not change (its
  day advanced, but no window gained or lost a count) is not published again.
- `positions`: per input partition ("t3": transactions partition 3, "l0": labels partition 0),
  the offset of the last record counted. An input record read again (a replay after a crash or
  a rebalance, which re-sends it to the re-keyed topic) has an offset at or below it and is not
  counted twice. Offsets grow within a partition, and one partition's records of a terminal
  reach the table in that order (a partition is routed by one agent at a time, and faust flushes
  what it sent before a rebalance hands the partition on). The positions live in the same table
  value (one changelog record) as the counts they describe, so a restart recovers both together.

Serialized for the table's changelog as JSON: `{"as_of_day", "positions", "published", "risk"}`
with `risk` the `TerminalRisk.to_bytes()` document.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt

from scorer.terminal_risk import DELAY_DAYS, RISK_WINDOWS_DAYS, TerminalRisk
from terminals.events import TRANSACTION, TerminalEvent

#: `as_of_day` of a terminal that has seen nothing yet.
NO_DAY = -1
_LONGEST_WINDOW_DAYS = max(RISK_WINDOWS_DAYS)


class Applied(NamedTuple):
    """What applying one event did."""

    #: False: the event was counted before (its input offset is not past the last counted).
    counted: bool
    #: The published features changed (or the day advanced): publish the terminal's risk.
    publish: bool


class _Stored(msgspec.Struct, frozen=True):
    as_of_day: int
    positions: dict[str, int]
    risk: msgspec.Raw
    published: list[float] | None = None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(_Stored)


class TerminalState:
    """One terminal's counts, current day and input positions: the worker's table value."""

    __slots__ = ("as_of_day", "positions", "published", "risk")

    def __init__(self) -> None:
        self.risk = TerminalRisk()
        self.as_of_day = NO_DAY
        self.positions: dict[str, int] = {}
        self.published: list[float] | None = None

    def apply(self, event: TerminalEvent, day_ms: int) -> Applied:
        """Count one transaction or label of this terminal, once.

        A transaction counts on its day; a fraud label adds a confirmed fraud on its
        transaction's day, a legitimate one changes no count. The terminal's day advances to the
        transaction's day, or to the day a label was reported. `publish` is True when the day
        advanced or the event landed in a day some window reads as of the current day: the
        features may have changed (`changed_features` tells).
        """
        position = f"{event.source}{event.partition}"
        if event.offset <= self.positions.get(position, -1):
            return Applied(counted=False, publish=False)
        self.positions[position] = event.offset
        day = event.event_time // day_ms
        if event.source == TRANSACTION:
            self.risk.add_transaction(day)
            changed_counts, today = True, day
        else:
            if event.fraud:
                self.risk.add_label(day, True)
            changed_counts, today = event.fraud, event.reported_at // day_ms
        advanced = today > self.as_of_day
        if advanced:
            self.as_of_day = today
        newest_read = self.as_of_day - DELAY_DAYS
        in_window = newest_read - _LONGEST_WINDOW_DAYS < day <= newest_read
        return Applied(counted=True, publish=advanced or (changed_counts and in_window))

    def features(self) -> npt.NDArray[np.float32]:
        """TERMINAL_FEATURE_NAMES as of `as_of_day`."""
        return self.risk.features(max(self.as_of_day, 0))

    def changed_features(self) -> npt.NDArray[np.float32] | None:
        """The features as of `as_of_day` if they differ from the last published ones (which
        they then become), else None: the record to publish, if any."""
        features = self.features()
        values = features.tolist()
        if values == self.published:
            return None
        self.published = values
        return features

    def to_bytes(self) -> bytes:
        """The table value (JSON)."""
        stored = _Stored(
            self.as_of_day, self.positions, msgspec.Raw(self.risk.to_bytes()), self.published
        )
        return _encoder.encode(stored)

    @classmethod
    def from_bytes(cls, value: bytes) -> TerminalState:
        """The inverse of `to_bytes`; ValueError for anything it did not write."""
        try:
            stored = _decoder.decode(value)
        except msgspec.MsgspecError as exc:
            raise ValueError(f"not a terminal state: {exc}") from exc
        state = cls()
        state.risk = TerminalRisk.from_bytes(bytes(stored.risk))
        state.as_of_day = stored.as_of_day
        state.positions = dict(stored.positions)
        state.published = stored.published
        return state
