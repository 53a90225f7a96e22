"""Exactly-once undo of the card state: the card rows each batch changed, as they were before,
kept until the transaction that holds the batch commits, so that an aborted transaction is
undone in memory instead of by reading the changelog again.

Key design decisions:
- Before a batch changes its cards (and before an eviction forgets some), their rows are copied;
  an abort puts back the copies of every batch past the committed offsets, newest first. Its
  cost is the batches' size, not the state's (a reload read every owned partition's changelog
  again: about 9 s per million cards). Past `UNDO_MAX_CARDS` copies between two commits the
  copies are dropped and an abort reloads, so memory stays bounded.
- A partition that went must not come back by an undo: its copies and offsets go with it.
- No lock of its own: the card state (`stream/owned_card_history.py`) calls it under its lock.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from scorer.card_history_store import CardSnapshot

log = logging.getLogger(__name__)

#: Exactly-once: the most card rows copied for undo between two commits (about 150 bytes each).
#: A transaction holds at most FRAUD_TRANSACTION_MAX_RECORDS records (10,000 by default), so
#: this is reached only with a much larger setting; an abort then reloads instead.
UNDO_MAX_CARDS = 200_000


class _Undo(NamedTuple):
    """What one batch changed, as it was before: its snapshots in the order they were taken."""

    #: The batch's highest input offset per partition: committed once every one is.
    offsets: dict[int, int]
    snapshots: list[CardSnapshot]


class CardHistoryUndo:
    """The copies of the card rows that the batches not yet committed changed."""

    def __init__(self) -> None:
        self._entries: list[_Undo] = []
        self._cards = 0
        #: Copies were dropped (too many): the next rollback reloads.
        self._overflow = False
        #: Committed input positions (next offset to read) per partition, as last reported.
        self._committed: dict[int, int] = {}

    def remember(self, offsets: dict[int, int], snapshots: list[CardSnapshot]) -> None:
        """One batch's copies: `offsets`, its highest input offset per partition; `snapshots`,
        the rows it changed as they were before, in the order they were taken."""
        if self._overflow:
            return
        self._entries.append(_Undo(offsets, snapshots))
        self._cards += sum(len(s.keys) for s in snapshots)
        if self._cards > UNDO_MAX_CARDS:
            log.warning(
                "more than %s cards changed since the last commit: an abort now reloads the "
                "card state instead of undoing",
                UNDO_MAX_CARDS,
            )
            self._entries.clear()
            self._cards = 0
            self._overflow = True

    def committed(self, positions: Mapping[tuple[str, int], int]) -> None:
        """Input positions a transaction committed: the copies of the batches they cover are
        no longer needed."""
        for (_topic, partition), position in positions.items():
            self._committed[partition] = max(position, self._committed.get(partition, -1))
        done = 0
        for entry in self._entries:
            if not _covered(entry, self._committed):
                break
            done += 1
            self._cards -= sum(len(s.keys) for s in entry.snapshots)
        del self._entries[:done]

    def take_back(self, committed: Mapping[int, int]) -> list[CardSnapshot] | None:
        """The copies to put back, in that order, to undo the batches past the `committed`
        positions (partition → next offset to read); None when copies were dropped (the state
        must be read again from the changelog). Either way, no copy is kept."""
        if self._overflow:
            self._entries.clear()
            self._cards = 0
            self._overflow = False
            return None
        copies: list[CardSnapshot] = []
        for entry in reversed(self._entries):
            if not entry.offsets:
                continue  # only partitions that went: nothing of theirs comes back
            if _covered(entry, committed):
                break  # this batch and all before it committed
            copies.extend(reversed(entry.snapshots))
        self._entries.clear()
        self._cards = 0
        return copies

    def forget(self, partitions: set[int], prefixes: tuple[str, ...]) -> None:
        """Partitions that went, whose card keys start with `prefixes`: no copy of theirs is put
        back, and their commits no longer count."""
        for partition in partitions:
            self._committed.pop(partition, None)
        for entry in self._entries:
            for i, snapshot in enumerate(entry.snapshots):
                keep = [not key.startswith(prefixes) for key in snapshot.keys]
                entry.snapshots[i] = _select(snapshot, keep)
            for partition in partitions:
                entry.offsets.pop(partition, None)


def _covered(entry: _Undo, committed: Mapping[int, int]) -> bool:
    """Whether every record of the batch is below the committed positions."""
    return all(offset < committed.get(p, -1) for p, offset in entry.offsets.items())


def _select(snapshot: CardSnapshot, keep: list[bool]) -> CardSnapshot:
    """The part of `snapshot` whose keys `keep` says."""
    mask = np.array(keep, np.bool_)
    held_kept = mask[snapshot.held]
    return CardSnapshot(
        [key for key, k in zip(snapshot.keys, keep, strict=True) if k],
        snapshot.held[mask],
        snapshot.records[held_kept],
    )
