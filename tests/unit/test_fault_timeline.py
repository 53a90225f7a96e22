"""The fault suite's decision timeline (`faults/timeline.py`) and what it reads in a replica's
log (`faults/replica_logs.py`), on in-memory records and log text."""

from __future__ import annotations

import pytest

from faults.replica_logs import Restore, Resume, moved_away, restores, resumes
from faults.timeline import Latency, PartitionGap, Silence, latency, longest_gaps, silences
from faults.verifier import Decision, InputRecord

T0 = 1_800_000_000_000


def record(partition: int, offset: int, sent_ms: int) -> InputRecord:
    return InputRecord(partition, offset, T0 + sent_ms, f"t{partition}-{offset}", "card")


def decided(r: InputRecord, after_ms: int, *, event_ms: int | None = None) -> Decision:
    assert r.transaction_id is not None
    event = r.timestamp_ms if event_ms is None else T0 + event_ms
    return Decision(
        0, r.offset, r.transaction_id, "card", "c", r.timestamp_ms + after_ms, event_time_ms=event
    )


def every_10_ms(partition: int, n: int) -> list[InputRecord]:
    return [record(partition, i, 10 * i) for i in range(n)]


def test_the_longest_gap_is_between_consecutive_decisions_of_a_partition() -> None:
    records = every_10_ms(0, 5)
    # From the third record on, the partition stalls until T0 + 720: silent since 10 + 5 ms.
    decisions = [decided(r, 5 if r.offset < 2 else 720 - 10 * r.offset) for r in records]
    [gap] = longest_gaps(records, decisions, {0})
    assert gap == PartitionGap(
        0, decisions_ms=705, ended_at_ms=T0 + 720, input_ms=10, waited_ms=700
    ), "the third record waited from its production at T0 + 20"


def test_gaps_follow_decided_at_not_the_topic_order() -> None:
    records = every_10_ms(0, 3)
    decisions = [decided(r, 5) for r in reversed(records)]
    assert longest_gaps(records, decisions, {0})[0].decisions_ms == 10


def test_only_the_partitions_asked_for_count() -> None:
    kept, moved = every_10_ms(0, 3), every_10_ms(1, 3)
    decisions = [decided(r, 5) for r in kept] + [decided(r, 5_000 * r.offset) for r in moved]
    gaps = longest_gaps(kept + moved, decisions, {0})
    assert [(g.partition, g.decisions_ms) for g in gaps] == [(0, 10)]
    assert longest_gaps(kept + moved, decisions, {1})[0].decisions_ms == 5_010


def test_a_silent_input_shows_in_the_input_gap_not_in_the_wait() -> None:
    records = [record(0, 0, 0), record(0, 1, 2_000), record(0, 2, 2_010)]
    gap = longest_gaps(records, [decided(r, 5) for r in records], {0})[0]
    assert (gap.decisions_ms, gap.input_ms, gap.waited_ms) == (2_000, 2_000, 5)


def test_a_record_left_undecided_makes_every_gap_after_its_production_a_wait() -> None:
    records = every_10_ms(0, 4)
    # The first record is decided only at 3,000; the others promptly: the partition decided
    # nothing between 35 and 3,000 while the first record waited since 0.
    after = {0: 3_000, 1: 5, 2: 5, 3: 5}
    decisions = [decided(r, after[r.offset]) for r in records]
    gap = longest_gaps(records, decisions, {0})[0]
    assert (gap.decisions_ms, gap.waited_ms) == (2_965, 2_965)


def test_a_duplicate_counts_as_a_sign_of_life() -> None:
    records = every_10_ms(0, 2)
    first, second = records
    # The first record's repeat, 300 ms after the first decision, splits a 600 ms silence.
    decisions = [decided(first, 5), decided(first, 305), decided(second, 595)]
    assert longest_gaps(records, decisions, {0})[0].decisions_ms == 300


def test_a_partition_with_under_two_decisions_has_no_gap() -> None:
    records = every_10_ms(0, 2)
    gaps = longest_gaps(records, [decided(records[0], 5)], {0, 3})
    assert [(g.partition, g.decisions_ms, g.waited_ms) for g in gaps] == [(0, 0, 0), (3, 0, 0)]


def test_silences_are_every_gap_longer_than_asked() -> None:
    records = every_10_ms(0, 4) + every_10_ms(1, 2)
    times = {(0, 0): 0, (0, 1): 1_500, (0, 2): 1_600, (0, 3): 3_000, (1, 0): 0, (1, 1): 900}
    decisions = [decided(r, times[r.partition, r.offset] - 10 * r.offset) for r in records]
    assert silences(records, decisions, {0, 1}, 1_000) == [
        Silence(0, T0, T0 + 1_500),
        Silence(0, T0 + 1_600, T0 + 3_000),
    ]
    assert silences(records, decisions, {1}, 1_000) == []


def test_latency_takes_each_transactions_first_decision() -> None:
    records = every_10_ms(0, 100)
    decisions = [decided(r, 10 + r.offset) for r in records]
    decisions.append(decided(records[0], 90_000))  # a repeat, much later: not its latency
    found = latency(decisions)
    assert found.decided == 100
    assert found.p50_ms == pytest.approx(59.5)
    assert found.p99_ms == pytest.approx(108.01)
    assert found.max_ms == 109


def test_latency_is_from_the_event_time_not_the_record_timestamp() -> None:
    r = record(0, 0, 1_000)
    assert latency([decided(r, 5, event_ms=0)]).max_ms == 1_005


def test_latency_of_nothing_is_zero() -> None:
    undated = decided(record(0, 0, 0), 5)._replace(event_time_ms=None)
    assert latency([undated]) == Latency(0, 0.0, 0.0, 0.0)


# The service's own lines (stream/service.py, stream/owned_card_history.py), as a replica logs
# them.
LOG = """\
2026-12-03 08:00:00,001 INFO stream.service: assigned tx[0], tx[1], tx[2], tx[3]
2026-12-03 08:00:01,002 INFO stream.owned_card_history: restored card state \
topic=g-card-state-changelog partition=0 cards=16667 changelog_records=16667 in 0.412s
2026-12-03 08:00:01,003 INFO stream.service: partition=0 resumed: its card state loaded 0.420s \
after its assignment
2026-12-03 08:00:09,004 INFO stream.service: revoked tx[1], tx[3]: releasing 12 undecided \
records, committing what was decided
2026-12-03 08:00:10,005 WARNING stream.service: lost tx[2]: 0 undecided records released, \
nothing of them is committed
2026-12-03 08:00:11,006 INFO stream.service: revoked other-tx[0]: releasing 0 undecided records
2026-12-03 08:00:12,007 INFO stream.service: assigned tx[1]
2026-12-03 08:00:12,107 INFO stream.owned_card_history: restored card state \
topic=g-card-state-changelog \
partition=1 cards=3 changelog_records=950 (kept cards, changelog read from 16700) in 0.031s
"""


def test_moved_away_reads_revoked_and_lost_partitions_of_the_topic() -> None:
    assert moved_away(LOG, "tx") == {1, 2, 3}
    assert moved_away(LOG, "other-tx") == {0}
    assert moved_away(LOG.splitlines()[0], "tx") == set()


def test_restores_and_resumes_are_read_with_their_figures() -> None:
    assert restores(LOG) == [
        Restore(0, 16_667, 16_667, False, 0.412),
        Restore(1, 3, 950, True, 0.031),
    ]
    assert resumes(LOG) == [Resume(0, 0.42)]
    assert restores("") == [] and resumes("") == []
