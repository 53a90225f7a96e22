"""The scorer's copies of the worker's tables (stream/worker_tables.py) with a scripted consumer:
a broker that goes away does not stop the reader for good; records dated past the host's clock
are skipped; tombstones and old records are forgotten, and the memory held says so; `loaded`
waits for the end of the topic; the newest record's age is exported, and so is the age of the
worker's state, from its progress records. The card-frauds copy runs
the same reader: its records become each transaction's card columns, as of its own day."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from prometheus_client import CollectorRegistry

from contracts.card_frauds import encode_card_frauds
from contracts.event_time import EventClock
from contracts.terminal_risk import (
    HORIZON_DAYS,
    MS_PER_DAY,
    NUM_TERMINAL_FEATURES,
    encode_terminal_risk,
)
from contracts.worker_progress import WorkerProgress, encode_progress
from stream import compacted_topic, worker_tables
from stream.metrics import ServiceMetrics
from stream.worker_tables import CardFraudsTable, TerminalRiskTable, WorkerTable
from tests.unit.fakes import message

TOPIC = "risk"
RISKY = np.full(NUM_TERMINAL_FEATURES, 0.5, np.float32)
DAY = 20_000
#: The tests' wall clock: 1 AM on DAY.
WALL_MS = DAY * MS_PER_DAY + 3_600_000


class Message:
    def __init__(self, key: bytes, value: bytes | None, timestamp_ms: int = WALL_MS) -> None:
        self._key, self._value, self._timestamp_ms = key, value, timestamp_ms
        #: Its place in the one partition (set by `reading`).
        self.at = 0

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self.at

    def error(self) -> None:
        return None

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return 1, self._timestamp_ms


def risk(terminal: str, day: int = DAY) -> Message:
    return Message(terminal.encode(), encode_terminal_risk(terminal, day, RISKY))


class ScriptedConsumer:
    """One partition holding `records` (handed out `per_read` at a time); metadata fails
    `away` times first (the broker away)."""

    records: ClassVar[list[Message]] = []
    away = 0
    per_read = 1_000
    #: The error the broker answers metadata with (None: the topic is there).
    topic_error: int | None = None

    def __init__(self, _settings: dict[str, Any]) -> None:
        self.metadata_calls = 0
        self._pending = list(self.records)
        self._position = 0

    def list_topics(self, topic: str, timeout: float) -> Any:
        self.metadata_calls += 1
        if self.metadata_calls <= self.away:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Broker transport failure"))
        if self.topic_error is not None:
            error = KafkaError(self.topic_error)
            return SimpleNamespace(topics={topic: SimpleNamespace(error=error, partitions={})})
        partition = SimpleNamespace(id=0)
        return SimpleNamespace(
            topics={topic: SimpleNamespace(error=None, partitions={0: partition})}
        )

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float) -> tuple[int, int]:
        return 0, len(self.records)

    def incremental_assign(self, partitions: list[Any]) -> None:
        pass

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, 0, self._position)]

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        messages = self._pending[: self.per_read]
        self._pending = self._pending[self.per_read :]
        self._position += len(messages)
        if not messages:
            time.sleep(0.001)
        return messages

    def close(self) -> None:
        pass


def reading(
    monkeypatch: pytest.MonkeyPatch,
    records: list[Message],
    kind: type[WorkerTable[Any]] = TerminalRiskTable,
    **script: int,
) -> tuple[Any, CollectorRegistry]:
    for offset, record in enumerate(records):
        record.at = offset
    consumer = type("Consumer", (ScriptedConsumer,), {"records": records, **script})
    monkeypatch.setattr(compacted_topic, "Consumer", consumer)
    monkeypatch.setattr(compacted_topic, "MISSING_TOPIC_RETRY_S", 0.01)
    table, registry = new_table(kind)
    table.start()
    return table, registry


def new_table(kind: type[WorkerTable[Any]] = TerminalRiskTable) -> tuple[Any, CollectorRegistry]:
    """A table on the tests' clock, not started, and the registry of its metrics."""
    registry = CollectorRegistry()
    table = kind(
        {},
        TOPIC,
        ServiceMetrics(registry),
        clock=EventClock(wall_ms=lambda: WALL_MS),
        day_ms=MS_PER_DAY,
    )
    return table, registry


def eventually(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_broker_that_goes_away_does_not_stop_the_reader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table, _ = reading(monkeypatch, [risk("T-1")], away=2)
    try:
        eventually(lambda: len(table) == 1)
        assert np.allclose(table.features(["T-1", None], np.zeros(2, np.int64))[0], RISKY)
    finally:
        table.close()


def test_a_record_as_of_a_day_that_has_not_come_is_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Finding 2, the scorer's side: a record counted as of a future day hides the terminal's
    # real risk (its windows are empty) until the worker writes the terminal again.
    table, registry = reading(monkeypatch, [risk("T-1"), risk("T-1", DAY + 3_000_000)])
    try:
        eventually(table.loaded.is_set)
        assert np.allclose(table.features(["T-1"], np.zeros(1, np.int64))[0], RISKY)
        skipped = registry.get_sample_value(
            "fraud_terminal_risk_records_skipped_total", {"reason": "future"}
        )
        assert skipped == 1
    finally:
        table.close()


def test_tombstones_and_records_no_window_reads_are_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Finding 5, the scorer's side: the copy holds only what can still matter, and says how
    # much memory that is.
    monkeypatch.setattr(worker_tables, "SWEEP_INTERVAL_S", 0.0)
    records = [risk(f"T-{i}", DAY - HORIZON_DAYS - 1) for i in range(50)]
    records += [risk("T-new"), risk("T-gone"), Message(b"T-gone", None)]
    table, registry = reading(monkeypatch, records)
    try:
        eventually(lambda: len(table) == 1)
        assert np.allclose(
            table.features(["T-new", "T-gone", "T-0"], np.zeros(3, np.int64)).sum(axis=1),
            [RISKY.sum(), 0, 0],
        )
        held = registry.get_sample_value("fraud_terminal_risk_bytes")
        assert held is not None and 0 < held < 1_000
    finally:
        table.close()


def test_loaded_waits_for_the_end_the_topic_had_at_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Finding 9: a restarted replica scored with neutral risk until it had read the topic.
    records = [risk(f"T-{i}") for i in range(30)]
    table, registry = reading(monkeypatch, records, per_read=7)
    try:
        eventually(table.loaded.is_set)
        assert len(table) == 30, "loaded only once every record was read"
        age = registry.get_sample_value("fraud_terminal_risk_newest_record_age_seconds")
        assert age is not None and age >= time.time() - WALL_MS / 1000 - 1
    finally:
        table.close()


def test_a_missing_topic_is_loaded_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    table, _ = reading(monkeypatch, [], topic_error=KafkaError.UNKNOWN_TOPIC_OR_PART)
    try:
        eventually(table.loaded.is_set)
        assert len(table) == 0
    finally:
        table.close()


def test_a_broker_that_never_answers_is_not_a_missing_topic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 43, finding 2: metadata that never answered counted as a missing topic, so the
    # replica scored with neutral terminal risk (this test once asserted that).
    monkeypatch.setattr(compacted_topic, "RETRY_MAX_S", 0.01)
    table, registry = reading(monkeypatch, [], away=10**9)
    try:
        sample = {"reader": "terminal-risk", "cause": "unreadable"}
        eventually(
            lambda: (registry.get_sample_value("fraud_topic_reader_errors_total", sample) or 0) >= 3
        )
        assert not table.loaded.is_set()
        assert table.problem is not None and "_TRANSPORT" in table.problem
        # The worker's progress cannot be read either: its reader's errors are counted (the
        # topic-unreadable alert fires on them) and the state's age is unknown, never 0.
        progress = {"reader": "terminal-risk-progress", "cause": "unreadable"}
        eventually(
            lambda: (
                (registry.get_sample_value("fraud_topic_reader_errors_total", progress) or 0) >= 3
            )
        )
        table.features(["T-1"], np.array([WALL_MS], np.int64))
        age = registry.get_sample_value("fraud_terminal_risk_state_age_seconds")
        assert age is not None and np.isnan(age)
    finally:
        table.close()


def frauds(card: str, as_of_day: int, days: list[int], counts: list[int]) -> Message:
    value = encode_card_frauds(card, as_of_day, np.array(days), np.array(counts))
    return Message(card.encode(), value)


def test_a_cards_frauds_count_on_the_fresh_windows_back_from_each_transactions_day(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    records = [
        frauds("C-1", DAY, [DAY - 1, DAY - 3], [1, 2]),
        frauds("C-2", DAY, [DAY], [1]),
        Message(b"C-2", None),  # its frauds taken back (a correction): forgotten
        frauds("C-3", DAY + 3_000_000, [DAY], [5]),  # as of a day that has not come: skipped
        Message(b"C-4", b'{"card_id": "C-4", "as_of_day": 1, "days": [1], "frauds": [0]}'),
    ]
    table, registry = reading(monkeypatch, records, CardFraudsTable)
    try:
        eventually(table.loaded.is_set)
        assert len(table) == 1
        day_ms = np.array([DAY, DAY, DAY + 3, DAY - 2, DAY], np.int64) * MS_PER_DAY
        rows = table.features(["C-1", "C-1", "C-1", "C-1", "nobody"], day_ms)
        # (2-day, 7-day) windows: day DAY reads DAY-1 (1 fraud) in both, DAY-3 (2) in 7 days only.
        expected = np.log1p([[1, 3], [1, 3], [0, 3], [2, 2], [0, 0]])
        assert np.allclose(rows, expected)
        assert np.allclose(table.features(["C-2", "C-3"], day_ms[:2]), 0.0)
        for reason in ("future", "invalid"):
            sample = {"reason": reason}
            skipped = registry.get_sample_value("fraud_card_frauds_records_skipped_total", sample)
            assert skipped == 1, reason
        held = registry.get_sample_value("fraud_card_frauds_bytes")
        assert held is not None and 0 < held < 1_000
    finally:
        table.close()


def progress(partition: int, partitions: int, counted_to: int) -> Any:
    key, value = encode_progress(WorkerProgress(partition, partitions, counted_to))
    return message(0, value, topic=f"{TOPIC}-progress", key=key)


def test_the_state_age_is_how_far_the_scored_transactions_are_past_the_slowest_partition() -> None:
    # Issue 44, item 2: the age of the worker's state the replica scores with, in event time.
    table, registry = new_table()

    def age() -> float:
        sample = registry.get_sample_value("fraud_terminal_risk_state_age_seconds")
        assert sample is not None, "always exported"
        return sample

    newest = WALL_MS - 60_000
    table._apply_progress(progress(0, 2, newest - 3 * MS_PER_DAY))
    assert np.isnan(age()), "nothing scored yet"
    table.features(["T-1", "T-2"], np.array([newest - 5_000, newest], np.int64))
    assert np.isnan(age()), "partition 1 has not said how far it reached"
    table._apply_progress(progress(1, 2, newest - MS_PER_DAY))
    assert age() == 3 * 86_400, "the slowest partition's"
    table._apply_progress(progress(0, 2, newest - 1_000))
    assert age() == 86_400
    table._apply_progress(progress(0, 2, newest - 10 * MS_PER_DAY))
    assert age() == 86_400, "a partition's progress never goes back"
    # Unreadable, or past the clock: skipped and counted, nothing changes.
    table._apply_progress(
        message(0, b'{"partition": 3, "partitions": 2, "counted_to": 1}', key=b"3")
    )
    table._apply_progress(progress(1, 2, WALL_MS + 10 * MS_PER_DAY))
    skipped = registry.get_sample_value(
        "fraud_terminal_risk_records_skipped_total", {"reason": "progress"}
    )
    assert skipped == 2 and age() == 86_400
    # A transaction dated far ahead counts at the clock's bound, not at its own time.
    table.features(["T-1"], np.array([WALL_MS + 365 * MS_PER_DAY], np.int64))
    assert age() < 86_400 + 600
    # Caught up: 0, never negative.
    bound = EventClock(wall_ms=lambda: WALL_MS).bound_ms()
    table._apply_progress(progress(1, 2, bound))
    table._apply_progress(progress(0, 2, bound))
    assert age() == 0.0
    # A worker with another partition count: unknown until each of its partitions has said.
    table._apply_progress(progress(0, 3, WALL_MS))
    assert np.isnan(age())
