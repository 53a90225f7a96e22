"""The served model's drift (stream/drift_watch.py): measured against its own package's
reference, shown once a window is complete, started again when another model serves."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import numpy as np
from prometheus_client import CollectorRegistry

from scorer.drift import drift_reference
from scorer.features import FEATURE_NAMES
from scorer.model import Scorer
from stream.drift_watch import DriftWatch
from stream.metrics import ServiceMetrics


def _scorer(with_reference: bool) -> Scorer:
    rng = np.random.default_rng(3)
    rows = rng.normal(50.0, 1.0, size=(1_000, len(FEATURE_NAMES))).astype(np.float32)
    reference = drift_reference("far", rng.random(1_000) + 5.0, rows, FEATURE_NAMES, ["log_amount"])
    manifest = SimpleNamespace(drift=reference if with_reference else None)
    return cast(Scorer, SimpleNamespace(package=SimpleNamespace(manifest=manifest)))


def test_the_psi_is_set_once_a_window_is_complete_and_cleared_when_another_model_serves():
    registry = CollectorRegistry()
    watch = DriftWatch(_scorer(True), metrics=ServiceMetrics(registry), window=10)
    scores = np.full(8, 0.5)
    rows = np.zeros((8, len(FEATURE_NAMES)), np.float32)
    decided = np.ones(8, bool)
    watch.observe(scores, rows, decided)
    assert registry.get_sample_value("fraud_score_psi") == 0.0
    decided[4:] = False  # only the rows the model decided count
    watch.observe(scores, rows, decided)
    assert (registry.get_sample_value("fraud_score_psi") or 0.0) > 1.0
    assert (registry.get_sample_value("fraud_feature_psi", {"feature": "log_amount"}) or 0.0) > 1.0
    watch.follow(_scorer(False))
    assert registry.get_sample_value("fraud_score_psi") == 0.0
    assert registry.get_sample_value("fraud_feature_psi", {"feature": "log_amount"}) is None
    watch.observe(np.full(20, 0.5), np.zeros((20, len(FEATURE_NAMES))), np.ones(20, bool))
    assert registry.get_sample_value("fraud_score_psi") == 0.0
