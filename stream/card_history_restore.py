"""What a card state restore reads: a partition's changelog loaded into the replica's one card
store, whole, or only its tail over the cards kept since the partition went. Restores, warm
returns and warm starts (`stream/owned_card_history.py`) all load through here; the restore thread
that runs them is `stream/restores.py`'s.

Key design decisions:
- A restore keeps, per card, the state with the highest input offset; a tombstone forgets the
  card, and a state after it starts the card anew (`CardHistoryStore.restore`). What it reads, and
  up to where: `stream/card_history_changelog.py`.
- The card state's lock is taken per `RESTORE_APPLY_CHUNK` records loaded, so batches of other
  partitions go on meanwhile, waiting a few milliseconds at most.
- A card state record that cannot be read is skipped, with a warning: its card starts anew.
- Warm return: a partition revoked once all its changelog records are acknowledged (and, with
  exactly-once, committed) leaves its cards equal to a replay of its changelog up to the end the
  changelog had then, since only the owner writes there. The replica keeps them with that end
  offset for `retain_s` (`stream/retained_partitions.py`); if the partition comes back
  meanwhile, the restore reads only the records written since (the next owner's), which replace
  or forget cards as a full replay would (a card's last record wins). In scenario 6 of the fault
  suite a partition came back after a full restore of 3 to 4 s. A changelog that no longer holds
  that offset (deleted by retention, or truncated) is read whole, as is a partition kept past
  `retain_s`; a retained partition is not owned, so no batch changes it and a record sent again
  skips its cards.
- Warm start (FRAUD_STATE_WARM_UP): a replica about to join reads every partition's
  changelog up to the end it has then and keeps the cards as a warm return does, so the
  partitions it is given read only what their owners wrote since. Reading from an end taken
  before the read re-applies the records written during it: harmless, since applying a record
  again over cards that hold it changes nothing (the same state ties, an older one loses).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import NamedTuple

from scorer.card_history import CardHistory
from stream.card_history_changelog import Changelog
from stream.card_history_keys import card_key
from stream.retained_partitions import RetainedPartition

log = logging.getLogger(__name__)

#: Changelog records loaded per hold of the state lock. Each batch of the partitions kept waits
#: for the hold under way: a whole read (10,000 records) held it 20 ms (median; up to 100 ms
#: when the store grows) on an idle core, 1,000 records 1.7 ms, for the same total.
RESTORE_APPLY_CHUNK = 1_000


class LoadedChangelog(NamedTuple):
    """What a load added."""

    #: Cards added to the store.
    cards: int
    #: Changelog records read.
    records: int
    #: The newest event time a restored card applied (-1: none).
    newest: int


class ChangelogLoader:
    """Loads partitions' changelogs into the card store, a chunk at a time under its lock."""

    def __init__(self, changelog: Changelog, history: CardHistory, lock: threading.Lock) -> None:
        self._changelog = changelog
        self._history = history
        self._lock = lock

    def load(self, partition: int, progress: Callable[[], None], start: int = 0) -> LoadedChangelog:
        """Load the partition's changelog from offset `start` into the store; `progress` is
        called after every chunk read."""
        history = self._history
        read = cards = 0
        newest = -1
        prefix = card_key(partition, "")
        for read_chunk in self._changelog.read(partition, progress, start):
            for first in range(0, len(read_chunk), RESTORE_APPLY_CHUNK):
                chunk = read_chunk[first : first + RESTORE_APPLY_CHUNK]
                keys = [prefix + card for card, _ in chunk]
                states = [state for _, state in chunk]
                with self._lock:
                    held = len(history)
                    restored = history.restore_states(keys, states)
                    newest = max(newest, restored.newest_event_ms)
                    cards += len(history) - held
                for problem in restored.rejected:
                    log.warning("skipping a card state record (the card starts anew): %s", problem)
            read += len(read_chunk)
        return LoadedChangelog(cards, read, newest)

    def load_tail(
        self, partition: int, kept: RetainedPartition, progress: Callable[[], None]
    ) -> LoadedChangelog:
        """`load` over the partition's kept cards, from the end its changelog had when it went
        (`ChangelogTailGone` when that offset is gone: the changelog must be read whole)."""
        cards, records, newest = self.load(partition, progress, kept.end)
        return LoadedChangelog(cards, records, max(newest, kept.watermark))
