"""The scorer's terminal-risk table (stream/terminal_table.py) with a scripted consumer: a broker
that goes away does not stop the reader for good."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from confluent_kafka import KafkaError, KafkaException
from prometheus_client import CollectorRegistry

from scorer.terminal_risk import NUM_TERMINAL_FEATURES, encode_terminal_risk
from stream import terminal_table
from stream.metrics import ServiceMetrics
from stream.terminal_table import TerminalRiskTable

TOPIC = "risk"
RISKY = np.full(NUM_TERMINAL_FEATURES, 0.5, np.float32)


class Message:
    def __init__(self, key: bytes, value: bytes) -> None:
        self._key, self._value = key, value

    def error(self) -> None:
        return None

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value


class BrokerAwayThenBack:
    """Metadata fails twice (the broker is away), then the topic has one record."""

    def __init__(self, _settings: dict[str, Any]) -> None:
        self.metadata_calls = 0
        self._pending = [Message(b"T-1", encode_terminal_risk("T-1", 20_000, RISKY))]

    def list_topics(self, topic: str, timeout: float) -> Any:
        self.metadata_calls += 1
        if self.metadata_calls <= 2:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Broker transport failure"))
        partition = SimpleNamespace(id=0)
        return SimpleNamespace(
            topics={topic: SimpleNamespace(error=None, partitions={0: partition})}
        )

    def incremental_assign(self, partitions: list[Any]) -> None:
        pass

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        messages, self._pending = self._pending, []
        if not messages:
            time.sleep(0.001)
        return messages

    def close(self) -> None:
        pass


def test_a_broker_that_goes_away_does_not_stop_the_reader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(terminal_table, "Consumer", BrokerAwayThenBack)
    monkeypatch.setattr(terminal_table, "MISSING_TOPIC_RETRY_S", 0.01)
    table = TerminalRiskTable({}, TOPIC, ServiceMetrics(CollectorRegistry()))
    table.start()
    try:
        deadline = time.monotonic() + 10
        while len(table) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert np.allclose(table.features(["T-1", None])[0], RISKY)
    finally:
        table.close()
