"""Decisions in a registry format across an upgrade, on the real broker and a real Schema
Registry: the decisions subject already holds release 0.1.0's schema, whose reasons carry their
words as `label` only; this release's schema (a reason's `text` beside the deprecated `label`)
registers as the subject's next version under its BACKWARD rule, as the service does at start,
and a consumer of the topic reads both releases' decisions, the words from `text` or, in a
0.1.0 decision, from `label`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from contracts.decision import Decision, Reason
from contracts.output_formats import (
    COMPATIBILITY,
    DECISION_AVRO_SCHEMA,
    DECISION_JSON_SCHEMA,
    decision_encoder,
    decision_message,
    topic_subject,
)
from tests.integration.conftest import Topics, produce, read_topic
from tests.integration.test_registry_input import (
    REGISTRY_CLIENT,
    decision_deserializer,
    registry,  # noqa: F401 (a fixture)
)
from tests.support.release_010 import release_010_avro

WORDS = "amount 229.90"
#: A review as release 0.1.0 wrote it: its reason's words under `label` only.
RELEASE_010_DECISION: dict[str, Any] = {
    "transaction_id": "t-010", "card_id": "c-1", "score": 0.62, "decision": "review",
    "model_version": "m-1", "degraded": False, "event_time": 1_700_000_000_000,
    "decided_at": 1_700_000_000_020,
    "reasons": [{"feature": "log_amount", "label": WORDS, "contribution": 0.3}],
    "rules": [], "features": "",
}  # fmt: skip
DECISION = Decision(
    "t-new", "c-1", 0.62, "review", "m-1", False, 1_700_000_000_000, 1_700_000_000_020,
    reasons=(Reason(feature="log_amount", text=WORDS, contribution=0.3),),
)  # fmt: skip
#: A serializer's or deserializer's call: (value, context) -> value.
_Serialize = Callable[[Any, Any], Any]


def release_010_json_schema() -> str:
    """0.1.0's JSON Schema: this release's, with 0.1.0's reason object."""
    schema = json.loads(DECISION_JSON_SCHEMA)
    schema["properties"]["reasons"]["items"] = {
        "type": "object",
        "properties": {
            "feature": {"type": "string"},
            "label": {"type": "string"},
            "contribution": {"type": "number"},
        },
        "required": ["feature", "label", "contribution"],
    }
    return json.dumps(schema)


def release_010_message() -> Any:
    """0.1.0's Protobuf message: this release's without a reason's field 4 (`text`), its
    `label` not marked deprecated."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto()
    decision_message().DESCRIPTOR.file.CopyToProto(proto)
    (reason,) = proto.message_type[0].nested_type
    kept = [field for field in reason.field if field.number != 4]
    del reason.field[:]
    reason.field.extend(kept)
    for field in reason.field:
        field.ClearField("options")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("fraudscorer.Decision"))


def release_010_serializer(output_format: str, client: SchemaRegistryClient) -> _Serialize:
    """What release 0.1.0's service wrote decisions with."""
    subject = topic_subject()
    if output_format == "avro":
        return AvroSerializer(client, release_010_avro(), conf=subject)
    if output_format == "json-schema":
        return JSONSerializer(
            release_010_json_schema(), client, conf={"validate": False, **subject}
        )
    message = release_010_message()
    protobuf = ProtobufSerializer(message, client, {"use.deprecated.format": False, **subject})

    def serialize(record: dict[str, Any], context: Any) -> bytes | None:
        reasons = [message.Reason(**reason) for reason in record["reasons"]]
        return protobuf(message(**{**record, "reasons": reasons}), context)

    return serialize


@pytest.mark.parametrize("output_format", ["avro", "protobuf", "json-schema"])
def test_the_schema_with_text_evolves_the_subject_and_both_releases_decisions_read(
    output_format: str,
    registry: SchemaRegistryClient,  # noqa: F811 (the fixture)
    topics_factory: Callable[..., Topics],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The encoder's registry client is the test's, which the fixture closes (the service keeps
    # its own for its life).
    monkeypatch.setattr("contracts.input_formats.registry_client", lambda settings: registry)
    topics = topics_factory(1)
    context = SerializationContext(topics.output, MessageField.VALUE)
    subject = f"{topics.output}-value"
    registry.set_compatibility(subject, COMPATIBILITY)
    written_by_010 = release_010_serializer(output_format, registry)(RELEASE_010_DECISION, context)

    # This release's start-up: BACKWARD on the subject, then its schema registered.
    encode = decision_encoder(output_format, topics.output, REGISTRY_CLIENT)
    produce(topics.output, [(b"c-1", written_by_010), (b"c-1", encode(DECISION))])

    assert registry.get_compatibility(subject) == "BACKWARD"
    versions = registry.get_versions(subject)
    assert len(versions) == 2, "this release's schema is the subject's second version"
    # A team's consumer with this release's schema.
    consume = decision_deserializer(output_format, registry, DECISION_AVRO_SCHEMA)
    old, new = (consume(m.value(), context) for m in read_topic(topics.output, 2))
    (old_reason,), (new_reason,) = old["reasons"], new["reasons"]
    assert new_reason["text"] == new_reason["label"] == WORDS
    assert old_reason["label"] == WORDS
    assert not old_reason.get("text"), "0.1.0 wrote none: absent, or the schema's default"
    # A consumer's reading of the words: `text`, else `label`.
    assert [(r.get("text") or r["label"]) for r in (old_reason, new_reason)] == [WORDS, WORDS]
    # The contract's own decoder fills `text` from a 0.1.0 decision's `label`.
    decoded = msgspec.convert(
        {**old, "event_time": int(old["event_time"]), "decided_at": int(old["decided_at"])},
        Decision,
    )
    assert decoded.reasons[0].text == WORDS
