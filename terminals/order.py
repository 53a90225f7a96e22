"""The router's inputs in event-time order: which records to route next, which input partitions
to pause, and how far each input has been read (the marks the table's clock follows).

Why: the worker counts two inputs, the transactions and the labels, and its clock says what is
stale and which terminals are idle. Read as they come, the small labels topic is read to its
end (a label's report time, weeks ahead) long before a backlog of transactions; a clock moved by
whichever input is read first then makes every older transaction stale. So, as Kafka Streams
does (it picks the next record from the partition whose head is oldest, waiting up to
`max.task.idle.ms` for an empty one), the router routes a record only once every input partition
has been read up to its time:

- Each assigned input partition has a queue of records read but not routed, in offset order.
  A record's key is the newest trusted time its partition has shown up to it (its own event
  time, a label's report time, or the one before it when its time is later than the wall clock
  allows, or missing: an invalid record), so keys never decrease within a partition and a
  record is never routed before the records in front of it.
- `take` routes, in key order, every record whose key is at most the bound: the smallest newest
  key over the partitions that are not idle. A partition with nothing queued holds the others
  back until it is read again, or until it has read nothing for `wait_s` (idle;
  FRAUD_FEATURES_INPUT_WAIT_MS, Kafka Streams' `max.task.idle.ms`), whether or not it was read
  to its end: the end of what the broker had a moment ago is not the end of a backfill still
  being written. Counted idle at its end at once, such a partition held no clock back, the
  clock ran ahead to the other inputs' time, and what came next on it was stale (issue 44).
  In a live run the counts then trail by up to the wait, which no feature reads: the windows
  end days back (docs/benchmarks.md).
- A partition whose queue holds `max_queued` records, or `max_bytes` of what they hold (a
  dead letter keeps its record's bytes), is paused (librdkafka stops fetching it and drops
  what it prefetched) and resumed below half of both: memory stays bounded while one input is
  held back, by those plus one `consume` batch per partition.
- `marks` says, per partition, the key every record it will still route has reached (its head's
  key, or its newest key when its queue is empty) and whether it is idle: sent with the
  internal records, so each table partition's clock moves with the minimum over every input,
  whichever router replica owns it (terminals/state.py).

Pure: no Kafka, no faust; the caller reads, pauses and commits. The wall clock is a parameter.
"""

from __future__ import annotations

import bisect
import time
from collections import Counter
from collections.abc import Callable, Iterable
from functools import partial
from itertools import accumulate
from operator import sub
from typing import Generic, TypeVar

from terminals.events import InputMarks

T = TypeVar("T")

#: A partition's key before it has shown any trusted time.
NO_TIME = -1


class _Input(Generic[T]):
    """One input partition's queue: its keys (never decreasing) and records, from `head` on."""

    __slots__ = (
        "at_end",
        "bytes",
        "head",
        "items",
        "keys",
        "newest",
        "paused",
        "read_at",
        "sizes",
    )

    def __init__(self) -> None:
        self.keys: list[int] = []
        self.items: list[T] = []
        self.sizes: list[int] = []
        self.head = 0
        #: What the queued records hold, in bytes (as the caller sized them).
        self.bytes = 0
        #: The newest key shown (NO_TIME: none yet).
        self.newest = NO_TIME
        #: Read to its end (partition EOF) since its last record: it has no lag to tell.
        self.at_end = False
        #: When it was last read a record, or assigned (monotonic s).
        self.read_at = 0.0
        self.paused = False

    def __len__(self) -> int:
        return len(self.keys) - self.head

    def drop(self, count: int) -> None:
        self.bytes -= sum(self.sizes[self.head : self.head + count])
        self.head += count
        if self.head == len(self.keys):
            self.keys.clear()
            self.items.clear()
            self.sizes.clear()
            self.head = 0
        elif self.head > 1_024 and self.head * 2 > len(self.keys):
            del self.keys[: self.head]
            del self.items[: self.head]
            del self.sizes[: self.head]
            self.head = 0


class EventTimeOrder(Generic[T]):
    """The records of the assigned input partitions, routed in event-time order (see the module
    docstring). Keys are strings naming the partition ("t3", "l0"); `T` is what the caller
    routes for a record."""

    def __init__(
        self,
        max_queued: int,
        max_bytes: int,
        wait_s: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_queued < 2:
            raise ValueError(f"max_queued must be >= 2, got {max_queued}")
        if max_bytes < 2:
            raise ValueError(f"max_bytes must be >= 2, got {max_bytes}")
        if wait_s < 0:
            raise ValueError(f"wait_s must be >= 0, got {wait_s}")
        self._max_queued = max_queued
        self._max_bytes = max_bytes
        self._wait_s = wait_s
        self._monotonic = monotonic
        self._inputs: dict[str, _Input[T]] = {}

    # -- the assignment ----------------------------------------------------------------------

    def assign(self, keys: Iterable[str]) -> None:
        """Partitions now assigned: empty queues, not read yet (waited for)."""
        now = self._monotonic()
        for key in keys:
            if key not in self._inputs:
                state: _Input[T] = _Input()
                state.read_at = now
                self._inputs[key] = state

    def revoke(self, keys: Iterable[str]) -> None:
        """Partitions taken away: what was queued is dropped (not committed, so the next owner
        reads it again)."""
        for key in keys:
            self._inputs.pop(key, None)

    def __contains__(self, key: str) -> bool:
        return key in self._inputs

    def queued(self) -> int:
        """Records read and not routed yet, over every partition."""
        return sum(len(state) for state in self._inputs.values())

    def queued_bytes(self) -> int:
        """What the records read and not routed yet hold, over every partition."""
        return sum(state.bytes for state in self._inputs.values())

    # -- what was read -----------------------------------------------------------------------

    def extend(self, key: str, times_ms: list[int], items: list[T], sizes: list[int]) -> None:
        """Records read from `key`, in offset order, with their trusted times (NO_TIME: none
        that may move a clock: it takes the time before it) and what each holds in bytes."""
        if not items:
            return
        state = self._inputs[key]
        keys = list(accumulate(times_ms, max, initial=state.newest))
        del keys[0]
        state.newest = keys[-1]
        state.keys += keys
        state.items += items
        state.sizes += sizes
        state.bytes += sum(sizes)
        state.at_end = False
        state.read_at = self._monotonic()

    def reading(self) -> list[str]:
        """The partitions not known to be read to their end."""
        return [key for key, state in self._inputs.items() if not state.at_end]

    def at_end(self, key: str) -> None:
        """Every record of the partition was read, as far as its last fetch knew (librdkafka's
        partition EOF). It is still waited for: idle only once it has read nothing for `wait_s`."""
        state = self._inputs.get(key)
        if state is not None:
            state.at_end = True

    # -- what to route -----------------------------------------------------------------------

    def take(self, limit: int) -> tuple[list[T], dict[str, T]]:
        """Up to `limit` records whose turn it is, in key order (each partition's in its
        offset order): every key at most the bound, the smallest newest key over the partitions
        that are not idle; and, per partition, the last of them it gave (the caller commits up to
        it). The bound is taken again until nothing more is due (a partition emptied by that
        may be idle already): one batch, not one per bound."""
        taken: list[T] = []
        last: dict[str, T] = {}
        while len(taken) < limit:
            bound = self._bound()
            if bound is None or not self._due(bound, limit - len(taken), taken, last):
                break
        return taken, last

    def _due(self, bound: int, limit: int, taken: list[T], last: dict[str, T]) -> bool:
        """Append to `taken` up to `limit` records with keys at most `bound`, in key order,
        dropped from their queues; whether there was any. Per record: list copies and a sort
        of the keys, no tuple made (this runs on every record the worker reads)."""
        names: list[str] = []
        starts: list[int] = []
        keys: list[int] = []
        items: list[T] = []
        for key, state in self._inputs.items():
            if not len(state):
                continue
            end = bisect.bisect_right(state.keys, bound, state.head)
            if end > state.head:
                names.append(key)
                starts.append(len(keys))
                keys += state.keys[state.head : end]
                items += state.items[state.head : end]
        if not names:
            return False
        if len(names) == 1:
            due = items[:limit]
            counts = {names[0]: len(due)}
        else:
            # Stable: each partition's records, already in key order, keep their offset order,
            # so what `limit` leaves out is the end of some partitions' runs.
            order = sorted(range(len(keys)), key=keys.__getitem__)
            del order[limit:]
            due = list(map(items.__getitem__, order))
            if len(order) == len(keys):
                counts = dict(zip(names, map(sub, [*starts[1:], len(keys)], starts), strict=True))
            else:
                runs = Counter(map(partial(bisect.bisect_right, starts), order))
                counts = {names[run - 1]: count for run, count in runs.items()}
        taken += due
        for key, count in counts.items():
            state = self._inputs[key]
            last[key] = state.items[state.head + count - 1]
            state.drop(count)
        return True

    def _bound(self) -> int | None:
        """The newest key every partition that is not idle has shown; None when none is
        (every partition idle, nothing queued)."""
        now = self._monotonic()
        bound: int | None = None
        for state in self._inputs.values():
            if not len(state) and self._idle(state, now):
                continue
            if bound is None or state.newest < bound:
                bound = state.newest
        return bound

    def _idle(self, state: _Input[T], now: float) -> bool:
        """Whether an empty partition holds no one back: it has read nothing for `wait_s`.
        Counted from its last read, not from when its queue emptied: its records may have
        waited for another partition's, and the partitions must not take their waits in turn."""
        return now - state.read_at >= self._wait_s

    # -- pausing -----------------------------------------------------------------------------

    def to_pause(self) -> list[str]:
        """Partitions to pause now (their queue is full); marked paused."""
        full = [
            key
            for key, state in self._inputs.items()
            if not state.paused
            and (len(state) >= self._max_queued or state.bytes >= self._max_bytes)
        ]
        for key in full:
            self._inputs[key].paused = True
        return full

    def to_resume(self) -> list[str]:
        """Paused partitions to resume now (their queue is below half); marked resumed."""
        records, held = self._max_queued // 2, self._max_bytes // 2
        low = [
            key
            for key, state in self._inputs.items()
            if state.paused and len(state) < records and state.bytes < held
        ]
        for key in low:
            self._inputs[key].paused = False
        return low

    # -- how far each input is read ----------------------------------------------------------

    def marks(self, partitions: tuple[int, int]) -> InputMarks:
        """Per assigned partition: the key every record it will still route has reached, and
        whether it is idle (`partitions`: those of the two input topics)."""
        now = self._monotonic()
        reached: dict[str, tuple[int, bool]] = {}
        for key, state in self._inputs.items():
            if len(state):
                reached[key] = (state.keys[state.head], False)
            else:
                reached[key] = (state.newest, self._idle(state, now))
        return InputMarks(partitions, reached)
