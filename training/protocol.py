"""The handbook's evaluation protocol and metrics (Le Borgne et al., chapters 3-5).

- A fold: a training week, a delay week (its outcomes are not yet known when the model goes
  live, so it is neither trained nor tested on), a test week. From each test day the cards
  already known to be compromised are removed: those with a fraud in the training week, or on
  any day up to the delay before that test day (the handbook's rule), and, row by row, those
  the service's features already know to be compromised when it scores the row (a fraud of the
  card confirmed within its fresh-label window: training/fold_data.py, `stream_fold`).
- Card Precision@k: per test day, each card scores its transactions' maximum; of the k highest
  cards, the share that had a fraud that day. Cards caught on an earlier test day are removed
  from later days. The figure is the mean over the test days.
- Folds are prequential, as in the handbook's model selection: the latest fold, then the same
  protocol shifted back a week at a time; the figures are the mean (and standard deviation) over
  the folds.
- Validation before test, as in the handbook's model selection (chapter 5, "Model selection"):
  the validation folds are the test folds moved back by a delay and an assessment week, so the
  latest validation week is the earliest test fold's training week and every validation row
  precedes every test week. Choices (the model, its calibration, its thresholds, the fallback
  rules) are made on the validation folds; the test folds are scored once and only reported.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

TRAIN_DAYS = DELAY_DAYS = TEST_DAYS = 7
TOP_K = 100

_Bools = npt.NDArray[np.bool_]
_Ints = npt.NDArray[np.int64]


class Schedule(NamedTuple):
    """Training-week start days of the validation and the test folds, each latest first."""

    validation: list[int]
    test: list[int]


def days_needed(folds: int) -> int:
    """The shortest stream that holds `folds` validation folds and `folds` test folds."""
    # Latest test fold: 3 weeks; each further fold adds one; the validation folds add as many,
    # plus the delay and assessment weeks between the latest of them and the earliest test fold.
    fold_days = TRAIN_DAYS + DELAY_DAYS + TEST_DAYS
    return fold_days + 2 * (folds - 1) * TEST_DAYS + DELAY_DAYS + TEST_DAYS


def fold_schedule(days: int, folds: int) -> Schedule:
    """The folds of a stream of `days` days: the latest test week ends with the stream.

    Raises ValueError when the stream is too short for `folds` of each.
    """
    if folds < 1:
        raise ValueError(f"folds must be >= 1, got {folds}")
    if days < days_needed(folds):
        raise ValueError(
            f"{days} days hold fewer than {folds} validation and {folds} test folds: "
            f"give at least {days_needed(folds)} days or fewer folds"
        )
    latest_test = days - (TRAIN_DAYS + DELAY_DAYS + TEST_DAYS)
    test = [latest_test - k * TEST_DAYS for k in range(folds)]
    latest_validation = test[-1] - (DELAY_DAYS + TEST_DAYS)
    return Schedule([latest_validation - k * TEST_DAYS for k in range(folds)], test)


def assessed_days(train_start_day: int) -> tuple[int, int]:
    """First and last day of the week a fold assesses (validation or test)."""
    first = train_start_day + TRAIN_DAYS + DELAY_DAYS
    return first, first + TEST_DAYS - 1


def validation_days(schedule: Schedule) -> tuple[int, int]:
    """First and last day of the validation weeks."""
    return assessed_days(schedule.validation[-1])[0], assessed_days(schedule.validation[0])[1]


class Fold(NamedTuple):
    """Rows of one fold (indices into the stream)."""

    train_start_day: int
    train: _Ints
    test: _Ints


def handbook_fold(
    day: _Ints,
    card: _Ints,
    is_fraud: _Bools,
    train_start_day: int,
    known_at_row: _Bools | None = None,
) -> Fold:
    """The training rows and the test rows of one fold: known-compromised cards removed by the
    handbook's rule and, where `known_at_row` is given, the rows it marks."""
    train = np.flatnonzero((day >= train_start_day) & (day < train_start_day + TRAIN_DAYS))
    known = set(card[train[is_fraud[train]]].tolist())
    test_parts = []
    first_test_day = train_start_day + TRAIN_DAYS + DELAY_DAYS
    for k in range(TEST_DAYS):
        revealed = np.flatnonzero((day == train_start_day + TRAIN_DAYS + k - 1) & is_fraud)
        known.update(card[revealed].tolist())
        rows = np.flatnonzero(day == first_test_day + k)
        rows = rows[~np.isin(card[rows], list(known))]
        test_parts.append(rows if known_at_row is None else rows[~known_at_row[rows]])
    return Fold(train_start_day, train, np.concatenate(test_parts))


def roc_auc(is_fraud: _Bools, scores: npt.NDArray[np.floating]) -> float:
    """Area under the ROC curve: the chance a random fraud outscores a random legit row.

    Ties count one half. Raises ValueError unless both classes are present.
    """
    positives = int(is_fraud.sum())
    negatives = len(is_fraud) - positives
    if positives == 0 or negatives == 0:
        raise ValueError(f"ROC-AUC needs both classes, got {positives} fraud of {len(is_fraud)}")
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    # Tied scores share the average of the ranks they span (ranks from 1).
    average_rank = np.cumsum(counts) - (counts - 1) / 2.0
    rank_sum = float(average_rank[inverse][is_fraud].sum())
    return (rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives)


def average_precision(is_fraud: _Bools, scores: npt.NDArray[np.floating]) -> float:
    """Average precision: precision averaged over the recall steps of descending thresholds.

    Tied scores form one threshold. Raises ValueError if there is no fraud.
    """
    positives = int(is_fraud.sum())
    if positives == 0:
        raise ValueError("average precision needs at least one fraud row")
    order = np.argsort(-scores, kind="stable")
    ranked_scores = scores[order]
    true_positives = np.cumsum(is_fraud[order])
    # The last row of each run of tied scores closes a threshold.
    closes = np.append(ranked_scores[1:] != ranked_scores[:-1], True)
    true_positives = true_positives[closes]
    flagged = np.flatnonzero(closes) + 1
    precision = true_positives / flagged
    recall_step = np.diff(true_positives, prepend=0) / positives
    return float((recall_step * precision).sum())


def card_precision_at_k(
    day: _Ints, card: _Ints, is_fraud: _Bools, scores: npt.NDArray[np.floating], k: int = TOP_K
) -> float:
    """Card Precision@k, the mean over the days present; caught cards leave later days."""
    caught: set[int] = set()
    daily = []
    for today in np.unique(day).tolist():
        rows = np.flatnonzero(day == today)
        rows = rows[~np.isin(card[rows], list(caught))]
        cards, inverse = np.unique(card[rows], return_inverse=True)
        best = np.full(len(cards), -np.inf)
        np.maximum.at(best, inverse, scores[rows].astype(np.float64))
        defrauded = np.zeros(len(cards), np.bool_)
        np.logical_or.at(defrauded, inverse, is_fraud[rows])
        top = np.argsort(-best, kind="stable")[:k]
        hits = cards[top][defrauded[top]]
        caught.update(hits.tolist())
        daily.append(len(hits) / k)
    return float(np.mean(daily)) if daily else float("nan")


class Metrics(NamedTuple):
    """Threshold-free figures of one test set, as the handbook reports them."""

    roc_auc: float
    average_precision: float
    card_precision: float  # Card Precision@TOP_K


def protocol_metrics(
    day: _Ints, card: _Ints, is_fraud: _Bools, scores: npt.NDArray[np.floating]
) -> Metrics:
    """ROC-AUC, average precision and Card Precision@100 of a fold's test rows."""
    return Metrics(
        roc_auc(is_fraud, scores),
        average_precision(is_fraud, scores),
        card_precision_at_k(day, card, is_fraud, scores),
    )
