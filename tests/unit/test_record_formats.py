"""The format numbers of the records the project writes for itself and reads back
(contracts/record_format.py): each writer says its format; each reader reads release 0.1.0's
records (no format field), and refuses a newer format or a field that is not a format number,
so a replica of an older release never reads a newer writer's fields as its own."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import numpy as np
import pytest

from contracts import card_frauds, terminal_risk, worker_progress
from contracts.card_frauds import decode_card_frauds, encode_card_frauds
from contracts.record_format import FORMAT_FIELD
from contracts.terminal_risk import (
    BUCKET_DAYS,
    NUM_TERMINAL_FEATURES,
    decode_terminal_risk,
    encode_terminal_risk,
)
from contracts.worker_progress import WorkerProgress, decode_progress, encode_progress


def terminal_risk_value() -> bytes:
    days = np.arange(BUCKET_DAYS, dtype=np.int64)
    counts = np.ones((BUCKET_DAYS, 2), np.int64)
    return encode_terminal_risk("T1", 40, np.zeros(NUM_TERMINAL_FEATURES), (days, counts))


def card_frauds_value() -> bytes:
    return encode_card_frauds("C1", 40, np.array([38, 39]), np.array([1, 2]))


def progress_value() -> bytes:
    return encode_progress(WorkerProgress(partition=0, partitions=2, counted_to=10**12))[1]


RECORDS = [
    ("terminal-risk", terminal_risk_value, decode_terminal_risk, terminal_risk.FORMAT),
    ("card-frauds", card_frauds_value, decode_card_frauds, card_frauds.FORMAT),
    ("progress", progress_value, decode_progress, worker_progress.FORMAT),
]
NAMES = [name for name, *_ in RECORDS]


def with_format(value: bytes, found: object) -> bytes:
    record = msgspec.json.decode(value)
    if found is None:
        del record[FORMAT_FIELD]
    else:
        record[FORMAT_FIELD] = found
    return msgspec.json.encode(record)


@pytest.mark.parametrize(("name", "value", "decode", "current"), RECORDS, ids=NAMES)
def test_each_writer_says_its_format_and_a_record_of_0_1_0_without_one_still_reads(
    name: str, value: Callable[[], bytes], decode: Callable[[bytes], object], current: int
) -> None:
    written = value()
    assert msgspec.json.decode(written)[FORMAT_FIELD] == current
    assert repr(decode(with_format(written, None))) == repr(decode(written))


@pytest.mark.parametrize(("name", "value", "decode", "current"), RECORDS, ids=NAMES)
@pytest.mark.parametrize("found", [2, 10**9, 0, -1, "1", 1.5, True, None])
def test_a_newer_format_or_one_that_is_not_a_number_is_refused(
    name: str,
    value: Callable[[], bytes],
    decode: Callable[[bytes], object],
    current: int,
    found: object,
) -> None:
    found = current + 1 if found == 2 else found
    if found is None:  # a JSON null: not a format number either
        record = msgspec.json.decode(value())
        record[FORMAT_FIELD] = None
        bad = msgspec.json.encode(record)
    else:
        bad = with_format(value(), found)
    with pytest.raises(ValueError, match="format"):
        decode(bad)
