"""Reasons on every flagged decision, and rules that change decisions live, against the real
broker and the real service process."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import msgspec
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from scorer.catalogue import BY_NAME
from tests.integration.conftest import Topics, produce, read_topic
from tests.integration.test_pipeline import decisions_of, simulated
from tests.support.records import raw_headers


@pytest.fixture
def rules_topic(admin: AdminClient) -> Iterator[str]:
    name = f"rules-{uuid.uuid4().hex[:10]}"
    created = admin.create_topics([NewTopic(name, 1, 1, config={"cleanup.policy": "compact"})])
    for future in created.values():
        future.result(timeout=30)
    yield name
    for future in admin.delete_topics([name]).values():
        future.result(timeout=30)


def test_every_review_and_decline_carries_three_reasons(topics_factory, service_factory):
    topics: Topics = topics_factory(partitions=2)
    records, sent = simulated(4000, seed=17, prefix="why")
    produce(topics.input, records)
    service_factory(topics)

    decisions = decisions_of(topics.output, len(sent))

    assert len(decisions) == len(sent)
    flagged = [d for d in decisions if d["decision"] != "approve"]
    assert flagged, "the simulated traffic holds fraud the model flags"
    for decision in flagged:
        reasons = decision["reasons"]
        assert len(reasons) == 3, decision
        assert all(reason["feature"] in BY_NAME and reason["text"] for reason in reasons)
        assert all(reason["label"] == reason["text"] for reason in reasons)  # deprecated
        contributions = [reason["contribution"] for reason in reasons]
        assert contributions == sorted(contributions, reverse=True)
    assert all("reasons" not in d for d in decisions if d["decision"] == "approve")


def test_rules_sent_to_the_rules_topic_change_decisions_live(
    topics_factory, service_factory, rules_topic
):
    topics: Topics = topics_factory(partitions=1)
    # No guard: with it, the override would wait until the replica's sample of the traffic
    # holds 50 rows (two seconds of it), which 300 transactions decided at once may not give.
    # The guard is tested in test_rules_topic.py.
    service = service_factory(topics, "--rules-topic", rules_topic, "--rules-guard-share", "0")
    first, sent = simulated(300, seed=23, prefix="before")
    produce(topics.input, first)
    before = decisions_of(topics.output, len(sent))
    denied_card = str(sent[0]["card_id"])
    assert all(not d.get("rules") for d in before), "no rule is in force yet"

    produce(
        rules_topic,
        [
            (f"deny:card:{denied_card}".encode(), b"{}"),
            (
                b"override:ecom-reviewed",
                json.dumps({"channel": "ecom", "review": 0.0, "decline": 1.0}).encode(),
            ),
            (b"bogus:entry", b"{}"),
        ],
    )
    service.wait_for_metric('fraud_rules_updates_total{result="applied"}', 2)
    service.wait_for_metric('fraud_rules_updates_total{result="rejected"}', 1)

    again = [
        (key, value)
        for key, value in first
        if value is not None and msgspec.json.decode(value)["card_id"] == denied_card
    ]
    later, later_sent = simulated(300, seed=29, prefix="after")
    produce(topics.input, [*again, *later])
    after = decisions_of(topics.output, len(sent) + len(again) + len(later_sent))[len(sent) :]

    by_id = {r["transaction_id"]: r for r in later_sent}
    denied = [d for d in after if d["card_id"] == denied_card]
    assert len(denied) >= len(again) > 0
    assert all(d["decision"] == "decline" and "deny:card" in d["rules"] for d in denied)
    ecom = [d for d in after if by_id.get(d["transaction_id"], {}).get("channel") == "ecom"]
    assert ecom, "the simulated traffic holds e-commerce transactions"
    for decision in ecom:
        assert decision["decision"] in ("review", "decline")
        assert "override:ecom-reviewed" in decision["rules"]
    others = [
        d
        for d in after
        if d["card_id"] != denied_card
        and by_id.get(d["transaction_id"], {}).get("channel") not in (None, "ecom")
    ]
    assert all("override:ecom-reviewed" not in d.get("rules", ()) for d in others)

    (letter,) = read_topic(topics.dlq, 1)
    headers = dict(raw_headers(letter))
    assert letter.key() == b"bogus:entry"
    assert headers["dlq.reason"] == b"rules_update"
    assert headers["dlq.original.topic"] == rules_topic.encode()
