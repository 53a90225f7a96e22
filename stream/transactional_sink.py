"""Exactly-once: outputs and input offsets committed together in Kafka transactions.

`TransactionalSink` is the `OutputSink` of a replica in exactly-once mode. Its responsibilities:
- write every output into the open transaction, begun on the first output after a commit,
  one writer at a time (a lock: the scoring thread may write while the consuming thread commits);
- count a record as finished once librdkafka has accepted its outputs: the transaction commit,
  not a delivery report, makes them durable, so outcome groups complete at once;
- commit (`commit_if_due`, `commit`): the offsets the tracker says are finished are sent with the
  consumer's group metadata (KIP-447: a zombie whose group generation is stale is fenced), then
  the transaction is committed, every `commit_interval_s` or at `max_records` records;
- on failure: retry what librdkafka calls retriable, abort what requires it (`TransactionAborted`:
  the caller rewinds the consumer to the committed offsets and reads again), raise what is
  fatal (another replica took over this transactional id: the process must restart); an abort
  that times out is tried again (`confirm_abort`) before the rewind ends;
- after the cluster went away (every broker down, `cluster_lost`), replace the producer at the
  next commit and read again from the committed offsets, instead of trusting the old one:
  librdkafka then blocked in send_offsets_to_transaction() past its timeout, on a group
  coordinator it had cached (librdkafka #5456, #5511), until the replica was restarted. The
  new producer's init_transactions() fences the old one and aborts what it left open. An
  abort the broker refuses as INVALID_TXN_STATE (librdkafka #4849, fatal for the producer but
  not a takeover) replaces the producer the same way;
- send a replacement for an output the broker refused for itself (`stream/refusals.py`);
- never commit an outcome past the offsets committed with it (`stream/outcome_order.py`: a
  record's own dead letter waits for the records before it; a commit that would fall inside a
  batch's outputs waits for the next pass, and one that must happen now, on a revoke or at
  shutdown, aborts instead).

Key design decisions:
- Delivery reports come for errors only (`delivery.report.only.error`): a success costs no
  Python callback, and a failure still names its output.
- Between an abort and the end of the rewind (`discarding`), outputs are dropped: their records
  will be read again, and nothing of them may enter the next transaction.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from contracts.offsets import OffsetTracker, PartitionKey, position_of
from deadletter.router import DeadLetterRouter
from plumbing.errors import RecordRejectedError
from plumbing.kafka_errors import translate_kafka_error
from stream.metrics import ServiceMetrics
from stream.outcome_order import OutcomeOrder
from stream.outcomes import OutcomeGroup
from stream.refusals import RefusedOutputs
from stream.sink import Headers, Output, index_of, produce

log = logging.getLogger(__name__)

#: How long one send_offsets / commit / abort call may block before it is retried on a later
#: pass of the loop (which keeps polling meanwhile).
TRANSACTION_CALL_TIMEOUT_S = 10.0


class TransactionAborted(Exception):
    """The open transaction was aborted: every record since the last commit must be read again."""


class TransactionalSink:
    """An `OutputSink` writing into Kafka transactions; see the module docstring."""

    def __init__(
        self,
        new_producer: Callable[[], Producer],
        consumer: Consumer,
        tracker: OffsetTracker,
        router: DeadLetterRouter,
        *,
        commit_interval_s: float,
        max_records: int,
        max_message_bytes: int,
        metrics: ServiceMetrics,
        on_committed: Callable[[dict[PartitionKey, int]], None] = lambda _positions: None,
    ) -> None:
        self._new_producer = new_producer
        self._producer = new_producer()
        #: Set from any thread when every broker went away: the producer is replaced at the
        #: next commit.
        self._cluster_lost = False
        #: Set while a replacement producer's init_transactions() is not confirmed yet.
        self._registering = False
        #: Told the positions of every committed transaction (the lag metric needs them).
        self._on_committed = on_committed
        self._consumer = consumer
        self._tracker = tracker
        self._commit_interval_s = commit_interval_s
        self._max_records = max_records
        self._metrics = metrics
        self._lock = threading.RLock()
        self._open = False
        self._opened_at = 0.0
        self._records = 0
        self._discarding = False
        self._refused = RefusedOutputs(router, max_message_bytes)
        #: Set while a commit failed in a way that may pass: fetching waits for it.
        self.commit_pending = False
        #: Set while an abort timed out: no transaction may begin until it is confirmed.
        self.abort_pending = False
        #: Set when librdkafka refused an output because the open transaction already failed
        #: in the background: nothing more goes into it, and the next commit aborts it.
        self._doomed = False
        self._order = OutcomeOrder(tracker)

    def initialize(self, timeout_s: float) -> None:
        """Register the transactional id with the broker, fencing any older producer that had
        it and aborting what it left open (a replica restarted after a crash)."""
        self._producer.init_transactions(timeout_s)

    def cluster_lost(self) -> None:
        """Every broker went away (a client's error callback, any thread): replace the producer
        at the next commit (see the module docstring)."""
        self._cluster_lost = True

    # -- writing (any thread) -------------------------------------------------------------

    def send(self, output: Output) -> None:
        with self._lock:
            if self._discarding or self._order.hold(output):
                return
            self._write(output)
            self._release_held()

    def send_batch(
        self,
        topic: str,
        keys: list[bytes],
        values: Sequence[bytes | None],
        group: OutcomeGroup,
        output_of: Callable[[int], Output],
        partition: int | None = None,
        *,
        headers: Sequence[Headers | None] | None = None,
    ) -> None:
        # The hot path: one error-only callback shared by the batch, no object per record.
        def report(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                self._on_delivery_error(output_of(index_of(keys, values, message)), error)

        with self._lock:
            if self._discarding:
                return
            self._begin()
            self._order.written(group.sources)
            delivered = group.delivered
            for index, (key, value) in enumerate(zip(keys, values, strict=True)):
                if self._refused:
                    self._produce(self._refused.instead_of_remembered(output_of(index)))
                else:
                    refused = self._try_produce(
                        topic,
                        key,
                        value,
                        None if headers is None else headers[index],
                        report,
                        partition,
                    )
                    if refused is not None:
                        self._produce(self._refused.instead_of_refused(output_of(index), refused))
                delivered()
            self._records += len(values)
            self._release_held()

    def forget(self, partitions: set[PartitionKey]) -> None:
        """Drop what is held for partitions that are gone (their next owner re-reads them)."""
        with self._lock:
            self._order.forget(partitions)
            self._refused.forget(partitions)

    def poll(self) -> None:
        self._producer.poll(0)

    def flush(self, timeout_s: float) -> int:
        """Commit what is open (shutdown, revoke); return how many outputs are not committed:
        those of a transaction that aborted (counted before the abort forgets them), or whose
        commit waits for another try."""
        records = self._records
        try:
            self.commit()
        except (TransactionAborted, KafkaException) as exc:
            log.error("could not commit the last transaction: %s", exc)
            return records
        return self._records if self.commit_pending else 0

    # -- committing (consuming thread) -------------------------------------------------------

    def commit_if_due(self, now: float) -> None:
        """Commit when the transaction has been open `commit_interval_s` or holds `max_records`
        (or a failed commit waits for another try), unless a batch is halfway through its
        outputs: then on a later pass."""
        full = self._records >= self._max_records
        due = self._open and (now - self._opened_at >= self._commit_interval_s or full)
        if self.commit_pending or self._doomed or (due and self._order.covered()):
            self.commit()

    def commit(self) -> None:
        """Send the finished offsets and commit the open transaction.

        Raises TransactionAborted after aborting it (the caller must rewind), and KafkaException
        for a fatal error. A retriable failure leaves `commit_pending` set for the next call.
        """
        with self._lock:
            if self._cluster_lost:
                self._replace_producer("the cluster went away")
                raise TransactionAborted("the producer was replaced after the cluster went away")
            if self._doomed:
                log.warning("the transaction failed in the background: aborting it")
                self.abort()
                raise TransactionAborted("the transaction failed while outputs went into it")
            if not self.commit_pending and not self._order.covered():
                log.warning("the transaction holds outcomes past the finished offsets: aborting")
                self.abort()
                raise TransactionAborted("outcomes past the finished offsets")
            positions = self._tracker.take_commit_positions()
            if not self._open and not positions and not self.commit_pending:
                return
            try:
                if positions:
                    offsets = [TopicPartition(t, p, o) for (t, p), o in positions.items()]
                    self._producer.send_offsets_to_transaction(
                        offsets,
                        self._consumer.consumer_group_metadata(),
                        TRANSACTION_CALL_TIMEOUT_S,
                    )
                self._producer.commit_transaction(TRANSACTION_CALL_TIMEOUT_S)
            except KafkaException as exc:
                self._on_commit_error(cast(KafkaError, exc.args[0]), positions)
                return
            self._open = False
            self._records = 0
            self._order.committed()
            self._refused.committed()
            self.commit_pending = False
            self._metrics.set_delivery_stalled(False)
            self._on_committed(positions)

    def abort(self) -> None:
        """Abort the open transaction (partitions lost) and drop outputs until `end_rewind`."""
        with self._lock:
            started = self._open or self.commit_pending or self.abort_pending
            self._discard_open()
            if started:
                self.abort_pending = True
                self.confirm_abort()

    def confirm_abort(self) -> bool:
        """Whether no abort waits to be confirmed; if one does, try it again now.

        An abort that times out (the broker unreachable) is still under way in librdkafka,
        which refuses to begin another transaction (`_CONFLICT`) until a call of
        abort_transaction() returns: the rewind waits for this to say True.
        """
        with self._lock:
            if self._registering and not self._register():
                return False
            if not self.abort_pending:
                return True
            try:
                self._producer.abort_transaction(TRANSACTION_CALL_TIMEOUT_S)
            except KafkaException as exc:
                error = cast(KafkaError, exc.args[0])
                if error.fatal() and error.code() == KafkaError.INVALID_TXN_STATE:
                    # librdkafka #4849: an abort soon after produce() can be refused so, fatal
                    # for this producer but no sign of another replica (that is PRODUCER_FENCED).
                    self._replace_producer(f"the broker refused the abort ({error.str()})")
                    return not self._registering
                if error.fatal():
                    _log_fatal(error)
                    raise
                if error.retriable():
                    log.warning("abort not confirmed yet (%s): retrying", error.str())
                    self._metrics.set_delivery_stalled(True)
                    return False
                log.error("abort failed, the broker aborts it on timeout: %s", exc)
            self.abort_pending = False
            self._metrics.set_delivery_stalled(False)
            return True

    @property
    def stalled(self) -> bool:
        """Whether outputs cannot be made durable now: a commit or an abort waits for another
        try, or a replacement producer is not registered yet (fetching waits, and the replica
        is not ready)."""
        return self.commit_pending or self.abort_pending or self._registering

    @property
    def rewind_needed(self) -> bool:
        """Whether an abort dropped outputs the consumer must read again: until `end_rewind`
        says it is back at the committed offsets. A revoke's `flush` that aborts says it only
        so."""
        return self._discarding

    def end_rewind(self) -> None:
        """The consumer is back at the committed offsets: accept outputs again."""
        with self._lock:
            self._discarding = False

    # -- internals ---------------------------------------------------------------------------

    def _discard_open(self) -> None:
        """Forget the open transaction's bookkeeping; outputs are dropped until `end_rewind`."""
        self._discarding = True
        self._doomed = False
        self._order.aborted()
        self._refused.aborted()
        self._open = False
        self._records = 0
        self.commit_pending = False

    def _replace_producer(self, reason: str) -> None:
        """Drop the producer without another call that could block, and register a new one:
        its init_transactions() fences the old one and aborts what it left open."""
        self._cluster_lost = False
        log.warning(
            "%s: replacing the transactional producer; what followed the last commit is read again",
            reason,
        )
        self._metrics.record_producer_replaced()
        self._discard_open()
        self.abort_pending = False
        self._producer = self._new_producer()
        self._registering = True
        self._register()

    def _register(self) -> bool:
        """init_transactions() of a replacement producer; whether it is confirmed."""
        try:
            self._producer.init_transactions(TRANSACTION_CALL_TIMEOUT_S)
        except KafkaException as exc:
            error = cast(KafkaError, exc.args[0])
            if error.fatal() or not error.retriable():
                _log_fatal(error)
                raise
            log.warning("new producer not registered yet (%s): retrying", error.str())
            self._metrics.set_delivery_stalled(True)
            return False
        self._registering = False
        # What was reported while it registered is the outage it replaced the old one for.
        self._cluster_lost = False
        self._metrics.set_delivery_stalled(False)
        return True

    def _write(self, output: Output) -> None:
        self._begin()
        self._order.written([position_of(output.source)])
        self._produce(self._refused.instead_of_remembered(output))
        output.group.delivered()
        self._records += 1

    def _release_held(self) -> None:
        """Write the held dead letters whose earlier records now have their outcomes."""
        for output in self._order.releasable():
            self._write(output)

    def _begin(self) -> None:
        if not self._open:
            self._producer.begin_transaction()
            self._open = True
            self._opened_at = time.monotonic()

    def _on_commit_error(self, error: KafkaError, positions: dict[Any, int]) -> None:
        if error.fatal():
            _log_fatal(error)
            raise KafkaException(error)
        if error.txn_requires_abort():
            log.warning("transaction failed (%s): aborting, reading again from the commit", error)
            self.abort()
            raise TransactionAborted(error.str())
        # Retriable: the same commit is tried again on a later pass.
        log.warning("transaction commit not confirmed yet (%s): retrying", error.str())
        self.commit_pending = True
        self._metrics.set_delivery_stalled(True)
        self._metrics.record_delivery_retry(error.name())

    def _produce(self, output: Output) -> None:
        def report(error: KafkaError | None, _message: Message) -> None:
            if error is not None:
                self._on_delivery_error(output, error)

        while True:
            refused = self._try_produce(
                output.topic,
                output.key,
                output.value,
                output.headers,
                report,
                output.partition,
            )
            if refused is None:
                return
            output = self._refused.instead_of_refused(output, refused)

    def _try_produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Any,
        report: Callable[[KafkaError | None, Message], None],
        partition: int | None,
    ) -> KafkaError | None:
        """`produce`, except that nothing more goes into a transaction that already failed."""
        if self._doomed:
            return None
        error = produce(self._producer, topic, key, value, headers, report, partition)
        if error is None or error.code() != KafkaError._STATE:
            return error
        # The open transaction failed (e.g. a partition could not be added to it), or its
        # commit is not confirmed (the broker went away mid-commit): either way this output
        # cannot join it. The next commit aborts instead, and the rewind reads the committed
        # offsets back from the broker, so the records are decided again exactly once (if the
        # unconfirmed commit did land, its records stay decided).
        log.warning("output refused, the transaction failed or awaits its commit: %s", error.str())
        self._doomed = True
        return None

    def _on_delivery_error(self, output: Output, error: KafkaError) -> None:
        translated = translate_kafka_error(error, output.topic)
        if isinstance(translated, RecordRejectedError):
            # The commit will fail; the record is dead-lettered when it is read again.
            self._refused.remember(output, translated)
        if output.kind == "dead_letter":
            self._metrics.record_dead_letter_produce_failure(error.name())


def _log_fatal(error: KafkaError) -> None:
    """Say why the replica stops, alike for a commit, an abort or a registration that failed
    for good (the fault suite tells such an exit from a crash by this line)."""
    log.error("fatal transaction error (another replica took over?): %s", error.str())
