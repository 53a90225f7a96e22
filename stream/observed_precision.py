"""Observed precision: of the transactions a replica flagged, how many turned out fraud, counted
as their labels arrive (FRAUD_OBSERVED_PRECISION=on).

The replica remembers each transaction it flags (review or decline): its id and event time,
at most `max_pending` at once (beyond that a flagged transaction is
not followed, and `fraud_flagged_outcomes_untracked_total` says so; the estimate stays unbiased,
on fewer). A reader follows the labels topic from its end, since only labels of decisions made
since the start can match. Each label marks a remembered transaction fraud or legitimate, and
moves the label clock: the newest `reported_at` seen, never past the host's clock plus the
allowed skew (`EventClock`), so one future-dated label cannot close every window at once.

A flagged transaction matures when the label clock passes its event time by the maturity
(`FRAUD_OBSERVED_PRECISION_MATURITY_DAYS`, history time: divided by `FRAUD_HISTORY_TIME_SCALE`
like the card windows). It is then counted once in `fraud_flagged_outcomes_total{outcome}`:
`fraud` (a fraud label arrived by then), `legit` (a legitimate one did) or `unreported` (none:
a fraud reported later than the maturity counts as a false positive here, so set the maturity
past most of your label delays, `fraud_features_label_delay_seconds`). Observed precision over
a window is fraud / (fraud + legit + unreported); each replica counts what it flagged, so the
sums over replicas give the service's.

Matured transactions are taken from a heap ordered by event time, not from the order they were
flagged in: one flagged transaction dated far ahead (a valid one may say 9999-12-31) would
otherwise hold back every one flagged after it. Its event time also counts only up to the host's
clock plus the allowed skew (`EventClock`, the rule of the state's clocks), so it matures too.

The labels decide nothing, so a replica never waits for them: a labels topic that cannot be read
leaves it ready, and shows in `fraud_topic_reader_read_age_seconds{reader="labels"}` (the
reader tries again, and starts a failed consumer again, as every topic reader does).
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from confluent_kafka import OFFSET_END, Message

from contracts.event_time import EventClock
from contracts.label import decode_label
from plumbing.errors import RecordError
from stream.compacted_topic import CompactedTopicReader
from stream.metrics import ServiceMetrics

log = logging.getLogger(__name__)

MS_PER_DAY = 86_400_000


class ObservedPrecision:
    """Follows flagged transactions until their labels have had time to arrive."""

    def __init__(
        self,
        metrics: ServiceMetrics,
        *,
        maturity_days: float,
        time_scale: float,
        max_pending: int,
        clock: EventClock,
        kafka: Mapping[str, Any] | None = None,
        topic: str | None = None,
    ) -> None:
        """`kafka` and `topic`: the labels topic to follow (None: labels come by `apply`
        alone)."""
        self._metrics = metrics
        self._maturity_ms = int(maturity_days * MS_PER_DAY / time_scale)
        self._max_pending = max_pending
        self._clock = clock
        #: Flagged transaction id -> (event time, the label's outcome so far, None: none yet).
        self._pending: dict[str, tuple[int, bool | None]] = {}
        #: (event time, id) of every pending transaction: the next to mature on top.
        self._maturing: list[tuple[int, str]] = []
        self._label_clock_ms: int | None = None
        self._lock = threading.Lock()
        self._reader = (
            None
            if topic is None
            else CompactedTopicReader(
                dict(kafka or {}),
                topic,
                self.apply,
                name="labels",
                metrics=metrics,
                start_at=OFFSET_END,
            )
        )

    def start(self) -> None:
        if self._reader is not None:
            self._reader.start()

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()

    def note_flagged(self, ids: Sequence[str], event_time: npt.NDArray[np.int64]) -> None:
        """Remember the transactions of a batch that were flagged (on the scoring thread)."""
        untracked = 0
        bound_ms = self._clock.bound_ms()
        with self._lock:
            pending, maturing = self._pending, self._maturing
            for transaction_id, at in zip(ids, event_time.tolist(), strict=True):
                if transaction_id in pending:
                    continue  # decided again (a redelivery, a rewind): still one transaction
                if len(pending) >= self._max_pending:
                    untracked += 1
                    continue
                at = min(at, bound_ms)
                pending[transaction_id] = (at, None)
                heapq.heappush(maturing, (at, transaction_id))
            size = len(pending)
        self._metrics.set_flagged_pending(size)
        if untracked:
            self._metrics.count_flagged_untracked(untracked)

    def apply(self, message: Message) -> None:
        """One record of the labels topic (on the reader's thread): a bad one is skipped."""
        try:
            label = decode_label(message.value())
        except RecordError as exc:
            log.warning(
                "labels: skipping the record at partition %s offset %s: %s",
                message.partition(),
                message.offset(),
                exc,
            )
            return
        self.label(label.transaction_id, label.fraud, label.reported_at)

    def label(self, transaction_id: str, fraud: bool, reported_at: int) -> None:
        """A confirmed outcome: mark the transaction if it was flagged here, move the label
        clock, and count what matured."""
        matured = {"fraud": 0, "legit": 0, "unreported": 0}
        with self._lock:
            found = self._pending.get(transaction_id)
            if found is not None and found[1] is not True:  # a fraud label is not undone
                self._pending[transaction_id] = (found[0], fraud)
            trusted = min(reported_at, self._clock.bound_ms())
            if self._label_clock_ms is None or trusted > self._label_clock_ms:
                self._label_clock_ms = trusted
            horizon = self._label_clock_ms - self._maturity_ms
            maturing = self._maturing
            while maturing and maturing[0][0] <= horizon:
                _, matured_id = heapq.heappop(maturing)
                _, fraud_so_far = self._pending.pop(matured_id)
                kind = (
                    "unreported" if fraud_so_far is None else "fraud" if fraud_so_far else "legit"
                )
                matured[kind] += 1
            size = len(self._pending)
        self._metrics.set_flagged_pending(size)
        for kind, n in matured.items():
            if n:
                self._metrics.count_flagged_outcomes(kind, n)
