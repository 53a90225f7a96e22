"""The replica's shared Kafka error callback: what it reports on, and to whom."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from plumbing.errors import ClientFailure
from stream.startup.kafka_clients import ClientErrors


def test_every_broker_down_is_told_to_each_listener_and_nothing_else_is() -> None:
    errors = ClientErrors()
    told: list[str] = []
    errors.on_cluster_lost(lambda: told.append("sink"))
    errors.on_cluster_lost(lambda: told.append("other"))
    errors(KafkaError(KafkaError._TRANSPORT, "Disconnected"))
    errors(KafkaError(KafkaError._TIMED_OUT, "Timed out"))
    assert told == []
    errors(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert told == ["sink", "other"]
    errors.raise_if_failed()  # an outage is not a failure of the replica


def test_an_authentication_failure_stops_the_replica_with_what_to_check() -> None:
    errors = ClientErrors()
    errors(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error"))
    with pytest.raises(ClientFailure, match=r"sasl\.username and sasl\.password"):
        errors.raise_if_failed()
