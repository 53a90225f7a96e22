"""The format numbers of the records the project writes for itself and reads back
(contracts/record_format.py): each writer says its format (the rules topic's writers leave it
out while it is 1); each reader reads release 0.1.0's records (no format field), and refuses a
newer format or a field that is not a format number, so a replica of an older release never
reads a newer writer's fields as its own. Release 0.1.0's own decoders (as cc13c04 declares
them) read what this release writes, for a rollback."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import msgspec
import numpy as np
import pytest
from confluent_kafka import Message
from prometheus_client import CollectorRegistry

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
from plumbing.errors import RulesUpdateError
from scorer import rule_sources
from scorer.rule_expressions import RulesError
from scorer.rules import Rules
from stream.metrics import ServiceMetrics
from stream.rules_table import RulesTable
from terminals import events
from terminals import state as state_module
from terminals.config import FeaturesSettings
from terminals.entity_table import UNREADABLE, EntityTable
from terminals.events import InputMarks, Routed, TerminalEvent, batch_by_partition, decode_batch
from terminals.metrics import WorkerMetrics
from terminals.state import TerminalState
from terminals.table_clock import TerminalClock
from terminals.table_progress import TableClocks
from tests.unit.fakes import message as fake_message


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


# ── the features worker's internal records (terminals/events.py) ───────────────────────────
#: What release 0.1.0's router wrote (cc13c04's `batch_by_partition`): a transaction and a fraud
#: label of terminal T1, the label again for card C1, and the router's marks; no format.
INTERNAL_0_1_0 = (
    b'[[["T1",["t",3,41,1700000000000,false,0,""]],'
    b'["T1",["l",0,7,1700000000000,true,1700000100000,"tx-1"]]],'
    b'[["C1",["l",0,7,1700000000000,true,1700000100000,"tx-1"]]],'
    b'[[4,1],{"t3":[1700000000000,false],"l0":[1700000100000,true]}]]'
)
TX = TerminalEvent("t", 3, 41, 1_700_000_000_000)
FRAUD = TerminalEvent("l", 0, 7, 1_700_000_000_000, True, 1_700_000_100_000, "tx-1")
MARKS = InputMarks((4, 1), {"t3": (1_700_000_000_000, False), "l0": (1_700_000_100_000, True)})
#: What INTERNAL_0_1_0 holds: events, cards, marks.
INTERNAL_HOLDS = ([("T1", TX), ("T1", FRAUD)], [("C1", FRAUD)], MARKS)


class Batch010(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """`TerminalBatch` as release 0.1.0 declares it (cc13c04), to read what this one writes."""

    events: list[tuple[str, TerminalEvent]]
    cards: list[tuple[str, TerminalEvent]] = []
    marks: InputMarks | None = None


def internal_value() -> bytes:
    routed = [Routed("T1", TX), Routed("T1", FRAUD), Routed("C1", FRAUD, card=True)]
    return batch_by_partition(routed, 1, MARKS)[0]


def test_the_router_writes_its_format_last_and_0_1_0_and_this_release_read_it() -> None:
    written = internal_value()
    assert msgspec.json.decode(written)[-1] == events.PLAIN_FORMAT, "no runs: format 1"
    assert written == INTERNAL_0_1_0[:-1] + b",1]", "0.1.0's record and the format"
    batch = decode_batch(written)
    assert (batch.events, batch.cards, batch.marks) == INTERNAL_HOLDS
    # A rollback: 0.1.0's decoder ignores the trailing element and reads the rest as written.
    old = msgspec.json.decode(written, type=Batch010)
    assert (old.events, old.cards, old.marks) == (batch.events, batch.cards, batch.marks)


def test_an_internal_record_of_0_1_0_reads_as_format_1() -> None:
    batch = decode_batch(INTERNAL_0_1_0)
    assert batch.format_version == 1
    assert (batch.events, batch.cards, batch.marks) == INTERNAL_HOLDS


@pytest.mark.parametrize(
    "value",
    [
        b"[[],[],null,3]",
        INTERNAL_0_1_0[:-1] + b",3]",
        # What a newer format changed may not decode here: its format is still named.
        b'[[["T1",{"source":"t"}]],[],null,3]',
    ],
)
def test_an_internal_record_of_a_newer_format_is_refused_naming_it(value: bytes) -> None:
    with pytest.raises(ValueError, match="terminal-events record of format 3, newer"):
        decode_batch(value)


@pytest.mark.parametrize("found", [b'"1"', b"1.5", b"true", b"null", b"0", b"-1", b"[1]"])
def test_an_internal_record_whose_format_is_not_a_number_is_refused(found: bytes) -> None:
    with pytest.raises(ValueError, match="not a format number"):
        decode_batch(b"[[],[],null," + found + b"]")


# ── the features worker's table values (terminals/state.py), both tables' changelogs ───────
#: What release 0.1.0 wrote to the table (cc13c04's `TerminalState.to_bytes`) for the entry of
#: T1 above once both its events were applied and published: no format.
TABLE_0_1_0 = (
    b'{"as_of_day":19675,"positions":{"t3":41,"l0":7},"risk":{"days":[-1,-1,-1,-1,-1,-1,-1'
    b",-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,19675,-1,-1,-1,-1"
    b',-1,-1,-1,-1],"counts":[[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],'
    b"[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],"
    b"[0,0],[0,0],[0,0],[0,0],[0,0],[1,1],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0]]"
    b'},"published":[19675.0,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0,-'
    b"1.0,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0,"
    b"19675.0,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,"
    b"0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,"
    b"0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,"
    b"0.0,0.0,0.0,0.0,0.0,0.0,0.0,1.0,1.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,"
    b'0.0,0.0,0.0,0.0],"labels":{"tx-1":[19675,true]}}'
)


class Stored010(msgspec.Struct, frozen=True):
    """The table value as release 0.1.0 declares it (cc13c04's `_Stored`)."""

    as_of_day: int
    positions: dict[str, int]
    risk: msgspec.Raw
    published: list[float] | None = None
    labels: dict[str, tuple[int, bool]] = {}


def table_entry() -> TerminalState:
    clock = TerminalClock(86_400_000)
    clock.follow(InputMarks((4, 1), {"t0": (1_700_000_200_000, False), "l0": (0, True)}))
    state = TerminalState()
    state.apply(TX, clock)
    state.apply(FRAUD, clock)
    state.take_publication()
    return state


def with_table_format(value: bytes, found: bytes) -> bytes:
    assert value.endswith(b"}")
    return value[:-1] + b',"format_version":' + found + b"}"


def test_the_worker_writes_its_table_values_format_and_0_1_0_and_this_release_read_it() -> None:
    written = table_entry().to_bytes()
    assert msgspec.json.decode(written)[FORMAT_FIELD] == state_module.FORMAT
    assert written == with_table_format(TABLE_0_1_0, b"1"), "0.1.0's value and the format"
    copy = TerminalState.from_bytes(written)
    assert copy.to_bytes() == written
    # A rollback: 0.1.0's decoder ignores the field it does not know.
    old = msgspec.json.decode(written, type=Stored010)
    assert msgspec.json.encode(old) == TABLE_0_1_0


def test_a_table_value_of_0_1_0_reads_as_format_1() -> None:
    state = TerminalState.from_bytes(TABLE_0_1_0)
    assert (state.as_of_day, state.positions, state.labels) == (
        19675,
        {"t3": 41, "l0": 7},
        {"tx-1": (19675, True)},
    )
    days, counts = state.risk.buckets()
    assert days[29] == 19675 and counts[29].tolist() == [1, 1]
    assert not state.unpublished(), "what it published is known"
    assert state.to_bytes() == with_table_format(TABLE_0_1_0, b"1")


@pytest.mark.parametrize(
    "value",
    [
        with_table_format(TABLE_0_1_0, b"2"),
        # What a newer format changed may not decode here: its format is still named.
        b'{"as_of_day":"today","format_version":2}',
    ],
)
def test_a_table_value_of_a_newer_format_is_refused_naming_it(value: bytes) -> None:
    with pytest.raises(ValueError, match="features-worker table record of format 2, newer"):
        TerminalState.from_bytes(value)


@pytest.mark.parametrize("found", [b'"1"', b"1.5", b"true", b"null", b"0", b"-1"])
def test_a_table_value_whose_format_is_not_a_number_is_refused(found: bytes) -> None:
    with pytest.raises(ValueError, match="not a format number"):
        TerminalState.from_bytes(with_table_format(TABLE_0_1_0, found))


@pytest.mark.parametrize("card", [False, True], ids=["terminals", "cards"])
def test_an_entry_of_a_newer_format_is_left_as_it_is_and_its_events_counted_unreadable(
    card: bool, caplog: pytest.LogCaptureFixture
) -> None:
    newer = with_table_format(TABLE_0_1_0, b"2")
    table = {"T1": newer, "T2": TABLE_0_1_0}
    config = FeaturesSettings(table_partitions=1)
    metrics = WorkerMetrics(CollectorRegistry())
    entities = EntityTable(cast(Any, None), table, config, metrics, TableClocks(config), card=card)
    later = TerminalEvent("t", 3, 42, 1_700_000_000_000)
    entities.apply(0, [("T1", later), ("T1", later), ("T2", later)])
    entities.write(0)
    assert table["T1"] == newer, "never overwritten: it holds what a newer release counted"
    assert TerminalState.from_bytes(table["T2"]).positions["t3"] == 42, "the others go on"
    if card:
        name, sample = "fraud_features_card_events_total", {"result": UNREADABLE}
    else:
        name = "fraud_features_terminal_events_total"
        sample = {"source": "transaction", "result": UNREADABLE}
    assert metrics.registry.get_sample_value(name, sample) == 2
    assert "features-worker table record of format 2, newer" in caplog.text


# ── the rules topic (scorer/rule_sources.py), written by operators ─────────────────────────
#: Records as release 0.1.0 reads them and operators write them (docs/rules.md): no format.
RULES_0_1_0 = [
    (b"rule:big-burst", b'{"when": "amount > 5000 and card_tx_1h >= 3", "then": "review"}'),
    (
        b"override:ecom",
        b'{"channel": "ecom", "mcc_family": "digital", "review": 0.3, "decline": 0.6}',
    ),
    (b"deny:card:4000:0012", b'{"reason": "chargeback"}'),
    (b"allow:merchant:m-1", b"{}"),
]
RULE_KEYS = [key.decode() for key, _ in RULES_0_1_0]
#: The records whose value is read: rules and overrides (a deny or allow value is free-form).
READ_RULES = RULES_0_1_0[:2]
READ_RULE_KEYS = RULE_KEYS[:2]


class RuleSpec010(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A rule as release 0.1.0 declares it (cc13c04's `_RuleSpec`)."""

    when: str
    then: str


def with_rules_format(value: bytes, found: bytes) -> bytes:
    return value[:-1] + (b", " if value != b"{}" else b"") + b'"format_version": ' + found + b"}"


@pytest.mark.parametrize(("key", "value"), RULES_0_1_0, ids=RULE_KEYS)
def test_a_rules_record_without_a_format_or_of_format_1_applies(key: bytes, value: bytes) -> None:
    assert rule_sources.FORMAT == 1
    rules = Rules.EMPTY.with_update(key.decode(), value)
    assert len(rules) == 1
    said = Rules.EMPTY.with_update(key.decode(), with_rules_format(value, b"1"))
    assert said.summary() == rules.summary()


def test_writers_leave_the_format_out_while_it_is_1_since_0_1_0_refuses_it() -> None:
    _, value = RULES_0_1_0[0]
    msgspec.json.decode(value, type=RuleSpec010)
    with pytest.raises(msgspec.ValidationError, match="unknown field `format_version`"):
        msgspec.json.decode(with_rules_format(value, b"1"), type=RuleSpec010)


@pytest.mark.parametrize(("key", "value"), READ_RULES, ids=READ_RULE_KEYS)
def test_a_rules_record_of_a_newer_format_is_refused_naming_it(key: bytes, value: bytes) -> None:
    for newer in (with_rules_format(value, b"2"), with_rules_format(value, b'2, "unless": "x"')):
        with pytest.raises(RulesError, match="rules-topic record of format 2, newer"):
            Rules.EMPTY.with_update(key.decode(), newer)


@pytest.mark.parametrize(("key", "value"), RULES_0_1_0[2:], ids=RULE_KEYS[2:])
@pytest.mark.parametrize("found", [b"2", b'"2"', b"null"])
def test_a_list_entry_of_any_format_is_listed_as_0_1_0_lists_it(
    key: bytes, value: bytes, found: bytes
) -> None:
    """Neither release reads a deny or allow value beyond its being a JSON object: whether the
    id is listed never depends on its format (docs/contracts.md)."""
    listed = Rules.EMPTY.with_update(key.decode(), with_rules_format(value, found))
    assert listed.summary() == Rules.EMPTY.with_update(key.decode(), value).summary()
    assert len(listed) == 1


@pytest.mark.parametrize(("key", "value"), READ_RULES, ids=READ_RULE_KEYS)
@pytest.mark.parametrize("found", [b'"1"', b"1.5", b"true", b"null", b"0", b"-1"])
def test_a_rules_record_whose_format_is_not_a_number_is_refused(
    key: bytes, value: bytes, found: bytes
) -> None:
    with pytest.raises(RulesError, match="not a format number"):
        Rules.EMPTY.with_update(key.decode(), with_rules_format(value, found))


class RulesReader(RulesTable):
    """The rules table of a replica whose reader is never started: the test hands it records
    as the reader would (the first `catch_up` of partition 0 are the catch-up at start)."""

    def __init__(self, catch_up: int) -> None:
        self.registry = CollectorRegistry()
        super().__init__(Rules.EMPTY, ServiceMetrics(self.registry), kafka={}, topic="rules")
        assert self._reader is not None
        self._reader._catch_up_ends = {0: catch_up}
        self.letters: list[str] = []
        self.offset = 0

    def _dead_letter(self, message: Message, error: RulesUpdateError, where: str) -> None:
        self.letters.append(str(error))

    def read(self, key: bytes, value: bytes) -> None:
        assert self._reader is not None
        self._reader._apply(fake_message(self.offset, value, topic="rules", key=key))
        self.offset += 1

    def counted(self, result: str) -> float:
        found = self.registry.get_sample_value("fraud_rules_updates_total", {"result": result})
        return found or 0.0


@pytest.mark.parametrize("at_start", [True, False], ids=["at-start", "live"])
def test_the_rules_reader_refuses_a_newer_format_and_keeps_the_rules_in_force(
    at_start: bool,
) -> None:
    reader = RulesReader(catch_up=2 if at_start else 0)
    key, value = RULES_0_1_0[0]
    reader.read(key, value)
    in_force = reader.current
    reader.read(key, with_rules_format(b'{"when": "amount > 0", "then": "decline"}', b"2"))
    assert reader.current is in_force, "fails closed: nothing of it applied"
    if at_start:
        assert reader.counted("refused_at_start") == 1 and reader.letters == []
    else:
        assert reader.counted("rejected") == 1
        assert len(reader.letters) == 1 and "of format 2, newer" in reader.letters[0]
