"""Every Prometheus metric of the service, named `fraud_<thing>_<unit>`, and the small functions
the rest of the code calls to update them (no other module touches prometheus_client).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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
EVENT_TO_DECISION = Histogram(
    "fraud_event_to_decision_seconds",
    "Transaction event_time to decided_at",
    buckets=LATENCY_SECONDS_BUCKETS,
)
IN_FLIGHT = Gauge("fraud_in_flight_records", "Records consumed whose outcome is not yet durable")
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


def record_dead_letter_delivered(reason: str) -> None:
    DEAD_LETTERS.labels(reason).inc()


def record_batch(size: int, wait_s: float, inference_s: float) -> None:
    BATCH_SIZE.observe(size)
    BATCH_WAIT.observe(wait_s)
    INFERENCE_TIME.observe(inference_s)


def record_latencies(latencies_s: list[float]) -> None:
    for latency in latencies_s:
        EVENT_TO_DECISION.observe(latency)


def set_in_flight(count: int) -> None:
    IN_FLIGHT.set(count)


def set_model(model_version: str, provider: str) -> None:
    MODEL_INFO.labels(model_version).set(1)
    PROVIDER_INFO.labels(provider).set(1)
