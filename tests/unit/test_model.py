"""The model runtime on this machine's CPU: provider choice, fallback, checks, errors."""

from __future__ import annotations

import importlib.metadata
import logging
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from scorer.features import NUM_FEATURES
from scorer.model import CPU, CUDA, OnnxScorer
from stream.config import SHIPPED_MODEL_PATH
from stream.errors import ConfigurationError, ScoreError


def test_only_the_gpu_build_of_onnxruntime_is_installed() -> None:
    # Both distributions install the same `onnxruntime` module; the CPU one would shadow CUDA.
    assert importlib.metadata.version("onnxruntime-gpu")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("onnxruntime")


def test_cpu_device_scores_probabilities_that_vary() -> None:
    scorer = OnnxScorer(SHIPPED_MODEL_PATH, "cpu")
    assert scorer.provider == CPU
    assert scorer.model_version.startswith("fraud-mlp-")
    rng = np.random.default_rng(0)
    scores = scorer.score(rng.normal(size=(64, NUM_FEATURES)).astype(np.float32))
    assert scores.shape == (64,) and scores.dtype == np.float32
    assert ((scores >= 0) & (scores <= 1)).all()
    assert scores.std() > 0.01


def test_cuda_request_without_a_usable_gpu_falls_back_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="scorer.model"):
        scorer = OnnxScorer(SHIPPED_MODEL_PATH, "cuda")
    if scorer.provider == CUDA:
        pytest.fail("this test expects a machine without a usable GPU (CI has none)")
    assert scorer.provider == CPU
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "CUDA is not usable" in warnings[0].getMessage()
    assert scorer.score(np.zeros((2, NUM_FEATURES), np.float32)).shape == (2,)


def test_warm_up_runs_every_requested_batch_size() -> None:
    scorer = OnnxScorer(SHIPPED_MODEL_PATH, "cpu")
    assert scorer.warm_up((1, 8, 256)) >= 0.0


def test_onnx_runtime_errors_become_score_errors() -> None:
    scorer = OnnxScorer(SHIPPED_MODEL_PATH, "cpu")
    with pytest.raises(ScoreError) as caught:
        scorer.score(np.zeros((3, NUM_FEATURES + 1), np.float32))
    assert caught.value.__cause__ is not None, "the ONNX Runtime error is kept as the cause"


def _model_with_features(names: list[str]) -> bytes:
    weights = numpy_helper.from_array(np.ones((len(names), 1), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["features", "w"], ["score"])],
        "other",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", len(names)])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 1])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(model, {"feature_names": ",".join(names), "model_version": "other"})
    return bytes(model.SerializeToString())


def test_a_model_trained_on_other_features_is_rejected_with_the_fix(tmp_path: Path) -> None:
    other = tmp_path / "other.onnx"
    other.write_bytes(_model_with_features(["amount", "velocity_1h"]))
    with pytest.raises(ConfigurationError, match=r"retrain it with `python -m scorer\.train`"):
        OnnxScorer(other, "cpu")


def test_unreadable_models_are_configuration_errors(tmp_path: Path) -> None:
    broken = tmp_path / "m.onnx"
    broken.write_bytes(b"not an onnx model")
    with pytest.raises(ConfigurationError, match="cannot load the model"):
        OnnxScorer(broken, "cpu")
    with pytest.raises(ConfigurationError, match="cannot read model"):
        OnnxScorer(tmp_path / "missing.onnx", "cpu")
