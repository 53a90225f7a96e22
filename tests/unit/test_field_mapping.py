"""A team's own field names, paths, time formats and codes onto the contract
(contracts/field_mapping.py), with the two worked examples in examples/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from contracts.field_mapping import FieldMapping, avro_paths, json_schema_paths
from contracts.transaction import Transaction
from plumbing.errors import ConfigurationError, ValidationError

EXAMPLES = Path(__file__).parents[2] / "examples"
ISO8583 = FieldMapping.load(EXAMPLES / "iso8583" / "mapping.toml")
CHECKOUT = FieldMapping.load(EXAMPLES / "checkout" / "mapping.toml")

AUTHORIZATION: dict[str, Any] = {
    "mti": "0100",
    "rrn": "612345678901",
    "stan": "000123",
    "pan_token": "tok_4f9a",
    "amount_minor": 4250,
    "currency_numeric": "756",
    "mcc": 5411,
    "pos_entry_mode": "07",
    "transmitted_at": "2026-01-05T10:00:00.250+01:00",
    "acceptor": {"merchant_id": "M-77", "terminal_id": "T-1", "country": "CH"},
}


def mapped(mapping: FieldMapping, record: dict[str, Any]) -> Transaction:
    return msgspec.convert(mapping.apply(record), Transaction)


def test_the_card_processor_example_maps_codes_minor_units_and_local_times() -> None:
    transaction = mapped(ISO8583, AUTHORIZATION)
    assert transaction == Transaction(
        transaction_id="612345678901",
        card_id="tok_4f9a",
        merchant_id="M-77",
        terminal_id="T-1",
        amount=42.5,
        currency="CHF",
        mcc=5411,
        country="CH",
        channel="pos",
        card_present=True,
        event_time=1_767_603_600_250,  # 09:00:00.250 UTC
        utc_offset_minutes=60,  # the time's own offset: its hour features read 10h
    )
    online = mapped(ISO8583, {**AUTHORIZATION, "pos_entry_mode": "81"})
    assert (online.channel, online.card_present) == ("ecom", False)


def test_the_checkout_example_maps_nested_fields_epoch_seconds_and_constants() -> None:
    event = {
        "event_id": "evt-1",
        "occurred_at": 1_767_571_200.5,
        "order": {"total": 19.99, "currency": "EUR"},
        "payment": {"card_fingerprint": "fp-9"},
        "merchant": {"id": "shop-3", "category_code": 5732, "country": "NL"},
    }
    transaction = mapped(CHECKOUT, event)
    assert (transaction.transaction_id, transaction.card_id, transaction.amount) == (
        "evt-1",
        "fp-9",
        19.99,
    )
    assert (transaction.event_time, transaction.channel, transaction.card_present) == (
        1_767_571_200_500,
        "ecom",
        False,
    )
    assert transaction.terminal_id is None
    assert transaction.utc_offset_minutes is None  # epoch times carry no offset: UTC


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"transmitted_at": "2026-01-05T10:00:00"}, "has no offset"),
        ({"transmitted_at": "yesterday"}, "not ISO-8601"),
        ({"pos_entry_mode": "90"}, "no mapping for the value '90'"),
        ({"acceptor": {"terminal_id": "T-1", "country": "CH"}}, "acceptor.merchant_id is missing"),
    ],
)
def test_a_record_the_mapping_cannot_read_is_invalid_naming_why(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        ISO8583.apply({**AUTHORIZATION, **change})


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"fields": {"pan": "x"}}, "'pan', not a transaction field"),
        ({"fields": {"card_id": "a..b"}}, "must be a dotted path"),
        (
            {"fields": {"channel": "x"}, "constants": {"channel": "pos"}},
            "both mapped and a constant",
        ),
        ({"time_format": "unix"}, "time_format must be one of"),
        ({"amount_scale": 0}, "amount_scale must be a number > 0"),
        ({"amount_scale": True}, "amount_scale must be a number > 0"),
        ({"values": {"channel": {}}}, r"\[values.channel\] must be a table"),
        ({"field": {}}, "unknown key 'field'"),
    ],
)
def test_a_bad_mapping_file_names_the_key(document: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        FieldMapping.from_document(document)


def test_a_file_that_is_not_toml_is_a_configuration_error(tmp_path: Path) -> None:
    broken = tmp_path / "mapping.toml"
    broken.write_text("[fields\n")
    with pytest.raises(ConfigurationError, match="is not TOML"):
        FieldMapping.load(broken)


def test_the_examples_fit_their_schemas_and_a_wrong_path_is_named() -> None:
    avro = json.loads((EXAMPLES / "iso8583" / "schema.avsc").read_text())
    ISO8583.check_schema_fields(avro_paths(avro))
    CHECKOUT.check_schema_fields(
        json_schema_paths(json.loads((EXAMPLES / "checkout" / "schema.json").read_text()))
    )
    typo = FieldMapping.from_document({"fields": {"card_id": "pan_tokn"}})
    with pytest.raises(ConfigurationError, match="card_id = 'pan_tokn'"):
        typo.check_schema_fields(avro_paths(avro))
    with pytest.raises(ConfigurationError, match="no field 'transaction_id'"):
        FieldMapping().check_schema_fields(avro_paths(avro))


def test_times_in_seconds_and_microseconds_are_exact_for_integers() -> None:
    for time_format, value, expected in [
        ("epoch_s", 253_402_300_799, 253_402_300_799_000),
        ("epoch_us", 1_767_571_200_123_456, 1_767_571_200_123),
    ]:
        mapping = FieldMapping.from_document({"time_format": time_format})
        assert mapping.apply({"event_time": value})["event_time"] == expected
    with pytest.raises(ValidationError, match="out of range"):
        FieldMapping.from_document({"time_format": "epoch_s"}).apply({"event_time": float("inf")})


def test_an_iso_time_gives_its_offset_unless_the_mapping_gives_one() -> None:
    for stamp, offset in (("2026-03-01T23:30:00-05:00", -300), ("2026-03-01T04:30:00Z", 0)):
        assert mapped(ISO8583, {**AUTHORIZATION, "transmitted_at": stamp}).utc_offset_minutes == (
            offset
        )
    fixed = FieldMapping(
        ISO8583.paths, {**ISO8583.constants, "utc_offset_minutes": 330}, ISO8583.amount_scale,
        ISO8583.values, ISO8583.time_format,
    )  # fmt: skip
    assert mapped(fixed, AUTHORIZATION).utc_offset_minutes == 330
