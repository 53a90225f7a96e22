"""The changelog writer: card states with their batch, or coalesced across batches, and a
batch's input offsets finished only once its states are acknowledged."""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import pytest

from contracts.offsets import OffsetTracker
from stream.card_state import ChangelogRecord
from stream.changelog_writer import ChangelogWriter
from stream.outcomes import OutcomeGroup
from tests.support.waiting import wait_until
from tests.unit.fakes import MemorySink
from tests.unit.replica import TOPIC, Replica, messages, tp

CHANGELOG = "states"


class _Record(NamedTuple):
    message: object


class Batch:
    """A scored batch as the writer sees it: its records (tracked), its group, its states."""

    def __init__(
        self,
        tracker: OffsetTracker,
        writer: ChangelogWriter,
        offsets: range,
        states: list[tuple[str, bytes | None]],
    ) -> None:
        self.sources = [((TOPIC, 0), offset) for offset in offsets]
        tracker.track_all(self.sources, [10] * len(self.sources))
        self.changes = [ChangelogRecord(0, card, state, 0) for card, state in states]
        self.completed: list[Counter[tuple[str, str]]] = []
        labels = Counter({("decision", "approve"): len(self.sources)})
        labels.update(writer.labels(self.changes))
        self.group = OutcomeGroup(
            tracker,
            self.sources,
            labels,
            self.completed.append,
            holds=writer.holds(self.changes),
        )
        self.records = [_Record(f"message {offset}") for offset in offsets]
        writer.write(self.records, self.changes, self.group)  # type: ignore[arg-type]

    def decided(self) -> None:
        """Its decisions are acknowledged."""
        for _ in self.sources:
            self.group.delivered()


def _writer(sink: MemorySink, tracker: OffsetTracker, interval_s: float, records: int = 1_000):
    return ChangelogWriter(
        sink, tracker, CHANGELOG, flush_interval_s=interval_s, flush_records=records
    )


def _committable(tracker: OffsetTracker) -> dict[tuple[str, int], int]:
    return tracker.take_commit_positions()


def test_with_the_batch_its_states_are_outputs_of_its_group() -> None:
    sink, tracker = MemorySink(), OffsetTracker()
    writer = _writer(sink, tracker, 0.0)
    assert not writer.coalescing
    batch = Batch(tracker, writer, range(3), [("c1", b"s1"), ("c2", None)])
    assert [(o.kind, o.key, o.value, o.partition) for o in sink.sent] == [
        ("changelog", b"c1", b"s1", 0),
        ("changelog", b"c2", None, 0),
    ]
    assert [str(o.source) for o in sink.sent] == ["message 0", "message 0"]
    batch.decided()
    assert _committable(tracker) == {}, "the states are not acknowledged yet"
    sink.deliver_all()
    assert _committable(tracker) == {(TOPIC, 0): 3}


def test_coalesced_states_wait_for_the_flush_and_hold_the_offsets_until_it_is_acknowledged():
    sink, tracker = MemorySink(), OffsetTracker()
    writer = _writer(sink, tracker, 60.0)
    first = Batch(tracker, writer, range(0, 2), [("c1", b"c1 v1"), ("c2", b"c2 v1")])
    second = Batch(tracker, writer, range(2, 4), [("c1", b"c1 v2"), ("c3", None)])
    assert sink.sent == [], "nothing goes out before the flush"
    first.decided()
    second.decided()
    assert first.completed and second.completed, "decisions are counted when acknowledged"
    assert _committable(tracker) == {}, "no offset is finished before its states are durable"

    writer.flush()
    assert [(o.key, o.value) for o in sink.sent] == [
        (b"c1", b"c1 v2"),  # one record per card: its newest state
        (b"c2", b"c2 v1"),
        (b"c3", None),
    ]
    assert str(sink.sent[0].source) == "message 2", "a failed send names the record that made it"
    sink.sent[0].delivered()
    sink.sent[1].delivered()
    assert _committable(tracker) == {}, "one state of the flush is not acknowledged yet"
    sink.sent[2].delivered()
    assert _committable(tracker) == {(TOPIC, 0): 4}
    writer.flush()
    assert len(sink.sent) == 3, "a flush with nothing waiting sends nothing"


def test_a_batch_acknowledged_before_its_decisions_finishes_with_them() -> None:
    sink, tracker = MemorySink(), OffsetTracker()
    writer = _writer(sink, tracker, 60.0)
    batch = Batch(tracker, writer, range(2), [("c1", b"s")])
    writer.flush()
    sink.deliver_all()
    assert _committable(tracker) == {}
    assert not batch.completed
    batch.decided()
    assert _committable(tracker) == {(TOPIC, 0): 2}
    assert batch.completed == [Counter({("decision", "approve"): 2})]


def test_a_flush_is_due_after_the_interval_or_at_the_records_bound() -> None:
    sink, tracker = MemorySink(), OffsetTracker()
    writer = _writer(sink, tracker, 60.0, records=5)
    Batch(tracker, writer, range(0, 3), [("c1", b"s")])
    writer.flush_if_due(0.0)
    assert sink.sent == [], "not due yet"
    Batch(tracker, writer, range(3, 5), [("c2", b"s")])
    assert len(sink.sent) == 2, "the waiting batches hold the bound's 5 records: flushed"

    timed = _writer(sink, tracker, 0.05)
    Batch(tracker, timed, range(5, 6), [("c3", b"s")])
    timed.flush_if_due(0.0)
    assert len(sink.sent) == 2
    wait_until(lambda: timed.flush_if_due(float("inf")) or len(sink.sent) == 3, timeout_s=1)


def test_a_batch_without_states_takes_no_hold() -> None:
    sink, tracker = MemorySink(), OffsetTracker()
    writer = _writer(sink, tracker, 60.0)
    batch = Batch(tracker, writer, range(2), [])
    batch.decided()
    assert _committable(tracker) == {(TOPIC, 0): 2}


@pytest.mark.parametrize("bad", [{"flush_interval_s": -1.0}, {"flush_records": 0}])
def test_bad_flush_settings_are_refused(bad: dict[str, float]) -> None:
    settings = {"flush_interval_s": 0.1, "flush_records": 1, **bad}
    with pytest.raises(ValueError, match="flush_interval_s must be"):
        ChangelogWriter(MemorySink(), OffsetTracker(), CHANGELOG, **settings)  # type: ignore[arg-type]


def test_a_replica_commits_a_batch_only_once_its_coalesced_states_are_in_the_changelog() -> None:
    # A flush interval no test waits for: only the revoke and the shutdown flush.
    with Replica(card_state=True, changelog_flush_ms=60_000.0) as replica:
        replica.consumer.assign(tp(0, 1))
        replica.consumer.feed(messages(0, range(50)) + messages(1, range(50)))
        wait_until(lambda: len(replica.decided()) == 100)
        assert replica.consumer.stored == {}, "decided, but their states are not durable"
        assert replica.changelog.partitions == {}

        replica.consumer.revoke(tp(1))
        wait_until(lambda: replica.consumer.stored.get((TOPIC, 1)) == 50)
        assert replica.consumer.stored.get((TOPIC, 0)) == 50, "the revoke flushed every state"
        cards = {key for key, _state in replica.changelog.partitions[0]}
        assert len(cards) == len(replica.changelog.partitions[0]), "one record per card"
        replica.consumer.assign(tp(1))
        replica.consumer.feed(messages(0, range(50, 60)))
        wait_until(lambda: len(replica.decided()) == 110)
        assert replica.consumer.stored.get((TOPIC, 0)) == 50
    assert replica.consumer.stored.get((TOPIC, 0)) == 60, "the shutdown flushed the last states"
