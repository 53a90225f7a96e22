"""The guard of the rules topic (FRAUD_RULES_GUARD_SHARE): a live update that would flag more
than a share of the last minute's traffic is held until it is confirmed.

A rule that declines everything (`when = "amount > 0"`), or a deny entry for the merchant of a
third of the traffic, is one typo away from a valid update, and was applied like any other.
Responsibilities and decisions:
- The sample: the scoring thread hands each decided batch to `observe`, which keeps a few of
  its rows (transaction, feature row, score) in one slot per second, ROWS_PER_SECOND at most,
  for the last WINDOW_S: at most SAMPLE_ROWS rows, about 1.5 MB. Once a second's slot is full a
  batch costs one clock read and one comparison; filling it, a copy of up to ROWS_PER_SECOND
  rows.
- The judgement, on the rules reader's thread: the share of the sample the rules in force flag
  (review or decline), and the share the updated rules would flag, each decided as the scoring
  thread decides (`Rules.decide`, with the thresholds of the newest batch). An update is held
  when the updated rules flag more than the guard's share of the sample and more than the rules
  in force do: an update that flags no more than before (removing a rule, an allow entry) is
  never held. While the sample holds fewer than MIN_SAMPLE_ROWS rows there is too little
  traffic to judge by (`can_judge`): `check` holds nothing, so the rules table makes a rule or
  override update wait until it can (a list entry is applied).
- Cheap for list entries: a deny or allow entry (or its tombstone) changes only the rows of its
  id, so an id the sample does not hold is applied without deciding anything; and the sample is
  put in columns at most once per SAMPLE_REUSE_S, so a burst of updates shares one.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from contracts.decision import APPROVE
from scorer.columns import TransactionColumns, TransactionFields
from scorer.decisions import Thresholds
from scorer.rules import Rules

#: The sample covers the last minute of traffic.
WINDOW_S = 60
#: Rows kept from each second: 60 seconds of them make a sample of about 2,000 rows, enough to
#: tell a share of a few percent from one of tens of percent.
ROWS_PER_SECOND = 34
SAMPLE_ROWS = WINDOW_S * ROWS_PER_SECOND
#: Fewer rows than this in the last minute: too little traffic to judge an update by.
MIN_SAMPLE_ROWS = 50
#: The sample in columns is reused for this long (a burst of updates judged by one).
SAMPLE_REUSE_S = 1.0
_LIST_ACTIONS = ("deny", "allow")


class Held(NamedTuple):
    """Why an update is held: the shares of the sample flagged now and with it, of `rows`."""

    share_now: float
    share_new: float
    rows: int


class _Slot:
    """The rows kept from one second of traffic."""

    __slots__ = ("features", "rows", "scores", "second", "thresholds", "transactions")

    def __init__(self, second: int, thresholds: Thresholds) -> None:
        self.second = second
        self.thresholds = thresholds
        self.rows = 0
        self.transactions: list[TransactionFields] = []
        self.features: list[npt.NDArray[np.float32]] = []
        self.scores: list[npt.NDArray[np.float32]] = []


class _Sample(NamedTuple):
    columns: TransactionColumns
    features: npt.NDArray[np.float32]
    scores: npt.NDArray[np.float32]
    thresholds: Thresholds
    #: How many rows of each list kind (card, merchant, terminal) hold each id.
    ids: dict[str, Counter[str | None]]


class RulesGuard:
    """Keeps a sample of the last minute's traffic (`observe`) and judges rules updates by it
    (`check`); `share` is FRAUD_RULES_GUARD_SHARE, above 0."""

    def __init__(self, share: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not 0.0 < share <= 1.0:
            raise ValueError(f"the guard's share must be in (0, 1], got {share}")
        self.share = share
        self._clock = clock
        self._slots: deque[_Slot] = deque(maxlen=WINDOW_S)
        self._lock = threading.Lock()
        #: The sample last put in columns, and when (only the reader's thread touches it).
        self._built: tuple[float, _Sample | None] | None = None

    def observe(
        self,
        transactions: Sequence[TransactionFields],
        features: npt.NDArray[np.float32],
        scores: npt.NDArray[np.float32],
        thresholds: Thresholds,
    ) -> None:
        """Keep a few rows of a decided batch (on the scoring thread): evenly spread over it,
        those with a score (a record that failed has none)."""
        second = int(self._clock())
        with self._lock:
            slot = self._slots[-1] if self._slots else None
            if slot is not None and slot.second == second and slot.rows >= ROWS_PER_SECOND:
                return
            if slot is None or slot.second != second:
                slot = _Slot(second, thresholds)
                self._slots.append(slot)
            room = ROWS_PER_SECOND - slot.rows
        n = len(transactions)
        if n == 0:
            return
        picked = np.unique(np.linspace(0, n - 1, min(room, n)).astype(np.intp))
        picked = picked[np.isfinite(scores[picked])]
        if not len(picked):
            return
        kept = [transactions[i] for i in picked.tolist()]
        rows, row_scores = features[picked], scores[picked]  # copies
        with self._lock:
            slot.transactions.extend(kept)
            slot.features.append(rows)
            slot.scores.append(row_scores)
            slot.rows += len(kept)
            slot.thresholds = thresholds

    def check(self, key: str, present: bool, current: Rules, candidate: Rules) -> Held | None:
        """Whether the update (`key`; `present`: not a tombstone) that turns `current` into
        `candidate` must be held (on the reader's thread); None: apply it. Raises what
        deciding raises, which the caller treats as a refused update."""
        sample = self._sample()
        if sample is None:
            return None
        action, _, rest = key.partition(":")
        if action in _LIST_ACTIONS:
            kind, _, entry_id = rest.partition(":")
            if not sample.ids.get(kind, Counter())[entry_id]:
                return None  # no row of the sample holds the id: nothing changes
            if action == "allow" and present:
                return None  # an allow entry only approves
        rows = len(sample.scores)
        share_new = _flagged_share(candidate, sample)
        if share_new <= self.share:
            return None
        share_now = _flagged_share(current, sample)
        return Held(share_now, share_new, rows) if share_new > share_now else None

    def can_judge(self) -> bool:
        """Whether the sample holds enough rows to judge an update by (on the reader's
        thread)."""
        return self._sample() is not None

    def rows(self) -> int:
        """Rows in the sample of the last minute."""
        horizon = int(self._clock()) - WINDOW_S
        with self._lock:
            return sum(slot.rows for slot in self._slots if slot.second > horizon)

    def _sample(self) -> _Sample | None:
        """The last minute's rows as one batch, made at most once per SAMPLE_REUSE_S; None
        while they are too few to judge by."""
        now = self._clock()
        if self._built is not None and now - self._built[0] < SAMPLE_REUSE_S:
            return self._built[1]
        sample = self._build(int(now) - WINDOW_S)
        self._built = (now, sample)
        return sample

    def _build(self, horizon: int) -> _Sample | None:
        with self._lock:
            slots = [slot for slot in self._slots if slot.second > horizon and slot.rows]
            transactions = [t for slot in slots for t in slot.transactions]
            features = [rows for slot in slots for rows in slot.features]
            scores = [rows for slot in slots for rows in slot.scores]
        if len(transactions) < MIN_SAMPLE_ROWS:
            return None
        columns = TransactionColumns.from_transactions(transactions)
        ids: dict[str, Counter[str | None]] = {
            "card": Counter(columns.card_id),
            "merchant": Counter(columns.merchant_id),
            "terminal": Counter(columns.terminal_id),
        }
        return _Sample(
            columns, np.concatenate(features), np.concatenate(scores), slots[-1].thresholds, ids
        )


def _flagged_share(rules: Rules, sample: _Sample) -> float:
    outcome = rules.decide(sample.columns, sample.features, sample.scores, sample.thresholds)
    return sum(decision != APPROVE for decision in outcome.decisions) / len(outcome.decisions)
