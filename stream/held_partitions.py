"""Partitions held back while their next record cannot be decoded for a cause that may pass (the
Schema Registry down or refusing, `contracts.input_formats.RegistryUnavailableError`).

Such a record is neither decided nor dead-lettered: its partition goes back to it (a seek, which
also drops what librdkafka pre-fetched after it) and is paused for a backoff that doubles on
every failure in a row, from the retry backoff up to its maximum; then it is resumed and the
record read again. Only that partition waits: the others go on, and so does the loop (which
keeps the replica in its group). The partition's records after it are not tracked, so nothing
past it commits. Backpressure (`stream/flow.py`) may pause and resume every partition
meanwhile: a hold that ends while fetching is paused simply ends (fetching resumes them all),
and a held partition resumed early reads its record again and is held again, a backoff longer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, Message, TopicPartition

from contracts.offsets import PartitionKey, position_of
from stream.metrics import ServiceMetrics
from stream.resume import resume

log = logging.getLogger(__name__)


class HeldPartitions:
    """The partitions waiting for a transient decoding failure to pass."""

    def __init__(
        self,
        consumer: Consumer,
        backoff_s: float,
        backoff_max_s: float,
        metrics: ServiceMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._consumer = consumer
        self._metrics = metrics
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._clock = clock
        #: partition → (when to read it again, the backoff it waited)
        self._until: dict[PartitionKey, tuple[float, float]] = {}
        #: partition → the backoff of its last hold, until a record of it decodes again
        self._last_backoff: dict[PartitionKey, float] = {}

    def __contains__(self, key: PartitionKey) -> bool:
        return key in self._until

    def __len__(self) -> int:
        return len(self._until)

    def hold(self, message: Message, why: Exception) -> None:
        """Go back to `message` and pause its partition for the next backoff."""
        key, offset = position_of(message)
        topic, partition = key
        previous = self._last_backoff.get(key)
        backoff = self._backoff_s if previous is None else min(previous * 2, self._backoff_max_s)
        self._last_backoff[key] = backoff
        self._until[key] = (self._clock() + backoff, backoff)
        self._metrics.set_held_partitions(len(self._until))
        where = TopicPartition(topic, partition, offset)
        self._consumer.pause([where])
        self._consumer.seek(where)
        log.warning(
            "holding topic=%s partition=%s at offset=%s for %.1fs: %s",
            topic,
            partition,
            offset,
            backoff,
            why,
        )

    def decoded(self, key: PartitionKey) -> None:
        """A record of the partition decoded: its next failure starts from the first backoff.
        Called per record: a dict lookup only while some partition has failed."""
        if self._last_backoff:
            self._last_backoff.pop(key, None)

    def release_due(self, fetching_paused: bool) -> None:
        """Resume the partitions whose backoff is over (unless backpressure holds them all)."""
        now = self._clock()
        due = [key for key, (until, _) in self._until.items() if until <= now]
        for key in due:
            del self._until[key]
        if due:
            self._metrics.set_held_partitions(len(self._until))
        if due and not fetching_paused:
            resume(self._consumer, [TopicPartition(topic, partition) for topic, partition in due])

    def forget(self, keys: Iterable[PartitionKey]) -> None:
        """Partitions that went: their next owner reads them."""
        for key in keys:
            self._until.pop(key, None)
            self._last_backoff.pop(key, None)
        self._metrics.set_held_partitions(len(self._until))
