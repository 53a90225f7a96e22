"""The fallback decision: fast, transparent rules used when the model cannot answer in time.

It runs when a transaction's decision deadline has passed (late policy `fallback`) or when the
model is unavailable. Its decisions carry `degraded: true`. The rules read the same feature
matrix as the model and cost microseconds per batch: no model call, no per-record Python.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from scorer.features import FEATURE_NAMES

_COLUMN = {name: i for i, name in enumerate(FEATURE_NAMES)}
#: Amounts above this, away from home and without the card, are the classic cash-out.
LARGE_AMOUNT = 2_000.0
#: Score of a transaction with no red flag: well under any sensible review threshold.
BASE_SCORE = 0.05
#: Each red flag adds its weight; two strong ones reach a typical decline threshold (0.8).
RED_FLAG_WEIGHTS = {
    "card_not_present_abroad": 0.35,
    "high_risk_country": 0.30,
    "large_amount": 0.30,
    "card_testing_probe": 0.45,
    "night": 0.10,
}


def fallback_scores(features: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """A rules score in [0, 1] per row of the feature matrix [B, F]."""

    def column(name: str) -> npt.NDArray[np.float32]:
        return features[:, _COLUMN[name]]

    not_present = column("card_present") < 0.5
    flags = {
        "card_not_present_abroad": not_present & (column("cross_border") > 0.5),
        "high_risk_country": column("high_risk_country") > 0.5,
        "large_amount": column("log_amount") > np.log1p(LARGE_AMOUNT),
        "card_testing_probe": (column("tiny_amount") > 0.5) & (column("channel_ecom") > 0.5),
        "night": column("night") > 0.5,
    }
    score = np.full(len(features), BASE_SCORE, np.float32)
    for name, hit in flags.items():
        score += np.float32(RED_FLAG_WEIGHTS[name]) * hit
    return np.minimum(score, np.float32(1.0))
