"""Per-terminal risk from confirmed outcomes, with the handbook's delay: pure, no Kafka.

A terminal's risk over a window of w days is the share of its transactions in that window that
were confirmed fraud. As in the handbook (Le Borgne et al., "Reproducible Machine Learning for
Credit Card Fraud Detection", baseline feature transformation), the window ends `DELAY_DAYS`
before the day scored, because outcomes (chargebacks, reviews) take about that long to arrive:
on day d, window w covers the w days d - DELAY_DAYS - w + 1 … d - DELAY_DAYS. Days are whole
`day_ms` periods of event time since the epoch (UTC days by default; shorter in a compressed
demo).

State is `BUCKET_DAYS` daily buckets per terminal of (transactions, confirmed frauds), each
bucket tagged with the day it holds, so a bucket is reused for a newer day without a clean-up
pass and an outcome for a day older than the buckets hold is dropped. The functions here work
on stacks of terminals (leading axis), so the faust worker's per-terminal `TerminalRisk` value
and training's table of every terminal run the same arithmetic.

The published `terminal-risk` record, its shape (the windows, the bucket count, the feature
names) and its encoding are a contract: `contracts/terminal_risk.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec
import numpy as np
import numpy.typing as npt

from contracts.terminal_risk import (
    BUCKET_DAYS,
    DELAY_DAYS,
    EMPTY_DAY,
    FRESH_WINDOWS_DAYS,
    MS_PER_DAY,
    NUM_TERMINAL_FEATURES,
    RISK_WINDOWS_DAYS,
    TerminalRiskRecord,
)

_PER_WINDOW = 3
#: What the model sees for a terminal nobody knows anything about: no transactions, no risk.
NEUTRAL_TERMINAL_FEATURES: npt.NDArray[np.float32] = np.zeros(NUM_TERMINAL_FEATURES, np.float32)
_TRANSACTIONS, _FRAUDS = 0, 1

_Ints = npt.NDArray[np.int64]


def day_length_ms(time_scale: float) -> int:
    """The length of a terminal-risk day in event-time ms: shorter in a compressed-time demo
    (FRAUD_HISTORY_TIME_SCALE), the same for the worker and the scorer."""
    return max(1, round(MS_PER_DAY / time_scale))


def day_of(event_time_ms: npt.ArrayLike, day_ms: int = MS_PER_DAY) -> _Ints:
    """The day number of each event time (whole `day_ms` periods since the epoch)."""
    if day_ms <= 0:
        raise ValueError(f"day_ms must be > 0, got {day_ms}")
    return np.asarray(event_time_ms, np.int64) // np.int64(day_ms)


def empty_buckets(terminals: int) -> tuple[_Ints, _Ints]:
    """Buckets of `terminals` terminals that saw nothing: (days [T, B], counts [T, B, 2])."""
    days = np.full((terminals, BUCKET_DAYS), EMPTY_DAY, np.int64)
    return days, np.zeros((terminals, BUCKET_DAYS, 2), np.int64)


def add_events(
    days: _Ints, counts: _Ints, terminal: _Ints, day: _Ints, frauds: npt.NDArray[np.bool_] | None
) -> None:
    """Count events into the buckets, in place: a transaction each (`frauds` None) or a
    confirmed outcome each (`frauds[i]` True adds a fraud; False adds nothing).

    Order-free: the buckets end as if the events came one by one in any order. An event for a
    day older than the one its bucket now holds is dropped; a newer day empties the bucket.
    """
    terminal = np.asarray(terminal, np.int64)
    day = np.asarray(day, np.int64)
    if frauds is not None:
        keep = np.asarray(frauds, np.bool_)
        terminal, day = terminal[keep], day[keep]
    if len(day) == 0:
        return
    slot = day % BUCKET_DAYS
    newest = np.maximum(days[terminal, slot], day)
    flat = terminal * BUCKET_DAYS + slot
    held = days.reshape(-1)
    target = held.copy()
    np.maximum.at(target, flat, newest)
    renewed = np.flatnonzero(target != held)
    counts.reshape(-1, 2)[renewed] = 0
    held[renewed] = target[renewed]
    current = held[flat] == day
    column = _TRANSACTIONS if frauds is None else _FRAUDS
    np.add.at(counts.reshape(-1, 2)[:, column], flat[current], 1)


def window_features(days: _Ints, counts: _Ints, as_of_day: _Ints) -> npt.NDArray[np.float32]:
    """TERMINAL_FEATURE_NAMES of each terminal [T] as of its day `as_of_day` [T]: the delayed
    windows, and the confirmed frauds known so far on its most recent days."""
    as_of_day = np.asarray(as_of_day, np.int64)
    newest = as_of_day - DELAY_DAYS
    age = newest[:, None] - days  # 0 for the newest day a window reads
    out = np.empty((len(days), NUM_TERMINAL_FEATURES), np.float32)
    for i, window in enumerate(RISK_WINDOWS_DAYS):
        inside = (days != EMPTY_DAY) & (age >= 0) & (age < window)
        transactions = (counts[:, :, _TRANSACTIONS] * inside).sum(axis=1)
        frauds = (counts[:, :, _FRAUDS] * inside).sum(axis=1)
        out[:, _PER_WINDOW * i] = np.log1p(transactions)
        out[:, _PER_WINDOW * i + 1] = np.clip(frauds / np.maximum(transactions, 1), 0.0, 1.0)
        out[:, _PER_WINDOW * i + 2] = np.log1p(frauds)
    out[:, _PER_WINDOW * len(RISK_WINDOWS_DAYS) :] = fresh_frauds(
        days, counts[:, :, _FRAUDS], as_of_day
    )
    return out


def fresh_frauds(days: _Ints, frauds: _Ints, as_of_day: _Ints) -> npt.NDArray[np.float32]:
    """log(1 + the confirmed frauds known so far) on each of FRESH_WINDOWS_DAYS back from
    `as_of_day` [T], today included, from daily fraud counts (days [T, K], frauds [T, K];
    EMPTY_DAY: no day): a terminal's (`window_features`) or a card's (`scorer/card_frauds.py`).

    The service knows when each label arrived, so a fraud reported today counts today, not 7
    days later (the handbook's delay stands in for not knowing it)."""
    age = np.asarray(as_of_day, np.int64)[:, None] - days  # 0 for today
    out = np.empty((len(days), len(FRESH_WINDOWS_DAYS)), np.float32)
    for i, window in enumerate(FRESH_WINDOWS_DAYS):
        inside = (days != EMPTY_DAY) & (age >= 0) & (age < window)
        out[:, i] = np.log1p((frauds * inside).sum(axis=1))
    return out


class TerminalRisk:
    """One terminal's buckets: the value the faust worker keeps per terminal in its table."""

    __slots__ = ("_counts", "_days")

    def __init__(self) -> None:
        self._days, self._counts = empty_buckets(1)

    def add_transaction(self, day: int, count: int = 1) -> None:
        """Count `count` transactions of this terminal on `day`: `add_events` for one day,
        without its arrays (the features worker counts transactions so, and the vectorised
        path's set-up was most of its cost per event)."""
        slot = day % BUCKET_DAYS
        days, counts = self._days[0], self._counts[0]
        held = int(days[slot])
        if day < held:
            return  # its bucket holds a newer day
        if day > held:
            days[slot] = day
            counts[slot] = 0
        counts[slot, _TRANSACTIONS] += count

    def add_label(self, day_of_transaction: int, fraud: bool) -> None:
        """Count one confirmed outcome of a transaction made on `day_of_transaction`; a legit
        outcome changes nothing (every transaction already counts in the denominator)."""
        add_events(
            self._days,
            self._counts,
            np.zeros(1, np.int64),
            np.array([day_of_transaction]),
            np.array([fraud]),
        )

    def retract_label(self, day_of_transaction: int) -> None:
        """Take back one confirmed fraud counted on `day_of_transaction` (a label corrected to
        legitimate); nothing if that day's bucket holds another day by now."""
        slot = day_of_transaction % BUCKET_DAYS
        if self._days[0, slot] == day_of_transaction and self._counts[0, slot, _FRAUDS] > 0:
            self._counts[0, slot, _FRAUDS] -= 1

    def newest_day(self) -> int:
        """The newest day any bucket holds, or -1 when none does."""
        return int(self._days.max())

    def buckets(self) -> tuple[_Ints, _Ints]:
        """Copies of the buckets: (days [BUCKET_DAYS], counts [BUCKET_DAYS, 2])."""
        return self._days[0].copy(), self._counts[0].copy()

    def empty(self) -> bool:
        """Whether no bucket holds a count (every window reads zero, now and later)."""
        return not self._counts.any()

    def features(self, as_of_day: int) -> npt.NDArray[np.float32]:
        """TERMINAL_FEATURE_NAMES as of `as_of_day`: risk over the windows ending DELAY_DAYS
        before it, and the transaction and confirmed-fraud counts (log1p) of those windows."""
        features: npt.NDArray[np.float32] = window_features(
            self._days, self._counts, np.array([as_of_day])
        )[0]
        return features

    def to_bytes(self) -> bytes:
        """Serialized buckets (for a faust table with raw values)."""
        return msgspec.json.encode(
            {"days": self._days[0].tolist(), "counts": self._counts[0].tolist()}
        )

    @classmethod
    def from_bytes(cls, value: bytes) -> TerminalRisk:
        """The inverse of `to_bytes`; ValueError for anything it did not write."""
        try:
            decoded = msgspec.json.decode(value, type=_Buckets)
        except msgspec.MsgspecError as exc:
            raise ValueError(f"not a terminal risk state: {exc}") from exc
        if len(decoded.days) != BUCKET_DAYS or len(decoded.counts) != BUCKET_DAYS:
            raise ValueError(f"a terminal risk state has {BUCKET_DAYS} buckets")
        risk = cls()
        risk._days[0] = decoded.days
        risk._counts[0] = decoded.counts
        return risk


class _Buckets(msgspec.Struct):
    days: list[int]
    counts: list[tuple[int, int]]


def terminal_features(
    known: Mapping[str, TerminalRiskRecord],
    terminal_ids: Sequence[str | None],
    day: _Ints,
) -> npt.NDArray[np.float32]:
    """The terminal columns [B, NUM_TERMINAL_FEATURES] of a batch, each as of its transaction's
    `day` [B], from the latest record per terminal id (the scorer's copy of `terminal-risk`):
    from the record's buckets when it has them, as training computes them; as published
    otherwise; neutral where there is no record."""
    out = np.empty((len(terminal_ids), NUM_TERMINAL_FEATURES), np.float32)
    out[:] = NEUTRAL_TERMINAL_FEATURES
    rows: list[int] = []
    buckets: list[tuple[_Ints, _Ints]] = []
    for i, terminal_id in enumerate(terminal_ids):
        record = None if terminal_id is None else known.get(terminal_id)
        if record is None:
            continue
        if record.buckets is None:
            out[i] = record.features
        else:
            rows.append(i)
            buckets.append(record.buckets)
    if rows:  # only the terminals that have buckets are stacked and computed
        days = np.stack([b[0] for b in buckets])
        counts = np.stack([b[1] for b in buckets])
        out[rows] = window_features(days, counts, np.asarray(day, np.int64)[rows])
    return out
