"""A batch of decoded transactions as columns: the one per-record step before any feature.

`TransactionColumns.from_transactions` reads each decoded transaction once into numpy arrays (and
the ids into lists, which the per-card and per-terminal state looks up by name). Every feature,
the per-card history and the terminal risk work on these columns, vectorised.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

#: Amounts below this are typical of card-testing probes.
TINY_AMOUNT = 2.0


class TransactionFields(Protocol):
    """The fields of a decoded transaction that features read."""

    @property
    def card_id(self) -> str: ...
    @property
    def merchant_id(self) -> str: ...
    @property
    def terminal_id(self) -> str | None: ...
    @property
    def amount(self) -> float: ...
    @property
    def currency(self) -> str: ...
    @property
    def mcc(self) -> int: ...
    @property
    def country(self) -> str: ...
    @property
    def channel(self) -> str: ...
    @property
    def card_present(self) -> bool: ...
    @property
    def event_time(self) -> int: ...
    @property
    def utc_offset_minutes(self) -> int | None: ...


class TransactionColumns(NamedTuple):
    """A batch of transactions as columns (one numpy array per field; ids as lists)."""

    amount: npt.NDArray[np.float64]
    currency: npt.NDArray[np.str_]  # 3 upper-case letters
    mcc: npt.NDArray[np.int64]
    country: npt.NDArray[np.str_]  # 2 upper-case letters
    channel: npt.NDArray[np.str_]
    card_present: npt.NDArray[np.bool_]
    event_time: npt.NDArray[np.int64]
    card_id: Sequence[str]
    merchant_id: Sequence[str]
    #: None where the transaction names no terminal.
    terminal_id: Sequence[str | None]
    #: Each local clock's offset from UTC in minutes (0 where not given); None: all UTC.
    utc_offset_minutes: npt.NDArray[np.int64] | None = None

    @classmethod
    def from_transactions(cls, batch: Sequence[TransactionFields]) -> TransactionColumns:
        """Read decoded transactions into columns (the only per-record step)."""
        n = len(batch)
        return cls(
            amount=np.fromiter((t.amount for t in batch), np.float64, n),
            currency=np.array([t.currency for t in batch], dtype="<U3"),
            mcc=np.fromiter((t.mcc for t in batch), np.int64, n),
            country=np.array([t.country for t in batch], dtype="<U2"),
            channel=np.array([t.channel for t in batch], dtype="<U4"),
            card_present=np.fromiter((t.card_present for t in batch), np.bool_, n),
            event_time=np.fromiter((t.event_time for t in batch), np.int64, n),
            card_id=[t.card_id for t in batch],
            merchant_id=[t.merchant_id for t in batch],
            terminal_id=[t.terminal_id for t in batch],
            utc_offset_minutes=_offsets([t.utc_offset_minutes for t in batch]),
        )

    @classmethod
    def concat(cls, parts: Sequence[TransactionColumns]) -> TransactionColumns:
        """The rows of `parts`, one after the other."""
        columns: list[Any] = []
        for name in cls._fields:
            pieces = [getattr(part, name) for part in parts]
            if name == "utc_offset_minutes":
                given = any(piece is not None for piece in pieces)
                columns.append(
                    np.concatenate(
                        [
                            np.zeros(len(part.event_time), np.int64) if piece is None else piece
                            for part, piece in zip(parts, pieces, strict=True)
                        ]
                    )
                    if given
                    else None
                )
            elif isinstance(pieces[0], np.ndarray):
                columns.append(np.concatenate(pieces))
            else:
                columns.append([x for piece in pieces for x in piece])
        return cls._make(columns)

    def local_time(self) -> npt.NDArray[np.int64]:
        """Event times (epoch ms) shifted to each local clock where its offset is given: what
        hour-of-day and weekday read."""
        if self.utc_offset_minutes is None:
            return self.event_time
        shifted: npt.NDArray[np.int64] = self.event_time + self.utc_offset_minutes * 60_000
        return shifted

    def rows(self, index: npt.NDArray[np.int64]) -> TransactionColumns:
        """The columns of the rows at `index`, in that order."""
        listed = index.tolist()
        return TransactionColumns._make(
            column[index]
            if isinstance(column, np.ndarray)
            else None
            if column is None
            else [column[i] for i in listed]
            for column in self
        )


def _offsets(given: list[int | None]) -> npt.NDArray[np.int64] | None:
    """The offsets as a column, 0 where not given; None when none is (the usual case)."""
    if not any(offset is not None for offset in given):
        return None
    return np.array([0 if offset is None else offset for offset in given], np.int64)


def letters_index(codes: npt.NDArray[np.str_], width: int) -> npt.NDArray[np.int64]:
    """Map fixed-width upper-case codes ("US", "EUR") to 0 … 26**width - 1, vectorised.

    Characters outside A-Z are clipped into that range, so no input can index out of bounds.
    """
    letters = codes.astype(f"<U{width}").view(np.uint32).reshape(-1, width).astype(np.int64) - 65
    letters = np.clip(letters, 0, 25)
    index = np.zeros(len(codes), np.int64)
    for position in range(width):
        index = index * 26 + letters[:, position]
    return index
