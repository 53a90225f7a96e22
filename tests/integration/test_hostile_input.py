"""Hostile input through the real broker: every record ends as exactly one decision or one dead
letter, and the service stays up.

Hypothesis generates the records: invalid UTF-8, truncated and deeply nested JSON, huge strings,
NaN and Infinity, wrong types, out-of-range numbers, missing and duplicated fields, empty and
null values, unknown extra fields, mixed with valid transactions. One service runs for all
examples. Set FRAUD_HOSTILE_EXAMPLES to run more examples (the default keeps `make test` short).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from typing import Any

import msgspec
import pytest
from confluent_kafka import Message, Producer
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from contracts.transaction import MAX_EVENT_TIME_MS
from simulator.transactions import TransactionSimulator
from tests.integration.conftest import (
    BOOTSTRAP,
    ServiceProcess,
    committed_offsets,
    encode,
    read_topic,
)
from tests.integration.raw_produce import RawRecord, produce_raw
from tests.support.records import headers_of, value_of

EXAMPLES = int(os.environ.get("FRAUD_HOSTILE_EXAMPLES", "6"))
BASE = TransactionSimulator(99, id_prefix="base").generate(50).records
_ids = itertools.count()
# Summary over all examples of this run, printed at the end (`pytest -s` shows it).
OUTCOMES: Counter[str] = Counter()

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


#: "valid" three times: hostile records are mixed into mostly valid traffic.
KINDS = (
    "valid",
    "valid",
    "valid",
    "extra_fields",
    "wrong_type",
    "out_of_range",
    "missing",
    "duplicated",
    "huge_string",
    "nan",
    "truncated",
    "nested",
    "invalid_utf8",
    "empty",
    "null",
    "tombstone",
    "random_bytes",
)


@st.composite
def hostile_record(draw: st.DrawFn) -> tuple[str, bytes | None, str]:
    """(kind, value bytes, transaction_id it would be decided under)."""
    # Fixed width: draws that depend on the record's length stay the same from run to run.
    tx_id = f"hostile-{next(_ids):012d}"
    base: dict[str, Any] = {**draw(st.sampled_from(BASE)), "transaction_id": tx_id}
    kind = draw(st.sampled_from(KINDS))
    raw: bytes | None
    if kind == "valid":
        raw = msgspec.json.encode(base)
    elif kind == "extra_fields":
        extra = draw(
            st.dictionaries(
                st.text(min_size=1, max_size=10).filter(lambda k: k not in base),
                json_values,
                min_size=1,
                max_size=3,
            )
        )
        raw = msgspec.json.encode({**base, **extra})
    elif kind == "wrong_type":
        field = draw(st.sampled_from([k for k in base if k != "transaction_id"]))
        raw = msgspec.json.encode(
            {**base, field: draw(json_values.filter(lambda v: type(v) is not type(base[field])))}
        )
    elif kind == "out_of_range":
        field, value = draw(
            st.sampled_from(
                [
                    ("amount", 0),
                    ("amount", -3.5),
                    ("amount", 1e7),
                    ("mcc", 10_000),
                    ("mcc", -1),
                    ("event_time", -1),
                    ("currency", "usd"),
                    ("country", "USA"),
                    ("channel", "fax"),
                    ("event_time", 2**63),
                    ("currency", "EUR\n"),
                    ("country", "DE\n"),
                ]
            )
        )
        raw = msgspec.json.encode({**base, field: value})
    elif kind == "missing":
        dropped = draw(
            st.sets(
                st.sampled_from([k for k in base if k not in ("transaction_id", "terminal_id")]),
                min_size=1,
            )
        )
        raw = msgspec.json.encode({k: v for k, v in base.items() if k not in dropped})
    elif kind == "duplicated":
        raw = (
            msgspec.json.encode(base)[:-1]
            + b',"amount":'
            + draw(st.sampled_from([b"12.5", b'"x"', b"-1"]))
            + b"}"
        )
    elif kind == "huge_string":
        field = draw(st.sampled_from(["card_id", "merchant_id", "terminal_id", "currency"]))
        raw = msgspec.json.encode({**base, field: "A" * draw(st.integers(65, 200_000))})
    elif kind == "nan":
        raw = msgspec.json.encode({**base, "amount": 1.0}).replace(
            b'"amount":1.0',
            b'"amount":' + draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e999"])),
        )
    elif kind == "truncated":
        full = msgspec.json.encode(base)
        raw = full[: draw(st.integers(0, len(full) - 1))]
    elif kind == "nested":
        depth = draw(st.integers(100, 100_000))
        raw = (
            b"[" * depth + b"]" * depth
            if draw(st.booleans())
            else b'{"a":' * depth + b"1" + b"}" * depth
        )
    elif kind == "invalid_utf8":
        raw = msgspec.json.encode(base).replace(
            b'"card_id":"',
            b'"card_id":"' + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80"])),
        )
    elif kind == "empty":
        raw = draw(st.sampled_from([b"", b"{}", b"[]", b'""', b" "]))
    elif kind == "null":
        raw = b"null"
    elif kind == "tombstone":
        raw = None
    else:
        raw = draw(st.binary(max_size=300))
    return kind, raw, tx_id


def produce_indexed(topic: str, values: list[bytes | None]) -> dict[tuple[int, int], int]:
    """Produce values; return (partition, offset) → index of each acknowledged record."""
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 5})
    positions: dict[tuple[int, int], int] = {}
    for index, value in enumerate(values):

        def report(error: object, message: Message, index: int = index) -> None:
            assert error is None, error
            partition, offset = message.partition(), message.offset()
            assert partition is not None and offset is not None, "an acknowledged record has both"
            positions[(partition, offset)] = index

        producer.produce(topic, key=f"card-{index % 7}".encode(), value=value, on_delivery=report)
    assert producer.flush(60) == 0
    return positions


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")  # big reprs, on purpose
def test_every_hostile_record_ends_as_exactly_one_outcome(topics_factory, service_factory):
    topics = topics_factory(partitions=2)
    service = service_factory(topics, "--max-batch-size", "64")
    produced = [0]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        # Each example costs a broker round trip: report the failing one, don't shrink it.
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(hostile_record(), min_size=20, max_size=200))
    def check(batch: list[tuple[str, bytes | None, str]]) -> None:
        positions = produce_indexed(topics.input, [raw for _, raw, _ in batch])
        produced[0] += len(batch)
        service.wait_for_metric("fraud_records_consumed_total", produced[0])
        wait_for_outcomes(service, produced[0])
        decided_total = service.metric_total("fraud_decisions_produced_total")
        decisions = read_topic(topics.output, int(decided_total), settle_s=0.2)
        letters = read_topic(topics.dlq, produced[0] - int(decided_total), settle_s=0.2)

        ids = {tx_id: i for i, (_, _, tx_id) in enumerate(batch)}
        outcomes: Counter[int] = Counter()
        for message in decisions:
            index = ids.get(json.loads(value_of(message))["transaction_id"])
            if index is not None:
                outcomes[index] += 1
                OUTCOMES["decided:" + batch[index][0]] += 1
        for message in letters:
            headers = headers_of(message)
            origin = (int(headers["dlq.original.partition"]), int(headers["dlq.original.offset"]))
            index = positions.get(origin)
            if index is not None:
                outcomes[index] += 1
                OUTCOMES[f"dead_letter:{headers['dlq.reason']}:{batch[index][0]}"] += 1
        wrong = {i: (batch[i][0], outcomes[i]) for i in range(len(batch)) if outcomes[i] != 1}
        assert not wrong, f"records without exactly one outcome (index: kind, count): {wrong}"
        decided = decided_ids(decisions)
        for kind, _, tx_id in batch:
            if kind in ("valid", "extra_fields"):
                assert tx_id in decided, f"a {kind} record was not decided"
        assert service.process.poll() is None, "the service must stay up"

    check()
    print(f"\nhostile run: {sum(OUTCOMES.values())} records; {dict(sorted(OUTCOMES.items()))}")


def decided_ids(decisions: list[Message]) -> set[str]:
    return {json.loads(value_of(m))["transaction_id"] for m in decisions}


def wait_for_outcomes(service: ServiceProcess, count: int, timeout_s: float = 60.0) -> None:
    """Wait until the service counts `count` delivered decisions and dead letters in all."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = service.metric_total("fraud_decisions_produced_total") + service.metric_total(
            "fraud_dead_letters_total"
        )
        if done >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"fewer than {count} outcomes after {timeout_s}s:\n{service.log()}")


def test_a_valid_looking_record_no_column_can_hold_never_stops_the_partition(
    topics_factory, service_factory
):
    # Findings 1 and 12 of the review: event_time 2**63 crashed every replica, forever; a
    # header key that is not UTF-8 made reading the headers raise on the dead-letter path.
    topics = topics_factory(partitions=1)
    group = f"extreme-{uuid.uuid4().hex[:8]}"
    base = TransactionSimulator(77, id_prefix="extreme").generate(4).records
    not_utf8 = [(b"\xff\xfe-trace", b"\x1b[31m")]
    records: list[RawRecord] = [
        (b"c0", encode({**base[0], "event_time": 1_767_571_200_000}), []),
        (b"c1", encode({**base[1], "event_time": 2**63}), []),
        (b"c2", encode({**base[2], "event_time": MAX_EVENT_TIME_MS}), []),
        (b"c3", b"{broken", not_utf8),
        (b"c4", encode({**base[3], "event_time": 1_767_571_200_000}), not_utf8),
    ]
    produce_raw(BOOTSTRAP, topics.input, 0, records)
    service = service_factory(topics, "--group-id", group)

    decided = decided_ids(read_topic(topics.output, 3))
    letters = read_topic(topics.dlq, 2)

    assert decided == {
        base[0]["transaction_id"],
        base[2]["transaction_id"],
        base[3]["transaction_id"],
    }
    headers = [headers_of(m) for m in letters]
    assert [(h["dlq.original.offset"], h["dlq.reason"]) for h in headers] == [
        ("1", "validate"),
        ("3", "decode"),
    ]
    assert "event_time" in headers[0]["dlq.message"]
    assert headers[1]["dlq.headers.dropped"].startswith("unreadable")
    assert service.process.poll() is None, "the service stays up"
    deadline = time.monotonic() + 30
    while committed_offsets(group, topics.input, 1)[0] != 5:
        assert time.monotonic() < deadline, "the partition's position never reached its end"
        time.sleep(0.2)


#: Runs in a child interpreter, so that a crash fails the test instead of ending the run: the
#: record read for its trace context, then for its dead letter (a decision the broker refused
#: for good is dead-lettered after its batch's trace context was read).
_READ_TWICE = """
import sys
from confluent_kafka import Consumer
from plumbing.errors import DeliveryError
from contracts.trace_context import batch_trace_headers
from deadletter.router import DeadLetterRouter

consumer = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
                     "auto.offset.reset": "earliest"})
consumer.subscribe([sys.argv[3]])
message = None
while message is None or message.error():
    message = consumer.poll(1.0)
print("trace", batch_trace_headers([message]))
letter = DeadLetterRouter("dlq", "test").dead_letter(message, DeliveryError("refused"))
print("letter", dict(letter.headers)["dlq.headers.dropped"].decode())
consumer.close()
"""


def test_a_record_whose_header_key_is_not_utf8_can_be_read_for_its_trace_and_its_dead_letter(
    topics_factory,
):
    # The real client keeps, after headers() raised, a list with a NULL key for the next
    # caller: the dead letter of such a record, read after its trace context, crashed.
    topics = topics_factory(partitions=1)
    deadline = time.monotonic() + 30
    while True:  # a topic just created may have no leader yet (error 6)
        try:
            produce_raw(BOOTSTRAP, topics.input, 0, [(b"c0", b"{}", [(b"\xff\xfe-trace", b"x")])])
            break
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)

    child = subprocess.run(
        [
            sys.executable,
            "-c",
            _READ_TWICE,
            BOOTSTRAP,
            f"twice-{uuid.uuid4().hex[:8]}",
            topics.input,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert child.returncode == 0, f"exit {child.returncode}\n{child.stderr[-2000:]}"
    assert child.stdout.splitlines() == [
        "trace None",
        "letter unreadable: a header key is not UTF-8",
    ], child.stdout
