"""Train the shipped fraud model on simulated traffic and export it to ONNX with its model card.

    python -m training.train [--seed 7] [--samples 300000] [--out PATH] [--card PATH]

The model is a small multi-layer perceptron over `build_features` output, trained in plain numpy
and exported with the input standardisation folded into its first layer, so the service feeds it
raw features. The same seed and sample count give a byte-identical model file and model card on
the same platform.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from scorer.decisions import DEFAULT_DECLINE_THRESHOLD, DEFAULT_REVIEW_THRESHOLD
from scorer.features import FEATURE_NAMES, NUM_FEATURES, TINY_AMOUNT, build_features
from simulator.transactions import FRAUD_SCENARIO_SHARES, SCENARIOS, TransactionSimulator

logger = logging.getLogger(__name__)

MODEL_NAME = "fraud-mlp"
MODEL_RELEASE = "1.0.0"
DEFAULT_SEED = 7
DEFAULT_SAMPLES = 300_000
_MODELS_DIR = Path(__file__).resolve().parent.parent / "scorer" / "models"
DEFAULT_MODEL_PATH = _MODELS_DIR / f"{MODEL_NAME}.onnx"
DEFAULT_CARD_PATH = _MODELS_DIR / "MODEL_CARD.md"
#: Fewer samples leave too few frauds per scenario for the held-out metrics to mean anything.
MIN_SAMPLES = 5_000

#: The service's default decision thresholds: score ≥ review → "review", ≥ decline → "decline".
REVIEW_THRESHOLD = DEFAULT_REVIEW_THRESHOLD
DECLINE_THRESHOLD = DEFAULT_DECLINE_THRESHOLD

#: The training sample is spread over a simulated week, so every hour of the day is seen.
TRAINING_SPAN_S = 7 * 24 * 3600
TRAINING_FRAUD_RATE = 0.02
HELD_OUT_SHARE = 0.2

HIDDEN_SIZES: tuple[int, ...] = (32, 16)
EPOCHS = 20
BATCH_SIZE = 512
LEARNING_RATE = 2e-3
ADAM_BETA1, ADAM_BETA2, ADAM_EPSILON = 0.9, 0.999, 1e-8
#: Loss weight of a fraud relative to a legitimate transaction. Full balancing (≈ 49 at a 2 %
#: fraud rate) pushes most legitimate scores above 0.5 and floods the review queue; this weight
#: keeps legitimate traffic mostly below the review threshold while still lifting fraud scores.
FRAUD_WEIGHT = 3.0
#: Binary features have zero spread in a sample that lacks them; dividing by ~0 would blow up
#: the folded weights, so such features are left unscaled.
_MIN_FEATURE_STD = 1e-3
#: Separates the trainer's random stream from the simulator's for the same seed.
_TRAINER_STREAM = 1

OPSET = 17
#: ONNX 1.12 released opset 17 with IR version 8; the onnxruntime versions we support load it.
IR_VERSION = 8
INPUT_NAME = "features"
OUTPUT_NAME = "score"

FEATURE_DESCRIPTIONS: dict[str, str] = {
    "log_amount": "log(1 + amount), amount in the card's billing currency",
    "tiny_amount": f"1 if the amount is below {TINY_AMOUNT} (card-testing probes)",
    "round_amount": "1 if the amount is a multiple of 10",
    "channel_pos": "1 for a point-of-sale transaction",
    "channel_ecom": "1 for an e-commerce transaction",
    "channel_atm": "1 for an ATM withdrawal",
    "card_present": "1 if the card was physically present",
    "hour_sin": "sine of the UTC hour of day (cyclic encoding)",
    "hour_cos": "cosine of the UTC hour of day (cyclic encoding)",
    "night": "1 between 00:00 and 05:00 UTC",
    "mcc_everyday": "1 for everyday merchants (groceries, fuel, restaurants, pharmacies)",
    "mcc_travel": "1 for travel merchants (airlines, hotels, car rental, transport)",
    "mcc_digital": "1 for digital goods and online services (media, games, apps, teleselling)",
    "mcc_high_value": "1 for high-value goods (electronics, jewellery, computers)",
    "mcc_cash": "1 for cash and quasi-cash (ATM, wire transfer, gambling)",
    "cross_border": "1 if the merchant country's currency differs from the card's currency",
    "high_risk_country": "1 if the merchant country is on the high-risk list",
}

_Floats = npt.NDArray[np.float64]


class Layer(NamedTuple):
    """One fully connected layer: outputs = inputs @ weights + bias."""

    weights: _Floats  # [inputs, outputs]
    bias: _Floats  # [outputs]


class Evaluation(NamedTuple):
    """Metrics of a model on a labelled sample."""

    roc_auc: float
    average_precision: float
    rows: int
    fraud_rows: int
    #: Rows of each scenario in the sample.
    scenario_rows: dict[str, int]
    #: Share of each fraud scenario's rows scoring ≥ REVIEW_THRESHOLD and ≥ DECLINE_THRESHOLD.
    recall: dict[str, tuple[float, float]]
    #: The same shares for all fraud together.
    overall_recall: tuple[float, float]
    #: Share of legitimate rows scoring ≥ REVIEW_THRESHOLD and ≥ DECLINE_THRESHOLD.
    false_positive_rate: tuple[float, float]


class TrainingResult(NamedTuple):
    """A trained, exported model and how it was made and how it scored."""

    model: bytes  # the serialized ONNX model
    model_version: str
    seed: int
    samples: int
    train_rows: int
    fraud_rate: float  # share of fraud in the whole simulated sample
    evaluation: Evaluation


# Metrics.


def roc_auc(is_fraud: npt.NDArray[np.bool_], scores: npt.NDArray[np.floating]) -> float:
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


def average_precision(is_fraud: npt.NDArray[np.bool_], scores: npt.NDArray[np.floating]) -> float:
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


def evaluate(scores: npt.NDArray[np.floating], scenario: npt.NDArray[np.str_]) -> Evaluation:
    """Score quality overall, per fraud scenario and on legit traffic at the default thresholds."""
    is_fraud = scenario != SCENARIOS[0]
    thresholds = (REVIEW_THRESHOLD, DECLINE_THRESHOLD)

    def share_flagged(rows: npt.NDArray[np.bool_]) -> tuple[float, float]:
        count = int(rows.sum())
        if count == 0:
            return (math.nan, math.nan)
        review, decline = (float((scores[rows] >= t).sum()) / count for t in thresholds)
        return (review, decline)

    return Evaluation(
        roc_auc=roc_auc(is_fraud, scores),
        average_precision=average_precision(is_fraud, scores),
        rows=len(scores),
        fraud_rows=int(is_fraud.sum()),
        scenario_rows={name: int((scenario == name).sum()) for name in SCENARIOS},
        recall={name: share_flagged(scenario == name) for name in SCENARIOS[1:]},
        overall_recall=share_flagged(is_fraud),
        false_positive_rate=share_flagged(~is_fraud),
    )


# Training.


def _sigmoid(x: _Floats) -> _Floats:
    # Written through tanh, which cannot overflow for large |x| as exp(-x) can.
    result: _Floats = 0.5 * (1.0 + np.tanh(0.5 * x))
    return result


def _initial_layers(rng: np.random.Generator) -> list[Layer]:
    sizes = (NUM_FEATURES, *HIDDEN_SIZES, 1)
    return [
        # He initialisation suits ReLU layers.
        Layer(rng.normal(0.0, math.sqrt(2.0 / fan_in), (fan_in, fan_out)), np.zeros(fan_out))
        for fan_in, fan_out in itertools.pairwise(sizes)
    ]


def _fit(
    features: _Floats, is_fraud: npt.NDArray[np.bool_], rng: np.random.Generator
) -> list[Layer]:
    """Mini-batch Adam on fraud-weighted binary cross-entropy over standardised features."""
    layers = _initial_layers(rng)
    params = [array for layer in layers for array in layer]
    first_moment = [np.zeros_like(p) for p in params]
    second_moment = [np.zeros_like(p) for p in params]
    target = is_fraud.astype(np.float64)
    weight = np.where(is_fraud, FRAUD_WEIGHT, 1.0)
    step = 0
    for epoch in range(EPOCHS):
        order = rng.permutation(len(features))
        loss_sum = weight_sum = 0.0
        for start in range(0, len(order), BATCH_SIZE):
            rows = order[start : start + BATCH_SIZE]
            x, y, w = features[rows], target[rows], weight[rows]
            activations = [x]
            for layer in layers[:-1]:
                activations.append(np.maximum(activations[-1] @ layer.weights + layer.bias, 0.0))
            logit = (activations[-1] @ layers[-1].weights + layers[-1].bias)[:, 0]
            probability = _sigmoid(logit)
            # Cross-entropy from logits: log(1 + e^z) - y z, stable for any z.
            loss = np.logaddexp(0.0, logit) - y * logit
            loss_sum += float((w * loss).sum())
            weight_sum += float(w.sum())
            upstream = ((probability - y) * w / w.sum())[:, None]
            grads: list[_Floats] = []
            for index in range(len(layers) - 1, -1, -1):
                grads[:0] = [activations[index].T @ upstream, upstream.sum(axis=0)]
                if index:
                    upstream = (upstream @ layers[index].weights.T) * (activations[index] > 0.0)
            step += 1
            correction1 = 1.0 - ADAM_BETA1**step
            correction2 = 1.0 - ADAM_BETA2**step
            for param, grad, m, v in zip(params, grads, first_moment, second_moment, strict=True):
                m *= ADAM_BETA1
                m += (1.0 - ADAM_BETA1) * grad
                v *= ADAM_BETA2
                v += (1.0 - ADAM_BETA2) * grad * grad
                param -= (
                    LEARNING_RATE * (m / correction1) / (np.sqrt(v / correction2) + ADAM_EPSILON)
                )
        logger.info("epoch=%d weighted_loss=%.5f", epoch + 1, loss_sum / weight_sum)
    return layers


def _fold_standardisation(layers: list[Layer], mean: _Floats, std: _Floats) -> list[Layer]:
    """The same network taking raw features: (x - mean) / std folded into the first layer."""
    first = layers[0]
    weights = first.weights / std[:, None]
    bias = first.bias - mean @ weights
    return [Layer(weights, bias), *layers[1:]]


# Export.


def _model_version(layers: Sequence[Layer]) -> str:
    digest = hashlib.sha256()
    for layer in layers:
        for array in layer:
            digest.update(np.ascontiguousarray(array, dtype="<f4").tobytes())
    return f"{MODEL_NAME}-{MODEL_RELEASE}-{digest.hexdigest()[:8]}"


def export_onnx(layers: Sequence[Layer], metadata: dict[str, str]) -> bytes:
    """Serialize the network as an ONNX model: "features" float32 [batch, F] → "score" [batch]."""
    initializers: list[TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    current = INPUT_NAME
    for index, layer in enumerate(layers):
        weights, bias = f"layer{index}.weights", f"layer{index}.bias"
        initializers.append(numpy_helper.from_array(layer.weights.astype(np.float32), weights))
        initializers.append(numpy_helper.from_array(layer.bias.astype(np.float32), bias))
        linear = f"layer{index}.linear"
        nodes.append(helper.make_node("Gemm", [current, weights, bias], [linear]))
        if index < len(layers) - 1:
            current = f"layer{index}.relu"
            nodes.append(helper.make_node("Relu", [linear], [current]))
        else:
            current = linear
    initializers.append(numpy_helper.from_array(np.array([-1], np.int64), "score_shape"))
    nodes.append(helper.make_node("Sigmoid", [current], ["probability"]))
    nodes.append(helper.make_node("Reshape", ["probability", "score_shape"], [OUTPUT_NAME]))
    graph = helper.make_graph(
        nodes,
        MODEL_NAME,
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", NUM_FEATURES])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch"])],
        initializer=initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="training.train",
        producer_version=MODEL_RELEASE,
        doc_string="Fraud probability of a card transaction from its build_features row.",
    )
    model.ir_version = IR_VERSION
    helper.set_model_props(model, metadata)
    onnx.checker.check_model(model, full_check=True)
    serialized: bytes = model.SerializeToString()
    return serialized


def score_with_onnxruntime(
    model: bytes, features: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    """Scores of a serialized model for a feature matrix, on ONNX Runtime's CPU provider."""
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    scores: npt.NDArray[np.float32] = session.run([OUTPUT_NAME], {INPUT_NAME: features})[0]
    return scores


def train_model(seed: int = DEFAULT_SEED, samples: int = DEFAULT_SAMPLES) -> TrainingResult:
    """Simulate `samples` transactions, train on them less a held-out HELD_OUT_SHARE, evaluate.

    Writes no files. Raises ValueError for a negative seed or fewer than MIN_SAMPLES samples.
    """
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if samples < MIN_SAMPLES:
        raise ValueError(f"samples must be >= {MIN_SAMPLES}, got {samples}")
    started = time.perf_counter()
    simulator = TransactionSimulator(seed, fraud_rate=TRAINING_FRAUD_RATE)
    batch = simulator.generate(samples, rate_per_s=samples / TRAINING_SPAN_S)
    features = build_features(batch.columns)
    logger.info(
        "simulated rows=%d fraud=%d elapsed_s=%.1f",
        samples,
        int(batch.is_fraud.sum()),
        time.perf_counter() - started,
    )

    rng = np.random.default_rng((seed, _TRAINER_STREAM))
    order = rng.permutation(samples)
    held_out_rows = round(samples * HELD_OUT_SHARE)
    held_out, train = order[:held_out_rows], order[held_out_rows:]
    train_features = features[train].astype(np.float64)
    mean = train_features.mean(axis=0)
    std = train_features.std(axis=0)
    std = np.where(std < _MIN_FEATURE_STD, 1.0, std)
    layers = _fit((train_features - mean) / std, batch.is_fraud[train], rng)
    layers = _fold_standardisation(layers, mean, std)
    logger.info("trained rows=%d elapsed_s=%.1f", len(train), time.perf_counter() - started)

    model_version = _model_version(layers)
    model = export_onnx(
        layers,
        {
            "model_version": model_version,
            "feature_names": ",".join(FEATURE_NAMES),
            "seed": str(seed),
            "training_samples": str(samples),
        },
    )
    evaluation = evaluate(
        score_with_onnxruntime(model, features[held_out]), batch.scenario[held_out]
    )
    logger.info(
        "evaluated model_version=%s roc_auc=%.4f average_precision=%.4f elapsed_s=%.1f",
        model_version,
        evaluation.roc_auc,
        evaluation.average_precision,
        time.perf_counter() - started,
    )
    return TrainingResult(
        model=model,
        model_version=model_version,
        seed=seed,
        samples=samples,
        train_rows=len(train),
        fraud_rate=float(batch.is_fraud.mean()),
        evaluation=evaluation,
    )


# Model card.


def _percent(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100.0 * value:.1f} %"


def metrics_table(evaluation: Evaluation) -> str:
    """Recall per fraud scenario and legit false-positive rate at both thresholds (Markdown)."""
    header = (
        f"| held-out rows | count | score ≥ {REVIEW_THRESHOLD} (review) "
        f"| score ≥ {DECLINE_THRESHOLD} (decline) |"
    )
    rows = [
        (f"recall: {name}", evaluation.scenario_rows[name], evaluation.recall[name])
        for name in SCENARIOS[1:]
    ]
    rows.append(("recall: all fraud", evaluation.fraud_rows, evaluation.overall_recall))
    rows.append(
        (
            f"false-positive rate: {SCENARIOS[0]}",
            evaluation.scenario_rows[SCENARIOS[0]],
            evaluation.false_positive_rate,
        )
    )
    lines = [header, "| --- | ---: | ---: | ---: |"]
    lines.extend(
        f"| {label} | {count} | {_percent(review)} | {_percent(decline)} |"
        for label, count, (review, decline) in rows
    )
    return "\n".join(lines)


def _retrain_command(seed: int, samples: int) -> str:
    return f"python -m training.train --seed {seed} --samples {samples}"


def render_model_card(result: TrainingResult) -> str:
    """The model card (Markdown) of a trained model."""
    evaluation = result.evaluation
    features = "\n".join(
        f"| {index} | `{name}` | {FEATURE_DESCRIPTIONS[name]} |"
        for index, name in enumerate(FEATURE_NAMES)
    )
    scenario_shares = ", ".join(
        f"`{name}` {share:.0%}" for name, share in FRAUD_SCENARIO_SHARES.items()
    )
    hidden = " → ".join(f"{size} (ReLU)" for size in HIDDEN_SIZES)
    return f"""# Model card: {MODEL_NAME}

| | |
| --- | --- |
| model_version | `{result.model_version}` |
| file | `scorer/models/{MODEL_NAME}.onnx` (ONNX, opset {OPSET}, IR version {IR_VERSION}) |
| input | `{INPUT_NAME}`: float32 `[batch, {NUM_FEATURES}]`, raw `build_features` output |
| output | `{OUTPUT_NAME}`: float32 `[batch]`, fraud probability in [0, 1] |

## What it is

A small multi-layer perceptron that scores one card transaction at a time from the transaction's
own fields. It is the model the `fraud-scorer` service ships with and the model the load tests
and benchmarks run; it was trained only on simulated traffic.

## Intended use

Scoring micro-batches of transactions in the `fraud-scorer` service, where the score maps to a
decision with the default thresholds (they are configuration): `approve` below
{REVIEW_THRESHOLD}, `review` from {REVIEW_THRESHOLD}, `decline` from {DECLINE_THRESHOLD}.
It demonstrates and exercises the serving path; it is not a model for real payments, which
needs training on real labelled traffic, history features and calibration to the issuer's
review capacity.

## Features

The model reads the {NUM_FEATURES} columns of `scorer.features.build_features`, in this order
(the `feature_names` metadata of the model file lists them too):

| # | name | meaning |
| --- | --- | --- |
{features}

## Training data

- Source: `simulator.transactions.TransactionSimulator`, seed {result.seed}, configured fraud rate
  {TRAINING_FRAUD_RATE:.0%}: {result.samples} transactions spread over one simulated week,
  {result.fraud_rate:.2%} of them fraud.
- Fraud scenarios and their shares of the fraud:
  {scenario_shares}.
- Legitimate traffic overlaps the fraud on purpose: travel abroad, foreign web shops,
  big-ticket purchases, small app purchases, night-time spending.
- Split: seeded random, by row, {1 - HELD_OUT_SHARE:.0%} / {HELD_OUT_SHARE:.0%}:
  {result.train_rows} training rows, {evaluation.rows} held-out rows.

## Architecture and training

- {NUM_FEATURES} inputs → {hidden} → 1 (sigmoid). The input standardisation (mean and standard
  deviation of the training split) is folded into the first layer.
- ONNX graph: `Gemm`, `Relu`, `Sigmoid`, `Reshape` only, all with CUDA and CPU kernels in ONNX
  Runtime.
- Plain numpy: Adam (learning rate {LEARNING_RATE}), {EPOCHS} epochs, mini-batches of
  {BATCH_SIZE}, binary cross-entropy with fraud rows weighted {FRAUD_WEIGHT:g} times. The
  weight is chosen so that the default thresholds fit: legitimate traffic scores mostly below
  {REVIEW_THRESHOLD}.
- Deterministic: the same seed and sample count give a byte-identical model file.

## Metrics on the held-out split

- ROC-AUC: {evaluation.roc_auc:.4f}
- Average precision: {evaluation.average_precision:.4f}
  (fraud is {evaluation.fraud_rows / evaluation.rows:.2%} of the held-out rows)

{metrics_table(evaluation)}

## Limitations

- Transaction-alone features: the model sees one transaction and nothing of the card's or the
  terminal's history. Compromised terminals (ordinary-looking transactions at a terminal that
  skims cards) and card-testing bursts are properly caught only with history features
  (per-terminal fraud rates, per-card velocity); those are a later issue.
- Simulated data only: the scenario mix, the amounts and the overlap with legitimate traffic are
  the simulator's assumptions, so the metrics above say how well the model learned the
  simulator, not how it would do on real payments.
- Amounts are not converted between currencies, and the hour of day is UTC, not the merchant's
  local time.
- With fraud weighted {FRAUD_WEIGHT:g} times in training, the score overstates the true fraud
  probability; read it as a ranking with thresholds tuned to it.

## How to retrain

From the repository root, with the `train` extra installed:

```
{_retrain_command(result.seed, result.samples)}
```

It rewrites `scorer/models/{MODEL_NAME}.onnx` and this card; the same arguments reproduce both
byte for byte on the same platform.
"""


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training.train",
        description="Train the fraud model on simulated traffic; write the ONNX model and card.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--seed", type=int, default=DEFAULT_SEED, help="seed of the simulator and the training"
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=DEFAULT_SAMPLES,
        # argparse %-formats help strings, so the percent sign is doubled.
        help=f"simulated transactions, {HELD_OUT_SHARE:.0%}% of them held out for evaluation",
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_MODEL_PATH, help="where to write the ONNX model"
    )
    parser.add_argument(
        "--card", type=Path, default=DEFAULT_CARD_PATH, help="where to write the model card"
    )
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    if args.samples < MIN_SAMPLES:
        parser.error(f"--samples must be >= {MIN_SAMPLES}, got {args.samples}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m training.train`."""
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    result = train_model(args.seed, args.samples)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(result.model)
    args.card.parent.mkdir(parents=True, exist_ok=True)
    args.card.write_text(render_model_card(result), encoding="utf-8")
    logger.info("wrote model=%s bytes=%d card=%s", args.out, len(result.model), args.card)
    print(metrics_table(result.evaluation))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
