"""Card state against records and retries that used to corrupt it silently, through the real
broker: one transaction dated 9999-12-31 must not wipe a partition's cards (finding 1 of the
state review), and a card state retried after a newer one was delivered must not end up as the
card's last changelog record (finding 3)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, NamedTuple

from confluent_kafka import Producer
from prometheus_client import CollectorRegistry

from contracts.offsets import OffsetTracker, SourceOffset
from contracts.transaction import MAX_EVENT_TIME_MS, Transaction, decode_transaction
from deadletter.policy import RetryPolicy
from deadletter.router import DeadLetterRouter
from plumbing.errors import TransientDeliveryError
from scorer.columns import TransactionColumns
from simulator.transactions import TransactionSimulator
from stream.card_history_changelog import KafkaChangelog
from stream.metrics import ServiceMetrics
from stream.outcomes import OutcomeGroup
from stream.owned_card_history import OwnedCardHistory
from stream.redelivery import Redelivery
from stream.sink import KafkaSink, Output
from tests.integration.conftest import BOOTSTRAP, encode, produce, read_topic
from tests.support.records import key_of
from tests.unit.fakes import message

CARDS = 1_000


def restored(changelog: str, registry: CollectorRegistry | None = None) -> OwnedCardHistory:
    state = OwnedCardHistory(
        KafkaChangelog({"bootstrap.servers": BOOTSTRAP}, changelog),
        time_scale=1.0,
        metrics=ServiceMetrics(registry or CollectorRegistry()),
    )
    state.restore([0])
    return state


def test_a_transaction_dated_9999_wipes_no_card(topics_factory, service_factory) -> None:
    topics = topics_factory(partitions=1)
    changelog = f"{topics.input}.cards"
    simulator = TransactionSimulator(5, num_cards=CARDS, id_prefix="future")
    records = simulator.generate(4 * CARDS).records
    cards = {str(r["card_id"]) for r in records}
    service = service_factory(
        topics, "--state-changelog-topic", changelog, "--state-evict-interval-s", "0.5"
    )
    produce(topics.input, [(str(r["card_id"]).encode(), encode(r)) for r in records])
    future = dict(records[0], transaction_id="from-the-future", event_time=MAX_EVENT_TIME_MS)
    produce(topics.input, [(b"x", encode(future))])
    time.sleep(1.0)  # past the eviction interval: the next batch looks for idle cards
    last = dict(records[1], transaction_id="after-it")
    produce(topics.input, [(str(last["card_id"]).encode(), encode(last))])
    decided = read_topic(topics.output, len(records) + 2, timeout_s=120, settle_s=0)
    assert len(decided) == len(records) + 2, service.log()

    assert service.metric('fraud_state_event_time_out_of_bounds_total{reason="future"}') == 1
    written = read_topic(changelog, 1, timeout_s=30, settle_s=1.0)
    tombstoned = {key_of(m).decode() for m in written if m.value() is None}
    assert not tombstoned & cards, f"{len(tombstoned & cards)} cards wiped"
    registry = CollectorRegistry()
    restored(changelog, registry)
    assert registry.get_sample_value("fraud_card_state_cards") == len(cards)


class FailOnce:
    """A sink whose first card state of `card` is reported failed without being produced (the
    broker did not acknowledge it); everything else goes to the broker."""

    def __init__(self, sink: KafkaSink, on_failure: Any, card: str) -> None:
        self._sink = sink
        self._on_failure = on_failure
        self._card = card.encode()
        self.failed: list[Output] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)

    def send_batch(
        self, topic, keys, values, group, output_of, partition=None, *, headers=None
    ) -> None:
        assert headers is None, "card states carry no headers"
        if not self.failed and self._card in keys:
            i = keys.index(self._card)
            self.failed.append(output_of(i))
            self._on_failure(output_of(i), TransientDeliveryError("timed out", "_MSG_TIMED_OUT"))
            keys, values = keys[:i] + keys[i + 1 :], list(values[:i]) + list(values[i + 1 :])
        self._sink.send_batch(topic, keys, values, group, output_of, partition)


def test_a_retried_card_state_never_ends_older_than_the_cards_newest(topics_factory) -> None:
    changelog = topics_factory(partitions=1).input
    simulator = TransactionSimulator(9, num_cards=40, id_prefix="retry")
    transactions = [decode_transaction(encode(r)) for r in simulator.generate(600).records]
    card = Counter(t.card_id for t in transactions[:200]).most_common(1)[0][0]
    metrics = ServiceMetrics(CollectorRegistry())
    state = OwnedCardHistory(
        KafkaChangelog({"bootstrap.servers": BOOTSTRAP}, changelog),
        time_scale=1.0,
        metrics=metrics,
    )
    state.restore([0])
    redelivery = Redelivery(
        RetryPolicy(5, 0.01, 0.1),
        DeadLetterRouter(f"{changelog}.dlq", "test"),
        delivery_timeout_s=10.0,
        max_message_bytes=1_000_000,
        metrics=metrics,
        current_card=state.current,
    )
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "enable.idempotence": True})
    sink = FailOnce(KafkaSink(producer, redelivery.failed), redelivery.failed, card)
    tracker = OffsetTracker()
    for start in range(0, len(transactions), 50):  # batches: the card's state fails once
        batch = [
            _Record(t, (("tx", 0), start + i))
            for i, t in enumerate(transactions[start : start + 50])
        ]
        tracker.track_all([r.position for r in batch], [1] * len(batch))
        columns = TransactionColumns.from_transactions([r.transaction for r in batch])
        _, changed = state.update(batch, columns)  # one partition: one batch of changes
        keys = [card_id for change in changed for card_id in change.card_ids]
        values = [value for change in changed for value in change.states]
        group = OutcomeGroup(
            tracker,
            [r.position for r in batch],
            Counter({("changelog", "card_state"): len(keys)}),
            lambda _: None,
        )

        output_of = changelog_outputs(changelog, keys, values, message(start, topic="tx"), group)
        sink.send_batch(changelog, keys, values, group, output_of, 0)
        assert producer.flush(30) == 0
    assert sink.failed, "the card's first state failed"
    assert redelivery.retry(sink)
    assert producer.flush(30) == 0

    newest = state.current(0, card).state
    written = [
        m.value()
        for m in read_topic(changelog, 1, timeout_s=30, settle_s=1.0)
        if m.key() == card.encode()
    ]
    assert written[-1] == newest, "the card's last changelog record is its newest state"
    assert restored(changelog).current(0, card).state == newest


def changelog_outputs(
    topic: str, keys: list[bytes], values: list[bytes | None], source: Any, group: OutcomeGroup
) -> Any:
    """The `output_of` of a batch's card states (what BatchScorer gives the sink)."""

    def output_of(i: int) -> Output:
        return Output("changelog", topic, keys[i], values[i], None, source, group, "card_state", 0)

    return output_of


class _Record(NamedTuple):
    transaction: Transaction
    position: SourceOffset
