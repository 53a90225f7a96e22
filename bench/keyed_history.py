"""The service's card history for a framework whose state store keeps one value per record key
(Quix Streams' `State`): each record's card state is read from the store, updated by
`CardHistory` (the service's own update, windows and features) and handed back to be stored.

Responsibilities and decisions:
- The stored value is the card's changelog form (`CardHistoryStore`: one `STATE_DTYPE` record behind
  a version byte, `STATE_BYTES` bytes), so the framework stores and changelogs exactly what the
  service's changelog holds for the card.
- One scratch `CardHistory` does the arithmetic and holds no card between records: the
  framework's store is the only state, as it would be for any user of that framework.
- Idempotence is the service's: the record's input offset is kept in the state, and a record
  whose offset is not above it changes nothing.
- Not done here, since a store that sees one key at a time cannot: the service's per-partition
  event-time clock (future and stale records, `stream/partition_clocks.py`) and the eviction of idle
  cards. On the benchmark's backlog (no event time in the future, none older than a window)
  neither changes a feature.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from scorer.card_history import CardHistory
from scorer.columns import TransactionColumns


class KeyedHistory:
    """Updates one card's history, one transaction at a time, on state stored per key. Not
    thread-safe: one owner calls it."""

    def __init__(self, *, time_scale: float = 1.0) -> None:
        """`time_scale`: as `CardHistory`'s (the input's event time compressed by it)."""
        self._scratch = CardHistory(time_scale=time_scale)

    def update(
        self, state: bytes | None, transaction: TransactionColumns, offset: int
    ) -> tuple[npt.NDArray[np.float32], bytes | None]:
        """The history feature row [1, NUM_HISTORY_FEATURES] of `transaction` (columns of one
        transaction) applied to its card's stored `state` (None: a card not seen before), and
        the card's state after it; None when the record changed nothing (read again, at or
        below the offset the state holds), so there is nothing to store.

        Raises ValueError for a stored value that is not a card state of this version."""
        (card,) = transaction.card_id
        history = self._scratch
        if state is not None:
            rejected = history.restore([(card, state)])
            if rejected:
                raise ValueError(f"{rejected[0]}: clear the state store of this card")
        try:
            row = history.update_and_features(
                [card], transaction, transaction.merchant_id, np.array([offset], np.int64)
            )
            changed = history.take_dirty()
        finally:
            history.forget([card])
        return row, changed[0][1] if changed else None
