"""The transaction contract of docs/contracts.md, rule by rule."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from contracts.transaction import MAX_EVENT_TIME_MS, decode_transaction
from plumbing.errors import DecodeError, ValidationError

VALID: dict[str, Any] = {
    "transaction_id": "t-1",
    "card_id": "c-1",
    "merchant_id": "m-1",
    "terminal_id": "term-9",
    "amount": 42.5,
    "currency": "EUR",
    "mcc": 5411,
    "country": "DE",
    "channel": "pos",
    "card_present": True,
    "event_time": 1_767_571_200_000,
}


def test_valid_transaction_decodes() -> None:
    t = decode_transaction(msgspec.json.encode(VALID))
    assert (t.transaction_id, t.amount, t.mcc, t.channel, t.terminal_id) == (
        "t-1",
        42.5,
        5411,
        "pos",
        "term-9",
    )


def test_terminal_is_optional_and_unknown_fields_are_ignored() -> None:
    record = {k: v for k, v in VALID.items() if k != "terminal_id"} | {"loyalty_tier": "gold"}
    assert decode_transaction(msgspec.json.encode(record)).terminal_id is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("transaction_id", ""),
        ("transaction_id", "x" * 65),
        ("card_id", 123),
        ("merchant_id", None),
        ("amount", 0),
        ("amount", -1.0),
        ("amount", 1_000_000.01),
        ("amount", "12.00"),
        ("currency", "eur"),
        ("currency", "EURO"),
        ("mcc", -1),
        ("mcc", 10_000),
        ("mcc", 54.5),
        ("mcc", True),
        ("country", "DEU"),
        ("channel", "phone"),
        ("card_present", "yes"),
        ("card_present", 1),
        ("event_time", -5),
        ("event_time", 1.5),
        ("terminal_id", "t" * 65),
    ],
)
def test_rule_violations_are_validation_errors(field: str, value: object) -> None:
    with pytest.raises(ValidationError):
        decode_transaction(msgspec.json.encode({**VALID, field: value}))


@pytest.mark.parametrize("missing", [k for k in VALID if k != "terminal_id"])
def test_missing_required_field_is_a_validation_error(missing: str) -> None:
    record = {k: v for k, v in VALID.items() if k != missing}
    with pytest.raises(ValidationError, match=missing):
        decode_transaction(msgspec.json.encode(record))


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"\xff\xfe\x00", b'{"amount": NaN}', b'{"amount": Infinity}', b"[1, 2", None],
)
def test_malformed_values_are_decode_errors(raw: bytes | None) -> None:
    with pytest.raises(DecodeError):
        decode_transaction(raw)


def test_overflowing_amount_is_rejected() -> None:
    raw = msgspec.json.encode(VALID).replace(b"42.5", b"1e999")
    with pytest.raises(ValidationError):
        decode_transaction(raw)


def test_not_an_object_is_a_validation_error() -> None:
    with pytest.raises(ValidationError):
        decode_transaction(b"[1, 2, 3]")


@pytest.mark.parametrize(
    "raw", [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000]
)
def test_deeply_nested_json_is_a_decode_error_not_a_crash(raw: bytes) -> None:
    with pytest.raises(DecodeError, match="nested too deeply"):
        decode_transaction(raw)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("currency", "EUR\n"),
        ("country", "DE\n"),
        ("event_time", 2**63),
        ("event_time", MAX_EVENT_TIME_MS + 1),
        ("event_time", -1),
    ],
)
def test_values_no_column_can_hold_are_invalid(field: str, value: object) -> None:
    # Finding 1 of the review: event_time 2**63 passed validation and crashed every replica
    # while building columns; finding 10: "EUR\n" passed the pattern and was truncated.
    with pytest.raises(ValidationError):
        decode_transaction(msgspec.json.encode({**VALID, field: value}))


def test_the_extreme_legal_event_times_are_valid() -> None:
    for event_time in (0, MAX_EVENT_TIME_MS):
        assert decode_transaction(msgspec.json.encode({**VALID, "event_time": event_time}))
