"""The shipped model package of a training run: where it goes, and the manifest that states how
its model was trained, chosen, calibrated and given its thresholds.

The manifest is written from the run's results alone, beside the model card
(training/card.py), by the command that writes the package (training/simulator_run.py).
"""

from __future__ import annotations

from pathlib import Path

from scorer.features import FEATURE_NAMES
from scorer.model_package import FORMAT as MANIFEST_FORMAT
from scorer.model_package import (
    Manifest,
    ModelInfo,
    ModelOutput,
    ThresholdChoice,
    Training,
)
from training.fold_data import COLD_START_DAYS
from training.protocol import TRAIN_DAYS, Metrics, validation_days
from training.results import TrainingResult, mean_std
from training.thresholds import FALSE_DECLINE_COST, REVIEW_LEGIT_SHARE

_MODELS_DIR = Path(__file__).resolve().parent.parent / "scorer" / "models"


def package_path(name: str) -> Path:
    """Where the package of a model of that name ships."""
    return _MODELS_DIR / name


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
