"""Per-card confirmed frauds known so far: each transaction's `card_fresh_frauds_*` columns from
its card's `card-frauds` record (`contracts/card_frauds.py`); pure, no Kafka.

The record lists the days (of the transactions) that hold a confirmed fraud, counted by the
features worker as each label arrives; the columns count them on the fresh-label windows back
from the scored transaction's own day with the terminal's arithmetic
(`scorer.terminal_risk.fresh_frauds`), which training also runs on the same daily counts
(`simulator/replay.py`). A card with no record, or a transaction with no card, has none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from contracts.card_frauds import NUM_CARD_FRAUD_FEATURES, CardFraudsRecord
from contracts.terminal_risk import EMPTY_DAY
from scorer.terminal_risk import fresh_frauds

_Ints = npt.NDArray[np.int64]


def card_features(
    known: Mapping[str, CardFraudsRecord], card_ids: Sequence[str], day: _Ints
) -> npt.NDArray[np.float32]:
    """The card-fraud columns [B, NUM_CARD_FRAUD_FEATURES] of a batch, each as of its
    transaction's `day` [B], from the latest record per card id (the scorer's copy of
    `card-frauds`); zeros where there is none."""
    out = np.zeros((len(card_ids), NUM_CARD_FRAUD_FEATURES), np.float32)
    rows: list[int] = []
    records: list[CardFraudsRecord] = []
    for i, card_id in enumerate(card_ids):
        record = known.get(card_id)
        if record is not None:
            rows.append(i)
            records.append(record)
    if rows:  # only the cards with frauds are stacked, padded to the longest record
        width = max(len(r.days) for r in records)
        days = np.full((len(rows), width), EMPTY_DAY, np.int64)
        frauds = np.zeros((len(rows), width), np.int64)
        for j, record in enumerate(records):
            days[j, : len(record.days)] = record.days
            frauds[j, : len(record.frauds)] = record.frauds
        out[rows] = fresh_frauds(days, frauds, np.asarray(day, np.int64)[rows])
    return out
