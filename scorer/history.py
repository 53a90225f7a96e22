"""Per-card history of one input partition: a fixed-size record per card, updated in batches.

Transactions are keyed by `card_id`, so each card's history lives with its partition. A
`CardHistory` holds, for every card it has seen, one fixed-size numpy record (`STATE_DTYPE`,
`STATE_BYTES` bytes serialized) and turns a micro-batch into the `HISTORY_FEATURE_NAMES` columns
with a handful of vectorised numpy passes. Responsibilities and decisions:

- Windows are exponentially decayed counters: a count or amount sum over a window of length w
  is kept as a sum whose terms decay as exp(-age / w). At a steady rate it has the mean of the
  sliding window of length w, but it needs one number per window instead of every event, and
  updating it is O(1). Distinct merchants and countries come from a ring of the last
  `RING_SIZE` transactions (minute, merchant hash, country).
- Order: a batch is applied per card in event-time order (ties by offset); several transactions
  of one card in one batch see each other in that order. The batch is processed in rounds, the
  r-th transaction of every card in round r, each round one vectorised pass.
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

from scorer.card_record import (
    CARD_TESTING_WINDOW_MS,
    COL_AVG,
    COL_COUNTRIES,
    COL_MERCHANTS,
    COL_SINCE,
    COL_TESTING,
    COL_TO_MEAN,
    COL_TX,
    COL_ZSCORE,
    HISTORY_FEATURE_NAMES,
    LONGEST_WINDOW_MS,
    MAX_ZSCORE,
    MIN_HISTORY,
    MS_PER_DAY,
    MS_PER_HOUR,
    MS_PER_MINUTE,
    NUM_HISTORY_FEATURES,
    NUM_SUMS,
    RECENT_MS,
    RING_SIZE,
    STATE_BYTES,
    STATE_DTYPE,
    STD_FLOOR,
    STD_FLOOR_SHARE,
    SUM_AMOUNT,
    SUM_COUNT,
    SUM_SQUARES,
    SUM_TESTING_COUNT,
    SUM_WINDOW,
    WINDOWS,
    WINDOWS_MS,
    Floats,
    distinct_counts,
    merchant_hashes,
    validate_scale,
)
from scorer.card_store import CardStore
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


class CardHistory(CardStore):
    """Per-card state, by card key: its features, and how a batch updates it (the rows, their
    changelog form and restore are `CardStore`'s). Keys are card ids, or card ids qualified by
    their input partition where one history serves several partitions (the service).

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
        out = np.empty((n, NUM_HISTORY_FEATURES), np.float32)
        if n == 0:
            return out
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
        if len(np.unique(rows)) == n:
            rounds = [np.arange(n)]  # one transaction per card: a single pass
        else:
            order = np.lexsort((offsets, event_time, rows))
            sorted_rows = rows[order]
            starts = np.flatnonzero(np.r_[True, sorted_rows[1:] != sorted_rows[:-1]])
            rank = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
            rounds = [order[rank == r] for r in range(int(rank.max()) + 1)]
        for sel in rounds:  # at most one transaction of each card per round
            out[sel] = self._apply(
                rows[sel],
                event_time[sel],
                fresh[sel],
                offsets[sel],
                amount[sel],
                small_ecom[sel],
                merchant[sel],
                country[sel],
            )
        if not fresh.all():
            # A card whose records all changed nothing (stale, or future with no clock) has
            # no state: hold none, as its changelog holds none.
            empty = np.unique(rows[~fresh])
            empty = empty[self._times[empty, 1] < 0]
            if len(empty):
                self.forget([str(self._ids[row]) for row in empty.tolist()])
        return out

    def _apply(
        self,
        rows: npt.NDArray[np.int64],
        t: npt.NDArray[np.int64],
        apply: npt.NDArray[np.bool_],
        offset: npt.NDArray[np.int64],
        amount: Floats,
        small_ecom: npt.NDArray[np.bool_],
        merchant: npt.NDArray[np.uint32],
        country: npt.NDArray[np.uint16],
    ) -> npt.NDArray[np.float32]:
        """Apply one transaction per card (distinct rows) and return their features."""
        n = len(rows)
        times = self._times[rows]
        last = times[:, 0]
        has_prev = last >= 0
        elapsed_ms = np.where(has_prev, np.maximum(t - last, 0), 0).astype(np.float64)
        decay = np.exp(-elapsed_ms[:, None] * self._inverse_windows[None, :])
        sums = self._sums[rows].astype(np.float64) * decay[:, SUM_WINDOW]

        # The amount against the card's history before this transaction.
        history = sums[:, SUM_COUNT + WINDOWS - 1]
        known = history > MIN_HISTORY
        safe_history = np.where(known, history, 1.0)
        mean = np.where(known, sums[:, SUM_AMOUNT + WINDOWS - 1] / safe_history, 0.0)
        variance = np.maximum(sums[:, SUM_SQUARES] / safe_history - mean * mean, 0.0)
        std = np.sqrt(variance) + STD_FLOOR_SHARE * mean + STD_FLOOR
        to_mean = np.where(known, np.log1p(amount) - np.log1p(mean), 0.0)
        zscore = np.where(known, np.clip((amount - mean) / std, -MAX_ZSCORE, MAX_ZSCORE), 0.0)

        added = np.empty((n, NUM_SUMS), np.float64)
        added[:, SUM_COUNT:SUM_TESTING_COUNT] = 1.0
        added[:, SUM_TESTING_COUNT] = small_ecom
        added[:, SUM_AMOUNT:SUM_SQUARES] = amount[:, None]
        added[:, SUM_SQUARES] = amount * amount
        sums += added * apply[:, None]
        minute = (t // MS_PER_MINUTE).astype(np.uint32) + np.uint32(1)
        ring_minute = self._ring_minute[rows]
        ring_merchant = self._ring_merchant[rows]
        ring_country = self._ring_country[rows]
        slot = self._ring_next[rows].astype(np.int64)
        applied = np.flatnonzero(apply)
        at = (applied, slot[applied])
        ring_minute[at] = minute[applied]
        ring_merchant[at] = merchant[applied]
        ring_country[at] = country[applied]

        features = np.empty((n, NUM_HISTORY_FEATURES), np.float64)
        counts = sums[:, SUM_COUNT:SUM_TESTING_COUNT]
        features[:, COL_TX:COL_AVG] = np.log1p(counts)
        average = sums[:, SUM_AMOUNT:SUM_SQUARES] / np.maximum(counts, MIN_HISTORY)
        features[:, COL_AVG:COL_TO_MEAN] = np.log1p(np.where(counts > 0, average, 0.0))
        features[:, COL_TO_MEAN] = to_mean
        features[:, COL_ZSCORE] = zscore
        since_ms = np.where(has_prev, np.minimum(elapsed_ms, self._longest_ms), self._longest_ms)
        features[:, COL_SINCE] = np.log1p(since_ms / 1000.0)
        age = minute.astype(np.int64)[:, None] - ring_minute
        recent = (ring_minute > 0) & (age <= self._recent_minutes)
        features[:, COL_MERCHANTS] = distinct_counts(ring_merchant, recent)
        features[:, COL_COUNTRIES] = distinct_counts(ring_country, recent)
        features[:, COL_TESTING] = np.log1p(sums[:, SUM_TESTING_COUNT])

        if len(applied):
            target = rows[applied]
            self._times[target, 0] = np.maximum(t[applied], last[applied])
            self._times[target, 1] = np.maximum(offset[applied], times[applied, 1])
            self._sums[target] = sums[applied]
            self._ring_minute[target] = ring_minute[applied]
            self._ring_merchant[target] = ring_merchant[applied]
            self._ring_country[target] = ring_country[applied]
            self._ring_next[target] = (slot[applied] + 1) % RING_SIZE
            self._mark_dirty(target)
        return features.astype(np.float32)

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
