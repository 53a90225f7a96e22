"""The budget of the control inputs (issue 43, "a budget for every input surface"): rules-topic
records, rules files, and terminal-risk and card-frauds records as a corrupt or hostile
producer would write them. Each drives the real decoding path (the rules table's `_apply` on a
Kafka message, `Rules.load` on a file, the worker tables' `_apply`) and asserts the input is
used or refused (dead-lettered, ConfigurationError, skipped and counted), never crashes, and
stays under its budget (docs/threat-model.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import Message
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from contracts.card_frauds import encode_card_frauds
from contracts.event_time import EventClock
from contracts.terminal_risk import (
    BUCKET_DAYS,
    MS_PER_DAY,
    NUM_TERMINAL_FEATURES,
    TERMINAL_FEATURE_NAMES,
    encode_terminal_risk,
)
from contracts.worker_progress import MAX_RECORD_BYTES as MAX_PROGRESS_BYTES
from contracts.worker_progress import decode_progress
from plumbing.errors import ConfigurationError, RulesUpdateError
from scorer.rule_sources import MAX_NAMED_ENTRIES, MAX_UPDATE_BYTES
from scorer.rules import Rules
from stream.metrics import ServiceMetrics
from stream.rules_table import RulesTable
from stream.worker_tables import MAX_RECORD_BYTES, CardFraudsTable, TerminalRiskTable
from tests.support.budget import MIB, Budget, within
from tests.unit.fakes import message

#: A rules-topic record: refused by its size, or parsed and compiled (an AST of at most 16 KiB
#: of source), in well under a second.
RULES_RECORD = Budget(peak_bytes=8 * MIB, seconds=2.0)
#: A rules file of up to a few hundred KB, parsed whole.
RULES_FILE = Budget(peak_bytes=16 * MIB, seconds=5.0)
#: A worker-table record: at most MAX_RECORD_BYTES parsed.
TABLE_RECORD = Budget(peak_bytes=2 * MIB, seconds=1.0)
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- rules-topic records -------------------------------------------------------------------------

_NAMES = ["amount", "mcc", "country", "currency", "channel", "card_present", "hour", "nobody"]
_OPERATORS = ["<", ">=", "==", "!=", "in", "not in", "**", "@", "is", "//", "%", "<<", "and"]


def _member(draw: Any) -> str:
    return draw(
        st.one_of(
            st.integers(-(10**30), 10**30).map(str),
            st.text(max_size=40).map(repr),
            st.just("'" + "Z" * 20_000 + "'"),
            st.sampled_from(["True", "None", "...", "[1]", "x"]),
        )
    )


@st.composite
def expressions(draw: Any) -> str:
    """`when` texts: huge member lists, long strings, deep nesting, unknown operators, code."""
    kind = draw(st.sampled_from(["members", "nested", "chain", "operator", "code", "text"]))
    name = draw(st.sampled_from(_NAMES))
    if kind == "members":
        count = draw(st.sampled_from([0, 1, 17, 999, 1_000, 1_001, 3_000]))
        members = [_member(draw) for _ in range(min(count, 5))] * max(1, count // 5)
        return f"{name} in [{', '.join(members)}]"
    if kind == "nested":
        depth = draw(st.integers(1, 5_000))
        return "(" * depth + f"{name} > 1" + ")" * depth
    if kind == "chain":
        terms = draw(st.integers(1, 3_000))
        return " or ".join([f"{name} > {draw(st.integers(0, 9))}"] * terms)
    if kind == "operator":
        op = draw(st.sampled_from(_OPERATORS))
        return f"{name} {op} {draw(st.sampled_from(['1', repr('NG'), '[1, 2]', name]))}"
    if kind == "code":
        return draw(
            st.sampled_from(
                [
                    "__import__('os').system('true')",
                    "(lambda: 1)()",
                    "[x for x in range(10**9)]",
                    "amount.__class__",
                    "f'{amount}' == 'x'",
                    "9" * 10_000 + " > amount",
                    "1e308 * 1e308 > amount",
                ]
            )
        )
    return draw(st.text(max_size=300))


def _json(value: object) -> bytes:
    return json.dumps(value).encode()


@st.composite
def rules_records(draw: Any) -> tuple[bytes | None, bytes | None]:
    kind = draw(st.sampled_from(["rule", "override", "list", "bytes", "nesting", "huge"]))
    if kind == "rule":
        then = draw(st.sampled_from(["review", "decline", "approve", "", "x" * 100]))
        return b"rule:r", _json({"when": draw(expressions()), "then": then})
    if kind == "override":
        fields = draw(
            st.dictionaries(
                st.sampled_from(["channel", "mcc_family", "country", "review", "decline", "x"]),
                st.one_of(st.floats(allow_nan=True), st.text(max_size=30), st.integers()),
            )
        )
        return b"override:o", json.dumps(fields, allow_nan=True).encode()
    if kind == "list":
        action = draw(st.sampled_from(["deny", "allow", "block"]))
        entry = draw(st.one_of(st.text(max_size=80), st.just("c" * 10_000)))
        key = f"{action}:{draw(st.sampled_from(['card', 'merchant', 'terminal', '']))}:{entry}"
        value = draw(st.one_of(st.none(), st.just(b"{}"), st.binary(max_size=100)))
        return key.encode("utf-8", "surrogatepass"), value
    if kind == "nesting":
        depth = draw(st.integers(1, 20_000))
        return b"deny:card:c-1", b'{"a":' * depth + b"1" + b"}" * depth
    if kind == "huge":
        return b"rule:r", b'{"when": "' + b"a" * (MAX_UPDATE_BYTES * 4) + b'"}'
    key = draw(st.one_of(st.none(), st.binary(max_size=600)))
    return key, draw(st.one_of(st.none(), st.binary(max_size=MAX_UPDATE_BYTES + 100)))


class _Letters(RulesTable):
    """The rules table, its dead letters kept instead of produced."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        super().__init__(Rules.EMPTY, ServiceMetrics(self.registry))
        self.letters: list[RulesUpdateError] = []

    def _dead_letter(self, message: Message, error: RulesUpdateError, where: str) -> None:
        self.letters.append(error)

    def counted(self, result: str) -> float:
        sample = {"result": result}
        return self.registry.get_sample_value("fraud_rules_updates_total", sample) or 0.0


_AMPLIFIED = json.dumps(
    {"when": "country in [" + ", ".join(["'NG'"] * 1_999 + ["'" + "Z" * 20_000 + "'"]) + "]"}
).encode()
_MEMBERS = json.dumps({"when": "mcc in [" + ", ".join(["5411"] * 3_000) + "]", "then": "review"})


@PROPERTY
@given(record=rules_records())
@example(record=(b"rule:amp", None))
@example(record=(b"rule:amp", _AMPLIFIED))
@example(record=(b"rule:members", _MEMBERS.encode()))
@example(record=(b"rule:deep", _json({"when": "(" * 5_000 + "amount > 1" + ")" * 5_000})))
@example(record=(b"deny:card:c-1", b'{"a":' * 20_000 + b"1" + b"}" * 20_000))
def test_a_rules_topic_record_is_applied_or_dead_lettered_within_budget(
    record: tuple[bytes | None, bytes | None],
) -> None:
    key, value = record
    table = _Letters()
    kafka_message = message(7, value, topic="rules", key=key)  # type: ignore[arg-type]
    with within(RULES_RECORD, f"rules record {key!r:.60}"):
        table._apply(kafka_message)
    applied, rejected = table.counted("applied"), table.counted("rejected")
    assert (applied, rejected) in ((1.0, 0.0), (0.0, 1.0))
    assert len(table.letters) == rejected
    for letter in table.letters:
        assert "\n" not in str(letter) and len(str(letter)) < 2_000


# --- rules files ---------------------------------------------------------------------------------


@st.composite
def rules_files(draw: Any) -> tuple[str, bytes]:
    suffix = draw(st.sampled_from([".toml", ".yaml"]))
    kind = draw(st.sampled_from(["rules", "lists", "nesting", "bytes", "aliases"]))
    if kind == "rules":
        count = draw(st.sampled_from([1, 5, 101]))
        # Past the count bound, one small rule is enough; a hostile expression 101 times over
        # is a file of megabytes, whose TOML alone parses for seconds (still within the file's
        # bound, MAX_RULES_FILE_BYTES: a deployer's file, read once at start).
        when = "amount > 1" if count > MAX_NAMED_ENTRIES else draw(expressions())
        rules = [{"name": f"r{i}", "when": when, "then": "review"} for i in range(count)]
        document: dict[str, object] = {"rule": rules}
    elif kind == "lists":
        ids = draw(st.lists(st.text(max_size=70), max_size=50))
        document = {"deny": {"cards": ids * draw(st.sampled_from([1, 20]))}}
    elif kind == "nesting":
        depth = draw(st.integers(1, 20_000))
        text = "a = " + "[" * depth + "]" * depth if suffix == ".toml" else "[" * depth
        return suffix, text.encode()
    elif kind == "aliases":
        aliases = b"b: &b [*a, *a, *a]\n" * 20
        return ".yaml", b"a: &a [c-1, c-2]\n" + aliases + b"deny: {cards: *b}\n"
    else:
        return suffix, draw(st.binary(max_size=2_000))
    if suffix == ".yaml":
        return suffix, json.dumps(document).encode()  # JSON is YAML
    return suffix, _toml(document).encode()


def _toml(document: dict[str, object]) -> str:
    lines: list[str] = []
    for table, value in document.items():
        if isinstance(value, list):
            for entry in value:
                lines.append(f"[[{table}]]")
                lines.extend(f"{k} = {json.dumps(v)}" for k, v in entry.items())
        else:
            lines.append(f"[{table}]")
            lines.extend(f"{k} = {json.dumps(v)}" for k, v in dict(value).items())  # type: ignore[call-overload]
    return "\n".join(lines) + "\n"


@settings(PROPERTY, max_examples=25)
@given(file=rules_files())
def test_a_rules_file_is_loaded_or_stops_the_start_in_one_line_within_budget(
    tmp_path_factory: Any, file: tuple[str, bytes]
) -> None:
    suffix, content = file
    path = Path(tmp_path_factory.mktemp("rules")) / f"rules{suffix}"
    path.write_bytes(content)
    with within(RULES_FILE, f"rules file of {len(content):,} bytes"):
        try:
            Rules.load(path)
        except ConfigurationError as exc:
            assert "\n" not in str(exc).strip() or "YAML" in str(exc), str(exc)[:300]
            assert str(path) in str(exc)


# --- terminal-risk and card-frauds records -------------------------------------------------------

DAY = 20_000
WALL_MS = DAY * MS_PER_DAY + 3_600_000


@st.composite
def terminal_risk_values(draw: Any) -> bytes:
    kind = draw(st.sampled_from(["valid", "fields", "buckets", "nesting", "bytes", "huge", "id"]))
    if kind == "valid":
        return encode_terminal_risk("t-1", DAY, np.full(NUM_TERMINAL_FEATURES, 0.5))
    record: dict[str, object] = {"terminal_id": "t-1", "as_of_day": DAY}
    record.update(dict.fromkeys(TERMINAL_FEATURE_NAMES, 0.5))
    if kind == "fields":
        name = draw(st.sampled_from([*TERMINAL_FEATURE_NAMES, "terminal_id", "as_of_day"]))
        record[name] = draw(
            st.one_of(
                st.none(),
                st.booleans(),
                # Past float64's range (about 1.8e308) as well as float32's.
                st.integers(-(10**400), 10**400),
                st.floats(allow_nan=True, allow_infinity=True),
                st.text(max_size=100),
                st.lists(st.integers(), max_size=5),
            )
        )
        return json.dumps(record, allow_nan=True).encode()
    if kind == "buckets":
        length = draw(st.sampled_from([0, BUCKET_DAYS, 10_000]))
        record["days"] = [draw(st.integers(-(10**400), 10**400))] * length
        record["counts"] = [[1, 2]] * draw(st.sampled_from([0, BUCKET_DAYS, 10_000]))
        return json.dumps(record).encode()
    if kind == "nesting":
        depth = draw(st.integers(1, 50_000))
        return b"[" * depth + b"]" * depth
    if kind == "huge":
        return json.dumps({**record, "pad": "x" * draw(st.sampled_from([10, 900_000]))}).encode()
    if kind == "id":
        record["terminal_id"] = "t" * draw(st.sampled_from([64, 65, 500_000]))
        return json.dumps(record).encode()
    return draw(st.binary(max_size=5_000))


@st.composite
def card_frauds_values(draw: Any) -> bytes:
    kind = draw(st.sampled_from(["valid", "lists", "nesting", "bytes", "huge", "id"]))
    if kind == "valid":
        return encode_card_frauds("c-1", DAY, np.array([DAY - 1]), np.array([2]))
    if kind == "lists":
        # Past int64's range (and float64's), where a conversion would overflow.
        length = draw(st.sampled_from([0, 1, BUCKET_DAYS + 1, 100_000]))
        days = [draw(st.integers(-(10**400), 10**400))] * length
        frauds = [draw(st.integers(-5, 10**400))] * draw(st.sampled_from([0, length]))
        as_of_day = draw(st.one_of(st.just(DAY), st.integers(-(10**400), 10**400)))
        record = {"card_id": "c-1", "as_of_day": as_of_day, "days": days, "frauds": frauds}
        return json.dumps(record).encode()
    if kind == "nesting":
        depth = draw(st.integers(1, 50_000))
        return b'{"card_id":' + b"[" * depth + b"]" * depth + b"}"
    if kind == "huge":
        return json.dumps({"card_id": "c-1", "pad": "x" * 900_000}).encode()
    if kind == "id":
        card = "c" * draw(st.sampled_from([64, 65, 500_000]))
        return encode_card_frauds(card, DAY, np.array([DAY]), np.array([1]))
    return draw(st.binary(max_size=5_000))


def _table(kind: type[TerminalRiskTable | CardFraudsTable]) -> tuple[Any, CollectorRegistry]:
    registry = CollectorRegistry()
    clock = EventClock(wall_ms=lambda: WALL_MS)
    table = kind({}, "t", ServiceMetrics(registry), clock=clock, day_ms=MS_PER_DAY)
    return table, registry


_NESTED = b"[" * 50_000 + b"]" * 50_000
_PADDED = json.dumps({"terminal_id": "t-1", "as_of_day": DAY, "pad": "x" * 900_000}).encode()


def _terminal_risk_with(name: str, value: object) -> bytes:
    record: dict[str, object] = {"terminal_id": "t-1", "as_of_day": DAY}
    record.update(dict.fromkeys(TERMINAL_FEATURE_NAMES, 0.5))
    record[name] = value
    return json.dumps(record).encode()


def _card_frauds_with(days: list[int], frauds: list[int], as_of_day: int = DAY) -> bytes:
    record = {"card_id": "c-1", "as_of_day": as_of_day, "days": days, "frauds": frauds}
    return json.dumps(record).encode()


@PROPERTY
@given(
    record=st.one_of(
        st.tuples(st.just(TerminalRiskTable), terminal_risk_values()),
        st.tuples(st.just(CardFraudsTable), card_frauds_values()),
    ),
    key=st.one_of(st.just(b"k-1"), st.binary(max_size=300)),
)
@example(record=(TerminalRiskTable, _NESTED), key=b"t-1")
@example(record=(TerminalRiskTable, _PADDED), key=b"t-1")
@example(record=(CardFraudsTable, b'{"card_id": ' + _NESTED + b"}"), key=b"c-1")
# An integer past float64's range: converting it raised OverflowError, not ValueError.
@example(record=(TerminalRiskTable, _terminal_risk_with("terminal_tx_1d", 10**400)), key=b"t-1")
@example(record=(TerminalRiskTable, _terminal_risk_with("terminal_risk_7d", -(10**309))), key=b"t")
@example(record=(CardFraudsTable, _card_frauds_with([DAY], [2**63])), key=b"c-1")
@example(record=(CardFraudsTable, _card_frauds_with([10**400], [1])), key=b"c-1")
@example(record=(CardFraudsTable, _card_frauds_with([DAY], [1], -(10**400))), key=b"c-1")
def test_a_worker_table_record_is_taken_or_skipped_and_counted_within_budget(
    record: tuple[type[TerminalRiskTable | CardFraudsTable], bytes], key: bytes
) -> None:
    table_kind, value = record
    terminal = table_kind is TerminalRiskTable
    table, registry = _table(table_kind)
    with within(TABLE_RECORD, f"{table.name} record of {len(value):,} bytes"):
        table._apply(key, value, WALL_MS)
    metric = "fraud_terminal_risk" if terminal else "fraud_card_frauds"
    skipped = sum(
        registry.get_sample_value(f"{metric}_records_skipped_total", {"reason": reason}) or 0
        for reason in ("invalid", "future")
    )
    assert len(table) + skipped == 1, "taken or skipped and counted"
    assert len(value) <= MAX_RECORD_BYTES or len(table) == 0
    assert table._bytes <= 4_096 * len(table), "an entry holds at most a few KB"


# --- the worker's progress records ---------------------------------------------------------------


def progress_values() -> st.SearchStrategy[bytes]:
    """Progress records near the contract (any field any JSON value, fields missing or extra)
    and any bytes, up to far past MAX_PROGRESS_BYTES."""
    number = st.one_of(
        st.integers(-(2**64), 2**64),
        st.sampled_from([0, 1, 10**400, -(10**400), WALL_MS, 2**53 + 1]),
        st.floats(allow_nan=True),
        st.text(max_size=20),
        st.none(),
    )
    record = st.fixed_dictionaries(
        {},
        optional={"partition": number, "partitions": number, "counted_to": number, "x": number},
    )
    return st.one_of(
        record.map(lambda r: json.dumps(r).encode()),
        st.binary(max_size=600),
        st.just(b"[" * 50_000 + b"]" * 50_000),
        st.just(
            json.dumps(
                {"partition": 0, "partitions": 1, "counted_to": 1, "pad": "x" * 10**6}
            ).encode()
        ),
    )


@PROPERTY
@given(value=progress_values())
@example(value=b'{"partition": 0, "partitions": 1, "counted_to": 0}')
def test_a_progress_record_is_taken_or_skipped_and_counted_within_budget(value: bytes) -> None:
    table, registry = _table(TerminalRiskTable)
    table.features(["t"], np.array([WALL_MS], np.int64))
    with within(TABLE_RECORD, f"progress record of {len(value):,} bytes"):
        table._apply_progress(message(0, value, topic="t-progress", key=b"0"))
    skipped = registry.get_sample_value(
        "fraud_terminal_risk_records_skipped_total", {"reason": "progress"}
    )
    age = registry.get_sample_value("fraud_terminal_risk_state_age_seconds")
    assert age is not None
    if skipped == 1:
        assert np.isnan(age), "a record not taken tells nothing"
    else:
        assert len(value) <= MAX_PROGRESS_BYTES and skipped == 0
        progress = decode_progress(value)
        assert progress.counted_to <= WALL_MS + 300_000, "never past the clock's bound"
        if progress.partitions == 1:
            assert 0 <= age <= WALL_MS / 1000, "taken: how far behind the transaction scored"
        else:
            assert np.isnan(age), "the other partitions have not said"
