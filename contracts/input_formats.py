"""The formats a transaction may arrive in (FRAUD_INPUT_FORMAT), each decoded to the one
`Transaction` contract:

- `json`: the contract's JSON (`contracts/transaction.py`), no registry.
- `avro`, `json-schema`: Confluent's Schema Registry wire format (a magic byte and the schema
  id before the payload), decoded by `confluent_kafka.schema_registry`'s deserializers with the
  writer's schema fetched by its id and cached, so a producer that moves to a new schema
  version (an added optional field) is read without a restart. The decoded record is then
  validated against the contract in one msgspec pass, like JSON; JSON Schema records are not
  also validated against the writer's schema (its serializer did, on the producer's side).
- `protobuf`: the same wire format (and the message indexes), parsed by the client's
  `ProtobufDeserializer` with the team's generated message class (FRAUD_INPUT_PROTOBUF_MESSAGE):
  Protobuf reads a newer writer's message with an older class (unknown fields are skipped), so
  schema versions need no restart either. The schema id is looked up in the registry (cached) so
  that an unknown one is dead-lettered as for Avro; the writer's schema itself is not fetched
  (Apicurio's Confluent-compatible API does not serve the `serialized` form the client asks
  for, docs/input-mapping.md).

Before a registry record is decoded, its schema id is checked (`contracts/writer_schemas.py`,
once per id): it must be registered under the topic's subject (or FRAUD_SCHEMA_REGISTRY_SUBJECTS)
and have no shape that allocates without bound. A registry record or a mapped JSON record longer
than FRAUD_MAX_RECORD_BYTES is not decoded at all, so what one record decodes into is bounded
(docs/threat-model.md). Avro logical types are read as the contract's plain values: a
timestamp-millis or -micros as epoch milliseconds, a decimal as a number, a uuid as text.

How a registry record fails (docs/contracts.md, "Dead letter"):
- a schema id the registry says it does not know (its code 40403): `SchemaUnknownError` (dead
  letter `schema_unknown`);
- not the wire format, too long, a writer schema refused, or bytes that do not decode with their
  schema: `SchemaDecodeError` (`schema_decode`);
- a lookup that failed for a cause that may pass (the registry unreachable, a timeout, 5xx, 429,
  refused credentials, a 404 that is not the registry's own "not found"):
  `RegistryUnavailableError`, never a dead letter: the consuming loop holds the record's
  partition and reads it again after a backoff.

The registry client's own retries are off (`max.retries` 0): a lookup that fails returns at
once, so a registry that is down holds one partition, not the whole consuming loop.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any, cast

import msgspec

from contracts.field_mapping import FieldMapping, avro_paths, json_schema_paths
from contracts.transaction import Transaction, decode_transaction
from contracts.writer_schemas import (
    WriterSchema,
    WriterSchemas,
    plain_logical_values,
    registry_failure,
)
from plumbing.errors import (
    ConfigurationError,
    DecodeError,
    RegistryUnavailableError,
    SchemaDecodeError,
    ValidationError,
)

log = logging.getLogger(__name__)

INPUT_FORMATS = ("json", "avro", "json-schema", "protobuf")
#: Registry client settings under the user's: fail fast, the loop retries (see above).
REGISTRY_DEFAULTS: Mapping[str, Any] = {"max.retries": 0, "timeout": 5}
#: The longest record value a registry format or a mapping decodes (FRAUD_MAX_RECORD_BYTES):
#: a payment record is under a few kilobytes; what one decodes into is bounded by its length.
DEFAULT_MAX_RECORD_BYTES = 65_536
#: The registry's name of each input format's schemas.
_SCHEMA_TYPES = {"avro": "AVRO", "json-schema": "JSON", "protobuf": "PROTOBUF"}

#: Magic byte and schema id, before the payload (and a protobuf record's message indexes).
_WIRE_HEADER_BYTES = 5
#: Nested messages deeper than this are not walked for mapping paths (recursive types).
_MAX_PROTOBUF_DEPTH = 8

#: Decodes one record value of the input topic into a transaction.
TransactionDecoder = Callable[[bytes | None], Transaction]


def transaction_decoder(
    input_format: str,
    topic: str,
    registry: Mapping[str, Any] | None = None,
    mapping: FieldMapping | None = None,
    protobuf_message: str | None = None,
    *,
    subjects: Collection[str] = (),
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    client: Any = None,
) -> TransactionDecoder:
    """The decoder of `input_format` for records of `topic`; `registry` is the Schema Registry
    client's configuration (`url` and any credentials), needed by the registry formats;
    `mapping` maps the team's fields onto the contract's (`contracts/field_mapping.py`);
    `protobuf_message` (module:Class) is the protobuf format's generated message class;
    `subjects`: those a writer schema must be registered under (default `<topic>-value`);
    `max_record_bytes`: the longest record a registry format or a mapping decodes; `client`:
    a registry client to use (its owner closes it) instead of one made from `registry`.

    Raises ConfigurationError for an unknown format, a registry format without a registry URL,
    registry settings the client does not take, or a mapping the topic's registered schema
    does not satisfy.
    """
    if input_format not in INPUT_FORMATS:
        raise ConfigurationError(
            f"unknown input format {input_format!r}; one of {', '.join(INPUT_FORMATS)}"
        )
    if input_format == "json":
        # The contract's own JSON needs no length bound: its typed decoder allocates only the
        # contract's fields, and skips the rest without building it.
        return decode_transaction if mapping is None else _mapped_json(mapping, max_record_bytes)
    if client is None and (not registry or not registry.get("url")):
        raise ConfigurationError(
            f"input format {input_format} needs a Schema Registry: set FRAUD_SCHEMA_REGISTRY_URL"
        )
    from confluent_kafka.schema_registry import prefix_schema_id_deserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = client or registry_client(registry or {})
    context = SerializationContext(topic, MessageField.VALUE)
    writer_schemas = WriterSchemas(
        client, subjects or (f"{topic}-value",), _SCHEMA_TYPES[input_format], _http_errors
    )
    # The schema id from the payload's prefix only: the one `writer_schemas` checked.
    conf = {"schema.id.deserializer": prefix_schema_id_deserializer}
    deserialize: Callable[[bytes, SerializationContext], Any]
    if input_format == "protobuf":
        message_class = protobuf_class(protobuf_message)
        if mapping is not None:
            mapping.check_schema_fields(protobuf_paths(message_class.DESCRIPTOR))
        deserialize = _protobuf_deserializer(message_class)
    elif mapping is not None:
        _check_registered_schema(client, f"{topic}-value", input_format, mapping)
    if input_format == "avro":
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        deserialize = AvroDeserializer(client, conf=conf)
    elif input_format == "json-schema":
        from confluent_kafka.schema_registry.json_schema import JSONDeserializer

        # Not validated against the writer's schema per record (its producer's serializer did;
        # the contract validates what scoring reads): 43,319 records/s against 8,837 with it.
        deserialize = JSONDeserializer(
            None, schema_registry_client=client, conf={**conf, "validate": False}
        )

    def decode(value: bytes | None) -> Transaction:
        writer = _writer_schema(writer_schemas, value, max_record_bytes)
        record = _deserialized(deserialize, cast(bytes, value), context)
        if writer.logical_paths:
            plain_logical_values(record, writer.logical_paths)
        return _converted(record if mapping is None else mapping.apply(record))

    return decode


def _writer_schema(
    writer_schemas: WriterSchemas, value: bytes | None, max_record_bytes: int
) -> WriterSchema:
    """The checked writer schema a registry record names in its prefix."""
    if value is None:
        raise DecodeError("record has no value (tombstone)")
    if len(value) > max_record_bytes:
        raise SchemaDecodeError(
            f"record of {len(value):,} bytes, over FRAUD_MAX_RECORD_BYTES ({max_record_bytes:,})"
        )
    if len(value) < _WIRE_HEADER_BYTES or value[0] != 0:
        raise SchemaDecodeError(
            "not the Schema Registry wire format (magic byte 0, then a 4-byte schema id)"
        )
    return writer_schemas.check(int.from_bytes(value[1:_WIRE_HEADER_BYTES], "big"))


def registry_client(registry: Mapping[str, Any]) -> Any:
    """A Schema Registry client with `REGISTRY_DEFAULTS` under `registry`; ConfigurationError
    for settings the client does not take."""
    # Imported here: the JSON path (the default) needs none of the registry's dependencies.
    from confluent_kafka.schema_registry import SchemaRegistryClient

    try:
        return SchemaRegistryClient({**REGISTRY_DEFAULTS, **registry})
    except ValueError as exc:
        raise ConfigurationError(f"schema registry settings (schema.registry.*): {exc}") from exc


def _mapped_json(mapping: FieldMapping, max_record_bytes: int) -> TransactionDecoder:
    """JSON in the team's own shape: decoded untyped (so at most `max_record_bytes` of it),
    mapped, then validated by the contract."""

    def decode(value: bytes | None) -> Transaction:
        if value is None:
            raise DecodeError("record has no value (tombstone)")
        if len(value) > max_record_bytes:
            raise DecodeError(
                f"record of {len(value):,} bytes, over FRAUD_MAX_RECORD_BYTES "
                f"({max_record_bytes:,})"
            )
        try:
            record = msgspec.json.decode(value)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise DecodeError(f"not JSON: {exc}") from exc
        if not isinstance(record, dict):
            raise ValidationError(f"expected a JSON object, got {type(record).__name__}")
        return _converted(mapping.apply(record))

    return decode


def _converted(record: Mapping[str, Any]) -> Transaction:
    try:
        return msgspec.convert(record, Transaction)
    except msgspec.ValidationError as exc:
        raise ValidationError(str(exc)) from exc


def _check_registered_schema(
    client: Any, subject: str, input_format: str, mapping: FieldMapping
) -> None:
    """Check the mapping against the latest schema of the topic's subject, at start-up. No
    schema registered yet, or no registry reachable: checked record by record instead."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        registered = client.get_latest_version(subject)
    except SchemaRegistryError as exc:
        log.warning("input mapping not checked at start-up: subject %s: %s", subject, exc)
        return
    except Exception as exc:  # unreachable now: the records will tell
        log.warning("input mapping not checked at start-up: schema registry: %s", exc)
        return
    schema = json.loads(registered.schema.schema_str)
    paths = avro_paths(schema) if input_format == "avro" else json_schema_paths(schema)
    mapping.check_schema_fields(paths)
    log.info("input mapping checked against %s version %s", subject, registered.version)


def _deserialized(
    deserialize: Callable[[bytes, Any], Any], value: bytes, context: Any
) -> dict[str, Any]:
    """The record as the registry's deserializer reads it, its failures sorted by cause."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        record = deserialize(value, context)
    except SchemaRegistryError as exc:
        raise registry_failure(exc, "the record's schema") from exc
    except (OSError, _http_errors()) as exc:
        raise RegistryUnavailableError(
            f"schema registry unreachable: {type(exc).__name__}: {exc}"
        ) from exc
    except Exception as exc:  # whatever the payload provokes in the decoder
        raise SchemaDecodeError(f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(record, dict):  # what every deserializer returns; cheaper than the ABC
        raise SchemaDecodeError(f"the schema decodes to {type(record).__name__}, not a record")
    return record


def protobuf_class(spec: str | None) -> Any:
    """The generated message class named `module:Class`; ConfigurationError saying what to fix
    when it cannot be imported or is not a protobuf message."""
    from google.protobuf.message import Message

    module_name, _, class_name = (spec or "").partition(":")
    if not module_name or not class_name:
        raise ConfigurationError(
            f"FRAUD_INPUT_PROTOBUF_MESSAGE must be module:Class (e.g. payments_pb2:Payment), "
            f"got {spec!r}"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"cannot import {module_name!r} for FRAUD_INPUT_PROTOBUF_MESSAGE: {exc}; generate it "
            "with protoc --python_out and put its directory on PYTHONPATH"
        ) from exc
    message_class = getattr(module, class_name, None)
    if not (isinstance(message_class, type) and issubclass(message_class, Message)):
        raise ConfigurationError(
            f"{spec!r} is not a protobuf message class (FRAUD_INPUT_PROTOBUF_MESSAGE)"
        )
    return message_class


def protobuf_paths(descriptor: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every field path a protobuf message declares, nested messages included."""
    paths: list[tuple[str, ...]] = []
    for field in descriptor.fields:
        path = (*prefix, field.name)
        paths.append(path)
        nested = field.message_type is not None and not _is_map(field)
        if nested and len(path) < _MAX_PROTOBUF_DEPTH:
            paths.extend(protobuf_paths(field.message_type, path))
    return paths


def _protobuf_deserializer(message_class: Any) -> Callable[[bytes, Any], Any]:
    from confluent_kafka.schema_registry import prefix_schema_id_deserializer
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer

    parse = ProtobufDeserializer(
        message_class,
        {"use.deprecated.format": False, "schema.id.deserializer": prefix_schema_id_deserializer},
    )

    def deserialize(value: bytes, context: Any) -> Mapping[str, Any]:
        return _message_dict(parse(value, context))

    return deserialize


def _message_dict(message: Any) -> dict[str, Any]:
    """A parsed message as plain values: a field without presence that was not sent reads as
    its default (proto3 sends no false, 0 or ""), one with presence only when set; enums by
    name, nested messages and maps as dicts."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        repeated = field.is_repeated
        if not repeated and field.has_presence and not message.HasField(field.name):
            continue
        value = getattr(message, field.name)
        if _is_map(field):
            entry = field.message_type.fields_by_name["value"]
            value = {k: _plain(entry, v) for k, v in value.items()}
        elif repeated:
            value = [_plain(field, v) for v in value]
        else:
            value = _plain(field, value)
        out[field.name] = value
    return out


def _plain(field: Any, value: Any) -> Any:
    """One value of `field` as a plain value: a message as a dict, an enum by name (by number
    when this class does not know it: a newer writer's value)."""
    if field.message_type is not None:
        return _message_dict(value)
    if field.enum_type is not None:
        known = field.enum_type.values_by_number.get(value)
        return value if known is None else known.name
    return value


def _is_map(field: Any) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _http_errors() -> type[BaseException]:
    """The registry client's transport errors (timeouts, refused connections): those of the
    HTTP library it imports (httpx, or httpx2 from confluent-kafka 2.16)."""
    from confluent_kafka.schema_registry.common._httpx_compat import httpx

    return httpx.TransportError
