"""The budget of a registry record (issue 43; docs/threat-model.md), against a real Schema
Registry: whatever schema a producer registers under the topic's subject, and whatever bytes it
then writes, each record is decoded or refused with the contract's error (never a registry
fault, never a crash) within a stated memory and time budget.

Hypothesis draws the Avro writer schemas (records, arrays, maps, unions, enums, fixed, logical
types, nested, some of them free per item or recursive) and registers each one; the records are
random bytes, counts that claim 2^k items, records cut short, and records the schema's own
writer produced. JSON Schema and Protobuf get their hostile bytes the same way."""

from __future__ import annotations

import importlib
import io
import itertools
import json
import os
import struct
import uuid
from collections.abc import Iterator
from typing import Any

import fastavro
import fastavro.utils
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from hypothesis import HealthCheck, assume, currently_in_test_context, event, given, settings
from hypothesis import strategies as st

from contracts.input_formats import (
    DEFAULT_MAX_RECORD_BYTES,
    TransactionDecoder,
    transaction_decoder,
)
from contracts.transaction import Transaction
from plumbing.errors import RecordError
from simulator.transactions import TransactionSimulator
from tests.integration.test_registry_hostile import zigzag
from tests.integration.test_registry_input import (
    AVRO_V1,
    JSON_SCHEMA,
    PROTO_MODULE,
    REGISTRY_CLIENT,
    REGISTRY_URL,
    TOPIC_SUBJECT,
)
from tests.support.budget import MIB, Budget, within

#: A record of at most FRAUD_MAX_RECORD_BYTES. The worst Avro shape found, an array of
#: one-boolean records (a dict per byte), builds 12 MiB from 64 KiB under tracemalloc.
BUDGET = Budget(peak_bytes=32 * MIB, seconds=10.0)
EXAMPLES = int(os.environ.get("FRAUD_BUDGET_EXAMPLES", "40"))
VALID = [dict(r) for r in TransactionSimulator(8, id_prefix="rb").generate(5).records]
_names = itertools.count()

PRIMITIVES = ["null", "boolean", "int", "long", "float", "double", "bytes", "string"]
LOGICAL = [
    {"type": "long", "logicalType": "timestamp-millis"},
    {"type": "long", "logicalType": "timestamp-micros"},
    {"type": "long", "logicalType": "local-timestamp-millis"},
    {"type": "int", "logicalType": "date"},
    {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 4},
    {"type": "string", "logicalType": "uuid"},
]


def _named(kind: str, **rest: Any) -> dict[str, Any]:
    return {"type": kind, "name": f"N{next(_names)}", **rest}


avro_types = st.recursive(
    st.sampled_from(PRIMITIVES) | st.sampled_from(LOGICAL),
    lambda inner: st.one_of(
        st.builds(lambda items: {"type": "array", "items": items}, inner),
        st.builds(lambda values: {"type": "map", "values": values}, inner),
        st.builds(lambda other: ["null", other], inner.filter(lambda t: t != "null")),
        st.builds(
            lambda fields: _named(
                "record", fields=[{"name": f"f{i}", "type": t} for i, t in enumerate(fields)]
            ),
            st.lists(inner, max_size=4),
        ),
        st.builds(lambda n: _named("enum", symbols=[f"S{i}" for i in range(n)]), st.integers(1, 5)),
        st.builds(lambda size: _named("fixed", size=size), st.integers(0, 16)),
    ),
    max_leaves=12,
)
#: A writer schema: the contract's fields (so some records decode) and hostile ones beside.
avro_schemas = st.builds(
    lambda extra: {
        **AVRO_V1,
        "name": f"W{next(_names)}",
        "fields": [
            *AVRO_V1["fields"],
            *({"name": f"x{i}", "type": t} for i, t in enumerate(extra)),
        ],
    },
    st.lists(avro_types, min_size=1, max_size=3),
)


_decoders: dict[tuple[str, str], TransactionDecoder] = {}


def _decoder(
    client: SchemaRegistryClient, input_format: str, topic: str, **options: Any
) -> TransactionDecoder:
    """One decoder per format and topic for the whole run, as a replica has one: its writer
    schemas checked once, on the module's registry client (closed with it)."""
    if (input_format, topic) not in _decoders:
        _decoders[input_format, topic] = transaction_decoder(
            input_format, topic, client=client, **options
        )
    return _decoders[input_format, topic]


def _outcome(decode: TransactionDecoder, value: bytes) -> str:
    with within(BUDGET, f"a record of {len(value):,} bytes"):
        try:
            result = decode(value)
        except RecordError as refused:
            if currently_in_test_context():  # `--hypothesis-show-statistics` shows the mix
                event(refused.reason)
            return refused.reason
    assert isinstance(result, Transaction)
    if currently_in_test_context():
        event("decoded")
    return "decoded"


@pytest.fixture(scope="module")
def client() -> Iterator[SchemaRegistryClient]:
    with SchemaRegistryClient(REGISTRY_CLIENT) as registry:
        try:
            registry.get_subjects()
        except Exception as exc:
            pytest.fail(f"no Schema Registry at {REGISTRY_URL} ({exc}): run `make registry-up`")
        yield registry


@pytest.fixture(scope="module")
def topic() -> str:
    return f"tx-budget-{uuid.uuid4().hex[:8]}"


def _header(schema_id: int) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_an_avro_record_is_decided_or_refused_within_budget(
    client: SchemaRegistryClient, topic: str, data: st.DataObject
) -> None:
    schema = data.draw(avro_schemas, label="writer schema")
    try:
        parsed = fastavro.parse_schema(json.loads(json.dumps(schema)))
        schema_id = client.register_schema(f"{topic}-value", Schema(json.dumps(schema), "AVRO"))
    except (fastavro.schema.SchemaParseException, SchemaRegistryError):
        assume(False)  # not Avro at all: no producer could register it

    # After the wire header: what the schema's writer wrote (cut short, perhaps), random
    # bytes, or a count that claims 2^k items.
    kind = data.draw(st.sampled_from(["written", "bytes", "claim"]), label="payload")
    if kind == "written":
        record = next(fastavro.utils.generate_many(parsed, 1))  # hypothesis seeds `random`
        record.update(data.draw(st.sampled_from(VALID)))
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, record)
        payload = buffer.getvalue()[: data.draw(st.integers(0, 4096))]
    elif kind == "bytes":
        payload = data.draw(st.binary(max_size=256))
    else:
        payload = zigzag(2 ** data.draw(st.integers(1, 62))) + data.draw(st.binary(max_size=16))
    _outcome(_decoder(client, "avro", topic), _header(schema_id) + payload)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.binary(max_size=512),
        st.builds(lambda depth: b"[" * depth, st.integers(1, 60_000)),
        st.builds(lambda n: b"[" + b"{}," * n + b"0]", st.integers(1, 30_000)),
        st.builds(
            lambda r, junk: json.dumps({**r, "junk": junk}).encode(),
            st.sampled_from(VALID),
            st.recursive(st.integers() | st.text(max_size=8), lambda x: st.lists(x, max_size=6)),
        ),
    )
)
def test_a_json_schema_record_is_decided_or_refused_within_budget(
    client: SchemaRegistryClient, payload: bytes
) -> None:
    topic = "tx-budget-json"
    schema_id = client.register_schema(f"{topic}-value", Schema(json.dumps(JSON_SCHEMA), "JSON"))
    decode = _decoder(client, "json-schema", topic)
    outcome = _outcome(decode, _header(schema_id) + payload)
    if len(payload) > DEFAULT_MAX_RECORD_BYTES:
        assert outcome == "schema_decode"


@pytest.fixture(scope="module")
def payment_class(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    folder = tmp_path_factory.mktemp("proto")
    (folder / "budget_payment_pb2.py").write_text(PROTO_MODULE, encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(folder))
        yield importlib.import_module("budget_payment_pb2")


#: An unknown field 99 on the wire: a group's start and end, and an empty length-delimited one.
GROUP_START, GROUP_END, EMPTY_FIELD = (
    bytes([0x9B, 0x06]),
    bytes([0x9C, 0x06]),
    bytes([0x9A, 0x06, 0]),
)


def _group_nest(depth: int) -> bytes:
    """Unknown field 99 as groups nested `depth` deep (4 bytes a level)."""
    return GROUP_START * depth + GROUP_END * depth


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.one_of(
        st.binary(max_size=512),
        st.builds(_group_nest, st.integers(1, 10_000)),
        st.builds(lambda n: EMPTY_FIELD * n, st.integers(1, 25_000)),
    )
)
def test_a_protobuf_record_is_decided_or_refused_within_budget(
    client: SchemaRegistryClient, payment_class: Any, payload: bytes
) -> None:
    topic = "tx-budget-proto"
    serializer = ProtobufSerializer(
        payment_class.Payment, client, {"use.deprecated.format": False, **TOPIC_SUBJECT}
    )
    context = SerializationContext(topic, MessageField.VALUE)
    valid = serializer(
        payment_class.Payment(**{k: v for k, v in VALID[0].items() if v is not None}), context
    )
    assert valid is not None
    decode = _decoder(client, "protobuf", topic, protobuf_message="budget_payment_pb2:Payment")
    assert _outcome(decode, valid) == "decoded"
    # The header and message index of the valid record, then hostile message bytes.
    _outcome(decode, valid[:6] + payload)


def test_the_worst_avro_shape_found_stays_within_budget_at_the_length_bound(
    client: SchemaRegistryClient, topic: str
) -> None:
    one_bit = {"type": "record", "name": "Bit", "fields": [{"name": "b", "type": "boolean"}]}
    bits = {"name": "bits", "type": {"type": "array", "items": one_bit}}
    schema = {**AVRO_V1, "name": "Worst", "fields": [bits, *AVRO_V1["fields"]]}
    schema_id = client.register_schema(f"{topic}-value", Schema(json.dumps(schema), "AVRO"))
    decode = _decoder(client, "avro", topic)
    items = DEFAULT_MAX_RECORD_BYTES - 16
    value = _header(schema_id) + zigzag(items) + b"\x00" * items + b"\x00"
    assert len(value) <= DEFAULT_MAX_RECORD_BYTES
    assert _outcome(decode, value) == "schema_decode", "the contract's fields are cut off"
    assert _outcome(decode, value + b"\x00" * 64) == "schema_decode", "too long: not decoded"
