"""Train the shipped fraud model on the simulated stream and export it to ONNX with its card.

    python -m training [--seeds 7,8,9] [--days 122] [--folds 4] [--jobs N]
                       [--regimes capacity,chargebacks,today] [--out PACKAGE_DIR]

For each label regime and each seed (the first regime's first seed's model ships; the others
show how far the figures move with the simulated world and with how outcomes are reported;
seeds run in parallel processes, `--jobs` at once):

1. Simulate the handbook world for `days` days, its outcomes reported under the regime
   (`simulator/label_regimes.py`), and replay it through the service's own state and feature
   code (`simulator/replay.py`): no train/serve skew. Under the realistic regimes a fold's
   model learns only the frauds reported before it goes live (`training_targets`).
2. Validation folds (`training/protocol.py`: the handbook's chapter 5 schedule, every validation
   week before every test week). Both candidates, a gradient-boosted ensemble compiled to tensor
   operations (`training/gbdt.py`) and an MLP (`training/mlp.py`), are trained on each fold's
   training week, with the stream's first days, when every card is new (`training_rows`), and
   score its validation week. Every choice is made here: the candidate with
   the higher mean average precision; its calibration (`training/calibration.py`) on its
   validation log-odds; the decision thresholds (`training/thresholds.py`) on its calibrated
   validation scores; the fallback rules' fit (`training/fallback_fit.py`) on the validation rows.
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

import hashlib
import logging
import math
import multiprocessing
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from contracts.terminal_risk import FRESH_WINDOWS_DAYS, MS_PER_DAY
from scorer.drift import DriftReference, drift_reference, most_influential
from scorer.fallback import fallback_scores
from scorer.features import FEATURE_NAMES, NUM_FEATURES
from scorer.flag_rate import expected_flag_rate
from scorer.model_package import FORMAT as MANIFEST_FORMAT
from scorer.model_package import (
    Manifest,
    ModelInfo,
    ModelOutput,
    ThresholdChoice,
    Training,
)
from simulator.fraud import DEFAULT_SCENARIOS
from simulator.label_regimes import AUDIT_SHARE, LabelRegime
from simulator.replay import Stream, simulate
from simulator.transactions import DEFAULT_CARDS, DEFAULT_START_TIME_MS
from training import gbdt, handbook_recipe, mlp
from training.calibration import Bin, Platt, fit_platt, reliability
from training.fallback_fit import FallbackFit, fit_fallback
from training.onnx_export import score_with_onnxruntime
from training.options import DEFAULT_DAYS, DEFAULT_SEEDS, FOLDS
from training.protocol import (
    DELAY_DAYS,
    TEST_DAYS,
    TRAIN_DAYS,
    Fold,
    Metrics,
    Schedule,
    fold_schedule,
    handbook_fold,
    protocol_metrics,
    roc_auc,
)
from training.thresholds import (
    FALSE_DECLINE_COST,
    OTHER_FALSE_DECLINE_COSTS,
    REVIEW_LEGIT_SHARE,
    Chosen,
    decline_threshold,
    flagged_shares,
    review_threshold,
)

logger = logging.getLogger(__name__)

#: The candidates, by kind; the name of each one's package.
MODEL_NAMES = {"gbdt": "fraud-gbdt", "mlp": "fraud-mlp"}
#: The handbook's recipe, reported beside the candidates under this kind.
HANDBOOK = "handbook"
MODEL_RELEASE = "2.5.0"
#: Every fold also trains on the stream's first days, when every card and terminal is new: the
#: service meets such cards at start-up and for every new card, and a model trained on steady
#: state only flagged 6-8 % of their legitimate transactions on day 0 (3 % over a new stream's
#: first 10 days, 1 % in steady state). Chosen on the validation folds and on the first days of
#: an independent stream (seed + COLD_CHECK_SEED_OFFSET), never on a test week.
COLD_START_DAYS = 7
#: The cold-check streams COLD_START_DAYS was chosen on: the card says their columns are not
#: held out.
COLD_START_CHOSEN_ON = (107, 108)
#: The stream that checks cold start in the model card: another seed, COLD_CHECK_DAYS long.
COLD_CHECK_SEED_OFFSET = 100
COLD_CHECK_DAYS = 10
_MODELS_DIR = Path(__file__).resolve().parent.parent / "scorer" / "models"
#: Separates the trainer's random stream from the simulator's for the same seed.
_TRAINER_STREAM = 1
#: Test rows of this scenario are left out of the handbook-comparable figures.
NOT_IN_HANDBOOK = "card_testing"
#: Confirmed frauds known so far, without the delay (`scorer/terminal_risk.py`): the handbook's
#: setting has nothing like them (its outcomes arrive after the delay), so the card also reports
#: the chosen candidate without them, on the first seed only (it costs a model per test fold).
#: A row whose card this feature counts a confirmed fraud for is left out of every assessed
#: week: the service knows the card is compromised (within hours of a report), so the row tests
#: what serving already knows, not the model. The widest of the card's fresh-label windows.
KNOWN_COMPROMISED_FEATURE = f"card_fresh_frauds_{max(FRESH_WINDOWS_DAYS)}d"
FRESH_LABEL_COLUMNS = tuple(
    f"{entity}_fresh_frauds_{w}d" for entity in ("terminal", "card") for w in FRESH_WINDOWS_DAYS
)

_Ints = npt.NDArray[np.int64]
_Floats = npt.NDArray[np.float64]
_Model = gbdt.Trees | list[mlp.Layer]
#: Per scenario (legit included): the shares at or above review and at or above decline.
Outcomes = dict[str, tuple[float, float]]


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


class ColdStartDay(NamedTuple):
    legit_review: float
    legit_decline: float
    fraud_recall: float


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
    chosen = _validate(stream, schedule, seed)
    logger.info(
        "chose winner=%s platt=%s thresholds=%s seed=%d elapsed_s=%.1f",
        chosen.winner,
        chosen.platt,
        chosen.thresholds,
        seed,
        time.perf_counter() - began,
    )
    tested = _test(stream, schedule, seed, chosen.winner, chosen.platt)
    ablated = (
        _test_without_fresh_labels(stream, schedule, seed, chosen.winner)
        if without_fresh_labels
        else []
    )
    logger.info("tested seed=%d elapsed_s=%.1f", seed, time.perf_counter() - began)
    cold_start = _cold_start(tested.model, seed, cards, chosen.thresholds, regime, audit_share)
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
            chosen.winner: _at_review(stream, tested.rows, tested.scores, chosen.thresholds.review),
            HANDBOOK: _at_review(stream, tested.rows, tested.recipe_scores, chosen.recipe_review),
        },
        validation_outcomes=_outcomes(stream, chosen.rows, chosen.scores, chosen.thresholds),
        test_outcomes=_outcomes(stream, tested.rows, tested.scores, chosen.thresholds),
        fallback=FallbackReport(
            chosen.fallback,
            _outcomes(
                stream,
                chosen.rows,
                fallback_scores(stream.features[chosen.rows]),
                chosen.thresholds,
            ),
            _outcomes(stream, tested.rows, rules_test, chosen.thresholds),
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


def _cold_start(
    model: bytes,
    seed: int,
    cards: int,
    thresholds: Chosen,
    regime: LabelRegime,
    audit_share: float,
) -> list[ColdStartDay]:
    """The shipped model on a new stream's first COLD_CHECK_DAYS days, day by day."""
    stream = simulate(seed + COLD_CHECK_SEED_OFFSET, COLD_CHECK_DAYS, cards, regime, audit_share)
    scores = score_with_onnxruntime(model, stream.features)
    days = []
    for day in range(COLD_CHECK_DAYS):
        legit = scores[(stream.day == day) & ~stream.is_fraud]
        fraud = scores[(stream.day == day) & stream.is_fraud]
        days.append(
            ColdStartDay(
                float((legit >= thresholds.review).mean()),
                float((legit >= thresholds.decline).mean()),
                float((fraud >= thresholds.review).mean()) if len(fraud) else math.nan,
            )
        )
    return days


class _Choices(NamedTuple):
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


def _validate(stream: Stream, schedule: Schedule, seed: int) -> _Choices:
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
            model = _fit(kind, stream.features[train], training_targets(stream, start, train), seed)
            exported, _ = _export(kind, model, seed, len(train))
            scores = score_with_onnxruntime(exported, stream.features[fold.test])
            validation[kind].append(_fold_result(stream, start, fold.test, scores))
            logits[kind].append(_logits(model, stream.features[fold.test]))
            served_logits[kind].append(_logits(model, stream.features[served[-1]]))
        result, scores = _handbook_recipe(stream, start, train, fold.test)
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
    return _Choices(
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


class _Tested(NamedTuple):
    """The chosen model and the handbook recipe on the test folds."""

    folds: dict[str, list[FoldResult]]
    rows: _Ints  # the test weeks' rows, fold after fold
    scores: npt.NDArray[np.float32]  # the chosen model's, from its exported graphs
    model: bytes  # the latest fold's exported model: the one that ships
    version: str
    recipe_scores: npt.NDArray[np.floating]  # the handbook recipe's, of the same rows


def _test(stream: Stream, schedule: Schedule, seed: int, winner: str, platt: Platt) -> _Tested:
    """Each test week scored once by the chosen, calibrated candidate trained on its fold."""
    folds: dict[str, list[FoldResult]] = {winner: [], HANDBOOK: []}
    tested: list[_Ints] = []
    test_scores: list[npt.NDArray[np.float32]] = []
    recipe_scores: list[npt.NDArray[np.floating]] = []
    exports: list[tuple[bytes, str]] = []
    for start in schedule.test:
        fold = stream_fold(stream, start)
        train = training_rows(stream, fold.train)
        fitted = _fit(winner, stream.features[train], training_targets(stream, start, train), seed)
        model = _calibrated(fitted, platt)
        exports.append(_export(winner, model, seed, len(train)))
        scores = score_with_onnxruntime(exports[-1][0], stream.features[fold.test])
        folds[winner].append(_fold_result(stream, start, fold.test, scores))
        result, recipe = _handbook_recipe(stream, start, train, fold.test)
        folds[HANDBOOK].append(result)
        recipe_scores.append(recipe)
        tested.append(fold.test)
        test_scores.append(scores)
        logger.info("test fold train_start_day=%d seed=%d", start, seed)
    shipped, version = exports[0]
    return _Tested(
        folds,
        np.concatenate(tested),
        np.concatenate(test_scores),
        shipped,
        version,
        np.concatenate(recipe_scores),
    )


def _test_without_fresh_labels(
    stream: Stream, schedule: Schedule, seed: int, winner: str
) -> list[FoldResult]:
    """The chosen candidate trained and scored without FRESH_LABEL_COLUMNS on each test fold."""
    keep = np.array([i for i, name in enumerate(FEATURE_NAMES) if name not in FRESH_LABEL_COLUMNS])
    results = []
    for start in schedule.test:
        fold = stream_fold(stream, start)
        train = training_rows(stream, fold.train)
        targets = training_targets(stream, start, train)
        model = _fit(winner, stream.features[train][:, keep], targets, seed)
        logits = _logits(model, stream.features[fold.test][:, keep])
        results.append(_fold_result(stream, start, fold.test, logits))
    return results


def stream_fold(stream: Stream, train_start_day: int) -> Fold:
    """A fold of `stream`: known-compromised cards removed by the handbook's rule, and every row
    whose card the service already knows to be compromised when it scores it: a fraud of the
    card confirmed within KNOWN_COMPROMISED_FEATURE's window, as its own feature says."""
    known = stream.features[:, FEATURE_NAMES.index(KNOWN_COMPROMISED_FEATURE)] > 0
    return handbook_fold(stream.day, stream.card, stream.is_fraud, train_start_day, known)


def training_rows(stream: Stream, week: _Ints) -> _Ints:
    """A fold's training rows: the stream's first COLD_START_DAYS days, then its training week."""
    cold = np.flatnonzero(stream.day < COLD_START_DAYS)
    return np.concatenate([cold, week[stream.day[week] >= COLD_START_DAYS]])


def training_targets(stream: Stream, train_start_day: int, rows: _Ints) -> npt.NDArray[np.bool_]:
    """What a model trained on these rows of the fold learns as fraud.

    Under the ``today`` regime, every fraud, as the handbook's protocol assumes (its outcomes
    are known after the delay week). Under the others, only the frauds reported before the
    model goes live, on the first day of the week it is assessed on: a fraud not yet reported
    reads as legitimate, as it does to a team that retrains. Assessment always reads every
    outcome (the truth the simulator knows).
    """
    if stream.regime is LabelRegime.TODAY:
        return stream.is_fraud[rows]
    go_live_ms = DEFAULT_START_TIME_MS + assessed_days(train_start_day)[0] * MS_PER_DAY
    return stream.is_fraud[rows] & (stream.reported_at[rows] < go_live_ms)


def _fold_result(
    stream: Stream, start: int, rows: _Ints, scores: npt.NDArray[np.floating]
) -> FoldResult:
    in_handbook = stream.scenario[rows] != NOT_IN_HANDBOOK
    return FoldResult(
        start,
        _metrics(stream, rows[in_handbook], scores[in_handbook]),
        _metrics(stream, rows, scores),
    )


def _metrics(stream: Stream, rows: _Ints, scores: npt.NDArray[np.floating]) -> Metrics:
    return protocol_metrics(stream.day[rows], stream.card[rows], stream.is_fraud[rows], scores)


def _handbook_recipe(
    stream: Stream, start: int, train: _Ints, assessed: _Ints
) -> tuple[FoldResult, npt.NDArray[np.floating]]:
    """The handbook's recipe trained on `train`: its figures on `assessed`, and its scores."""
    model = handbook_recipe.fit(stream.features[train], training_targets(stream, start, train))
    scores = handbook_recipe.scores(model, stream.features[assessed])
    return _fold_result(stream, start, assessed, scores), scores


def _at_review(
    stream: Stream, rows: _Ints, scores: npt.NDArray[np.floating], review: float
) -> AtReview:
    flagged = scores >= review
    is_fraud = stream.is_fraud[rows]
    return AtReview(review, float(flagged[is_fraud].mean()), float(flagged[~is_fraud].mean()))


def _outcomes(
    stream: Stream, rows: _Ints, scores: npt.NDArray[np.floating], chosen: Chosen
) -> Outcomes:
    scenario = stream.scenario[rows]
    return {name: flagged_shares(scores[scenario == name], chosen) for name in DEFAULT_SCENARIOS}


def _fit(
    kind: str, features: npt.NDArray[np.float32], is_fraud: npt.NDArray[np.bool_], seed: int
) -> _Model:
    """One candidate fitted on these training rows; its output is the log-odds of fraud."""
    if kind == "gbdt":
        return gbdt.fit(features, is_fraud, seed)
    return mlp.fit(features, is_fraud, np.random.default_rng((seed, _TRAINER_STREAM)))


def _logits(model: _Model, features: npt.NDArray[np.float32]) -> _Floats:
    if isinstance(model, gbdt.Trees):
        return gbdt.raw_scores(model, features)
    return mlp.raw_scores(model, features)


def _calibrated(model: _Model, platt: Platt) -> _Model:
    """The same model whose log-odds are a·z + b: its sigmoid is the calibrated probability."""
    if isinstance(model, gbdt.Trees):
        return gbdt.calibrated(model, platt.a, platt.b)
    last = model[-1]
    return [*model[:-1], mlp.Layer(last.weights * platt.a, last.bias * platt.a + platt.b)]


def _export(kind: str, model: _Model, seed: int, training_rows: int) -> tuple[bytes, str]:
    """The ONNX model and its model_version (the hash of its parameters)."""
    name = MODEL_NAMES[kind]
    arrays: list[npt.NDArray[np.generic]] = (
        list(model) if isinstance(model, gbdt.Trees) else [a for layer in model for a in layer]
    )
    version = f"{name}-{MODEL_RELEASE}-{parameters_digest(arrays)}"
    metadata = {
        "model_version": version,
        "feature_names": ",".join(FEATURE_NAMES),
        "seed": str(seed),
        "training_rows": str(training_rows),
    }
    if isinstance(model, gbdt.Trees):
        return gbdt.export_onnx(model, NUM_FEATURES, name, metadata), version
    return mlp.export_onnx(model, NUM_FEATURES, name, metadata), version


def parameters_digest(arrays: Sequence[npt.NDArray[np.generic]]) -> str:
    """The first 8 hex digits of the sha256 of a model's parameters: its version's suffix."""
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:8]


def package_path(name: str) -> Path:
    """Where the package of a model of that name ships."""
    return _MODELS_DIR / name


def assessed_days(train_start_day: int) -> tuple[int, int]:
    """First and last day of the week a fold assesses (validation or test)."""
    first = train_start_day + TRAIN_DAYS + DELAY_DAYS
    return first, first + TEST_DAYS - 1


def validation_days(schedule: Schedule) -> tuple[int, int]:
    """First and last day of the validation weeks."""
    return assessed_days(schedule.validation[-1])[0], assessed_days(schedule.validation[0])[1]


def manifest(result: TrainingResult) -> Manifest:
    """The shipped package's manifest (its hash is set when it is written)."""
    first, last = validation_days(result.schedule)
    weeks = f"the validation weeks (days {first}-{last}, before every test week)"
    start = result.schedule.test[0]
    metrics = {
        f"validation_{field}_mean_over_folds": round(
            mean_std(result.validation[result.winner], field)[0], 4
        )
        for field in Metrics._fields
    }
    metrics |= {
        f"test_{field}_mean_over_folds": round(mean_std(result.test[result.winner], field)[0], 4)
        for field in Metrics._fields
    }
    return Manifest(
        format=MANIFEST_FORMAT,
        model=ModelInfo(result.model_name, result.model_version),
        features=list(FEATURE_NAMES),
        output=ModelOutput(
            meaning="probability of fraud, calibrated by Platt scaling on "
            f"{weeks}; on the test weeks the mean score was {result.test_mean_score:.4f} "
            f"and the fraud rate {result.test_fraud_rate:.4f} (MODEL_CARD.md, Calibration)",
            calibration="platt",
        ),
        thresholds=ThresholdChoice(
            result.thresholds.review,
            result.thresholds.decline,
            chosen_by=f"on {weeks}: review, the lowest score at which at most "
            f"{REVIEW_LEGIT_SHARE:.0%} of legitimate transactions reach review; decline, the "
            "score at or above review with the lowest cost when a declined legitimate "
            f"transaction costs {FALSE_DECLINE_COST:g} and a fraud not declined costs its "
            "amount (MODEL_CARD.md, Thresholds)",
            expected_flag_rate=result.expected_flag_rate,
        ),
        training=Training(
            data=f"simulated stream: seed {result.seed}, {result.days} days, {result.rows} "
            f"transactions ({result.fraud_rows} fraud), {result.labels} labels reported under "
            f"the {result.regime.value} label regime",
            window=f"days 0-{COLD_START_DAYS - 1} (cold start) and {start}-"
            f"{start + TRAIN_DAYS - 1} ({result.train_rows} rows), the training week of the "
            f"latest of {len(result.schedule.test)} test folds; chosen, "
            f"calibrated and thresholds set on {weeks}",
            metrics=metrics,
        ),
        onnx_sha256="",
        reference=result.reference,
        drift=result.drift,
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
