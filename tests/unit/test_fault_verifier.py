"""The fault suite's verifier on in-memory records: a clean run passes, and each check fails
when its violation is injected."""

from __future__ import annotations

import pytest

from faults.verifier import DeadLetter, Decision, FaultWindow, InputRecord, Report, verify
from faults.zombie import Freeze

T0 = 1_800_000_000_000
GUARANTEES = [pytest.param(False, id="at-least-once"), pytest.param(True, id="exactly-once")]


def inputs(n: int = 6, partitions: int = 2) -> list[InputRecord]:
    """n transactions over `partitions` partitions, one every 10 ms; card = partition."""
    return [
        InputRecord(i % partitions, i // partitions, T0 + 10 * i, f"t{i}", f"card-{i % partitions}")
        for i in range(n)
    ]


def decision(
    record: InputRecord, offset: int, *, content: str = "approve", at: int = 5
) -> Decision:
    assert record.transaction_id is not None and record.card_id is not None
    return Decision(
        record.partition,
        offset,
        record.transaction_id,
        record.card_id,
        content,
        record.timestamp_ms + at,
    )


def decide_all(records: list[InputRecord]) -> list[Decision]:
    """Decisions in input order, output partition = input partition."""
    return [decision(r, r.offset) for r in records]


def check(
    records: list[InputRecord],
    decisions: list[Decision],
    letters: list[DeadLetter] | None = None,
    faults: list[FaultWindow] | None = None,
    *,
    exactly_once: bool = False,
) -> Report:
    return verify(records, decisions, letters or [], faults or [], exactly_once=exactly_once)


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_one_outcome_each_in_order_passes(exactly_once: bool) -> None:
    records = inputs()
    bad = InputRecord(0, 3, T0 + 100, None, None)
    letter = DeadLetter(0, 0, 0, 3, ("decode", b"{"), T0 + 105)
    report = check([*records, bad], decide_all(records), [letter], exactly_once=exactly_once)
    assert report.violations() == []
    assert (report.inputs, report.decided, report.dead_lettered) == (7, 6, 1)
    assert report.max_latency_s == pytest.approx(0.005)


def test_a_record_without_outcome_is_lost() -> None:
    records = inputs()
    report = check(records, decide_all(records)[:-1])
    assert report.lost == 1
    assert report.violations() == ["1 input records have no outcome"]
    assert "lost: input (1, 2) t5" in report.examples


def test_a_record_with_a_decision_and_a_dead_letter_breaks_disjointness() -> None:
    records = inputs()
    letter = DeadLetter(0, 0, records[0].partition, records[0].offset, ("score", b"x"), T0)
    report = check(records, decide_all(records), [letter])
    assert report.both == 1
    assert "1 input records have a decision and a dead letter" in report.violations()


def test_an_outcome_of_no_input_record_is_unexpected() -> None:
    records = inputs()
    stray = Decision(0, 99, "never-sent", "card-0", "approve", T0)
    letter = DeadLetter(0, 0, 5, 0, ("decode", b"{"), T0)
    report = check(records, [*decide_all(records), stray], [letter])
    assert report.unexpected == 2
    assert report.violations() == ["2 outcomes belong to no input record"]


def test_exactly_once_allows_no_duplicate_even_in_a_fault_window() -> None:
    records = inputs()
    fault = FaultWindow("kill", T0, T0 + 1_000, {0: 0, 1: 0})
    twice = [*decide_all(records), decision(records[4], 10)]
    assert check(records, twice, faults=[fault], exactly_once=False).violations() == []
    report = check(records, twice, faults=[fault], exactly_once=True)
    assert report.duplicates == 1
    assert report.violations() == ["exactly-once: 1 duplicate outcomes visible"]


def test_at_least_once_duplicates_only_among_records_in_flight_at_a_fault() -> None:
    records = inputs(8)  # partition 0: t0 t2 t4 t6 at offsets 0..3
    # Committed up to offset 2 of partition 0 when the fault began; it ended before t6 was sent.
    fault = FaultWindow("kill", T0 + 35, T0 + 55, {0: 2, 1: 4})
    inside = decision(records[4], 10)  # offset 2, sent at +40: in flight
    committed_before = decision(records[2], 11)  # offset 1: committed before the fault
    sent_after = decision(records[6], 12)  # offset 3, sent at +60: after the fault ended
    base = decide_all(records)
    assert check(records, [*base, inside], faults=[fault]).violations() == []
    for outside in (committed_before, sent_after):
        report = check(records, [*base, inside, outside], faults=[fault])
        assert (report.duplicates, report.duplicates_outside_faults) == (2, 1)
        assert report.violations() == ["1 duplicates of records not in flight at a fault"]
    without_fault = check(records, [*base, inside])
    assert without_fault.duplicates_outside_faults == 1


def test_a_duplicate_that_differs_from_the_first_is_reported() -> None:
    records = inputs()
    fault = FaultWindow("kill", T0, T0 + 1_000, {0: 0, 1: 0})
    differing = decision(records[3], 10, content="decline")
    report = check(records, [*decide_all(records), differing], faults=[fault])
    assert report.duplicates_not_identical == 1
    assert report.violations() == ["1 duplicates differ from the first"]


def test_a_rescored_duplicate_passes_only_where_rescoring_is_allowed() -> None:
    records = inputs()
    fault = FaultWindow("kill", T0, T0 + 1_000, {0: 0, 1: 0})
    base = [d._replace(verdict=(0.1, "approve")) for d in decide_all(records)]
    rescored = base[3]._replace(offset=10, verdict=(0.2, "approve"))
    other_card = rescored._replace(content="other card")
    duplicates = [*base, rescored]

    strict = verify(records, duplicates, [], [fault], exactly_once=False)
    assert (strict.duplicates_not_identical, strict.duplicates_rescored) == (1, 0)
    allowed = verify(records, duplicates, [], [fault], exactly_once=False, rescoring_allowed=True)
    assert allowed.violations() == []
    assert (allowed.duplicates_not_identical, allowed.duplicates_rescored) == (0, 1)
    # Rescoring never excuses a duplicate that differs in anything else.
    changed = verify(
        records, [*base, other_card], [], [fault], exactly_once=False, rescoring_allowed=True
    )
    assert changed.violations() == ["1 duplicates differ from the first"]


def test_a_duplicate_dead_letter_must_repeat_reason_and_value() -> None:
    records = [InputRecord(0, 0, T0, None, None)]
    fault = FaultWindow("kill", T0, T0 + 1_000, {0: 0})
    first = DeadLetter(0, 0, 0, 0, ("decode", b"{"), T0 + 5)
    same, other = first._replace(offset=1), first._replace(offset=1, content=("produce", b"{"))
    assert check(records, [], [first, same], [fault]).violations() == []
    assert check(records, [], [first, other], [fault]).duplicates_not_identical == 1


def test_decisions_out_of_their_cards_input_order_are_reported() -> None:
    records = inputs(6, partitions=1)  # one card, t0..t5 at offsets 0..5
    decisions = decide_all(records)
    swapped = [decisions[0], decisions[2]._replace(offset=1), decisions[1]._replace(offset=2)]
    report = check(records, [*swapped, *decisions[3:]])
    assert report.order_violations == 1
    assert report.violations() == ["1 decisions out of their card's input order"]


def test_a_replayed_tail_after_a_crash_keeps_first_appearance_order() -> None:
    records = inputs(4, partitions=1)
    fault = FaultWindow("kill", T0, T0 + 1_000, {0: 1})
    d = decide_all(records)
    replayed = [d[0], d[1], d[2], d[1]._replace(offset=3), d[2]._replace(offset=4)]
    replayed.append(d[3]._replace(offset=5))
    assert check(records, replayed, faults=[fault]).violations() == []


def test_a_cards_decisions_split_over_two_partitions_are_out_of_order() -> None:
    records = inputs(4, partitions=1)
    decisions = decide_all(records)
    decisions[2] = decisions[2]._replace(partition=1)
    assert check(records, decisions).order_violations >= 1


def test_an_input_repeating_a_transaction_id_is_reported() -> None:
    records = inputs()
    repeat = records[1]._replace(offset=7)
    report = check([*records, repeat], decide_all(records))
    assert report.input_repeats == 1
    assert "the input holds 1 transaction ids more than once" in report.violations()


def test_recovery_runs_until_the_last_late_record_got_its_outcome() -> None:
    records = inputs(20, partitions=1)  # one every 10 ms from T0
    # A fault at +50 ms: records sent from +40 to +120 wait until +2,150 for their decision.
    late = {4, 5, 6, 7, 8, 9, 10, 11, 12}
    decisions = [
        decision(r, r.offset, at=2_150 - 10 * r.offset if r.offset in late else 5) for r in records
    ]
    fault = FaultWindow("kill", T0 + 50, T0 + 50, {0: 4})
    report = check(records, decisions, faults=[fault])
    assert report.recovery_s == pytest.approx((2.1,))
    assert report.max_latency_s == pytest.approx(2.11)
    quiet = check(records, decide_all(records), faults=[fault])
    assert quiet.recovery_s == (0.0,)


def test_recovery_uses_when_a_live_reader_saw_the_decision() -> None:
    records = inputs(2, partitions=1)
    fault = FaultWindow("zombie", T0, T0 + 100, {0: 0})
    decisions = decide_all(records)
    decisions[1] = decisions[1]._replace(visible_at_ms=T0 + 3_000)
    assert check(records, decisions, faults=[fault]).recovery_s == pytest.approx((3.0,))


def test_a_record_caught_by_the_next_fault_counts_for_that_one() -> None:
    records = inputs(300, partitions=1)  # one every 10 ms, from T0 to T0 + 2,990
    first = FaultWindow("kill a", T0 + 100, T0 + 100, {0: 10})
    second = FaultWindow("kill b", T0 + 2_000, T0 + 2_000, {0: 200})
    # Late after the first fault: sent from +100 to +500, decided at +1,500. Sent at +1,500
    # (before the second fault, but within a second of it): decided at +6,000.
    late = {r.offset: T0 + 1_500 for r in records if 10 <= r.offset <= 50}
    late[150] = T0 + 6_000
    decisions = [
        decision(r, r.offset, at=late[r.offset] - r.timestamp_ms if r.offset in late else 5)
        for r in records
    ]
    report = check(records, decisions, faults=[first, second])
    assert report.recovery_s == pytest.approx((1.4, 4.0))


def test_a_zombie_late_write_counts_only_when_it_repeats_a_decision() -> None:
    """Scenario 3's account: a late write of the zombie (partition 0) that appears once is a
    commit completed at the thaw; one repeated by the new owner is a fencing failure; the other
    replica's writes held behind the zombie's transaction are counted apart."""
    records = inputs(6)
    freeze = Freeze(stopped_ms=T0 + 100, thawed_ms=T0 + 9_000, partitions=frozenset({0}))

    def late(record: InputRecord, offset: int) -> Decision:
        return decision(record, offset)._replace(produced_ms=T0 + 50, visible_at_ms=T0 + 9_100)

    on_time = [
        decision(r, r.offset)._replace(produced_ms=T0, visible_at_ms=T0 + 60) for r in records
    ]
    # t0 (zombie's) completes at the thaw, once; t1 (the other replica's) was held back.
    once = [late(records[0], 0), late(records[1], 0), *on_time[2:]]
    assert freeze.late_writes(records, once) == (1, 0, 1)
    # The new owner decided t0 as well: the zombie's late write repeats it.
    twice = [*once, decision(records[0], 9)._replace(produced_ms=T0 + 9_500)]
    assert freeze.late_writes(records, twice) == (1, 1, 1)
    # Produced after the freeze, or visible before the thaw: not late.
    assert freeze.late_writes(records, on_time) == (0, 0, 0)
