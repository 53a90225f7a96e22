"""Unit tests of the training command and the shipped model (training/train.py, scorer/models/)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from scorer.features import FEATURE_NAMES, NUM_FEATURES, build_features
from simulator.transactions import TransactionSimulator
from training.train import (
    DEFAULT_CARD_PATH,
    DEFAULT_MODEL_PATH,
    FEATURE_DESCRIPTIONS,
    IR_VERSION,
    OPSET,
    TRAINING_SPAN_S,
    TrainingResult,
    average_precision,
    main,
    roc_auc,
    train_model,
)

TINY_SAMPLES = 20_000
#: Ops with CUDA kernels in ONNX Runtime that the exported graph may use.
ALLOWED_OPS = {"Gemm", "MatMul", "Add", "Relu", "Sigmoid", "Sub", "Div", "Reshape", "Flatten"}


@pytest.fixture(scope="module")
def tiny() -> TrainingResult:
    return train_model(seed=3, samples=TINY_SAMPLES)


def fresh_sample(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Features and fraud labels of a newly simulated week of traffic."""
    batch = TransactionSimulator(seed).generate(n, rate_per_s=n / TRAINING_SPAN_S)
    return build_features(batch.columns), batch.is_fraud


def cpu_session(model: bytes | Path) -> ort.InferenceSession:
    source = str(model) if isinstance(model, Path) else model
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"])


def test_tiny_model_loads_on_cpu_and_scores_fraud_higher(tiny: TrainingResult) -> None:
    session = cpu_session(tiny.model)
    [features_input] = session.get_inputs()
    [score_output] = session.get_outputs()
    assert (features_input.name, features_input.type) == ("features", "tensor(float)")
    assert features_input.shape[1] == NUM_FEATURES
    assert (score_output.name, score_output.type) == ("score", "tensor(float)")

    features, is_fraud = fresh_sample(seed=101, n=20_000)
    [scores] = session.run(["score"], {"features": features})
    assert scores.shape == (len(features),)
    assert scores.dtype == np.float32
    assert np.all((scores >= 0.0) & (scores <= 1.0))
    assert scores.std() > 0.01
    assert scores[is_fraud].mean() > scores[~is_fraud].mean() + 0.2


def test_tiny_model_graph_and_metadata(tiny: TrainingResult) -> None:
    model = onnx.load_from_string(tiny.model)
    onnx.checker.check_model(model)
    assert model.ir_version == IR_VERSION
    assert [(o.domain, o.version) for o in model.opset_import] == [("", OPSET)]
    assert {node.op_type for node in model.graph.node} <= ALLOWED_OPS
    metadata = {prop.key: prop.value for prop in model.metadata_props}
    assert metadata == {
        "model_version": tiny.model_version,
        "feature_names": ",".join(FEATURE_NAMES),
        "seed": "3",
        "training_samples": str(TINY_SAMPLES),
    }
    assert tiny.model_version.startswith("fraud-mlp-1.0.0-")
    assert len(tiny.model) < 16_000


def test_training_is_deterministic(tiny: TrainingResult) -> None:
    again = train_model(seed=3, samples=TINY_SAMPLES)
    assert again.model == tiny.model
    other = train_model(seed=4, samples=TINY_SAMPLES)
    assert other.model_version != tiny.model_version


def test_tiny_model_evaluation(tiny: TrainingResult) -> None:
    evaluation = tiny.evaluation
    assert evaluation.rows == TINY_SAMPLES // 5
    assert tiny.train_rows == TINY_SAMPLES - evaluation.rows
    assert sum(evaluation.scenario_rows.values()) == evaluation.rows
    assert evaluation.roc_auc > 0.8
    assert 0.0 < evaluation.average_precision <= 1.0
    review_fpr, decline_fpr = evaluation.false_positive_rate
    assert decline_fpr <= review_fpr < 0.1


def test_roc_auc_against_pairwise_definition() -> None:
    rng = np.random.default_rng(0)
    labels = rng.random(300) < 0.2
    scores = np.round(rng.random(300), 1)  # many ties
    pairs = scores[labels][:, None] - scores[~labels][None, :]
    expected = ((pairs > 0).sum() + 0.5 * (pairs == 0).sum()) / pairs.size
    assert roc_auc(labels, scores) == pytest.approx(expected)
    assert roc_auc(np.array([False, True]), np.array([0.1, 0.9])) == 1.0
    assert roc_auc(np.array([True, False]), np.array([0.1, 0.9])) == 0.0
    with pytest.raises(ValueError, match="both classes"):
        roc_auc(np.array([True, True]), np.array([0.1, 0.9]))


def test_average_precision_known_values() -> None:
    labels = np.array([True, False, True, False])
    # Ranked: hit (P=1), miss, hit (P=2/3), miss → (1 + 2/3) / 2.
    assert average_precision(labels, np.array([0.9, 0.8, 0.7, 0.1])) == pytest.approx(5 / 6)
    # All tied: one threshold flags everything, precision = base rate.
    assert average_precision(labels, np.full(4, 0.5)) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="fraud"):
        average_precision(np.zeros(3, bool), np.zeros(3))


def test_every_feature_is_described_in_the_card() -> None:
    assert tuple(FEATURE_DESCRIPTIONS) == FEATURE_NAMES


def test_main_writes_model_and_card(tmp_path: Path) -> None:
    out, card = tmp_path / "m" / "model.onnx", tmp_path / "card.md"
    assert main(["--seed", "9", "--samples", "5000", "--out", str(out), "--card", str(card)]) == 0
    model = onnx.load(str(out))
    version = {p.key: p.value for p in model.metadata_props}["model_version"]
    text = card.read_text(encoding="utf-8")
    assert version in text
    assert "python -m training.train --seed 9 --samples 5000" in text


def test_shipped_model_matches_features_and_ranks_fresh_traffic() -> None:
    session = cpu_session(DEFAULT_MODEL_PATH)
    metadata = session.get_modelmeta().custom_metadata_map
    assert tuple(metadata["feature_names"].split(",")) == FEATURE_NAMES
    assert metadata["model_version"] in DEFAULT_CARD_PATH.read_text(encoding="utf-8")
    features, is_fraud = fresh_sample(seed=2024, n=50_000)
    [scores] = session.run(["score"], {"features": features})
    assert roc_auc(is_fraud, scores) > 0.85
