"""Train the shipped fraud model on the simulated stream and export it to ONNX with its card.

    python -m training [--seed 7] [--days 87] [--out PACKAGE_DIR]

1. Simulate the handbook world for `days` days and replay it through the service's own state
   and feature code (`training/replay.py`): no train/serve skew.
2. For each of the handbook's prequential test folds (`training/protocol.py`: a training week, a
   delay week, a test week with known-compromised cards removed), train both candidates, a
   gradient-boosted ensemble compiled to tensor operations (`training/gbdt.py`) and an MLP
   (`training/mlp.py`), and score the test week with the exported ONNX model on ONNX Runtime.
3. Ship the candidate with the higher mean average precision: its model of the latest fold, as
   a model package (scorer/model_package.py): model.onnx, model.toml and MODEL_CARD.md.

The same seed and days give a byte-identical model file and model card on the same platform.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from scorer.decisions import DEFAULT_DECLINE_THRESHOLD, DEFAULT_REVIEW_THRESHOLD
from scorer.features import FEATURE_NAMES, NUM_FEATURES
from scorer.model_package import FORMAT as MANIFEST_FORMAT
from scorer.model_package import (
    Manifest,
    ModelInfo,
    ModelOutput,
    ThresholdChoice,
    Training,
    write_model_package,
)
from simulator.fraud import SCENARIOS
from training import gbdt, mlp
from training.onnx_export import score_with_onnxruntime
from training.protocol import TEST_DAYS, TRAIN_DAYS, Metrics, handbook_fold, protocol_metrics
from training.replay import Stream, simulate

logger = logging.getLogger(__name__)

MODEL_NAMES = {"gbdt": "fraud-gbdt", "mlp": "fraud-mlp"}
MODEL_RELEASE = "2.0.0"
DEFAULT_SEED = 7
#: Days before the first training week: every window (30 days, + the 7-day delay for terminal
#: risk) is full, and compromised terminals (28 days) and cards (14) are in steady state.
WARMUP_DAYS = 45
FOLDS = 4
DEFAULT_DAYS = WARMUP_DAYS + (FOLDS - 1) * TEST_DAYS + TRAIN_DAYS + 7 + TEST_DAYS
_MODELS_DIR = Path(__file__).resolve().parent.parent / "scorer" / "models"
#: The service's default decision thresholds.
REVIEW_THRESHOLD = DEFAULT_REVIEW_THRESHOLD
DECLINE_THRESHOLD = DEFAULT_DECLINE_THRESHOLD
#: The shipped score is shifted (a constant on the log-odds: rankings do not change) so that
#: this share of the training week's legitimate transactions reaches the review threshold.
TARGET_REVIEW_RATE = 0.005
#: Separates the trainer's random stream from the simulator's for the same seed.
_TRAINER_STREAM = 1
#: Test rows of this scenario are left out of the handbook-comparable figures.
NOT_IN_HANDBOOK = "card_testing"


class FoldResult(NamedTuple):
    """One candidate on one fold."""

    train_start_day: int
    handbook: Metrics  # test rows of the handbook's scenarios
    everything: Metrics  # all test rows, card testing included


class Candidate(NamedTuple):
    """A model type over every fold, and its model of the latest fold."""

    kind: str
    folds: list[FoldResult]
    model: bytes
    model_version: str
    #: Review and decline recall per fraud scenario, and the legit review/decline rates, on the
    #: latest fold's test week (all rows).
    recall: dict[str, tuple[float, float]]
    false_positive_rate: tuple[float, float]

    def mean(self, field: str, handbook: bool = True) -> tuple[float, float]:
        """Mean and standard deviation of a Metrics field over the folds."""
        values = [getattr(f.handbook if handbook else f.everything, field) for f in self.folds]
        return float(np.mean(values)), float(np.std(values))


class TrainingResult(NamedTuple):
    """The shipped model, how it was made and how both candidates scored."""

    model: bytes
    model_name: str
    model_version: str
    seed: int
    days: int
    rows: int
    fraud_rows: int
    labels: int
    train_rows: int
    test_rows: int
    candidates: dict[str, Candidate]
    winner: str
    scenario_rows: dict[str, int]
    #: The median of the latest training week's legitimate rows: reason codes' reference row.
    reference: list[float]
    #: Training-week start day of the latest fold, the shipped model's.
    train_start_day: int


def fold_starts(days: int, folds: int = FOLDS) -> list[int]:
    """Training-week start days of the test folds, latest first, ending with the stream."""
    latest = days - (TRAIN_DAYS + 7 + TEST_DAYS)
    starts = [latest - k * TEST_DAYS for k in range(folds)]
    if starts[-1] < 0:
        raise ValueError(f"{days} days hold fewer than {folds} folds")
    return starts


def train_model(
    seed: int = DEFAULT_SEED, days: int = DEFAULT_DAYS, folds: int = FOLDS, cards: int = 5_000
) -> TrainingResult:
    """Simulate, replay, train and evaluate both candidates; pick the winner. Writes nothing.

    `cards` below the handbook's 5,000 makes a quick, smaller run (the tests' reduced
    configuration); the shipped model uses the default.
    """
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    starts = fold_starts(days, folds)
    stream = simulate(seed, days, cards)
    candidates = {kind: _candidate(kind, stream, starts, seed) for kind in MODEL_NAMES}
    winner = max(candidates, key=lambda kind: candidates[kind].mean("average_precision")[0])
    shipped = candidates[winner]
    latest = handbook_fold(stream.day, stream.card, stream.is_fraud, starts[0])
    return TrainingResult(
        model=shipped.model,
        model_name=MODEL_NAMES[winner],
        model_version=shipped.model_version,
        seed=seed,
        days=days,
        rows=len(stream.is_fraud),
        fraud_rows=int(stream.is_fraud.sum()),
        labels=stream.labels,
        train_rows=len(latest.train),
        test_rows=len(latest.test),
        candidates=candidates,
        winner=winner,
        scenario_rows={name: int((stream.scenario == name).sum()) for name in SCENARIOS},
        reference=[
            float(v)
            for v in np.median(stream.features[latest.train][~stream.is_fraud[latest.train]], 0)
        ],
        train_start_day=starts[0],
    )


def _candidate(kind: str, stream: Stream, starts: list[int], seed: int) -> Candidate:
    results: list[FoldResult] = []
    latest: tuple[bytes, str, npt.NDArray[np.float32], npt.NDArray[np.int64]] | None = None
    for start in starts:
        began = time.perf_counter()
        fold = handbook_fold(stream.day, stream.card, stream.is_fraud, start)
        model, version = _train(kind, stream, fold.train, seed)
        test = fold.test
        scores = score_with_onnxruntime(model, stream.features[test])
        handbook = test[stream.scenario[test] != NOT_IN_HANDBOOK]
        in_handbook = np.isin(test, handbook)
        results.append(
            FoldResult(
                start,
                _metrics(stream, handbook, scores[in_handbook]),
                _metrics(stream, test, scores),
            )
        )
        logger.info(
            "fold kind=%s train_start_day=%d handbook=%s elapsed_s=%.1f",
            kind,
            start,
            results[-1].handbook,
            time.perf_counter() - began,
        )
        if latest is None:
            latest = (model, version, scores, test)
    assert latest is not None
    model, version, scores, test = latest
    scenario = stream.scenario[test]
    recall = {name: _flagged(scores[scenario == name]) for name in SCENARIOS[1:]}
    return Candidate(kind, results, model, version, recall, _flagged(scores[scenario == "legit"]))


def _metrics(
    stream: Stream, rows: npt.NDArray[np.int64], scores: npt.NDArray[np.float32]
) -> Metrics:
    return protocol_metrics(stream.day[rows], stream.card[rows], stream.is_fraud[rows], scores)


def _flagged(scores: npt.NDArray[np.float32]) -> tuple[float, float]:
    if len(scores) == 0:
        return (math.nan, math.nan)
    return (
        float((scores >= REVIEW_THRESHOLD).mean()),
        float((scores >= DECLINE_THRESHOLD).mean()),
    )


def _train(kind: str, stream: Stream, train: npt.NDArray[np.int64], seed: int) -> tuple[bytes, str]:
    """Fit one candidate on the training rows; its ONNX model and model_version."""
    features, is_fraud = stream.features[train], stream.is_fraud[train]
    rng = np.random.default_rng((seed, _TRAINER_STREAM))
    name = MODEL_NAMES[kind]
    legit = features[~is_fraud]
    if kind == "gbdt":
        trees = gbdt.fit(features, is_fraud, seed)
        trees = gbdt.shifted(trees, _review_shift(gbdt.raw_scores(trees, legit)))
        arrays: list[npt.NDArray[np.generic]] = list(trees)
    else:
        layers = mlp.fit(features, is_fraud, rng)
        shift = _review_shift(mlp.raw_scores(layers, legit))
        last = layers[-1]
        layers[-1] = mlp.Layer(last.weights, last.bias + shift)
        arrays = [array for layer in layers for array in layer]
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(np.ascontiguousarray(array).tobytes())
    version = f"{name}-{MODEL_RELEASE}-{digest.hexdigest()[:8]}"
    metadata = {
        "model_version": version,
        "feature_names": ",".join(FEATURE_NAMES),
        "seed": str(seed),
        "training_rows": str(len(train)),
    }
    if kind == "gbdt":
        return gbdt.export_onnx(trees, NUM_FEATURES, name, metadata), version
    return mlp.export_onnx(layers, NUM_FEATURES, name, metadata), version


def _review_shift(legit_logits: npt.NDArray[np.float64]) -> float:
    """The log-odds shift that puts TARGET_REVIEW_RATE of these logits at the review threshold."""
    cut = float(np.quantile(legit_logits, 1.0 - TARGET_REVIEW_RATE))
    return math.log(REVIEW_THRESHOLD / (1.0 - REVIEW_THRESHOLD)) - cut


def package_path(name: str) -> Path:
    """Where the package of a model of that name ships."""
    return _MODELS_DIR / name


def manifest(result: TrainingResult) -> Manifest:
    """The shipped package's manifest (its hash is set when it is written)."""
    shipped = result.candidates[result.winner]
    return Manifest(
        format=MANIFEST_FORMAT,
        model=ModelInfo(result.model_name, result.model_version),
        features=list(FEATURE_NAMES),
        output=ModelOutput(
            meaning="fraud score in [0, 1], ranking transactions: a probability shifted on the "
            f"log-odds so that {TARGET_REVIEW_RATE:.1%} of the training week's legitimate "
            "transactions reach the review threshold; not calibrated",
            calibration="none",
        ),
        thresholds=ThresholdChoice(
            REVIEW_THRESHOLD,
            DECLINE_THRESHOLD,
            chosen_by=f"fixed defaults; the score is shifted so that {TARGET_REVIEW_RATE:.1%} "
            "of the training week's legitimate transactions reach review (MODEL_CARD.md)",
        ),
        training=Training(
            data=f"simulated stream: seed {result.seed}, {result.days} days, {result.rows} "
            f"transactions ({result.fraud_rows} fraud), {result.labels} labels",
            window=f"days {result.train_start_day}-{result.train_start_day + TRAIN_DAYS - 1} "
            f"({result.train_rows} rows), the latest of {len(shipped.folds)} folds",
            metrics={
                f"test_{field}_mean_over_folds": round(shipped.mean(field)[0], 4)
                for field in ("roc_auc", "average_precision", "card_precision")
            },
        ),
        onnx_sha256="",
        reference=result.reference,
    )


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training",
        description="Train the fraud model on the simulated stream; write the ONNX model and card.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--seed", type=int, default=DEFAULT_SEED, help="simulator and training seed"
    )
    parser.add_argument(
        "--days", type=int, default=DEFAULT_DAYS, help="simulated days (warm-up + the folds)"
    )
    parser.add_argument("--folds", type=int, default=FOLDS, help="prequential test folds")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the model package directory to write (default: the shipped package)",
    )
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    if args.folds < 1:
        parser.error(f"--folds must be >= 1, got {args.folds}")
    try:
        fold_starts(args.days, args.folds)
    except ValueError as exc:
        parser.error(f"--days {args.days}: {exc}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m training` (and `python -m training.train`)."""
    from training.card import metrics_table, render_model_card

    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    result = train_model(args.seed, args.days, args.folds)
    out = args.out or package_path(result.model_name)
    write_model_package(out, result.model, manifest(result), render_model_card(result, args.folds))
    logger.info("wrote package=%s model_bytes=%d", out, len(result.model))
    print(metrics_table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
