"""Known-good feature rows: what a model must score before it serves, and what tells a broken
model from a poison record while it serves.

The all-zeros row alone says little: a graph can score it and return NaN for every real
transaction (a log of a count, a division by a spread), and then every record would be
dead-lettered as poison. So a model is also asked about real rows:

- `typical_rows`: a few typical transactions (groceries, e-commerce, an ATM withdrawal, a
  flight, a digital purchase at night, a card-testing probe) through the feature code, as a
  card's first transaction: what there is before any traffic;
- `RecentRows`: a small ring of the feature rows the scoring stage decided by the model
  lately, filled as it scores. A candidate model must score every one as a probability
  (`stream/model_reload.py`), and a model in service that fails most of them is broken
  (`scorer/isolation.py`): its records are decided by the fallback rules, not dead-lettered.

The ring is written by the scoring thread and read by the reload thread, under one lock held
for a copy of at most `ROWS_PER_BATCH` rows (a few hundred bytes).
"""

from __future__ import annotations

import functools
import threading
from typing import Literal

import numpy as np
import numpy.typing as npt

from contracts.transaction import Transaction
from scorer.columns import TransactionColumns
from scorer.features import NUM_FEATURES, build_features

#: Rows the ring holds: enough to sample the traffic of the last few seconds across its cards
#: and shapes, few enough that a model scores them all in one call of well under a millisecond.
RECENT_ROWS = 64
#: Rows taken from each batch, spread over it: at 5,000 tx/s and a batch of 256, the ring holds
#: the last 16 batches (about a second); one batch of one shape cannot fill it alone.
ROWS_PER_BATCH = 4

#: 2026-01-06 (a Tuesday) 00:00 UTC, the day of the typical transactions.
_DAY_MS = 1_767_657_600_000
_HOUR_MS = 3_600_000
#: (amount, currency, mcc, country, channel, card present, hour of day UTC)
_TYPICAL: tuple[tuple[float, str, int, str, Literal["pos", "ecom", "atm"], bool, int], ...] = (
    (42.5, "EUR", 5411, "FR", "pos", True, 12),  # groceries
    (89.99, "EUR", 5732, "DE", "ecom", False, 20),  # electronics, online
    (100.0, "GBP", 6011, "GB", "atm", True, 9),  # cash
    (350.0, "USD", 4511, "US", "ecom", False, 15),  # a flight
    (9.99, "EUR", 5815, "NL", "ecom", False, 2),  # digital goods, at night
    (1.5, "EUR", 5999, "FR", "ecom", False, 3),  # a tiny amount (a card-testing probe)
)


@functools.cache
def typical_rows() -> npt.NDArray[np.float32]:
    """The feature rows of a few typical transactions, each as its card's first (neutral
    history, terminal and card frauds). Read-only: shared by every caller."""
    transactions = [
        Transaction(
            transaction_id=f"typical-{i}",
            card_id=f"typical-card-{i}",
            merchant_id=f"typical-merchant-{i}",
            amount=amount,
            currency=currency,
            mcc=mcc,
            country=country,
            channel=channel,
            card_present=present,
            event_time=_DAY_MS + hour * _HOUR_MS,
        )
        for i, (amount, currency, mcc, country, channel, present, hour) in enumerate(_TYPICAL)
    ]
    rows = build_features(TransactionColumns.from_transactions(transactions))
    rows.setflags(write=False)
    return rows


class RecentRows:
    """A bounded ring of feature rows lately decided by a model (`note`), sampled whole
    (`sample`). Thread-safe: one writer (the scoring stage), any readers."""

    def __init__(self, capacity: int = RECENT_ROWS, per_batch: int = ROWS_PER_BATCH) -> None:
        if capacity < 1 or per_batch < 1:
            raise ValueError(f"capacity and per_batch must be >= 1, got {capacity}, {per_batch}")
        self._rows = np.zeros((capacity, NUM_FEATURES), np.float32)
        self._per_batch = per_batch
        self._next = 0
        self._filled = 0
        self._lock = threading.Lock()

    def note(self, features: npt.NDArray[np.float32], usable: npt.NDArray[np.bool_]) -> None:
        """Keep up to `per_batch` of the batch's `features` rows where `usable` (decided by
        the model, its score a probability), spread over the batch."""
        rows = np.flatnonzero(usable)
        if not len(rows):
            return
        picked = rows[:: max(1, len(rows) // self._per_batch)][: self._per_batch].tolist()
        capacity = len(self._rows)
        with self._lock:
            for i in picked:
                self._rows[self._next] = features[i]
                self._next = (self._next + 1) % capacity
            self._filled = min(capacity, self._filled + len(picked))

    def sample(self) -> npt.NDArray[np.float32]:
        """A copy of every row held [n, NUM_FEATURES] (n = 0 before the first `note`)."""
        with self._lock:
            return self._rows[: self._filled].copy()

    def __len__(self) -> int:
        return self._filled
