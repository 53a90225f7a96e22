"""The worker's per-card table was called `card-state` up to release 0.1.0, the scorer's word
for its card history; it is `card-frauds` now, and so is its changelog
(`<app id>-card-frauds-changelog`). A worker upgraded from 0.1.0 would restore an empty table
from the new changelog and forget every card's frauds counted before, so before faust starts
`migrate_card_table` copies the former changelog into the new one.

Decisions:
- Per partition, to the same partition, key, value and tombstone alike, in offset order: faust
  restores a partition from its own changelog partition, keeping the last value per key.
- What was copied is committed, per partition, as the former changelog's offset reached, in the
  consumer group `<app id>-card-table-migration`: a later start copies only a partition whose
  commit is short of the former's end (a copy broken off, or records the release wrote since).
  A partition is then copied again from its start: the records it repeats carry the same values
  in the same order, so the restored table is the same.
- Streamed: one partition at a time, each record produced as it is read, so memory stays at
  librdkafka's queue whatever the changelog's size; a read or a delivery that makes no progress
  for `STALL_TIMEOUT_S` stops the worker with a message (it copies again at its next start).
- Every worker must be stopped before the first of the new release starts (docs/upgrading.md;
  the Helm chart recreates the worker's pods): a 0.1.0 worker still writing the former changelog
  after the copy would lose what it writes then.
- The former changelog is left as it is (a rollback to 0.1.0 restores from it, without what the
  new release counted since); delete it once no rollback is wanted (CHANGELOG: the release
  after next stops looking for it).
- A former changelog with another partition count than FRAUD_FEATURES_TABLE_PARTITIONS stops the
  worker: its partitions would not be the new one's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from plumbing.errors import ConfigurationError
from plumbing.topic_admin import ADMIN_TIMEOUT_S
from terminals.config import FeaturesSettings

log = logging.getLogger(__name__)

#: The per-card table's name up to release 0.1.0 (its changelog's name comes from it).
FORMER_CARD_TABLE_NAME = "card-state"
READ_BATCH = 5_000
READ_WAIT_S = 1.0
#: A partition whose read or copy makes no progress for this long stops the worker.
STALL_TIMEOUT_S = 120.0
#: When librdkafka's queue is full, serve delivery reports this long before producing again.
QUEUE_FULL_BACKOFF_S = 0.05
COORDINATOR_BACKOFF_S = 0.2
_COORDINATOR_MOVING = {
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
}


def migration_group(app_id: str) -> str:
    """The consumer group whose commits say how far each partition was copied."""
    return f"{app_id}-card-table-migration"


def migrate_card_table(
    config: FeaturesSettings, admin: AdminClient, former: str, new: str, partitions: int
) -> int:
    """Copy each partition of changelog `former` not copied yet into `new`; return the records
    copied (0 when there is no former changelog).

    Raises ConfigurationError when the former changelog has another partition count, or it
    cannot be read or copied."""
    found = admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics.get(former)
    if found is None or found.error is not None:
        return 0
    if len(found.partitions) != partitions:
        raise ConfigurationError(
            f"the former card table's changelog {former!r} has {len(found.partitions)} "
            f"partitions, FRAUD_FEATURES_TABLE_PARTITIONS is {partitions}: set it back to "
            "copy it, or delete the topic to start the card frauds afresh"
        )
    kafka = {"bootstrap.servers": config.bootstrap_servers, **config.kafka_settings()}
    consumer = Consumer(
        {
            **kafka,
            "group.id": migration_group(config.app_id),
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    producer = Producer({**kafka, "enable.idempotence": True})
    copied = 0
    try:
        for position in _committed(consumer, former, partitions):
            partition = position.partition
            low, high = consumer.get_watermark_offsets(
                TopicPartition(former, partition), ADMIN_TIMEOUT_S
            )
            if position.offset >= high:
                continue
            copied += _copy(consumer, producer, former, new, partition, low, high)
            consumer.commit(offsets=[TopicPartition(former, partition, high)], asynchronous=False)
    except KafkaException as exc:
        raise ConfigurationError(
            f"copying {former!r} into {new!r}: {exc}; the worker copies again at its next start"
        ) from exc
    finally:
        consumer.close()
    if copied:
        log.info(
            "copied %s records of the former card table's changelog %s into %s", copied, former, new
        )
    return copied


def _committed(consumer: Consumer, topic: str, partitions: int) -> list[TopicPartition]:
    """The group's commits on `topic`, asked again while its coordinator is being found or
    loaded (a new group's first question is often answered so)."""
    deadline = time.monotonic() + ADMIN_TIMEOUT_S
    while True:
        try:
            found: list[TopicPartition] = consumer.committed(
                [TopicPartition(topic, p) for p in range(partitions)], ADMIN_TIMEOUT_S
            )
            return found
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            again = isinstance(error, KafkaError) and error.code() in _COORDINATOR_MOVING
            if not again or time.monotonic() > deadline:
                raise
            time.sleep(COORDINATOR_BACKOFF_S)


def _copy(
    consumer: Consumer,
    producer: Producer,
    former: str,
    new: str,
    partition: int,
    low: int,
    high: int,
) -> int:
    """Produce every record of `former`'s partition from `low` up to `high` to the same partition
    of `new`, and wait until each is acknowledged; return how many."""
    refused: list[str] = []

    def delivered(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            refused.append(error.str())

    count = 0
    if high > low:
        consumer.assign([TopicPartition(former, partition, low)])
        stalled_at = time.monotonic() + STALL_TIMEOUT_S
        done = False
        while not done:
            messages = consumer.consume(READ_BATCH, READ_WAIT_S)
            if messages:
                stalled_at = time.monotonic() + STALL_TIMEOUT_S
            elif time.monotonic() > stalled_at:
                raise ConfigurationError(
                    f"{former!r} partition {partition} not read to its end; the worker copies "
                    "again at its next start"
                )
            for message in messages:
                error = message.error()
                if error is None:
                    _produce(producer, new, partition, message, delivered)
                    count += 1
                elif error.code() == KafkaError._PARTITION_EOF:
                    done = done or (message.offset() or 0) >= high
                else:
                    raise KafkaException(error)
    left = producer.flush(STALL_TIMEOUT_S)
    if left or refused:
        why = refused[0] if refused else f"{left} records not acknowledged"
        raise ConfigurationError(
            f"copying {former!r} partition {partition} into {new!r}: {why}; the worker copies "
            "again at its next start"
        )
    return count


def _produce(
    producer: Producer,
    topic: str,
    partition: int,
    message: Message,
    delivered: Callable[[KafkaError | None, Message], None],
) -> None:
    while True:
        try:
            producer.produce(
                topic, message.value(), message.key(), partition=partition, on_delivery=delivered
            )
            producer.poll(0)
            return
        except BufferError:
            producer.poll(QUEUE_FULL_BACKOFF_S)
