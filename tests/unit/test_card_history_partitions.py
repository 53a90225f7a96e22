"""The replica's card state (stream/owned_card_history.py) over batches that mix partitions: one
store keyed by partition and card must behave as one history per partition; and a changelog whose
leader is not known yet. The changelog reads are Kafka's
(tests/integration/test_card_history_restore.py); here every changelog is empty."""

from __future__ import annotations

import threading
import zlib
from typing import Any, NamedTuple

import msgspec
import numpy as np
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from prometheus_client import CollectorRegistry

from contracts.offsets import SourceOffset
from contracts.transaction import Transaction, decode_transaction
from scorer.card_history import MS_PER_DAY, CardHistory, neutral_history
from scorer.card_history_record import STATE_BYTES, STATE_VERSION
from scorer.card_history_store import CardHistoryStore, Restored
from scorer.columns import TransactionColumns
from simulator.transactions import TransactionSimulator
from stream import card_history_changelog, card_history_restore
from stream.card_history_changelog import watermarks
from stream.metrics import ServiceMetrics
from stream.owned_card_history import OwnedCardHistory
from tests.unit.fakes import MemoryChangelog, changes

TOPIC = "transactions"


class Record(NamedTuple):
    transaction: Transaction
    position: SourceOffset


def new_state(
    partitions: list[int],
    registry: CollectorRegistry | None = None,
    *,
    changelog: MemoryChangelog | None = None,
    **settings: Any,
) -> OwnedCardHistory:
    state = OwnedCardHistory(
        changelog or MemoryChangelog(),
        time_scale=1.0,
        metrics=ServiceMetrics(registry or CollectorRegistry()),
        **settings,
    )
    state.restore(partitions)
    return state


def records(count: int, partitions: int, seed: int = 4) -> list[Record]:
    """Simulated transactions of few cards (so cards repeat within a batch), each partition
    given by its card, except that a card's every third transaction goes to the next
    partition: the same card id in two partitions."""
    batch = TransactionSimulator(seed, num_cards=40, num_terminals=80).generate(count)
    out = []
    offsets = [0] * partitions
    for i, record in enumerate(batch.records):
        transaction = decode_transaction(msgspec.json.encode(record))
        partition = zlib.crc32(transaction.card_id.encode()) % partitions
        if i % 3 == 0:
            partition = (partition + 1) % partitions
        out.append(Record(transaction, ((TOPIC, partition), offsets[partition])))
        offsets[partition] += 1
    return out


def update(state: OwnedCardHistory, batch: list[Record]):
    """The batch's history rows, and its changelog records one by one."""
    columns = TransactionColumns.from_transactions([r.transaction for r in batch])
    rows, batches = state.update(batch, columns)
    return rows, changes(batches)


def test_a_mixed_batch_scores_as_one_history_per_partition() -> None:
    stream = records(1_200, partitions=3)
    state = new_state([0, 1, 2])
    alone = {p: CardHistory() for p in range(3)}
    for start in range(0, len(stream), 256):
        batch = stream[start : start + 256]
        rows, changelog = update(state, batch)
        assert rows is not None
        for p, history in alone.items():
            index = np.array([i for i, r in enumerate(batch) if r.position[0][1] == p])
            part = TransactionColumns.from_transactions([batch[i].transaction for i in index])
            offsets = np.array([batch[i].position[1] for i in index], np.int64)
            expected = history.update_and_features(part.card_id, part, part.merchant_id, offsets)
            np.testing.assert_array_equal(rows[index], expected)
            # Every changed card of the partition, once, joining a record of its partition.
            changed = sorted(card for card, _ in history.take_dirty())
            mine = [c for c in changelog if c.partition == p]
            assert sorted(c.card_id for c in mine) == changed
            assert all(batch[c.batch_index].position[0][1] == p for c in mine)
            assert all(c.batch_index == index[-1] for c in mine)


def test_a_batch_read_again_changes_nothing() -> None:
    stream = records(300, partitions=2)
    state = new_state([0, 1])
    first, changelog = update(state, stream)
    again, nothing = update(state, stream)
    assert changelog and nothing == []
    assert first is not None and again is not None


def test_a_dropped_partition_forgets_its_cards_only() -> None:
    registry = CollectorRegistry()
    stream = records(600, partitions=2)
    state = new_state([0, 1], registry)
    update(state, stream)
    cards = registry.get_sample_value("fraud_card_state_cards")
    in_zero = {r.transaction.card_id for r in stream if r.position[0][1] == 0}
    in_one = {r.transaction.card_id for r in stream if r.position[0][1] == 1}
    assert cards == len(in_zero) + len(in_one)

    state.drop([0])

    assert registry.get_sample_value("fraud_card_state_cards") == len(in_one)
    rows, changelog = update(state, stream)
    assert rows is not None and changelog == [], "partition 1 kept its state (read again)"
    dropped = np.array([i for i, r in enumerate(stream) if r.position[0][1] == 0])
    columns = TransactionColumns.from_transactions([stream[i].transaction for i in dropped])
    np.testing.assert_array_equal(rows[dropped], neutral_history(columns))
    assert update(state, [stream[i] for i in dropped]) == (None, [])


def test_a_partition_that_went_leaves_the_updates_of_the_others_in_its_batch() -> None:
    # Finding 6 of the state review: a batch formed before a partition was lost held records of
    # the partitions kept too, and its whole history update was dropped: the kept partitions'
    # cards never counted those transactions, and nothing reached their changelog.
    stream = records(600, partitions=2)
    state = new_state([0, 1])
    alone = new_state([1])
    state.drop([0])
    rows, changelog = update(state, stream)
    in_one = [r for r in stream if r.position[0][1] == 1]
    expected_rows, expected_changelog = update(alone, in_one)
    assert rows is not None and expected_rows is not None
    index = [i for i, r in enumerate(stream) if r.position[0][1] == 1]
    np.testing.assert_array_equal(rows[index], expected_rows)
    assert sorted((c.card_id, c.state) for c in changelog) == sorted(
        (c.card_id, c.state) for c in expected_changelog
    )
    assert changelog and all(stream[c.batch_index].position[0][1] == 1 for c in changelog)


def later(record: Record, offset: int) -> Record:
    """The record's card again, 40 days on (every other card is then idle)."""
    event_time = record.transaction.event_time + 40 * MS_PER_DAY
    partition = record.position[0]
    return Record(
        msgspec.structs.replace(record.transaction, event_time=event_time), (partition, offset)
    )


def test_idle_cards_get_tombstones_in_their_own_partition() -> None:
    stream = records(200, partitions=2)
    state = new_state([0, 1], evict_interval_s=0.0)
    update(state, stream)
    cards = {p: {r.transaction.card_id for r in stream if r.position[0][1] == p} for p in (0, 1)}
    first = {p: next(r for r in stream if r.position[0][1] == p) for p in (0, 1)}

    for p in (0, 1):
        # Only the batch's own partition is evicted, as of its own newest event time.
        _, changelog = update(state, [later(first[p], 10_000)])
        tombstones = [c for c in changelog if c.state is None]
        assert {c.card_id for c in tombstones} == cards[p] - {first[p].transaction.card_id}
        assert all(c.partition == p and c.batch_index == 0 for c in tombstones)


class LeaderElection:
    """A consumer whose partition has no leader for its first `refusals` questions."""

    def __init__(self, refusals: int, code: int = KafkaError.NOT_LEADER_FOR_PARTITION) -> None:
        self.refusals = refusals
        self.code = code
        self.asked = 0

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float) -> tuple[int, int]:
        self.asked += 1
        if self.asked <= self.refusals:
            raise KafkaException(KafkaError(self.code))
        return 0, 42


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.NOT_LEADER_FOR_PARTITION,
        # The client's metadata does not know a changelog just created yet (it once stopped a
        # replica whose background restore asked at once).
        KafkaError._UNKNOWN_PARTITION,
    ],
)
def test_a_changelog_without_a_leader_yet_is_asked_again(
    monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    monkeypatch.setattr(card_history_changelog, "LEADER_RETRY_S", 0.0)
    consumer = LeaderElection(refusals=3, code=code)
    assert watermarks(consumer, TopicPartition("changelog", 0)) == (0, 42)  # type: ignore[arg-type]
    assert consumer.asked == 4


def test_other_changelog_errors_are_not_asked_again() -> None:
    consumer = LeaderElection(refusals=1, code=KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        watermarks(consumer, TopicPartition("changelog", 0))  # type: ignore[arg-type]
    assert consumer.asked == 1


def test_a_restore_holds_the_state_lock_for_a_piece_of_each_read_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The partitions kept wait for each hold of the lock: a read of 2,500 changelog records
    loads in pieces of RESTORE_APPLY_CHUNK, each under the lock, and all of it loads."""
    changelog = MemoryChangelog(chunk=2_500)
    valid = bytes([STATE_VERSION]) + bytes(STATE_BYTES - 1)
    for card in range(2_500):
        changelog.append(0, f"card-{card}", valid)
    registry = CollectorRegistry()
    state = new_state([], registry, changelog=changelog)
    holds: list[tuple[int, bool]] = []
    load = CardHistoryStore.restore_states

    def recorded(store: CardHistoryStore, keys: list[str], states: list[bytes | None]) -> Restored:
        holds.append((len(keys), state._lock.locked()))
        return load(store, keys, states)

    monkeypatch.setattr(CardHistoryStore, "restore_states", recorded)
    state.restore([0])
    piece = card_history_restore.RESTORE_APPLY_CHUNK
    assert holds == [(piece, True), (piece, True), (2_500 - 2 * piece, True)]
    assert registry.get_sample_value("fraud_card_state_cards") == 2_500


class _HeldCardGauge(ServiceMetrics):
    """Metrics whose first card-count report, once armed, waits until released."""

    def __init__(self) -> None:
        super().__init__(CollectorRegistry())
        self.cards: list[int] = []
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def set_card_state(self, cards: int, size_bytes: int) -> None:
        if self.armed:
            self.armed = False
            self.entered.set()
            self.release.wait(5)
        self.cards.append(cards)
        super().set_card_state(cards, size_bytes)


def test_two_threads_reports_of_the_card_count_land_in_the_order_of_the_changes() -> None:
    # The consuming thread and the restore thread both report the card count: a report read
    # before another thread's change must not be set after that thread's report.
    metrics = _HeldCardGauge()
    state = OwnedCardHistory(MemoryChangelog(), time_scale=1.0, metrics=metrics)
    state.restore([0, 1, 2])
    update(state, records(300, partitions=3))
    metrics.armed = True
    first = threading.Thread(target=state.forget_cards, args=([1],))
    first.start()
    assert metrics.entered.wait(5)
    second = threading.Thread(target=state.forget_cards, args=([0, 2],))
    second.start()
    second.join(0.3)
    assert second.is_alive()  # its change waits until the first report is set
    metrics.release.set()
    first.join(5)
    second.join(5)
    assert metrics.cards[-2] > 0  # the first thread's count, with partitions 0 and 2 still held
    assert metrics.cards[-1] == 0  # the second thread's, after all three went
