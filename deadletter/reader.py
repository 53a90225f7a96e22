"""Reading the dead-letter topic, and choosing which dead letters a command acts on.

A `DeadLetterReader` reads each partition from a start position (its beginning, or a consumer
group's committed position) to its end as of the moment the read was planned: records that
arrive later are left for the next run, so every run ends. A `DeadLetterFilter` selects dead
letters by their headers and their place in the topic; `inspect` and `replay` share both.

librdkafka errors are translated here, at the boundary, into `DeadLetterToolError` naming the
topic, so the command line can report them in one line.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, NamedTuple, cast

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from contracts.dead_letter import (
    ERROR,
    HEADERS_DROPPED,
    ORIGINAL_TOPIC,
    REASON,
    UNREADABLE_HEADERS,
    Headers,
    decode_headers,
    failed_at_ms,
    read_headers,
)
from plumbing.errors import FraudScorerError

#: How long one metadata, watermark or commit request, and a read that makes no progress, may
#: take before the broker is declared unreachable.
REQUEST_TIMEOUT_S = 10.0
#: consume() returns after this long even with fewer records, so the loop sees the end promptly.
CONSUME_WAIT_S = 0.2
#: Records fetched per consume() call.
CONSUME_BATCH_RECORDS = 500
#: Prefix of the throw-away group of a read that commits nothing (librdkafka needs a group.id).
EPHEMERAL_GROUP_PREFIX = "fraud-dlq-inspect-"

READER_SETTINGS: dict[str, Any] = {
    # Positions are committed explicitly, and only by `replay`, after delivery (never on a timer).
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    # The end of a partition is found by this event as well as by offset: a transactional
    # producer's commit marker occupies the last offset and is never delivered as a record.
    "enable.partition.eof": True,
    # A start position deleted by retention meanwhile: read from the oldest record left.
    "auto.offset.reset": "earliest",
}


class DeadLetterToolError(FraudScorerError):
    """The dead-letter tool cannot do its work with the broker; the message names the topic."""


def kafka_error_text(exc: KafkaException) -> str:
    """librdkafka's own description of the error carried by `exc`."""
    error = exc.args[0] if exc.args else None
    return error.str() if isinstance(error, KafkaError) else str(exc)


def parse_time(text: str) -> int:
    """Epoch milliseconds of `text`: epoch ms, or ISO-8601 (UTC unless it names an offset)."""
    text = text.strip()
    if text.isdecimal():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"expected epoch milliseconds or ISO-8601 like 2026-11-30T10:00:00Z, got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


class PartitionRange(NamedTuple):
    """The offsets [start, end) of one partition of the dead-letter topic that a run reads."""

    partition: int
    start: int
    end: int


class DeadLetter(NamedTuple):
    """One record of the dead-letter topic: where it is, its bytes, and its headers decoded."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    decoded: dict[str, str]

    @classmethod
    def of(cls, message: Message) -> DeadLetter:
        """The dead letter a consumed record holds (librdkafka sets partition and offset)."""
        headers = read_headers(message)
        decoded = decode_headers(headers)
        if headers is None:
            decoded[HEADERS_DROPPED] = UNREADABLE_HEADERS
        return cls(
            cast(int, message.partition()),
            cast(int, message.offset()),
            message.key(),
            message.value(),
            headers or [],
            decoded,
        )


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters a command acts on; an empty field selects everything.

    Times bound `dlq.failed_at` as since <= failed_at < until; offsets are an inclusive range in
    one partition of the dead-letter topic.
    """

    reasons: frozenset[str] = frozenset()
    errors: frozenset[str] = frozenset()
    original_topic: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    partition: int | None = None
    from_offset: int | None = None
    to_offset: int | None = None

    def __post_init__(self) -> None:
        for name in ("since_ms", "until_ms", "partition", "from_offset", "to_offset"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        since, until = self.since_ms, self.until_ms
        if since is not None and until is not None and since >= until:
            raise ValueError(f"since must be before until, got since={since} until={until}")
        first, last = self.from_offset, self.to_offset
        if first is not None and last is not None and first > last:
            raise ValueError(f"from-offset must be <= to-offset, got {first} > {last}")
        if (first is not None or last is not None) and self.partition is None:
            raise ValueError("an offset range needs a partition: offsets are per partition")

    def matches(self, letter: DeadLetter) -> bool:
        """Whether `letter` is selected."""
        partition, offset, headers = letter.partition, letter.offset, letter.decoded
        if self.partition is not None and partition != self.partition:
            return False
        if self.from_offset is not None and offset < self.from_offset:
            return False
        if self.to_offset is not None and offset > self.to_offset:
            return False
        if self.reasons and headers.get(REASON) not in self.reasons:
            return False
        if self.errors and headers.get(ERROR) not in self.errors:
            return False
        if self.original_topic is not None and headers.get(ORIGINAL_TOPIC) != self.original_topic:
            return False
        if self.since_ms is None and self.until_ms is None:
            return True
        failed_at = failed_at_ms(headers)
        if failed_at is None:
            return False
        if self.since_ms is not None and failed_at < self.since_ms:
            return False
        return self.until_ms is None or failed_at < self.until_ms

    def clip(self, partition: int, start: int, end: int) -> PartitionRange | None:
        """The part of `partition`'s offsets [start, end) this filter can select, if any."""
        if self.partition is not None and partition != self.partition:
            return None
        if self.from_offset is not None:
            start = max(start, self.from_offset)
        if self.to_offset is not None:
            end = min(end, self.to_offset + 1)
        return PartitionRange(partition, start, end) if start < end else None


class DeadLetterReader:
    """Reads one dead-letter topic, and commits a consumer group's position in it.

    Without a group the reader uses a throw-away one and must not commit.
    """

    def __init__(self, kafka: Mapping[str, Any], topic: str, group: str | None = None) -> None:
        self.topic = topic
        self.group = group
        settings = {
            **READER_SETTINGS,
            **kafka,
            "group.id": group or f"{EPHEMERAL_GROUP_PREFIX}{uuid.uuid4().hex[:8]}",
        }
        try:
            self._consumer = Consumer(settings)
        except KafkaException as exc:
            raise DeadLetterToolError(f"cannot create a consumer: {kafka_error_text(exc)}") from exc

    def __enter__(self) -> DeadLetterReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Leave the broker; the reader cannot be used afterwards."""
        self._consumer.close()

    def partitions_of(self, topic: str) -> list[int]:
        """The partitions of `topic`; DeadLetterToolError if it does not exist or is unreadable."""
        try:
            metadata = self._consumer.list_topics(topic, timeout=REQUEST_TIMEOUT_S).topics[topic]
        except KafkaException as exc:
            raise DeadLetterToolError(
                f"cannot look up topic {topic!r}: {kafka_error_text(exc)}"
            ) from exc
        if metadata.error is not None:
            raise DeadLetterToolError(f"topic {topic!r} cannot be used: {metadata.error.str()}")
        return sorted(metadata.partitions)

    def plan(self, where: DeadLetterFilter, *, resume: bool) -> list[PartitionRange]:
        """The non-empty ranges to read: from each partition's beginning, or from the group's
        committed position when `resume`, to its end now; narrowed by `where`'s offsets."""
        try:
            return self._plan(where, resume)
        except KafkaException as exc:
            raise DeadLetterToolError(
                f"cannot read {self.topic!r}: {kafka_error_text(exc)}"
            ) from exc

    def _plan(self, where: DeadLetterFilter, resume: bool) -> list[PartitionRange]:
        partitions = self.partitions_of(self.topic)
        if where.partition is not None and where.partition not in partitions:
            raise DeadLetterToolError(
                f"topic {self.topic!r} has no partition {where.partition} "
                f"(it has {len(partitions)})"
            )
        committed = {p: OFFSET_INVALID for p in partitions}
        if resume:
            positions = self._consumer.committed(
                [TopicPartition(self.topic, p) for p in partitions], timeout=REQUEST_TIMEOUT_S
            )
            committed = {tp.partition: tp.offset for tp in positions}
        ranges = []
        for partition in partitions:
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(self.topic, partition), timeout=REQUEST_TIMEOUT_S
            )
            # A committed position older than the oldest record left was deleted by retention.
            start = max(low, committed[partition])
            selected = where.clip(partition, start, high)
            if selected is not None:
                ranges.append(selected)
        return ranges

    def records(self, ranges: list[PartitionRange]) -> Iterator[DeadLetter]:
        """The records of `ranges`, in offset order within each partition."""
        ends = {r.partition: r.end for r in ranges}
        try:
            self._consumer.assign(
                [TopicPartition(self.topic, r.partition, r.start) for r in ranges]
            )
            last_progress = time.monotonic()
            while ends:
                messages = self._consumer.consume(CONSUME_BATCH_RECORDS, CONSUME_WAIT_S)
                if not messages:
                    if time.monotonic() - last_progress > REQUEST_TIMEOUT_S:
                        raise DeadLetterToolError(
                            f"cannot read {self.topic!r}: no records for {REQUEST_TIMEOUT_S:.0f}s "
                            f"before the end of partitions {sorted(ends)}"
                        )
                    continue
                last_progress = time.monotonic()
                for message in messages:
                    yield from self._within(message, ends)
        except KafkaException as exc:
            raise DeadLetterToolError(
                f"cannot read {self.topic!r}: {kafka_error_text(exc)}"
            ) from exc

    def _within(self, message: Message, ends: dict[int, int]) -> Iterator[DeadLetter]:
        """`message`'s dead letter if it lies in its partition's range; drops a finished range
        from `ends`."""
        partition = cast(int, message.partition())
        if partition not in ends:
            return
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                raise DeadLetterToolError(
                    f"cannot read {self.topic!r} partition {partition}: {error.str()}"
                )
            del ends[partition]
            return
        offset = cast(int, message.offset())
        if offset < ends[partition]:
            yield DeadLetter.of(message)
        if offset >= ends[partition] - 1:
            del ends[partition]

    def commit(self, positions: Mapping[int, int]) -> None:
        """Commit the group's position (next offset to read) of these partitions, synchronously."""
        if not positions:
            return
        offsets = [TopicPartition(self.topic, p, o) for p, o in sorted(positions.items())]
        try:
            results = self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            raise DeadLetterToolError(
                f"cannot commit the position of group {self.group!r} in {self.topic!r}: "
                f"{kafka_error_text(exc)}"
            ) from exc
        for result in results or []:
            if result.error is not None:
                raise DeadLetterToolError(
                    f"cannot commit the position of group {self.group!r} in {self.topic!r} "
                    f"partition {result.partition}: {result.error.str()}"
                )
