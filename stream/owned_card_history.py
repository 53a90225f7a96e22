"""Per-card history on the hot path: one `CardHistory` for every partition this replica owns,
kept durable in a compacted changelog topic.

Responsibilities:
- restore a partition's state from its changelog before the partition's first batch is scored
  (on assignment, on the restore thread of `stream/restores.py` while the partition is
  paused), and say how long that took (what a restore reads: `stream/card_history_restore.py`);
- turn a batch's records into their history feature rows (in consumption order) and into the
  changelog records their updates produced (changed cards, and tombstones for cards idle past
  the longest window), to be written with the batch's outputs: the commit that covers a batch's
  input offsets covers its state too;
- keep each partition's event-time clock (its watermark), as of which its records are read and
  its idle cards evicted (`stream/partition_clocks.py`);
- drop a partition's state when it is lost; when it is revoked with every change durable (or
  read before joining: warm start), keep its cards for FRAUD_STATE_RETAIN_S, so that if it comes
  back only the changelog's tail is read (`stream/retained_partitions.py`); after an aborted
  transaction (exactly-once), undo the changes of the batches it held, whose updates never
  became durable (`stream/card_history_undo.py`);
- say what a card's state is now, for a changelog record sent again (`stream/redelivery.py`).

Key design decisions:
- The changelog (`stream/card_history_changelog.py`) is partitioned as the input: a card's state
  moves with its transactions on a rebalance.
- One store for every owned partition, not one per partition: a batch's cards are updated in
  one vectorised pass, so its cost does not grow with the partitions it spans (one history
  per partition cost over three times as much a record: docs/benchmarks.md, "Figures behind
  design choices"). A card's key is its id behind its partition (`stream/card_history_keys.py`).
- Updates are idempotent by input offset (`CardHistory`): a record read again after a crash
  changes nothing twice.
- A batch with records of a partition that is not loaded (revoked or lost while the batch was
  formed) gives those records neutral features and updates the others as usual.
- A lock orders the restore thread's restores and the consuming thread's drops against the
  batches; a restore takes it per chunk loaded, so batches of other partitions go on meanwhile.
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
from scorer.card_history import CardHistory, neutral_history
from scorer.card_history_store import CardSnapshot
from scorer.columns import TransactionColumns
from stream.card_history_changelog import Changelog, ChangelogBatch, ChangelogTailGone
from stream.card_history_keys import KEY_SEPARATOR, card_key
from stream.card_history_restore import ChangelogLoader, LoadedChangelog
from stream.card_history_undo import CardHistoryUndo
from stream.metrics import ServiceMetrics
from stream.partition_clocks import PartitionClocks
from stream.retained_partitions import RETAIN_S, RetainedPartition, RetainedPartitions

log = logging.getLogger(__name__)

#: How often, in wall-clock seconds, each partition looks for idle cards to evict (default of
#: FRAUD_STATE_EVICT_INTERVAL_S).
EVICT_INTERVAL_S = 60.0


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


class OwnedCardHistory:
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
        self._changelog = changelog
        self.changelog_topic = changelog.topic
        self._metrics = metrics
        self._history = CardHistory(time_scale=time_scale)
        #: Partitions whose state is restored (owned): each one's event-time clock.
        self._clocks = PartitionClocks(
            clock or EventClock(time_scale=time_scale),
            self._history.longest_window_ms,
            evict_interval_s,
        )
        self._undo = CardHistoryUndo() if undo else None
        #: Partitions revoked whose cards are kept (not owned: no batch changes them).
        self._retained = RetainedPartitions(retain_s)
        self._lock = threading.Lock()
        self._loader = ChangelogLoader(changelog, self._history, self._lock)

    # -- consuming thread: rebalances --------------------------------------------------------

    def restore(self, partitions: Sequence[int], progress: Callable[[], None] = _nothing) -> None:
        """Load the state of newly assigned partitions from their changelog, replacing any state
        held for them; `progress` is called after every chunk read (a long restore is not a
        stuck replica)."""
        # Only a partition whose state is loaded has cards (a restore that failed or was
        # cancelled forgot what it read): asking the others would scan every card for nothing.
        now = time.monotonic()
        with self._lock:
            held = {partition for partition in partitions if partition in self._clocks}
            retained, expired = self._retained.take(partitions, now)
        self._forget(held | expired)
        for partition in partitions:
            started = time.monotonic()
            kept = retained.get(partition)
            (cards, records, newest), tail = self._load(partition, progress, kept)
            with self._lock:
                self._clocks.start(partition, newest)
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
        durable, whose cards are kept for `retain_s` ("Warm return":
        stream/card_history_restore.py). Return the others, whose cards stay in memory until
        `forget_cards` (a revoke leaves that to the restore thread: half of a million cards take
        about 0.4 s to forget)."""
        watermarks = self._let_go(set(partitions))
        now = time.monotonic()
        with self._lock:
            self._retained.keep_revoked(ends or {}, watermarks, now)
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
                if partition in self._clocks or partition in self._retained:
                    continue
            started = time.monotonic()
            end = self._changelog.end(partition)
            (cards, records, newest), _ = self._load(partition, progress)
            with self._lock:
                self._retained.keep(partition, end, self._clocks.bounded(newest), time.monotonic())
            log.info(
                "warmed up card state topic=%s partition=%s cards=%s changelog_records=%s "
                "(kept until assigned, up to %ss) in %.3fs",
                self.changelog_topic,
                partition,
                cards,
                records,
                self._retained.retain_s,
                time.monotonic() - started,
            )
        self._report()

    @property
    def retains(self) -> bool:
        """Whether a partition revoked cleanly keeps its cards (`retain_s` > 0)."""
        return self._retained.retains

    def expire_retained(self) -> None:
        """Forget the cards of the partitions kept past `retain_s` (on the restore thread, in
        order with the restores, so a partition that came back is never forgotten)."""
        now = time.monotonic()
        with self._lock:
            expired = self._retained.expire(now)
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
            return self._clocks.owned()

    def reload(self, progress: Callable[[], None] = _nothing) -> None:
        """Restore every owned partition again from its changelog."""
        self.restore(self.owned(), progress)

    def committed(self, positions: Mapping[tuple[str, int], int]) -> None:
        """Input positions a transaction committed (exactly-once): the undo copies of the
        batches they cover are no longer needed."""
        with self._lock:
            if self._undo is not None:
                self._undo.committed(positions)

    def rollback(
        self, committed: Mapping[int, int], progress: Callable[[], None] = _nothing
    ) -> None:
        """Undo what the batches past the `committed` positions (partition → next offset to
        read) changed: their transaction was aborted, and they will be read again."""
        started = time.monotonic()
        with self._lock:
            copies = None if self._undo is None else self._undo.take_back(committed)
            for snapshot in copies or ():
                self._history.revert(snapshot)
        if copies is None:
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
            owned = [p for p in present if p in self._clocks]
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
            if partition not in self._clocks:
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
        times = self._clocks.advance(partitions, np.asarray(columns.event_time, np.int64))
        if times.future:
            self._metrics.record_event_time_out_of_bounds("future", times.future)
        if times.stale:
            self._metrics.record_event_time_out_of_bounds("stale", times.stale)

        prefix = {partition: card_key(partition, "") for partition in times.partitions}
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
            keys,
            columns,
            columns.merchant_id,
            offsets,
            event_time=times.event_time,
            applies=times.applies,
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
            self._undo.remember(batch_offsets, snapshots)
        return rows, [batch for batch in changes.values() if batch.card_ids]

    def _evictions(
        self, changes: Mapping[int, ChangelogBatch], snapshots: list[CardSnapshot]
    ) -> None:
        """Tombstones, added to `changes`, for the idle cards of the batch's partitions due for
        eviction, each idle as of its partition's watermark; their rows are copied to
        `snapshots` when undo is on."""
        for partition in self._clocks.due_for_eviction(changes):
            prefix = card_key(partition, "")
            idle = [
                key
                for key in self._history.idle(self._clocks.watermark(partition))
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
                watermark = self._clocks.stop(partition)
                if watermark is not None:
                    watermarks[partition] = watermark
                self._retained.drop(partition)
            if self._undo is not None:
                self._undo.forget(partitions, prefixes)  # a partition that went stays gone
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

    def _load(
        self, partition: int, progress: Callable[[], None], kept: RetainedPartition | None = None
    ) -> tuple[LoadedChangelog, bool]:
        """Load the partition's changelog: whole, or over its `kept` cards from the end it had
        when it went (whole when that offset is gone); the bool says whether only the tail was
        read. A load that fails forgets what it read: no half-restored partition stays."""
        try:
            if kept is None:
                return self._loader.load(partition, progress), False
            try:
                return self._loader.load_tail(partition, kept, progress), True
            except ChangelogTailGone as gone:
                log.warning("partition=%s: %s; reading its whole changelog", partition, gone)
                self._forget({partition})
                return self._loader.load(partition, progress), False
        except BaseException:
            self._forget({partition})
            raise

    def _report(self) -> None:
        # Set under the lock: the consuming and restore threads both report, and a count read
        # before the other thread's change must not land after that thread's report.
        with self._lock:
            self._metrics.set_card_state(len(self._history), self._history.nbytes)
            self._metrics.set_kept_partitions(len(self._retained))
