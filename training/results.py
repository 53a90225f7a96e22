"""What a training run reports: its figures fold by fold and the result of one seed's run,
which the model card and the package manifest are written from.

Values only, and the two summaries every report uses (the mean and spread over folds or seeds),
so that the card and the manifest read a run without importing the code that trains it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from scorer.drift import DriftReference
from simulator.label_regimes import LabelRegime
from training.calibration import Bin, Platt
from training.fallback_fit import FallbackFit
from training.protocol import Metrics, Schedule
from training.thresholds import Chosen

#: Per scenario (legit included): the shares at or above review and at or above decline.
Outcomes = dict[str, tuple[float, float]]


class ColdStartDay(NamedTuple):
    """One day of the cold-start check: legitimate shares at or above review and decline, and
    the fraud recall at review."""

    legit_review: float
    legit_decline: float
    fraud_recall: float


class FoldResult(NamedTuple):
    """One model on one fold's assessment week (validation or test)."""

    train_start_day: int
    handbook: Metrics  # rows of the handbook's scenarios and legitimate rows
    everything: Metrics  # all rows, card testing included


def mean_std(folds: Sequence[FoldResult], field: str, handbook: bool = True) -> tuple[float, float]:
    """Mean and standard deviation of a Metrics field over folds."""
    return spread([getattr(f.handbook if handbook else f.everything, field) for f in folds])


def spread(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; NaN for fewer than two values)."""
    if not values:
        return (math.nan, math.nan)
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else math.nan


class FallbackReport(NamedTuple):
    """The shipped fallback rules, and the fit of this run's validation weeks."""

    fit: FallbackFit
    validation: Outcomes
    test: Outcomes
    test_roc_auc: float


class TrainingResult(NamedTuple):
    """One seed's run: the shipped-form model, how it was chosen and how everything scored."""

    model: bytes
    model_name: str
    model_version: str
    seed: int
    days: int
    schedule: Schedule
    rows: int
    fraud_rows: int
    labels: int
    scenario_rows: dict[str, int]
    #: The chosen candidate's kind.
    winner: str
    #: By kind (both candidates and HANDBOOK): the validation folds, latest first.
    validation: dict[str, list[FoldResult]]
    #: The chosen candidate's and HANDBOOK's test folds, latest first.
    test: dict[str, list[FoldResult]]
    #: The chosen candidate trained and scored without FRESH_LABEL_COLUMNS, on the test folds
    #: (its log-odds in numpy); empty unless asked for.
    without_fresh_labels: list[FoldResult]
    platt: Platt
    thresholds: Chosen
    #: The decline threshold under OTHER_FALSE_DECLINE_COSTS, same validation scores.
    decline_by_cost: dict[float, float]
    validation_reliability: list[Bin]
    test_reliability: list[Bin]
    #: Mean calibrated score and fraud rate of all test rows.
    test_mean_score: float
    test_fraud_rate: float
    #: By kind (the chosen candidate's and HANDBOOK), what its review threshold, chosen on the
    #: validation weeks, flags on all test rows.
    test_at_review: dict[str, AtReview]
    validation_outcomes: Outcomes
    test_outcomes: Outcomes
    fallback: FallbackReport
    #: The median of the shipped model's training week's legitimate rows: reason codes' row.
    reference: list[float]
    #: Histograms of the validation weeks' scores and most influential features (drift PSI).
    drift: DriftReference
    #: [low, high]: the flag rate live traffic should stay within (scorer/flag_rate.py).
    expected_flag_rate: list[float]
    train_rows: int
    test_rows: int
    #: Per day of a new stream (another seed, every card new on day 0): the shares of legitimate
    #: transactions at or above review and decline, and the fraud recall at review.
    cold_start: list[ColdStartDay]
    #: How outcomes were reported (`simulator/label_regimes.py`) and the capacity regime's
    #: audit share.
    regime: LabelRegime
    audit_share: float


class AtReview(NamedTuple):
    """A review threshold (at most REVIEW_LEGIT_SHARE of validation legitimate rows at or
    above it) and what it flags on the test rows."""

    threshold: float
    fraud_recall: float
    legit_share: float
