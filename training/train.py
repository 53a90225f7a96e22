"""Train the shipped fraud model on the simulated stream and export it to ONNX with its card.

    python -m training [--seeds 7,8,9] [--days 122] [--folds 4] [--jobs N]
                       [--regimes capacity,chargebacks,today] [--out PACKAGE_DIR]

For each label regime and each seed (the first regime's first seed's model ships; the others
show how far the figures move with the simulated world and with how outcomes are reported;
seeds run in parallel processes, `--jobs` at once):

1. Simulate the handbook world for `days` days, its outcomes reported under the regime
   (`simulator/label_regimes.py`), and replay it through the service's own state and feature
   code (`simulator/replay.py`): no train/serve skew. Under the realistic regimes a fold's
   model learns only the frauds reported before it goes live (`training_targets`,
   `training/fold_data.py`).
2. Validation folds (`training/protocol.py`: the handbook's chapter 5 schedule, every validation
   week before every test week; run by `training/model_selection.py`). Both candidates
   (`training/candidates.py`), a gradient-boosted ensemble compiled to tensor operations
   (`training/gbdt.py`) and an MLP (`training/mlp.py`), are trained on each fold's training
   week, with the stream's first days, when every card is new (`training_rows`,
   `training/fold_data.py`), and score its validation week. Every choice is made here: the
   candidate with the higher mean average precision; its calibration
   (`training/calibration.py`) on its validation log-odds; the decision thresholds
   (`training/thresholds.py`) on its calibrated validation scores; the fallback rules' fit
   (`training/fallback_fit.py`) on the validation rows.
3. Test folds: the chosen candidate, trained on each fold's training week and calibrated, is
   exported to ONNX and scores the fold's test week once on ONNX Runtime: the reported figures.
   The handbook's own recipe (`training/handbook_recipe.py`) is trained and scored on the same
   validation and test folds, as the baseline; on the first seed, the chosen candidate is also
   tested without the fresh-label columns, which the handbook's setting has no counterpart for.
4. The first seed's model of the latest test fold ships as a model package
   (scorer/model_package.py): model.onnx, model.toml and MODEL_CARD.md.

The same seeds and days give a byte-identical model file and model card on the same platform.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat

import numpy as np

from scorer.drift import drift_reference, most_influential
from scorer.fallback import fallback_scores
from scorer.features import FEATURE_NAMES
from scorer.flag_rate import expected_flag_rate
from simulator.fraud import DEFAULT_SCENARIOS
from simulator.label_regimes import AUDIT_SHARE, LabelRegime
from simulator.replay import simulate
from simulator.transactions import DEFAULT_CARDS
from training.assessment import at_review, outcomes
from training.calibration import reliability
from training.candidates import HANDBOOK, MODEL_NAMES
from training.cold_start_check import check_cold_start
from training.fold_data import stream_fold, training_rows
from training.model_selection import (
    choose_on_validation_folds,
    score_test_folds,
    score_test_folds_without_fresh_labels,
)
from training.onnx_export import score_with_onnxruntime
from training.options import DEFAULT_DAYS, DEFAULT_SEEDS, FOLDS
from training.protocol import fold_schedule, roc_auc, validation_days
from training.results import FallbackReport, TrainingResult

logger = logging.getLogger(__name__)


def train_model(
    seed: int = DEFAULT_SEEDS[0],
    days: int = DEFAULT_DAYS,
    folds: int = FOLDS,
    cards: int = DEFAULT_CARDS,
    without_fresh_labels: bool = False,
    regime: LabelRegime = LabelRegime.TODAY,
    audit_share: float = AUDIT_SHARE,
) -> TrainingResult:
    """Simulate and replay one seed's stream; choose, calibrate and test. Writes nothing.

    `cards` below the handbook's 5,000 makes a quick, smaller run (the tests' reduced
    configuration); the shipped model uses the default. `without_fresh_labels` also tests the
    chosen candidate without FRESH_LABEL_COLUMNS. `regime` and `audit_share`: how outcomes are
    reported (`simulator/label_regimes.py`).
    """
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    schedule = fold_schedule(days, folds)
    stream = simulate(seed, days, cards, regime, audit_share)
    began = time.perf_counter()
    chosen = choose_on_validation_folds(stream, schedule, seed)
    logger.info(
        "chose winner=%s platt=%s thresholds=%s seed=%d elapsed_s=%.1f",
        chosen.winner,
        chosen.platt,
        chosen.thresholds,
        seed,
        time.perf_counter() - began,
    )
    tested = score_test_folds(stream, schedule, seed, chosen.winner, chosen.platt)
    ablated = (
        score_test_folds_without_fresh_labels(stream, schedule, seed, chosen.winner)
        if without_fresh_labels
        else []
    )
    logger.info("tested seed=%d elapsed_s=%.1f", seed, time.perf_counter() - began)
    cold_start = check_cold_start(tested.model, seed, cards, chosen.thresholds, regime, audit_share)
    valid_fraud = stream.is_fraud[chosen.rows]
    test_fraud = stream.is_fraud[tested.rows]
    rules_test = fallback_scores(stream.features[tested.rows])
    latest = stream_fold(stream, schedule.test[0])
    legit_train = stream.features[latest.train][~stream.is_fraud[latest.train]]
    validation_rows = stream.features[chosen.served_rows]
    first, last = validation_days(schedule)
    drift = drift_reference(
        f"every row of the validation weeks ({len(chosen.served_rows)} rows, days {first}-{last}, "
        "known-compromised cards included, as serving sees them), scored by the chosen "
        "candidate, calibrated",
        chosen.served_scores,
        validation_rows,
        FEATURE_NAMES,
        most_influential(
            lambda rows: score_with_onnxruntime(tested.model, rows), validation_rows, FEATURE_NAMES
        ),
    )
    return TrainingResult(
        model=tested.model,
        model_name=MODEL_NAMES[chosen.winner],
        model_version=tested.version,
        seed=seed,
        days=days,
        schedule=schedule,
        rows=len(stream.is_fraud),
        fraud_rows=int(stream.is_fraud.sum()),
        labels=len(stream.labels),
        scenario_rows={name: int((stream.scenario == name).sum()) for name in DEFAULT_SCENARIOS},
        winner=chosen.winner,
        validation=chosen.validation,
        test=tested.folds,
        without_fresh_labels=ablated,
        platt=chosen.platt,
        thresholds=chosen.thresholds,
        decline_by_cost=chosen.decline_by_cost,
        validation_reliability=reliability(chosen.scores, valid_fraud),
        test_reliability=reliability(tested.scores, test_fraud),
        test_mean_score=float(tested.scores.astype(np.float64).mean()),
        test_fraud_rate=float(test_fraud.mean()),
        test_at_review={
            chosen.winner: at_review(stream, tested.rows, tested.scores, chosen.thresholds.review),
            HANDBOOK: at_review(stream, tested.rows, tested.recipe_scores, chosen.recipe_review),
        },
        validation_outcomes=outcomes(stream, chosen.rows, chosen.scores, chosen.thresholds),
        test_outcomes=outcomes(stream, tested.rows, tested.scores, chosen.thresholds),
        fallback=FallbackReport(
            chosen.fallback,
            outcomes(
                stream,
                chosen.rows,
                fallback_scores(stream.features[chosen.rows]),
                chosen.thresholds,
            ),
            outcomes(stream, tested.rows, rules_test, chosen.thresholds),
            roc_auc(test_fraud, rules_test),
        ),
        reference=[float(v) for v in np.median(legit_train, axis=0)],
        drift=drift,
        expected_flag_rate=expected_flag_rate(
            chosen.served_scores, stream.day[chosen.served_rows], chosen.thresholds.review
        ),
        train_rows=len(training_rows(stream, latest.train)),
        test_rows=len(latest.test),
        cold_start=cold_start,
        regime=regime,
        audit_share=audit_share,
    )


def train_models(
    seeds: Sequence[int],
    days: int = DEFAULT_DAYS,
    folds: int = FOLDS,
    jobs: int | None = None,
    regime: LabelRegime = LabelRegime.TODAY,
    audit_share: float = AUDIT_SHARE,
    without_fresh_labels: bool = True,
) -> list[TrainingResult]:
    """`train_model` of each seed, in that order, the first one also without fresh labels
    (unless `without_fresh_labels` is False); up to `jobs` seeds at once, each in a process of
    its own (the results are the same either way)."""
    jobs = min(jobs or os.cpu_count() or 1, len(seeds))
    # The shipped seed: also without fresh labels.
    first = [without_fresh_labels and i == 0 for i in range(len(seeds))]
    args = (
        seeds,
        repeat(days),
        repeat(folds),
        repeat(DEFAULT_CARDS),
        first,
        repeat(regime),
        repeat(audit_share),
    )
    if jobs == 1:
        return list(map(train_model, *args))
    # "spawn": a fresh interpreter per worker, never a fork of a process that holds threads.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=configure_logging) as pool:
        return list(pool.map(train_model, *args))


def configure_logging() -> None:
    """INFO lines with their time and logger, for a training run and each of its processes."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
