"""How a Schema Registry record's failures are sorted (contracts/input_formats.py): what the
registry does not know, or what does not decode, is the record's fault and dead-lettered; what
may pass (the registry unreachable, overloaded, refusing credentials) never is. The registry
round trips themselves run against a real registry (tests/integration/test_registry_input.py).
And what each decision format needs."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka.schema_registry.common._httpx_compat import httpx
from confluent_kafka.schema_registry.error import SchemaRegistryError

from contracts.decision import encode_decision
from contracts.errors import (
    ConfigurationError,
    RegistryUnavailableError,
    SchemaDecodeError,
    SchemaUnknownError,
)
from contracts.input_formats import _deserialized, transaction_decoder
from contracts.output_formats import decision_encoder
from contracts.transaction import decode_transaction


def failing(exc: BaseException) -> Any:
    def deserialize(value: bytes, context: object) -> Any:
        raise exc

    return deserialize


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (SchemaRegistryError(404, 40403, "Schema 7 not found"), SchemaUnknownError),
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


def test_json_decisions_need_no_registry_and_avro_ones_need_one() -> None:
    assert decision_encoder("json", "decisions") is encode_decision
    with pytest.raises(ConfigurationError, match="FRAUD_SCHEMA_REGISTRY_URL"):
        decision_encoder("avro", "decisions", {})
    with pytest.raises(ConfigurationError, match="unknown output format 'protobuf'"):
        decision_encoder("protobuf", "decisions")
