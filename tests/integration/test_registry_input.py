"""Avro and JSON Schema input through the real broker and a real Schema Registry (Apicurio's
Confluent-compatible API, started by `make registry-up` / `make test`): the Confluent
serializers write, the service decides every record once, a producer moves to a new schema
version mid-run without a restart, and records the registry cannot read are dead-lettered with
their own reason and their bytes unchanged; a registry that is down holds the input and loses
nothing."""

from __future__ import annotations

import contextlib
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
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from simulator.transactions import TransactionSimulator
from tests.integration.conftest import ServiceProcess, Topics, free_port, produce, read_topic

REGISTRY_URL = os.environ.get(
    "FRAUD_TEST_SCHEMA_REGISTRY_URL", "http://127.0.0.1:18081/apis/ccompat/v7"
)

_FIELDS = [
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
    with SchemaRegistryClient({"url": REGISTRY_URL}) as client:
        yield client


def transactions(n: int, prefix: str) -> list[dict[str, Any]]:
    return [dict(r) for r in TransactionSimulator(17, id_prefix=prefix).generate(n).records]


def serialize(
    serializer: Callable[[Any, SerializationContext], bytes | None],
    topic: str,
    records: list[dict[str, Any]],
) -> list[tuple[bytes | None, bytes | None]]:
    context = SerializationContext(topic, MessageField.VALUE)
    return [(r["card_id"].encode(), serializer(r, context)) for r in records]


def decided(topics: Topics, expected: int) -> Counter[str]:
    """Each transaction id's decisions."""
    return Counter(
        json.loads(m.value())["transaction_id"] for m in read_topic(topics.output, expected)
    )


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
        topics.input, serialize(AvroSerializer(registry, json.dumps(AVRO_V1)), topics.input, v1)
    )
    service.wait_for_metric("fraud_records_consumed_total", 200)

    # Mid-run, the producer moves to v2 (an added optional field): a new schema id.
    v2 = [{**r, "device_id": f"d-{i}"} for i, r in enumerate(transactions(100, "avro2"))]
    v2_serializer = AvroSerializer(registry, json.dumps(AVRO_V2))
    v2_records = serialize(v2_serializer, topics.input, v2)
    assert (
        v2_records[0][1] is not None
        and v2_records[0][1][1:5]
        != serialize(AvroSerializer(registry, json.dumps(AVRO_V1)), topics.input, v1[:1])[0][1][1:5]
    ), "v2 has a schema id of its own"
    unknown_id = b"\x00" + struct.pack(">I", 987_654_321) + v2_records[0][1][5:]
    not_wire_format = b'{"transaction_id": "plain-json"}'
    produce(topics.input, [*v2_records, (b"c-unknown", unknown_id), (b"c-raw", not_wire_format)])

    counts = decided(topics, 300)
    assert set(counts) == {r["transaction_id"] for r in v1 + v2}
    assert set(counts.values()) == {1}, "each decided once"
    letters = read_topic(topics.dlq, 2)
    reasons = {dict(m.headers() or [])["dlq.reason"].decode(): m.value() for m in letters}
    assert reasons == {"schema_unknown": unknown_id, "schema_decode": not_wire_format}
    assert service.process.poll() is None


def test_json_schema_input_is_decided(
    registry: SchemaRegistryClient,
    topics_factory: Callable[..., Topics],
    service_factory: Callable[..., ServiceProcess],
) -> None:
    topics = topics_factory()
    service_factory(topics, "--input-format", "json-schema", "--schema-registry-url", REGISTRY_URL)
    records = transactions(150, "jsons")
    serializer = JSONSerializer(json.dumps(JSON_SCHEMA), registry)
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
        serialize(AvroSerializer(registry, json.dumps(AVRO_V1)), topics.input, records),
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
