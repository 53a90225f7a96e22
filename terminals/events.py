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
Its fourth element is its format (`FORMAT`, contracts/record_format.py): absent from release
0.1.0's records (format 1); a record of a newer format is refused (`decode_batch`), and the
agent skips it as any internal record it cannot read.

The combiner (`FRAUD_FEATURES_COMBINE=on`, format 2): a terminal's transactions within the
routed batch travel as one `TransactionRun` (their input partitions, offsets and event times:
three lists of numbers) instead of an event each, after the format as the record's fifth
element. The table counts a run in one loop (`TerminalState.apply_run`), not an event at a
time. A run never spans another event of its terminal (a label, or a transaction dated past the
clock's bound, which counts on a day that depends on what came before it): that event's place
is kept (`TransactionRun.events_before`), and a run keeps its transactions in the router's
order, so it counts exactly what its transactions one by one would. Each transaction keeps its
input partition and offset in the run, so a run routed again after a crash (whose batch may end
elsewhere than the first time) counts only the transactions past its terminal's position in
their partition: exactly once, as the events are (docs/state.md, "The combiner"). A terminal
with one transaction in the batch sends it as its event (cheaper to read than a run).

Pure functions: no faust, no Kafka.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Literal, NamedTuple, cast

import msgspec

from contracts.label import decode_label
from contracts.record_format import FIRST_FORMAT, check_format
from contracts.transaction import decode_transaction

#: The internal record's format (contracts/record_format.py): 2 carries transaction runs (the
#: combiner); a record without runs is written as format 1, which every release reads.
FORMAT = 2
PLAIN_FORMAT = 1
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


class TransactionRun(msgspec.Struct, array_like=True, gc=False):
    """A terminal's transactions routed together (the combiner), in the router's order: the
    table counts them in one loop, each input position once."""

    #: How many of the terminal's events in the same record come before this run.
    events_before: int
    #: Per transaction: its input partition, its offset there, and its event time (epoch ms).
    partitions: list[int]
    offsets: list[int]
    event_times: list[int]


class TerminalBatch(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """The events of one internal record, of one partition: [terminal_id, event] pairs, and
    [card_id, event] pairs (labels only; none in a record of an older worker), the router's
    marks (none in a record of an older worker: it moves no clock), its format, and
    [terminal_id, run] pairs (format 2: the combiner's)."""

    events: list[tuple[str, TerminalEvent]]
    cards: list[tuple[str, TerminalEvent]] = []
    marks: InputMarks | None = None
    #: The fourth element (`FORMAT`); absent from release 0.1.0's records (format 1).
    #: Release 0.1.0's decoder ignores an array_like struct's extra trailing elements (checked
    #: with cc13c04's `decode_batch` and the msgspec 0.23.0 it locks), so it still reads what
    #: this release writes: the format is written, not left out as the rules topic's is.
    format_version: int = FIRST_FORMAT
    #: Format 2 only. A release that reads only format 1 refuses such a record on its format
    #: (it would otherwise ignore the runs, a trailing element, and lose their counts).
    runs: list[tuple[str, TransactionRun]] = []


_encode = msgspec.json.Encoder().encode
_decoder = msgspec.json.Decoder(TerminalBatch)
#: Element of the record that holds its format.
_FORMAT_AT = TerminalBatch.__struct_fields__.index("format_version")


def partition_of(terminal_id: str, partitions: int) -> int:
    """The internal (and table) partition of a terminal: the same in every process and release
    (CRC-32 of the UTF-8 id), since the table's changelog partitions are laid out by it."""
    return zlib.crc32(terminal_id.encode()) % partitions


def batch_by_partition(
    routed: Sequence[Routed],
    partitions: int,
    marks: InputMarks | None = None,
    also: Iterable[int] = (),
    *,
    combine_to_ms: int | None = None,
) -> dict[int, bytes]:
    """The internal records of routed events: one per partition, events in their order, each
    with `marks`; and a record of the marks alone for each partition of `also` that has no
    events. With `combine_to_ms` (the clock's bound: a later time counts on the clock's day,
    which depends on the order), the transactions dated up to it of a terminal that has more
    than one go as runs (`TransactionRun`, format 2), each cut where another event of that
    terminal comes between."""
    combined: set[str] = set()
    if combine_to_ms is not None:
        counts = Counter(
            key
            for key, event, card in routed
            if not card and event.source == TRANSACTION and event.event_time <= combine_to_ms
        )
        combined = {key for key, count in counts.items() if count > 1}
    by_partition: dict[int, _Building] = {}
    for key, event, card in routed:
        partition = partition_of(key, partitions)
        batch = by_partition.get(partition)
        if batch is None:
            batch = by_partition[partition] = _Building()
        if card:
            batch.cards.append((key, event))
        elif key not in combined:
            batch.events.append((key, event))
        elif event.source == TRANSACTION and event.event_time <= cast(int, combine_to_ms):
            batch.add_transaction(key, event)
        else:
            batch.add_cut(key, event)
    for partition in also:
        if partition not in by_partition:
            by_partition[partition] = _Building()
    return {p: batch.encode(marks) for p, batch in by_partition.items()}


class _Building:
    """One internal record while the router fills it."""

    __slots__ = ("cards", "events", "events_of", "open_runs", "runs")

    def __init__(self) -> None:
        self.events: list[tuple[str, TerminalEvent]] = []
        self.cards: list[tuple[str, TerminalEvent]] = []
        self.runs: list[tuple[str, TransactionRun]] = []
        #: Per terminal with runs: its last run, while no other event of it has cut it.
        self.open_runs: dict[str, TransactionRun] = {}
        #: Per terminal with runs: its events so far.
        self.events_of: dict[str, int] = {}

    def add_transaction(self, key: str, event: TerminalEvent) -> None:
        run = self.open_runs.get(key)
        if run is None:
            run = self.open_runs[key] = TransactionRun(self.events_of.get(key, 0), [], [], [])
            self.runs.append((key, run))
        run.partitions.append(event.partition)
        run.offsets.append(event.offset)
        run.event_times.append(event.event_time)

    def add_cut(self, key: str, event: TerminalEvent) -> None:
        """An event of a terminal with runs: its later transactions count after it."""
        self.events.append((key, event))
        self.events_of[key] = self.events_of.get(key, 0) + 1
        self.open_runs.pop(key, None)

    def encode(self, marks: InputMarks | None) -> bytes:
        if self.runs:
            return _encode((self.events, self.cards, marks, FORMAT, self.runs))
        return _encode((self.events, self.cards, marks, PLAIN_FORMAT))


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
        if batch.runs:
            raise ValueError("not a batch of terminal events: runs in a record of format 1")
    for _, run in batch.runs:
        count = len(run.offsets)
        if not count or len(run.partitions) != count or len(run.event_times) != count:
            raise ValueError(
                "not a batch of terminal events: a run without transactions, or whose "
                "partitions, offsets and times differ in number"
            )
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
