"""The card-history changelog: the compacted topic the scorer's per-card history is kept durable
in (stream/owned_card_history.py), and how it is read back for a restore.

- The changelog partition is the input partition: a card's state lives where its transactions
  are, and moves with them on a rebalance.
- A restore reads with isolation.level=read_committed, so it sees only what committed, and stops
  at the end the partition had when it started: a replica that still believes it owns a
  partition (a zombie reloading after an abort) must not chase the new owner's writes.
- A tail read (a warm return) from an offset the partition no longer holds says so
  (`ChangelogTailGone`), and the caller reads it whole.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import tenacity
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from plumbing.kafka_errors import leader_unknown

log = logging.getLogger(__name__)

#: A restore's reads give up after this long without progress.
RESTORE_IDLE_TIMEOUT_S = 30.0
RESTORE_BATCH = 10_000
#: The pause before asking a partition whose leader is not known yet again.
LEADER_RETRY_S = 0.1

#: A changelog chunk: (card id, state or None for a tombstone), in changelog order.
Chunk = list[tuple[str, bytes | None]]


class ChangelogBatch(NamedTuple):
    """A batch's changelog records of one input partition, as they are produced: each card's
    state, or None (a tombstone), keyed by its card id. Lists, not an object per card: a batch
    of a backlog changes a card per record."""

    partition: int
    #: Index, in the batch, of the partition's last record (whose output group they join).
    batch_index: int
    card_ids: list[bytes]
    states: list[bytes | None]


class ChangelogTailGone(Exception):
    """The changelog no longer holds the offset a tail read starts from: read it whole."""


class Changelog(Protocol):
    """Where the card states are read back from: the changelog topic (or a test's list)."""

    @property
    def topic(self) -> str: ...

    def read(self, partition: int, progress: Callable[[], None], start: int = 0) -> Iterator[Chunk]:
        """The partition's records from offset `start` (0: all of them) up to the end it has
        now, in chunks; `progress` is called after every read (a long restore is not a stuck
        replica). Raises `ChangelogTailGone` when a `start` past 0 is not in the partition."""
        ...

    def end(self, partition: int) -> int:
        """The offset the partition's next record will get."""
        ...

    def partition_ids(self) -> list[int]:
        """The topic's partitions."""
        ...


class KafkaChangelog:
    """The changelog topic, read partition by partition for a restore."""

    def __init__(self, kafka: Mapping[str, Any], topic: str) -> None:
        self._kafka = dict(kafka)
        self.topic = topic

    def partition_ids(self) -> list[int]:
        consumer = Consumer({**self._kafka, "group.id": f"{self.topic}-restore"})
        try:
            metadata = consumer.list_topics(self.topic, timeout=RESTORE_IDLE_TIMEOUT_S)
        finally:
            consumer.close()
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None:
            raise RuntimeError(
                f"changelog {self.topic} cannot be listed: {None if topic is None else topic.error}"
            )
        return sorted(topic.partitions)

    def end(self, partition: int) -> int:
        consumer = Consumer({**self._kafka, "group.id": f"{self.topic}-restore"})
        try:
            return watermarks(consumer, TopicPartition(self.topic, partition))[1]
        finally:
            consumer.close()

    def read(self, partition: int, progress: Callable[[], None], start: int = 0) -> Iterator[Chunk]:
        consumer = Consumer(
            {
                **self._kafka,
                "group.id": f"{self.topic}-restore",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
            }
        )
        try:
            assigned = TopicPartition(self.topic, partition)
            low, high = watermarks(consumer, assigned)
            if start > 0 and not low <= start <= high:
                raise ChangelogTailGone(
                    f"changelog {self.topic}[{partition}] holds offsets {low} to {high}, "
                    f"not {start}"
                )
            if high <= max(low, start):
                return
            consumer.assign(
                [TopicPartition(self.topic, partition, start if start > 0 else OFFSET_BEGINNING)]
            )
            idle_until = time.monotonic() + RESTORE_IDLE_TIMEOUT_S
            while True:
                # consume() waits its whole timeout unless the batch fills: keep it short, and
                # stop on the position (it moves past transaction markers) without waiting for
                # end-of-partition, so a small partition restores in milliseconds, not a second.
                messages = consumer.consume(RESTORE_BATCH, 0.05)
                progress()
                if not messages and time.monotonic() > idle_until:
                    raise TimeoutError(f"changelog {self.topic}[{partition}] stalled")
                chunk, done = _restorable(messages, high)
                yield chunk
                if messages:
                    idle_until = time.monotonic() + RESTORE_IDLE_TIMEOUT_S
                if done or consumer.position([assigned])[0].offset >= high:
                    return
        finally:
            consumer.close()


def watermarks(consumer: Consumer, partition: TopicPartition) -> tuple[int, int]:
    """The partition's low and high watermarks. A partition whose leader is not elected or
    known yet (its changelog just created, a broker restarting) answers "not leader" for a
    moment: that is asked again, for up to RESTORE_IDLE_TIMEOUT_S."""
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(leader_unknown),
        wait=tenacity.wait_fixed(LEADER_RETRY_S),
        stop=tenacity.stop_after_delay(RESTORE_IDLE_TIMEOUT_S),
        before_sleep=lambda state: log.info(
            "changelog partition %s: %s; asking again",
            partition.partition,
            state.outcome.exception() if state.outcome else None,
        ),
        reraise=True,
    )
    low, high = retrying(consumer.get_watermark_offsets, partition, RESTORE_IDLE_TIMEOUT_S)
    return low, high


def _restorable(messages: Sequence[Message], end: int) -> tuple[Chunk, bool]:
    """The card records among `messages` that precede offset `end`, and whether the
    partition's end (end-of-partition, or a record at `end` or past it) was reached."""
    chunk: Chunk = []
    for message in messages:
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                return chunk, True
            raise RuntimeError(f"reading the card state changelog: {error.str()}")
        offset = message.offset()
        if offset is not None and offset >= end:  # written since the restore began
            return chunk, True
        key = message.key()
        if key is not None:
            chunk.append((key.decode("utf-8", "replace"), message.value()))
    return chunk, False
