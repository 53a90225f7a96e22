"""The flag rate a package expects (scorer/flag_rate.py): the range from validation days, the
manifest field that states it, and the gauge the FraudFlagRateUnexpected alert reads."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from plumbing.errors import ConfigurationError
from scorer.decisions import Thresholds
from scorer.flag_rate import FLAG_RATE_MARGIN, MIN_DAY_ROWS, expected_flag_rate, range_in_use
from scorer.model_package import load_model_package, parse_manifest, write_model_package
from stream.metrics import ServiceMetrics
from stream.startup.config import SHIPPED_MODEL_PATH


def test_the_range_is_the_lowest_and_highest_daily_share_widened():
    # Day 0 flags 1 %, day 1 flags 3 %; day 2 is too small to bound anything (it flags all).
    rows = MIN_DAY_ROWS * 2
    scores = np.concatenate(
        [
            np.where(np.arange(rows) < rows * 0.01, 0.9, 0.1),
            np.where(np.arange(rows) < rows * 0.03, 0.9, 0.1),
            np.full(10, 0.9),
        ]
    )
    day = np.repeat([0, 1, 2], [rows, rows, 10])
    low, high = expected_flag_rate(scores, day, review=0.5)
    assert low == pytest.approx(0.01 / FLAG_RATE_MARGIN)
    assert high == pytest.approx(0.03 * FLAG_RATE_MARGIN)


def test_without_a_full_day_all_rows_count_as_one_and_the_range_stays_within_one():
    scores = np.array([0.9] * 70 + [0.1] * 30)
    assert expected_flag_rate(scores, np.zeros(100, np.int64), review=0.5) == [0.35, 1.0]
    with pytest.raises(ValueError, match="one day per score"):
        expected_flag_rate(scores, np.zeros(99, np.int64), review=0.5)


def test_the_range_is_in_use_only_with_the_packages_own_thresholds(tmp_path: Path):
    shipped = load_model_package(SHIPPED_MODEL_PATH)
    stated = shipped.manifest.thresholds.expected_flag_rate
    assert len(stated) == 2 and 0.0 < stated[0] < stated[1] < 1.0, "the shipped model states it"
    assert range_in_use(shipped, shipped.thresholds) == tuple(stated)
    overridden = Thresholds(shipped.thresholds.review / 2, shipped.thresholds.decline)
    assert range_in_use(shipped, overridden) is None
    assert range_in_use(None, shipped.thresholds) is None
    silent = msgspec.structs.replace(
        shipped.manifest,
        thresholds=msgspec.structs.replace(shipped.manifest.thresholds, expected_flag_rate=[]),
    )
    package = write_model_package(tmp_path / "p", shipped.onnx, silent)
    assert range_in_use(package, package.thresholds) is None


@pytest.mark.parametrize(
    "stated", [[0.5, 0.1], [0.1], [0.1, 0.2, 0.3], [-0.1, 0.2], [0.1, 1.5], [math.nan, 0.2]]
)
def test_a_manifest_refuses_a_range_that_is_not_one(stated: list[float]):
    document = msgspec.to_builtins(load_model_package(SHIPPED_MODEL_PATH).manifest)
    document["thresholds"]["expected_flag_rate"] = stated
    with pytest.raises(ConfigurationError, match="expected_flag_rate"):
        parse_manifest(document)


def test_the_gauge_shows_the_range_and_nan_when_unknown():
    registry = CollectorRegistry()
    metrics = ServiceMetrics(registry)
    metrics.set_model("m-1", "CPUExecutionProvider", (0.004, 0.03))
    assert registry.get_sample_value("fraud_model_expected_flag_ratio", {"bound": "low"}) == 0.004
    assert registry.get_sample_value("fraud_model_expected_flag_ratio", {"bound": "high"}) == 0.03
    metrics.set_model("m-2", "CPUExecutionProvider", None)
    for bound in ("low", "high"):
        value = registry.get_sample_value("fraud_model_expected_flag_ratio", {"bound": bound})
        assert value is not None and math.isnan(value)
