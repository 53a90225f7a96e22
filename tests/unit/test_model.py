"""The model runtime on this machine's CPU: scores, checks of the model, errors."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from contracts.errors import ConfigurationError, ScoreError
from scorer.features import NUM_FEATURES
from scorer.model import OnnxScorer
from scorer.runtime import CPU
from stream.config import SHIPPED_MODEL_PATH
from tests.models import POISON, onnx_model, poison_model


def test_only_the_gpu_build_of_onnxruntime_is_installed() -> None:
    # Both distributions install the same `onnxruntime` module; the CPU one would shadow CUDA.
    assert importlib.metadata.version("onnxruntime-gpu")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("onnxruntime")


def test_cpu_device_scores_probabilities_that_vary() -> None:
    scorer = OnnxScorer(SHIPPED_MODEL_PATH, "cpu")
    assert scorer.provider == CPU
    assert scorer.model_version.startswith("fraud-gbdt-")
    rng = np.random.default_rng(0)
    scores = scorer.score(rng.normal(size=(64, NUM_FEATURES)).astype(np.float32))
    assert scores.shape == (64,) and scores.dtype == np.float32
    assert ((scores >= 0) & (scores <= 1)).all()
    assert scores.std() > 0.01


@pytest.mark.parametrize("io_binding", [False, True], ids=["plain", "bound"])
def test_onnx_runtime_errors_become_score_errors(tmp_path: Path, io_binding: bool) -> None:
    model = tmp_path / "poison.onnx"
    model.write_bytes(poison_model())
    scorer = OnnxScorer(model, "cpu", io_binding=io_binding, max_batch_size=8)
    rows = np.zeros((3, NUM_FEATURES), np.float32)
    assert scorer.score(rows).tolist() == [1.0, 1.0, 1.0]
    rows[1, 4] = POISON
    with pytest.raises(ScoreError) as caught:
        scorer.score(rows)
    assert caught.value.__cause__ is not None, "the ONNX Runtime error is kept as the cause"
    with pytest.raises(ScoreError) as caught:
        scorer.score(np.zeros((3, NUM_FEATURES + 1), np.float32))
    assert caught.value.__cause__ is not None


def test_a_model_trained_on_other_features_is_rejected_with_the_fix(tmp_path: Path) -> None:
    other = tmp_path / "other.onnx"
    names = ("amount", "velocity_1h")
    matmul = helper.make_node("MatMul", ["features", "w"], ["score"])
    other.write_bytes(onnx_model([matmul], {"w": np.ones((2, 1), np.float32)}, ["batch", 1], names))
    with pytest.raises(ConfigurationError, match=r"retrain it with `python -m training\.train`"):
        OnnxScorer(other, "cpu")


def test_a_model_without_one_score_per_row_is_rejected(tmp_path: Path) -> None:
    wide = tmp_path / "wide.onnx"
    matmul = helper.make_node("MatMul", ["features", "w"], ["score"])
    weights = {"w": np.ones((NUM_FEATURES, 2), np.float32)}
    wide.write_bytes(onnx_model([matmul], weights, ["batch", 2]))
    with pytest.raises(ConfigurationError, match=r"one score per row"):
        OnnxScorer(wide, "cpu")


def test_unreadable_models_are_configuration_errors(tmp_path: Path) -> None:
    broken = tmp_path / "m.onnx"
    broken.write_bytes(b"not an onnx model")
    with pytest.raises(ConfigurationError, match="cannot load the model"):
        OnnxScorer(broken, "cpu")
    with pytest.raises(ConfigurationError, match="cannot read model"):
        OnnxScorer(tmp_path / "missing.onnx", "cpu")
