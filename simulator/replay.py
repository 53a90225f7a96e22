"""Simulate a labelled stream and replay it through the service's own state and feature code.

Training must see exactly the features the service computes, so nothing here computes a
feature itself: the stream goes, in event-time order and in micro-batches like the service's,
through `scorer.history.CardHistory` (one per partition: the service keys one store by
partition and card, which gives each partition's cards the same features; cards idle past the
longest window are evicted each simulated day, as the service does), the terminal-risk
buckets (`scorer.terminal_risk.add_events` / `window_features`, the functions behind the faust
worker's per-terminal value) fed with the simulated outcomes at the time they are reported, and
finally `scorer.features.build_features`. The cards' confirmed frauds known so far go through
the same buckets, fed with the fraud labels only, as the worker's per-card value is.
"""

from __future__ import annotations

import logging
import math
import time
import zlib
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from contracts.card_frauds import NUM_CARD_FRAUD_FEATURES
from contracts.terminal_risk import MS_PER_DAY, NUM_TERMINAL_FEATURES
from scorer.columns import TransactionColumns
from scorer.features import build_features
from scorer.history import NUM_HISTORY_FEATURES, CardHistory
from scorer.terminal_risk import (
    add_events,
    day_of,
    empty_buckets,
    fresh_frauds,
    window_features,
)
from simulator.transactions import DEFAULT_CARDS, DEFAULT_START_TIME_MS, TransactionSimulator

logger = logging.getLogger(__name__)

#: The service's default batch cap; the replay cuts the stream into batches of this size.
REPLAY_BATCH_SIZE = 256
#: Input partitions the replay spreads cards over (each has its own CardHistory).
REPLAY_PARTITIONS = 3
#: Transactions simulated per call: at most this, and about one day's for a small population (a
#: short stream then costs milliseconds, not 50,000 rows' worth); the cut changes no row.
_CHUNK = 50_000

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


def simulate(seed: int, days: int, cards: int = DEFAULT_CARDS) -> Stream:
    """Simulate `days` whole days of the handbook world (real time) and replay them; `cards`
    customers (the handbook's 5,000 by default) and twice as many terminals."""
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
    card = np.concatenate([b.card for b in batches])[:keep]
    terminal = np.concatenate([b.terminal for b in batches])[:keep]
    logger.info(
        "simulated days=%d rows=%d fraud=%d labels=%d elapsed_s=%.1f",
        days,
        keep,
        int((scenario != "legit").sum()),
        len(labels),
        time.perf_counter() - started,
    )
    history = replay_history(columns)
    terminal_features = replay_terminal_risk(
        columns, terminal, len(simulator.population.terminal_ids), labels
    )
    card_frauds = replay_card_frauds(columns, card, len(simulator.population.card_ids), labels)
    features = build_features(columns, history, terminal_features, card_frauds)
    logger.info("replayed rows=%d elapsed_s=%.1f", keep, time.perf_counter() - started)
    return Stream(
        columns=columns,
        features=features,
        scenario=scenario,
        is_fraud=scenario != "legit",
        card=card,
        day=(columns.event_time - DEFAULT_START_TIME_MS) // MS_PER_DAY,
        labels=labels,
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


def replay_terminal_risk(
    columns: TransactionColumns,
    terminal: _Ints,
    terminals: int,
    labels: list[dict[str, object]],
) -> npt.NDArray[np.float32]:
    """Each transaction's terminal features from the outcomes reported before it happened."""
    return _replay_known_frauds(
        columns,
        terminal,
        terminals,
        labels,
        columns.terminal_id,
        "terminal_id",
        window_features,
        NUM_TERMINAL_FEATURES,
        count_transactions=True,
    )


def replay_card_frauds(
    columns: TransactionColumns,
    card: _Ints,
    cards: int,
    labels: list[dict[str, object]],
) -> npt.NDArray[np.float32]:
    """Each transaction's card-fraud columns from the frauds reported before it happened."""

    def features(days: _Ints, counts: _Ints, day: _Ints) -> npt.NDArray[np.float32]:
        return fresh_frauds(days, counts[:, :, 1], day)

    return _replay_known_frauds(
        columns, card, cards, labels, columns.card_id, "card_id", features, NUM_CARD_FRAUD_FEATURES
    )


def _replay_known_frauds(
    columns: TransactionColumns,
    entity: _Ints,
    entities: int,
    labels: list[dict[str, object]],
    ids: Sequence[str | None],
    field: str,
    features: Callable[[_Ints, _Ints, _Ints], npt.NDArray[np.float32]],
    width: int,
    *,
    count_transactions: bool = False,
) -> npt.NDArray[np.float32]:
    """Each transaction's `features` of its entity (`entity` [n], indexes of `entities`; `ids`
    [n] its name, which a label gives in `field`) from the daily buckets the worker keeps for
    it: the frauds reported before the transaction happened, and its transactions when
    `count_transactions`."""
    n = len(columns.amount)
    out = np.empty((n, width), np.float32)
    days, counts = empty_buckets(entities)
    index = {name: i for i, name in enumerate(ids) if name}
    frauds = [label for label in labels if label["fraud"] and label.get(field) in index]
    reported = np.array([int(str(label["reported_at"])) for label in frauds], np.int64)
    order = np.argsort(reported, kind="stable")
    fraud_entity = np.array(
        [entity[index[str(frauds[i][field])]] for i in order.tolist()], np.int64
    )
    fraud_day = day_of([int(str(frauds[i]["event_time"])) for i in order.tolist()])
    # Outcome j is known to every transaction from position before[j] on.
    before = np.searchsorted(columns.event_time, reported[order], side="right")
    tx_day = day_of(columns.event_time)
    cuts = np.unique(np.concatenate(([0], before, [n])))
    for begin, end in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
        known = np.flatnonzero(before == begin)
        if len(known):
            frauds_known = np.ones(len(known), np.bool_)
            add_events(days, counts, fraud_entity[known], fraud_day[known], frauds_known)
        rows = slice(begin, end)
        which = entity[rows]
        out[rows] = features(days[which], counts[which], tx_day[rows])
        if count_transactions:
            add_events(days, counts, which, tx_day[rows], None)
    return out
