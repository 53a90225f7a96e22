"""The scorer's copy of `terminal-risk`: every terminal's latest risk record, read whole.

The features worker (`fraud-features`) publishes each terminal's risk, from confirmed labels,
to a compacted topic keyed by terminal id. Every replica reads all of it (a global table: a
transaction of any card may happen at any terminal), from the beginning and then as it grows,
on a thread of its own, and the scoring thread joins a batch against it in one pass: each
transaction's terminal features come from its terminal's daily buckets as of the transaction's
own day, as training computes them (`scorer/terminal_risk.py`).

Responsibilities and decisions:
- A terminal with no record yet, or with no terminal id, gets the neutral features, never an
  error; a record that cannot be read is skipped with a warning; a tombstone forgets the
  terminal (the worker sends one when its risk becomes neutral or it goes idle).
- A record dated past the wall clock plus the allowed skew (`contracts/event_time.py`) is
  skipped: its windows were counted as of a day that has not come, so its features are neutral
  or wrong, and it would hide the terminal's real risk until the worker writes again.
- Bounded: a record as of a day that no window reads any more, as of the newest day the table
  has seen, is forgotten (its features are neutral from then on), so the copy holds only what
  can still matter even when the topic keeps old records. `fraud_terminal_risk_bytes` says how
  much memory it holds.
- Loaded: `loaded` is set once the reader (`stream/compacted_topic.py`) has read every
  partition up to the end it had when it started (or at once when the topic does not exist
  yet): a replica scores only after that, so a restart does not score with neutral risk.
- `fraud_terminal_risk_newest_record_age_seconds` is the age of the newest record held (by its
  Kafka timestamp): when the worker stops publishing, it grows, and an alert fires.
- The table is a dict replaced value by value: the scoring thread reads it without a lock (one
  dict lookup per transaction is atomic), the reader thread is its only writer.
- The reader uses no consumer group and commits nothing: it always rebuilds from the topic; a
  missing topic is waited for (the worker may start later), and so is a broker that went away.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from confluent_kafka import Message

from contracts.event_time import EventClock
from contracts.terminal_risk import HORIZON_DAYS, TerminalRiskRecord, decode_terminal_risk
from scorer.terminal_risk import terminal_features
from stream.compacted_topic import CompactedTopicReader
from stream.metrics import ServiceMetrics

log = logging.getLogger(__name__)

#: How often records as of days no window reads any more are forgotten.
SWEEP_INTERVAL_S = 60.0
#: Per terminal beyond its id, features and buckets: the dict slots and the arrays' headers.
_ENTRY_OVERHEAD_BYTES = 100


class TerminalRiskTable:
    """Reads `terminal-risk` into memory on a daemon thread until `close()`."""

    def __init__(
        self,
        kafka: Mapping[str, Any],
        topic: str,
        metrics: ServiceMetrics,
        *,
        clock: EventClock,
        day_ms: int,
    ) -> None:
        self.topic = topic
        self._metrics = metrics
        self._clock = clock
        self._day_ms = day_ms
        self._records: dict[str, TerminalRiskRecord] = {}
        self._as_of: dict[str, int] = {}
        self._bytes = 0
        self._newest_day = -1
        self._newest_record_ms: int | None = None
        self._last_sweep = time.monotonic()
        self._reader = CompactedTopicReader(
            kafka,
            topic,
            self._apply_message,
            name="terminal-risk",
            after_read=self._after_read,
            loaded_note=lambda: f"{len(self._records)} terminals",
        )
        #: Set once every partition is read up to the end it had when the reader started.
        self.loaded = self._reader.loaded
        metrics.watch_terminal_risk_age(self._newest_record_age_s)

    def start(self) -> None:
        self._reader.start()

    def close(self) -> None:
        self._reader.close()

    def __len__(self) -> int:
        return len(self._records)

    def features(
        self, terminal_ids: Sequence[str | None], event_time: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float32]:
        """The terminal feature rows of a batch, each as of its transaction's day (neutral
        where unknown)."""
        return terminal_features(self._records, terminal_ids, event_time // self._day_ms)

    def _newest_record_age_s(self) -> float:
        newest = self._newest_record_ms
        return 0.0 if newest is None else max(0.0, time.time() - newest / 1000.0)

    def _after_read(self, read_some: bool) -> None:
        if read_some:
            self._metrics.set_terminal_risk(len(self._records), self._bytes)
        if time.monotonic() - self._last_sweep >= SWEEP_INTERVAL_S:
            self._sweep()

    def _apply_message(self, message: Message) -> None:
        self._apply(message.key(), message.value(), message.timestamp()[1])

    def _apply(self, key: bytes | None, value: bytes | None, timestamp_ms: int) -> None:
        if key is None:
            return
        if timestamp_ms > 0:
            self._newest_record_ms = max(self._newest_record_ms or 0, timestamp_ms)
        terminal_id = key.decode("utf-8", "replace")
        if value is None:
            self._forget(terminal_id)
            return
        try:
            record = decode_terminal_risk(value)
        except ValueError as exc:
            log.warning("skipping a terminal-risk record for %r: %s", terminal_id, exc)
            self._metrics.record_terminal_risk_skipped("invalid")
            return
        if record.as_of_day > self._clock.bound_ms() // self._day_ms:
            log.warning(
                "skipping the terminal-risk record of %r: as of day %s, past this host's clock",
                terminal_id,
                record.as_of_day,
            )
            self._metrics.record_terminal_risk_skipped("future")
            return
        # Replaced, never removed first: the scoring thread reads the dict meanwhile.
        old = self._records.get(record.terminal_id)
        self._records[record.terminal_id] = record
        self._as_of[record.terminal_id] = record.as_of_day
        self._bytes += _entry_bytes(record) - (0 if old is None else _entry_bytes(old))
        self._newest_day = max(self._newest_day, record.as_of_day)

    def _forget(self, terminal_id: str) -> None:
        record = self._records.pop(terminal_id, None)
        if record is not None:
            self._as_of.pop(terminal_id, None)
            self._bytes -= _entry_bytes(record)

    def _sweep(self) -> None:
        """Forget the records as of days no window reads any more (their risk is neutral)."""
        self._last_sweep = time.monotonic()
        oldest = self._newest_day - HORIZON_DAYS
        old = [terminal for terminal, day in self._as_of.items() if day < oldest]
        for terminal_id in old:
            self._forget(terminal_id)
        if old:
            log.info("forgot %s terminal-risk records older than day %s", len(old), oldest)
            self._metrics.set_terminal_risk(len(self._records), self._bytes)


def _entry_bytes(record: TerminalRiskRecord) -> int:
    buckets = 0 if record.buckets is None else sum(array.nbytes for array in record.buckets)
    return (
        sys.getsizeof(record.terminal_id) + record.features.nbytes + buckets + _ENTRY_OVERHEAD_BYTES
    )
