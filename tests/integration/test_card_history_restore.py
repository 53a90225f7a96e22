"""The card-state restore against the real broker: it reads a partition's changelog up to the
end the partition had when the restore began, and no further."""

from __future__ import annotations

from confluent_kafka import Producer
from prometheus_client import CollectorRegistry

from scorer.card_history_record import STATE_BYTES, STATE_VERSION
from stream.card_history_changelog import RESTORE_BATCH, KafkaChangelog
from stream.metrics import ServiceMetrics
from stream.owned_card_history import OwnedCardHistory
from tests.integration.conftest import BOOTSTRAP, produce

#: More records than one read returns, so the restore is still reading when the late one lands.
CARDS = 3 * RESTORE_BATCH
STATE = bytes([STATE_VERSION]) + bytes(STATE_BYTES - 1)


def owned_card_history(
    changelog: str, registry: CollectorRegistry, retain_s: float = 0.0
) -> OwnedCardHistory:
    return OwnedCardHistory(
        KafkaChangelog({"bootstrap.servers": BOOTSTRAP}, changelog),
        time_scale=1.0,
        metrics=ServiceMetrics(registry),
        retain_s=retain_s,
    )


def test_a_restore_reads_what_committed_and_ends_at_the_last_marker(topics_factory) -> None:
    # An exactly-once changelog ends with a transaction marker, never handed to a reader: the
    # restore must still see where it ends, and never load an aborted update.
    changelog = topics_factory(partitions=1).input
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "transactional.id": changelog})
    producer.init_transactions(30)
    for first, commit in ((0, True), (100, False), (200, True)):
        producer.begin_transaction()
        for i in range(first, first + 100):
            producer.produce(changelog, key=f"card-{i}".encode(), value=STATE)
        # In the log before the marker, so the aborted update is there to skip; an abort with
        # produce requests in flight was once refused (librdkafka #4849).
        assert producer.flush(30) == 0
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    registry = CollectorRegistry()

    owned_card_history(changelog, registry).restore([0])

    assert registry.get_sample_value("fraud_card_state_cards") == 200


def test_a_restore_does_not_chase_records_written_after_it_began(topics_factory) -> None:
    # A zombie reloading its state after an abort once read a partition for 120 s while its
    # new owner kept writing the changelog: reading "to the end" never ended.
    changelog = topics_factory(partitions=1).input
    produce(changelog, [(f"card-{i}".encode(), STATE) for i in range(CARDS)])
    registry = CollectorRegistry()
    state = owned_card_history(changelog, registry)
    writer = Producer({"bootstrap.servers": BOOTSTRAP})
    late: list[str] = []

    def another_owner_writes() -> None:
        card = f"late-{len(late)}"
        writer.produce(changelog, key=card.encode(), value=STATE)
        assert writer.flush(30) == 0
        late.append(card)

    state.restore([0], another_owner_writes)

    assert late, "the restore never reported progress"
    assert registry.get_sample_value("fraud_card_state_cards") == CARDS


def test_a_warm_up_reads_every_partition_and_an_assignment_only_what_came_since(
    topics_factory,
) -> None:
    changelog = topics_factory(partitions=2).input
    produce(changelog, [(f"card-{i}".encode(), STATE) for i in range(1_000)])
    registry = CollectorRegistry()
    state = owned_card_history(changelog, registry, retain_s=600.0)

    state.warm_up()

    assert registry.get_sample_value("fraud_state_kept_partitions") == 2
    assert registry.get_sample_value("fraud_card_state_cards") == 1_000
    produce(changelog, [(f"late-{i}".encode(), STATE) for i in range(100)])
    state.restore([0, 1])
    tail = registry.get_sample_value(
        "fraud_state_restore_changelog_records_total", {"read": "tail"}
    )
    assert tail == 100, "only the records written since the warm-up"
    assert registry.get_sample_value("fraud_card_state_cards") == 1_100
