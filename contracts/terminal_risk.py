"""The `terminal-risk` record: what the features worker publishes for a terminal and the scorer
reads (docs/contracts.md, "Terminal risk"). Its shape follows from the windows below: the
handbook's delayed windows, and the fresh-label windows of frauds known so far.

The record (JSON, key = terminal_id):
`{"terminal_id": str, "as_of_day": int, <TERMINAL_FEATURE_NAMES>: number, …, "days": [38 ints],
"counts": [38 pairs of transactions, frauds]}`: the features as of `as_of_day`, and the buckets
they come from. The scorer computes each transaction's features from the buckets as of the
transaction's own day, exactly as training does (`scorer.terminal_risk.window_features`), so a
record published days ago is not stale; a record without buckets (an older worker) is used as
of its own day. A terminal with no record, or a transaction without a terminal, gets neutral
features.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt

from contracts.record_format import FIRST_FORMAT, FORMAT_FIELD, check_format

#: The record's format (contracts/record_format.py).
FORMAT = 1
DELAY_DAYS = 7
RISK_WINDOWS_DAYS: tuple[int, ...] = (1, 7, 30)
#: Today back to the oldest day any window reads.
BUCKET_DAYS = DELAY_DAYS + max(RISK_WINDOWS_DAYS) + 1
#: How far before a day the oldest day a window reads lies: a day further back than this from
#: the newest day seen is read by no window ever again.
HORIZON_DAYS = DELAY_DAYS + max(RISK_WINDOWS_DAYS) - 1
MS_PER_DAY = 86_400_000
#: Fresh-label windows, in days back from the day scored, today included: confirmed frauds
#: known so far on the days the delayed windows do not read yet.
FRESH_WINDOWS_DAYS: tuple[int, ...] = (2, 7)
TERMINAL_FEATURE_NAMES: tuple[str, ...] = (
    *(
        name
        for w in RISK_WINDOWS_DAYS
        for name in (f"terminal_tx_{w}d", f"terminal_risk_{w}d", f"terminal_frauds_{w}d")
    ),
    *(f"terminal_fresh_frauds_{w}d" for w in FRESH_WINDOWS_DAYS),
)
NUM_TERMINAL_FEATURES = len(TERMINAL_FEATURE_NAMES)
#: The largest finite float32: a feature past it is refused, not read as infinite.
_FLOAT32_MAX = float(np.finfo(np.float32).max)
#: The day a bucket that holds no day yet is tagged with.
EMPTY_DAY = -1

_Ints = npt.NDArray[np.int64]


class TerminalRiskRecord(NamedTuple):
    """A published `terminal-risk` record."""

    terminal_id: str
    as_of_day: int
    features: npt.NDArray[np.float32]  # [NUM_TERMINAL_FEATURES], TERMINAL_FEATURE_NAMES order
    #: The buckets: days [BUCKET_DAYS] and counts [BUCKET_DAYS, 2]; None from an older worker.
    buckets: tuple[_Ints, _Ints] | None = None


def encode_terminal_risk(
    terminal_id: str,
    as_of_day: int,
    features: npt.ArrayLike,
    buckets: tuple[_Ints, _Ints] | None = None,
) -> bytes:
    """The JSON value of a `terminal-risk` record (its key is the terminal id)."""
    values = np.asarray(features, np.float64).reshape(-1)
    if len(values) != NUM_TERMINAL_FEATURES:
        raise ValueError(f"expected {NUM_TERMINAL_FEATURES} features, got {len(values)}")
    record: dict[str, object] = {
        FORMAT_FIELD: FORMAT,
        "terminal_id": terminal_id,
        "as_of_day": int(as_of_day),
    }
    record.update(zip(TERMINAL_FEATURE_NAMES, values.tolist(), strict=True))
    if buckets is not None:
        days, counts = buckets
        record["days"] = np.asarray(days, np.int64).tolist()
        record["counts"] = np.asarray(counts, np.int64).tolist()
    return msgspec.json.encode(record)


def decode_terminal_risk(value: bytes) -> TerminalRiskRecord:
    """Read a `terminal-risk` record; ValueError if it is not one (a missing or non-finite
    feature, no terminal_id, buckets of the wrong shape, …)."""
    try:
        raw = msgspec.json.decode(value)
    except msgspec.MsgspecError as exc:
        raise ValueError(f"terminal-risk record is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError("terminal-risk record is not a JSON object")
    check_format(raw.get(FORMAT_FIELD, FIRST_FORMAT), "terminal-risk", FORMAT)
    terminal_id, as_of_day = raw.get("terminal_id"), raw.get("as_of_day")
    if not isinstance(terminal_id, str) or isinstance(as_of_day, bool):
        raise ValueError("terminal-risk record needs a string terminal_id")
    if not isinstance(as_of_day, int):
        raise ValueError("terminal-risk record needs an integer as_of_day")
    values = [raw.get(name) for name in TERMINAL_FEATURE_NAMES]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise ValueError(f"terminal-risk record needs numbers {list(TERMINAL_FEATURE_NAMES)}")
    # Checked before the cast: a number past float32's range would become infinite in it. An
    # integer past float64's range cannot even be read as one (OverflowError).
    try:
        exact = np.array(values, np.float64)
    except OverflowError as exc:
        raise ValueError(f"terminal-risk record has a feature past float64's range: {exc}") from exc
    if not (np.abs(exact) <= _FLOAT32_MAX).all():
        raise ValueError("terminal-risk record has a feature that is not a finite float32")
    features = exact.astype(np.float32)
    return TerminalRiskRecord(terminal_id, as_of_day, features, _buckets(raw))


def _buckets(raw: dict[str, object]) -> tuple[_Ints, _Ints] | None:
    if "days" not in raw and "counts" not in raw:
        return None
    try:
        days = np.array(raw.get("days"), np.int64)
        counts = np.array(raw.get("counts"), np.int64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"terminal-risk record has buckets that are not integers: {exc}") from exc
    if days.shape != (BUCKET_DAYS,) or counts.shape != (BUCKET_DAYS, 2):
        raise ValueError(f"terminal-risk record needs {BUCKET_DAYS} buckets of 2 counts")
    if (days < EMPTY_DAY).any() or (counts < 0).any():
        raise ValueError("terminal-risk record has a negative bucket")
    return days, counts
