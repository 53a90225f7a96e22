"""The label contract of docs/contracts.md, rule by rule."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from contracts.label import MAX_REPORT_SKEW_MS, decode_label
from contracts.transaction import MAX_EVENT_TIME_MS
from plumbing.errors import DecodeError, ValidationError

VALID: dict[str, Any] = {
    "transaction_id": "t-1",
    "card_id": "c-1",
    "terminal_id": "term-9",
    "fraud": True,
    "event_time": 1_767_571_200_000,
    "reported_at": 1_767_830_400_000,
}


def test_valid_label_decodes() -> None:
    label = decode_label(msgspec.json.encode(VALID))
    assert (label.transaction_id, label.card_id, label.terminal_id, label.fraud) == (
        "t-1",
        "c-1",
        "term-9",
        True,
    )
    assert (label.event_time, label.reported_at) == (VALID["event_time"], VALID["reported_at"])


def test_terminal_is_optional_and_unknown_fields_are_ignored() -> None:
    record = {k: v for k, v in VALID.items() if k != "terminal_id"} | {"source": "chargeback"}
    assert decode_label(msgspec.json.encode(record)).terminal_id is None
    assert decode_label(msgspec.json.encode({**VALID, "terminal_id": None})).terminal_id is None


def test_a_legitimate_outcome_is_a_label_too() -> None:
    assert decode_label(msgspec.json.encode({**VALID, "fraud": False})).fraud is False


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("transaction_id", ""),
        ("transaction_id", "x" * 65),
        ("card_id", ""),
        ("card_id", 123),
        ("terminal_id", "t" * 65),
        ("terminal_id", 7),
        ("fraud", 1),
        ("fraud", "true"),
        ("fraud", None),
        ("event_time", -1),
        ("event_time", 1.5),
        ("event_time", "1767571200000"),
        ("event_time", MAX_EVENT_TIME_MS + 1),
        ("event_time", 2**63),
        ("reported_at", -1),
        ("reported_at", 2.5),
        ("reported_at", MAX_EVENT_TIME_MS + 1),
    ],
)
def test_rule_violations_are_validation_errors(field: str, value: object) -> None:
    with pytest.raises(ValidationError):
        decode_label(msgspec.json.encode({**VALID, field: value}))


@pytest.mark.parametrize("missing", [k for k in VALID if k != "terminal_id"])
def test_missing_required_field_is_a_validation_error(missing: str) -> None:
    record = {k: v for k, v in VALID.items() if k != missing}
    with pytest.raises(ValidationError, match=missing):
        decode_label(msgspec.json.encode(record))


def test_reported_before_the_transaction_is_invalid_beyond_the_clock_skew() -> None:
    at = VALID["event_time"]
    for reported_at in (at, at - MAX_REPORT_SKEW_MS):
        assert decode_label(msgspec.json.encode({**VALID, "reported_at": reported_at}))
    with pytest.raises(ValidationError, match="before event_time"):
        decode_label(msgspec.json.encode({**VALID, "reported_at": at - MAX_REPORT_SKEW_MS - 1}))


@pytest.mark.parametrize(
    "raw", [b"", b"{", b"\xff\xfe\x00", b'{"event_time": NaN}', b"[1, 2", b"not json", None]
)
def test_malformed_values_are_decode_errors(raw: bytes | None) -> None:
    with pytest.raises(DecodeError):
        decode_label(raw)


@pytest.mark.parametrize("raw", [b"[1, 2, 3]", b'"label"', b"null", b"true"])
def test_json_that_is_not_an_object_is_a_validation_error(raw: bytes) -> None:
    with pytest.raises(ValidationError):
        decode_label(raw)


def test_overflowing_number_is_a_validation_error() -> None:
    raw = msgspec.json.encode(VALID).replace(b"1767571200000", b"1e999")
    with pytest.raises(ValidationError):
        decode_label(raw)


def test_deeply_nested_json_is_a_decode_error_not_a_crash() -> None:
    with pytest.raises(DecodeError, match="nested too deeply"):
        decode_label(b"[" * 100_000 + b"]" * 100_000)


def test_the_extreme_legal_times_are_valid() -> None:
    for at in (0, MAX_EVENT_TIME_MS):
        assert decode_label(msgspec.json.encode({**VALID, "event_time": at, "reported_at": at}))
