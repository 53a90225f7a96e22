"""Observed precision through the real broker: a replica follows what it flagged, reads the
labels topic from its end, and counts each flagged transaction once its labels have had their
time (FRAUD_OBSERVED_PRECISION_MATURITY_DAYS), by the label that came."""

from __future__ import annotations

import time
import uuid

from confluent_kafka.admin import NewTopic

from contracts.terminal_risk import MS_PER_DAY
from tests.integration.conftest import produce, read_topic
from tests.integration.features_worker import label, transaction


def test_flagged_transactions_are_counted_by_their_labels_once_mature(
    admin, topics_factory, service_factory
):
    labels_topic = f"labels-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(labels_topic, 2, 1)])[labels_topic].result(timeout=30)
    try:
        topics = topics_factory(partitions=2)
        # Every decision flagged (a review threshold of 0), by the model however old the event.
        service = service_factory(
            topics,
            *("--observed-precision", "on", "--labels-topic", labels_topic),
            *("--review-threshold", "0", "--decision-deadline-ms", "0"),
        )
        deadline = time.monotonic() + 60
        while f"{labels_topic} loaded" not in service.log():  # followed from its end now
            assert time.monotonic() < deadline, service.log()
            time.sleep(0.2)

        day0 = time.time_ns() // 1_000_000 // MS_PER_DAY - 30
        produce(topics.input, [transaction(i, day0, "P") for i in range(6)])
        assert len(read_topic(topics.output, 6)) == 6
        service.wait_for_metric("fraud_flagged_outcomes_pending", 6)

        # Two frauds and a legitimate outcome within the week, a record that is no label, and
        # one more label eight days on: the label clock passes the six by the maturity.
        produce(labels_topic, [label(i, day0, "P", fraud=True, reported=day0 + 2) for i in (0, 1)])
        produce(labels_topic, [label(2, day0, "P", fraud=False, reported=day0 + 3)])
        produce(labels_topic, [(b"c-0", b"not a label")])
        produce(labels_topic, [label(99, day0 + 8, None, fraud=False, reported=day0 + 8)])

        service.wait_for_metric('fraud_flagged_outcomes_total{outcome="unreported"}', 3)
        assert service.metric('fraud_flagged_outcomes_total{outcome="fraud"}') == 2
        assert service.metric('fraud_flagged_outcomes_total{outcome="legit"}') == 1
        assert service.metric("fraud_flagged_outcomes_pending") == 0
        assert "skipping the record at partition" in service.log()
    finally:
        admin.delete_topics([labels_topic])[labels_topic].result(timeout=30)
