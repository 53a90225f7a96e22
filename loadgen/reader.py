"""Reads a run's outcomes back: the decisions and dead letters produced after it started."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping
from typing import cast

import msgspec
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from loadgen.report import ReceivedLog

log = logging.getLogger(__name__)

#: Outcomes fetched per consume() call, and the longest it blocks (bounds how late stop is seen).
READ_BATCH = 1000
READ_TIMEOUT_S = 0.1
METADATA_TIMEOUT_S = 10.0


class OutcomeReader(threading.Thread):
    """Reads decisions and dead letters produced after the run started."""

    def __init__(self, kafka: Mapping[str, str], topics: list[str], decision_topic: str) -> None:
        """`kafka`: librdkafka settings (bootstrap servers, security) for the reader's consumer."""
        super().__init__(name="outcome-reader", daemon=True)
        self.received = ReceivedLog()
        self._decision_topic = decision_topic
        self._stop_event = threading.Event()
        self._consumer = Consumer(
            {
                **kafka,
                "group.id": f"fraud-loadgen-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
                # Exactly-once: decisions of aborted transactions are not outcomes.
                "isolation.level": "read_committed",
            }
        )
        # Start at today's end of every partition: earlier runs' outcomes are not ours.
        assignment = []
        for topic in topics:
            metadata = self._consumer.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics[topic]
            if metadata.error is not None:
                raise RuntimeError(f"topic {topic!r}: {metadata.error.str()}")
            for partition in metadata.partitions:
                _low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=METADATA_TIMEOUT_S
                )
                assignment.append(TopicPartition(topic, partition, high))
        self._consumer.assign(assignment)

    @property
    def count(self) -> int:
        """Outcomes read so far."""
        return len(self.received.decisions) + len(self.received.dead_letters)

    def run(self) -> None:
        decode = msgspec.json.decode
        try:
            while not self._stop_event.is_set():
                for message in self._consumer.consume(READ_BATCH, READ_TIMEOUT_S):
                    error = message.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            log.warning("reader: %s", error.str())
                        continue
                    if message.topic() == self._decision_topic:
                        d = decode(message.value() or b"null")
                        self.received.decisions.append(
                            (d["transaction_id"], d["decision"], d["event_time"], d["decided_at"])
                        )
                        if d["decision"] != "approve":
                            self.received.flagged += 1
                            self.received.flagged_with_reasons += len(d.get("reasons", ())) >= 3
                    else:
                        self._dead_letter(message)
        finally:
            self._consumer.close()

    def _dead_letter(self, message: Message) -> None:
        headers = dict(cast(list[tuple[str, bytes]], message.headers() or []))
        try:
            position = (
                int(headers["dlq.original.partition"]),
                int(headers["dlq.original.offset"]),
            )
        except (KeyError, ValueError):
            position = (-1, -1)
        self.received.dead_letters.append(position)

    def stop(self) -> None:
        """Ask the thread to close its consumer and end."""
        self._stop_event.set()
