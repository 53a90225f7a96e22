"""The features worker as the integration tests drive it: a `fraud-features run` child process,
the records they produce (transactions and labels on whole days), and readers of the
`terminal-risk` and `card-frauds` topics. Used by test_features_worker.py; no tests here."""

from __future__ import annotations

import math
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, TopicPartition

from contracts.card_frauds import decode_card_frauds
from contracts.terminal_risk import MS_PER_DAY, TERMINAL_FEATURE_NAMES, decode_terminal_risk
from contracts.worker_progress import progress_topic_name
from plumbing.metrics_text import Sample, samples, scrape
from tests.integration.conftest import (
    BOOTSTRAP,
    REPO,
    committed_offsets,
    encode,
    end_offsets,
)
from tests.support.network import free_port

#: Day 20,000 since the epoch (2024-10-04): the transactions' day in these tests.
DAY0 = 20_000
PARTITIONS = 2
SESSION_TIMEOUT_S = 6
READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class WorkerTopics:
    transactions: str
    labels: str
    risk: str
    dlq: str
    app_id: str
    card_frauds: str

    @property
    def progress(self) -> str:
        """The worker's progress topic (it creates it where missing)."""
        return progress_topic_name(self.risk)


@dataclass
class WorkerProcess:
    """A `fraud-features run` child process with its own log file and metrics port."""

    topics: WorkerTopics
    log_path: Path
    data_dir: Path
    metrics_port: int = field(default_factory=free_port)
    extra: tuple[str, ...] = ()
    #: Short, so that each test's last records are not held back long by a quiet partition
    #: (FRAUD_FEATURES_INPUT_WAIT_MS, default 5 s); a worker on a large backlog needs longer.
    input_wait_ms: int = 500
    process: subprocess.Popen[bytes] = field(init=False)

    def start(self) -> WorkerProcess:
        args = [
            *self.extra,
            *("--bootstrap-servers", BOOTSTRAP, "--app-id", self.topics.app_id),
            *("--input-topic", self.topics.transactions, "--labels-topic", self.topics.labels),
            *("--terminal-risk-topic", self.topics.risk, "--dlq-topic", self.topics.dlq),
            *("--card-frauds-topic", self.topics.card_frauds),
            *("--table-partitions", str(PARTITIONS), "--instance-id", "w1"),
            *("--session-timeout-s", str(SESSION_TIMEOUT_S), "--data-dir", str(self.data_dir)),
            *("--metrics-host", "127.0.0.1", "--metrics-port", str(self.metrics_port)),
            *("--input-wait-ms", str(self.input_wait_ms)),
        ]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "terminals", "run", *args],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def wait_ready(self, starts: int = 1) -> None:
        """Until faust says `Worker ready` for the `starts`-th time in this log."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self.log().count("Worker ready") < starts:
            assert self.process.poll() is None, f"worker exited early:\n{self.log()[-6000:]}"
            assert time.monotonic() < deadline, f"worker not ready:\n{self.log()[-6000:]}"
            time.sleep(0.2)

    def probe(self, path: str) -> int:
        """The HTTP status of /healthz or /readyz."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=5):
                return 200
        except urllib.error.HTTPError as exc:
            return exc.code

    def metric(self, sample: str) -> float:
        """One sample's value, named as its line names it (`name{labels}`)."""
        values = {s.key: s.value for s in self.samples()}
        assert sample in values, f"{sample} not exposed"
        return values[sample]

    def samples(self, prefix: str = "") -> list[Sample]:
        """The /metrics samples whose name starts with `prefix`."""
        exposition = scrape(f"http://127.0.0.1:{self.metrics_port}/metrics")
        return [sample for sample in samples(exposition) if sample.name.startswith(prefix)]

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def at(day: int, ms: int = 3_600_000) -> int:
    """An event time on `day` (1 AM by default)."""
    return day * MS_PER_DAY + ms


def transaction(i: int, day: int, terminal: str | None) -> tuple[bytes, bytes]:
    record: dict[str, object] = {
        "transaction_id": f"t-{i}",
        "card_id": f"c-{i % 5}",
        "merchant_id": "m-1",
        "amount": 12.5,
        "currency": "EUR",
        "mcc": 5411,
        "country": "DE",
        "channel": "pos",
        "card_present": True,
        "event_time": at(day),
    }
    if terminal is not None:
        record["terminal_id"] = terminal
    return f"c-{i % 5}".encode(), encode(record)


def label(
    i: int, day: int, terminal: str | None, *, fraud: bool, reported: int
) -> tuple[bytes, bytes]:
    record: dict[str, object] = {
        "transaction_id": f"t-{i}",
        "card_id": f"c-{i % 5}",
        "terminal_id": terminal,
        "fraud": fraud,
        "event_time": at(day),
        "reported_at": at(reported, 7_200_000),
    }
    return f"c-{i % 5}".encode(), encode(record)


class RiskReader:
    """Reads the terminal-risk topic (or, `cards`, the card-frauds topic) as it grows; the
    latest record per terminal (card)."""

    def __init__(self, topic: str, *, cards: bool = False) -> None:
        self._cards = cards
        #: The latest record per terminal; None once a tombstone came.
        self.latest: dict[str, dict[str, float] | None] = {}
        self._consumer = Consumer(
            {
                "bootstrap.servers": BOOTSTRAP,
                "group.id": f"reader-{uuid.uuid4().hex}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        self._consumer.subscribe([topic])

    def wait_for(
        self,
        terminal: str,
        expected: dict[str, float],
        timeout_s: float = 45.0,
        *,
        exact: bool = False,
    ) -> dict[str, float]:
        """Until the terminal's latest record has the expected fields (`exact`: and no other);
        return that record."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._read_some()
            found = self.latest.get(terminal)
            if found is None or not _matches(found, expected):
                continue
            if not exact or set(found) == set(expected):
                return found
        raise AssertionError(f"{terminal}: expected {expected}, latest {self.latest.get(terminal)}")

    def wait_for_tombstone(self, terminal: str, timeout_s: float = 45.0) -> None:
        """Until the terminal's latest record is a tombstone."""
        deadline = time.monotonic() + timeout_s
        while not (terminal in self.latest and self.latest[terminal] is None):
            assert time.monotonic() < deadline, f"{terminal}: {self.latest.get(terminal)}"
            self._read_some()

    def _read_some(self) -> None:
        for message in self._consumer.consume(500, 0.2):
            assert message.error() is None, message.error()
            key = (message.key() or b"").decode()
            value = message.value()
            if value is None:
                self.latest[key] = None
                continue
            if self._cards:
                card = decode_card_frauds(value)
                assert card.card_id == key
                frauds = dict(zip(card.days.tolist(), card.frauds.tolist(), strict=True))
                self.latest[key] = {"as_of_day": card.as_of_day} | {
                    f"frauds_on_{day}": count for day, count in frauds.items()
                }
                continue
            record = decode_terminal_risk(value)
            assert record.terminal_id == key
            self.latest[key] = {"as_of_day": record.as_of_day} | dict(
                zip(FEATURES, record.features.tolist(), strict=True)
            )

    def close(self) -> None:
        self._consumer.close()


FEATURES = list(TERMINAL_FEATURE_NAMES)


def _matches(record: dict[str, float] | None, expected: dict[str, float]) -> bool:
    return record is not None and all(
        k in record and math.isclose(record[k], v, rel_tol=1e-5, abs_tol=1e-6)
        for k, v in expected.items()
    )


def risk(transactions: int, frauds: int, window: int) -> dict[str, float]:
    """The expected features of one window."""
    return {
        f"terminal_tx_{window}d": math.log1p(transactions),
        f"terminal_risk_{window}d": frauds / max(transactions, 1),
        f"terminal_frauds_{window}d": math.log1p(frauds),
    }


def rewind(group: str, topic: str, timeout_s: float = 30.0) -> None:
    """Commit offset 0 of every partition of the topic for the group, once the group is empty
    (a killed member leaves it when its session times out)."""
    partitions = [TopicPartition(topic, p, 0) for p in range(PARTITIONS)]
    deadline = time.monotonic() + timeout_s
    while True:
        consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": group})
        try:
            consumer.commit(offsets=partitions, asynchronous=False)
            return
        except KafkaException:
            assert time.monotonic() < deadline, f"cannot rewind {group} on {topic}"
            time.sleep(1.0)
        finally:
            consumer.close()


def wait_committed(group: str, topic: str, timeout_s: float = 30.0) -> None:
    """Until the group committed every record of the topic (so a restart cannot re-read it)."""
    ends = end_offsets(topic, PARTITIONS)
    deadline = time.monotonic() + timeout_s
    while True:
        committed = committed_offsets(group, topic, PARTITIONS)
        if all(end == 0 or committed[p] >= end for p, end in ends.items()):
            return
        assert time.monotonic() < deadline, f"{group} committed {committed} of {topic}, not {ends}"
        time.sleep(0.5)
