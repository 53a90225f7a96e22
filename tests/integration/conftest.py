"""Fixtures for integration tests against the real Kafka broker that `make test` starts.

A missing broker fails the run (it is never a silent skip). Every test gets its own topics and
consumer group, so tests never see each other's records.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import psycopg
import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from loadgen.options import DEFAULT_SEED
from loadgen.time_scale import time_scale
from plumbing.metrics_text import by_key, samples
from tests.support.network import free_port
from tests.support.topics import create_topics, delete_topics

BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def admin() -> AdminClient:
    client = AdminClient({"bootstrap.servers": BOOTSTRAP})
    try:
        client.list_topics(timeout=15)
    except Exception as exc:
        pytest.fail(f"no Kafka broker at {BOOTSTRAP} ({exc}); start one with `make kafka-up`")
    return client


#: The PostgreSQL server `make test` starts (ops/postgres/postgres.sh), for the review console.
POSTGRES = "postgresql://postgres@127.0.0.1:15432"


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh database of its own on the PostgreSQL server, dropped after the test."""
    name = f"review_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(f"{POSTGRES}/postgres", autocommit=True)
    except psycopg.OperationalError as exc:
        pytest.fail(f"no PostgreSQL at {POSTGRES} ({exc}); start it: ops/postgres/postgres.sh up")
    admin.execute(f"CREATE DATABASE {name}")
    yield f"{POSTGRES}/{name}"
    admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
    admin.close()


@dataclass(frozen=True)
class Topics:
    """One test's input, decision and dead-letter topics."""

    input: str
    output: str
    dlq: str
    partitions: int


@pytest.fixture
def topics_factory(admin: AdminClient) -> Iterator[Callable[..., Topics]]:
    created: list[str] = []

    def make(partitions: int = 3) -> Topics:
        suffix = uuid.uuid4().hex[:10]
        topics = Topics(f"tx-{suffix}", f"decisions-{suffix}", f"tx-{suffix}.dlq", partitions)
        names = [topics.input, topics.output, topics.dlq]
        created.extend(create_topics(admin, [NewTopic(n, partitions, 1) for n in names]))
        return topics

    yield make
    delete_topics(admin, created)


#: The broker's default max.message.bytes (1 MiB and batch overhead), less a little.
LARGE_MESSAGE_BYTES = 1_048_000


def produce(
    topic: str,
    records: Sequence[tuple[bytes | None, bytes | None]],
    *,
    max_message_bytes: int = 1_000_000,
) -> int:
    """Produce (key, value) pairs, in order, and wait until all are acknowledged; return the send
    time (ms). Idempotent, because a plain producer may reorder a retried batch past the next.
    `max_message_bytes`: the largest record the client sends (up to LARGE_MESSAGE_BYTES)."""
    producer = Producer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "linger.ms": 5,
            "enable.idempotence": True,
            "message.max.bytes": max_message_bytes,
        }
    )
    sent_ms = time.time_ns() // 1_000_000
    for key, value in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(30) == 0
    return sent_ms


#: One record to produce: key, value and headers.
RecordWithHeaders = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]


def produce_to_partition(topic: str, partition: int, records: list[RecordWithHeaders]) -> None:
    """Produce records with headers to one partition, in order, and wait until all are
    acknowledged (so their offsets are 0, 1, 2, … in a new topic)."""
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "enable.idempotence": True})
    for key, value, headers in records:
        # A copy: the client's list type also admits str and None values, so ours is not one.
        producer.produce(topic, key=key, value=value, headers=[*headers], partition=partition)
    assert producer.flush(30) == 0


def committed_offsets(group: str, topic: str, partitions: int) -> dict[int, int]:
    """The committed position of `group` in each partition of `topic` (negative: none)."""
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": group})
    try:
        wanted = [TopicPartition(topic, p) for p in range(partitions)]
        return {tp.partition: tp.offset for tp in consumer.committed(wanted, timeout=30)}
    finally:
        consumer.close()


def end_offsets(topic: str, partitions: int) -> dict[int, int]:
    """The high watermark (offset of the next record) of each partition of `topic`."""
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": f"reader-{uuid.uuid4().hex}"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def run_tool(module: str, *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    """Run `python -m module args…` from the repository root; capture its output as text."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def run_loadgen(
    topics: Topics, metrics_port: int, *args: str, timeout_s: float = 180
) -> subprocess.CompletedProcess[str]:
    """fraud-loadgen against `topics` and the service whose metrics are on `metrics_port`, with
    a JSON summary (`--json --quiet`) and `args` (the rate, duration, shape …)."""
    return run_tool(
        "loadgen.cli",
        "--bootstrap-servers",
        BOOTSTRAP,
        "--input-topic",
        topics.input,
        "--output-topic",
        topics.output,
        "--dlq-topic",
        topics.dlq,
        "--metrics-url",
        f"http://127.0.0.1:{metrics_port}/metrics",
        "--json",
        "--quiet",
        *args,
        timeout_s=timeout_s,
    )


def fed_by_loadgen(mean_rate: float) -> tuple[str, str]:
    """The scorer flag that agrees with a fraud-loadgen run at `mean_rate` tx/s on average (its
    default seed); without it, the load generator refuses to run (loadgen/time_scale.py)."""
    return ("--history-time-scale", str(time_scale(DEFAULT_SEED, mean_rate)))


def encode(record: dict[str, object]) -> bytes:
    return msgspec.json.encode(record)


def read_topic(
    topic: str, expected: int, timeout_s: float = 60.0, settle_s: float = 1.0
) -> list[Message]:
    """Read a topic from the start until `expected` records arrived (or the timeout), then
    `settle_s` longer so that extra records (duplicates) would show too."""
    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    messages: list[Message] = []
    deadline = time.monotonic() + timeout_s
    settle_until: float | None = None
    try:
        while time.monotonic() < (settle_until or deadline):
            for message in consumer.consume(1000, 0.2):
                assert message.error() is None, message.error()
                messages.append(message)
            if settle_until is None and len(messages) >= expected:
                settle_until = time.monotonic() + settle_s
    finally:
        consumer.close()
    return messages


@dataclass
class ServiceProcess:
    """A `fraud-scorer run` child process with its own log file and metrics port."""

    args: list[str]
    log_path: Path
    metrics_port: int
    process: subprocess.Popen[bytes] = field(init=False)

    def start(self) -> ServiceProcess:
        with self.log_path.open("ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                [sys.executable, "-m", "stream", "run", *self.args],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def rss_mb(self) -> float:
        """The process's resident memory now, in MiB."""
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def metrics(self) -> str:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as r:
            return str(r.read().decode())

    def metric(self, name: str) -> float:
        """The value of one sample, named as its line names it (`name{labels}`)."""
        values = by_key(self.metrics())
        if name not in values:
            raise AssertionError(f"metric {name} not exposed")
        return values[name]

    def metric_total(self, name: str) -> float:
        """The sum of a metric's samples over all label values."""
        return sum(s.value for s in samples(self.metrics()) if s.name == name)

    def wait_for_metric(self, name: str, at_least: float, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if self.metric(name) >= at_least:
                    return
            except (OSError, AssertionError):
                pass
            assert self.process.poll() is None, f"service exited early:\n{self.log()}"
            time.sleep(0.1)
        raise AssertionError(f"{name} did not reach {at_least} in {timeout_s}s:\n{self.log()}")

    def signal(self, signum: signal.Signals) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout_s: float = 60.0) -> int:
        return self.process.wait(timeout=timeout_s)

    def log(self) -> str:
        """The whole log: a check for a line must not depend on how much was logged after it
        (a tail of 6,000 characters once lost a rebalance's line to later warnings)."""
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def service_factory(tmp_path: Path) -> Iterator[Callable[..., ServiceProcess]]:
    started: list[ServiceProcess] = []
    group = f"fraud-scorer-{uuid.uuid4().hex[:10]}"

    def start(topics: Topics, *extra: str, instance: str = "a") -> ServiceProcess:
        port = free_port()
        args = [
            "--bootstrap-servers",
            BOOTSTRAP,
            "--input-topic",
            topics.input,
            "--output-topic",
            topics.output,
            "--dlq-topic",
            topics.dlq,
            "--group-id",
            group,
            "--instance-id",
            instance,
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(port),
            # Its own (empty) risk and card-frauds tables: shared ones filled by a demo make
            # scores depend on when the replica read them.
            "--terminal-risk-topic",
            f"{topics.input}-terminal-risk",
            "--card-frauds-topic",
            f"{topics.input}-card-frauds",
            *extra,
        ]
        service = ServiceProcess(args, tmp_path / f"service-{instance}.log", port)
        service.start()
        started.append(service)
        return service

    yield start
    for service in started:
        if service.process.poll() is None:
            service.process.kill()
            service.process.wait(timeout=30)
