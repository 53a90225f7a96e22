"""The mapping file surface (docs/threat-model.md): whoever can write the file FRAUD_INPUT_MAPPING
names can make it anything (random bytes, deep nesting, huge tables, long strings, thousands of
value codes, paths of 10,000 segments). It is loaded or refused with ConfigurationError, within
a budget, at start; and a hostile mapping that loads, applied to hostile records (deep paths
against deep records, values of every type), decides or refuses each record (RecordError, a
dead letter) within a budget, through the real JSON decoding path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from contracts.field_mapping import (
    CONTRACT_FIELDS,
    MAX_MAPPING_BYTES,
    MAX_PATH_SEGMENTS,
    TIME_FORMATS,
    FieldMapping,
)
from contracts.input_formats import transaction_decoder
from contracts.transaction import Transaction
from plumbing.errors import ConfigurationError, RecordError
from tests.support.budget import MIB, Budget, within

#: Loading a file: TOML parsing costs tens of bytes per byte of the file, which is bounded.
LOAD_BUDGET = Budget(48 * MIB, 10.0)
#: Deciding one record through a mapping: a few copies of the record, which is bounded by the
#: broker (here at most RECORD_BYTES), and little else.
RECORD_BYTES = 256 * 1024
APPLY_BUDGET = Budget(8 * RECORD_BYTES + 2 * MIB, 2.0)

FIELD = st.sampled_from(CONTRACT_FIELDS)
KEY = st.one_of(st.sampled_from(["a", "payment", "card", "x.y"]), st.text(min_size=1, max_size=8))


def _quoted(text: str) -> str:
    return json.dumps(text)  # a TOML basic string is a JSON string, for what json.dumps writes


@st.composite
def toml_texts(draw: st.DrawFn) -> str:
    """TOML documents, hostile in one way each, most of them valid TOML."""
    n = draw(st.one_of(st.integers(0, 64), st.integers(0, 20_000)))
    kind = draw(
        st.sampled_from(
            [
                "deep array",
                "deep inline table",
                "deep table header",
                "long path",
                "many codes",
                "long string",
                "many fields",
                "wrong types",
            ]
        )
    )
    field = draw(FIELD)
    if kind == "deep array":
        return f"[constants]\n{field} = " + "[" * n + "]" * n + "\n"
    if kind == "deep inline table":
        return f"[constants]\n{field} = " + "{a = " * n + "1" + "}" * n + "\n"
    if kind == "deep table header":
        return "[" + ".".join(["values", field, *(["a"] * n)]) + "]\nx = 1\n"
    if kind == "long path":
        segment = draw(st.sampled_from(["a", "payment", "x" * 100]))
        return f"[fields]\n{field} = {_quoted('.'.join([segment] * (n + 1)))}\n"
    if kind == "many codes":
        value = draw(st.sampled_from(['"ecom"', "true", "[1, 2]", '{a = "b"}', _quoted("v" * 50)]))
        codes = "".join(f'"{i}" = {value}\n' for i in range(n))
        return f"[values.{field}]\n{codes}"
    if kind == "long string":
        character = draw(st.sampled_from(["x", "é", "\\"]))
        return f"time_format = {_quoted(character * n * 50)}\n"
    if kind == "many fields":
        return "[fields]\n" + "".join(f"f{i} = {_quoted('a.b')}\n" for i in range(n))
    value = draw(st.sampled_from(["1", "true", "[]", "{}", '"a..b"', "1979-05-27", "nan", "-1"]))
    key = draw(st.sampled_from(["amount_scale", "time_format", "fields", "values", "constants"]))
    return f"{key} = {value}\n"


FILES = st.one_of(
    toml_texts().map(lambda text: text.encode("utf-8")),
    st.binary(max_size=4_096),
    # Past the size bound: refused before it is parsed.
    st.integers(MAX_MAPPING_BYTES + 1, 4 * MAX_MAPPING_BYTES).map(lambda n: b"#" * n),
)


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(content=FILES)
# The extremes, every run: the parser's depth, a path of 10,000 segments, the most codes that
# fit the size bound, a string as long as the bound, a file just past it.
@example(content=b"[constants]\nchannel = " + b"[" * 5_000 + b"]" * 5_000)
@example(content=b"[constants]\nchannel = " + b"{a = " * 5_000 + b"1" + b"}" * 5_000)
@example(content=b"[values.channel." + b".".join([b"a"] * 10_000) + b"]\nx = 1\n")
@example(content=b'[fields]\ncard_id = "' + b".".join([b"a"] * 10_000) + b'"\n')
@example(content=b"[values.channel]\n" + b"".join(b'"%d" = "ecom"\n' % i for i in range(15_000)))
@example(content=b'time_format = "' + b"x" * (MAX_MAPPING_BYTES - 20) + b'"\n')
@example(content=b"#" * (MAX_MAPPING_BYTES + 1))
def test_a_hostile_mapping_file_is_loaded_or_refused_within_budget(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "mapping.toml"
    path.write_bytes(content)
    with within(LOAD_BUDGET, f"a mapping file of {len(content):,} bytes"):
        try:
            mapping = FieldMapping.load(path)
        except ConfigurationError as exc:
            mapping = None
            message = str(exc)
    if mapping is None:
        assert "\n" not in message.strip() and len(message) < 1_000, "one short line"
        return
    assert len(content) <= MAX_MAPPING_BYTES
    assert all(0 < len(path) <= MAX_PATH_SEGMENTS for path in mapping.paths.values())


# -- a loaded mapping, applied to hostile records ----------------------------------------------

PATHS = st.lists(KEY, min_size=1, max_size=MAX_PATH_SEGMENTS)
LEAVES: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 63), (1 << 64) - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=64),
    st.sampled_from(["2026-01-05T10:00:00+01:00", "9999-12-31T23:59:59Z", "ecom", "pos", "CH"]),
    st.integers(1, RECORD_BYTES // 2).map(lambda n: "x" * n),
    st.integers(1, 300).map(lambda depth: _nested([], depth)),
    st.integers(1, 300).map(lambda depth: _nested({}, depth)),
)


def _nested(inner: Any, depth: int) -> Any:
    for _ in range(depth):
        inner = [inner] if isinstance(inner, list) else {"a": inner}
    return inner


#: What a mapping may give a field: a constant, or the value of a code.
SCALARS: st.SearchStrategy[Any] = st.one_of(
    st.booleans(),
    st.integers(-(1 << 63), (1 << 63) - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=80),
    st.sampled_from(["ecom", "pos", "atm", "CH", "EUR"]),
)


@st.composite
def mappings(draw: st.DrawFn) -> FieldMapping:
    fields = draw(st.dictionaries(FIELD, PATHS.map(".".join), max_size=len(CONTRACT_FIELDS)))
    constants = {
        f: v
        for f, v in draw(st.dictionaries(FIELD, SCALARS, max_size=3)).items()
        if f not in fields
    }
    values = draw(
        st.dictionaries(
            FIELD,
            st.dictionaries(st.text(max_size=8), SCALARS, min_size=1, max_size=2_000),
            max_size=3,
        )
    )
    document = {
        "fields": fields,
        "constants": constants,
        "values": values,
        "time_format": draw(st.sampled_from(TIME_FORMATS)),
        "amount_scale": draw(st.floats(min_value=1e-300, max_value=1e300)),
    }
    try:
        return FieldMapping.from_document(document)
    except ConfigurationError:
        assume(False)
        raise


@st.composite
def records(draw: st.DrawFn, mapping: FieldMapping) -> bytes:
    """A JSON record that follows the mapping's paths (deeper, where it draws so) to hostile
    values, or strays from them."""
    record: dict[str, Any] = {}
    for path in [*mapping.paths.values(), *((f,) for f in CONTRACT_FIELDS)]:
        if draw(st.integers(0, 4)) == 0:
            continue
        node = record
        for key in path[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                break
            node = child
        else:
            node[path[-1]] = draw(LEAVES)
    encoded = json.dumps(record).encode()
    assume(len(encoded) <= RECORD_BYTES)
    return encoded


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_a_hostile_mapping_decides_or_refuses_hostile_records_within_budget(data) -> None:
    mapping = data.draw(mappings())
    decode = transaction_decoder("json", "tx", mapping=mapping)
    for value in data.draw(st.lists(records(mapping), min_size=1, max_size=3)):
        with within(APPLY_BUDGET, f"a record of {len(value):,} bytes through a mapping"):
            try:
                decided = decode(value)
            except RecordError:
                continue
        assert isinstance(decided, Transaction)


@pytest.mark.parametrize("constant", ["", False, "2026-12-07T10:00:00Z"])
def test_an_iso8601_event_time_given_as_a_constant_is_refused(constant: object) -> None:
    # It once reached `apply`, which unpacked the constant as a parsed (time, offset) pair.
    with pytest.raises(ConfigurationError, match=r"iso8601 reads each record's event_time"):
        FieldMapping.from_document(
            {"time_format": "iso8601", "constants": {"event_time": constant}}
        )


@pytest.mark.parametrize("depth", [MAX_PATH_SEGMENTS + 1, 10_000])
def test_a_path_deeper_than_the_bound_is_refused_naming_the_field(depth: int) -> None:
    with pytest.raises(ConfigurationError, match=r"\[fields\] card_id.*segments"):
        FieldMapping.from_document({"fields": {"card_id": ".".join(["a"] * depth)}})


def test_a_file_larger_than_the_bound_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "mapping.toml"
    path.write_bytes(b"# padding\n" * (MAX_MAPPING_BYTES // 10 + 1))
    with pytest.raises(ConfigurationError, match="larger than"):
        FieldMapping.load(path)


def test_toml_nested_past_the_parser_s_depth_is_refused_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "mapping.toml"
    path.write_text("[constants]\nchannel = " + "[" * 5_000 + "]" * 5_000 + "\n")
    with pytest.raises(ConfigurationError, match="nested"):
        FieldMapping.load(path)


@pytest.mark.parametrize(
    "document",
    [
        {"constants": {"channel": {"a": {"a": "ecom"}}}},
        {"constants": {"channel": ["ecom"]}},
        {"values": {"channel": {"81": {"a": "ecom"}}}},
    ],
    ids=["constant table", "constant array", "code table"],
)
def test_a_constant_or_code_that_is_not_a_scalar_is_refused(document: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match=r"must (be|map to) a string, number or boolean"):
        FieldMapping.from_document(document)
