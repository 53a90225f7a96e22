"""Re-keying: a transaction or a label (keyed by card) becomes an event of its terminal.

The input topics are keyed by `card_id`, so one terminal's records are spread over every
partition. Before anything touches the per-terminal table, the worker's routing agents turn each
record into a `TerminalEvent` and send it to one internal topic keyed by `terminal_id` (faust's
repartitioning, as `Stream.group_by` does it), so each terminal's events meet in one partition
and one table partition. The event carries what the table needs and no more: which input it came
from and where (for idempotent counting, see terminals/state.py), the transaction's event time,
and for a label the outcome and when it became known. Decoding happens once, here.

Pure functions: no faust, no Kafka.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import msgspec

from contracts.label import decode_label
from contracts.transaction import decode_transaction

TRANSACTION: Literal["t"] = "t"
LABEL: Literal["l"] = "l"


class TerminalEvent(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One record of a terminal, as the internal re-keyed topic carries it (a JSON array)."""

    #: TRANSACTION or LABEL.
    source: Literal["t", "l"]
    #: Partition and offset of the record in its input topic.
    partition: int
    offset: int
    #: The transaction's event time (epoch ms).
    event_time: int
    #: Labels: the confirmed outcome, and when it became known (epoch ms).
    fraud: bool = False
    reported_at: int = 0


class Routed(NamedTuple):
    """A record's terminal (the new key) and its event (the new value)."""

    terminal_id: str
    event: bytes
    #: A label's outcome (False for a transaction).
    fraud: bool = False


_encode = msgspec.json.Encoder().encode
_decoder = msgspec.json.Decoder(TerminalEvent)


def route_transaction(value: bytes | None, partition: int, offset: int) -> Routed | None:
    """The terminal event of a transaction record, or None when it names no terminal.

    Raises DecodeError or ValidationError (contracts/transaction.py) for an invalid record.
    """
    transaction = decode_transaction(value)
    if not transaction.terminal_id:
        return None
    event = TerminalEvent(TRANSACTION, partition, offset, transaction.event_time)
    return Routed(transaction.terminal_id, _encode(event))


def route_label(value: bytes | None, partition: int, offset: int) -> Routed | None:
    """The terminal event of a label record, or None when it names no terminal.

    Raises DecodeError or ValidationError (contracts/label.py) for an invalid record.
    """
    label = decode_label(value)
    if not label.terminal_id:
        return None
    event = TerminalEvent(
        LABEL, partition, offset, label.event_time, label.fraud, label.reported_at
    )
    return Routed(label.terminal_id, _encode(event), label.fraud)


def decode_event(value: bytes | None) -> TerminalEvent:
    """Read an internal event back; ValueError if it is not one (never expected)."""
    try:
        return _decoder.decode(value or b"")
    except msgspec.MsgspecError as exc:
        raise ValueError(f"not a terminal event: {exc}") from exc
