"""Where `CardHistory` keeps its cards: one fixed-size row per card in a few numpy columns,
an index from card key to row, and the row's changelog form.

Responsibilities and decisions:
- A card's key is whatever string identifies it to the owner: its id (training), or its id
  qualified by its input partition in the service, whose one store holds every partition the
  replica owns (`stream/owned_card_history.py`).
- Rows are taken from a free list and the columns double when it runs out, so a new card costs
  no allocation in the common case and memory per card is fixed (`STATE_BYTES` serialized).
- A card's changelog record is its row as one `STATE_DTYPE` record behind a version byte; a
  reader refuses any other version or length rather than guess.
- Rows changed since the changelog last took them are marked dirty, so a batch writes each
  changed card once. The rows marked are also listed, so taking them costs what the batches
  changed, not a scan of every card (docs/benchmarks.md, "Figures behind design choices").
- A restore keeps, per card, the state with the highest input offset, not the last one read: a
  changelog whose records of one card arrived out of order (an older state written again by a
  retry) must not roll the card back. A tombstone forgets the card; a state after it starts the
  card anew (a card evicted and then seen again).
- `snapshot` and `revert` copy a few cards' rows out and back: an aborted transaction's changes
  are undone without reading the changelog again.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple, TypeVar, cast

import numpy as np
import numpy.typing as npt

from scorer.card_history_record import (
    INITIAL_CAPACITY,
    NUM_SUMS,
    RING_SIZE,
    SERIALIZED_STATE_DTYPE,
    STATE_BYTES,
    STATE_DTYPE,
    STATE_VERSION,
)
from scorer.card_history_update import CardColumns

_T = TypeVar("_T", bound=np.generic)


#: Where a serialized state keeps its input offset (after the version byte and `last_ms`).
def _offset_at() -> int:
    outer, inner = SERIALIZED_STATE_DTYPE.fields, STATE_DTYPE.fields
    assert outer is not None and inner is not None
    return int(outer["state"][1]) + int(inner["offset"][1])


_OFFSET_AT = _offset_at()


class CardSnapshot(NamedTuple):
    """Some cards' rows as they were: `revert` puts them back (absent ones are forgotten)."""

    keys: list[str]
    held: npt.NDArray[np.bool_]
    records: npt.NDArray[np.void]  # STATE_DTYPE, one per held key (in `keys` order)


class Restored(NamedTuple):
    """What `CardHistoryStore.restore_states` did with a run of changelog records."""

    #: Why records were refused, one line each (their cards start anew).
    rejected: list[str]
    #: The newest event time the run's cards hold after it (-1: none held).
    newest_event_ms: int


class CardHistoryStore:
    """The rows of a set of cards, by key. Not thread-safe: one owner calls it."""

    def __init__(self) -> None:
        capacity = INITIAL_CAPACITY
        self._times = np.full((capacity, 2), -1, np.int64)  # last_ms, offset
        self._sums = np.zeros((capacity, NUM_SUMS), np.float32)
        self._ring_minute = np.zeros((capacity, RING_SIZE), np.uint32)
        self._ring_merchant = np.zeros((capacity, RING_SIZE), np.uint32)
        self._ring_country = np.zeros((capacity, RING_SIZE), np.uint16)
        self._ring_next = np.zeros(capacity, np.uint8)
        self._dirty = np.zeros(capacity, np.bool_)
        #: Rows marked dirty since `take_dirty` last ran (repeats allowed), and how many.
        self._marked: list[npt.NDArray[np.int64]] = []
        self._marked_count = 0
        self._used = np.zeros(capacity, np.bool_)
        self._index: dict[str, int] = {}
        self._ids: list[str | None] = [None] * capacity
        self._free: list[int] = list(range(capacity - 1, -1, -1))
        self._key_bytes = 0

    def _rows_for(self, keys: Sequence[str]) -> npt.NDArray[np.int64]:
        index = self._index
        rows = [index.get(key, -1) for key in keys]
        if -1 in rows:
            # New cards get their rows first and are cleared in one pass; a card new to this
            # batch and seen twice in it gets one row.
            new = dict.fromkeys(key for key, row in zip(keys, rows, strict=True) if row < 0)
            self._clear(self._take_rows(list(new)))
            rows = [index[key] for key in keys]
        return np.array(rows, np.int64)

    def _take_rows(self, keys: list[str]) -> npt.NDArray[np.int64]:
        """Rows for cards not seen before (distinct keys; the rows are not cleared yet)."""
        while len(self._free) < len(keys):
            self._grow()
        taken = self._free[len(self._free) - len(keys) :]
        del self._free[len(self._free) - len(keys) :]
        self._index.update(zip(keys, taken, strict=True))
        ids = self._ids
        for key, row in zip(keys, taken, strict=True):
            ids[row] = key
        rows = np.array(taken, np.int64)
        self._used[rows] = True
        self._key_bytes += sum(map(sys.getsizeof, keys))
        return rows

    def _columns(self) -> CardColumns:
        """The state columns, as the compiled update changes them in place."""
        return CardColumns(
            self._times,
            self._sums,
            self._ring_minute,
            self._ring_merchant,
            self._ring_country,
            self._ring_next,
        )

    def _clear(self, rows: npt.NDArray[np.int64]) -> None:
        self._times[rows] = -1
        self._sums[rows] = 0.0
        self._ring_minute[rows] = 0
        self._ring_merchant[rows] = 0
        self._ring_country[rows] = 0
        self._ring_next[rows] = 0

    def _grow(self) -> None:
        old = len(self._times)

        def doubled(array: npt.NDArray[_T], fill: int = 0) -> npt.NDArray[_T]:
            # np.zeros maps pages the kernel zeroes when first written: only the old rows are
            # copied now (a restore of a million cards doubles its columns ten times).
            grown = np.zeros((2 * old, *array.shape[1:]), array.dtype)
            if fill:
                grown[old:] = fill
            grown[:old] = array
            return grown

        self._times = doubled(self._times, -1)
        self._sums = doubled(self._sums)
        self._ring_minute = doubled(self._ring_minute)
        self._ring_merchant = doubled(self._ring_merchant)
        self._ring_country = doubled(self._ring_country)
        self._ring_next = doubled(self._ring_next)
        self._dirty = doubled(self._dirty)
        self._used = doubled(self._used)
        self._ids.extend([None] * old)
        self._free.extend(range(2 * old - 1, old - 1, -1))

    def forget(self, keys: Iterable[str]) -> None:
        """Drop these cards (unknown keys are ignored); their rows are reused."""
        for key in keys:
            row = self._index.pop(key, None)
            if row is None:
                continue
            self._ids[row] = None
            self._used[row] = False
            self._dirty[row] = False
            self._key_bytes -= sys.getsizeof(key)
            self._free.append(row)

    def __iter__(self) -> Iterator[str]:
        """The keys of the cards held."""
        return iter(self._index)

    def _records(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.void]:
        records = np.empty(len(rows), STATE_DTYPE)
        records["last_ms"] = self._times[rows, 0]
        records["offset"] = self._times[rows, 1]
        records["sums"] = self._sums[rows]
        records["ring_minute"] = self._ring_minute[rows]
        records["ring_merchant"] = self._ring_merchant[rows]
        records["ring_country"] = self._ring_country[rows]
        records["ring_next"] = self._ring_next[rows]
        return records

    def _mark_dirty(self, rows: npt.NDArray[np.int64]) -> None:
        """Note that these rows changed (their cards go to the next `take_dirty`)."""
        self._dirty[rows] = True
        self._marked.append(rows)
        self._marked_count += len(rows)
        if self._marked_count > len(self._dirty):  # an owner that never takes: stay bounded
            self._marked = [np.flatnonzero(self._dirty)]
            self._marked_count = len(self._marked[0])

    def take_dirty(self) -> list[tuple[str, bytes]]:
        """(key, serialized state) of every card changed since the last call."""
        if not self._marked:
            return []
        marked = np.unique(np.concatenate(self._marked))
        self._marked, self._marked_count = [], 0
        rows = marked[self._dirty[marked]]  # a card forgotten since is no longer dirty
        self._dirty[rows] = False
        data = self._serialized(rows)
        ids = self._ids
        return [
            (str(ids[row]), data[i * STATE_BYTES : (i + 1) * STATE_BYTES])
            for i, row in enumerate(rows.tolist())
        ]

    def _serialized(self, rows: npt.NDArray[np.int64]) -> bytes:
        serialized = np.empty(len(rows), SERIALIZED_STATE_DTYPE)
        serialized["version"] = STATE_VERSION
        serialized["state"] = self._records(rows)
        return serialized.tobytes()

    def state_of(self, key: str) -> bytes | None:
        """The card's serialized state now, or None when it is not held."""
        row = self._index.get(key)
        return None if row is None else self._serialized(np.array([row], np.int64))

    def snapshot(self, keys: Sequence[str]) -> CardSnapshot:
        """The rows of these cards (distinct keys) as they are now, for `revert`."""
        index = self._index
        rows = np.array([index.get(key, -1) for key in keys], np.int64)
        held = rows >= 0
        return CardSnapshot(list(keys), held, self._records(rows[held]))

    def revert(self, snapshot: CardSnapshot) -> None:
        """Put the cards of `snapshot` back as they were then: held ones get their rows back,
        the others are forgotten. Nothing is marked dirty (the changelog has these states)."""
        absent = [key for key, held in zip(snapshot.keys, snapshot.held, strict=True) if not held]
        self.forget(absent)
        kept = [key for key, held in zip(snapshot.keys, snapshot.held, strict=True) if held]
        if kept:
            rows = self._rows_for(kept)
            self._load(rows, snapshot.records)
            self._dirty[rows] = False

    def _load(self, rows: npt.NDArray[np.int64], records: npt.NDArray[np.void]) -> None:
        self._times[rows, 0] = records["last_ms"]
        self._times[rows, 1] = records["offset"]
        self._sums[rows] = records["sums"]
        self._ring_minute[rows] = records["ring_minute"]
        self._ring_merchant[rows] = records["ring_merchant"]
        self._ring_country[rows] = records["ring_country"]
        self._ring_next[rows] = records["ring_next"] % RING_SIZE

    def restore(self, records: Iterable[tuple[str, bytes | None]]) -> list[str]:
        """Load a run of changelog records, in changelog order: (key, state), None being a
        tombstone that forgets the card. Between tombstones a card ends with the state of the
        highest input offset read (ties: the later one), so an older state written after a
        newer one never wins; a state after a tombstone starts the card anew. A chunk of a
        compacted changelog loads with a few numpy copies instead of one per record.

        A record that is not a state this version wrote (wrong length or version) forgets its
        card, which starts anew; the return value says why, one line per such record.
        """
        pairs = list(records)
        keys, states = [key for key, _ in pairs], [state for _, state in pairs]
        return self.restore_states(keys, states).rejected

    def restore_states(self, keys: list[str], states: list[bytes | None]) -> Restored:
        """`restore` of a run given as its keys and their states (a restore reads them so), and
        the newest event time the run's cards hold after it."""
        newest = self._restore_distinct_states(keys, states)
        if newest is not None:
            return Restored([], newest)
        #: key → (offset, state or None, whether a tombstone of this run came before it)
        last: dict[str, tuple[int, bytes | None, bool]] = {}
        rejected: list[str] = []
        for key, state in zip(keys, states, strict=True):
            if state is not None and (len(state) != STATE_BYTES or state[0] != STATE_VERSION):
                rejected.append(
                    f"card {key!r}: not a version {STATE_VERSION} card state "
                    f"({len(state)} bytes, expected {STATE_BYTES})"
                )
                state = None
            if state is None:
                last[key] = (-1, None, True)
                continue
            offset = int.from_bytes(state[_OFFSET_AT : _OFFSET_AT + 8], "little", signed=True)
            before = last.get(key)
            if before is None:
                last[key] = (offset, state, False)
            elif before[1] is None or offset >= before[0]:
                last[key] = (offset, state, before[2])
        self.forget([key for key, (_, state, _) in last.items() if state is None])
        loaded = [(key, entry) for key, entry in last.items() if entry[1] is not None]
        # A state loads past what its card holds from earlier chunks, unless a tombstone of
        # this chunk forgot that.
        index = self._index
        held_rows = np.array([index.get(key, -1) for key, _ in loaded], np.int64)
        held = np.where(held_rows >= 0, self._times[held_rows, 1], -1)
        offsets = np.array([offset for _, (offset, _, _) in loaded], np.int64)
        anew = np.array([after for _, (_, _, after) in loaded], np.bool_)
        newer = anew | (offsets >= held)
        kept = [entry for entry, new in zip(loaded, newer.tolist(), strict=True) if new]
        if kept:
            rows = self._rows_for([key for key, _ in kept])
            data = b"".join([state for _, (_, state, _) in kept if state is not None])
            self._load(rows, np.frombuffer(data, SERIALIZED_STATE_DTYPE)["state"])
            self._dirty[rows] = False
        held_now = np.array([index[key] for key in last if key in index], np.int64)
        return Restored(rejected, int(self._times[held_now, 0].max()) if len(held_now) else -1)

    def _restore_distinct_states(self, keys: list[str], states: list[bytes | None]) -> int | None:
        """`restore_states` of a run whose keys are distinct and whose records are all states
        this version wrote (most chunks of a compacted changelog), in a few numpy passes instead
        of a step per record: the newest event time its cards hold after it; None, loading
        nothing, for any other run."""
        if not keys or None in states or len(set(keys)) < len(keys):
            return None
        present = cast(list[bytes], states)
        sizes = np.fromiter(map(len, present), np.int64, len(present))
        if (sizes != STATE_BYTES).any():
            return None
        parsed = np.frombuffer(b"".join(present), SERIALIZED_STATE_DTYPE)
        if (parsed["version"] != STATE_VERSION).any():
            return None
        loaded = parsed["state"]
        # A state loads past what its card holds from earlier runs (ties: the later one).
        index = self._index
        rows = np.array([index.get(key, -1) for key in keys], np.int64)
        new = rows < 0
        newer = loaded["offset"] >= np.where(new, -1, self._times[rows, 1])
        adding = new & newer
        if adding.any():  # one lookup per key: the new cards' rows are taken from what it found
            fresh = [key for key, add in zip(keys, adding.tolist(), strict=True) if add]
            taken = self._take_rows(fresh)
            self._clear(taken)
            rows[adding] = taken
        if not newer.all():
            loaded, changed = loaded[newer], rows[newer]
        else:
            changed = rows
        self._load(changed, loaded)
        self._dirty[changed] = False
        held = rows[rows >= 0]
        return int(self._times[held, 0].max()) if len(held) else -1

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: object) -> bool:
        return key in self._index

    @property
    def nbytes(self) -> int:
        """Memory held: the state columns and flags (all rows, free ones too), the index
        (dict, row → key list, free list) and the keys it keeps alive."""
        arrays = (*self._columns(), self._dirty, self._used)
        return (
            sum(array.nbytes for array in arrays)
            + sys.getsizeof(self._index)
            + sys.getsizeof(self._ids)
            + sys.getsizeof(self._free)
            + self._key_bytes
        )
