"""The hand-off between the consuming thread and the scoring thread: closed micro-batches in
order, with one lock and one owner per batch.

Responsibilities:
- hold closed batches in order until the scoring thread takes them (`offer`, `take`), or let
  the consuming thread score a batch itself when nothing is waiting or being scored (`claim`:
  inline scoring, `stream/scoring.py`);
- tell the consuming thread when the scoring thread is behind (`full`, `wait_for_room`), so it
  stops forming batches nobody can score yet;
- drop the records of revoked or lost partitions from batches not yet taken (`discard`);
- tell when everything offered has been scored (`unfinished`, `wait_until_done`), for
  rebalances and shutdown, and end the scoring thread once drained (`close`).

Key design decisions:
- A batch belongs to exactly one thread at a time: the hand-off until `take`, the scoring
  thread from then until `done`. `discard` only ever replaces batches the hand-off still owns,
  with new lists, so the scoring thread never sees a batch change under it.
- `offer` never blocks and never refuses: a batch is closed when it is due, and it must not be
  lost. The consuming thread keeps what it holds bounded by not fetching while `full`; the
  in-flight bound (`stream/flow.py`) bounds memory whatever happens.
- Every wait is on a condition variable of the one lock, no sleep polling: `_changed` for the
  waiting batches, `_finished` for batches done; a batch finished wakes only those that wait
  for that (an idle scoring thread is not woken for every batch scored inline).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from stream.batcher import Batch

T = TypeVar("T")


class Handoff(Generic[T]):
    """Closed batches waiting for the scoring thread, bounded by `capacity` for the producer."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._waiting: deque[Batch[T]] = deque()
        self._taken = 0
        self._closed = False
        lock = threading.Lock()
        self._changed = threading.Condition(lock)
        self._finished = threading.Condition(lock)

    @property
    def full(self) -> bool:
        """Whether `capacity` batches already wait: the scoring thread is behind."""
        with self._changed:
            return len(self._waiting) >= self._capacity

    @property
    def unfinished(self) -> int:
        """Batches offered and not yet done: waiting, or being scored."""
        with self._changed:
            return len(self._waiting) + self._taken

    def offer(self, batch: Batch[T]) -> None:
        """Append a closed batch (consuming thread). Raises RuntimeError once closed."""
        with self._changed:
            if self._closed:
                raise RuntimeError("the hand-off is closed")
            self._waiting.append(batch)
            self._changed.notify_all()

    def claim(self) -> bool:
        """Own the next batch on the calling thread instead of offering it, which keeps batches
        in order only while none is waiting or being scored: then True, and the caller owns
        it until `done` (it counts as `unfinished` meanwhile); otherwise False (offer it)."""
        with self._changed:
            if self._waiting or self._taken or self._closed:
                return False
            self._taken += 1
            return True

    def wait_for_room(self, timeout_s: float) -> bool:
        """Block until fewer than `capacity` batches wait, at most `timeout_s`; return whether
        there is room."""
        with self._changed:
            return self._changed.wait_for(
                lambda: len(self._waiting) < self._capacity, max(0.0, timeout_s)
            )

    def take(self, timeout_s: float) -> Batch[T] | None:
        """The next batch (scoring thread), which it owns until `done`; None when none came
        within `timeout_s`, or when the hand-off is closed and drained (see `drained`)."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._waiting or self._closed, timeout_s):
                return None
            if not self._waiting:
                return None
            self._taken += 1
            batch = self._waiting.popleft()
            self._changed.notify_all()
            return batch

    def done(self, _batch: Batch[T]) -> None:
        """A batch taken or claimed is finished."""
        with self._finished:
            self._taken -= 1
            self._finished.notify_all()

    @property
    def drained(self) -> bool:
        """Closed, and nothing left to take."""
        with self._changed:
            return self._closed and not self._waiting

    def discard(self, drop: Callable[[T], bool]) -> int:
        """Remove the items for which `drop` is true from the batches not yet taken (a batch
        left empty is removed); return how many items were removed."""
        removed = 0
        with self._changed:
            kept: deque[Batch[T]] = deque()
            for batch in self._waiting:
                items = [item for item in batch.items if not drop(item)]
                removed += len(batch.items) - len(items)
                if items:
                    kept.append(
                        batch if len(items) == len(batch.items) else batch._replace(items=items)
                    )
            self._waiting = kept
            self._changed.notify_all()
            self._finished.notify_all()  # nothing may be left to wait for
        return removed

    def close(self) -> None:
        """No more batches will come: `take` returns None once the waiting ones are taken."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def wait_until_done(self, deadline_s: float) -> bool:
        """Block until every offered batch is done, or the `time.monotonic()` deadline passes;
        return whether all are done."""
        with self._finished:
            return self._finished.wait_for(
                lambda: not self._waiting and not self._taken,
                max(0.0, deadline_s - time.monotonic()),
            )
