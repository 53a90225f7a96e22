"""Batch spans (stream/tracing.py): the links of a batch, when spans are on, and that off they
cost no import of OpenTelemetry at all."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from contracts.offsets import OffsetTracker
from contracts.trace_context import TraceParent
from deadletter.router import DeadLetterRouter
from scorer.decide import DecisionPolicy
from scorer.decisions import Thresholds
from stream.batcher import Batch
from stream.metrics import ServiceMetrics
from stream.pending_record import PendingRecord
from stream.scoring import BatchScorer
from stream.tracing import (
    BatchOutcome,
    BatchTracer,
    Contexts,
    batch_tracer,
    linked_contexts,
    spans_requested,
)
from tests.support.budget import MIB, Budget, within
from tests.support.records import offset_of
from tests.unit.fakes import FakeScorer, MemorySink
from tests.unit.test_batch_scorer import make_batch, poison_amount, traceparent

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
TRACER: dict[str, Any] = {
    "input_topic": "tx",
    "group_id": "g",
    "instance_id": "i",
    "max_batch_size": 256,
}


def test_a_batch_links_to_each_record_whose_traceparent_parses():
    contexts = [
        None,
        [("traceparent", traceparent(1)), ("tracestate", b"congo=t61rcWkgMzE")],
        [("traceparent", b"not-a-traceparent")],
        [("tracestate", b"congo=t61rcWkgMzE")],
        [("traceparent", traceparent(4))],
    ]
    assert linked_contexts(contexts) == [
        TraceParent(int(traceparent(i)[3:35], 16), 0xF067AA0BA902B7, 1) for i in (1, 4)
    ]
    assert linked_contexts(None) == []


@pytest.mark.parametrize(
    ("environ", "requested"),
    [
        ({}, False),
        (ENDPOINT, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, False),
        ({**ENDPOINT, "OTEL_SDK_DISABLED": "TRUE"}, False),
        ({**ENDPOINT, "OTEL_SDK_DISABLED": "false"}, True),
    ],
)
def test_spans_are_requested_by_an_endpoint_unless_the_sdk_is_disabled(environ, requested):
    assert spans_requested(environ) is requested


def test_without_an_endpoint_there_is_no_tracer_and_opentelemetry_is_never_imported():
    program = textwrap.dedent(
        """
        import sys
        import stream.startup.cli, stream.service, stream.startup.wiring
        from stream.tracing import batch_tracer
        assert batch_tracer(input_topic="tx", group_id="g", instance_id="i",
                            max_batch_size=256, environ={}) is None
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    )
    assert run.stdout.strip() == "[]"


def test_an_endpoint_without_the_extra_is_a_warning_and_no_tracer(monkeypatch, caplog):
    # A None entry makes the import fail as if the package were not installed.
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with caplog.at_level(logging.WARNING, logger="stream.tracing"):
        assert batch_tracer(**TRACER, environ=ENDPOINT) is None
    assert "pip install 'fraud-scorer[otel]'" in caplog.text


# -- with the SDK (the otel extra; the dev extra installs it) ----------------------------------


@pytest.fixture
def exported():
    pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from stream.tracing import OtelBatchTracer

    exporter = InMemorySpanExporter()
    tracer = OtelBatchTracer.create(SimpleSpanProcessor(exporter), **TRACER, environ={})
    return tracer, exporter


def score(tracer: BatchTracer, *batches: Batch[PendingRecord]) -> None:
    sink, tracker = MemorySink(), OffsetTracker()
    stage = BatchScorer(
        FakeScorer(raises_on=poison_amount),
        sink,
        tracker,
        DeadLetterRouter("tx.dlq", "g/i"),
        output_topic="decisions",
        policy=DecisionPolicy(Thresholds(0.5, 0.8), 1_000.0, "score"),
        metrics=ServiceMetrics(CollectorRegistry()),
        tracer=tracer,
    )
    for batch in batches:
        for record in batch.items:
            tracker.track(("tx", 0), offset_of(record.message))
        stage.process(batch)


def test_one_span_per_batch_links_to_its_records_traces(exported):
    tracer, exporter = exported
    traced = make_batch(6, headers=lambda i: [("traceparent", traceparent(i))] if i % 2 else [])
    poisoned = make_batch(3, headers=lambda i: [("traceparent", traceparent(10 + i))], poison={1})

    score(tracer, traced, poisoned)

    spans = exporter.get_finished_spans()
    assert [span.name for span in spans] == ["score tx", "score tx"]
    linked = [[(link.context.trace_id, link.context.span_id) for link in s.links] for s in spans]
    assert linked == [
        [(int(traceparent(i)[3:35], 16), 0xF067AA0BA902B7) for i in (1, 3, 5)],
        [(int(traceparent(10 + i)[3:35], 16), 0xF067AA0BA902B7) for i in range(3)],
    ]
    assert all(link.context.is_remote for s in spans for link in s.links)
    first, second = (dict(span.attributes) for span in spans)
    assert first["messaging.batch.message_count"] == 6 and first["fraud.decisions"] == 6
    assert (second["fraud.decisions"], second["fraud.dead_letters"]) == (2, 1)
    assert first["messaging.destination.name"] == "tx"
    assert first["fraud.model_version"] == "fake-1"
    assert spans[0].parent is None and spans[0].start_time < spans[0].end_time
    assert spans[0].resource.attributes["service.name"] == "fraud-scorer"


def test_every_record_of_a_full_batch_is_linked(exported):
    tracer, exporter = exported
    score(tracer, make_batch(200, headers=lambda i: [("traceparent", traceparent(i % 256))]))
    (span,) = exporter.get_finished_spans()
    assert len(span.links) == 200 and span.dropped_links == 0


def test_an_endpoint_with_the_extra_makes_an_otlp_tracer():
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from stream.tracing import OtelBatchTracer

    assert isinstance(batch_tracer(**TRACER, environ=ENDPOINT), OtelBatchTracer)


@pytest.fixture
def silent_collector():
    """An OTLP endpoint that takes connections and never answers (a collector that hangs)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def test_spans_held_for_a_collector_that_does_not_answer_stay_within_their_memory_bound(
    silent_collector, monkeypatch
):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from stream.tracing import OtelBatchTracer

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", silent_collector)
    monkeypatch.setenv("OTEL_SPAN_LINK_COUNT_LIMIT", "1000000")  # asks for more than is kept
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")  # so that closing is quick
    tracer = batch_tracer(**{**TRACER, "max_batch_size": 4_096}, environ=os.environ)
    assert isinstance(tracer, OtelBatchTracer)
    # Every record of every batch carries a distinct valid traceparent of the longest kind a
    # later version may send: each would be a link.
    contexts: list[list[tuple[str, bytes]] | None] = [
        [("traceparent", b"cc-%032x-%016x-01-" % (i + 1, i + 1) + b"x" * 900)] for i in range(4_096)
    ]
    outcome = BatchOutcome(4_096, 4_096, 0, "m")
    try:
        # What the spans may hold while they wait (SPAN_MEMORY_BYTES, 16 MiB), with room for
        # the export's encoding of its batch. Without the bounds: 305 MB after 120 batches.
        with within(Budget(24 * MIB, 60.0), "spans for a silent collector"):
            for _ in range(160):  # more spans than the queue and the export batch hold
                tracer.batch_scored(contexts, 0.001, outcome)
    finally:
        tracer.close()


def test_a_span_links_at_most_its_limit_of_records_and_the_queue_fits_the_memory_bound():
    from stream.tracing import (
        LINK_BYTES,
        MAX_LINKS_PER_SPAN,
        SPAN_BYTES,
        SPAN_MEMORY_BYTES,
        span_bounds,
    )

    contexts = [[("traceparent", traceparent(i % 256))] for i in range(1_000)]
    assert len(linked_contexts(contexts, 10)) == 10
    assert linked_contexts(contexts, 10) == linked_contexts(contexts[:10])
    for batch_cap, environ in [
        (65_536, {}),
        (65_536, {"OTEL_SPAN_LINK_COUNT_LIMIT": "1000000"}),
        (256, {}),
        (16, {}),
        (4_096, {"OTEL_SPAN_LINK_COUNT_LIMIT": "8"}),
    ]:
        bounds = span_bounds(batch_cap, environ)
        assert bounds.max_links <= min(batch_cap, MAX_LINKS_PER_SPAN)
        held = bounds.max_queue_size + bounds.max_export_batch_size
        assert held * (SPAN_BYTES + bounds.max_links * LINK_BYTES) <= SPAN_MEMORY_BYTES
        assert 1 <= bounds.max_export_batch_size <= bounds.max_queue_size
    assert span_bounds(4_096, {"OTEL_SPAN_LINK_COUNT_LIMIT": "8"}).max_links == 8
    assert span_bounds(256, {}).max_links == 256  # a default batch: every record linked


class RecordingTracer:
    """A BatchTracer that notes what it was told, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def batch_scored(self, contexts: Contexts, elapsed_s: float, outcome: BatchOutcome) -> None:
        self.calls.append("batch")

    def close(self) -> None:
        self.calls.append("close")


def test_a_stopping_replica_closes_its_tracer_after_its_last_batch() -> None:
    # Issue 43 review: OtelBatchTracer.close() was never called, so the spans the exporter
    # still held at a stop were lost.
    from tests.support.waiting import wait_until
    from tests.unit.replica import TOPIC, Replica, messages, tp

    tracer = RecordingTracer()
    with Replica(tracer=tracer) as replica:
        replica.consumer.assign(tp(0))
        replica.consumer.feed(messages(0, range(10)))
        wait_until(lambda: replica.consumer.stored == {(TOPIC, 0): 10})
    assert tracer.calls[-1] == "close" and tracer.calls.count("close") == 1
    assert "batch" in tracer.calls
