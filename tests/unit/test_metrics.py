"""The metrics module: an injectable registry, and a batch histogram that reads exactly like
prometheus_client's own."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from stream.batch_histogram import BatchHistogram
from stream.metric_definitions import LATENCY_SECONDS_BUCKETS
from stream.metrics import ServiceMetrics


def samples(
    registry: CollectorRegistry, name: str
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        if family.name == name
        for s in family.samples
        if not s.name.endswith("_created")
    }


@given(st.lists(st.floats(min_value=0, max_value=120, allow_nan=False), max_size=200))
def test_batch_histogram_gives_the_buckets_prometheus_client_gives(values: list[float]) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    batch = BatchHistogram("latency_seconds", "doc", LATENCY_SECONDS_BUCKETS, registry=ours)
    reference = Histogram(
        "latency_seconds", "doc", buckets=LATENCY_SECONDS_BUCKETS, registry=theirs
    )
    batch.observe_many(np.array(values, np.float64))
    for value in values:
        reference.observe(value)
    mine, expected = samples(ours, "latency_seconds"), samples(theirs, "latency_seconds")
    assert mine.keys() == expected.keys()
    for key, value in expected.items():
        assert mine[key] == value or abs(mine[key] - value) <= 1e-9 * max(1.0, abs(value)), key


def test_each_registry_counts_on_its_own() -> None:
    first, second = ServiceMetrics(CollectorRegistry()), ServiceMetrics(CollectorRegistry())
    first.count_delivered({("decision", "approve"): 3, ("dead_letter", "decode"): 1})
    second.count_delivered({("decision", "approve"): 1})
    get = first.registry.get_sample_value
    assert get("fraud_decisions_produced_total", {"decision": "approve"}) == 3
    assert get("fraud_dead_letters_total", {"reason": "decode"}) == 1
    assert (
        second.registry.get_sample_value("fraud_decisions_produced_total", {"decision": "approve"})
        == 1
    )
