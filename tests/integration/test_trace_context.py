"""Trace context through the stream, against the real broker: a transaction's `traceparent` and
`tracestate` reach its decision, and a malformed transaction's reach its dead letter."""

from __future__ import annotations

import msgspec
import pytest

from simulator.transactions import TransactionSimulator
from tests.integration.conftest import encode, produce_to_partition, read_topic

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
        msgspec.json.decode(m.value())["transaction_id"]: m.headers()
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

    assert [dict(m.headers())["dlq.reason"] for m in letters] == [b"decode", b"validate"]
    assert [m.headers()[:2] for m in letters] == [
        [("traceparent", PARENT), ("dlq.reason", b"decode")],
        [("traceparent", PARENT), ("tracestate", STATE)],
    ]
