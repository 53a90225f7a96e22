"""Per-card history on the hot path: a `CardHistory` per assigned partition, kept durable in a
compacted changelog topic.

Responsibilities:
- restore a partition's state from its changelog before the partition's first batch is scored
  (on assignment), and say how long that took;
- turn a batch's records into their history feature rows (per partition, in consumption order)
  and into the changelog records their updates produced (changed cards, and tombstones for
  cards idle past the longest window), to be written with the batch's outputs: the commit that
  covers a batch's input offsets covers its state too;
- drop a partition's state when it is revoked or lost, and reload every assigned partition
  after an aborted transaction (exactly-once), whose updates never became durable.

Key design decisions:
- The changelog partition is the input partition: a card's state lives where its transactions
  are, and moves with them on a rebalance.
- Updates are idempotent by input offset (`CardHistory`): a record read again after a crash
  changes nothing twice.
- The restore reads with isolation.level=read_committed, so it sees only what committed, and
  stops at the end the partition had when it started: a replica that still believes it owns a
  partition (a zombie reloading after an abort) must not chase the new owner's writes.
- A lock orders the consuming thread's restores and drops against the scoring thread's batches.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from contracts.offsets import SourceOffset
from contracts.transaction import Transaction
from scorer.columns import TransactionColumns
from scorer.history import CardHistory
from stream.metrics import ServiceMetrics

log = logging.getLogger(__name__)

#: How often, in wall-clock seconds, each partition looks for idle cards to evict.
EVICT_INTERVAL_S = 60.0
#: A restore's reads give up after this long without progress.
RESTORE_IDLE_TIMEOUT_S = 30.0
RESTORE_BATCH = 10_000


def _nothing() -> None:
    pass


class StatefulRecord(Protocol):
    """What the state needs of a record of a batch."""

    @property
    def transaction(self) -> Transaction: ...
    @property
    def position(self) -> SourceOffset: ...


class ChangelogRecord(NamedTuple):
    """One record for the changelog: a card's state, or None (a tombstone)."""

    partition: int
    card_id: str
    state: bytes | None
    #: Index, in the batch, of a record of the same partition (whose output group it joins).
    batch_index: int


class CardState:
    """The card histories of the partitions this replica owns."""

    def __init__(
        self,
        kafka: Mapping[str, Any],
        input_topic: str,
        changelog_topic: str,
        *,
        time_scale: float,
        metrics: ServiceMetrics,
    ) -> None:
        self._kafka = dict(kafka)
        self._input_topic = input_topic
        self.changelog_topic = changelog_topic
        self._time_scale = time_scale
        self._metrics = metrics
        self._histories: dict[int, CardHistory] = {}
        self._last_eviction: dict[int, float] = {}
        self._lock = threading.Lock()

    # -- consuming thread: rebalances --------------------------------------------------------

    def restore(self, partitions: Sequence[int], progress: Callable[[], None] = _nothing) -> None:
        """Load the state of newly assigned partitions from their changelog; `progress` is
        called after every chunk read (a long restore is not a stuck replica)."""
        for partition in partitions:
            started = time.monotonic()
            history = CardHistory(time_scale=self._time_scale)
            records = self._read_changelog(partition, history, progress)
            with self._lock:
                self._histories[partition] = history
                self._last_eviction[partition] = time.monotonic()
            seconds = time.monotonic() - started
            self._metrics.observe_state_restore(seconds)
            log.info(
                "restored card state topic=%s partition=%s cards=%s changelog_records=%s in %.3fs",
                self._input_topic,
                partition,
                len(history),
                records,
                seconds,
            )
        self._report()

    def drop(self, partitions: Sequence[int]) -> None:
        """Forget the state of partitions that went (their next owner restores it)."""
        with self._lock:
            for partition in partitions:
                self._histories.pop(partition, None)
                self._last_eviction.pop(partition, None)
        self._report()

    def reload(self, progress: Callable[[], None] = _nothing) -> None:
        """Restore every owned partition again (its in-memory updates were aborted)."""
        with self._lock:
            partitions = sorted(self._histories)
        self.restore(partitions, progress)

    # -- scoring thread: batches -------------------------------------------------------------

    def update(
        self, records: Sequence[StatefulRecord]
    ) -> tuple[npt.NDArray[np.float32] | None, list[ChangelogRecord]]:
        """The history feature rows of `records` (batch order) and the changelog records their
        updates produced. None for the rows when a partition's state is not loaded (the
        features are then neutral)."""
        by_partition: dict[int, list[int]] = {}
        for index, record in enumerate(records):
            by_partition.setdefault(record.position[0][1], []).append(index)
        rows: npt.NDArray[np.float32] | None = None
        changelog: list[ChangelogRecord] = []
        with self._lock:
            for partition, indices in by_partition.items():
                history = self._histories.get(partition)
                if history is None:
                    return None, []
                part = [records[i] for i in indices]
                transactions = [r.transaction for r in part]
                columns = TransactionColumns.from_transactions(transactions)
                offsets = np.fromiter((r.position[1] for r in part), np.int64, len(part))
                features = history.update_and_features(
                    columns.card_id, columns, columns.merchant_id, offsets
                )
                if rows is None:
                    rows = np.empty((len(records), features.shape[1]), np.float32)
                rows[indices] = features
                last = indices[-1]
                changelog.extend(
                    ChangelogRecord(partition, card, state, last)
                    for card, state in history.take_dirty()
                )
                changelog.extend(self._evictions(partition, history, columns, last))
        self._report()
        return rows, changelog

    def _evictions(
        self,
        partition: int,
        history: CardHistory,
        columns: TransactionColumns,
        batch_index: int,
    ) -> list[ChangelogRecord]:
        now = time.monotonic()
        if now - self._last_eviction.get(partition, now) < EVICT_INTERVAL_S:
            return []
        self._last_eviction[partition] = now
        newest = int(columns.event_time.max())
        return [
            ChangelogRecord(partition, card, None, batch_index)
            for card in history.evict_idle(newest)
        ]

    # -- internals ---------------------------------------------------------------------------

    def _read_changelog(
        self, partition: int, history: CardHistory, progress: Callable[[], None]
    ) -> int:
        consumer = Consumer(
            {
                **self._kafka,
                "group.id": f"{self.changelog_topic}-restore",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
            }
        )
        read = 0
        try:
            assigned = TopicPartition(self.changelog_topic, partition)
            low, high = consumer.get_watermark_offsets(assigned, timeout=RESTORE_IDLE_TIMEOUT_S)
            if high <= low:
                return 0
            consumer.assign([TopicPartition(self.changelog_topic, partition, OFFSET_BEGINNING)])
            idle_until = time.monotonic() + RESTORE_IDLE_TIMEOUT_S
            while True:
                # consume() waits its whole timeout unless the batch fills: keep it short, and
                # stop on the position (it moves past transaction markers) without waiting for
                # end-of-partition, so a small partition restores in milliseconds, not a second.
                messages = consumer.consume(RESTORE_BATCH, 0.05)
                progress()
                if not messages and time.monotonic() > idle_until:
                    raise TimeoutError(f"changelog {self.changelog_topic}[{partition}] stalled")
                chunk, done = _restorable(messages, high)
                for problem in history.restore(chunk):
                    log.warning("skipping a card state record (the card starts anew): %s", problem)
                read += len(chunk)
                if messages:
                    idle_until = time.monotonic() + RESTORE_IDLE_TIMEOUT_S
                if done or consumer.position([assigned])[0].offset >= high:
                    return read
        finally:
            consumer.close()

    def _report(self) -> None:
        with self._lock:
            cards = sum(len(h) for h in self._histories.values())
            size = sum(h.nbytes for h in self._histories.values())
        self._metrics.set_card_state(cards, size)


def _restorable(
    messages: Sequence[Message], end: int
) -> tuple[list[tuple[str, bytes | None]], bool]:
    """The card records among `messages` that precede offset `end`, and whether the
    partition's end (end-of-partition, or a record at `end` or past it) was reached."""
    chunk: list[tuple[str, bytes | None]] = []
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
