"""Exactly-once mode against the real broker: a crash repeats nothing, and a zombie's writes are
fenced. Decisions are read with isolation.level=read_committed (librdkafka's default, which
`read_topic` uses), as docs/contracts.md tells consumers of `decisions` to."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter

from confluent_kafka import Consumer, Message

from simulator.transactions import TransactionSimulator
from tests.integration.conftest import BOOTSTRAP, encode, produce, read_topic
from tests.support.records import raw_headers, value_of

EXACTLY_ONCE = ("--processing-guarantee", "exactly-once")


def backlog(topic: str, n: int, seed: int, bad_every: int = 0) -> tuple[set[str], int]:
    """Produce `n` transactions (and an invalid record every `bad_every`); return their ids and
    how many invalid records went in."""
    records = TransactionSimulator(seed, id_prefix=f"eos{seed}").generate(n).records
    values: list[tuple[bytes | None, bytes | None]] = []
    bad = 0
    for i, record in enumerate(records):
        values.append((str(record["card_id"]).encode(), encode(record)))
        if bad_every and i % bad_every == 0:
            values.append((b"bad", b"{not json " + str(i).encode()))
            bad += 1
    produce(topic, values)
    return {str(r["transaction_id"]) for r in records}, bad


def ids(messages: list[Message]) -> Counter[str]:
    return Counter(json.loads(value_of(m))["transaction_id"] for m in messages)


def count_committed(topic: str) -> int:
    """Records of `topic` a read_committed consumer sees right now."""
    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": f"count-{time.monotonic_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen, idle_until = 0, time.monotonic() + 3
    try:
        while time.monotonic() < idle_until:
            got = consumer.consume(1000, 0.2)
            if got:
                seen += len(got)
                idle_until = time.monotonic() + 1
    finally:
        consumer.close()
    return seen


def test_a_kill_9_under_load_repeats_no_decision_and_no_dead_letter(
    topics_factory, service_factory
):
    topics = topics_factory(partitions=3)
    n = 30_000
    sent, bad = backlog(topics.input, n, seed=61, bad_every=1_000)
    settings = (*EXACTLY_ONCE, "--max-batch-size", "64", "--max-in-flight-records", "1000")
    killed = service_factory(topics, *settings, instance="killed")
    killed.wait_for_metric('fraud_decisions_produced_total{decision="approve"}', 0.3 * n)
    killed.signal(signal.SIGKILL)
    killed.wait()

    service_factory(topics, *settings, instance="restarted")
    decisions = read_topic(topics.output, n, timeout_s=180, settle_s=3)
    letters = read_topic(topics.dlq, bad, timeout_s=30, settle_s=2)

    decided = ids(decisions)
    assert set(decided) == sent, "every transaction decided"
    assert max(decided.values()) == 1, "no decision visible twice"
    positions = Counter(
        (
            dict(raw_headers(m))["dlq.original.partition"],
            dict(raw_headers(m))["dlq.original.offset"],
        )
        for m in letters
    )
    assert len(letters) == bad and max(positions.values()) == 1, "each dead letter once"


def test_a_zombie_replica_is_fenced_and_its_writes_never_visible(topics_factory, service_factory):
    topics = topics_factory(partitions=2)
    n = 6_000
    sent, _ = backlog(topics.input, n, seed=62)
    # Long transactions, so the zombie is frozen with thousands of outputs uncommitted; a
    # short session, so the group moves its partitions while it is frozen.
    settings = (
        *EXACTLY_ONCE,
        "--transaction-ms",
        "4000",
        "--max-batch-size",
        "32",
        "--max-in-flight-records",
        "400",
        "-X",
        "session.timeout.ms=6000",
        "-X",
        "max.poll.interval.ms=6000",
    )
    zombie = service_factory(topics, *settings, instance="zombie")
    zombie.wait_for_metric('fraud_decisions_produced_total{decision="approve"}', 500)
    zombie.signal(signal.SIGSTOP)
    try:
        successor = service_factory(topics, *settings, instance="successor")
        successor.wait_for_metric('fraud_decisions_produced_total{decision="approve"}', 500, 90)
    finally:
        zombie.signal(signal.SIGCONT)
    decisions = read_topic(topics.output, n, timeout_s=180, settle_s=8)

    decided = ids(decisions)
    assert set(decided) == sent
    assert max(decided.values()) == 1, "a write of the zombie became visible"
    log = zombie.log()
    assert "aborting" in log or "lost" in log or "fatal transaction error" in log, log
