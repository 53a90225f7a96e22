"""The simulator's transactions in the shapes of the worked examples (examples/): how a card
processor's feed and a web shop's checkout event would carry them. Tests and benchmarks produce
these to show that a team's own fields, read through a field mapping, score as the contract's."""

from __future__ import annotations

import datetime as dt
from typing import Any

#: DE22 POS entry mode per (channel, card present); other combinations have no example code.
ENTRY_MODES = {("pos", True): "05", ("ecom", False): "81"}
#: ISO 4217 numeric codes of the simulator's currencies (examples/iso8583/mapping.toml).
CURRENCY_NUMERIC = {
    "AUD": "036",
    "BRL": "986",
    "CAD": "124",
    "CHF": "756",
    "CNY": "156",
    "EUR": "978",
    "GBP": "826",
    "IDR": "360",
    "INR": "356",
    "JPY": "392",
    "MXN": "484",
    "NGN": "566",
    "PHP": "608",
    "PLN": "985",
    "RON": "946",
    "RUB": "643",
    "UAH": "980",
    "USD": "840",
}
#: The processor's local time: event times are sent with this offset.
PROCESSOR_OFFSET = dt.timezone(dt.timedelta(hours=1))


def authorization(record: dict[str, Any]) -> dict[str, Any]:
    """A transaction as examples/iso8583/schema.avsc carries it (`ENTRY_MODES` says which)."""
    local = dt.datetime.fromtimestamp(record["event_time"] / 1000, PROCESSOR_OFFSET)
    return {
        "mti": "0100",
        "rrn": record["transaction_id"],
        "stan": "000001",
        "pan_token": record["card_id"],
        "amount_minor": round(record["amount"] * 100),
        "currency_numeric": CURRENCY_NUMERIC[record["currency"]],
        "mcc": record["mcc"],
        "pos_entry_mode": ENTRY_MODES[(record["channel"], record["card_present"])],
        "transmitted_at": local.isoformat(timespec="milliseconds"),
        "acceptor": {
            "merchant_id": record["merchant_id"],
            "terminal_id": record.get("terminal_id"),
            "country": record["country"],
        },
    }


def checkout_event(record: dict[str, Any]) -> dict[str, Any]:
    """A transaction as examples/checkout/schema.json carries it (epoch seconds, nested)."""
    return {
        "event_id": record["transaction_id"],
        "occurred_at": record["event_time"] / 1000,
        "order": {"total": record["amount"], "currency": record["currency"]},
        "payment": {"card_fingerprint": record["card_id"]},
        "merchant": {
            "id": record["merchant_id"],
            "category_code": record["mcc"],
            "country": record["country"],
        },
    }
