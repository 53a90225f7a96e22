"""How a Schema Registry record's failures are sorted (contracts/input_formats.py): what the
registry does not know, or what does not decode, is the record's fault and dead-lettered; what
may pass (the registry unreachable, overloaded, refusing credentials) never is. The registry
round trips themselves run against a real registry (tests/integration/test_registry_input.py).
And what each decision format needs."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import fastavro
import msgspec
import pytest
from confluent_kafka.schema_registry.common._httpx_compat import httpx
from confluent_kafka.schema_registry.error import SchemaRegistryError

from contracts.decision import Decision, Reason, encode_decision
from contracts.input_formats import (
    _deserialized,
    _message_dict,
    protobuf_class,
    protobuf_paths,
    transaction_decoder,
)
from contracts.output_formats import (
    DECISION_AVRO_SCHEMA,
    DECISION_PROTO,
    decision_encoder,
    decision_message,
)
from contracts.transaction import decode_transaction
from plumbing.errors import (
    ConfigurationError,
    RegistryUnavailableError,
    SchemaDecodeError,
    SchemaUnknownError,
)
from stream.startup.config import ScorerSettings
from tests.support.release_010 import release_010_avro


def failing(exc: BaseException) -> Any:
    def deserialize(value: bytes, context: object) -> Any:
        raise exc

    return deserialize


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (SchemaRegistryError(404, 40403, "Schema 7 not found"), SchemaUnknownError),
        # Any other 404 (a wrong URL path, a misrouted ingress) holds the partition.
        (SchemaRegistryError(404, -1, "HTTP 404 Not Found"), RegistryUnavailableError),
        (SchemaRegistryError(500, 50001, "storage error"), RegistryUnavailableError),
        (SchemaRegistryError(503, 50003, "unavailable"), RegistryUnavailableError),
        (SchemaRegistryError(429, 42900, "too many requests"), RegistryUnavailableError),
        (SchemaRegistryError(401, 40101, "unauthorized"), RegistryUnavailableError),
        (SchemaRegistryError(422, 42201, "invalid schema"), SchemaDecodeError),
        (httpx.ConnectError("Connection refused"), RegistryUnavailableError),
        (httpx.ReadTimeout("timed out"), RegistryUnavailableError),
        (IndexError("string index out of range"), SchemaDecodeError),  # fastavro, cut bytes
        (EOFError(), SchemaDecodeError),
    ],
)
def test_failures_are_sorted_by_cause(raised: BaseException, expected: type) -> None:
    with pytest.raises(expected):
        _deserialized(failing(raised), b"\x00\x00\x00\x00\x07", None)


def test_a_schema_that_is_not_a_record_does_not_decode() -> None:
    with pytest.raises(SchemaDecodeError, match="not a record"):
        _deserialized(lambda value, context: "a string", b"\x00\x00\x00\x00\x07", None)


def test_json_needs_no_registry_and_the_registry_formats_need_one() -> None:
    assert transaction_decoder("json", "tx") is decode_transaction
    with pytest.raises(ConfigurationError, match="FRAUD_SCHEMA_REGISTRY_URL"):
        transaction_decoder("avro", "tx", {})
    with pytest.raises(ConfigurationError, match=r"schema\.registry"):
        transaction_decoder("avro", "tx", {"url": "http://127.0.0.1:1", "no.such.setting": "x"})


def test_json_decisions_need_no_registry_and_the_registry_formats_need_one() -> None:
    assert decision_encoder("json", "decisions") is encode_decision
    for output_format in ("avro", "protobuf", "json-schema"):
        with pytest.raises(ConfigurationError, match="FRAUD_SCHEMA_REGISTRY_URL"):
            decision_encoder(output_format, "decisions", {})
    with pytest.raises(ConfigurationError, match="unknown output format 'xml'"):
        decision_encoder("xml", "decisions")


def test_the_protobuf_decision_message_is_the_proto_text_and_round_trips() -> None:
    message = decision_message()
    fields = [(f.name, f.number) for f in message.DESCRIPTOR.fields]
    declared = re.findall(r"^  \S+(?: \S+)? (\w+) = (\d+);", DECISION_PROTO, re.MULTILINE)
    assert fields == [(name, int(number)) for name, number in declared]
    assert [name for name, _ in fields] == list(Decision.__struct_fields__)
    # A reason's fields keep their numbers: `text` is new as 4, the deprecated `label` keeps 2
    # (never reused: a consumer of 0.1.0's schema reads 2 as the words).
    reason = message.Reason.DESCRIPTOR
    declared = re.findall(r"^    \S+ (\w+) = (\d+)( \[deprecated = true\])?;", DECISION_PROTO, re.M)
    assert [(f.name, f.number, f.GetOptions().deprecated) for f in reason.fields] == [
        (name, int(number), bool(deprecated)) for name, number, deprecated in declared
    ]
    assert [(f.name, f.number) for f in reason.fields] == [
        ("feature", 1), ("label", 2), ("contribution", 3), ("text", 4)
    ]  # fmt: skip
    assert {f.name for f in reason.fields} == set(Reason.__struct_fields__)
    decision = message(
        transaction_id="t", score=0.9, decision="decline", rules=["deny"],
        reasons=[message.Reason(feature="amount", text="1,000", label="1,000", contribution=0.4)],
    )  # fmt: skip
    assert message.FromString(decision.SerializeToString()) == decision


def test_the_avro_decision_schema_reads_a_decision_of_release_010() -> None:
    """0.1.0's reasons had `label` only: this schema reads them (its `text` defaults to ""), as
    the registry's BACKWARD check requires (tests/integration/test_registry_output.py)."""
    schema = json.loads(DECISION_AVRO_SCHEMA)
    release_010 = json.loads(release_010_avro())
    written = {
        **msgspec.to_builtins(Decision("t", "c", 0.9, "review", "m", False, 1, 2)),
        "reasons": [{"feature": "log_amount", "label": "amount 229.90", "contribution": 0.3}],
        "rules": [], "features": "",
    }  # fmt: skip
    value = io.BytesIO()
    fastavro.schemaless_writer(value, fastavro.parse_schema(release_010), written)
    value.seek(0)
    read = fastavro.schemaless_reader(
        value, fastavro.parse_schema(release_010), fastavro.parse_schema(schema)
    )
    assert isinstance(read, dict)
    assert read["reasons"] == [
        {"feature": "log_amount", "label": "amount 229.90", "contribution": 0.3, "text": ""}
    ]


def _payment_class() -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="t/p.proto", package="t", syntax="proto3")
    inner = proto.message_type.add(name="Card")
    inner.field.add(name="token", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    kind = proto.enum_type.add(name="Kind")
    kind.value.add(name="POS", number=0)
    kind.value.add(name="ECOM", number=1)
    message = proto.message_type.add(name="Payment")
    message.field.add(name="amount", number=1, type=field.TYPE_DOUBLE, label=field.LABEL_OPTIONAL)
    message.field.add(name="present", number=2, type=field.TYPE_BOOL, label=field.LABEL_OPTIONAL)
    message.field.add(
        name="kind", number=3, type=field.TYPE_ENUM, type_name=".t.Kind", label=field.LABEL_OPTIONAL
    )
    message.field.add(
        name="card", number=4, type=field.TYPE_MESSAGE, type_name=".t.Card",
        label=field.LABEL_OPTIONAL,
    )  # fmt: skip
    message.field.add(name="tags", number=5, type=field.TYPE_STRING, label=field.LABEL_REPEATED)
    entry = message.nested_type.add(name="ExtrasEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    entry.field.add(
        name="value", number=2, type=field.TYPE_MESSAGE, type_name=".t.Card",
        label=field.LABEL_OPTIONAL,
    )  # fmt: skip
    message.field.add(
        name="extras", number=6, type=field.TYPE_MESSAGE, type_name=".t.Payment.ExtrasEntry",
        label=field.LABEL_REPEATED,
    )  # fmt: skip
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("t.Payment"))


def test_a_protobuf_message_reads_as_plain_values_with_proto3_defaults() -> None:
    payment = _payment_class()
    message = payment(amount=12.5, kind=1, tags=["a", "b"])
    message.card.token = "tok"
    message.extras["x"].token = "t-x"
    assert _message_dict(message) == {
        "amount": 12.5,
        "present": False,  # proto3 sends no false: its default is read
        "kind": "ECOM",
        "card": {"token": "tok"},
        "tags": ["a", "b"],
        "extras": {"x": {"token": "t-x"}},
    }
    assert "card" not in _message_dict(payment()), "a message field has presence"
    assert _message_dict(payment(kind=7))["kind"] == 7, "a newer writer's enum value, by number"
    paths = protobuf_paths(payment.DESCRIPTOR)
    assert ("card", "token") in paths and ("extras",) in paths
    assert ("extras", "key") not in paths


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (None, "must be module:Class"),
        ("payments_pb2", "must be module:Class"),
        ("no_such_module_pb2:Payment", "generate it with protoc"),
        ("json:JSONDecoder", "is not a protobuf message class"),
    ],
)
def test_a_protobuf_class_that_cannot_be_used_is_refused_with_the_fix(
    spec: str | None, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        protobuf_class(spec)


def test_protobuf_input_needs_its_message_class() -> None:
    with pytest.raises(ConfigurationError, match="go together"):
        ScorerSettings.from_sources(
            {}, {"FRAUD_INPUT_FORMAT": "protobuf", "FRAUD_SCHEMA_REGISTRY_URL": "http://r"}
        )
