"""`fraud-train from-topics` against the real broker: the service decides a simulated stream with
its features logged, the simulator's labels arrive on a labels topic, and a challenger is trained
from the two topics, counting only the labels reported by the cut-off."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import numpy as np
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from contracts.decision import encode_features
from plumbing.errors import ConfigurationError
from scorer.features import NUM_FEATURES
from scorer.model_package import CARD_FILE, load_model_package
from scorer.model_source import DirectorySource
from simulator.label_regimes import audit_sample
from simulator.transactions import TransactionSimulator
from stream.model_reload import load_serving_model
from stream.package_check import sanity_check
from stream.startup.config import ScorerSettings
from tests.integration.conftest import BOOTSTRAP, Topics, encode, produce, read_topic
from tests.support.budget import MIB, Budget, within
from training.from_topics import main as fraud_train
from training.logged_decisions import read_decisions

CARDS = 1_000
TRANSACTIONS = 24_000
RATE_PER_S = 100.0
#: Outcome delays shrunk so that most frauds are reported within the stream.
LABEL_DELAY_SCALE = 0.05
#: Reading a topic of seven records of up to a megabyte each: a few times their bytes.
READ_BUDGET = Budget(peak_bytes=64 * MIB, seconds=30.0)


def train_from(topics: Topics, labels_topic: str, out: Path, *args: str) -> int:
    """fraud-train from-topics on the service's decisions and `labels_topic`, into `out`."""
    return fraud_train(
        [
            "--bootstrap-servers",
            BOOTSTRAP,
            "--decisions-topic",
            topics.output,
            "--labels-topic",
            labels_topic,
            "--out",
            str(out),
            *args,
        ]
    )


@pytest.fixture
def labels_topic(admin: AdminClient):
    name = f"labels-{time.time_ns()}"
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(timeout=30)
    yield name
    admin.delete_topics([name])[name].result(timeout=30)


def test_a_challenger_is_trained_from_the_decisions_and_the_labels_reported_by_the_cut_off(
    topics_factory, service_factory, labels_topic: str, tmp_path: Path, capsys
):
    span_ms = int(TRANSACTIONS / RATE_PER_S * 1000)
    simulator = TransactionSimulator(
        23,
        num_cards=CARDS,
        num_terminals=2 * CARDS,
        fraud_scale=3.0,
        start_time_ms=time.time_ns() // 1_000_000 - 2 * span_ms,
        id_prefix="flywheel",
        label_delay_scale=LABEL_DELAY_SCALE,
    )
    batch = simulator.generate(TRANSACTIONS, rate_per_s=RATE_PER_S)
    topics: Topics = topics_factory(partitions=2)
    produce(topics.input, [(str(r["card_id"]).encode(), encode(r)) for r in batch.records])
    service_factory(
        topics,
        "--decision-features",
        "on",
        "--history-time-scale",
        str(batch.time_scale),
    )
    decisions = [
        msgspec.json.decode(m.value() or b"") for m in read_topic(topics.output, TRANSACTIONS)
    ]
    assert len(decisions) == TRANSACTIONS
    until = time.time_ns() // 1_000_000
    # One more outcome, reported after the cut-off: it must not count.
    legit = next(label for label in batch.labels if not label["fraud"])
    late = {**legit, "fraud": True, "reported_at": until + 60_000}
    produce(
        labels_topic,
        [(str(label["card_id"]).encode(), msgspec.json.encode(label)) for label in batch.labels]
        + [(str(late["card_id"]).encode(), msgspec.json.encode(late))],
    )
    out = tmp_path / "challenger"

    code = train_from(topics, labels_topic, out, "--until", str(until), "--version", "challenger-1")

    captured = capsys.readouterr()
    printed = captured.out
    assert code == 0, captured.err
    package = load_model_package(out)
    assert package.version == "challenger-1"
    sanity_check(load_serving_model(ScorerSettings(), DirectorySource(out)).scorer)
    frauds = sum(1 for label in batch.labels if label["fraud"])
    assert f"{frauds} frauds)" in package.manifest.training.data  # the late one is not counted
    assert f"{TRANSACTIONS} kept" in package.manifest.training.data
    metrics = package.manifest.training.metrics
    assert metrics["evaluation_auc"] > 0.7, printed
    assert 0.0 <= metrics["evaluation_served_auc"] <= 1.0
    assert "evaluation rows 4800" in printed
    low, high = package.manifest.thresholds.expected_flag_rate
    assert 0.0 <= low < high <= 1.0, "the flag rate the alert compares with is stated"
    assert "No audit sample" in (out / CARD_FILE).read_text()

    # The same topics with an audit sample: the approved decisions whose ids hash into it.
    audited_out = tmp_path / "audited"
    code = train_from(
        topics, labels_topic, audited_out, "--until", str(until), "--audit-share", "0.2"
    )
    assert code == 0, capsys.readouterr().err
    approved = [d["transaction_id"] for d in decisions if d["decision"] == "approve"]
    sampled = {t for t, s in zip(approved, audit_sample(approved, 0.2), strict=True) if s}
    fraud_ids = {str(label["transaction_id"]) for label in batch.labels if label["fraud"]}
    assert 0.15 * len(approved) < len(sampled) < 0.25 * len(approved)
    assert (
        f"Audit sample (0.2 of approved decisions): {len(sampled)} audited, "
        f"{len(sampled & fraud_ids)} frauds:"
    ) in (audited_out / CARD_FILE).read_text()
    assert len(sampled & fraud_ids) > 0, "some audited fraud was weighted"


def test_decisions_without_features_are_refused_with_what_to_do(
    topics_factory, service_factory, labels_topic: str, tmp_path: Path, capsys
):
    topics: Topics = topics_factory(partitions=1)
    records = TransactionSimulator(3, id_prefix="nofeat").generate(200).records
    produce(topics.input, [(str(r["card_id"]).encode(), encode(r)) for r in records])
    service_factory(topics)
    assert len(read_topic(topics.output, len(records))) == len(records)
    code = train_from(topics, labels_topic, tmp_path / "never")
    assert code == 2
    assert "FRAUD_DECISION_FEATURES=on" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_hostile_decisions_are_skipped_and_counted_within_a_bound_and_a_missing_topic_refused(
    admin: AdminClient,
):
    name = f"decisions-hostile-{time.time_ns()}"
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(timeout=30)
    try:
        row = encode_features(np.zeros(NUM_FEATURES, np.float32))
        good = {
            "transaction_id": "t-1",
            "decision": "approve",
            "score": 0.1,
            "model_version": "v1",
            "event_time": 1,
            "decided_at": 2,
            "features": row,
        }
        big = 900_000  # under the broker's default message bound
        hostile = [
            b"not json",
            b"[" * 100_000 + b"]" * 100_000,  # nesting: the decoder's depth bound refuses it
            msgspec.json.encode({k: v for k, v in good.items() if k != "decision"}),
            msgspec.json.encode({**good, "transaction_id": "t-2", "features": "A" * big}),
            msgspec.json.encode({**good, "transaction_id": "t-3", "features": "%" * big}),
            msgspec.json.encode({**good, "transaction_id": "t-4", "extra": [[[0]] * 50_000]}),
        ]
        produce(name, [(b"k", value) for value in [*hostile, msgspec.json.encode(good)]])
        with within(READ_BUDGET, "six hostile decisions and a good one"):
            decisions = read_decisions(BOOTSTRAP, name, until_ms=10)
        assert decisions.transaction_ids == ["t-4", "t-1"], "in the order read"
        assert decisions.skipped["unreadable"] == 4
        assert decisions.skipped["without_features"] == 1
        assert decisions.approved.tolist() == [True, True]
    finally:
        admin.delete_topics([name])[name].result(timeout=30)
    with pytest.raises(ConfigurationError, match="is not on the broker"):
        read_decisions(BOOTSTRAP, f"no-such-topic-{time.time_ns()}", until_ms=10)
