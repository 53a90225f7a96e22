"""`fraud-loadgen --replay FILE`: a team's own recorded transactions, sent again to see what the
service would have decided on them ("what would it have done last Tuesday?").

The file holds one transaction a row: JSON lines (`.jsonl`, `.ndjson`, `.json`), CSV (`.csv`,
numbers and true/false read as such) or Parquet (`.parquet`, needs pyarrow). Rows are in the
team's own shape, read through the same field mapping as the service's
(`--input-mapping`, `contracts/field_mapping.py`), which gives each row its transaction id, card
(the record key) and event time; each row is produced as JSON, as it was, without the label
column. Start the scorer with the same `FRAUD_INPUT_MAPPING`.

Rows are sent in event-time order: at their original pace (`--replay-speed 1`), sped up by a
factor, or at a constant rate (`--replay-rate`). Event times are kept as recorded, so the card
history and terminal risk see the day as it was; latency is measured from when a row was sent.
A row whose label column (`--label-column`, default `is_fraud`: true/false or 1/0) is present
counts in the recall and false-positive rate. A row the mapping cannot read is sent anyway (the
service dead-letters it) and counted as malformed.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from contracts.field_mapping import FieldMapping
from contracts.transaction import Transaction
from plumbing.errors import RecordError

#: The file suffixes read, by format.
JSON_LINES = (".jsonl", ".ndjson", ".json")
CSV = (".csv",)
PARQUET = (".parquet",)
_TRUE, _FALSE = {"true", "1", "yes"}, {"false", "0", "no", ""}


@dataclass(frozen=True)
class ReplayRow:
    """One row to send."""

    key: bytes
    value: bytes
    transaction_id: str
    #: The row's label (None: the row has none), and whether the mapping could read it.
    is_fraud: bool | None
    readable: bool
    event_time: int


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The file's rows as dicts; ValueError naming the file and line when one is not readable."""
    suffix = path.suffix.lower()
    try:
        if suffix in JSON_LINES:
            return list(_json_lines(path))
        if suffix in CSV:
            with path.open(newline="", encoding="utf-8") as handle:
                return [{k: _scalar(v) for k, v in row.items()} for row in csv.DictReader(handle)]
        if suffix in PARQUET:
            try:
                import pyarrow.parquet as parquet  # type: ignore[import-not-found]
            except ImportError:
                raise ValueError(
                    f"{path}: reading Parquet needs pyarrow (pip install pyarrow)"
                ) from None
            return list(parquet.read_table(path).to_pylist())
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    raise ValueError(
        f"{path}: unknown file type {suffix!r}; JSON lines ({', '.join(JSON_LINES)}), "
        f"CSV ({', '.join(CSV)}) or Parquet ({', '.join(PARQUET)})"
    )


def _json_lines(path: Path) -> Iterator[dict[str, Any]]:
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}, line {number}: not JSON: {exc}") from exc
            if not isinstance(row, dict):
                raise ValueError(f"{path}, line {number}: expected a JSON object")
            yield row


def _scalar(text: str | None) -> Any:
    """A CSV cell as the number or boolean it spells, else the text."""
    if text is None:
        return None
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def plan(
    rows: list[dict[str, Any]], mapping: FieldMapping | None, label_column: str
) -> list[ReplayRow]:
    """The rows to send, in event-time order (unreadable rows where they stood)."""
    mapping = mapping or FieldMapping()
    out: list[ReplayRow] = []
    last_time = 0
    for number, row in enumerate(rows):
        label = _label(row.get(label_column), label_column, number)
        sent = {k: v for k, v in row.items() if k != label_column}
        value = msgspec.json.encode(sent)
        try:
            transaction = msgspec.convert(mapping.apply(sent), Transaction)
        except (RecordError, msgspec.ValidationError):
            out.append(ReplayRow(b"", value, f"unreadable-row-{number}", label, False, last_time))
            continue
        last_time = transaction.event_time
        out.append(
            ReplayRow(
                transaction.card_id.encode(),
                value,
                transaction.transaction_id,
                label,
                True,
                transaction.event_time,
            )
        )
    order = sorted(range(len(out)), key=lambda i: (out[i].event_time, i))
    return [out[i] for i in order]


def _label(value: Any, column: str, number: int) -> bool | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError(f"row {number + 1}: {column} must be true/false or 1/0, got {value!r}")


class ReplaySchedule:
    """When each row is due: its original pace divided by `speed`, or a constant `rate`."""

    def __init__(self, event_times: list[int], *, speed: float = 1.0, rate: float | None = None):
        if not event_times:
            raise ValueError("the replay file holds no rows")
        times = np.asarray(event_times, np.float64)
        if rate is not None:
            self._due = np.arange(len(times), dtype=np.float64) / rate
        else:
            self._due = (times - times[0]) / 1000.0 / speed
        self.total = len(times)
        #: The last row's due time, and at least a second, so that rates stay finite.
        self.duration_s = max(1.0, float(self._due[-1]))

    @property
    def mean_rate(self) -> float:
        return self.total / self.duration_s

    def due_by(self, elapsed_s: float) -> int:
        return int(np.searchsorted(self._due, elapsed_s, side="right"))

    def due_at(self, index: int) -> float:
        return float(self._due[index])

    def rate_at(self, elapsed_s: float) -> float:
        """Rows due in the second up to `elapsed_s`."""
        return float(self.due_by(elapsed_s) - self.due_by(elapsed_s - 1.0))

    def per_second(self) -> list[float]:
        counts = np.bincount(self._due.astype(np.int64), minlength=math.ceil(self.duration_s))
        return [float(c) for c in counts]
