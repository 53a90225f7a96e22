"""The trace-context header contract: which headers travel to a decision, and what parses."""

from __future__ import annotations

import pytest
from confluent_kafka import Message
from hypothesis import given
from hypothesis import strategies as st

from contracts.dead_letter import read_headers
from contracts.trace_context import (
    MAX_HEADER_BYTES,
    TraceParent,
    batch_trace_headers,
    parse_traceparent,
    trace_context,
    trace_headers,
)
from tests.support.records import UnreadableHeaders
from tests.unit.fakes import message

#: The example of W3C Trace Context, section 3.2.
EXAMPLE = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_traceparent_and_tracestate_travel_in_that_order_and_nothing_else():
    state = b"congo=t61rcWkgMzE"
    headers = [("x-other", b"1"), ("tracestate", state), ("traceparent", EXAMPLE)]
    assert trace_context(headers) == [("traceparent", EXAMPLE), ("tracestate", state)]


def test_the_last_of_a_repeated_header_travels_alone():
    headers = [("traceparent", b"first"), ("traceparent", EXAMPLE)]
    assert trace_context(headers) == [("traceparent", EXAMPLE)]


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [("x-other", b"1")],
        [("Traceparent", EXAMPLE)],  # names match exactly, as W3C propagators write them
        [("traceparent", None)],
        [("traceparent", b"0" * (MAX_HEADER_BYTES + 1))],
    ],
    ids=["none", "unrelated", "capitalised", "null value", "too long"],
)
def test_nothing_travels_without_a_usable_trace_header(headers):
    assert trace_context(headers) is None


def test_a_malformed_value_travels_unchanged():
    assert trace_context([("traceparent", b"\xff garbage")]) == [("traceparent", b"\xff garbage")]


def test_trace_headers_of_a_record_without_headers_is_none():
    assert trace_headers(message(0, headers=[])) is None
    assert trace_headers(message(0, headers=[("traceparent", EXAMPLE)])) == [
        ("traceparent", EXAMPLE)
    ]


def test_a_batch_without_trace_context_has_none_at_all():
    assert batch_trace_headers([message(0, headers=[]), message(1, headers=[])]) is None
    assert batch_trace_headers([message(0, headers=[]), message(1, headers=[("x", b"1")])]) is None
    assert batch_trace_headers(
        [message(0, headers=[("x", b"1")]), message(1, headers=[("traceparent", EXAMPLE)])]
    ) == [None, [("traceparent", EXAMPLE)]]


def test_a_record_whose_headers_cannot_be_read_carries_nothing_and_its_batch_mates_theirs():
    batch: list[Message] = [
        message(0, headers=[("x-other", b"1"), ("traceparent", EXAMPLE)]),
        UnreadableHeaders(),  # type: ignore[list-item]
        message(2, headers=[("traceparent", EXAMPLE), ("x-other", b"2")]),
    ]
    assert batch_trace_headers(batch) == [
        [("traceparent", EXAMPLE)],
        None,
        [("traceparent", EXAMPLE)],
    ]
    assert batch_trace_headers([UnreadableHeaders()]) is None  # type: ignore[list-item]


def test_the_w3c_example_parses():
    assert parse_traceparent(EXAMPLE) == TraceParent(
        0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 0x01
    )


def test_a_later_version_may_add_fields_after_a_dash():
    assert parse_traceparent(b"cc" + EXAMPLE[2:] + b"-what-the-future-holds") is not None


@pytest.mark.parametrize(
    "value",
    [
        b"",
        EXAMPLE.upper(),
        b"ff" + EXAMPLE[2:],
        EXAMPLE + b"-extra",  # version 00 ends at its flags
        b"cc" + EXAMPLE[2:] + b"extra",
        EXAMPLE.replace(b"4bf92f3577b34da6a3ce929d0e0e4736", b"0" * 32),
        EXAMPLE.replace(b"00f067aa0ba902b7", b"0" * 16),
        EXAMPLE[:-1],
        EXAMPLE.replace(b"-", b"_"),
        EXAMPLE + b"\n",
    ],
)
def test_what_w3c_calls_invalid_does_not_parse(value):
    assert parse_traceparent(value) is None


@given(st.binary(max_size=80))
def test_no_bytes_make_parsing_raise(value):
    parsed = parse_traceparent(value)
    assert parsed is None or (parsed.trace_id and parsed.span_id)


def test_a_record_whose_headers_cannot_be_read_can_be_read_again_for_its_dead_letter():
    record = UnreadableHeaders()
    assert trace_headers(record) is None  # type: ignore[arg-type]
    # A decision refused for good is dead-lettered after its trace context was read: the fake
    # fails here if the first read left the client's broken list in place.
    assert read_headers(record) is None  # type: ignore[arg-type]
    assert batch_trace_headers([record]) is None  # type: ignore[list-item]
    assert record.asked == 3
