"""Drift (scorer/drift.py): reference histograms, the population stability index, the window the
service measures it over, the features a model uses most, and the manifest's [drift] section."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import numpy.typing as npt
import pytest
from prometheus_client import CollectorRegistry

from contracts.offsets import OffsetTracker
from deadletter.router import DeadLetterRouter
from plumbing.errors import ConfigurationError
from scorer.decide import DecisionPolicy
from scorer.decisions import Thresholds
from scorer.drift import DriftWindow, drift_reference, histogram, most_influential, psi
from scorer.model import OnnxScorer
from scorer.model_package import (
    load_model_package,
    manifest_toml,
    parse_manifest,
    write_model_package,
)
from stream.metrics import ServiceMetrics
from stream.scoring import BatchScorer
from stream.startup.config import SHIPPED_MODEL_PATH
from tests.support.records import offset_of
from tests.unit.fakes import MemorySink
from tests.unit.test_batch_scorer import make_batch


def test_a_reference_histogram_holds_deciles_and_merges_repeated_edges():
    rng = np.random.default_rng(1)
    spread = histogram(rng.normal(size=100_000))
    assert len(spread.edges) == 9 and len(spread.shares) == 10
    assert np.allclose(spread.shares, 0.1, atol=0.002)
    mostly_zero = histogram(np.concatenate([np.zeros(9_000), np.arange(1, 1_001)]))
    assert mostly_zero.edges[0] == 0.0 and mostly_zero.shares[0] == 0.0  # nothing below 0
    assert sum(mostly_zero.shares) == pytest.approx(1.0)


def test_a_value_holding_a_large_share_gets_a_bin_of_its_own():
    rng = np.random.default_rng(7)
    # 60 % zeros, 20 % exactly 1.0, the rest spread: 0 and 1 each hold a bin and nothing else.
    values = np.concatenate([np.zeros(6_000), np.ones(2_000), rng.uniform(0.0, 5.0, 2_000)])
    reference = histogram(values)
    edges = np.asarray(reference.edges)
    for atom, share in [(0.0, 0.6), (1.0, 0.2)]:
        at = int(np.searchsorted(edges, atom, side="right"))
        assert reference.shares[at] == pytest.approx(share)
        assert edges[at] == np.nextafter(np.float32(atom), np.float32(np.inf))
    assert sum(reference.shares) == pytest.approx(1.0)


@pytest.mark.parametrize("live_share", [0.5, 0.3])
def test_the_psi_of_a_zero_heavy_feature_moves_with_its_non_zero_share(live_share: float):
    """A count that is 0 on 95 % of the reference rows (terminal_fresh_frauds_7d): with decile
    edges alone, 0 and every positive count shared one bin and the PSI stayed 0."""
    rng = np.random.default_rng(8)

    def counts_with_non_zero_share(share: float, rows: int) -> np.ndarray:
        return np.where(rng.random(rows) < share, rng.integers(1, 6, rows), 0).astype(np.float32)

    reference = histogram(counts_with_non_zero_share(0.05, 50_000))
    edges = np.asarray(reference.edges)

    def live_psi(share: float) -> float:
        values = counts_with_non_zero_share(share, 10_000)
        live = np.bincount(np.searchsorted(edges, values, side="right"), minlength=len(edges) + 1)
        return psi(reference, live)

    assert live_psi(0.05) < 0.02
    assert live_psi(live_share) > 0.25


def test_psi_is_near_zero_for_the_same_population_and_large_for_a_shifted_one():
    rng = np.random.default_rng(2)
    reference = histogram(rng.normal(size=50_000))
    edges = np.asarray(reference.edges)

    def counts(values: np.ndarray) -> np.ndarray:
        return np.bincount(np.searchsorted(edges, values, side="right"), minlength=len(edges) + 1)

    assert psi(reference, counts(rng.normal(size=10_000))) < 0.01
    assert psi(reference, counts(rng.normal(0.5, 1.0, 10_000))) > 0.1
    assert psi(reference, counts(rng.normal(1.5, 1.0, 10_000))) > 0.25


def test_the_window_gives_one_psi_per_window_for_the_score_and_each_feature():
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(20_000, 3)).astype(np.float32)
    scores = rng.random(20_000)
    reference = drift_reference("test", scores, rows, ["a", "b", "c"], ["b"])
    window = DriftWindow(reference, {"b": 1}, window=1_000)
    assert window.observe(scores[:600], rows[:600]) is None
    first = window.observe(scores[600:1_000], rows[600:1_000])
    assert first is not None and set(first) == {"score", "b"} and first["score"] < 0.05
    shifted = rows[1_000:2_000].copy()
    shifted[:, 1] += 2.0
    second = window.observe(scores[1_000:2_000], shifted)
    assert second is not None and second["b"] > 0.25 and second["score"] < 0.05


def test_the_most_influential_features_are_those_the_score_reads():
    rng = np.random.default_rng(4)
    rows = rng.normal(size=(5_000, 6)).astype(np.float32)

    def score(x: npt.NDArray[np.float32]) -> npt.NDArray[np.floating]:
        return 1 / (1 + np.exp(-(3 * x[:, 4] + x[:, 1])))

    assert most_influential(score, rows, list("abcdef"), count=3) == ["e", "b"]


def test_a_manifest_keeps_its_drift_reference_and_refuses_a_bad_one(tmp_path: Path):
    shipped = load_model_package(SHIPPED_MODEL_PATH)
    rng = np.random.default_rng(5)
    rows = rng.normal(size=(1_000, len(shipped.manifest.features))).astype(np.float32)
    drift = drift_reference(
        "test rows", rng.random(1_000), rows, shipped.manifest.features, ["log_amount"]
    )
    manifest = msgspec.structs.replace(shipped.manifest, drift=drift)
    written = write_model_package(tmp_path / "p", shipped.onnx, manifest)
    assert written.manifest.drift == drift
    document = msgspec.to_builtins(msgspec.structs.replace(manifest, drift=drift))
    document["drift"]["features"] = {"not_a_feature": document["drift"]["score"]}
    with pytest.raises(ConfigurationError, match="not among the package's features"):
        parse_manifest(document)
    document["drift"]["features"] = {}
    document["drift"]["score"]["shares"] = [0.5]
    with pytest.raises(ConfigurationError, match="one more share than edges"):
        parse_manifest(document)
    assert "[drift.score]" in manifest_toml(manifest)


def test_the_scoring_stage_sets_the_psi_of_each_window(tmp_path: Path):

    shipped = load_model_package(SHIPPED_MODEL_PATH)
    names = shipped.manifest.features
    rng = np.random.default_rng(6)
    # A reference far from the batch's traffic: every PSI comes out large.
    rows = rng.normal(50.0, 1.0, size=(2_000, len(names))).astype(np.float32)
    drift = drift_reference("far away", rng.random(2_000) + 5.0, rows, names, ["log_amount"])
    package = write_model_package(
        tmp_path / "p", shipped.onnx, msgspec.structs.replace(shipped.manifest, drift=drift)
    )
    registry = CollectorRegistry()
    batch = make_batch(60)
    tracker = OffsetTracker()
    for record in batch.items:
        tracker.track(("tx", 0), offset_of(record.message))
    stage = BatchScorer(
        OnnxScorer(package),
        MemorySink(),
        tracker,
        DeadLetterRouter("tx.dlq", "g/i"),
        output_topic="decisions",
        policy=DecisionPolicy(Thresholds(0.5, 0.8)),
        metrics=ServiceMetrics(registry),
        drift_window=50,
    )
    stage.process(batch)
    assert (registry.get_sample_value("fraud_score_psi") or 0.0) > 1.0
    assert (registry.get_sample_value("fraud_feature_psi", {"feature": "log_amount"}) or 0.0) > 1.0


def test_metric_and_feature_names_toml_cannot_write_bare_are_kept(tmp_path: Path):
    shipped = load_model_package(SHIPPED_MODEL_PATH)
    metrics = {"recall@1%": 0.5, "auc_0.5": 0.9}
    training = msgspec.structs.replace(shipped.manifest.training, metrics=metrics)
    manifest = msgspec.structs.replace(shipped.manifest, training=training)
    written = write_model_package(tmp_path / "p", shipped.onnx, manifest)
    assert written.manifest.training.metrics == metrics
