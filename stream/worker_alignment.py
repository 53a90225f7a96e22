"""Replays and backfills score with the features of their own time (`FRAUD_WAIT_FOR_WORKER=on`).

In normal serving the scorer never waits for the features worker: a decision is due within its
deadline, and a worker behind only makes the terminal and card-fraud columns older
(`fraud_terminal_risk_state_age_seconds` says how much). A replay or backfill of history at full
speed is different: the scorer would decide most of it before the worker has counted the days
its windows read, with features no live run would have had. With this setting on, a closed batch
is scored only once the worker's published state reaches its newest transaction, as Flink's
watermark alignment holds a source that runs ahead of the others:

- "Reaches" is the worker's progress (the minimum over its table partitions of their progress
  records, `contracts/worker_progress.py`): every transaction and label at or before it has been
  counted and what it changed published. The scorer's copies of `terminal-risk` and
  `card-frauds` are then read up to their ends as of after that progress was seen, so the
  records the progress vouches for are in them before the batch is scored.
- A transaction dated past this host's clock plus the allowed skew counts as of that bound, as
  its card history does.
- While a batch waits, the replica reads on up to its in-flight bound (FRAUD_MAX_IN_FLIGHT_*;
  backpressure then pauses its partitions, and the loop keeps polling, so the group keeps it),
  so the batches behind are ready when the worker reaches them; none is scored before the one
  held: records are decided in order. `fraud_worker_wait_seconds_total` counts the wait; a log
  line says what is waited for when a wait starts, at most once every LOG_EVERY_S.

What this does not bound: the worker running ahead of the scorer. Its published records then
hold counts of days after a transaction scored. The terminal windows read only days at least
DELAY_DAYS back, so transaction counts do not move them, but a label reported after a scored
transaction and counted by then does, and so does a worker more than a day ahead on a history
longer than the buckets hold (BUCKET_DAYS: its oldest buckets are reused). docs/state.md,
"Replays and backfills".
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from contracts.event_time import EventClock
from stream.batcher import Batch
from stream.metrics import ServiceMetrics
from stream.pending_record import PendingRecord
from stream.worker_tables import CardFraudsTable, TerminalRiskTable

log = logging.getLogger(__name__)

#: How often a wait that lasts is logged again.
LOG_EVERY_S = 30.0


class _Confirming(NamedTuple):
    """A progress seen, waiting for the table copies to be read up to their ends."""

    counted_to_ms: int
    terminal_risk: int
    card_frauds: int


class WorkerAlignment:
    """Says whether a batch whose newest transaction is at a given event time may be scored."""

    def __init__(
        self,
        terminals: TerminalRiskTable,
        card_frauds: CardFraudsTable,
        clock: EventClock,
        metrics: ServiceMetrics,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._terminals = terminals
        self._card_frauds = card_frauds
        self._clock = clock
        self._metrics = metrics
        self._now = now
        #: Event time (epoch ms) up to which the tables are known to hold the worker's state.
        self._aligned_to_ms = -1
        self._confirming: _Confirming | None = None
        #: When the current wait began and was last counted, and when it was last logged.
        self._waiting_since: float | None = None
        self._counted_at = 0.0
        self._logged_at = 0.0

    def allows(self, newest_ms: int) -> bool:
        """Whether a batch whose newest transaction is at `newest_ms` may be scored now; False
        counts the time waited since the last call (call it on every pass while it waits)."""
        newest_ms = min(newest_ms, self._clock.bound_ms())
        if newest_ms > self._aligned_to_ms:
            self._advance()
        if newest_ms <= self._aligned_to_ms:
            if self._waiting_since is not None:
                self._count_wait()
                log.debug(
                    "the features worker reached the held batch after %.1fs: scoring resumes",
                    self._now() - self._waiting_since,
                )
                self._waiting_since = None
            return True
        self._wait(newest_ms)
        return False

    def _advance(self) -> None:
        """Move `_aligned_to_ms` to the worker's progress once the tables hold what it vouches
        for: ask them to read to their ends after the progress is seen, and take it when they
        have."""
        confirming = self._confirming
        if confirming is not None:
            if not (
                self._terminals.read_to_end(confirming.terminal_risk)
                and self._card_frauds.read_to_end(confirming.card_frauds)
            ):
                return
            self._aligned_to_ms = confirming.counted_to_ms
            self._confirming = None
        progress = self._terminals.counted_to_ms()
        if progress > self._aligned_to_ms:
            self._confirming = _Confirming(
                progress, self._terminals.ask_read_to_end(), self._card_frauds.ask_read_to_end()
            )

    def _wait(self, newest_ms: int) -> None:
        now = self._now()
        if self._waiting_since is None:
            self._waiting_since = self._counted_at = now
        else:
            self._count_wait()
        if now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            progress = self._terminals.counted_to_ms()
            reached = "nothing yet" if progress < 0 else f"{progress} (epoch ms)"
            log.info(
                "waiting for the features worker (FRAUD_WAIT_FOR_WORKER=on): the next batch "
                "reaches %s (epoch ms), the worker's published state %s; waited %.1fs",
                newest_ms,
                reached,
                now - self._waiting_since,
            )

    def _count_wait(self) -> None:
        now = self._now()
        self._metrics.waited_for_worker(now - self._counted_at)
        self._counted_at = now


class HeldForWorker:
    """The closed batches waiting for the worker, in order, each with its newest event time: a
    batch closed behind a held one waits behind it. Without an alignment (the setting off)
    nothing is held: `offer` hands a batch off at once."""

    def __init__(self, alignment: WorkerAlignment | None) -> None:
        self._alignment = alignment
        self._batches: deque[tuple[Batch[PendingRecord], int]] = deque()

    def __bool__(self) -> bool:
        return bool(self._batches)

    @property
    def records(self) -> int:
        return sum(len(batch.items) for batch, _ in self._batches)

    def offer(
        self, batch: Batch[PendingRecord], hand_off: Callable[[Batch[PendingRecord]], None]
    ) -> None:
        """Hand a closed batch off now, or once the worker has reached it."""
        if self._alignment is None:
            hand_off(batch)
            return
        self._batches.append((batch, max(r.transaction.event_time for r in batch.items)))
        self.release(hand_off)

    def release(self, hand_off: Callable[[Batch[PendingRecord]], None]) -> None:
        """Hand off, in order, the batches the worker has reached."""
        batches, alignment = self._batches, self._alignment
        while batches and alignment is not None and alignment.allows(batches[0][1]):
            hand_off(batches.popleft()[0])

    def discard(self, drop: Callable[[PendingRecord], bool]) -> int:
        """Remove the records for which `drop` is true (a batch left empty is removed); return
        how many were removed."""
        removed = 0
        kept: deque[tuple[Batch[PendingRecord], int]] = deque()
        for batch, newest_ms in self._batches:
            items = [record for record in batch.items if not drop(record)]
            removed += len(batch.items) - len(items)
            if items:
                kept.append((batch._replace(items=items), newest_ms))
        self._batches = kept
        return removed
