"""Trace context through the stream, against the real broker: a transaction's `traceparent` and
`tracestate` reach its decision, a malformed transaction's reach its dead letter, and with an
OTLP endpoint each batch is exported as a span linked to its records' traces."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec
import pytest

from simulator.transactions import TransactionSimulator
from tests.integration.conftest import encode, produce_to_partition, read_topic
from tests.support.records import raw_headers, value_of
from tests.support.waiting import wait_until

PARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
STATE = b"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_decisions_carry_their_transactions_trace_context(
    topics_factory, service_factory, guarantee
):
    topics = topics_factory(partitions=1)
    traced, untraced, malformed = TransactionSimulator(5, id_prefix="trace").generate(3).records
    produce_to_partition(
        topics.input,
        0,
        [
            (b"k", encode(traced), [("traceparent", PARENT), ("tracestate", STATE)]),
            (b"k", encode(untraced), [("x-request-id", b"42")]),
            # Passed through unchanged: its reader decides what to make of it.
            (b"k", encode(malformed), [("traceparent", b"not-a-traceparent")]),
        ],
    )
    service_factory(topics, "--processing-guarantee", guarantee)

    carried = {
        msgspec.json.decode(value_of(m))["transaction_id"]: m.headers()
        for m in read_topic(topics.output, 3)
    }

    assert carried == {
        traced["transaction_id"]: [("traceparent", PARENT), ("tracestate", STATE)],
        untraced["transaction_id"]: None,
        malformed["transaction_id"]: [("traceparent", b"not-a-traceparent")],
    }


def test_a_dead_letter_carries_its_records_trace_context(topics_factory, service_factory):
    topics = topics_factory(partitions=1)
    valid = TransactionSimulator(6, id_prefix="trace-dlq").generate(1).records[0]
    produce_to_partition(
        topics.input,
        0,
        [
            (b"k", b"{not json", [("traceparent", PARENT)]),
            (
                b"k",
                encode({**valid, "amount": -1.0}),
                [("traceparent", PARENT), ("tracestate", STATE)],
            ),
        ],
    )
    service_factory(topics)

    letters = read_topic(topics.dlq, 2)

    assert [dict(raw_headers(m))["dlq.reason"] for m in letters] == [b"decode", b"validate"]
    assert [raw_headers(m)[:2] for m in letters] == [
        [("traceparent", PARENT), ("dlq.reason", b"decode")],
        [("traceparent", PARENT), ("tracestate", STATE)],
    ]


class Collector(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver on 127.0.0.1 that keeps the bodies it is sent."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Receive)
        self.bodies: list[bytes] = []

    def spans(self) -> Iterator[Any]:
        """Every span received so far."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        for body in list(self.bodies):
            for resource in ExportTraceServiceRequest.FromString(body).resource_spans:
                for scope in resource.scope_spans:
                    yield from scope.spans


class _Receive(BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:
        assert self.path == "/v1/traces"
        self.server.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test reads what it received."""


@pytest.fixture
def collector() -> Iterator[Collector]:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    server = Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_with_an_otlp_endpoint_each_batch_is_a_span_linked_to_its_records_traces(
    topics_factory, service_factory, collector, monkeypatch
):
    topics = topics_factory(partitions=1)
    records = TransactionSimulator(7, id_prefix="trace-span").generate(3).records
    produce_to_partition(
        topics.input,
        0,
        [
            (b"k", encode(r), [("traceparent", PARENT)] if i != 1 else [])
            for i, r in enumerate(records)
        ],
    )
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{collector.server_port}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export within a tenth of a second
    service_factory(topics)

    def decided() -> int:
        return sum(
            attribute.value.int_value
            for span in collector.spans()
            for attribute in span.attributes
            if attribute.key == "fraud.decisions"
        )

    wait_until(lambda: decided() >= 3, 60, "spans of batches deciding all three records")
    spans = list(collector.spans())
    assert {span.name for span in spans} == {f"score {topics.input}"}
    links = [(link.trace_id.hex(), link.span_id.hex()) for span in spans for link in span.links]
    assert links == [("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")] * 2
