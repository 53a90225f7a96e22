"""Offset bookkeeping for at-least-once delivery: the only place that decides what may be committed.

A consumed offset becomes committable only when it, and every offset consumed before it on the
same partition, has its outcome (a decision or a dead letter) acknowledged by the broker. Outputs
are acknowledged out of order (decisions and dead letters go to different topics, retries come
late), so each partition keeps its offsets in consumption order and advances past a prefix of
finished ones. Delivery reports arrive on whichever thread serves the producer, so every method
takes the tracker's lock.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

PartitionKey = tuple[str, int]
SourceOffset = tuple[PartitionKey, int]


@dataclass
class _PartitionOffsets:
    pending: deque[int] = field(default_factory=deque)
    finished: set[int] = field(default_factory=set)
    #: Next offset to commit (last offset of the finished prefix + 1), once one finished.
    commit_position: int | None = None
    advanced: bool = False


class OffsetTracker:
    """Tracks consumed offsets per partition and yields the positions that are safe to commit."""

    def __init__(self) -> None:
        self._partitions: dict[PartitionKey, _PartitionOffsets] = {}
        self._in_flight = 0
        self._lock = threading.Lock()

    @property
    def in_flight(self) -> int:
        """Records consumed whose outcome is not yet acknowledged."""
        return self._in_flight

    def track(self, partition: PartitionKey, offset: int) -> None:
        """Record that `offset` was consumed (call in consumption order per partition)."""
        self.track_all([(partition, offset)])

    def track_all(self, sources: list[SourceOffset]) -> None:
        """Record that these offsets were consumed, in consumption order per partition."""
        with self._lock:
            partitions = self._partitions
            for partition, offset in sources:
                state = partitions.get(partition)
                if state is None:
                    state = partitions[partition] = _PartitionOffsets()
                state.pending.append(offset)
            self._in_flight += len(sources)

    def finish(self, partition: PartitionKey, offset: int) -> None:
        """Record that the outcome of `offset` is durable."""
        self.finish_all([(partition, offset)])

    def finish_all(self, sources: Iterable[SourceOffset]) -> None:
        """Record that these outcomes are durable. Offsets of partitions no longer tracked are
        ignored: they were revoked or lost, and the new owner re-reads them."""
        with self._lock:
            for partition, offset in sources:
                state = self._partitions.get(partition)
                if state is None:
                    continue
                state.finished.add(offset)
                self._in_flight -= 1
                pending, finished = state.pending, state.finished
                while pending and pending[0] in finished:
                    done = pending.popleft()
                    finished.discard(done)
                    state.commit_position = done + 1
                    state.advanced = True

    def take_commit_positions(self) -> dict[PartitionKey, int]:
        """Positions (next offset to read) that advanced since the last call."""
        positions: dict[PartitionKey, int] = {}
        with self._lock:
            for key, state in self._partitions.items():
                if state.advanced and state.commit_position is not None:
                    positions[key] = state.commit_position
                    state.advanced = False
        return positions

    def pending_in(self, partitions: Iterable[PartitionKey]) -> int:
        """How many tracked records of these partitions still wait for their outcome."""
        with self._lock:
            return sum(
                len(self._partitions[p].pending) for p in partitions if p in self._partitions
            )

    def forget(self, partitions: Iterable[PartitionKey]) -> None:
        """Drop all bookkeeping of partitions this consumer no longer owns."""
        with self._lock:
            for key in partitions:
                state = self._partitions.pop(key, None)
                if state is not None:
                    self._in_flight -= len(state.pending) - len(state.finished)
