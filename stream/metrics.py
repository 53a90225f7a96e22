"""Every Prometheus metric of the service, named `fraud_<thing>_<unit>`, and the small functions
the rest of the code calls to update them (no other module touches prometheus_client).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

#: Powers of two up to the largest useful batch, so "never over the cap" reads off one bucket.
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
#: Sub-millisecond to a second: batch waits and inference both live in this range.
SHORT_SECONDS_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip
#: End-to-end: the SLO region (tens of ms) finely, then a tail up to a minute for backlogs.
LATENCY_SECONDS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0,
)  # fmt: skip

RECORDS_CONSUMED = Counter("fraud_records_consumed_total", "Records read from the input topic")
DECISIONS_PRODUCED = Counter(
    "fraud_decisions_produced_total", "Decisions acknowledged by the broker", ["decision"]
)
DEAD_LETTERS = Counter(
    "fraud_dead_letters_total", "Dead letters acknowledged by the broker", ["reason"]
)
BATCH_SIZE = Histogram(
    "fraud_batch_size_records", "Records per scored micro-batch", buckets=BATCH_SIZE_BUCKETS
)
BATCH_WAIT = Histogram(
    "fraud_batch_wait_seconds",
    "Time from a batch's first record to its flush",
    buckets=SHORT_SECONDS_BUCKETS,
)
INFERENCE_TIME = Histogram(
    "fraud_inference_seconds",
    "Time of one model call (features excluded)",
    buckets=SHORT_SECONDS_BUCKETS,
)


class BatchHistogram(Collector):
    """A Prometheus histogram fed a whole batch of observations at once with numpy: one call per
    batch instead of one `Histogram.observe` per record on the hot path."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = np.array(buckets, np.float64)
        self._counts = np.zeros(len(buckets) + 1, np.int64)  # the last one is +Inf
        self._sum = 0.0
        self._lock = threading.Lock()
        REGISTRY.register(self)

    def observe_many(self, values: npt.NDArray[np.floating[Any]]) -> None:
        # side="left": a value equal to a bound belongs to that bucket (le = less or equal).
        slots = np.searchsorted(self._bounds, values, side="left")
        counts = np.bincount(slots, minlength=len(self._counts))
        with self._lock:
            self._counts += counts
            self._sum += float(np.sum(values))

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            cumulative = np.cumsum(self._counts).tolist()
            total_sum = self._sum
        labels = [repr(float(b)) for b in self._bounds] + [
            "+Inf"
        ]  # as prometheus_client writes them
        yield HistogramMetricFamily(
            self._name,
            self._documentation,
            buckets=list(zip(labels, cumulative, strict=True)),
            sum_value=total_sum,
        )


EVENT_TO_DECISION = BatchHistogram(
    "fraud_event_to_decision_seconds",
    "Transaction event_time to decided_at",
    LATENCY_SECONDS_BUCKETS,
)
IN_FLIGHT = Gauge("fraud_in_flight_records", "Records consumed whose outcome is not yet durable")
IN_FLIGHT_BYTES = Gauge(
    "fraud_in_flight_bytes", "Key and value bytes of the records counted in fraud_in_flight_records"
)
PAUSED_PARTITIONS = Gauge("fraud_paused_partitions", "Assigned partitions paused by backpressure")
CONSUMER_LAG = Gauge(
    "fraud_consumer_lag_records",
    "Log end offset minus committed offset, per partition (what KEDA's Kafka scaler uses)",
    ["topic", "partition"],
)
TIME_LAG = Gauge(
    "fraud_time_lag_seconds", "Age of the oldest event_time in the batch being scored now"
)
BATCH_CAP = Gauge("fraud_batch_size_cap_records", "Current cap on records per micro-batch")
BATCH_CAP_CHANGES = Counter(
    "fraud_batch_size_cap_changes_total", "Changes of the adaptive batch cap", ["direction"]
)
LATE_RECORDS = Counter(
    "fraud_late_records_total", "Transactions whose decision deadline had passed at batch time"
)
DEGRADED_DECISIONS = Counter(
    "fraud_degraded_decisions_total",
    "Decisions made by the fallback rules instead of the model",
    ["cause"],
)
DELIVERY_RETRIES = Counter(
    "fraud_delivery_retries_total", "Retries of outputs the broker did not acknowledge", ["cause"]
)
DEAD_LETTER_PRODUCE_FAILURES = Counter(
    "fraud_dead_letter_produce_failures_total",
    "Dead letters the broker did not acknowledge (each is retried)",
    ["cause"],
)
DELIVERY_STALLED = Gauge(
    "fraud_delivery_stalled", "1 while retries are exhausted and fetching is stopped"
)
POISON_RECORDS = Counter(
    "fraud_poison_records_total", "Records isolated by bisection as breaking the model"
)
MODEL_INFO = Gauge("fraud_model_info", "The model in use (value 1)", ["model_version"])
PROVIDER_INFO = Gauge(
    "fraud_execution_provider_info",
    "The ONNX Runtime execution provider in use (value 1)",
    ["provider"],
)


def record_consumed(count: int) -> None:
    RECORDS_CONSUMED.inc(count)


def record_decisions_delivered(decision: str, count: int) -> None:
    DECISIONS_PRODUCED.labels(decision).inc(count)


def record_dead_letter_delivered(reason: str, count: int) -> None:
    DEAD_LETTERS.labels(reason).inc(count)


def record_batch(size: int, wait_s: float, inference_s: float) -> None:
    BATCH_SIZE.observe(size)
    BATCH_WAIT.observe(wait_s)
    INFERENCE_TIME.observe(inference_s)


def observe_event_to_decision(latencies_s: npt.NDArray[np.floating[Any]]) -> None:
    EVENT_TO_DECISION.observe_many(latencies_s)


def set_in_flight(count: int, size_bytes: int) -> None:
    IN_FLIGHT.set(count)
    IN_FLIGHT_BYTES.set(size_bytes)


def set_model(model_version: str, provider: str) -> None:
    MODEL_INFO.labels(model_version).set(1)
    PROVIDER_INFO.labels(provider).set(1)


def set_paused_partitions(count: int) -> None:
    PAUSED_PARTITIONS.set(count)


def set_consumer_lag(topic: str, partition: int, lag: int) -> None:
    CONSUMER_LAG.labels(topic, str(partition)).set(lag)


def forget_consumer_lag(topic: str, partition: int) -> None:
    with contextlib.suppress(KeyError):
        CONSUMER_LAG.remove(topic, str(partition))


def set_time_lag(seconds: float) -> None:
    TIME_LAG.set(seconds)


def set_batch_cap(cap: int, direction: str | None = None) -> None:
    BATCH_CAP.set(cap)
    if direction is not None:
        BATCH_CAP_CHANGES.labels(direction).inc()


def record_late(count: int) -> None:
    LATE_RECORDS.inc(count)


def record_degraded(cause: str, count: int) -> None:
    DEGRADED_DECISIONS.labels(cause).inc(count)


def record_delivery_retry(cause: str) -> None:
    DELIVERY_RETRIES.labels(cause).inc()


def record_dead_letter_produce_failure(cause: str) -> None:
    DEAD_LETTER_PRODUCE_FAILURES.labels(cause).inc()


def set_delivery_stalled(stalled: bool) -> None:
    DELIVERY_STALLED.set(1 if stalled else 0)


def record_poison(count: int) -> None:
    POISON_RECORDS.inc(count)
