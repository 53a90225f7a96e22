"""The formats a decision may be written in (FRAUD_OUTPUT_FORMAT): the contract's JSON, or Avro,
Protobuf or JSON Schema in the Schema Registry wire format, for teams whose consumers read those.

Each registry format has a schema of the decision contract's fields and types:
`DECISION_AVRO_SCHEMA`, `decision_message()` (the Protobuf message, whose .proto text is
`DECISION_PROTO`), `DECISION_JSON_SCHEMA`. When the service starts it sets the subject
(`<output topic>-value`) to BACKWARD compatibility, the registry rule under which a consumer with
the new schema reads what the old one wrote, and registers the schema there by serializing one
decision, so a registry that refuses it stops the start; a later version of this service may
only add fields with defaults (as a reason's `text` was added beside `label`, which stays,
deprecated, until the release after next: Avro with a default, Protobuf as field 4; JSON Schema
describes it without declaring it, see there). Every decision is then written with that schema's id
(`confluent_kafka.schema_registry`'s serializers, which look the id up once and cache it). The
JSON Schema serializer does not validate each decision against the schema: the service made
them, from the same contract. Dead letters keep the input's bytes exactly, whatever the formats.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from contracts.decision import Decision, encode_decision
from plumbing.errors import ClientFailure, ConfigurationError

OUTPUT_FORMATS = ("json", "avro", "protobuf", "json-schema")
#: The registry rule the decision subject is registered under (see the module docstring).
COMPATIBILITY = "BACKWARD"

DECISION_AVRO_SCHEMA = json.dumps(
    {
        "type": "record",
        "name": "Decision",
        "namespace": "fraudscorer",
        "doc": "One decision per transaction (docs/contracts.md, Decision)",
        "fields": [
            {"name": "transaction_id", "type": "string"},
            {"name": "card_id", "type": "string"},
            {"name": "score", "type": "double", "doc": "in [0, 1]"},
            {"name": "decision", "type": "string", "doc": "approve, review or decline"},
            {"name": "model_version", "type": "string"},
            {"name": "degraded", "type": "boolean"},
            {"name": "event_time", "type": "long", "doc": "epoch ms, from the transaction"},
            {"name": "decided_at", "type": "long", "doc": "epoch ms"},
            {
                "name": "reasons",
                "type": {
                    "type": "array",
                    "items": {
                        "type": "record",
                        "name": "Reason",
                        "fields": [
                            {"name": "feature", "type": "string"},
                            {
                                "name": "label",
                                "type": "string",
                                "default": "",
                                "doc": "deprecated: the same as text; removed in the release "
                                "after next",
                            },
                            {"name": "contribution", "type": "double"},
                            # Added after 0.1.0: a default, so that this schema reads 0.1.0's
                            # decisions (BACKWARD); there they read "" (take `label` then).
                            {
                                "name": "text",
                                "type": "string",
                                "default": "",
                                "doc": "the feature's value in words",
                            },
                        ],
                    },
                },
                "default": [],
                "doc": "the model's top reasons on a review or decline",
            },
            {
                "name": "rules",
                "type": {"type": "array", "items": "string"},
                "default": [],
                "doc": "the rules that hit",
            },
            {
                "name": "features",
                "type": "string",
                "default": "",
                "doc": "with FRAUD_DECISION_FEATURES=on, the feature row scored: base64 of "
                "float32 little-endian values in the feature catalogue's order",
            },
        ],
    }
)

#: The decision as a proto3 message (`decision_message()` builds its class), for consumers that
#: generate their own with protoc.
DECISION_PROTO = """syntax = "proto3";
package fraudscorer;

// One decision per transaction (docs/contracts.md, Decision).
message Decision {
  string transaction_id = 1;
  string card_id = 2;
  double score = 3;           // in [0, 1]
  string decision = 4;        // approve, review or decline
  string model_version = 5;
  bool degraded = 6;
  int64 event_time = 7;       // epoch ms, from the transaction
  int64 decided_at = 8;       // epoch ms
  repeated Reason reasons = 9;
  repeated string rules = 10;
  string features = 11;       // with FRAUD_DECISION_FEATURES=on: base64 float32 row

  message Reason {
    string feature = 1;
    string label = 2 [deprecated = true];  // the same as text; removed in the release after next
    double contribution = 3;
    string text = 4;            // the feature's value in words ("" in 0.1.0's: take label)
  }
}
"""

DECISION_JSON_SCHEMA = json.dumps(
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Decision",
        "description": "One decision per transaction (docs/contracts.md, Decision)",
        "type": "object",
        "properties": {
            "transaction_id": {"type": "string"},
            "card_id": {"type": "string"},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "decision": {"type": "string", "enum": ["approve", "review", "decline"]},
            "model_version": {"type": "string"},
            "degraded": {"type": "boolean"},
            "event_time": {"type": "integer", "description": "epoch ms, from the transaction"},
            "decided_at": {"type": "integer", "description": "epoch ms"},
            "reasons": {
                "type": "array",
                "items": {
                    "type": "object",
                    # `text` is described, not declared: 0.1.0's reason object is open (any other
                    # property allowed), and a registry's BACKWARD check refuses a property
                    # added to an open object, as old data could hold anything under that name
                    # (Confluent: PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL, for a typed one;
                    # Apicurio: "property schemas narrowed", even for an empty schema).
                    "description": "also text (a string): the feature's value in words, absent "
                    "from release 0.1.0's decisions (read label then)",
                    "properties": {
                        "feature": {"type": "string"},
                        "label": {
                            "type": "string",
                            "description": "deprecated: the same as text; removed in the "
                            "release after next",
                        },
                        "contribution": {"type": "number"},
                    },
                    "required": ["feature", "label", "contribution"],
                },
            },
            "rules": {"type": "array", "items": {"type": "string"}},
            "features": {"type": "string"},
        },
        "required": [
            "transaction_id",
            "card_id",
            "score",
            "decision",
            "model_version",
            "degraded",
            "event_time",
            "decided_at",
        ],
    }
)

#: Encodes one decision into the output record's value.
DecisionEncoder = Callable[[Decision], bytes]
#: The serializer's call: (value, context) -> bytes.
_Serialize = Callable[[Any, Any], bytes | None]


def decision_encoder(
    output_format: str, topic: str, registry: Mapping[str, Any] | None = None
) -> DecisionEncoder:
    """The encoder of `output_format` for decisions written to `topic`; `registry` is the
    Schema Registry client's configuration, needed by every format but json.

    Raises ConfigurationError for an unknown format or a registry format without a registry
    URL, and ClientFailure when the registry refuses the schema or cannot be reached at
    start-up.
    """
    if output_format not in OUTPUT_FORMATS:
        raise ConfigurationError(
            f"unknown output format {output_format!r}; one of {', '.join(OUTPUT_FORMATS)}"
        )
    if output_format == "json":
        return encode_decision
    if not registry or not registry.get("url"):
        raise ConfigurationError(
            f"output format {output_format} needs a Schema Registry: set FRAUD_SCHEMA_REGISTRY_URL"
        )
    from confluent_kafka.serialization import MessageField, SerializationContext

    from contracts.input_formats import registry_client

    client = registry_client(registry)
    subject = f"{topic}-value"
    context = SerializationContext(topic, MessageField.VALUE)
    try:
        client.set_compatibility(subject, COMPATIBILITY)
        serialize = _serializer(output_format, client)
        serialize(_PROBE, context)  # registers the schema now, not at the first decision
    except Exception as exc:
        raise ClientFailure(
            f"cannot register the decision schema under {subject}: {type(exc).__name__}: {exc}"
        ) from exc

    def encode(decision: Decision) -> bytes:
        value = serialize(decision, context)
        assert value is not None  # a decision is never None
        return bytes(value)

    return encode


def topic_subject() -> dict[str, Any]:
    """A registry serializer's setting that names the contract's subject: the topic's own
    (`<topic>-value`). Named, because confluent-kafka 2.16.2's default first asks the registry
    for the topic's "associations" (Apicurio answers 404): one more registry call per topic, for
    nothing this contract uses."""
    from confluent_kafka.schema_registry import topic_subject_name_strategy

    return {"subject.name.strategy": topic_subject_name_strategy}


def _serializer(output_format: str, client: Any) -> _Serialize:
    """The registry serializer of a decision in `output_format` (registering its schema)."""
    if output_format == "avro":
        from confluent_kafka.schema_registry.avro import AvroSerializer

        # A decision leaves out its empty fields; every Avro field needs a value.
        return AvroSerializer(  # type: ignore[no-any-return]
            client, DECISION_AVRO_SCHEMA, _full_record, topic_subject()
        )
    if output_format == "json-schema":
        from confluent_kafka.schema_registry.json_schema import JSONSerializer

        return JSONSerializer(  # type: ignore[no-any-return]
            DECISION_JSON_SCHEMA, client, _full_record, {"validate": False, **topic_subject()}
        )
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    message = decision_message()
    protobuf = ProtobufSerializer(
        message, client, {"use.deprecated.format": False, **topic_subject()}
    )

    def serialize(decision: Decision, context: Any) -> bytes | None:
        record = _full_record(decision, context)
        record["reasons"] = [message.Reason(**reason) for reason in record["reasons"]]
        return protobuf(message(**record), context)  # type: ignore[no-any-return]

    return serialize


def _full_record(decision: Decision, _context: Any) -> dict[str, Any]:
    """The decision with its empty fields too (a registry schema names every field)."""
    return {"reasons": [], "rules": [], "features": "", **msgspec.to_builtins(decision)}


def decision_message() -> Any:
    """The Protobuf message class of `DECISION_PROTO`, as protoc would generate it."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    kind = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="fraudscorer/decision.proto", package="fraudscorer", syntax="proto3"
    )
    message = proto.message_type.add(name="Decision")
    reason = message.nested_type.add(name="Reason")
    reason_fields = (
        ("feature", "TYPE_STRING"),
        ("label", "TYPE_STRING"),  # deprecated: removed in the release after next; never reuse 2
        ("contribution", "TYPE_DOUBLE"),
        ("text", "TYPE_STRING"),  # added after 0.1.0
    )
    for number, (name, field_type) in enumerate(reason_fields, start=1):
        field = reason.field.add(
            name=name, number=number, type=getattr(kind, field_type), label=kind.LABEL_OPTIONAL
        )
        if name == "label":
            field.options.deprecated = True
    fields = (
        ("transaction_id", "TYPE_STRING"),
        ("card_id", "TYPE_STRING"),
        ("score", "TYPE_DOUBLE"),
        ("decision", "TYPE_STRING"),
        ("model_version", "TYPE_STRING"),
        ("degraded", "TYPE_BOOL"),
        ("event_time", "TYPE_INT64"),
        ("decided_at", "TYPE_INT64"),
        ("reasons", "TYPE_MESSAGE"),
        ("rules", "TYPE_STRING"),
        ("features", "TYPE_STRING"),
    )
    for number, (name, field_type) in enumerate(fields, start=1):
        repeated = name in ("reasons", "rules")
        field = message.field.add(
            name=name,
            number=number,
            type=getattr(kind, field_type),
            label=kind.LABEL_REPEATED if repeated else kind.LABEL_OPTIONAL,
        )
        if name == "reasons":
            field.type_name = ".fraudscorer.Decision.Reason"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("fraudscorer.Decision"))


#: What start-up serializes once to register the schema (written nowhere).
_PROBE = Decision("probe", "probe", 0.0, "approve", "probe", False, 0, 0)
