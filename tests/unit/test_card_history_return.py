"""A partition that comes back to the replica that gave it up (stream/card_history_restore.py, "Warm
return"): its kept cards plus the changelog's records since must equal a full replay of the
changelog, the next owner's updates and tombstones included; a changelog that lost those records,
a partition kept too long and `retain_s` 0 read the whole changelog. The changelog is an
in-memory list here; tests/integration/test_card_history.py drives the real broker."""

from __future__ import annotations

import time

import numpy as np
from prometheus_client import CollectorRegistry

from scorer.card_history import MS_PER_DAY, neutral_history
from scorer.columns import TransactionColumns
from stream.owned_card_history import OwnedCardHistory
from tests.unit.fakes import MemoryChangelog, changes
from tests.unit.test_card_history_integrity import (
    NOW_MS,
    Record,
    apply,
    at,
    held,
    new_state,
    stream,
)

RECORDS = stream(partitions=2)
CARDS = {r.transaction.card_id for r in RECORDS}
FIRST, SECOND, THIRD = RECORDS[:2_500], RECORDS[2_500:4_500], RECORDS[4_500:]


def of(partition: int, records: list[Record]) -> list[Record]:
    return [r for r in records if r.position[0][1] == partition]


def features(state: OwnedCardHistory, batch: list[Record]) -> np.ndarray:
    columns = TransactionColumns.from_transactions([r.transaction for r in batch])
    rows, _ = state.update(batch, columns)
    assert rows is not None
    return rows


def restores(registry: CollectorRegistry, read: str) -> tuple[float | None, float | None]:
    """How many restores of that kind (`read`: whole or tail) ran, and the records they read."""
    labels = {"read": read}
    return (
        registry.get_sample_value("fraud_state_restore_seconds_count", labels),
        registry.get_sample_value("fraud_state_restore_changelog_records_total", labels),
    )


def given_up_and_moved_on(
    changelog: MemoryChangelog, registry: CollectorRegistry | None = None
) -> tuple[OwnedCardHistory, int]:
    """Replica `a` decides FIRST on partitions 0 and 1, gives partition 1 up with its changelog's
    end; replica `b` restores it, decides SECOND's records of it, forgets one card (a tombstone,
    as an eviction writes) and gives it up again. Returns `a` and the end it kept."""
    a = new_state(changelog, registry, partitions=[0, 1], retain_s=600.0)
    apply(a, changelog, FIRST)
    end = changelog.end(1)
    assert a.let_go([1], {1: end}) == [], "its cards are kept"
    b = new_state(changelog, partitions=[1])
    apply(b, changelog, of(1, SECOND))
    changelog.append(1, of(1, FIRST)[0].transaction.card_id, None)
    b.let_go([1])
    apply(a, changelog, of(0, SECOND))
    return a, end


def test_a_partition_back_reads_only_the_tail_and_equals_a_full_replay() -> None:
    changelog, registry = MemoryChangelog(), CollectorRegistry()
    a, end = given_up_and_moved_on(changelog, registry)
    forgotten = of(1, FIRST)[0].transaction.card_id
    assert end > 0
    assert registry.get_sample_value("fraud_state_kept_partitions") == 1
    assert restores(registry, "tail") == (0, 0)

    a.restore([1])
    full = new_state(changelog, partitions=[1])

    assert changelog.reads[-2] == (1, end), "only the records written since it went"
    assert registry.get_sample_value("fraud_state_kept_partitions") == 0
    assert restores(registry, "tail") == (1, changelog.end(1) - end)
    assert restores(registry, "whole") == (2, 0), "the first restores, of an empty changelog"
    expected = held(full, CARDS, 1)
    assert forgotten not in expected
    assert held(a, CARDS, 1) == expected
    # Same cards and the same clock: the next records get the same features.
    later = of(1, THIRD)
    assert np.array_equal(features(a, later), features(full, later))


def test_a_kept_partition_is_not_owned_and_no_batch_changes_it() -> None:
    changelog = MemoryChangelog()
    a = new_state(changelog, partitions=[0, 1], retain_s=600.0)
    apply(a, changelog, FIRST)
    before = len(changelog.partitions[1])
    assert a.let_go([1], {1: changelog.end(1)}) == []

    batch = SECOND[:400]
    columns = TransactionColumns.from_transactions([r.transaction for r in batch])
    rows, written = a.update(batch, columns)

    assert {c.partition for c in changes(written)} == {0}
    assert len(changelog.partitions[1]) == before
    card = of(1, FIRST)[0].transaction.card_id
    assert a.current(1, card).owned is False
    assert rows is not None
    kept = [i for i, r in enumerate(batch) if r.position[0][1] == 1]
    assert np.array_equal(rows[kept], neutral_history(columns)[kept])


def test_a_changelog_that_lost_the_tail_is_read_whole() -> None:
    changelog, registry = MemoryChangelog(), CollectorRegistry()
    a, end = given_up_and_moved_on(changelog, registry)
    changelog.compact()
    changelog.delete_before(1, end + 1)  # retention took records the kept cards lack

    a.restore([1])
    full = new_state(changelog, partitions=[1])

    assert changelog.reads[-3:-1] == [(1, end), (1, 0)]
    assert restores(registry, "tail") == (0, 0), "counted as a whole read"
    assert restores(registry, "whole")[0] == 3, "partitions 0 and 1 at first, then 1"
    assert held(a, CARDS, 1) == held(full, CARDS, 1)


def test_without_retain_or_past_it_the_cards_go_and_a_return_reads_everything() -> None:
    changelog = MemoryChangelog()
    a = new_state(changelog, partitions=[0, 1], retain_s=0.0)
    apply(a, changelog, FIRST)
    assert a.let_go([1], {1: changelog.end(1)}) == [1], "to forget"

    registry = CollectorRegistry()
    b = new_state(changelog, registry, partitions=[0, 1], retain_s=0.05)
    cards = registry.get_sample_value("fraud_card_state_cards")
    assert b.let_go([1], {1: changelog.end(1)}) == []
    b.expire_retained()
    assert registry.get_sample_value("fraud_card_state_cards") == cards, "not expired yet"
    time.sleep(0.06)
    b.expire_retained()
    assert registry.get_sample_value("fraud_card_state_cards") == len(
        {r.transaction.card_id for r in of(0, FIRST)}
    )
    b.restore([1])
    assert changelog.reads[-1] == (1, 0)


def test_kept_cards_past_their_time_are_not_read_over_even_before_they_expire() -> None:
    # Expiry runs on the restore thread once idle: a busy one may restore a partition whose
    # kept cards are past their time before it forgot them.
    changelog = MemoryChangelog()
    a = new_state(changelog, partitions=[0, 1], retain_s=0.05)
    apply(a, changelog, FIRST)
    assert a.let_go([1], {1: changelog.end(1)}) == []
    time.sleep(0.06)

    a.restore([1])

    assert changelog.reads[-1] == (1, 0), "its whole changelog"
    assert held(a, CARDS, 1) == held(new_state(changelog, partitions=[1]), CARDS, 1)


def test_a_partition_back_with_nothing_written_since_keeps_its_clock() -> None:
    changelog = MemoryChangelog()
    a = new_state(changelog, partitions=[0, 1], retain_s=600.0)
    apply(a, changelog, FIRST)
    a.let_go([1], {1: changelog.end(1)})
    a.restore([1])
    full = new_state(changelog, partitions=[1])
    assert changelog.reads[-2] == (1, changelog.end(1))

    # Older than every window as of the partition's clock: stale after the return as before.
    last = of(1, FIRST)[-1]
    stale = [at(last, last.position[1] + 1, NOW_MS - 400 * MS_PER_DAY)]
    columns = TransactionColumns.from_transactions([stale[0].transaction])
    assert changes(a.update(stale, columns)[1]) == []
    assert held(a, CARDS, 1) == held(full, CARDS, 1)


def test_a_replica_warmed_up_reads_only_what_was_written_since() -> None:
    # FRAUD_STATE_WARM_UP: a replica about to join loads every partition, kept; the one it is
    # given reads from the end noted then, and equals a full replay of what its owner wrote
    # meanwhile (a tombstone included).
    changelog, registry = MemoryChangelog(), CollectorRegistry()
    owner = new_state(changelog, partitions=[0, 1])
    apply(owner, changelog, FIRST)
    joining = new_state(changelog, registry, partitions=[], retain_s=600.0)
    reads = len(changelog.reads)

    joining.warm_up()

    assert changelog.reads[reads:] == [(0, 0), (1, 0)]
    assert registry.get_sample_value("fraud_state_kept_partitions") == 2
    assert joining.owned() == []
    end = changelog.end(1)
    apply(owner, changelog, SECOND)
    changelog.append(1, of(1, FIRST)[0].transaction.card_id, None)

    joining.restore([1])
    full = new_state(changelog, partitions=[1])

    assert changelog.reads[-2] == (1, end)
    assert held(joining, CARDS, 1) == held(full, CARDS, 1)
    later = of(1, THIRD)
    assert np.array_equal(features(joining, later), features(full, later))
    assert registry.get_sample_value("fraud_state_kept_partitions") == 1, "partition 0 kept"


def test_records_written_while_warming_up_are_read_again_harmlessly() -> None:
    # The end is noted before the read, which goes on to the end it finds: what the owner
    # wrote in between is read again at the assignment, over cards that already hold it.
    changelog = MemoryChangelog()
    owner = new_state(changelog, partitions=[0, 1])
    apply(owner, changelog, FIRST)
    apply(owner, changelog, SECOND[:1_000])
    joining = new_state(changelog, partitions=[], retain_s=600.0)
    noted = changelog.end(1) - 300
    changelog.end = lambda partition: noted  # type: ignore[method-assign]
    joining.warm_up()
    del changelog.end  # the real one again

    joining.restore([1])

    assert changelog.reads[-1] == (1, noted)
    assert held(joining, CARDS, 1) == held(new_state(changelog, partitions=[1]), CARDS, 1)


def test_no_warm_up_without_retain() -> None:
    changelog = MemoryChangelog()
    apply(new_state(changelog, partitions=[0, 1]), changelog, FIRST)
    joining = new_state(changelog, partitions=[], retain_s=0.0)
    reads = len(changelog.reads)
    joining.warm_up()
    assert len(changelog.reads) == reads
