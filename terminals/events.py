"""Re-keying: a transaction or a label (keyed by card) becomes an event of its terminal, and a
label also one of its card.

The input topics are keyed by `card_id`, so one terminal's records are spread over every
partition. Before anything touches the per-terminal table, the worker's routing agents turn each
record into a `TerminalEvent` and send it to the internal topic partition of its terminal
(`partition_of`: CRC-32 of the terminal id), so each terminal's events meet in one partition and
one table partition: faust's repartitioning, as `Stream.group_by` does it. Each label goes to
its card's partition too (CRC-32 of the card id), for the per-card table of confirmed frauds;
transactions do not (a card's table counts frauds only). The event carries what
the table needs and no more: which input it came from and where (for idempotent counting, see
terminals/state.py), the transaction's event time, and for a label the outcome and when it
became known. Decoding happens once, here.

The events of one routed batch of input records that go to one partition travel as one record
(`TerminalBatch`, a JSON array of [terminal_id, event] pairs, then of [card_id, event] pairs),
in the router's event-time order: one internal
record per partition and batch instead of one per input record, which is what keeps faust's
per-record cost off the table's side. The record also carries how far the router has read each
of its inputs (`InputMarks`, terminals/order.py): the table partition's clock moves only with the
minimum over the inputs (terminals/state.py), never with whichever input was read first.
Its last element is its format (`FORMAT`, contracts/record_format.py): absent from release
0.1.0's records (format 1); a record of a newer format is refused (`decode_batch`), and the
agent skips it as any internal record it cannot read.

Pure functions: no faust, no Kafka.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Literal, NamedTuple

import msgspec

from contracts.label import decode_label
from contracts.record_format import FIRST_FORMAT, check_format
from contracts.transaction import decode_transaction

#: The internal record's format (contracts/record_format.py).
FORMAT = 1
#: How the format's refusals name the record.
RECORD = "terminal-events"
#: Who reads the worker's own records: a format is read by one release before another writes it.
WORKERS = "every features worker, with a release that reads the format before one writes it"

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
    #: Labels: the confirmed outcome, when it became known (epoch ms), and the labelled
    #: transaction (a later label of the same transaction replaces it).
    fraud: bool = False
    reported_at: int = 0
    transaction_id: str = ""


class Routed(NamedTuple):
    """A record's terminal or card (the new key) and its event (the new value)."""

    key: str
    event: TerminalEvent
    #: The event of a card (for its confirmed frauds), not of a terminal.
    card: bool = False


class InputMarks(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """How far one router has read the inputs it owns, sent with its internal records: the
    table partition's clock is the minimum over every input partition (terminals/state.py)."""

    #: Partitions of the transactions and of the labels topic: every one of them must have
    #: been heard of before the clock moves (another replica's router may own some).
    partitions: tuple[int, int]
    #: Per input partition the router owns ("t3": transactions partition 3, "l0": labels
    #: partition 0): the time (epoch ms; a label's report time) that every record it will still
    #: route from there has reached, -1 while it has read none; and whether the partition is
    #: idle (nothing queued for FRAUD_FEATURES_INPUT_WAIT_MS): then it holds no clock back.
    reached: dict[str, tuple[int, bool]]


class TerminalBatch(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """The events of one internal record, of one partition: [terminal_id, event] pairs, and
    [card_id, event] pairs (labels only; none in a record of an older worker), the router's
    marks (none in a record of an older worker: it moves no clock), and its format."""

    events: list[tuple[str, TerminalEvent]]
    cards: list[tuple[str, TerminalEvent]] = []
    marks: InputMarks | None = None
    #: Written as the last element (`FORMAT`); absent from release 0.1.0's records (format 1).
    #: Release 0.1.0's decoder ignores an array_like struct's extra trailing elements (checked
    #: with cc13c04's `decode_batch` and the msgspec 0.23.0 it locks), so it still reads what
    #: this release writes: the format is written, not left out as the rules topic's is.
    format_version: int = FIRST_FORMAT


_encode = msgspec.json.Encoder().encode
_decoder = msgspec.json.Decoder(TerminalBatch)
#: Element of the record that holds its format.
_FORMAT_AT = len(TerminalBatch.__struct_fields__) - 1


def partition_of(terminal_id: str, partitions: int) -> int:
    """The internal (and table) partition of a terminal: the same in every process and release
    (CRC-32 of the UTF-8 id), since the table's changelog partitions are laid out by it."""
    return zlib.crc32(terminal_id.encode()) % partitions


def batch_by_partition(
    routed: Iterable[Routed],
    partitions: int,
    marks: InputMarks | None = None,
    also: Iterable[int] = (),
) -> dict[int, bytes]:
    """The internal records of routed events: one per partition, events in their order, each
    with `marks`; and a record of the marks alone for each partition of `also` that has no
    events."""
    by_partition: dict[int, TerminalBatch] = {}
    for key, event, card in routed:
        partition = partition_of(key, partitions)
        batch = by_partition.get(partition)
        if batch is None:
            batch = by_partition[partition] = TerminalBatch([], [], marks, FORMAT)
        (batch.cards if card else batch.events).append((key, event))
    for partition in also:
        if partition not in by_partition:
            by_partition[partition] = TerminalBatch([], [], marks, FORMAT)
    return {p: _encode(batch) for p, batch in by_partition.items()}


def decode_batch(value: bytes | None) -> TerminalBatch:
    """Read an internal record back; ValueError if it is not one (never expected), or if it is
    of a newer format than FORMAT (a newer release wrote it) or its format is not a number."""
    try:
        batch = _decoder.decode(value or b"")
    except msgspec.MsgspecError as exc:
        _check_format_of_unreadable(value)
        raise ValueError(f"not a batch of terminal events: {exc}") from exc
    if batch.format_version != FORMAT:  # the common case costs one comparison
        check_format(batch.format_version, RECORD, FORMAT, WORKERS)
    return batch


def _check_format_of_unreadable(value: bytes | None) -> None:
    """A record this release cannot decode may be a newer format's, whose elements mean what
    this one does not know: then the error names its format."""
    try:
        raw = msgspec.json.decode(value or b"")
    except msgspec.MsgspecError:
        return
    if isinstance(raw, list) and len(raw) > _FORMAT_AT:
        check_format(raw[_FORMAT_AT], RECORD, FORMAT, WORKERS)


def route_transaction(value: bytes | None, partition: int, offset: int) -> Routed | None:
    """The terminal event of a transaction record, or None when it names no terminal.

    Raises DecodeError or ValidationError (contracts/transaction.py) for an invalid record.
    """
    return read_transaction(value, partition, offset)[1]


def read_transaction(value: bytes | None, partition: int, offset: int) -> tuple[int, Routed | None]:
    """A transaction record's event time, and its terminal event (None: it names no terminal).

    Raises DecodeError or ValidationError (contracts/transaction.py) for an invalid record.
    """
    transaction = decode_transaction(value)
    if not transaction.terminal_id:
        return transaction.event_time, None
    event = TerminalEvent(TRANSACTION, partition, offset, transaction.event_time)
    return transaction.event_time, Routed(transaction.terminal_id, event)


def route_label(value: bytes | None, partition: int, offset: int) -> list[Routed]:
    """The events of a label record: its terminal's, when it names one, and its card's.

    Raises DecodeError or ValidationError (contracts/label.py) for an invalid record.
    """
    label = decode_label(value)
    event = TerminalEvent(
        LABEL,
        partition,
        offset,
        label.event_time,
        label.fraud,
        label.reported_at,
        label.transaction_id,
    )
    card = Routed(label.card_id, event, card=True)
    return [Routed(label.terminal_id, event), card] if label.terminal_id else [card]
