"""Where a batch's card states go: the changelog topic, with the batch or coalesced across batches.

A scored batch changes some cards (`stream/card_state.py`); their new states must be durable in
the changelog before the batch's input offsets may be committed. Two ways:

- with the batch (exactly-once, or FRAUD_CHANGELOG_FLUSH_MS=0): the states are outputs of the
  batch's outcome group, produced beside its decisions (in exactly-once mode, in its
  transaction, which is the unit of commit there);
- coalesced (at-least-once, the default): the states wait here, a card's newest one replacing
  the one before, and go out together once FRAUD_CHANGELOG_FLUSH_MS has passed since the oldest
  waiting batch was scored, once the waiting batches hold a quarter of
  FRAUD_MAX_IN_FLIGHT_RECORDS, and before a revoke's commit and at shutdown. Each waiting
  batch's outcome group is held (`OutcomeGroup.release`) until the flush that carries its
  states is acknowledged, so its offsets are never committed before its states are durable; its
  decisions are not held back. What it saves is the broker's work: one produce request per
  partition per flush instead of per batch (at 24 partitions, most of a batch's changelog
  records are alone in their partition's request), and one record per card per flush instead of
  one per batch it appears in. What it costs: offsets are committed up to that much later, so a
  crash decides that much more again.

Order: a flush sends under the lock, and the states of one card are made in input order, so a
card's states reach its changelog partition in the order they were made (a compacted topic
keeps each key's last record). A state sent again after a failure carries the card's state as
it is then (`stream/redelivery.py`), never an older one.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

from confluent_kafka import Message

from contracts.offsets import OffsetTracker
from stream.card_state import ChangelogRecord
from stream.outcomes import OutcomeGroup, OutputLabel
from stream.sink import Output, OutputSink

#: The group label of changelog outputs (not counted as decisions or dead letters).
CARD_STATE: OutputLabel = ("changelog", "card_state")
#: Coalesced: a flush is due once the waiting batches hold this share of the in-flight bound.
FLUSH_SHARE_OF_IN_FLIGHT = 4

#: One partition's states to send: (card id, state or None for a tombstone, a consumed record of
#: that partition, which a failed send names as its source).
_States = list[tuple[str, bytes | None, Message]]


class _Consumed(Protocol):
    @property
    def message(self) -> Message: ...


class ChangelogWriter:
    """Sends the card states of scored batches to the changelog topic (see the module)."""

    def __init__(
        self,
        sink: OutputSink,
        tracker: OffsetTracker,
        topic: str,
        *,
        flush_interval_s: float,
        flush_records: int,
    ) -> None:
        """`flush_interval_s` 0: with the batch; otherwise coalesced, flushed that long after the
        oldest waiting batch or once the waiting batches hold `flush_records` records."""
        if flush_interval_s < 0 or flush_records < 1:
            raise ValueError(
                f"flush_interval_s must be >= 0 and flush_records >= 1, got {flush_interval_s} "
                f"and {flush_records}"
            )
        self.topic = topic
        self._sink = sink
        self._tracker = tracker
        self._interval_s = flush_interval_s
        self._flush_records = flush_records
        self._lock = threading.Lock()
        #: The newest state of each waiting card, by (partition, card id).
        self._states: dict[tuple[int, str], tuple[bytes | None, Message]] = {}
        self._held: list[OutcomeGroup] = []
        self._records = 0
        self._oldest: float | None = None

    @property
    def coalescing(self) -> bool:
        """Whether states wait for a flush (the batch's group then takes one hold, not
        outputs: `labels` and `holds`)."""
        return self._interval_s > 0

    def labels(self, changes: list[ChangelogRecord]) -> Counter[OutputLabel]:
        """The outputs `changes` add to their batch's outcome group."""
        if not changes or self.coalescing:
            return Counter()
        return Counter({CARD_STATE: len(changes)})

    def holds(self, changes: list[ChangelogRecord]) -> int:
        """The holds `changes` put on their batch's outcome group."""
        return int(bool(changes) and self.coalescing)

    def write(
        self, records: Sequence[_Consumed], changes: list[ChangelogRecord], group: OutcomeGroup
    ) -> None:
        """The states a batch (`records`, completing `group`) produced: sent now, or kept for
        the next flush (`group` created with `holds(changes)`)."""
        if not changes:
            return
        if not self.coalescing:
            by_partition: dict[int, _States] = {}
            for change in changes:
                by_partition.setdefault(change.partition, []).append(
                    (change.card_id, change.state, records[change.batch_index].message)
                )
            self._send(by_partition, group)
            return
        with self._lock:
            states = self._states
            for change in changes:
                states[change.partition, change.card_id] = (
                    change.state,
                    records[change.batch_index].message,
                )
            self._held.append(group)
            self._records += len(records)
            if self._oldest is None:
                self._oldest = time.monotonic()
            if self._records >= self._flush_records:
                self._flush_locked()

    def flush_if_due(self, now: float) -> None:
        """Flush when the oldest waiting batch has waited the flush interval (`now`:
        time.monotonic())."""
        oldest = self._oldest
        if oldest is not None and now - oldest >= self._interval_s:
            self.flush()

    def flush(self) -> None:
        """Send every waiting state now (a revoke, shutdown)."""
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        held = self._held
        if not held:
            return
        states = self._states
        self._states, self._held, self._records, self._oldest = {}, [], 0, None

        def durable(_labels: Counter[OutputLabel]) -> None:
            for group in held:
                group.release()

        flushed = OutcomeGroup(self._tracker, [], Counter({CARD_STATE: len(states)}), durable)
        by_partition: dict[int, _States] = {}
        for (partition, card_id), (state, source) in states.items():
            by_partition.setdefault(partition, []).append((card_id, state, source))
        self._send(by_partition, flushed)

    def _send(self, by_partition: dict[int, _States], group: OutcomeGroup) -> None:
        """One shared-callback send per partition."""
        topic = self.topic
        for partition, states in by_partition.items():

            def output_of(i: int, states: _States = states, partition: int = partition) -> Output:
                card_id, state, source = states[i]
                return Output(
                    kind="changelog",
                    topic=topic,
                    key=card_id.encode(),
                    value=state,
                    headers=None,
                    source=source,
                    group=group,
                    label=CARD_STATE[1],
                    partition=partition,
                )

            keys = [card_id.encode() for card_id, _state, _source in states]
            values = [state for _card_id, state, _source in states]
            self._sink.send_batch(topic, keys, values, group, output_of, partition)
