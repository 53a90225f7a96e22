"""One replica's stream loop: consume → decode + validate → micro-batch → score → produce or
dead-letter → store offsets.

Offsets are stored only for records whose decisions or dead letters the broker acknowledged
(`stream/offsets.py`); librdkafka commits what is stored. On SIGTERM the loop stops fetching,
finishes the open batch, waits for every output to be acknowledged, commits and closes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any, NamedTuple, cast

import numpy as np
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from deadletter.record import Headers, SourceRecord, dead_letter_headers
from scorer.decisions import Decision, Thresholds, classify, encode_decision, valid_scores
from scorer.features import TransactionColumns, build_features
from scorer.model import Scorer
from stream import metrics
from stream.batcher import Batch, MicroBatcher
from stream.config import ServiceConfig
from stream.errors import DeliveryError, RecordError, ScoreError
from stream.health import HealthState
from stream.offsets import OffsetTracker, PartitionKey
from stream.outcomes import OutcomeGroup, SourceOffset
from stream.sink import OutputSink
from stream.transaction import Transaction, decode_transaction

log = logging.getLogger(__name__)

#: How long one idle poll blocks: bounds how late a stop request or a delivery report is seen.
IDLE_POLL_S = 0.1


class PendingRecord(NamedTuple):
    """A consumed, valid transaction waiting in a micro-batch."""

    message: Message
    transaction: Transaction


def _position(message: Message) -> SourceOffset:
    """Partition and offset of a consumed record (librdkafka always sets them on one)."""
    return (cast(str, message.topic()), cast(int, message.partition())), cast(int, message.offset())


def _source_of(message: Message) -> SourceRecord:
    (topic, partition), offset = _position(message)
    return SourceRecord(
        topic=topic,
        partition=partition,
        offset=offset,
        timestamp_ms=message.timestamp()[1],
        key=message.key(),
        value=message.value(),
        headers=cast(Headers, list(message.headers() or [])),
    )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class ScoringService:
    """Runs the stream loop of one replica until `stop()` or a delivery failure."""

    def __init__(
        self,
        config: ServiceConfig,
        consumer: Consumer,
        sink: OutputSink,
        scorer: Scorer,
        health: HealthState,
    ) -> None:
        self._config = config
        self._consumer = consumer
        self._sink = sink
        self._scorer = scorer
        self._health = health
        self._thresholds = Thresholds(config.review_threshold, config.decline_threshold)
        self._batcher: MicroBatcher[PendingRecord] = MicroBatcher(
            config.max_batch_size, config.max_wait_ms
        )
        self._tracker = OffsetTracker()
        self._stopping = threading.Event()
        self._failure: DeliveryError | None = None
        self._service_name = f"{config.group_id}/{config.instance_id}"

    def stop(self) -> None:
        """Ask the loop to drain and exit (safe from a signal handler)."""
        self._stopping.set()

    @property
    def failure(self) -> DeliveryError | None:
        """The delivery failure that stopped the loop, if any."""
        return self._failure

    def run(self) -> None:
        """Subscribe and process until stopped; then drain, commit and close the consumer."""
        self._consumer.subscribe(
            [self._config.input_topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )  # fmt: skip
        self._health.set_ready(True)
        log.info(
            "consuming topic=%s group=%s max_batch_size=%s max_wait_ms=%s",
            self._config.input_topic,
            self._config.group_id,
            self._config.max_batch_size,
            self._config.max_wait_ms,
        )
        try:
            while not self._stopping.is_set() and self._failure is None:
                self._health.beat()
                self._step()
        finally:
            self._health.set_ready(False, "shutting down")
            self._shut_down()

    # -- the loop ---------------------------------------------------------------------------

    def _step(self) -> None:
        wait_s = self._batcher.seconds_until_due(time.monotonic())
        if wait_s is None:
            # No open batch: poll() hands over the first record the moment it arrives, which
            # starts the batch's deadline clock on time.
            message = self._consumer.poll(IDLE_POLL_S)
            messages = [] if message is None else [message]
        else:
            # An open batch: fill it, but never past its cap and never past its deadline.
            messages = self._consumer.consume(self._batcher.room, wait_s)
        if messages:
            self._accept(messages, time.monotonic())
        due = self._batcher.take_due(time.monotonic())
        if due is not None:
            self._process(due)
        self._sink.poll()
        self._store_offsets()

    def _accept(self, messages: list[Message], now_s: float) -> None:
        accepted = 0
        for message in messages:
            error = message.error()
            if error is not None:
                self._on_consume_error(error, message)
                continue
            accepted += 1
            self._tracker.track(*_position(message))
            try:
                transaction = decode_transaction(message.value())
            except RecordError as exc:
                self._dead_letter(message, exc)
                continue
            full = self._batcher.add(PendingRecord(message, transaction), now_s)
            if full is not None:
                self._process(full)
        metrics.record_consumed(accepted)
        metrics.set_in_flight(self._tracker.in_flight)

    def _on_consume_error(self, error: KafkaError, message: Message) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            return
        log.error(
            "consume error topic=%s partition=%s code=%s: %s",
            message.topic(), message.partition(), error.name(), error.str(),
        )  # fmt: skip
        if error.fatal():
            self._fail(DeliveryError(f"fatal consumer error: {error.str()}"), [])

    # -- score and produce ------------------------------------------------------------------

    def _process(self, batch: Batch[PendingRecord]) -> None:
        records = batch.items
        transactions = [r.transaction for r in records]
        features = build_features(TransactionColumns.from_transactions(transactions))
        started = time.perf_counter()
        try:
            scores = self._scorer.score(features)
        except ScoreError as exc:
            log.error("scoring failed for a batch of %s records: %s", len(records), exc)
            for record in records:
                self._dead_letter(record.message, exc)
            return
        inference_s = time.perf_counter() - started
        metrics.record_batch(len(records), batch.wait_s, inference_s)

        ok = valid_scores(scores) if len(scores) == len(records) else np.zeros(len(records), bool)
        if not ok.all():
            for record, score in zip(records, scores, strict=False):
                self._dead_letter(record.message, ScoreError(f"model returned score {score!r}"))
            return
        decided_at = _now_ms()
        labels = classify(scores, self._thresholds)
        group = OutcomeGroup(
            self._tracker,
            [_position(r.message) for r in records],
            len(records),
            _count_decisions,
            self._fail,
        )
        model_version = self._scorer.model_version
        topic = self._config.output_topic
        send = self._sink.send
        for record, score, label in zip(records, scores.tolist(), labels, strict=True):
            t = record.transaction
            decision = Decision(
                transaction_id=t.transaction_id,
                card_id=t.card_id,
                score=score,
                decision=label,
                model_version=model_version,
                degraded=False,
                event_time=t.event_time,
                decided_at=decided_at,
            )
            send(topic, t.card_id.encode(), encode_decision(decision), group.expect(label))
        metrics.record_latencies([(decided_at - t.event_time) / 1000.0 for t in transactions])

    def _dead_letter(self, message: Message, error: RecordError) -> None:
        source = _source_of(message)
        reason = error.reason
        log.warning(
            "dead-lettering topic=%s partition=%s offset=%s reason=%s: %s",
            source.topic, source.partition, source.offset, reason, error,
        )  # fmt: skip
        # A decode or validation message says all there is; a trace helps where code failed.
        scoring = isinstance(error, ScoreError)
        headers = dead_letter_headers(
            source,
            error,
            reason=reason,
            attempts=1,
            service=self._service_name,
            failed_at_ms=_now_ms(),
            model_version=self._scorer.model_version if scoring else None,
            with_stacktrace=scoring,
        )
        group = OutcomeGroup(
            self._tracker,
            [_position(message)],
            1,
            lambda _labels: metrics.record_dead_letter_delivered(reason),
            self._fail,
        )
        self._sink.send(
            self._config.dlq_topic, source.key, source.value, group.expect(reason), headers
        )

    def _fail(self, error: DeliveryError, sources: list[SourceOffset]) -> None:
        """An output was not delivered: stop without committing the records it covered."""
        where = ", ".join(f"{t}[{p}]@{o}" for (t, p), o in sources[:5])
        log.error("delivery failed, stopping without committing %s: %s", where or "-", error)
        if self._failure is None:
            self._failure = error
        self._stopping.set()

    # -- offsets, rebalance, shutdown -------------------------------------------------------

    def _store_offsets(self) -> None:
        positions = self._tracker.take_commit_positions()
        if positions:
            self._consumer.store_offsets(
                offsets=[TopicPartition(t, p, o) for (t, p), o in positions.items()]
            )
        metrics.set_in_flight(self._tracker.in_flight)

    def _drain_outputs(self) -> None:
        """Score the open batch and wait for every output to be acknowledged."""
        batch = self._batcher.drain(time.monotonic())
        if batch is not None and self._failure is None:
            self._process(batch)
        left = self._sink.flush(self._config.shutdown_timeout_s)
        if left:
            log.error(
                "%s outputs not acknowledged after %ss", left, self._config.shutdown_timeout_s
            )
        self._store_offsets()

    def _commit(self) -> None:
        try:
            self._consumer.commit(asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._NO_OFFSET:  # nothing new stored: benign
                log.warning("commit failed, the next commit will cover it: %s", exc)

    def _on_assign(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        log.info("assigned %s", _describe(partitions))

    def _on_revoke(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        log.info("revoked %s: finishing their records before letting go", _describe(partitions))
        self._drain_outputs()
        self._commit()
        self._tracker.forget(_keys(partitions))

    def _on_lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        log.warning("lost %s: nothing of them will be committed", _describe(partitions))
        self._tracker.forget(_keys(partitions))

    def _shut_down(self) -> None:
        self._drain_outputs()
        # Only acknowledged records were stored, so committing is right even after a failure.
        self._commit()
        self._consumer.close()
        log.info("stopped; in-flight records left uncommitted: %s", self._tracker.in_flight)


def _count_decisions(labels: Counter[str]) -> None:
    for label, count in labels.items():
        metrics.record_decisions_delivered(label, count)


def _keys(partitions: list[TopicPartition]) -> list[PartitionKey]:
    return [(p.topic, p.partition) for p in partitions]


def _describe(partitions: list[TopicPartition]) -> str:
    return ", ".join(f"{p.topic}[{p.partition}]" for p in partitions) or "nothing"
