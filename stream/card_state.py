"""Per-card history on the hot path: one `CardHistory` for every partition this replica owns,
kept durable in a compacted changelog topic.

Responsibilities:
- restore a partition's state from its changelog before the partition's first batch is scored
  (on assignment, on the restore thread of `stream/restores.py` while the partition is
  paused), and say how long that took;
- turn a batch's records into their history feature rows (in consumption order) and into the
  changelog records their updates produced (changed cards, and tombstones for cards idle past
  the longest window), to be written with the batch's outputs: the commit that covers a batch's
  input offsets covers its state too;
- keep each partition's event-time clock (its watermark), which no single record can move past
  the wall clock plus the allowed skew (`contracts/event_time.py`);
- drop a partition's state when it is lost; when it is revoked with every change durable, keep
  its cards for FRAUD_STATE_RETAIN_S, so that if it comes back only the changelog's tail is
  read; after an aborted transaction (exactly-once), undo the changes of the batches it held,
  whose updates never became durable;
- say what a card's state is now, for a changelog record sent again (`stream/redelivery.py`).

Key design decisions:
- The changelog (`stream/card_changelog.py`) is partitioned as the input: a card's state
  moves with its transactions on a rebalance.
- One store for every owned partition, not one per partition: a batch's cards are updated in
  one vectorised pass, so its cost does not grow with the partitions it spans (one history
  per partition cost over three times as much a record: docs/benchmarks.md, "Figures behind
  design choices").
  A card's key is its id behind its partition (`card_key`): a card id seen in two partitions
  (a producer that keys by something else) is two cards, as before, and a string key costs no
  more memory than the id alone (a (partition, id) tuple cost 84 bytes a card more, and a
  1,000,000-card restore 36 % more time).
- Updates are idempotent by input offset (`CardHistory`): a record read again after a crash
  changes nothing twice.
- Event time, bounded: a record dated past the bound never moves its partition's watermark,
  and counts in its card's history as of that watermark (it is counted, so a future date cannot
  hide a spree from the windows; on a partition whose clock knows no time yet it changes no
  state); a record older than the longest window as of the watermark changes no state (its
  features read the state as it is). Idle cards are evicted as of the partition's watermark,
  never as of one batch's newest record. A restored partition's watermark is the newest event
  time its cards applied, so what was stale before a rebalance is stale after it.
- A batch with records of a partition that is not loaded (revoked or lost while the batch was
  formed) gives those records neutral features and updates the others as usual.
- A restore keeps, per card, the state with the highest input offset; a tombstone forgets the
  card, and a state after it starts the card anew (`CardStore.restore`). What it reads, and up
  to where: `stream/card_changelog.py`.
- Exactly-once undo: before a batch changes its cards (and before an eviction forgets some), their
  rows are copied; an abort puts back the copies of every batch past the committed offsets,
  newest first. Its cost is the batches' size, not the state's (a reload read every owned
  partition's changelog again: about 9 s per million cards). Past `UNDO_MAX_CARDS` copies
  between two commits the copies are dropped and an abort reloads, so memory stays bounded.
- Warm return: a partition revoked once all its changelog records are acknowledged (and, with
  exactly-once, committed) leaves its cards equal to a replay of its changelog up to the end
  the changelog had then, since only the owner writes there. The replica keeps them with that
  end offset (`let_go`) for `retain_s`; if the partition comes back meanwhile, the restore reads
  only the records written since (the next owner's), which replace or forget cards as a full
  replay would (a card's last record wins). In scenario 6 of the fault suite a partition came
  back after a full restore of 3 to 4 s. A changelog that no longer holds that offset (deleted
  by retention, or truncated) is read whole, as is a partition kept past `retain_s`; a retained
  partition is not owned, so no batch changes it and a record sent again skips its cards.
- Warm start (`warm_up`, FRAUD_STATE_WARM_UP): a replica about to join reads every partition's
  changelog up to the end it has then and keeps the cards as a warm return does, so the
  partitions it is given read only what their owners wrote since. Reading from an end taken
  before the read re-applies the records written during it: harmless, since applying a record
  again over cards that hold it changes nothing (the same state ties, an older one loses).
- A lock orders the restore thread's restores and the consuming thread's drops against the
  batches; a restore takes it per `RESTORE_APPLY_CHUNK` records loaded, so batches of other
  partitions go on meanwhile, waiting a few milliseconds at most.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from contracts.event_time import EventClock
from contracts.offsets import SourceOffset
from contracts.transaction import Transaction
from scorer.card_store import CardSnapshot
from scorer.columns import TransactionColumns
from scorer.history import CardHistory, neutral_history
from stream.card_changelog import Changelog, ChangelogBatch, ChangelogTailGone
from stream.metrics import ServiceMetrics

log = logging.getLogger(__name__)

#: How often, in wall-clock seconds, each partition looks for idle cards to evict (default of
#: FRAUD_STATE_EVICT_INTERVAL_S).
EVICT_INTERVAL_S = 60.0
#: Changelog records loaded per hold of the state lock. Each batch of the partitions kept waits
#: for the hold under way: a whole read (10,000 records) held it 20 ms (median; up to 100 ms
#: when the store grows) on an idle core, 1,000 records 1.7 ms, for the same total.
RESTORE_APPLY_CHUNK = 1_000
#: Exactly-once: the most card rows copied for undo between two commits (about 150 bytes each).
#: A transaction holds at most FRAUD_TRANSACTION_MAX_RECORDS records (10,000 by default), so
#: this is reached only with a much larger setting; an abort then reloads instead.
UNDO_MAX_CARDS = 200_000
#: How long, in seconds, the cards of a partition revoked cleanly stay in memory in case it comes
#: back (default of FRAUD_STATE_RETAIN_S).
RETAIN_S = 600.0


def _nothing() -> None:
    pass


class StatefulRecord(Protocol):
    """What the state needs of a record of a batch."""

    @property
    def transaction(self) -> Transaction: ...
    @property
    def position(self) -> SourceOffset: ...


class CardOwnership(NamedTuple):
    """A card's state now, as a changelog record sent again must carry it."""

    #: False when the card's partition is not this replica's (its next owner has the state).
    owned: bool
    #: The serialized state; None when the card is not held (a tombstone).
    state: bytes | None


#: Cards forgotten per hold of the state lock when partitions go.
FORGET_CHUNK = 20_000
#: Between a card key's partition and card id: never in a partition number.
KEY_SEPARATOR = "\x00"


def card_key(partition: int, card_id: str) -> str:
    """A card's key in the replica's store: its id, qualified by its input partition."""
    return f"{partition}{KEY_SEPARATOR}{card_id}"


class _Retained(NamedTuple):
    """A partition revoked with its cards kept."""

    #: The changelog's end offset when it was revoked: a return reads from there.
    end: int
    watermark: int
    #: When its cards go (`time.monotonic()`), unless it came back.
    until: float


class _Undo(NamedTuple):
    """What one batch changed, as it was before: its snapshots in the order they were taken."""

    #: The batch's highest input offset per partition: committed once every one is.
    offsets: dict[int, int]
    snapshots: list[CardSnapshot]


class CardState:
    """The card histories of the partitions this replica owns."""

    def __init__(
        self,
        changelog: Changelog,
        *,
        time_scale: float,
        metrics: ServiceMetrics,
        clock: EventClock | None = None,
        undo: bool = False,
        evict_interval_s: float = EVICT_INTERVAL_S,
        retain_s: float = RETAIN_S,
    ) -> None:
        """`undo`: keep what each batch changed until it commits, so an aborted transaction
        is undone in memory (exactly-once). `evict_interval_s`: how often each partition
        looks for idle cards. `retain_s`: how long a partition revoked cleanly keeps its cards
        (`let_go`); 0 forgets them at once."""
        self._evict_interval_s = evict_interval_s
        self._retain_s = retain_s
        self._changelog = changelog
        self.changelog_topic = changelog.topic
        self._metrics = metrics
        self._history = CardHistory(time_scale=time_scale)
        self._longest_ms = self._history.longest_window_ms
        self._clock = clock or EventClock(time_scale=time_scale)
        #: Partitions whose state is restored: each one's event-time watermark (-1: none yet)
        #: and when its idle cards were last evicted.
        self._watermark: dict[int, int] = {}
        self._last_eviction: dict[int, float] = {}
        self._undo: list[_Undo] | None = [] if undo else None
        self._undo_cards = 0
        #: Undo copies were dropped (too many): the next rollback reloads.
        self._undo_overflow = False
        #: Committed input positions (next offset to read) per partition, as last reported.
        self._committed: dict[int, int] = {}
        #: Partitions revoked whose cards are kept (not owned: no batch changes them).
        self._retained: dict[int, _Retained] = {}
        self._lock = threading.Lock()

    # -- consuming thread: rebalances --------------------------------------------------------

    def restore(self, partitions: Sequence[int], progress: Callable[[], None] = _nothing) -> None:
        """Load the state of newly assigned partitions from their changelog, replacing any state
        held for them; `progress` is called after every chunk read (a long restore is not a
        stuck replica)."""
        # Only a partition whose state is loaded has cards (a restore that failed or was
        # cancelled forgot what it read): asking the others would scan every card for nothing.
        now = time.monotonic()
        with self._lock:
            held = {partition for partition in partitions if partition in self._watermark}
            retained = {p: self._retained.pop(p) for p in partitions if p in self._retained}
        # Kept past their time (the restore thread was too busy to forget them): read whole.
        expired = {partition for partition, kept in retained.items() if kept.until <= now}
        retained = {p: kept for p, kept in retained.items() if p not in expired}
        self._forget(held | expired)
        for partition in partitions:
            started = time.monotonic()
            kept = retained.get(partition)
            try:
                if kept is not None:
                    cards, records, newest, tail = self._read_tail(partition, kept, progress)
                else:
                    cards, records, newest = self._read_changelog(partition, progress)
                    tail = False
            except BaseException:
                self._forget({partition})  # no half-restored partition stays in memory
                raise
            with self._lock:
                # The clock resumes at the newest event time the cards applied, so a record older
                # than the longest window is as stale after a restore as before; bounded like
                # any clock, against states an older version wrote from a future-dated record.
                self._watermark[partition] = min(newest, self._clock.bound_ms())
                self._last_eviction[partition] = time.monotonic()
            seconds = time.monotonic() - started
            self._metrics.observe_state_restore("tail" if tail else "whole", seconds, records)
            log.info(
                "restored card state topic=%s partition=%s cards=%s changelog_records=%s%s "
                "in %.3fs",
                self.changelog_topic,
                partition,
                cards,
                records,
                f" (kept cards, changelog read from {kept.end})" if tail and kept else "",
                seconds,
            )
        self._report()

    def drop(self, partitions: Sequence[int]) -> None:
        """Forget the state of partitions that went (their next owner restores it): `let_go`,
        then `forget_cards`."""
        self._forget(set(partitions))
        self._report()

    def let_go(self, partitions: Sequence[int], ends: Mapping[int, int] | None = None) -> list[int]:
        """Partitions that went are no longer owned: from now on no batch updates them and
        `current` says so. `ends`: the changelog's end offset of those revoked with every change
        durable, whose cards are kept for `retain_s` (see the module's "Warm return"). Return
        the others, whose cards stay in memory until `forget_cards` (a revoke leaves that to
        the restore thread: half of a million cards take about 0.4 s to forget)."""
        ends = ends if self.retains and ends is not None else {}
        watermarks = self._let_go(set(partitions))
        until = time.monotonic() + self._retain_s
        with self._lock:
            for partition, end in ends.items():
                if partition in watermarks:
                    self._retained[partition] = _Retained(end, watermarks[partition], until)
            released = [partition for partition in partitions if partition not in self._retained]
        self._report()
        return released

    def warm_up(self, progress: Callable[[], None] = _nothing) -> None:
        """Before joining the group, load every partition of the changelog that this replica
        does not own, each up to the end it has now, and keep their cards as `let_go` keeps
        those of a partition revoked cleanly: an assignment then reads only what was written
        since, and the cards of the partitions not given are forgotten once `retain_s` passes.
        Nothing when `retain_s` is 0. `progress` as for `restore`."""
        if not self.retains:
            return
        for partition in self._changelog.partition_ids():
            with self._lock:
                if partition in self._watermark or partition in self._retained:
                    continue
            started = time.monotonic()
            end = self._changelog.end(partition)
            try:
                cards, records, newest = self._read_changelog(partition, progress)
            except BaseException:
                self._forget({partition})
                raise
            with self._lock:
                self._retained[partition] = _Retained(
                    end, min(newest, self._clock.bound_ms()), time.monotonic() + self._retain_s
                )
            log.info(
                "warmed up card state topic=%s partition=%s cards=%s changelog_records=%s "
                "(kept until assigned, up to %ss) in %.3fs",
                self.changelog_topic,
                partition,
                cards,
                records,
                self._retain_s,
                time.monotonic() - started,
            )
        self._report()

    @property
    def retains(self) -> bool:
        """Whether a partition revoked cleanly keeps its cards (`retain_s` > 0)."""
        return self._retain_s > 0

    def expire_retained(self) -> None:
        """Forget the cards of the partitions kept past `retain_s` (on the restore thread, in
        order with the restores, so a partition that came back is never forgotten)."""
        now = time.monotonic()
        with self._lock:
            expired = {p for p, kept in self._retained.items() if kept.until <= now}
            for partition in expired:
                del self._retained[partition]
        if expired:
            log.info("forgetting the kept cards of partitions %s (not back)", sorted(expired))
            self.forget_cards(sorted(expired))

    def forget_cards(self, partitions: Sequence[int]) -> None:
        """Forget the cards of partitions let go, a chunk at a time (batches of the partitions
        kept go on in between)."""
        self._forget_cards(set(partitions))
        self._report()

    def owned(self) -> list[int]:
        """The partitions whose state is loaded."""
        with self._lock:
            return sorted(self._watermark)

    def reload(self, progress: Callable[[], None] = _nothing) -> None:
        """Restore every owned partition again from its changelog."""
        self.restore(self.owned(), progress)

    def committed(self, positions: Mapping[tuple[str, int], int]) -> None:
        """Input positions a transaction committed (exactly-once): the undo copies of the
        batches they cover are no longer needed."""
        with self._lock:
            for (_topic, partition), position in positions.items():
                self._committed[partition] = max(position, self._committed.get(partition, -1))
            if self._undo is None:
                return
            done = 0
            for entry in self._undo:
                if not self._covered(entry, self._committed):
                    break
                done += 1
                self._undo_cards -= sum(len(s.keys) for s in entry.snapshots)
            del self._undo[:done]

    def rollback(
        self, committed: Mapping[int, int], progress: Callable[[], None] = _nothing
    ) -> None:
        """Undo what the batches past the `committed` positions (partition → next offset to
        read) changed: their transaction was aborted, and they will be read again."""
        started = time.monotonic()
        with self._lock:
            overflow = self._undo is None or self._undo_overflow
            if not overflow:
                assert self._undo is not None
                undone = 0
                for entry in reversed(self._undo):
                    if not entry.offsets:
                        continue  # only partitions that went: nothing of theirs comes back
                    if self._covered(entry, committed):
                        break  # this batch and all before it committed
                    for snapshot in reversed(entry.snapshots):
                        self._history.revert(snapshot)
                    undone += 1
                self._undo.clear()
                self._undo_cards = 0
        if overflow:
            self._reset_undo()
            self.reload(progress)
            method = "reload"
        else:
            self._report()
            method = "undo"
        self._metrics.record_state_rollback(method)
        log.warning(
            "card state rolled back to the committed offsets by %s in %.3fs",
            method,
            time.monotonic() - started,
        )

    # -- scoring thread: batches -------------------------------------------------------------

    def update(
        self, records: Sequence[StatefulRecord], columns: TransactionColumns
    ) -> tuple[npt.NDArray[np.float32] | None, list[ChangelogBatch]]:
        """The history feature rows of `records` (batch order; `columns` are theirs) and the
        changelog records their updates produced. None for the rows when no partition of the
        batch is loaded (the features are then neutral); a record of a partition that is not
        loaded gets neutral features and changes nothing."""
        n = len(records)
        partitions = np.fromiter((r.position[0][1] for r in records), np.int64, n)
        offsets = np.fromiter((r.position[1] for r in records), np.int64, n)
        with self._lock:
            present = np.unique(partitions).tolist()
            owned = [p for p in present if p in self._watermark]
            if not owned:
                return None, []
            if len(owned) == len(present):
                rows, changelog = self._update(partitions, offsets, columns, np.arange(n))
            else:
                index = np.flatnonzero(np.isin(partitions, owned))
                part = columns.rows(index)
                kept, changelog = self._update(partitions[index], offsets[index], part, index)
                rows = neutral_history(columns)
                rows[index] = kept
        self._report()
        return rows, changelog

    def current(self, partition: int, card_id: str) -> CardOwnership:
        """The card's state now (see `CardOwnership`)."""
        with self._lock:
            if partition not in self._watermark:
                return CardOwnership(False, None)
            return CardOwnership(True, self._history.state_of(card_key(partition, card_id)))

    def _update(
        self,
        partitions: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.int64],
        columns: TransactionColumns,
        in_batch: npt.NDArray[np.int64],
    ) -> tuple[npt.NDArray[np.float32], list[ChangelogBatch]]:
        """`update` for records of owned partitions only; `in_batch` is each one's index in the
        whole batch. Holds the lock."""
        event_time = np.asarray(columns.event_time, np.int64)
        beyond = self._clock.beyond(event_time)
        future = int(np.count_nonzero(beyond))
        present, which = np.unique(partitions, return_inverse=True)
        newest = np.full(len(present), -1, np.int64)
        np.maximum.at(newest, which[~beyond], event_time[~beyond])
        watermarks = np.empty(len(present), np.int64)
        for i, partition in enumerate(present.tolist()):
            watermarks[i] = self._watermark[partition] = max(
                self._watermark[partition], int(newest[i])
            )
        if future:
            # Counted as of its partition's clock. While the clock knows no time yet (a new
            # partition) there is none to count it at: it changes no state, so no made-up time
            # becomes the clock a restore resumes from.
            event_time = event_time.copy()
            event_time[beyond] = watermarks[which[beyond]]
        applies = (event_time >= watermarks[which] - self._longest_ms) & (event_time >= 0)
        stale = int(np.count_nonzero(~applies & ~beyond))
        if future:
            self._metrics.record_event_time_out_of_bounds("future", future)
        if stale:
            self._metrics.record_event_time_out_of_bounds("stale", stale)

        prefix = {partition: card_key(partition, "") for partition in present.tolist()}
        keys = [
            prefix[p] + card for p, card in zip(partitions.tolist(), columns.card_id, strict=True)
        ]
        # Each partition's last record in the batch: its changelog records name it as source.
        last = {p: int(in_batch[i]) for i, p in enumerate(partitions.tolist())}
        snapshots: list[CardSnapshot] = []
        if self._undo is not None:
            snapshots.append(self._history.snapshot(list(dict.fromkeys(keys))))
        history = self._history
        rows = history.update_and_features(
            keys, columns, columns.merchant_id, offsets, event_time=event_time, applies=applies
        )
        changes = {p: ChangelogBatch(p, last[p], [], []) for p in prefix}
        by_head = {str(p): batch for p, batch in changes.items()}  # a card key's head
        for key, state in history.take_dirty():
            head, _, card = key.partition(KEY_SEPARATOR)
            batch = by_head[head]
            batch.card_ids.append(card.encode())
            batch.states.append(state)
        self._evictions(changes, snapshots)
        if self._undo is not None:
            batch_offsets = {p: int(offsets[partitions == p].max()) for p in prefix}
            self._remember(_Undo(batch_offsets, snapshots))
        return rows, [batch for batch in changes.values() if batch.card_ids]

    def _evictions(
        self, changes: Mapping[int, ChangelogBatch], snapshots: list[CardSnapshot]
    ) -> None:
        """Tombstones, added to `changes`, for the idle cards of the batch's partitions due for
        eviction, each idle as of its partition's watermark; their rows are copied to
        `snapshots` when undo is on."""
        now = time.monotonic()
        due = [p for p in changes if now - self._last_eviction[p] >= self._evict_interval_s]
        for partition in due:
            self._last_eviction[partition] = now
            prefix = card_key(partition, "")
            idle = [
                key
                for key in self._history.idle(self._watermark[partition])
                if key.startswith(prefix)
            ]
            if not idle:
                continue
            if self._undo is not None:
                snapshots.append(self._history.snapshot(idle))
            self._history.forget(idle)
            batch = changes[partition]
            batch.card_ids.extend(key[len(prefix) :].encode() for key in idle)
            batch.states.extend([None] * len(idle))

    # -- internals ---------------------------------------------------------------------------

    @staticmethod
    def _covered(entry: _Undo, committed: Mapping[int, int]) -> bool:
        """Whether every record of the batch is below the committed positions."""
        return all(offset < committed.get(p, -1) for p, offset in entry.offsets.items())

    def _remember(self, entry: _Undo) -> None:
        assert self._undo is not None
        if self._undo_overflow:
            return
        self._undo.append(entry)
        self._undo_cards += sum(len(s.keys) for s in entry.snapshots)
        if self._undo_cards > UNDO_MAX_CARDS:
            log.warning(
                "more than %s cards changed since the last commit: an abort now reloads the "
                "card state instead of undoing",
                UNDO_MAX_CARDS,
            )
            self._undo.clear()
            self._undo_cards = 0
            self._undo_overflow = True

    def _reset_undo(self) -> None:
        with self._lock:
            if self._undo is not None:
                self._undo.clear()
            self._undo_cards = 0
            self._undo_overflow = False

    def _forget(self, partitions: set[int]) -> None:
        self._let_go(partitions)
        self._forget_cards(partitions)

    def _let_go(self, partitions: set[int]) -> dict[int, int]:
        """Make `partitions` not owned; return the watermarks of those that were."""
        if not partitions:
            return {}
        prefixes = tuple(card_key(partition, "") for partition in partitions)
        watermarks: dict[int, int] = {}
        with self._lock:
            for partition in partitions:
                if partition in self._watermark:
                    watermarks[partition] = self._watermark.pop(partition)
                self._retained.pop(partition, None)
                self._last_eviction.pop(partition, None)
                self._committed.pop(partition, None)
            if self._undo:
                # A partition that went must not come back by an undo.
                for entry in self._undo:
                    for i, snapshot in enumerate(entry.snapshots):
                        keep = [not key.startswith(prefixes) for key in snapshot.keys]
                        entry.snapshots[i] = _select(snapshot, keep)
                    for partition in partitions:
                        entry.offsets.pop(partition, None)
        return watermarks

    def _forget_cards(self, partitions: set[int]) -> None:
        if not partitions:
            return
        prefixes = tuple(card_key(partition, "") for partition in partitions)
        with self._lock:
            keys = list(self._history)
        # Their cards are found, then forgotten a chunk at a time with the lock released in
        # between, so the batches of the partitions kept go on (half of a million cards took
        # 0.4 s under the lock). None of these partitions gains a card meanwhile: they are not
        # owned, and their restores run on the restore thread, after this (`stream/restores.py`).
        doomed = [key for key in keys if key.startswith(prefixes)]
        for start in range(0, len(doomed), FORGET_CHUNK):
            with self._lock:
                self._history.forget(doomed[start : start + FORGET_CHUNK])

    def _read_tail(
        self, partition: int, kept: _Retained, progress: Callable[[], None]
    ) -> tuple[int, int, int, bool]:
        """`_read_changelog` over the partition's kept cards, from the end it had when it went;
        all of it when that offset is gone. The last item says whether only the tail was read."""
        try:
            cards, records, newest = self._read_changelog(partition, progress, kept.end)
        except ChangelogTailGone as gone:
            log.warning("partition=%s: %s; reading its whole changelog", partition, gone)
            self._forget({partition})
            return *self._read_changelog(partition, progress), False
        return cards, records, max(newest, kept.watermark), True

    def _read_changelog(
        self, partition: int, progress: Callable[[], None], start: int = 0
    ) -> tuple[int, int, int]:
        """Load the partition's changelog from offset `start` into the store; return the cards
        it added, the changelog records read and the newest event time a restored card applied
        (-1: none)."""
        read = cards = 0
        newest = -1
        prefix = card_key(partition, "")
        for read_chunk in self._changelog.read(partition, progress, start):
            for first in range(0, len(read_chunk), RESTORE_APPLY_CHUNK):
                chunk = read_chunk[first : first + RESTORE_APPLY_CHUNK]
                keys = [prefix + card for card, _ in chunk]
                states = [state for _, state in chunk]
                with self._lock:
                    held = len(self._history)
                    restored = self._history.restore_states(keys, states)
                    newest = max(newest, restored.newest_event_ms)
                    cards += len(self._history) - held
                for problem in restored.rejected:
                    log.warning("skipping a card state record (the card starts anew): %s", problem)
            read += len(read_chunk)
        return cards, read, newest

    def _report(self) -> None:
        # Set under the lock: the consuming and restore threads both report, and a count read
        # before the other thread's change must not land after that thread's report.
        with self._lock:
            self._metrics.set_card_state(len(self._history), self._history.nbytes)
            self._metrics.set_kept_partitions(len(self._retained))


def _select(snapshot: CardSnapshot, keep: list[bool]) -> CardSnapshot:
    """The part of `snapshot` whose keys `keep` says."""
    mask = np.array(keep, np.bool_)
    held_kept = mask[snapshot.held]
    return CardSnapshot(
        [key for key, k in zip(snapshot.keys, keep, strict=True) if k],
        snapshot.held[mask],
        snapshot.records[held_kept],
    )
