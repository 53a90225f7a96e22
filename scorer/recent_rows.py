"""Known-good feature rows: what a model must score before it serves, and what tells a broken
model from a poison record while it serves.

The all-zeros row alone says little: a graph can score it and return NaN for every real
transaction (a log of a count, a division by a spread), and then every record would be
dead-lettered as poison. So a model is also asked about real rows:

- the typical rows (`stream/typical_rows.py`): a short simulated stream through the feature
  code, what there is before any traffic;
- `RecentRows`: a small ring of the feature rows the scoring stage decided by the model
  lately, filled as it scores. A candidate model must score every one as a probability
  (`stream/package_check.py`), and a model in service that fails most of them is broken
  (`scorer/isolation.py`): its records are decided by the fallback rules, not dead-lettered.

The ring is written by the scoring thread and read by the reload thread, under one lock held
for a copy of at most `ROWS_PER_BATCH` rows (a few hundred bytes).
"""

from __future__ import annotations

import threading

import numpy as np
import numpy.typing as npt

from scorer.features import NUM_FEATURES

#: Rows the ring holds: enough to sample the traffic of the last few seconds across its cards
#: and shapes, few enough that a model scores them all in one call of well under a millisecond.
RECENT_ROWS = 64
#: Rows taken from each batch, spread over it: at 5,000 tx/s and a batch of 256, the ring holds
#: the last 16 batches (about a second); one batch of one shape cannot fill it alone.
ROWS_PER_BATCH = 4


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
