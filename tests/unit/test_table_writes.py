"""When the features worker's table agent writes the entries a partition's records changed, and
what it acknowledges then (terminals/table_writes.py, `TableWrites`): a record is acknowledged
(faust may commit it) only once what it changed is written, and records held are bounded in time
and in number; and faust never commits past a record held unwritten, even one a rebalance
dropped. The clock is a parameter."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from faust.transport.consumer import Consumer as FaustConsumer

from terminals.table_writes import MAX_HELD, NO_COMMIT, TableWrites, bound_commits


class Record:
    """Stands for a faust event: records whether it was acknowledged."""

    def __init__(self, offset: int = 0) -> None:
        self.acked = False
        self.message = SimpleNamespace(offset=offset)

    def ack(self) -> None:
        self.acked = True


def test_a_partition_is_due_once_its_oldest_record_held_is_an_interval_old() -> None:
    now = [100.0]
    writes = TableWrites(10.0, clock=lambda: now[0])
    first, second = Record(), Record()
    assert not writes.hold(0, first)
    now[0] += 9.9
    assert not writes.hold(0, second)
    assert not writes.hold(1, Record()), "each partition has its own interval"
    now[0] += 0.1
    assert writes.hold(0, Record())
    writes.acknowledge(0)
    assert first.acked and second.acked
    assert not writes.hold(0, Record()), "the interval starts again with the next record"


def test_records_held_are_bounded_in_number_however_long_the_interval() -> None:
    writes = TableWrites(600.0, clock=lambda: 0.0)
    due = [writes.hold(3, Record()) for _ in range(MAX_HELD)]
    assert due == [False] * (MAX_HELD - 1) + [True]


def test_a_rebalance_drops_the_records_held_without_acknowledging_them() -> None:
    writes = TableWrites(0.0, clock=lambda: 0.0)
    held = Record()
    writes.hold(0, held)
    generation = writes.generation
    writes.reset()
    writes.acknowledge(0)
    assert not held.acked, "read again from the committed offset by the partition's owner"
    assert writes.generation == generation + 1


def test_a_partition_commits_up_to_its_oldest_record_held_and_nothing_after_a_drop() -> None:
    writes = TableWrites(600.0, clock=lambda: 0.0)
    assert writes.commit_bound(0) is None, "nothing held: no bound"
    writes.hold(0, Record(40))
    writes.hold(0, Record(41))
    assert writes.commit_bound(0) == 40
    writes.reset()  # a rebalance drops 40 and 41 unwritten: they are read again
    assert writes.commit_bound(0) == NO_COMMIT
    writes.hold(0, Record(40))
    assert writes.commit_bound(0) == 40
    writes.acknowledge(0)  # written
    assert writes.commit_bound(0) is None


class Consumer:
    """Stands for faust's consumer: `_new_offset` returns the end of its acknowledged run."""

    def __init__(self, run_end: int) -> None:
        self.run_end = run_end
        self.asked = 0

    def _new_offset(self, _tp: object) -> int | None:
        self.asked += 1
        return self.run_end


def test_faust_commits_no_further_than_the_oldest_record_held() -> None:
    # Faust acknowledges by itself a record it skips during a rebalance (offset 45 here), which
    # its run check can let through: its run would then end past records 40-44, held unwritten.
    writes = TableWrites(600.0, clock=lambda: 0.0)
    consumer = Consumer(run_end=46)
    bound_commits(consumer, "events", writes)
    internal = SimpleNamespace(topic="events", partition=0)
    other = SimpleNamespace(topic="other", partition=0)
    assert consumer._new_offset(internal) == 46, "nothing held"
    writes.hold(0, Record(40))
    assert consumer._new_offset(internal) == 40
    assert consumer._new_offset(other) == 46, "another topic is not bounded"
    writes.reset()
    asked = consumer.asked
    assert consumer._new_offset(internal) is None
    assert consumer.asked == asked, "faust's acknowledgements are left as they are"


def test_a_faust_without_the_hook_is_refused_and_this_one_has_it() -> None:
    with pytest.raises(RuntimeError, match="_new_offset"):
        bound_commits(object(), "events", TableWrites(1.0))
    assert callable(FaustConsumer._new_offset), "the faust installed lacks the hook"


def test_a_record_without_events_is_acknowledged_at_once_unless_records_wait_before_it() -> None:
    # The router's marks come to a quiet partition every few seconds: held like the others,
    # the last one kept the partition's commit a record behind its end for good.
    now = [0.0]
    writes = TableWrites(10.0, clock=lambda: now[0])
    marks = Record(5)
    assert not writes.hold(0, marks, events=False)
    assert marks.acked and writes.commit_bound(0) is None
    counted, later_marks = Record(6), Record(7)
    writes.hold(0, counted)
    assert not writes.hold(0, later_marks, events=False)
    assert not later_marks.acked, "acknowledged with the record it follows, once written"
    now[0] += 10.0
    assert writes.hold(0, Record(8), events=False), "and it still brings the write when due"
    writes.acknowledge(0)
    assert counted.acked and later_marks.acked
