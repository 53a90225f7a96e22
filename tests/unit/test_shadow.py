"""Shadow scoring (stream/shadow.py) with fakes: the challenger scores on its own thread after
the decisions went out, so it never delays or blocks one; what it cannot score in time, or the
broker does not take, is dropped and counted."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import pytest
from confluent_kafka import KafkaError
from prometheus_client import CollectorRegistry

from contracts.offsets import OffsetTracker
from contracts.shadow import ShadowDecision
from deadletter.router import DeadLetterRouter
from plumbing.errors import ScoreError
from scorer.decide import DecisionPolicy
from scorer.decisions import Thresholds
from stream.metrics import ServiceMetrics
from stream.model_reload import ServingModel
from stream.scoring import BatchScorer
from stream.shadow import Shadow, ShadowOutput
from tests.support.records import offset_of
from tests.unit.fakes import FakeScorer, MemorySink
from tests.unit.test_batch_scorer import make_batch

POLICY = DecisionPolicy(Thresholds(0.5, 0.8), 1_000.0, "score")
WAIT_S = 5.0


class FakeProducer:
    """The producer's calls the shadow output makes; `refuse` fails each delivery with it,
    `full_after` raises BufferError past that many records."""

    def __init__(self, refuse: KafkaError | None = None, full_after: int | None = None) -> None:
        self.records: list[tuple[str, bytes, bytes]] = []
        self._reports: list[Callable[[KafkaError | None, Any], None]] = []
        self._refuse = refuse
        self._full_after = full_after

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: Any) -> None:
        if self._full_after is not None and len(self.records) >= self._full_after:
            raise BufferError("Local: Queue full")
        self.records.append((topic, key, value))
        self._reports.append(on_delivery)

    def poll(self, _timeout: float = 0) -> int:
        reports, self._reports = self._reports, []
        for report in reports:
            report(self._refuse, None)
        return len(reports)

    def flush(self, _timeout: float = 0) -> int:
        self.poll()
        return 0


class SlowScorer(FakeScorer):
    """A challenger that scores only once `release` is set."""

    model_version = "challenger-1"

    def __init__(self) -> None:
        super().__init__(rule=lambda f: np.full(len(f), 0.9, np.float32))
        self.release = threading.Event()
        self.started = threading.Event()

    def score(self, features: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        self.started.set()
        assert self.release.wait(WAIT_S), "the test never released the challenger"
        return super().score(features)


def shadow_of(
    scorer: Any,
    producer: FakeProducer,
    *,
    timeout_s: float = 10.0,
    queue_batches: int = 64,
) -> tuple[Shadow, CollectorRegistry]:
    registry = CollectorRegistry()
    metrics = ServiceMetrics(registry)
    model = ServingModel(scorer, POLICY, None, "test")
    output = ShadowOutput(producer, "decisions.shadow", metrics)  # type: ignore[arg-type]
    shadow = Shadow(model, output, metrics, timeout_s=timeout_s, queue_batches=queue_batches)
    return shadow, registry


def stage(shadow: Shadow, registry: CollectorRegistry) -> tuple[BatchScorer, MemorySink]:
    sink, tracker = MemorySink(), OffsetTracker()
    scorer = BatchScorer(
        FakeScorer(),
        sink,
        tracker,
        DeadLetterRouter("tx.dlq", "g/i"),
        output_topic="decisions",
        policy=POLICY,
        metrics=ServiceMetrics(CollectorRegistry()),
        shadow=shadow,
    )
    return scorer, sink


def dropped(registry: CollectorRegistry, reason: str) -> float | None:
    return registry.get_sample_value("fraud_shadow_records_dropped_total", {"reason": reason})


def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.01)


def test_decisions_are_sent_without_waiting_for_a_challenger_that_hangs():
    challenger, producer = SlowScorer(), FakeProducer()
    shadow, registry = shadow_of(challenger, producer)
    scorer, sink = stage(shadow, registry)
    shadow.start()
    try:
        batch = make_batch(8)
        tracker = scorer._tracker
        for record in batch.items:
            tracker.track(("tx", 0), offset_of(record.message))
        started = time.perf_counter()
        scorer.process(batch)
        assert time.perf_counter() - started < 1.0
        assert [o.kind for o in sink.sent] == ["decision"] * 8
        sink.deliver_all()
        assert tracker.take_commit_positions() == {("tx", 0): 8}, "the offsets commit at once"
        assert challenger.started.wait(WAIT_S) and producer.records == []

        challenger.release.set()
        until(lambda: len(producer.records) == 8)
    finally:
        challenger.release.set()
        shadow.stop()
    shadows = [msgspec.json.decode(value, type=ShadowDecision) for _, _, value in producer.records]
    sent = [r.transaction.transaction_id for r in batch.items]
    assert [s.transaction_id for s in shadows] == sent
    assert {s.model_version for s in shadows} == {"challenger-1"}
    assert {s.decision for s in shadows} == {"decline"}
    assert registry.get_sample_value("fraud_shadow_model_score_count") == 8


def test_a_batch_not_scored_within_the_time_limit_is_dropped_and_counted():
    challenger, producer = SlowScorer(), FakeProducer()
    shadow, registry = shadow_of(challenger, producer, timeout_s=0.05)
    scorer, _ = stage(shadow, registry)
    shadow.start()
    try:
        scorer.process(make_batch(5))  # the challenger starts on it and hangs
        assert challenger.started.wait(WAIT_S)
        scorer.process(make_batch(3))  # waits behind it, past the limit
        time.sleep(0.1)
        challenger.release.set()
        until(lambda: dropped(registry, "late") == 8)
    finally:
        challenger.release.set()
        shadow.stop()
    assert producer.records == []
    assert registry.get_sample_value("fraud_shadow_model_score_count") in (None, 0)


def test_batches_beyond_the_queue_are_dropped_as_busy_without_waiting():
    challenger, producer = SlowScorer(), FakeProducer()
    shadow, registry = shadow_of(challenger, producer, queue_batches=1)
    scorer, _ = stage(shadow, registry)
    shadow.start()
    try:
        scorer.process(make_batch(2))  # taken by the challenger
        assert challenger.started.wait(WAIT_S)
        scorer.process(make_batch(3))  # waits in the queue
        started = time.perf_counter()
        scorer.process(make_batch(4))  # finds the queue full
        assert time.perf_counter() - started < 1.0
        assert dropped(registry, "busy") == 4
        challenger.release.set()
        until(lambda: len(producer.records) == 5)
    finally:
        challenger.release.set()
        shadow.stop()


@pytest.mark.parametrize(
    "producer",
    [
        FakeProducer(refuse=KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)),
        FakeProducer(refuse=KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)),
        FakeProducer(full_after=2),
    ],
    ids=["too large", "no such topic", "queue full"],
)
def test_shadow_records_the_broker_does_not_take_are_dropped_and_counted(producer):
    challenger = FakeScorer(rule=lambda f: np.full(len(f), 0.1, np.float32))
    shadow, registry = shadow_of(challenger, producer)
    scorer, sink = stage(shadow, registry)
    shadow.start()
    try:
        scorer.process(make_batch(6))
        until(lambda: dropped(registry, "refused") == (6 if producer._full_after is None else 4))
    finally:
        shadow.stop()
    assert [o.kind for o in sink.sent] == ["decision"] * 6


def test_a_challenger_that_fails_costs_its_batch_and_not_the_next():
    calls: list[int] = []

    def rule(features: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        calls.append(len(features))
        if len(calls) == 1:
            raise RuntimeError("an error ONNX Runtime was never expected to raise")
        if len(calls) == 2:
            raise ScoreError("CUDA error: device lost")
        return np.full(len(features), 0.2, np.float32)

    producer = FakeProducer()
    shadow, registry = shadow_of(FakeScorer(rule=rule), producer)
    scorer, _ = stage(shadow, registry)
    shadow.start()
    try:
        for n in (2, 3, 4):
            scorer.process(make_batch(n))
        until(lambda: len(producer.records) == 4)
    finally:
        shadow.stop()
    assert registry.get_sample_value("fraud_shadow_failures_total") == 2
