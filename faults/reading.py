"""Reading what a scenario left in Kafka: the three topics to their end, committed and end
offsets, and a live reader that notes when each decision became visible.

Decisions are read with `isolation.level=read_committed`, as docs/contracts.md tells their
consumers to: in exactly-once mode an aborted transaction's writes never show, and reading "to
the end" means up to the last stable offset once no transaction is open any more.
"""

from __future__ import annotations

import bisect
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, cast

import msgspec
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from contracts.decision import Decision as DecisionRecord
from faults.verifier import DeadLetter, Decision, InputRecord

#: Records per consume() call, and how long one call may wait.
READ_BATCH = 5_000
READ_WAIT_S = 0.2
METADATA_TIMEOUT_S = 15.0


class _Transaction(msgspec.Struct):
    transaction_id: str
    card_id: str


def _consumer(bootstrap: str, **settings: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"faults-reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            **settings,
        }
    )


def partitions_of(consumer: Consumer, topic: str) -> list[int]:
    metadata = consumer.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics[topic]
    if metadata.error is not None:
        raise RuntimeError(f"topic {topic!r}: {metadata.error.str()}")
    return sorted(metadata.partitions)


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """The high watermark of each partition of `topic`."""
    consumer = _consumer(bootstrap)
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), METADATA_TIMEOUT_S)[1]
            for p in partitions_of(consumer, topic)
        }
    finally:
        consumer.close()


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The committed position of `group` in each partition of `topic` (0 where none)."""
    consumer = _consumer(bootstrap, **{"group.id": group})
    try:
        wanted = [TopicPartition(topic, p) for p in range(partitions)]
        found = consumer.committed(wanted, timeout=METADATA_TIMEOUT_S)
        return {tp.partition: max(tp.offset, 0) for tp in found}
    finally:
        consumer.close()


def read_to_end(bootstrap: str, topic: str, timeout_s: float) -> Iterator[Message]:
    """Every record of `topic` up to the end offsets it has now, read_committed. Raises
    TimeoutError when the end is not reached in `timeout_s` (a transaction left open)."""
    consumer = _consumer(bootstrap)
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), METADATA_TIMEOUT_S)[1]
            for p in partitions_of(consumer, topic)
        }
        waiting = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in waiting])
        deadline = time.monotonic() + timeout_s
        while waiting:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: partitions {sorted(waiting)} not read to the end")
            for message in consumer.consume(READ_BATCH, READ_WAIT_S):
                error = message.error()
                if error is None:
                    yield message
                elif error.code() == KafkaError._PARTITION_EOF:
                    # The end a read_committed reader reaches: the last stable offset.
                    if cast(int, message.offset()) >= ends[cast(int, message.partition())]:
                        waiting.discard(cast(int, message.partition()))
                else:
                    raise RuntimeError(f"{topic}: {error.str()}")
    finally:
        consumer.close()


def read_inputs(bootstrap: str, topic: str, timeout_s: float = 120.0) -> list[InputRecord]:
    decode = msgspec.json.Decoder(_Transaction).decode
    records = []
    for m in read_to_end(bootstrap, topic, timeout_s):
        try:
            tx: _Transaction | None = decode(m.value() or b"")
        except msgspec.DecodeError:
            tx = None
        records.append(
            InputRecord(
                cast(int, m.partition()),
                cast(int, m.offset()),
                m.timestamp()[1],
                tx.transaction_id if tx else None,
                tx.card_id if tx else None,
            )
        )
    return records


def read_decisions(
    bootstrap: str,
    topic: str,
    visibility: VisibilityLog | None = None,
    timeout_s: float = 120.0,
) -> list[Decision]:
    decode = msgspec.json.Decoder(DecisionRecord).decode
    decisions = []
    for m in read_to_end(bootstrap, topic, timeout_s):
        d = decode(m.value() or b"")
        partition, offset = cast(int, m.partition()), cast(int, m.offset())
        content = (d.card_id, d.model_version, d.degraded, d.event_time)
        seen = visibility.seen_at(partition, offset) if visibility else None
        decisions.append(
            Decision(
                partition,
                offset,
                d.transaction_id,
                d.card_id,
                content,
                d.decided_at,
                seen,
                m.timestamp()[1],
                (d.score, d.decision),
                d.event_time,
            )
        )
    return decisions


def read_dead_letters(bootstrap: str, topic: str, timeout_s: float = 120.0) -> list[DeadLetter]:
    return [dead_letter_of(m) for m in read_to_end(bootstrap, topic, timeout_s)]


def dead_letter_of(m: Message) -> DeadLetter:
    headers = {k: v.decode() for k, v in cast(list[tuple[str, bytes]], m.headers() or [])}
    return DeadLetter(
        cast(int, m.partition()),
        cast(int, m.offset()),
        int(headers.get("dlq.original.partition", -1)),
        int(headers.get("dlq.original.offset", -1)),
        (headers.get("dlq.reason"), m.value()),
        int(headers.get("dlq.failed_at", 0)),
    )


class VisibilityLog(threading.Thread):
    """Reads the decision topic live (read_committed) and notes when each offset first became
    visible: per partition, the highest offset seen at each consume(), so the cost is one entry
    per call, not per record."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(name="visibility", daemon=True)
        self._consumer = _consumer(bootstrap, **{"enable.partition.eof": False})
        partitions = partitions_of(self._consumer, topic)
        self._consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        self._offsets: dict[int, list[int]] = {p: [] for p in partitions}
        self._times: dict[int, list[int]] = {p: [] for p in partitions}
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            while not self._stop_event.is_set():
                messages = self._consumer.consume(READ_BATCH, READ_WAIT_S)
                now_ms = time.time_ns() // 1_000_000
                highest: dict[int, int] = {}
                for m in messages:
                    if m.error() is None:
                        p = cast(int, m.partition())
                        highest[p] = max(highest.get(p, -1), cast(int, m.offset()))
                for p, offset in highest.items():
                    self._offsets[p].append(offset)
                    self._times[p].append(now_ms)
        finally:
            self._consumer.close()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=30)

    def seen_at(self, partition: int, offset: int) -> int | None:
        """When `offset` of `partition` was first seen (epoch ms), or None if it never was."""
        offsets = self._offsets.get(partition, [])
        i = bisect.bisect_left(offsets, offset)
        return self._times[partition][i] if i < len(offsets) else None
