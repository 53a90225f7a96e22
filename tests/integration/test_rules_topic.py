"""The rules topic against the real broker and a real service replica (issue 43): a record
built to cost memory is refused and the updates behind it still apply at once."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.conftest import ServiceProcess, Topics, produce, read_topic
from tests.integration.test_pipeline import decisions_of, simulated
from tests.support.network import http_status
from tests.support.records import raw_headers
from tests.support.topics import create_topics, delete_topics
from tests.unit.test_rules_bounds import amplification_record

#: The issue's bound on what the amplification record may cost a replica.
RSS_GROWTH_MAX_BYTES = 100 * 1024 * 1024
#: A deny entry written after it takes effect within this long (the issue's bound).
DENY_IN_FORCE_S = 2.0


@pytest.fixture
def rules_topic_factory(admin: AdminClient) -> Iterator[Callable[[], str]]:
    created: list[str] = []

    def make() -> str:
        name = f"rules-{uuid.uuid4().hex[:10]}"
        config = {"cleanup.policy": "compact"}
        created.extend(create_topics(admin, [NewTopic(name, 1, 1, config=config)]))
        return name

    yield make
    delete_topics(admin, created)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def ready(service: ServiceProcess) -> bool:
    assert service.process.poll() is None, f"service exited early:\n{service.log()}"
    return http_status(service.metrics_port, "/readyz") == 200


def dead_letters(topic: str, expected: int) -> list[tuple[bytes | None, bytes]]:
    """(key, dlq.reason) of every dead letter on `topic`, once `expected` arrived (or later)."""
    letters = read_topic(topic, expected, timeout_s=20.0, settle_s=2.0)
    return [(m.key(), dict(raw_headers(m))["dlq.reason"]) for m in letters]


def test_the_amplification_record_is_refused_and_a_deny_after_it_applies_at_once(
    topics_factory: Callable[..., Topics],
    service_factory: Callable[..., ServiceProcess],
    rules_topic_factory: Callable[[], str],
) -> None:
    topics, rules_topic = topics_factory(partitions=1), rules_topic_factory()
    service = service_factory(topics, "--rules-topic", rules_topic)
    first, sent = simulated(50, seed=31, prefix="amp")
    produce(topics.input, first)
    decisions_of(topics.output, len(sent))
    rss_before = rss_bytes(service.process.pid)
    card = str(sent[0]["card_id"])

    produce(rules_topic, [(b"rule:amplified", amplification_record())])
    produce(rules_topic, [(f"deny:card:{card}".encode(), b"{}")])
    written = time.monotonic()
    service.wait_for_metric('fraud_rules_updates_total{result="applied"}', 1, DENY_IN_FORCE_S)
    in_force_s = time.monotonic() - written

    assert in_force_s <= DENY_IN_FORCE_S
    assert service.metric('fraud_rules_updates_total{result="rejected"}') == 1
    growth = rss_bytes(service.process.pid) - rss_before
    assert growth < RSS_GROWTH_MAX_BYTES, f"RSS grew {growth:,} bytes"
    again = [(key, value) for key, value in first if key == card.encode()]
    produce(topics.input, again)
    decided = decisions_of(topics.output, len(sent) + len(again))[len(sent) :]
    assert [d["decision"] for d in decided] == ["decline"] * len(again)
    assert all("deny:card" in d["rules"] for d in decided)
    assert dead_letters(topics.dlq, 1) == [(b"rule:amplified", b"rules_update")]
