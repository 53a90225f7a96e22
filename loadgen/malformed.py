"""Malformed-record injection: the kinds of broken input a real producer fleet emits."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import numpy as np

Record = dict[str, object]


def _truncated(record: Record) -> bytes:
    raw = msgspec.json.encode(record)
    return raw[: len(raw) // 2]


def _invalid_utf8(record: Record) -> bytes:
    return msgspec.json.encode(record).replace(b'"card_id":"', b'"card_id":"\xff\xfe', 1)


def _missing_amount(record: Record) -> bytes:
    return msgspec.json.encode({k: v for k, v in record.items() if k != "amount"})


def _negative_amount(record: Record) -> bytes:
    return msgspec.json.encode({**record, "amount": -abs(float(str(record["amount"])))})


def _amount_as_text(record: Record) -> bytes:
    return msgspec.json.encode({**record, "amount": str(record["amount"])})


def _unknown_channel(record: Record) -> bytes:
    return msgspec.json.encode({**record, "channel": "telepathy"})


def _nan_amount(record: Record) -> bytes:
    return msgspec.json.encode({**record, "amount": 0.0}).replace(b'"amount":0.0', b'"amount":NaN')


#: Each turns a valid record into bytes that the service must dead-letter.
MALFORMATIONS: dict[str, Callable[[Record], bytes]] = {
    "truncated": _truncated,
    "invalid_utf8": _invalid_utf8,
    "missing_amount": _missing_amount,
    "negative_amount": _negative_amount,
    "amount_as_text": _amount_as_text,
    "unknown_channel": _unknown_channel,
    "nan_amount": _nan_amount,
}


def malform(record: Record, rng: np.random.Generator) -> bytes:
    """A randomly chosen malformed rendering of `record`."""
    names = list(MALFORMATIONS)
    return MALFORMATIONS[names[int(rng.integers(len(names)))]](record)
