"""Backpressure: pause fetching while the replica holds too much, resume once it has drained.

The bound is on records held (consumed, not yet committed). At the high-water mark every
assigned partition is paused; at the low-water mark they resume. The loop keeps polling while
paused, so the group never evicts the replica for silence (`max.poll.interval.ms`). Pausing
also purges librdkafka's pre-fetch queue for those partitions, so memory stays flat.

librdkafka keeps an application's pause flag on a partition across a rebalance, so the state
of every newly assigned partition is set explicitly in the assignment callback.
"""

from __future__ import annotations

import logging

from confluent_kafka import Consumer, TopicPartition

from stream import metrics
from stream.offsets import PartitionKey

log = logging.getLogger(__name__)

#: Resume when held records fall to this share of the bound: hysteresis, so one record more or
#: less does not flip the state on every poll.
RESUME_FRACTION = 0.5


class FlowControl:
    """Owns the pause state of the consumer's partitions."""

    def __init__(self, consumer: Consumer, max_in_flight_records: int) -> None:
        self._consumer = consumer
        self.high_water = max_in_flight_records
        self.low_water = int(max_in_flight_records * RESUME_FRACTION)
        self._assigned: set[PartitionKey] = set()
        self._paused = False
        self._reason = ""

    @property
    def paused(self) -> bool:
        return self._paused

    def update(self, in_flight: int, blocked_by: str | None) -> None:
        """Re-evaluate: `blocked_by` names a condition that forbids fetching (hand-off full,
        deliveries stalled), or is None."""
        if not self._paused and (blocked_by is not None or in_flight >= self.high_water):
            self._set(True, blocked_by or f"{in_flight} records in flight")
        elif self._paused and blocked_by is None and in_flight <= self.low_water:
            self._set(False, "")

    def on_assign(self, partitions: list[TopicPartition]) -> None:
        self._assigned.update((p.topic, p.partition) for p in partitions)
        if not partitions:
            return
        if self._paused:
            self._consumer.pause(partitions)
        else:
            self._consumer.resume(partitions)
        metrics.set_paused_partitions(len(self._assigned) if self._paused else 0)

    def on_revoke(self, partitions: list[TopicPartition]) -> None:
        self._assigned.difference_update((p.topic, p.partition) for p in partitions)
        metrics.set_paused_partitions(len(self._assigned) if self._paused else 0)

    def _set(self, paused: bool, reason: str) -> None:
        partitions = [TopicPartition(t, p) for t, p in sorted(self._assigned)]
        if partitions:
            (self._consumer.pause if paused else self._consumer.resume)(partitions)
        self._paused = paused
        if paused:
            log.info("pausing %s partitions: %s", len(partitions), reason)
        else:
            log.info("resuming %s partitions", len(partitions))
        metrics.set_paused_partitions(len(partitions) if paused else 0)
