"""Model selection, as the handbook's chapter 5 runs it: every choice on the validation folds,
then the choice scored once on the test folds.

On the validation folds both candidates and the handbook's recipe are trained and scored, and
the candidate, its calibration, the thresholds and the fallback rules' fit are chosen. The test
folds only score the chosen, calibrated candidate (and the recipe beside it): they play no part
in any choice, so the figures they give are honest.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from scorer.features import FEATURE_NAMES
from simulator.replay import Stream
from training import candidates
from training.assessment import fold_result, handbook_recipe_fold
from training.calibration import Platt, fit_platt
from training.candidates import HANDBOOK, MODEL_NAMES
from training.fallback_fit import FallbackFit, fit_fallback
from training.fold_data import FRESH_LABEL_COLUMNS, stream_fold, training_rows, training_targets
from training.onnx_export import score_with_onnxruntime
from training.protocol import Schedule, assessed_days
from training.results import FoldResult, mean_std
from training.thresholds import (
    OTHER_FALSE_DECLINE_COSTS,
    Chosen,
    decline_threshold,
    review_threshold,
)

logger = logging.getLogger(__name__)

_Ints = npt.NDArray[np.int64]
_Floats = npt.NDArray[np.float64]


class Choices(NamedTuple):
    """Everything the validation folds decided, and the scores it was decided on."""

    winner: str
    validation: dict[str, list[FoldResult]]
    rows: _Ints  # the validation weeks' assessed rows, fold after fold
    scores: _Floats  # the winner's calibrated scores of them
    #: Every row of the validation weeks, known-compromised cards included, and the winner's
    #: calibrated scores of them: the traffic serving sees, for the drift reference and the
    #: expected flag rate (a known-compromised card's rows are flagged far more often).
    served_rows: _Ints
    served_scores: _Floats
    platt: Platt
    thresholds: Chosen
    decline_by_cost: dict[float, float]
    fallback: FallbackFit
    #: The handbook recipe's review threshold, by the same rule as ours.
    recipe_review: float


def choose_on_validation_folds(stream: Stream, schedule: Schedule, seed: int) -> Choices:
    """Both candidates and the handbook recipe on the validation folds; every choice."""
    validation: dict[str, list[FoldResult]] = {kind: [] for kind in (*MODEL_NAMES, HANDBOOK)}
    logits: dict[str, list[_Floats]] = {kind: [] for kind in MODEL_NAMES}
    served_logits: dict[str, list[_Floats]] = {kind: [] for kind in MODEL_NAMES}
    assessed: list[_Ints] = []
    served: list[_Ints] = []
    recipe_scores: list[npt.NDArray[np.floating]] = []
    for start in schedule.validation:
        fold = stream_fold(stream, start)
        train = training_rows(stream, fold.train)
        assessed.append(fold.test)
        week = assessed_days(start)
        served.append(np.flatnonzero((stream.day >= week[0]) & (stream.day <= week[-1])))
        for kind in MODEL_NAMES:
            model = candidates.fit(
                kind, stream.features[train], training_targets(stream, start, train), seed
            )
            exported, _ = candidates.export(kind, model, seed, len(train))
            scores = score_with_onnxruntime(exported, stream.features[fold.test])
            validation[kind].append(fold_result(stream, start, fold.test, scores))
            logits[kind].append(candidates.logits(model, stream.features[fold.test]))
            served_logits[kind].append(candidates.logits(model, stream.features[served[-1]]))
        result, scores = handbook_recipe_fold(stream, start, train, fold.test)
        validation[HANDBOOK].append(result)
        recipe_scores.append(scores)
        logger.info("validation fold train_start_day=%d seed=%d", start, seed)
    winner = max(MODEL_NAMES, key=lambda kind: mean_std(validation[kind], "average_precision")[0])
    rows = np.concatenate(assessed)
    is_fraud = stream.is_fraud[rows]
    platt = fit_platt(np.concatenate(logits[winner]), is_fraud)
    calibrated = platt.apply(np.concatenate(logits[winner]))
    review = review_threshold(calibrated[~is_fraud])
    amount = stream.columns.amount[rows].astype(np.float64)
    return Choices(
        winner,
        validation,
        rows,
        calibrated,
        np.concatenate(served),
        platt.apply(np.concatenate(served_logits[winner])),
        platt,
        Chosen(review, decline_threshold(calibrated, is_fraud, amount, floor=review)),
        {
            cost: decline_threshold(calibrated, is_fraud, amount, cost, floor=review)
            for cost in OTHER_FALSE_DECLINE_COSTS
        },
        fit_fallback(stream.features[rows], is_fraud),
        review_threshold(np.concatenate(recipe_scores)[~is_fraud]),
    )


class Tested(NamedTuple):
    """The chosen model and the handbook recipe on the test folds."""

    folds: dict[str, list[FoldResult]]
    rows: _Ints  # the test weeks' rows, fold after fold
    scores: npt.NDArray[np.float32]  # the chosen model's, from its exported graphs
    model: bytes  # the latest fold's exported model: the one that ships
    version: str
    recipe_scores: npt.NDArray[np.floating]  # the handbook recipe's, of the same rows


def score_test_folds(
    stream: Stream, schedule: Schedule, seed: int, winner: str, platt: Platt
) -> Tested:
    """Each test week scored once by the chosen, calibrated candidate trained on its fold."""
    folds: dict[str, list[FoldResult]] = {winner: [], HANDBOOK: []}
    tested: list[_Ints] = []
    test_scores: list[npt.NDArray[np.float32]] = []
    recipe_scores: list[npt.NDArray[np.floating]] = []
    exports: list[tuple[bytes, str]] = []
    for start in schedule.test:
        fold = stream_fold(stream, start)
        train = training_rows(stream, fold.train)
        fitted = candidates.fit(
            winner, stream.features[train], training_targets(stream, start, train), seed
        )
        model = candidates.calibrated(fitted, platt)
        exports.append(candidates.export(winner, model, seed, len(train)))
        scores = score_with_onnxruntime(exports[-1][0], stream.features[fold.test])
        folds[winner].append(fold_result(stream, start, fold.test, scores))
        result, recipe = handbook_recipe_fold(stream, start, train, fold.test)
        folds[HANDBOOK].append(result)
        recipe_scores.append(recipe)
        tested.append(fold.test)
        test_scores.append(scores)
        logger.info("test fold train_start_day=%d seed=%d", start, seed)
    shipped, version = exports[0]
    return Tested(
        folds,
        np.concatenate(tested),
        np.concatenate(test_scores),
        shipped,
        version,
        np.concatenate(recipe_scores),
    )


def score_test_folds_without_fresh_labels(
    stream: Stream, schedule: Schedule, seed: int, winner: str
) -> list[FoldResult]:
    """The chosen candidate trained and scored without FRESH_LABEL_COLUMNS on each test fold."""
    keep = np.array([i for i, name in enumerate(FEATURE_NAMES) if name not in FRESH_LABEL_COLUMNS])
    results = []
    for start in schedule.test:
        fold = stream_fold(stream, start)
        train = training_rows(stream, fold.train)
        targets = training_targets(stream, start, train)
        model = candidates.fit(winner, stream.features[train][:, keep], targets, seed)
        logits = candidates.logits(model, stream.features[fold.test][:, keep])
        results.append(fold_result(stream, start, fold.test, logits))
    return results
