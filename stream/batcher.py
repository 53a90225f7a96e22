"""Micro-batch formation with a size cap and a deadline from the first record.

Contract (the same as Ray Serve's `@serve.batch` and Faust's `Stream.take(max_, within)`):

- a batch closes when it holds `max_batch_size` items, or `max_wait_ms` after its first item was
  added, whichever comes first;
- a batch is never empty and never holds more than `max_batch_size` items: with a cap of 1000,
  item 1001 starts the next batch;
- items leave in the order they were added.

The batcher does no I/O and never sleeps: the caller asks `seconds_until_due()` how long it may
block waiting for more records, and passes the clock reading in, so tests drive time by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar

T = TypeVar("T")


class Batch(NamedTuple, Generic[T]):
    """A closed micro-batch."""

    items: list[T]
    #: Clock reading (seconds) when the first item was added.
    opened_at_s: float
    #: Clock reading (seconds) when the batch closed.
    closed_at_s: float
    #: True when it closed because it reached its cap, False when its deadline passed.
    closed_full: bool

    @property
    def wait_s(self) -> float:
        """How long the first item waited for the batch to close."""
        return self.closed_at_s - self.opened_at_s


class MicroBatcher(Generic[T]):
    """Accumulates items into micro-batches bounded by size and by age of their first item."""

    def __init__(self, max_batch_size: int, max_wait_ms: float) -> None:
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int):
            raise TypeError(f"max_batch_size must be an int, got {max_batch_size!r}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        self.max_wait_s = max_wait_ms / 1000.0
        self._cap = max_batch_size
        self._next_cap = max_batch_size
        self._items: list[T] = []
        self._opened_at_s = 0.0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def cap(self) -> int:
        """The size cap of the open (or next) batch."""
        return self._cap if self._items else self._next_cap

    @property
    def room(self) -> int:
        """How many more items the open batch can take before it closes."""
        return self.cap - len(self._items)

    def set_cap(self, max_batch_size: int) -> None:
        """Change the size cap from the next batch on; the open batch keeps the cap it opened
        with, so no batch ever holds more than the cap in force when it opened."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self._next_cap = max_batch_size

    def add(self, item: T, now_s: float) -> Batch[T] | None:
        """Add one item; return the batch if this item filled it, else None."""
        if not self._items:
            self._opened_at_s = now_s
            self._cap = self._next_cap
        self._items.append(item)
        if len(self._items) >= self._cap:
            return self._close(now_s, full=True)
        return None

    def discard(self, drop: Callable[[T], bool]) -> int:
        """Remove the open batch's items for which `drop` is true (partitions revoked or lost);
        return how many were removed. The deadline stays that of the first item added."""
        kept = [item for item in self._items if not drop(item)]
        removed = len(self._items) - len(kept)
        self._items = kept
        return removed

    def seconds_until_due(self, now_s: float) -> float | None:
        """Seconds until the open batch's deadline (0 if past), or None when no batch is open."""
        if not self._items:
            return None
        return max(0.0, self._opened_at_s + self.max_wait_s - now_s)

    def take_due(self, now_s: float) -> Batch[T] | None:
        """Close and return the open batch if its deadline has passed."""
        if self._items and now_s >= self._opened_at_s + self.max_wait_s:
            return self._close(now_s, full=False)
        return None

    def drain(self, now_s: float) -> Batch[T] | None:
        """Close and return the open batch whatever its age (shutdown, rebalance)."""
        return self._close(now_s, full=False) if self._items else None

    def _close(self, now_s: float, full: bool) -> Batch[T]:
        batch = Batch(self._items, self._opened_at_s, now_s, full)
        self._items = []
        return batch
