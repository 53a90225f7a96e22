"""The AIMD batch-cap controller."""

from __future__ import annotations

import pytest

from stream.controller import (
    ADDITIVE_STEP,
    DECREASE_FACTOR,
    MIN_EVIDENCE_BATCHES,
    BatchSizeController,
)


def test_grows_additively_while_under_the_slo_and_backlogged() -> None:
    c = BatchSizeController(slo_ms=50, min_size=16, max_size=1024)
    caps = [
        c.observe(0.010, closed_full=True, lag_records=None) for _ in range(MIN_EVIDENCE_BATCHES)
    ]
    assert caps[-1] == 16 + ADDITIVE_STEP and caps[:-1] == [None] * (MIN_EVIDENCE_BATCHES - 1)


def test_does_not_grow_without_backlog() -> None:
    c = BatchSizeController(slo_ms=50, min_size=16, max_size=1024)
    assert all(c.observe(0.010, closed_full=False, lag_records=0) is None for _ in range(50))
    assert c.cap == 16


def test_rising_lag_counts_as_backlog() -> None:
    c = BatchSizeController(slo_ms=50, min_size=16, max_size=1024)
    changes = [c.observe(0.010, closed_full=False, lag_records=lag) for lag in range(0, 1000, 100)]
    assert c.cap > 16 and any(changes)


def test_cuts_multiplicatively_when_the_slo_is_missed() -> None:
    c = BatchSizeController(slo_ms=50, min_size=16, max_size=1024, initial=512)
    assert c.observe(0.080, closed_full=True, lag_records=None) == int(512 * DECREASE_FACTOR)
    assert c.observe(0.080, closed_full=True, lag_records=None) == int(512 * DECREASE_FACTOR**2)


def test_stays_within_bounds() -> None:
    c = BatchSizeController(slo_ms=50, min_size=16, max_size=40, initial=40)
    for _ in range(100):
        c.observe(0.001, closed_full=True, lag_records=None)
    assert c.cap == 40
    for _ in range(100):
        c.observe(1.0, closed_full=True, lag_records=None)
    assert c.cap == 16


def test_trajectory_settles_below_the_slo_for_a_latency_that_grows_with_size() -> None:
    # batch latency = 2 ms + 0.1 ms per record: the SLO of 30 ms fits 280 records.
    c = BatchSizeController(slo_ms=30, min_size=16, max_size=2048)
    for _ in range(2000):
        c.observe(0.002 + 0.0001 * c.cap, closed_full=True, lag_records=None)
    assert 150 <= c.cap <= 280


@pytest.mark.parametrize(
    ("args", "match"), [((0, 1, 2), "slo_ms"), ((10, 0, 2), "min_size"), ((10, 5, 2), "min_size")]
)
def test_validates_arguments(args: tuple[float, int, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BatchSizeController(*args)
