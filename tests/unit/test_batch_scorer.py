"""One batch through the scoring stage, with an in-memory sink and a fake model."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, Message
from prometheus_client import CollectorRegistry

from contracts.decision import decode_features
from contracts.offsets import OffsetTracker
from contracts.transaction import decode_transaction
from deadletter.router import DeadLetterRouter
from scorer.columns import TransactionColumns
from scorer.decide import DecisionPolicy, LatePolicy
from scorer.decisions import Thresholds
from scorer.features import build_features
from scorer.model import Scorer
from simulator.transactions import TransactionSimulator
from stream.batcher import Batch
from stream.metrics import ServiceMetrics
from stream.pending_record import PendingRecord
from stream.scoring import BatchReport, BatchScorer
from tests.support.records import UnreadableHeaders, offset_of
from tests.unit.fakes import FakeScorer, MemorySink, message

HUGE_AMOUNT = 999_999.0


def make_batch(
    n: int,
    *,
    event_time_ms: int | None = None,
    poison: Collection[int] = frozenset(),
    headers: Callable[[int], list[tuple[str, bytes]]] | None = None,
) -> Batch[PendingRecord]:
    """`headers(i)`: the i-th record's headers (default: one unrelated header)."""
    records = TransactionSimulator(3).generate(n).records
    items = []
    for i, record in enumerate(records):
        record = {**record, "event_time": event_time_ms or time.time_ns() // 1_000_000}
        if i in poison:
            record["amount"] = HUGE_AMOUNT
        value = msgspec.json.encode(record)
        source = message(i, value, headers=None if headers is None else headers(i))
        items.append(PendingRecord(source, decode_transaction(value), (("tx", 0), i)))
    return Batch(items, 0.0, 0.005, closed_full=True)


def poison_amount(features: npt.NDArray[np.float32]) -> npt.NDArray[np.bool_]:
    return features[:, 0] > np.log1p(HUGE_AMOUNT - 1)


def run(
    batch: Batch[PendingRecord],
    scorer: Scorer,
    late_policy: LatePolicy = "score",
    deadline_ms: float = 1_000.0,
    registry: CollectorRegistry | None = None,
    log_features: bool = False,
) -> tuple[MemorySink, OffsetTracker, BatchReport]:
    sink, tracker = MemorySink(), OffsetTracker()
    for record in batch.items:
        tracker.track(("tx", 0), offset_of(record.message))
    policy = DecisionPolicy(Thresholds(0.5, 0.8), deadline_ms, late_policy)
    stage = BatchScorer(
        scorer,
        sink,
        tracker,
        DeadLetterRouter("tx.dlq", "g/i"),
        output_topic="decisions",
        policy=policy,
        metrics=ServiceMetrics(registry or CollectorRegistry()),
        log_features=log_features,
    )
    report = stage.process(batch)
    return sink, tracker, report


def decisions(sink: MemorySink) -> list[dict[str, Any]]:
    decoded = []
    for output in sink.sent:
        if output.kind == "decision":
            assert output.value is not None, "a decision always has a value"
            decoded.append(msgspec.json.decode(output.value))
    return decoded


def test_every_record_gets_one_output_and_offsets_commit_after_delivery():
    batch = make_batch(50)
    sink, tracker, report = run(batch, FakeScorer())
    assert len(sink.sent) == 50 and all(o.kind == "decision" for o in sink.sent)
    assert [d["transaction_id"] for d in decisions(sink)] == [
        r.transaction.transaction_id for r in batch.items
    ]
    assert tracker.take_commit_positions() == {}, "nothing commits before the broker acknowledges"
    sink.deliver_all()
    assert tracker.take_commit_positions() == {("tx", 0): 50}
    assert report.size == 50 and report.closed_full


def test_poison_records_are_dead_lettered_and_their_batch_mates_decided():
    batch = make_batch(40, poison={4, 31})
    sink, tracker, _ = run(batch, FakeScorer(raises_on=poison_amount))
    dead = [o for o in sink.sent if o.kind == "dead_letter"]
    assert sorted(offset_of(o.source) for o in dead) == [4, 31]
    headers = dict(dead[0].headers or [])
    assert headers["dlq.reason"] == b"score"
    assert headers["dlq.model_version"] == b"fake-1"
    assert b"Traceback" in headers["dlq.stacktrace"]
    assert dead[0].value == batch.items[4].message.value(), "original bytes kept"
    assert len(decisions(sink)) == 38
    sink.deliver_all()
    assert tracker.take_commit_positions() == {("tx", 0): 40}


@pytest.mark.parametrize(("policy", "degraded"), [("score", False), ("fallback", True)])
def test_late_records_follow_the_late_policy(policy, degraded):
    registry = CollectorRegistry()
    hour_ago = time.time_ns() // 1_000_000 - 3_600_000
    scorer = FakeScorer()
    batch = make_batch(10, event_time_ms=hour_ago)
    sink, _, _ = run(batch, scorer, late_policy=policy, registry=registry)
    assert [d["degraded"] for d in decisions(sink)] == [degraded] * 10
    assert registry.get_sample_value("fraud_late_records_total") == 10
    late_by_rules = registry.get_sample_value("fraud_degraded_decisions_total", {"cause": "late"})
    assert late_by_rules == (10 if degraded else None)
    assert scorer.calls == ([] if degraded else [10]), "fallback rows never reach the model"


def test_a_broken_model_degrades_to_rules_instead_of_dead_lettering():
    sink, _, _ = run(make_batch(12), FakeScorer(broken=True))
    assert len(decisions(sink)) == 12
    assert all(d["degraded"] for d in decisions(sink))
    assert all(0.0 <= d["score"] <= 1.0 for d in decisions(sink))


def test_logged_features_are_the_rows_the_model_scored():
    batch = make_batch(40, poison={5})
    scorer = FakeScorer(raises_on=poison_amount)
    sink, _, _ = run(batch, scorer, log_features=True)
    logged = {d["transaction_id"]: decode_features(d["features"]) for d in decisions(sink)}
    assert len(logged) == 39  # the poison record is dead-lettered, with no decision
    transactions = [r.transaction for r in batch.items]
    rows = build_features(TransactionColumns.from_transactions(transactions))
    for t, row in zip(transactions, rows, strict=True):
        if t.transaction_id in logged:
            np.testing.assert_array_equal(logged[t.transaction_id], row)
    assert all(len(d.get("features", "")) == 0 for d in decisions(run(batch, scorer)[0]))


def test_each_stage_of_a_batch_is_timed_once_and_delivery_when_its_outputs_are_acknowledged():
    registry = CollectorRegistry()
    produced_ms = time.time_ns() // 1_000_000 - 2_000  # two seconds before it joined the batch
    batch = make_batch(8)
    items = [
        item._replace(
            message=Message(
                topic="tx", partition=0, offset=i, value=item.message.value(),
                timestamp=(TIMESTAMP_CREATE_TIME, produced_ms),
            )
        )
        for i, item in enumerate(batch.items)
    ]  # fmt: skip
    now = time.monotonic()
    sink, _, _ = run(
        Batch(items, now - 0.004, now, closed_full=False), FakeScorer(), registry=registry
    )

    def count(stage: str) -> float | None:
        return registry.get_sample_value("fraud_stage_seconds_count", {"stage": stage})

    for stage in ("queue", "batch", "handoff", "state", "terminal", "decide", "encode"):
        assert count(stage) == 1, stage
    assert count("delivery") == 0, "not before the broker acknowledges"
    sink.deliver_all()
    assert count("delivery") == 1
    queue = registry.get_sample_value("fraud_stage_seconds_sum", {"stage": "queue"})
    assert queue is not None and 1.9 < queue < 60.0
    assert registry.get_sample_value("fraud_stage_seconds_sum", {"stage": "batch"}) == (
        pytest.approx(0.004)
    )


def traceparent(i: int) -> bytes:
    return f"00-4bf92f3577b34da6a3ce929d0e0e47{i:02x}-00f067aa0ba902b7-01".encode()


def test_each_decision_and_dead_letter_carries_its_transactions_trace_context():
    def headers(i: int) -> list[tuple[str, bytes]]:
        return [
            [],
            [("traceparent", traceparent(i)), ("tracestate", b"congo=t61rcWkgMzE"), ("x", b"y")],
            [("traceparent", b"not-a-traceparent")],
        ][i % 3]

    batch = make_batch(9, headers=headers, poison={4})
    sink, _, _ = run(batch, FakeScorer(raises_on=poison_amount))

    carried = {o.source.offset(): o.headers for o in sink.sent if o.kind == "decision"}
    assert carried == {
        0: None,
        1: [("traceparent", traceparent(1)), ("tracestate", b"congo=t61rcWkgMzE")],
        2: [("traceparent", b"not-a-traceparent")],
        3: None,
        5: [("traceparent", b"not-a-traceparent")],
        6: None,
        7: [("traceparent", traceparent(7)), ("tracestate", b"congo=t61rcWkgMzE")],
        8: [("traceparent", b"not-a-traceparent")],
    }
    (letter,) = [o for o in sink.sent if o.kind == "dead_letter"]
    assert (letter.headers or [])[:3] == headers(4), "a dead letter keeps every original header"


def test_a_batch_without_trace_context_sends_its_decisions_without_headers():
    sink, _, _ = run(make_batch(5, headers=lambda i: [("x", b"y")] if i else []), FakeScorer())
    assert sink.batch_headers == [None]
    assert all(o.headers is None for o in sink.sent)


@pytest.mark.parametrize("poison", [set(), {2}])
def test_a_record_whose_headers_cannot_be_read_is_asked_once_decided_or_dead_lettered(poison):
    batch = make_batch(4, poison=poison, headers=lambda i: [("traceparent", traceparent(i))])
    unreadable = UnreadableHeaders(batch.items[2].message)
    batch.items[2] = batch.items[2]._replace(message=unreadable)  # type: ignore[arg-type]
    sink, _, _ = run(batch, FakeScorer(raises_on=poison_amount))

    carried = {offset_of(o.source): o.headers for o in sink.sent if o.kind == "decision"}
    assert carried[0] == [("traceparent", traceparent(0))] and carried[3] is not None
    assert (2 in carried) == (not poison) and carried.get(2) is None
    assert [o.kind for o in sink.sent].count("dead_letter") == len(poison)
    assert unreadable.asked == 1
