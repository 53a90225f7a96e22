"""The model runtime on this machine's CPU: scores, checks of the model, errors."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from plumbing.errors import ConfigurationError, ScoreError
from scorer.features import FEATURE_NAMES, NUM_FEATURES
from scorer.model import OnnxScorer
from scorer.model_package import load_model_package
from scorer.runtime import CPU
from stream.startup.config import SHIPPED_MODEL_PATH
from tests.support.models import POISON, onnx_model, package, poison_model


def test_only_the_gpu_build_of_onnxruntime_is_installed() -> None:
    # Both distributions install the same `onnxruntime` module; the CPU one would shadow CUDA.
    assert importlib.metadata.version("onnxruntime-gpu")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("onnxruntime")


def test_cpu_device_scores_probabilities_that_vary() -> None:
    scorer = OnnxScorer(load_model_package(SHIPPED_MODEL_PATH), "cpu")
    assert scorer.provider == CPU
    assert scorer.model_version.startswith("fraud-gbdt-")
    rng = np.random.default_rng(0)
    scores = scorer.score(rng.normal(size=(64, NUM_FEATURES)).astype(np.float32))
    assert scores.shape == (64,) and scores.dtype == np.float32
    assert ((scores >= 0) & (scores <= 1)).all()
    assert scores.std() > 0.01


@pytest.mark.parametrize("io_binding", [False, True], ids=["plain", "bound"])
def test_onnx_runtime_errors_become_score_errors(tmp_path: Path, io_binding: bool) -> None:
    model = load_model_package(package(tmp_path / "poison", poison_model()))
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


def test_a_package_reads_its_own_columns_in_its_own_order(tmp_path: Path) -> None:
    names = ("card_tx_1h", "log_amount")
    weights: dict[str, np.ndarray] = {
        "w": np.array([[1.0], [10.0]], np.float32),
        "flat": np.array([-1], np.int64),
    }
    nodes = [
        helper.make_node("MatMul", ["features", "w"], ["z"]),
        helper.make_node("Reshape", ["z", "flat"], ["score"]),
    ]
    model = package(tmp_path / "two", onnx_model(nodes, weights, ["batch"], names), names)
    scorer = OnnxScorer(load_model_package(model), "cpu")
    rows = np.zeros((2, NUM_FEATURES), np.float32)
    rows[:, FEATURE_NAMES.index("card_tx_1h")] = [0.01, 0.02]
    rows[:, FEATURE_NAMES.index("log_amount")] = [0.03, 0.04]
    assert scorer.score(rows) == pytest.approx([0.01 + 0.3, 0.02 + 0.4])


def test_a_graph_that_disagrees_with_its_manifest_is_rejected_with_the_fix(tmp_path: Path) -> None:
    names = ("card_tx_1h", "log_amount")
    matmul = helper.make_node("MatMul", ["features", "w"], ["score"])
    model = onnx_model([matmul], {"w": np.ones((2, 1), np.float32)}, ["batch", 1], names)
    three = package(tmp_path / "three", model, (*names, "night"))
    with pytest.raises(ConfigurationError, match=r"manifest names 3 features.*re-export"):
        OnnxScorer(load_model_package(three), "cpu")


def test_a_model_without_one_score_per_row_is_rejected(tmp_path: Path) -> None:
    matmul = helper.make_node("MatMul", ["features", "w"], ["score"])
    weights = {"w": np.ones((NUM_FEATURES, 2), np.float32)}
    wide = package(tmp_path / "wide", onnx_model([matmul], weights, ["batch", 2]))
    with pytest.raises(ConfigurationError, match=r"one score per row"):
        OnnxScorer(load_model_package(wide), "cpu")


def test_unreadable_models_are_configuration_errors(tmp_path: Path) -> None:
    broken = load_model_package(package(tmp_path / "broken", b"not an onnx model"))
    with pytest.raises(ConfigurationError, match="cannot load the model"):
        OnnxScorer(broken, "cpu")
