"""What may be committed: only prefixes of acknowledged offsets, per partition."""

from __future__ import annotations

from collections import Counter

from stream.errors import DeliveryError
from stream.offsets import OffsetTracker
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
    completed: list[Counter[str]] = []
    group = OutcomeGroup(tracker, [(P0, 0), (P0, 1), (P0, 2)], 3, completed.append, _never)
    callbacks = [group.expect(label) for label in ("approve", "approve", "decline")]
    callbacks[0](None)
    callbacks[2](None)
    assert tracker.take_commit_positions() == {}
    callbacks[1](None)
    assert tracker.take_commit_positions() == {P0: 3}
    assert completed == [Counter({"approve": 2, "decline": 1})]


def test_a_failed_delivery_keeps_the_group_uncommitted() -> None:
    tracker = OffsetTracker()
    tracker.track(P0, 0)
    tracker.track(P0, 1)
    failures: list[DeliveryError] = []
    group = OutcomeGroup(tracker, [(P0, 0), (P0, 1)], 2, _never, lambda e, _s: failures.append(e))
    ok, broken = group.expect("approve"), group.expect("approve")
    broken(DeliveryError("broker said no"))
    ok(None)
    assert len(failures) == 1
    assert tracker.take_commit_positions() == {}
    assert tracker.in_flight == 2


def _never(*_args: object) -> None:
    raise AssertionError("must not be called")
