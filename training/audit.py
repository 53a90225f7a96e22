"""The audit sample among the approved decisions (`fraud-train from-topics --audit-share`):
what it says of the frauds the served model approves, and what its frauds weigh in training."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from simulator.label_regimes import audit_sample
from training.logged_decisions import Decisions


class Audit(NamedTuple):
    """The audit sample among the approved decisions kept (`--audit-share`)."""

    share: float
    #: Approved decisions in the sample, and the frauds among them reported by the cut-off.
    audited: int
    frauds: int
    #: What each of those frauds weighed in training (`--audit-weight`).
    weight: float

    def approved_fraud_rate(self) -> tuple[float, float, float]:
        """The share of approved transactions that were frauds, with its 95 % Wilson interval
        (NaN without any audited)."""
        if not self.audited:
            return (float("nan"),) * 3
        n, p, z = self.audited, self.frauds / self.audited, 1.96
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return p, max(0.0, centre - half), min(1.0, centre + half)


def audit_weights(
    decisions: Decisions, is_fraud: npt.NDArray[np.bool_], share: float, fraud_weight: float
) -> tuple[npt.NDArray[np.float64], Audit]:
    """Each row's training weight, and the audit sample's count: an approved decision in the
    `audit_sample` of `share` that was a fraud weighs `fraud_weight`, every other row 1."""
    sampled = decisions.approved & audit_sample(decisions.transaction_ids, share)
    weight = np.ones(len(is_fraud), np.float64)
    weight[sampled & is_fraud] = fraud_weight
    return weight, Audit(share, int(sampled.sum()), int((sampled & is_fraud).sum()), fraud_weight)


def audit_line(audit: Audit) -> str:
    if not audit.share:
        return (
            "No audit sample (`--audit-share 0`): the frauds among approved transactions are "
            "known only as chargebacks report them, weeks later."
        )
    rate, low, high = audit.approved_fraud_rate()
    return (
        f"Audit sample ({audit.share:g} of approved decisions): {audit.audited} audited, "
        f"{audit.frauds} frauds: {rate:.2%} of approved transactions were frauds the served "
        f"model let through (95 % interval {low:.2%}-{high:.2%}); each audited fraud weighed "
        f"{audit.weight:g} in training."
    )
