"""The reader of a compacted topic (stream/compacted_topic.py) with a scripted consumer: only a
topic the broker does not know is read as empty; one that cannot be read (no metadata, not
authorized, its ends unknown, read errors) keeps the reader not loaded and says why; a
consumer that fails is replaced and reads on from where it stopped; nothing is silent
(issue 43, finding 2); a read to the end is done only once what was written before it is
applied, and never while the ends cannot be had. The same against the real broker:
tests/integration/test_control_topics.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from prometheus_client import CollectorRegistry

from stream import compacted_topic
from stream.compacted_topic import CompactedTopicReader
from stream.metrics import ServiceMetrics
from tests.support.waiting import wait_until

TOPIC = "control"


class Record:
    def __init__(self, offset: int, error: KafkaError | None = None) -> None:
        self._offset, self._error = offset, error

    def error(self) -> KafkaError | None:
        return self._error

    def key(self) -> bytes:
        return b"k%d" % self._offset

    def value(self) -> bytes:
        return b"v"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return 1, 0


class Script:
    """What the broker does, shared by every consumer a reader makes (it makes a new one after
    a failure): `records` in one partition, handed out `per_read` at a time."""

    records = 10
    #: The first offset the partition still holds (deleted, compacted or expired before it):
    #: `records` too when none is left.
    low = 0
    per_read = 3
    #: Metadata: raise (`away`), or the topic's error code, or its one partition.
    away = False
    topic_error: int | None = None
    #: End offsets that fail this many times first.
    ends_fail = 0
    #: Reads that raise (the consumer failed), by how many reads were made before.
    consume_raises_at: ClassVar[set[int]] = set()
    #: Reads that return a read error instead of records while this is set.
    read_error: KafkaError | None = None


class ScriptedConsumer:
    script: ClassVar[type[Script]] = Script
    made: ClassVar[list[ScriptedConsumer]] = []
    reads = 0

    def __init__(self, _settings: dict[str, Any]) -> None:
        self.assigned: list[TopicPartition] = []
        #: Where the next read fetches from.
        self._fetch = 0
        #: What `position` says: as librdkafka, OFFSET_INVALID (-1001) until a record is
        #: consumed, then the offset after it.
        self._position = OFFSET_INVALID
        ScriptedConsumer.made.append(self)

    def list_topics(self, topic: str, timeout: float) -> Any:
        script = self.script
        if script.away:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Broker transport failure"))
        if script.topic_error is not None:
            error = KafkaError(script.topic_error)
            return SimpleNamespace(topics={topic: SimpleNamespace(error=error, partitions={})})
        partitions = {0: SimpleNamespace(id=0)}
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=partitions)})

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float) -> tuple[int, int]:
        if self.script.ends_fail > 0:
            self.script.ends_fail -= 1
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to get watermarks"))
        return self.script.low, self.script.records

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned.extend(partitions)
        start = partitions[0].offset
        if start == OFFSET_BEGINNING:
            self._fetch = self.script.low
        elif start == OFFSET_END:
            self._fetch = self.script.records
        else:
            self._fetch = start

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, 0, self._position)]

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        script = self.script
        ScriptedConsumer.reads += 1
        if ScriptedConsumer.reads in script.consume_raises_at:
            raise KafkaException(KafkaError(KafkaError._FATAL, "the consumer failed"))
        if script.read_error is not None:
            time.sleep(0.001)
            return [Record(-1, script.read_error)]
        if not self.assigned or self._fetch >= script.records:
            time.sleep(0.001)
            return []
        stop = min(script.records, self._fetch + script.per_read)
        records = [Record(offset) for offset in range(self._fetch, stop)]
        self._fetch = self._position = stop
        return records

    def close(self) -> None:
        pass


Reading = tuple[CompactedTopicReader, list[int], CollectorRegistry]


@pytest.fixture
def reading(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Reading]]:
    """`reading(apply=None, start_at=OFFSET_BEGINNING, **script)`: a started reader over a
    scripted broker, the offsets it applied, and its metrics."""
    readers: list[CompactedTopicReader] = []
    monkeypatch.setattr(compacted_topic, "RETRY_MIN_S", 0.01)
    monkeypatch.setattr(compacted_topic, "RETRY_MAX_S", 0.05)
    monkeypatch.setattr(compacted_topic, "MISSING_TOPIC_RETRY_S", 0.01)
    monkeypatch.setattr(compacted_topic, "READS_PER_ROUND", 5)
    ScriptedConsumer.made = []
    ScriptedConsumer.reads = 0

    def start(
        apply: Callable[[Any], None] | None = None, start_at: int = OFFSET_BEGINNING, **script: Any
    ) -> Reading:
        scripted = type("Scripted", (Script,), {"consume_raises_at": set(), **script})
        consumer = type("Consumer", (ScriptedConsumer,), {"script": scripted})
        monkeypatch.setattr(compacted_topic, "Consumer", consumer)
        applied: list[int] = []
        registry = CollectorRegistry()
        reader = CompactedTopicReader(
            {},
            TOPIC,
            apply or (lambda message: applied.append(message.offset())),
            name="rules",
            metrics=ServiceMetrics(registry),
            start_at=start_at,
        )
        reader.script = scripted  # type: ignore[attr-defined]
        readers.append(reader)
        reader.start()
        return reader, applied, registry

    yield start
    for reader in readers:
        reader.close()


def errors(registry: CollectorRegistry, cause: str) -> float:
    value = registry.get_sample_value(
        "fraud_topic_reader_errors_total", {"reader": "rules", "cause": cause}
    )
    return value or 0.0


def age_s(registry: CollectorRegistry) -> float:
    value = registry.get_sample_value("fraud_topic_reader_read_age_seconds", {"reader": "rules"})
    assert value is not None
    return value


def test_only_a_topic_the_broker_does_not_know_is_read_as_empty(
    reading: Callable[..., Reading],
) -> None:
    reader, applied, registry = reading(topic_error=KafkaError.UNKNOWN_TOPIC_OR_PART)
    wait_until(reader.loaded.is_set, what="loaded")
    assert applied == [] and reader.problem is None
    assert age_s(registry) < 1.0


@pytest.mark.parametrize(
    "broker",
    [
        {"away": True},
        {"topic_error": KafkaError.TOPIC_AUTHORIZATION_FAILED},
        {"topic_error": KafkaError.LEADER_NOT_AVAILABLE},
    ],
    ids=["no metadata", "not authorized", "no leader"],
)
def test_a_topic_that_cannot_be_read_is_never_loaded_and_says_why(
    reading: Callable[..., Reading], broker: dict[str, Any]
) -> None:
    # Finding 2: each of these marked the topic loaded (logged as "not there yet"): a replica
    # then scored without the rules of its topic.
    reader, applied, registry = reading(**broker)
    wait_until(lambda: errors(registry, "unreadable") >= 3, what="three tries counted")
    time.sleep(0.3)
    assert not reader.loaded.is_set()
    assert reader.problem, "says why"
    assert age_s(registry) >= 0.3
    assert reader.alive()
    reader.script.away, reader.script.topic_error = False, None  # type: ignore[attr-defined]
    wait_until(reader.loaded.is_set, what="loaded once the topic can be read")
    assert applied == list(range(10)) and reader.problem is None
    assert age_s(registry) < 1.0


def test_end_offsets_that_cannot_be_had_are_asked_again(reading: Callable[..., Reading]) -> None:
    # Finding 2: a watermark timeout ended the reader's thread for good, and marked the topic
    # loaded with nothing read.
    reader, applied, registry = reading(ends_fail=3)
    wait_until(reader.loaded.is_set, what="loaded")
    assert applied == list(range(10))
    assert errors(registry, "unreadable") == 3
    assert reader.alive()


def test_a_consumer_that_fails_is_replaced_and_reads_on_from_where_it_stopped(
    reading: Callable[..., Reading],
) -> None:
    # Finding 2: the reader's thread died for good ("reader stopped") and the topic counted as
    # loaded with what it had.
    reader, applied, registry = reading(consume_raises_at={2})
    wait_until(lambda: errors(registry, "restart") >= 1, what="restarted")
    wait_until(reader.loaded.is_set, what="loaded")
    assert applied == list(range(10)), "each record once, none lost"
    assert errors(registry, "restart") == 1
    assert len(ScriptedConsumer.made) == 2
    assert ScriptedConsumer.made[1].assigned[0].offset == 3, "from where the first one stopped"
    assert reader.alive()


def test_a_record_its_owner_cannot_take_is_skipped_and_counted(
    reading: Callable[..., Reading],
) -> None:
    applied: list[int] = []

    def apply(message: Any) -> None:
        if message.offset() == 4:
            raise RuntimeError("a bug in the table")
        applied.append(message.offset())

    reader, _, registry = reading(apply)
    wait_until(reader.loaded.is_set, what="loaded")
    assert applied == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert errors(registry, "record") == 1


def test_read_errors_after_loading_are_counted_and_the_age_grows(
    reading: Callable[..., Reading],
) -> None:
    # Authorization revoked after the start: the table keeps what it has, and says so.
    reader, applied, registry = reading()
    wait_until(reader.loaded.is_set, what="loaded")
    denied = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed")
    reader.script.read_error = denied  # type: ignore[attr-defined]
    wait_until(lambda: errors(registry, "unreadable") >= 3, what="read errors counted")
    time.sleep(0.3)
    assert reader.problem is not None and "TOPIC_AUTHORIZATION_FAILED" in reader.problem
    assert age_s(registry) >= 0.3
    assert reader.loaded.is_set() and applied == list(range(10))
    reader.script.read_error = None  # type: ignore[attr-defined]
    wait_until(lambda: reader.problem is None, what="readable again")
    assert age_s(registry) < 1.0


def test_a_topic_whose_records_were_all_deleted_is_loaded(
    reading: Callable[..., Reading],
) -> None:
    # The review of issue 43: a partition with offsets but no records left (low = high > 0:
    # after compaction, retention or delete_records) has no record to consume, so librdkafka's
    # position stayed OFFSET_INVALID, the reader was never caught up and the replica never
    # ready ("loading ..." with no reason).
    reader, applied, _ = reading(low=10, records=10)
    wait_until(reader.loaded.is_set, 5.0, what="loaded")
    assert applied == [] and reader.problem is None
    reader.script.records = 12  # type: ignore[attr-defined]
    wait_until(lambda: applied == [10, 11], 5.0, what="the records written since")


def test_a_topic_whose_first_records_were_deleted_is_loaded_once_the_rest_is_read(
    reading: Callable[..., Reading],
) -> None:
    reader, applied, _ = reading(low=4, records=10)
    wait_until(reader.loaded.is_set, 5.0, what="loaded")
    assert applied == list(range(4, 10))


def test_a_reader_that_starts_at_the_end_goes_on_from_there_after_its_consumer_failed(
    reading: Callable[..., Reading],
) -> None:
    # The review of issue 43: a partition of which nothing was read yet restarted from
    # OFFSET_BEGINNING in the new consumer, so the labels reader (which starts at the end)
    # applied the whole topic's history after a restart.
    reader, applied, registry = reading(start_at=OFFSET_END, consume_raises_at={3})
    wait_until(lambda: len(ScriptedConsumer.made) == 2, 5.0, what="a new consumer")
    wait_until(lambda: ScriptedConsumer.reads > 6, 5.0, what="reads by the new consumer")
    assert applied == [], "nothing written before the start"
    assert errors(registry, "restart") == 1
    assert ScriptedConsumer.made[1].assigned[0].offset == 10, "from the end it started at"
    reader.script.records = 12  # type: ignore[attr-defined]
    wait_until(lambda: applied == [10, 11], 5.0, what="the records written since")


class _Fatal(BaseException):
    """Not an Exception: nothing in the reader may take it for a failure to retry."""


def test_a_reader_whose_thread_ends_says_so_and_counts_it(
    reading: Callable[..., Reading], caplog: pytest.LogCaptureFixture
) -> None:
    # The review of issue 43: a reader's thread that ended was silent to health (`alive()` was
    # asked by nobody). `stopped()` names why, for the service's liveness, and it is counted.
    def apply(message: Any) -> None:
        if message.offset() == 4:
            raise _Fatal("the end of it")

    reader, _, registry = reading(apply)  # started: it may have ended already
    wait_until(lambda: not reader.alive(), 5.0, what="the thread ended")
    assert reader.stopped() == "_Fatal: the end of it"
    assert errors(registry, "stopped") == 1
    assert "control reader stopped (_Fatal: the end of it)" in caplog.text
    assert not reader.loaded.is_set()
    reader.close()
    assert reader.stopped() is None, "closed: stopped on purpose"


def test_a_read_to_the_end_counts_only_once_what_was_written_before_it_is_applied(
    reading: Callable[..., Reading],
) -> None:
    # FRAUD_WAIT_FOR_WORKER (stream/worker_alignment.py) scores a held batch only once the
    # tables hold what the worker's progress vouches for.
    gate, applied = threading.Event(), []

    def apply(message: Any) -> None:
        if message.offset() == 15:
            gate.wait(5)
        applied.append(message.offset())

    reader, _, _ = reading(apply=apply)
    wait_until(reader.loaded.is_set, what="loaded")
    reader.script.records = 20  # type: ignore[attr-defined]  # 10 more written since
    asked = reader.ask_read_to_end()
    wait_until(lambda: 14 in applied, what="reading on")
    time.sleep(0.1)
    assert not reader.read_to_end(asked), "offset 15 is not applied yet"
    gate.set()
    wait_until(lambda: reader.read_to_end(asked), what="read to the end")
    assert applied == list(range(20))


def test_a_read_to_the_end_whose_ends_cannot_be_had_is_never_done(
    reading: Callable[..., Reading],
) -> None:
    reader, applied, registry = reading()
    wait_until(reader.loaded.is_set, what="loaded")
    reader.script.ends_fail = 10**9  # type: ignore[attr-defined]
    asked = reader.ask_read_to_end()
    wait_until(lambda: errors(registry, "unreadable") >= 2, what="ends asked and refused")
    assert not reader.read_to_end(asked), "fails closed: an end not known is not reached"
    reader.script.ends_fail = 0  # type: ignore[attr-defined]
    wait_until(lambda: reader.read_to_end(asked), what="read to the end once the ends are had")
    assert applied == list(range(10))
