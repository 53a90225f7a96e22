"""Backpressure: pause fetching while the replica holds too much, resume once it has drained.

Two bounds on what is held (consumed, outcome not yet acknowledged): records, and their key and
value bytes (valid records may carry unknown fields up to the broker's size limit, so a record
count alone does not bound memory). At either high-water mark every assigned partition is
paused; once both are at their low-water marks they resume. Each fetch asks for no more
records than fit under both bounds (bytes at the running average record size), so a fetch
overshoots the byte bound by a record or so when sizes change. librdkafka's own pre-fetch queue
is bounded apart from this (`queued.max.messages.kbytes`). The loop keeps polling while
paused, so the group never evicts the replica for silence (`max.poll.interval.ms`). Pausing
also purges librdkafka's pre-fetch queue for those partitions, so memory stays flat. A resume
wakes the broker threads that fetch them (`stream/resume.py`): with every partition paused,
librdkafka would otherwise fetch again only up to a second later. librdkafka itself pauses
every partition during a rebalance and resumes the ones kept once the assignment callback has
returned, so the partitions fetching are woken once more, shortly after each assignment.

librdkafka keeps an application's pause flag on a partition across a rebalance, so the state
of every newly assigned partition is set explicitly in the assignment callback. A partition
assigned `withheld` (its card state still restoring, `stream/restores.py`) stays paused
whatever the bounds say until it is released.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, TopicPartition

from contracts.offsets import PartitionKey
from stream.metrics import ServiceMetrics
from stream.resume import resume, wake

log = logging.getLogger(__name__)

#: Resume when held records fall to this share of the bound: hysteresis, so one record more or
#: less does not flip the state on every poll.
RESUME_FRACTION = 0.5
#: A first guess at a record's size (a transaction's JSON is a few hundred bytes), and how fast
#: the running estimate comes down after larger records (exponential smoothing, per fetch).
INITIAL_AVERAGE_SIZE_BYTES = 512.0
SIZE_SMOOTHING = 0.2
#: librdkafka resumes the partitions a rebalance kept on its main thread after the assignment
#: callback returns (6-12 ms later in fault scenario 6's debug log); a wake-up sent before that
#: is lost, so it is sent this long after the callback.
REBALANCE_WAKE_DELAY_S = 0.05


class FlowControl:
    """Owns the pause state of the consumer's partitions."""

    def __init__(
        self,
        consumer: Consumer,
        max_in_flight_records: int,
        max_in_flight_bytes: int,
        metrics: ServiceMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._consumer = consumer
        self._clock = clock
        self._metrics = metrics
        self.high_water = max_in_flight_records
        self.low_water = int(max_in_flight_records * RESUME_FRACTION)
        self.high_water_bytes = max_in_flight_bytes
        self.low_water_bytes = int(max_in_flight_bytes * RESUME_FRACTION)
        self._assigned: set[PartitionKey] = set()
        #: Assigned partitions kept paused until released, whatever the bounds.
        self._withheld: set[PartitionKey] = set()
        self._paused = False
        self._paused_at_bound = False
        self._average_size = INITIAL_AVERAGE_SIZE_BYTES
        #: When to wake the fetchers after the last rebalance; None once done.
        self._wake_at: float | None = None

    @property
    def paused(self) -> bool:
        return self._paused

    def room(self, in_flight: int, in_flight_bytes: int) -> int:
        """How many more records may be fetched now: under the record bound, and under the
        byte bound at the average size of the records seen so far."""
        records = self.high_water - in_flight
        room_bytes = self.high_water_bytes - in_flight_bytes
        if room_bytes <= 0:
            return 0
        return min(records, max(1, int(room_bytes / self._average_size)))

    def observe(self, records: int, size_bytes: int) -> None:
        """Sizes of records just fetched, for the average that `room` estimates with."""
        if records:
            # Up at once, down slowly: a bound must not trust small records to stay small.
            mean = size_bytes / records
            smoothed = self._average_size + SIZE_SMOOTHING * (mean - self._average_size)
            self._average_size = max(mean, smoothed)

    def update(self, in_flight: int, in_flight_bytes: int, blocked_by: str | None) -> None:
        """Re-evaluate: `blocked_by` names a condition that forbids fetching (outputs failing,
        the scoring thread stuck), or is None.

        Paused at a bound, fetching resumes once records and bytes are both down to their
        low-water marks (hysteresis); paused only for a block, it resumes as soon as the block
        clears while both are under their bounds.
        """
        if self._wake_at is not None and self._clock() >= self._wake_at:
            self._wake_at = None
            if not self._paused:
                wake(self._consumer, self._partitions(self._assigned - self._withheld))
        over = in_flight >= self.high_water or in_flight_bytes >= self.high_water_bytes
        if blocked_by is not None:
            if not self._paused:
                self._set(True, blocked_by)
            self._paused_at_bound = False
        elif not self._paused:
            if over:
                self._set(True, f"{in_flight} records, {in_flight_bytes} bytes in flight")
                self._paused_at_bound = True
        elif self._paused_at_bound or over:
            self._paused_at_bound = True
            if in_flight <= self.low_water and in_flight_bytes <= self.low_water_bytes:
                self._set(False, "")
        else:
            self._set(False, "")

    def on_assign(self, partitions: list[TopicPartition], withheld: bool = False) -> None:
        """Newly assigned partitions: paused or fetching as the others are, or paused until
        `release` if `withheld`."""
        keys = {(p.topic, p.partition) for p in partitions}
        self._assigned.update(keys)
        # The last callback of every rebalance, the partitions kept included.
        self._wake_at = self._clock() + REBALANCE_WAKE_DELAY_S
        if withheld:
            self._withheld.update(keys)
        if not partitions:
            return
        if self._paused or withheld:
            self._consumer.pause(partitions)
        else:
            self._consumer.resume(partitions)  # woken with the others after the callback
        self._metrics.set_paused_partitions(len(self._assigned) if self._paused else 0)

    def release(self, keys: list[PartitionKey]) -> None:
        """Withheld partitions may fetch again (now, unless backpressure pauses them all)."""
        released = [key for key in keys if key in self._withheld]
        self._withheld.difference_update(released)
        if released and not self._paused:
            resume(self._consumer, self._partitions(released))

    def on_revoke(self, partitions: list[TopicPartition]) -> None:
        keys = {(p.topic, p.partition) for p in partitions}
        self._assigned.difference_update(keys)
        self._withheld.difference_update(keys)
        self._metrics.set_paused_partitions(len(self._assigned) if self._paused else 0)

    def _set(self, paused: bool, reason: str) -> None:
        kept = self._assigned if paused else self._assigned - self._withheld
        partitions = self._partitions(kept)
        if partitions and paused:
            self._consumer.pause(partitions)
        elif partitions:
            resume(self._consumer, partitions)
        self._paused = paused
        if paused:
            log.info("pausing %s partitions: %s", len(partitions), reason)
        else:
            log.info("resuming %s partitions", len(partitions))
        self._metrics.set_paused_partitions(len(partitions) if paused else 0)

    @staticmethod
    def _partitions(keys: Iterable[PartitionKey]) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, p in sorted(keys)]
