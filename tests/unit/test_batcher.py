"""The micro-batch contract, driven by a hand-held clock."""

from __future__ import annotations

import pytest

from stream.batcher import MicroBatcher


def test_batch_closes_when_it_reaches_the_cap() -> None:
    batcher: MicroBatcher[int] = MicroBatcher(max_batch_size=3, max_wait_ms=1000)
    assert batcher.add(1, now_s=0.0) is None
    assert batcher.add(2, now_s=0.1) is None
    batch = batcher.add(3, now_s=0.2)
    assert batch is not None
    assert batch.items == [1, 2, 3]
    assert batch.wait_s == pytest.approx(0.2)
    assert len(batcher) == 0


def test_item_after_the_cap_starts_the_next_batch() -> None:
    batcher: MicroBatcher[int] = MicroBatcher(max_batch_size=1000, max_wait_ms=50)
    closed = [b for i in range(2500) if (b := batcher.add(i, now_s=0.0)) is not None]
    assert [len(b.items) for b in closed] == [1000, 1000]
    assert closed[1].items[0] == 1000
    assert len(batcher) == 500


def test_deadline_counts_from_the_first_item_not_the_last() -> None:
    batcher: MicroBatcher[str] = MicroBatcher(max_batch_size=100, max_wait_ms=10)
    batcher.add("a", now_s=5.000)
    batcher.add("b", now_s=5.009)
    assert batcher.seconds_until_due(5.009) == pytest.approx(0.001)
    assert batcher.take_due(5.0099) is None
    batch = batcher.take_due(5.010)
    assert batch is not None and batch.items == ["a", "b"]
    assert batch.wait_s == pytest.approx(0.010)


def test_lone_item_is_due_after_max_wait() -> None:
    batcher: MicroBatcher[str] = MicroBatcher(max_batch_size=100, max_wait_ms=250)
    assert batcher.seconds_until_due(0.0) is None
    batcher.add("only", now_s=1.0)
    assert batcher.seconds_until_due(1.1) == pytest.approx(0.15)
    assert batcher.seconds_until_due(9.0) == 0.0
    batch = batcher.take_due(1.25)
    assert batch is not None and batch.items == ["only"]


def test_never_returns_an_empty_batch() -> None:
    batcher: MicroBatcher[int] = MicroBatcher(max_batch_size=2, max_wait_ms=0)
    assert batcher.take_due(100.0) is None
    assert batcher.drain(100.0) is None


def test_drain_closes_a_young_batch() -> None:
    batcher: MicroBatcher[int] = MicroBatcher(max_batch_size=10, max_wait_ms=1000)
    batcher.add(7, now_s=0.0)
    batch = batcher.drain(0.001)
    assert batch is not None and batch.items == [7]
    assert batcher.drain(0.002) is None


def test_room_shrinks_as_the_batch_fills() -> None:
    batcher: MicroBatcher[int] = MicroBatcher(max_batch_size=4, max_wait_ms=10)
    assert batcher.room == 4
    batcher.add(1, now_s=0.0)
    assert batcher.room == 3


@pytest.mark.parametrize(
    ("size", "wait", "error"),
    [
        (0, 10, ValueError),
        (-1, 10, ValueError),
        (5, -1, ValueError),
        (2.5, 10, TypeError),
        (True, 1, TypeError),
    ],
)
def test_rejects_bad_arguments(size: object, wait: float, error: type[Exception]) -> None:
    with pytest.raises(error, match="max_"):
        MicroBatcher(size, wait)  # type: ignore[arg-type]
