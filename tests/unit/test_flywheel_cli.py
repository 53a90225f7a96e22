"""`python -m flywheel`'s options: a bad one is refused before anything runs, with what is wrong."""

from __future__ import annotations

import pytest

from flywheel.__main__ import build_parser, main
from simulator.label_regimes import REVIEWS_PER_DAY, LabelRegime


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--evaluation-share", "0.8"], "leave at least 10 % of the rows for training"),
        (["--reviews-per-day", "-1"], "--reviews-per-day >= 0"),
        (["--audit-weight", "0"], "--audit-weight > 0"),
        (["--drift-day", "40"], "0 < --drift-day < --train-days"),
    ],
)
def test_bad_settings_are_refused_before_the_run(flags: list[str], problem: str, capsys):
    assert main([*flags, "--bootstrap-servers", "127.0.0.1:1"]) == 2
    assert problem in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--audit-share", "1.5"], ["--label-regime", "weekly"]])
def test_values_outside_their_range_are_refused_by_the_parser(flags: list[str], capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(flags)
    assert exited.value.code == 2
    assert flags[0] in capsys.readouterr().err


def test_the_default_run_is_the_capacity_regime_without_audits():
    args = build_parser().parse_args([])
    assert args.label_regime is LabelRegime.CAPACITY
    assert (args.audit_share, args.audit_weight, args.reviews_per_day) == (
        0.0,
        1.0,
        REVIEWS_PER_DAY,
    )
