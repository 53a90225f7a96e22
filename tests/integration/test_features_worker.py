"""`fraud-features` against the real broker: late labels change a terminal's published risk, the
table survives a kill -9 (recovered from its changelog), and bad labels are dead-lettered; and
`fraud-loadgen` feeds it labels that match the transactions it sent.

Each test has its own topics and app id (so its own consumer group and internal topics), and runs
the worker as a child process. Event times are whole UTC days far in the past, so the windows are
plain to read: on day d the 1-, 7- and 30-day windows end on day d - 7.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from contracts.dead_letter import decode_headers
from contracts.label import decode_label
from contracts.transaction import decode_transaction
from scorer.terminal_risk import DELAY_DAYS, MS_PER_DAY, decode_terminal_risk
from terminals.topics import changelog_topic_name, events_topic_name
from tests.integration.conftest import (
    BOOTSTRAP,
    REPO,
    committed_offsets,
    encode,
    end_offsets,
    free_port,
    produce,
    produce_to_partition,
    read_topic,
)

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


@dataclass
class WorkerProcess:
    """A `fraud-features run` child process with its own log file and metrics port."""

    topics: WorkerTopics
    log_path: Path
    data_dir: Path
    metrics_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] = field(init=False)

    def start(self) -> WorkerProcess:
        args = [
            *("--bootstrap-servers", BOOTSTRAP, "--app-id", self.topics.app_id),
            *("--input-topic", self.topics.transactions, "--labels-topic", self.topics.labels),
            *("--terminal-risk-topic", self.topics.risk, "--dlq-topic", self.topics.dlq),
            *("--table-partitions", str(PARTITIONS), "--instance-id", "w1"),
            *("--session-timeout-s", str(SESSION_TIMEOUT_S), "--data-dir", str(self.data_dir)),
            *("--metrics-host", "127.0.0.1", "--metrics-port", str(self.metrics_port)),
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

    def metric(self, sample: str) -> float:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(sample + " "):
                    return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"{sample} not exposed")

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def worker_topics(admin: AdminClient) -> Iterator[WorkerTopics]:
    suffix = uuid.uuid4().hex[:10]
    topics = WorkerTopics(
        f"tx-{suffix}", f"labels-{suffix}", f"risk-{suffix}", f"tx-{suffix}.dlq", f"ff-{suffix}"
    )
    new = [NewTopic(name, PARTITIONS, 1) for name in (topics.transactions, topics.dlq)]
    new.append(NewTopic(topics.risk, 1, 1, config={"cleanup.policy": "compact"}))
    new.append(NewTopic(topics.labels, PARTITIONS, 1))
    for future in admin.create_topics(new).values():
        future.result(timeout=30)
    yield topics
    internal = [events_topic_name(topics.app_id), changelog_topic_name(topics.app_id)]
    existing = set(admin.list_topics(timeout=30).topics)
    names = [n for n in (*(t.topic for t in new), *internal) if n in existing]
    for future in admin.delete_topics(names).values():
        future.result(timeout=30)


@pytest.fixture
def start_worker(
    worker_topics: WorkerTopics, tmp_path: Path
) -> Iterator[Callable[[], WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start() -> WorkerProcess:
        data_dir = tmp_path / f"faust-{len(started)}"
        worker = WorkerProcess(worker_topics, tmp_path / "worker.log", data_dir).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.process.poll() is None:
            worker.process.terminate()
            try:
                worker.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()


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
    record = {
        "transaction_id": f"t-{i}",
        "card_id": f"c-{i % 5}",
        "terminal_id": terminal,
        "fraud": fraud,
        "event_time": at(day),
        "reported_at": at(reported, 7_200_000),
    }
    return f"c-{i % 5}".encode(), encode(record)


class RiskReader:
    """Reads the terminal-risk topic as it grows; the latest record per terminal."""

    def __init__(self, topic: str) -> None:
        self.latest: dict[str, dict[str, float]] = {}
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
        self, terminal: str, expected: dict[str, float], timeout_s: float = 45.0
    ) -> dict[str, float]:
        """Until the terminal's latest record has the expected fields; return that record."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for message in self._consumer.consume(500, 0.2):
                assert message.error() is None, message.error()
                key = (message.key() or b"").decode()
                record = decode_terminal_risk(message.value() or b"")
                assert record.terminal_id == key
                self.latest[key] = {"as_of_day": record.as_of_day} | dict(
                    zip(FEATURES, record.features.tolist(), strict=True)
                )
            if _matches(self.latest.get(terminal), expected):
                return self.latest[terminal]
        raise AssertionError(f"{terminal}: expected {expected}, latest {self.latest.get(terminal)}")

    def close(self) -> None:
        self._consumer.close()


FEATURES = [f"terminal_{kind}_{w}d" for w in (1, 7, 30) for kind in ("tx", "risk", "frauds")]


def _matches(record: dict[str, float] | None, expected: dict[str, float]) -> bool:
    return record is not None and all(
        math.isclose(record[k], v, rel_tol=1e-5, abs_tol=1e-6) for k, v in expected.items()
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


def test_late_labels_change_the_published_risk_and_the_table_survives_a_kill(
    worker_topics: WorkerTopics, start_worker: Callable[[], WorkerProcess]
) -> None:
    topics = worker_topics
    today = DAY0 + DELAY_DAYS + 2  # the windows end on DAY0 + 2
    # Terminal P: 10 transactions on DAY0 and 10 on DAY0 + 2, one on DAY0 + 8 (inside the delay
    # as of today), and one today, which advances the terminal's day. Another terminal and a
    # transaction without one ride along.
    records = [transaction(i, DAY0, "P") for i in range(10)]
    records += [transaction(i, DAY0 + 2, "P") for i in range(10, 20)]
    records += [transaction(20, DAY0 + 8, "P"), transaction(21, today, "P")]
    records += [transaction(30, today, "Q"), transaction(31, today, None)]
    produce(topics.transactions, records)
    worker = start_worker()
    reader = RiskReader(topics.risk)
    try:
        before = reader.wait_for(
            "P", {"as_of_day": today} | risk(10, 0, 1) | risk(20, 0, 7) | risk(20, 0, 30)
        )
        worker.wait_ready()

        # Chargebacks arrive a week late: three frauds of DAY0, a legitimate outcome, a fraud of
        # DAY0 + 8 (still inside the delay: it must not count yet) and a label without terminal.
        late = [label(i, DAY0, "P", fraud=True, reported=today) for i in range(3)]
        late += [label(5, DAY0, "P", fraud=False, reported=today)]
        late += [label(20, DAY0 + 8, "P", fraud=True, reported=today)]
        late += [label(31, today, None, fraud=True, reported=today)]
        produce(topics.labels, late)
        after = reader.wait_for(
            "P", {"as_of_day": today} | risk(10, 0, 1) | risk(20, 3, 7) | risk(20, 3, 30)
        )
        assert after != before
        assert worker.metric('fraud_features_labels_total{outcome="no_terminal"}') == 1
        assert worker.metric('fraud_features_transactions_total{outcome="no_terminal"}') == 1

        # Everything read is committed: the restarted worker does not read these transactions
        # again, so their counts can only come back from the table's changelog.
        for topic in (topics.transactions, topics.labels):
            wait_committed(topics.app_id, topic)
        changelog = changelog_topic_name(topics.app_id)
        assert sum(end_offsets(changelog, PARTITIONS).values()) > 0
        worker.kill()
        # While it is down, rewind its labels to the start, as a crash before a commit would:
        # the restarted worker reads them again and must not count them twice.
        rewind(topics.app_id, topics.labels)

        # One more fraud of DAY0, reported six days later, while the worker is down; and a
        # transaction that moves the terminal's day on, so DAY0 + 8 is inside the windows.
        later = DAY0 + DELAY_DAYS + 8
        produce(topics.labels, [label(3, DAY0, "P", fraud=True, reported=later)])
        produce(topics.transactions, [transaction(22, later, "P")])
        restarted = start_worker()
        restarted.wait_ready(starts=2)
        # As of `later` the windows end on DAY0 + 8: the 1-day window holds the one transaction
        # of DAY0 + 8 and its fraud; 7 days (DAY0 + 2 … + 8): 11 transactions, 1 fraud; 30
        # days: all 21 transactions and the 3 + 1 + 1 frauds, counted before and after the kill.
        reader.wait_for(
            "P",
            {"as_of_day": later} | risk(1, 1, 1) | risk(11, 1, 7) | risk(21, 5, 30),
            timeout_s=SESSION_TIMEOUT_S + READY_TIMEOUT_S,
        )
        counted = 'fraud_features_terminal_events_total{result="counted",source="label"}'
        duplicate = 'fraud_features_terminal_events_total{result="duplicate",source="label"}'
        assert restarted.metric(counted) == 1
        # The five labels with a terminal, read again (and maybe re-keyed events not committed).
        assert restarted.metric(duplicate) >= 5
    finally:
        reader.close()


def test_bad_labels_are_dead_lettered_with_the_scorers_headers(
    worker_topics: WorkerTopics, start_worker: Callable[[], WorkerProcess]
) -> None:
    topics = worker_topics
    good = label(1, DAY0, "P", fraud=True, reported=DAY0 + DELAY_DAYS)
    swapped = msgspec.json.decode(good[1])
    swapped["event_time"], swapped["reported_at"] = swapped["reported_at"], swapped["event_time"]
    bad: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]] = [
        (b"c-1", b"{not json", [("trace", b"abc")]),
        (b"c-1", encode({**msgspec.json.decode(good[1]), "fraud": "yes"}), []),
        (b"c-1", encode(swapped), [("dlq.reason", b"forged")]),
        (b"c-1", None, []),
    ]
    produce_to_partition(topics.labels, 0, [*bad, (good[0], good[1], [])])
    worker = start_worker()

    letters = read_topic(topics.dlq, expected=len(bad), timeout_s=READY_TIMEOUT_S)
    assert len(letters) == len(bad), worker.log()[-4000:]
    by_offset = {int(decode_headers(m.headers())["dlq.original.offset"]): m for m in letters}
    assert sorted(by_offset) == [0, 1, 2, 3]
    expected = {0: ("decode", "DecodeError"), 1: ("validate", "ValidationError")}
    expected |= {2: ("validate", "ValidationError"), 3: ("decode", "DecodeError")}
    for offset, (reason, error) in expected.items():
        letter = by_offset[offset]
        headers = decode_headers(letter.headers())
        assert (headers["dlq.reason"], headers["dlq.error"]) == (reason, error)
        assert headers["dlq.original.topic"] == topics.labels
        assert headers["dlq.original.partition"] == "0"
        assert headers["dlq.service"] == f"{topics.app_id}/w1"
        assert headers["dlq.attempts"] == "1"
        assert int(headers["dlq.failed_at"]) > 0 and int(headers["dlq.original.timestamp"]) > 0
        assert headers["dlq.message"]
        assert (letter.key(), letter.value()) == (bad[offset][0], bad[offset][1])
    assert decode_headers(by_offset[0].headers())["trace"] == "abc"
    assert "before event_time" in decode_headers(by_offset[2].headers())["dlq.message"]
    # A forged dlq.* header is kept under the quarantine prefix, never taken for the worker's.
    forged = decode_headers(by_offset[2].headers())
    assert forged["dlq.original.header.dlq.reason"] == "forged"

    # The valid label behind them is not blocked: it reaches the terminal.
    reader = RiskReader(topics.risk)
    try:
        reader.wait_for("P", {"as_of_day": DAY0 + DELAY_DAYS} | risk(0, 1, 1))
    finally:
        reader.close()
    assert worker.metric('fraud_features_labels_total{outcome="dead_lettered"}') == len(bad)


def test_loadgen_sends_labels_that_match_the_transactions_it_sent(
    worker_topics: WorkerTopics, admin: AdminClient
) -> None:
    # No scorer: nothing is decided (exit status 1), but every label must be a valid label of a
    # transaction the run sent, with that transaction's event time.
    topics = worker_topics
    decisions = f"decisions-{topics.app_id}"
    admin.create_topics([NewTopic(decisions, 1, 1)])[decisions].result(timeout=30)
    try:
        result = _run_loadgen(topics, decisions)
    finally:
        admin.delete_topics([decisions])[decisions].result(timeout=30)
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["labels_topic"] == topics.labels and summary["labels_failed"] == 0
    assert summary["labels_sent"] > 0, result.stderr
    sent = {
        decode_transaction(m.value()).transaction_id: decode_transaction(m.value())
        for m in read_topic(topics.transactions, summary["sent"], settle_s=0.2)
    }
    labels = read_topic(topics.labels, summary["labels_sent"], settle_s=1.0)
    assert len(labels) == summary["labels_sent"]
    for message in labels:
        label = decode_label(message.value())
        transaction = sent[label.transaction_id]
        assert message.key() == label.card_id.encode() == transaction.card_id.encode()
        assert (label.event_time, label.terminal_id) == (
            transaction.event_time,
            transaction.terminal_id,
        )
        assert label.reported_at >= label.event_time


def _run_loadgen(topics: WorkerTopics, decisions: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "loadgen.cli", "--bootstrap-servers", BOOTSTRAP),
            *("--input-topic", topics.transactions, "--output-topic", decisions),
            *("--dlq-topic", topics.dlq, "--labels-topic", topics.labels),
            *("--rate", "2000", "--duration", "4", "--drain-timeout", "0"),
            *("--metrics-url", "", "--json", "--quiet"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
