"""What the scorer itself says during a load run: its /metrics, scraped every second.

Only the figures the report plots are kept: the batch-size histogram (distribution and mean
batch size over time), the consumer lag summed over partitions, and the current batch cap. And,
once before sending, its history time scale (`loadgen/time_scale.py`).
"""

from __future__ import annotations

import itertools
import threading
import time
import urllib.request
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families

BATCH_SIZE_METRIC = "fraud_batch_size_records"
LAG_METRIC = "fraud_consumer_lag_records"
BATCH_CAP_METRIC = "fraud_batch_size_cap_records"
HISTORY_TIME_SCALE_METRIC = "fraud_history_time_scale"
SCRAPE_TIMEOUT_S = 5.0
SCRAPE_INTERVAL_S = 1.0


class MetricsSnapshot(NamedTuple):
    """One scrape of the scorer's /metrics."""

    #: time.monotonic() of the scrape.
    at_s: float
    #: Cumulative batch-size histogram: bucket upper bound ("le") → batches so far.
    batch_buckets: dict[str, float]
    batch_count: float
    batch_sum: float
    #: Consumer lag summed over the partitions the replica reports; None before its first report.
    lag_records: float | None
    batch_cap: float | None


def scrape(metrics_url: str) -> MetricsSnapshot | None:
    """The scorer's figures now, or None when /metrics cannot be reached."""
    at_s = time.monotonic()
    try:
        text = read_page(metrics_url)
    except OSError:
        return None
    return parse_metrics(text, at_s)


def history_time_scale(metrics_url: str) -> float:
    """The scorer's FRAUD_HISTORY_TIME_SCALE, as its /metrics says.

    Raises:
        OSError: /metrics cannot be read.
        LookupError: it has no such metric (a scorer older than the metric).
    """
    for family in text_string_to_metric_families(read_page(metrics_url)):
        for sample in family.samples:
            if sample.name == HISTORY_TIME_SCALE_METRIC:
                return sample.value
    raise LookupError(f"{metrics_url} has no {HISTORY_TIME_SCALE_METRIC}")


def read_page(metrics_url: str) -> str:
    """The /metrics page as text. Raises OSError when it cannot be read."""
    with urllib.request.urlopen(metrics_url, timeout=SCRAPE_TIMEOUT_S) as response:
        return str(response.read().decode())


def parse_metrics(text: str, at_s: float) -> MetricsSnapshot:
    """The figures of one /metrics page (Prometheus text format) scraped at `at_s`."""
    buckets: dict[str, float] = {}
    count = total = 0.0
    lag: float | None = None
    cap: float | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == BATCH_SIZE_METRIC + "_bucket":
                buckets[sample.labels["le"]] = sample.value
            elif sample.name == BATCH_SIZE_METRIC + "_count":
                count = sample.value
            elif sample.name == BATCH_SIZE_METRIC + "_sum":
                total = sample.value
            elif sample.name == LAG_METRIC:
                lag = (lag or 0.0) + sample.value
            elif sample.name == BATCH_CAP_METRIC:
                cap = sample.value
    return MetricsSnapshot(at_s, buckets, count, total, lag, cap)


class MetricsScraper(threading.Thread):
    """Scrapes /metrics every SCRAPE_INTERVAL_S until stopped; unreachable scrapes are skipped."""

    def __init__(self, metrics_url: str) -> None:
        super().__init__(name="metrics-scraper", daemon=True)
        self.snapshots: list[MetricsSnapshot] = []
        self._url = metrics_url
        self._stop_event = threading.Event()

    def scrape_now(self) -> None:
        """Take one snapshot at once (the run's first and last)."""
        snapshot = scrape(self._url)
        if snapshot is not None:
            self.snapshots.append(snapshot)

    def run(self) -> None:
        while not self._stop_event.wait(SCRAPE_INTERVAL_S):
            self.scrape_now()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=SCRAPE_TIMEOUT_S * 2)


def batch_size_distribution(
    before: dict[str, float] | None, after: dict[str, float] | None
) -> dict[str, int] | None:
    """Batches per size range between two scrapes ("<=N" → count), from the smallest bucket up
    to the largest one that holds a batch, empty ones included (a gap in the distribution is a
    finding too); None without the second scrape."""
    if not after:
        return None
    before = before or {}
    distribution: dict[str, int] = {}
    previous_total = 0.0
    for le in sorted(after, key=float):
        total = after[le] - before.get(le, 0.0)
        count = int(total - previous_total)
        previous_total = total
        distribution["+Inf" if le == "+Inf" else f"<={int(float(le))}"] = count
    while distribution and not distribution[next(reversed(distribution))]:
        distribution.popitem()
    return distribution


def metrics_over_time(
    snapshots: list[MetricsSnapshot], origin_s: float
) -> list[dict[str, float | None]]:
    """Per scrape interval: batches scored, their mean size, the lag and the cap at its end;
    times in seconds since `origin_s` (a time.monotonic() value: the start of sending)."""
    rows: list[dict[str, float | None]] = []
    for previous, current in itertools.pairwise(snapshots):
        batches = current.batch_count - previous.batch_count
        records = current.batch_sum - previous.batch_sum
        rows.append(
            {
                "t_s": round(current.at_s - origin_s, 3),
                "batches": batches,
                "mean_batch_size": round(records / batches, 1) if batches > 0 else None,
                "lag_records": current.lag_records,
                "batch_cap": current.batch_cap,
            }
        )
    return rows
