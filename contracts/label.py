"""The label contract (docs/contracts.md): decoding and validation of one `labels` record.

A label is a confirmed outcome of one transaction (a chargeback, an analyst's review), fed back
usually days after the transaction. It names the transaction's card, terminal and event time, so
the features worker can count it on the terminal's day of the transaction without looking the
transaction up.

Decoding mirrors `contracts/transaction.py`: msgspec checks every field rule in one pass, unknown
fields are ignored, and the errors are the project's `DecodeError` (not UTF-8 JSON) and
`ValidationError` (JSON that breaks a rule). One rule involves two fields and is checked after
decoding: an outcome cannot be known before its transaction happened, so `reported_at` may
precede `event_time` by at most `MAX_REPORT_SKEW_MS` (the clocks of the payment system and the
reporting system may differ a little); an earlier one usually means swapped fields.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from contracts.decoding import decode_value
from contracts.transaction import MAX_EVENT_TIME_MS, MAX_ID_CHARS
from plumbing.errors import ValidationError

#: How far `reported_at` may precede `event_time`: clock differences between two systems, not
#: a real report (outcomes arrive hours to weeks later).
MAX_REPORT_SKEW_MS = 300_000

_Id = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)]
_EpochMs = Annotated[int, msgspec.Meta(ge=0, le=MAX_EVENT_TIME_MS)]


class Label(msgspec.Struct, frozen=True, gc=False):
    """One confirmed outcome as produced to the `labels` topic (key = card_id)."""

    transaction_id: _Id
    card_id: _Id
    #: The confirmed outcome: True for fraud, False for a legitimate transaction.
    fraud: bool
    #: The labelled transaction's event time (epoch ms).
    event_time: _EpochMs
    #: When the outcome became known (epoch ms).
    reported_at: _EpochMs
    #: The transaction's terminal; None (or empty) when it had none.
    terminal_id: Annotated[str, msgspec.Meta(max_length=MAX_ID_CHARS)] | None = None
    #: Who confirmed it, when a person did (the review console, `fraud-review`); None for
    #: chargebacks and other systems' reports.
    reviewer: Annotated[str, msgspec.Meta(max_length=MAX_ID_CHARS)] | None = None


_decoder = msgspec.json.Decoder(Label)


def decode_label(value: bytes | None) -> Label:
    """Decode and validate one label record value.

    Raises:
        DecodeError: the value is missing, not UTF-8 or not well-formed JSON.
        ValidationError: the JSON breaks a rule of the label contract.
    """
    label = decode_value(_decoder, value)
    if label.reported_at < label.event_time - MAX_REPORT_SKEW_MS:
        raise ValidationError(
            f"reported_at {label.reported_at} is before event_time {label.event_time} "
            f"(more than {MAX_REPORT_SKEW_MS} ms): an outcome cannot be known before its "
            "transaction"
        )
    return label
