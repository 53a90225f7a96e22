"""Records that pass validation with extreme but legal values, through the whole batch path:
columns → features → the shipped model → decision records. Each one ends as exactly one
decision or one dead letter, and the scoring stage never raises (finding 1 of the review)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from contracts.field_mapping import FieldMapping
from contracts.input_formats import TransactionDecoder, transaction_decoder
from contracts.offsets import OffsetTracker
from contracts.transaction import (
    MAX_AMOUNT,
    MAX_EVENT_TIME_MS,
    MAX_ID_CHARS,
    MAX_UTC_OFFSET_MINUTES,
    Transaction,
    decode_transaction,
)
from deadletter.router import DeadLetterRouter
from scorer.decide import DecisionPolicy
from scorer.decisions import Thresholds
from scorer.model import OnnxScorer
from scorer.model_package import load_model_package
from simulator.team_shapes import checkout_event
from stream.batcher import Batch
from stream.metrics import ServiceMetrics
from stream.pending_record import PendingRecord
from stream.scoring import BatchScorer
from stream.startup.config import SHIPPED_MODEL_PATH
from tests.unit.fakes import MemorySink, message

letters = st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
ids = st.one_of(
    st.text(min_size=1, max_size=MAX_ID_CHARS),
    st.text(st.characters(codec="utf-8"), min_size=MAX_ID_CHARS, max_size=MAX_ID_CHARS),
    st.just("\u202e\u0000\U0001f4b3" * 21),
)
amounts = st.one_of(
    st.sampled_from([5e-324, 1e-300, 0.01, 1.0, 9.999999, MAX_AMOUNT, MAX_AMOUNT - 1e-9]),
    st.floats(min_value=5e-324, max_value=MAX_AMOUNT, allow_nan=False),
)
event_times = st.one_of(
    st.sampled_from([0, 1, 2**31, MAX_EVENT_TIME_MS - 1, MAX_EVENT_TIME_MS]),
    st.integers(min_value=0, max_value=MAX_EVENT_TIME_MS),
)
utc_offsets = st.sampled_from(
    [-MAX_UTC_OFFSET_MINUTES, -1, 0, 1, MAX_UTC_OFFSET_MINUTES]
) | st.integers(-MAX_UTC_OFFSET_MINUTES, MAX_UTC_OFFSET_MINUTES)
extra_fields = st.dictionaries(
    st.text(max_size=10).filter(lambda k: k not in TRANSACTION_FIELDS),
    st.one_of(st.none(), st.integers(-(2**70), 2**70), st.text(max_size=30)),
    max_size=3,
)
TRANSACTION_FIELDS: set[str] = {
    "transaction_id",
    "card_id",
    "merchant_id",
    "terminal_id",
    "amount",
    "currency",
    "mcc",
    "country",
    "channel",
    "card_present",
    "event_time",
    "utc_offset_minutes",
}


@st.composite
def legal_record(draw: st.DrawFn) -> dict[str, object]:
    record: dict[str, object] = {
        "transaction_id": draw(ids),
        "card_id": draw(ids),
        "merchant_id": draw(ids),
        "amount": draw(amounts),
        "currency": "".join(draw(st.lists(letters, min_size=3, max_size=3))),
        "mcc": draw(st.sampled_from([0, 1, 4829, 6011, 9998, 9999]) | st.integers(0, 9999)),
        "country": "".join(draw(st.lists(letters, min_size=2, max_size=2))),
        "channel": draw(st.sampled_from(["pos", "ecom", "atm"])),
        "card_present": draw(st.booleans()),
        "event_time": draw(event_times),
    }
    terminal = draw(st.none() | st.text(max_size=MAX_ID_CHARS))
    if terminal is not None:
        record["terminal_id"] = terminal
    offset = draw(st.none() | utc_offsets)
    if offset is not None:  # local time before the epoch or past 9999: still a legal record
        record["utc_offset_minutes"] = offset
    return {**draw(extra_fields), **record}


@pytest.fixture(scope="module")
def stage() -> tuple[BatchScorer, MemorySink, OffsetTracker]:
    sink, tracker = MemorySink(), OffsetTracker()
    scorer = OnnxScorer(load_model_package(SHIPPED_MODEL_PATH))
    scorer.warm_up()
    policy = DecisionPolicy(Thresholds(0.5, 0.8), 1_000.0, "fallback")
    router = DeadLetterRouter("tx.dlq", "g/i")
    return (
        BatchScorer(
            scorer,
            sink,
            tracker,
            router,
            output_topic="d",
            policy=policy,
            metrics=ServiceMetrics(CollectorRegistry()),
        ),
        sink,
        tracker,
    )


def score_each(
    stage: tuple[BatchScorer, MemorySink, OffsetTracker],
    values: list[bytes],
    decode: TransactionDecoder,
) -> list[Transaction]:
    """Decode the values (legal records: each must pass), score them as one batch, and check
    that each ends as exactly one decision or dead letter; return the transactions."""
    batch_scorer, sink, tracker = stage
    sink.sent.clear()
    items, transactions = [], []
    for offset, value in enumerate(values):
        transaction = decode(value)
        transactions.append(transaction)
        tracker.track(("tx", 0), offset)
        items.append(PendingRecord(message(offset, value), transaction, (("tx", 0), offset)))
    now = time.monotonic()

    batch_scorer.process(Batch(items, now, now, closed_full=False))

    outcomes = Counter(o.source.offset() for o in sink.sent)
    assert outcomes == Counter(range(len(values))), "one output per record, no more"
    for output in sink.sent:
        if output.kind == "decision":
            assert output.value is not None, "a decision always has a value"
            decision = msgspec.json.decode(output.value)
            assert 0.0 <= decision["score"] <= 1.0
            assert decision["decision"] in ("approve", "review", "decline")
    sink.deliver_all()
    tracker.take_commit_positions()
    return transactions


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(legal_record(), min_size=1, max_size=40))
def test_every_legal_record_ends_as_exactly_one_decision_or_dead_letter(
    stage: tuple[BatchScorer, MemorySink, OffsetTracker], records: list[dict[str, object]]
) -> None:
    score_each(stage, [msgspec.json.encode(r) for r in records], decode_transaction)


CHECKOUT = FieldMapping.load(Path(__file__).parents[2] / "examples" / "checkout" / "mapping.toml")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(legal_record(), min_size=1, max_size=30))
def test_extreme_records_in_a_teams_own_shape_map_score_and_encode(
    stage: tuple[BatchScorer, MemorySink, OffsetTracker], records: list[dict[str, object]]
) -> None:
    # Through the field mapping too: nested paths, a float time in seconds (9999-12-31 and
    # 1970 included), then features, the model and the decision's encoding.
    values = [msgspec.json.encode(checkout_event(r)) for r in records]
    transactions = score_each(stage, values, transaction_decoder("json", "tx", mapping=CHECKOUT))
    for record, transaction in zip(records, transactions, strict=True):
        assert abs(transaction.event_time - int(record["event_time"])) <= 1  # type: ignore[call-overload]
        assert (transaction.channel, transaction.card_present) == ("ecom", False)
