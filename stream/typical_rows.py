"""Typical feature rows: the real transactions a model must score before it serves.

A model is refused unless it scores each of these rows as a probability (`sanity_check`,
`stream/package_check.py`), at start-up and on every reload, before any traffic shows what it
does with real records. Hand-made rows would each be a card's first transaction, with a neutral
history, terminal and card frauds: a model that returns NaN for any card with history passes
them and then fails most of the traffic. So the rows come from a short simulated stream
(`simulator/replay.py`: the project's simulator replayed through the service's own card
history, terminal-risk and card-frauds feature code, exactly as training sees them), chosen to
cover what traffic holds: cards seen for the first time and cards with history, terminals with
frauds reported, cards with confirmed frauds, every fraud scenario and channel, and, for each
feature, the row where it is largest and the row where it is smallest.

Computed once per process, on first use (a stream of a few hundred transactions, well under a
second), and shared read-only.
"""

from __future__ import annotations

import functools

import numpy as np
import numpy.typing as npt

from scorer.features import FEATURE_NAMES
from simulator.replay import simulate

#: The stream: 60 cards (and 120 terminals) over 14 days, about 700 transactions; long enough
#: for card histories a month deep in their 7-day and 1-day windows, and for frauds to be
#: reported against terminals and cards before later transactions of theirs.
SEED, DAYS, CARDS = 7, 14, 60
#: Rows taken from each kind (spread over the stream), before each feature's extremes are added.
PER_KIND = 3

_COLUMN = {name: i for i, name in enumerate(FEATURE_NAMES)}
#: `card_tx_30d` (log(1 + count)) between a card's first transaction, log(2), and its second.
_SEEN_BEFORE = float(np.log1p(1.5))


@functools.cache
def typical_rows() -> npt.NDArray[np.float32]:
    """The feature rows [n, NUM_FEATURES] of a few dozen transactions of a short simulated
    stream. Read-only: shared by every caller."""
    stream = simulate(SEED, DAYS, CARDS)
    features = stream.features
    first = features[:, _COLUMN["card_tx_30d"]] < _SEEN_BEFORE
    kinds = [
        first,
        ~first,  # a card with history
        features[:, _COLUMN["terminal_frauds_7d"]] > 0,
        features[:, _COLUMN["card_fresh_frauds_7d"]] > 0,
        *(stream.scenario == scenario for scenario in np.unique(stream.scenario)),
        *(features[:, _COLUMN[f"channel_{channel}"]] > 0 for channel in ("pos", "ecom", "atm")),
    ]
    chosen: set[int] = set()
    for kind in kinds:
        of_kind = np.flatnonzero(kind)
        spread = np.linspace(0, len(of_kind) - 1, min(PER_KIND, len(of_kind)), dtype=int)
        chosen.update(of_kind[spread].tolist())
    chosen.update(np.argmax(features, axis=0).tolist())
    chosen.update(np.argmin(features, axis=0).tolist())
    rows = np.ascontiguousarray(features[sorted(chosen)])
    rows.setflags(write=False)
    return rows
