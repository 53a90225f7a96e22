"""Consumer lag per partition, read from librdkafka's periodic statistics.

librdkafka already tracks each assigned partition's log end and committed offsets; its
statistics callback hands them over once per `statistics.interval.ms` on the consumer's own
poll, so measuring lag costs the hot path nothing and no extra broker requests.

librdkafka's statistics keep listing a partition after it was revoked (fetch state "stopped"),
with this consumer's last, stale view of its committed offset. Only the partitions the replica
owns are reported: another replica reports the others, and a sum over replicas (what KEDA
scales on) must count each partition once.

In exactly-once mode the offsets are committed by the transactional producer, which the
consumer never hears of: its committed offset stays what it fetched at assignment, and its
`consumer_lag` only grows. The transactions report what they committed (`committed`), and the
lag is counted from the later of the two.
"""

from __future__ import annotations

import json
import logging

from contracts.offsets import PartitionKey
from stream.metrics import ServiceMetrics

log = logging.getLogger(__name__)

#: How often librdkafka emits statistics (and so how fresh the lag gauges are).
STATISTICS_INTERVAL_MS = 1_000


class LagMonitor:
    """Keeps `fraud_consumer_lag_records` per partition of the input topic up to date."""

    def __init__(self, topic: str, metrics: ServiceMetrics) -> None:
        self._topic = topic
        self._metrics = metrics
        self._lags: dict[PartitionKey, int] = {}
        self._owned: set[PartitionKey] = set()
        #: Positions committed by this replica's transactions (exactly-once), per partition.
        self._committed: dict[PartitionKey, int] = {}

    @property
    def total(self) -> int | None:
        """Sum of the known partition lags (log end - committed), or None before any report."""
        return sum(self._lags.values()) if self._lags else None

    def on_statistics(self, stats_json: str) -> None:
        """librdkafka's `stats_cb`."""
        try:
            partitions = json.loads(stats_json)["topics"][self._topic]["partitions"]
        except (KeyError, ValueError):
            return
        for name, partition in partitions.items():
            number = int(name)
            key = (self._topic, number)
            lag = partition.get("consumer_lag", -1)
            ours = self._committed.get(key, -1)
            if ours > partition.get("committed_offset", -1) and partition.get("ls_offset", -1) >= 0:
                # Read committed (exactly-once): the end is the last stable offset.
                lag = max(0, partition["ls_offset"] - ours)
            if lag < 0 or key not in self._owned:
                continue
            self._lags[key] = lag
            self._metrics.set_consumer_lag(self._topic, number, lag)

    def committed(self, positions: dict[PartitionKey, int]) -> None:
        """Positions this replica's transaction just committed (exactly-once)."""
        for key, position in positions.items():
            if key in self._owned:
                self._committed[key] = max(position, self._committed.get(key, -1))

    def assign(self, partitions: list[PartitionKey]) -> None:
        """Report these partitions from now on: the replica owns them."""
        self._owned.update(partitions)

    def forget(self, partitions: list[PartitionKey]) -> None:
        """Stop reporting partitions this replica no longer owns."""
        for key in partitions:
            self._owned.discard(key)
            self._committed.pop(key, None)
            if self._lags.pop(key, None) is not None:
                self._metrics.forget_consumer_lag(*key)
