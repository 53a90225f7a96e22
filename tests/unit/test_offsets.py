"""What may be committed: only prefixes of acknowledged offsets, per partition."""

from __future__ import annotations

from collections import Counter

import pytest

from contracts.offsets import OffsetTracker
from stream.outcomes import OutcomeGroup

P0, P1 = ("tx", 0), ("tx", 1)


def test_commit_position_advances_only_over_a_finished_prefix() -> None:
    tracker = OffsetTracker()
    for offset in (10, 11, 12):
        tracker.track(P0, offset)
    tracker.finish(P0, 11)
    assert tracker.take_commit_positions() == {}
    tracker.finish(P0, 10)
    assert tracker.take_commit_positions() == {P0: 12}
    assert tracker.take_commit_positions() == {}, "a position is reported once"
    tracker.finish(P0, 12)
    assert tracker.take_commit_positions() == {P0: 13}
    assert tracker.in_flight == 0


def test_partitions_are_independent() -> None:
    tracker = OffsetTracker()
    tracker.track(P0, 0)
    tracker.track(P1, 5)
    tracker.finish(P1, 5)
    assert tracker.take_commit_positions() == {P1: 6}
    assert tracker.in_flight == 1


def test_forget_drops_revoked_partitions_and_their_late_acks() -> None:
    tracker = OffsetTracker()
    tracker.track(P0, 1)
    tracker.track(P0, 2)
    tracker.track(P1, 1)
    tracker.finish(P0, 2)
    tracker.forget([P0])
    assert tracker.in_flight == 1
    tracker.finish(P0, 1)  # an acknowledgement arriving after the revoke
    assert tracker.take_commit_positions() == {}
    assert tracker.pending_in([P0, P1]) == 1


def test_outcome_group_finishes_its_sources_after_the_last_delivery() -> None:
    tracker = OffsetTracker()
    for offset in range(3):
        tracker.track(P0, offset)
    completed: list[Counter[tuple[str, str]]] = []
    labels = Counter({("decision", "approve"): 2, ("dead_letter", "score"): 1})
    group = OutcomeGroup(tracker, [(P0, 0), (P0, 1), (P0, 2)], labels, completed.append)
    group.delivered()
    group.delivered()
    assert tracker.take_commit_positions() == {}
    assert completed == []
    group.delivered()
    assert tracker.take_commit_positions() == {P0: 3}
    assert completed == [labels]


def test_a_relabelled_output_is_counted_as_what_it_became() -> None:
    tracker = OffsetTracker()
    tracker.track(P0, 0)
    completed: list[Counter[tuple[str, str]]] = []
    group = OutcomeGroup(tracker, [(P0, 0)], Counter({("decision", "review"): 1}), completed.append)
    group.relabel(("decision", "review"), ("dead_letter", "produce"))
    group.delivered()
    assert +completed[0] == Counter({("dead_letter", "produce"): 1})


def test_an_undelivered_output_keeps_the_group_uncommitted() -> None:
    tracker = OffsetTracker()
    tracker.track(P0, 0)
    tracker.track(P0, 1)
    group = OutcomeGroup(tracker, [(P0, 0), (P0, 1)], Counter({("decision", "approve"): 2}), _never)
    group.delivered()  # the other output is being retried
    assert tracker.take_commit_positions() == {}
    assert tracker.in_flight == 2


def test_outcome_group_needs_an_output() -> None:
    with pytest.raises(ValueError, match="at least one output"):
        OutcomeGroup(OffsetTracker(), [], Counter(), _never)


def _never(*_args: object) -> None:
    raise AssertionError("must not be called")


def test_a_late_acknowledgement_from_before_a_revoke_counts_once() -> None:
    # Finding 11 of the review: acknowledgements of a revoke that timed out arrived after the
    # partition came back, and were counted against the new tracking (in-flight went negative).
    tracker = OffsetTracker()
    tracker.track(P0, 5, size=100)
    tracker.forget([P0])
    tracker.track(P0, 5, size=100)  # assigned here again: re-read from the committed position
    tracker.finish(P0, 5)  # the old output's acknowledgement, late
    tracker.finish(P0, 5)  # the new output's
    assert tracker.in_flight == 0 and tracker.in_flight_bytes == 0
    assert tracker.take_commit_positions() == {P0: 6}


def test_bytes_in_flight_follow_records_until_acknowledged_or_forgotten() -> None:
    tracker = OffsetTracker()
    tracker.track_all([(P0, 1), (P0, 2), (P1, 1)], [1_000, 50, 7])
    assert tracker.in_flight_bytes == 1_057
    tracker.finish(P0, 2)
    assert tracker.in_flight_bytes == 1_007
    assert tracker.forget([P0]) == 1
    assert tracker.in_flight_bytes == 7 and tracker.in_flight == 1
