"""Consumer lag from librdkafka's statistics: only the partitions the replica owns."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry

from stream.lag import LagMonitor
from stream.metrics import ServiceMetrics

TOPIC = "tx"


def statistics(**partitions: tuple[str, int] | dict[str, object]) -> str:
    """librdkafka's statistics JSON, reduced to what the monitor reads: per partition number,
    (fetch_state, consumer_lag) or the fields themselves; "-1" is librdkafka's internal
    unassigned partition."""
    listed: dict[str, object] = {"-1": {"fetch_state": "none", "consumer_lag": -1}}
    for name, fields in partitions.items():
        if isinstance(fields, tuple):
            fields = {"fetch_state": fields[0], "consumer_lag": fields[1]}
        listed[name.removeprefix("p")] = fields
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


def test_exactly_once_lag_counts_from_what_the_transactions_committed() -> None:
    # Seen against the broker (fault suite): in exactly-once mode the consumer never hears of
    # the offsets its transactions commit, so librdkafka's consumer_lag kept the committed
    # offset fetched at assignment and the gauge read 6,600-10,300 per partition after the
    # group had committed everything.
    registry = CollectorRegistry()
    lag = LagMonitor(TOPIC, ServiceMetrics(registry=registry))
    lag.assign([(TOPIC, 0), (TOPIC, 1)])
    stale = {"fetch_state": "active", "committed_offset": 100, "ls_offset": 1_000}
    lag.committed({(TOPIC, 0): 1_000, (TOPIC, 1): 940, ("other", 0): 5})
    lag.on_statistics(
        statistics(p0={**stale, "consumer_lag": 900}, p1={**stale, "consumer_lag": 900})
    )
    assert exposed(registry) == {"0": 0, "1": 60}
    lag.forget([(TOPIC, 1)])
    lag.assign([(TOPIC, 1)])  # owned again: what this replica committed before is forgotten
    lag.on_statistics(statistics(p1={**stale, "consumer_lag": 900}))
    assert exposed(registry) == {"0": 0, "1": 900}
