"""Avro and JSON Schema input through the real broker and a real Schema Registry (Apicurio's
Confluent-compatible API, started by `make registry-up` / `make test`): the Confluent
serializers write, the service decides every record once, a producer moves to a new schema
version mid-run without a restart, and records the registry cannot read are dead-lettered with
their own reason and their bytes unchanged; decisions written in Avro read back with the
Confluent deserializer; a registry that is down holds the input and loses
nothing; both worked examples of examples/ (a team's own fields, mapped) run end to end."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import socket
import struct
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from contracts.output_formats import topic_subject
from simulator.team_shapes import ENTRY_MODES, authorization, checkout_event
from simulator.transactions import TransactionSimulator
from tests.integration.conftest import ServiceProcess, Topics, produce, read_topic
from tests.support.network import free_port
from tests.support.records import raw_headers, value_of

REGISTRY_URL = os.environ.get(
    "FRAUD_TEST_SCHEMA_REGISTRY_URL", "http://127.0.0.1:18081/apis/ccompat/v7"
)
#: The test clients' registry settings: a stuck request fails in seconds, not at pytest's timeout.
REGISTRY_CLIENT = {"url": REGISTRY_URL, "timeout": 10}
#: Every serializer writes under the topic's own subject, as the service reads it.
TOPIC_SUBJECT = topic_subject()

_FIELDS: list[dict[str, Any]] = [
    {"name": "transaction_id", "type": "string"},
    {"name": "card_id", "type": "string"},
    {"name": "merchant_id", "type": "string"},
    {"name": "terminal_id", "type": ["null", "string"], "default": None},
    {"name": "amount", "type": "double"},
    {"name": "currency", "type": "string"},
    {"name": "mcc", "type": "int"},
    {"name": "country", "type": "string"},
    {"name": "channel", "type": "string"},
    {"name": "card_present", "type": "boolean"},
    {"name": "event_time", "type": "long"},
]
AVRO_V1 = {"type": "record", "name": "CardTransaction", "namespace": "pay", "fields": _FIELDS}
#: v2: a producer adds an optional field (BACKWARD compatible).
AVRO_V2 = {
    **AVRO_V1,
    "fields": [*_FIELDS, {"name": "device_id", "type": ["null", "string"], "default": None}],
}
_JSON_TYPES = {"string": "string", "double": "number", "int": "integer", "long": "integer",
               "boolean": "boolean"}  # fmt: skip
JSON_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "CardTransaction",
    "type": "object",
    "properties": {
        f["name"]: {
            "type": _JSON_TYPES[f["type"]] if isinstance(f["type"], str) else ["null", "string"]
        }
        for f in _FIELDS
    },
    "required": [f["name"] for f in _FIELDS if f["name"] != "terminal_id"],
}


@pytest.fixture(scope="module")
def registry() -> Iterator[SchemaRegistryClient]:
    try:
        with urllib.request.urlopen(f"{REGISTRY_URL}/subjects", timeout=5):
            pass
    except OSError as exc:
        pytest.fail(f"no Schema Registry at {REGISTRY_URL} ({exc}): run `make registry-up`")
    with SchemaRegistryClient(REGISTRY_CLIENT) as client:
        yield client


def transactions(n: int, prefix: str) -> list[dict[str, Any]]:
    return [dict(r) for r in TransactionSimulator(17, id_prefix=prefix).generate(n).records]


def serialize(
    serializer: Callable[[Any, SerializationContext], bytes | None],
    topic: str,
    records: list[dict[str, Any]],
    keys: list[str] | None = None,
) -> list[tuple[bytes | None, bytes | None]]:
    """The records' values, keyed by their card id (or by `keys`: records in a team's shape)."""
    context = SerializationContext(topic, MessageField.VALUE)
    cards = [r["card_id"] for r in records] if keys is None else keys
    return [(card.encode(), serializer(r, context)) for card, r in zip(cards, records, strict=True)]


def decided(topics: Topics, expected: int) -> Counter[str]:
    """Each transaction id's decisions."""
    return Counter(
        json.loads(value_of(m))["transaction_id"] for m in read_topic(topics.output, expected)
    )


def evolved_then_unreadable(
    topics: Topics,
    service: ServiceProcess,
    v1: list[dict[str, Any]],
    v2: list[dict[str, Any]],
    v2_records: list[tuple[bytes | None, bytes | None]],
) -> None:
    """After v1 records, produce the v2 records (a newer schema version), one with a schema id
    the registry does not know and one not in the wire format; every v1 and v2 transaction is
    decided once and the two others are dead-lettered with their reasons, bytes unchanged."""
    value = v2_records[0][1]
    assert value is not None
    unknown_id = b"\x00" + struct.pack(">I", 987_654_321) + value[5:]
    not_wire_format = b'{"transaction_id": "plain-json"}'
    produce(topics.input, [*v2_records, (b"c-unknown", unknown_id), (b"c-raw", not_wire_format)])

    counts = decided(topics, len(v1) + len(v2))
    assert set(counts) == {r["transaction_id"] for r in v1 + v2}
    assert set(counts.values()) == {1}, "each decided once"
    letters = read_topic(topics.dlq, 2)
    reasons = {dict(raw_headers(m))["dlq.reason"].decode(): m.value() for m in letters}
    assert reasons == {"schema_unknown": unknown_id, "schema_decode": not_wire_format}
    assert service.process.poll() is None


def test_avro_input_evolves_without_a_restart_and_dead_letters_what_the_registry_cannot_read(
    registry: SchemaRegistryClient,
    topics_factory: Callable[..., Topics],
    service_factory: Callable[..., ServiceProcess],
) -> None:
    topics = topics_factory()
    service = service_factory(
        topics, "--input-format", "avro", "--schema-registry-url", REGISTRY_URL
    )
    v1 = transactions(200, "avro1")
    produce(
        topics.input,
        serialize(
            AvroSerializer(registry, json.dumps(AVRO_V1), conf=TOPIC_SUBJECT), topics.input, v1
        ),
    )
    service.wait_for_metric("fraud_records_consumed_total", 200)

    # Mid-run, the producer moves to v2 (an added optional field): a new schema id.
    v2 = [{**r, "device_id": f"d-{i}"} for i, r in enumerate(transactions(100, "avro2"))]
    v2_serializer = AvroSerializer(registry, json.dumps(AVRO_V2), conf=TOPIC_SUBJECT)
    v2_records = serialize(v2_serializer, topics.input, v2)
    v1_value = serialize(
        AvroSerializer(registry, json.dumps(AVRO_V1), conf=TOPIC_SUBJECT), topics.input, v1[:1]
    )[0][1]
    v2_value = v2_records[0][1]
    assert v2_value is not None and v1_value is not None and v2_value[1:5] != v1_value[1:5], (
        "v2 has a schema id of its own"
    )
    evolved_then_unreadable(topics, service, v1, v2, v2_records)


def test_json_schema_input_is_decided(
    registry: SchemaRegistryClient,
    topics_factory: Callable[..., Topics],
    service_factory: Callable[..., ServiceProcess],
) -> None:
    topics = topics_factory()
    service_factory(topics, "--input-format", "json-schema", "--schema-registry-url", REGISTRY_URL)
    records = transactions(150, "jsons")
    serializer = JSONSerializer(json.dumps(JSON_SCHEMA), registry, conf=TOPIC_SUBJECT)
    produce(topics.input, serialize(serializer, topics.input, records))
    counts = decided(topics, 150)
    assert set(counts) == {r["transaction_id"] for r in records}
    assert set(counts.values()) == {1}


class RegistryLink:
    """A TCP link to the registry that the test can cut: while down, connections are refused,
    as from a registry that is down; up again, the same port forwards once more."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self.port = free_port()
        self._server: socket.socket | None = None
        self._open: list[socket.socket] = []

    def up(self) -> None:
        server = socket.create_server(("127.0.0.1", self.port))
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def down(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for connection in self._open:
            with contextlib.suppress(OSError):
                connection.close()
        self._open.clear()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return  # closed: down
            upstream = socket.create_connection(self._target)
            self._open += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def test_a_registry_that_is_down_holds_the_input_and_loses_nothing(
    registry: SchemaRegistryClient,
    topics_factory: Callable[..., Topics],
    service_factory: Callable[..., ServiceProcess],
) -> None:
    target = urllib.parse.urlsplit(REGISTRY_URL)
    link = RegistryLink((target.hostname or "127.0.0.1", target.port or 80))
    url = REGISTRY_URL.replace(target.netloc, f"127.0.0.1:{link.port}")
    topics = topics_factory()
    service = service_factory(
        topics, "--input-format", "avro", "--schema-registry-url", url,
        "--retry-backoff-max-ms", "2000",
    )  # fmt: skip
    records = transactions(100, "down")
    produce(
        topics.input,
        serialize(
            AvroSerializer(registry, json.dumps(AVRO_V1), conf=TOPIC_SUBJECT), topics.input, records
        ),
    )
    time.sleep(10)  # the registry is down for 10 s: nothing decided, nothing dead-lettered
    assert read_topic(topics.output, 1, timeout_s=1, settle_s=0) == []
    assert read_topic(topics.dlq, 1, timeout_s=1, settle_s=0) == []
    assert service.process.poll() is None, service.log()
    assert "holding topic=" in service.log()

    link.up()
    try:
        counts = decided(topics, 100)
    finally:
        link.down()
    assert set(counts) == {r["transaction_id"] for r in records}
    assert set(counts.values()) == {1}
    assert read_topic(topics.dlq, 1, timeout_s=2, settle_s=0) == []


EXAMPLES = Path(__file__).parents[2] / "examples"


def test_the_card_processor_example_runs_end_to_end(
    registry: SchemaRegistryClient,
    topics_factory: Callable[..., Topics],
    service_factory: Callable[..., ServiceProcess],
) -> None:
    topics = topics_factory()
    records = [
        r for r in transactions(300, "iso") if (r["channel"], r["card_present"]) in ENTRY_MODES
    ]
    schema = (EXAMPLES / "iso8583" / "schema.avsc").read_text()
    values = serialize(
        AvroSerializer(registry, schema, conf=TOPIC_SUBJECT),
        topics.input,
        [authorization(r) for r in records],
        [r["card_id"] for r in records],
    )
    produce(topics.input, values[:1])  # registers the schema: the mapping is checked against it
    service = service_factory(
        topics, "--input-format", "avro", "--schema-registry-url", REGISTRY_URL,
        "--input-mapping", str(EXAMPLES / "iso8583" / "mapping.toml"),
    )  # fmt: skip
    produce(topics.input, values[1:])
    counts = decided(topics, len(records))
    assert set(counts) == {r["transaction_id"] for r in records}
    assert set(counts.values()) == {1}
    assert read_topic(topics.dlq, 1, timeout_s=2, settle_s=0) == []
    assert "input mapping checked against" in service.log()


def test_the_checkout_example_runs_end_to_end(
    registry: SchemaRegistryClient,
    topics_factory: Callable[..., Topics],
    service_factory: Callable[..., ServiceProcess],
) -> None:
    topics = topics_factory()
    records = transactions(200, "shop")
    schema = (EXAMPLES / "checkout" / "schema.json").read_text()
    serializer = JSONSerializer(schema, registry, conf=TOPIC_SUBJECT)
    service_factory(
        topics, "--input-format", "json-schema", "--schema-registry-url", REGISTRY_URL,
        "--input-mapping", str(EXAMPLES / "checkout" / "mapping.toml"),
    )  # fmt: skip
    events = [checkout_event(r) for r in records]
    produce(
        topics.input, serialize(serializer, topics.input, events, [r["card_id"] for r in records])
    )
    counts = decided(topics, len(records))
    assert set(counts) == {r["transaction_id"] for r in records}
    assert set(counts.values()) == {1}


def test_a_mapping_that_does_not_fit_the_registered_schema_stops_the_start(
    registry: SchemaRegistryClient,
    topics_factory: Callable[..., Topics],
    service_factory: Callable[..., ServiceProcess],
    tmp_path: Path,
) -> None:
    topics = topics_factory()
    schema = (EXAMPLES / "iso8583" / "schema.avsc").read_text()
    record = authorization(transactions(1, "typo")[0] | {"channel": "pos", "card_present": True})
    produce(
        topics.input,
        serialize(
            AvroSerializer(registry, schema, conf=TOPIC_SUBJECT),
            topics.input,
            [record],
            [record["pan_token"]],
        ),
    )
    mapping = tmp_path / "mapping.toml"
    mapping.write_text(
        (EXAMPLES / "iso8583" / "mapping.toml").read_text().replace('"pan_token"', '"pan"')
    )
    service = service_factory(
        topics, "--input-format", "avro", "--schema-registry-url", REGISTRY_URL,
        "--input-mapping", str(mapping),
    )  # fmt: skip
    assert service.wait(60) == 2
    assert "card_id = 'pan', but the input schema has no such field" in service.log()


def decision_deserializer(
    output_format: str, registry: SchemaRegistryClient, avro_reader_schema: str | None = None
) -> Any:
    """Confluent's deserializer of decisions in `output_format`, as a team's consumer makes it,
    returning dicts; in Avro it reads with `avro_reader_schema` (None: the writer's schema, by
    the id in each record)."""
    if output_format == "avro":
        return AvroDeserializer(registry, avro_reader_schema)
    if output_format == "json-schema":
        from confluent_kafka.schema_registry.json_schema import JSONDeserializer

        return JSONDeserializer(None, schema_registry_client=registry)
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
    from google.protobuf.json_format import MessageToDict

    from contracts.output_formats import decision_message

    read = ProtobufDeserializer(decision_message(), {"use.deprecated.format": False})
    return lambda value, context: MessageToDict(
        read(value, context),
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )


@pytest.mark.parametrize("registry_format", ["avro", "protobuf", "json-schema"])
def test_a_registry_format_in_and_out_read_back_by_a_confluent_deserializer(
    registry_format: str,
    registry: SchemaRegistryClient,
    topics_factory: Callable[..., Topics],
    service_factory: Callable[..., ServiceProcess],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A producer's serializer -> the service -> decisions in the same format, read back by
    Confluent's deserializer: each transaction decided once."""
    flags = ["--input-format", registry_format, "--output-format", registry_format]
    records = transactions(200, f"roundtrip-{registry_format}")
    if registry_format == "protobuf":
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

        (tmp_path / "team_payment_pb2.py").write_text(PROTO_MODULE, encoding="utf-8")
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.setenv(
            "PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
        )
        team = importlib.import_module("team_payment_pb2")

        flags += ["--input-protobuf-message", "team_payment_pb2:Payment"]
        protobuf = ProtobufSerializer(
            team.Payment, registry, {"use.deprecated.format": False, **TOPIC_SUBJECT}
        )
        records = [{k: v for k, v in r.items() if v is not None} for r in records]
        serializer: Any = lambda r, c: protobuf(team.Payment(**r), c)  # noqa: E731
    elif registry_format == "json-schema":
        serializer = JSONSerializer(json.dumps(JSON_SCHEMA), registry, conf=TOPIC_SUBJECT)
    else:
        serializer = AvroSerializer(registry, json.dumps(AVRO_V1), conf=TOPIC_SUBJECT)
    topics = topics_factory()
    service_factory(topics, *flags, "--schema-registry-url", REGISTRY_URL)
    produce(topics.input, serialize(serializer, topics.input, records))

    context = SerializationContext(topics.output, MessageField.VALUE)
    deserialize = decision_deserializer(registry_format, registry)
    decisions = [deserialize(m.value(), context) for m in read_topic(topics.output, 200)]
    assert Counter(d["transaction_id"] for d in decisions) == Counter(
        r["transaction_id"] for r in records
    ), "each decided once"
    event_times = {r["transaction_id"]: r["event_time"] for r in records}
    for decision in decisions:
        assert 0.0 <= decision["score"] <= 1.0
        assert decision["decision"] in ("approve", "review", "decline")
        assert int(decision["event_time"]) == event_times[decision["transaction_id"]]
        assert isinstance(decision["reasons"], list) and isinstance(decision["rules"], list)
        assert all(r["text"] and r["label"] == r["text"] for r in decision["reasons"])
    subject = f"{topics.output}-value"
    assert registry.get_compatibility(subject) == "BACKWARD"
    kind = {"avro": "AVRO", "protobuf": "PROTOBUF", "json-schema": "JSON"}[registry_format]
    assert registry.get_latest_version(subject).schema.schema_type == kind


#: A team's generated protobuf module (simulator/team_shapes.py builds its classes as protoc's
#: output would); the service imports v1 by name.
PROTO_MODULE = """
from contracts.output_formats import topic_subject
from simulator.team_shapes import payment_message

Payment = payment_message(1)
PaymentV2 = payment_message(2)
"""


def test_protobuf_input_evolves_and_dead_letters_what_it_cannot_read(
    registry: SchemaRegistryClient,
    topics_factory: Callable[..., Topics],
    service_factory: Callable[..., ServiceProcess],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    (tmp_path / "team_payment_pb2.py").write_text(PROTO_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    team = importlib.import_module("team_payment_pb2")

    topics = topics_factory()
    service = service_factory(
        topics,
        "--input-format",
        "protobuf",
        "--input-protobuf-message",
        "team_payment_pb2:Payment",
        "--schema-registry-url",
        REGISTRY_URL,
    )

    def payments(
        kind: Any, records: list[dict[str, Any]]
    ) -> list[tuple[bytes | None, bytes | None]]:
        serializer = ProtobufSerializer(
            kind, registry, {"use.deprecated.format": False, **TOPIC_SUBJECT}
        )
        return serialize(lambda r, c: serializer(kind(**r), c), topics.input, records)

    v1 = transactions(150, "proto1")
    without_terminal = {**v1[0], "terminal_id": None}
    v1 = [{k: v for k, v in without_terminal.items() if v is not None}, *v1[1:]]
    produce(topics.input, payments(team.Payment, v1))
    # A producer on v2 (an added field, a schema id of its own) is read with the v1 class.
    v2 = [{**r, "device_id": f"d-{i}"} for i, r in enumerate(transactions(100, "proto2"))]
    v2_records = payments(team.PaymentV2, v2)
    assert v2_records[0][1] is not None
    evolved_then_unreadable(topics, service, v1, v2, v2_records)
