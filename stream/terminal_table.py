"""The scorer's copy of `terminal-risk`: every terminal's latest risk features, read whole.

The features worker (`fraud-features`) publishes each terminal's risk, from confirmed labels,
to a compacted topic keyed by terminal id. Every replica reads all of it (a global table: a
transaction of any card may happen at any terminal), from the beginning and then as it grows,
on a thread of its own, and the scoring thread joins a batch against it in one pass.

Responsibilities and decisions:
- A terminal with no record yet, or with no terminal id, gets the neutral features, never an
  error; a record that cannot be read is skipped with a warning.
- The table is a dict replaced value by value: the scoring thread reads it without a lock (one
  dict lookup per transaction is atomic), the reader thread is its only writer.
- The reader uses no consumer group and commits nothing: it always rebuilds from the topic.
- A missing topic is waited for (the worker may start later), and so is a broker that went
  away; readiness does not depend on it.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from scorer.terminal_risk import decode_terminal_risk, terminal_features
from stream.metrics import ServiceMetrics

log = logging.getLogger(__name__)

#: How long the reader waits for records before looking for new partitions or stopping.
POLL_S = 0.5
#: How often a missing topic is looked for again.
MISSING_TOPIC_RETRY_S = 10.0
METADATA_TIMEOUT_S = 10.0
READ_BATCH = 5_000


class TerminalRiskTable:
    """Reads `terminal-risk` into memory on a daemon thread until `close()`."""

    def __init__(self, kafka: Mapping[str, Any], topic: str, metrics: ServiceMetrics) -> None:
        self._kafka = dict(kafka)
        self.topic = topic
        self._metrics = metrics
        self._features: dict[str, npt.NDArray[np.float32]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="terminal-risk", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def __len__(self) -> int:
        return len(self._features)

    def features(self, terminal_ids: Sequence[str | None]) -> npt.NDArray[np.float32]:
        """The terminal feature rows of a batch (neutral where unknown)."""
        return terminal_features(self._features, terminal_ids)

    def _run(self) -> None:
        consumer = Consumer(
            {
                **self._kafka,
                "group.id": f"terminal-risk-reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
            }
        )
        try:
            assigned: set[int] = set()
            while not self._stop.is_set():
                partitions = self._partitions(consumer)
                if partitions is None:
                    self._stop.wait(MISSING_TOPIC_RETRY_S)
                    continue
                new = partitions - assigned
                if new:
                    consumer.incremental_assign(
                        [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in sorted(new)]
                    )
                    assigned |= new
                self._read(consumer)
        except KafkaException as exc:
            log.error("terminal-risk reader stopped: %s (terminals keep neutral risk)", exc)
        finally:
            consumer.close()

    def _partitions(self, consumer: Consumer) -> set[int] | None:
        try:
            metadata = consumer.list_topics(self.topic, timeout=METADATA_TIMEOUT_S)
        except KafkaException as exc:  # the broker away: keep the table, ask again later
            log.warning("terminal-risk metadata unavailable (%s): trying again", exc)
            return None
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            log.warning("topic %s not there yet: terminals get neutral risk meanwhile", self.topic)
            return None
        return set(topic.partitions)

    def _read(self, consumer: Consumer) -> None:
        """Read what is there now, for up to about a minute, then let metadata be checked."""
        for _ in range(120):
            if self._stop.is_set():
                return
            messages = consumer.consume(READ_BATCH, POLL_S)
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        log.warning("reading %s: %s", self.topic, error.str())
                    continue
                self._apply(message.key(), message.value())
            if messages:
                self._metrics.set_terminal_risk_terminals(len(self._features))

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        terminal_id = key.decode("utf-8", "replace")
        if value is None:
            self._features.pop(terminal_id, None)
            return
        try:
            record = decode_terminal_risk(value)
        except ValueError as exc:
            log.warning("skipping a terminal-risk record for %r: %s", terminal_id, exc)
            return
        self._features[record.terminal_id] = record.features
