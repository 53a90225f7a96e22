"""Label regimes: how and when the outcome of a simulated transaction is reported.

A model's fresh-label features (a terminal's or a card's frauds confirmed so far) and its
training labels are only as good as the feedback behind them, so a model is trained and
evaluated under a named regime:

- ``today``: the simulator's own outcomes (`simulator/fraud.py`, `outcome_delays_s`). 35 % of
  frauds are confirmed by an analyst about 4 h after the transaction, whether or not anything
  flagged them; the rest by chargebacks (median 2.5 days); 0.5 % of legitimate transactions
  are confirmed legitimate. Optimistic: kept for comparison.
- ``chargebacks``: every fraud is reported by a chargeback or the cardholder, CHARGEBACK_DELAY
  after the transaction; nothing else is ever labelled.
- ``capacity``: analysts review what the service flags (`scorer/fallback.py`: a transaction
  with a red flag), REVIEWS_PER_DAY cases a day, each hour the hour's share, highest expected
  loss (score x amount) first. A case not reached within CASE_EXPIRY_MS of its flag is left to
  chargebacks. A random AUDIT_SHARE of unflagged transactions is reviewed too, as issuers do to
  measure what they miss. A reviewed transaction's outcome, fraud or legitimate, is reported
  within REVIEW_WORK_MS after the hour of its review. Every other fraud is reported as under
  ``chargebacks``.

In training (`simulator/replay.py`) the flags come from the rules, not from a trained model:
the regime must exist before the model it trains, and a rule set is what a team runs before it
has a model. The flywheel (`make flywheel`) flags with the served model's own decisions
(`capacity_reports`), and audits the transactions of the `audit_sample`.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Sequence
from enum import StrEnum
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from contracts.terminal_risk import MS_PER_DAY


class LabelRegime(StrEnum):
    TODAY = "today"
    CHARGEBACKS = "chargebacks"
    CAPACITY = "capacity"


#: `make model`'s regimes: the shipped model is trained under the first, the realistic one; the
#: model card reports the others beside it.
SHIPPED_REGIMES = (LabelRegime.CAPACITY, LabelRegime.CHARGEBACKS, LabelRegime.TODAY)


#: Log-normal chargeback delay: median 7 days, sigma of the log 0.6 (90 % within 15 days, 99 %
#: within 28), cut at the card networks' 120-day filing limit. The handbook's own protocol
#: assumes a week of feedback delay (Le Borgne et al., chapter 5; Dal Pozzolo et al. 2018).
CHARGEBACK_DELAY_S = (7 * 86_400.0, 0.6)
MAX_CHARGEBACK_DELAY_S = 120 * 86_400.0
#: Cases reviewed a day: the handbook's premise behind Card Precision@100 (investigators check
#: 100 cards a day).
REVIEWS_PER_DAY = 100
#: A flagged transaction not reviewed within a day is left to chargebacks.
CASE_EXPIRY_MS = MS_PER_DAY
#: Share of unflagged transactions reviewed at random (the default of `fraud-train --audit-share`).
AUDIT_SHARE = 0.001
#: A review's outcome is reported within this long after the hour it was reviewed in.
REVIEW_WORK_MS = 3_600_000
#: The queue is worked hour by hour.
SHIFT_MS = 3_600_000

#: A report time that never comes: the outcome is not reported.
NEVER = np.iinfo(np.int64).max

#: Expired cases are swept out of the queue once it holds more than this many.
_PRUNE_ABOVE = 10_000

_Ints = npt.NDArray[np.int64]
_Floats = npt.NDArray[np.float64]


def chargeback_delays_ms(rng: np.random.Generator, n: int) -> _Ints:
    """`n` chargeback delays in whole milliseconds (at least 1)."""
    median, sigma = CHARGEBACK_DELAY_S
    seconds = np.minimum(median * np.exp(sigma * rng.standard_normal(n)), MAX_CHARGEBACK_DELAY_S)
    return np.maximum(np.ceil(seconds * 1000.0), 1).astype(np.int64)


def reviews_in_shift(shift: int, reviews_per_day: int = REVIEWS_PER_DAY) -> int:
    """Cases reviewed in the `shift`-th hour since the stream began: the day's capacity spread
    over its 24 hours, whole cases, exactly `reviews_per_day` in every 24 consecutive hours."""
    per_day = 24
    return (shift + 1) * reviews_per_day // per_day - shift * reviews_per_day // per_day


class ReviewQueue:
    """Flagged transactions waiting for an analyst, highest expected loss first."""

    def __init__(self, expiry_ms: int = CASE_EXPIRY_MS) -> None:
        self._expiry_ms = expiry_ms
        self._heap: list[tuple[float, int, int]] = []  # (-expected loss, row, flagged at)

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, rows: _Ints, flagged_at_ms: _Ints, expected_loss: _Floats) -> None:
        """Queue these rows (flagged at those times, with that expected loss)."""
        for row, at, loss in zip(
            rows.tolist(), flagged_at_ms.tolist(), expected_loss.tolist(), strict=True
        ):
            heapq.heappush(self._heap, (-loss, row, at))

    def take(self, count: int, now_ms: int) -> list[int]:
        """Up to `count` rows to review at `now_ms`, highest expected loss first; the cases
        flagged more than the expiry before `now_ms` leave the queue unreviewed."""
        oldest = now_ms - self._expiry_ms
        taken: list[int] = []
        while self._heap and len(taken) < count:
            _, row, at = heapq.heappop(self._heap)
            if at >= oldest:
                taken.append(row)
        if len(self._heap) > _PRUNE_ABOVE:  # cases no one reached: bound the queue
            self._heap = [case for case in self._heap if case[2] >= oldest]
            heapq.heapify(self._heap)
        return taken


class Reviewers:
    """The capacity regime's analysts, shift after shift: flagged transactions queue, each
    shift takes its share of the day's reviews off the queue, and audits are drawn among the
    transactions nothing flagged."""

    def __init__(
        self,
        rng: np.random.Generator,
        audit_share: float = AUDIT_SHARE,
        reviews_per_day: int = REVIEWS_PER_DAY,
    ) -> None:
        self._rng = rng
        self._audit_share = audit_share
        self._reviews_per_day = reviews_per_day
        self._queue = ReviewQueue()
        self._audited: list[int] = []
        self._shifts = 0

    def see(
        self,
        rows: _Ints,
        flagged: npt.NDArray[np.bool_],
        at_ms: _Ints,
        expected_loss: _Floats,
        audited: npt.NDArray[np.bool_] | None = None,
    ) -> None:
        """This shift's transactions `rows` (at `at_ms`): the `flagged` ones queue with their
        `expected_loss` (one per flagged row), and the others in the audit are reviewed too:
        those `audited` (an `audit_sample`), or else a random draw of the audit share."""
        self._queue.add(rows[flagged], at_ms[flagged], expected_loss)
        if audited is None:
            audited = self._rng.random(len(rows)) < self._audit_share
        self._audited.extend(rows[audited & ~flagged].tolist())

    def end_shift(self, shift_end_ms: int) -> tuple[list[int], list[int]]:
        """The rows reviewed in the shift that ends at `shift_end_ms`, and when each one's
        outcome is reported."""
        capacity = reviews_in_shift(self._shifts, self._reviews_per_day)
        reviewed = self._queue.take(capacity, shift_end_ms) + self._audited
        self._audited = []
        self._shifts += 1
        done = shift_end_ms + self._rng.integers(0, REVIEW_WORK_MS, len(reviewed))
        return reviewed, done.tolist()


def shifts(at_ms: _Ints) -> list[tuple[int, int, int]]:
    """The shifts of transactions at `at_ms` (in time order): every hour from the first one's to
    the last one's, empty hours included, each as (its first row, the row after its last, the
    time it ends)."""
    if not len(at_ms):
        return []
    first, last = int(at_ms[0]) // SHIFT_MS, int(at_ms[-1]) // SHIFT_MS
    hours = np.arange(first, last + 2, dtype=np.int64) * SHIFT_MS
    bounds = np.searchsorted(at_ms, hours).tolist()
    return [(bounds[k], bounds[k + 1], (first + k + 1) * SHIFT_MS) for k in range(last - first + 1)]


def audit_sample(transaction_ids: Sequence[str], share: float) -> npt.NDArray[np.bool_]:
    """Which of these transactions are in the audit sample of `share`: those whose id hashes
    below it. A hash, not a draw, so that the analysts who audit and the trainer that weighs
    the audits (`fraud-train from-topics --audit-share`) agree on the sample without a field on
    the wire."""
    if share <= 0.0:
        return np.zeros(len(transaction_ids), np.bool_)
    cut = int(share * 2.0**64)
    return np.fromiter(
        (
            int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "little") < cut
            for t in transaction_ids
        ),
        np.bool_,
        len(transaction_ids),
    )


class Reports(NamedTuple):
    """When each transaction's outcome is reported, and whether an analyst reviewed it."""

    #: ms; NEVER: not reported (a legitimate transaction nobody reviewed).
    reported_at: _Ints
    reviewed: npt.NDArray[np.bool_]


def capacity_reports(
    at_ms: _Ints,
    flagged: npt.NDArray[np.bool_],
    expected_loss: _Floats,
    is_fraud: npt.NDArray[np.bool_],
    audited: npt.NDArray[np.bool_],
    rng: np.random.Generator,
    reviews_per_day: int = REVIEWS_PER_DAY,
) -> Reports:
    """The capacity regime over transactions in time order whose flags are already known (a
    served model's decisions): hour by hour the flagged ones queue (with their `expected_loss`,
    one per row), the hour's share of reviews is taken off the queue, the `audited` unflagged
    ones are reviewed, and every fraud not reviewed first is reported by chargeback."""
    n = len(at_ms)
    reported_at = np.full(n, NEVER, np.int64)
    frauds = np.flatnonzero(is_fraud)
    reported_at[frauds] = at_ms[frauds] + chargeback_delays_ms(rng, len(frauds))
    reviewed = np.zeros(n, np.bool_)
    reviewers = Reviewers(rng, reviews_per_day=reviews_per_day)
    for begin, end, shift_end in shifts(at_ms):
        reviewers.see(
            np.arange(begin, end, dtype=np.int64),
            flagged[begin:end],
            at_ms[begin:end],
            expected_loss[begin:end][flagged[begin:end]],
            audited[begin:end],
        )
        rows, done = reviewers.end_shift(shift_end)
        picked = np.asarray(rows, np.int64)
        reviewed[picked] = True
        reported_at[picked] = np.minimum(reported_at[picked], np.asarray(done, np.int64))
    return Reports(reported_at, reviewed)
