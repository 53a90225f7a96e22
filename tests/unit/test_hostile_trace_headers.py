"""The trace headers surface (docs/threat-model.md): whatever headers a producer puts on a
transaction (random bytes, huge values, thousands of headers, repeated names, a key that is not
UTF-8), the service reads them on its real paths within a budget and never crashes: the trace
context its decision carries (`contracts/trace_context.py`), the batch span's links
(`stream/tracing.py`, with the SDK) and the dead letter that keeps the original headers
(`deadletter/router.py`). A header is carried (the two trace headers, at most MAX_HEADER_BYTES
each), linked (a traceparent that parses), or ignored."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from confluent_kafka import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.trace_context import (
    MAX_HEADER_BYTES,
    TRACEPARENT,
    TRACESTATE,
    batch_trace_headers,
    parse_traceparent,
)
from deadletter.router import DeadLetterRouter
from plumbing.errors import ValidationError
from stream.tracing import MAX_LINKS_PER_SPAN, BatchOutcome, linked_contexts
from tests.support.budget import MIB, Budget, within
from tests.support.records import UnreadableHeaders

#: What reading one batch's headers may cost beyond the records themselves: each reader gets
#: its own copy of the headers from the client (trace context and dead letter: two), a batch
#: holds at most BATCH_BYTES of them, and the rest is small.
BATCH_BYTES = 2 * MIB
BUDGET = Budget(3 * BATCH_BYTES + 4 * MIB, 5.0)


def _traceparent(version: str, trace_id: int, span_id: int, flags: int, rest: bytes) -> bytes:
    value = f"{version}-{trace_id:032x}-{span_id:016x}-{flags:02x}".encode()
    return value + (b"-" + rest if rest else b"")


NAMES = st.one_of(
    st.sampled_from([TRACEPARENT, TRACESTATE, "Traceparent", "dlq.reason", "baggage", ""]),
    st.text(max_size=64),
)
VALUES = st.one_of(
    st.none(),
    st.binary(max_size=2 * MAX_HEADER_BYTES),
    st.builds(
        _traceparent,
        st.sampled_from(["00", "01", "cc", "ff"]),
        st.integers(0, (1 << 128) - 1),
        st.integers(0, (1 << 64) - 1),
        st.integers(0, 255),
        st.binary(max_size=MAX_HEADER_BYTES),
    ),
    # A huge value: far past anything a header needs, up to the broker's default record size.
    st.integers(MAX_HEADER_BYTES, 1 << 20).map(lambda n: b"\xff" * n),
)
HEADERS = st.one_of(
    st.lists(st.tuples(NAMES, VALUES), max_size=40),
    # Thousands of small headers, traceparents among them.
    st.integers(0, 5_000).map(
        lambda n: [(TRACEPARENT if i % 3 else f"h{i}", b"%d" % i) for i in range(n)]
    ),
)
#: A record: its headers, and whether a header key is not UTF-8 (the client cannot read them).
RECORDS = st.tuples(HEADERS, st.booleans())


def _size(headers: Sequence[tuple[str, str | bytes | None]]) -> int:
    return sum(len(name) + len(value or b"") for name, value in headers)


def _batch(records: list[tuple[list[tuple[str, str | bytes | None]], bool]]) -> list[Any]:
    messages: list[Any] = []
    total = 0
    for offset, (headers, unreadable) in enumerate(records):
        total += _size(headers)
        if total > BATCH_BYTES:
            break
        message = Message(
            topic="tx", partition=0, offset=offset, key=b"card", value=b"{}", headers=[*headers]
        )
        messages.append(UnreadableHeaders(message) if unreadable else message)
    return messages


@pytest.fixture(scope="module")
def tracer():
    pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    from stream.tracing import OtelBatchTracer

    class Discarding(SpanExporter):
        """Keeps no span: the test measures the service's side, not an exporter's."""

        spans = 0
        links = 0

        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            Discarding.spans += len(spans)
            Discarding.links = max(Discarding.links, *(len(s.links) for s in spans))
            return SpanExportResult.SUCCESS

    created = OtelBatchTracer.create(
        SimpleSpanProcessor(Discarding()),
        input_topic="tx",
        group_id="g",
        instance_id="i",
        max_batch_size=65_536,
        environ={},
    )
    yield created, Discarding
    created.close()


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(records=st.lists(RECORDS, min_size=1, max_size=6))
def test_hostile_headers_are_carried_linked_or_ignored_within_budget(tracer, records):
    span_tracer, exported = tracer
    messages = _batch(records)
    if not messages:
        return
    router = DeadLetterRouter("tx.dlq", "g/i")
    spans_before = exported.spans

    with within(BUDGET, "a batch's trace headers"):
        contexts = batch_trace_headers(messages)
        links = linked_contexts(contexts)
        span_tracer.batch_scored(contexts, 0.001, BatchOutcome(len(messages), 0, 0, "m"))
        letters = [router.dead_letter(m, ValidationError("hostile")) for m in messages]

    assert exported.spans == spans_before + 1
    assert exported.links <= MAX_LINKS_PER_SPAN
    assert contexts is None or len(contexts) == len(messages)
    for message, carried in zip(messages, contexts or [None] * len(messages), strict=True):
        if carried is None:
            continue
        assert not isinstance(message, UnreadableHeaders), "unreadable headers carried"
        names = [name for name, _ in carried]
        assert names in ([TRACEPARENT], [TRACESTATE], [TRACEPARENT, TRACESTATE])
        assert all(value is not None and len(value) <= MAX_HEADER_BYTES for _, value in carried)
    parsed = [
        p
        for carried in contexts or []
        if carried is not None and carried[0][0] == TRACEPARENT
        for p in [parse_traceparent(carried[0][1])]
        if p is not None
    ]
    assert links == parsed[:MAX_LINKS_PER_SPAN]
    assert len(letters) == len(messages)
