"""One card's history record: the windows it keeps, its fields and their serialized form, and
the small vectorised helpers `CardHistory` (`scorer/card_history.py`) builds on.

A record has a fixed size (`STATE_DTYPE`, `STATE_BYTES` serialized with a version byte), so the
memory per card is fixed and the changelog value of a card is the same bytes on every platform.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

MS_PER_MINUTE = 60_000
MS_PER_HOUR = 60 * MS_PER_MINUTE
MS_PER_DAY = 24 * MS_PER_HOUR
#: Count and amount windows, in event-time milliseconds (before `time_scale`).
WINDOWS_MS: tuple[int, ...] = (MS_PER_HOUR, MS_PER_DAY, 7 * MS_PER_DAY, 30 * MS_PER_DAY)
WINDOW_NAMES: tuple[str, ...] = ("1h", "1d", "7d", "30d")
LONGEST_WINDOW_MS = max(WINDOWS_MS)
#: Card testing: small e-commerce amounts within the last few minutes.
CARD_TESTING_WINDOW_MS = 10 * MS_PER_MINUTE
#: Distinct merchants and countries are counted over this window …
RECENT_MS = MS_PER_DAY
#: … among this many last transactions of the card.
RING_SIZE = 8

HISTORY_FEATURE_NAMES: tuple[str, ...] = (
    *(f"card_tx_{name}" for name in WINDOW_NAMES),
    *(f"card_avg_amount_{name}" for name in WINDOW_NAMES),
    "card_amount_to_mean",
    "card_amount_zscore",
    "card_since_previous",
    "card_distinct_merchants_1d",
    "card_distinct_countries_1d",
    "card_testing_velocity",
)
NUM_HISTORY_FEATURES = len(HISTORY_FEATURE_NAMES)
COL_TX, COL_AVG = 0, len(WINDOWS_MS)
COL_TO_MEAN, COL_ZSCORE, COL_SINCE, COL_MERCHANTS, COL_COUNTRIES, COL_TESTING = range(
    2 * len(WINDOWS_MS), NUM_HISTORY_FEATURES
)
#: The z-score is clipped to ±this; beyond it, "far off the card's habits" is all it says.
MAX_ZSCORE = 20.0
#: Spread floor of the z-score: a card with one or two alike amounts has no usable spread.
STD_FLOOR_SHARE, STD_FLOOR = 0.05, 0.5
#: Below this decayed 30-day count the card has no mean to compare an amount with.
MIN_HISTORY = 1e-3

#: One card's state as serialized, little-endian and packed, so its bytes are the same on every
#: platform. In memory the same fields live in a few column arrays.
STATE_DTYPE = np.dtype(
    [
        ("last_ms", "<i8"),  # event time of the newest applied transaction; -1: none
        ("offset", "<i8"),  # highest input offset applied; -1: none
        # Decayed counts per window, then of card testing; decayed amount sums per window; the
        # decayed sum of squared amounts over the longest window.
        ("sums", "<f4", (2 * len(WINDOWS_MS) + 2,)),
        ("ring_minute", "<u4", (RING_SIZE,)),  # event minute + 1 of the last transactions; 0: none
        ("ring_merchant", "<u4", (RING_SIZE,)),  # hashes of their merchant ids
        ("ring_country", "<u2", (RING_SIZE,)),  # their countries, 0 … 26**2 - 1
        ("ring_next", "u1"),  # slot the next transaction takes
    ]
)
#: First byte of a serialized state; a reader refuses any other.
STATE_VERSION = 1
#: A changelog value: the version byte, then the state.
SERIALIZED_STATE_DTYPE = np.dtype([("version", "u1"), ("state", STATE_DTYPE)])
STATE_BYTES = SERIALIZED_STATE_DTYPE.itemsize
WINDOWS = len(WINDOWS_MS)
SUM_COUNT, SUM_TESTING_COUNT, SUM_AMOUNT, SUM_SQUARES = 0, WINDOWS, WINDOWS + 1, 2 * WINDOWS + 1
NUM_SUMS = 2 * WINDOWS + 2
#: The decay (by window, the last being card testing's) that applies to each of the sums.
SUM_WINDOW = np.array([*range(WINDOWS), WINDOWS, *range(WINDOWS), WINDOWS - 1])
INITIAL_CAPACITY = 1024
#: Polynomial hash of merchant ids over their code points (stable across processes).
HASH_BASE = np.uint32(1_000_003)


def validate_scale(time_scale: float) -> float:
    if isinstance(time_scale, bool) or not isinstance(time_scale, int | float):
        raise TypeError(f"time_scale must be a number, got {time_scale!r}")
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"time_scale must be a positive finite number, got {time_scale!r}")
    return float(time_scale)


def merchant_hashes(merchant_ids: Sequence[str]) -> npt.NDArray[np.uint32]:
    """A 32-bit hash of each merchant id, the same in every process (unlike hash())."""
    codes = np.array(merchant_ids, dtype=np.str_)
    width = codes.dtype.itemsize // 4
    if len(codes) == 0 or width == 0:
        return np.zeros(len(codes), np.uint32)
    points = codes.view(np.uint32).reshape(len(codes), width)
    powers = HASH_BASE ** np.arange(width, dtype=np.uint32)  # wraps modulo 2**32
    hashed: npt.NDArray[np.uint32] = (points * powers).sum(axis=1, dtype=np.uint32)
    return hashed
