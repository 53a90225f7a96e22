"""Decisions in, cases out: the console's one consumer reads the decisions topic for flagged
decisions and the transactions topic for the fields a decision lacks (amount, currency,
merchant, terminal, country, channel, local time).

Bounded and restartable:
- The transactions are joined in a window of the last `join_window` read (`RecentTransactions`),
  a fixed-size FIFO. A decision read before its transaction opens a case at once, and the case
  gets its fields when the transaction comes (the open cases still waiting are reloaded at
  start).
- Offsets are committed after the cases of a batch are in the database, so a restart reads
  again what was not stored (a re-read decision opens no second case). The transactions'
  offsets are committed at the oldest one the window still holds, so a restart refills the
  window as it was.
- At `max_open_cases` open cases the consumer pauses (nothing is dropped; lag grows) until
  analysts close some.
- A record that is not a well-formed, bounded decision or transaction is skipped and counted:
  these are the scorer's and the producers' topics, whose dead letters are theirs.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Annotated, Any

import msgspec
from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from contracts.transaction import MAX_EVENT_TIME_MS, MAX_ID_CHARS, decode_transaction
from plumbing.errors import DecodeError, ValidationError
from review.cases import CaseStore, NewCase, TransactionDetails, case_reason
from review.metrics import ReviewMetrics
from review.settings import ReviewSettings

log = logging.getLogger(__name__)

#: A decision or transaction longer than this is skipped unread (the scorer writes under 4 KiB).
MAX_RECORD_BYTES = 65_536
#: Records read per poll.
BATCH = 500
#: The card decisions remembered for a case's timeline: per card, and cards at most.
TIMELINE_LENGTH = 10
TIMELINE_CARDS = 100_000
TOPIC_REFRESH_MS = 5_000
#: How often the open cases are counted against FRAUD_REVIEW_MAX_OPEN_CASES.
QUEUE_CHECK_S = 1.0
#: How often closed cases past their retention are deleted.
PURGE_EVERY_S = 3_600.0

_Id = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)]
_Text = Annotated[str, msgspec.Meta(max_length=1_000)]


class _Reason(msgspec.Struct, frozen=True, kw_only=True):
    feature: Annotated[str, msgspec.Meta(max_length=200)]
    #: The feature's value in words; a decision of release 0.1.0 has only `label`, the same
    #: words (written beside `text` for one more release, deprecated).
    text: _Text = ""
    label: _Text = ""
    contribution: float


class _Decision(msgspec.Struct, frozen=True):
    """A decision as the console reads it: the decision contract, every field bounded."""

    transaction_id: _Id
    card_id: _Id
    score: Annotated[float, msgspec.Meta(ge=0, le=1)]
    decision: Annotated[str, msgspec.Meta(max_length=20)]
    model_version: Annotated[str, msgspec.Meta(max_length=200)]
    event_time: Annotated[int, msgspec.Meta(ge=0, le=MAX_EVENT_TIME_MS)]
    decided_at: Annotated[int, msgspec.Meta(ge=0, le=MAX_EVENT_TIME_MS)]
    reasons: Annotated[tuple[_Reason, ...], msgspec.Meta(max_length=20)] = ()
    rules: Annotated[
        tuple[Annotated[str, msgspec.Meta(max_length=200)], ...], msgspec.Meta(max_length=50)
    ] = ()


_decode_decision = msgspec.json.Decoder(_Decision).decode


class RecentTransactions:
    """The last `capacity` transactions read, by id, for the join; and, per partition, the
    offset a restart must read from to hold the same ones again."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._held: OrderedDict[str, tuple[tuple[int, int], TransactionDetails]] = OrderedDict()
        #: Per partition, the offsets held, oldest first (global FIFO order keeps each sorted).
        self._offsets: dict[int, deque[int]] = {}
        self._next: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._held)

    def add(
        self, partition: int, offset: int, transaction_id: str, details: TransactionDetails
    ) -> None:
        self._next[partition] = offset + 1
        if transaction_id in self._held:
            return  # a duplicate: the first copy keeps its place (and the restart offset)
        self._held[transaction_id] = ((partition, offset), details)
        self._offsets.setdefault(partition, deque()).append(offset)
        if len(self._held) > self._capacity:
            _, ((old_partition, _old), _details) = self._held.popitem(last=False)
            self._offsets[old_partition].popleft()

    def skipped(self, partition: int, offset: int) -> None:
        """A record read but not held (not a transaction)."""
        self._next[partition] = offset + 1

    def get(self, transaction_id: str) -> TransactionDetails | None:
        held = self._held.get(transaction_id)
        return None if held is None else held[1]

    def restart_offsets(self) -> dict[int, int]:
        """Per partition read, where a restart must begin to hold what is held now."""
        return {
            partition: (held[0] if (held := self._offsets.get(partition)) else next_offset)
            for partition, next_offset in self._next.items()
        }

    def forget_partitions(self, partitions: set[int]) -> None:
        """Partitions revoked: their transactions leave the window with their offsets."""
        for transaction_id in [tid for tid, ((p, _), _) in self._held.items() if p in partitions]:
            del self._held[transaction_id]
        for partition in partitions:
            self._offsets.pop(partition, None)
            self._next.pop(partition, None)


class CardTimelines:
    """Each card's last decisions, for a case's timeline: bounded in cards (least recent out),
    and packed (13 bytes a decision): 100,000 cards of 10 decisions hold about 35 MB, where
    a dict per decision took 356 MiB (measured with tracemalloc)."""

    def __init__(self) -> None:
        self._cards: OrderedDict[str, bytes] = OrderedDict()

    def record(self, decision: _Decision) -> bytes:
        """Remember this decision; return the card's decisions before it, packed (`unpack`
        them for a case only: most decisions open none)."""
        packed = self._cards.pop(decision.card_id, b"")
        entry = _TIMELINE_ENTRY.pack(
            decision.event_time, decision.score, _DECISION_CODES.get(decision.decision, 255)
        )
        self._cards[decision.card_id] = (packed + entry)[-TIMELINE_LENGTH * _TIMELINE_ENTRY.size :]
        if len(self._cards) > TIMELINE_CARDS:
            self._cards.popitem(last=False)
        return packed

    @staticmethod
    def unpack(packed: bytes) -> list[dict[str, Any]]:
        """Decisions `record` returned, oldest first."""
        return [
            {"event_time": event_time, "score": round(score, 6), "decision": _decision_name(code)}
            for event_time, score, code in _TIMELINE_ENTRY.iter_unpack(packed)
        ]


#: A timeline entry: event time (ms), score, decision (its index in DECISIONS; 255: another).
_TIMELINE_ENTRY = struct.Struct("<qfB")
_DECISIONS = ("approve", "review", "decline")
_DECISION_CODES = {name: code for code, name in enumerate(_DECISIONS)}


def _decision_name(code: int) -> str:
    return _DECISIONS[code] if code < len(_DECISIONS) else "other"


class Ingest:
    """The consumer thread: decisions and transactions into the case store."""

    def __init__(
        self,
        config: ReviewSettings,
        store: CaseStore,
        metrics: ReviewMetrics,
        consumer_factory: Callable[[dict[str, Any]], Consumer] = Consumer,
    ) -> None:
        self._config = config
        self._store = store
        self._metrics = metrics
        self._recent = RecentTransactions(config.join_window)
        self._timelines = CardTimelines()
        #: Open cases whose transaction was not read yet, oldest first, at most join_window: a
        #: transaction that never comes leaves this set as newer ones arrive.
        self._awaiting: OrderedDict[str, None] = OrderedDict.fromkeys(
            store.awaiting_details(config.join_window)
        )
        self._opens_cases = config.case_decisions
        self._consumer = consumer_factory(
            {
                "bootstrap.servers": config.bootstrap_servers,
                **config.kafka_settings(),
                "group.id": config.group_id,
                "enable.auto.commit": False,
                "auto.offset.reset": config.auto_offset_reset,
                "client.id": f"fraud-review-{config.instance_id}",
                # A topic created after the console started (the scorer's, at its first
                # start) is found within seconds, not librdkafka's default 5 minutes.
                "topic.metadata.refresh.interval.ms": TOPIC_REFRESH_MS,
            }
        )
        self._stop = threading.Event()
        self._paused = False
        self._next_queue_check = 0.0
        #: The reading state last applied, and to which partitions.
        self._flow_applied: tuple[bool, set[tuple[str, int]]] = (False, set())
        self.assigned = threading.Event()
        self.last_beat = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="review-ingest", daemon=True)
        self.failure: BaseException | None = None

    def start(self) -> None:
        self._consumer.subscribe(
            [self._config.output_topic, self._config.input_topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
        )
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)
        self._consumer.close()

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assigned.set()

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._recent.forget_partitions(
            {p.partition for p in partitions if p.topic == self._config.input_topic}
        )

    def _run(self) -> None:
        next_purge = 0.0
        try:
            while not self._stop.is_set():
                self.last_beat = time.monotonic()
                self._apply_backpressure()
                messages = self._consumer.consume(BATCH, timeout=0.5)
                if messages:
                    self._handle(messages)
                if time.monotonic() >= next_purge:
                    purged = self._store.purge_closed(self._config.retention_days * 86_400_000)
                    if purged:
                        log.info("deleted %d closed cases past their retention", purged)
                    next_purge = time.monotonic() + PURGE_EVERY_S
        except BaseException as exc:
            self.failure = exc
            log.exception("the ingest thread stopped")
            raise

    def _apply_backpressure(self) -> None:
        # Counting open cases scans their index (about 0.1 s at a million): once a second, and
        # the metrics read this count rather than run their own.
        now = time.monotonic()
        if now < self._next_queue_check:
            return
        self._next_queue_check = now + QUEUE_CHECK_S
        open_cases, oldest = self._store.queue_state()
        self._metrics.queue_state(open_cases, oldest)
        full = open_cases >= self._config.max_open_cases
        if full != self._paused:
            if full:
                log.warning(
                    "%d open cases (FRAUD_REVIEW_MAX_OPEN_CASES): reading paused until some "
                    "are closed",
                    open_cases,
                )
            else:
                log.info("reading resumed (%d open cases)", open_cases)
            self._paused = full
            self._metrics.ingest_paused.set(int(full))
        # Both topics together, so the join window still holds what a decision read on resume
        # needs; applied again when the assignment changed (a rebalance), so a partition
        # assigned since follows the same state.
        assignment = {(tp.topic, tp.partition) for tp in self._consumer.assignment()}
        if assignment and (full, assignment) != self._flow_applied:
            partitions = [TopicPartition(topic, partition) for topic, partition in assignment]
            (self._consumer.pause if full else self._consumer.resume)(partitions)
            self._flow_applied = (full, assignment)

    def _handle(self, messages: list[Message]) -> None:
        cases: list[NewCase] = []
        found: list[tuple[str, TransactionDetails]] = []
        decision_offsets: dict[int, int] = {}
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer error: %s", error.str())
                continue
            partition, offset = message.partition(), message.offset()
            if partition is None or offset is None:
                continue
            if message.topic() == self._config.input_topic:
                self._read_transaction(message, partition, offset, found)
            else:
                decision_offsets[partition] = offset + 1
                case = self._read_decision(message)
                if case is not None:
                    cases.append(case)
        opened = self._store.open_cases(cases)
        self._store.add_details(found)
        self._metrics.cases_opened.inc(opened)
        self._commit(decision_offsets)

    def _read_transaction(
        self,
        message: Message,
        partition: int,
        offset: int,
        found: list[tuple[str, TransactionDetails]],
    ) -> None:
        value = message.value()
        if value is not None and len(value) > MAX_RECORD_BYTES:
            self._skip(self._config.input_topic, "too_large")
            self._recent.skipped(partition, offset)
            return
        try:
            tx = decode_transaction(value)
        except (DecodeError, ValidationError):
            self._skip(self._config.input_topic, "invalid")
            self._recent.skipped(partition, offset)
            return
        details = TransactionDetails(
            tx.amount,
            tx.currency,
            tx.merchant_id,
            tx.terminal_id or None,
            tx.country,
            tx.channel,
            tx.utc_offset_minutes,
        )
        self._recent.add(partition, offset, tx.transaction_id, details)
        if tx.transaction_id in self._awaiting:
            del self._awaiting[tx.transaction_id]
            found.append((tx.transaction_id, details))

    def _read_decision(self, message: Message) -> NewCase | None:
        value = message.value()
        if value is None or len(value) > MAX_RECORD_BYTES:
            self._skip(self._config.output_topic, "too_large" if value else "invalid")
            return None
        try:
            decision = _decode_decision(value)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            self._skip(self._config.output_topic, "invalid")
            return None
        earlier = self._timelines.record(decision)
        if decision.decision not in self._opens_cases:
            return None
        details = self._recent.get(decision.transaction_id)
        if details is None:
            self._awaiting[decision.transaction_id] = None
            if len(self._awaiting) > self._config.join_window:
                self._awaiting.popitem(last=False)
        return NewCase(
            decision.transaction_id,
            decision.card_id,
            decision.score,
            decision.decision,
            decision.model_version,
            decision.event_time,
            decision.decided_at,
            [case_reason(msgspec.structs.asdict(reason)) for reason in decision.reasons],
            list(decision.rules),
            details,
            CardTimelines.unpack(earlier),
        )

    def _skip(self, topic: str, reason: str) -> None:
        self._metrics.records_skipped.labels(topic, reason).inc()

    def _commit(self, decision_offsets: dict[int, int]) -> None:
        offsets = [
            TopicPartition(self._config.output_topic, partition, offset)
            for partition, offset in decision_offsets.items()
        ] + [
            TopicPartition(self._config.input_topic, partition, offset)
            for partition, offset in self._recent.restart_offsets().items()
            if offset != OFFSET_INVALID
        ]
        if not offsets:
            return
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:  # a rebalance under way: the next owner re-reads them
            log.warning("offsets not committed (%s); their records will be read again", exc)
