"""The `terminal-risk-progress` record: how far in event time the features worker's published
state reaches, per table partition (docs/contracts.md, "Worker progress").

The record (JSON, key = the table partition, as text): `{"partition": int, "partitions": int,
"counted_to": int}`. Every transaction and label whose time (a label's report time) is at or
before `counted_to` (epoch ms) has been counted by that table partition, and what it changed has
been published to `terminal-risk` and `card-frauds` (counts no window reads for days, a day
before a window reads them): the minimum, over every input partition, of how far the worker has
read it (terminals/state.py, `TerminalClock`). The scorer takes the
minimum over the `partitions` table partitions, and the age of the state it scores with is how
far the transactions it scores are past it (`fraud_terminal_risk_state_age_seconds`). The topic
is compacted, one partition, named after the terminal-risk topic (`progress_topic_name`).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from contracts.record_format import FIRST_FORMAT, check_format

#: The record's format (contracts/record_format.py).
FORMAT = 1
#: The most table partitions a record may name (the worker's own bound is far below).
MAX_PARTITIONS = 10_000
#: A record's value is a few dozen bytes; a larger one is skipped before it is parsed.
MAX_RECORD_BYTES = 256


class WorkerProgress(msgspec.Struct, frozen=True):
    """One table partition's progress."""

    partition: Annotated[int, msgspec.Meta(ge=0, lt=MAX_PARTITIONS)]
    partitions: Annotated[int, msgspec.Meta(ge=1, le=MAX_PARTITIONS)]
    #: Epoch ms: everything at or before it is counted and published.
    counted_to: Annotated[int, msgspec.Meta(ge=0, le=2**53)]
    #: Absent from release 0.1.0's records (format 1); `encode_progress` writes FORMAT.
    format_version: int = FIRST_FORMAT


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(WorkerProgress)


def progress_topic_name(terminal_risk_topic: str) -> str:
    """The progress topic of a terminal-risk topic."""
    return f"{terminal_risk_topic}-progress"


def encode_progress(progress: WorkerProgress) -> tuple[bytes, bytes]:
    """The record's key and value."""
    current = msgspec.structs.replace(progress, format_version=FORMAT)
    return str(progress.partition).encode(), _encoder.encode(current)


def decode_progress(value: bytes | None) -> WorkerProgress:
    """Read a record's value; ValueError for anything else (too large, not JSON, a field
    missing or out of range, a partition not below `partitions`)."""
    if value is None or len(value) > MAX_RECORD_BYTES:
        size = "no value" if value is None else f"{len(value):,} bytes"
        raise ValueError(f"not a worker progress record: {size}")
    try:
        progress = _decoder.decode(value)
    except msgspec.MsgspecError as exc:
        raise ValueError(f"not a worker progress record: {exc}") from exc
    check_format(progress.format_version, "worker progress", FORMAT)
    if progress.partition >= progress.partitions:
        raise ValueError(
            f"not a worker progress record: partition {progress.partition} of {progress.partitions}"
        )
    return progress
