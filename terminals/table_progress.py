"""How far each table partition has got in event time, and what the worker tells of it.

Each table partition has a clock of its own (a `TerminalClock` of terminals/state.py, kept in
`TableClocks`), moved only by the marks of its records: faust reads the internal partitions at
their own speeds, so one partition's progress must not make another's events stale. The
clocks' watermarks go to the progress topic after each publication round (`ProgressSender`),
and the newest transaction time counted to a metric (`NewestCounted`).
"""

from __future__ import annotations

import faust

from contracts.worker_progress import WorkerProgress, encode_progress
from terminals.config import FeaturesSettings
from terminals.events import InputMarks
from terminals.metrics import WorkerMetrics
from terminals.router import newest_transaction_time
from terminals.table_clock import TerminalClock


class NewestCounted:
    """The newest transaction time the table has counted: that of the marks of the records it
    applied (the router's reading up to then, every transaction before it routed first)."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self._metrics = metrics
        self._newest_ms = -1

    def follow(self, marks: InputMarks) -> None:
        newest = newest_transaction_time(marks)
        if newest > self._newest_ms:
            self._newest_ms = newest
            self._metrics.counted_event_time(newest)


class TableClocks:
    """The clock of each table partition (terminals/state.py), shared by its two tables."""

    def __init__(self, config: FeaturesSettings) -> None:
        self._config = config
        self._clocks: dict[int, TerminalClock] = {}

    def of(self, partition: int) -> TerminalClock:
        clock = self._clocks.get(partition)
        if clock is None:
            clock = self._clocks[partition] = self._config.clock
        return clock

    def reset(self) -> None:
        """After an assignment: each clock starts again from the marks it reads."""
        self._clocks.clear()

    def reached(self) -> dict[int, int]:
        """Per table partition owned, its watermark (epoch ms), once it has one."""
        return {p: c.watermark_ms for p, c in self._clocks.items() if c.watermark_ms >= 0}


class ProgressSender:
    """Sends, after each publication round, how far each table partition's published state
    reaches (its clock's watermark before the round) to the progress topic
    (contracts/worker_progress.py): the scorer's `fraud_terminal_risk_state_age_seconds`.
    Only what moved forward is sent: a new owner starts again from its committed offset, and
    what the partition published before stays published."""

    def __init__(self, app: faust.App, topic: str, config: FeaturesSettings) -> None:
        self._app = app
        self._topic = topic
        self._partitions = config.table_partitions
        self._sent: dict[int, int] = {}

    async def send(self, reached: dict[int, int]) -> None:
        for partition, counted_to in reached.items():
            if counted_to <= self._sent.get(partition, -1):
                continue
            key, value = encode_progress(WorkerProgress(partition, self._partitions, counted_to))
            await self._app.producer.send(
                self._topic, key, value, partition=None, timestamp=None, headers=None
            )
            self._sent[partition] = counted_to
