"""Control topics that cannot be read, against the real broker (issue 43, finding 2).

Only a topic the broker does not know is read as empty. A topic the broker refuses (here `..`:
a name the settings accept and the broker answers TOPIC_EXCEPTION for, standing in for one the
client is not authorized to read: both are a metadata error on the topic; the secured broker's
TOPIC_AUTHORIZATION_FAILED is in tests/secure/test_secure_service.py), or a broker that does
not answer, keeps the reader not loaded and the replica not ready, consuming nothing. A reader
whose consumer fails is started again and reads on; a record its table cannot take is skipped.
Every failure shows in `fraud_topic_reader_*`.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client import CollectorRegistry

from stream import compacted_topic
from stream.compacted_topic import CompactedTopicReader
from stream.metrics import ServiceMetrics
from tests.integration.conftest import BOOTSTRAP, ServiceProcess, Topics, produce, read_topic
from tests.integration.test_pipeline import simulated
from tests.support.network import free_port, http_status
from tests.support.topics import create_topics, delete_topics
from tests.support.waiting import wait_until

#: A topic name the settings accept and the broker refuses ("Invalid topic").
REFUSED_TOPIC = ".."
#: How long a test watches a reader or replica that must not load meanwhile.
WATCHED_S = 6.0


class Reading:
    """A reader of `topic` on the real broker, what it applied, and its metrics."""

    def __init__(
        self,
        topic: str,
        kafka: dict[str, Any] | None = None,
        apply: Callable[[Message], None] | None = None,
    ) -> None:
        self.applied: list[tuple[int, bytes | None]] = []
        self.registry = CollectorRegistry()
        self.reader = CompactedTopicReader(
            kafka or {"bootstrap.servers": BOOTSTRAP},
            topic,
            apply or (lambda m: self.applied.append((m.offset() or 0, m.value()))),
            name="rules",
            metrics=ServiceMetrics(self.registry),
        )
        self.reader.start()

    def errors(self, cause: str) -> float:
        sample = {"reader": "rules", "cause": cause}
        return self.registry.get_sample_value("fraud_topic_reader_errors_total", sample) or 0.0

    def age_s(self) -> float:
        sample = {"reader": "rules"}
        value = self.registry.get_sample_value("fraud_topic_reader_read_age_seconds", sample)
        assert value is not None
        return value


@pytest.fixture
def readings() -> Iterator[Callable[..., Reading]]:
    made: list[Reading] = []

    def make(*args: Any, **kwargs: Any) -> Reading:
        made.append(Reading(*args, **kwargs))
        return made[-1]

    yield make
    for reading in made:
        reading.reader.close()


@pytest.fixture
def compacted_topic_factory(admin: AdminClient) -> Iterator[Callable[[], str]]:
    created: list[str] = []

    def make() -> str:
        name = f"control-{uuid.uuid4().hex[:10]}"
        config = {"cleanup.policy": "compact"}
        created.extend(create_topics(admin, [NewTopic(name, 2, 1, config=config)]))
        return name

    yield make
    delete_topics(admin, created)


def records(n: int) -> list[tuple[bytes | None, bytes | None]]:
    return [(f"k{i}".encode(), f"v{i}".encode()) for i in range(n)]


def test_a_topic_that_does_not_exist_is_read_as_empty(
    readings: Callable[..., Reading],
) -> None:
    reading = readings(f"control-missing-{uuid.uuid4().hex[:10]}")
    wait_until(reading.reader.loaded.is_set, 15.0, "loaded")
    assert reading.applied == [] and reading.reader.problem is None
    assert reading.age_s() < 5.0 and reading.errors("unreadable") == 0


def test_a_topic_the_broker_refuses_is_never_loaded(readings: Callable[..., Reading]) -> None:
    # Finding 2: a metadata error on the topic (TOPIC_AUTHORIZATION_FAILED among them) was
    # logged as "not there yet" and the topic marked loaded, empty.
    reading = readings(REFUSED_TOPIC)
    wait_until(lambda: reading.errors("unreadable") >= 2, 15.0, "two tries counted")
    time.sleep(1.0)
    assert not reading.reader.loaded.is_set()
    problem = reading.reader.problem
    assert problem is not None and "TOPIC_EXCEPTION" in problem, problem
    assert reading.age_s() >= 1.0


def test_a_broker_that_does_not_answer_is_never_loaded(
    readings: Callable[..., Reading], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Finding 2: a metadata failure marked the topic loaded ("not there yet").
    monkeypatch.setattr(compacted_topic, "METADATA_TIMEOUT_S", 1.0)
    silent = {"bootstrap.servers": f"127.0.0.1:{free_port()}", "log_level": 0}
    reading = readings(f"control-{uuid.uuid4().hex[:10]}", silent)
    wait_until(lambda: reading.errors("unreadable") >= 2, 15.0, "two tries counted")
    assert not reading.reader.loaded.is_set()
    assert reading.reader.problem is not None and "no metadata" in reading.reader.problem


def test_a_consumer_that_fails_is_started_again_and_reads_every_record_once(
    readings: Callable[..., Reading],
    compacted_topic_factory: Callable[[], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Finding 2: an error out of the consumer ended the reader's thread for good.
    topic = compacted_topic_factory()
    produce(topic, records(40))
    failures = iter([False, False, True])

    class FailingOnce(Consumer):
        def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
            if next(failures, False):
                raise KafkaException(KafkaError(KafkaError._FAIL, "the consumer failed"))
            return super().consume(min(num_messages, 7), timeout)

    monkeypatch.setattr(compacted_topic, "Consumer", FailingOnce)
    monkeypatch.setattr(compacted_topic, "RETRY_MIN_S", 0.05)
    reading = readings(topic)
    wait_until(reading.reader.loaded.is_set, 30.0, "loaded")
    assert reading.errors("restart") == 1
    values = sorted(value or b"" for _, value in reading.applied)
    assert values == sorted(f"v{i}".encode() for i in range(40)), "each record once"
    produce(topic, [(b"later", b"after the restart")])
    wait_until(lambda: len(reading.applied) == 41, 15.0, "a record written later")
    assert reading.reader.alive()


def test_a_record_its_table_cannot_take_is_skipped_and_counted(
    readings: Callable[..., Reading], compacted_topic_factory: Callable[[], str]
) -> None:
    topic = compacted_topic_factory()
    produce(topic, records(10))
    taken: list[bytes | None] = []
    lock = threading.Lock()

    def apply(message: Message) -> None:
        if message.value() == b"v3":
            raise RuntimeError("a bug in the table")
        with lock:
            taken.append(message.value())

    reading = readings(topic, apply=apply)
    wait_until(reading.reader.loaded.is_set, 30.0, "loaded")
    assert sorted(v or b"" for v in taken) == sorted(f"v{i}".encode() for i in range(10) if i != 3)
    assert reading.errors("record") == 1 and reading.reader.alive()


def ready(service: ServiceProcess) -> tuple[int, str]:
    assert service.process.poll() is None, f"service exited early:\n{service.log()}"
    return http_status(service.metrics_port, "/readyz"), service.log()


@pytest.mark.parametrize(
    ("flag", "reader"),
    [
        ("--rules-topic", "rules"),
        ("--terminal-risk-topic", "terminal-risk"),
        ("--card-frauds-topic", "card-frauds"),
    ],
)
def test_a_replica_whose_control_topic_cannot_be_read_stays_not_ready_and_consumes_nothing(
    topics_factory: Callable[..., Topics],
    service_factory: Callable[..., ServiceProcess],
    flag: str,
    reader: str,
) -> None:
    # Finding 2: the replica marked the topic loaded and scored without it (with the file's
    # rules only; with neutral terminal risk; with no card frauds).
    topics = topics_factory(partitions=1)
    first, _ = simulated(20, seed=41, prefix="closed")
    produce(topics.input, first)
    service = service_factory(topics, flag, REFUSED_TOPIC)
    errors = f'fraud_topic_reader_errors_total{{cause="unreadable",reader="{reader}"}}'
    service.wait_for_metric(errors, 2)
    time.sleep(WATCHED_S)

    assert ready(service)[0] == 503
    assert read_topic(topics.output, 1, timeout_s=1.0, settle_s=0.0) == [], "nothing decided"
    age = f'fraud_topic_reader_read_age_seconds{{reader="{reader}"}}'
    assert service.metric(age) >= WATCHED_S
    assert service.metric("fraud_records_consumed_total") == 0
    assert f"{REFUSED_TOPIC} cannot be read (TOPIC_EXCEPTION" in service.log()


def test_a_replica_whose_labels_cannot_be_read_decides_and_says_so(
    topics_factory: Callable[..., Topics], service_factory: Callable[..., ServiceProcess]
) -> None:
    # The labels decide nothing: a replica never waits for them, but their reader is not silent.
    topics = topics_factory(partitions=1)
    first, sent = simulated(20, seed=43, prefix="labels")
    produce(topics.input, first)
    service = service_factory(topics, "--observed-precision", "on", "--labels-topic", REFUSED_TOPIC)
    assert len(read_topic(topics.output, len(sent))) == len(sent)
    errors = 'fraud_topic_reader_errors_total{cause="unreadable",reader="labels"}'
    service.wait_for_metric(errors, 1)
    wait_until(lambda: ready(service)[0] == 200, 30.0, "/readyz 200", interval_s=0.2)


def emptied_topic(admin: AdminClient, made: list[str], records: int) -> str:
    """A compacted topic (with retention, which delete_records needs) that held `records` and
    whose records were all deleted since: its first offset is its end, past 0."""
    name = f"control-{uuid.uuid4().hex[:10]}"
    config = {"cleanup.policy": "compact,delete"}
    made.extend(create_topics(admin, [NewTopic(name, 1, 1, config=config)]))
    produce(name, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(records)])
    for future in admin.delete_records([TopicPartition(name, 0, OFFSET_END)]).values():
        future.result(timeout=30)
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": f"w-{uuid.uuid4().hex}"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(name, 0), timeout=30)
    finally:
        consumer.close()
    assert low == high == records, (low, high)
    return name


def test_a_replica_whose_control_topics_were_emptied_becomes_ready(
    admin: AdminClient,
    topics_factory: Callable[..., Topics],
    service_factory: Callable[..., ServiceProcess],
) -> None:
    # The review of issue 43: a control topic whose records were all deleted (compaction,
    # retention, delete_records) has offsets but nothing to consume; librdkafka's position in
    # it stayed OFFSET_INVALID, so its reader was never loaded and the replica never ready
    # (/readyz "loading the rules topic", with no reason).
    made: list[str] = []
    try:
        rules, risk = emptied_topic(admin, made, 3), emptied_topic(admin, made, 5)
        topics = topics_factory(partitions=1)
        first, sent = simulated(20, seed=47, prefix="emptied")
        produce(topics.input, first)
        service = service_factory(topics, "--rules-topic", rules, "--terminal-risk-topic", risk)
        wait_until(lambda: ready(service)[0] == 200, 30.0, "/readyz 200", interval_s=0.2)
        assert len(read_topic(topics.output, len(sent))) == len(sent)
        assert f"{rules} loaded" in service.log() and f"{risk} loaded" in service.log()
    finally:
        delete_topics(admin, made)
