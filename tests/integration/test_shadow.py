"""Shadow scoring through the real broker: a challenger (FRAUD_SHADOW_MODEL) scores every decided
transaction on the features the served model saw, its shadow records reach the shadow topic one
per decision, and no decision changes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from confluent_kafka.admin import AdminClient, NewTopic
from onnx import helper

from contracts.transaction import decode_transaction
from scorer.columns import TransactionColumns
from scorer.decisions import DEFAULT_THRESHOLDS, classify
from scorer.features import FEATURE_NAMES, build_features
from tests.integration.conftest import BOOTSTRAP, Topics, produce, read_topic
from tests.integration.test_pipeline import decisions_of, simulated
from tests.support.models import onnx_model, package
from tests.support.records import value_of

#: The challenger: sigmoid(SLOPE * (log_amount - CENTRE)), reading that one feature.
SLOPE, CENTRE = 2.0, 4.0
TOLERANCE = 1e-5


def challenger(directory: Path) -> Path:
    model = onnx_model(
        [
            helper.make_node("Sub", ["features", "centre"], ["centred"]),
            helper.make_node("Mul", ["centred", "slope"], ["logit"]),
            helper.make_node("Sigmoid", ["logit"], ["probability"]),
            helper.make_node("Flatten", ["probability"], ["flat"], axis=0),
            helper.make_node("Squeeze", ["flat", "zero"], ["score"]),
        ],
        {
            "centre": np.array([CENTRE], np.float32),
            "slope": np.array([SLOPE], np.float32),
            "zero": np.array([0], np.int64),
        },
        ["batch"],
        feature_names=("log_amount",),
        model_version="challenger-1",
    )
    return package(directory, model, ("log_amount",), version="challenger-1")


def test_the_challenger_scores_every_decision_in_shadow_and_changes_none(
    topics_factory, service_factory, tmp_path: Path
):
    topics: Topics = topics_factory(partitions=2)
    shadow_topic = f"{topics.output}.shadow"
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    admin.create_topics([NewTopic(shadow_topic, 2, 1)])[shadow_topic].result(timeout=30)
    records, _ = simulated(2_000, seed=41, prefix="shadow")
    produce(topics.input, records)
    service = service_factory(topics, "--shadow-model", str(challenger(tmp_path / "challenger")))

    decisions = {d["transaction_id"]: d for d in decisions_of(topics.output, len(records))}
    shadows = [json.loads(value_of(m)) for m in read_topic(shadow_topic, len(records))]
    assert len(decisions) == len(records) == len(shadows)
    assert {s["transaction_id"] for s in shadows} == set(decisions)

    transactions = [decode_transaction(value) for _, value in records if value is not None]
    log_amount = build_features(TransactionColumns.from_transactions(transactions))[
        :, FEATURE_NAMES.index("log_amount")
    ]
    expected = dict(
        zip(
            (t.transaction_id for t in transactions),
            (1.0 / (1.0 + np.exp(-SLOPE * (log_amount - CENTRE)))).tolist(),
            strict=True,
        )
    )
    for shadow in shadows:
        decision = decisions[shadow["transaction_id"]]
        assert abs(shadow["score"] - expected[shadow["transaction_id"]]) <= TOLERANCE
        assert shadow["model_version"] == "challenger-1"
        assert (
            shadow["decision"]
            == classify(np.array([shadow["score"]], dtype=np.float32), DEFAULT_THRESHOLDS)[0]
        )
        assert shadow["served_score"] == decision["score"]
        assert shadow["served_model_version"] == decision["model_version"] != "challenger-1"
        assert shadow["decided"] == decision["decision"]
    # The served model's decisions stand: its own scores, its own thresholds.
    assert all(abs(d["score"] - expected[i]) > TOLERANCE for i, d in list(decisions.items())[:50])

    pairs = {
        (served, challenger_label): service.metric(
            f'fraud_shadow_decisions_total{{served="{served}",shadow="{challenger_label}"}}'
        )
        for served, challenger_label in {(s["served_decision"], s["decision"]) for s in shadows}
    }
    assert sum(pairs.values()) == len(shadows)
    changed = sum(s["served_decision"] != s["decision"] for s in shadows)
    assert changed == sum(n for (a, b), n in pairs.items() if a != b) > 0
    assert service.metric("fraud_shadow_model_score_count") == len(shadows)
