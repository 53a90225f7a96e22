"""The flywheel's labels (flywheel/labels.py): the outcomes of the days v1 served, as each label
regime reports them, with v1's decisions as the flags the analysts review."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flywheel.labels import reported_labels
from flywheel.settings import FlywheelSettings
from simulator.label_regimes import LabelRegime
from simulator.transactions import DEFAULT_START_TIME_MS, SimulatedBatch, TransactionSimulator

CARDS, RATE = 600, 50.0
WARM_DAYS, DRIFTED_DAYS = 6, 6


def _settings(regime: LabelRegime, audit_share: float = 0.0) -> FlywheelSettings:
    return FlywheelSettings(
        bootstrap="unused",
        seed=3,
        cards=CARDS,
        train_days=WARM_DAYS + DRIFTED_DAYS,
        drift_day=WARM_DAYS,
        late_days=1,
        served_days=1,
        rate=RATE,
        out=Path("unused"),
        metrics_port=0,
        regime=regime,
        audit_share=audit_share,
        reviews_per_day=5,
    )


@pytest.fixture(scope="module")
def served() -> tuple[SimulatedBatch, SimulatedBatch, list[dict[str, Any]]]:
    simulator = TransactionSimulator(
        3, num_cards=CARDS, num_terminals=2 * CARDS, start_time_ms=DEFAULT_START_TIME_MS
    )
    warm = simulator.generate(WARM_DAYS * 2 * CARDS, rate_per_s=RATE)
    simulator.start_account_takeovers()
    drifted = simulator.generate(DRIFTED_DAYS * 2 * CARDS, rate_per_s=RATE)
    # v1's decisions: the large amounts flagged, scored by their amount.
    decisions = [
        {
            "transaction_id": r["transaction_id"],
            "decision": "review" if float(r["amount"]) > 150.0 else "approve",  # type: ignore[arg-type]
            "score": min(1.0, float(r["amount"]) / 1_000.0),  # type: ignore[arg-type]
        }
        for r in (*warm.records, *drifted.records)
    ]
    return warm, drifted, decisions


def _labels(served, regime: LabelRegime, audit_share: float = 0.0):
    return reported_labels(_settings(regime, audit_share), DEFAULT_START_TIME_MS, *served)


def test_capacity_reviews_v1s_flags_within_capacity_and_reports_the_rest_by_chargeback(served):
    warm, drifted, decisions = served
    labels, sources = _labels(served, LabelRegime.CAPACITY, audit_share=0.01)
    cut_off = int(drifted.columns.event_time[-1])
    reported = [int(label["reported_at"]) for label in labels]
    assert reported == sorted(reported) and reported[-1] <= cut_off
    flagged = {d["transaction_id"] for d in decisions if d["decision"] != "approve"}
    reviewed = sources["reviews"] - sources["audits"]
    # The rows of 12 simulated days at the mean rate span about 12.4 days of capacity.
    assert 0 < reviewed <= 5 * (WARM_DAYS + DRIFTED_DAYS + 1) < len(flagged)
    assert sources["audits"] > 0 and sources["frauds_by_review"] > 0
    assert sources["audits"] == sources["audits_before_drift"] + sources["audits_after_drift"]
    legitimate = [label for label in labels if not label["fraud"]]
    assert (
        len(legitimate)
        == sources["reviews"] - sources["frauds_by_review"] - sources["frauds_by_audit"]
    ), "a legitimate outcome is reported only by a review"
    frauds = sum(bool(label["fraud"]) for label in labels)
    assert frauds == sources["frauds_reported"] < int(warm.is_fraud.sum() + drifted.is_fraud.sum())


def test_chargebacks_report_frauds_alone_and_no_one_reviews(served):
    labels, sources = _labels(served, LabelRegime.CHARGEBACKS, audit_share=0.01)
    assert all(label["fraud"] for label in labels)
    assert (sources["reviews"], sources["audits"]) == (0, 0)
    assert len(labels) == sources["frauds_reported"] > 0


def test_today_hands_on_the_simulators_own_outcomes(served):
    warm, drifted, _ = served
    labels, sources = _labels(served, LabelRegime.TODAY)
    assert labels == [*warm.labels, *drifted.labels]
    assert sources["frauds_reported"] == sum(bool(label["fraud"]) for label in labels)


def test_the_same_seed_reports_the_same_labels(served):
    first = _labels(served, LabelRegime.CAPACITY, audit_share=0.01)
    assert _labels(served, LabelRegime.CAPACITY, audit_share=0.01) == first
    assert np.isfinite(first[1]["reviews_a_day"])
