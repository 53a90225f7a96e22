"""One replica: consume → decode + validate → micro-batch → hand off → score → produce →
commit, with backpressure, rebalance handling and a graceful stop.

Two threads share the work. The consuming thread (the caller of `run`) owns the consumer: it
polls, decodes, dead-letters invalid records, forms batches and hands them to the scoring
thread through a bounded queue (`stream/scoring.py`). Offsets are stored only for records
whose outputs the broker acknowledged (`stream/offsets.py`); librdkafka commits what is stored.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from deadletter.policy import RetryPolicy
from deadletter.router import DeadLetterRouter, position_of
from scorer.decisions import Thresholds
from scorer.model import Scorer
from stream import metrics
from stream.batcher import Batch, MicroBatcher
from stream.config import ServiceConfig
from stream.controller import BatchSizeController
from stream.errors import DeliveryError, RecordError
from stream.flow import FlowControl
from stream.health import HealthState
from stream.lag import LagMonitor
from stream.offsets import OffsetTracker, PartitionKey, SourceOffset
from stream.outcomes import OutcomeGroup
from stream.redelivery import Redelivery
from stream.scoring import BatchReport, BatchScorer, PendingRecord, ScoringWorker, count_delivered
from stream.sink import KafkaSink, Output
from stream.transaction import decode_transaction

log = logging.getLogger(__name__)

#: How long one idle poll blocks: bounds how late a stop request is noticed.
IDLE_POLL_S = 0.1
#: Granularity of waits for the scoring thread (rebalance, shutdown).
WAIT_STEP_S = 0.005

Handoff = queue.Queue[Batch[PendingRecord] | None]


class ScoringService:
    """Runs one replica until `stop()`; then drains, commits and closes the consumer."""

    def __init__(
        self,
        config: ServiceConfig,
        consumer: Consumer,
        producer: Producer,
        scorer: Scorer,
        health: HealthState,
        lag: LagMonitor,
        delivery_timeout_s: float,
    ) -> None:
        self._config = config
        self._consumer = consumer
        self._sink = sink = KafkaSink(producer, self._on_delivery_failure)
        self._health = health
        self._lag = lag
        self._tracker = OffsetTracker()
        self._router = DeadLetterRouter(config.dlq_topic, f"{config.group_id}/{config.instance_id}")
        self._redelivery = Redelivery(
            sink,
            RetryPolicy(
                config.delivery_attempts,
                config.retry_backoff_ms / 1000.0,
                config.retry_backoff_max_ms / 1000.0,
            ),
            self._router,
            delivery_timeout_s,
        )
        self._controller = (
            BatchSizeController(config.slo_ms, config.min_batch_size, config.max_batch_size)
            if config.slo_ms
            else None
        )
        initial_cap = self._controller.cap if self._controller else config.max_batch_size
        self._batcher: MicroBatcher[PendingRecord] = MicroBatcher(initial_cap, config.max_wait_ms)
        metrics.set_batch_cap(initial_cap)
        self._flow = FlowControl(consumer, config.max_in_flight_records)
        self._handoff: Handoff = queue.Queue(maxsize=config.handoff_batches)
        self._parked: deque[Batch[PendingRecord]] = deque()
        self._worker = ScoringWorker(
            self._handoff,
            BatchScorer(
                scorer,
                sink,
                self._tracker,
                self._router,
                output_topic=config.output_topic,
                thresholds=Thresholds(config.review_threshold, config.decline_threshold),
                decision_deadline_ms=config.decision_deadline_ms,
                late_policy=config.late_policy,
            ),
            sink,
            self._redelivery,
            config.retry_backoff_max_ms / 1000.0,
            self._adapt,
            scorer.warm_up,
        )
        self._stopping = threading.Event()

    def stop(self) -> None:
        """Ask the replica to drain and exit (safe from a signal handler)."""
        self._stopping.set()

    @property
    def failure(self) -> BaseException | None:
        """What stopped the replica abnormally, if anything."""
        return self._worker.error

    def run(self) -> None:
        """Warm the model up, subscribe and process until stopped; then drain, commit and close
        the consumer."""
        self._worker.start()
        self._worker.warmed_up.wait()
        self._consumer.subscribe(
            [self._config.input_topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )  # fmt: skip
        log.info(
            "consuming topic=%s group=%s max_batch_size=%s max_wait_ms=%s max_in_flight=%s",
            self._config.input_topic, self._config.group_id, self._batcher.cap,
            self._config.max_wait_ms, self._config.max_in_flight_records,
        )  # fmt: skip
        try:
            while not self._stopping.is_set() and self._worker.error is None:
                self._health.beat()
                self._step()
        finally:
            self._health.set_ready(False, "shutting down")
            self._shut_down()

    # -- the consuming thread -------------------------------------------------------------

    def _step(self) -> None:
        stalled = self._redelivery.stalled
        self._health.set_ready(not stalled, "outputs cannot be delivered; fetching stopped")
        self._flow.update(self._tracker.in_flight, "deliveries stalled" if stalled else None)
        if self._parked and not stalled:
            # The scoring thread is a batch behind: wait for room rather than fetch more.
            # librdkafka's own pre-fetch queue is bounded, so waiting costs no memory; pausing
            # would throw that queue away and fetch it again.
            self._wait_for_handoff_room()
            self._sink.poll()
            self._store_offsets()
            return
        room = min(self._batcher.room, self._flow.high_water - self._tracker.in_flight)
        wait_s = self._batcher.seconds_until_due(time.monotonic())
        if self._flow.paused or room <= 0 or wait_s is None:
            # poll() hands over a first record the moment it arrives, which starts the batch's
            # deadline on time; paused partitions return nothing, but callbacks are served.
            message = self._consumer.poll(IDLE_POLL_S if wait_s is None else wait_s)
            messages = [] if message is None else [message]
        else:
            # An open batch: fill it, never past its cap, its deadline or the in-flight bound.
            messages = self._consumer.consume(room, wait_s)
        if messages:
            self._accept(messages, time.monotonic())
        due = self._batcher.take_due(time.monotonic())
        if due is not None:
            self._hand_off(due)
        self._sink.poll()
        self._store_offsets()

    def _accept(self, messages: list[Message], now_s: float) -> None:
        records: list[tuple[Message, SourceOffset]] = []
        for message in messages:
            error = message.error()
            if error is not None:
                self._on_consume_error(error, message)
                continue
            records.append((message, position_of(message)))
        # Every record is tracked before any of its outputs exists: the scoring thread may
        # deliver a batch's outputs while this loop is still going.
        self._tracker.track_all([position for _, position in records])
        for message, position in records:
            try:
                transaction = decode_transaction(message.value())
            except RecordError as exc:
                self._dead_letter(message, position, exc)
                continue
            full = self._batcher.add(PendingRecord(message, transaction, position), now_s)
            if full is not None:
                self._hand_off(full)
        metrics.record_consumed(len(records))

    def _on_consume_error(self, error: KafkaError, message: Message) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            return
        log.error(
            "consume error topic=%s partition=%s code=%s: %s",
            message.topic(), message.partition(), error.name(), error.str(),
        )  # fmt: skip
        if error.fatal():
            raise KafkaException(error)

    def _on_delivery_failure(self, output: Output, error: DeliveryError) -> None:
        self._redelivery.failed(output, error)

    def _dead_letter(self, message: Message, position: SourceOffset, error: RecordError) -> None:
        (topic, partition), offset = position
        log.warning(
            "dead-lettering topic=%s partition=%s offset=%s reason=%s: %s",
            topic, partition, offset, error.reason, error,
        )  # fmt: skip
        group = OutcomeGroup(
            self._tracker, [position], Counter({("dead_letter", error.reason): 1}),
            count_delivered,
        )  # fmt: skip
        self._sink.send(self._router.dead_letter(message, error, group))

    def _hand_off(self, batch: Batch[PendingRecord]) -> None:
        if not self._parked:
            try:
                self._handoff.put_nowait(batch)
                return
            except queue.Full:
                pass
        # The scoring thread is behind: keep the batch here and stop fetching until it catches up.
        self._parked.append(batch)

    def _release_parked(self) -> None:
        while self._parked:
            try:
                self._handoff.put_nowait(self._parked[0])
            except queue.Full:
                return
            self._parked.popleft()

    def _wait_for_handoff_room(self) -> None:
        try:
            self._handoff.put(self._parked[0], timeout=IDLE_POLL_S)
        except queue.Full:
            return
        self._parked.popleft()
        self._release_parked()

    def _store_offsets(self) -> None:
        positions = self._tracker.take_commit_positions()
        if positions:
            self._consumer.store_offsets(
                offsets=[TopicPartition(t, p, o) for (t, p), o in positions.items()]
            )
        metrics.set_in_flight(self._tracker.in_flight)

    def _commit(self) -> None:
        self._store_offsets()
        try:
            self._consumer.commit(asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._NO_OFFSET:  # nothing new stored: benign
                log.warning("commit failed, the next commit will cover it: %s", exc)

    # -- adaptation (called on the scoring thread) ---------------------------------------

    def _adapt(self, report: BatchReport) -> None:
        if self._controller is None:
            return
        old = self._controller.cap
        new = self._controller.observe(report.latency_s, report.closed_full, self._lag.total)
        if new is not None:
            self._batcher.set_cap(new)
            metrics.set_batch_cap(new, "up" if new > old else "down")
            log.info("batch cap %s -> %s (batch latency %.1f ms)", old, new, report.latency_s * 1e3)

    # -- rebalance (called on the consuming thread, inside poll) -------------------------

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("assigned %s", _describe(partitions))
        self._flow.on_assign(partitions)

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = {(p.topic, p.partition) for p in partitions}
        released = self._release_records(keys)
        log.info(
            "revoked %s: releasing %s undecided records, committing what was decided",
            _describe(partitions), released,
        )  # fmt: skip
        deadline = time.monotonic() + self._config.shutdown_timeout_s
        self._wait_for_scoring(deadline)
        self._sink.flush(max(0.0, deadline - time.monotonic()))
        self._commit()
        self._forget(keys, partitions)

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = {(p.topic, p.partition) for p in partitions}
        released = self._release_records(keys)
        log.warning(
            "lost %s: %s undecided records released, nothing of them is committed",
            _describe(partitions), released,
        )  # fmt: skip
        self._forget(keys, partitions)

    def _release_records(self, keys: set[PartitionKey]) -> int:
        """Drop not-yet-scored records of these partitions (their new owner re-reads them)."""

        def revoked(record: PendingRecord) -> bool:
            return record.position[0] in keys

        released = self._batcher.discard(revoked)
        with self._handoff.mutex:
            waiting = [b for b in self._handoff.queue if b is not None]
        for batch in [*self._parked, *waiting]:
            kept = [r for r in batch.items if not revoked(r)]
            released += len(batch.items) - len(kept)
            batch.items[:] = kept  # the scoring thread skips a batch left empty
        while self._parked and not self._parked[0].items:
            self._parked.popleft()
        return released

    def _forget(self, keys: set[PartitionKey], partitions: list[TopicPartition]) -> None:
        self._tracker.forget(keys)
        self._flow.on_revoke(partitions)
        self._lag.forget(sorted(keys))

    def _wait_for_scoring(self, deadline: float) -> None:
        """Wait until every handed-off batch is scored and sent (or the deadline passes)."""
        while self._handoff.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(WAIT_STEP_S)

    # -- shutdown ---------------------------------------------------------------------------

    def _shut_down(self) -> None:
        deadline = time.monotonic() + self._config.shutdown_timeout_s
        if self._worker.error is None:
            last = self._batcher.drain(time.monotonic())
            if last is not None:
                self._hand_off(last)
            self._until(deadline, self._all_parked_handed_off)
            self._until(deadline, self._put_end_marker)
        self._worker.stop_retrying()
        self._worker.join(max(0.0, deadline - time.monotonic()))
        left = self._sink.flush(max(0.0, deadline - time.monotonic()))
        if left or self._worker.is_alive():
            log.error(
                "stop grace period (%ss) over: %s outputs unacknowledged; their records stay "
                "uncommitted and will be re-read", self._config.shutdown_timeout_s, left,
            )  # fmt: skip
        # Only acknowledged records were stored, so committing is right whatever happened.
        self._commit()
        self._consumer.close()
        log.info("stopped; records left uncommitted: %s", self._tracker.in_flight)

    def _all_parked_handed_off(self) -> bool:
        self._release_parked()
        return not self._parked

    def _put_end_marker(self) -> bool:
        try:
            self._handoff.put_nowait(None)
            return True
        except queue.Full:
            return False

    @staticmethod
    def _until(deadline: float, done: Callable[[], bool]) -> None:
        while not done() and time.monotonic() < deadline:
            time.sleep(WAIT_STEP_S)


def _describe(partitions: list[TopicPartition]) -> str:
    return ", ".join(f"{p.topic}[{p.partition}]" for p in partitions) or "nothing"
