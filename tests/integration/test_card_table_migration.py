"""The features worker's per-card table changelog of release 0.1.0 (`<app id>-card-state-changelog`)
copied into the new one (`<app id>-card-frauds-changelog`) before faust starts, against the
broker (terminals/card_table_migration.py). `make upgrade-check` runs it live, under load."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from faults.reading import read_to_end
from plumbing.errors import ConfigurationError
from terminals.card_table_migration import (
    FORMER_CARD_TABLE_NAME,
    migrate_card_table,
    migration_group,
)
from terminals.config import FeaturesSettings
from terminals.topics import CARD_TABLE_NAME, changelog_topic_name
from tests.integration.conftest import BOOTSTRAP

PARTITIONS = 3


def _topics(admin: AdminClient, partitions: int = PARTITIONS) -> tuple[FeaturesSettings, str, str]:
    config = FeaturesSettings(
        bootstrap_servers=BOOTSTRAP, app_id=f"migration-{uuid.uuid4().hex[:8]}"
    )
    former = changelog_topic_name(config.app_id, FORMER_CARD_TABLE_NAME)
    new = changelog_topic_name(config.app_id, CARD_TABLE_NAME)
    compact = {"cleanup.policy": "compact"}
    futures = admin.create_topics(
        [
            NewTopic(former, partitions, 1, config=compact),
            NewTopic(new, PARTITIONS, 1, config=compact),
        ]
    )
    for future in futures.values():
        future.result(timeout=30)
    return config, former, new


def _produce(topic: str, records: list[tuple[int, bytes, bytes | None]]) -> None:
    producer = Producer({"bootstrap.servers": BOOTSTRAP})
    for partition, key, value in records:
        producer.produce(topic, value, key, partition=partition)
    assert producer.flush(30) == 0


def _by_partition(topic: str) -> dict[int, list[tuple[bytes | None, bytes | None]]]:
    """Each partition's records in order, up to its end."""
    found: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
    for message in read_to_end(BOOTSTRAP, topic, 30):
        found.setdefault(message.partition() or 0, []).append((message.key(), message.value()))
    return found


#: Two cards per partition, one of them removed again (a tombstone), as faust writes them.
FORMER = [
    (p, f"card-{p}-{i}".encode(), value)
    for p in range(PARTITIONS)
    for i, value in enumerate([b'{"days":[1]}', b'{"days":[2]}', None])
]


def test_the_former_changelog_is_copied_once_partition_by_partition(admin: AdminClient) -> None:
    config, former, new = _topics(admin)
    _produce(former, FORMER)

    assert migrate_card_table(config, admin, former, new, PARTITIONS) == len(FORMER)
    copied = _by_partition(new)
    assert copied == _by_partition(former)
    # A second start copies nothing: every partition's copy is committed.
    assert migrate_card_table(config, admin, former, new, PARTITIONS) == 0
    assert _by_partition(new) == copied


def test_a_partition_written_since_or_broken_off_is_copied_again_alone(
    admin: AdminClient,
) -> None:
    config, former, new = _topics(admin)
    _produce(former, FORMER)
    assert migrate_card_table(config, admin, former, new, PARTITIONS) == len(FORMER)
    # 0.1.0 wrote one more record to partition 1 since (a worker started too early), and the
    # copy of partition 2 broke off after its first record.
    _produce(former, [(1, b"card-1-late", b'{"days":[3]}')])
    consumer = Consumer(
        {"bootstrap.servers": BOOTSTRAP, "group.id": migration_group(config.app_id)}
    )
    consumer.commit(offsets=[TopicPartition(former, 2, 1)], asynchronous=False)
    consumer.close()

    assert migrate_card_table(config, admin, former, new, PARTITIONS) == 4 + 3
    copied, expected = _by_partition(new), _by_partition(former)
    assert copied[0] == expected[0]
    assert copied[1] == expected[1][:3] + expected[1]  # the same last value per key
    assert copied[2] == expected[2] + expected[2]


def test_no_former_changelog_copies_nothing(admin: AdminClient) -> None:
    config = FeaturesSettings(bootstrap_servers=BOOTSTRAP, app_id=f"fresh-{uuid.uuid4().hex[:8]}")
    former = changelog_topic_name(config.app_id, FORMER_CARD_TABLE_NAME)
    assert migrate_card_table(config, admin, former, former + "-new", PARTITIONS) == 0


def test_a_former_changelog_of_another_partition_count_stops_the_worker(
    admin: AdminClient,
) -> None:
    config, former, new = _topics(admin, partitions=PARTITIONS + 1)
    try:
        migrate_card_table(config, admin, former, new, PARTITIONS)
    except ConfigurationError as exc:
        assert "FRAUD_FEATURES_TABLE_PARTITIONS" in str(exc)
    else:
        raise AssertionError("a changelog of another partition count was copied")
