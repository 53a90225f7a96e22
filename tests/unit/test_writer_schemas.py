"""The writer-schema check (contracts/writer_schemas.py) on its own: which Avro shapes are
refused before a record is decoded, and how logical-type values become the contract's. The
registry round trips run against a real registry (tests/integration/test_registry_hostile.py)."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import uuid
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry.error import SchemaRegistryError

from contracts.event_time import EpochMs
from contracts.writer_schemas import (
    MAX_SCHEMA_DEPTH,
    avro_logical_paths,
    plain_logical_values,
    registry_failure,
)
from plumbing.errors import (
    RegistryUnavailableError,
    SchemaDecodeError,
    SchemaUnknownError,
    ValidationError,
)


def record(*fields: tuple[str, Any], name: str = "T") -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": [{"name": n, "type": t} for n, t in fields]}


EMPTY = {"type": "record", "name": "Empty", "fields": []}


@pytest.mark.parametrize(
    "items",
    [
        "null",
        EMPTY,
        {"type": "fixed", "name": "F", "size": 0},
        record(("a", "null"), ("b", EMPTY), name="Nothing"),
    ],
    ids=["null", "empty-record", "fixed-0", "record-of-nothing"],
)
def test_an_array_of_items_that_cost_no_bytes_is_refused(items: Any) -> None:
    # The 12-byte record of issue 43: 2^40 `null`s claimed by one count.
    schema = record(("junk", {"type": "array", "items": items}))
    with pytest.raises(SchemaDecodeError, match="items can be written in 0 bytes"):
        avro_logical_paths(schema)


@pytest.mark.parametrize(
    "items",
    ["boolean", "string", ["null", "string"], {"type": "array", "items": "null"}],
)
def test_items_of_a_byte_or_more_are_let_through_when_nothing_inside_is_free(items: Any) -> None:
    schema = record(("ok", {"type": "array", "items": items}))
    if items == {"type": "array", "items": "null"}:
        with pytest.raises(SchemaDecodeError):
            avro_logical_paths(schema)  # the inner array is itself free per item
    else:
        assert avro_logical_paths(schema) == ()


def test_a_map_of_nulls_costs_its_keys_and_is_let_through() -> None:
    assert avro_logical_paths(record(("m", {"type": "map", "values": "null"}))) == ()


def test_a_recursive_type_is_refused() -> None:
    node = record(("value", "long"), ("next", ["null", "Node"]), name="Node")
    with pytest.raises(SchemaDecodeError, match="contains itself"):
        avro_logical_paths(record(("head", node)))


def test_a_top_level_that_is_not_a_record_is_refused() -> None:
    with pytest.raises(SchemaDecodeError, match="not an Avro record"):
        avro_logical_paths({"type": "array", "items": "long"})


def test_a_schema_nested_past_the_bound_is_refused() -> None:
    schema: Any = "long"
    for level in range(MAX_SCHEMA_DEPTH + 2):
        schema = record(("inner", schema), name=f"L{level}")
    with pytest.raises(SchemaDecodeError, match="deeper than"):
        avro_logical_paths(schema)


def test_unknown_types_and_nameless_fixed_are_refused() -> None:
    with pytest.raises(SchemaDecodeError, match="unknown type"):
        avro_logical_paths(record(("x", "NotDefined")))
    with pytest.raises(SchemaDecodeError, match="without a name"):
        avro_logical_paths(record(("x", {"type": "fixed", "size": 4})))


TIMESTAMP_MS = {"type": "long", "logicalType": "timestamp-millis"}
TIMESTAMP_US = {"type": "long", "logicalType": "timestamp-micros"}
DECIMAL = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}
UUID = {"type": "string", "logicalType": "uuid"}
LOGICAL = record(
    ("event_time", TIMESTAMP_MS),
    ("amount", DECIMAL),
    ("transaction_id", UUID),
    ("payment", record(("at", ["null", TIMESTAMP_US]), name="Payment")),
    ("history", {"type": "array", "items": TIMESTAMP_MS}),
)


def test_logical_types_are_found_by_their_record_paths_only() -> None:
    assert avro_logical_paths(LOGICAL) == (
        ("event_time",),
        ("amount",),
        ("transaction_id",),
        ("payment", "at"),
    )


def decoded(schema: dict[str, Any], value: dict[str, Any]) -> dict[str, Any]:
    """`value` written and read back by fastavro, as the registry's deserializer reads it."""
    parsed = fastavro.parse_schema(schema)
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, parsed, value)
    result = fastavro.schemaless_reader(io.BytesIO(buffer.getvalue()), parsed)
    assert isinstance(result, dict)
    return result


def test_logical_values_become_the_contracts_plain_values_exactly() -> None:
    transaction_id = uuid.uuid4()
    record_value = decoded(
        LOGICAL,
        {
            "event_time": 1_767_571_200_123,
            "amount": decimal.Decimal("1234567.89"),
            "transaction_id": str(transaction_id),
            "payment": {"at": 1_767_571_200_123_999},
            "history": [1],
        },
    )
    assert isinstance(record_value["event_time"], dt.datetime), "fastavro's reading"
    plain_logical_values(record_value, avro_logical_paths(LOGICAL))
    assert record_value["event_time"] == 1_767_571_200_123
    assert isinstance(record_value["event_time"], EpochMs)
    assert record_value["payment"]["at"] == 1_767_571_200_123, "micros truncated to the ms"
    assert record_value["amount"] == 1234567.89
    assert record_value["transaction_id"] == str(transaction_id)


def test_a_timestamp_before_1970_is_exact_too() -> None:
    value = decoded(record(("t", TIMESTAMP_US)), {"t": -1_500})  # 1.5 ms before the epoch
    plain_logical_values(value, (("t",),))
    assert value["t"] == -2, "floored, as epoch ms are"


def test_a_local_timestamp_has_no_instant_and_is_invalid() -> None:
    local = {"type": "long", "logicalType": "local-timestamp-millis"}
    schema = record(("event_time", local))
    value = decoded(schema, {"event_time": 1_767_571_200_123})
    with pytest.raises(ValidationError, match="no zone"):
        plain_logical_values(value, avro_logical_paths(schema))


def test_a_missing_or_null_logical_value_is_left_alone() -> None:
    value: dict[str, Any] = {"payment": {"at": None}}
    plain_logical_values(value, (("payment", "at"), ("event_time",), ("a", "b", "c")))
    assert value == {"payment": {"at": None}}


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (SchemaRegistryError(404, 40403, "Schema 7 not found"), SchemaUnknownError),
        # A wrong URL path, a misrouted ingress: not the record's fault (issue 43, finding 6).
        (SchemaRegistryError(404, -1, "Not Found"), RegistryUnavailableError),
        (SchemaRegistryError(404, None, "<html>404</html>"), RegistryUnavailableError),  # type: ignore[arg-type]
        (SchemaRegistryError(500, 50001, "storage error"), RegistryUnavailableError),
        (SchemaRegistryError(422, 42201, "invalid schema"), SchemaDecodeError),
    ],
)
def test_registry_answers_are_sorted_by_cause(raised: SchemaRegistryError, expected: type) -> None:
    assert type(registry_failure(raised, "schema id 7")) is expected


class _Registry:
    """The two lookups WriterSchemas makes of a registry, answered from memory, and a
    reference whose version the registry no longer has."""

    def __init__(self, schema: Any) -> None:
        self.schema = schema

    def get_subjects_by_schema_id(self, schema_id: int) -> list[str]:
        return ["tx-value"]

    def get_schema(self, schema_id: int) -> Any:
        return self.schema

    def get_version(self, subject: str, version: int) -> Any:
        raise SchemaRegistryError(404, 40402, f"Version {version} not found")


def test_a_reference_the_registry_lost_refuses_the_schema_instead_of_holding() -> None:
    from confluent_kafka.schema_registry import Schema, SchemaReference

    from contracts.writer_schemas import WriterSchemas

    referring = Schema(
        '{"type": "record", "name": "T", "fields": [{"name": "m", "type": "Money"}]}',
        "AVRO",
        [SchemaReference("Money", "money-value", 3)],
    )
    schemas = WriterSchemas(_Registry(referring), ["tx-value"], "AVRO", lambda: OSError)
    with pytest.raises(SchemaDecodeError, match="a reference"):
        schemas.check(7)
