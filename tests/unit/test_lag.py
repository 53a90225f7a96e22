"""Consumer lag from librdkafka's statistics: only the partitions the replica owns."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry

from stream.lag import LagMonitor
from stream.metrics import ServiceMetrics

TOPIC = "tx"


def statistics(**partitions: tuple[str, int]) -> str:
    """librdkafka's statistics JSON, reduced to what the monitor reads: per partition number,
    (fetch_state, consumer_lag); "-1" is librdkafka's internal unassigned partition."""
    listed = {"-1": {"fetch_state": "none", "consumer_lag": -1}}
    for name, (state, lag) in partitions.items():
        listed[name.removeprefix("p")] = {"fetch_state": state, "consumer_lag": lag}
    return json.dumps({"topics": {TOPIC: {"partitions": listed}}})


def exposed(registry: CollectorRegistry) -> dict[str, float]:
    return {
        s.labels["partition"]: s.value
        for family in registry.collect()
        if family.name == "fraud_consumer_lag_records"
        for s in family.samples
    }


def test_owned_partitions_are_reported() -> None:
    registry = CollectorRegistry()
    lag = LagMonitor(TOPIC, ServiceMetrics(registry=registry))
    lag.assign([(TOPIC, 0), (TOPIC, 1)])
    lag.on_statistics(statistics(p0=("active", 7), p1=("active", 0)))
    assert exposed(registry) == {"0": 7, "1": 0}
    assert lag.total == 7


def test_a_revoked_partition_stays_gone_though_librdkafka_still_lists_it() -> None:
    # Seen against the broker: after a revoke, librdkafka's statistics keep the partition
    # ("stopped") with this consumer's stale committed offset, so the lag it shows only grows
    # while another replica owns and drains the partition.
    registry = CollectorRegistry()
    lag = LagMonitor(TOPIC, ServiceMetrics(registry=registry))
    lag.assign([(TOPIC, 0), (TOPIC, 1)])
    lag.on_statistics(statistics(p0=("active", 0), p1=("active", 0)))
    lag.forget([(TOPIC, 1)])
    lag.on_statistics(statistics(p0=("active", 0), p1=("stopped", 9_135)))
    assert exposed(registry) == {"0": 0}
    assert lag.total == 0
    lag.assign([(TOPIC, 1)])
    lag.on_statistics(statistics(p0=("active", 0), p1=("active", 3)))
    assert exposed(registry) == {"0": 0, "1": 3}


def test_nothing_is_reported_before_an_assignment() -> None:
    registry = CollectorRegistry()
    lag = LagMonitor(TOPIC, ServiceMetrics(registry=registry))
    lag.on_statistics(statistics(p0=("active", 5)))
    assert exposed(registry) == {}
    assert lag.total is None
