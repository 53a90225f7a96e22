"""The formats a decision may be written in (FRAUD_OUTPUT_FORMAT): the contract's JSON, or Avro in
the Schema Registry wire format, for teams whose consumers read Avro.

The Avro schema (`DECISION_AVRO_SCHEMA`) has the decision contract's fields and types. When the
service starts it sets its subject (`<output topic>-value`) to BACKWARD compatibility, the
registry rule under which a consumer with the new schema reads what the old one wrote, and
registers the schema there; a later version of this service may only add fields with defaults.
Every decision is then written with that schema's id (`confluent_kafka.schema_registry`'s
serializer, which looks the id up once and caches it). Dead letters keep the input's bytes
exactly, whatever the formats.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from contracts.decision import Decision, encode_decision
from contracts.errors import ClientFailure, ConfigurationError

OUTPUT_FORMATS = ("json", "avro")
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
                            {"name": "label", "type": "string"},
                            {"name": "contribution", "type": "double"},
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

#: Encodes one decision into the output record's value.
DecisionEncoder = Callable[[Decision], bytes]


def decision_encoder(
    output_format: str, topic: str, registry: Mapping[str, Any] | None = None
) -> DecisionEncoder:
    """The encoder of `output_format` for decisions written to `topic`; `registry` is the
    Schema Registry client's configuration, needed by `avro`.

    Raises ConfigurationError for an unknown format or avro without a registry URL, and
    ClientFailure when the registry refuses the schema or cannot be reached at start-up.
    """
    if output_format not in OUTPUT_FORMATS:
        raise ConfigurationError(
            f"unknown output format {output_format!r}; one of {', '.join(OUTPUT_FORMATS)}"
        )
    if output_format == "json":
        return encode_decision
    if not registry or not registry.get("url"):
        raise ConfigurationError(
            "output format avro needs a Schema Registry: set FRAUD_SCHEMA_REGISTRY_URL"
        )
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from contracts.input_formats import registry_client

    client = registry_client(registry)
    subject = f"{topic}-value"
    try:
        client.set_compatibility(subject, COMPATIBILITY)
        client.register_schema(subject, Schema(DECISION_AVRO_SCHEMA, "AVRO"))
    except Exception as exc:
        raise ClientFailure(
            f"cannot register the decision schema under {subject}: {type(exc).__name__}: {exc}"
        ) from exc
    serialize = AvroSerializer(
        client,
        DECISION_AVRO_SCHEMA,
        # A decision leaves out its empty fields; every Avro field needs a value.
        lambda decision, _context: {
            "reasons": [],
            "rules": [],
            "features": "",
            **msgspec.to_builtins(decision),
        },
        {"auto.register.schemas": False},
    )
    context = SerializationContext(topic, MessageField.VALUE)

    def encode(decision: Decision) -> bytes:
        value = serialize(decision, context)
        assert value is not None  # a decision is never None
        return bytes(value)

    return encode
