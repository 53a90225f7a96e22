"""When the table agent writes the entries a table partition's records changed, and when the
records are acknowledged: the tables' at-least-once.

The agent writes the entries a partition's records changed once every
FRAUD_FEATURES_WRITE_INTERVAL_MS, and acknowledges those records only then (`TableWrites`); faust
flushes what the agent sent (changelog writes, published risk) before it commits the internal
topic's acknowledged offsets, and never past a record held unwritten (`bound_commits`). After a
crash or a rebalance the records since the last commit are applied again, and the table skips
the events it counted already.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: `TableWrites.commit_bound` of a partition that may commit nothing yet.
NO_COMMIT = -1
#: Internal records held, per table partition, until its entries are written: a catch-up
#: reads them faster than an interval passes, and each holds its value (up to 1,000 events).
MAX_HELD = 1_000


class TableWrites:
    """Per table partition, the internal records applied since its entries were last written:
    acknowledged only once they are (faust then commits them), so that what the changelog
    lacks is always past the committed offset. One write an interval per entry, however many
    records changed it meanwhile: during a catch-up, or when a terminal sees several
    transactions an interval, that is most of the table's cost saved."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._held: dict[int, list[Any]] = {}
        self._since: dict[int, float] = {}
        #: Partitions whose applied records a rebalance dropped before they were written: read
        #: again from the committed offset, none of theirs may be committed until written.
        self._dropped: set[int] = set()
        #: Counts the revocations and assignments (`reset`).
        self.generation = 0

    def hold(self, partition: int, event: Any, *, events: bool = True) -> bool:
        """Hold an applied record; True when the partition's entries are due to be written:
        its oldest record held is an interval old, or it holds MAX_HELD records. A record
        without events (the router's marks alone, or one it could not read) changed no entry:
        with nothing held before it, it is acknowledged at once, so an idle partition's commit
        reaches its end instead of staying a record behind."""
        if not events and not self._held.get(partition):
            event.ack()
            return False
        held = self._held.setdefault(partition, [])
        held.append(event)
        now = self._clock()
        due = now - self._since.setdefault(partition, now) >= self._interval_s
        return due or len(held) >= MAX_HELD

    def acknowledge(self, partition: int) -> None:
        """The partition's entries are written: its records held are done."""
        for event in self._held.pop(partition, ()):
            event.ack()
        self._since.pop(partition, None)
        self._dropped.discard(partition)

    def commit_bound(self, partition: int) -> int | None:
        """The highest offset faust may commit for the partition (the next one it would read):
        that of its oldest record held, not written yet; NO_COMMIT while records a rebalance
        dropped unwritten wait to be read again; None: no bound."""
        held = self._held.get(partition)
        if held:
            return int(held[0].message.offset)
        return NO_COMMIT if partition in self._dropped else None

    def reset(self) -> None:
        """After a revocation or an assignment: the records held are read again from the
        committed offsets (never acknowledged, they were not committed)."""
        self._dropped.update(partition for partition, held in self._held.items() if held)
        self._held.clear()
        self._since.clear()
        self.generation += 1


def bound_commits(consumer: Any, topic: str, writes: TableWrites) -> None:
    """Cap every commit faust makes of `topic` at `writes.commit_bound`.

    Faust commits the longest run of acknowledged offsets from the committed one. Besides the
    agent's acknowledgements, it acknowledges by itself a record it skips during a rebalance (one
    the agent had not started), and that run check lets one such record through when the
    committed offset is 0 or unknown, or one offset past it: a commit could then pass records
    the agent holds unwritten, which the rebalance then drops. This wraps faust's
    `Consumer._new_offset` (no public hook), and refuses to start on a faust without it."""
    original = getattr(consumer, "_new_offset", None)
    if not callable(original):
        raise RuntimeError(
            "this faust-streaming's Consumer has no _new_offset: the features worker cannot "
            "bound its commits; install the version pinned in pyproject.toml"
        )

    def bounded(tp: Any) -> int | None:
        bound = writes.commit_bound(tp.partition) if tp.topic == topic else None
        if bound == NO_COMMIT:
            return None
        offset: int | None = original(tp)
        if offset is None or bound is None:
            return offset
        return min(offset, bound)

    consumer._new_offset = bounded
