"""The data flywheel (`make flywheel`, flywheel/loop.py) with smaller numbers, through the real
broker: v1 serves, the simulator's new pattern switches on, analysts review what v1 flags within
their capacity and audit a share of what it approves (the capacity label regime), v2 is trained
from the decisions and labels topics, runs in shadow over a late window and is promoted without
a restart."""

from __future__ import annotations

from pathlib import Path

from flywheel.loop import run
from flywheel.settings import FlywheelSettings
from simulator.label_regimes import LabelRegime
from tests.integration.conftest import BOOTSTRAP
from tests.support.network import free_port


def test_v2_trained_from_the_topics_catches_the_new_pattern_v1_misses(tmp_path: Path):
    summary = run(
        FlywheelSettings(
            bootstrap=BOOTSTRAP,
            seed=5,
            cards=1_500,
            train_days=24,
            drift_day=10,
            late_days=6,
            served_days=1,
            rate=1_000.0,
            out=tmp_path / "flywheel",
            metrics_port=free_port(),
            regime=LabelRegime.CAPACITY,
            audit_share=0.01,
            reviews_per_day=30,
        )
    )
    labels = summary["labels"]
    # The analysts' work: at most their capacity of v1's flags a day, plus the audits; frauds
    # found both ways, and the rest only as chargebacks report them.
    # (24 simulated days of rows at the mean rate span a little more than 24 days of capacity.)
    assert labels["reviews"] - labels["audits"] <= 30 * 25
    assert 0.005 * 24 * 3_000 < labels["audits"] < 0.02 * 24 * 3_000
    assert labels["frauds_by_review"] > 0 and labels["frauds_by_audit"] >= 0
    assert labels["frauds_by_review"] + labels["frauds_by_audit"] < labels["frauds_reported"]
    assert labels["new_pattern_frauds_reported"] > 0
    late = summary["late_window"]
    assert late["new_pattern_frauds"] > 50
    # At the same false-positive rate, v2 catches what v1 never learnt.
    assert late["v2"]["recall_new_pattern"] > late["v1"]["recall_new_pattern"] + 0.3
    assert abs(late["v2"]["flagged_legit"] - late["v1"]["flagged_legit"]) < 0.005
    # v2's thresholds, chosen on its validation rows, keep to the review budget (1 %).
    assert 0.002 < late["v2"]["reviewed_legit"] < 0.03
    assert summary["served_after_promotion"] == [summary["v2"]]
    assert summary["v2"] != summary["v1"]
    assert (tmp_path / "flywheel" / "summary.json").is_file()
