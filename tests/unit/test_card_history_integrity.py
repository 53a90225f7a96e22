"""The card state against records and retries that used to corrupt it silently (the state
review): a record dated in the far future, one from the far past, a changelog whose records of
a card arrived out of order, and an aborted transaction undone in memory. The changelog is an
in-memory list here; tests/integration/test_state_integrity.py drives the real broker."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import msgspec
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

import stream.card_history_restore as card_history_restore
from contracts.event_time import EventClock
from contracts.offsets import SourceOffset
from contracts.transaction import MAX_EVENT_TIME_MS, Transaction, decode_transaction
from scorer.card_history import MS_PER_DAY, CardHistory
from scorer.card_history_record import SERIALIZED_STATE_DTYPE, STATE_DTYPE, STATE_VERSION
from scorer.columns import TransactionColumns
from simulator.transactions import TransactionSimulator
from stream.metrics import ServiceMetrics
from stream.owned_card_history import OwnedCardHistory
from tests.unit.fakes import Change, MemoryChangelog, changes

TOPIC = "transactions"
#: The simulated stream's clock (January 2026) is the wall clock of these tests.
SIMULATED = TransactionSimulator(3, num_cards=1_000, num_terminals=200).generate(6_000)
NOW_MS = int(SIMULATED.columns.event_time.max())


class Record(NamedTuple):
    transaction: Transaction
    position: SourceOffset


def stream(partitions: int = 1) -> list[Record]:
    out, offsets = [], [0] * partitions
    for record in SIMULATED.records:
        transaction = decode_transaction(msgspec.json.encode(record))
        partition = zlib.crc32(transaction.card_id.encode()) % partitions
        out.append(Record(transaction, ((TOPIC, partition), offsets[partition])))
        offsets[partition] += 1
    return out


def at(record: Record, offset: int, event_time: int) -> Record:
    """The record's transaction at another offset and event time."""
    moved = msgspec.structs.replace(record.transaction, event_time=event_time)
    return Record(moved, (record.position[0], offset))


def new_state(
    changelog: MemoryChangelog,
    registry: CollectorRegistry | None = None,
    *,
    partitions: list[int] | None = None,
    **settings: Any,
) -> OwnedCardHistory:
    """A card state owning `partitions` (default: 0 and those the changelog holds)."""
    state = OwnedCardHistory(
        changelog,
        time_scale=1.0,
        metrics=ServiceMetrics(registry or CollectorRegistry()),
        clock=EventClock(wall_ms=lambda: NOW_MS),
        **settings,
    )
    state.restore(sorted({0, *changelog.partitions}) if partitions is None else partitions)
    return state


def apply(state: OwnedCardHistory, changelog: MemoryChangelog, batch: list[Record]) -> list[Change]:
    """One batch through the state, its changelog records written (as the sink does)."""
    columns = TransactionColumns.from_transactions([r.transaction for r in batch])
    records = changes(state.update(batch, columns)[1])
    for record in records:
        changelog.append(record.partition, record.card_id, record.state)
    return records


def held(state: OwnedCardHistory, card_ids: set[str], partition: int = 0) -> dict[str, bytes]:
    """The serialized state of each of these cards that `state` holds."""
    found = {card: state.current(partition, card).state for card in card_ids}
    return {card: value for card, value in found.items() if value is not None}


def test_a_record_dated_in_the_far_future_forgets_no_card() -> None:
    # Finding 1: eviction took the batch's newest event time as "now", so one valid record
    # dated 9999-12-31 made every card of the partition idle: all forgotten, each tombstoned.
    changelog = MemoryChangelog()
    registry = CollectorRegistry()
    state = new_state(changelog, registry, evict_interval_s=0.0)
    records = stream()
    for start in range(0, len(records), 256):
        apply(state, changelog, records[start : start + 256])
    cards = {r.transaction.card_id for r in records}
    before = held(state, cards)
    assert len(before) == len(cards) > 500

    future = at(records[0], len(records), MAX_EVENT_TIME_MS)
    written = apply(state, changelog, [future])

    assert not [r for r in written if r.state is None], "no card was tombstoned"
    assert set(held(state, cards)) == cards
    assert (
        registry.get_sample_value(
            "fraud_state_event_time_out_of_bounds_total", {"reason": "future"}
        )
        == 1
    )
    # It counted, as of its partition's clock (the newest trusted event time), not later.
    card = future.transaction.card_id
    last_ms = np.frombuffer(held(state, {card})[card][1:], STATE_DTYPE)["last_ms"][0]
    assert last_ms == NOW_MS
    restored = new_state(changelog)
    assert held(restored, cards) == held(state, cards), "the changelog agrees"


def test_a_future_record_cannot_move_the_clock_that_evicts() -> None:
    # The eviction still works, as of the partition's own clock: a card idle for 32 days is
    # forgotten, the others stay, whatever a future record says.
    changelog = MemoryChangelog()
    state = new_state(changelog, evict_interval_s=0.0)
    records = stream()
    old = at(records[0], 0, NOW_MS - 32 * MS_PER_DAY)
    recent = at(records[1], 1, NOW_MS)
    written = apply(state, changelog, [old]) + apply(state, changelog, [recent])
    written += apply(state, changelog, [at(records[2], 2, MAX_EVENT_TIME_MS)])
    tombstones = {r.card_id for r in written if r.state is None}
    assert tombstones == {old.transaction.card_id}


def test_a_stream_replayed_from_the_past_is_not_moved_to_today_by_one_record() -> None:
    # A backlog of last year's transactions (a replay, a benchmark): a record past the wall
    # clock must not move the partition's clock to today either, which would make every card
    # of the replay idle.
    changelog = MemoryChangelog()
    state = OwnedCardHistory(
        changelog,
        time_scale=1.0,
        metrics=ServiceMetrics(CollectorRegistry()),
        clock=EventClock(wall_ms=lambda: NOW_MS + 300 * MS_PER_DAY),
        evict_interval_s=0.0,
    )
    state.restore([0])
    records = stream()
    apply(state, changelog, records[:2_000])
    written = apply(state, changelog, [at(records[0], 2_000, MAX_EVENT_TIME_MS)])
    assert [r for r in written if r.state is None] == []


def test_a_record_older_than_every_window_changes_no_state() -> None:
    changelog = MemoryChangelog()
    registry = CollectorRegistry()
    state = new_state(changelog, registry)
    records = stream()
    apply(state, changelog, records[:500])
    cards = {r.transaction.card_id for r in records[:500]}
    before = held(state, cards)
    ancient = at(records[10], 500, 0)  # 1970: a replay gone wrong, a default value
    written = apply(state, changelog, [ancient])
    assert written == [] and held(state, cards) == before
    assert (
        registry.get_sample_value("fraud_state_event_time_out_of_bounds_total", {"reason": "stale"})
        == 1
    )


def test_a_restore_keeps_each_cards_newest_state_whatever_order_it_was_written_in() -> None:
    # Finding 3: a retried changelog record reached the topic after a newer state of its card,
    # and a restore kept the last one it read, rolling the card back.
    changelog = MemoryChangelog()
    state = new_state(changelog)
    records = stream()
    first = apply(state, changelog, records[:300])
    newer = apply(state, changelog, records[300:600])
    cards = {r.card_id for r in newer}
    current = held(state, cards)
    for record in first:  # the older states of the same cards, written again last
        if record.card_id in cards:
            changelog.append(record.partition, record.card_id, record.state)
    assert held(new_state(changelog), cards) == current
    changelog.compact()  # what the broker keeps: each card's last record, the stale one
    rolled_back = held(new_state(changelog), cards)
    assert rolled_back != current, "a restore cannot mend a compacted log: the writer must"


def state_bytes(offset: int) -> bytes:
    """A card state that has applied input offsets up to `offset`."""
    record = np.zeros(1, SERIALIZED_STATE_DTYPE)
    record["version"] = STATE_VERSION
    record["state"]["offset"] = offset
    return record.tobytes()


def applied(history: CardHistory, card: str) -> int | None:
    state = history.state_of(card)
    return (
        None
        if state is None
        else int(np.frombuffer(state, SERIALIZED_STATE_DTYPE)["state"]["offset"][0])
    )


def test_a_restore_keeps_the_highest_offset_and_starts_anew_after_a_tombstone() -> None:
    cases: list[tuple[list[tuple[str, bytes | None]], int | None]] = [
        ([("c", state_bytes(5)), ("c", state_bytes(3))], 5),
        ([("c", state_bytes(5)), ("c", state_bytes(5))], 5),
        ([("c", state_bytes(5)), ("c", None)], None),
        # Evicted, then seen again: the state after the tombstone is the card's, whatever the
        # offset (a card state resent after eviction is the tombstone, never an old state).
        ([("c", state_bytes(5)), ("c", None), ("c", state_bytes(5))], 5),
        ([("c", state_bytes(5)), ("c", None), ("c", state_bytes(6)), ("c", state_bytes(3))], 6),
    ]
    for log, expected in cases:
        in_one = CardHistory()
        in_one.restore(log)
        chunked = CardHistory()
        for record in log:  # a chunk a record: the same card as one chunk
            chunked.restore([record])
        assert applied(in_one, "c") == applied(chunked, "c") == expected, log


@pytest.mark.parametrize("chunk", [1, 100_000], ids=["records-one-by-one", "one-run-with-repeats"])
def test_a_restored_partition_knows_a_stale_record(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A restore used to start the partition's clock anew: the first record after it, however
    # old, was applied, so a replay of last year's records after a rebalance rewrote cards the
    # owner before would have left alone. Read one record at a time, every run is distinct
    # (`CardHistoryStore`'s numpy path); read whole, the run repeats cards (its step-by-step path).
    monkeypatch.setattr(card_history_restore, "RESTORE_APPLY_CHUNK", chunk)
    changelog = MemoryChangelog(chunk=chunk)
    records = stream()
    owner = new_state(changelog)
    for half in (records[: len(records) // 2], records[len(records) // 2 :]):
        apply(owner, changelog, half)  # two batches: cards repeat in the changelog
    registry = CollectorRegistry()
    restored = new_state(changelog, registry)
    cards = {r.transaction.card_id for r in records}
    before = held(restored, cards)

    old = at(records[0], len(records), NOW_MS - 400 * MS_PER_DAY)
    assert apply(restored, changelog, [old]) == []

    assert held(restored, cards) == before
    assert (
        registry.get_sample_value("fraud_state_event_time_out_of_bounds_total", {"reason": "stale"})
        == 1
    )


def test_an_aborted_transaction_is_undone_without_reading_the_changelog() -> None:
    # Finding 8: every abort reloaded the replica's whole card state from the changelog (about
    # 9 s per million cards), so records that make transactions abort were a denial of service.
    changelog = MemoryChangelog()
    registry = CollectorRegistry()
    state = new_state(changelog, registry, undo=True, evict_interval_s=0.0)
    records = stream(partitions=2)
    committed = MemoryChangelog()

    def batch(start: int, end: int) -> list[Change]:
        return apply(state, changelog, records[start:end])

    for written in (batch(0, 400), batch(400, 800)):
        for record in written:
            committed.append(record.partition, record.card_id, record.state)
    positions = {
        p: 1 + max(r.position[1] for r in records[:800] if r.position[0][1] == p) for p in (0, 1)
    }
    state.committed({(TOPIC, p): o for p, o in positions.items()})
    cards = {r.transaction.card_id for r in records}
    before = {p: held(state, cards, p) for p in (0, 1)}
    batch(800, 1_300)
    batch(1_300, 1_301)
    batch(1_301, 2_000)
    reads: list[int] = []

    def read(
        partition: int, progress: Callable[[], None], start: int = 0
    ) -> Iterator[list[tuple[str, bytes | None]]]:
        reads.append(partition)
        return iter(())

    changelog.read = read  # type: ignore[method-assign]

    state.rollback(positions)

    assert reads == [], "undone in memory"
    assert {p: held(state, cards, p) for p in (0, 1)} == before
    assert registry.get_sample_value("fraud_state_rollbacks_total", {"method": "undo"}) == 1
    restored = new_state(committed)
    assert {p: held(restored, cards, p) for p in (0, 1)} == before


def test_a_future_record_on_a_partition_without_a_clock_changes_no_state() -> None:
    # Counted as of what clock? A new partition knows no time yet: a made-up one (the bound)
    # would become the clock a restore resumes from and make a replay's cards stale.
    changelog = MemoryChangelog()
    registry = CollectorRegistry()
    state = new_state(changelog, registry)
    records = stream()
    future = at(records[0], 0, MAX_EVENT_TIME_MS)
    assert apply(state, changelog, [future]) == []
    assert held(state, {future.transaction.card_id}) == {}
    assert (
        registry.get_sample_value(
            "fraud_state_event_time_out_of_bounds_total", {"reason": "future"}
        )
        == 1
    )
    # The partition's first trusted record starts its clock as usual.
    assert [r.card_id for r in apply(state, changelog, records[1:2])] == [
        records[1].transaction.card_id
    ]
