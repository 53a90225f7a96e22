"""Partitions given up with their cards kept: one revoked with every change durable (or read
before joining: warm start) keeps its cards, not owned, for `retain_s` (FRAUD_STATE_RETAIN_S),
so that if it comes back its restore reads only the changelog's tail (why that equals a full
read: "Warm return" in stream/card_history_restore.py). Kept past that time, its cards are
forgotten.

`OwnedCardHistory` (stream/owned_card_history.py) holds one `RetainedPartitions` and calls it
under its lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

#: How long, in seconds, the cards of a partition revoked cleanly stay in memory in case it comes
#: back (default of FRAUD_STATE_RETAIN_S).
RETAIN_S = 600.0


class RetainedPartition(NamedTuple):
    """A partition revoked with its cards kept."""

    #: The changelog's end offset when it was revoked: a return reads from there.
    end: int
    watermark: int
    #: When its cards go (`time.monotonic()`), unless it came back.
    until: float


class RetainedPartitions:
    """The partitions whose cards are kept, and until when. Not locked: its owner's lock guards
    every call."""

    def __init__(self, retain_s: float) -> None:
        """`retain_s`: how long a partition's cards are kept; 0 keeps none."""
        self.retain_s = retain_s
        self._kept: dict[int, RetainedPartition] = {}

    @property
    def retains(self) -> bool:
        """Whether a partition revoked cleanly keeps its cards (`retain_s` > 0)."""
        return self.retain_s > 0

    def __contains__(self, partition: int) -> bool:
        return partition in self._kept

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, partition: int, end: int, watermark: int, now: float) -> None:
        """Keep the partition's cards until `retain_s` past `now`: a return reads its changelog
        from `end`, its clock resuming at `watermark` at least."""
        self._kept[partition] = RetainedPartition(end, watermark, now + self.retain_s)

    def keep_revoked(
        self, ends: Mapping[int, int], watermarks: Mapping[int, int], now: float
    ) -> None:
        """Keep the cards of the partitions revoked with every change durable (`ends`: their
        changelog's end offsets) that were owned (`watermarks`: their clocks then); none when
        `retain_s` is 0."""
        if not self.retains:
            return
        for partition, end in ends.items():
            if partition in watermarks:
                self.keep(partition, end, watermarks[partition], now)

    def take(
        self, partitions: Iterable[int], now: float
    ) -> tuple[dict[int, RetainedPartition], set[int]]:
        """Stop keeping `partitions` (assigned again): those kept that are still in their time,
        whose restore reads the tail, and those kept past it (the restore thread was too busy to
        forget them), whose restore reads whole."""
        taken = {p: self._kept.pop(p) for p in partitions if p in self._kept}
        expired = {partition for partition, kept in taken.items() if kept.until <= now}
        return {p: kept for p, kept in taken.items() if p not in expired}, expired

    def drop(self, partition: int) -> None:
        """Stop keeping `partition`, if it was kept."""
        self._kept.pop(partition, None)

    def expire(self, now: float) -> set[int]:
        """Stop keeping the partitions kept past their time; return them (to forget)."""
        expired = {p for p, kept in self._kept.items() if kept.until <= now}
        for partition in expired:
            del self._kept[partition]
        return expired
