"""Backpressure, rebalances and restarts under a backlog, against the real broker."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
from confluent_kafka import Message
from onnx import helper

from plumbing.metrics_text import samples
from scorer.features import NUM_FEATURES
from simulator.transactions import TransactionSimulator
from tests.integration.conftest import ServiceProcess, encode, produce, read_topic
from tests.support.models import onnx_model, package
from tests.support.records import value_of

#: Hidden width of the deliberately slow model.
SLOW_WIDTH = 2048


def backlog(topic: str, n: int, seed: int) -> set[str]:
    records = TransactionSimulator(seed, id_prefix=f"bp{seed}").generate(n).records
    for start in range(0, n, 50_000):
        chunk = records[start : start + 50_000]
        produce(topic, [(str(r["card_id"]).encode(), encode(r)) for r in chunk])
    return {str(r["transaction_id"]) for r in records}


class Sampler(threading.Thread):
    """Samples a service's in-flight gauge and RSS every 50 ms."""

    def __init__(self, service: ServiceProcess) -> None:
        super().__init__(daemon=True)
        self.service = service
        self.in_flight: list[float] = []
        self.rss: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set() and self.service.process.poll() is None:
            try:
                self.in_flight.append(self.service.metric("fraud_in_flight_records"))
                self.rss.append(self.service.rss_mb())
            except (OSError, AssertionError):
                pass
            time.sleep(0.05)


#: A scoring thread that falls behind fetching is what fills the in-flight bound here: with
#: batches scored inline, the loop fetches no more than it has scored.
BEHIND = ("--scoring", "thread")


def slow_model(path: Path) -> Path:
    """A valid fraud model made deliberately slow (two wide layers, tens of ms per 100 rows), so a
    backlog arrives faster than it is scored."""
    rng = np.random.default_rng(2)
    shapes = {
        "w1": (NUM_FEATURES, SLOW_WIDTH),
        "w2": (SLOW_WIDTH, SLOW_WIDTH),
        "w3": (SLOW_WIDTH, 1),
    }
    initializers = {n: rng.normal(0, 0.05, shape).astype(np.float32) for n, shape in shapes.items()}
    initializers["flat"] = np.array([-1], np.int64)
    nodes = [
        helper.make_node("MatMul", ["features", "w1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["r1"]),
        helper.make_node("MatMul", ["r1", "w2"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["r2"]),
        helper.make_node("MatMul", ["r2", "w3"], ["z"]),
        helper.make_node("Sigmoid", ["z"], ["p"]),
        helper.make_node("Reshape", ["p", "flat"], ["score"]),
    ]
    return package(path, onnx_model(nodes, initializers, ["batch"]), version="slow-1")


def test_a_backlog_faster_than_scoring_pauses_at_the_bound_and_memory_stays_flat(
    topics_factory, service_factory, tmp_path
):
    topics = topics_factory(partitions=3)
    sent = backlog(topics.input, 10_000, seed=41)
    service = service_factory(
        topics,
        "--model-path",
        str(slow_model(tmp_path / "slow")),
        *BEHIND,
        # A hand-off deeper than the bound: the bound, not the hand-off, must stop fetching.
        "--max-in-flight-records",
        "1500",
        "--max-batch-size",
        "250",
        "--handoff-batches",
        "10",
    )
    sampler = Sampler(service)
    sampler.start()

    decisions = read_topic(topics.output, len(sent), timeout_s=180)
    sampler.stop.set()
    sampler.join()

    assert {json.loads(value_of(m))["transaction_id"] for m in decisions} == sent
    assert max(sampler.in_flight) <= 1500, "the in-flight bound is never exceeded"
    log = service.log()
    assert "pausing 3 partitions: 1500 records," in log
    assert "resuming 3 partitions" in log
    service.wait_for_metric("fraud_records_consumed_total", len(sent))
    assert service.metric("fraud_paused_partitions") == 0, "drained: nothing stays paused"
    # 10,000 records held would show far above this; numba's compiler and the compiled card
    # update alone take about 130 MB of it (docs/installing.md).
    assert max(sampler.rss) < 450, f"peak RSS {max(sampler.rss):.0f} MB"
    assert "lost" not in log


def test_paused_partitions_all_resume_when_a_replica_joins_and_leaves(
    topics_factory, service_factory, tmp_path
):
    topics = topics_factory(partitions=4)
    # Enough that the first replica is still busy when the second has joined: it decides about
    # 5,000 records/s here, and 20,000 were all decided before the second had its partitions.
    sent = backlog(topics.input, 60_000, seed=43)
    model = str(slow_model(tmp_path / "slow"))
    tight = (
        "--model-path",
        model,
        *BEHIND,
        "--max-in-flight-records",
        "600",
        "--max-batch-size",
        "100",
        "--handoff-batches",
        "10",
    )
    first = service_factory(topics, *tight, instance="first")
    first.wait_for_metric("fraud_paused_partitions", 4)  # paused when the other one joins
    second = service_factory(topics, *tight, instance="second")
    second.wait_for_metric("fraud_records_consumed_total", 500, timeout_s=60)
    second.signal(signal.SIGTERM)
    assert second.wait() == 0, second.log()

    decisions = read_topic(topics.output, len(sent), timeout_s=120)

    counts = Counter(json.loads(value_of(m))["transaction_id"] for m in decisions)
    assert set(counts) == sent
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lags = [s.value for s in samples(first.metrics()) if s.name == "fraud_consumer_lag_records"]
        if len(lags) == 4 and max(lags) == 0 and first.metric("fraud_paused_partitions") == 0:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"lag did not return to zero on all partitions: {lags}\n{first.log()}")
    assert "assigned" in second.log() and "revoked" in first.log()
    assert "pausing" in second.log(), "the joining replica was paused at its bound too"


def test_kill_at_30_and_stop_at_60_percent_decides_every_transaction(
    topics_factory, service_factory
):
    topics = topics_factory(partitions=3)
    n = 60_000
    sent = backlog(topics.input, n, seed=47)
    # Without card history, a record decided again gets the very same score: with it, its
    # card's history already holds the record the second time (docs/contracts.md).
    slow = ("--max-batch-size", "64", "--max-in-flight-records", "1000", "--card-history", "off")
    killed = service_factory(topics, *slow, instance="killed")
    killed.wait_for_metric('fraud_decisions_produced_total{decision="approve"}', 0.3 * n * 0.95)
    killed.signal(signal.SIGKILL)
    killed.wait()
    by_killed = read_topic(topics.output, n, timeout_s=3, settle_s=0)

    stopped = service_factory(topics, *slow, instance="stopped")
    deadline = time.monotonic() + 120
    while len(read_topic(topics.output, n, timeout_s=2, settle_s=0)) < 0.6 * n:
        assert time.monotonic() < deadline, stopped.log()
    stopped.signal(signal.SIGTERM)
    assert stopped.wait() == 0, stopped.log()
    until_stop = read_topic(topics.output, n, timeout_s=3, settle_s=1)

    service_factory(topics, "--card-history", "off", instance="last")

    def ids(messages: list[Message]) -> Counter[str]:
        return Counter(json.loads(value_of(m))["transaction_id"] for m in messages)

    # The kill leaves duplicates, so n records read are not yet n transactions decided: read
    # until every one is there (a loaded machine once left the last replica a second behind).
    deadline = time.monotonic() + 120
    everything = read_topic(topics.output, n, timeout_s=120)
    while not sent <= set(ids(everything)) and time.monotonic() < deadline:
        everything = read_topic(topics.output, len(everything) + 1, timeout_s=10)

    phase_1, phase_1_2, total = ids(by_killed), ids(until_stop), ids(everything)
    phase_2, phase_3 = phase_1_2 - phase_1, total - phase_1_2
    assert set(total) == sent, "every transaction decided"
    assert 0.2 * n < phase_1.total() < n, "the kill landed mid-stream"
    assert not set(phase_2) & set(phase_3), "a clean stop leaves nothing to decide twice"
    duplicated = {tx for tx, count in total.items() if count > 1}
    assert duplicated <= set(phase_1), "only the killed replica's uncommitted tail repeats"
    assert max(total.values()) == 2
    first: dict[str, dict[str, object]] = {}
    for d in (json.loads(value_of(m)) for m in everything):
        earlier = first.setdefault(d["transaction_id"], d)
        assert (earlier["score"], earlier["decision"]) == (d["score"], d["decision"])


def test_late_transactions_get_a_degraded_fallback_decision(topics_factory, service_factory):
    topics = topics_factory(partitions=1)
    records = TransactionSimulator(53, id_prefix="late").generate(200).records
    an_hour_ago = time.time_ns() // 1_000_000 - 3_600_000
    produce(topics.input, [(b"k", encode({**r, "event_time": an_hour_ago})) for r in records])
    service = service_factory(topics, "--decision-deadline-ms", "1000", "--late-policy", "fallback")

    decisions = [json.loads(value_of(m)) for m in read_topic(topics.output, 200)]

    assert len(decisions) == 200 and all(d["degraded"] for d in decisions)
    assert service.metric("fraud_late_records_total") == 200
    assert service.metric('fraud_degraded_decisions_total{cause="late"}') == 200


def test_large_valid_records_are_bounded_by_bytes_not_only_by_count(
    topics_factory, service_factory, tmp_path
):
    # Finding 7 of the review: valid records may carry unknown fields up to the broker's limit,
    # so a bound on records alone let 10,000 of them hold about 10 GB.
    topics = topics_factory(partitions=1)
    records = TransactionSimulator(12, id_prefix="fat").generate(120).records
    padding = "p" * 400_000
    produce(topics.input, [(b"k", encode({**r, "notes": padding})) for r in records])
    bound = 2 * 1_048_576
    service = service_factory(
        topics,
        "--model-path",
        str(slow_model(tmp_path / "slow")),
        *BEHIND,
        "--max-in-flight-bytes",
        str(bound),
        "--max-batch-size",
        "16",
        # librdkafka's own pre-fetch is bounded separately; keep it small here.
        "-X",
        "queued.max.messages.kbytes=1024",
        "-X",
        "fetch.max.bytes=1048576",
        "-X",
        "max.partition.fetch.bytes=1048576",
    )
    peak_bytes, decided_count = 0.0, 0.0
    deadline = time.monotonic() + 120
    while decided_count < len(records):
        assert time.monotonic() < deadline, service.log()
        try:
            peak_bytes = max(peak_bytes, service.metric("fraud_in_flight_bytes"))
            decided_count = service.metric_total("fraud_decisions_produced_total")
        except (OSError, AssertionError):
            assert service.process.poll() is None, service.log()
        time.sleep(0.02)

    # One fetch may overshoot the bound by what librdkafka had queued (1 MiB here) and one more
    # record: the bound is checked before each fetch.
    assert 0 < peak_bytes <= bound + 1_048_576 + len(padding) + 1_000
    assert "bytes in flight" in service.log()
    decided = read_topic(topics.output, len(records))
    assert {json.loads(value_of(m))["transaction_id"] for m in decided} == {
        r["transaction_id"] for r in records
    }


def test_batches_held_for_a_stopped_worker_pause_at_the_bound_and_memory_stays_flat(
    topics_factory, service_factory
):
    # FRAUD_WAIT_FOR_WORKER=on with no features worker: its progress never comes, so every
    # batch is held. The replica must read on only up to its in-flight bound, then pause and
    # keep polling (the group keeps it), deciding nothing ahead of the worker.
    topics = topics_factory(partitions=3)
    backlog(topics.input, 10_000, seed=47)
    service = service_factory(
        topics,
        *("--wait-for-worker", "on", "--max-in-flight-records", "1500"),
        *("--max-batch-size", "250"),
    )
    sampler = Sampler(service)
    sampler.start()
    service.wait_for_metric("fraud_paused_partitions", 3)
    time.sleep(5)  # held and paused a while: nothing more may be read meanwhile
    sampler.stop.set()
    sampler.join()

    assert max(sampler.in_flight) <= 1500, "the held batches count against the bound"
    assert service.metric("fraud_records_consumed_total") <= 1500
    assert service.metric("fraud_paused_partitions") == 3, "still paused: still held"
    assert service.metric_total("fraud_decisions_produced_total") == 0, "none decided ahead"
    assert service.metric("fraud_worker_wait_seconds_total") > 0
    assert max(sampler.rss) < 450, f"peak RSS {max(sampler.rss):.0f} MB"
    assert "pausing 3 partitions: 1500 records," in service.log()
