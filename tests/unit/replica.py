"""A `ScoringService` on in-memory fakes (consumer, sink, transactional producer, scorer), run
on its own thread, and the records it is fed: the harness of test_service.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
from confluent_kafka import KafkaError, TopicPartition
from prometheus_client import CollectorRegistry

from contracts.input_formats import TransactionDecoder
from contracts.offsets import OffsetTracker
from contracts.transaction import decode_transaction
from deadletter.policy import RetryPolicy
from plumbing.health import HealthState
from scorer.decisions import DEFAULT_THRESHOLDS
from simulator.transactions import TransactionSimulator
from stream.lag import LagMonitor
from stream.metrics import ServiceMetrics
from stream.owned_card_history import OwnedCardHistory
from stream.redelivery import Redelivery
from stream.service import ScoringService
from stream.startup.config import ScorerSettings
from stream.startup.wiring import Collaborators, dead_letter_router
from stream.transactional_sink import TransactionalSink
from tests.unit.fakes import (
    AutoSink,
    FakeConsumer,
    FakeScorer,
    FakeTransactionalProducer,
    MemoryChangelog,
    message,
)

TOPIC = "tx"
RECORDS = TransactionSimulator(17, id_prefix="svc").generate(2_000).records


def tp(*partitions: int) -> list[TopicPartition]:
    return [TopicPartition(TOPIC, p) for p in partitions]


def messages(partition: int, offsets: range, value_of: Callable[[int], bytes] | None = None):
    return [
        message(
            offset,
            value_of(offset) if value_of else record_value(partition, offset),
            partition=partition,
            topic=TOPIC,
        )
        for offset in offsets
    ]


def record_value(partition: int, offset: int) -> bytes:
    """A distinct transaction per partition and offset (up to 1,000 offsets a partition)."""
    return msgspec.json.encode(RECORDS[(partition * 1_000 + offset) % len(RECORDS)])


class Replica:
    """A ScoringService on fakes, running on its own thread."""

    #: Where batches are scored unless a test says (`FRAUD_SCORING`).
    scoring = "inline"

    def __init__(
        self,
        scorer: FakeScorer | None = None,
        *,
        card_history: bool = False,
        terminals: Any = None,
        decode: TransactionDecoder = decode_transaction,
        tracer: Any = None,
        **settings: object,
    ) -> None:
        """`card_history`: keep card history, its changelog in `self.changelog` (a list in
        memory that receives every card state output once the sink delivers it).
        `terminals`: a stand-in for the copy of terminal-risk (start, close, loaded,
        features). `decode`: how a record's value becomes a transaction. `tracer`: the batch
        tracer (stream/tracing.py), none by default."""
        defaults: dict[str, object] = {
            "scoring": self.scoring,
            "input_topic": TOPIC,
            "max_wait_ms": 2.0,
            "max_batch_size": 32,
            "min_batch_size": 1,
            "retry_backoff_ms": 1.0,
            "retry_backoff_max_ms": 5.0,
            "shutdown_timeout_s": 5.0,
        }
        self.config = ScorerSettings(**{**defaults, **settings})  # type: ignore[arg-type]
        self.consumer = FakeConsumer()
        router = dead_letter_router(self.config)
        self.metrics = ServiceMetrics(CollectorRegistry())
        self.changelog = MemoryChangelog()
        self.consumer.ends = lambda topic, partition: self.changelog.end(partition)
        self.card_history = (
            OwnedCardHistory(
                self.changelog,
                time_scale=1.0,
                metrics=self.metrics,
                undo=self.config.exactly_once,
                retain_s=self.config.state_retain_s,
            )
            if card_history
            else None
        )
        self.redelivery = Redelivery(
            RetryPolicy(self.config.delivery_attempts, 0.001, 0.005),
            router,
            delivery_timeout_s=0.01,
            max_message_bytes=1_000_000,
            metrics=self.metrics,
            current_card=None if self.card_history is None else self.card_history.current,
        )
        self.sink = AutoSink(self.redelivery.failed, self.changelog)
        self.scorer = scorer or FakeScorer()
        self.health = HealthState()
        tracker = OffsetTracker()
        #: Every transactional producer the sink made (it replaces one after the cluster went
        #: away); the last is the one in use.
        self.producers = [FakeTransactionalProducer(self.consumer)]
        self.producer.changelog = self.changelog
        self._producers_made = 0
        #: The init_transactions() error of the next replacement producer, if any.
        self.replacement_init_error: KafkaError | None = None
        lag = LagMonitor(TOPIC, self.metrics)
        self.transactions = (
            TransactionalSink(
                self._next_producer,  # type: ignore[arg-type]
                self.consumer,  # type: ignore[arg-type]
                tracker,
                router,
                commit_interval_s=self.config.transaction_ms / 1000.0,
                max_records=self.config.transaction_max_records,
                max_message_bytes=1_000_000,
                metrics=self.metrics,
                on_committed=lag.committed,
            )
            if self.config.exactly_once
            else None
        )
        self.parts = Collaborators(
            consumer=self.consumer,  # type: ignore[arg-type]
            sink=self.transactions or self.sink,
            scorer=self.scorer,
            redelivery=self.redelivery,
            router=router,
            health=self.health,
            lag=lag,
            metrics=self.metrics,
            policy=self.config.decision_policy(DEFAULT_THRESHOLDS),
            tracker=tracker,
            transactions=self.transactions,
            card_history=self.card_history,
            terminals=terminals,
            decode=decode,
            tracer=tracer,
        )
        self.service = ScoringService(self.config, self.parts)
        self.thread = threading.Thread(target=self.service.run, daemon=True)

    @property
    def producer(self) -> FakeTransactionalProducer:
        return self.producers[-1]

    def _next_producer(self) -> FakeTransactionalProducer:
        """The sink's producer factory: the first producer, then a new one per call."""
        self._producers_made += 1
        if self._producers_made > 1:
            self.producers.append(FakeTransactionalProducer(self.consumer))
            self.producer.init_error = self.replacement_init_error
            self.producer.changelog = self.changelog
        return self.producer

    def __enter__(self) -> Replica:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self, timeout_s: float = 30.0) -> float:
        started = time.monotonic()
        self.service.stop()
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the replica did not stop"
        return time.monotonic() - started

    def outputs(self) -> list[tuple[str, bytes | None]]:
        """(topic, value) of every output made durable: acknowledged, or committed."""
        if self.transactions is not None:
            return [
                (topic, value)
                for producer in self.producers
                for topic, _key, value in producer.committed
            ]
        return [(o.topic, o.value) for o in self.sink.delivered]

    def decided(self) -> dict[str, dict[str, object]]:
        values = [value for topic, value in self.outputs() if topic == self.config.output_topic]
        decisions = [msgspec.json.decode(v) for v in values if v is not None]
        by_id = {d["transaction_id"]: d for d in decisions}
        assert len(by_id) == len(decisions), "a decision became durable twice"
        return by_id

    def committed(self) -> dict[tuple[str, int], int]:
        """Offsets committed for the group: by the consumer, or by the transactions."""
        if self.transactions is not None:
            return self.consumer.committed_offsets
        return self.consumer.consumer_commits

    def progress(self) -> dict[tuple[str, int], int]:
        """Positions made committable so far: stored offsets, or committed ones."""
        return self.consumer.committed_offsets if self.transactions else self.consumer.stored
