"""Per-card history of one input partition: a fixed-size record per card, updated in batches.

Transactions are keyed by `card_id`, so each card's history lives with its partition. A
`CardHistory` holds, for every card it has seen, one fixed-size numpy record (`STATE_DTYPE`,
`STATE_BYTES` bytes serialized) and turns a micro-batch into the `HISTORY_FEATURE_NAMES` columns:
the batch is prepared with a few vectorised numpy passes, then applied record by record in one
compiled loop (`scorer/card_history_update.py`). Responsibilities and decisions:

- Windows are exponentially decayed counters: a count or amount sum over a window of length w
  is kept as a sum whose terms decay as exp(-age / w). At a steady rate it has the mean of the
  sliding window of length w, but it needs one number per window instead of every event, and
  updating it is O(1). Distinct merchants and countries come from a ring of the last
  `RING_SIZE` transactions (minute, merchant hash, country).
- Order: a batch is applied per card in event-time order (ties by offset); several transactions
  of one card in one batch see each other in that order.
- Idempotence: each record keeps the highest input offset applied to it. A transaction whose
  offset is not above the one its card had before the batch (a record re-read after a crash)
  is not applied again; its features are read from the state as it is. Offsets of a partition
  are consumed in order, so every record of a card up to that offset has been applied.
- A transaction older than its card's last one (late, out of order) is applied as if it happened
  at the card's last event time: decayed counters cannot go back in time.
- Features are computed after the transaction is applied (windows include it, as in the
  handbook), except the amount's relation to the card's mean, which compares it with the card's
  history before it.
- Bounded: cards idle past the longest window are evicted (`idle`, `forget`); the store never
  holds more than the live cards' records plus the index.
- Robust: any valid transaction (event_time 0 … 9999-12-31, amounts up to 1e6, any ids) gives
  finite features; nothing here raises for a valid record.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from scorer.card_history_record import (
    CARD_TESTING_WINDOW_MS,
    HISTORY_FEATURE_NAMES,
    LONGEST_WINDOW_MS,
    MS_PER_DAY,
    MS_PER_HOUR,
    MS_PER_MINUTE,
    NUM_HISTORY_FEATURES,
    RECENT_MS,
    STATE_BYTES,
    STATE_DTYPE,
    WINDOWS_MS,
    merchant_hashes,
    validate_scale,
)
from scorer.card_history_store import CardHistoryStore
from scorer.card_history_update import apply_in_order
from scorer.columns import TINY_AMOUNT, TransactionColumns, letters_index

__all__ = [
    "HISTORY_FEATURE_NAMES",
    "MS_PER_DAY",
    "MS_PER_HOUR",
    "NUM_HISTORY_FEATURES",
    "STATE_BYTES",
    "STATE_DTYPE",
    "CardHistory",
    "neutral_history",
]


class CardHistory(CardHistoryStore):
    """Per-card state, by card key: its features, and how a batch updates it (the rows, their
    changelog form and restore are `CardHistoryStore`'s). Keys are card ids, or card ids qualified
    by their input partition where one history serves several partitions (the service).

    Not thread-safe: one owner (the partition's scoring path) calls it.
    """

    def __init__(self, *, time_scale: float = 1.0) -> None:
        """`time_scale` > 1 compresses time (a demo whose simulated day lasts 86,400 /
        time_scale s of event time): every window and the eviction horizon shrink by it, so
        features keep the meaning the model was trained on."""
        scale = validate_scale(time_scale)
        windows_ms = np.array([*WINDOWS_MS, CARD_TESTING_WINDOW_MS], np.float64) / scale
        self._inverse_windows = 1.0 / windows_ms
        self._recent_minutes = RECENT_MS / MS_PER_MINUTE / scale
        self._longest_ms = LONGEST_WINDOW_MS / scale
        super().__init__()

    @property
    def longest_window_ms(self) -> float:
        """The longest window, in event-time ms (after the time scale)."""
        return self._longest_ms

    # The batch path.

    def update_and_features(
        self,
        keys: Sequence[str],
        columns: TransactionColumns,
        merchant_ids: Sequence[str],
        offsets: npt.NDArray[np.int64],
        *,
        event_time: npt.NDArray[np.int64] | None = None,
        applies: npt.NDArray[np.bool_] | None = None,
    ) -> npt.NDArray[np.float32]:
        """History features [B, len(HISTORY_FEATURE_NAMES)] of a batch of transactions (in
        consumption order; `keys` names each one's card), applying each to its card's state in
        event-time order per card. A record whose offset is <= the offset its card has applied
        is not applied again (its features are read from the state as it is): offsets are
        compared per card only, so a card's records must come from one input partition.

        `event_time` replaces the columns' event times as the state counts them (the owner's
        clock bounds them, `contracts/event_time.py`); a record whose `applies` is False is not
        applied either (its features are read from the state as it is).

        Raises ValueError only when the arguments disagree in length.
        """
        n = len(keys)
        if not len(columns.amount) == len(merchant_ids) == len(offsets) == n:
            raise ValueError(
                f"batch lengths differ: {n} card ids, {len(columns.amount)} transactions, "
                f"{len(merchant_ids)} merchant ids, {len(offsets)} offsets"
            )
        if n == 0:
            return np.empty((0, NUM_HISTORY_FEATURES), np.float32)
        rows = self._rows_for(keys)
        offsets = np.asarray(offsets, np.int64)
        event_time = np.asarray(columns.event_time if event_time is None else event_time, np.int64)
        amount = np.asarray(columns.amount, np.float64)
        small_ecom = (amount < TINY_AMOUNT) & (np.asarray(columns.channel) == "ecom")
        merchant = merchant_hashes(merchant_ids)
        country = letters_index(np.asarray(columns.country), 2).astype(np.uint16)
        # Records up to the offset a card had applied before this batch are done; the rest of
        # the batch applies, in event-time order (which need not be offset order).
        fresh = offsets > self._times[rows, 1]
        if applies is not None:
            fresh &= applies
        order = np.lexsort((offsets, event_time, rows))
        out = np.empty((n, NUM_HISTORY_FEATURES), np.float32)
        apply_in_order(
            order,
            rows,
            event_time,
            fresh,
            offsets,
            amount,
            small_ecom,
            merchant,
            country,
            *self._columns(),
            self._inverse_windows,
            self._recent_minutes,
            self._longest_ms,
            out,
        )
        applied = rows[fresh]
        if len(applied):
            self._mark_dirty(applied)
        if not fresh.all():
            # A card whose records all changed nothing (stale, or future with no clock) has
            # no state: hold none, as its changelog holds none.
            empty = np.unique(rows[~fresh])
            empty = empty[self._times[empty, 1] < 0]
            if len(empty):
                self.forget([str(self._ids[row]) for row in empty.tolist()])
        return out

    def idle(self, now_ms: int) -> list[str]:
        """The cards idle for longer than the longest window at `now_ms` (event time)."""
        rows = np.flatnonzero(self._used & (self._times[:, 0] < now_ms - self._longest_ms))
        ids = self._ids
        return [str(ids[row]) for row in rows.tolist()]

    def evict_idle(self, now_ms: int) -> list[str]:
        """Forget the cards idle at `now_ms` (`idle`); return their keys."""
        evicted = self.idle(now_ms)
        self.forget(evicted)
        return evicted


_SCRATCH = threading.local()


def neutral_history(columns: TransactionColumns) -> npt.NDArray[np.float32]:
    """The history features of a batch whose every card is new (history unknown).

    A scratch history per thread keeps one card per row of the largest batch seen, reset
    before each use, so no card is allocated on the way."""
    n = len(columns.amount)
    ids: list[str] = getattr(_SCRATCH, "ids", [])
    if not ids or len(ids) < n:  # the first call on a thread may be an empty batch
        ids = [str(i) for i in range(max(n, 2 * len(ids), 256))]
        _SCRATCH.ids, _SCRATCH.history = ids, CardHistory()
    history: CardHistory = _SCRATCH.history
    batch_ids = ids[:n]
    history._clear(history._rows_for(batch_ids))
    return history.update_and_features(batch_ids, columns, batch_ids, np.zeros(n, np.int64))
