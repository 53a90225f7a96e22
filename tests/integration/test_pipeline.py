"""The walking skeleton end to end: real broker, real service process, real model."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import msgspec
import pytest

from simulator.transactions import TransactionSimulator
from tests.integration.conftest import Topics, encode, produce, read_topic
from tests.support.records import headers_of, value_of

Records = list[tuple[bytes | None, bytes | None]]


def simulated(
    n: int, seed: int = 11, prefix: str = "tx"
) -> tuple[Records, list[dict[str, object]]]:
    batch = TransactionSimulator(seed, id_prefix=prefix).generate(n)
    return [(str(r["card_id"]).encode(), encode(r)) for r in batch.records], batch.records


def decisions_of(topic: str, expected: int, **kwargs: float) -> list[dict[str, Any]]:
    return [msgspec.json.decode(value_of(m)) for m in read_topic(topic, expected, **kwargs)]


def test_every_transaction_gets_exactly_one_decision_in_card_order(topics_factory, service_factory):
    topics: Topics = topics_factory(partitions=3)
    records, sent = simulated(3000)
    produce(topics.input, records)
    service_factory(topics, "--max-batch-size", "128")

    decisions = decisions_of(topics.output, len(sent))

    assert Counter(d["transaction_id"] for d in decisions) == Counter(
        r["transaction_id"] for r in sent
    )
    by_id = {r["transaction_id"]: r for r in sent}
    for d in decisions:
        source = by_id[d["transaction_id"]]
        assert d["card_id"] == source["card_id"] and d["event_time"] == source["event_time"]
        assert 0.0 <= d["score"] <= 1.0
        assert d["decision"] in ("approve", "review", "decline")
        assert d["model_version"] and d["degraded"] is False and d["decided_at"] > 0
    sent_order: dict[object, list[object]] = defaultdict(list)
    for r in sent:
        sent_order[r["card_id"]].append(r["transaction_id"])
    decided_order: dict[object, list[object]] = defaultdict(list)
    for d in decisions:
        decided_order[d["card_id"]].append(d["transaction_id"])
    assert decided_order == sent_order
    assert len({d["score"] for d in decisions}) > 100, "the model must not return constants"


def test_lone_record_is_flushed_at_the_deadline(topics_factory, service_factory):
    topics = topics_factory(partitions=1)
    service = service_factory(topics, "--max-batch-size", "1000", "--max-wait-ms", "300")
    service.wait_for_metric("fraud_records_consumed_total", 0)
    time.sleep(3)  # let the group settle so the record meets an assigned, idle consumer
    records, _ = simulated(1, seed=3)
    sent_ms = produce(topics.input, records)

    (decision,) = decisions_of(topics.output, 1)

    # Never before the deadline of a batch that did not fill up ...
    assert decision["decided_at"] - sent_ms >= 300
    # ... and flushed by the deadline, not by some later poll.
    service.wait_for_metric("fraud_batch_wait_seconds_count", 1)
    assert service.metric("fraud_batch_size_records_sum") == 1
    assert service.metric('fraud_batch_wait_seconds_bucket{le="1.0"}') == 1


def test_batches_never_exceed_the_size_cap_under_load(topics_factory, service_factory):
    topics = topics_factory(partitions=3)
    records, _ = simulated(5000, seed=5)
    produce(topics.input, records)
    service = service_factory(topics, "--max-batch-size", "64", "--max-wait-ms", "50")

    service.wait_for_metric("fraud_batch_size_records_sum", 5000)

    batches = service.metric("fraud_batch_size_records_count")
    assert service.metric('fraud_batch_size_records_bucket{le="64.0"}') == batches
    assert batches >= 5000 / 64
    # A backlog fills batches to the cap rather than flushing them part-empty.
    assert service.metric('fraud_batch_size_records_bucket{le="32.0"}') < batches / 2


def test_invalid_records_are_dead_lettered_and_neighbours_decided(topics_factory, service_factory):
    topics = topics_factory(partitions=2)
    good, sent = simulated(200, seed=8)
    bad: Records = [
        (b"k1", b"{not json"),
        (b"k2", b'{"transaction_id": "x"}'),
        (b"k3", b"\xff\xfe"),
        (b"k4", None),
        (b"k5", encode({**sent[0], "transaction_id": "neg", "amount": -5})),
    ]
    mixed = good[:100] + bad + good[100:]
    produce(topics.input, mixed)
    service_factory(topics)

    decisions = decisions_of(topics.output, len(good))
    dead = read_topic(topics.dlq, len(bad))
    # Where each bad record landed (their keys are unique): its dead letter must point there.
    bad_keys = {key for key, _ in bad}
    origin = {
        m.key(): (m.partition(), m.offset())
        for m in read_topic(topics.input, len(mixed))
        if m.key() in bad_keys
    }

    assert sorted(d["transaction_id"] for d in decisions) == sorted(
        str(r["transaction_id"]) for r in sent
    )
    assert len(dead) == len(bad)
    by_key = {m.key(): m for m in dead}
    for key, value in bad:
        letter = by_key[key]
        assert letter.value() == value, "the original bytes travel unchanged"
        headers = headers_of(letter)
        assert headers["dlq.original.topic"] == topics.input
        partition, offset = origin[key]
        assert headers["dlq.original.partition"] == str(partition)
        assert headers["dlq.original.offset"] == str(offset)
        assert headers["dlq.attempts"] == "1"
        assert headers["dlq.error"] in ("DecodeError", "ValidationError")
        assert headers["dlq.message"]
        assert headers["dlq.service"].endswith("/a")
        assert int(headers["dlq.failed_at"]) > 0
    reasons = {k: headers_of(by_key[k])["dlq.reason"] for k, _ in bad}
    assert reasons == {
        b"k1": "decode",
        b"k2": "validate",
        b"k3": "decode",
        b"k4": "decode",
        b"k5": "validate",
    }


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_graceful_stop_drains_and_commits(topics_factory, service_factory, stop_signal):
    topics = topics_factory(partitions=3)
    records, sent = simulated(20_000, seed=13)
    produce(topics.input, records)
    # Card history off: then a record decided again gets the very same score (with it on, its
    # card's history already holds the record the second time: docs/contracts.md).
    stateless = ("--card-history", "off")
    first = service_factory(topics, "--max-batch-size", "64", *stateless, instance="first")
    first.wait_for_metric('fraud_decisions_produced_total{decision="approve"}', 2000)
    first.signal(stop_signal)
    assert first.wait() == 0, first.log()
    decided_before = len(read_topic(topics.output, 20_000, timeout_s=5, settle_s=0))
    assert 0 < decided_before < 20_000, "the stop should land mid-stream"

    service_factory(topics, *stateless, instance="second")
    decisions = decisions_of(topics.output, len(sent))

    counts = Counter(d["transaction_id"] for d in decisions)
    assert set(counts) == {r["transaction_id"] for r in sent}
    assert max(counts.values()) == 1, "a restart after a clean stop decides nothing twice"


def test_a_stop_while_starting_exits_cleanly(topics_factory, service_factory):
    """A replica stopped while it loads its model (a rebalance storm, a rollout undone) exits
    0, as one stopped while consuming does, and decides nothing."""
    topics = topics_factory(partitions=1)
    produce(topics.input, simulated(10, seed=12)[0])
    service = service_factory(topics)
    deadline = time.monotonic() + 60
    while "starting instance=" not in service.log():
        assert time.monotonic() < deadline, service.log()
        time.sleep(0.01)
    service.signal(signal.SIGTERM)
    assert service.wait() == 0, service.log()
    assert read_topic(topics.output, 1, timeout_s=2, settle_s=0) == []


def test_restart_after_sigkill_loses_nothing(topics_factory, service_factory):
    topics = topics_factory(partitions=3)
    records, sent = simulated(20_000, seed=17)
    produce(topics.input, records)
    # Card history off: then a record decided again gets the very same score (with it on, its
    # card's history already holds the record the second time: docs/contracts.md).
    stateless = ("--card-history", "off")
    first = service_factory(topics, "--max-batch-size", "64", *stateless, instance="first")
    first.wait_for_metric('fraud_decisions_produced_total{decision="approve"}', 2000)
    first.signal(signal.SIGKILL)
    first.wait()

    service_factory(topics, *stateless, instance="second")
    decisions = decisions_of(topics.output, len(sent), timeout_s=90)

    decided = {d["transaction_id"] for d in decisions}
    assert decided == {r["transaction_id"] for r in sent}
    # Duplicates may come only from the killed replica's uncommitted tail, and are identical.
    first_seen: dict[object, dict[str, Any]] = {}
    for d in decisions:
        earlier = first_seen.setdefault(d["transaction_id"], d)
        assert (earlier["score"], earlier["decision"]) == (d["score"], d["decision"])


def test_two_supervised_processes_share_the_partitions_and_stop_together(
    topics_factory, service_factory
):
    topics = topics_factory(partitions=4)
    records, sent = simulated(4000, seed=13, prefix="procs")
    service = service_factory(topics, "--processes", "2")
    deadline = time.monotonic() + 60
    while service.log().count("INFO stream.rebalance: assigned tx") < 2:
        assert time.monotonic() < deadline, service.log()
        time.sleep(0.2)
    produce(topics.input, records)

    decisions = decisions_of(topics.output, len(sent))
    # Each child serves its own metrics, on the base port and the next one.
    counts = []
    for port in (service.metrics_port, service.metrics_port + 1):
        child = type(service)(service.args, service.log_path, port)
        counts.append(child.metric("fraud_records_consumed_total"))
    service.signal(signal.SIGTERM)

    assert service.wait() == 0, service.log()
    assert Counter(d["transaction_id"] for d in decisions) == Counter(
        r["transaction_id"] for r in sent
    )
    assert sum(counts) >= len(sent) and all(c > 0 for c in counts), counts
    log = service.log_path.read_text()  # whole: log() is only its tail
    assert "instance=a-0" in log and "instance=a-1" in log


def test_the_supervisor_restarts_a_process_that_dies(topics_factory, service_factory):
    topics = topics_factory(partitions=2)
    service = service_factory(topics, "--processes", "2")
    service.wait_for_metric("fraud_records_consumed_total", 0)
    pid = service.process.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert len(children) == 2
    os.kill(int(children[0]), signal.SIGKILL)
    deadline = time.monotonic() + 30
    while service.log().count("starting instance=a-0") < 2:
        assert time.monotonic() < deadline, service.log()
        time.sleep(0.2)
    assert "process 0 exited with status -9: restarting it" in service.log()
    records, sent = simulated(500, seed=14, prefix="restart")
    produce(topics.input, records)

    decided = {d["transaction_id"] for d in decisions_of(topics.output, len(sent), timeout_s=90)}

    assert decided == {r["transaction_id"] for r in sent}
    service.signal(signal.SIGTERM)
    assert service.wait() == 0


def test_processes_drain_and_exit_when_their_supervisor_is_killed(topics_factory, service_factory):
    topics = topics_factory(partitions=2)
    service = service_factory(topics, "--processes", "2")
    deadline = time.monotonic() + 60
    while service.log().count("INFO stream.rebalance: assigned tx") < 2:
        assert time.monotonic() < deadline, service.log()
        time.sleep(0.2)
    pid = service.process.pid
    children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    assert len(children) == 2

    os.kill(pid, signal.SIGKILL)
    service.process.wait(timeout=10)

    deadline = time.monotonic() + 60
    while any(Path(f"/proc/{child}").exists() for child in children):
        assert time.monotonic() < deadline, f"orphaned processes still running:\n{service.log()}"
        time.sleep(0.2)
    assert service.log().count("stopped; records left uncommitted: 0") == 2, service.log()


#: The supervisor, with its watch over the children's /healthz shortened from minutes to seconds.
QUICK_WATCH_SUPERVISOR = (
    "import sys; from stream.startup import child_health as h; "
    "h.STARTUP_GRACE_S, h.CHECK_INTERVAL_S, h.CHECK_TIMEOUT_S = 15.0, 0.5, 0.5; "
    "from stream.startup.cli import main; sys.exit(main())"
)


def test_the_supervisor_kills_and_restarts_a_process_that_hangs(topics_factory, service_factory):
    # A pod's liveness probe sees only the first process's port: a frozen second process was
    # seen by nobody. The supervisor asks each child's /healthz itself.
    topics = topics_factory(partitions=2)
    service = service_factory(topics, "--processes", "2", launcher=("-c", QUICK_WATCH_SUPERVISOR))
    second = type(service)(service.args, service.log_path, service.metrics_port + 1)
    try:
        service.wait_for_metric("fraud_records_consumed_total", 0)
        second.wait_for_metric("fraud_records_consumed_total", 0, process=service.process)
        pid = service.process.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        os.kill(int(children[1]), signal.SIGSTOP)  # alive to the kernel, silent to everyone
        deadline = time.monotonic() + 60
        while "process 1 exited with status -9: restarting it" not in service.log():
            assert time.monotonic() < deadline, service.log()
            time.sleep(0.2)
        assert "process 1: /healthz failed 3 checks in a row; killing it" in service.log()
        second.wait_for_metric("fraud_records_consumed_total", 0, process=service.process)
        records, sent = simulated(500, seed=15, prefix="hung")
        produce(topics.input, records)

        decided = {
            d["transaction_id"] for d in decisions_of(topics.output, len(sent), timeout_s=120)
        }

        assert decided == {r["transaction_id"] for r in sent}
        assert "process 0:" not in service.log(), "the healthy process was left alone"
    finally:
        service.signal(signal.SIGTERM)
    assert service.wait(90) == 0, service.log()
