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


#: The contract's fields as a protobuf message: (name, field type).
_PAYMENT_FIELDS: tuple[tuple[str, str], ...] = (
    ("transaction_id", "TYPE_STRING"),
    ("card_id", "TYPE_STRING"),
    ("merchant_id", "TYPE_STRING"),
    ("terminal_id", "TYPE_STRING"),
    ("amount", "TYPE_DOUBLE"),
    ("currency", "TYPE_STRING"),
    ("mcc", "TYPE_INT32"),
    ("country", "TYPE_STRING"),
    ("channel", "TYPE_STRING"),
    ("card_present", "TYPE_BOOL"),
    ("event_time", "TYPE_INT64"),
)


def payment_message(version: int = 1) -> Any:
    """A team's protobuf `Payment` message class, as `protoc --python_out` would generate it
    from a proto3 file of the contract's fields (`terminal_id` optional); version 2 adds a
    `device_id`, as a producer's next schema version would."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    kind = descriptor_pb2.FieldDescriptorProto
    package = f"team.v{version}"
    proto = descriptor_pb2.FileDescriptorProto(
        name=f"team/payment_v{version}.proto", package=package, syntax="proto3"
    )
    message = proto.message_type.add(name="Payment")
    fields = [*_PAYMENT_FIELDS, *([("device_id", "TYPE_STRING")] if version >= 2 else [])]
    for number, (name, field_type) in enumerate(fields, start=1):
        field = message.field.add(
            name=name, number=number, type=getattr(kind, field_type), label=kind.LABEL_OPTIONAL
        )
        if name == "terminal_id":  # proto3 `optional`: absent is not ""
            field.proto3_optional = True
            field.oneof_index = len(message.oneof_decl)
            message.oneof_decl.add(name="_terminal_id")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Payment"))
