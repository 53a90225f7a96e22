"""`python -m flywheel`'s and `python -m flywheel.audit_study`'s options (a bad one is refused
before anything runs, with what is wrong), and how the study compares its arms."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flywheel.__main__ import build_parser, main
from flywheel.audit_study import aggregate
from flywheel.audit_study import main as audit_study_main
from simulator.label_regimes import REVIEWS_PER_DAY, LabelRegime


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--evaluation-share", "0.8"], "leave at least 10 % of the rows for training"),
        (["--reviews-per-day", "-1"], "--reviews-per-day >= 0"),
        (["--audit-weight", "0"], "--audit-weight > 0"),
        (["--drift-day", "40"], "0 < --drift-day < --train-days"),
        (["--label-regime", "today", "--audit-share", "0.01"], "--audit-share needs"),
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


def _summary(takeovers: float, everything: float, audited: int = 0) -> dict[str, Any]:
    window = {"recall_new_pattern": takeovers, "recall_all": everything}
    return {
        "late_window": {"v2": window},
        "labels": {"reviews_a_day": 70.0, "new_pattern_by_audit": audited},
    }


def test_the_audit_study_compares_each_arm_with_its_groups_baseline_on_the_same_seed():
    rows = aggregate(
        {
            "cap-d20-a0": {17: _summary(0.80, 0.50), 18: _summary(0.70, 0.40)},
            "cap-d20-a0.01-w1": {17: _summary(0.85, 0.52, 3), 18: _summary(0.71, 0.40, 5)},
            "today-d33": {17: _summary(0.01, 0.30)},
        }
    )
    by_arm = {row["arm"]: row for row in rows}
    assert set(by_arm) == {"cap-d20-a0", "cap-d20-a0.01-w1", "today-d33"}
    assert by_arm["cap-d20-a0"]["change_takeovers"] is None, "the baseline itself"
    change = by_arm["cap-d20-a0.01-w1"]["change_takeovers"]
    assert change == pytest.approx({"mean": 0.03, "std": 0.028284}, abs=1e-6)
    assert by_arm["cap-d20-a0.01-w1"]["takeovers_audited"]["mean"] == 4.0
    assert by_arm["today-d33"]["change_takeovers"] is None, "no baseline run to pair with"


@pytest.mark.parametrize(
    "flags", [["--seeds", "17"], ["--seeds", "17,x"], ["--arms", "cap-d20-a0,weekly"]]
)
def test_the_audit_study_refuses_one_seed_and_unknown_arms(flags: list[str], capsys):
    with pytest.raises(SystemExit) as exited:
        audit_study_main(flags)
    assert exited.value.code == 2
    assert flags[0] in capsys.readouterr().err


def test_the_audit_study_stops_on_a_run_it_cannot_read_and_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "cap-d20-a0-s17"
    broken.mkdir()
    (broken / "summary.json").write_text("{", encoding="utf-8")
    code = audit_study_main(["--seeds", "17,18", "--arms", "cap-d20-a0", "--out", str(tmp_path)])
    assert code == 1
    err = capsys.readouterr().err
    assert "cannot read" in err and f"delete {broken}" in err
    assert not (tmp_path / "results.json").exists()
