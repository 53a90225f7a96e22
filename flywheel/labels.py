"""The flywheel's labels: the outcomes of the days v1 served, reported as the label regime
reports them (`simulator/label_regimes.py`), with v1's own decisions as the flags analysts
review."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from flywheel.settings import FlywheelSettings
from simulator.label_regimes import NEVER, LabelRegime, audit_sample, capacity_reports
from simulator.transactions import SimulatedBatch

#: Separates the label regime's random stream from the simulator's for the same seed.
_LABELS_STREAM = 3


def reported_labels(
    settings: FlywheelSettings,
    start_ms: int,
    warm: SimulatedBatch,
    drifted: SimulatedBatch,
    v1_decisions: list[dict[str, Any]],
) -> tuple[list[dict[str, object]], dict[str, Any]]:
    """The outcomes of the training days reported by their end under the settings' regime, in
    report order, and the summary's account of them (`_label_sources`)."""
    records = [*warm.records, *drifted.records]
    ids = [str(r["transaction_id"]) for r in records]
    is_fraud = np.concatenate([warm.is_fraud, drifted.is_fraud])
    new_pattern = np.concatenate([warm.scenario, drifted.scenario]) == "account_takeover"
    nothing = np.zeros(len(ids), np.bool_)
    if settings.regime is LabelRegime.TODAY:
        labels = [*warm.labels, *drifted.labels]
        frauds = {str(label["transaction_id"]) for label in labels if label["fraud"]}
        reported = np.array([t in frauds for t in ids], np.bool_)
        return labels, _label_sources(
            settings, reported, new_pattern, nothing, nothing, nothing, nothing
        )
    flagged, score = nothing.copy(), np.zeros(len(ids), np.float64)
    if settings.regime is LabelRegime.CAPACITY:
        row_of_id = {t: i for i, t in enumerate(ids)}
        for decision in reversed(v1_decisions):  # a redelivered transaction: its first decision
            row = row_of_id.get(decision["transaction_id"])
            if row is not None:
                flagged[row] = decision["decision"] != "approve"
                score[row] = decision["score"]
    audited = (
        nothing
        if settings.regime is LabelRegime.CHARGEBACKS
        else ~flagged & audit_sample(ids, settings.audit_share)
    )
    event_time = np.concatenate([warm.columns.event_time, drifted.columns.event_time])
    amount = np.concatenate([warm.columns.amount, drifted.columns.amount])
    # The regime's hours and days are simulated time: compressed event time scaled back.
    scale = warm.time_scale
    reports = capacity_reports(
        np.floor((event_time - start_ms) * scale).astype(np.int64),
        flagged,
        score * amount,
        is_fraud,
        audited,
        np.random.default_rng([settings.seed, _LABELS_STREAM]),
        settings.reviews_per_day,
    )
    reported_at = reports.reported_at.copy()
    ever = reported_at != NEVER
    reported_at[ever] = start_ms + np.ceil(reported_at[ever] / scale).astype(np.int64)
    known = reported_at <= int(event_time[-1])
    order = np.flatnonzero(known)
    order = order[np.argsort(reported_at[order], kind="stable")]
    labels = [
        {
            "transaction_id": ids[row],
            "card_id": records[row]["card_id"],
            "terminal_id": records[row]["terminal_id"],
            "fraud": bool(is_fraud[row]),
            "event_time": int(event_time[row]),
            "reported_at": int(reported_at[row]),
        }
        for row in order.tolist()
    ]
    reviewed = known & reports.reviewed
    sources = _label_sources(
        settings,
        known & is_fraud,
        new_pattern,
        reviewed & flagged & is_fraud,
        reviewed & audited & is_fraud,
        reviewed,
        reviewed & audited,
    )
    # What the audits saw: the share of approved transactions that were frauds, before the
    # drift (the warm days) and after it.
    drift = len(warm.records)
    for name, part in (("before_drift", slice(0, drift)), ("after_drift", slice(drift, None))):
        audits = reviewed[part] & audited[part]
        sources[f"audits_{name}"] = int(audits.sum())
        sources[f"audit_frauds_{name}"] = int((audits & is_fraud[part]).sum())
    return labels, sources


def _label_sources(
    settings: FlywheelSettings,
    fraud_reported: npt.NDArray[np.bool_],
    new_pattern: npt.NDArray[np.bool_],
    fraud_by_review: npt.NDArray[np.bool_],
    fraud_by_audit: npt.NDArray[np.bool_],
    reviewed: npt.NDArray[np.bool_],
    audits: npt.NDArray[np.bool_],
) -> dict[str, Any]:
    """Per row of the training days: frauds reported by their end, by a review of v1's flags,
    by an audit, and the transactions reviewed, all and audits (each a boolean mask); returns
    the counts, on the new pattern too, and the reviews a day."""
    return {
        "regime": str(settings.regime),
        "audit_share": settings.audit_share,
        "frauds_reported": int(fraud_reported.sum()),
        "frauds_by_review": int(fraud_by_review.sum()),
        "frauds_by_audit": int(fraud_by_audit.sum()),
        "new_pattern_frauds_reported": int((fraud_reported & new_pattern).sum()),
        "new_pattern_by_review": int((fraud_by_review & new_pattern).sum()),
        "new_pattern_by_audit": int((fraud_by_audit & new_pattern).sum()),
        "reviews": int(reviewed.sum()),
        "audits": int(audits.sum()),
        "reviews_a_day": round(float(reviewed.sum()) / settings.train_days, 1),
    }
