"""Scores to decisions, and the dead-letter headers."""

from __future__ import annotations

import msgspec
import numpy as np

from contracts.dead_letter import MAX_MESSAGE_CHARS, SourceRecord, dead_letter_headers
from contracts.decision import Decision, Reason, encode_decision
from plumbing.errors import ScoreError, ValidationError
from scorer.decisions import Thresholds, classify, valid_scores


def test_thresholds_split_scores_into_three_classes() -> None:
    scores = np.array([0.0, 0.49, 0.5, 0.79, 0.8, 1.0], np.float32)
    assert classify(scores, Thresholds(review=0.5, decline=0.8)) == [
        "approve",
        "approve",
        "review",
        "review",
        "decline",
        "decline",
    ]


def test_only_probabilities_are_valid_scores() -> None:
    scores = np.array([0.0, 1.0, 0.3, np.nan, np.inf, -0.1, 1.5], np.float32)
    assert valid_scores(scores).tolist() == [True, True, True, False, False, False, False]


def test_decision_wire_format_has_every_contract_field() -> None:
    d = Decision("t", "c", 0.25, "approve", "m-1", False, 10, 20)
    assert msgspec.json.decode(encode_decision(d)) == {
        "transaction_id": "t",
        "card_id": "c",
        "score": 0.25,
        "decision": "approve",
        "model_version": "m-1",
        "degraded": False,
        "event_time": 10,
        "decided_at": 20,
    }


def test_a_reason_carries_its_words_as_text_and_as_the_deprecated_label_alike() -> None:
    reason = Reason(feature="log_amount", text="amount 229.90", contribution=0.3)
    d = Decision("t", "c", 0.9, "review", "m-1", False, 10, 20, reasons=(reason,))
    (written,) = msgspec.json.decode(encode_decision(d))["reasons"]
    assert written == {
        "feature": "log_amount",
        "text": "amount 229.90",
        "label": "amount 229.90",
        "contribution": 0.3,
    }


def test_a_reason_of_a_release_010_decision_reads_its_label_as_its_text() -> None:
    written_by_010 = (
        b'{"transaction_id":"t","card_id":"c","score":0.9,"decision":"review",'
        b'"model_version":"m-1","degraded":false,"event_time":10,"decided_at":20,'
        b'"reasons":[{"feature":"log_amount","label":"amount 229.90","contribution":0.3}]}'
    )
    (reason,) = msgspec.json.decode(written_by_010, type=Decision).reasons
    assert reason == Reason(feature="log_amount", text="amount 229.90", contribution=0.3)
    assert reason.text == reason.label == "amount 229.90"


SOURCE = SourceRecord("transactions", 2, 41, 1000, b"card", b"{bad", [("trace-id", b"abc")])


def test_dead_letter_keeps_original_headers_and_adds_the_contract_ones() -> None:
    headers = dead_letter_headers(
        SOURCE,
        ValidationError("amount must be > 0"),
        reason="validate",
        attempts=1,
        service="fraud-scorer/a",
        failed_at_ms=2000,
    )
    as_text = {k: v.decode() for k, v in headers}
    assert headers[0] == ("trace-id", b"abc")
    assert as_text == {
        "trace-id": "abc",
        "dlq.reason": "validate",
        "dlq.error": "ValidationError",
        "dlq.message": "amount must be > 0",
        "dlq.original.topic": "transactions",
        "dlq.original.partition": "2",
        "dlq.original.offset": "41",
        "dlq.original.timestamp": "1000",
        "dlq.attempts": "1",
        "dlq.failed_at": "2000",
        "dlq.service": "fraud-scorer/a",
    }


def test_dead_letter_message_and_trace_are_bounded() -> None:
    try:
        raise ScoreError("x" * 50_000)
    except ScoreError as exc:
        error = exc
    source = SOURCE._replace(headers=[("dlq.reason", b"forged")])
    headers = dict(
        dead_letter_headers(
            source,
            error,
            reason="score",
            attempts=2,
            service="s",
            failed_at_ms=1,
            model_version="m-1",
            with_stacktrace=True,
        )
    )
    assert len(headers["dlq.message"].decode()) <= MAX_MESSAGE_CHARS
    assert headers["dlq.message"].decode().endswith("[truncated]")
    assert headers["dlq.model_version"] == b"m-1"
    assert b"Traceback" in headers["dlq.stacktrace"] and len(headers["dlq.stacktrace"]) <= 4_100
    assert headers["dlq.reason"] == b"score", "a forged dlq header never survives"
