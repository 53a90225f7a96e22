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
from typing import cast

from confluent_kafka import Message

PartitionKey = tuple[str, int]
SourceOffset = tuple[PartitionKey, int]


def position_of(message: Message) -> SourceOffset:
    """Partition and offset of a consumed record (librdkafka always sets them on one)."""
    return (cast(str, message.topic()), cast(int, message.partition())), cast(int, message.offset())


@dataclass
class _PartitionOffsets:
    #: Offsets in consumption order, up to the first whose outcome is not yet durable.
    pending: deque[int] = field(default_factory=deque)
    #: Size in bytes of each tracked offset whose outcome is not yet durable: membership here
    #: is what makes an acknowledgement count (a second or stale one finds nothing).
    unfinished: dict[int, int] = field(default_factory=dict)
    #: Next offset to commit (last offset of the finished prefix + 1), once one finished.
    commit_position: int | None = None
    advanced: bool = False


class OffsetTracker:
    """Tracks consumed offsets per partition and yields the positions that are safe to commit.

    It also counts what is held: records (and their bytes) consumed whose outcome is not yet
    acknowledged, the measure the consumer's backpressure bounds.
    """

    def __init__(self) -> None:
        self._partitions: dict[PartitionKey, _PartitionOffsets] = {}
        self._in_flight = 0
        self._in_flight_bytes = 0
        self._lock = threading.Lock()

    @property
    def in_flight(self) -> int:
        """Records consumed whose outcome is not yet acknowledged."""
        return self._in_flight

    @property
    def in_flight_bytes(self) -> int:
        """Key and value bytes of those records."""
        return self._in_flight_bytes

    def track(self, partition: PartitionKey, offset: int, size: int = 0) -> None:
        """Record that `offset` (of `size` bytes) was consumed, in consumption order."""
        self.track_all([(partition, offset)], [size])

    def track_all(self, sources: list[SourceOffset], sizes: list[int]) -> None:
        """Record that these offsets were consumed, in consumption order per partition, with
        their sizes in bytes."""
        with self._lock:
            partitions = self._partitions
            for (partition, offset), size in zip(sources, sizes, strict=True):
                state = partitions.get(partition)
                if state is None:
                    state = partitions[partition] = _PartitionOffsets()
                state.pending.append(offset)
                state.unfinished[offset] = size
            self._in_flight += len(sources)
            self._in_flight_bytes += sum(sizes)

    def finish(self, partition: PartitionKey, offset: int) -> None:
        """Record that the outcome of `offset` is durable."""
        self.finish_all([(partition, offset)])

    def finish_all(self, sources: Iterable[SourceOffset]) -> None:
        """Record that these outcomes are durable.

        An offset this tracker does not hold as unfinished is ignored: its partition was revoked
        or lost (the new owner re-reads it), or it was acknowledged already (a late report from
        before a revoke, for a partition assigned here again).
        """
        with self._lock:
            for partition, offset in sources:
                state = self._partitions.get(partition)
                if state is None:
                    continue
                size = state.unfinished.pop(offset, None)
                if size is None:
                    continue
                self._in_flight -= 1
                self._in_flight_bytes -= size
                pending, unfinished = state.pending, state.unfinished
                while pending and pending[0] not in unfinished:
                    state.commit_position = pending.popleft() + 1
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

    def first_unfinished(self, partition: PartitionKey) -> int | None:
        """The lowest tracked offset of `partition` still waiting for its outcome."""
        with self._lock:
            state = self._partitions.get(partition)
            return state.pending[0] if state is not None and state.pending else None

    def commit_position(self, partition: PartitionKey) -> int | None:
        """Where a commit of `partition` would stand now: after its finished prefix."""
        with self._lock:
            state = self._partitions.get(partition)
            return None if state is None else state.commit_position

    def pending_in(self, partitions: Iterable[PartitionKey]) -> int:
        """How many tracked records of these partitions still wait for their outcome."""
        with self._lock:
            return sum(
                len(self._partitions[p].unfinished) for p in partitions if p in self._partitions
            )

    def forget(self, partitions: Iterable[PartitionKey]) -> int:
        """Drop all bookkeeping of partitions this consumer no longer owns; return how many of
        their records were still waiting for their outcome."""
        dropped = 0
        with self._lock:
            for key in partitions:
                state = self._partitions.pop(key, None)
                if state is not None:
                    dropped += len(state.unfinished)
                    self._in_flight_bytes -= sum(state.unfinished.values())
            self._in_flight -= dropped
        return dropped
