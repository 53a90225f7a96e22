"""The scorer's copies of what the features worker publishes: `terminal-risk` (every terminal's
latest risk record) and `card-frauds` (every card's confirmed frauds known so far), each read
whole.

The features worker (`fraud-features`) publishes each terminal's risk, and each card's
confirmed frauds, from labels, to a compacted topic keyed by terminal id (card id). Every
replica reads all of each (a global table: a transaction of any card may happen at any
terminal, and a card's records are not partitioned as the input is), from the beginning and then
as it grows, on a thread of its own, and the scoring thread joins a batch against it in one
pass: each transaction's columns come from its terminal's daily buckets (its card's days of
fraud) as of the transaction's own day, as training computes them (`scorer/terminal_risk.py`,
`scorer/card_frauds.py`).

Responsibilities and decisions (`WorkerTable`, for both):
- A terminal (card) with no record yet, or a transaction without one, gets the neutral
  features, never an error; a record that cannot be read is skipped with a warning; a tombstone
  forgets the key (the worker sends one when nothing of it is read any more, or it goes idle).
- Bounded per record, whoever wrote it: a value over MAX_RECORD_BYTES is skipped before it is
  parsed, and so is an id longer than the transaction contract's (an entry holds at most a few
  KB), or JSON nested too deep to parse.
- A record dated past the wall clock plus the allowed skew (`contracts/event_time.py`) is
  skipped: its windows were counted as of a day that has not come, so its features are neutral
  or wrong, and it would hide the real ones until the worker writes again.
- Bounded: a record as of a day that no window reads any more, as of the newest day the table
  has seen, is forgotten (its features are neutral from then on), so the copy holds only what
  can still matter even when the topic keeps old records. `fraud_terminal_risk_bytes`
  (`fraud_card_frauds_bytes`) says how much memory it holds.
- Loaded: `loaded` is set once the reader (`stream/compacted_topic.py`) has read every
  partition up to the end it had when it started (or at once when the broker says the topic
  does not exist): a replica scores only after that, so a restart does not score with neutral
  features. A topic that cannot be read is not an empty one: the replica waits (`problem`).
- `fraud_terminal_risk_state_age_seconds` is the age of the worker's state the replica scores
  with: how far in event time the newest transaction it scored is past what the worker has
  counted and published (the minimum over its table partitions of their progress records,
  `contracts/worker_progress.py`, read from `<terminal-risk>-progress` beside the table). It
  grows while the worker catches up on a backlog, though it publishes all the while, and when
  it stops; `FraudTerminalRiskStale` fires on it. Unknown (NaN) until every table partition has
  said how far it reached and a transaction was scored; that reader never holds the replica
  back. `fraud_terminal_risk_newest_record_age_seconds` is the wall-clock age of the newest
  record held (by its Kafka timestamp). (Card records come only with frauds, so their age says
  nothing about the worker.)
- The table is a dict replaced value by value: the scoring thread reads it without a lock (one
  dict lookup per transaction is atomic), the reader thread is its only writer.
- The reader uses no consumer group and commits nothing: it always rebuilds from the topic; a
  missing topic is waited for (the worker may start later), and so is a broker that went away;
  a reader that fails is started again (`fraud_topic_reader_*` say so).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt
from confluent_kafka import Message

from contracts.card_frauds import CardFraudsRecord, decode_card_frauds
from contracts.event_time import EventClock
from contracts.terminal_risk import HORIZON_DAYS, TerminalRiskRecord, decode_terminal_risk
from contracts.transaction import MAX_ID_CHARS
from contracts.worker_progress import decode_progress, progress_topic_name
from scorer.card_frauds import card_features
from scorer.terminal_risk import terminal_features
from stream.compacted_topic import CompactedTopicReader
from stream.metrics import ServiceMetrics

log = logging.getLogger(__name__)

#: How often records as of days no window reads any more are forgotten.
SWEEP_INTERVAL_S = 60.0
#: Per entry beyond its id, features and buckets: the dict slots and the arrays' headers.
_ENTRY_OVERHEAD_BYTES = 100
#: A record's value may hold this many bytes: a terminal-risk record with every bucket takes
#: about 1.5 KB, a card-frauds one under 1 KB. A larger one is skipped before it is parsed.
MAX_RECORD_BYTES = 16_384

R = TypeVar("R", TerminalRiskRecord, CardFraudsRecord)


class _Decoded(NamedTuple):
    key: str
    as_of_day: int
    size_bytes: int


class WorkerTable(Generic[R]):
    """Reads one of the worker's topics into memory on a daemon thread until `close()` (see the
    module docstring); subclasses say how a record is read and joined."""

    #: The topic's name in logs ("terminal-risk", "card-frauds").
    name = ""

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
        self._records: dict[str, R] = {}
        self._held: dict[str, _Decoded] = {}
        self._bytes = 0
        self._newest_day = -1
        self._newest_record_ms: int | None = None
        self._last_sweep = time.monotonic()
        self._reader = CompactedTopicReader(
            kafka,
            topic,
            self._apply_message,
            name=self.name,
            metrics=metrics,
            after_read=self._after_read,
            loaded_note=lambda: f"{len(self._records)} {self._entries}",
        )
        #: Set once every partition is read up to the end it had when the reader started.
        self.loaded = self._reader.loaded
        self._attach(kafka, metrics)

    _entries = "entries"

    def _attach(self, kafka: Mapping[str, Any], metrics: ServiceMetrics) -> None:
        """What a subclass reads and exports beside the table, set up at the end of
        `__init__` (nothing by default)."""

    @property
    def problem(self) -> str | None:
        """Why the topic cannot be read now; None while it can."""
        return self._reader.problem

    def stopped(self) -> str | None:
        """Why the topic's reader ended before `close()`; None while it runs."""
        return self._reader.stopped()

    def start(self) -> None:
        self._reader.start()

    def close(self) -> None:
        self._reader.close()

    def ask_read_to_end(self) -> int:
        """Ask the reader to read the topic up to its end as of now (`read_to_end`)."""
        return self._reader.ask_read_to_end()

    def read_to_end(self, asked: int) -> bool:
        """Whether every record written before request `asked` is in the table."""
        return self._reader.read_to_end(asked)

    def __len__(self) -> int:
        return len(self._records)

    def _decode(self, value: bytes) -> tuple[R, _Decoded]:
        """The record and what the table keeps of it; ValueError if it is not one."""
        raise NotImplementedError

    def _report(self) -> None:
        """The gauges: how many entries, how many bytes."""
        raise NotImplementedError

    def _skipped(self, reason: str) -> None:
        raise NotImplementedError

    def _newest_record_age_s(self) -> float:
        newest = self._newest_record_ms
        return 0.0 if newest is None else max(0.0, time.time() - newest / 1000.0)

    def _after_read(self, read_some: bool) -> None:
        if read_some:
            self._report()
        if time.monotonic() - self._last_sweep >= SWEEP_INTERVAL_S:
            self._sweep()

    def _apply_message(self, message: Message) -> None:
        self._apply(message.key(), message.value(), message.timestamp()[1])

    def _apply(self, key: bytes | None, value: bytes | None, timestamp_ms: int) -> None:
        if key is None:
            return
        if timestamp_ms > 0:
            self._newest_record_ms = max(self._newest_record_ms or 0, timestamp_ms)
        name = key.decode("utf-8", "replace")
        if value is None:
            self._forget(name)
            return
        try:
            if len(value) > MAX_RECORD_BYTES:
                raise ValueError(f"{len(value):,} bytes, over {MAX_RECORD_BYTES:,}")
            record, decoded = self._decode(value)
            if len(decoded.key) > MAX_ID_CHARS:
                raise ValueError(f"an id of {len(decoded.key):,} characters, over {MAX_ID_CHARS}")
        except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deep
            log.warning("skipping a %s record for %.80r: %s", self.name, name, exc)
            self._skipped("invalid")
            return
        if decoded.as_of_day > self._clock.bound_ms() // self._day_ms:
            log.warning(
                "skipping the %s record of %r: as of day %s, past this host's clock",
                self.name,
                name,
                decoded.as_of_day,
            )
            self._skipped("future")
            return
        # Replaced, never removed first: the scoring thread reads the dict meanwhile.
        old = self._held.get(decoded.key)
        self._records[decoded.key] = record
        self._held[decoded.key] = decoded
        self._bytes += decoded.size_bytes - (0 if old is None else old.size_bytes)
        self._newest_day = max(self._newest_day, decoded.as_of_day)

    def _forget(self, key: str) -> None:
        if self._records.pop(key, None) is not None:
            self._bytes -= self._held.pop(key).size_bytes

    def _sweep(self) -> None:
        """Forget the records as of days no window reads any more (their features are
        neutral)."""
        self._last_sweep = time.monotonic()
        oldest = self._newest_day - HORIZON_DAYS
        old = [key for key, held in self._held.items() if held.as_of_day < oldest]
        for key in old:
            self._forget(key)
        if old:
            log.info("forgot %s %s records older than day %s", len(old), self.name, oldest)
            self._report()


class TerminalRiskTable(WorkerTable[TerminalRiskRecord]):
    """The copy of `terminal-risk`: each transaction's terminal features; and how far the
    worker's state reaches, from `<terminal-risk>-progress`."""

    name = "terminal-risk"
    _entries = "terminals"

    def _attach(self, kafka: Mapping[str, Any], metrics: ServiceMetrics) -> None:
        #: Per table partition of the worker: how far its published state reaches (epoch ms),
        #: and how many partitions it has. Replaced whole, never changed in place: the scrape
        #: reads it from another thread.
        self._counted_to: dict[int, int] = {}
        self._partitions = 0
        #: The newest event time scored (epoch ms, bounded by the clock), -1 before any.
        self._newest_scored_ms = -1
        self._progress = CompactedTopicReader(
            kafka,
            progress_topic_name(self.topic),
            self._apply_progress,
            name=f"{self.name}-progress",
            metrics=metrics,
        )
        metrics.watch_terminal_risk_age(self._newest_record_age_s, self.state_age_s)

    def start(self) -> None:
        super().start()
        self._progress.start()

    def close(self) -> None:
        self._progress.close()
        super().close()

    def features(
        self, terminal_ids: Sequence[str | None], event_time: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float32]:
        """The terminal feature rows of a batch, each as of its transaction's day (neutral
        where unknown)."""
        if len(event_time):
            newest = min(int(event_time.max()), self._clock.bound_ms())
            self._newest_scored_ms = max(self._newest_scored_ms, newest)
        return terminal_features(self._records, terminal_ids, event_time // self._day_ms)

    def counted_to_ms(self) -> int:
        """How far (epoch ms) the worker's published state reaches: the minimum over its table
        partitions' progress records; -1 until every one has told it."""
        counted_to, partitions = self._counted_to, self._partitions
        if not partitions or len(counted_to) < partitions:
            return -1
        return min(counted_to.values())

    def state_age_s(self) -> float:
        """How far (event-time seconds) the newest transaction scored is past the worker's
        progress; NaN until every table partition has told it and a transaction was scored."""
        counted_to, newest = self.counted_to_ms(), self._newest_scored_ms
        if newest < 0 or counted_to < 0:
            return float("nan")
        return max(0.0, (newest - counted_to) / 1000.0)

    def _apply_progress(self, message: Message) -> None:
        value = message.value()
        if value is None:  # a tombstone: nothing to forget, progress only moves forward
            return
        try:
            progress = decode_progress(value)
        except ValueError as exc:
            log.warning("skipping a %s-progress record: %s", self.name, exc)
            self._skipped("progress")
            return
        if progress.counted_to > self._clock.bound_ms():
            log.warning("skipping a %s-progress record past this host's clock", self.name)
            self._skipped("progress")
            return
        counted_to = {} if progress.partitions != self._partitions else dict(self._counted_to)
        known = counted_to.get(progress.partition, -1)
        counted_to[progress.partition] = max(known, progress.counted_to)
        self._counted_to, self._partitions = counted_to, progress.partitions

    def _decode(self, value: bytes) -> tuple[TerminalRiskRecord, _Decoded]:
        record = decode_terminal_risk(value)
        buckets = 0 if record.buckets is None else sum(array.nbytes for array in record.buckets)
        size = sys.getsizeof(record.terminal_id) + record.features.nbytes + buckets
        return record, _Decoded(record.terminal_id, record.as_of_day, size + _ENTRY_OVERHEAD_BYTES)

    def _report(self) -> None:
        self._metrics.set_terminal_risk(len(self._records), self._bytes)

    def _skipped(self, reason: str) -> None:
        self._metrics.record_terminal_risk_skipped(reason)


class CardFraudsTable(WorkerTable[CardFraudsRecord]):
    """The copy of `card-frauds`: each transaction's card-fraud columns."""

    name = "card-frauds"
    _entries = "cards"

    def features(
        self, card_ids: Sequence[str], event_time: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float32]:
        """The card-fraud rows of a batch, each as of its transaction's day (zeros where the
        card has no record)."""
        return card_features(self._records, card_ids, event_time // self._day_ms)

    def _decode(self, value: bytes) -> tuple[CardFraudsRecord, _Decoded]:
        record = decode_card_frauds(value)
        size = sys.getsizeof(record.card_id) + record.days.nbytes + record.frauds.nbytes
        return record, _Decoded(record.card_id, record.as_of_day, size + _ENTRY_OVERHEAD_BYTES)

    def _report(self) -> None:
        self._metrics.set_card_frauds(len(self._records), self._bytes)

    def _skipped(self, reason: str) -> None:
        self._metrics.record_card_frauds_skipped(reason)
