"""Shadow scoring through the real broker: a challenger (FRAUD_SHADOW_MODEL) scores every decided
transaction on the features the served model saw, its shadow records reach the shadow topic one
per decision, and no decision changes. And a shadow never delays or blocks a decision: a slow
challenger does not hold decisions back, and shadow records the broker refuses (too large for
the shadow topic, or a shadow topic that does not exist) are dropped and counted, while the
decisions' offsets commit, in either processing guarantee."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from onnx import helper

from contracts.transaction import decode_transaction
from scorer.columns import TransactionColumns
from scorer.decisions import DEFAULT_THRESHOLDS, classify
from scorer.features import FEATURE_NAMES, build_features
from tests.integration.conftest import (
    BOOTSTRAP,
    ServiceProcess,
    Topics,
    committed_offsets,
    end_offsets,
    produce,
    read_topic,
)
from tests.integration.test_pipeline import decisions_of, simulated
from tests.support.models import onnx_model, package, slow_model
from tests.support.records import value_of
from tests.support.topics import delete_topics

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


# -- a shadow never delays or blocks a decision -----------------------------------------------

GUARANTEES = ["at-least-once", "exactly-once"]


def slow_challenger(directory: Path, at_least_s: float) -> tuple[Path, float]:
    """A challenger that takes at least `at_least_s` a call on this machine (measured), and
    what one call took."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    rows = np.ones((8, len(FEATURE_NAMES)), np.float32)

    def call_s(iterations: int) -> float:
        session = ort.InferenceSession(
            slow_model(iterations), options, providers=["CPUExecutionProvider"]
        )
        started = time.perf_counter()
        session.run(None, {"features": rows})
        return time.perf_counter() - started

    iterations = max(1, int(np.ceil(10 * at_least_s / call_s(10))))
    model = slow_model(iterations, model_version="slow-challenger")
    path = package(directory, model, version="slow-challenger")
    return path, call_s(iterations)


def wait_until_committed(service: ServiceProcess, topics: Topics, timeout_s: float = 60) -> None:
    """Until the service's group has committed every record of the input topic."""
    group = service.args[service.args.index("--group-id") + 1]
    end = end_offsets(topics.input, topics.partitions)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if committed_offsets(group, topics.input, topics.partitions) == end:
            return
        assert service.process.poll() is None, service.log()
        time.sleep(0.5)
    raise AssertionError(
        f"offsets {committed_offsets(group, topics.input, topics.partitions)} never reached "
        f"{end}:\n{service.log()}"
    )


def test_a_slow_challenger_does_not_delay_decisions(topics_factory, service_factory, tmp_path):
    topics: Topics = topics_factory(partitions=1)
    challenger_path, call_s = slow_challenger(tmp_path / "slow", at_least_s=1.0)
    records, _ = simulated(2_000, seed=43, prefix="slow")
    batches = len(records) // 100
    service = service_factory(
        topics,
        "--max-batch-size",
        "100",
        "--shadow-model",
        str(challenger_path),
        "--shadow-topic",
        f"{topics.output}.shadow",
        "--shadow-timeout-ms",
        "300",
    )
    service.wait_for_metric("fraud_records_consumed_total", 0, timeout_s=120)
    produce(topics.input, records)

    decisions = decisions_of(topics.output, len(records), timeout_s=120)
    assert len(decisions) == len(records)
    decided_at = [d["decided_at"] for d in decisions]
    spread_s = (max(decided_at) - min(decided_at)) / 1000.0
    # Waiting for the challenger, the batches would have been decided a call apart at least.
    assert spread_s < min(6.0, (batches - 1) * call_s / 3), (spread_s, call_s)
    # It never scored a batch within 300 ms: every shadow record is dropped, counted.
    deadline = time.monotonic() + 60
    while service.metric_total("fraud_shadow_records_dropped_total") < len(records):
        assert time.monotonic() < deadline, service.metrics()
        time.sleep(0.5)
    assert service.metric_total("fraud_shadow_records_dropped_total") == len(records)
    wait_until_committed(service, topics)


@pytest.mark.parametrize("guarantee", GUARANTEES)
def test_shadow_records_the_broker_refuses_are_dropped_and_the_decisions_commit(
    topics_factory, service_factory, tmp_path: Path, guarantee: str
):
    topics: Topics = topics_factory(partitions=2)
    # Every shadow record (about 300 bytes) is larger than its topic takes.
    shadow_topic = f"{topics.output}.shadow"
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    small = NewTopic(shadow_topic, 2, 1, config={"max.message.bytes": "100"})
    admin.create_topics([small])[shadow_topic].result(timeout=30)
    try:
        records, _ = simulated(600, seed=47, prefix=f"refused-{guarantee}")
        produce(topics.input, records)
        service = service_factory(
            topics,
            "--processing-guarantee",
            guarantee,
            "--shadow-model",
            str(challenger(tmp_path / "challenger")),
        )

        assert len(decisions_of(topics.output, len(records))) == len(records)
        wait_until_committed(service, topics)
        service.wait_for_metric(
            'fraud_shadow_records_dropped_total{reason="refused"}', len(records), timeout_s=60
        )
        assert read_topic(shadow_topic, 1, timeout_s=3) == []
    finally:
        delete_topics(admin, [shadow_topic])


def test_a_shadow_topic_that_does_not_exist_blocks_no_decision(
    topics_factory, service_factory, tmp_path: Path
):
    topics: Topics = topics_factory(partitions=1)
    records, _ = simulated(300, seed=53, prefix="no-topic")
    produce(topics.input, records)
    # The broker creates no topic on its own (auto.create.topics.enable=false).
    service = service_factory(
        topics,
        "--shadow-model",
        str(challenger(tmp_path / "challenger")),
        "--shadow-topic",
        f"{topics.output}.nowhere",
    )

    assert len(decisions_of(topics.output, len(records))) == len(records)
    wait_until_committed(service, topics)
    service.wait_for_metric(
        'fraud_shadow_records_dropped_total{reason="refused"}', len(records), timeout_s=90
    )
