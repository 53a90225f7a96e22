"""The per-record card update, compiled: each transaction of a batch applied to its card's row
in turn, and its history features, in one machine-code loop (numba).

`CardHistory.update_and_features` orders a batch (per card by event time, ties by offset) and
calls `apply_in_order` with its `CardHistoryStore` columns; the arithmetic is the one the module
docstring of `scorer/card_history.py` describes. One loop over the records replaces a vectorised
numpy pass per round (the r-th transaction of every card), whose fixed cost of some forty numpy
calls was paid again for every transaction a card had in the batch.

Compiled when this module is first imported (explicit signature), and cached next to it or in
`NUMBA_CACHE_DIR`, so the first batch never waits for the compiler.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
from numba import njit, types

from scorer.card_history_record import (
    COL_AVG,
    COL_COUNTRIES,
    COL_MERCHANTS,
    COL_SINCE,
    COL_TESTING,
    COL_TO_MEAN,
    COL_TX,
    COL_ZSCORE,
    MAX_ZSCORE,
    MIN_HISTORY,
    MS_PER_MINUTE,
    NUM_SUMS,
    RING_SIZE,
    STD_FLOOR,
    STD_FLOOR_SHARE,
    SUM_AMOUNT,
    SUM_COUNT,
    SUM_SQUARES,
    SUM_TESTING_COUNT,
    SUM_WINDOW,
    WINDOWS,
)

_SUM_WINDOW = SUM_WINDOW.astype(np.int64)
Ints = npt.NDArray[np.int64]
Flags = npt.NDArray[np.bool_]


class CardColumns(NamedTuple):
    """A `CardHistoryStore`'s columns, one row per card, which the update changes in place."""

    times: Ints  # [cards, 2]: last_ms, offset
    sums: npt.NDArray[np.float32]  # [cards, NUM_SUMS]
    ring_minute: npt.NDArray[np.uint32]  # [cards, RING_SIZE]
    ring_merchant: npt.NDArray[np.uint32]
    ring_country: npt.NDArray[np.uint16]
    ring_next: npt.NDArray[np.uint8]  # [cards]


_SIGNATURE = types.void(
    types.int64[:],  # order
    types.int64[:],  # rows
    types.int64[:],  # t
    types.boolean[:],  # apply
    types.int64[:],  # offset
    types.float64[:],  # amount
    types.boolean[:],  # small_ecom
    types.uint32[:],  # merchant
    types.uint16[:],  # country
    types.int64[:, :],  # times
    types.float32[:, :],  # sums
    types.uint32[:, :],  # ring_minute
    types.uint32[:, :],  # ring_merchant
    types.uint16[:, :],  # ring_country
    types.uint8[:],  # ring_next
    types.float64[:],  # inverse_windows
    types.float64,  # recent_minutes
    types.float64,  # longest_ms
    types.float32[:, :],  # out
)


@njit(cache=True, nogil=True)
def _distinct(values: Ints, valid: Flags) -> float:
    """How many distinct values among the valid entries."""
    count = 0
    for j in range(len(values)):
        if not valid[j]:
            continue
        seen = False
        for k in range(j):
            if valid[k] and values[k] == values[j]:
                seen = True
                break
        if not seen:
            count += 1
    return float(count)


@njit(_SIGNATURE, cache=True, nogil=True)
def apply_in_order(
    order: Ints,
    rows: Ints,
    t: Ints,
    apply: Flags,
    offset: Ints,
    amount: npt.NDArray[np.float64],
    small_ecom: Flags,
    merchant: npt.NDArray[np.uint32],
    country: npt.NDArray[np.uint16],
    times: Ints,
    sums: npt.NDArray[np.float32],
    ring_minute: npt.NDArray[np.uint32],
    ring_merchant: npt.NDArray[np.uint32],
    ring_country: npt.NDArray[np.uint16],
    ring_next: npt.NDArray[np.uint8],
    inverse_windows: npt.NDArray[np.float64],
    recent_minutes: float,
    longest_ms: float,
    out: npt.NDArray[np.float32],
) -> None:
    """Apply records `order[0]`, `order[1]`, … to their cards' `rows` of the store's columns
    (`times` … `ring_next`, a `CardColumns` unpacked; changed in place) and write every record's
    history features to `out` [n, NUM_HISTORY_FEATURES]. A record whose `apply` is False
    changes nothing; its features are read from its card as it is at the record's time."""
    s = np.empty(NUM_SUMS, np.float64)
    minutes = np.empty(RING_SIZE, np.uint32)
    merchants = np.empty(RING_SIZE, np.int64)
    countries = np.empty(RING_SIZE, np.int64)
    recent = np.empty(RING_SIZE, np.bool_)
    for i in order:
        row = rows[i]
        last = times[row, 0]
        has_prev = last >= 0
        elapsed = float(max(t[i] - last, 0)) if has_prev else 0.0
        for j in range(NUM_SUMS):
            s[j] = np.float64(sums[row, j]) * math.exp(-elapsed * inverse_windows[_SUM_WINDOW[j]])

        # The amount against the card's history before this transaction.
        x = amount[i]
        history = s[SUM_COUNT + WINDOWS - 1]
        known = history > MIN_HISTORY
        to_mean = 0.0
        zscore = 0.0
        if known:
            mean = s[SUM_AMOUNT + WINDOWS - 1] / history
            variance = max(s[SUM_SQUARES] / history - mean * mean, 0.0)
            std = math.sqrt(variance) + STD_FLOOR_SHARE * mean + STD_FLOOR
            to_mean = math.log1p(x) - math.log1p(mean)
            zscore = min(max((x - mean) / std, -MAX_ZSCORE), MAX_ZSCORE)

        applies = apply[i]
        minute = np.uint32(t[i] // MS_PER_MINUTE) + np.uint32(1)
        slot = np.int64(ring_next[row])
        for j in range(RING_SIZE):
            minutes[j] = ring_minute[row, j]
            merchants[j] = ring_merchant[row, j]
            countries[j] = ring_country[row, j]
        if applies:
            for j in range(SUM_COUNT, SUM_TESTING_COUNT):
                s[j] += 1.0
            s[SUM_TESTING_COUNT] += 1.0 if small_ecom[i] else 0.0
            for j in range(SUM_AMOUNT, SUM_SQUARES):
                s[j] += x
            s[SUM_SQUARES] += x * x
            minutes[slot] = minute
            merchants[slot] = merchant[i]
            countries[slot] = country[i]

        for j in range(WINDOWS):
            count = s[SUM_COUNT + j]
            out[i, COL_TX + j] = math.log1p(count)
            average = s[SUM_AMOUNT + j] / max(count, MIN_HISTORY) if count > 0 else 0.0
            out[i, COL_AVG + j] = math.log1p(average)
        out[i, COL_TO_MEAN] = to_mean
        out[i, COL_ZSCORE] = zscore
        since_ms = min(elapsed, longest_ms) if has_prev else longest_ms
        out[i, COL_SINCE] = math.log1p(since_ms / 1000.0)
        for j in range(RING_SIZE):
            age = np.int64(minute) - np.int64(minutes[j])
            recent[j] = minutes[j] > 0 and age <= recent_minutes
        out[i, COL_MERCHANTS] = _distinct(merchants, recent)
        out[i, COL_COUNTRIES] = _distinct(countries, recent)
        out[i, COL_TESTING] = math.log1p(s[SUM_TESTING_COUNT])

        if applies:
            times[row, 0] = max(t[i], last)
            times[row, 1] = max(offset[i], times[row, 1])
            for j in range(NUM_SUMS):
                sums[row, j] = s[j]
            ring_minute[row, slot] = minutes[slot]
            ring_merchant[row, slot] = merchant[i]
            ring_country[row, slot] = country[i]
            ring_next[row] = (slot + 1) % RING_SIZE
