"""The load generator's simulated clock agreed with the scorer's history time scale
(loadgen/time_scale.py): matched, derived, or refused with the setting to use."""

from __future__ import annotations

import pytest

from loadgen.options import build_parser, validate
from loadgen.time_scale import (
    MIN_RATE_PER_S,
    Pace,
    assumption,
    check_replay,
    setting,
    simulated_pace,
    time_scale,
    world,
)
from plumbing.errors import ConfigurationError

#: A world that makes 0.1 tx per simulated second: 2,000 tx/s is 20,000x compressed time.
NATURAL = 0.1
WHERE = "http://scorer:9102/metrics"


def pace(scorer_scale: float | None, rate: float, *, given: bool = True, per_mean: float = 1.0):
    return simulated_pace(
        scorer_scale,
        rate=rate,
        rate_given=given,
        rate_per_mean=per_mean,
        natural_rate=NATURAL,
        where=WHERE,
    )


def test_an_unknown_scorer_scale_keeps_the_rate_and_its_own_scale() -> None:
    assert pace(None, 2_000) == Pace(2_000, 20_000.0)


def test_a_rate_close_to_the_scorers_pace_runs_at_the_scorers_scale_exactly() -> None:
    assert pace(19_000.0, 2_000) == Pace(2_000, 19_000.0)


def test_without_a_rate_the_run_sends_at_the_scorers_pace() -> None:
    assert pace(5_000.0, 1_000, given=False) == pytest.approx(Pace(500.0, 5_000.0))
    # A shape whose --rate is its peak, twice its mean: the mean is what sets the scale.
    assert pace(5_000.0, 1_000, given=False, per_mean=2.0) == pytest.approx(Pace(1_000, 5_000.0))


def test_a_scorer_in_real_time_refuses_the_rate_with_the_setting_for_both_services() -> None:
    with pytest.raises(ConfigurationError) as refused:
        pace(1.0, 2_000)
    message = str(refused.value)
    assert "\n" not in message
    assert f"{WHERE} runs its history windows at FRAUD_HISTORY_TIME_SCALE=1:" in message
    assert message.endswith("start fraud-scorer and fraud-features with " + setting(20_000.0))
    assert "--rate" not in message  # the scorer's pace, 0.1 tx/s, is no run


def test_a_scorer_in_real_time_refuses_a_run_without_a_rate_too() -> None:
    with pytest.raises(ConfigurationError, match=r"FRAUD_HISTORY_TIME_SCALE=10000$"):
        pace(1.0, 1_000, given=False)


def test_a_rate_far_from_a_compressed_scorer_is_refused_naming_the_scorers_pace() -> None:
    with pytest.raises(ConfigurationError) as refused:
        pace(10_000.0, 2_000)
    assert str(refused.value).endswith(
        "with FRAUD_HISTORY_TIME_SCALE=20000, or send --rate 1000 (the scorer's pace)"
    )
    assert 10_000.0 * NATURAL >= MIN_RATE_PER_S


def test_a_replay_needs_a_scorer_in_real_time() -> None:
    check_replay(None, where=WHERE)
    check_replay(1.0, where=WHERE)
    with pytest.raises(ConfigurationError, match=r"FRAUD_HISTORY_TIME_SCALE=1 \(the default\)"):
        check_replay(8_000.0, where=WHERE)


def test_the_warning_says_what_it_assumes() -> None:
    line = assumption(17_865.56, 2_000, "no --metrics-url")
    assert line.startswith("fraud-loadgen: warning: ")
    assert "(no --metrics-url)" in line
    assert "run at FRAUD_HISTORY_TIME_SCALE=17865.6 (this run's, for 2000 tx/s)" in line


def test_a_quarter_world_at_a_quarter_rate_runs_simulated_time_as_fast() -> None:
    small = world(7, 1_250)
    assert (len(small.population.card_ids), len(small.population.terminal_ids)) == (1_250, 2_500)
    assert time_scale(7, 500, 1_250) == pytest.approx(time_scale(7, 2_000), rel=0.05)


def test_the_world_size_bounds_the_fraud_scale() -> None:
    args = build_parser().parse_args(["--cards", "50000", "--fraud-scale", "2"])
    with pytest.raises(ValueError, match=r"--fraud-scale x --cards / 5000 must be <= 10"):
        validate(args)
