"""The rules topic against the real broker and a real service replica (issue 43): a record
built to cost memory is refused and the updates behind it still apply at once; bad updates
never hold a replica back, and each is dead-lettered once."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.conftest import (
    ServiceProcess,
    Topics,
    produce,
    produce_to_partition,
    read_topic,
)
from tests.integration.test_pipeline import decisions_of, simulated
from tests.support.network import http_status
from tests.support.records import raw_headers
from tests.support.topics import create_topics, delete_topics
from tests.support.waiting import wait_until
from tests.unit.test_rules_bounds import amplification_record

#: The issue's bound on what the amplification record may cost a replica.
RSS_GROWTH_MAX_MB = 100
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
    rss_before_mb = service.rss_mb()
    card = str(sent[0]["card_id"])

    produce(rules_topic, [(b"rule:amplified", amplification_record())])
    produce(rules_topic, [(f"deny:card:{card}".encode(), b"{}")])
    written = time.monotonic()
    service.wait_for_metric('fraud_rules_updates_total{result="applied"}', 1, DENY_IN_FORCE_S)
    in_force_s = time.monotonic() - written

    assert in_force_s <= DENY_IN_FORCE_S
    assert service.metric('fraud_rules_updates_total{result="rejected"}') == 1
    growth_mb = service.rss_mb() - rss_before_mb
    assert growth_mb < RSS_GROWTH_MAX_MB, f"RSS grew {growth_mb:.1f} MiB"
    again = [(key, value) for key, value in first if key == card.encode()]
    produce(topics.input, again)
    decided = decisions_of(topics.output, len(sent) + len(again))[len(sent) :]
    assert [d["decision"] for d in decided] == ["decline"] * len(again)
    assert all("deny:card" in d["rules"] for d in decided)
    assert dead_letters(topics.dlq, 1) == [(b"rule:amplified", b"rules_update")]


def bad_updates(n: int) -> list[tuple[bytes | None, bytes | None]]:
    """`n` records the rules refuse, of every kind of mistake."""
    kinds: list[tuple[bytes | None, bytes | None]] = [
        (b"bogus:entry", b"{}"),
        (b"rule:broken", b'{"when": "open(1)", "then": "review"}'),
        (b"deny:card:c-1", b"{not json"),
        (b"\xff\xfe", b"{}"),  # a compacted topic refuses a record without a key
        (b"override:o", b'{"review": 0.9, "decline": 0.1, "channel": "pos"}'),
    ]
    return [kinds[i % len(kinds)] for i in range(n)]


def test_bad_updates_at_start_hold_no_replica_back(
    topics_factory: Callable[..., Topics],
    service_factory: Callable[..., ServiceProcess],
    rules_topic_factory: Callable[[], str],
) -> None:
    # Finding 5: each bad update waited up to 10 s for its dead letter (here, the dead-letter
    # topic does not exist, so it is never acknowledged): 12 of them used up the start-up wait.
    topics, rules_topic = topics_factory(partitions=1), rules_topic_factory()
    first, sent = simulated(30, seed=37, prefix="start")
    card = str(sent[0]["card_id"])
    produce(rules_topic, [*bad_updates(6), (f"deny:card:{card}".encode(), b"{}")])
    produce(topics.input, first)
    started = time.monotonic()
    service = service_factory(
        topics,
        *("--rules-topic", rules_topic, "--dlq-topic", f"{topics.dlq}-missing"),
        *("-X", "message.timeout.ms=3000"),  # an undeliverable dead letter fails in 3 s
    )

    wait_until(lambda: ready(service), 30.0, "/readyz 200", interval_s=0.2)
    ready_s = time.monotonic() - started

    decided = decisions_of(topics.output, len(sent))
    denied = [d for d in decided if d["card_id"] == card]
    assert denied and all(d["decision"] == "decline" for d in denied)
    assert ready_s < 30.0
    assert service.metric('fraud_rules_updates_total{result="refused_at_start"}') == 6
    summary = [line for line in service.log().splitlines() if "refused while reading" in line]
    assert len(summary) == 1, service.log()

    # Read live, a bad update is dead-lettered without holding the updates behind it back, and
    # the dead letter's failure is logged from its delivery report.
    produce(rules_topic, [(b"bogus:live", b"{}"), (b"deny:card:other", b"{}")])
    written = time.monotonic()
    service.wait_for_metric('fraud_rules_updates_total{result="applied"}', 2, DENY_IN_FORCE_S)
    assert time.monotonic() - written <= DENY_IN_FORCE_S
    wait_until(lambda: "was not delivered" in service.log(), 20.0, "the failed dead letter logged")


def test_a_bad_update_is_dead_lettered_once_when_read_live_and_never_at_a_start(
    topics_factory: Callable[..., Topics],
    service_factory: Callable[..., ServiceProcess],
    rules_topic_factory: Callable[[], str],
) -> None:
    # Finding 5: every replica dead-lettered the topic's bad updates again at every start.
    topics, rules_topic = topics_factory(partitions=1), rules_topic_factory()
    produce(rules_topic, bad_updates(3))
    first = service_factory(topics, "--rules-topic", rules_topic, instance="a")
    wait_until(lambda: ready(first), 30.0, "/readyz 200", interval_s=0.2)
    produce(rules_topic, [(b"bogus:live", b"{}")])
    first.wait_for_metric('fraud_rules_updates_total{result="rejected"}', 1)
    first.signal(signal.SIGTERM)
    assert first.wait(60) == 0
    second = service_factory(topics, "--rules-topic", rules_topic, instance="b")
    wait_until(lambda: ready(second), 30.0, "/readyz 200", interval_s=0.2)

    assert dead_letters(topics.dlq, 1) == [(b"bogus:live", b"rules_update")]
    assert second.metric('fraud_rules_updates_total{result="refused_at_start"}') == 4


#: The header that confirms a rules update the guard held (docs/rules.md).
CONFIRMED = [("fraud.rules.confirm", b"yes")]


def decided_waves(
    service: ServiceProcess, topics: Topics, waves: int, prefix: str, decided: float
) -> float:
    """Produce `waves` of 60 transactions a second apart, each decided before the next: the
    guard keeps rows of each second it saw traffic in. Returns the decisions made so far."""
    for wave in range(waves):
        records, _ = simulated(60, seed=50 + wave, prefix=f"{prefix}{wave}")
        produce(topics.input, records)
        decided += len(records)

        def all_decided(n: float = decided) -> bool:
            return service.metric_total("fraud_decisions_produced_total") >= n

        wait_until(all_decided, 30.0, "the wave decided", interval_s=0.1)
        time.sleep(1.05)
    return decided


def test_a_rule_that_declines_everything_is_held_until_it_is_confirmed(
    topics_factory: Callable[..., Topics],
    service_factory: Callable[..., ServiceProcess],
    rules_topic_factory: Callable[[], str],
) -> None:
    # Finding 14: an update that declined every transaction was applied like any other.
    topics, rules_topic = topics_factory(partitions=1), rules_topic_factory()
    service = service_factory(topics, "--rules-topic", rules_topic)  # the guard's default: 0.5
    wait_until(lambda: ready(service), 30.0, "/readyz 200", interval_s=0.2)
    decided = decided_waves(service, topics, 3, "before", 0)
    everything = (b"rule:everything", b'{"when": "amount > 0", "then": "decline"}')

    produce(rules_topic, [everything])
    service.wait_for_metric('fraud_rules_updates_total{result="held"}', 1, 10.0)
    assert "rules update rule:everything held" in service.log()
    decided = decided_waves(service, topics, 1, "held", decided)
    produce_to_partition(rules_topic, 0, [(*everything, CONFIRMED)])
    service.wait_for_metric('fraud_rules_updates_total{result="applied"}', 1, 10.0)
    decided_waves(service, topics, 1, "confirmed", decided)

    decisions = decisions_of(topics.output, int(decided) + 60)
    by_wave = {
        wave: [d for d in decisions if d["transaction_id"].startswith(wave)]
        for wave in ("held", "confirmed")
    }
    assert not any("rule:everything" in d.get("rules", ()) for d in by_wave["held"])
    assert by_wave["confirmed"] and all(d["decision"] == "decline" for d in by_wave["confirmed"])


def test_a_held_update_is_judged_by_a_replica_that_starts_after_it(
    topics_factory: Callable[..., Topics],
    service_factory: Callable[..., ServiceProcess],
    rules_topic_factory: Callable[[], str],
) -> None:
    # The review of issue 43: the held record stays the latest of its key, so a replica that
    # started later applied it at its catch-up, unjudged, and declined everything for good.
    # Now it is applied there (no traffic to judge by yet), then judged once the sample fills.
    topics, rules_topic = topics_factory(partitions=1), rules_topic_factory()
    first = service_factory(topics, "--rules-topic", rules_topic, instance="a")
    wait_until(lambda: ready(first), 30.0, "/readyz 200", interval_s=0.2)
    decided_waves(first, topics, 3, "a", 0)
    produce(rules_topic, [(b"rule:everything", b'{"when": "amount > 0", "then": "decline"}')])
    first.wait_for_metric('fraud_rules_updates_total{result="held"}', 1, 10.0)
    first.signal(signal.SIGTERM)
    assert first.wait(60) == 0

    second = service_factory(topics, "--rules-topic", rules_topic, instance="b")
    wait_until(lambda: ready(second), 30.0, "/readyz 200", interval_s=0.2)
    decided = decided_waves(second, topics, 3, "b", 0)
    second.wait_for_metric('fraud_rules_updates_total{result="held"}', 1, 10.0)
    decided_waves(second, topics, 1, "later", decided)

    later = [
        d
        for d in decisions_of(topics.output, 3 * 60 + int(decided) + 60)
        if d["transaction_id"].startswith("later")
    ]
    assert len(later) == 60
    assert not any("rule:everything" in d.get("rules", ()) for d in later)
    assert "rule:everything held" in second.log() and "read at start" in second.log()
