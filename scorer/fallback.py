"""The fallback decision: fast, transparent rules used when the model cannot answer in time.

It runs when a transaction's decision deadline has passed (late policy `fallback`) or when the
model is unavailable. Its decisions carry `degraded: true`. The rules read the same feature
matrix as the model and cost microseconds per batch: no model call, no per-record Python.

A few red flags, each one comparison on one feature, one per fraud pattern the features show:
an amount above what card holders spend at all, an amount far above the card's own habit, a
terminal with frauds confirmed this week, a burst of tiny online purchases. Each flag adds its
weight to the log-odds of fraud; the score is the resulting probability, so the thresholds that
read the model's calibrated score read it too. The cut-offs and weights were fitted on the
validation weeks of the shipped model's training run (`training/fallback_fit.py`, seed 7); the
model card shows them refitted on the latest run and the rules' recall on the test weeks. Refit
them on your own labelled traffic before relying on them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from scorer.features import FEATURE_NAMES

_COLUMN = {name: i for i, name in enumerate(FEATURE_NAMES)}


class Cutoffs(NamedTuple):
    """Where each red flag starts."""

    #: Amounts above this (the simulator's own large-amount fraud starts above 220).
    large_amount: float
    #: (1 + amount) / (1 + the card's 30-day mean before it) above this.
    amount_spike: float
    #: Frauds at the terminal on the last 7 days, today included, confirmed so far: at least
    #: this many.
    terminal_recent_frauds: float
    #: Small e-commerce purchases on the card in the last ~10 minutes, this one included, at
    #: least this many.
    card_testing_burst: float


CUTOFFS = Cutoffs(
    large_amount=220.0, amount_spike=3.0, terminal_recent_frauds=2, card_testing_burst=2
)
#: Log-odds of fraud of a transaction with no red flag.
BASE_LOG_ODDS = -6.31
#: Log-odds each red flag adds.
RED_FLAG_WEIGHTS: dict[str, float] = {
    "large_amount": 9.02,
    "amount_spike": 8.03,
    "terminal_recent_frauds": 7.21,
    "card_testing_burst": 9.67,
}
#: A count stored as log(1 + n) in float32 reads back a hair off n: compare half a unit lower.
_HALF_A_UNIT = 0.5


def red_flags(
    features: npt.NDArray[np.float32], cutoffs: Cutoffs = CUTOFFS
) -> dict[str, npt.NDArray[np.bool_]]:
    """Which rows of the feature matrix [B, F] raise each red flag."""

    def column(name: str) -> npt.NDArray[np.float32]:
        return features[:, _COLUMN[name]]

    return {
        "large_amount": column("log_amount") > np.log1p(cutoffs.large_amount),
        "amount_spike": column("card_amount_to_mean") > np.log(cutoffs.amount_spike),
        "terminal_recent_frauds": column("terminal_fresh_frauds_7d")
        > np.log1p(cutoffs.terminal_recent_frauds - _HALF_A_UNIT),
        "card_testing_burst": column("card_testing_velocity")
        > np.log1p(cutoffs.card_testing_burst - _HALF_A_UNIT),
    }


def fallback_scores(features: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """The rules' fraud probability in [0, 1] per row of the feature matrix [B, F]."""
    log_odds = np.full(len(features), BASE_LOG_ODDS, np.float64)
    for name, hit in red_flags(features).items():
        log_odds += RED_FLAG_WEIGHTS[name] * hit
    # 1 / (1 + e^-x) through tanh, which cannot overflow.
    return (0.5 * (1.0 + np.tanh(0.5 * log_odds))).astype(np.float32)
