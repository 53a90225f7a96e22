"""Unit tests of the traffic shapes and their open-loop schedule (loadgen/shapes.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadgen.cli import main
from loadgen.shapes import (
    DEFAULT_RATES,
    DIURNAL_PEAK_HOUR,
    DIURNAL_TROUGH_HOUR,
    SHAPES,
    Burst,
    Diurnal,
    Schedule,
    make_shape,
)


def _at(rates: np.ndarray) -> float:
    return float(rates[0])


def _hour_to_s(hour: float, duration_s: float) -> np.ndarray:
    return np.array([hour / 24.0 * duration_s])


@given(
    rate=st.floats(10.0, 20_000.0),
    duration_s=st.floats(0.5, 120.0),
)
def test_constant_schedule_is_rate_times_duration_evenly_spaced(rate, duration_s):
    schedule = Schedule(make_shape("constant", rate, duration_s), duration_s)

    # Rounded to whole records; 1e-9 for the float sum (25/s for 0.5000000000000001 s is
    # 12.500000000000002 records, and the schedule sends 12).
    assert abs(schedule.total - rate * duration_s) <= 0.5 + 1e-9
    assert schedule.due_by(0.0) == 1  # the first record goes at once
    for index in (0, schedule.total // 2, schedule.total - 1):
        assert schedule.due_at(index) == pytest.approx(index / rate, abs=1e-6)


def test_ramp_goes_from_zero_to_rate_and_sends_half_of_constant():
    shape = make_shape("ramp", 1_000.0, 10.0)
    schedule = Schedule(shape, 10.0)

    assert _at(shape.rate_at(np.array([0.0]))) == 0.0
    assert _at(shape.rate_at(np.array([5.0]))) == pytest.approx(500.0)
    assert _at(shape.rate_at(np.array([10.0]))) == pytest.approx(1_000.0)
    assert schedule.total == 5_000
    # Cumulative rate t² · rate / (2 · duration): record i is due at sqrt(2 · i · 10 / 1000).
    assert schedule.due_at(2_000) == pytest.approx(math.sqrt(40.0), abs=1e-3)
    per_second = schedule.per_second()
    assert per_second == sorted(per_second)
    assert per_second[0] == pytest.approx(50.0) and per_second[-1] == pytest.approx(950.0)


def test_diurnal_seed_figures_50_at_3am_and_5000_at_lunch():
    duration_s = 24.0
    shape = make_shape("diurnal", DEFAULT_RATES["diurnal"], duration_s)
    assert isinstance(shape, Diurnal)

    at_3am = _at(shape.rate_at(_hour_to_s(DIURNAL_TROUGH_HOUR, duration_s)))
    at_lunch = _at(shape.rate_at(_hour_to_s(DIURNAL_PEAK_HOUR, duration_s)))
    day = shape.rate_at(np.linspace(0.0, duration_s, 24 * 60 + 1))

    assert at_3am == pytest.approx(50.0)
    assert at_lunch == pytest.approx(5_000.0)
    assert day.min() == pytest.approx(50.0) and day.max() == pytest.approx(5_000.0)
    # One smooth day: midnight at the end meets midnight at the start.
    assert day[0] == pytest.approx(day[-1])
    assert np.abs(np.diff(day)).max() < 5_000.0 / 100


def test_diurnal_scales_with_the_peak_rate_and_compresses_into_any_duration():
    small = make_shape("diurnal", 500.0, 60.0)
    assert _at(small.rate_at(_hour_to_s(DIURNAL_TROUGH_HOUR, 60.0))) == pytest.approx(5.0)
    assert _at(small.rate_at(_hour_to_s(DIURNAL_PEAK_HOUR, 60.0))) == pytest.approx(500.0)


def test_burst_rate_is_factor_times_base_at_the_end_of_each_period():
    shape = make_shape("burst", 100.0, 20.0, burst_every_s=5.0, burst_length_s=1.0, burst_factor=4)
    schedule = Schedule(shape, 20.0)

    per_second = schedule.per_second()
    assert per_second == pytest.approx([100, 100, 100, 100, 400] * 4, abs=0.5)
    # 20 s at 100/s, plus 4 bursts of 1 s at 300/s more.
    assert schedule.total == 20 * 100 + 4 * 300


def test_schedule_due_by_and_due_at_agree_and_never_exceed_the_total():
    schedule = Schedule(make_shape("burst", 300.0, 7.5, burst_every_s=2.0), 7.5)
    counts = [schedule.due_by(t) for t in np.linspace(-1.0, 10.0, 500)]

    assert counts[0] == 0
    assert counts == sorted(counts)
    assert counts[-1] == schedule.total
    for index in range(0, schedule.total, 97):
        due_s = schedule.due_at(index)
        assert schedule.due_by(due_s + 1e-6) >= index + 1
        assert schedule.due_by(due_s - 1e-3) <= index + 1


@pytest.mark.parametrize("name", SHAPES)
def test_every_shape_schedules_its_mean_rate(name):
    schedule = Schedule(make_shape(name, 1_000.0, 30.0), 30.0)
    assert schedule.mean_rate == pytest.approx(schedule.total / 30.0)
    assert sum(schedule.per_second()) == pytest.approx(schedule.total, abs=1.0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("sine", 10.0, 1.0), "shape must be one of"),
        (("constant", 0.0, 1.0), "rate must be"),
        (("ramp", 10.0, math.inf), "duration must be"),
    ],
)
def test_make_shape_rejects_bad_arguments_naming_them(args, message):
    with pytest.raises(ValueError, match=message):
        make_shape(*args)


def test_burst_longer_than_its_period_is_rejected():
    with pytest.raises(ValueError, match="burst length"):
        Burst(100.0, every_s=1.0, length_s=2.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--shape", "burst", "--burst-every", "2", "--burst-seconds", "3"], "--burst-seconds"),
        (["--shape", "burst", "--burst-factor", "0"], "--burst-factor"),
        (["--rate", "0.01", "--duration", "1"], "schedules no record"),
        (["--bad-ratio", "2"], "--bad-ratio"),
    ],
)
def test_cli_rejects_bad_flags_before_connecting(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err
