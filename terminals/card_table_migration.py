"""The worker's per-card table was called `card-state` up to release 0.1.0, the scorer's word
for its card history; it is `card-frauds` now, and so is its changelog
(`<app id>-card-frauds-changelog`). A worker upgraded from 0.1.0 would restore an empty table
from the new changelog and forget every card's frauds counted before, so before faust starts
`migrate_card_table` copies the former changelog into the new one.

Decisions:
- Per partition, to the same partition, key, value and tombstone alike, in offset order: faust
  restores a partition from its own changelog partition, keeping the last value per key.
- Copied when the new changelog partition holds fewer records than the former one: the first
  start of the new release, or a copy broken off. A partition is then copied again whole: the
  records it repeats carry the same values in the same order, so the restored table is the same.
  Once faust has written to the new changelog, it holds at least as many.
- The former changelog is left as it is (a rollback to 0.1.0 restores from it, without what the
  new release counted since); delete it once no rollback is wanted (CHANGELOG: the release
  after next stops looking for it).
- A former changelog with another partition count than FRAUD_FEATURES_TABLE_PARTITIONS stops the
  worker: its partitions would not be the new one's.
"""

from __future__ import annotations

import logging
import time
import uuid

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from plumbing.errors import ConfigurationError
from plumbing.topic_admin import ADMIN_TIMEOUT_S
from terminals.config import FeaturesSettings

log = logging.getLogger(__name__)

#: The per-card table's name up to release 0.1.0 (its changelog's name comes from it).
FORMER_CARD_TABLE_NAME = "card-state"
READ_BATCH = 5_000
READ_WAIT_S = 1.0
#: A partition not read to its end in this long (a broker away) stops the worker.
READ_TIMEOUT_S = 120.0
FLUSH_TIMEOUT_S = 120.0


def migrate_card_table(
    config: FeaturesSettings, admin: AdminClient, former: str, new: str, partitions: int
) -> int:
    """Copy the partitions of changelog `former` that `new` holds fewer records of; return the
    records copied (0 when there is no former changelog).

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
            "group.id": f"{config.app_id}-card-table-migration-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    producer = Producer({**kafka, "enable.idempotence": True})
    refused: list[str] = []

    def delivered(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            refused.append(error.str())

    copied = 0
    try:
        for partition, records in _read(consumer, former, partitions).items():
            _, held = consumer.get_watermark_offsets(
                TopicPartition(new, partition), ADMIN_TIMEOUT_S
            )
            if held >= len(records):
                continue
            for key, value in records:
                producer.produce(new, value, key, partition=partition, on_delivery=delivered)
                producer.poll(0)
            copied += len(records)
        left = producer.flush(FLUSH_TIMEOUT_S)
        if left or refused:
            why = refused[0] if refused else f"{left} records not acknowledged"
            raise ConfigurationError(f"copying {former!r} into {new!r}: {why}; start again")
    finally:
        consumer.close()
    if copied:
        log.info(
            "copied %s records of the former card table's changelog %s into %s", copied, former, new
        )
    return copied


_Record = tuple[bytes | None, bytes | None]


def _read(consumer: Consumer, topic: str, partitions: int) -> dict[int, list[_Record]]:
    """Every record of each partition, in order, up to the partition's end now."""
    ends = {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), ADMIN_TIMEOUT_S)
        for p in range(partitions)
    }
    records: dict[int, list[_Record]] = {p: [] for p in range(partitions)}
    waiting = {p for p, (low, high) in ends.items() if high > low}
    consumer.assign([TopicPartition(topic, p, ends[p][0]) for p in sorted(waiting)])
    deadline = time.monotonic() + READ_TIMEOUT_S
    while waiting:
        if time.monotonic() > deadline:
            raise ConfigurationError(
                f"{topic!r} partitions {sorted(waiting)} not read to their end: start again"
            )
        for message in consumer.consume(READ_BATCH, READ_WAIT_S):
            error, partition = message.error(), message.partition() or 0
            if error is None:
                records[partition].append((message.key(), message.value()))
            elif error.code() == KafkaError._PARTITION_EOF:
                if (message.offset() or 0) >= ends[partition][1]:
                    waiting.discard(partition)
            else:
                raise ConfigurationError(f"reading {topic!r} partition {partition}: {error.str()}")
    return records
