"""One replica: consume → decode + validate → micro-batch → score → produce → commit, with
backpressure and a graceful stop; rebalances are `stream/rebalance.py`'s, and what it waits for
before it joins its group (the control topics, the card state's warm-up)
`stream/before_joining.py`'s.

The consuming thread (the caller of `run`) owns the consumer: it polls, decodes, dead-letters
invalid records, forms batches and scores them itself, or hands them to the scoring thread
(`stream/scoring_thread.py` says which, when). Offsets are stored only for records whose outputs
the broker acknowledged (`contracts/offsets.py`); librdkafka commits what is stored.

The consumer is polled on every pass of the loop, whatever else happens: while fetching must
stop (outputs failing, the scoring thread stuck, the in-flight bound reached) its partitions are
paused, so a poll only serves rebalances and keeps the replica in its group.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

from confluent_kafka import KafkaError, KafkaException, Message

from contracts.offsets import PartitionKey, SourceOffset, position_of
from contracts.transaction import Transaction
from plumbing.errors import DecodeError, RecordError, RegistryUnavailableError
from plumbing.kafka_errors import ACCESS_DENIED
from stream.batcher import Batch, MicroBatcher
from stream.before_joining import wait_for_control_topics, warm_up_card_history
from stream.commits import Commits, StoredOffsets, TransactionCommits, committed_positions
from stream.controller import BatchSizeController
from stream.flow import FlowControl
from stream.handoff import Handoff
from stream.held_partitions import HeldPartitions
from stream.outcomes import OutcomeGroup
from stream.pending_record import PendingRecord
from stream.rebalance import Rebalance, describe
from stream.scoring import BatchReport
from stream.scoring_thread import ScoringThread
from stream.sink import Output
from stream.startup.config import ScorerSettings
from stream.startup.wiring import Collaborators, batch_scorer
from stream.worker_alignment import HeldForWorker

log = logging.getLogger(__name__)

#: How long one idle poll blocks: bounds how late a stop request is noticed.
IDLE_POLL_S = 0.1
#: How long the consuming thread waits for a scoring thread that is a batch behind before it
#: pauses its partitions and goes back to polling. Short waits are the normal rhythm of a
#: backlog (pausing would throw librdkafka's pre-fetched records away); a long one means the
#: scoring thread is stuck, and the group must not evict this replica for silence.
HANDOFF_WAIT_MAX_S = 1.0


class ScoringService:
    """Runs one replica until `stop()`; then drains, commits and closes the consumer.

    The outside world (consumer, sink, scorer, health, lag) comes in `Collaborators`; the rest
    is built here from the configuration.
    """

    def __init__(self, config: ScorerSettings, parts: Collaborators) -> None:
        self._config = config
        self._consumer = parts.consumer
        self._sink = parts.sink
        self._health = parts.health
        self._lag = parts.lag
        self._redelivery = parts.redelivery
        self._router = parts.router
        self._tracker = parts.tracker
        self._metrics = parts.metrics
        self._transactions = parts.transactions
        self._card_history = parts.card_history
        self._terminals = parts.terminals
        self._card_frauds = parts.card_frauds
        self._rules = parts.rules
        self._reloader = parts.reloader
        self._shadow = parts.shadow
        self._observed_precision = parts.observed_precision
        self._tracer = parts.tracer
        self._client_errors = parts.client_errors
        #: FRAUD_WAIT_FOR_WORKER=on: batches waiting for the features worker (in flight).
        self._held_for_worker = HeldForWorker(parts.worker_alignment)
        #: Why the broker refuses to let this replica consume (an ACL), while it does.
        self._access_denied: str | None = None
        self._commits: Commits = (
            StoredOffsets(parts.consumer, parts.tracker)
            if parts.transactions is None
            else TransactionCommits(parts.transactions)
        )
        #: Exactly-once: a transaction was aborted; the consumer must go back to the commit.
        self._rewind_pending = False
        self._controller = (
            BatchSizeController(config.slo_ms, config.min_batch_size, config.max_batch_size)
            if config.slo_ms
            else None
        )
        initial_cap = self._controller.cap if self._controller else config.max_batch_size
        self._batcher: MicroBatcher[PendingRecord] = MicroBatcher(initial_cap, config.max_wait_ms)
        self._metrics.set_batch_cap(initial_cap)
        self._flow = FlowControl(
            parts.consumer,
            config.max_in_flight_records,
            config.max_in_flight_bytes,
            parts.metrics,
        )
        self._decode = parts.decode
        self._held = HeldPartitions(
            parts.consumer,
            config.retry_backoff_ms / 1000.0,
            config.retry_backoff_max_ms / 1000.0,
            parts.metrics,
        )
        self._handoff: Handoff[PendingRecord] = Handoff(config.handoff_batches)
        self._scoring_thread = ScoringThread(
            self._handoff,
            batch_scorer(config, parts),
            parts.sink,
            parts.redelivery,
            config.retry_backoff_max_ms / 1000.0,
            self._adapt,
            parts.scorer.warm_up,
            inline=config.scoring == "inline",
        )
        self._stopping = threading.Event()
        self._handoff_full_since: float | None = None
        self._rebalance = Rebalance(
            parts.consumer,
            config.input_topic,
            config.shutdown_timeout_s,
            flow=self._flow,
            held=self._held,
            handoff=self._handoff,
            sink=parts.sink,
            tracker=parts.tracker,
            lag=parts.lag,
            metrics=parts.metrics,
            card_history=parts.card_history,
            transactions=parts.transactions,
            release_records=self._release_records,
            commit=self._commit,
            request_rewind=self._request_rewind,
        )

    def stop(self) -> None:
        """Ask the replica to drain and exit (safe from a signal handler)."""
        self._stopping.set()

    @property
    def failure(self) -> BaseException | None:
        """What stopped the replica abnormally, if anything."""
        return self._scoring_thread.error

    def run(self) -> None:
        """Warm the model up, subscribe and process until stopped; then drain, commit and close
        the consumer."""
        if self._config.scoring == "inline":
            self._scoring_thread.warm_up_here()
        self._scoring_thread.start()
        self._scoring_thread.warmed_up.wait()
        if self._transactions is not None:
            self._transactions.initialize(self._config.shutdown_timeout_s)
        if self._reloader is not None:
            self._reloader.start()
        if self._shadow is not None:
            self._shadow.start()
        if self._observed_precision is not None:
            self._observed_precision.start()
        wait_for_control_topics(
            [
                ("the rules topic", self._rules),
                ("terminal-risk", self._terminals),
                ("card-frauds", self._card_frauds),
            ],
            self._health,
            self._stopping,
            timeout_s=self._config.terminal_risk_load_timeout_s,
            poll_s=IDLE_POLL_S,
        )
        if self._card_history is not None and self._config.state_warm_up == "on":
            warm_up_card_history(self._card_history, self._health, self._stopping)
        self._consumer.subscribe(
            [self._config.input_topic],
            on_assign=self._rebalance.on_assign,
            on_revoke=self._rebalance.on_revoke,
            on_lost=self._rebalance.on_lost,
        )
        log.info("consuming topic=%s group=%s", self._config.input_topic, self._config.group_id)
        try:
            while not self._stopping.is_set() and self._scoring_thread.error is None:
                self._step()
        finally:
            self._health.set_ready(False, "shutting down")
            self._shut_down()

    # -- the consuming thread -------------------------------------------------------------

    def _step(self) -> None:
        """One pass: apply backpressure, fetch, decode and batch, hand off, commit."""
        self._health.beat()
        if self._client_errors is not None:
            self._client_errors.raise_if_failed()
        self._rebalance.resume_restored()
        if self._rewind_pending:
            self._rewind()
        self._apply_backpressure()
        if not self._flow.paused and self._handoff.full:
            self._wait_for_scoring_thread()
        else:
            self._accept(self._fetch())
            self._held_for_worker.release(self._hand_off)
            if not self._held_for_worker:
                due = self._batcher.take_due(time.monotonic())
                if due is not None:
                    self._held_for_worker.offer(due, self._hand_off)
        self._sink.poll()
        self._record_progress()

    def _hand_off(self, batch: Batch[PendingRecord]) -> None:
        """Score a closed batch here, or queue it for the scoring thread
        (`stream/scoring_thread.py`)."""
        if not self._scoring_thread.score_inline(batch):
            self._handoff.offer(batch)

    def _apply_backpressure(self) -> None:
        uncommitted = self._transactions is not None and self._transactions.stalled
        stalled = self._redelivery.stalled or uncommitted  # exactly-once: the commit delivers
        if self._access_denied is not None:
            self._health.set_ready(False, self._access_denied)
        else:
            self._health.set_ready(not stalled, "outputs cannot be delivered; fetching stopped")
        blocked_by = None
        if uncommitted:
            blocked_by = "transaction commit or abort not confirmed, retrying"
        elif self._redelivery.busy or stalled:
            blocked_by = "outputs not acknowledged, retrying"
        elif (
            self._handoff_full_since is not None
            and time.monotonic() - self._handoff_full_since >= HANDOFF_WAIT_MAX_S
        ):
            blocked_by = "scoring thread busy"
        self._flow.update(self._tracker.in_flight, self._tracker.in_flight_bytes, blocked_by)
        self._held.release_due(self._flow.paused)

    def _wait_for_scoring_thread(self) -> None:
        """The scoring thread is a batch behind: wait a moment for room rather than fetch more."""
        now = time.monotonic()
        since = self._handoff_full_since = self._handoff_full_since or now
        wait_s = min(IDLE_POLL_S, since + HANDOFF_WAIT_MAX_S - now)
        if self._handoff.wait_for_room(wait_s):
            self._handoff_full_since = None

    def _fetch(self) -> list[Message]:
        if not self._handoff.full:
            self._handoff_full_since = None
        tracker = self._tracker
        room = min(self._batcher.room, self._flow.room(tracker.in_flight, tracker.in_flight_bytes))
        wait_s = self._batcher.seconds_until_due(time.monotonic())
        if self._held_for_worker:
            wait_s = IDLE_POLL_S  # whatever else is due waits behind the held batch
        if self._flow.paused or room <= 0 or wait_s is None:
            # poll() hands over a first record the moment it arrives, which starts the batch's
            # deadline on time; paused partitions return nothing, but callbacks are served.
            message = self._consumer.poll(IDLE_POLL_S if wait_s is None else wait_s)
            return [] if message is None else [message]
        # An open batch: fill it, never past its cap, its deadline or the in-flight bound.
        return self._consumer.consume(room, wait_s)

    def _accept(self, messages: list[Message]) -> None:
        if not messages:
            return
        now_s = time.monotonic()
        records: list[Message] = []
        positions: list[SourceOffset] = []
        decoded: list[Transaction | RecordError] = []
        restoring, rewound = self._rebalance.restoring, set[PartitionKey]()
        for message in messages:
            error = message.error()
            if error is not None:
                self._on_consume_error(error, message)
                continue
            position = position_of(message)
            key = position[0]
            if key in self._held:
                continue  # read again from the held record once its hold ends
            if restoring and key in restoring:
                if key not in rewound:  # the partition's first record in this fetch
                    self._rebalance.rewind_restoring(position)
                    rewound.add(key)
                continue
            try:
                decoded.append(self._decode(message.value()))
                self._held.decoded(key)
            except RegistryUnavailableError as exc:
                self._held.hold(message, exc)
                continue
            except RecordError as exc:
                decoded.append(exc)
            except Exception as exc:  # whatever a record provokes, it never stops the loop
                decoded.append(DecodeError(f"{type(exc).__name__}: {exc}"))
            records.append(message)
            positions.append(position)
        if records:
            self._access_denied = None
        sizes = [len(m.value() or b"") + len(m.key() or b"") for m in records]
        # Every record is tracked before any of its outputs exists: the scoring thread may
        # deliver a batch's outputs while this loop is still going.
        self._tracker.track_all(positions, sizes)
        self._flow.observe(len(sizes), sum(sizes))
        for message, position, result in zip(records, positions, decoded, strict=True):
            if isinstance(result, RecordError):
                self._dead_letter(message, position, result)
                continue
            full = self._batcher.add(PendingRecord(message, result, position), now_s)
            if full is not None:
                self._held_for_worker.offer(full, self._hand_off)
        self._metrics.record_consumed(len(records))

    def _on_consume_error(self, error: KafkaError, message: Message) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            return
        if error.code() in ACCESS_DENIED:
            self._access_denied = f"not authorized to consume ({error.name()}: {error.str()})"
        where = f"topic={message.topic()} partition={message.partition()}"
        log.error("consume error %s code=%s: %s", where, error.name(), error.str())
        if error.fatal():
            raise KafkaException(error)

    def _dead_letter(self, message: Message, position: SourceOffset, error: RecordError) -> None:
        (topic, partition), offset = position
        where = f"topic={topic} partition={partition} offset={offset}"
        log.warning("dead-lettering %s reason=%s: %s", where, error.reason, error)
        labels = Counter({("dead_letter", error.reason): 1})
        group = OutcomeGroup(self._tracker, [position], labels, self._metrics.count_delivered)
        letter = self._router.dead_letter(message, error)
        self._sink.send(Output.dead_letter(letter, message, group))

    def _record_progress(self) -> None:
        self._rewind_pending |= self._commits.record_progress()  # True: a transaction aborted
        self._metrics.set_in_flight(self._tracker.in_flight, self._tracker.in_flight_bytes)

    def _commit(self) -> bool:
        """Commit now what is finished (rebalance, shutdown); return whether nothing sent waits
        to be sent again or to be undone by an abort (the card state is all durable)."""
        self._rewind_pending |= self._commits.commit_now()
        return not self._rewind_pending and not self._redelivery.busy

    def _rewind(self) -> None:
        """Exactly-once, once the abort is confirmed (fetching waits meanwhile): drop what is
        held and go back to the committed offsets; what followed is decided again."""
        if self._transactions is None or not self._transactions.confirm_abort():
            return
        assignment = self._consumer.assignment()
        committed = committed_positions(self._consumer, assignment)
        if committed is None:  # asked again next pass; the loop (and /healthz) goes on
            return
        released = self._release_records({(tp.topic, tp.partition) for tp in assignment})
        self._handoff.wait_until_done(time.monotonic() + self._config.shutdown_timeout_s)
        self._tracker.forget([(tp.topic, tp.partition) for tp in assignment])
        for position in committed:
            self._consumer.seek(position)
        if self._card_history is not None:
            # The aborted updates never reached the changelog: undo them.
            positions = {tp.partition: max(tp.offset, -1) for tp in committed}
            self._card_history.rollback(positions, self._health.beat)
        self._transactions.end_rewind()
        self._rewind_pending = False
        log.warning(
            "rewound %s to the committed offsets (%s undecided records dropped): what followed "
            "the last commit is decided again",
            describe(assignment),
            released,
        )

    # -- adaptation (called by whichever thread scored the batch) ------------------------

    def _adapt(self, report: BatchReport) -> None:
        if self._controller is None:
            return
        old = self._controller.cap
        new = self._controller.observe(report.latency_s, report.closed_full, self._lag.total)
        if new is not None:
            self._batcher.set_cap(new)
            self._metrics.set_batch_cap(new, "up" if new > old else "down")
            log.info("batch cap %s -> %s (batch latency %.1f ms)", old, new, report.latency_s * 1e3)

    def _request_rewind(self) -> None:
        self._rewind_pending = True

    def _release_records(self, keys: set[PartitionKey]) -> int:
        """Drop not-yet-scored records of these partitions (their new owner re-reads them)."""

        def revoked(record: PendingRecord) -> bool:
            return record.position[0] in keys

        released = self._batcher.discard(revoked) + self._handoff.discard(revoked)
        return released + self._held_for_worker.discard(revoked)

    # -- shutdown ---------------------------------------------------------------------------

    def _shut_down(self) -> None:
        """Score what is held, wait for its outputs, commit and close, all within one
        `shutdown_timeout_s`."""
        deadline = time.monotonic() + self._config.shutdown_timeout_s
        self._rebalance.shutting_down(deadline)
        if self._held_for_worker:  # never scored ahead of the worker, not even to stop
            log.info("%s records held for the worker: uncommitted", self._held_for_worker.records)
        elif self._scoring_thread.error is None:
            last = self._batcher.drain(time.monotonic())
            if last is not None:
                self._hand_off(last)
        self._handoff.close()
        self._scoring_thread.stop_retrying()
        self._scoring_thread.join(max(0.0, deadline - time.monotonic()))
        left = self._sink.flush(max(0.0, deadline - time.monotonic()))
        if left or self._scoring_thread.is_alive():
            log.error(
                "stop grace period (%ss) over: %s outputs unacknowledged; their records stay "
                "uncommitted and will be re-read",
                self._config.shutdown_timeout_s,
                left,
            )
        if self._reloader is not None:
            self._reloader.stop()
        if self._shadow is not None:
            self._shadow.stop()
        self._rebalance.stop()
        # Only acknowledged records were stored, so committing is right whatever happened.
        self._commit()
        self._consumer.close()
        if self._terminals is not None:
            self._terminals.close()
        if self._card_frauds is not None:
            self._card_frauds.close()
        if self._rules is not None:
            self._rules.close()
        if self._observed_precision is not None:
            self._observed_precision.close()
        if self._tracer is not None:
            self._tracer.close()  # the last batches' spans, which the exporter still holds
        log.info(
            "stopped; records left uncommitted: %s",
            self._rebalance.abandoned + self._tracker.in_flight,
        )
