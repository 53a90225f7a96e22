"""The `card-frauds` record: a card's confirmed frauds known so far, by the day of the
transaction, as the features worker publishes them and the scorer reads them (docs/contracts.md,
"Card frauds").

The record (JSON, key = card_id): `{"card_id": str, "as_of_day": int, "days": [ints],
"frauds": [ints]}`: the days (of the transactions) that hold a confirmed fraud, and how many,
as of `as_of_day` (the card's newest day of a label's report). Only days with a fraud are
listed, at most `BUCKET_DAYS` of them. The scorer counts, for each transaction, the frauds of
its card on the fresh-label windows back from the transaction's own day
(`scorer.card_frauds.card_features`), as training does from each label's report time. A card
with no record has none; the worker sends a tombstone once no window reads any of its frauds.
"""

from __future__ import annotations

from typing import Annotated, NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt

from contracts.record_format import FIRST_FORMAT, check_format
from contracts.terminal_risk import BUCKET_DAYS, FRESH_WINDOWS_DAYS

#: The record's format (contracts/record_format.py).
FORMAT = 1

CARD_FRAUD_FEATURE_NAMES: tuple[str, ...] = tuple(
    f"card_fresh_frauds_{w}d" for w in FRESH_WINDOWS_DAYS
)
NUM_CARD_FRAUD_FEATURES = len(CARD_FRAUD_FEATURE_NAMES)

_Ints = npt.NDArray[np.int64]


class CardFraudsRecord(NamedTuple):
    """A published `card-frauds` record."""

    card_id: str
    as_of_day: int
    days: _Ints  # [k] distinct days with a confirmed fraud
    frauds: _Ints  # [k] confirmed frauds on each (> 0)


#: A day number or a count: non-negative, and far inside int64 (sums of them cannot overflow).
_Count = Annotated[int, msgspec.Meta(ge=0, le=2**40)]


class _Record(msgspec.Struct):
    card_id: str
    as_of_day: _Count
    days: list[_Count]
    frauds: list[_Count]
    format_version: int = FIRST_FORMAT


_decoder = msgspec.json.Decoder(_Record)


def encode_card_frauds(card_id: str, as_of_day: int, days: _Ints, frauds: _Ints) -> bytes:
    """The JSON value of a `card-frauds` record from a card's daily buckets (days [n], frauds
    [n]): the days that hold a fraud only."""
    held = np.asarray(frauds, np.int64) > 0
    return msgspec.json.encode(
        {
            "format_version": FORMAT,
            "card_id": card_id,
            "as_of_day": int(as_of_day),
            "days": np.asarray(days, np.int64)[held].tolist(),
            "frauds": np.asarray(frauds, np.int64)[held].tolist(),
        }
    )


def decode_card_frauds(value: bytes) -> CardFraudsRecord:
    """Read a `card-frauds` record; ValueError if it is not one (a missing field, lists of
    different lengths or longer than BUCKET_DAYS, a day listed twice, a count below 1, …)."""
    try:
        raw = _decoder.decode(value)
    except msgspec.MsgspecError as exc:
        raise ValueError(f"not a card-frauds record: {exc}") from exc
    check_format(raw.format_version, "card-frauds", FORMAT)
    if len(raw.days) != len(raw.frauds) or len(raw.days) > BUCKET_DAYS:
        raise ValueError(f"card-frauds record needs as many days as counts, {BUCKET_DAYS} at most")
    days = np.array(raw.days, np.int64)
    frauds = np.array(raw.frauds, np.int64)
    if len(np.unique(days)) != len(days) or (frauds < 1).any():
        raise ValueError("card-frauds record needs distinct days and counts >= 1")
    return CardFraudsRecord(raw.card_id, raw.as_of_day, days, frauds)
