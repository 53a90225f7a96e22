"""`BatchHistogram`: a Prometheus histogram fed a whole batch of observations at once.

A Prometheus collector of the service's own (stream/metric_definitions.py defines the metrics
made of it), for the hot path: one numpy call per batch where `Histogram.observe` would be
called once per record. It reads exactly as prometheus_client's own histogram does.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector


class BatchHistogram(Collector):
    """A Prometheus histogram fed a whole batch of observations at once with numpy: one call per
    batch instead of one `Histogram.observe` per record on the hot path."""

    def __init__(
        self,
        name: str,
        documentation: str,
        buckets: tuple[float, ...],
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = np.array(buckets, np.float64)
        self._counts = np.zeros(len(buckets) + 1, np.int64)  # the last one is +Inf
        self._sum = 0.0
        self._lock = threading.Lock()
        if registry is not None:
            registry.register(self)

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
        # As prometheus_client writes bounds.
        labels = [repr(float(b)) for b in self._bounds] + ["+Inf"]
        yield HistogramMetricFamily(
            self._name,
            self._documentation,
            buckets=list(zip(labels, cumulative, strict=True)),
            sum_value=total_sum,
        )
