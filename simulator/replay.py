"""Simulate a labelled stream and replay it through the service's own state and feature code.

Training must see exactly the features the service computes, so nothing here computes a
feature itself: the stream goes, in event-time order and in micro-batches like the service's,
through `scorer.card_history.CardHistory` (one per partition: the service keys one store by
partition and card, which gives each partition's cards the same features; cards idle past the
longest window are evicted each simulated day, as the service does), the terminal-risk
buckets (`scorer.terminal_risk.add_events` / `window_features`, the functions behind the faust
worker's per-terminal value) fed with the simulated outcomes at the time they are reported, and
finally `scorer.features.build_features`. The cards' confirmed frauds known so far go through
the same buckets, fed with the fraud labels only, as the worker's per-card value is.

When outcomes are reported depends on the label regime (`simulator/label_regimes.py`). Under
``capacity`` it depends on the features too (analysts review what the rules flag), so that
replay runs hour by hour: an hour's rows get their features from what was reported before
them, the rules flag them, and the hour's reviews are reported after it.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
import zlib
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from contracts.card_frauds import NUM_CARD_FRAUD_FEATURES
from contracts.terminal_risk import MS_PER_DAY, NUM_TERMINAL_FEATURES
from scorer.card_history import NUM_HISTORY_FEATURES, CardHistory
from scorer.columns import TransactionColumns
from scorer.fallback import fallback_scores, red_flags
from scorer.features import NUM_FEATURES, build_features
from scorer.terminal_risk import (
    add_events,
    day_of,
    empty_buckets,
    fresh_frauds,
    window_features,
)
from simulator.label_regimes import (
    AUDIT_SHARE,
    NEVER,
    LabelRegime,
    Reviewers,
    chargeback_delays_ms,
    shifts,
)
from simulator.transactions import (
    DEFAULT_CARDS,
    DEFAULT_START_TIME_MS,
    TransactionSimulator,
    row_of,
    transaction_id,
)

logger = logging.getLogger(__name__)

#: The service's default batch cap; the replay cuts the stream into batches of this size.
REPLAY_BATCH_SIZE = 256
#: Input partitions the replay spreads cards over (each has its own CardHistory).
REPLAY_PARTITIONS = 3
#: Transactions simulated per call: at most this, and about one day's for a small population (a
#: short stream then costs milliseconds, not 50,000 rows' worth); the cut changes no row.
_CHUNK = 50_000
#: Separates the label regime's random stream from the simulator's for the same seed.
_REGIME_STREAM = 2

_Ints = npt.NDArray[np.int64]


class Stream(NamedTuple):
    """A simulated, labelled stream and the features the service computes for it."""

    columns: TransactionColumns
    features: npt.NDArray[np.float32]
    scenario: npt.NDArray[np.str_]
    is_fraud: npt.NDArray[np.bool_]
    card: _Ints  # population index of each row's card
    day: _Ints  # simulated day of each row, 0 = the first
    labels: list[dict[str, object]]  # outcomes reported during the stream, in report order
    #: When each row's outcome (fraud or legitimate) was reported, ms; NEVER: not in the stream.
    reported_at: _Ints
    regime: LabelRegime


def simulate(
    seed: int,
    days: int,
    cards: int = DEFAULT_CARDS,
    regime: LabelRegime = LabelRegime.TODAY,
    audit_share: float = AUDIT_SHARE,
) -> Stream:
    """Simulate `days` whole days of the handbook world (real time) and replay them; `cards`
    customers (the handbook's 5,000 by default) and twice as many terminals; outcomes reported
    under `regime` (`audit_share`: the capacity regime's random audits)."""
    if not 0.0 <= audit_share <= 1.0:
        raise ValueError(f"audit_share must be within [0, 1], got {audit_share!r}")
    started = time.perf_counter()
    simulator = TransactionSimulator(seed, num_cards=cards, num_terminals=2 * cards)
    end_ms = DEFAULT_START_TIME_MS + days * MS_PER_DAY
    batches = []
    labels: list[dict[str, object]] = []
    chunk = max(1, min(_CHUNK, math.ceil(simulator.population.expected_tx_per_day())))
    while True:
        batch = simulator.generate(chunk, with_records=False)
        batches.append(batch)
        labels.extend(batch.labels)
        if batch.columns.event_time[-1] >= end_ms:
            break
    time_ms = np.concatenate([b.columns.event_time for b in batches])
    keep = int(np.searchsorted(time_ms, end_ms))
    columns = TransactionColumns.concat([b.columns for b in batches]).rows(np.arange(keep))
    labels = [label for label in labels if int(str(label["reported_at"])) < end_ms]
    scenario = np.concatenate([b.scenario for b in batches])[:keep]
    is_fraud = scenario != "legit"
    card = np.concatenate([b.card for b in batches])[:keep]
    terminal = np.concatenate([b.terminal for b in batches])[:keep]
    logger.info(
        "simulated days=%d rows=%d fraud=%d elapsed_s=%.1f",
        days,
        keep,
        int(is_fraud.sum()),
        time.perf_counter() - started,
    )
    replay = Replay(
        columns,
        replay_history(columns),
        card,
        terminal,
        len(simulator.population.card_ids),
        len(simulator.population.terminal_ids),
    )
    rng = np.random.default_rng((seed, _REGIME_STREAM))
    if regime is LabelRegime.CAPACITY:
        features, reported_at = _replay_capacity(replay, is_fraud, rng, audit_share)
    else:
        reported_at = np.full(keep, NEVER, np.int64)
        if regime is LabelRegime.TODAY:
            for label in labels:
                reported_at[row_of(str(label["transaction_id"]))] = int(str(label["reported_at"]))
        else:
            frauds = np.flatnonzero(is_fraud)
            delays = chargeback_delays_ms(rng, len(frauds))
            reported_at[frauds] = columns.event_time[frauds] + delays
        features = replay_once(replay, is_fraud, reported_at)
    reported_at[reported_at >= end_ms] = NEVER
    if regime is not LabelRegime.TODAY:
        labels = _labels(columns, is_fraud, reported_at)
    logger.info(
        "replayed rows=%d regime=%s labels=%d elapsed_s=%.1f",
        keep,
        regime.value,
        len(labels),
        time.perf_counter() - started,
    )
    return Stream(
        columns=columns,
        features=features,
        scenario=scenario,
        is_fraud=is_fraud,
        card=card,
        day=(columns.event_time - DEFAULT_START_TIME_MS) // MS_PER_DAY,
        labels=labels,
        reported_at=reported_at,
        regime=regime,
    )


def partition_of(card_ids: list[str], partitions: int) -> _Ints:
    """A stable partition per card id (the role of Kafka's key hash)."""
    return np.array([zlib.crc32(c.encode()) % partitions for c in card_ids], np.int64)


def replay_history(
    columns: TransactionColumns, batch_size: int = REPLAY_BATCH_SIZE
) -> npt.NDArray[np.float32]:
    """The card-history features of a time-ordered stream, as the service computes them."""
    n = len(columns.amount)
    out = np.empty((n, NUM_HISTORY_FEATURES), np.float32)
    partition = partition_of(list(columns.card_id), REPLAY_PARTITIONS)
    day = columns.event_time // MS_PER_DAY
    for p in range(REPLAY_PARTITIONS):
        history = CardHistory()
        rows = np.flatnonzero(partition == p)
        evicted_through = int(day[rows[0]]) if len(rows) else 0
        for begin in range(0, len(rows), batch_size):
            part = rows[begin : begin + batch_size]
            if int(day[part[0]]) > evicted_through:  # once a day, like the service
                evicted_through = int(day[part[0]])
                history.evict_idle(int(columns.event_time[part[0]]))
            sub = columns.rows(part)
            out[part] = history.update_and_features(sub.card_id, sub, sub.merchant_id, part)
    return out


class _KnownFrauds:
    """One kind of entity's daily buckets, as the worker keeps them, advanced through the stream
    in time order: each transaction's features from the frauds reported before it happened,
    and (`count_transactions`) from the entity's earlier transactions."""

    def __init__(
        self,
        entity: _Ints,
        entities: int,
        features: Callable[[_Ints, _Ints, _Ints], npt.NDArray[np.float32]],
        width: int,
        count_transactions: bool,
    ) -> None:
        self._entity = entity  # [n] the entity of each row of the stream
        self._days, self._counts = empty_buckets(entities)
        self._features = features
        self._width = width
        self._count_transactions = count_transactions

    def advance(
        self, begin: int, end: int, tx_day: _Ints, event_time: _Ints, frauds: _Ints, reported: _Ints
    ) -> npt.NDArray[np.float32]:
        """The features of rows [begin, end), the next ones of the stream. The fraud rows
        `frauds`, reported at `reported` (ascending, each before row end - 1 happened), become
        known on the way, each to the rows after its report."""
        out = np.empty((end - begin, self._width), np.float32)
        before = np.searchsorted(event_time[begin:end], reported, side="right")
        cuts = np.unique(np.concatenate(([0], before, [end - begin])))
        for first, stop in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
            known = frauds[before == first]
            if len(known):
                confirmed = np.ones(len(known), np.bool_)
                add_events(self._days, self._counts, self._entity[known], tx_day[known], confirmed)
            which = self._entity[begin + first : begin + stop]
            day = tx_day[begin + first : begin + stop]
            out[first:stop] = self._features(self._days[which], self._counts[which], day)
            if self._count_transactions:
                add_events(self._days, self._counts, which, day, None)
        return out


class Replay:
    """The label-dependent features of a stream, computed in time order (`features`)."""

    def __init__(
        self,
        columns: TransactionColumns,
        history: npt.NDArray[np.float32],
        card: _Ints,
        terminal: _Ints,
        cards: int,
        terminals: int,
    ) -> None:
        self.columns = columns
        self._history = history
        self._tx_day = day_of(columns.event_time)
        self._terminals = _KnownFrauds(
            terminal, terminals, window_features, NUM_TERMINAL_FEATURES, count_transactions=True
        )
        self._cards = _KnownFrauds(
            card,
            cards,
            lambda days, counts, day: fresh_frauds(days, counts[:, :, 1], day),
            NUM_CARD_FRAUD_FEATURES,
            count_transactions=False,
        )

    def features(
        self, begin: int, end: int, frauds: _Ints, reported: _Ints
    ) -> npt.NDArray[np.float32]:
        """The feature matrix of rows [begin, end) (`_KnownFrauds.advance`)."""
        args = (begin, end, self._tx_day, self.columns.event_time, frauds, reported)
        return build_features(
            self.columns.rows(np.arange(begin, end)),
            self._history[begin:end],
            self._terminals.advance(*args),
            self._cards.advance(*args),
        )


def replay_once(
    replay: Replay, is_fraud: npt.NDArray[np.bool_], reported_at: _Ints
) -> npt.NDArray[np.float32]:
    """The features of the whole stream in one pass, each fraud known from its report time."""
    event_time = replay.columns.event_time
    frauds = np.flatnonzero(is_fraud & (reported_at < event_time[-1]))
    frauds = frauds[np.argsort(reported_at[frauds], kind="stable")]
    return replay.features(0, len(event_time), frauds, reported_at[frauds])


def _replay_capacity(
    replay: Replay, is_fraud: npt.NDArray[np.bool_], rng: np.random.Generator, audit_share: float
) -> tuple[npt.NDArray[np.float32], _Ints]:
    """The features of the stream and each row's report time under the capacity regime
    (`simulator/label_regimes.py`): hour by hour, the hour's rows scored by the rules, their
    flags queued, the hour's share of reviews taken off the queue, audits drawn."""
    event_time = replay.columns.event_time
    amount = replay.columns.amount
    n = len(event_time)
    features = np.empty((n, NUM_FEATURES), np.float32)
    reported_at = np.full(n, NEVER, np.int64)
    fraud_rows = np.flatnonzero(is_fraud)
    reported_at[fraud_rows] = event_time[fraud_rows] + chargeback_delays_ms(rng, len(fraud_rows))
    # Frauds not yet known, by report time; an entry whose time is no longer its row's was
    # overtaken by a review.
    pending = list(zip(reported_at[fraud_rows].tolist(), fraud_rows.tolist(), strict=True))
    heapq.heapify(pending)
    reviewers = Reviewers(rng, audit_share)
    for begin, end, shift_end in shifts(event_time):
        if end > begin:
            last = int(event_time[end - 1])
            known: list[tuple[int, int]] = []
            while pending and pending[0][0] < last:
                at, row = heapq.heappop(pending)
                if reported_at[row] == at:
                    known.append((at, row))
            frauds = np.array([row for _, row in known], np.int64)
            reported = np.array([at for at, _ in known], np.int64)
            rows = replay.features(begin, end, frauds, reported)
            features[begin:end] = rows
            flagged = np.any(np.stack(list(red_flags(rows).values())), axis=0)
            hit = np.flatnonzero(flagged)
            expected_loss = fallback_scores(rows[hit]).astype(np.float64) * amount[begin + hit]
            reviewers.see(np.arange(begin, end), flagged, event_time[begin:end], expected_loss)
        reviewed, done = reviewers.end_shift(shift_end)
        for row, at in zip(reviewed, done, strict=True):
            if at < reported_at[row]:
                reported_at[row] = at
                if is_fraud[row]:
                    heapq.heappush(pending, (at, row))
    return features, reported_at


def _labels(
    columns: TransactionColumns, is_fraud: npt.NDArray[np.bool_], reported_at: _Ints
) -> list[dict[str, object]]:
    """The outcomes of the rows with a report time, in report order, as the labels topic
    carries them."""
    rows = np.flatnonzero(reported_at != NEVER)
    rows = rows[np.argsort(reported_at[rows], kind="stable")]
    return [
        {
            "transaction_id": transaction_id(row),
            "card_id": columns.card_id[row],
            "terminal_id": columns.terminal_id[row],
            "fraud": bool(is_fraud[row]),
            "event_time": int(columns.event_time[row]),
            "reported_at": int(reported_at[row]),
        }
        for row in rows.tolist()
    ]
