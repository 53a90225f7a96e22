"""`fraud-train from-topics`: a challenger trained from what the service decided and what was
later confirmed, read back from Kafka; it promotes nothing.

1. **Read** the decisions topic (JSON) from its start to its end as it is when the run starts,
   keeping the decisions made by the cut-off `--until` that carry the feature row they were
   scored with (`FRAUD_DECISION_FEATURES=on`): training sees exactly what serving saw, fresh-label
   and terminal features included, as of each decision. A transaction decided twice (a
   redelivery) counts once, its first decision (training/logged_decisions.py).
2. **Join** the labels topic, counting only labels reported by the cut-off, as the handbook's
   delay does: a fraud reported after `--until` is not known yet, so its transaction trains as
   legitimate. Where a transaction has several labels, the last one reported by then counts.
   With `--audit-share`, the approved decisions of the audit sample say how many frauds the
   served model approved, and their frauds weigh `--audit-weight` (training/audit.py).
3. **Split** by event time, oldest first: training rows, then `--validation-share` of the rows
   (the GBDT's Platt calibration and both thresholds are fitted there, by the shipped model's
   goals: docs/models.md), then the most recent `--evaluation-share`, on which the challenger
   and the served model (its scores, as decided) are compared. `--delay` leaves the last stretch
   of event time before the cut-off out of every split, where most frauds are not reported yet.
4. **Train** with the shipped model's recipe (training/gbdt.py: LightGBM compiled to tensor
   operations, Platt-calibrated), and write the package with a model card (`--out`).

Memory is bounded by the rows kept: 43 float32 features and a few columns per decision
(about 250 bytes), with the transaction ids of the decisions and labels (docs/models.md has the
measured time and peak RSS on 1,000,000 decisions).
"""

from __future__ import annotations

import argparse
import logging
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt

from contracts.terminal_risk import MS_PER_DAY
from plumbing.errors import ConfigurationError
from scorer.drift import drift_reference, most_influential
from scorer.features import FEATURE_NAMES, NUM_FEATURES
from scorer.flag_rate import expected_flag_rate
from scorer.model_package import (
    FORMAT,
    Manifest,
    ModelInfo,
    ModelOutput,
    ThresholdChoice,
    Training,
    write_model_package,
)
from training import gbdt
from training.audit import Audit, audit_line, audit_weights
from training.calibration import Platt, fit_platt
from training.candidates import parameters_digest
from training.logged_decisions import Decisions, read_decisions, read_labels
from training.options import parse_args
from training.protocol import average_precision, roc_auc
from training.thresholds import (
    FALSE_DECLINE_COST,
    REVIEW_LEGIT_SHARE,
    decline_threshold,
    review_threshold,
)

log = logging.getLogger(__name__)

PROG = "fraud-train from-topics"
#: Fewest labelled frauds the training rows must hold to fit anything worth comparing.
MIN_TRAINING_FRAUDS = 20
#: The false-positive rate recall is compared at (the share of legitimate rows flagged).
COMPARE_AT_FPR = 0.01
#: Rows scored at once in numpy (a [rows, splits] matrix of about 4,500 splits).
SCORE_CHUNK = 20_000
_LOG_AMOUNT = FEATURE_NAMES.index("log_amount")


class Comparison(NamedTuple):
    """The challenger against the served model on the evaluation rows."""

    rows: int
    frauds: int
    challenger: dict[str, float]
    served: dict[str, float]
    served_versions: list[str]


class Retrained(NamedTuple):
    path: Path
    version: str
    comparison: Comparison
    audit: Audit
    training_rows: int
    training_frauds: int
    seconds: float
    peak_rss_mb: float


class Split(NamedTuple):
    train: npt.NDArray[np.intp]
    validation: npt.NDArray[np.intp]
    evaluation: npt.NDArray[np.intp]


def split_by_time(
    event_time: npt.NDArray[np.int64],
    until_ms: int,
    validation_share: float,
    evaluation_share: float,
    delay_ms: int = 0,
) -> Split:
    """Rows by event time, oldest first: training, validation, evaluation (the most recent);
    rows within `delay_ms` before the cut-off are in none."""
    kept = np.flatnonzero(event_time <= until_ms - delay_ms)
    ordered = kept[np.argsort(event_time[kept], kind="stable")]
    n = len(ordered)
    evaluation = round(n * evaluation_share)
    validation = round(n * validation_share)
    first_validation = n - evaluation - validation
    return Split(
        ordered[:first_validation],
        ordered[first_validation : n - evaluation],
        ordered[n - evaluation :],
    )


def fpr_cut(is_fraud: npt.NDArray[np.bool_], scores: npt.NDArray[np.floating], fpr: float) -> float:
    """The score above which `fpr` of the legitimate rows lie (NaN without any)."""
    legit = np.sort(scores[~is_fraud])
    if not len(legit):
        return float("nan")
    return float(legit[min(len(legit) - 1, int(np.ceil(len(legit) * (1.0 - fpr))))])


def recall_at_fpr(
    is_fraud: npt.NDArray[np.bool_], scores: npt.NDArray[np.floating], fpr: float
) -> float:
    """The share of frauds scored above the score that flags `fpr` of the legitimate rows."""
    if not is_fraud.any() or is_fraud.all():
        return float("nan")
    return float((scores[is_fraud] > fpr_cut(is_fraud, scores, fpr)).mean())


def figures(is_fraud: npt.NDArray[np.bool_], scores: npt.NDArray[np.floating]) -> dict[str, float]:
    """ROC-AUC, average precision and recall at COMPARE_AT_FPR."""
    return {
        "auc": round(float(roc_auc(is_fraud, scores)), 4),
        "average_precision": round(float(average_precision(is_fraud, scores)), 4),
        f"recall_at_{COMPARE_AT_FPR:.0%}_fpr".replace("%", "pct"): round(
            recall_at_fpr(is_fraud, scores, COMPARE_AT_FPR), 4
        ),
    }


def retrain(args: argparse.Namespace) -> Retrained:
    """The whole run: read, join, split, train, compare, write."""
    began = time.perf_counter()
    decisions = read_decisions(args.bootstrap_servers, args.decisions_topic, args.until)
    log.info(
        "read %d decisions with features; skipped %s",
        len(decisions.transaction_ids),
        decisions.skipped,
    )
    if not decisions.transaction_ids:
        raise ConfigurationError(
            f"no decision on {args.decisions_topic!r} made by {args.until} carries its features: "
            "run the service with FRAUD_DECISION_FEATURES=on and let it decide first "
            f"(skipped: {decisions.skipped})"
        )
    labels = read_labels(args.bootstrap_servers, args.labels_topic, args.until)
    is_fraud = np.fromiter(
        (labels.get(t, False) for t in decisions.transaction_ids),
        np.bool_,
        len(decisions.transaction_ids),
    )
    log.info(
        "joined %d labels reported by %d: %d frauds", len(labels), args.until, int(is_fraud.sum())
    )
    split = split_by_time(
        decisions.event_time, args.until, args.validation_share, args.evaluation_share, args.delay
    )
    train_frauds = int(is_fraud[split.train].sum())
    if train_frauds < MIN_TRAINING_FRAUDS or not is_fraud[split.validation].any():
        raise ConfigurationError(
            f"the training rows hold {train_frauds} frauds reported by the cut-off (at least "
            f"{MIN_TRAINING_FRAUDS} are needed) and the validation rows "
            f"{int(is_fraud[split.validation].sum())}: wait for more labels, or move --until"
        )
    weight, audit = audit_weights(decisions, is_fraud, args.audit_share, args.audit_weight)
    x = decisions.features
    trees = gbdt.fit(x[split.train], is_fraud[split.train], args.seed, weight[split.train])
    platt = fit_platt(_raw_scores(trees, x[split.validation]), is_fraud[split.validation])
    validation_scores = _calibrated_scores(trees, platt, x[split.validation])
    validation_fraud = is_fraud[split.validation]
    review = review_threshold(validation_scores[~validation_fraud])
    amount = np.expm1(x[split.validation, _LOG_AMOUNT].astype(np.float64))
    decline = decline_threshold(validation_scores, validation_fraud, amount, floor=review)
    model = gbdt.calibrated(trees, platt.a, platt.b)
    evaluation_fraud = is_fraud[split.evaluation]
    if evaluation_fraud.all() or not evaluation_fraud.any():
        raise ConfigurationError(
            f"the {len(split.evaluation)} evaluation rows hold {int(evaluation_fraud.sum())} "
            "frauds reported by the cut-off: the models cannot be compared there; raise "
            "--evaluation-share or move --until"
        )
    comparison = Comparison(
        rows=len(split.evaluation),
        frauds=int(evaluation_fraud.sum()),
        challenger=figures(evaluation_fraud, _calibrated_scores(trees, platt, x[split.evaluation])),
        served=figures(evaluation_fraud, decisions.score[split.evaluation]),
        served_versions=sorted({decisions.model_version[i] for i in split.evaluation}),
    )
    version = args.version or _version(model)
    onnx = gbdt.export_onnx(
        model,
        NUM_FEATURES,
        args.name,
        {
            "model_version": version,
            "feature_names": ",".join(FEATURE_NAMES),
            "seed": str(args.seed),
        },
    )
    legit_train = x[split.train][~is_fraud[split.train]]
    validation_rows = x[split.validation]
    drift = drift_reference(
        f"the validation rows ({len(split.validation)} decisions), calibrated scores",
        validation_scores,
        validation_rows,
        FEATURE_NAMES,
        most_influential(
            lambda rows: _calibrated_scores(trees, platt, rows), validation_rows, FEATURE_NAMES
        ),
    )
    manifest = _manifest(args, version, decisions, split, is_fraud, (review, decline), comparison)
    flag_rate = expected_flag_rate(
        validation_scores, decisions.event_time[split.validation] // MS_PER_DAY, review
    )
    manifest = msgspec.structs.replace(
        manifest,
        thresholds=msgspec.structs.replace(manifest.thresholds, expected_flag_rate=flag_rate),
        reference=[float(v) for v in np.median(legit_train, axis=0)],
        drift=drift,
    )
    card = _card(args, version, comparison, split, is_fraud, audit)
    write_model_package(args.out, onnx, manifest, card)
    return Retrained(
        args.out,
        version,
        comparison,
        audit,
        len(split.train),
        train_frauds,
        time.perf_counter() - began,
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    )


def _calibrated_scores(
    trees: gbdt.Trees, platt: Platt, features: npt.NDArray[np.float32]
) -> npt.NDArray[np.float64]:
    return platt.apply(_raw_scores(trees, features))


def _raw_scores(trees: gbdt.Trees, features: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """`gbdt.raw_scores` a chunk of rows at a time: its walk holds a [rows, splits] matrix."""
    return np.concatenate(
        [
            gbdt.raw_scores(trees, features[i : i + SCORE_CHUNK])
            for i in range(0, len(features), SCORE_CHUNK)
        ]
        or [np.zeros(0)]
    )


def _version(model: gbdt.Trees) -> str:
    return f"fraud-gbdt-retrained-{parameters_digest(list(model))}"


def _manifest(
    args: argparse.Namespace,
    version: str,
    decisions: Decisions,
    split: Split,
    is_fraud: npt.NDArray[np.bool_],
    thresholds: tuple[float, float],
    comparison: Comparison,
) -> Manifest:
    first, last = (
        int(decisions.event_time[split.train].min()),
        int(decisions.event_time[split.train].max()),
    )
    metrics = {f"evaluation_{k}": v for k, v in comparison.challenger.items()}
    metrics |= {f"evaluation_served_{k}": v for k, v in comparison.served.items()}
    return Manifest(
        format=FORMAT,
        model=ModelInfo(args.name, version),
        features=list(FEATURE_NAMES),
        output=ModelOutput(
            meaning="probability of fraud, calibrated by Platt scaling on the validation rows "
            f"({len(split.validation)} decisions before the evaluation rows)",
            calibration="platt",
        ),
        thresholds=ThresholdChoice(
            thresholds[0],
            thresholds[1],
            chosen_by=f"on the validation rows: review, the lowest score at which at most "
            f"{REVIEW_LEGIT_SHARE:.0%} of legitimate transactions reach review; decline, the "
            f"score at or above review with the lowest cost when a declined legitimate "
            f"transaction costs {FALSE_DECLINE_COST:g} and a fraud not declined its amount",
        ),
        training=Training(
            data=f"decisions on {args.decisions_topic!r} made by {args.until} (epoch ms) with "
            f"their logged features, {len(decisions.transaction_ids)} kept, joined to labels on "
            f"{args.labels_topic!r} reported by then ({int(is_fraud.sum())} frauds)",
            window=f"event times {first}-{last} ({len(split.train)} rows, "
            f"{int(is_fraud[split.train].sum())} frauds)",
            metrics=metrics,
        ),
        onnx_sha256="",
    )


def _card(
    args: argparse.Namespace,
    version: str,
    comparison: Comparison,
    split: Split,
    is_fraud: npt.NDArray[np.bool_],
    audit: Audit,
) -> str:
    frauds = [int(is_fraud[part].sum()) for part in split]
    rows = "\n".join(
        f"| {name} | {comparison.challenger[name]:.4f} | {comparison.served[name]:.4f} |"
        for name in comparison.challenger
    )
    return f"""# {args.name} {version}

Trained by `{PROG}` from the decisions on `{args.decisions_topic}` (with their logged features)
and the labels on `{args.labels_topic}` reported by {args.until} (epoch ms), with the shipped
model's recipe (training/gbdt.py, Platt calibration). Promoted by nobody yet: compare, run it in
shadow (FRAUD_SHADOW_MODEL), then `fraud-model promote`.

| rows | decisions | frauds reported by the cut-off |
| --- | ---: | ---: |
| training | {len(split.train)} | {frauds[0]} |
| validation (calibration, thresholds) | {len(split.validation)} | {frauds[1]} |
| evaluation (most recent) | {comparison.rows} | {comparison.frauds} |

{audit_line(audit)}

## Against the served model on the evaluation rows

The served model's figures are its scores as decided ({", ".join(comparison.served_versions)}).

| figure | this model | served |
| --- | ---: | ---: |
{rows}
"""


def main(argv: Sequence[str]) -> int:
    """`fraud-train from-topics`, its options alone (the flywheel's and the bench's call)."""
    return train_from_topics(parse_args(["from-topics", *argv]))


def train_from_topics(args: argparse.Namespace) -> int:
    """`fraud-train from-topics`: retrain, write the package, print the comparison."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        result = retrain(args)
    except ConfigurationError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    comparison = result.comparison
    print(f"wrote {result.path} ({result.version})")
    print(
        f"  trained on {result.training_rows} decisions ({result.training_frauds} frauds) in "
        f"{result.seconds:.1f} s, peak RSS {result.peak_rss_mb:.0f} MB"
    )
    print(f"  {audit_line(result.audit)}")
    print(f"  evaluation rows {comparison.rows} ({comparison.frauds} frauds):")
    for name in comparison.challenger:
        print(
            f"    {name:<22} challenger {comparison.challenger[name]:.4f}   served "
            f"{comparison.served[name]:.4f}"
        )
    return 0
