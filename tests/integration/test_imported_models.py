"""A team's own models, trained here on simulator data, imported with `fraud-model import` and
served through the real broker: every decision's score agrees with the native model's."""

from __future__ import annotations

from pathlib import Path

import joblib
import numpy as np
import pytest
import xgboost
from sklearn.ensemble import RandomForestClassifier

from contracts.transaction import decode_transaction
from model_tools.cli import main as fraud_model
from scorer.columns import TransactionColumns
from scorer.features import TRANSACTION_FEATURE_NAMES, build_features
from scorer.model_package import load_model_package
from simulator.replay import simulate
from tests.integration.conftest import Topics, produce
from tests.integration.test_pipeline import decisions_of, simulated

#: Features of the transaction alone: the test computes them from what it sent, exactly as the
#: service does, whatever the card's history.
READS = TRANSACTION_FEATURE_NAMES
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def rows() -> tuple[np.ndarray, np.ndarray]:
    stream = simulate(seed=31, days=8, cards=600)
    return stream.features[:, : len(READS)], stream.is_fraud.astype(np.int64)


def imported(tmp_path: Path, framework: str, model_file: Path, sample: np.ndarray) -> Path:
    np.save(tmp_path / "sample.npy", sample)
    out = tmp_path / f"{framework}-package"
    code = fraud_model(
        [
            "import",
            "--framework",
            framework,
            str(model_file),
            "--features",
            ",".join(READS),
            "--sample",
            str(tmp_path / "sample.npy"),
            "--name",
            f"team-{framework}",
            "--version",
            f"team-{framework}-1",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    return out


@pytest.mark.parametrize("framework", ["xgboost", "sklearn"])
def test_an_imported_model_serves_its_native_scores(
    framework: str, rows, tmp_path: Path, topics_factory, service_factory
):
    x, y = rows
    if framework == "xgboost":
        native = xgboost.XGBClassifier(n_estimators=40, max_depth=4, random_state=0).fit(x, y)
        model_file = tmp_path / "model.json"
        native.save_model(model_file)
    else:
        native = RandomForestClassifier(n_estimators=30, max_depth=6, random_state=0).fit(x, y)
        model_file = tmp_path / "model.joblib"
        joblib.dump(native, model_file)
    package = imported(tmp_path, framework, model_file, x[:2_000])
    assert load_model_package(package).version == f"team-{framework}-1"

    topics: Topics = topics_factory(partitions=2)
    records, _ = simulated(1_500, seed=37, prefix=framework)
    produce(topics.input, records)
    service_factory(topics, "--model-path", str(package))
    decisions = decisions_of(topics.output, len(records))

    assert len(decisions) == len(records)
    transactions = [decode_transaction(value) for _, value in records if value is not None]
    features = build_features(TransactionColumns.from_transactions(transactions))
    expected = dict(
        zip(
            (t.transaction_id for t in transactions),
            native.predict_proba(features[:, : len(READS)])[:, 1].tolist(),
            strict=True,
        )
    )
    served = {d["transaction_id"]: d["score"] for d in decisions}
    difference = max(abs(served[i] - expected[i]) for i in expected)
    assert difference <= TOLERANCE, difference
    assert {d["model_version"] for d in decisions} == {f"team-{framework}-1"}
    assert len({round(score, 6) for score in served.values()}) > 20, "scores must vary"
    assert not any(d["degraded"] for d in decisions)
