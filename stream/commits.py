"""The commit policy, in one place: how finished records become committed, per guarantee.

- At-least-once (`StoredOffsets`): the position past each finished prefix of records is stored
  on the consumer, and librdkafka commits what is stored in the background
  (`auto.commit.interval.ms`), and at once on a rebalance or at shutdown.
- Exactly-once (`TransactionCommits`): finished positions go into the open transaction with the
  outputs, committed every `FRAUD_TRANSACTION_MS`; an aborted transaction asks the loop to rewind.

Both are called from the consuming thread only.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from contracts.offsets import OffsetTracker
from stream.transactional_sink import TransactionAborted, TransactionalSink

log = logging.getLogger(__name__)

#: How long a rewind waits for the committed offsets.
REWIND_TIMEOUT_S = 5.0


class Commits(Protocol):
    """Makes finished records committed; each method returns whether the consumer must rewind
    to the committed offsets (an aborted transaction)."""

    def record_progress(self) -> bool:
        """On every pass of the loop: commit what is finished, when it is due."""
        ...

    def commit_now(self) -> bool:
        """Before partitions go (rebalance, shutdown): commit everything finished."""
        ...


class StoredOffsets:
    """At-least-once: store finished positions; librdkafka commits them."""

    def __init__(self, consumer: Consumer, tracker: OffsetTracker) -> None:
        self._consumer = consumer
        self._tracker = tracker

    def record_progress(self) -> bool:
        positions = self._tracker.take_commit_positions()
        if positions:
            self._consumer.store_offsets(
                offsets=[TopicPartition(t, p, o) for (t, p), o in positions.items()]
            )
        return False

    def commit_now(self) -> bool:
        self.record_progress()
        try:
            self._consumer.commit(asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._NO_OFFSET:  # nothing new stored: benign
                log.warning("commit failed, the next commit will cover it: %s", exc)
        return False


class TransactionCommits:
    """Exactly-once: the transaction carries the positions, committed when due."""

    def __init__(self, transactions: TransactionalSink) -> None:
        self._transactions = transactions

    def record_progress(self) -> bool:
        try:
            self._transactions.commit_if_due(time.monotonic())
        except TransactionAborted:
            return True
        return False

    def commit_now(self) -> bool:
        try:
            self._transactions.commit()
        except TransactionAborted:
            return True
        # An abort elsewhere (a revoke's flush) needs the rewind as much as one here.
        return self._transactions.rewind_needed


def committed_positions(
    consumer: Consumer, partitions: list[TopicPartition]
) -> list[TopicPartition] | None:
    """Where an exactly-once rewind takes `partitions` back to: their committed offsets (the
    beginning where none is), or None while the group coordinator does not answer (a replica
    back from a freeze or a broker restart: it does once the group settles; ask again)."""
    if not partitions:
        return []
    try:
        committed = consumer.committed(partitions, timeout=REWIND_TIMEOUT_S)
    except KafkaException as exc:
        log.warning("committed offsets not known yet (%s): rewinding later", exc)
        return None
    return [
        TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
        for tp in committed
    ]
