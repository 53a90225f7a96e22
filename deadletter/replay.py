"""`fraud-dlq replay`: re-produce selected dead letters to their original topic, resumably.

Each replayed record carries the dead letter's original key and value bytes and its original
headers, without the service's `dlq.*` headers and with `dlq.replayed_from`
(`contracts.dead_letter`). The replay reads as a consumer group and commits its own position in
the dead-letter topic, and only past records whose outcome is settled: replayed and acknowledged
by the broker, skipped by the filters, or skipped as incomplete (value, key or headers dropped).
So a replay that is interrupted (signal, crash, `max_records`) resumes at the first unsettled
record; what was acknowledged and committed is never produced again. Records acknowledged after
the last commit of a run that crashed are produced again by the next run: delivery is
at-least-once, like the service's.

A failed delivery stops the run: the position cannot pass a record that was not replayed, and
replaying what follows it would only be repeated by the next run.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from contracts.dead_letter import INCOMPLETE_MARKERS, ORIGINAL_TOPIC, replay_headers
from contracts.offsets import OffsetTracker
from deadletter.reader import (
    DeadLetter,
    DeadLetterFilter,
    DeadLetterReader,
    DeadLetterToolError,
    PartitionRange,
    kafka_error_text,
)
from plumbing.kafka_errors import delivery_error, stored

DEFAULT_GROUP = "fraud-dlq-replay"
#: Commit the acknowledged position this often, so that a crash repeats at most this much work.
COMMIT_INTERVAL_S = 5.0
#: Redraw the progress line at most this often.
PROGRESS_INTERVAL_S = 0.5
PROGRESS_BAR_CHARS = 30
#: How long to wait for room in librdkafka's produce queue before trying again.
QUEUE_FULL_WAIT_S = 0.1

#: Why a run stopped before the end of its ranges (`ReplaySummary.stopped_by`).
STOPPED_MAX_RECORDS = "max-records"
STOPPED_ERROR = "error"


@dataclass(frozen=True)
class ReplayOptions:
    """How a replay runs: its group, destination, limit, and whether it only reports."""

    group: str = DEFAULT_GROUP
    #: Replay every record here instead of its `dlq.original.topic`.
    to_topic: str | None = None
    dry_run: bool = False
    #: Stop after this many records replayed (acknowledged), or planned in a dry run.
    max_records: int | None = None

    def __post_init__(self) -> None:
        if not self.group.strip():
            raise ValueError("group must not be empty")
        if self.to_topic is not None and not self.to_topic.strip():
            raise ValueError("to_topic must not be empty")
        if self.max_records is not None and self.max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {self.max_records}")


@dataclass
class ReplaySummary:
    """What one replay run did (in a dry run: would have done)."""

    topic: str
    group: str
    dry_run: bool
    #: Records of the dead-letter topic read by this run.
    read: int = 0
    #: Read records that the filters selected.
    selected: int = 0
    skipped_by_filter: int = 0
    skipped_incomplete: int = 0
    failed: int = 0
    #: Records acknowledged by the broker (in a dry run: to be replayed), per destination topic.
    to_topics: Counter[str] = field(default_factory=Counter)
    #: None when the run read to the end; else `max-records`, `error` or a signal's name.
    stopped_by: str | None = None
    #: The first failure, naming the topic.
    error: str | None = None

    @property
    def replayed(self) -> int:
        """Selected records acknowledged by the broker at their destination (none in a dry run)."""
        return 0 if self.dry_run else self.to_topics.total()

    def as_dict(self) -> dict[str, Any]:
        """The summary as one JSON-ready object."""
        return {
            "topic": self.topic,
            "group": self.group,
            "dry_run": self.dry_run,
            "read": self.read,
            "selected": self.selected,
            "replayed": self.replayed,
            "skipped_by_filter": self.skipped_by_filter,
            "skipped_incomplete": self.skipped_incomplete,
            "failed": self.failed,
            "to_topics": dict(self.to_topics),
            "stopped_by": self.stopped_by,
            "error": self.error,
        }

    def render_text(self) -> str:
        """The summary for a person to read."""
        verb = "would replay" if self.dry_run else "replayed"
        targets = ", ".join(f"{t}={n}" for t, n in self.to_topics.most_common()) or "nothing"
        lines = [
            f"{self.topic} (group {self.group}): read {self.read}, selected {self.selected}, "
            f"{verb} {self.to_topics.total()} ({targets})",
            f"  skipped: {self.skipped_by_filter} by the filters, "
            f"{self.skipped_incomplete} incomplete (value, key or headers dropped); "
            f"failed: {self.failed}",
        ]
        if self.dry_run:
            lines.append("  dry run: nothing produced, no position committed")
        if self.stopped_by == STOPPED_ERROR:
            lines.append("  stopped by an error: fix it, then run again to continue")
        elif self.stopped_by is not None:
            lines.append(f"  stopped early ({self.stopped_by}): run again to continue")
        return "\n".join(lines)


class Progress:
    """A progress line on stderr: records read of the total, records replayed, rate."""

    def __init__(
        self,
        total: int,
        *,
        enabled: bool,
        done_label: str = "replayed",
        stream: TextIO | None = None,
        interval_s: float = PROGRESS_INTERVAL_S,
    ) -> None:
        self._total = total
        self._enabled = enabled
        self._done_label = done_label
        self._stream = sys.stderr if stream is None else stream
        self._interval_s = interval_s
        # On a terminal the line redraws itself; in a log each update is a line of its own.
        self._end = "\r" if self._stream.isatty() else "\n"
        self._started = time.monotonic()
        self._next_draw = self._started

    def finish(self, read: int, done: int, *, reached_end: bool) -> None:
        """Draw the last line. The total counts offsets, and transaction markers or aborted
        records occupy offsets too: a run that reached the end has read all there was."""
        if reached_end:
            self._total = read
        self.update(read, done, final=True)

    def update(self, read: int, done: int, *, final: bool = False) -> None:
        """Redraw the line, at most every `interval_s` unless `final`."""
        now = time.monotonic()
        if not self._enabled or (now < self._next_draw and not final):
            return
        self._next_draw = now + self._interval_s
        share = read / self._total if self._total else 1.0
        filled = round(share * PROGRESS_BAR_CHARS)
        bar = "#" * filled + "-" * (PROGRESS_BAR_CHARS - filled)
        elapsed_s = now - self._started
        rate = read / elapsed_s if elapsed_s > 0 else 0.0
        print(
            f"replay [{bar}] {read}/{self._total} read {share:4.0%}  "
            f"{self._done_label} {done}  {rate:,.0f} records/s",
            end="\n" if final else self._end,
            file=self._stream,
            flush=True,
        )


#: Idempotence and acks=all: a replayed record is written once and durably, in order per key.
PRODUCER_SETTINGS: dict[str, Any] = {"enable.idempotence": True, "acks": "all", "linger.ms": 5}


def create_producer(kafka: Mapping[str, Any]) -> Producer:
    """An idempotent producer (`PRODUCER_SETTINGS`, plus `kafka`)."""
    try:
        return Producer({**PRODUCER_SETTINGS, **kafka})
    except KafkaException as exc:
        raise DeadLetterToolError(f"cannot create a producer: {kafka_error_text(exc)}") from exc


class Replayer:
    """Replays the dead letters that a filter selects, committing its position as it goes.

    Without a producer (a dry run) it counts what it would replay, and commits nothing.
    """

    def __init__(
        self,
        reader: DeadLetterReader,
        producer: Producer | None,
        where: DeadLetterFilter,
        options: ReplayOptions,
        *,
        progress: bool = True,
    ) -> None:
        if (producer is None) != options.dry_run:
            raise ValueError("a dry run has no producer, and a real run needs one")
        self._reader = reader
        self._producer = producer
        self._where = where
        self._options = options
        self._progress = progress
        self._tracker = OffsetTracker()
        self._checked_topics: set[str] = set()
        self._in_flight = 0
        self.summary = ReplaySummary(reader.topic, options.group, options.dry_run)

    def stop(self, reason: str) -> None:
        """Ask the run to stop after the record at hand (from a signal handler, too)."""
        if self.summary.stopped_by is None:
            self.summary.stopped_by = reason

    def run(self) -> ReplaySummary:
        """Replay from the group's committed position to the end of the topic as of now."""
        ranges = self._reader.plan(self._where, resume=True)
        progress = Progress(
            sum(r.end - r.start for r in ranges),
            enabled=self._progress,
            done_label="would replay" if self._options.dry_run else "replayed",
        )
        try:
            self._replay(ranges, progress)
        except DeadLetterToolError as exc:
            self.summary.error = self.summary.error or str(exc)
            self.stop(STOPPED_ERROR)
        finally:
            self._settle()
            summary = self.summary
            progress.finish(
                summary.read, summary.to_topics.total(), reached_end=summary.stopped_by is None
            )
        return self.summary

    def _replay(self, ranges: list[PartitionRange], progress: Progress) -> None:
        next_commit = time.monotonic() + COMMIT_INTERVAL_S
        for letter in self._reader.records(ranges):
            self._tracker.track((self._reader.topic, letter.partition), letter.offset)
            self.summary.read += 1
            self._handle(letter)
            if self._producer is not None:
                self._producer.poll(0)  # delivery reports → the position advances
            if time.monotonic() >= next_commit:
                self._commit()
                next_commit = time.monotonic() + COMMIT_INTERVAL_S
            progress.update(self.summary.read, self.summary.to_topics.total())
            limit = self._options.max_records
            if limit is not None and self._attempted() >= limit:
                self.stop(STOPPED_MAX_RECORDS)
            if self.summary.stopped_by is not None:
                return

    def _attempted(self) -> int:
        """Records produced or planned so far, acknowledged or not."""
        return self.summary.to_topics.total() + self._in_flight + self.summary.failed

    def _handle(self, letter: DeadLetter) -> None:
        summary = self.summary
        position = (self._reader.topic, letter.partition)
        if not self._where.matches(letter):
            summary.skipped_by_filter += 1
            self._tracker.finish(position, letter.offset)
            return
        summary.selected += 1
        if any(marker in letter.decoded for marker in INCOMPLETE_MARKERS):
            summary.skipped_incomplete += 1
            self._tracker.finish(position, letter.offset)
            return
        try:
            topic = self._destination(letter)
            if self._producer is None:
                summary.to_topics[topic] += 1
            else:
                self._produce(self._producer, letter, topic)
        except DeadLetterToolError as exc:
            self._fail(str(exc))

    def _destination(self, letter: DeadLetter) -> str:
        topic = self._options.to_topic or letter.decoded.get(ORIGINAL_TOPIC)
        where = f"{self._reader.topic}/{letter.partition}/{letter.offset}"
        if not topic:
            raise DeadLetterToolError(f"{where} has no {ORIGINAL_TOPIC} header: replay it --to")
        if topic not in self._checked_topics:
            try:
                self._reader.partitions_of(topic)
            except DeadLetterToolError as exc:
                raise DeadLetterToolError(f"cannot replay {where}: {exc}") from exc
            self._checked_topics.add(topic)
        return topic

    def _produce(self, producer: Producer, letter: DeadLetter, topic: str) -> None:
        source = self._reader.topic
        # Typed as confluent-kafka's produce() declares it (a list is invariant in its items).
        headers: list[tuple[str, str | bytes | None]] = [
            *replay_headers(letter.headers, source, letter.partition, letter.offset)
        ]

        def delivered(error: KafkaError | None, message: Message) -> None:
            self._in_flight -= 1
            if not stored(error, message):
                where = f"{source}/{letter.partition}/{letter.offset}"
                self._fail(f"cannot replay {where}: {delivery_error(error, topic)}")
                return
            self.summary.to_topics[topic] += 1
            self._tracker.finish((source, letter.partition), letter.offset)

        while True:
            try:
                producer.produce(
                    topic,
                    value=letter.value,
                    key=letter.key,
                    headers=headers,
                    on_delivery=delivered,
                )
                break
            except BufferError:
                producer.poll(QUEUE_FULL_WAIT_S)
            except KafkaException as exc:
                raise DeadLetterToolError(
                    f"cannot replay to {topic!r}: {kafka_error_text(exc)}"
                ) from exc
        self._in_flight += 1

    def _fail(self, error: str) -> None:
        """A selected record could not be replayed: count it, keep the first error, stop."""
        self.summary.failed += 1
        self.summary.error = self.summary.error or error
        self.stop(STOPPED_ERROR)

    def _settle(self) -> None:
        """Wait for every delivery report, then commit the acknowledged position."""
        if self._producer is None:
            return
        # No timeout needed: librdkafka reports every record within its message.timeout.ms.
        self._producer.flush()
        self._commit()

    def _commit(self) -> None:
        if self._producer is None:
            return
        positions = self._tracker.take_commit_positions()
        self._reader.commit({partition: offset for (_, partition), offset in positions.items()})
