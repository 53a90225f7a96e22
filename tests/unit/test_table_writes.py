"""When the features worker's table agent writes the entries a partition's records changed, and
what it acknowledges then (terminals/app.py, `_Writes`): a record is acknowledged (faust may
commit it) only once what it changed is written, and records held are bounded in time and in
number. The clock is a parameter."""

from __future__ import annotations

from terminals.app import MAX_HELD, _Writes


class Record:
    """Stands for a faust event: records whether it was acknowledged."""

    def __init__(self) -> None:
        self.acked = False

    def ack(self) -> None:
        self.acked = True


def test_a_partition_is_due_once_its_oldest_record_held_is_an_interval_old() -> None:
    now = [100.0]
    writes = _Writes(10.0, clock=lambda: now[0])
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
    writes = _Writes(600.0, clock=lambda: 0.0)
    due = [writes.hold(3, Record()) for _ in range(MAX_HELD)]
    assert due == [False] * (MAX_HELD - 1) + [True]


def test_a_rebalance_drops_the_records_held_without_acknowledging_them() -> None:
    writes = _Writes(0.0, clock=lambda: 0.0)
    held = Record()
    writes.hold(0, held)
    generation = writes.generation
    writes.reset()
    writes.acknowledge(0)
    assert not held.acked, "read again from the committed offset by the partition's owner"
    assert writes.generation == generation + 1
