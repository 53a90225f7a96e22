"""A compacted topic read whole into memory: every replica's copy of a table that others write.

`CompactedTopicReader` reads every partition of a topic from the beginning, and then as it
grows, on a daemon thread of its own, and hands each record to its owner (the terminal-risk
table, the rules table); or, started at the end, follows a topic's new records (the labels of
the observed precision). Responsibilities and decisions:
- `loaded` is set once every partition is read up to the end it had when it was first assigned
  (or at once when the topic does not exist yet): a replica scores only after that, so a
  restart does not score with an empty table.
- No consumer group, nothing committed: a reader always rebuilds its table from the topic.
- A missing topic is waited for (its writer may start later), and so is a broker that went
  away; the table keeps what it has meanwhile.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

log = logging.getLogger(__name__)

#: How long the reader waits for records before looking for new partitions or stopping.
POLL_S = 0.5
#: How often a missing topic is looked for again.
MISSING_TOPIC_RETRY_S = 10.0
METADATA_TIMEOUT_S = 10.0
READ_BATCH = 5_000
#: Reads between two metadata checks (new partitions): about a minute at POLL_S.
READS_PER_ROUND = 120


class CompactedTopicReader:
    """Reads `topic` on a daemon thread until `close()`, handing each record to `apply`."""

    def __init__(
        self,
        kafka: Mapping[str, Any],
        topic: str,
        apply: Callable[[Message], None],
        *,
        name: str,
        after_read: Callable[[bool], None] = lambda _read_some: None,
        loaded_note: Callable[[], str] = lambda: "",
        start_at: int = OFFSET_BEGINNING,
    ) -> None:
        """`apply` gets every record, tombstones included, on the reader's thread; `after_read`
        runs after each read (True when it returned records); `loaded_note` says what was
        loaded, for the log line; `start_at`: where each partition is read from (OFFSET_END:
        only what is written from now on)."""
        self._kafka = dict(kafka)
        self.topic = topic
        self._apply = apply
        self._name = name
        self._after_read = after_read
        self._loaded_note = loaded_note
        self._start_at = start_at
        #: Set once every partition is read up to the end it had when the reader started.
        self.loaded = threading.Event()
        #: The end of each partition found before `loaded`, when it was first assigned: the
        #: records before it are the catch-up at start.
        self._catch_up_ends: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def in_catch_up(self, message: Message) -> bool:
        """Whether `message` is part of what the topic held when this reader started (read
        before `loaded`), rather than written since."""
        end = self._catch_up_ends.get(message.partition() or 0, 0)
        return (message.offset() or 0) < end

    def _run(self) -> None:
        consumer = Consumer(
            {
                **self._kafka,
                "group.id": f"{self._name}-reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
            }
        )
        try:
            assigned: set[int] = set()
            #: The end of each partition when it was first assigned: `loaded` waits for it.
            ends: dict[int, int] = {}
            #: Only what is there at the first look starts at `start_at`: a partition found
            #: later (the topic made, or grown, since) holds nothing written before the start.
            start_at = self._start_at
            while not self._stop.is_set():
                partitions = self._partitions(consumer)
                offset, start_at = start_at, OFFSET_BEGINNING
                if partitions is None:
                    self._set_loaded("the topic is not there yet")
                    self._stop.wait(MISSING_TOPIC_RETRY_S)
                    continue
                new = partitions - assigned
                if new:
                    for partition in new:
                        _, ends[partition] = consumer.get_watermark_offsets(
                            TopicPartition(self.topic, partition), METADATA_TIMEOUT_S
                        )
                        if not self.loaded.is_set():
                            self._catch_up_ends[partition] = ends[partition]
                    consumer.incremental_assign(
                        [TopicPartition(self.topic, p, offset) for p in sorted(new)]
                    )
                    assigned |= new
                self._read(consumer, ends)
        except KafkaException as exc:
            log.error("%s reader stopped: %s (the table keeps what it has)", self.topic, exc)
            self._set_loaded("the reader stopped")
        finally:
            consumer.close()

    def _partitions(self, consumer: Consumer) -> set[int] | None:
        try:
            metadata = consumer.list_topics(self.topic, timeout=METADATA_TIMEOUT_S)
        except KafkaException as exc:  # the broker away: keep the table, ask again later
            log.warning("%s metadata unavailable (%s): trying again", self.topic, exc)
            return None
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            log.warning("topic %s not there yet", self.topic)
            return None
        return set(topic.partitions)

    def _read(self, consumer: Consumer, ends: dict[int, int]) -> None:
        """Read what is there now, for up to about a minute, then let metadata be checked."""
        for _ in range(READS_PER_ROUND):
            if self._stop.is_set():
                return
            messages = consumer.consume(READ_BATCH, POLL_S)
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        log.warning("reading %s: %s", self.topic, error.str())
                    continue
                try:
                    self._apply(message)
                except Exception:  # one record must not end the table's reader
                    log.exception(
                        "%s: skipping the record at partition %s offset %s",
                        self.topic,
                        message.partition(),
                        message.offset(),
                    )
            self._after_read(bool(messages))
            if not self.loaded.is_set() and _caught_up(consumer, self.topic, ends):
                self._set_loaded(self._loaded_note())

    def _set_loaded(self, why: str) -> None:
        if not self.loaded.is_set():
            log.info("%s loaded: %s", self.topic, why)
            self.loaded.set()


def _caught_up(consumer: Consumer, topic: str, ends: Mapping[int, int]) -> bool:
    """Whether every partition's position has reached its end at the start."""
    positions = consumer.position([TopicPartition(topic, p) for p in ends])
    return all(tp.offset >= ends[tp.partition] or ends[tp.partition] == 0 for tp in positions)
