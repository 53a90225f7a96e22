"""The transaction contract (docs/contracts.md): decoding and validation of one input record.

msgspec decodes and checks every rule in a single pass in C, so an invalid record costs no more
than a valid one. Unknown fields are ignored for forward compatibility.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from contracts.decoding import decode_value

MAX_ID_CHARS = 64
MAX_AMOUNT = 1_000_000.0
#: 9999-12-31T23:59:59.999Z. Event times are epoch milliseconds in [0, this]: they fit int64
#: columns, float64 exactly (< 2**53) and every calendar library; anything else is invalid.
MAX_EVENT_TIME_MS = 253_402_300_799_999
#: The widest offset of a local clock from UTC, in minutes (ISO 8601 allows +/-23:59; real time
#: zones span -12:00 to +14:00).
MAX_UTC_OFFSET_MINUTES = 1_439

_Id = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)]


class Transaction(msgspec.Struct, frozen=True, gc=False):
    """One card transaction as produced to the `transactions` topic."""

    transaction_id: _Id
    card_id: _Id
    merchant_id: _Id
    # gt=0 and le=MAX_AMOUNT also reject NaN and infinities (JSON cannot carry them, and
    # an overflowing literal such as 1e999 fails the bound).
    amount: Annotated[float, msgspec.Meta(gt=0, le=MAX_AMOUNT)]
    # `$` also matches before a final newline ("EUR\n"): the length bound closes that gap.
    currency: Annotated[str, msgspec.Meta(pattern="^[A-Z]{3}$", max_length=3)]
    mcc: Annotated[int, msgspec.Meta(ge=0, le=9999)]
    country: Annotated[str, msgspec.Meta(pattern="^[A-Z]{2}$", max_length=2)]
    channel: Literal["pos", "ecom", "atm"]
    card_present: bool
    event_time: Annotated[int, msgspec.Meta(ge=0, le=MAX_EVENT_TIME_MS)]
    terminal_id: Annotated[str, msgspec.Meta(max_length=MAX_ID_CHARS)] | None = None
    #: The local clock's offset from UTC where the transaction happened, in minutes (east of
    #: Greenwich positive): hour-of-day features read local time when it is given, UTC
    #: otherwise. A mapped ISO-8601 time sets it from its own offset.
    utc_offset_minutes: (
        Annotated[int, msgspec.Meta(ge=-MAX_UTC_OFFSET_MINUTES, le=MAX_UTC_OFFSET_MINUTES)] | None
    ) = None


_decoder = msgspec.json.Decoder(Transaction)


def decode_transaction(value: bytes | None) -> Transaction:
    """Decode and validate one record value.

    Raises:
        DecodeError: the value is missing, not UTF-8 or not well-formed JSON.
        ValidationError: the JSON breaks a rule of the transaction contract.
    """
    return decode_value(_decoder, value)
