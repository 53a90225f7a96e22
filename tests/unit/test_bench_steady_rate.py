"""The benchmark's steady window: what its measured rates are computed over."""

from __future__ import annotations

import pytest

from bench.harness import steady_rate


def samples(every_s: float, until_s: float, rate: float, first_output_s: float = 1.0):
    """(time, outputs) watermark samples of a contender producing `rate` records/s."""
    times = [i * every_s for i in range(int(until_s / every_s) + 1)]
    return [(t, int(max(0.0, t - first_output_s) * rate)) for t in times]


@pytest.mark.parametrize("every_s", [0.25, 0.3, 0.7])
def test_the_window_covers_at_least_the_asked_seconds_and_measures_the_rate(every_s):
    window_s, rate = steady_rate(samples(every_s, 20.0, 1000.0), warmup_s=3.0, window_s=10.0)
    assert 10.0 <= window_s < 10.0 + 2 * every_s
    assert rate == pytest.approx(1000.0, rel=0.01)


def test_a_backlog_that_runs_out_gives_a_shorter_window():
    window_s, rate = steady_rate(samples(0.25, 8.0, 500.0), warmup_s=3.0, window_s=10.0)
    assert 3.0 <= window_s <= 4.5
    assert rate == pytest.approx(500.0, rel=0.01)


def test_no_output_or_no_sample_after_warm_up_has_no_rate():
    assert steady_rate([(0.0, 0), (1.0, 0)], 3.0, 10.0) == (0.0, None)
    assert steady_rate([(0.0, 0), (1.0, 5), (2.0, 10)], 3.0, 10.0) == (0.0, None)
