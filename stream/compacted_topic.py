"""A compacted topic read whole into memory: every replica's copy of a table that others write.

`CompactedTopicReader` reads every partition of a topic from the beginning, and then as it
grows, on a daemon thread of its own, and hands each record to its owner (the terminal-risk
table, the rules table); or, started at the end, follows a topic's new records (the labels of
the observed precision). Responsibilities and decisions:
- `loaded` is set once every partition is read up to the end it had when it was first assigned,
  or at once when the broker says the topic does not exist (its writer may start later): a
  replica scores only after that, so a restart does not score with an empty table. A partition
  that held no record then (its records all deleted, compacted or expired: its first offset is
  its end) counts as read at once: librdkafka has no position in it until it returns a record.
- Fails closed: only a topic the broker does not know (UNKNOWN_TOPIC_OR_PART) is an empty one.
  A topic that cannot be read (no metadata: the broker away or not answering; the topic not
  authorized, or refused with any other error; its end offsets unknown) is not: `loaded` waits,
  `problem` says why, and the reader tries again with a backoff.
- Never silent: every pass over the topic (its metadata, then reads without error) is counted as
  read; `fraud_topic_reader_read_age_seconds{reader}` is the time since the last, so it grows
  whenever the topic cannot be read, before or after `loaded` (an alert watches it).
  `fraud_topic_reader_errors_total{reader,cause}` counts what went wrong: `unreadable` (a pass
  that failed), `record` (a record its owner could not take: skipped), `restart` (below).
- Never dead: a consumer that fails (librdkafka raises) is closed and a new one started after a
  backoff, from where the old one stopped, so no record is applied twice or skipped; the table
  keeps what it has meanwhile.
- Never dead in silence: a thread that ends anyway (a BaseException other than an Exception) is
  logged at CRITICAL, counted (`cause="stopped"`) and named by `stopped()`, which the service's
  liveness asks for the control topics (`/healthz` fails, so the replica is restarted).
- No consumer group, nothing committed: a reader always rebuilds its table from the topic.
- Read up to now, on request: `ask_read_to_end()` has the reader ask each partition's end
  offset, and `read_to_end(asked)` is true once it has read that far (records written before
  the request are applied): what the scorer's wait for the features worker
  (`stream/worker_alignment.py`) needs so it never scores with a table behind the worker's
  progress record.
"""

from __future__ import annotations

import logging
import threading
import time
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

from stream.metrics import ServiceMetrics

log = logging.getLogger(__name__)

#: How long the reader waits for records before looking for new partitions or stopping.
POLL_S = 0.5
#: How often a missing topic is looked for again.
MISSING_TOPIC_RETRY_S = 10.0
METADATA_TIMEOUT_S = 10.0
READ_BATCH = 5_000
#: Reads between two metadata checks (new partitions; whether the topic can still be read):
#: about 10 s at POLL_S, so the read age of an idle topic stays around that.
READS_PER_ROUND = 20
#: A topic that cannot be read (or a consumer that failed) is tried again after this, doubling
#: up to RETRY_MAX_S.
RETRY_MIN_S = 0.5
RETRY_MAX_S = 30.0
#: The one metadata error that means there is no such topic, so nothing to read: an empty one.
_MISSING = KafkaError.UNKNOWN_TOPIC_OR_PART


class _Unreadable(Exception):
    """The topic cannot be read now (the message says why): tried again after a backoff."""


class CompactedTopicReader:
    """Reads `topic` on a daemon thread until `close()`, handing each record to `apply`."""

    def __init__(
        self,
        kafka: Mapping[str, Any],
        topic: str,
        apply: Callable[[Message], None],
        *,
        name: str,
        metrics: ServiceMetrics | None = None,
        after_read: Callable[[bool], None] = lambda _read_some: None,
        loaded_note: Callable[[], str] = lambda: "",
        start_at: int = OFFSET_BEGINNING,
    ) -> None:
        """`apply` gets every record, tombstones included, on the reader's thread; `name`
        names the reader in logs and metrics (`reader` label); `after_read` runs after each
        read (True when it returned records); `loaded_note` says what was loaded, for the log
        line; `start_at`: where each partition is read from (OFFSET_END: only what is written
        from now on)."""
        self._kafka = dict(kafka)
        self.topic = topic
        self._apply = apply
        self._name = name
        self._metrics = metrics
        self._after_read = after_read
        self._loaded_note = loaded_note
        self._start_at = start_at
        #: Set once every partition is read up to the end it had when the reader started.
        self.loaded = threading.Event()
        #: Why the topic cannot be read now; None while it can.
        self.problem: str | None = None
        self._stop = threading.Event()
        #: What ended the reader's thread before `close()`, if anything did.
        self._stopped_by: str | None = None
        self._read_at = time.monotonic()
        self._retry_s = RETRY_MIN_S
        #: The next offset to read in each partition assigned so far: where a new consumer
        #: starts after one failed (for a reader that starts at the end, that end until a
        #: record is read).
        self._next: dict[int, int] = {}
        #: The end of each partition when it was first assigned: `loaded` waits for it.
        self._ends: dict[int, int] = {}
        #: The first offset of each partition read then (its end, for a reader that starts
        #: there): none is left to read when it is its end.
        self._firsts: dict[int, int] = {}
        #: The same, for the partitions found before `loaded`: the records before it are the
        #: catch-up at start.
        self._catch_up_ends: dict[int, int] = {}
        #: Only what is there at the first look starts at `start_at`: a partition found later
        #: (the topic made, or grown, since) holds nothing written before the start.
        self._first_look = True
        #: `ask_read_to_end`: the requests made, the one whose ends are known, those ends, and
        #: the last request read up to them. Plain ints written by one thread each.
        self._end_asked = 0
        self._end_taken = 0
        self._asked_ends: dict[int, int] = {}
        self._end_reached = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        if metrics is not None:
            metrics.watch_topic_reader(name, self.read_age_s)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def alive(self) -> bool:
        """Whether the reader's thread runs (it ends only at `close()`)."""
        return self._thread.is_alive()

    def stopped(self) -> str | None:
        """Why the reader's thread ended before `close()` (nothing more of the topic is read
        from then on); None while it runs, before `start()` and after `close()`."""
        if self._stop.is_set() or self._thread.ident is None or self.alive():
            return None
        return self._stopped_by or "its thread ended"

    def read_age_s(self) -> float:
        """Seconds since the topic was last read without error (or since the reader was made)."""
        return max(0.0, time.monotonic() - self._read_at)

    def in_catch_up(self, message: Message) -> bool:
        """Whether `message` is part of what the topic held when this reader started (read
        before `loaded`), rather than written since."""
        end = self._catch_up_ends.get(message.partition() or 0, 0)
        return (message.offset() or 0) < end

    def ask_read_to_end(self) -> int:
        """Ask the reader to read every partition up to its end as of now; returns the request,
        for `read_to_end`. Cheap to ask often: the reader asks the ends at its next read, once
        for all the requests made since."""
        self._end_asked += 1
        return self._end_asked

    def read_to_end(self, asked: int) -> bool:
        """Whether every record written before request `asked` was made has been applied."""
        return self._end_reached >= asked

    # -- the reader's thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self._read_with_a_consumer()
                except Exception as exc:  # librdkafka failed (or a bug): a new consumer, later
                    self._count("restart")
                    log.error(
                        "%s reader failed (%s: %s): starting it again in %.1fs; the table keeps "
                        "what it has",
                        self.topic,
                        type(exc).__name__,
                        exc,
                        self._retry_s,
                    )
                    self._back_off()
        except BaseException as exc:  # the thread ends with it: say so, loudly, and count it
            self._stopped_by = f"{type(exc).__name__}: {exc}"
            self._count("stopped")
            log.critical(
                "%s reader stopped (%s): nothing more of it is read",
                self.topic,
                self._stopped_by,
                exc_info=True,
            )

    def _read_with_a_consumer(self) -> None:
        """Read until `close()` with one consumer; whatever it raises ends it."""
        consumer = Consumer(
            {
                **self._kafka,
                "group.id": f"{self._name}-reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
            }
        )
        try:
            assigned: set[int] = set()
            while not self._stop.is_set():
                try:
                    partitions = self._partitions(consumer)
                    if partitions is None:
                        self._first_look = False
                        self._end_reached = self._end_asked  # nothing to read
                        self._read_fine()
                        self._set_loaded("the topic does not exist (yet): read as empty")
                        self._stop.wait(MISSING_TOPIC_RETRY_S)
                        continue
                    new = partitions - assigned
                    if new:
                        self._assign(consumer, new)
                        assigned |= new
                    self._first_look = False
                    self._read(consumer)
                    self._read_fine()
                except _Unreadable as exc:
                    self._unreadable(str(exc))
        finally:
            consumer.close()

    def _partitions(self, consumer: Consumer) -> set[int] | None:
        """The topic's partitions; None when the broker says there is no such topic."""
        try:
            metadata = consumer.list_topics(self.topic, timeout=METADATA_TIMEOUT_S)
        except KafkaException as exc:  # the broker away or not answering
            raise _Unreadable(f"no metadata: {_described(exc)}") from None
        topic = metadata.topics.get(self.topic)
        if topic is None:
            raise _Unreadable("the broker did not describe it")
        if topic.error is not None:
            if topic.error.code() == _MISSING:
                return None
            raise _Unreadable(f"{topic.error.name()}: {topic.error.str()}")
        if not topic.partitions:
            raise _Unreadable("it has no partitions")
        return set(topic.partitions)

    def _assign(self, consumer: Consumer, new: set[int]) -> None:
        """Start reading `new` partitions: where a failed consumer stopped, or where the reader
        starts; each one's end is asked first (all or none are assigned)."""
        watermarks = self._watermarks(consumer, new)
        start = self._start_at if self._first_look else OFFSET_BEGINNING
        for partition, (first, end) in watermarks.items():
            if partition not in self._ends:
                self._ends[partition] = end
                if start == OFFSET_BEGINNING:
                    self._firsts[partition] = first
                else:
                    # Started at the end: nothing before it is read, even by a new consumer
                    # after this one failed (no record read yet must not mean "the beginning").
                    self._firsts[partition] = self._next[partition] = end
                if not self.loaded.is_set():
                    self._catch_up_ends[partition] = end
        consumer.incremental_assign(
            [TopicPartition(self.topic, p, self._next.get(p, start)) for p in sorted(new)]
        )

    def _read(self, consumer: Consumer) -> None:
        """Read what is there now, for up to READS_PER_ROUND reads, then let metadata be
        checked; _Unreadable on a read error (after handing over what the read returned)."""
        for _ in range(READS_PER_ROUND):
            if self._stop.is_set():
                return
            asked = self._end_asked
            if asked > self._end_taken:
                watermarks = self._watermarks(consumer, set(self._ends))
                self._asked_ends = {p: end for p, (_, end) in watermarks.items()}
                self._end_taken = asked
            messages = consumer.consume(READ_BATCH, POLL_S)
            failed: str | None = None
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        failed = f"{error.name()}: {error.str()}"
                    continue
                self._next[message.partition() or 0] = (message.offset() or 0) + 1
                try:
                    self._apply(message)
                except Exception:  # one record must not end the table's reader
                    self._count("record")
                    log.exception(
                        "%s: skipping the record at partition %s offset %s",
                        self.topic,
                        message.partition(),
                        message.offset(),
                    )
            self._after_read(bool(messages))
            if failed is not None:
                raise _Unreadable(f"reading it: {failed}")
            if not self.loaded.is_set() and self._caught_up(consumer, self._ends):
                self._read_fine()  # read to its end: whatever failed before is over
                self._set_loaded(self._loaded_note())
            taken = self._end_taken
            if taken > self._end_reached and self._caught_up(consumer, self._asked_ends):
                self._end_reached = taken

    def _watermarks(self, consumer: Consumer, partitions: set[int]) -> dict[int, tuple[int, int]]:
        """Each partition's first and end offsets now, asked of the broker; _Unreadable when
        one is not given."""
        watermarks: dict[int, tuple[int, int]] = {}
        for partition in sorted(partitions):
            try:
                watermarks[partition] = consumer.get_watermark_offsets(
                    TopicPartition(self.topic, partition), METADATA_TIMEOUT_S
                )
            except KafkaException as exc:
                raise _Unreadable(
                    f"partition {partition}'s end unknown: {_described(exc)}"
                ) from None
        return watermarks

    def _caught_up(self, consumer: Consumer, ends: Mapping[int, int]) -> bool:
        """Whether every partition's position has reached its end in `ends` (one that held no
        record when it was assigned, and still holds none, has no position to ask for)."""
        left = [p for p, end in ends.items() if end > self._next.get(p, self._firsts[p])]
        if not left:
            return True
        positions = consumer.position([TopicPartition(self.topic, p) for p in left])
        return all(tp.offset >= ends[tp.partition] for tp in positions)

    def _read_fine(self) -> None:
        """A pass over the topic went without error."""
        self._read_at = time.monotonic()
        self._retry_s = RETRY_MIN_S
        if self.problem is not None:
            log.info("%s can be read again", self.topic)
            self.problem = None

    def _unreadable(self, why: str) -> None:
        self._count("unreadable")
        if why != self.problem:  # once per new problem, not once per try
            waits = "" if self.loaded.is_set() else "; the replica waits for it"
            log.error(
                "%s cannot be read (%s): trying again, the table keeps what it has%s",
                self.topic,
                why,
                waits,
            )
        self.problem = why
        self._back_off()

    def _back_off(self) -> None:
        self._stop.wait(self._retry_s)
        self._retry_s = min(RETRY_MAX_S, self._retry_s * 2)

    def _count(self, cause: str) -> None:
        if self._metrics is not None:
            self._metrics.record_topic_reader_error(self._name, cause)

    def _set_loaded(self, why: str) -> None:
        if not self.loaded.is_set():
            log.info("%s loaded: %s", self.topic, why)
            self.loaded.set()


def _described(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    return f"{error.name()}: {error.str()}" if isinstance(error, KafkaError) else str(exc)
